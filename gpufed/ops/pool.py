"""`gpufed pool`: the consumer's view of the global GPU pool.

Owns: reading the virtual nodes (their `gpufed.io/gpu-pool` figures, written by each pool's
virtual kubelet from the provider's capacity estimator and the grant; readiness), the pods
waiting for GPUs (Pending, not bound to any node) and the virtual PersistentVolumes (claims bound on
a provider, `vkprovider.remote.volumes`) into one report: per provider and product — total, granted,
in use, free, held back for a waiting group, largest placeable shape —, the pending GPU demand, and
per provider the claims bound there (count, storage, each claim with its size and the provider's
claim's phase).

Reads only the consumer's API (the figures come from the virtual kubelets, which hold the
estimator streams); writes nothing.
"""

from __future__ import annotations

import contextlib
from decimal import Decimal
from pathlib import Path
from typing import Any

from gpufed.apis.pool import GPU_PRODUCT_LABEL, GPU_RESOURCE
from gpufed.apis.quantity import format_quantity, parse
from gpufed.apis.wire import POOL_ANNOTATION, REMOTE_CLUSTER_LABEL, TYPE_LABEL, VIRTUAL_NODE_TYPE
from gpufed.kube import rest
from gpufed.kube.client import api_client
from peering.grants import pod_requests
from peering.ops import volumes as peering_volumes
from vkprovider.forge.pools import parse_figures


def _gpus(pod: dict[str, Any]) -> int:
    return int(pod_requests(pod).get(GPU_RESOURCE, Decimal(0)))


def _ready(node: dict[str, Any]) -> bool:
    conditions = (node.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


def claims_by_provider(volumes: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """provider -> {claims, storage, items}: the claims bound there, from the virtual volumes (pure)."""
    out: dict[str, dict[str, Any]] = {}
    for c in peering_volumes.claims_of(volumes):
        row = out.setdefault(c.provider, {"claims": 0, "storage": Decimal(0), "items": []})
        row["claims"] += 1
        with contextlib.suppress(ValueError):
            row["storage"] += parse(c.size)
        item = {"claim": f"{c.namespace}/{c.name}", "size": c.size, "phase": c.phase, "remotePhase": c.remote_phase}
        row["items"].append(item)
    for row in out.values():
        row["storage"] = format_quantity(row["storage"], binary=True)
    return out


def report(
    nodes: list[dict[str, Any]], pods: list[dict[str, Any]], volumes: list[dict[str, Any]] | None = None
) -> dict[str, Any]:
    """The report from the virtual nodes, the consumer's pods and its virtual volumes (pure)."""
    pools = []
    for node in sorted(nodes, key=lambda n: str(n["metadata"]["name"])):
        meta = node["metadata"]
        labels = meta.get("labels") or {}
        figures = parse_figures((meta.get("annotations") or {}).get(POOL_ANNOTATION, ""))
        allocatable = (node.get("status") or {}).get("allocatable") or {}
        row: dict[str, Any] = {
            "provider": labels.get(REMOTE_CLUSTER_LABEL, ""),
            "node": meta["name"],
            "product": labels.get(GPU_PRODUCT_LABEL, ""),
            "ready": _ready(node),
            "allocatable": int(allocatable.get(GPU_RESOURCE, "0") or 0),
        }
        if figures is not None:
            row.update(
                product=figures.product or row["product"],
                total=figures.total,
                granted=figures.granted,
                inUse=figures.in_use,
                free=figures.free,
                reserved=figures.reserved,
                largestPlaceable=figures.largest_placeable,
                inFlight=figures.in_flight,
                capacity=figures.capacity_source,
            )
        else:
            unknown = ("total", "granted", "inUse", "free", "reserved", "largestPlaceable")
            row.update(dict.fromkeys(unknown), capacity="unknown")
        pools.append(row)
    waiting = [
        p
        for p in pods
        if (p.get("status") or {}).get("phase", "Pending") == "Pending"
        and not (p.get("spec") or {}).get("nodeName")
        and not p["metadata"].get("deletionTimestamp")
        and _gpus(p) > 0
    ]
    demand = [_gpus(p) for p in waiting]
    return {
        "pools": pools,
        "pending": {
            "pods": len(demand),
            "gpus": sum(demand),
            "largest": max(demand, default=0),
            "podNames": sorted(f"{p['metadata']['namespace']}/{p['metadata']['name']}" for p in waiting)[:50],
        },
        "claims": claims_by_provider(volumes or []),
    }


async def pool(kubeconfig: Path, context: str | None) -> dict[str, Any]:
    async with api_client(kubeconfig, context) as api:
        nodes = await rest.list_items(
            api, "/api/v1/nodes", params={"labelSelector": f"{TYPE_LABEL}={VIRTUAL_NODE_TYPE}"}
        )
        pods = await rest.list_items(
            api, "/api/v1/pods", params={"fieldSelector": "spec.nodeName=,status.phase=Pending"}
        )
        volumes = await peering_volumes.read_volumes(api)
    return report(nodes, pods, volumes)
