"""`RemoteProvider`: the PodProvider of the virtual nodes backed by one peered cluster.

Owns, for one (consumer, provider) — shared by every pool node of that provider (`remote.pools`):
- the provider-side view: TwinNamespaces of this consumer (from its tenant namespace: which local
  namespace maps to which twin namespace), and per ready twin namespace a watch on this consumer's
  twins (label `gpufed.io/origin-cluster-id=<consumer>`; each twin names its pool node in
  `gpufed.io/origin-node`) and on the namespace's Events;
- creating twins (forge.pods.remote_pod) after the ConfigMaps and Secrets they reference exist in
  the twin namespace (`remote.references`) and, with `tokens`, after their consumer-issued
  service-account token Secret exists (remote.tokens), deleting them with UID preconditions,
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
- the provider's TwinNamespaces are CLAIMS: a namespace counts as offloaded here only while the
  consumer's own NamespaceOffloading says it is offloaded to this provider (`remote.offloaded`) and
  the twin's name is a valid namespace name. A claim the consumer did not make starts nothing (no
  reflection, no twin, no token) and, when it persists for `claim_grace_s`, is reported once as a
  Warning Event `TwinNamespaceRefused` on that namespace's NamespaceOffloading (or, without one,
  on the provider's ForeignCluster);
- telling `reflection` (the `NamespaceReflection` it is built with) when a twin namespace becomes
  Ready (and offloaded here) or goes, and which Ingress annotations the provider publishes as allowed
  there (`INGRESS_ANNOTATIONS_FIELD` of the TwinNamespace status; None while it publishes none), and
  asking it for a namespace's annotations (its allow-list mode);
- refusing a pod that addresses objects by names Kubernetes never gives (`forge.pods.invalid_names`,
  e.g. `imagePullSecrets: ../../gpufed/secrets/x`): `ProviderError(reason=InvalidName)`, before
  anything is read for it;
- the twin's reported addresses: each goes through the IP translator and, with `pod_addresses`,
  must lie in the provider's pod range as seen here; a refused one is left out (no podIP rather
  than another's address) and reported once per pod and address as a Warning Event `PodIPRefused`;
- remote Events about a twin, mirrored onto the local pod (new ones only, not the history a relist
  replays; `Scheduled` is skipped: the consumer's scheduler already reported the placement; a reason
  that is no CamelCase word reads `Remote`, a type other than Warning `Normal`). Those and every Event
  this provider's view causes go through one bounded `EventRelay` (`events`: a bounded queue, per-pod
  and total rate limits, similar Events of one pod combined; what is dropped is counted in
  `gpufed_relayed_events_dropped_total`), never a task per provider Event;
- the grant (this provider's accepted ResourceSlices, consumer side, namespace gpufed), its node
  labels allow-listed (`forge.pools.filter_node_labels`; what is dropped is reported once per change
  as a Warning Event `NodeLabelsDropped` on the ForeignCluster), and the provider's health (its API
  answers), which pool nodes advertise.

Construction takes the collaborators: the two API clients, the IP translator, the token issuer,
the estimator's `placement` (None: static capacity, nobody to ask), the `reflection` (None: no
object reflection) and `pod_addresses` (None: addresses are only translated). Subscribers to twin
changes register with `subscribe`, before `run`.

Does not: decide when to create or delete (vkprovider.node does), or pick up renewed credentials:
the provider client is built once per process.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any, Protocol

import structlog

from gpufed.apis.meta import API_VERSION
from gpufed.apis.offloading import OffloadPodSecurity
from gpufed.apis.quantity import parse
from gpufed.apis.wire import (
    ORIGIN_CLUSTER_LABEL,
    ORIGIN_NODE_LABEL,
    ORIGIN_UID_LABEL,
    SYSTEM_NAMESPACE,
    ClusterID,
    tenant_namespace,
)
from gpufed.kube import rest
from gpufed.kube.client import KubeError
from gpufed.kube.times import parse_rfc3339
from gpufed.kube.watch import watch
from vkprovider.forge import podpolicy
from vkprovider.forge import pods as forge
from vkprovider.forge.meta import Target, is_dns_label, is_dns_subdomain, owned_by
from vkprovider.forge.pools import filter_node_labels
from vkprovider.node.provider import NOT_FOUND, Notify, ProviderError, Twin
from vkprovider.remote.events_relay import EventRelay, RelayLimits
from vkprovider.remote.offloaded import OffloadedNamespaces
from vkprovider.remote.placement import PlacementGate, Placer
from vkprovider.remote.references import ReferenceCopier
from vkprovider.remote.refusals import ADMISSION_REFUSED, refusal
from vkprovider.remote.tokens import PodTokens
from vkprovider.remote.translate import Identity, IPTranslator, PodAddresses

COMPONENT = "gpufed-virtual-kubelet"
#: Events of remote twins not mirrored (the consumer's own components already report these).
SKIPPED_EVENT_REASONS = frozenset({"Scheduled"})
#: Reasons of the Warning Events that report what a provider claimed or reported and was refused.
CLAIM_REFUSED = "TwinNamespaceRefused"
POD_IP_REFUSED = "PodIPRefused"
LABELS_DROPPED = "NodeLabelsDropped"
INVALID_NAME = "InvalidName"
#: Seconds a provider's claim on a namespace may stay unconfirmed by the consumer before it is
#: reported (the offloading controller writes its status just after it asked for the twin).
DEFAULT_CLAIM_GRACE_S = 10.0
#: Claims waiting for their grace at once, and claims remembered as reported (beyond: forgotten; a
#: repeated report of an old claim is harmless, a provider writing claims by the million is not).
MAX_PENDING_CLAIMS = 1_000
MAX_REPORTED = 10_000
#: The TwinNamespace status field where a provider publishes the Ingress annotations its policy
#: allows (the tenant's `spec.policy.ingressAnnotations`); without it only the class annotation is sent.
INGRESS_ANNOTATIONS_FIELD = "ingressAnnotations"
#: What a relayed Event's reason must look like (a CamelCase word, as Kubernetes components write them).
_REASON = re.compile(r"[A-Za-z][A-Za-z0-9]{0,127}")


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


@dataclass(frozen=True)
class Grant:
    """What the provider granted this consumer (all accepted ResourceSlices together)."""

    resources: Mapping[str, Decimal] = field(default_factory=dict)
    #: The GPU product every accepted slice is limited to (None: any, or they differ).
    gpu_product: str | None = None
    #: The labels the provider reported for the grant's nodes that a virtual node may carry.
    labels: Mapping[str, str] = field(default_factory=dict)
    accepted: bool = False


@dataclass(frozen=True)
class Health:
    ready: bool
    reason: str
    message: str


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


def origin_node(twin: Mapping[str, Any], default: str) -> str:
    """The pool node a twin belongs to (twins from before pools carry none: the default node)."""
    return str((twin.get("metadata", {}).get("labels") or {}).get(ORIGIN_NODE_LABEL) or default)


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
    ) -> None:
        self.local = local_api
        self.remote = remote_api
        self.settings = settings
        self.translator = translator or Identity()
        #: Consumer-issued service-account tokens for twins (None: twins run without an identity).
        self.tokens = tokens
        self.ready = asyncio.Event()
        #: Set once this provider's ResourceSlices have been listed (`grant()` is meaningful).
        self.slices_synced = asyncio.Event()
        self.tenant_ns = tenant_namespace(ClusterID(settings.consumer))
        #: local namespace -> twin namespace (Ready TwinNamespaces only), and back.
        self.twin_ns: dict[str, str] = {}
        self.local_ns: dict[str, str] = {}
        #: (local namespace, name) -> the twin pod as last seen (or as created).
        self._twins: dict[tuple[str, str], dict[str, Any]] = {}
        self._slices: dict[str, dict[str, Any]] = {}
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
        #: Asked before a GPU pod's twin is created (None: nobody to ask).
        self.placement = (
            PlacementGate(placement, settings.provider, settings.unplaceable_grace_s) if placement is not None else None
        )
        #: Called when this provider's ResourceSlices change.
        self.slice_listeners: list[Callable[[], None]] = []
        #: Whether a twin's reported address may become the local pod's (None: any translated one).
        self.pod_addresses = pod_addresses
        #: The consumer's own record of what is offloaded here; TwinNamespaces are only claims.
        self.offloaded = OffloadedNamespaces(local_api, settings.provider)
        self.offloaded.listeners.append(self._on_offloading)
        #: local namespace -> the provider's TwinNamespace for it, as last seen (a claim).
        self._claims: dict[str, dict[str, Any]] = {}
        #: Claims already reported (local namespace, twin, why), and those waiting for their grace.
        self._claims_reported: set[tuple[str, str, str]] = set()
        self._claims_pending: set[tuple[str, str, str]] = set()
        #: (local pod UID, address) refused as its podIP and already reported.
        self._ips_reported: set[tuple[str, str]] = set()
        #: The provider's node labels dropped by the allow-list, as last reported.
        self._labels_dropped: dict[str, str] = {}
        self._health: tuple[float, Health] | None = None
        #: Every Event this provider's view causes on consumer objects (bounded, rate-limited).
        self.events = EventRelay(local_api, settings.provider, COMPONENT, settings.event_limits)
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
                        self._on_twin_namespace,
                        what="twinnamespaces",
                        on_synced=twins_synced.set,
                    )
                )
                tg.create_task(
                    watch(
                        self.local,
                        rest.path(API_VERSION, "resourceslices", namespace=SYSTEM_NAMESPACE),
                        self._on_slice,
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

    def _on_slice(self, kind: str, obj: dict[str, Any]) -> None:
        name = obj["metadata"]["name"]
        if kind == "DELETED" or (obj.get("spec") or {}).get("providerClusterId") != self.settings.provider:
            self._slices.pop(name, None)
        else:
            self._slices[name] = obj
        self._report_dropped_labels()
        for listener in self.slice_listeners:
            listener()

    def _supplied_labels(self) -> dict[str, str]:
        """The node labels the provider reported on its accepted slices, unfiltered."""
        labels: dict[str, str] = {}
        for sl in self._slices.values():
            st = sl.get("status") or {}
            res: dict[str, Any] = next((c for c in st.get("conditions") or [] if c.get("type") == "Resources"), {})
            if res.get("status") == "True" and isinstance(st.get("nodeLabels"), Mapping):
                labels.update({str(k): str(v) for k, v in st["nodeLabels"].items()})
        return labels

    def _report_dropped_labels(self) -> None:
        dropped = filter_node_labels(self._supplied_labels(), self.settings.node_label_allow).dropped
        if dropped == self._labels_dropped:
            return
        self._labels_dropped = dropped
        if not dropped:
            return
        listed = ", ".join(f"{k}={v}" for k, v in sorted(dropped.items()))
        message = (
            f"provider {self.settings.provider} reported node labels its virtual nodes do not carry "
            f"(only GPU labels and the allow-list pass): {listed}"
        )[:1000]
        self._log.warning("provider node labels dropped", labels=sorted(dropped))
        self._emit_on_foreign_cluster("Warning", LABELS_DROPPED, message)

    def _emit_on_foreign_cluster(self, type_: str, reason: str, message: str) -> None:
        name = {"kind": "ForeignCluster", "metadata": {"name": self.settings.provider}}

        async def resolve() -> Mapping[str, Any] | None:
            fc: Mapping[str, Any] | None = await rest.get(
                self.local, rest.path(API_VERSION, "foreignclusters", self.settings.provider)
            )
            return fc

        self.events.offer(name, type_=type_, reason=reason, message=message, resolve=resolve)

    def _on_twin_namespace(self, kind: str, obj: dict[str, Any]) -> None:
        local = str((obj.get("spec") or {}).get("namespace") or "")
        if kind == "DELETED":
            self._claims.pop(local, None)
        else:
            self._claims[local] = obj
        self._evaluate(local)

    def _on_offloading(self, namespace: str) -> None:
        """The consumer's decision about `namespace` changed ("": first listed: all of them)."""
        for local in [namespace] if namespace else list(self._claims):
            self._evaluate(local)

    def _claim_refusal(self, local: str, twin: str) -> str:
        """Why the provider's claim of `local` (twin `twin`) is not followed; "" when it is."""
        if not self.offloaded.allows(local):
            return f"namespace {local} is not offloaded to {self.settings.provider}"
        if twin and not is_dns_label(twin):
            return f"{twin!r} is no valid namespace name"
        return ""

    def _evaluate(self, local: str) -> None:
        """Follow the provider's TwinNamespace for `local` where the consumer confirms it."""
        if not self.offloaded.synced.is_set():
            return  # claims wait until the consumer's own record has been listed
        obj = self._claims.get(local)
        st = (obj or {}).get("status") or {}
        twin = str(st.get("twin") or "")
        ready = obj is not None and not obj["metadata"].get("deletionTimestamp") and st.get("phase") == "Ready"
        if not ready:
            self._forget_namespace(local)
            return
        why = self._claim_refusal(local, twin)
        if why:
            self._forget_namespace(local)
            self._refuse_claim(local, twin, why)
            return
        moved = bool(twin) and self.twin_ns.get(local) != twin
        if moved:
            self._forget_namespace(local)  # another twin than before: start over
        self._set_pod_security(local, st.get("podSecurity"))
        if self.reflection is not None:
            self.reflection.set_ingress_annotations(local, _published_ingress_annotations(obj or {}))
        if not moved:
            return
        self._claims_reported = {c for c in self._claims_reported if c[0] != local}
        self.twin_ns[local] = twin
        self.local_ns[twin] = local
        if self._tg is not None:
            self._start_watches(twin)
        if self.reflection is not None:
            self.reflection.start_namespace(local, twin)
        # Pods refused because this namespace had no twin yet go again now, not after their backoff.
        for name in sorted(self._waiting.pop(local, set())):
            self._notify(local, name)

    def _forget_namespace(self, local: str) -> None:
        self.pod_security.pop(local, None)
        old = self.twin_ns.pop(local, None)
        if old:
            self.local_ns.pop(old, None)
            self._stop_watches(old)
            if self.reflection is not None:
                self.reflection.stop_namespace(local)

    def _refuse_claim(self, local: str, twin: str, why: str) -> None:
        """Report once, after the grace, a claim that is still refused then."""
        key = (local, twin, why)
        if key in self._claims_reported or key in self._claims_pending or self._tg is None:
            return
        if len(self._claims_pending) >= MAX_PENDING_CLAIMS:
            return  # still refused; only its report is skipped
        self._claims_pending.add(key)

        async def later() -> None:
            try:
                await asyncio.sleep(self.settings.claim_grace_s)
                obj = self._claims.get(local)
                st = (obj or {}).get("status") or {}
                if obj is None or str(st.get("twin") or "") != twin or self._claim_refusal(local, twin) != why:
                    return
                if len(self._claims_reported) >= MAX_REPORTED:
                    self._claims_reported.clear()
                self._claims_reported.add(key)
                message = (
                    f"provider {self.settings.provider} claims twin namespace {twin!r} for {local}, which this "
                    f"cluster did not give it ({why}): nothing of {local} is reflected, copied or run there"
                )
                self._log.warning("twin namespace claim refused", namespace=local, twin=twin, why=why)
                offloading = self.offloaded.offloading(local)
                if offloading is None:
                    self._emit_on_foreign_cluster("Warning", CLAIM_REFUSED, message)
                    return
                self.events.offer(offloading, type_="Warning", reason=CLAIM_REFUSED, message=message)
            finally:
                self._claims_pending.discard(key)

        self._tg.create_task(later())

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
                tg.create_task(
                    watch(
                        self.remote,
                        rest.path("v1", "events", namespace=twin_ns),
                        self._on_event,
                        what="events",
                        params={"fieldSelector": "involvedObject.kind=Pod"},
                    )
                )

        self._watches[twin_ns] = self._tg.create_task(both())
        self._log.info("watching twin namespace", namespace=twin_ns)

    def _stop_watches(self, twin_ns: str) -> None:
        task = self._watches.pop(twin_ns, None)
        self._synced.pop(twin_ns, None)
        if task is not None:
            task.cancel()
        for key, pod in list(self._twins.items()):
            if pod["metadata"]["namespace"] == twin_ns:
                del self._twins[key]
                self._notify(*key)

    def _on_twin(self, kind: str, obj: dict[str, Any]) -> None:
        local_ns = self.local_ns.get(obj["metadata"]["namespace"])
        if local_ns is None or not is_dns_subdomain(str(obj["metadata"].get("name") or "")):
            return
        key = (local_ns, obj["metadata"]["name"])
        if kind == "DELETED":
            current = self._twins.get(key)
            if current is not None and current["metadata"].get("uid") == obj["metadata"].get("uid"):
                del self._twins[key]
        else:
            self._twins[key] = obj
        self._notify(*key)

    def _on_event(self, kind: str, obj: dict[str, Any]) -> None:
        if kind != "ADDED" and kind != "MODIFIED":
            return  # SYNC replays history after every (re)list; only new events are mirrored
        inv = obj.get("involvedObject") or {}
        if inv.get("kind") != "Pod" or obj.get("reason") in SKIPPED_EVENT_REASONS:
            return
        local_ns = self.local_ns.get(str(inv.get("namespace") or ""))
        twin = self._twins.get((local_ns or "", str(inv.get("name") or "")))
        if local_ns is None or twin is None:
            return
        labels = twin["metadata"].get("labels") or {}
        local_pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"namespace": local_ns, "name": inv.get("name"), "uid": labels.get(ORIGIN_UID_LABEL)},
        }
        message = f"{obj.get('message') or ''} (on {self.settings.provider})"
        reason = str(obj.get("reason") or "")
        self.events.offer(
            local_pod,
            type_="Warning" if obj.get("type") == "Warning" else "Normal",
            reason=reason if _REASON.fullmatch(reason) else "Remote",
            message=message,
        )

    def _twin_of(self, key: tuple[str, str], pod: Mapping[str, Any]) -> Twin:
        meta = pod["metadata"]
        unplaced = (pod.get("status") or {}).get("phase", "Pending") == "Pending" and not (pod.get("spec") or {}).get(
            "nodeName"
        )
        return Twin(
            namespace=key[0],
            name=key[1],
            origin_uid=str((meta.get("labels") or {}).get(ORIGIN_UID_LABEL) or ""),
            terminal=forge.is_terminal(pod),
            deleting=bool(meta.get("deletionTimestamp")),
            unplaced_since=(_unix(meta.get("creationTimestamp")) or time.time()) if unplaced else None,
            raw=pod,
        )

    def twins(self) -> list[Twin]:
        return [self._twin_of(k, p) for k, p in list(self._twins.items())]

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
            await self.references.copy(namespace, ref, target)
        identity = await self.tokens.ensure(pod, target) if self.tokens is not None else None
        body = forge.remote_pod(pod, target, identity)
        url = rest.path("v1", "pods", namespace=target.namespace)
        try:
            created = await rest.create(self.remote, url, body, what=f"create twin {target.namespace}/{name}")
        except KubeError as e:
            if e.conflict:
                await self._adopt(pod, target)
                return
            refused = refusal(e, f"the provider {self.settings.provider} refused the pod")
            if refused.reason in (podpolicy.REASON, ADMISSION_REFUSED):
                self._policy_refused.setdefault(namespace, set()).add(name)
            raise refused from e
        # Seen at once: the next reconcile must not create it again before the watch reports it.
        self._twins.setdefault((namespace, name), created)

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
        """Images and activeDeadlineSeconds are the mutable fields of a running pod that matter."""
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
        if grace_period_s == 0:
            with contextlib.suppress(KeyError):
                if self._twins[(namespace, name)]["metadata"].get("uid") == meta["uid"]:
                    del self._twins[(namespace, name)]

    def pod_status(self, pod: Mapping[str, Any], twin: Twin) -> dict[str, Any]:
        def to_local_ip(remote_ip: str) -> str | None:
            why = self.pod_addresses.refuse_pod_ip(remote_ip) if self.pod_addresses is not None else None
            if why is None:
                return self.translator.to_local_ip(remote_ip)
            self._report_pod_ip(pod, remote_ip, why)
            return None

        return forge.local_status(twin.raw, pod, host_ip=self.settings.host_ip, to_local_ip=to_local_ip)

    def _report_pod_ip(self, pod: Mapping[str, Any], remote_ip: str, why: str) -> None:
        uid = str(pod["metadata"].get("uid") or "")
        if (uid, remote_ip) in self._ips_reported:
            return
        if len(self._ips_reported) >= MAX_REPORTED:  # bounded: a repeat of an old report is harmless
            self._ips_reported.clear()
        self._ips_reported.add((uid, remote_ip))
        message = (
            f"provider {self.settings.provider} reported address {remote_ip} for this pod's twin: {why}; "
            "it is not this pod's IP"
        )
        self._log.warning("twin address refused", namespace=pod["metadata"].get("namespace"), address=remote_ip)
        self.events.offer(pod, type_="Warning", reason=POD_IP_REFUSED, message=message)

    # ---- grant and health (what pool nodes advertise)

    def grant(self) -> Grant:
        granted: dict[str, Decimal] = {}
        products: set[str | None] = set()
        accepted = False
        for sl in self._slices.values():
            st = sl.get("status") or {}
            res: dict[str, Any] = next((c for c in st.get("conditions") or [] if c.get("type") == "Resources"), {})
            if res.get("status") != "True":
                continue
            accepted = True
            products.add((sl.get("spec") or {}).get("gpuProduct") or None)
            for r, q in (st.get("granted") or {}).items():
                with contextlib.suppress(ValueError):
                    granted[r] = granted.get(r, Decimal(0)) + parse(q)
        product = next(iter(products)) if len(products) == 1 else None
        labels = filter_node_labels(self._supplied_labels(), self.settings.node_label_allow).kept
        return Grant(granted, product, labels, accepted)

    async def health(self) -> Health:
        """Whether the provider's API answers (reused for `health_ttl_s`: every pool node asks)."""
        now = time.monotonic()
        if self._health is not None and now - self._health[0] < self.settings.health_ttl_s:
            return self._health[1]
        try:
            await rest.request(self.remote, "GET", "/version", what="provider health")
            health = Health(True, "KubeletReady", f"provider {self.settings.provider} answers")
        except KubeError as e:
            health = Health(False, "ProviderUnreachable", f"the provider's API does not answer: {str(e)[:300]}")
        self._health = (time.monotonic(), health)
        return health
