"""The provider role: one reconciler per Tenant (one per consumer), fed by the watches that matter.

Owns: the role's watches (nodes, running pods, PersistentVolumeClaims, PersistentVolumes,
StorageClasses, ResourceSlices, Tenants, consumer namespaces, TwinNamespaces, and gpufed's CSRs and
quotas) and the caches they keep (`CapacityCache`); which tenants an event re-queues (capacity
churn re-decides every tenant, debounced; heartbeats, status-only pod updates, a quota's usage and
the reconcile's own status and quota writes re-decide none; a claim re-decides its consumer), and
how much: a tenant queued by nodes and pods alone, whose last full reconcile settled less than
`resync_s` ago with the same spec, has its grant re-decided on what that reconcile saw (`_redecide`:
no namespace, role binding or policy is read or written), anything else gets a full reconcile;
readiness once the caches have synced; and `reconcile`,
level-triggered and idempotent, which for one Tenant validates its spec (phase Refused with an
`InvalidTenant` condition otherwise), applies the admission policies before any namespace of the
consumer exists, advances the handshake (`tenant_handshake`; consumers' later renewals of their certificates are
approved by `renewal_approval`, run beside the reconcilers), and once the consumer is
Authenticated ensures its tenant and twin namespaces (`tenant_namespaces`; the twins offer its claims
the StorageClasses of its storage grant as last decided), decides its slices and
quotas (`tenant_grants`), only then opens the namespaces to the consumer (role bindings once each
quota is in force, TwinNamespaces Ready), and sets the `PodSecurity` condition saying what its pods
may not do. The role also watches PriorityClasses: the global default one is allowed in every
consumer namespace (the provider's Priority admission names it in pods that name none).

Every outcome a human must see is a condition on the Tenant / ResourceSlice / TwinNamespace and,
for refusals, a Warning Event.

Metrics (defined with the consumer role's, here with role="provider" and the consumer as
remote_cluster): `gpufed_peering_phase` (1 for the Tenant's phase) and `gpufed_resource_granted` /
`gpufed_resource_used` (the tenant's total grant and what its pods request), dropped with the Tenant.

Does not: delete tenants (that is `gpufed unpeer`), or know the consumer's cluster beyond its id and key.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import structlog
from pydantic import ValidationError

from gpufed.apis.meta import API_VERSION
from gpufed.apis.peering import TENANT_READY, TenantSpec
from gpufed.apis.wire import (
    CONSUMER_LABEL,
    DRA_API_PATH,
    GRANT_QUOTA,
    MANAGED_BY,
    MANAGED_BY_LABEL,
    TENANT_PREFIX,
    ClusterID,
    parse_cluster_id,
)
from gpufed.kube import conditions as cond
from gpufed.kube import meta, rest
from gpufed.kube.metrics import StateGauge
from gpufed.kube.queue import WorkQueue
from gpufed.kube.watch import watch
from peering import grants, handshake, podsecurity, storage
from peering.controllers import status as st_
from peering.controllers.consumer import PEERING_PHASE, RESOURCE_GRANTED, RESOURCE_USED
from peering.controllers.identity import Identity
from peering.controllers.renewal_approval import RenewalApprover
from peering.controllers.tenant_grants import CapacityCache, TenantGrants, grant_of, quota_amounts
from peering.controllers.tenant_handshake import DEFAULT_CERT_SECONDS, TenantHandshake
from peering.controllers.tenant_namespaces import TenantNamespaces
from peering.grants import PodLoad

#: Seconds between full re-evaluations of a tenant even when nothing was seen to change.
DEFAULT_RESYNC_S = 30.0
#: Coalescing window for capacity changes (node and pod churn) before tenants are re-decided.
CAPACITY_DEBOUNCE_S = 1.0
#: Phases of a Tenant, as this role sets them.
PHASES = ("Pending", "Challenged", "Authenticated", "Refused")
ROLE = "provider"
_PHASE = StateGauge(PEERING_PHASE, PHASES)
#: The caches a decision depends on: the role is ready once every one has synced.
_GATES = frozenset({"nodes", "pods", "claims", "volumes", "storageclasses", "slices", "tenants", "namespaces"})


@dataclass(frozen=True)
class ProviderSettings:
    #: Seconds between periodic re-evaluations of every tenant.
    resync_s: float = DEFAULT_RESYNC_S
    #: How long a challenge may be answered.
    challenge_ttl: dt.timedelta = handshake.DEFAULT_CHALLENGE_TTL
    #: Requested lifetime of consumer client certificates, in seconds.
    cert_seconds: int = DEFAULT_CERT_SECONDS
    #: Concurrent tenant reconciles.
    workers: int = 4


def _tenant_of_namespace(namespace: str) -> str | None:
    if namespace.startswith(TENANT_PREFIX):
        return namespace[len(TENANT_PREFIX) :]
    return None


@dataclass(frozen=True)
class _Seen:
    """What a tenant's last full reconcile saw and settled."""

    spec: TenantSpec
    #: The twin namespaces it opened (the grant's quotas are partitioned over them).
    twins: list[str]
    #: When (monotonic): a full reconcile follows `resync_s` later in any case.
    at: float

    def holds(self, spec: TenantSpec, status: Mapping[str, Any], now: float, resync_s: float) -> bool:
        return spec == self.spec and status.get("phase") == "Authenticated" and now - self.at < resync_s


def _written(status: Mapping[str, Any]) -> dict[str, Any]:
    """A status as the API server keeps it: empty maps and lists are not stored."""
    return {k: v for k, v in status.items() if v not in ({}, [], None)}


class ProviderRole:
    """Runs the provider reconcilers of one cluster."""

    def __init__(self, api: Any, identity: Identity, settings: ProviderSettings | None = None) -> None:
        self.api = api
        self.identity = identity
        self.settings = settings or ProviderSettings()
        self.queue: WorkQueue[str] = WorkQueue("tenants")
        self.cache = CapacityCache()
        self.tenants: set[str] = set()
        self.ready = asyncio.Event()
        self._synced: set[str] = set()
        #: The caches that must be listed before grants are decided (DRA's too where it is served).
        self._gates = set(_GATES)
        self._log = structlog.get_logger().bind(cluster=identity.cluster_id, role="provider")
        self.namespaces = TenantNamespaces(api, self._log)
        self.handshake = TenantHandshake(
            api,
            identity,
            self.namespaces,
            challenge_ttl=self.settings.challenge_ttl,
            cert_seconds=self.settings.cert_seconds,
        )
        self.grants = TenantGrants(api, self.cache)
        #: Consumers' renewals of their client certificates.
        self.renewals = RenewalApprover(api, identity.cluster_id, self.settings.cert_seconds)
        #: Tenants queued for a full reconcile; the others were queued by capacity churn alone.
        self._full: set[str] = set()
        #: Tenant -> what its last full reconcile saw (`_Seen`): a reconcile queued by capacity churn
        #: alone re-decides the grant on it.
        self._seen: dict[str, _Seen] = {}
        #: Namespace -> whether gpufed's grant quota there is in force, as last seen.
        self._in_force: dict[str, bool] = {}
        #: Tenant -> (generation, deleting, labels, annotations) as last seen: its status writes (the
        #: reconcile's own) change none of them.
        self._tenant_gen: dict[str, tuple[int, bool, str, str]] = {}

    # ---- informers

    def _synced_cb(self, what: str) -> Any:
        def done() -> None:
            self._synced.add(what)
            if self._synced >= self._gates and not self.ready.is_set():
                self.ready.set()
                self._log.info("provider caches synced", tenants=len(self.tenants), nodes=len(self.cache.nodes))
            for t in self.tenants:
                self._queue_full(t)

        return done

    def _queue_full(self, tenant: str, delay: float = 0.0) -> None:
        self._full.add(tenant)
        self.queue.add(tenant, delay)

    def _all_tenants(self, *, full: bool = False) -> None:
        """Every tenant, debounced; `full` when what changed is more than capacity (nodes and pods)."""
        for t in self.tenants:
            if full:
                self._full.add(t)
            self.queue.add(t, CAPACITY_DEBOUNCE_S)

    def _on_node(self, kind: str, obj: dict[str, Any]) -> None:
        nodes = self.cache.nodes
        name = meta.name(obj)
        before = nodes.get(name)
        if kind == "DELETED":
            nodes.pop(name, None)
        else:
            nodes[name] = grants.node_info(obj)
        if nodes.get(name) != before:  # heartbeats change nothing a grant depends on
            self._all_tenants()

    def _on_pod(self, kind: str, obj: dict[str, Any]) -> None:
        pods = self.cache.pods
        key = (meta.namespace(obj), meta.name(obj))
        phase = (obj.get("status") or {}).get("phase")
        node = (obj.get("spec") or {}).get("nodeName")
        before = pods.get(key)
        if kind == "DELETED" or phase in ("Succeeded", "Failed") or not node:
            pods.pop(key, None)
        else:
            try:
                pods[key] = (key[0], PodLoad(node, grants.pod_requests(obj)))
            except ValueError:
                return  # a request the apiserver accepted but we cannot parse is ignored, not fatal
        if pods.get(key) != before:  # status updates of a bound pod change nothing a grant depends on
            self._all_tenants()

    def _on_device_object(self, kind: str, obj: dict[str, Any]) -> None:
        """A DRA ResourceSlice, DeviceClass or ResourceClaim: GPUs on DRA nodes and what claims hold."""
        devices = self.cache.devices
        before = devices.changes
        plural = {"ResourceSlice": "slice", "DeviceClass": "class", "ResourceClaim": "claim"}.get(str(obj.get("kind")))
        if plural == "slice":
            devices.delete_slice(meta.name(obj)) if kind == "DELETED" else devices.set_slice(obj)
        elif plural == "class":
            devices.delete_class(meta.name(obj)) if kind == "DELETED" else devices.set_class(obj)
        elif plural == "claim":
            if kind == "DELETED":
                devices.delete_claim(meta.namespace(obj), meta.name(obj))
            else:
                devices.set_claim(obj)
        if devices.changes != before:
            self._all_tenants()

    def _on_claim(self, kind: str, obj: dict[str, Any]) -> None:
        claims = self.cache.claims
        key = (meta.namespace(obj), meta.name(obj))
        before = claims.get(key)
        if kind == "DELETED":
            claims.pop(key, None)
        else:
            claims[key] = grants.claim_requests(obj)
        consumer = self.cache.ns_owner.get(key[0])
        if claims.get(key) != before and consumer in self.tenants:  # only a consumer's claims count in a grant
            self._queue_full(consumer, CAPACITY_DEBOUNCE_S)

    def _on_volume(self, kind: str, obj: dict[str, Any]) -> None:
        volumes = self.cache.volumes
        name = meta.name(obj)
        before = volumes.get(name)
        if kind == "DELETED":
            volumes.pop(name, None)
        else:
            volumes[name] = storage.volume_info(obj)
        if volumes.get(name) != before:  # static volumes bound or released change what storage is free
            self._all_tenants(full=True)

    def _on_storage_class(self, kind: str, obj: dict[str, Any]) -> None:
        classes = self.cache.storage_classes
        name = meta.name(obj)
        before = classes.get(name)
        if kind == "DELETED":
            classes.pop(name, None)
        else:
            classes[name] = storage.storage_class_info(obj)
        if classes.get(name) != before:
            self._all_tenants(full=True)

    def _on_slice(self, kind: str, obj: dict[str, Any]) -> None:
        slices = self.cache.slices
        tenant = _tenant_of_namespace(meta.namespace(obj))
        if tenant is None:
            return
        key = (meta.namespace(obj), meta.name(obj))
        before = slices.get(key)
        if kind == "DELETED":
            slices.pop(key, None)
        else:
            slices[key] = obj
        if before is None or kind == "DELETED" or meta.generation(before) != meta.generation(obj):
            self._queue_full(tenant)
        # else its status changed, which only the reconcile itself writes (the resync repairs any other)
        # Other tenants see this slice only through its grant (it reserves capacity).
        if grant_of(before) != grant_of(slices.get(key)):
            self._all_tenants()

    def _on_tenant(self, kind: str, obj: dict[str, Any]) -> None:
        name = meta.name(obj)
        if kind == "DELETED":
            self.tenants.discard(name)
            self._tenant_gen.pop(name, None)
            self._seen.pop(name, None)
        else:
            self.tenants.add(name)
            m = obj.get("metadata") or {}
            seen = (meta.generation(obj), meta.is_deleting(obj), str(m.get("labels")), str(m.get("annotations")))
            if self._tenant_gen.get(name) != seen:
                self._tenant_gen[name] = seen
                self._queue_full(name)

    def _on_labelled(self, kind: str, obj: dict[str, Any]) -> None:
        consumer = meta.labels(obj).get(CONSUMER_LABEL)
        if consumer and consumer in self.tenants:
            self._queue_full(consumer)

    def _on_quota(self, kind: str, obj: dict[str, Any]) -> None:
        """gpufed's grant quotas: their usage follows every pod and changes nothing here; what they
        enforce (unless it is what the grant last applied), their labels, or whether they are in
        force yet (the quota controller filled their status) does."""
        ns = meta.namespace(obj)
        if meta.name(obj) != GRANT_QUOTA:
            self._on_labelled(kind, obj)
            return
        if kind == "DELETED":
            self.cache.quotas.pop(ns, None)
            self._in_force.pop(ns, None)
            self._on_labelled(kind, obj)
            return
        seen = (quota_amounts((obj.get("spec") or {}).get("hard") or {}), meta.labels(obj).get(CONSUMER_LABEL, ""))
        in_force = bool((obj.get("status") or {}).get("hard"))
        if self.cache.quotas.get(ns) == seen and self._in_force.get(ns) == in_force:
            return
        self.cache.quotas[ns] = seen
        self._in_force[ns] = in_force
        self._on_labelled(kind, obj)

    def _on_namespace(self, kind: str, obj: dict[str, Any]) -> None:
        name = meta.name(obj)
        consumer = meta.labels(obj).get(CONSUMER_LABEL)
        if kind == "DELETED" or not consumer:
            consumer = self.cache.ns_owner.pop(name, None)
        else:
            self.cache.ns_owner[name] = consumer
        if consumer in self.tenants:
            self._queue_full(consumer)

    def _on_priority_class(self, kind: str, obj: dict[str, Any]) -> None:
        name = meta.name(obj)
        current = self.namespaces.default_priority_class
        if kind != "DELETED" and obj.get("globalDefault") is True:
            self.namespaces.default_priority_class = name
        elif current == name:
            self.namespaces.default_priority_class = None
        if self.namespaces.default_priority_class != current:
            self._all_tenants(full=True)

    def _on_twin_request(self, kind: str, obj: dict[str, Any]) -> None:
        tenant = _tenant_of_namespace(meta.namespace(obj))
        if tenant:
            self._queue_full(tenant)

    async def run(self) -> None:
        label = {"labelSelector": f"{MANAGED_BY_LABEL}={MANAGED_BY}"}
        running = {"fieldSelector": "status.phase!=Succeeded,status.phase!=Failed"}
        # (path, handler, name, params, counts for readiness)
        informers: list[tuple[str, Any, str, dict[str, str] | None, bool]] = [
            ("/api/v1/nodes", self._on_node, "nodes", None, True),
            ("/api/v1/pods", self._on_pod, "pods", running, True),
            ("/api/v1/persistentvolumeclaims", self._on_claim, "claims", None, True),
            ("/api/v1/persistentvolumes", self._on_volume, "volumes", None, True),
            ("/apis/storage.k8s.io/v1/storageclasses", self._on_storage_class, "storageclasses", None, True),
            (rest.path(API_VERSION, "resourceslices"), self._on_slice, "slices", None, True),
            (rest.path(API_VERSION, "tenants"), self._on_tenant, "tenants", None, True),
            ("/api/v1/namespaces", self._on_namespace, "namespaces", {"labelSelector": CONSUMER_LABEL}, True),
            (rest.path(API_VERSION, "twinnamespaces"), self._on_twin_request, "twinns", None, False),
            ("/apis/certificates.k8s.io/v1/certificatesigningrequests", self._on_labelled, "csrs", label, False),
            ("/api/v1/resourcequotas", self._on_quota, "quotas", label, False),
            ("/apis/scheduling.k8s.io/v1/priorityclasses", self._on_priority_class, "priorityclasses", None, False),
        ]
        if await rest.serves(self.api, DRA_API_PATH):
            for plural in ("resourceslices", "deviceclasses", "resourceclaims"):
                self._gates.add(f"dra-{plural}")
                informers.append((f"{DRA_API_PATH}/{plural}", self._on_device_object, f"dra-{plural}", None, True))
        async with asyncio.TaskGroup() as tg:
            for path_, handler, what, params, gates in informers:
                synced = self._synced_cb(what) if gates else None
                tg.create_task(watch(self.api, path_, handler, what=what, params=params, on_synced=synced))
            tg.create_task(self.renewals.run())
            await self.ready.wait()
            tg.create_task(self.queue.run(self.reconcile, workers=self.settings.workers))

    # ---- reconcile one tenant

    async def reconcile(self, name: str) -> float | None:
        tenant = await rest.get(self.api, rest.path(API_VERSION, "tenants", name))
        if tenant is None or meta.is_deleting(tenant):
            self.namespaces.forget(name)
            _PHASE.remove(name, ROLE)
            RESOURCE_GRANTED.remove(name, ROLE)
            RESOURCE_USED.remove(name, ROLE)
            return None
        log = self._log.bind(remote_cluster=name, kind="Tenant", name=name)
        old_status: dict[str, Any] = dict(tenant.get("status") or {})
        status = dict(old_status)
        status.setdefault("conditions", [])
        try:
            spec = TenantSpec.model_validate(tenant.get("spec") or {})
            consumer = parse_cluster_id(spec.consumer_cluster_id)
            if consumer != name:
                raise ValueError(f"spec.consumerClusterId {consumer!r} must equal the Tenant's name {name!r}")
        except (ValidationError, ValueError) as e:
            status["phase"] = "Refused"
            status["conditions"] = cond.mark(
                status["conditions"], "Authentication", False, "InvalidTenant", str(e)[:500]
            )
            await self._write_status(tenant, old_status, status)
            _PHASE.set("Refused", name, ROLE)
            return None

        full = name in self._full
        self._full.discard(name)
        seen = self._seen.get(name)
        if not full and seen is not None and seen.holds(spec, old_status, time.monotonic(), self.settings.resync_s):
            return await self._redecide(tenant, spec, consumer, seen, old_status, status)
        self._seen.pop(name, None)
        requeue = self.settings.resync_s
        # Before any namespace of the consumer exists: its pods are checked from their first.
        await self.namespaces.ensure_admission_policy()
        wait = await self.handshake.authenticate(tenant, spec, consumer, status, log)
        if wait is not None:
            requeue = min(requeue, wait)
        if status.get("phase") == "Authenticated":
            offered = self.grants.storage_offer(spec, consumer)
            projection = await self.namespaces.projection(tenant, consumer, offered)
            if not await self.namespaces.ensure_tenant_namespace(tenant, consumer, projection):
                status["conditions"] = cond.mark(
                    status["conditions"],
                    "Namespaces",
                    False,
                    "NamespaceTaken",
                    f"namespace {TENANT_PREFIX}{consumer} exists and is not consumer {consumer}'s; it is left alone",
                )
                await self._write_status(tenant, old_status, status)
                return requeue
            status["conditions"] = cond.mark(
                status["conditions"],
                "Namespaces",
                True,
                "Owned",
                f"namespace {TENANT_PREFIX}{consumer} is consumer {consumer}'s tenant namespace",
            )
            plan = await self.namespaces.twins(tenant, consumer, log, projection)
            # Quotas first: the consumer gets its role bindings in a namespace only once its quota holds.
            totals = await self.grants.decide(spec, consumer, plan.ready, status)
            opening = await self.namespaces.open(consumer, plan)
            if opening is not None:
                requeue = min(requeue, opening)
            elif wait is None and self.grants.storage_offer(spec, consumer) == offered:
                # Settled: until something beyond capacity changes, or the resync, churn re-decides
                # the grant alone.
                self._seen[name] = _Seen(spec, list(plan.ready), time.monotonic())
            RESOURCE_GRANTED.set({r: float(v) for r, v in totals.granted.items()}, consumer, ROLE)
            RESOURCE_USED.set({r: float(v) for r, v in totals.used.items()}, consumer, ROLE)
            status["conditions"] = cond.mark(
                status["conditions"],
                "PodSecurity",
                True,
                "Enforced",
                f"offload policy for consumer {consumer}'s pods: {podsecurity.describe(spec.policy.pod_security)}",
            )
        await self._write_status(tenant, old_status, status)
        _PHASE.set(str(status.get("phase") or "Pending"), name, ROLE)
        return requeue

    async def _redecide(
        self,
        tenant: dict[str, Any],
        spec: TenantSpec,
        consumer: ClusterID,
        seen: _Seen,
        old_status: dict[str, Any],
        status: dict[str, Any],
    ) -> float:
        """A reconcile queued by capacity churn alone: the grant re-decided on what the last full
        reconcile saw (its namespaces, policy and storage offer stay as they are)."""
        offered = self.grants.storage_offer(spec, consumer)
        totals = await self.grants.decide(spec, consumer, seen.twins, status)
        RESOURCE_GRANTED.set({r: float(v) for r, v in totals.granted.items()}, consumer, ROLE)
        RESOURCE_USED.set({r: float(v) for r, v in totals.used.items()}, consumer, ROLE)
        await self._write_status(tenant, old_status, status)
        if self.grants.storage_offer(spec, consumer) != offered:  # the twins offer other classes now
            self._seen.pop(consumer, None)
            return 0.0
        return max(0.0, seen.at + self.settings.resync_s - time.monotonic())

    async def _write_status(self, tenant: dict[str, Any], old: dict[str, Any], new: dict[str, Any]) -> None:
        new = {**new, "conditions": cond.ready(new.get("conditions") or [], TENANT_READY, meta.generation(tenant))}
        if _written(old) == _written(new):
            return
        await st_.write(self.api, "Tenant", "tenants", meta.name(tenant), new)
