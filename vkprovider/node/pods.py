"""The pod controller of a virtual node: local pods bound to it <-> their twins at the provider.

Owns, per local pod (key: namespace/name; per-key serialised, bounded workers, backoff), in two
lanes: pods that still need a twin wait in `creates`; everything else (status, deletion, fail-back,
adoption) in `queue`, with workers of its own, so a burst of creates never holds back a twin's
status or a deletion (a key in both lanes is still handled by one worker at a time):
- creation of the twin for a pod bound to the node, and its status reflected back through the
  status subresource (strategic merge on the API server's current object: conditions merge by
  type, qosClass is never sent); the uneventful Pending states (`uneventful`) of a twin this
  controller just created are held back for `status_debounce_s`, so a twin that runs within them
  costs one status patch;
- graceful deletion: on deletionTimestamp the twin is stopped with the pod's grace period; once it
  is gone (or terminal) the containers' terminal states are reported and the local pod is deleted
  with grace 0 and a UID precondition. A pod deleted locally at once (force delete) or a twin whose
  local pod is gone is removed at the provider. Finalizers are left to their owners: our delete
  only sets what a kubelet would;
- terminal pods are final: a Succeeded/Failed pod is never updated again and its twin is never
  recreated (a Job's completed pods stay completed across restarts);
- startup: every twin and every local pod is reconciled once both views are complete, so a
  restarted virtual kubelet adopts running twins (matched by origin UID), deletes twins whose local
  pod is gone, and recreates missing twins of non-terminal pods — nothing is duplicated;
- refusals: a `ProviderError` sets `status.reason=ProviderFailed` with the provider's message and a
  Warning Event on the pod, then retries with capped backoff; nothing fails silently;
- fail-back: a pod the provider says can never run here (`ProviderError(fail_back=True)`), or
  whose twin the provider has not placed within `unplaced_timeout_s` (or the pod's own shorter
  `gpufed.io/unplaced-timeout-seconds`, `unplaced_timeout`), is failed locally — its
  twin deleted first (nothing keeps holding the provider's quota), then phase Failed with the
  reason, a DisruptionTarget condition and a Warning Event — so that its Job/ReplicaSet creates a
  replacement the scheduler can put elsewhere. The other pods of its group (label `gpufed.io/gang`:
  a group is released onto one pool node, so they are all here) are failed back with it
  (`GangFailedBack`): a group runs whole or not at all.

Metrics (label `node`): `gpufed_offloaded_pods{phase}` (local pods bound to the node by their
local phase; kept per watch event, O(1) each), `gpufed_offload_latency_seconds{stage}` (from the
first sight of a pod that is not yet running to its twin being created, stage "created", and to
its local status first saying Running, stage "running"; a pod already past a stage when first seen,
e.g. adopted after a restart, is not observed for it) and `gpufed_pods_failed_back_total{reason}`.

Does not: know the provider (see `provider.PodProvider`), schedule, or touch pods of other nodes.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

import structlog
from prometheus_client import Counter, Gauge, Histogram

from gpufed.apis.wire import GANG_LABEL, UNPLACED_TIMEOUT_ANNOTATION
from gpufed.kube import events, rest
from gpufed.kube.client import KubeError
from gpufed.kube.deleted import RecentlyDeleted
from gpufed.kube.queue import WorkQueue
from gpufed.kube.times import rfc3339
from gpufed.kube.watch import watch
from vkprovider import defaults
from vkprovider.forge.pods import (
    TERMINAL_PHASES,
    failed_back_status,
    is_terminal,
    status_differs,
    terminated_status,
)
from vkprovider.node.provider import PodProvider, ProviderError, Twin

#: Reason on pods the provider refused (what virtual-kubelet and its users expect).
PROVIDER_FAILED = "ProviderFailed"
#: Reason of a pod failed back because the provider did not place its twin in time.
UNPLACED_TIMEOUT = "ProviderPendingTimeout"
#: Reason of the pods of a group failed back because another pod of the group was.
GANG_FAILED_BACK = "GangFailedBack"
COMPONENT = "gpufed-virtual-kubelet"
#: Seconds a twin may stay unplaced (Pending on no node) at the provider before the pod is failed back.
DEFAULT_UNPLACED_TIMEOUT_S = defaults.UNPLACED_TIMEOUT_S
#: The shortest unplaced timeout a pod may ask for (a provider's scheduler needs a moment).
MIN_UNPLACED_TIMEOUT_S = 10.0

Key = tuple[str, str]


#: Why a container of a starting pod waits when nothing is wrong.
STARTING_REASONS = frozenset({"ContainerCreating", "PodInitializing"})


def uneventful(patch: Mapping[str, Any]) -> bool:
    """Whether a status says only that the pod is starting: Pending, not unschedulable at the provider,
    every container waiting (if at all) only to be created."""
    status = patch.get("status") or {}
    if status.get("phase") not in (None, "Pending"):
        return False
    if any((c or {}).get("reason") == "Unschedulable" for c in status.get("conditions") or []):
        return False
    for kind in ("initContainerStatuses", "containerStatuses"):
        for c in status.get(kind) or []:
            state = {k: v for k, v in (c.get("state") or {}).items() if v is not None}  # None: cleared
            if set(state) - {"waiting"}:
                return False
            reason = (state.get("waiting") or {}).get("reason")
            if reason is not None and reason not in STARTING_REASONS:
                return False
    return True


def unplaced_timeout(pod: Mapping[str, Any], node_timeout: float | None) -> float | None:
    """How long `pod`'s twin may stay unplaced: the node's timeout (None: never), or the pod's own
    UNPLACED_TIMEOUT_ANNOTATION when that is a number of seconds between MIN_UNPLACED_TIMEOUT_S and it."""
    raw = ((pod.get("metadata") or {}).get("annotations") or {}).get(UNPLACED_TIMEOUT_ANNOTATION)
    if node_timeout is None or raw is None:
        return node_timeout
    try:
        asked = float(str(raw))
    except ValueError:
        return node_timeout
    return asked if MIN_UNPLACED_TIMEOUT_S <= asked <= node_timeout else node_timeout


OFFLOAD_LATENCY = Histogram(
    "gpufed_offload_latency_seconds",
    "Seconds from the pod controller first seeing a pod to its twin being created at the provider"
    ' (stage="created") and to the pod reported Running (stage="running").',
    ["node", "stage"],
    buckets=(0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 300.0, 600.0),
)
OFFLOADED_PODS = Gauge(
    "gpufed_offloaded_pods", "Local pods bound to a virtual node, by their local phase.", ["node", "phase"]
)
FAILED_BACK = Counter(
    "gpufed_pods_failed_back_total",
    "Pods failed locally because the provider cannot or did not place them (so they can be scheduled elsewhere).",
    ["node", "reason"],
)


@dataclass(frozen=True)
class PodSettings:
    #: Concurrent reconciles of pods that need a twin (the create lane). A create is three requests
    #: in a row (TokenRequest, twin, token Secret), so the lane's rate is workers / their latency; more
    #: did not start pods sooner in `make bench` (the API servers were the limit) and made the
    #: provider's quota admission lose races (409 Conflict) on up to a tenth of the creates.
    workers: int = 32
    #: Concurrent reconciles of everything else: status, deletion, fail-back (the update lane). A
    #: deletion waits for the node's re-advertisement, shared by the deletions of the same moment
    #: and spaced by the node's `min_poke_interval_s`: the lane keeps that many deletions in flight.
    update_workers: int = 64
    #: Longest wait (s) between retries of a refused pod.
    max_retry_s: float = 60.0
    #: Seconds between re-checks of a pod whose twin is being deleted (notifications usually come first).
    deletion_poll_s: float = 2.0
    #: Seconds a new twin's uneventful Pending states (containers waiting only to be created) are held
    #: back: a twin that runs within them costs one status patch (Running) instead of one per
    #: intermediate state; one still Pending is reported after them, and a waiting reason that says
    #: more (ErrImagePull, CreateContainerConfigError, …) at once.
    status_debounce_s: float = 10.0
    #: Seconds a twin may stay unplaced at the provider before the pod is failed back; None: never.
    unplaced_timeout_s: float | None = DEFAULT_UNPLACED_TIMEOUT_S


class PodController:
    """Keeps the twins of the pods bound to `node` in line with them (see the module docstring).

    `on_change(kind, pod)` is called after every watch event of a local pod bound to the node (e.g. to
    count what it holds and re-advertise capacity); `releasing` is awaited before a pod stops holding
    the node's resources (terminal status, deletion), so the node can lower what it advertises before
    the scheduler sees the resources free. The controller subscribes to `provider`'s twin
    notifications when constructed.
    """

    def __init__(
        self,
        api: Any,
        provider: PodProvider,
        node: str,
        settings: PodSettings | None = None,
        *,
        on_change: Callable[[str, Mapping[str, Any]], None] | None = None,
        releasing: Callable[[Mapping[str, Any]], Awaitable[None]] | None = None,
    ) -> None:
        self.api = api
        self.provider = provider
        self.node = node
        self.settings = settings or PodSettings()
        self.pods: dict[Key, dict[str, Any]] = {}
        self.queue: WorkQueue[Key] = WorkQueue(f"pods:{node}")
        self.creates: WorkQueue[Key] = WorkQueue(f"pods-create:{node}")
        #: key -> (its lock, reconciles holding or awaiting it): one reconcile per key across both lanes
        self._key_locks: dict[Key, tuple[asyncio.Lock, list[int]]] = {}
        self.ready = asyncio.Event()
        self._local_synced = asyncio.Event()
        self._refusals: dict[Key, int] = {}
        #: UIDs of pods whose terminal phase this controller wrote: final even while the watch still
        #: shows the pod as it was before that write.
        self._finished: set[str] = set()
        #: UIDs of pods being failed back -> (reason, message): their twin is never created again.
        self._failing: dict[str, tuple[str, str]] = {}
        self._on_change = on_change
        self._releasing = releasing
        self._log = structlog.get_logger().bind(node=node)
        #: Local phase of every known pod (what `gpufed_offloaded_pods` counts).
        self._phases: dict[Key, str] = {}
        #: UID -> (monotonic time first seen, twin creation observed) of pods not yet seen running.
        self._offloading: dict[str, tuple[float, bool]] = {}
        #: key -> (UID, monotonic time) of twins this controller created whose Pending status is held back.
        self._debounced: dict[Key, tuple[str, float]] = {}
        #: Pods this controller deleted: a reconcile started by an event under way does not delete
        #: them again.
        self._removed = RecentlyDeleted()
        provider.subscribe(self._notify)

    def _count(self, key: Key, phase: str | None) -> None:
        """Move `key` from its previous phase's count to `phase`'s (None: it is gone)."""
        before = self._phases.pop(key, None)
        if before == phase:
            if phase is not None:
                self._phases[key] = phase
            return
        if before is not None:
            OFFLOADED_PODS.labels(self.node, before).dec()
        if phase is not None:
            self._phases[key] = phase
            OFFLOADED_PODS.labels(self.node, phase).inc()

    def _observe(self, uid: str, stage: str) -> None:
        """Offload latency of `uid` up to `stage`, once per pod and stage."""
        seen = self._offloading.get(uid)
        if seen is None:
            return
        first, created = seen
        if stage == "created" and created:
            return
        OFFLOAD_LATENCY.labels(self.node, stage).observe(time.monotonic() - first)
        if stage == "running":
            del self._offloading[uid]
        else:
            self._offloading[uid] = (first, True)

    def _on_pod(self, kind: str, obj: dict[str, Any]) -> None:
        meta = obj["metadata"]
        key = (meta["namespace"], meta["name"])
        uid = meta.get("uid")
        if kind == "DELETED":
            self.pods.pop(key, None)
            self._removed.discard(uid)
            self._finished.discard(uid)
            self._failing.pop(uid, None)
            self._offloading.pop(uid, None)
            self._count(key, None)
        else:
            self.pods[key] = obj
            phase = str((obj.get("status") or {}).get("phase") or "Pending")
            self._count(key, phase)
            if phase == "Pending" and uid and uid not in self._offloading and not meta.get("deletionTimestamp"):
                self._offloading[uid] = (time.monotonic(), False)
            elif phase != "Pending":
                self._offloading.pop(uid, None)
        self._enqueue(key)
        if self._on_change is not None:
            self._on_change(kind, obj)

    # ---- what the kubelet API serves (vkprovider.kubelet.server.PodSource)

    def bound_pod(self, namespace: str, name: str) -> Mapping[str, Any] | None:
        """The local pod bound to this node, as last seen (None: unknown or bound elsewhere)."""
        pod = self.pods.get((namespace, name))
        if pod is None or (pod.get("spec") or {}).get("nodeName") != self.node:
            return None
        return pod

    def bound_pods(self) -> list[Mapping[str, Any]]:
        return [p for p in self.pods.values() if (p.get("spec") or {}).get("nodeName") == self.node]

    def running_pods(self) -> list[Mapping[str, Any]]:
        """The bound pods whose twin exists at the provider for their UID and has not finished (a
        twin being deleted still runs until it is gone); a pod deleted here is not listed, whatever
        its twin is doing."""
        out = []
        for twin in self.provider.twins():
            pod = self.bound_pod(twin.namespace, twin.name)
            if pod is not None and not twin.terminal and pod["metadata"].get("uid") == twin.origin_uid:
                out.append(pod)
        return out

    def finished(self, pod: Mapping[str, Any]) -> bool:
        """Whether this controller ended the pod (terminal, or being failed back) even if the watch
        does not show it yet."""
        uid = pod["metadata"].get("uid")
        return uid in self._finished or uid in self._failing

    def _notify(self, namespace: str, name: str) -> None:
        self._enqueue((namespace, name))

    def _enqueue(self, key: Key) -> None:
        """Queue `key` in its lane: `creates` when its pod still needs a twin, else `queue`."""
        pod = self.pods.get(key)
        if pod is not None and self.provider.twin(*key) is None:
            meta = pod["metadata"]
            uid = meta.get("uid")
            if not (meta.get("deletionTimestamp") or is_terminal(pod) or uid in self._finished or uid in self._failing):
                self.creates.add(key)
                return
        self.queue.add(key)

    async def _serialised(self, key: Key) -> float | None:
        """`reconcile`, never for the same key in both lanes at once."""
        entry = self._key_locks.get(key)
        if entry is None:
            entry = self._key_locks[key] = (asyncio.Lock(), [0])
        lock, users = entry
        users[0] += 1
        try:
            async with lock:
                return await self.reconcile(key)
        finally:
            users[0] -= 1
            if users[0] == 0:
                del self._key_locks[key]

    async def run(self) -> None:
        try:
            await self._run()
        finally:
            # This node's pods are no longer counted here (e.g. a drained pool node stops).
            for key in list(self._phases):
                self._count(key, None)

    async def _run(self) -> None:
        async with asyncio.TaskGroup() as tg:
            tg.create_task(self.provider.run())
            tg.create_task(
                watch(
                    self.api,
                    "/api/v1/pods",
                    self._on_pod,
                    what=f"pods on {self.node}",
                    params={"fieldSelector": f"spec.nodeName={self.node}"},
                    on_synced=self._local_synced.set,
                )
            )
            await self._local_synced.wait()
            await self.provider.ready.wait()
            # Startup reconciliation: both views are complete; every key on either side once.
            for t in self.provider.twins():
                self._enqueue((t.namespace, t.name))
            for key in list(self.pods):
                self._enqueue(key)
            self._log.info("pod controller synced", local=len(self.pods), remote=len(self.provider.twins()))
            self.ready.set()
            tg.create_task(self.queue.run(self._serialised, workers=self.settings.update_workers))
            tg.create_task(self.creates.run(self._serialised, workers=self.settings.workers))

    # ---- one pod

    async def reconcile(self, key: Key) -> float | None:
        namespace, name = key
        pod = self.pods.get(key)
        twin = self.provider.twin(namespace, name)
        if pod is None:
            if twin is not None:  # deleted here (also force deletes): nothing may keep running there
                self._log.debug("removing twin of a deleted pod", namespace=namespace, pod=name)
                await self._delete_twin(twin, 0)
            self._refusals.pop(key, None)
            self._debounced.pop(key, None)
            return None
        meta = pod["metadata"]
        uid = meta["uid"]
        if uid in self._removed:
            return None  # deleted here; its DELETED event follows
        if twin is not None and twin.origin_uid != uid:
            # A twin of an earlier pod with the same name (e.g. a StatefulSet replica): never adopt it.
            self._log.info("removing stale twin", namespace=namespace, pod=name, origin_uid=twin.origin_uid)
            await self._delete_twin(twin, 0)
            return self.settings.deletion_poll_s
        if meta.get("deletionTimestamp"):
            return await self._finish_deletion(pod, twin)
        if is_terminal(pod) or uid in self._finished:
            return None
        if uid in self._failing:
            return await self._fail_back(pod, twin, *self._failing[uid])
        if twin is None:
            return await self._create(key, pod)
        self._refusals.pop(key, None)
        if not twin.terminal and not twin.deleting:
            await self.provider.update_pod(pod, twin)
        patch = self.provider.pod_status(pod, twin)
        if status_differs(patch, pod):
            phase = (patch.get("status") or {}).get("phase")
            wait = self._held_back(key, uid, patch)
            if wait is not None:
                later = await self._check_placed(pod, twin)
                return wait if later is None else min(wait, later)
            if phase in TERMINAL_PHASES:
                await self._release(pod)
            await self._patch_status(pod, patch)
            if phase == "Running":
                self._observe(uid, "running")
        return await self._check_placed(pod, twin)

    def _held_back(self, key: Key, uid: str, patch: Mapping[str, Any]) -> float | None:
        """Seconds the uneventful Pending status of a twin created moments ago is held back; None:
        report it now."""
        held = self._debounced.get(key)
        if held is None or held[0] != uid:
            return None
        left = held[1] + self.settings.status_debounce_s - time.monotonic()
        if left > 0 and uneventful(patch):
            return left
        del self._debounced[key]
        return None

    async def _release(self, pod: Mapping[str, Any]) -> None:
        if self._releasing is not None:
            await self._releasing(pod)

    async def _check_placed(self, pod: dict[str, Any], twin: Twin) -> float | None:
        """Fail back a pod whose twin stayed unplaced too long; else when to look again."""
        timeout = unplaced_timeout(pod, self.settings.unplaced_timeout_s)
        if timeout is None or twin.unplaced_since is None or twin.terminal or twin.deleting:
            return None
        waited = time.time() - twin.unplaced_since
        if waited < timeout:
            return timeout - waited + 0.1
        scheduled: Mapping[str, Any] = next(
            (c for c in (pod.get("status") or {}).get("conditions") or [] if c.get("type") == "PodScheduled"), {}
        )
        why = f": {scheduled['message']}" if scheduled.get("message") else ""
        message = (
            f"the provider behind node {self.node} did not place the pod within {timeout:g}s{why}; "
            "failed back so that it can be scheduled elsewhere"
        )
        self._failing[pod["metadata"]["uid"]] = (UNPLACED_TIMEOUT, message)
        self._fail_group(pod)
        return await self._fail_back(pod, twin, UNPLACED_TIMEOUT, message)

    def _fail_group(self, pod: Mapping[str, Any]) -> None:
        """The other pods of `pod`'s group on this node (a group is released onto one pool node) are
        failed back with it: a group runs whole or not at all."""
        meta = pod["metadata"]
        group = (meta.get("labels") or {}).get(GANG_LABEL)
        if not group:
            return
        message = f"pod {meta['name']} of its group was failed back; the group runs whole or not at all"
        for key, other in self.pods.items():
            om = other["metadata"]
            if (
                om["namespace"] != meta["namespace"]
                or (om.get("labels") or {}).get(GANG_LABEL) != group
                or om.get("uid") in (meta.get("uid"), None)
                or om.get("uid") in self._failing
                or is_terminal(other)
                or om.get("deletionTimestamp")
            ):
                continue
            self._failing[om["uid"]] = (GANG_FAILED_BACK, message)
            self._enqueue(key)

    async def _fail_back(self, pod: dict[str, Any], twin: Twin | None, reason: str, message: str) -> float | None:
        """Delete the twin (it must not hold the provider's quota), then fail the pod here."""
        meta = pod["metadata"]
        namespace, name = meta["namespace"], meta["name"]
        if twin is not None:
            await self._delete_twin(twin, 0)
            if self.provider.twin(namespace, name) is not None:
                return self.settings.deletion_poll_s
        await self._release(pod)
        await self._patch_status(pod, failed_back_status(pod, now=rfc3339(), reason=reason, message=message))
        await events.emit(self.api, pod, type_="Warning", reason=reason, message=message, component=COMPONENT)
        self._failing.pop(meta["uid"], None)
        FAILED_BACK.labels(self.node, reason).inc()
        self._log.info("pod failed back", namespace=namespace, pod=name, reason=reason)
        return None

    async def _create(self, key: Key, pod: dict[str, Any]) -> float | None:
        namespace, name = key
        try:
            await self.provider.create_pod(pod)
        except ProviderError as e:
            if e.fail_back:
                self._refusals.pop(key, None)
                self._failing[pod["metadata"]["uid"]] = (e.reason, str(e))
                self._fail_group(pod)
                return await self._fail_back(pod, None, e.reason, str(e))
            n = self._refusals.get(key, 0) + 1
            self._refusals[key] = n
            message = str(e)
            self._log.warning("provider refused pod", namespace=namespace, pod=name, reason=e.reason, error=message)
            status = pod.get("status") or {}
            if status.get("reason") != PROVIDER_FAILED or status.get("message") != message:
                await self._patch_status(pod, {"status": {"reason": PROVIDER_FAILED, "message": message}})
            await events.emit(self.api, pod, type_="Warning", reason=e.reason, message=message, component=COMPONENT)
            if not e.retry:
                return None
            return float(min(self.settings.max_retry_s, 2 ** min(n, 10) * 0.5))
        self._observe(pod["metadata"]["uid"], "created")
        if self.settings.status_debounce_s > 0:
            self._debounced[key] = (pod["metadata"]["uid"], time.monotonic())
        if self._refusals.pop(key, None) is not None:
            await self._patch_status(pod, {"status": {"reason": None, "message": None}})
        self._log.debug("twin created", namespace=namespace, pod=name)
        return None

    async def _finish_deletion(self, pod: dict[str, Any], twin: Twin | None) -> float | None:
        meta = pod["metadata"]
        namespace, name = meta["namespace"], meta["name"]
        if twin is not None and not twin.terminal:
            if not twin.deleting:
                grace = int(meta.get("deletionGracePeriodSeconds") or 0)
                await self.provider.delete_pod(namespace, name, twin.origin_uid, grace)
                self._log.debug("stopping twin", namespace=namespace, pod=name, grace_s=grace)
            return self.settings.deletion_poll_s
        await self._release(pod)
        if not is_terminal(pod) and meta["uid"] not in self._finished:
            final = terminated_status(
                pod,
                twin.raw if twin is not None else None,
                now=rfc3339(),
                message=f"stopped on the provider because the pod was deleted (node {self.node})",
            )
            if status_differs(final, pod):
                try:
                    await self._patch_status(pod, final)
                except KubeError as e:
                    if not e.not_found:
                        raise
        if twin is not None:
            await self._delete_twin(twin, 0)
        try:
            await rest.delete(
                self.api,
                rest.path("v1", "pods", name, namespace=namespace),
                uid=meta["uid"],
                grace_period_s=0,
                what=f"delete pod {namespace}/{name}",
            )
        except KubeError as e:
            if not e.conflict:  # 409: the UID precondition failed, a new pod took the name
                raise
        self._removed.add(meta["uid"])
        self._log.debug("pod deleted", namespace=namespace, pod=name)
        return None

    async def _delete_twin(self, twin: Twin, grace: int) -> None:
        try:
            await self.provider.delete_pod(twin.namespace, twin.name, twin.origin_uid, grace)
        except ProviderError as e:
            self._log.warning("twin not deleted", namespace=twin.namespace, pod=twin.name, error=str(e))
            raise

    async def _patch_status(self, pod: Mapping[str, Any], patch: Mapping[str, Any]) -> None:
        meta = pod["metadata"]
        await rest.strategic_patch(
            self.api,
            rest.path("v1", "pods", meta["name"], namespace=meta["namespace"], sub="status"),
            patch,
            what=f"patch status of pod {meta['namespace']}/{meta['name']}",
        )
        if (patch.get("status") or {}).get("phase") in TERMINAL_PHASES:
            self._finished.add(meta["uid"])
