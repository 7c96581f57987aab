"""The gang controller (consumer side): the pods of a group are released together, onto one pool.

Owns: watching the pods the offloading webhook gated (label `gpufed.io/gang`, gate `gpufed.io/gang`)
and the virtual nodes (their pool figures, `gpufed.io/gpu-pool`), and for each group whose pods all
exist:

- choosing one pool (one provider, one GPU product) that holds every pod now, among the pools each
  pod's own required node selection allows (`gpupool.gang.place`, with the GPUs of groups released
  but not yet bound kept aside so that two groups are never promised the same GPUs);
- releasing the group: each pod gets `nodeSelector kubernetes.io/hostname=<pool node>` (a gated pod
  may gain node selection) and loses the gate, in one JSON patch with a `test` of the gate, and is
  annotated with the pool; then every pod is bound to the pool node at once (pods/binding), so the
  group is not bound one pod at a time between other pods (the ordinary kube-scheduler binds any pod
  a binding missed, to the same node: its node selection says so);
- pods of a group that was released before (a Job's next pods beside those still running, or the
  rest of a release cut short by an error) join it on its pool node once that pool holds them, and
  wait gated until then (a pod released onto a pool that cannot take it would be failed back, and
  its whole group with it);
- when no pool holds the group now: the pods stay gated with the condition `gpufed.io/GangPlaced`
  False (reason `Waiting`) and a Warning Event `GangWaiting` on the group's JobSet or Job (or its
  first pod) that say what the group needs and the largest group each pool takes now; the group is
  looked at again on every change of the pools. A group no pool could ever hold gets reason `NeverFits` and
  `GangUnplaceable` at once;
- reserving pools for waiting groups (`gpupool.gang.reservations`: the longest-waiting first, one
  group per pool): the reserving group's gated pods carry `GANG_RESERVE_ANNOTATION` with the pool
  node, whose virtual kubelet then offers other pods only the GPUs the group does not need
  (`vkprovider.remote.reservations`), and other groups are not released into them either. A group
  keeps a reservation at most `reserve_max_s`, then none for as long (pods that never end must not
  leave a pool's free GPUs idle for ever); the annotation goes when the group is released.

A pod outside an offloaded namespace, or one Kueue admits, is never gated (the webhook decides), so
this controller steps aside for them. Failing a placed group back whole when one of its twins is not
placed in time is the virtual kubelet's (`vkprovider.node.pods`: all pods of a group are on one pool
node, so on one virtual kubelet).

Does not: decide which pods form a group (`gpupool.gang.group_of`, at admission), or bind pods.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any

import structlog

from gpufed.apis.wire import (
    GANG_GATE,
    GANG_GROUP_ANNOTATION,
    GANG_LABEL,
    GANG_NODE_ANNOTATION,
    GANG_RESERVE_ANNOTATION,
    JOBSET_API_VERSION,
    TYPE_LABEL,
    VIRTUAL_NODE_TYPE,
)
from gpufed.kube import events, meta, rest
from gpufed.kube.client import KubeError
from gpufed.kube.times import rfc3339
from gpufed.kube.watch import watch
from gpupool.capacity import free_after
from gpupool.gang import (
    JOBSET_KIND,
    Decision,
    GroupError,
    Offer,
    Waiting,
    job_owner,
    jobset_owner,
    node_allows,
    place,
    reservations,
)
from vkprovider.forge.groups import size_of
from vkprovider.forge.offloading import gang_gated, gpus_of, pointer_segment
from vkprovider.forge.pods import HOSTNAME_LABEL, is_terminal
from vkprovider.forge.pools import figures_of, offer_of

COMPONENT = "gpufed-gang"
#: Pod condition saying whether the group was placed (and why not).
CONDITION = "gpufed.io/GangPlaced"
#: Seconds a burst of changes is gathered before the groups are looked at.
DEBOUNCE_S = 0.2
#: Seconds a released group's GPUs stay set aside while its pods are not bound yet.
RESERVE_S = 60.0
#: Seconds a waiting group holds a pool's GPUs back at most (then none for as long).
RESERVE_MAX_S = 300.0

Key = tuple[str, str]


@dataclass(frozen=True)
class GangSettings:
    debounce_s: float = DEBOUNCE_S
    reserve_s: float = RESERVE_S
    reserve_max_s: float = RESERVE_MAX_S
    #: Seconds between looks at the groups when nothing changed.
    recheck_s: float = 5.0


@dataclass
class _Released:
    node: str
    at: float
    #: the pods released (a Job's replacements of them are new pods, not these)
    pods: frozenset[str]


@dataclass(frozen=True)
class _Hold:
    """A waiting group's reservation: on which pool, since when, and (once held `reserve_max_s`)
    until when it may hold none."""

    node: str
    since: float
    paused_until: float = 0.0


def release_patch(pod: Mapping[str, Any], node: str) -> list[dict[str, Any]]:
    """The JSON patch that pins `pod` to `node` and removes the gang gate (failing, thanks to its
    `test`, if the gates changed meanwhile)."""
    spec = pod.get("spec") or {}
    gates = list(spec.get("schedulingGates") or [])
    rest_gates = [g for g in gates if g.get("name") != GANG_GATE]
    ops: list[dict[str, Any]] = [{"op": "test", "path": "/spec/schedulingGates", "value": gates}]
    if rest_gates:
        ops.append({"op": "replace", "path": "/spec/schedulingGates", "value": rest_gates})
    else:
        ops.append({"op": "remove", "path": "/spec/schedulingGates"})
    if spec.get("nodeSelector"):
        ops.append({"op": "add", "path": "/spec/nodeSelector/kubernetes.io~1hostname", "value": node})
    else:
        ops.append({"op": "add", "path": "/spec/nodeSelector", "value": {HOSTNAME_LABEL: node}})
    annotations = (pod.get("metadata") or {}).get("annotations")
    if annotations:
        at = "/metadata/annotations"
        ops.append({"op": "add", "path": f"{at}/{pointer_segment(GANG_NODE_ANNOTATION)}", "value": node})
        if GANG_RESERVE_ANNOTATION in annotations:
            ops.append({"op": "remove", "path": f"{at}/{pointer_segment(GANG_RESERVE_ANNOTATION)}"})
    else:
        ops.append({"op": "add", "path": "/metadata/annotations", "value": {GANG_NODE_ANNOTATION: node}})
    return ops


class GangController:
    """Places gated groups until cancelled."""

    def __init__(
        self, api: Any, settings: GangSettings | None = None, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.api = api
        self.settings = settings or GangSettings()
        self.clock = clock
        #: group (namespace, label) -> pod name -> pod (every pod with the label, gated or not)
        self.groups: dict[Key, dict[str, dict[str, Any]]] = {}
        #: virtual node name -> node
        self.nodes: dict[str, dict[str, Any]] = {}
        self.released: dict[Key, _Released] = {}
        #: waiting group -> (pool node, GPUs per pod) it holds back there, as of this or the last pass
        self.reserved: dict[Key, tuple[str, tuple[int, ...]]] = {}
        #: waiting group -> its reservation over time (since when, and the pause after it)
        self._holds: dict[Key, _Hold] = {}
        #: group -> the last reason reported, so a waiting group is reported once per change
        self.reported: dict[Key, str] = {}
        self.dirty = asyncio.Event()
        self._log = structlog.get_logger().bind(component="gang")

    # ---- caches

    def on_pod(self, event: str, pod: dict[str, Any]) -> None:
        label = meta.labels(pod).get(GANG_LABEL)
        if not label:
            return
        key = (meta.namespace(pod), label)
        members = self.groups.setdefault(key, {})
        if event == "DELETED":
            members.pop(meta.name(pod), None)
            if not members:
                self.groups.pop(key, None)
                self.released.pop(key, None)
                self.reported.pop(key, None)
                self.reserved.pop(key, None)
                self._holds.pop(key, None)
        else:
            members[meta.name(pod)] = pod
        self.dirty.set()

    def on_node(self, event: str, node: dict[str, Any]) -> None:
        if event == "DELETED":
            self.nodes.pop(meta.name(node), None)
        else:
            self.nodes[meta.name(node)] = node
        self.dirty.set()

    # ---- decisions

    def _unbound(self, key: Key, r: _Released) -> list[dict[str, Any]]:
        """The pods of a release that are still to be bound."""
        members = self.groups.get(key, {})
        return [
            p
            for name in sorted(r.pods)
            if (p := members.get(name)) is not None
            and not (p.get("spec") or {}).get("nodeName")
            and not is_terminal(p)
            and not meta.is_deleting(p)
        ]

    def expire(self, now: float) -> None:
        """Forget releases whose pods are all bound (or gone), or that are older than `reserve_s`."""
        for key, r in list(self.released.items()):
            if not self._unbound(key, r) or now - r.at > self.settings.reserve_s:
                del self.released[key]

    def offers(self, now: float, group: Key | None = None, *, reserved: bool = True) -> list[Offer]:
        """The pools, with the GPUs of released groups whose pods are not all bound set aside, and
        (`reserved`) those reserved for waiting groups other than `group`."""
        self.expire(now)
        pending: dict[str, list[int]] = {}
        for key, r in self.released.items():
            pending.setdefault(r.node, []).extend(gpus_of(p) for p in self._unbound(key, r))
        for key, (pool, gpus) in self.reserved.items() if reserved else ():
            if key != group:
                pending.setdefault(pool, []).extend(gpus)
        out: list[Offer] = []
        for name, node in self.nodes.items():
            figures = figures_of(node)
            offer = offer_of(figures) if figures is not None else None
            if offer is None or offer.node != name:
                continue
            held = pending.get(name, [])
            if held:
                free = None
                if offer.free_nodes is not None:
                    free = free_after(offer.free_nodes, held)
                offer = replace(offer, headroom=max(0, offer.headroom - sum(held)), free_nodes=free)
            out.append(offer)
        return out

    def decide(self, key: Key, now: float) -> tuple[Decision, list[dict[str, Any]], Waiting | None] | None:
        """The decision for one group, its gated pods, and (a complete group that no pool holds now
        but one could some day) what it waits for; None when there is nothing to decide."""
        members = self.groups.get(key, {})
        gated = [p for p in members.values() if gang_gated(p) and not meta.is_deleting(p)]
        if not gated or key in self.released:
            return None
        # pods of the group that were released and still run or wait there (the rest of a release
        # cut short, a Job's next pods beside those still running): the gated ones join them
        joined = sorted(
            {
                meta.annotations(p).get(GANG_NODE_ANNOTATION, "")
                for p in members.values()
                if not gang_gated(p) and not meta.is_deleting(p) and not is_terminal(p)
            }
            - {""}
        )
        if joined:
            gated.sort(key=meta.name)
            return self._join(key, joined[0], gated, now), gated, None
        sizes = [size_of(p) for p in gated]
        size = max(sizes, default=0)
        if len(gated) < size:
            return None  # the rest of the group is still being created
        gated.sort(key=meta.name)
        gated = gated[:size] if size else gated
        offers = [
            o
            for o in self.offers(now, key)
            if all(node_allows(p, o.node, meta.labels(self.nodes[o.node])) for p in gated)
        ]
        gpus = [gpus_of(p) for p in gated]
        decision = place(gpus, offers)
        waiting = None
        if decision.node is None and not decision.never:
            waiting = Waiting(key, self._since(key), tuple(gpus), frozenset(o.node for o in offers))
        return decision, gated, waiting

    def _join(self, key: Key, node: str, gated: list[dict[str, Any]], now: float) -> Decision:
        """Pods joining their group on `node`: released when that pool holds them now, else they wait
        there (never elsewhere: a group runs on one pool)."""
        gpus = [gpus_of(p) for p in gated]
        offer = next((o for o in self.offers(now, key) if o.node == node), None)
        if offer is None:
            return Decision(None, f"the group runs on {node}, which offers no GPU pool now")
        decision = place(gpus, [offer])
        if decision.node is not None:
            return Decision(node, f"the pods join their group on {node}")
        return Decision(
            None, f"the group runs on {node}; {len(gated)} more of its pods wait for it to hold them: {decision.reason}"
        )

    # ---- actions

    async def _release(self, key: Key, node: str, pods: list[dict[str, Any]], now: float) -> None:
        self.released[key] = _Released(node, now, frozenset(meta.name(p) for p in pods))
        for pod in pods:
            path = rest.path("v1", "pods", meta.name(pod), namespace=meta.namespace(pod))
            try:
                await rest.request(
                    self.api, "PATCH", path, body=release_patch(pod, node), content_type="application/json-patch+json"
                )
            except KubeError as e:
                if e.status != 404:
                    self._log.warning("gang pod not released", pod=meta.name(pod), error=str(e)[:200])
                    self.released.pop(key, None)
                    self.dirty.set()
                    return
        # Bound together, at once: left to the scheduler, the pods would be bound one by one as the
        # pool node's allocatable allows (one largest shape beyond what it holds), with other pods
        # taking the node in between. The scheduler binds whatever is not bound here (same node).
        for pod in pods:
            await self._bind(pod, node)
        self.reported.pop(key, None)
        self._log.info("gang released", namespace=key[0], group=_group_name(pods), node=node, pods=len(pods))

    async def _bind(self, pod: Mapping[str, Any], node: str) -> None:
        """Bind a released pod to its pool node (pods/binding); a pod the scheduler bound first, or that
        is gone, is fine, and any other refusal leaves the pod to the scheduler."""
        name, namespace = meta.name(pod), meta.namespace(pod)
        binding = {
            "apiVersion": "v1",
            "kind": "Binding",
            "metadata": {"name": name, "namespace": namespace, "uid": meta.uid(pod)},
            "target": {"apiVersion": "v1", "kind": "Node", "name": node},
        }
        try:
            await rest.create(self.api, rest.path("v1", "pods", name, namespace=namespace, sub="binding"), binding)
        except KubeError as e:
            if e.status not in (404, 409):
                self._log.warning("gang pod left to the scheduler", pod=name, error=str(e)[:200])

    async def _report(self, key: Key, decision: Decision, pods: list[dict[str, Any]]) -> None:
        reason = "NeverFits" if decision.never else "Waiting"
        if self.reported.get(key) == decision.reason:
            return
        self.reported[key] = decision.reason
        condition = {
            "type": CONDITION,
            "status": "False",
            "reason": reason,
            "message": decision.reason,
            "lastTransitionTime": _now(),
        }
        for pod in pods:
            path = rest.path("v1", "pods", meta.name(pod), namespace=meta.namespace(pod), sub="status")
            with contextlib.suppress(KubeError):
                await rest.strategic_patch(self.api, path, {"status": {"conditions": [condition]}})
        subject = await self._subject(pods[0])
        await events.emit(
            self.api,
            subject,
            type_="Warning",
            reason="GangUnplaceable" if decision.never else "GangWaiting",
            message=f"group {_group_name(pods)}: {decision.reason}",
            component=COMPONENT,
        )

    async def _subject(self, pod: Mapping[str, Any]) -> Mapping[str, Any]:
        """The group's JobSet or Job when one runs it (users look there), else the pod."""
        with contextlib.suppress(GroupError):
            ref = jobset_owner(pod)
            if ref is not None:
                path = rest.path(JOBSET_API_VERSION, "jobsets", ref.name, namespace=meta.namespace(pod))
                jobset = await rest.get(self.api, path)
                if jobset is not None:
                    return {**jobset, "apiVersion": JOBSET_API_VERSION, "kind": JOBSET_KIND}
        name = job_owner(pod)
        if name:
            job = await rest.get(self.api, rest.path("batch/v1", "jobs", name, namespace=meta.namespace(pod)))
            if job is not None:
                return {**job, "apiVersion": "batch/v1", "kind": "Job"}
        return {**pod, "apiVersion": "v1", "kind": "Pod"}

    async def reconcile(self) -> None:
        """One pass over the groups, the longest-waiting first: each is released, or waits (and may
        reserve a pool no older group reserved)."""
        now = self.clock()
        self.expire(now)
        for key, hold in list(self._holds.items()):
            if hold.paused_until and hold.paused_until <= now:
                del self._holds[key]  # its pause is over
        self.reserved = {}
        reports: list[tuple[Key, Decision, list[dict[str, Any]]]] = []
        for key in sorted(self.groups, key=lambda k: (self._since(k), k)):
            decided = self.decide(key, now)
            if decided is None:
                continue
            decision, pods, waits = decided
            if decision.node is None:
                if waits is not None:
                    self._reserve(waits, now)
                reports.append((key, decision, pods))
                continue
            self._holds.pop(key, None)
            try:
                await self._release(key, decision.node, pods, now)
            except KubeError as e:
                self._log.warning("gang not handled", group=key[1], error=str(e)[:200])
        for key, decision, pods in reports:
            if key in self.reserved:
                node, gpus = self.reserved[key]
                note = f"; {sum(gpus)} GPUs on {node} are held back for it as they free up"
                decision = replace(decision, reason=decision.reason + note)
            try:
                await self._report(key, decision, pods)
            except KubeError as e:
                self._log.warning("gang not handled", group=key[1], error=str(e)[:200])
        await self._mark_reservations()

    def _since(self, key: Key) -> str:
        """When the group's first pod was created (RFC 3339)."""
        return min(
            (str(meta.metadata(p).get("creationTimestamp") or "") for p in self.groups[key].values()), default=""
        )

    def _reserve(self, waiting: Waiting, now: float) -> None:
        """Reserve a pool for a waiting group, unless an older group reserved every pool it could use,
        or it held one for `reserve_max_s` and its pause is not over."""
        hold = self._holds.get(waiting.key)
        if hold is not None and hold.paused_until:
            return
        taken = {node for node, _ in self.reserved.values()}
        offers = [o for o in self.offers(now, reserved=False) if o.node not in taken]
        node = reservations([waiting], offers).get(waiting.key)
        if node is None:
            self._holds.pop(waiting.key, None)
            return
        if hold is None or hold.node != node:
            hold = _Hold(node, now)  # a new reservation, or on another pool
        if now - hold.since > self.settings.reserve_max_s:
            self._holds[waiting.key] = replace(hold, paused_until=now + self.settings.reserve_max_s)
            return
        self._holds[waiting.key] = hold
        self.reserved[waiting.key] = (node, waiting.gpus)

    async def _mark_reservations(self) -> None:
        """Mark the gated pods of the reserving groups with their pool (and unmark all others)."""
        for key, members in list(self.groups.items()):
            want = self.reserved[key][0] if key in self.reserved else None
            for pod in list(members.values()):
                if not gang_gated(pod) or meta.is_deleting(pod):
                    continue
                if meta.annotations(pod).get(GANG_RESERVE_ANNOTATION) == want:
                    continue
                path = rest.path("v1", "pods", meta.name(pod), namespace=meta.namespace(pod))
                mark = {"metadata": {"annotations": {GANG_RESERVE_ANNOTATION: want}}}
                try:
                    await rest.merge_patch(self.api, path, mark)
                except KubeError as e:
                    if e.status != 404:
                        self._log.warning("gang reservation not marked", pod=meta.name(pod), error=str(e)[:200])

    # ---- loops

    async def run(self) -> None:
        """Place groups until cancelled; an error ends no more than this pass (logged, started again
        after `recheck_s`), never the controller."""
        while True:
            try:
                await self._run()
            except* Exception as group:  # whatever fails here must not end the controller
                first = group.exceptions[0]
                self._log.warning("gang placement stopped", error=f"{type(first).__name__}: {first}"[:300])
            await asyncio.sleep(self.settings.recheck_s)

    async def _run(self) -> None:
        self.groups.clear()  # the watches list everything again
        self.nodes.clear()
        async with asyncio.TaskGroup() as tg:
            pods = {"labelSelector": GANG_LABEL}
            tg.create_task(watch(self.api, "/api/v1/pods", self.on_pod, what="gang pods", params=pods))
            tg.create_task(
                watch(
                    self.api,
                    "/api/v1/nodes",
                    self.on_node,
                    what="virtual nodes",
                    params={"labelSelector": f"{TYPE_LABEL}={VIRTUAL_NODE_TYPE}"},
                )
            )
            while True:
                # waiting groups are looked at again now and then (set-aside GPUs expire)
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(self.settings.recheck_s):
                        await self.dirty.wait()
                await asyncio.sleep(self.settings.debounce_s)
                self.dirty.clear()
                await self.reconcile()


def _group_name(pods: list[dict[str, Any]]) -> str:
    return meta.annotations(pods[0]).get(GANG_GROUP_ANNOTATION) or meta.labels(pods[0]).get(GANG_LABEL, "?")


def _now() -> str:
    return rfc3339(time.time())
