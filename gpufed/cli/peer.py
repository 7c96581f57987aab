"""`gpufed peer`, `gpufed unpeer`, `gpufed info`: flags -> `gpufed.ops.peer` (peer, unpeer),
`gpufed.ops.force_unpeer` (unpeer --force) and `peering.ops.peer` (info), progress on stderr, the
result on stdout.

Every local input (both kubeconfigs and contexts, the slice asked for, the network flags, the
`--force` flags and the peer's ClusterID) is checked before either cluster is contacted; a bad one
exits 2. The operations are imported when a
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
  # the provider gpu-a-1a2b3c4d is gone for good: forget it on the consumer
  gpufed unpeer --force --context consumer --provider gpu-a-1a2b3c4d
  # the consumer consumer-5e6f7a8b is gone for good: forget it on the provider
  gpufed unpeer --force --context gpu-a --consumer consumer-5e6f7a8b
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


def _check_force(
    force: bool,
    provider_id: str | None,
    consumer_id: str | None,
    remote_kubeconfig: object,
    remote_context: object,
) -> tuple[str, str] | None:
    """(side this cluster plays, the gone peer's ClusterID) for `--force`; None without it."""
    from gpufed.apis.wire import parse_cluster_id
    from gpufed.errors import UsageError

    named = [(flag, v) for flag, v in (("--provider", provider_id), ("--consumer", consumer_id)) if v is not None]
    if not force:
        if named:
            raise UsageError(f"{named[0][0]} names a peer that is gone: it goes with --force only")
        return None
    if len(named) != 1:
        raise UsageError(
            "--force forgets one peer that is gone, on the cluster that is left: name it with --provider ID "
            "(run on the consumer) or --consumer ID (run on the provider), not both"
        )
    if remote_kubeconfig is not None or remote_context is not None:
        raise UsageError(
            "--force works on one cluster, the one that is left: drop --remote-kubeconfig/--remote-context "
            "(while both clusters answer, unpeer without --force removes the peering on both)"
        )
    flag, value = named[0]
    try:
        peer = parse_cluster_id(value or "")
    except ValueError as e:
        raise UsageError(f"{flag}: {e}") from None
    return ("consumer" if flag == "--provider" else "provider"), peer


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
    force: Annotated[
        bool,
        typer.Option(
            "--force",
            help="the peer is gone for good: remove the peering from this one cluster (--kubeconfig, --context) "
            "only, without contacting the peer; needs --provider or --consumer",
        ),
    ] = False,
    provider_id: Annotated[
        str | None,
        typer.Option(
            "--provider",
            help="with --force, run on the consumer: the ClusterID of the provider that is gone (its virtual "
            "nodes, credentials and gateway are removed, its pods failed back with reason ProviderGone)",
        ),
    ] = None,
    consumer_id: Annotated[
        str | None,
        typer.Option(
            "--consumer",
            help="with --force, run on the provider: the ClusterID of the consumer that is gone (its tenant "
            "and twin namespaces, CSRs and gateway are removed)",
        ),
    ] = None,
) -> None:
    """Remove everything a peering created on both clusters, the network fabric included; with
    --force, remove it from the one cluster that is left when the other is gone for good."""
    from gpufed.ops import peer as ops

    check_timeout(timeout)
    forced = checked(lambda: _check_force(force, provider_id, consumer_id, remote_kubeconfig, remote_context))
    if forced is not None:
        from gpufed.apis.wire import ClusterID
        from gpufed.ops import force_unpeer as fops

        side, peer_id = forced
        target = checked(lambda: resolve(kubeconfig, context, role=side))
        req = fops.ForceRequest(
            _ref(target, side),
            "consumer" if side == "consumer" else "provider",
            ClusterID(peer_id),
            delete_volumes=delete_volumes,
            timeout_s=timeout,
        )
        removed = run_op(fops.force_unpeer(req, Report()))
        stdout_console().print(f"forgot {peer_id} on this {side}: {removed} object(s) removed or failed back")
        return
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
