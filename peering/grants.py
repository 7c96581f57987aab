"""ResourceSlice negotiation on the provider: what to grant a consumer, and why.

Owns: the grant decision — LIVE free capacity (allocatable of schedulable nodes, minus what
non-terminal pods request on them, minus the still-unused part of other consumers' grants; for claim
storage, what the StorageClasses offered to the consumer can hold, `StorageSupply`), clamped by the
tenant's policy (per-resource maxima, allowed GPU products, whether partial grants are acceptable) —
and the human-readable reason for it; splitting a grant over the consumer's namespaces and the
ResourceQuota that enforces each share (`partition`, `quota_hard`: claim storage as
`requests.storage`, and one claim per granted pod slot as `persistentvolumeclaims`, both zero
without a storage grant).

Invariants: a grant never exceeds the request, the policy, or what is free; a consumer's own
running pods count as capacity it keeps (re-evaluating a grant never takes away what already runs
because of the consumer's own usage); an unknown or negative resource is an error, not a zero.

Pure: the controller gathers nodes, pods, policies and other grants and hands them in.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from decimal import Decimal
from enum import StrEnum

from gpufed.apis.pool import GPU_PRODUCT_LABEL, SLICE_RESOURCES
from gpufed.apis.pool import GPU_RESOURCE as GPU
from gpufed.apis.quantity import format_quantity, parse
from gpufed.apis.wire import CLAIMS_RESOURCE, STORAGE_RESOURCE

#: Claim storage (bytes), and the number of claims (a quota resource only: one per granted pod slot).
STORAGE = STORAGE_RESOURCE
CLAIMS = CLAIMS_RESOURCE
#: Node resources: what nodes offer and pods request.
RESOURCES = SLICE_RESOURCES
#: What a slice may ask for: the node resources and claim storage.
GRANT_RESOURCES = (*RESOURCES, STORAGE)
#: What a namespace's quota shares out: the grant, and the number of claims it allows.
QUOTA_RESOURCES = (*GRANT_RESOURCES, CLAIMS)

Resources = Mapping[str, Decimal]


class GrantError(ValueError):
    """The request itself is invalid (unknown resource, negative amount)."""


class Reason(StrEnum):
    GRANTED = "Granted"
    PARTIAL = "PartialGrant"
    NO_CAPACITY = "InsufficientCapacity"
    POLICY = "PolicyLimit"
    PRODUCT_NOT_ALLOWED = "GPUProductNotAllowed"
    NO_SUCH_PRODUCT = "GPUProductNotFound"
    PARTIAL_NOT_ALLOWED = "PartialGrantRefused"
    NO_STORAGE_CLASS = "NoStorageClass"


@dataclass(frozen=True)
class NodeInfo:
    name: str
    allocatable: Resources
    labels: Mapping[str, str] = field(default_factory=dict)
    #: Ready, not cordoned, no NoSchedule/NoExecute taint a tenant pod would not tolerate.
    schedulable: bool = True
    #: Resources the node offers that no grant is made of (MIG slices, other devices, huge pages).
    extended: frozenset[str] = frozenset()


@dataclass(frozen=True)
class PodLoad:
    """Requests of one non-terminal pod bound to `node`."""

    node: str
    requests: Resources


@dataclass(frozen=True)
class OtherGrant:
    """Another consumer's grant and how much of it its pods use now."""

    granted: Resources
    used: Resources
    gpu_product: str | None = None


@dataclass(frozen=True)
class TenantPolicy:
    #: Per-resource ceiling; a resource missing here is limited only by capacity.
    maximum: Resources = field(default_factory=dict)
    #: GPU products this consumer may ask for; None allows every product.
    allowed_gpu_products: frozenset[str] | None = None
    #: Whether a grant smaller than the request is acceptable (else it is Denied).
    allow_partial: bool = True


@dataclass(frozen=True)
class StorageSupply:
    """What the provider's storage holds for one consumer's claims."""

    #: The StorageClasses offered to the consumer (none: no storage can be granted).
    classes: tuple[str, ...] = ()
    #: Bytes the unbound static volumes of those classes hold; None when a class provisions volumes on
    #: demand (the provider's storage then limits claims itself, at provisioning).
    free: Decimal | None = None


@dataclass(frozen=True)
class SliceRequest:
    resources: Resources
    gpu_product: str | None = None


@dataclass(frozen=True)
class Decision:
    accepted: bool
    reason: Reason
    message: str
    granted: Resources
    #: What was free for this consumer when deciding (for `gpufed info` and the status).
    available: Resources


def _fmt(resource: str, v: Decimal) -> str:
    return format_quantity(v, binary=resource in ("memory", STORAGE))


def validate(request: SliceRequest) -> None:
    """Raise GrantError for unknown resources or negative amounts."""
    for r, v in request.resources.items():
        if r not in GRANT_RESOURCES:
            raise GrantError(f"unknown resource {r!r}: a slice may ask for {', '.join(GRANT_RESOURCES)}")
        if v < 0:
            raise GrantError(f"{r} must not be negative (got {_fmt(r, v)})")
    if not any(v > 0 for v in request.resources.values()):
        raise GrantError("the slice asks for nothing: give at least one positive resource")


def _node_matches(node: NodeInfo, product: str | None) -> bool:
    return product is None or node.labels.get(GPU_PRODUCT_LABEL) == product


def free_capacity(nodes: Iterable[NodeInfo], pods: Iterable[PodLoad], product: str | None) -> dict[str, Decimal]:
    """Allocatable minus requested, summed over schedulable nodes of `product` (all when None).

    Per node the result is floored at zero, so an over-committed node does not hide free space on
    another one.
    """
    used: dict[str, dict[str, Decimal]] = {}
    for p in pods:
        per = used.setdefault(p.node, {})
        for r, v in p.requests.items():
            per[r] = per.get(r, Decimal(0)) + v
    free = {r: Decimal(0) for r in RESOURCES}
    for n in nodes:
        if not n.schedulable or not _node_matches(n, product):
            continue
        for r in RESOURCES:
            free[r] += max(Decimal(0), n.allocatable.get(r, Decimal(0)) - used.get(n.name, {}).get(r, Decimal(0)))
    return free


def decide(
    request: SliceRequest,
    *,
    nodes: Iterable[NodeInfo],
    pods: Iterable[PodLoad],
    own_usage: Resources,
    others: Iterable[OtherGrant],
    policy: TenantPolicy,
    storage: StorageSupply = StorageSupply(),
) -> Decision:
    """Grant what the request, the policy and the live capacity allow; explain the outcome.

    Claim storage is limited by `storage` (no class offered: none; unbound static volumes: what they
    hold, less the unused part of other consumers' storage grants; classes that provision on demand:
    the policy alone) instead of by nodes."""
    validate(request)
    nodes = list(nodes)
    wanted = {r: v for r, v in request.resources.items() if v > 0}
    product = request.gpu_product
    empty: dict[str, Decimal] = {}

    if product is not None:
        if policy.allowed_gpu_products is not None and product not in policy.allowed_gpu_products:
            allowed = ", ".join(sorted(policy.allowed_gpu_products)) or "none"
            return Decision(
                False,
                Reason.PRODUCT_NOT_ALLOWED,
                f"GPU product {product} is not allowed for this consumer (allowed: {allowed})",
                empty,
                empty,
            )
        if not any(n.labels.get(GPU_PRODUCT_LABEL) == product for n in nodes):
            have = sorted({n.labels[GPU_PRODUCT_LABEL] for n in nodes if GPU_PRODUCT_LABEL in n.labels})
            return Decision(
                False,
                Reason.NO_SUCH_PRODUCT,
                f"the provider has no nodes with GPU product {product} (it has: {', '.join(have) or 'no GPUs'})",
                empty,
                empty,
            )
    elif wanted.get(GPU, Decimal(0)) > 0 and policy.allowed_gpu_products is not None:
        # Without a product selector the grant may land on any product: only allow it if all are allowed.
        present = {n.labels.get(GPU_PRODUCT_LABEL) for n in nodes if n.allocatable.get(GPU, Decimal(0)) > 0}
        forbidden = sorted(p for p in present if p is not None and p not in policy.allowed_gpu_products)
        if forbidden:
            return Decision(
                False,
                Reason.PRODUCT_NOT_ALLOWED,
                "this consumer may only use GPU products "
                f"{', '.join(sorted(policy.allowed_gpu_products)) or 'none'}: "
                "set a GPU product selector on the slice",
                empty,
                empty,
            )

    free = free_capacity(nodes, pods, product)
    reserved: dict[str, Decimal] = {r: Decimal(0) for r in GRANT_RESOURCES}
    for o in others:
        for r in GRANT_RESOURCES:
            # Storage is not a node's: every other storage grant holds on to it, whatever its product.
            if r != STORAGE and product is not None and o.gpu_product not in (None, product):
                continue
            reserved[r] += max(Decimal(0), o.granted.get(r, Decimal(0)) - o.used.get(r, Decimal(0)))
    available = {r: max(Decimal(0), free[r] - reserved[r]) + own_usage.get(r, Decimal(0)) for r in RESOURCES}
    if not storage.classes:
        available[STORAGE] = Decimal(0)
    elif storage.free is not None:
        available[STORAGE] = max(Decimal(0), storage.free - reserved[STORAGE]) + own_usage.get(STORAGE, Decimal(0))

    granted: dict[str, Decimal] = {}
    shortfalls: list[str] = []
    limited_by_policy = False
    for r, want in wanted.items():
        cap = policy.maximum.get(r)
        room = available.get(r, want)  # storage provisioned on demand: the policy alone limits it
        g = min(want, room, cap if cap is not None else want)
        granted[r] = g
        if g < want:
            if cap is not None and cap <= room and cap < want:
                limited_by_policy = True
                why = f"the policy allows at most {_fmt(r, cap)}"
            elif r == STORAGE and not storage.classes:
                why = "no StorageClass of the provider is offered to this consumer"
            elif r == STORAGE:
                why = f"only {_fmt(r, room)} free in the offered classes' volumes after other consumers' grants"
            else:
                why = f"only {_fmt(r, room)} free after running pods and other consumers' grants"
            shortfalls.append(f"{r}: {_fmt(r, g)} of {_fmt(r, want)} ({why})")

    where = f" of GPU product {product}" if product else ""
    if not shortfalls:
        return Decision(True, Reason.GRANTED, "granted everything requested" + where, granted, available)
    detail = "; ".join(shortfalls)
    if any(granted[r] == 0 for r in wanted):
        if limited_by_policy:
            reason = Reason.POLICY
        elif STORAGE in wanted and granted[STORAGE] == 0 and not storage.classes:
            reason = Reason.NO_STORAGE_CLASS
        else:
            reason = Reason.NO_CAPACITY
        return Decision(False, reason, f"denied{where}: {detail}", empty, available)
    if not policy.allow_partial:
        return Decision(
            False,
            Reason.PARTIAL_NOT_ALLOWED,
            f"denied{where}: only a partial grant is possible and the policy refuses partial grants: {detail}",
            empty,
            available,
        )
    return Decision(True, Reason.PARTIAL, f"partially granted{where}: {detail}", granted, available)


# ---- reading capacity out of API objects (plain dicts), and splitting a grant over namespaces

#: Taints a tenant pod is expected to tolerate (GPU nodes are commonly tainted for GPU pods only).
TOLERATED_TAINTS = frozenset({GPU})


def _quantities(d: Mapping[str, str] | None) -> dict[str, Decimal]:
    out: dict[str, Decimal] = {}
    for r, q in (d or {}).items():
        if r in RESOURCES:
            out[r] = parse(str(q))
    return out


def node_info(node: Mapping[str, object]) -> NodeInfo:
    """NodeInfo of a Node object: allocatable, labels, and whether tenant pods could land there."""
    meta = node.get("metadata") or {}
    spec = node.get("spec") or {}
    status = node.get("status") or {}
    assert isinstance(meta, dict) and isinstance(spec, dict) and isinstance(status, dict)
    ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions") or [])
    blocking = [
        t
        for t in spec.get("taints") or []
        if t.get("effect") in ("NoSchedule", "NoExecute") and t.get("key") not in TOLERATED_TAINTS
    ]
    return NodeInfo(
        name=str(meta.get("name", "")),
        allocatable=_quantities(status.get("allocatable")),
        labels=dict(meta.get("labels") or {}),
        schedulable=ready and not spec.get("unschedulable") and not blocking,
        extended=frozenset(r for r in status.get("allocatable") or {} if _ungranted(str(r))),
    )


def _ungranted(resource: str) -> bool:
    """A node resource a pod could request that no grant is made of: a device (`vendor/name`) or huge pages."""
    return resource not in RESOURCES and ("/" in resource or resource.startswith("hugepages-"))


def pod_requests(pod: Mapping[str, object]) -> dict[str, Decimal]:
    """What a pod holds on its node, as the scheduler counts it: max(sum of containers, largest
    init container) per resource, plus the pod overhead, plus one `pods` slot."""
    spec = pod.get("spec") or {}
    assert isinstance(spec, dict)
    total: dict[str, Decimal] = {}
    for c in spec.get("containers") or []:
        for r, v in _quantities((c.get("resources") or {}).get("requests")).items():
            total[r] = total.get(r, Decimal(0)) + v
    for c in spec.get("initContainers") or []:
        for r, v in _quantities((c.get("resources") or {}).get("requests")).items():
            total[r] = max(total.get(r, Decimal(0)), v)
    for r, v in _quantities(spec.get("overhead")).items():
        total[r] = total.get(r, Decimal(0)) + v
    total["pods"] = Decimal(1)
    return total


def add(a: Resources, b: Resources) -> dict[str, Decimal]:
    return {r: a.get(r, Decimal(0)) + b.get(r, Decimal(0)) for r in set(a) | set(b)}


#: Integer units the quota is split in: millicores, bytes, whole GPUs, whole pods, bytes, whole claims.
_UNIT = {
    "cpu": Decimal("0.001"),
    "memory": Decimal(1),
    GPU: Decimal(1),
    "pods": Decimal(1),
    STORAGE: Decimal(1),
    CLAIMS: Decimal(1),
}


def enforced(grant: Resources) -> dict[str, Decimal]:
    """What the quotas of a consumer's twin namespaces enforce together for `grant`: the grant, and
    with a storage grant one claim per granted pod slot (none without)."""
    claims = grant.get("pods", Decimal(0)) if grant.get(STORAGE, Decimal(0)) > 0 else Decimal(0)
    return {**{r: grant.get(r, Decimal(0)) for r in GRANT_RESOURCES}, CLAIMS: claims}


def claim_requests(claim: Mapping[str, object]) -> dict[str, Decimal]:
    """What a PersistentVolumeClaim counts against its namespace's quota, as the quota controller
    counts it: its requested storage and one claim (a request that cannot be read counts as none)."""
    spec = claim.get("spec") or {}
    assert isinstance(spec, dict)
    requested = ((spec.get("resources") or {}).get("requests") or {}).get(STORAGE)
    try:
        size = parse(str(requested)) if requested is not None else Decimal(0)
    except ValueError:
        size = Decimal(0)
    return {STORAGE: size, CLAIMS: Decimal(1)}


def partition(grant: Resources, used: Mapping[str, Resources]) -> dict[str, dict[str, Decimal]]:
    """Split a grant over namespaces so that the SUM of the per-namespace limits never exceeds it.

    Kubernetes quotas are per namespace; a consumer with several twin namespaces must not get the
    grant once per namespace. Each namespace keeps what it uses, and the headroom (grant minus all
    usage) is split evenly in integer units, the remainder going to the namespaces in name order.
    When usage already exceeds the grant (the grant shrank), every namespace is held at its usage:
    running pods keep running and bound claims stay, new ones are refused by the quota. Every
    resource of `QUOTA_RESOURCES` gets a limit (zero where the grant has none).
    """
    names = sorted(used)
    out: dict[str, dict[str, Decimal]] = {n: {} for n in names}
    if not names:
        return out
    for r in QUOTA_RESOURCES:
        unit = _UNIT[r]
        total_used = sum((used[n].get(r, Decimal(0)) for n in names), Decimal(0))
        headroom_units = int(max(Decimal(0), grant.get(r, Decimal(0)) - total_used) / unit)
        each, extra = divmod(headroom_units, len(names))
        for i, n in enumerate(names):
            out[n][r] = used[n].get(r, Decimal(0)) + unit * (each + (1 if i < extra else 0))
    return out


# ---- what a grant's quota holds beside the granted resources

#: Ephemeral storage (requests and limits) that each granted pod slot brings to a namespace's quota.
EPHEMERAL_STORAGE_PER_POD = parse("20Gi")
#: Object counts of every consumer namespace (twins: what reflection and offloaded pods need, with room;
#: the consumer cannot create node ports or load balancers at all; its claims are limited by the grant).
TWIN_OBJECT_COUNTS = {
    "count/configmaps": 1000,
    "count/secrets": 1000,
    "count/services": 200,
    "count/endpointslices.discovery.k8s.io": 1000,
    "count/ingresses.networking.k8s.io": 100,
    "services.nodeports": 0,
    "services.loadbalancers": 0,
}
#: The tenant namespace holds control objects: the consumer's requests, and the token Secrets of its pods.
TENANT_OBJECT_COUNTS = {
    **TWIN_OBJECT_COUNTS,
    "count/twinnamespaces.gpufed.io": 200,
    "count/resourceslices.gpufed.io": 50,
}
#: How a granted resource is named in a ResourceQuota.
QUOTA_NAMES = {
    "cpu": "requests.cpu",
    "memory": "requests.memory",
    GPU: f"requests.{GPU}",
    "pods": "pods",
    STORAGE: "requests.storage",
    CLAIMS: "persistentvolumeclaims",
}


def quota_hard(limits: Resources, extended: Iterable[str], *, tenant: bool) -> dict[str, str]:
    """`spec.hard` of a consumer namespace's ResourceQuota: the namespace's share of the grant
    (`limits`, from `partition`; claim storage and the number of claims zero where it has none, and
    always in the tenant namespace, which holds control objects only), ephemeral storage in proportion
    to its pods, zero of every other resource the provider's nodes offer (`extended`: MIG slices,
    other devices, huge pages), and object counts (no node ports, no load balancers; in a twin
    namespace one more Secret per pod slot, for the pod's service-account token)."""
    shares = {r: limits.get(r, Decimal(0)) for r in QUOTA_RESOURCES if r in limits or r in (STORAGE, CLAIMS)}
    if tenant:
        shares.update({STORAGE: Decimal(0), CLAIMS: Decimal(0)})
    hard = {QUOTA_NAMES[r]: _fmt(r, v) for r, v in sorted(shares.items())}
    storage = format_quantity(limits.get("pods", Decimal(0)) * EPHEMERAL_STORAGE_PER_POD, binary=True)
    hard["requests.ephemeral-storage"] = storage
    hard["limits.ephemeral-storage"] = storage
    for r in sorted(set(extended) - set(RESOURCES)):
        hard[f"requests.{r}"] = "0"
    counts = dict(TENANT_OBJECT_COUNTS if tenant else TWIN_OBJECT_COUNTS)
    if not tenant:  # every offloaded pod brings its service-account token Secret
        counts["count/secrets"] += int(limits.get("pods", Decimal(0)))
    hard.update({k: str(v) for k, v in counts.items()})
    return hard


#: Label prefixes copied from a provider's GPU nodes onto the consumer's virtual node.
GPU_LABEL_PREFIXES = ("nvidia.com/",)


def shared_gpu_labels(nodes: Iterable[NodeInfo], product: str | None) -> dict[str, str]:
    """The nvidia.com/* labels that every schedulable GPU node of `product` (all when None) carries
    with the same value: what a pod's nodeSelector may rely on wherever the provider places it."""
    common: dict[str, str] | None = None
    for n in nodes:
        if not n.schedulable or not _node_matches(n, product) or n.allocatable.get(GPU, Decimal(0)) <= 0:
            continue
        mine = {k: v for k, v in n.labels.items() if k.startswith(GPU_LABEL_PREFIXES)}
        common = mine if common is None else {k: v for k, v in common.items() if mine.get(k) == v}
    return dict(sorted((common or {}).items()))
