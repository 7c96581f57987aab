"""`gpufed network connect | disconnect | status | expose` and `gpufed gateway`: flags ->
`netfabric.ops` / `netfabric.controllers.gateway`; progress on stderr, results and tables on stdout.

Kubeconfigs, contexts and flags are checked before anything connects (exit 2). The operations
are imported when a command runs, not with the CLI (gpufed.cli says why).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.markup import escape
from rich.table import Table

from gpufed.cli.common import (
    MetricsHost,
    MetricsPort,
    Report,
    Timeout,
    check_timeout,
    checked,
    configure_logging,
    console,
    fail,
    run_op,
    serve,
)
from gpufed.cli.kubeconfig import Context, Kubeconfig, RemoteContext, RemoteKubeconfig, resolve, resolve_pair
from gpufed.cli.output import Output, check_output, emit, stdout_console, table
from gpufed.defaults import METRICS_HOST
from peering.defaults import OPERATION_TIMEOUT_S

if TYPE_CHECKING:
    from netfabric.ops import NetworkOptions
    from peering.ops.peer import ClusterRef

app = typer.Typer(help="The WireGuard fabric between peered clusters.", no_args_is_help=True)

CONNECT_EPILOG = """Examples:

  gpufed network connect --context consumer --remote-context gpu-a --wait
  gpufed network connect --kubeconfig consumer.yaml --remote-kubeconfig gpu-a.yaml --masquerade
"""
DISCONNECT_EPILOG = """Examples:

  gpufed network disconnect --context consumer --remote-context gpu-a
"""
STATUS_EPILOG = """Examples:

  gpufed network status
  gpufed network status --context gpu-a -o wide
  gpufed network status -o json | jq '.[] | select(.phase != "Connected")'
"""
EXPOSE_EPILOG = """Examples:

  # e.g. a Service's ClusterIP
  gpufed network expose 10.96.0.10
"""
GATEWAY_EPILOG = """Examples:

  # the controller runs it in each peering's gateway pod
  gpufed gateway --name gpu-a-3f2c91d0
  gpufed gateway --name gpu-a-3f2c91d0 --kubeconfig gw.yaml --netns gw-gpu-a --metrics-port 9102
"""
GatewayEndpoint = Annotated[
    str | None,
    typer.Option(
        "--gateway-endpoint",
        help="HOST[:PORT] where the consumer's gateway reaches the provider's (default: its NetworkConfig)",
    ),
]
PodCIDR = Annotated[str | None, typer.Option("--pod-cidr", help="consumer pod CIDR, if it has no NetworkConfig yet")]
RemotePodCIDR = Annotated[
    str | None, typer.Option("--remote-pod-cidr", help="provider pod CIDR, if it has no NetworkConfig yet")
]
MTU = Annotated[int, typer.Option("--mtu", help="tunnel MTU (default 0: underlay MTU minus 80 B, 1420 on 1500)")]
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
    from pydantic import ValidationError

    from gpufed.apis.network import NetworkConfigSpec
    from netfabric import ops

    for flag, cidr in (("--pod-cidr", pod_cidr), ("--remote-pod-cidr", remote_pod_cidr)):
        try:
            if cidr is not None:
                NetworkConfigSpec(pod_cidr=cidr)
        except ValidationError as e:
            raise fail(f"{flag}: invalid pod CIDR {cidr!r}: {e.errors()[0]['msg']}", code=2) from None
    if endpoint:
        try:
            NetworkConfigSpec(pod_cidr="10.0.0.0/16", gateway_endpoint=endpoint)
        except ValidationError as e:
            raise fail(f"--gateway-endpoint: {e.errors()[0]['msg']}", code=2) from None
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


def _pair(
    kubeconfig: Path | None, context: str | None, remote_kubeconfig: Path | None, remote_context: str | None
) -> tuple[ClusterRef, ClusterRef]:
    from peering.ops.peer import ClusterRef

    consumer, provider = checked(lambda: resolve_pair(kubeconfig, context, remote_kubeconfig, remote_context))
    return (
        ClusterRef(consumer.kubeconfig, consumer.context, "consumer"),
        ClusterRef(provider.kubeconfig, provider.context, "provider"),
    )


@app.command(epilog=CONNECT_EPILOG)
def connect(
    kubeconfig: Kubeconfig = None,
    remote_kubeconfig: RemoteKubeconfig = None,
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
    """Configure the tunnel between the consumer (--kubeconfig, --context) and the provider
    (--remote-kubeconfig, --remote-context)."""
    from netfabric import ops

    check_timeout(timeout)
    opts = network_options(
        gateway_endpoint, pod_cidr, remote_pod_cidr, mtu, masquerade, driver, timeout if wait else 0.0
    )
    consumer, provider = _pair(kubeconfig, context, remote_kubeconfig, remote_context)
    out = run_op(ops.connect(consumer, provider, opts, Report()))
    stdout_console().print(
        f"[bold green]connected[/] {out['consumer']} ↔ {out['provider']} via {out['endpoint']}: "
        f"provider pods appear at {out['providerPodsSeenAt']} on the consumer"
        + ("" if wait else " (`gpufed network status` shows the tunnel)")
    )


@app.command(epilog=DISCONNECT_EPILOG)
def disconnect(
    kubeconfig: Kubeconfig = None,
    remote_kubeconfig: RemoteKubeconfig = None,
    context: Context = None,
    remote_context: RemoteContext = None,
) -> None:
    """Remove the tunnel's objects on both sides (the gateways tear their data plane down)."""
    from netfabric import ops

    consumer, provider = _pair(kubeconfig, context, remote_kubeconfig, remote_context)
    run_op(ops.disconnect(consumer, provider, Report()))


async def network_status(kubeconfig: Path, context: str | None) -> list[dict[str, Any]]:
    from gpufed.kube.client import api_client, require_kubeconfig
    from netfabric import ops

    require_kubeconfig(kubeconfig)
    async with api_client(kubeconfig, context) as api:
        return await ops.status(api)


def status_table(rows: list[dict[str, Any]], *, wide: bool = False) -> Table:
    """The tunnels; `wide` adds the driver, MTU and the message."""
    columns = ["peer", "role", "status", "reason", "rtt ms", "peer pods", "seen at"]
    t = table("connections", [*columns, "driver", "mtu", "message"] if wide else columns, right=("rtt ms", "mtu"))
    for r in rows:
        color = {"Connected": "green", "Degraded": "yellow", "Down": "red"}.get(r["phase"], "white")
        row = [
            escape(r["cluster"]),
            escape(r["role"]),
            f"[{color}]{escape(r['phase'])}[/]",
            escape(r["reason"]),
            "" if r["rttMs"] is None else f"{r['rttMs']:.2f}",
            escape(r["podCidr"]),
            escape(r["mappedPodCidr"]),
        ]
        if wide:
            row += [escape(r["driver"]), str(r["mtu"] or ""), escape(r["message"])]
        t.add_row(*row)
    return t


@app.command(epilog=STATUS_EPILOG)
def status(
    kubeconfig: Kubeconfig = None,
    context: Context = None,
    output: Output = "table",
) -> None:
    """Every peer's tunnel on this cluster: Connected / Degraded / Down and why, RTT, mappings."""
    check_output(output)
    target = checked(lambda: resolve(kubeconfig, context))
    rows = run_op(network_status(target.kubeconfig, target.context))
    if emit(rows, output):
        return
    if not rows:
        console.print("no peer has a network connection on this cluster (`gpufed network connect`)")
        return
    stdout_console().print(status_table(rows, wide=output == "wide"))


@app.command(epilog=EXPOSE_EPILOG)
def expose(
    address: Annotated[str, typer.Argument(help="a non-pod address of this cluster, e.g. a Service ClusterIP")],
    kubeconfig: Kubeconfig = None,
    context: Context = None,
) -> None:
    """Make one of this cluster's non-pod addresses reachable from peers' pods (external CIDR)."""
    import ipaddress

    from gpufed.kube.client import api_client
    from netfabric import ops

    try:
        ipaddress.IPv4Address(address)
    except ValueError:
        raise fail(f"{address!r} is not an IPv4 address", code=2) from None
    target = checked(lambda: resolve(kubeconfig, context))

    async def go() -> dict[str, Any]:
        async with api_client(target.kubeconfig, target.context) as api:
            return await ops.expose(api, address)

    got = run_op(go())
    out = stdout_console()
    out.print(f"{got['address']} is {got['externalAddress']} in this cluster's external CIDR", markup=False)
    for peer, addr in sorted(got["peersReachItAt"].items()):
        out.print(f"  pods of {peer} reach it at {addr}", markup=False)


def gateway(
    name: Annotated[
        str,
        typer.Option(
            "--name", envvar="GPUFED_GATEWAY_NAME", help="the peer's cluster id (the name of its Gateway.gpufed.io)"
        ),
    ],
    kubeconfig: Annotated[
        Path | None,
        typer.Option(
            "--kubeconfig",
            envvar="GPUFED_KUBECONFIG",
            help="kubeconfig of the gateway's identity (default: the pod's service account)",
        ),
    ] = None,
    context: Annotated[str | None, typer.Option("--context", envvar="GPUFED_CONTEXT")] = None,
    netns: Annotated[
        str | None,
        typer.Option(
            "--netns", envvar="GPUFED_GATEWAY_NETNS", help="named network namespace of the data plane (default: own)"
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
