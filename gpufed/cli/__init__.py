"""The `gpufed` command line: one module per verb group; flags map onto settings here and only here.

This is the only place that configures logging.

Every `gpufed` process, the controller's virtual kubelets and every short command alike, starts by
importing this package, and it declares every verb. So the verb modules import at their top only
typer, rich and the `defaults` modules (the values their flags show); the parts that do the work
(aiohttp, pydantic models, the Kubernetes client, the controllers) are imported inside the verb
that runs. `gpufed peer` loads what a peering needs, not the controller, the doctor and the local
environment too (tests/unit/gpufed/cli/test_cli.py holds the start to that).

The verbs follow kubectl's conventions (docs/operations.md, "CLI conventions"): the kubeconfig and
context resolved as kubectl resolves them (`gpufed.cli.kubeconfig`), data on stdout and progress and
errors on stderr, `-o table|wide|json|yaml` on the read verbs (`gpufed.cli.output`), exit code 2
for a usage error found before anything connects, and an example in every verb's help (its epilog).
The same app is `kubectl-gpufed`, so `kubectl gpufed pool` runs `gpufed pool`.
"""

from __future__ import annotations

import typer

from gpufed.cli import controller, doctor, local, network, offload, pool, virtual_kubelet
from gpufed.cli import peer as peering_cmds
from gpufed.cli.gpu_agent import EPILOG as GPU_AGENT_EPILOG
from gpufed.cli.gpu_agent import gpu_agent

app = typer.Typer(
    name="gpufed",
    help="Pool GPUs of peered Kubernetes clusters behind virtual nodes.",
    epilog="Examples:\n\n  gpufed pool\n\n  gpufed peer --context consumer --remote-context gpu-a --gpus 8\n\n"
    "  kubectl gpufed info -o yaml",
    no_args_is_help=True,
    add_completion=False,
)
app.add_typer(local.app, name="local")
app.add_typer(network.app, name="network")
app.command(name="gateway", epilog=network.GATEWAY_EPILOG)(network.gateway)
app.command(name="controller", epilog=controller.EPILOG)(controller.controller)
app.command(name="virtual-kubelet", epilog=virtual_kubelet.EPILOG)(virtual_kubelet.virtual_kubelet)
app.command(name="peer", epilog=peering_cmds.PEER_EPILOG)(peering_cmds.peer)
app.command(name="unpeer", epilog=peering_cmds.UNPEER_EPILOG)(peering_cmds.unpeer)
app.command(name="info", epilog=peering_cmds.INFO_EPILOG)(peering_cmds.info)
app.command(name="offload-namespace", epilog=offload.OFFLOAD_EPILOG)(offload.offload_namespace)
app.command(name="unoffload-namespace", epilog=offload.UNOFFLOAD_EPILOG)(offload.unoffload_namespace)
app.command(name="gpu-agent", epilog=GPU_AGENT_EPILOG)(gpu_agent)
app.command(name="pool", epilog=pool.EPILOG)(pool.pool)
app.command(name="doctor", epilog=doctor.EPILOG)(doctor.doctor)


@app.command(epilog="Examples:\n\n  gpufed version\n\n  kubectl gpufed version")
def version() -> None:
    """Print gpufed's version."""
    from importlib.metadata import version as dist_version

    typer.echo(f"gpufed {dist_version('gpufed')}")


def main() -> None:
    app()


def kubectl_main() -> None:
    """`kubectl-gpufed`: the same app, named as kubectl runs it as a plugin."""
    app(prog_name="kubectl gpufed")
