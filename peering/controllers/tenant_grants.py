"""A tenant's grants on the provider: each ResourceSlice decided against live capacity, and the
quotas that enforce the total.

Owns:
- `CapacityCache`: what the provider role's watches keep (nodes, running pods, claims, StorageClasses,
  PersistentVolumes, every tenant's slices, which consumer owns which namespace), and what the
  consumers use and hold of it (usage per namespace — pods' requests, claims' storage and count —
  every slice's grant with its share of its tenant's usage);
- `TenantGrants.decide`: every ResourceSlice in the tenant namespace decided against that LIVE
  capacity (`peering.grants.decide`; claim storage against what the StorageClasses offered to the
  consumer can hold, `peering.storage`) and the Tenant's policy, its status written (Authentication
  and Resources conditions, granted, used, the GPU labels the grant's nodes share, and with a storage
  grant the offered StorageClasses) with a Warning Event for a new refusal; then enforcement: a
  ResourceQuota in each of the consumer's namespaces whose limits sum to the grant
  (`peering.grants.partition`; the tenant namespace holds control objects only, its quota is
  `tenant_namespaces`'), with ephemeral storage in proportion to the pods, claim storage and one
  claim per granted pod slot, zero of every other resource the nodes offer (MIG slices, other
  devices) and object counts (`peering.grants.quota_hard`);
- `TenantGrants.storage_offer`: the StorageClasses the consumer's twin namespaces offer its claims
  (the offer while its grant holds storage), which the admission policy reads there.

Does not: authenticate the consumer (`peering.controllers.tenant_handshake`), create namespaces or
bind the consumer's roles there once the quotas hold (`peering.controllers.tenant_namespaces`), or
watch (the provider role fills the cache). The arithmetic of a decision is `peering.grants`'.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from decimal import Decimal
from typing import Any

from pydantic import ValidationError

from gpufed.apis.peering import RESOURCE_SLICE_READY, ResourceSliceSpec, StorageClassOffer, TenantSpec
from gpufed.apis.pool import GPU_RESOURCE
from gpufed.apis.quantity import format_quantity, parse
from gpufed.apis.wire import (
    CONSUMER_LABEL,
    GRANT_QUOTA,
    MANAGED_BY,
    MANAGED_BY_LABEL,
    STORAGE_RESOURCE,
    TENANT_PREFIX,
    ClusterID,
    tenant_namespace,
)
from gpufed.kube import conditions as cond
from gpufed.kube import events, meta, rest
from peering import grants, storage
from peering.controllers import status as st_
from peering.devices import DeviceInventory
from peering.grants import NodeInfo, PodLoad
from peering.storage import StorageClassInfo, VolumeInfo

QUOTA_NAMES = grants.QUOTA_NAMES


def grant_of(slice_: Mapping[str, Any] | None) -> dict[str, str]:
    """What a ResourceSlice's status says was granted ({} when nothing is)."""
    return dict(((slice_ or {}).get("status") or {}).get("granted") or {})


def total(items: Iterable[Mapping[str, Decimal]]) -> dict[str, Decimal]:
    """The per-resource sum of `items`."""
    out: dict[str, Decimal] = {}
    for u in items:
        out = grants.add(out, u)
    return out


def _fmt(resources: Mapping[str, Decimal]) -> dict[str, str]:
    return {r: format_quantity(v, binary=r in ("memory", STORAGE_RESOURCE)) for r, v in sorted(resources.items())}


def policy_of(spec: TenantSpec) -> grants.TenantPolicy:
    """The Tenant's policy as `peering.grants` decides with it."""
    return grants.TenantPolicy(
        maximum={r: parse(q) for r, q in spec.policy.max_resources.items()},
        allowed_gpu_products=frozenset(spec.policy.allowed_gpu_products)
        if spec.policy.allowed_gpu_products is not None
        else None,
        allow_partial=spec.policy.allow_partial,
    )


@dataclass
class CapacityCache:
    """The provider role's watch caches that grants are decided over."""

    nodes: dict[str, NodeInfo] = field(default_factory=dict)
    #: (namespace, name) -> (namespace, load) of every bound, running pod.
    pods: dict[tuple[str, str], tuple[str, PodLoad]] = field(default_factory=dict)
    #: (namespace, name) -> every ResourceSlice in a tenant namespace.
    slices: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)
    #: namespace -> consumer, for the tenant and twin namespaces (from their labels).
    ns_owner: dict[str, str] = field(default_factory=dict)
    #: (namespace, name) -> what each PersistentVolumeClaim counts (`peering.grants.claim_requests`).
    claims: dict[tuple[str, str], dict[str, Decimal]] = field(default_factory=dict)
    #: name -> every StorageClass.
    storage_classes: dict[str, StorageClassInfo] = field(default_factory=dict)
    #: name -> every PersistentVolume.
    volumes: dict[str, VolumeInfo] = field(default_factory=dict)
    #: namespace -> (spec.hard as `quota_amounts`, consumer label) of gpufed's grant quota there, as
    #: the watch last showed it or as last applied.
    quotas: dict[str, tuple[dict[str, Decimal | str], str]] = field(default_factory=dict)
    #: DRA devices: GPUs a DeviceClass maps to nvidia.com/gpu are node capacity, and what claims hold
    #: of them is load (the pods' requests do not show it).
    devices: DeviceInventory = field(default_factory=DeviceInventory)

    def capacity_nodes(self) -> list[NodeInfo]:
        """The nodes, each with its DRA devices that count as GPUs added to its allocatable GPUs."""
        dra = self.devices.extended(GPU_RESOURCE)
        out = []
        for n in self.nodes.values():
            extra = dra.get(n.name, (0, 0))[0]
            if extra:
                gpus = n.allocatable.get(GPU_RESOURCE, Decimal(0)) + extra
                n = replace(n, allocatable={**n.allocatable, GPU_RESOURCE: gpus})
            out.append(n)
        return out

    def loads(self) -> list[PodLoad]:
        """Every bound pod's requests, and per node the DRA GPUs claims hold beyond them."""
        dra = self.devices.extended(GPU_RESOURCE)
        held = [PodLoad(node, {GPU_RESOURCE: Decimal(h)}) for node, (_n, h) in sorted(dra.items()) if h]
        return [load for _ns, load in self.pods.values()] + held

    def usage(self, consumer: str) -> dict[str, dict[str, Decimal]]:
        """What the consumer's pods request and its claims (volumes, and DRA devices that count as
        GPUs) hold now, per namespace it owns (tenant and twins)."""
        out: dict[str, dict[str, Decimal]] = {}
        for ns, load in self.pods.values():
            if self.ns_owner.get(ns) == consumer:
                out[ns] = grants.add(out.get(ns, {}), load.requests)
        for (ns, _name), held in self.claims.items():
            if self.ns_owner.get(ns) == consumer:
                out[ns] = grants.add(out.get(ns, {}), held)
        for ns, devices in self.devices.held_by_namespace(GPU_RESOURCE).items():
            if self.ns_owner.get(ns) == consumer:
                out[ns] = grants.add(out.get(ns, {}), {GPU_RESOURCE: Decimal(devices)})
        return out

    def grant_shares(self) -> dict[tuple[str, str], grants.OtherGrant]:
        """Every slice's grant and its share of its tenant's usage (attributed in slice-name order)."""
        out: dict[tuple[str, str], grants.OtherGrant] = {}
        remaining: dict[str, dict[str, Decimal]] = {}
        for (ns, name), obj in sorted(self.slices.items()):
            if ns not in remaining:
                remaining[ns] = total(self.usage(ns[len(TENANT_PREFIX) :]).values())
            try:
                granted = {r: parse(q) for r, q in grant_of(obj).items()}
            except ValueError:
                continue
            used = {r: min(remaining[ns].get(r, Decimal(0)), g) for r, g in granted.items()}
            remaining[ns] = {r: v - used.get(r, Decimal(0)) for r, v in remaining[ns].items()}
            out[(ns, name)] = grants.OtherGrant(granted, used, (obj.get("spec") or {}).get("gpuProduct"))
        return out


@dataclass(frozen=True)
class TenantTotals:
    """A tenant's whole grant and what its pods request now."""

    granted: dict[str, Decimal]
    used: dict[str, Decimal]


class TenantGrants:
    """Decides the slices of the provider's tenants and applies their quotas."""

    def __init__(self, api: Any, cache: CapacityCache) -> None:
        self.api = api
        self.cache = cache

    def offers(self, spec: TenantSpec) -> list[StorageClassOffer]:
        """The StorageClasses the Tenant's policy offers its consumer, as the cache knows them."""
        return storage.offers(self.cache.storage_classes.values(), spec.policy.storage_classes)

    def storage_offer(self, spec: TenantSpec, consumer: ClusterID) -> tuple[StorageClassOffer, ...]:
        """What the consumer's twin namespaces offer its claims: the offer while its slices (as last
        decided) grant storage, nothing otherwise."""
        tns = tenant_namespace(consumer)
        granted = Decimal(0)
        for (ns, _name), obj in self.cache.slices.items():
            if ns == tns:
                try:
                    granted += parse(str(grant_of(obj).get(STORAGE_RESOURCE, "0")))
                except ValueError:
                    continue
        return storage.projected(self.offers(spec), granted)

    async def decide(
        self, spec: TenantSpec, consumer: ClusterID, twins: list[str], status: dict[str, Any]
    ) -> TenantTotals:
        """Decide every slice of the tenant, apply its quotas, and fill the grant into `status`."""
        tns = tenant_namespace(consumer)
        policy = policy_of(spec)
        offered = self.offers(spec)
        supply = storage.supply(offered, self.cache.storage_classes, self.cache.volumes.values())
        # The watch cache is at least as fresh as the event that queued this reconcile.
        slices = [obj for (ns, _name), obj in sorted(self.cache.slices.items()) if ns == tns]
        usage = self.cache.usage(consumer)
        remaining = total(usage.values())
        shares = self.cache.grant_shares()
        pods = self.cache.loads()
        nodes = self.cache.capacity_nodes()
        total_granted: dict[str, Decimal] = {}
        for s in slices:
            old = dict(s.get("status") or {})
            st: dict[str, Any] = {"conditions": list(old.get("conditions") or [])}
            conds = st["conditions"]
            auth = cond.condition(
                "Authentication", True, "Authenticated", f"consumer {consumer} is authenticated", conds
            )
            try:
                sspec = ResourceSliceSpec.model_validate(s.get("spec") or {})
                request = grants.SliceRequest({r: parse(q) for r, q in sspec.resources.items()}, sspec.gpu_product)
                own = {r: min(remaining.get(r, Decimal(0)), v) for r, v in request.resources.items()}
                remaining = {r: v - own.get(r, Decimal(0)) for r, v in remaining.items()}
                decision = grants.decide(
                    request,
                    nodes=nodes,
                    pods=pods,
                    own_usage=own,
                    others=[g for key, g in shares.items() if key != (tns, meta.name(s))],
                    policy=policy,
                    storage=supply,
                )
                res = cond.condition("Resources", decision.accepted, decision.reason, decision.message, conds)
                granted = dict(decision.granted)
                used = own
                st["nodeLabels"] = grants.shared_gpu_labels(nodes, sspec.gpu_product)
            except (ValidationError, ValueError) as e:
                res = cond.condition("Resources", False, "InvalidSlice", f"the slice is invalid: {str(e)[:400]}", conds)
                granted, used = {}, {}
            st["conditions"] = cond.ready(
                cond.set_condition(cond.set_condition(conds, auth), res), RESOURCE_SLICE_READY, meta.generation(s)
            )
            st["granted"] = _fmt(granted)
            st["used"] = _fmt({r: v for r, v in used.items() if r in granted})
            if granted.get(STORAGE_RESOURCE, Decimal(0)) > 0:  # an empty list is not written (`rest.apply`)
                st["storageClasses"] = [o.model_dump(by_alias=True, mode="json") for o in offered]
            total_granted = grants.add(total_granted, granted)
            if cond.without_times(old) != cond.without_times(st):
                await st_.write(self.api, "ResourceSlice", "resourceslices", meta.name(s), st, tns)
                if res["status"] == "False" and cond.reason_of(old.get("conditions"), "Resources") != res["reason"]:
                    await events.emit(self.api, s, type_="Warning", reason=res["reason"], message=res["message"])
        # Enforcement: the twins share the grant (the tenant namespace's quota, control objects only,
        # is tenant_namespaces').
        limits = grants.partition(grants.enforced(total_granted), {t: usage.get(t, {}) for t in twins})
        extended = {r for n in self.cache.nodes.values() for r in n.extended}
        for ns, hard in limits.items():
            want = dict(grants.quota_hard(hard, extended, tenant=False))
            if self.cache.quotas.get(ns) != (quota_amounts(want), consumer):  # the watch shows it as wanted
                await apply_quota(self.api, ns, consumer, want)
                self.cache.quotas[ns] = (quota_amounts(want), consumer)
        used_now = total(usage.values())
        status["granted"] = _fmt(total_granted)
        status["used"] = _fmt(used_now)
        status["twinNamespaces"] = twins
        status["namespace"] = tns
        return TenantTotals(total_granted, used_now)


def quota_amounts(hard: Mapping[str, Any]) -> dict[str, Decimal | str]:
    """A quota's `hard` to compare by amount (the API server writes quantities in its own form:
    `1024Mi` comes back as `1Gi`); what is not a quantity is compared as written."""
    out: dict[str, Decimal | str] = {}
    for r, q in hard.items():
        try:
            out[str(r)] = parse(q)
        except ValueError:
            out[str(r)] = str(q)
    return out


async def apply_quota(api: Any, namespace: str, consumer: ClusterID, hard: Mapping[str, str]) -> None:
    """The grant's ResourceQuota `gpufed-grant` in one of a consumer's namespaces (tenant or twin)."""
    await rest.apply(
        api,
        rest.path("v1", "resourcequotas", GRANT_QUOTA, namespace=namespace),
        {
            "apiVersion": "v1",
            "kind": "ResourceQuota",
            "metadata": {
                "name": GRANT_QUOTA,
                "namespace": namespace,
                "labels": {MANAGED_BY_LABEL: MANAGED_BY, CONSUMER_LABEL: consumer},
            },
            "spec": {"hard": dict(hard)},
        },
    )
