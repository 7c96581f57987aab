"""`gpufed network connect | disconnect | status | expose` and `gpufed gateway`: flags ->
`netfabric.ops` / `netfabric.controllers.gateway`, with rich progress and tables.

The operations are imported when a command runs, not with the CLI (gpufed.cli says why).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.table import Table

from gpufed.cli.common import (
    Context,
    Kubeconfig,
    MetricsHost,
    MetricsPort,
    Output,
    Report,
    Timeout,
    check_output,
    configure_logging,
    console,
    fail,
    run_op,
    serve,
)
from gpufed.defaults import METRICS_HOST
from peering.defaults import OPERATION_TIMEOUT_S

if TYPE_CHECKING:
    from netfabric.ops import NetworkOptions

app = typer.Typer(help="The WireGuard fabric between peered clusters.", no_args_is_help=True)

RemoteKubeconfig = Annotated[Path, typer.Option("--remote-kubeconfig", help="kubeconfig of the provider cluster")]
RemoteContext = Annotated[str | None, typer.Option("--remote-context", help="context in --remote-kubeconfig")]
GatewayEndpoint = Annotated[
    str | None,
    typer.Option(
        "--gateway-endpoint",
        help="HOST[:PORT] where the consumer's gateway reaches the provider's [default: the provider's NetworkConfig]",
    ),
]
PodCIDR = Annotated[str | None, typer.Option("--pod-cidr", help="consumer pod CIDR, if it has no NetworkConfig yet")]
RemotePodCIDR = Annotated[
    str | None, typer.Option("--remote-pod-cidr", help="provider pod CIDR, if it has no NetworkConfig yet")
]
MTU = Annotated[int, typer.Option("--mtu", help="tunnel MTU [default 0: underlay MTU minus 80 B, 1420 on 1500]")]
Masquerade = Annotated[
    bool,
    typer.Option("--masquerade", help="SNAT peer traffic to the gateway's address (for strict CNIs such as Cilium)"),
]
Driver = Annotated[str, typer.Option("--driver", help="auto, kernel or wireguard-go")]


def network_options(
    endpoint: str | None,
    pod_cidr: str | None,
    remote_pod_cidr: str | None,
    mtu: int,
    masquerade: bool,
    driver: str,
    wait_s: float = 0.0,
) -> NetworkOptions:
    from netfabric import ops

    if driver not in ("auto", "kernel", "wireguard-go"):
        raise fail("--driver must be auto, kernel or wireguard-go", code=2)
    if not 0 <= mtu <= 9000 or 0 < mtu < 1280:
        raise fail("--mtu must be 0 (automatic) or 1280..9000", code=2)
    return ops.NetworkOptions(
        gateway_endpoint=endpoint,
        pod_cidr=pod_cidr,
        remote_pod_cidr=remote_pod_cidr,
        mtu=mtu,
        masquerade=masquerade,
        driver=driver,
        wait_s=wait_s,
    )


@app.command()
def connect(
    kubeconfig: Kubeconfig,
    remote_kubeconfig: RemoteKubeconfig,
    context: Context = None,
    remote_context: RemoteContext = None,
    gateway_endpoint: GatewayEndpoint = None,
    pod_cidr: PodCIDR = None,
    remote_pod_cidr: RemotePodCIDR = None,
    mtu: MTU = 0,
    masquerade: Masquerade = False,
    driver: Driver = "auto",
    wait: Annotated[bool, typer.Option("--wait/--no-wait", help="wait until both gateways report Connected")] = False,
    timeout: Timeout = OPERATION_TIMEOUT_S,
) -> None:
    """Configure the tunnel between the consumer (--kubeconfig) and the provider (--remote-kubeconfig)."""
    from netfabric import ops
    from peering.ops.peer import ClusterRef

    opts = network_options(
        gateway_endpoint, pod_cidr, remote_pod_cidr, mtu, masquerade, driver, timeout if wait else 0.0
    )
    out = run_op(
        ops.connect(
            ClusterRef(kubeconfig, context, "consumer"),
            ClusterRef(remote_kubeconfig, remote_context, "provider"),
            opts,
            Report(),
        )
    )
    console.print(
        f"[bold green]connected[/] {out['consumer']} ↔ {out['provider']} via {out['endpoint']}: "
        f"provider pods appear at {out['providerPodsSeenAt']} on the consumer"
        + ("" if wait else " (`gpufed network status` shows the tunnel)")
    )


@app.command()
def disconnect(
    kubeconfig: Kubeconfig,
    remote_kubeconfig: RemoteKubeconfig,
    context: Context = None,
    remote_context: RemoteContext = None,
) -> None:
    """Remove the tunnel's objects on both sides (the gateways tear their data plane down)."""
    from netfabric import ops
    from peering.ops.peer import ClusterRef

    run_op(
        ops.disconnect(
            ClusterRef(kubeconfig, context, "consumer"),
            ClusterRef(remote_kubeconfig, remote_context, "provider"),
            Report(),
        )
    )


async def network_status(kubeconfig: Path, context: str | None) -> list[dict[str, Any]]:
    from gpufed.kube.client import api_client, require_kubeconfig
    from netfabric import ops

    require_kubeconfig(kubeconfig)
    async with api_client(kubeconfig, context) as api:
        return await ops.status(api)


def status_table(rows: list[dict[str, Any]]) -> Table:
    t = Table(title="connections")
    for col in ("peer", "role", "status", "reason", "rtt ms", "driver", "mtu", "peer pods", "seen at", "message"):
        t.add_column(col)
    for r in rows:
        color = {"Connected": "green", "Degraded": "yellow", "Down": "red"}.get(r["phase"], "white")
        t.add_row(
            r["cluster"],
            r["role"],
            f"[{color}]{r['phase']}[/]",
            r["reason"],
            "" if r["rttMs"] is None else f"{r['rttMs']:.2f}",
            r["driver"],
            str(r["mtu"] or ""),
            r["podCidr"],
            r["mappedPodCidr"],
            r["message"],
        )
    return t


@app.command()
def status(
    kubeconfig: Kubeconfig,
    context: Context = None,
    output: Output = "table",
) -> None:
    """Every peer's tunnel on this cluster: Connected / Degraded / Down and why, RTT, mappings."""
    check_output(output)
    rows = run_op(network_status(kubeconfig, context))
    if output == "json":
        typer.echo(json.dumps(rows, indent=2))
        return
    if not rows:
        console.print("no peer has a network connection on this cluster (`gpufed network connect`)")
        return
    console.print(status_table(rows))


@app.command()
def expose(
    address: Annotated[str, typer.Argument(help="a non-pod address of this cluster, e.g. a Service ClusterIP")],
    kubeconfig: Kubeconfig,
    context: Context = None,
) -> None:
    """Make one of this cluster's non-pod addresses reachable from peers' pods (external CIDR)."""
    from gpufed.kube.client import api_client
    from netfabric import ops

    async def go() -> dict[str, Any]:
        async with api_client(kubeconfig, context) as api:
            return await ops.expose(api, address)

    out = run_op(go())
    console.print(f"{out['address']} is {out['externalAddress']} in this cluster's external CIDR")
    for peer, addr in sorted(out["peersReachItAt"].items()):
        console.print(f"  pods of {peer} reach it at {addr}")


def gateway(
    name: Annotated[
        str, typer.Option("--name", envvar="GPUFED_GATEWAY_NAME", help="the peer's cluster id (the Gateway's name)")
    ],
    kubeconfig: Annotated[
        Path | None,
        typer.Option(
            "--kubeconfig",
            envvar="GPUFED_KUBECONFIG",
            help="kubeconfig of the gateway's identity [default: the pod's service account]",
        ),
    ] = None,
    context: Annotated[str | None, typer.Option("--context", envvar="GPUFED_CONTEXT")] = None,
    netns: Annotated[
        str | None,
        typer.Option(
            "--netns", envvar="GPUFED_GATEWAY_NETNS", help="named network namespace of the data plane [default: own]"
        ),
    ] = None,
    wireguard_go: Annotated[
        Path,
        typer.Option("--wireguard-go", envvar="GPUFED_WIREGUARD_GO", help="wireguard-go binary (no kernel WireGuard)"),
    ] = Path("wireguard-go"),
    probe_interval: Annotated[float, typer.Option("--probe-interval", help="seconds between tunnel probes")] = 2.0,
    metrics_port: MetricsPort = None,
    metrics_host: MetricsHost = METRICS_HOST,
    log_level: Annotated[str, typer.Option("--log-level", envvar="GPUFED_LOG_LEVEL")] = "info",
) -> None:
    """Run one peering's gateway: WireGuard, prefix NAT, routes, and the Connection status."""
    from gpufed.kube.client import api_client
    from gpufed.kube.metrics import serving
    from netfabric.controllers.gateway import GatewayAgent, GatewaySettings

    configure_logging(log_level)
    settings = GatewaySettings(name=name, netns=netns, wireguard_go=wireguard_go, probe_interval_s=probe_interval)

    async def run() -> None:
        async with serving(metrics_port, metrics_host), api_client(kubeconfig, context) as api:
            await GatewayAgent(api, settings).run()

    serve(run)
