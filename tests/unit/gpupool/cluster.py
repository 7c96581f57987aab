"""In-memory clusters for the capacity model's tests: Node and Pod objects and an Inventory fed with them."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from gpupool.inventory import Inventory

H100 = "NVIDIA-H100-80GB-HBM3"
A100 = "NVIDIA-A100-SXM4-40GB"
GiB = 1024**3


def node(
    name: str,
    *,
    gpus: int = 8,
    product: str | None = H100,
    cpu: str = "96",
    memory: str = "1024Gi",
    pods: int = 110,
    ready: bool = True,
    unschedulable: bool = False,
    taints: Sequence[Mapping[str, str]] = (),
    labels: Mapping[str, str] | None = None,
    annotations: Mapping[str, str] | None = None,
    capacity_gpus: int | None = None,
) -> dict[str, Any]:
    lab = dict(labels or {})
    if product is not None:
        lab.setdefault("nvidia.com/gpu.product", product)
    alloc = {"cpu": cpu, "memory": memory, "pods": str(pods)}
    cap = dict(alloc)
    if gpus or capacity_gpus:
        alloc["nvidia.com/gpu"] = str(gpus)
        cap["nvidia.com/gpu"] = str(gpus if capacity_gpus is None else capacity_gpus)
    return {
        "metadata": {"name": name, "labels": lab, "annotations": dict(annotations or {})},
        "spec": {"unschedulable": unschedulable, "taints": list(taints)},
        "status": {
            "allocatable": alloc,
            "capacity": cap,
            "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
        },
    }


def pod(
    name: str,
    node_name: str | None,
    *,
    gpus: int = 0,
    cpu: str = "1",
    memory: str = "1Gi",
    phase: str = "Running",
    namespace: str = "team",
    spec: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    requests = {"cpu": cpu, "memory": memory}
    if gpus:
        requests["nvidia.com/gpu"] = str(gpus)
    s: dict[str, Any] = {"containers": [{"name": "c", "resources": {"requests": requests}}], **(spec or {})}
    if node_name:
        s["nodeName"] = node_name
    return {"metadata": {"namespace": namespace, "name": name}, "spec": s, "status": {"phase": phase}}


def inventory(*nodes: dict[str, Any], pods: Sequence[dict[str, Any]] = ()) -> Inventory:
    inv = Inventory()
    for n in nodes:
        inv.set_node(n)
    for p in pods:
        inv.set_pod(p)
    return inv


# ---- shape_of
