"""The live GPU capacity of one cluster: `Inventory`, an incremental model of its nodes and pods (pure).

Owns: `Inventory`, fed with watch events (`set_node`/`delete_node`, `set_pod`/`delete_pod`, and DRA
objects through `devices`, a `peering.devices.DeviceInventory`). Per node it keeps the facts
placement depends on (labels, taints, readiness, cordon, GPU health, allocatable, DRA GPUs) and the
summed requests of the non-terminal pods bound to it, so every answer is one pass over the nodes:
the `Snapshot` per GPU product, and `can_place`/`max_replicas` — whether one pod of a shape fits on
some node now, and how many do, with a sentence that says why (e.g. "no node of
NVIDIA-H100-80GB-HBM3 has 4 free GPUs (largest free on one node: 2; 8 free in total)"). The rules it
applies are those `gpupool.capacity` states.

Does not: talk to anyone. The estimator (`gpupool.estimator.server`) feeds it and serves its answers.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from decimal import ROUND_CEILING, ROUND_FLOOR, Decimal
from typing import Any

from gpufed.apis.pool import GPU_PRODUCT_LABEL, GPU_RESOURCE
from gpufed.apis.quantity import QuantityError, format_quantity, parse
from gpufed.apis.wire import GPU_HEALTH_ANNOTATION, GPU_SOURCE_ANNOTATION, GPU_UNHEALTHY, TYPE_LABEL, VIRTUAL_NODE_TYPE
from gpupool.capacity import (
    BLOCKING_EFFECTS,
    GPU_MEMORY_LABEL,
    GPU_TOLERATION,
    NO_RESOURCES,
    SNAPSHOT_TOLERATIONS,
    SOURCE_LABELS,
    SOURCE_NVML,
    TERMINAL_PHASES,
    Bucket,
    Placement,
    PodShape,
    ProductCapacity,
    Resources,
    Snapshot,
    Taint,
    Toleration,
    requirement,
    shape_of,
)
from gpupool.devices import groups
from peering.devices import DeviceInventory
from peering.grants import GPU_LABEL_PREFIXES, pod_requests


def _int(q: Any, *, scale: int = 1, ceil: bool) -> int:
    v = parse(str(q)) * scale
    return int(v.to_integral_value(rounding=ROUND_CEILING if ceil else ROUND_FLOOR))


@dataclass(frozen=True)
class _Node:
    product: str
    labels: Mapping[str, str]
    taints: tuple[Taint, ...]
    #: Ready, not cordoned, GPUs not reported unhealthy.
    healthy: bool
    nvml: bool
    capacity_gpus: int
    allocatable: Resources

    def untolerated(self, tolerations: Iterable[Toleration]) -> Taint | None:
        tols = tuple(tolerations)
        for t in self.taints:
            if t.effect in BLOCKING_EFFECTS and not any(tol.tolerates(t) for tol in tols):
                return t
        return None


def _node_from(node: Mapping[str, Any]) -> _Node:
    meta = node.get("metadata") or {}
    spec = node.get("spec") or {}
    status = node.get("status") or {}
    labels = {str(k): str(v) for k, v in (meta.get("labels") or {}).items()}
    annotations = meta.get("annotations") or {}
    ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions") or [])
    healthy = ready and not spec.get("unschedulable") and annotations.get(GPU_HEALTH_ANNOTATION) != GPU_UNHEALTHY
    taints = tuple(
        Taint(str(t.get("key") or ""), str(t.get("value") or ""), str(t.get("effect") or ""))
        for t in spec.get("taints") or []
        if isinstance(t, Mapping)
    )

    def quantity(d: Mapping[str, Any] | None, r: str, scale: int = 1) -> int:
        q = (d or {}).get(r)
        if q is None:
            return 0
        try:
            return max(0, _int(q, scale=scale, ceil=False))
        except QuantityError:
            return 0  # the API server validates quantities; a bad one counts as nothing

    alloc_raw = status.get("allocatable") or {}
    allocatable = Resources(
        quantity(alloc_raw, GPU_RESOURCE),
        quantity(alloc_raw, "cpu", 1000),
        quantity(alloc_raw, "memory"),
        quantity(alloc_raw, "pods"),
    )
    cap_raw = status.get("capacity") or {}
    capacity_gpus = quantity(cap_raw, GPU_RESOURCE) if GPU_RESOURCE in cap_raw else allocatable.gpus
    return _Node(
        product=labels.get(GPU_PRODUCT_LABEL, ""),
        labels=labels,
        taints=taints,
        healthy=healthy,
        nvml=annotations.get(GPU_SOURCE_ANNOTATION) == SOURCE_NVML,
        capacity_gpus=capacity_gpus,
        allocatable=allocatable,
    )


def _fmt_cpu(millis: int) -> str:
    return format_quantity(Decimal(millis) / 1000)


def _fmt_mem(b: int) -> str:
    return format_quantity(b, binary=True)


def _plural(n: int, one: str, many: str | None = None) -> str:
    return f"{n} {one if n == 1 else (many or one + 's')}"


class _Agg:
    """Running sums of one product while building a snapshot."""

    def __init__(self) -> None:
        self.nodes = 0
        self.unhealthy = 0
        self.total = 0
        self.allocatable = 0
        self.in_use = 0
        self.free = 0
        self.largest = 0
        self.largest_node = 0
        self.hist: Counter[int] = Counter()
        self.cpu = 0
        self.mem = 0
        self.pods = 0
        self.labels: dict[str, str] | None = None
        self.all_nvml = True
        self.seen = 0


class Inventory:
    """Nodes and the load of bound pods, updated one watch event at a time.

    `changes` counts updates that changed anything an answer depends on (heartbeats of a node or
    status updates of a bound pod do not), so a caller can skip recomputing for them.
    """

    def __init__(self) -> None:
        self._nodes: dict[str, _Node] = {}
        #: (namespace, name) -> (node, requests) of non-terminal bound pods.
        self._pods: dict[tuple[str, str], tuple[str, Resources]] = {}
        #: node name -> summed requests of its pods (kept for nodes not seen yet as well).
        self._used: dict[str, Resources] = {}
        self.changes = 0
        #: DRA devices: GPUs a class maps to `nvidia.com/gpu` count on their node like device-plugin GPUs.
        self.devices = DeviceInventory()

    # ---- feeding

    def set_node(self, node: Mapping[str, Any]) -> None:
        meta = node.get("metadata") or {}
        name = str(meta.get("name") or "")
        if not name:
            return
        if (meta.get("labels") or {}).get(TYPE_LABEL) == VIRTUAL_NODE_TYPE:
            self.delete_node(name)
            return
        new = _node_from(node)
        if self._nodes.get(name) != new:
            self._nodes[name] = new
            self.changes += 1

    def delete_node(self, name: str) -> None:
        if self._nodes.pop(name, None) is not None:
            self.changes += 1

    def set_pod(self, pod: Mapping[str, Any]) -> None:
        meta = pod.get("metadata") or {}
        key = (str(meta.get("namespace") or ""), str(meta.get("name") or ""))
        node = str((pod.get("spec") or {}).get("nodeName") or "")
        phase = (pod.get("status") or {}).get("phase")
        if not node or phase in TERMINAL_PHASES:
            self.delete_pod(*key)
            return
        try:
            need = requirement(pod_requests(pod))
        except ValueError:
            return  # a quantity the API server accepted but we cannot read: keep what we had
        if self._pods.get(key) == (node, need):
            return
        self._unload(key)
        self._pods[key] = (node, need)
        self._used[node] = self._used.get(node, NO_RESOURCES) + need
        self.changes += 1

    def delete_pod(self, namespace: str, name: str) -> None:
        if self._unload((namespace, name)):
            self.changes += 1

    def _unload(self, key: tuple[str, str]) -> bool:
        old = self._pods.pop(key, None)
        if old is None:
            return False
        node, need = old
        left = self._used[node] - need
        if left == NO_RESOURCES:
            del self._used[node]
        else:
            self._used[node] = left
        return True

    # ---- per node

    def _dra(self) -> dict[str, tuple[int, int]]:
        """node -> (DRA devices counted as GPUs, of those held by claims beyond the pods' requests)."""
        return self.devices.extended(GPU_RESOURCE)

    @staticmethod
    def _allocatable(name: str, node: _Node, dra: Mapping[str, tuple[int, int]]) -> Resources:
        return node.allocatable + Resources(gpus=dra.get(name, (0, 0))[0])

    def _load(self, name: str, dra: Mapping[str, tuple[int, int]]) -> Resources:
        return self._used.get(name, NO_RESOURCES) + Resources(gpus=dra.get(name, (0, 0))[1])

    def _free(self, name: str, node: _Node, dra: Mapping[str, tuple[int, int]]) -> Resources:
        return (self._allocatable(name, node, dra) - self._load(name, dra)).floored()

    @staticmethod
    def _matches(node: _Node, shape: PodShape) -> bool:
        if shape.gpu_product is not None and node.labels.get(GPU_PRODUCT_LABEL) != shape.gpu_product:
            return False
        return all(node.labels.get(k) == v for k, v in shape.node_selector)

    @staticmethod
    def _copies(free: Resources, shape: PodShape) -> int:
        """How many pods of `shape` fit in `free` (every pod takes one pod slot)."""
        n = free.pods
        for have, need in (
            (free.gpus, shape.gpus),
            (free.cpu_millis, shape.cpu_millis),
            (free.memory_bytes, shape.memory_bytes),
        ):
            if need > 0:
                n = min(n, have // need)
        return max(0, n)

    # ---- answers

    def snapshot(self, revision: int, now: float) -> Snapshot:
        aggs: dict[str, _Agg] = {}
        dra = self._dra()
        counted: dict[str, str] = {}
        for name, node in self._nodes.items():
            a = aggs.get(node.product)
            if a is None:
                a = aggs[node.product] = _Agg()
            a.seen += 1
            a.total += node.capacity_gpus + dra.get(name, (0, 0))[0]
            a.all_nvml = a.all_nvml and node.nvml
            if not node.healthy or node.untolerated(SNAPSHOT_TOLERATIONS) is not None:
                a.unhealthy += 1
                continue
            counted[name] = node.product
            allocatable = self._allocatable(name, node, dra)
            used = self._load(name, dra)
            free = (allocatable - used).floored()
            a.nodes += 1
            a.allocatable += allocatable.gpus
            a.largest_node = max(a.largest_node, allocatable.gpus)
            a.in_use += used.gpus
            a.free += free.gpus
            a.hist[free.gpus] += 1
            if free.pods > 0:
                a.largest = max(a.largest, free.gpus)
            a.cpu += free.cpu_millis
            a.mem += free.memory_bytes
            a.pods += free.pods
            if allocatable.gpus > 0:
                mine = {k: v for k, v in node.labels.items() if k.startswith(GPU_LABEL_PREFIXES)}
                a.labels = mine if a.labels is None else {k: v for k, v in a.labels.items() if mine.get(k) == v}
        products = []
        for product in sorted(aggs):
            a = aggs[product]
            labels = dict(sorted((a.labels or {}).items()))
            mem = labels.get(GPU_MEMORY_LABEL, "")
            products.append(
                ProductCapacity(
                    product=product,
                    nodes=a.nodes,
                    unhealthy_nodes=a.unhealthy,
                    total=a.total,
                    allocatable=a.allocatable,
                    in_use=a.in_use,
                    free=a.free,
                    largest_shape=a.largest,
                    histogram=tuple(Bucket(g, n) for g, n in sorted(a.hist.items(), reverse=True)),
                    free_cpu_millis=a.cpu,
                    free_memory_bytes=a.mem,
                    free_pods=a.pods,
                    labels=labels,
                    gpu_memory_mib=int(mem) if mem.isdigit() else None,
                    source=SOURCE_NVML if a.all_nvml and a.seen else SOURCE_LABELS,
                    largest_node=a.largest_node,
                )
            )
        return Snapshot(
            revision=revision, products=tuple(products), observed_at=now, devices=groups(self.devices, counted.get)
        )

    def can_place(self, shape: PodShape) -> Placement:
        """Whether one pod of `shape` fits on some node now, on how many, and why (not)."""
        return self._evaluate(shape)[0]

    def max_replicas(self, shape: PodShape) -> tuple[int, str]:
        """How many pods of `shape` fit now (each node filled as far as its scarcest resource
        allows), and a sentence saying so or why none does."""
        placement, replicas = self._evaluate(shape)
        if replicas == 0:
            return 0, placement.reason
        return replicas, (
            f"{_describe(shape, _plural(replicas, 'pod'))} fit{'s' if replicas == 1 else ''} "
            f"on {_nodes(shape, placement.nodes)}"
        )

    def _evaluate(self, shape: PodShape) -> tuple[Placement, int]:
        need = Resources(shape.gpus, shape.cpu_millis, shape.memory_bytes, 1)
        tolerations = shape.effective_tolerations()
        matching = healthy = tolerated = fits = replicas = 0
        best_gpus = total_free_gpus = 0
        blocking: Counter[str] = Counter()
        #: Among tolerated nodes with enough GPUs: most free of each other resource on one node.
        best_other = Resources()
        short_other: set[str] = set()
        dra = self._dra()
        for name, node in self._nodes.items():
            if not self._matches(node, shape):
                continue
            matching += 1
            if not node.healthy:
                continue
            healthy += 1
            taint = node.untolerated(tolerations)
            if taint is not None:
                blocking[str(taint)] += 1
                continue
            tolerated += 1
            free = self._free(name, node, dra)
            best_gpus = max(best_gpus, free.gpus)
            total_free_gpus += free.gpus
            if free.gpus < need.gpus:
                continue
            best_other = Resources(
                0,
                max(best_other.cpu_millis, free.cpu_millis),
                max(best_other.memory_bytes, free.memory_bytes),
                max(best_other.pods, free.pods),
            )
            lacking = {
                r
                for r, have, want in (
                    ("cpu", free.cpu_millis, need.cpu_millis),
                    ("memory", free.memory_bytes, need.memory_bytes),
                    ("pods", free.pods, need.pods),
                )
                if have < want
            }
            if lacking:
                short_other |= lacking
                continue
            fits += 1
            replicas += self._copies(free, shape)

        where = _where(shape)
        if fits:
            largest = (
                f" (largest free on one node: {_plural(best_gpus, 'GPU')})" if shape.gpus or shape.gpu_product else ""
            )
            reason = f"{_describe(shape)} fits on {_nodes(shape, fits)}{largest}"
            return Placement(True, reason, fits), replicas
        selector = _selector(shape)
        if matching == 0:
            if selector:
                reason = f"no schedulable node matches {selector}"
                if shape.gpu_product is not None:
                    have = sorted({n.product for n in self._nodes.values() if n.product})
                    reason += f" (GPU products here: {', '.join(have) or 'none'})"
            else:
                reason = "the cluster has no nodes"
        elif healthy == 0:
            reason = (
                f"no schedulable node matches {selector or 'the pod'}: "
                f"{'the one matching node is' if matching == 1 else f'all {matching} matching nodes are'} "
                "NotReady, cordoned or have unhealthy GPUs"
            )
        elif tolerated == 0:
            # Most common first; ties by name, so the message does not depend on the order nodes arrived in.
            taints = ", ".join(t for t, _n in sorted(blocking.items(), key=lambda kv: (-kv[1], kv[0]))[:3])
            reason = f"every schedulable {where} has a taint the pod does not tolerate ({taints})"
        elif best_gpus < shape.gpus:
            reason = (
                f"no {where} has {_plural(shape.gpus, 'free GPU')} "
                f"(largest free on one node: {best_gpus}; {total_free_gpus} free in total)"
            )
        else:
            parts = []
            if "cpu" in short_other:
                parts.append(
                    f"{_fmt_cpu(shape.cpu_millis)} CPU (at most {_fmt_cpu(best_other.cpu_millis)} free on one node)"
                )
            if "memory" in short_other:
                parts.append(
                    f"{_fmt_mem(shape.memory_bytes)} memory "
                    f"(at most {_fmt_mem(best_other.memory_bytes)} free on one node)"
                )
            if "pods" in short_other:
                parts.append("a free pod slot (every such node runs its maximum number of pods)")
            gpus = f" with {_plural(shape.gpus, 'free GPU')}" if shape.gpus else ""
            reason = f"no {where}{gpus} also has {' and '.join(parts)}"
        return Placement(False, reason, 0), 0


def _where(shape: PodShape, n: int = 1) -> str:
    nodes = "node" if n == 1 else "nodes"
    if shape.gpu_product:
        return f"{nodes} of {shape.gpu_product}"
    return f"GPU {nodes}" if shape.gpus else nodes


def _nodes(shape: PodShape, n: int) -> str:
    return f"{n} {_where(shape, n)}"


def _describe(shape: PodShape, noun: str = "a pod") -> str:
    """E.g. "a pod of 4 GPUs, 8 CPU" ("12 pods of ..." with noun "12 pods")."""
    parts = []
    if shape.gpus:
        parts.append(_plural(shape.gpus, "GPU"))
    if shape.cpu_millis:
        parts.append(f"{_fmt_cpu(shape.cpu_millis)} CPU")
    if shape.memory_bytes:
        parts.append(f"{_fmt_mem(shape.memory_bytes)} memory")
    return f"{noun} of {', '.join(parts)}" if parts else f"{noun} without requests"


def _selector(shape: PodShape) -> str:
    pairs = [*([(GPU_PRODUCT_LABEL, shape.gpu_product)] if shape.gpu_product is not None else []), *shape.node_selector]
    return ", ".join(f"{k}={v}" for k, v in pairs)


__all__ = [
    "GPU_TOLERATION",
    "Bucket",
    "Inventory",
    "Placement",
    "PodShape",
    "ProductCapacity",
    "Snapshot",
    "Taint",
    "Toleration",
    "shape_of",
]
