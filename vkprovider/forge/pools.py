"""GPU pools of one provider and what each pool's virtual node advertises (pure).

Owns:
- `plan_pools`: which virtual nodes stand for a provider — one per GPU product when the provider
  has several and per-product pools are on (the default), else one for the whole provider (named
  `gpufed-<provider>`, labelled with the product when there is exactly one);
- `advertise`: a pool node's capacity, allocatable, labels and figures from the estimator's live
  snapshot, the grant, and what the consumer's pods hold;
- `filter_node_labels`: which labels a provider supplies (its grant's `nodeLabels`, its estimator's
  product labels) may land on a virtual node. Offloading policies select providers by node labels,
  so a provider must not be able to claim what the consumer's own tooling means:
  only GPU labels (`nvidia.com/`, what providers publish) and the keys of a configurable allow-list
  pass; anything in the Kubernetes-reserved domains (`kubernetes.io`, `k8s.io` and their
  subdomains: `topology.kubernetes.io/*`, `node.kubernetes.io/*`, `node-role.kubernetes.io/*`,
  ...) and in gpufed's own (`gpufed.io`: only the virtual kubelet sets those) never does, whatever
  the allow-list says; a key or value that is no valid label is dropped too.

The mechanism that keeps the ordinary kube-scheduler from choosing a pool where a pod cannot run is
**capacity capping**: a pool node's allocatable GPUs are what its pods already hold plus the
largest shape that one provider node can still take (after in-flight pods, within the grant's
headroom). The scheduler's NodeResourcesFit then refuses every pod larger than that shape, so an
8-GPU pod is never bound to a pool whose nodes have at most 4 free, and a fragmented pool (8 free in
total, 2 per node) takes no 4-GPU pod. The cost: between two status updates a pool accepts at most
one largest shape beyond what it holds; the virtual kubelet re-advertises as soon as it accepts a
pod, so bursts proceed in steps of a few milliseconds. No scheduler extender or admission webhook
is involved, so nothing changes for users or the scheduler's configuration.

Without a snapshot (no estimator at the provider, or not reachable) the pool advertises the grant
as before (static mode); the figures say so. When the provider lowers the grant below what the
consumer's pods already hold, the overage is taken off every pool's allocatable (never below zero):
running pods stay, and no pod ending frees room for a new one until usage is back within the grant.

Does not: talk to anyone, or decide fail-back (the pod controller does, with the estimator's answer).
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from decimal import Decimal
from typing import Any

from gpufed.apis.pool import GPU_PRODUCT_LABEL, GPU_RESOURCE, SLICE_RESOURCES
from gpufed.apis.quantity import format_quantity
from gpufed.apis.wire import POD_GPUS_LABEL, POOL_ANNOTATION, POOL_PRODUCT_LABEL
from gpupool.capacity import Bucket, ProductCapacity, Snapshot, free_after
from gpupool.gang import Offer
from peering.grants import GPU_LABEL_PREFIXES

Resources = Mapping[str, Decimal]

#: Longest product slug in a pool node's name (node names stay far below 253 characters).
MAX_SLUG = 40
GPU_MEMORY_LABEL = "nvidia.com/gpu.memory"
#: Label domains a provider may never put on a virtual node (the domain itself and every subdomain).
RESERVED_LABEL_DOMAINS = ("kubernetes.io", "k8s.io", "gpufed.io")
_LABEL_NAME = re.compile(r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?")
_LABEL_PREFIX = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
MAX_LABEL_NAME = 63
MAX_LABEL_PREFIX = 253


@dataclass(frozen=True)
class LabelFilter:
    """Provider-supplied labels split into those a virtual node carries and those dropped."""

    kept: dict[str, str]
    dropped: dict[str, str]


def is_label(key: str, value: str) -> bool:
    """Whether `key=value` is a valid Kubernetes label (qualified name, label value)."""
    prefix, _, name = key.rpartition("/")
    if "/" in key and not (len(prefix) <= MAX_LABEL_PREFIX and _LABEL_PREFIX.fullmatch(prefix)):
        return False
    if not (len(name) <= MAX_LABEL_NAME and _LABEL_NAME.fullmatch(name)):
        return False
    return value == "" or (len(value) <= MAX_LABEL_NAME and bool(_LABEL_NAME.fullmatch(value)))


def reserved_label(key: str) -> bool:
    """Whether `key` lies in a domain providers may never set (`RESERVED_LABEL_DOMAINS`, or none)."""
    domain = key.rpartition("/")[0]
    if not domain:
        return True  # unprefixed keys are the cluster's own (e.g. `type`)
    return any(domain == d or domain.endswith("." + d) for d in RESERVED_LABEL_DOMAINS)


def label_allowed(key: str, allow: Iterable[str] = ()) -> bool:
    """Whether a provider may set the label `key` on a virtual node: a GPU label, or a key `allow`
    names (an entry ending in `/` or `*` is a prefix), never a reserved one."""
    if reserved_label(key):
        return False
    if key.startswith(GPU_LABEL_PREFIXES):
        return True
    for entry in allow:
        entry = entry.strip()
        if entry.endswith(("*", "/")):
            if entry.rstrip("*") and key.startswith(entry.rstrip("*")):
                return True
        elif entry and key == entry:
            return True
    return False


def filter_node_labels(labels: Mapping[str, str], allow: Iterable[str] = ()) -> LabelFilter:
    """`labels` a provider supplied, split by `label_allowed` and label syntax."""
    allow = tuple(allow)
    kept: dict[str, str] = {}
    dropped: dict[str, str] = {}
    for key, value in sorted(labels.items()):
        key, value = str(key), str(value)
        (kept if label_allowed(key, allow) and is_label(key, value) else dropped)[key] = value
    return LabelFilter(kept, dropped)


@dataclass(frozen=True)
class Pool:
    """One virtual node of a provider: all of it (product None) or one GPU product."""

    node: str
    product: str | None


def slug(product: str) -> str:
    """A DNS-label-safe, stable rendering of a GPU product name."""
    s = re.sub(r"[^a-z0-9]+", "-", product.lower()).strip("-") or "gpu"
    if len(s) > MAX_SLUG:
        digest = hashlib.sha256(product.encode()).hexdigest()[:8]
        s = s[: MAX_SLUG - 9].rstrip("-") + "-" + digest
    return s


def plan_pools(base: str, products: Iterable[str], granted_product: str | None, per_product: bool) -> list[Pool]:
    """The virtual nodes of a provider whose own node is `base` (gpufed-<provider>), given the GPU
    products its estimator reports.

    A grant for one product (`granted_product`) is one pool of that product. Several products give
    one pool each when `per_product`, named `<base>-<product slug>`.
    """
    if granted_product:
        return [Pool(base, granted_product)]
    found = sorted(set(products))
    if len(found) == 1:
        return [Pool(base, found[0])]
    if len(found) > 1 and per_product:
        return [Pool(f"{base}-{slug(p)}", p) for p in found]
    return [Pool(base, None)]


# ---- what a pool node advertises


@dataclass(frozen=True)
class PoolFigures:
    """The pool's numbers (annotation `gpufed.io/gpu-pool`, printed by `gpufed pool`)."""

    provider: str
    node: str
    product: str
    #: GPUs of the product at the provider (capacity, healthy or not); None without a snapshot.
    total: int | None
    #: GPUs the provider granted this consumer (the whole grant: pools of one provider share it).
    granted: int
    #: GPUs the consumer's pods on this pool hold (including pods being started).
    in_use: int
    #: GPUs free at the provider for this product now; None without a snapshot.
    free: int | None
    #: The most GPUs one more pod can get on this pool now (what allocatable allows beyond in_use).
    largest_placeable: int
    #: "Live" (estimator snapshot) or "Static: <why>" (grant only).
    capacity_source: str
    #: Pods on this pool accepted but not yet placed by the provider.
    in_flight: int = 0
    #: GPUs of the grant the consumer's pods on every pool of this provider leave unused.
    headroom: int = 0
    #: [free GPUs, provider nodes with that many free] after the in-flight pods, fullest first (what
    #: a group of pods can be packed onto); None without a snapshot.
    free_nodes: list[list[int]] | None = None
    #: GPUs the grant's accepted slices ask for: what `granted` grows back to once the provider's
    #: own load lets it (a group larger than this, or than `total`, is never placed here).
    requested: int = 0
    #: GPUs held back for the group the gang controller reserved this pool for (not offered to
    #: other pods; `free_nodes` and `headroom` still count them as free).
    reserved: int = 0

    def annotation(self) -> str:
        return json.dumps(asdict(self), sort_keys=True, separators=(",", ":"))


def parse_figures(text: str) -> PoolFigures | None:
    """The figures of a virtual node's annotation (None when absent or unreadable)."""
    try:
        raw = json.loads(text)
        return PoolFigures(**raw)
    except (ValueError, TypeError):
        return None


def figures_of(node: Mapping[str, Any]) -> PoolFigures | None:
    """The figures a pool virtual node carries (None: no pool node, or unreadable)."""
    annotations = (node.get("metadata") or {}).get("annotations") or {}
    return parse_figures(str(annotations.get(POOL_ANNOTATION) or ""))


def offer_of(figures: PoolFigures) -> Offer | None:
    """What the pool offers a group of pods now (None: figures of the wrong shape)."""
    try:
        free = None if figures.free_nodes is None else tuple(Bucket(int(f), int(n)) for f, n in figures.free_nodes)
        return Offer(
            node=str(figures.node),
            provider=str(figures.provider),
            product=str(figures.product or ""),
            headroom=int(figures.headroom or 0),
            free_nodes=free,
            total=None if figures.total is None else int(figures.total),
            granted=int(figures.granted or 0),
            requested=int(figures.requested or 0),
        )
    except (TypeError, ValueError):
        return None


@dataclass(frozen=True)
class Advertised:
    capacity: dict[str, str]
    allocatable: dict[str, str]
    labels: dict[str, str]
    annotations: dict[str, str]
    figures: PoolFigures


def _gpu(r: Resources) -> int:
    return int(r.get(GPU_RESOURCE, Decimal(0)))


def _fmt(values: Mapping[str, Decimal]) -> dict[str, str]:
    return {r: format_quantity(v, binary=r == "memory") for r, v in sorted(values.items())}


def _merge(products: Sequence[ProductCapacity]) -> ProductCapacity | None:
    """The provider as one pool: GPU products and CPU-only nodes summed."""
    if not products:
        return None
    buckets: dict[int, int] = {}
    for p in products:
        for b in p.histogram:
            buckets[b.free_gpus] = buckets.get(b.free_gpus, 0) + b.nodes
    gpu_products = [p for p in products if p.product]
    shared: dict[str, str] | None = None
    for p in gpu_products:
        shared = dict(p.labels) if shared is None else {k: v for k, v in shared.items() if p.labels.get(k) == v}
    return ProductCapacity(
        product="",
        nodes=sum(p.nodes for p in products),
        unhealthy_nodes=sum(p.unhealthy_nodes for p in products),
        total=sum(p.total for p in products),
        allocatable=sum(p.allocatable for p in products),
        in_use=sum(p.in_use for p in products),
        free=sum(p.free for p in products),
        largest_shape=max((p.largest_shape for p in products), default=0),
        largest_node=max((p.largest_node for p in products), default=0),
        histogram=tuple(Bucket(f, n) for f, n in sorted(buckets.items(), reverse=True)),
        free_cpu_millis=sum(p.free_cpu_millis for p in products),
        free_memory_bytes=sum(p.free_memory_bytes for p in products),
        free_pods=sum(p.free_pods for p in products),
        labels=shared or {},
        gpu_memory_mib=None,
        source="nvml" if products and all(p.source == "nvml" for p in products) else "labels",
    )


def _free_of(cap: ProductCapacity) -> dict[str, Decimal]:
    return {
        "cpu": Decimal(cap.free_cpu_millis) / 1000,
        "memory": Decimal(cap.free_memory_bytes),
        "pods": Decimal(cap.free_pods),
        GPU_RESOURCE: Decimal(cap.free),
    }


@dataclass(frozen=True)
class InFlight:
    """A pool's pods the provider has not placed yet (or placed after its last capacity snapshot):
    how many, their requests summed, and the GPUs of each one that asks for any (largest first)."""

    pods: int = 0
    requests: Resources = field(default_factory=dict)
    gpus: tuple[int, ...] = ()

    @classmethod
    def of(cls, pods: Sequence[Resources]) -> InFlight:
        total: dict[str, Decimal] = {}
        for p in pods:
            for r, v in p.items():
                total[r] = total.get(r, Decimal(0)) + v
        gpus = sorted((g for g in (_gpu(p) for p in pods) if g > 0), reverse=True)
        return cls(len(pods), {r: v for r, v in total.items() if v}, tuple(gpus))


NOTHING_IN_FLIGHT = InFlight()


def advertise(
    provider: str,
    pool: Pool,
    snapshot: Snapshot | None,
    *,
    granted: Resources,
    requested: Resources | None = None,
    used_all: Resources,
    used_here: Resources,
    in_flight: InFlight = NOTHING_IN_FLIGHT,
    reserved: Sequence[int] = (),
    static_reason: str = "no capacity estimator answer",
    label_allow: Iterable[str] = (),
) -> Advertised:
    """Capacity, allocatable, labels and figures of `pool`'s virtual node.

    granted: the provider's grant (all accepted slices); requested: what those slices ask for;
    used_all: requests of the consumer's non-terminal pods on every pool of this provider; used_here:
    on this pool; in_flight: this pool's pods that the provider has not placed yet (their requests
    are already part of used_here); reserved: GPUs per pod of the gated group the gang controller
    holds this pool for (`GANG_RESERVE_ANNOTATION`): kept from what allocatable offers other pods,
    but not from the figures (the gang controller places the group by them);
    label_allow: the consumer's allow-list of provider labels beyond the GPU ones (`label_allowed`).
    """
    headroom = {r: max(Decimal(0), granted.get(r, Decimal(0)) - used_all.get(r, Decimal(0))) for r in SLICE_RESOURCES}
    cap: ProductCapacity | None = None
    if snapshot is not None:
        cap = snapshot.product(pool.product) if pool.product else _merge(snapshot.products)
    labels: dict[str, str] = {}
    if pool.product:
        if is_label(GPU_PRODUCT_LABEL, pool.product):  # the provider names its products
            labels[GPU_PRODUCT_LABEL] = pool.product
        labels[POOL_PRODUCT_LABEL] = slug(pool.product)
    held_back = sum(g for g in reserved if g > 0)
    if snapshot is None:
        extra = dict(headroom)
        extra[GPU_RESOURCE] = max(Decimal(0), extra[GPU_RESOURCE] - held_back)
        source = f"Static: {static_reason}"
        total: int | None = None
        free: int | None = None
        free_nodes: list[list[int]] | None = None
    else:
        source = "Live"
        if cap is None:  # the product is gone (or none at all): nothing more goes here
            extra = {r: Decimal(0) for r in SLICE_RESOURCES}
            total, free, free_nodes = 0, 0, []
        else:
            labels.update(filter_node_labels(cap.labels, label_allow).kept)
            if cap.gpu_memory_mib and pool.product:
                labels[GPU_MEMORY_LABEL] = str(cap.gpu_memory_mib)
            pod_gpus = min(cap.largest_node, _gpu(granted))
            if pod_gpus > 0:
                labels[POD_GPUS_LABEL] = str(pod_gpus)
            waiting = {r: in_flight.requests.get(r, Decimal(0)) for r in SLICE_RESOURCES}
            free_now = _free_of(cap)
            extra = {r: max(Decimal(0), min(headroom[r], free_now[r] - waiting[r])) for r in SLICE_RESOURCES}
            after = free_after(cap.histogram, in_flight.gpus)
            free_nodes = [[b.free_gpus, b.nodes] for b in after]
            left = free_after(after, reserved) if held_back else after
            extra[GPU_RESOURCE] = min(
                max(Decimal(0), extra[GPU_RESOURCE] - held_back), Decimal(left[0].free_gpus if left else 0)
            )
            total, free = cap.total, cap.free
    # Beyond the grant (the provider lowered it below what already runs), the overage is taken off
    # what this pool holds: the scheduler then sees less than nothing free, so a pod ending here
    # frees no room before the virtual kubelet re-advertises (a node that advertised just what it
    # holds would look one pod's worth free in that window while the grant is still exceeded).
    over = {r: max(Decimal(0), used_all.get(r, Decimal(0)) - granted.get(r, Decimal(0))) for r in SLICE_RESOURCES}
    allocatable = {r: max(Decimal(0), used_here.get(r, Decimal(0)) + extra[r] - over[r]) for r in SLICE_RESOURCES}
    if not pool.product and granted.get(GPU_RESOURCE, Decimal(0)) <= 0 and _gpu(used_here) == 0:
        allocatable.pop(GPU_RESOURCE)  # a CPU-only grant advertises no GPU resource at all
    capacity = {r: max(allocatable[r], granted.get(r, Decimal(0))) for r in allocatable}
    figures = PoolFigures(
        provider=provider,
        node=pool.node,
        product=pool.product or "",
        total=total,
        granted=_gpu(granted),
        requested=max(_gpu(granted), _gpu(requested or {})),
        in_use=_gpu(used_here),
        free=free,
        largest_placeable=int(extra.get(GPU_RESOURCE, Decimal(0))),
        capacity_source=source,
        in_flight=in_flight.pods,
        reserved=held_back,
        headroom=int(headroom.get(GPU_RESOURCE, Decimal(0))),
        free_nodes=free_nodes,
    )
    return Advertised(
        capacity=_fmt(capacity),
        allocatable=_fmt(allocatable),
        labels=labels,
        annotations={POOL_ANNOTATION: figures.annotation()},
        figures=figures,
    )
