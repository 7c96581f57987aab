"""`RemoteProvider`: the PodProvider of the virtual nodes backed by one peered cluster.

Owns, for one (consumer, provider) — shared by every pool node of that provider (`remote.pools`):
- the provider-side view: TwinNamespaces of this consumer (from its tenant namespace: which local
  namespace maps to which twin namespace), and per ready twin namespace a watch on this consumer's
  twins (label `gpufed.io/origin-cluster-id=<consumer>`; each twin names its pool node in
  `gpufed.io/origin-node`) and on the namespace's Events;
- creating twins (forge.pods.remote_pod) after the ConfigMaps and Secrets they reference exist in
  the twin namespace (`remote.references`) and, with `tokens`, after their consumer-issued
  service-account tokens were issued (remote.tokens; their Secret is written right after the twin,
  owned by it), deleting them with UID preconditions,
  mapping API refusals to `ProviderError` with the provider's own message (`remote.refusals`, e.g.
  the quota's "exceeded quota: gpufed-grant, requested: ...");
- before creating the twin of a GPU pod, asking `placement` (the capacity estimator) whether any
  provider node can take it (`remote.placement`): a definite no is `ProviderError(fail_back=True)`;
- the provider's offload pod-security policy, as each Ready TwinNamespace's `status.podSecurity`
  publishes it: a pod it refuses (privileged, host namespaces, hostPath, added capabilities) gets no
  twin and `ProviderError(reason=OffloadPolicyRefused, retry=False)` with the reason
  (`forge.podpolicy`) — not retried and not failed back (every replacement would be refused the
  same way), but tried again when that namespace's policy changes. The provider's API server
  enforces the policy anyway; its refusal (403 from the admission policy or Pod Security
  Admission) is mapped the same way, with the API server's message;
- following the TwinNamespaces the consumer confirmed (`remote.claims` decides which, and reports
  the claims it did not make): a claim not followed starts nothing (no reflection, no twin, no token);
- telling `reflection` (the `NamespaceReflection` it is built with) when a twin namespace becomes
  Ready (and offloaded here) or goes, and which Ingress annotations the provider publishes as allowed
  there (`INGRESS_ANNOTATIONS_FIELD` of the TwinNamespace status; None while it publishes none), and
  asking it for a namespace's annotations (its allow-list mode);
- refusing a pod that addresses objects by names Kubernetes never gives (`forge.pods.invalid_names`,
  e.g. `imagePullSecrets: ../../gpufed/secrets/x`): `ProviderError(reason=InvalidName)`, before
  anything is read for it;
- the local pods' status from their twins', the twins' addresses translated and checked
  (`remote.addresses`);
- starting and stopping, with each followed twin namespace's twin watch, the mirroring of its
  Events about twins onto the local pods (`remote.remote_events`). Those and every Event this view
  causes go through one bounded `EventRelay` (`events`: a bounded queue, per-pod and total rate
  limits, similar Events of one pod combined; what is dropped is counted in
  `gpufed_relayed_events_dropped_total`), never a task per provider Event;
- watching this provider's ResourceSlices; the grant they add up to and the provider's health,
  which pool nodes advertise, are `remote.grant`'s.

Construction takes the collaborators: the two API clients, the IP translator, the token issuer,
the estimator's `placement` (None: static capacity, nobody to ask), the `reflection` (None: no
object reflection), `pod_addresses` (None: addresses are only translated) and `events`, the relay
it runs (None: one of its own, with `settings.event_limits`; the token issuer's reports belong in
the same relay). Subscribers to twin changes register with `subscribe`, before `run`.

Does not: decide when to create or delete (vkprovider.node does), or pick up renewed credentials
(the provider client it is given is a `gpufed.kube.reloadable.ReloadableClient` that the virtual
kubelet's composition root swaps when they change).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import structlog

from gpufed.apis.meta import API_VERSION
from gpufed.apis.offloading import OffloadPodSecurity
from gpufed.apis.wire import (
    ORIGIN_CLUSTER_LABEL,
    ORIGIN_UID_LABEL,
    SYSTEM_NAMESPACE,
    ClusterID,
    tenant_namespace,
)
from gpufed.kube import rest
from gpufed.kube.client import KubeError
from gpufed.kube.contention import contended, retry_contended
from gpufed.kube.deleted import RecentlyDeleted
from gpufed.kube.times import parse_rfc3339
from gpufed.kube.watch import watch
from vkprovider.forge import groups, podpolicy
from vkprovider.forge import pods as forge
from vkprovider.forge.dra_claims import twin_pod_claims
from vkprovider.forge.meta import Target, is_dns_subdomain, owned_by
from vkprovider.node.provider import NOT_FOUND, Notify, ProviderError, Twin
from vkprovider.remote.addresses import TwinAddresses
from vkprovider.remote.claims import DEFAULT_CLAIM_GRACE_S, TwinNamespaceClaims
from vkprovider.remote.dra_claims import ClaimOffloader
from vkprovider.remote.events_relay import EventRelay, RelayLimits
from vkprovider.remote.grant import Grant, Health, ProviderGrant
from vkprovider.remote.groups import GroupStart, SnapshotOf
from vkprovider.remote.offloaded import OffloadedNamespaces
from vkprovider.remote.placement import PlacementGate, Placer
from vkprovider.remote.references import ReferenceCopier
from vkprovider.remote.refusals import ADMISSION_REFUSED, refusal
from vkprovider.remote.remote_events import RemoteEvents
from vkprovider.remote.tokens import PodTokens
from vkprovider.remote.translate import Identity, IPTranslator, PodAddresses
from vkprovider.remote.twinstore import TwinStore

COMPONENT = "gpufed-virtual-kubelet"
#: Reason of the Warning Event for a pod that names objects by invalid names.
INVALID_NAME = "InvalidName"
#: The TwinNamespace status field where a provider publishes the Ingress annotations its policy
#: allows (the tenant's `spec.policy.ingressAnnotations`); without it only the class annotation is sent.
INGRESS_ANNOTATIONS_FIELD = "ingressAnnotations"


@dataclass(frozen=True)
class RemoteSettings:
    #: This (consumer) cluster's ClusterID.
    consumer: str
    #: The provider's ClusterID.
    provider: str
    #: The provider's default virtual node (twins without an origin-node label belong to it).
    node: str
    #: hostIP reported for offloaded pods (the virtual node's address).
    host_ip: str = "127.0.0.1"
    #: Seconds a health answer of the provider's API is reused.
    health_ttl_s: float = 2.0
    #: Seconds a GPU pod the estimator cannot place now waits (retried, no twin) before it is
    #: failed back: pods finishing at the provider free GPUs within moments.
    unplaceable_grace_s: float = 30.0
    #: Provider-supplied node labels allowed beyond the GPU ones (`forge.pools.label_allowed`).
    node_label_allow: tuple[str, ...] = ()
    #: Seconds a TwinNamespace the consumer did not ask for stays before it is reported.
    claim_grace_s: float = DEFAULT_CLAIM_GRACE_S
    #: How many Events about consumer objects this provider's view may cause, and how fast.
    event_limits: RelayLimits = field(default_factory=RelayLimits)


class NamespaceReflection(Protocol):
    """What the provider needs of the reflection of offloaded namespaces (`remote.reflection`)."""

    def start_namespace(self, local_ns: str, twin_ns: str) -> None:
        """Start reflecting `local_ns` into `twin_ns` (its TwinNamespace became Ready)."""
        ...

    def stop_namespace(self, local_ns: str) -> None:
        """Stop reflecting `local_ns` (its TwinNamespace went)."""
        ...

    def namespace_annotations(self, local_ns: str) -> Mapping[str, str]:
        """The annotations of `local_ns` as last seen (empty when unknown)."""
        ...

    def set_ingress_annotations(self, local_ns: str, allowed: Sequence[str] | None) -> None:
        """The Ingress annotations the provider allows in `local_ns`'s twin (None: not published)."""
        ...

    def held_object(self, side: str, kind: str, local_ns: str, name: str) -> Mapping[str, Any] | None:
        """The object of `kind` named `name` as the watch of `side` ("local": in `local_ns`, "remote":
        this consumer's copy in its twin namespace) last delivered it; None when none is held (absent,
        or not known: the caller reads it)."""
        ...


def _published_ingress_annotations(twin_namespace: Mapping[str, Any]) -> list[str] | None:
    """The Ingress annotations a TwinNamespace's status says the provider allows (None: it says nothing,
    or nothing readable)."""
    published = (twin_namespace.get("status") or {}).get(INGRESS_ANNOTATIONS_FIELD)
    if not isinstance(published, list) or not all(isinstance(p, str) for p in published):
        return None
    return [str(p) for p in published]


def _unix(timestamp: str | None) -> float | None:
    if not timestamp:
        return None
    try:
        return parse_rfc3339(timestamp).timestamp()
    except ValueError:
        return None


def _key(obj: Mapping[str, Any]) -> tuple[str, str]:
    meta = obj["metadata"]
    return str(meta["namespace"]), str(meta["name"])


class RemoteProvider:
    """The twins of one consumer at one provider (see the module docstring)."""

    def __init__(
        self,
        local_api: Any,
        remote_api: Any,
        settings: RemoteSettings,
        translator: IPTranslator | None = None,
        tokens: PodTokens | None = None,
        *,
        placement: Placer | None = None,
        reflection: NamespaceReflection | None = None,
        pod_addresses: PodAddresses | None = None,
        events: EventRelay | None = None,
        dra: ClaimOffloader | None = None,
        capacity: SnapshotOf | None = None,
    ) -> None:
        self.local = local_api
        #: The twins of offloaded pods' ResourceClaims (None: the consumer serves no DRA API).
        self.dra = dra
        self.remote = remote_api
        self.settings = settings
        self.translator = translator or Identity()
        #: Consumer-issued service-account tokens for twins (None: twins run without an identity).
        self.tokens = tokens
        self.ready = asyncio.Event()
        self.tenant_ns = tenant_namespace(ClusterID(settings.consumer))
        #: local namespace -> twin namespace (Ready TwinNamespaces only), and back.
        self.twin_ns: dict[str, str] = {}
        self.local_ns: dict[str, str] = {}
        #: (local namespace, name) -> the twin pod as last seen (or as created).
        self._twins = TwinStore()
        #: Twins deleted here with grace 0: an event about one of them that was under way is not taken
        #: as the twin being back, so it is not deleted twice.
        self._gone = RecentlyDeleted()
        self._watches: dict[str, asyncio.Task[None]] = {}
        self._synced: dict[str, asyncio.Event] = {}
        #: Told when a twin namespace becomes Ready or goes (None: nothing is reflected).
        self.reflection = reflection
        self.references = ReferenceCopier(
            local_api,
            remote_api,
            settings.consumer,
            settings.provider,
            reflection.namespace_annotations if reflection is not None else lambda _ns: {},
            reflection.held_object if reflection is not None else None,
        )
        self._subscribers: list[Notify] = []
        #: local namespace -> pods refused because it had no Ready twin namespace yet.
        self._waiting: dict[str, set[str]] = {}
        #: local namespace -> the provider's offload policy there (None: not published, e.g. an
        #: older provider; its API server still decides).
        self.pod_security: dict[str, OffloadPodSecurity | None] = {}
        #: local namespace -> pods refused by an admission policy (tried again when it changes).
        self._policy_refused: dict[str, set[str]] = {}
        self._tg: asyncio.TaskGroup | None = None
        #: Pool node -> its GPU product (twins of that node are pinned to it).
        self.pool_products: dict[str, str | None] = {}
        #: The twins of a group are created gated and released together (`capacity`: the provider's
        #: live capacity snapshot, None without one).
        self.groups = GroupStart(remote_api, self._twins, self.pool_products, capacity)
        #: Asked before a GPU pod's twin is created (None: nobody to ask).
        self.placement = (
            PlacementGate(placement, settings.provider, settings.unplaceable_grace_s) if placement is not None else None
        )
        #: Every Event this provider's view causes on consumer objects (bounded, rate-limited).
        self.events = (
            events if events is not None else EventRelay(local_api, settings.provider, COMPONENT, settings.event_limits)
        )
        #: The provider's Events about twins, mirrored onto the local pods through `events`.
        self.remote_events = RemoteEvents(
            remote_api,
            settings.provider,
            self.events,
            lambda twin_ns: self.local_ns.get(twin_ns),
            lambda local_ns, name: self._twins.get((local_ns, name)),
        )
        #: The twins' reported addresses, translated and checked for the local pods' status.
        self.addresses = TwinAddresses(settings.provider, settings.host_ip, self.translator, pod_addresses, self.events)
        #: The consumer's own record of what is offloaded here; TwinNamespaces are only claims.
        self.offloaded = OffloadedNamespaces(local_api, settings.provider)
        self.claims = TwinNamespaceClaims(
            self.offloaded,
            settings.provider,
            settings.claim_grace_s,
            self.events,
            self._emit_on_foreign_cluster,
            self._follow,
            self._forget_namespace,
            lambda: self._tg,
        )
        self.offloaded.listeners.append(self.claims.on_offloading)
        #: This provider's ResourceSlices, and the grant and health its pool nodes advertise.
        self.grants = ProviderGrant(
            remote_api,
            settings.provider,
            settings.node_label_allow,
            settings.health_ttl_s,
            self._emit_on_foreign_cluster,
        )
        #: Set once this provider's ResourceSlices have been listed (`grant()` is meaningful).
        self.slices_synced = self.grants.synced
        #: Called when this provider's ResourceSlices change.
        self.slice_listeners = self.grants.listeners
        self._log = structlog.get_logger().bind(remote_cluster=settings.provider)

    # ---- provider view

    def subscribe(self, notify: Notify) -> None:
        """Register `notify` for the LOCAL key of every twin that appears, changes or goes."""
        self._subscribers.append(notify)

    def _notify(self, namespace: str, name: str) -> None:
        for notify in self._subscribers:
            notify(namespace, name)

    async def run(self) -> None:
        """Watch TwinNamespaces, ResourceSlices and per Ready twin namespace its twins and Events,
        until cancelled; `ready` once every twin namespace's twins have been listed."""
        twins_synced = asyncio.Event()
        try:
            async with asyncio.TaskGroup() as tg:
                tg.create_task(
                    watch(
                        self.remote,
                        rest.path(API_VERSION, "twinnamespaces", namespace=self.tenant_ns),
                        self.claims.on_twin_namespace,
                        what="twinnamespaces",
                        on_synced=twins_synced.set,
                    )
                )
                tg.create_task(
                    watch(
                        self.local,
                        rest.path(API_VERSION, "resourceslices", namespace=SYSTEM_NAMESPACE),
                        self.grants.on_slice,
                        what="resourceslices",
                        on_synced=self.slices_synced.set,
                    )
                )
                tg.create_task(self.offloaded.run())
                tg.create_task(self.events.run())
                self._tg = tg
                if self.tokens is not None:
                    tg.create_task(self.tokens.run(lambda: dict(self.local_ns), self.is_mine))
                await twins_synced.wait()
                await self.offloaded.synced.wait()
                # Each claim the consumer confirmed has started its watches by now.
                await asyncio.gather(*(e.wait() for e in self._synced.values()))
                self.ready.set()
                self._log.info("provider view synced", twin_namespaces=len(self.twin_ns), twins=len(self._twins))
        finally:
            for t in self._watches.values():
                t.cancel()

    def _emit_on_foreign_cluster(self, type_: str, reason: str, message: str) -> None:
        name = {"kind": "ForeignCluster", "metadata": {"name": self.settings.provider}}

        async def resolve() -> Mapping[str, Any] | None:
            fc: Mapping[str, Any] | None = await rest.get(
                self.local, rest.path(API_VERSION, "foreignclusters", self.settings.provider)
            )
            return fc

        self.events.offer(name, type_=type_, reason=reason, message=message, resolve=resolve)

    def _follow(self, local: str, twin: str, claim: Mapping[str, Any]) -> bool:
        """Follow the Ready claim of `local` (twin `twin`) the consumer confirmed; True when it is a
        twin namespace not followed before."""
        st = claim.get("status") or {}
        moved = bool(twin) and self.twin_ns.get(local) != twin
        if moved:
            self._forget_namespace(local)  # another twin than before: start over
        self._set_pod_security(local, st.get("podSecurity"))
        if self.reflection is not None:
            self.reflection.set_ingress_annotations(local, _published_ingress_annotations(claim))
        if not moved:
            return False
        self.twin_ns[local] = twin
        self.local_ns[twin] = local
        if self._tg is not None:
            self._start_watches(twin)
        if self.reflection is not None:
            self.reflection.start_namespace(local, twin)
        # Pods refused because this namespace had no twin yet go again now, not after their backoff.
        for name in sorted(self._waiting.pop(local, set())):
            self._notify(local, name)
        return True

    def _forget_namespace(self, local: str) -> None:
        self.pod_security.pop(local, None)
        old = self.twin_ns.pop(local, None)
        if old:
            self.local_ns.pop(old, None)
            self._stop_watches(old)
            if self.reflection is not None:
                self.reflection.stop_namespace(local)

    def _set_pod_security(self, local: str, published: Any) -> None:
        try:
            policy = None if published is None else OffloadPodSecurity.model_validate(published)
        except ValueError:
            policy = None  # unreadable (a newer provider's shape?): the provider's API server decides
        if local in self.pod_security and self.pod_security[local] == policy:
            return
        self.pod_security[local] = policy
        # Pods refused under the old policy go again now (they are not retried otherwise).
        for name in sorted(self._policy_refused.pop(local, set())):
            self._notify(local, name)

    def _start_watches(self, twin_ns: str) -> None:
        if twin_ns in self._watches or self._tg is None:
            return
        synced = self._synced.setdefault(twin_ns, asyncio.Event())
        selector = {"labelSelector": f"{ORIGIN_CLUSTER_LABEL}={self.settings.consumer}"}

        async def both() -> None:
            while True:
                try:
                    await watch_twins()
                except KubeError as e:  # e.g. 403 while the provider is still binding the namespace
                    self._log.warning("cannot watch twin namespace; retrying", namespace=twin_ns, error=str(e))
                    await asyncio.sleep(2.0)

        async def watch_twins() -> None:
            async with asyncio.TaskGroup() as tg:
                tg.create_task(
                    watch(
                        self.remote,
                        rest.path("v1", "pods", namespace=twin_ns),
                        self._on_twin,
                        what=f"twins in {twin_ns}",
                        params=selector,
                        on_synced=synced.set,
                    )
                )
                tg.create_task(self.remote_events.watch(twin_ns))

        self._watches[twin_ns] = self._tg.create_task(both())
        self._log.info("watching twin namespace", namespace=twin_ns)

    def _stop_watches(self, twin_ns: str) -> None:
        task = self._watches.pop(twin_ns, None)
        self._synced.pop(twin_ns, None)
        if task is not None:
            task.cancel()
        for key, pod in self._twins.items():
            if pod["metadata"]["namespace"] == twin_ns:
                self._twins.pop(key)
                self._notify(*key)

    def _on_twin(self, kind: str, obj: dict[str, Any]) -> None:
        local_ns = self.local_ns.get(obj["metadata"]["namespace"])
        if local_ns is None or not is_dns_subdomain(str(obj["metadata"].get("name") or "")):
            return
        key = (local_ns, obj["metadata"]["name"])
        uid = str(obj["metadata"].get("uid") or "")
        if kind == "DELETED":
            self._gone.discard(uid)
            self._twins.pop(key, uid=uid)
            if self.dra is not None:
                self.dra.forget(uid)
        elif uid in self._gone:
            return  # deleted here already; its DELETED event follows
        else:
            self._twins.put(key, obj)
            if self.dra is not None and (obj.get("spec") or {}).get("resourceClaims") and self._tg is not None:
                self._tg.create_task(self._report_allocation(local_ns, obj))
        self._notify(*key)

    async def _report_allocation(self, local_ns: str, twin: Mapping[str, Any]) -> None:
        assert self.dra is not None
        try:
            await self.dra.report(local_ns, twin)
        except KubeError as e:
            self._log.warning("provider allocation not shown", pod=twin["metadata"]["name"], error=str(e))

    def _twin_of(self, key: tuple[str, str], pod: Mapping[str, Any]) -> Twin:
        meta = pod["metadata"]
        return Twin(
            namespace=key[0],
            name=key[1],
            origin_uid=str((meta.get("labels") or {}).get(ORIGIN_UID_LABEL) or ""),
            terminal=forge.is_terminal(pod),
            deleting=bool(meta.get("deletionTimestamp")),
            unplaced_since=(_unix(meta.get("creationTimestamp")) or time.time()) if forge.unplaced(pod) else None,
            raw=pod,
        )

    def twins(self) -> list[Twin]:
        return [self._twin_of(k, p) for k, p in self._twins.items()]

    def twin(self, namespace: str, name: str) -> Twin | None:
        pod = self._twins.get((namespace, name))
        return None if pod is None else self._twin_of((namespace, name), pod)

    def twin_ref(self, pod: Mapping[str, Any]) -> tuple[str, str]:
        """(namespace, name) of the twin of this local pod at the provider, or ProviderError NotFound."""
        meta = pod["metadata"]
        twin = self._twins.get((meta["namespace"], meta["name"]))
        if twin is None or (twin["metadata"].get("labels") or {}).get(ORIGIN_UID_LABEL) != meta.get("uid"):
            raise ProviderError(
                f"pod {meta['namespace']}/{meta['name']} has no twin on provider {self.settings.provider} (yet)",
                reason=NOT_FOUND,
                retry=False,
            )
        return str(twin["metadata"]["namespace"]), str(twin["metadata"]["name"])

    # ---- pods

    def _target(self, namespace: str, name: str, node: str) -> Target:
        twin_ns = self.twin_ns.get(namespace)
        if twin_ns is None:
            self._waiting.setdefault(namespace, set()).add(name)
            raise ProviderError(
                f"namespace {namespace} is not offloaded to provider {self.settings.provider} "
                f"(run `gpufed offload-namespace {namespace}`, or wait for its twin namespace)",
                reason="NamespaceNotOffloaded",
            )
        return Target(self.settings.consumer, node, twin_ns, self.settings.provider, self.pool_products.get(node))

    def is_mine(self, pod: Mapping[str, Any]) -> bool:
        """Whether the local `pod` is bound to one of this provider's virtual nodes."""
        node = str((pod.get("spec") or {}).get("nodeName") or "")
        return bool(node) and (node == self.settings.node or node in self.pool_products)

    async def create_pod(self, pod: Mapping[str, Any]) -> None:
        namespace, name = _key(pod)
        invalid = forge.invalid_names(pod)
        if invalid:
            raise ProviderError(
                f"pod {namespace}/{name} names objects by invalid names ({', '.join(invalid)}): Kubernetes "
                "names are RFC 1123 subdomains; nothing was read or copied for it",
                reason=INVALID_NAME,
                retry=False,
            )
        node = str((pod.get("spec") or {}).get("nodeName") or self.settings.node)
        target = self._target(namespace, name, node)
        self._check_pod_security(pod)
        if self.placement is not None and (namespace, name) not in self._twins:
            # The estimator's answer is authoritative only when given: an unreachable one lets the pod through.
            await self.placement.check(pod, target.gpu_product)
        for ref in forge.references(pod):
            if not await self.references.copy(namespace, ref, target):
                # As a kubelet says it: the pod starts without what its optional reference names.
                self.events.offer(
                    pod,
                    type_="Warning",
                    reason=f"Optional{ref.kind}NotFound",
                    message=f'{ref.kind.lower()} "{ref.name}" not found',
                )
        claims = await self.dra.plan(pod, target) if self.dra is not None else []
        # The tokens are asked for before the twin exists (a pod the consumer refuses one gets no
        # twin); their Secret is written after it, owned by it.
        identity = self.tokens.identity(pod) if self.tokens is not None else None
        prepared = await self.tokens.prepare(pod, target) if self.tokens is not None else None
        body = forge.remote_pod(pod, target, identity)
        if self.groups.gate_new(pod):
            groups.add_gate(body["spec"])
        if claims:
            body["spec"]["resourceClaims"] = twin_pod_claims(pod, {e: c["metadata"]["name"] for e, c in claims})
        url = rest.path("v1", "pods", namespace=target.namespace)
        try:
            created = await retry_contended(
                lambda: rest.create(self.remote, url, body, what=f"create twin {target.namespace}/{name}")
            )
        except KubeError as e:
            if e.conflict and not contended(e):  # AlreadyExists
                await self._adopt(pod, target)
                adopted = self._twins.get((namespace, name))
                if adopted is not None and identity is not None and self.tokens is not None:
                    await self.tokens.ensure(pod, target, owner=adopted)
                if claims and adopted is not None and self.dra is not None:
                    await self.dra.ensure(adopted, claims)
                return
            refused = refusal(e, f"the provider {self.settings.provider} refused the pod")
            if refused.reason in (podpolicy.REASON, ADMISSION_REFUSED):
                self._policy_refused.setdefault(namespace, set()).add(name)
            raise refused from e
        # Seen at once: the next reconcile must not create it again before the watch reports it (and
        # writes the token Secret through `update_pod` when writing it here fails).
        self._twins.setdefault((namespace, name), created)
        if identity is not None and self.tokens is not None:
            await self.tokens.ensure(pod, target, owner=created, prepared=prepared)
        if claims and self.dra is not None:
            await self.dra.ensure(created, claims)

    def capacity_changed(self) -> None:
        """A capacity snapshot arrived: the gated twins of groups are looked at again."""
        for key in self.groups.waiting():
            self._notify(*key)

    def _check_pod_security(self, pod: Mapping[str, Any]) -> None:
        """Refuse early, with the provider's reason, a pod its published offload policy refuses."""
        namespace, name = _key(pod)
        policy = self.pod_security.get(namespace)
        if policy is None:
            return
        found = podpolicy.violations(pod, policy)
        if found:
            self._policy_refused.setdefault(namespace, set()).add(name)
            raise ProviderError(podpolicy.refusal(self.settings.provider, found), reason=podpolicy.REASON, retry=False)

    async def _adopt(self, pod: Mapping[str, Any], target: Target) -> None:
        namespace, name = _key(pod)
        existing = await self.references.get_remote(rest.path("v1", "pods", name, namespace=target.namespace))
        if existing is None:
            raise ProviderError("the twin was being replaced; retrying", reason="TwinConflict")
        if not owned_by(existing, self.settings.consumer):
            raise ProviderError(
                f"pod {target.namespace}/{name} on {self.settings.provider} was not created by gpufed; "
                "it is left alone and this pod cannot be offloaded under that name",
                reason="NameCollision",
                retry=True,
            )
        if owned_by(existing, self.settings.consumer, pod["metadata"]["uid"]):
            self._twins.setdefault((namespace, name), existing)
            return
        raise ProviderError("an earlier twin with this name is still being removed; retrying", reason="TwinConflict")

    async def update_pod(self, pod: Mapping[str, Any], twin: Twin) -> None:
        """Images and activeDeadlineSeconds are the mutable fields of a running pod that matter; a
        token Secret the twin mounts is written again when it is missing; a gated twin of a group is
        started with the rest of its group once it may."""
        namespace, name = _key(pod)
        await self.groups.start(pod, twin.raw)
        if self.tokens is not None and self.twin_ns.get(namespace) == (twin.raw.get("metadata") or {}).get("namespace"):
            target = self._target(namespace, name, str((pod.get("spec") or {}).get("nodeName") or self.settings.node))
            if self.tokens.missing(pod, target):
                await self.tokens.ensure(pod, target, owner=twin.raw)
        local_spec = pod.get("spec") or {}
        remote_spec = twin.raw.get("spec") or {}
        patch: dict[str, Any] = {}
        for kind in ("containers", "initContainers"):
            want = {c["name"]: c.get("image") for c in local_spec.get(kind) or []}
            have = {c["name"]: c.get("image") for c in remote_spec.get(kind) or []}
            changed = [{"name": n, "image": img} for n, img in want.items() if n in have and have[n] != img]
            if changed:
                patch.setdefault("spec", {})[kind] = changed
        if local_spec.get("activeDeadlineSeconds") != remote_spec.get("activeDeadlineSeconds"):
            patch.setdefault("spec", {})["activeDeadlineSeconds"] = local_spec.get("activeDeadlineSeconds")
        if not patch:
            return
        meta = twin.raw["metadata"]
        try:
            await rest.strategic_patch(
                self.remote, rest.path("v1", "pods", meta["name"], namespace=meta["namespace"]), patch
            )
        except KubeError as e:
            raise refusal(e, "cannot update the twin") from e

    async def delete_pod(self, namespace: str, name: str, uid: str, grace_period_s: int) -> None:
        pod = self._twins.get((namespace, name))
        if pod is None:
            return
        labels = pod["metadata"].get("labels") or {}
        if labels.get(ORIGIN_UID_LABEL) != uid:
            return
        meta = pod["metadata"]
        try:
            await rest.delete(
                self.remote,
                rest.path("v1", "pods", meta["name"], namespace=meta["namespace"]),
                uid=meta["uid"],
                grace_period_s=grace_period_s,
                what=f"delete twin {meta['namespace']}/{meta['name']}",
            )
        except KubeError as e:
            if e.conflict:  # the UID precondition: that twin is already gone
                return
            raise refusal(e, "cannot delete the twin") from e
        if self.tokens is not None:
            await self.tokens.forget(namespace, name, meta["namespace"], uid=uid)
        if grace_period_s == 0 and self._twins.pop((namespace, name), uid=meta["uid"]) is not None:
            self._gone.add(meta["uid"])

    def pod_status(self, pod: Mapping[str, Any], twin: Twin) -> dict[str, Any]:
        return self.addresses.local_status(pod, twin.raw)

    # ---- grant and health (what pool nodes advertise)

    def grant(self) -> Grant:
        return self.grants.grant()

    async def health(self) -> Health:
        """Whether the provider's API answers (reused for `health_ttl_s`: every pool node asks)."""
        return await self.grants.health()
