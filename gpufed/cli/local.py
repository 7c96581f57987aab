"""`gpufed local up|down|status|demo`: the local multi-cluster environment.

Flags and GPUFED_* environment variables map onto `LocalSettings` and the topology here; the work
is done by `gpufed.localenv.launcher` (and, for `demo`, the story in `gpufed.localenv.demo`),
imported when a command runs, not with the CLI (gpufed.cli says why).
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from gpufed.cli.common import console, fail, run_op
from gpufed.cli.output import Output, check_output, emit, stdout_console, table
from gpufed.defaults import DEMO_NAMESPACE, LOCAL_BASE_PORT, LOCAL_JOB_SECONDS
from gpufed.errors import GpufedError

if TYPE_CHECKING:
    import structlog

    from gpufed.localenv.launcher import LocalSettings
    from gpufed.localenv.topology import Topology

app = typer.Typer(help="Local Kubernetes clusters with kwok GPU nodes, built from source.", no_args_is_help=True)

UP_EPILOG = """Examples:

  # consumer, gpu-a and gpu-b; then run the export KUBECONFIG=... it prints
  gpufed local up
  gpufed local up --topology my-topology.yaml --base-port 21000
"""
DOWN_EPILOG = """Examples:

  gpufed local down
  gpufed local down --state-dir /tmp/gpufed-local
"""
STATUS_EPILOG = """Examples:

  gpufed local status
  gpufed local status -o json | jq '.[] | select(.healthy | not) | .name'
"""
DEMO_EPILOG = """Examples:

  gpufed local demo
  # leave everything running to explore
  gpufed local demo --keep --namespace team-b
"""

#: Repository root when running from a source checkout (editable install), else None.
_SOURCE_ROOT = Path(__file__).resolve().parents[2]
_BUILD_SCRIPT = _SOURCE_ROOT / "deploy" / "local" / "build.sh"
#: gpufed's CRDs and RBAC, installed into every local cluster.
_MANIFESTS = _SOURCE_ROOT / "deploy"


def _default_state_dir() -> Path:
    return Path(os.environ.get("XDG_STATE_HOME", Path.home() / ".local" / "state")) / "gpufed" / "local"


def _default_bin_dir() -> Path:
    if _BUILD_SCRIPT.exists():
        return _SOURCE_ROOT / ".cache" / "bin"
    return Path.home() / ".cache" / "gpufed" / "bin"


StateDir = Annotated[
    Path | None,
    typer.Option(
        "--state-dir", envvar="GPUFED_LOCAL_DIR", help="State directory (default: ~/.local/state/gpufed/local)"
    ),
]
BinDir = Annotated[
    Path | None,
    typer.Option(
        "--bin-dir", envvar="GPUFED_BIN_DIR", help="Directory of the built binaries (default: <repo>/.cache/bin)"
    ),
]


def _settings(state_dir: Path | None, bin_dir: Path | None, timeout: float | None = None) -> LocalSettings:
    from gpufed.localenv.launcher import LocalSettings

    s = LocalSettings(
        state_dir=(state_dir or _default_state_dir()).resolve(),
        bin_dir=(bin_dir or _default_bin_dir()).resolve(),
        build_script=_BUILD_SCRIPT if _BUILD_SCRIPT.exists() else None,
        manifests_dir=_MANIFESTS if _MANIFESTS.exists() else None,
    )
    if timeout is not None:
        s = LocalSettings(s.state_dir, s.bin_dir, s.build_script, timeout, s.manifests_dir)
    return s


def _running_topology(settings: LocalSettings) -> Topology:
    """The topology recorded by `up` in the state directory, else the default one."""
    from gpufed.localenv.topology import Topology, default_topology

    try:
        state = json.loads((settings.state_dir / "state.json").read_text())
        return Topology.model_validate(state["topology"])
    except (OSError, ValueError, KeyError):
        return default_topology()


def _log() -> structlog.stdlib.BoundLogger:
    import structlog

    structlog.configure(
        processors=[
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="%H:%M:%S"),
            structlog.dev.ConsoleRenderer(),
        ],
        logger_factory=structlog.PrintLoggerFactory(file=sys.stderr),
    )
    log: structlog.stdlib.BoundLogger = structlog.get_logger()
    return log


@app.command(epilog=UP_EPILOG)
def up(
    state_dir: StateDir = None,
    bin_dir: BinDir = None,
    topology: Annotated[Path | None, typer.Option(help="Topology YAML (default: consumer, gpu-a, gpu-b)")] = None,
    base_port: Annotated[int, typer.Option(help="First loopback port; 25 per cluster")] = LOCAL_BASE_PORT,
    job_seconds: Annotated[float, typer.Option(help="How long Job pods run on kwok nodes")] = LOCAL_JOB_SECONDS,
    timeout: Annotated[float, typer.Option(help="Seconds to wait for everything to be healthy")] = 240.0,
) -> None:
    """Start (or complete) the local clusters and wait until every apiserver and node is ready."""
    from gpufed.localenv.launcher import LocalEnvironment
    from gpufed.localenv.topology import default_topology, load_topology

    log = _log()
    try:
        topo = load_topology(topology) if topology else default_topology(base_port=base_port, job_seconds=job_seconds)
    except GpufedError as e:
        raise fail(e, e.exit_code) from None
    env = LocalEnvironment(_settings(state_dir, bin_dir, timeout), topo)
    try:
        asyncio.run(env.up(lambda m: log.info(m)))
    except GpufedError as e:
        console.print(f"[bold red]error:[/] {e}")
        console.print(
            "what was started keeps running: fix the cause and run `gpufed local up` again to complete it, "
            "or `gpufed local down" + (f" --state-dir {state_dir}" if state_dir else "") + "` to stop it"
        )
        raise typer.Exit(e.exit_code) from None
    typer.echo(f"export KUBECONFIG={env.merged_kubeconfig}   # contexts: " + ", ".join(c.name for c in topo.clusters))


@app.command(epilog=DOWN_EPILOG)
def down(state_dir: StateDir = None, bin_dir: BinDir = None) -> None:
    """Stop every process of the local clusters and remove their state."""
    from gpufed.localenv.launcher import LocalEnvironment

    log = _log()
    settings = _settings(state_dir, bin_dir)
    try:
        LocalEnvironment(settings, _running_topology(settings)).down(lambda m: log.info(m))
    except GpufedError as e:
        raise fail(e, e.exit_code) from None


@app.command(epilog=STATUS_EPILOG)
def status(
    state_dir: StateDir = None,
    bin_dir: BinDir = None,
    output: Output = "table",
) -> None:
    """Show each local cluster: components, version, nodes, GPUs. Exit 1 when any is unhealthy."""
    from gpufed.localenv.launcher import LocalEnvironment

    check_output(output)
    settings = _settings(state_dir, bin_dir)
    env = LocalEnvironment(settings, _running_topology(settings))
    statuses = run_op(env.status())
    data = [
        {
            "name": s.name,
            "apiserver": s.apiserver,
            "healthy": s.healthy,
            "version": s.version,
            "nodesReady": s.nodes_ready,
            "nodesTotal": s.nodes_total,
            "gpus": s.gpus,
            "components": {c.name: {"pid": c.pid, "running": c.running, "port": c.port} for c in s.components},
        }
        for s in statuses
    ]
    if not emit(data, output):
        wide = output == "wide"
        columns = ["cluster", "apiserver", "version", "healthy", "nodes", "GPUs", "running"]
        t = table(
            f"gpufed local clusters ({settings.state_dir})",
            [*columns, "pids"] if wide else columns,
            right=("nodes", "GPUs"),
        )
        for s in statuses:
            down = [c.name.removeprefix("kube-") for c in s.components if not c.running]
            comps = f"[red]down: {', '.join(down)}[/]" if down else f"[green]{len(s.components)}/{len(s.components)}[/]"
            row = [
                s.name,
                s.apiserver.removeprefix("https://"),
                s.version,
                "[green]yes[/]" if s.healthy else "[red]no[/]",
                f"{s.nodes_ready}/{s.nodes_total}",
                str(s.gpus),
                comps,
            ]
            if wide:
                row.append(", ".join(f"{c.name}={c.pid}" for c in s.components if c.pid))
            t.add_row(*row)
        stdout_console().print(t)
    if not all(s.healthy for s in statuses):
        raise typer.Exit(1)


@app.command(epilog=DEMO_EPILOG)
def demo(
    state_dir: StateDir = None,
    bin_dir: BinDir = None,
    namespace: Annotated[str, typer.Option(help="The consumer namespace to offload")] = DEMO_NAMESPACE,
    keep: Annotated[
        bool, typer.Option("--keep", help="Do not clean up: leave the peerings, the namespace and its workloads")
    ] = False,
    no_network: Annotated[
        bool, typer.Option("--no-network", help="Skip the network steps (tunnels, the request through the Service)")
    ] = False,
    base_port: Annotated[
        int, typer.Option(help="First loopback port, when no environment runs in the state directory yet")
    ] = LOCAL_BASE_PORT,
) -> None:
    """The whole story, narrated and timed: clusters, peering (network included), offloading, a GPU Job,
    a Deployment and Service reached through the tunnels, the pool, clean-up. Exit 1 when a step fails."""
    from gpufed.localenv.demo import DemoSettings, run_demo
    from gpufed.localenv.launcher import LocalEnvironment
    from gpufed.localenv.topology import default_topology

    settings = _settings(state_dir, bin_dir)
    running = (settings.state_dir / "state.json").exists()
    try:
        topo = _running_topology(settings) if running else default_topology(base_port=base_port)
    except GpufedError as e:
        raise fail(e, e.exit_code) from None
    env = LocalEnvironment(settings, topo)
    opts = DemoSettings(namespace=namespace, keep=keep, network=not no_network)
    try:
        code = asyncio.run(run_demo(env, opts, sys.stdout))
    except KeyboardInterrupt:
        console.print(
            "[bold red]interrupted[/]: the demo's own processes and network namespaces are gone, its objects may "
            "remain in the clusters; run `gpufed local demo` again to finish and clean up"
        )
        raise typer.Exit(130) from None
    raise typer.Exit(code)
