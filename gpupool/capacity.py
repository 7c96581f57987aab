"""The GPU capacity model's values: what a pod needs and what a cluster offers, per GPU product (pure).

Owns:
- `Snapshot`/`ProductCapacity`: aggregates per GPU product (`nvidia.com/gpu.product`; "" for nodes
  without one): how many nodes count, how many GPUs exist, are allocatable, in use and free, the
  largest shape one pod can get, the free-GPU histogram, and the labels every node of the product
  shares. Only aggregates: no node or pod names, ever (consumers get no view of the provider's nodes);
- `PodShape` (`shape_of`): what one pod needs, as the scheduler counts it; `Resources`: the
  summed vector (GPUs, CPU, memory, pod slots) requests and free capacity are counted in;
- `Placement`: the answer to "does a pod of this shape fit", with a sentence that says why;
- `best_fit` / `free_after` / `buckets_of`: the free GPUs per node after some pods are placed on
  them, largest first, each on the fullest node that still takes it (as a bin-packing scheduler would).

`gpupool.inventory.Inventory` keeps the live model of one cluster and computes these values.

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

DRA: a device a DeviceClass maps to `nvidia.com/gpu` counts as a GPU of its node, and one a claim
holds beyond the pods' requests as load (`peering.devices`); `DeviceGroup` aggregates the devices
themselves, per product, driver, attributes and capacity.

Does not: evaluate node affinity beyond the GPU product, pod (anti-)affinity, topology spread,
ports, volumes or DRA claims' selectors; predict preemption; talk to anyone.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from decimal import ROUND_CEILING, Decimal
from typing import Any

from gpufed.apis.pool import GPU_PRODUCT_LABEL, GPU_RESOURCE
from gpufed.apis.wire import (
    VIRTUAL_NODE_TYPE_LABELS,
)
from peering.grants import TOLERATED_TAINTS, pod_requests

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
SNAPSHOT_TOLERATIONS = tuple(Toleration(key=k, operator="Exists") for k in sorted(TOLERATED_TAINTS))


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
    #: GPU allocatable of the largest counted node: the most GPUs one pod could ever get there
    #: (0: unknown, e.g. from an estimator that does not send it).
    largest_node: int = 0


@dataclass(frozen=True)
class Attribute:
    """One DRA device attribute: its qualified name (`<domain>/<id>`), type and value as text."""

    name: str
    #: "string", "int", "bool" or "version" (the fields of resource.k8s.io's DeviceAttribute).
    kind: str
    value: str


@dataclass(frozen=True)
class DeviceGroup:
    """Dynamic Resource Allocation devices of one kind: same node GPU product, driver, attributes and
    capacity (per-device identities such as the UUID or index left out). Only aggregates: no node,
    pool or device names."""

    #: nvidia.com/gpu.product of the nodes the devices are on ("" without one).
    product: str
    #: The DRA driver that publishes them (e.g. gpu.nvidia.com).
    driver: str
    #: DeviceClasses of the provider that select the driver's devices.
    device_classes: tuple[str, ...]
    #: Sorted by name; names qualified with the driver's domain when the driver left them bare.
    attributes: tuple[Attribute, ...]
    #: (qualified name, quantity) sorted by name.
    capacity: tuple[tuple[str, str], ...]
    #: The extended resource one of the classes maps these devices to (e.g. nvidia.com/gpu; "" for
    #: none): such devices are counted in the product's GPU figures as well.
    extended_resource: str
    #: Devices on counted (healthy, schedulable) nodes.
    total: int
    #: Of those, not allocated to any ResourceClaim.
    free: int
    #: Most free devices of the group on one node (what one claim can get at once).
    largest: int = 0


@dataclass(frozen=True)
class Snapshot:
    #: Raised by the estimator whenever an aggregate changes (never for a heartbeat).
    revision: int
    #: By product name.
    products: tuple[ProductCapacity, ...]
    #: Unix seconds when the figures were last known to be current.
    observed_at: float
    #: DRA device groups, by (product, driver, attributes).
    devices: tuple[DeviceGroup, ...] = ()

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


@dataclass(frozen=True)
class Resources:
    """GPUs, CPU millicores, memory bytes, pod slots."""

    gpus: int = 0
    cpu_millis: int = 0
    memory_bytes: int = 0
    pods: int = 0

    def __add__(self, o: Resources) -> Resources:
        return Resources(
            self.gpus + o.gpus, self.cpu_millis + o.cpu_millis, self.memory_bytes + o.memory_bytes, self.pods + o.pods
        )

    def __sub__(self, o: Resources) -> Resources:
        return Resources(
            self.gpus - o.gpus, self.cpu_millis - o.cpu_millis, self.memory_bytes - o.memory_bytes, self.pods - o.pods
        )

    def floored(self) -> Resources:
        return Resources(max(0, self.gpus), max(0, self.cpu_millis), max(0, self.memory_bytes), max(0, self.pods))


NO_RESOURCES = Resources()


# ---- reading API objects


def requirement(raw: Mapping[str, Decimal]) -> Resources:
    def up(r: str, scale: int = 1) -> int:
        return int((raw.get(r, Decimal(0)) * scale).to_integral_value(rounding=ROUND_CEILING))

    return Resources(up(GPU_RESOURCE), up("cpu", 1000), up("memory"), up("pods"))


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
    need = requirement(pod_requests(pod))
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


# ---- pods on the free-GPU histogram


def best_fit(histogram: Sequence[Bucket], gpus: Sequence[int]) -> tuple[list[int], list[int]]:
    """Free GPUs per node after placing `gpus` (largest first, each on the fullest node that still
    takes it, as a bin-packing scheduler would), and the pods that fit nowhere."""
    free = sorted((b.free_gpus for b in histogram for _ in range(b.nodes)), reverse=True)
    unplaced: list[int] = []
    for g in sorted((g for g in gpus if g > 0), reverse=True):
        fits = [i for i, f in enumerate(free) if f >= g]
        if not fits:
            unplaced.append(g)
            continue
        i = min(fits, key=lambda j: free[j])
        free[i] -= g
    return free, unplaced


def free_after(histogram: Sequence[Bucket], gpus: Sequence[int]) -> tuple[Bucket, ...]:
    """The free-GPU histogram once `gpus` (GPUs per pod) are placed by `best_fit` (largest free
    first: its first bucket is the most one more pod can get)."""
    free, _ = best_fit(histogram, gpus)
    return buckets_of(free)


def buckets_of(free: Sequence[int]) -> tuple[Bucket, ...]:
    """Free GPUs per node as a histogram (by free_gpus descending, nodes with none left out)."""
    counts: dict[int, int] = {}
    for f in free:
        if f > 0:
            counts[f] = counts.get(f, 0) + 1
    return tuple(Bucket(f, n) for f, n in sorted(counts.items(), reverse=True))
