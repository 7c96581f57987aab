"""`gpufed peer`, `gpufed unpeer`, `gpufed info`: flags -> `gpufed.ops.peer` (peer, unpeer) and
`peering.ops.peer` (info), progress on stderr, the result on stdout.

Every local input (both kubeconfigs and contexts, the slice asked for, the network flags) is
checked before either cluster is contacted; a bad one exits 2. The operations are imported when a
command runs, not with the CLI (gpufed.cli says why).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.markup import escape

from gpufed.cli import network as net
from gpufed.cli.common import Report, Timeout, check_timeout, checked, console, fail, run_op
from gpufed.cli.kubeconfig import Context, Kubeconfig, RemoteContext, RemoteKubeconfig, Target, resolve, resolve_pair
from gpufed.cli.output import Output, check_output, emit, stdout_console, table
from peering.defaults import OPERATION_TIMEOUT_S

if TYPE_CHECKING:
    from peering.ops.peer import ClusterRef

PEER_EPILOG = """Examples:

  # both clusters are contexts of $KUBECONFIG (or ~/.kube/config)
  gpufed peer --context consumer --remote-context gpu-a --gpus 8
  # the provider's kubeconfig is another file
  gpufed peer --kubeconfig consumer.yaml --remote-kubeconfig gpu-a.yaml --gpus 4 --gpu-product NVIDIA-H100-80GB-HBM3
  gpufed peer --context consumer --remote-context gpu-a --no-network
"""
UNPEER_EPILOG = """Examples:

  gpufed unpeer --context consumer --remote-context gpu-a
  gpufed unpeer --kubeconfig consumer.yaml --remote-kubeconfig gpu-a.yaml --delete-volumes
"""
INFO_EPILOG = """Examples:

  gpufed info
  # a provider: its consumers and their twin namespaces
  gpufed info --context gpu-a -o wide
  gpufed info -o yaml
"""


def _ref(target: Target, role: str) -> ClusterRef:
    from peering.ops.peer import ClusterRef

    return ClusterRef(target.kubeconfig, target.context, role)


def _check_slice(resources: dict[str, str], gpu_product: str | None) -> None:
    """The slice as the provider would validate it (any provider: the ID only names it)."""
    from gpufed.apis.wire import ClusterID
    from gpufed.errors import UsageError
    from peering.ops.peer import PeerError, validate_request

    try:
        validate_request(resources, gpu_product, ClusterID("provider"))
    except PeerError as e:
        raise UsageError(str(e)) from None


def peer(
    kubeconfig: Kubeconfig = None,
    remote_kubeconfig: RemoteKubeconfig = None,
    context: Context = None,
    remote_context: RemoteContext = None,
    gpus: Annotated[int, typer.Option("--gpus", help="nvidia.com/gpu to ask for")] = 0,
    gpu_product: Annotated[
        str | None, typer.Option("--gpu-product", help="only GPUs of this nvidia.com/gpu.product")
    ] = None,
    cpu: Annotated[str, typer.Option("--cpu", help="CPU to ask for (quantity)")] = "16",
    memory: Annotated[str, typer.Option("--memory", help="memory to ask for (quantity)")] = "64Gi",
    pods: Annotated[int, typer.Option("--pods", help="pods to ask for")] = 110,
    storage: Annotated[
        str | None,
        typer.Option(
            "--storage",
            help="total size of the PersistentVolumeClaims to ask for (quantity, e.g. 100Gi) (default: none)",
        ),
    ] = None,
    remote_api_server: Annotated[
        str | None,
        typer.Option(
            "--remote-api-server", help="provider API URL as the consumer reaches it (default: from its kubeconfig)"
        ),
    ] = None,
    timeout: Timeout = OPERATION_TIMEOUT_S,
    no_network: Annotated[
        bool, typer.Option("--no-network", help="control plane only: no tunnel (`gpufed network connect` later)")
    ] = False,
    gateway_endpoint: net.GatewayEndpoint = None,
    pod_cidr: net.PodCIDR = None,
    remote_pod_cidr: net.RemotePodCIDR = None,
    mtu: net.MTU = 0,
    masquerade: net.Masquerade = False,
    driver: net.Driver = "auto",
) -> None:
    """Peer the consumer (--kubeconfig, --context) with the provider (--remote-kubeconfig,
    --remote-context), negotiate a slice and configure the network fabric."""
    from gpufed.apis.pool import GPU_RESOURCE
    from gpufed.apis.wire import STORAGE_RESOURCE
    from gpufed.ops import peer as ops
    from peering.ops.peer import PeerRequest

    check_timeout(timeout)
    network = (
        None
        if no_network
        else net.network_options(gateway_endpoint, pod_cidr, remote_pod_cidr, mtu, masquerade, driver)
    )
    resources = {"cpu": cpu, "memory": memory, "pods": str(pods)}
    if gpus != 0:  # negative values reach validation and get its error
        resources[GPU_RESOURCE] = str(gpus)
    if storage is not None:
        resources[STORAGE_RESOURCE] = storage
    checked(lambda: _check_slice(resources, gpu_product))
    consumer, provider = checked(lambda: resolve_pair(kubeconfig, context, remote_kubeconfig, remote_context))
    req = PeerRequest(
        consumer=_ref(consumer, "consumer"),
        provider=_ref(provider, "provider"),
        resources=resources,
        gpu_product=gpu_product,
        timeout_s=timeout,
        provider_api_server=remote_api_server,
    )
    result = run_op(ops.peer(ops.PeerSettings(req, network), Report()))
    out = stdout_console()
    t = table(
        f"slice {result.consumer_id} → {result.provider_id}: {result.reason}",
        ("resource", "requested", "granted"),
        right=("requested", "granted"),
    )
    for r in sorted(result.requested):
        t.add_row(r, result.requested[r], result.granted.get(r, "0"))
    out.print(t)
    if not result.accepted:
        raise fail(f"{result.provider_id} denied the slice: {result.reason}: {result.message}", code=3)
    if result.reason != "Granted":
        console.print(f"[yellow]note:[/] {escape(result.message)}")
    out.print(f"[bold green]peered[/] {result.consumer_id} with {result.provider_id}")


def unpeer(
    kubeconfig: Kubeconfig = None,
    remote_kubeconfig: RemoteKubeconfig = None,
    context: Context = None,
    remote_context: RemoteContext = None,
    timeout: Timeout = OPERATION_TIMEOUT_S,
    delete_volumes: Annotated[
        bool,
        typer.Option(
            "--delete-volumes",
            help="also when claims keep their data on the provider: delete those claims, and so their data "
            "on the provider, which is lost (without it, unpeering is refused while such claims exist)",
        ),
    ] = False,
) -> None:
    """Remove everything a peering created on both clusters, the network fabric included."""
    from gpufed.ops import peer as ops

    check_timeout(timeout)
    consumer, provider = checked(lambda: resolve_pair(kubeconfig, context, remote_kubeconfig, remote_context))
    run_op(
        ops.unpeer(
            _ref(consumer, "consumer"), _ref(provider, "provider"), Report(), timeout, delete_volumes=delete_volumes
        )
    )


def info(
    kubeconfig: Kubeconfig = None,
    context: Context = None,
    output: Output = "table",
) -> None:
    """This cluster's peerings: phase, requested vs granted, used vs granted per resource."""
    from peering.ops import peer as ops

    check_output(output)
    target = checked(lambda: resolve(kubeconfig, context))
    data = run_op(ops.info(_ref(target, "cluster")))
    data["connections"] = run_op(net.network_status(target.kubeconfig, target.context))
    if emit(data, output):
        return
    render_info(data, wide=output == "wide")


def render_info(data: dict[str, Any], *, wide: bool) -> None:
    """`gpufed info` as tables on stdout; `wide` lists every claim and the tunnels' details."""
    out = stdout_console()
    out.print(f"cluster [bold]{escape(data['clusterId'])}[/] (key {escape(data['keyFingerprint'])})")
    t = table(
        "providers (this cluster consumes)",
        ("provider", "phase", "slice", "resource", "requested", "granted", "used", "decision"),
        right=("requested", "granted", "used"),
    )
    for p in data["providers"]:
        if not p["slices"]:
            t.add_row(p["clusterId"], p["phase"], "-", "", "", "", "", "")
        for s in p["slices"]:
            for i, r in enumerate(sorted(s["requested"])):
                t.add_row(
                    p["clusterId"] if i == 0 else "",
                    p["phase"] if i == 0 else "",
                    s["name"] if i == 0 else "",
                    r,
                    s["requested"][r],
                    s["granted"].get(r, "0"),
                    s["used"].get(r, "0"),
                    s["reason"] if i == 0 else "",
                )
    out.print(t)
    for p in data["providers"]:
        if p.get("claims"):
            limit = len(p["claims"]) if wide else 10
            shown = ", ".join(f"{c['claim']} ({c['size']})" for c in p["claims"][:limit])
            more = f", and {len(p['claims']) - limit} more" if len(p["claims"]) > limit else ""
            out.print(f"claims bound on {p['clusterId']}: {len(p['claims'])}: {shown}{more}", markup=False)
    if data["consumers"]:
        c = table("consumers (this cluster provides)", ("consumer", "phase", "granted", "used", "twin namespaces"))
        for x in data["consumers"]:
            fmt = ", ".join(f"{k}={v}" for k, v in sorted(x["granted"].items()))
            used = ", ".join(f"{k}={v}" for k, v in sorted(x["used"].items()))
            c.add_row(x["clusterId"], x["phase"], fmt, used, ", ".join(x["twinNamespaces"]))
        out.print(c)
    if data["connections"]:
        out.print(net.status_table(data["connections"], wide=wide))
