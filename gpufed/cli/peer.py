"""`gpufed peer`, `gpufed unpeer`, `gpufed info`: flags -> `gpufed.ops.peer` (peer, unpeer) and
`peering.ops.peer` (info), with rich progress.

The operations are imported when a command runs, not with the CLI (gpufed.cli says why).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from gpufed.cli import network as net
from gpufed.cli.common import Context, Kubeconfig, Output, Report, Timeout, check_output, console, fail, run_op
from peering.defaults import OPERATION_TIMEOUT_S

RemoteKubeconfig = Annotated[Path, typer.Option("--remote-kubeconfig", help="kubeconfig of the provider cluster")]
RemoteContext = Annotated[str | None, typer.Option("--remote-context", help="context in --remote-kubeconfig")]


def peer(
    kubeconfig: Kubeconfig,
    remote_kubeconfig: RemoteKubeconfig,
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
            help="total size of the PersistentVolumeClaims to ask for (quantity, e.g. 100Gi) [default: none]",
        ),
    ] = None,
    remote_api_server: Annotated[
        str | None,
        typer.Option(
            "--remote-api-server", help="provider API URL as the consumer reaches it [default: from its kubeconfig]"
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
    """Peer the consumer (--kubeconfig) with the provider (--remote-kubeconfig), negotiate a slice and
    configure the network fabric."""
    from gpufed.apis.pool import GPU_RESOURCE
    from gpufed.apis.wire import STORAGE_RESOURCE
    from gpufed.ops import peer as ops
    from peering.ops.peer import ClusterRef, PeerRequest

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
    req = PeerRequest(
        consumer=ClusterRef(kubeconfig, context, "consumer"),
        provider=ClusterRef(remote_kubeconfig, remote_context, "provider"),
        resources=resources,
        gpu_product=gpu_product,
        timeout_s=timeout,
        provider_api_server=remote_api_server,
    )
    result = run_op(ops.peer(ops.PeerSettings(req, network), Report()))
    table = Table(title=f"slice {result.consumer_id} → {result.provider_id}: {result.reason}")
    table.add_column("resource")
    table.add_column("requested", justify="right")
    table.add_column("granted", justify="right")
    for r in sorted(result.requested):
        table.add_row(r, result.requested[r], result.granted.get(r, "0"))
    console.print(table)
    if not result.accepted:
        raise fail(f"{result.provider_id} denied the slice: {result.reason}: {result.message}", code=3)
    if result.reason != "Granted":
        console.print(f"[yellow]note:[/] {result.message}")
    console.print(f"[bold green]peered[/] {result.consumer_id} with {result.provider_id}")


def unpeer(
    kubeconfig: Kubeconfig,
    remote_kubeconfig: RemoteKubeconfig,
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
    from peering.ops.peer import ClusterRef

    consumer = ClusterRef(kubeconfig, context, "consumer")
    provider = ClusterRef(remote_kubeconfig, remote_context, "provider")
    run_op(ops.unpeer(consumer, provider, Report(), timeout, delete_volumes=delete_volumes))


def info(
    kubeconfig: Kubeconfig,
    context: Context = None,
    output: Output = "table",
) -> None:
    """This cluster's peerings: phase, requested vs granted, used vs granted per resource."""
    from peering.ops import peer as ops
    from peering.ops.peer import ClusterRef

    check_output(output)
    data = run_op(ops.info(ClusterRef(kubeconfig, context, "cluster")))
    data["connections"] = run_op(net.network_status(kubeconfig, context))
    if output == "json":
        typer.echo(json.dumps(data, indent=2))
        return
    console.print(f"cluster [bold]{data['clusterId']}[/] (key {data['keyFingerprint']})")
    t = Table(title="providers (this cluster consumes)")
    for col in ("provider", "phase", "slice", "resource", "requested", "granted", "used", "decision"):
        t.add_column(col)
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
    console.print(t)
    for p in data["providers"]:
        if p.get("claims"):
            shown = ", ".join(f"{c['claim']} ({c['size']})" for c in p["claims"][:10])
            more = f", and {len(p['claims']) - 10} more" if len(p["claims"]) > 10 else ""
            console.print(f"claims bound on {p['clusterId']}: {len(p['claims'])}: {shown}{more}")
    if data["consumers"]:
        c = Table(title="consumers (this cluster provides)")
        for col in ("consumer", "phase", "granted", "used", "twin namespaces"):
            c.add_column(col)
        for x in data["consumers"]:
            fmt = ", ".join(f"{k}={v}" for k, v in sorted(x["granted"].items()))
            used = ", ".join(f"{k}={v}" for k, v in sorted(x["used"].items()))
            c.add_row(x["clusterId"], x["phase"], fmt, used, ", ".join(x["twinNamespaces"]))
        console.print(c)
    if data["connections"]:
        console.print(net.status_table(data["connections"]))
