"""The `gpufed` command line: one module per verb group; flags map onto settings here and only here.

This is the only place that configures logging.

Every `gpufed` process, the controller's virtual kubelets and every short command alike, starts by
importing this package, and it declares every verb. So the verb modules import at their top only
typer, rich and the `defaults` modules (the values their flags show); the parts that do the work
(aiohttp, pydantic models, the Kubernetes client, the controllers) are imported inside the verb
that runs. `gpufed peer` loads what a peering needs, not the controller, the doctor and the local
environment too (tests/unit/gpufed/cli/test_cli.py holds the start to that).
"""

from __future__ import annotations

import typer

from gpufed.cli import controller, doctor, local, network, offload, pool, virtual_kubelet
from gpufed.cli import peer as peering_cmds
from gpufed.cli.gpu_agent import gpu_agent

app = typer.Typer(
    name="gpufed",
    help="Pool GPUs of peered Kubernetes clusters behind virtual nodes.",
    no_args_is_help=True,
    add_completion=False,
)
app.add_typer(local.app, name="local")
app.add_typer(network.app, name="network")
app.command(name="gateway")(network.gateway)
app.command(name="controller")(controller.controller)
app.command(name="virtual-kubelet")(virtual_kubelet.virtual_kubelet)
app.command(name="peer")(peering_cmds.peer)
app.command(name="unpeer")(peering_cmds.unpeer)
app.command(name="info")(peering_cmds.info)
app.command(name="offload-namespace")(offload.offload_namespace)
app.command(name="unoffload-namespace")(offload.unoffload_namespace)
app.command(name="gpu-agent")(gpu_agent)
app.command(name="pool")(pool.pool)
app.command(name="doctor")(doctor.doctor)


@app.command()
def version() -> None:
    """Print gpufed's version."""
    from importlib.metadata import version as dist_version

    typer.echo(f"gpufed {dist_version('gpufed')}")


def main() -> None:
    app()
