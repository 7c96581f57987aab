"""The consumer's namespace offloading: NamespaceOffloading -> twin namespaces on the selected providers.

Owns, per consumer namespace holding a NamespaceOffloading named `offloading` (key = the
namespace), level-triggered and idempotent:
- the finalizer `gpufed.io/offloading` on the NamespaceOffloading, so neither it nor its
  namespace disappears before the twins are gone;
- the label `gpufed.io/offloading=<strategy>` on the Namespace (the webhook's namespaceSelector);
- the RoleBinding `gpufed-reflection` in the namespace while at least one provider is selected
  (or its twin is still being removed), giving the virtual kubelets read access to what they
  reflect there (ClusterRole `gpufed-virtual-kubelet-reflection`; nothing cluster-wide); a
  namespace offloaded to no provider (strategy Local, no matching virtual node) has none. Every
  virtual kubelet authenticates as the same identity (ServiceAccount `gpufed/gpufed-virtual-kubelet`,
  user `gpufed:virtual-kubelet`), so RBAC cannot tell one provider's from another's: which provider
  may see which namespace is decided by the virtual kubelets from this controller's status (below);
- one TwinNamespace request per selected provider, named like the namespace, in the tenant
  namespace `gpufed-tenant-<consumer-id>` on that provider (server-side applied with the
  credentials in Secret `gpufed/gpufed-remote-<provider>`), with `spec.twinName` per the mapping
  strategy; a provider is selected when one of its virtual nodes (label
  `gpufed.io/remote-cluster-id`) matches `spec.clusterSelector` (strategy Local selects none);
- removing the requests of providers no longer selected;
- `status`: phase, one `remoteNamespaces` entry per selected provider (the provider's own verdict
  on the twin) and one in phase `Terminating` per provider whose twin is being removed (also when
  that provider cannot be reached: the condition says so), and the conditions Ready and
  ProvidersReachable; Warning Events for refused twins. This status is the consumer's record of
  which (namespace, provider) pairs exist: a virtual kubelet follows a provider's TwinNamespace only
  for a namespace listed here for that provider, not `Terminating` (`vkprovider.remote.offloaded`).

Deletion (the NamespaceOffloading is deleted, e.g. with its namespace): delete the requests on every
peered provider, wait until they are gone (requeue), remove the namespace label, then the finalizer.

Invariants: an unreachable provider is a condition and a retry, never silently dropped; a provider
whose ForeignCluster is gone (unpeered: `gpufed unpeer` removed its tenant namespace and so every
request there) does not block the finalizer. Re-evaluated on changes of NamespaceOffloadings,
virtual nodes (labels, appearance) and ForeignClusters, and periodically.

Does not: mutate pods (the webhook does), create the twin namespaces themselves (the provider does,
from the requests), or move pods when the selection changes.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

import structlog
from pydantic import ValidationError

from gpufed.apis.meta import API_VERSION
from gpufed.apis.offloading import NamespaceOffloadingSpec, NodeSelector
from gpufed.apis.wire import (
    MANAGED_BY,
    MANAGED_BY_LABEL,
    NAMESPACE_OFFLOADING,
    OFFLOADING_LABEL,
    ORIGIN_CLUSTER_LABEL,
    REFLECTION_ROLE,
    REFLECTION_ROLEBINDING,
    REMOTE_CLUSTER_LABEL,
    SYSTEM_NAMESPACE,
    TYPE_LABEL,
    VIRTUAL_KUBELET_SERVICE_ACCOUNT,
    VIRTUAL_KUBELET_USER,
    VIRTUAL_NODE_TYPE,
    ClusterID,
    tenant_namespace,
    twin_namespace,
)
from gpufed.kube import conditions as cond
from gpufed.kube import events, rest
from gpufed.kube import meta as meta_
from gpufed.kube.client import KubeError
from gpufed.kube.queue import WorkQueue
from gpufed.kube.watch import watch
from peering.controllers import status as st_
from peering.controllers.remotes import Remotes

FINALIZER = "gpufed.io/offloading"
KIND = "NamespaceOffloading"
PLURAL = "namespaceoffloadings"
#: Seconds between re-reads while a twin is not Ready yet (or is being removed).
DEFAULT_PENDING_POLL_S = 1.0
#: What kube-apiserver's quota admission says while a quota's usage is not computed yet.
QUOTA_NOT_COUNTED = "status unknown for quota"
#: Seconds between retries while a provider is unreachable.
DEFAULT_UNREACHABLE_RETRY_S = 5.0
#: Seconds between re-reads of settled offloadings.
DEFAULT_RESYNC_S = 30.0


@dataclass(frozen=True)
class OffloadingSettings:
    #: Seconds between re-reads while a twin is not Ready or still being removed.
    pending_poll_s: float = DEFAULT_PENDING_POLL_S
    #: Seconds between retries of an unreachable provider.
    unreachable_retry_s: float = DEFAULT_UNREACHABLE_RETRY_S
    #: Seconds between re-reads of settled offloadings.
    resync_s: float = DEFAULT_RESYNC_S
    #: Concurrent namespace reconciles.
    workers: int = 4


@dataclass(frozen=True)
class RemoteOutcome:
    """What one provider said about (or did with) one namespace's twin."""

    cluster_id: str
    namespace: str
    phase: str  # Pending | Ready | Refused | Unreachable | Terminating
    message: str
    #: Whether the provider answered (a twin being removed stays `Terminating` when it did not).
    reachable: bool = True

    def wire(self) -> dict[str, str]:
        return {"clusterId": self.cluster_id, "namespace": self.namespace, "phase": self.phase, "message": self.message}


def selected_providers(
    spec: NamespaceOffloadingSpec, virtual_nodes: dict[str, dict[str, str]], peered: set[str]
) -> list[str]:
    """Providers (sorted) with a virtual node whose labels match the cluster selector; none for Local.

    Only peered providers count: a virtual node left behind by an unpeered provider selects nothing.
    """
    if spec.pod_offloading_strategy == "Local":
        return []
    selector: NodeSelector = spec.cluster_selector
    out = {
        labels[REMOTE_CLUSTER_LABEL]
        for labels in virtual_nodes.values()
        if labels.get(REMOTE_CLUSTER_LABEL) in peered and selector.matches(labels)
    }
    return sorted(out)


def expected_twin(spec: NamespaceOffloadingSpec, namespace: str, consumer: ClusterID) -> str:
    """The twin's name as the provider will compute it (for messages before it answers)."""
    chosen = spec.twin_name(namespace)
    if chosen:
        return chosen
    try:
        return twin_namespace(namespace, consumer)
    except ValueError:
        return ""


def summarize(strategy: str, outcomes: list[RemoteOutcome]) -> tuple[str, bool | None, str, str]:
    """(phase, Ready status, reason, message) of an offloading from its providers' outcomes."""
    if not outcomes:
        if strategy == "Local":
            return "Ready", True, "LocalOnly", "pods of this namespace run on local nodes only"
        return (
            "Pending",
            False,
            "NoMatchingProvider",
            "no peered provider has a virtual node matching the cluster selector (yet)",
        )
    ready = [o for o in outcomes if o.phase == "Ready"]
    refused = [o for o in outcomes if o.phase == "Refused"]
    unreachable = [o for o in outcomes if o.phase == "Unreachable"]
    if len(ready) == len(outcomes):
        names = ", ".join(f"{o.cluster_id}/{o.namespace}" for o in ready)
        return "Ready", True, "TwinsReady", f"twin namespaces ready: {names}"
    bad = [*refused, *unreachable, *(o for o in outcomes if o.phase in ("Pending", "Terminating"))]
    detail = "; ".join(f"{o.cluster_id}: {o.phase}: {o.message}" for o in bad)
    reason = "TwinRefused" if refused else ("ProviderUnreachable" if unreachable else "Waiting")
    if ready:
        return "Partial", False, reason, detail
    if refused and not unreachable and len(refused) == len(outcomes):
        return "Failed", False, reason, detail
    return "Pending", False, reason, detail


class OffloadingController:
    """Reconciles every NamespaceOffloading of this (consumer) cluster."""

    def __init__(self, api: Any, cluster_id: ClusterID, settings: OffloadingSettings | None = None) -> None:
        self.api = api
        self.cluster_id = cluster_id
        self.settings = settings or OffloadingSettings()
        self.queue: WorkQueue[str] = WorkQueue("offloadings")
        self.remotes = Remotes()
        #: namespace -> the NamespaceOffloading seen last (from the watch).
        self.offloadings: dict[str, dict[str, Any]] = {}
        #: virtual node name -> its labels.
        self.virtual_nodes: dict[str, dict[str, str]] = {}
        #: peered providers: ForeignCluster name (= ClusterID) of those with role Provider.
        self.providers: set[str] = set()
        self.ready = asyncio.Event()
        self._synced: set[str] = set()
        self._log = structlog.get_logger().bind(cluster=cluster_id, role="offloading")

    # ---- informers

    def _all(self) -> None:
        for ns in self.offloadings:
            self.queue.add(ns)

    def _on_offloading(self, kind: str, obj: dict[str, Any]) -> None:
        meta = obj["metadata"]
        if meta.get("name") != NAMESPACE_OFFLOADING:
            return  # the CRD refuses other names; nothing to do
        ns = str(meta.get("namespace"))
        if kind == "DELETED":
            self.offloadings.pop(ns, None)
        else:
            self.offloadings[ns] = obj
        self.queue.add(ns)

    def _on_node(self, kind: str, obj: dict[str, Any]) -> None:
        name = obj["metadata"]["name"]
        before = self.virtual_nodes.get(name)
        if kind == "DELETED":
            self.virtual_nodes.pop(name, None)
        else:
            self.virtual_nodes[name] = dict(obj["metadata"].get("labels") or {})
        if self.virtual_nodes.get(name) != before:  # status heartbeats change no selection
            self._all()

    def _on_fc(self, kind: str, obj: dict[str, Any]) -> None:
        name = obj["metadata"]["name"]
        before = name in self.providers
        roles = (obj.get("spec") or {}).get("roles") or []
        if kind == "DELETED" or "Provider" not in roles:
            self.providers.discard(name)
        else:
            self.providers.add(name)
        if name in self.providers or before:
            self._all()  # peering progress (credentials stored) may unblock twins; unpeering ends waits

    def _synced_cb(self, what: str) -> Any:
        def done() -> None:
            self._synced.add(what)
            if self._synced >= {"offloadings", "virtual-nodes", "foreignclusters"} and not self.ready.is_set():
                self.ready.set()
            self._all()

        return done

    async def run(self) -> None:
        informers: list[tuple[str, Any, str, dict[str, str] | None]] = [
            (rest.path(API_VERSION, PLURAL), self._on_offloading, "offloadings", None),
            ("/api/v1/nodes", self._on_node, "virtual-nodes", {"labelSelector": f"{TYPE_LABEL}={VIRTUAL_NODE_TYPE}"}),
            (rest.path(API_VERSION, "foreignclusters"), self._on_fc, "foreignclusters", None),
        ]
        try:
            async with asyncio.TaskGroup() as tg:
                for path_, handler, what, params in informers:
                    tg.create_task(
                        watch(self.api, path_, handler, what=what, params=params, on_synced=self._synced_cb(what))
                    )
                await self.ready.wait()
                tg.create_task(self.queue.run(self.reconcile, workers=self.settings.workers))
        finally:
            await asyncio.shield(self.remotes.close())

    # ---- reconcile one namespace

    def _path(self, namespace: str, sub: str = "") -> str:
        return rest.path(API_VERSION, PLURAL, NAMESPACE_OFFLOADING, namespace=namespace, sub=sub)

    def _request_path(self, namespace: str) -> str:
        return rest.path(API_VERSION, "twinnamespaces", namespace, namespace=tenant_namespace(self.cluster_id))

    async def reconcile(self, namespace: str) -> float | None:
        obj = await rest.get(self.api, self._path(namespace))
        if obj is None:
            return None
        log = self._log.bind(kind=KIND, namespace=namespace, name=NAMESPACE_OFFLOADING)
        if obj["metadata"].get("deletionTimestamp"):
            return await self._finalize(obj, namespace, log)
        old = dict(obj.get("status") or {})
        status: dict[str, Any] = {**old, "conditions": list(old.get("conditions") or [])}
        status["observedGeneration"] = obj["metadata"].get("generation", 1)
        try:
            spec = NamespaceOffloadingSpec.model_validate(obj.get("spec") or {})
        except ValidationError as e:
            msg = "; ".join(str(err["msg"]) for err in e.errors())[:500]
            status.update(phase="Failed", remoteNamespaces=[])
            status["conditions"] = cond.mark(status["conditions"], "Ready", False, "InvalidSpec", msg)
            await self._write_status(namespace, old, status, meta_.generation(obj))
            return None
        if FINALIZER not in (obj["metadata"].get("finalizers") or []):
            await self._set_finalizers(obj, [*(obj["metadata"].get("finalizers") or []), FINALIZER])
        if not await self._label_namespace(namespace, spec.pod_offloading_strategy):
            return None  # the namespace is gone; its deletion deletes this object
        peered = set(self.providers)
        selected = selected_providers(spec, self.virtual_nodes, peered)
        outcomes: list[RemoteOutcome] = []
        unreachable: list[str] = []
        for provider in selected:
            outcome = await self._ensure_twin(namespace, spec, ClusterID(provider), log)
            outcomes.append(outcome)
            if outcome.phase == "Unreachable":
                unreachable.append(provider)
        for provider in sorted(peered - set(selected)):
            leaving = await self._remove_twin(namespace, ClusterID(provider), log)
            if leaving is not None:
                outcomes.append(leaving)  # still being removed: shown until it is gone
                if not leaving.reachable:
                    unreachable.append(provider)
        if outcomes or selected:
            await self._bind_reflection(namespace)
        else:  # offloaded nowhere: no virtual kubelet reads anything here
            await rest.delete(self.api, self._rolebinding_path(namespace))
        wanted = [o for o in outcomes if o.cluster_id in selected]
        phase, ok, reason, message = summarize(spec.pod_offloading_strategy, wanted)
        conds = cond.mark(status["conditions"], "Ready", ok, reason, message)
        if unreachable:
            conds = cond.mark(
                conds, "ProvidersReachable", False, "ProviderUnreachable", "cannot reach " + ", ".join(unreachable)
            )
        else:
            conds = cond.mark(conds, "ProvidersReachable", True, "Reachable", "every peered provider answers")
        status.update(phase=phase, remoteNamespaces=[o.wire() for o in outcomes], conditions=conds)
        await self._emit_refusals(obj, old, outcomes)
        await self._write_status(namespace, old, status, meta_.generation(obj))
        if old.get("phase") != phase:
            log.info("offloading phase", phase=phase, providers=selected)
        if unreachable:
            return self.settings.unreachable_retry_s
        if phase != "Ready" or len(outcomes) != len(wanted):
            return self.settings.pending_poll_s
        return self.settings.resync_s

    async def _ensure_twin(
        self, namespace: str, spec: NamespaceOffloadingSpec, provider: ClusterID, log: Any
    ) -> RemoteOutcome:
        expected = expected_twin(spec, namespace, self.cluster_id)
        try:
            remote = await self.remotes.for_provider(self.api, provider)
            if remote is None:
                return RemoteOutcome(provider, expected, "Pending", "no credentials for this provider yet (peering)")
            body: dict[str, Any] = {"namespace": namespace}
            twin = spec.twin_name(namespace)
            if twin:
                body["twinName"] = twin
            req = await rest.apply(
                remote,
                self._request_path(namespace),
                {
                    "apiVersion": API_VERSION,
                    "kind": "TwinNamespace",
                    "metadata": {
                        "name": namespace,
                        "namespace": tenant_namespace(self.cluster_id),
                        "labels": {MANAGED_BY_LABEL: MANAGED_BY, ORIGIN_CLUSTER_LABEL: self.cluster_id},
                    },
                    "spec": body,
                },
            )
        except KubeError as e:
            if e.status in (400, 422):  # the provider's schema refuses the request: retrying changes nothing
                return RemoteOutcome(provider, expected, "Refused", str(e)[:300])
            if e.status == 403 and QUOTA_NOT_COUNTED in str(e):
                # the provider answers, its quota controller has not counted our tenant namespace yet
                # (a quota over a kind it started watching after the quota was made waits for its
                # next full resync): the request is retried as it is
                return RemoteOutcome(
                    provider,
                    expected,
                    "Pending",
                    "the provider's quota controller has not counted this consumer's usage yet: " + str(e)[:200],
                )
            log.warning("provider unreachable", remote_cluster=provider, error=str(e)[:300])
            await self.remotes.drop(provider)
            return RemoteOutcome(provider, expected, "Unreachable", str(e)[:300])
        st = req.get("status") or {}
        ready: dict[str, Any] = next((c for c in st.get("conditions") or [] if c.get("type") == "Ready"), {})
        phase = str(st.get("phase") or "Pending")
        message = str(ready.get("message") or "waiting for the provider to create the twin namespace")
        return RemoteOutcome(provider, str(st.get("twin") or expected), phase, message)

    async def _remove_twin(self, namespace: str, provider: ClusterID, log: Any) -> RemoteOutcome | None:
        """Delete this namespace's request on `provider`; None once it is gone."""
        try:
            remote = await self.remotes.for_provider(self.api, provider)
            if remote is None:
                return None  # never authenticated there: nothing could have been created
            path_ = self._request_path(namespace)
            req = await rest.get(remote, path_)
            if req is None:
                return None
            twin = str((req.get("status") or {}).get("twin") or "")
            if not req["metadata"].get("deletionTimestamp"):
                log.info("removing twin namespace request", remote_cluster=provider)
                await rest.delete(remote, path_, uid=req["metadata"]["uid"])
            return RemoteOutcome(provider, twin, "Terminating", "the twin namespace is being removed")
        except KubeError as e:
            log.warning("provider unreachable", remote_cluster=provider, error=str(e)[:300])
            await self.remotes.drop(provider)
            message = f"cannot reach the provider to remove the twin: {str(e)[:300]}"
            return RemoteOutcome(provider, "", "Terminating", message, reachable=False)

    async def _finalize(self, obj: dict[str, Any], namespace: str, log: Any) -> float | None:
        if FINALIZER not in (obj["metadata"].get("finalizers") or []):
            return None
        old = dict(obj.get("status") or {})
        outcomes = []
        for provider in sorted(self.providers):
            outcome = await self._remove_twin(namespace, ClusterID(provider), log)
            if outcome is not None:
                outcomes.append(outcome)
        if outcomes:
            status = {**old, "phase": "Terminating", "remoteNamespaces": [o.wire() for o in outcomes]}
            unreachable = [o.cluster_id for o in outcomes if not o.reachable]
            status["conditions"] = cond.mark(
                list(old.get("conditions") or []),
                "Ready",
                False,
                "ProviderUnreachable" if unreachable else "Removing",
                "waiting for the twin namespaces to be removed: "
                + "; ".join(f"{o.cluster_id}: {o.phase}: {o.message}" for o in outcomes),
            )
            await self._write_status(namespace, old, status, meta_.generation(obj))
            return self.settings.unreachable_retry_s if unreachable else self.settings.pending_poll_s
        await self._unlabel_namespace(namespace)
        await rest.delete(self.api, self._rolebinding_path(namespace))
        await self._set_finalizers(obj, [f for f in obj["metadata"].get("finalizers") or [] if f != FINALIZER])
        log.info("offloading removed")
        return None

    # ---- local writes

    async def _set_finalizers(self, obj: dict[str, Any], finalizers: list[str]) -> None:
        # A merge patch guarded by resourceVersion: a concurrent change makes it fail and retry
        # (never a lost finalizer of someone else). Not server-side apply: `gpufed offload-namespace`
        # applies the spec as the same field manager and would drop a finalizer it does not send.
        meta = obj["metadata"]
        await rest.merge_patch(
            self.api,
            self._path(meta["namespace"]),
            {"metadata": {"finalizers": finalizers, "resourceVersion": meta["resourceVersion"]}},
        )

    async def _label_namespace(self, namespace: str, strategy: str) -> bool:
        """Label the Namespace with the strategy; False when the namespace does not exist."""
        ns = await rest.get(self.api, rest.path("v1", "namespaces", namespace))
        if ns is None:
            return False
        if (ns["metadata"].get("labels") or {}).get(OFFLOADING_LABEL) != strategy:
            await rest.merge_patch(
                self.api,
                rest.path("v1", "namespaces", namespace),
                {"metadata": {"labels": {OFFLOADING_LABEL: strategy}}},
            )
        return True

    def _rolebinding_path(self, namespace: str) -> str:
        return rest.path("rbac.authorization.k8s.io/v1", "rolebindings", REFLECTION_ROLEBINDING, namespace=namespace)

    async def _bind_reflection(self, namespace: str) -> None:
        """The virtual kubelets may read what they reflect, in this namespace only."""
        want = {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": {
                "name": REFLECTION_ROLEBINDING,
                "namespace": namespace,
                "labels": {MANAGED_BY_LABEL: MANAGED_BY},
            },
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": REFLECTION_ROLE},
            "subjects": [
                {"kind": "User", "apiGroup": "rbac.authorization.k8s.io", "name": VIRTUAL_KUBELET_USER},
                {"kind": "ServiceAccount", "name": VIRTUAL_KUBELET_SERVICE_ACCOUNT, "namespace": SYSTEM_NAMESPACE},
            ],
        }
        have = await rest.get(self.api, self._rolebinding_path(namespace))
        if have is None or have.get("subjects") != want["subjects"] or have.get("roleRef") != want["roleRef"]:
            await rest.apply(self.api, self._rolebinding_path(namespace), want, what="reflection RoleBinding")

    async def _unlabel_namespace(self, namespace: str) -> None:
        ns = await rest.get(self.api, rest.path("v1", "namespaces", namespace))
        if ns is not None and OFFLOADING_LABEL in (ns["metadata"].get("labels") or {}):
            await rest.merge_patch(
                self.api, rest.path("v1", "namespaces", namespace), {"metadata": {"labels": {OFFLOADING_LABEL: None}}}
            )

    async def _write_status(self, namespace: str, old: dict[str, Any], new: dict[str, Any], generation: int) -> None:
        new = {**new, "conditions": cond.observed(new.get("conditions") or [], generation)}
        if cond.without_times(old) == cond.without_times(new):
            return
        await st_.write(self.api, KIND, PLURAL, NAMESPACE_OFFLOADING, new, namespace)

    async def _emit_refusals(self, obj: dict[str, Any], old: dict[str, Any], outcomes: list[RemoteOutcome]) -> None:
        before = {r.get("clusterId"): r.get("phase") for r in old.get("remoteNamespaces") or []}
        for o in outcomes:
            if o.phase == "Refused" and before.get(o.cluster_id) != "Refused":
                await events.emit(
                    self.api,
                    obj,
                    type_="Warning",
                    reason="TwinRefused",
                    message=f"provider {o.cluster_id} refused the twin namespace: {o.message}",
                )
