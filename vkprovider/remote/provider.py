"""`RemoteProvider`: the PodProvider of the virtual nodes backed by one peered cluster.

Owns, for one (consumer, provider) — shared by every pool node of that provider (`remote.pools`):
- the provider-side view: TwinNamespaces of this consumer (from its tenant namespace: which local
  namespace maps to which twin namespace), and per ready twin namespace a watch on this consumer's
  twins (label `gpufed.io/origin-cluster-id=<consumer>`; each twin names its pool node in
  `gpufed.io/origin-node`) and on the namespace's Events;
- creating twins (forge.pods.remote_pod) after the ConfigMaps and Secrets they reference exist in
  the twin namespace (copied from the consumer with the reflection forge, never overwriting an
  object gpufed did not create, refused when annotated `gpufed.io/skip-reflection`) and, with
  `tokens`, after their consumer-issued service-account token Secret exists (remote.tokens),
  deleting them with UID preconditions, mapping API refusals to `ProviderError` with the provider's
  own message (e.g. the quota's "exceeded quota: gpufed-grant, requested: ...");
- before creating the twin of a GPU pod, asking `placement` (the capacity estimator) whether any
  provider node can take it: a definite no is `ProviderError(fail_back=True)`;
- the provider's offload pod-security policy, as each Ready TwinNamespace's `status.podSecurity`
  publishes it: a pod it refuses (privileged, host namespaces, hostPath, added capabilities) gets no
  twin and `ProviderError(reason=OffloadPolicyRefused, retry=False)` with the reason
  (`forge.podpolicy`) — not retried and not failed back (every replacement would be refused the
  same way), but tried again when that namespace's policy changes. The provider's API server
  enforces the policy anyway; its refusal (403 from the admission policy or Pod Security
  Admission) is mapped the same way, with the API server's message;
- telling listeners (reflection) when a twin namespace becomes Ready or goes;
- remote Events about a twin, mirrored onto the local pod (new ones only, not the history a relist
  replays; `Scheduled` is skipped: the consumer's scheduler already reported the placement);
- the grant (this provider's accepted ResourceSlices, consumer side, namespace gpufed) and the
  provider's health (its API answers), which pool nodes advertise.

Does not: decide when to create or delete (vkprovider.node does), or pick up renewed credentials:
the provider client is built once per process (certificate rotation is issue 11's).
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

import structlog

from gpufed.apis.models import API_VERSION, GPU_RESOURCE, OffloadPodSecurity
from gpufed.apis.quantity import parse
from gpufed.apis.wire import (
    ORIGIN_CLUSTER_LABEL,
    ORIGIN_NODE_LABEL,
    ORIGIN_UID_LABEL,
    SYSTEM_NAMESPACE,
    ClusterID,
    tenant_namespace,
)
from gpufed.kube import events, rest
from gpufed.kube.client import KubeError
from gpufed.kube.watch import watch
from gpupool.capacity import Placement
from peering import podsecurity
from peering.grants import pod_requests
from vkprovider.forge import podpolicy, reflection
from vkprovider.forge import pods as forge
from vkprovider.node.provider import NOT_FOUND, Notify, ProviderError, Twin
from vkprovider.remote.tokens import PodTokens
from vkprovider.remote.translate import Identity, IPTranslator

COMPONENT = "gpufed-virtual-kubelet"
#: Events of remote twins not mirrored (the consumer's own components already report these).
SKIPPED_EVENT_REASONS = frozenset({"Scheduled"})


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


#: Reason of a pod failed back because no provider node can take it.
UNPLACEABLE = "GPUUnplaceable"
#: Reason while a GPU pod waits (locally, no twin) for the provider to have room.
WAITING_FOR_GPUS = "WaitingForGPUs"
#: Reason of a pod the provider's API server refused at admission for another policy than gpufed's
#: (Pod Security Admission, another ValidatingAdmissionPolicy): deterministic, so not retried.
ADMISSION_REFUSED = "AdmissionRefused"


@dataclass(frozen=True)
class Grant:
    """What the provider granted this consumer (all accepted ResourceSlices together)."""

    resources: Mapping[str, Decimal] = field(default_factory=dict)
    #: The GPU product every accepted slice is limited to (None: any, or they differ).
    gpu_product: str | None = None
    #: nvidia.com/* labels the provider reported for the grant's nodes.
    labels: Mapping[str, str] = field(default_factory=dict)
    accepted: bool = False


@dataclass(frozen=True)
class Health:
    ready: bool
    reason: str
    message: str


#: (local pod, pool product) -> the estimator's answer, or None when it cannot say.
Placer = Callable[[Mapping[str, Any], str | None], Awaitable[Placement | None]]


def _unix(timestamp: str | None) -> float | None:
    if not timestamp:
        return None
    try:
        return dt.datetime.fromisoformat(timestamp.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def origin_node(twin: Mapping[str, Any], default: str) -> str:
    """The pool node a twin belongs to (twins from before pools carry none: the default node)."""
    return str((twin.get("metadata", {}).get("labels") or {}).get(ORIGIN_NODE_LABEL) or default)


def _key(obj: Mapping[str, Any]) -> tuple[str, str]:
    meta = obj["metadata"]
    return str(meta["namespace"]), str(meta["name"])


class RemoteProvider:
    def __init__(
        self,
        local_api: Any,
        remote_api: Any,
        settings: RemoteSettings,
        translator: IPTranslator | None = None,
        tokens: PodTokens | None = None,
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
        #: (twin namespace, kind, name) -> resourceVersion of the local object last copied there.
        self._copied: dict[tuple[str, str, str], str] = {}
        self._notify: Notify = lambda _ns, _name: None
        #: local namespace -> pods refused because it had no Ready twin namespace yet.
        self._waiting: dict[str, set[str]] = {}
        #: local namespace -> the provider's offload policy there (None: not published, e.g. an
        #: older provider; its API server still decides).
        self.pod_security: dict[str, OffloadPodSecurity | None] = {}
        #: local namespace -> pods refused by an admission policy (tried again when it changes).
        self._policy_refused: dict[str, set[str]] = {}
        self._tg: asyncio.TaskGroup | None = None
        #: Called with (local namespace, twin namespace) when a twin namespace becomes Ready and with
        #: (local namespace, None) when it goes (reflection starts and stops its reflectors).
        self.namespace_listeners: list[Callable[[str, str | None], None]] = []
        #: A namespace's annotations (the reflection policy's allow-list mode), from reflection.
        self.namespace_annotations: Callable[[str], Mapping[str, str]] = lambda _ns: {}
        #: Pool node -> its GPU product (twins of that node are pinned to it).
        self.pool_products: dict[str, str | None] = {}
        #: Asked before a GPU pod's twin is created (None: nobody to ask).
        self.placement: Placer | None = None
        #: Called when this provider's ResourceSlices change.
        self.slice_listeners: list[Callable[[], None]] = []
        self._health: tuple[float, Health] | None = None
        #: Local pod UID -> when the estimator first said it cannot be placed.
        self._unplaceable: dict[str, float] = {}
        self._log = structlog.get_logger().bind(remote_cluster=settings.provider)

    # ---- provider view

    async def run(self, notify: Notify) -> None:
        self._notify = notify
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
                self._tg = tg
                if self.tokens is not None:
                    tg.create_task(self.tokens.run(lambda: list(self.twin_ns.values())))
                await twins_synced.wait()  # each Ready twin namespace has started its watches by now
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
        for listener in self.slice_listeners:
            listener()

    def _on_twin_namespace(self, kind: str, obj: dict[str, Any]) -> None:
        local = str((obj.get("spec") or {}).get("namespace") or "")
        st = obj.get("status") or {}
        twin = str(st.get("twin") or "")
        gone = kind == "DELETED" or obj["metadata"].get("deletionTimestamp") or st.get("phase") != "Ready"
        if gone:
            self.pod_security.pop(local, None)
            old = self.twin_ns.pop(local, None)
            if old:
                self.local_ns.pop(old, None)
                self._stop_watches(old)
                for listener in self.namespace_listeners:
                    listener(local, None)
            return
        self._set_pod_security(local, st.get("podSecurity"))
        if not twin or self.twin_ns.get(local) == twin:
            return
        self.twin_ns[local] = twin
        self.local_ns[twin] = local
        if self._tg is not None:
            self._start_watches(twin)
        for listener in self.namespace_listeners:
            listener(local, twin)
        # Pods refused because this namespace had no twin yet go again now, not after their backoff.
        for name in sorted(self._waiting.pop(local, set())):
            self._notify(local, name)

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
                    watch(self.remote, rest.path("v1", "events", namespace=twin_ns), self._on_event, what="events")
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
        if local_ns is None:
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
        if self._tg is None:
            return
        self._tg.create_task(
            events.emit(
                self.local,
                local_pod,
                type_=str(obj.get("type") or "Normal"),
                reason=str(obj.get("reason") or "Remote"),
                message=message,
                component=COMPONENT,
            )
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

    def _target(self, namespace: str, name: str, node: str) -> forge.Target:
        twin_ns = self.twin_ns.get(namespace)
        if twin_ns is None:
            self._waiting.setdefault(namespace, set()).add(name)
            raise ProviderError(
                f"namespace {namespace} is not offloaded to provider {self.settings.provider} "
                f"(run `gpufed offload-namespace {namespace}`, or wait for its twin namespace)",
                reason="NamespaceNotOffloaded",
            )
        return forge.Target(self.settings.consumer, node, twin_ns, self.settings.provider, self.pool_products.get(node))

    async def create_pod(self, pod: Mapping[str, Any]) -> None:
        namespace, name = _key(pod)
        node = str((pod.get("spec") or {}).get("nodeName") or self.settings.node)
        target = self._target(namespace, name, node)
        self._check_pod_security(pod)
        await self._check_placement(pod, target)
        for ref in forge.references(pod):
            await self._copy_reference(namespace, ref, target)
        identity = await self.tokens.ensure(pod, target) if self.tokens is not None else None
        body = forge.remote_pod(pod, target, identity)
        url = rest.path("v1", "pods", namespace=target.namespace)
        try:
            created = await rest.create(self.remote, url, body, what=f"create twin {target.namespace}/{name}")
        except KubeError as e:
            if e.conflict:
                await self._adopt(pod, target)
                return
            refusal = self._refusal(e, f"the provider {self.settings.provider} refused the pod")
            if refusal.reason in (podpolicy.REASON, ADMISSION_REFUSED):
                self._policy_refused.setdefault(namespace, set()).add(name)
            raise refusal from e
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

    async def _check_placement(self, pod: Mapping[str, Any], target: forge.Target) -> None:
        """Fail back a GPU pod the estimator says no provider node can take (its answer is
        authoritative only when given: an unreachable estimator lets the pod through)."""
        if self.placement is None or _key(pod) in self._twins:
            return
        gpus = pod_gpus(pod)
        if gpus <= 0:
            return
        uid = str(pod["metadata"].get("uid") or "")
        answer = await self.placement(pod, target.gpu_product)
        if answer is None or answer.placeable:
            self._unplaceable.pop(uid, None)
            return
        what = f"{gpus} GPUs" + (f" of {target.gpu_product}" if target.gpu_product else "")
        now = time.monotonic()
        for stale in [u for u, t in self._unplaceable.items() if now - t > 10 * self.settings.unplaceable_grace_s]:
            del self._unplaceable[stale]  # pods deleted while they waited
        waited = now - self._unplaceable.setdefault(uid, now)
        if waited < self.settings.unplaceable_grace_s:
            raise ProviderError(
                f"waiting for {what} to free up at provider {self.settings.provider} "
                f"(failed back after {self.settings.unplaceable_grace_s:g}s): {answer.reason}",
                reason=WAITING_FOR_GPUS,
            )
        self._unplaceable.pop(uid, None)
        raise ProviderError(
            f"provider {self.settings.provider} cannot place this pod ({what}): {answer.reason}",
            reason=UNPLACEABLE,
            fail_back=True,
        )

    async def _adopt(self, pod: Mapping[str, Any], target: forge.Target) -> None:
        namespace, name = _key(pod)
        existing = await self._get_remote(rest.path("v1", "pods", name, namespace=target.namespace))
        if existing is None:
            raise ProviderError("the twin was being replaced; retrying", reason="TwinConflict")
        if not forge.owned_by(existing, self.settings.consumer):
            raise ProviderError(
                f"pod {target.namespace}/{name} on {self.settings.provider} was not created by gpufed; "
                "it is left alone and this pod cannot be offloaded under that name",
                reason="NameCollision",
                retry=True,
            )
        if forge.owned_by(existing, self.settings.consumer, pod["metadata"]["uid"]):
            self._twins.setdefault((namespace, name), existing)
            return
        raise ProviderError("an earlier twin with this name is still being removed; retrying", reason="TwinConflict")

    async def _get_remote(self, url: str) -> dict[str, Any] | None:
        try:
            return await rest.get(self.remote, url)
        except KubeError as e:
            raise self._refusal(e, f"cannot read from provider {self.settings.provider}") from e

    async def _copy_reference(self, namespace: str, ref: forge.Reference, target: forge.Target) -> None:
        plural = "configmaps" if ref.kind == "ConfigMap" else "secrets"
        try:
            local = await rest.get(self.local, rest.path("v1", plural, ref.name, namespace=namespace))
        except KubeError as e:
            raise ProviderError(
                f"cannot read {ref.kind} {namespace}/{ref.name}: {e}", reason="ReferenceUnreadable"
            ) from e
        if local is None:
            if ref.optional:
                return
            raise ProviderError(
                f'{ref.kind} "{ref.name}" not found in namespace {namespace}: the pod cannot start on '
                f"{self.settings.provider} until it exists",
                reason="ReferenceNotFound",
            )
        decision = reflection.policy(local, self.namespace_annotations(namespace))
        if decision.reason in ("Skipped", "NotAllowed"):  # the reflector would remove the copy again
            raise ProviderError(
                f"{ref.kind} {namespace}/{ref.name} is not reflected ({decision.message}): the pod needs it on "
                f"{self.settings.provider} and cannot be offloaded without it",
                reason="ReferenceNotReflected",
            )
        rv = str(local["metadata"].get("resourceVersion"))
        cache_key = (target.namespace, ref.kind, ref.name)
        if self._copied.get(cache_key) == rv:
            return
        # The same copy the Secret/ConfigMap reflector makes (the pod cannot wait for it).
        twin = (reflection.remote_config_map if ref.kind == "ConfigMap" else reflection.remote_secret)(local, target)
        if twin is None:
            return
        url = rest.path("v1", plural, ref.name, namespace=target.namespace)
        existing = await self._get_remote(url)
        if existing is not None and not forge.owned_by(existing, self.settings.consumer):
            raise ProviderError(
                f"{ref.kind} {target.namespace}/{ref.name} on {self.settings.provider} was not created by gpufed; "
                "it is left alone",
                reason="NameCollision",
            )
        try:
            await rest.apply(self.remote, url, twin, what=f"copy {ref.kind} {ref.name}")
        except KubeError as e:
            raise self._refusal(e, f"cannot copy {ref.kind} {ref.name} to {self.settings.provider}") from e
        self._copied[cache_key] = rv

    def _refusal(self, e: KubeError, what: str) -> ProviderError:
        if e.transient:
            return ProviderError(f"{what}: {e}", reason="ProviderUnavailable")
        if e.status == 403 and "exceeded quota" in str(e):
            return ProviderError(f"{what}: {e}", reason="QuotaExceeded")
        if e.status in (403, 422) and f"ValidatingAdmissionPolicy '{podsecurity.POLICY_NAME}'" in str(e):
            return ProviderError(f"{what}: {e}", reason=podpolicy.REASON, retry=False)
        if e.status in (403, 422) and ("ValidatingAdmissionPolicy" in str(e) or "violates PodSecurity" in str(e)):
            return ProviderError(f"{what}: {e}", reason=ADMISSION_REFUSED, retry=False)
        if e.status == 422:
            return ProviderError(f"{what}: {e}", reason="InvalidPod", retry=False)
        return ProviderError(f"{what}: {e}", reason="ProviderFailed")

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
            raise self._refusal(e, "cannot update the twin") from e

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
            raise self._refusal(e, "cannot delete the twin") from e
        if self.tokens is not None:
            await self.tokens.forget(namespace, name, meta["namespace"], uid=uid)
        if grace_period_s == 0:
            with contextlib.suppress(KeyError):
                if self._twins[(namespace, name)]["metadata"].get("uid") == meta["uid"]:
                    del self._twins[(namespace, name)]

    def pod_status(self, pod: Mapping[str, Any], twin: Twin) -> dict[str, Any]:
        return forge.local_status(twin.raw, pod, host_ip=self.settings.host_ip, to_local_ip=self.translator.to_local_ip)

    # ---- grant and health (what pool nodes advertise)

    def grant(self) -> Grant:
        granted: dict[str, Decimal] = {}
        labels: dict[str, str] = {}
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
            labels.update(st.get("nodeLabels") or {})
        product = next(iter(products)) if len(products) == 1 else None
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


def pod_gpus(pod: Mapping[str, Any]) -> int:
    """GPUs a pod requests (as the scheduler counts them)."""
    return int(pod_requests(pod).get(GPU_RESOURCE, Decimal(0)))
