"""`GangReservations`: the GPUs the gang controller holds back on pool nodes for a waiting group.

A group waits gated until one pool holds all of its pods at once. Meanwhile pods that are bound one
by one would take each GPU the pool frees, and a group that needs two whole provider nodes could
wait for ever. So the gang controller reserves a pool for the group that has waited longest, by
annotating that group's gated pods with `GANG_RESERVE_ANNOTATION` (the pool node). This watch keeps,
per pool node, the GPUs each of those pods asks for; the pool's node status offers other pods only
what is left once they are placed (`forge.pools.advertise`, `reserved`), so the freed GPUs wait
for the group.

Owns: one watch of the consumer's unbound group pods (label `GANG_LABEL`, no `spec.nodeName`;
a pod leaves it when it is bound), and `reserved(node)`. Listeners are told when a node's
reservation changes.

Trust: the pods are the consumer's own. A user who annotates a pod of theirs holds back at most the
GPUs that pod requests, which their namespace's quota already counts while it is pending. A pod
being deleted, finished, or without the group gate holds nothing.

Does not: choose which group is reserved, or where (`vkprovider.gangs`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from gpufed.apis.wire import GANG_LABEL, GANG_RESERVE_ANNOTATION
from gpufed.kube import meta
from gpufed.kube.watch import watch
from vkprovider.forge.offloading import gang_gated, gpus_of
from vkprovider.forge.pods import is_terminal

#: Told the pool node whose reservation changed.
Listener = Callable[[str], None]


def reserved_on(pod: Mapping[str, Any]) -> str | None:
    """The pool node a gated group pod holds GPUs on (None: none)."""
    node = meta.annotations(pod).get(GANG_RESERVE_ANNOTATION)
    if not node or (pod.get("spec") or {}).get("nodeName") or meta.is_deleting(pod) or is_terminal(pod):
        return None
    return str(node) if gang_gated(pod) else None


class GangReservations:
    def __init__(self, api: Any) -> None:
        self.api = api
        #: pod UID -> (pool node, GPUs the pod asks for)
        self._pods: dict[str, tuple[str, int]] = {}
        self.listeners: list[Listener] = []

    def reserved(self, node: str) -> tuple[int, ...]:
        """GPUs per pod held back on `node`, largest first."""
        return tuple(sorted((g for n, g in self._pods.values() if n == node and g > 0), reverse=True))

    def on_pod(self, kind: str, pod: Mapping[str, Any]) -> None:
        uid = meta.uid(pod)
        if not uid:
            return
        before = self._pods.pop(uid, None)
        node = None if kind == "DELETED" else reserved_on(pod)
        if node is not None:
            try:
                gpus = gpus_of(pod)
            except (ValueError, ArithmeticError):  # a malformed pod holds nothing
                gpus = 0
            self._pods[uid] = (node, gpus)
        now = self._pods.get(uid)
        if now == before:
            return
        for changed in {x[0] for x in (before, now) if x is not None}:
            for listener in self.listeners:
                listener(changed)

    async def run(self) -> None:
        await watch(
            self.api,
            "/api/v1/pods",
            self.on_pod,
            what="reserving group pods",
            params={"labelSelector": GANG_LABEL, "fieldSelector": "spec.nodeName="},
        )
