"""The live GPU capacity of one cluster, as the provider's capacity estimator sees it (pure).

Owns:
- `Inventory`: an incremental model of the cluster's nodes and the pods bound to them, fed with
  watch events (`set_node`/`delete_node`, `set_pod`/`delete_pod`). Per node it keeps the facts
  placement depends on (labels, taints, readiness, cordon, GPU health, allocatable) and the summed
  requests of the non-terminal pods bound to it, so every answer is one pass over the nodes;
- `Snapshot`/`ProductCapacity`: aggregates per GPU product (`nvidia.com/gpu.product`; "" for nodes
  without one): how many nodes count, how many GPUs exist, are allocatable, in use and free, the
  largest shape one pod can get, the free-GPU histogram, and the labels every node of the product
  shares. Only aggregates: no node or pod names, ever (consumers get no view of the provider's nodes);
- `PodShape` (`shape_of`): what one pod needs, as the scheduler counts it;
- `can_place`/`max_replicas`: whether one pod of a shape fits on some node now, and how many do,
  with a sentence that says why (e.g. "no node of NVIDIA-H100-80GB-HBM3 has 4 free GPUs (largest
  free on one node: 2; 8 free in total)").

Rules (those of kube-scheduler's NodeResourcesFit, TaintToleration and NodeSelector plugins, minus
what an estimate cannot know):
- a node counts when it is Ready, not cordoned, not marked `gpufed.io/gpu-health=Unhealthy` by the
  GPU node agent, and carries no NoSchedule/NoExecute taint the pod does not tolerate. The snapshot
  (no particular pod) tolerates what a tenant pod is expected to tolerate
  (`peering.grants.TOLERATED_TAINTS`); a shape tolerates its own tolerations plus, when it asks for
  GPUs, `nvidia.com/gpu` (added by the ExtendedResourceToleration admission plugin);
- free = allocatable - requests of the pods bound to the node that are not Succeeded/Failed (pods
  not yet bound are no load), floored at zero per node; every pod takes one `pods` slot;
- gpufed's own virtual nodes (`gpufed.io/type=virtual-node`) are not this cluster's capacity
  (they are other providers' GPUs) and are ignored, so pools never chain.

Does not: evaluate node affinity beyond the GPU product, pod (anti-)affinity, topology spread,
ports, volumes or DRA claims; predict preemption; talk to anyone. The estimator
(`gpupool.estimator.server`) feeds it and serves its answers.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from decimal import ROUND_CEILING, ROUND_FLOOR, Decimal
from typing import Any

from gpufed.apis.pool import GPU_PRODUCT_LABEL, GPU_RESOURCE
from gpufed.apis.quantity import QuantityError, format_quantity, parse
from gpufed.apis.wire import (
    GPU_HEALTH_ANNOTATION,
    GPU_SOURCE_ANNOTATION,
    GPU_UNHEALTHY,
    TYPE_LABEL,
    VIRTUAL_NODE_TYPE,
    VIRTUAL_NODE_TYPE_LABELS,
)
from peering.grants import GPU_LABEL_PREFIXES, TOLERATED_TAINTS, pod_requests

#: Node label with the memory of one GPU in MiB (NVIDIA GPU feature discovery).
GPU_MEMORY_LABEL = "nvidia.com/gpu.memory"
#: `gpu_source` values: facts from NVML (the GPU node agent), or from device-plugin capacity and labels.
SOURCE_NVML = "nvml"
SOURCE_LABELS = "labels"
#: Taint effects that keep a pod off a node (PreferNoSchedule only discourages).
BLOCKING_EFFECTS = frozenset({"NoSchedule", "NoExecute"})
TERMINAL_PHASES = frozenset({"Succeeded", "Failed"})
#: nodeSelector keys that only virtual nodes carry: a pod placed through a virtual node keeps them
#: in its spec, and they say nothing about the provider's nodes.
VIRTUAL_ONLY_SELECTOR_KEYS = frozenset(VIRTUAL_NODE_TYPE_LABELS)
GPUFED_LABEL_PREFIX = "gpufed.io/"

# ---- values


@dataclass(frozen=True)
class Toleration:
    """A pod toleration (Kubernetes semantics; `tolerationSeconds` plays no part in placement)."""

    key: str = ""
    operator: str = "Equal"
    value: str = ""
    effect: str = ""

    def tolerates(self, taint: Taint) -> bool:
        """Kubernetes' ToleratesTaint: an empty effect matches every effect, an empty key (with
        Exists) every key; Exists ignores the value, Equal (the default) compares it."""
        if self.effect and self.effect != taint.effect:
            return False
        if self.key and self.key != taint.key:
            return False
        if self.operator == "Exists":
            return True
        return self.operator in ("", "Equal") and self.value == taint.value


@dataclass(frozen=True)
class Taint:
    key: str
    value: str = ""
    effect: str = ""

    def __str__(self) -> str:
        return f"{self.key}{'=' + self.value if self.value else ''}:{self.effect}"


#: What the ExtendedResourceToleration admission plugin adds to pods that request GPUs.
GPU_TOLERATION = Toleration(key=GPU_RESOURCE, operator="Exists")
#: What the snapshot's "schedulable" means: the taints a tenant pod is expected to tolerate.
_SNAPSHOT_TOLERATIONS = tuple(Toleration(key=k, operator="Exists") for k in sorted(TOLERATED_TAINTS))


@dataclass(frozen=True)
class PodShape:
    """What one pod needs on one node."""

    gpus: int = 0
    cpu_millis: int = 0
    memory_bytes: int = 0
    #: None: any product (or no GPU at all).
    gpu_product: str | None = None
    #: nodeSelector pairs the node's labels must carry (sorted; without the product, see gpu_product).
    node_selector: tuple[tuple[str, str], ...] = ()
    tolerations: tuple[Toleration, ...] = ()

    def effective_tolerations(self) -> tuple[Toleration, ...]:
        return (*self.tolerations, GPU_TOLERATION) if self.gpus > 0 else self.tolerations


@dataclass(frozen=True)
class Bucket:
    """`nodes` counted nodes have exactly `free_gpus` GPUs free."""

    free_gpus: int
    nodes: int


@dataclass(frozen=True)
class ProductCapacity:
    #: nvidia.com/gpu.product ("" for nodes without one).
    product: str
    #: Schedulable healthy nodes counted below.
    nodes: int
    #: Nodes left out: NotReady, cordoned, an untolerable taint, or gpu-health Unhealthy.
    unhealthy_nodes: int
    #: GPU capacity of every node of the product, healthy or not.
    total: int
    #: GPU allocatable of the counted nodes.
    allocatable: int
    #: GPUs requested by non-terminal pods bound to the counted nodes.
    in_use: int
    #: allocatable - in_use, floored at 0 per node (so free >= allocatable - in_use).
    free: int
    #: Most GPUs one pod can get on one node (a node without a free pod slot offers none).
    largest_shape: int
    #: Free GPUs per counted node -> number of nodes, by free_gpus descending.
    histogram: tuple[Bucket, ...]
    #: Free CPU (millicores), memory (bytes) and pod slots, summed over the counted nodes.
    free_cpu_millis: int
    free_memory_bytes: int
    free_pods: int
    #: nvidia.com/* labels every counted GPU node of the product carries with the same value.
    labels: Mapping[str, str] = field(default_factory=dict)
    #: Memory of one GPU in MiB, when every counted node agrees (nvidia.com/gpu.memory).
    gpu_memory_mib: int | None = None
    #: "nvml" when every node of the product is described by the GPU node agent from NVML, else "labels".
    source: str = SOURCE_LABELS


@dataclass(frozen=True)
class Snapshot:
    #: Raised by the estimator whenever an aggregate changes (never for a heartbeat).
    revision: int
    #: By product name.
    products: tuple[ProductCapacity, ...]
    #: Unix seconds when the figures were last known to be current.
    observed_at: float

    def product(self, name: str) -> ProductCapacity | None:
        return next((p for p in self.products if p.product == name), None)

    def gpu_products(self) -> list[str]:
        """Named products that have GPUs (nodes with GPUs but no product label stay under "")."""
        return [p.product for p in self.products if p.total > 0 and p.product]


@dataclass(frozen=True)
class Placement:
    placeable: bool
    #: A sentence for humans, whether it fits or not.
    reason: str
    #: Nodes where one pod of the shape fits now.
    nodes: int


# ---- reading API objects


def _int(q: Any, *, scale: int = 1, ceil: bool) -> int:
    v = parse(str(q)) * scale
    return int(v.to_integral_value(rounding=ROUND_CEILING if ceil else ROUND_FLOOR))


def _requirement(raw: Mapping[str, Decimal]) -> _Vec:
    def up(r: str, scale: int = 1) -> int:
        return int((raw.get(r, Decimal(0)) * scale).to_integral_value(rounding=ROUND_CEILING))

    return _Vec(up(GPU_RESOURCE), up("cpu", 1000), up("memory"), up("pods"))


def _product_from_affinity(spec: Mapping[str, Any]) -> str | None:
    """The product when every required nodeSelectorTerm pins `nvidia.com/gpu.product In [one value]`
    to the same value (terms are ORed, so one unpinned term means any product)."""
    terms = (
        ((spec.get("affinity") or {}).get("nodeAffinity") or {}).get("requiredDuringSchedulingIgnoredDuringExecution")
        or {}
    ).get("nodeSelectorTerms") or []
    found: set[str] = set()
    for term in terms:
        values = [
            tuple(e.get("values") or ())
            for e in (term or {}).get("matchExpressions") or []
            if e.get("key") == GPU_PRODUCT_LABEL and e.get("operator") == "In"
        ]
        pinned = {v[0] for v in values if len(v) == 1}
        if len(pinned) != 1:
            return None
        found |= pinned
    return found.pop() if len(found) == 1 else None


def shape_of(pod: Mapping[str, Any], *, gpu_product: str | None = None) -> PodShape:
    """The shape of `pod`: its requests as the scheduler counts them (`grants.pod_requests`), its
    nodeSelector (minus gpufed.io/* keys and the virtual-node keys, which match only virtual nodes;
    the product is carried in `gpu_product`), its tolerations, and its GPU product (nodeSelector
    nvidia.com/gpu.product, or a required node affinity pinning one value). `gpu_product` (the
    pool's product) overrides what the pod says. Raises ValueError for unparsable quantities."""
    spec = pod.get("spec") or {}
    need = _requirement(pod_requests(pod))
    selector = {str(k): str(v) for k, v in (spec.get("nodeSelector") or {}).items()}
    product = gpu_product or selector.get(GPU_PRODUCT_LABEL) or _product_from_affinity(spec)
    pairs = tuple(
        sorted(
            (k, v)
            for k, v in selector.items()
            if k != GPU_PRODUCT_LABEL and not k.startswith(GPUFED_LABEL_PREFIX) and k not in VIRTUAL_ONLY_SELECTOR_KEYS
        )
    )
    tolerations = tuple(
        Toleration(
            key=str(t.get("key") or ""),
            operator=str(t.get("operator") or "Equal"),
            value=str(t.get("value") or ""),
            effect=str(t.get("effect") or ""),
        )
        for t in spec.get("tolerations") or []
        if isinstance(t, Mapping)
    )
    return PodShape(
        gpus=need.gpus,
        cpu_millis=need.cpu_millis,
        memory_bytes=need.memory_bytes,
        gpu_product=product,
        node_selector=pairs,
        tolerations=tolerations,
    )


# ---- the inventory


@dataclass(frozen=True)
class _Vec:
    """GPUs, CPU millicores, memory bytes, pod slots."""

    gpus: int = 0
    cpu_millis: int = 0
    memory_bytes: int = 0
    pods: int = 0

    def __add__(self, o: _Vec) -> _Vec:
        return _Vec(
            self.gpus + o.gpus, self.cpu_millis + o.cpu_millis, self.memory_bytes + o.memory_bytes, self.pods + o.pods
        )

    def __sub__(self, o: _Vec) -> _Vec:
        return _Vec(
            self.gpus - o.gpus, self.cpu_millis - o.cpu_millis, self.memory_bytes - o.memory_bytes, self.pods - o.pods
        )

    def floored(self) -> _Vec:
        return _Vec(max(0, self.gpus), max(0, self.cpu_millis), max(0, self.memory_bytes), max(0, self.pods))


_ZERO = _Vec()


@dataclass(frozen=True)
class _Node:
    product: str
    labels: Mapping[str, str]
    taints: tuple[Taint, ...]
    #: Ready, not cordoned, GPUs not reported unhealthy.
    healthy: bool
    nvml: bool
    capacity_gpus: int
    allocatable: _Vec

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
    allocatable = _Vec(
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
        self._pods: dict[tuple[str, str], tuple[str, _Vec]] = {}
        #: node name -> summed requests of its pods (kept for nodes not seen yet as well).
        self._used: dict[str, _Vec] = {}
        self.changes = 0

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
            need = _requirement(pod_requests(pod))
        except ValueError:
            return  # a quantity the API server accepted but we cannot read: keep what we had
        if self._pods.get(key) == (node, need):
            return
        self._unload(key)
        self._pods[key] = (node, need)
        self._used[node] = self._used.get(node, _ZERO) + need
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
        if left == _ZERO:
            del self._used[node]
        else:
            self._used[node] = left
        return True

    # ---- per node

    def _free(self, name: str, node: _Node) -> _Vec:
        return (node.allocatable - self._used.get(name, _ZERO)).floored()

    @staticmethod
    def _matches(node: _Node, shape: PodShape) -> bool:
        if shape.gpu_product is not None and node.labels.get(GPU_PRODUCT_LABEL) != shape.gpu_product:
            return False
        return all(node.labels.get(k) == v for k, v in shape.node_selector)

    @staticmethod
    def _copies(free: _Vec, shape: PodShape) -> int:
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
        for name, node in self._nodes.items():
            a = aggs.get(node.product)
            if a is None:
                a = aggs[node.product] = _Agg()
            a.seen += 1
            a.total += node.capacity_gpus
            a.all_nvml = a.all_nvml and node.nvml
            if not node.healthy or node.untolerated(_SNAPSHOT_TOLERATIONS) is not None:
                a.unhealthy += 1
                continue
            used = self._used.get(name, _ZERO)
            free = (node.allocatable - used).floored()
            a.nodes += 1
            a.allocatable += node.allocatable.gpus
            a.in_use += used.gpus
            a.free += free.gpus
            a.hist[free.gpus] += 1
            if free.pods > 0:
                a.largest = max(a.largest, free.gpus)
            a.cpu += free.cpu_millis
            a.mem += free.memory_bytes
            a.pods += free.pods
            if node.allocatable.gpus > 0:
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
                )
            )
        return Snapshot(revision=revision, products=tuple(products), observed_at=now)

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
        need = _Vec(shape.gpus, shape.cpu_millis, shape.memory_bytes, 1)
        tolerations = shape.effective_tolerations()
        matching = healthy = tolerated = fits = replicas = 0
        best_gpus = total_free_gpus = 0
        blocking: Counter[str] = Counter()
        #: Among tolerated nodes with enough GPUs: most free of each other resource on one node.
        best_other = _Vec()
        short_other: set[str] = set()
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
            free = self._free(name, node)
            best_gpus = max(best_gpus, free.gpus)
            total_free_gpus += free.gpus
            if free.gpus < need.gpus:
                continue
            best_other = _Vec(
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
