"""`UsageLedger`: running totals of what the consumer's pods hold on a provider's pool nodes.

A pool node advertises its provider's free capacity against what the consumer's pods already hold
there (`PoolView.node_state`, read at every node status write). Summing every bound pod at every
read costs O(pods) per read; at 10,000 pods it was half of the virtual kubelet's CPU. The ledger
keeps the sums instead, updated per pod event:

- a pod counts on its node from its first watch event bound there until it is released (its
  controller is about to end it: terminal, deleted, failed back), becomes terminal, or is gone;
  a released pod never counts again (released is final for a UID);
- `all` sums the counted pods of every pool node of the provider, `here` those of one node;
- a counted pod is *in flight* until its twin is placed at the provider and a capacity snapshot has
  arrived `snapshot_lag_s` after that placement (before, the snapshot may still show its resources
  as free). The in-flight pods of each node are running totals too (`forge.pools.InFlight`): a read
  looks only at the pods whose twin changed since the last read (a new pod counts as changed) and
  at the placed ones whose snapshot has come, oldest placement first, so a burst of thousands of
  unplaced pods costs nothing per read.

Does not: watch anything (the pool manager feeds it the pod controllers' events, releases and twin
notifications), parse the provider's snapshot, or count DRA claims (`ClaimCache` does).
"""

from __future__ import annotations

import heapq
import time
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from gpufed.apis.pool import GPU_RESOURCE
from peering.grants import pod_requests
from vkprovider.forge.pods import is_terminal
from vkprovider.forge.pools import InFlight
from vkprovider.node.provider import Twin

Resources = Mapping[str, Decimal]
#: (namespace, name) -> the twin this pool node's view sees (None: none or another pool's).
TwinOf = Callable[[str, str], Twin | None]


@dataclass
class _Held:
    node: str
    namespace: str
    name: str
    requests: Resources


def _add(into: dict[str, Decimal], requests: Resources, sign: int) -> None:
    for r, v in requests.items():
        into[r] = into.get(r, Decimal(0)) + sign * v


class UsageLedger:
    def __init__(self, snapshot_lag_s: float) -> None:
        self.snapshot_lag_s = snapshot_lag_s
        self._held: dict[str, _Held] = {}
        self._all: dict[str, Decimal] = {}
        self._here: dict[str, dict[str, Decimal]] = {}
        #: UIDs that never count again (released or terminal), until their pod is gone.
        self._released: set[str] = set()
        #: node -> UIDs of counted pods to look at in the next read of that node (new, twin changed).
        self._changed: dict[str, set[str]] = {}
        #: node -> its in-flight pods (UIDs), their summed requests, and how many ask for n GPUs.
        self._flying: dict[str, set[str]] = {}
        self._flying_sum: dict[str, dict[str, Decimal]] = {}
        self._flying_gpus: dict[str, Counter[int]] = {}
        #: node -> (time placed, UID) of in-flight pods whose twin is placed: a heap, oldest first.
        self._landing: dict[str, list[tuple[float, str]]] = {}
        #: (namespace, name) -> UID of the counted pod under that name.
        self._by_key: dict[tuple[str, str], str] = {}
        #: UID -> monotonic time its twin was first seen placed.
        self._placed_at: dict[str, float] = {}

    def __len__(self) -> int:
        return len(self._held)

    # ---- changes

    def on_pod(self, node: str, kind: str, pod: Mapping[str, Any]) -> None:
        """A watch event of the pods bound to `node` (the watch of one pool node's pods)."""
        meta = pod["metadata"]
        uid = meta.get("uid")
        if not uid:
            return
        held = self._held.get(uid)
        if held is not None and held.node != node:
            return  # counted on another node: only that node's watch changes it
        if kind == "DELETED":
            self._drop(uid)
            self._released.discard(uid)
            self._placed_at.pop(uid, None)
            return
        if (pod.get("spec") or {}).get("nodeName") != node or is_terminal(pod):
            self._drop(uid)
            if is_terminal(pod):
                self._released.add(uid)
            return
        if uid in self._released:
            return
        requests = pod_requests(pod)
        if held is not None and held.requests == requests:
            return
        self._drop(uid)
        entry = _Held(node, meta["namespace"], meta["name"], requests)
        self._held[uid] = entry
        _add(self._all, requests, 1)
        _add(self._here.setdefault(node, {}), requests, 1)
        self._by_key[(entry.namespace, entry.name)] = uid
        self._fly(uid, entry)
        self._changed.setdefault(node, set()).add(uid)

    def release(self, uid: str) -> None:
        """The pod's controller is about to end it: it holds nothing from now on."""
        self._drop(uid)
        self._released.add(uid)

    def twin_changed(self, namespace: str, name: str) -> None:
        """The twin under this name changed: its pod is looked at again at the next read."""
        uid = self._by_key.get((namespace, name))
        if uid is not None:
            self._changed.setdefault(self._held[uid].node, set()).add(uid)

    def forget_node(self, node: str) -> None:
        """The node's pod controller stopped: none of its pods counts any more."""
        for uid in [u for u, h in self._held.items() if h.node == node]:
            self._drop(uid)
        for per_node in (self._here, self._changed, self._flying, self._flying_sum, self._flying_gpus, self._landing):
            per_node.pop(node, None)

    def _drop(self, uid: str) -> None:
        held = self._held.pop(uid, None)
        if held is None:
            return
        self._land(uid, held)
        _add(self._all, held.requests, -1)
        _add(self._here.setdefault(held.node, {}), held.requests, -1)
        if self._by_key.get((held.namespace, held.name)) == uid:
            del self._by_key[(held.namespace, held.name)]
        self._changed.get(held.node, set()).discard(uid)

    def _fly(self, uid: str, held: _Held) -> None:
        """Count the pod in flight on its node (once)."""
        flying = self._flying.setdefault(held.node, set())
        if uid in flying:
            return
        flying.add(uid)
        _add(self._flying_sum.setdefault(held.node, {}), held.requests, 1)
        gpus = int(held.requests.get(GPU_RESOURCE, Decimal(0)))
        if gpus > 0:
            self._flying_gpus.setdefault(held.node, Counter())[gpus] += 1

    def _land(self, uid: str, held: _Held) -> None:
        """The pod no longer counts in flight on its node."""
        flying = self._flying.get(held.node)
        if flying is None or uid not in flying:
            return
        flying.discard(uid)
        _add(self._flying_sum.setdefault(held.node, {}), held.requests, -1)
        gpus = int(held.requests.get(GPU_RESOURCE, Decimal(0)))
        if gpus > 0:
            counter = self._flying_gpus[held.node]
            counter[gpus] -= 1
            if counter[gpus] <= 0:
                del counter[gpus]

    # ---- reads

    def usage(self, node: str, twin_of: TwinOf, snapshot_at: float | None) -> tuple[Resources, Resources, InFlight]:
        """(all, here, in flight) for `node`. `twin_of` is that node's view of twins; `snapshot_at`
        the monotonic time the last capacity snapshot arrived (None: no capacity feed)."""
        now = time.monotonic()
        landing = self._landing.setdefault(node, [])
        for uid in self._changed.pop(node, ()):
            self._check(uid, twin_of, snapshot_at, now, landing)
        if snapshot_at is not None:
            while landing and landing[0][0] + self.snapshot_lag_s <= snapshot_at:
                _, uid = heapq.heappop(landing)
                self._check(uid, twin_of, snapshot_at, now, landing)
        gpus = self._flying_gpus.get(node) or Counter()
        in_flight = InFlight(
            pods=len(self._flying.get(node, ())),
            requests={r: v for r, v in self._flying_sum.get(node, {}).items() if v},
            gpus=tuple(sorted(gpus.elements(), reverse=True)),
        )
        return (
            {r: v for r, v in self._all.items() if v},
            {r: v for r, v in self._here.get(node, {}).items() if v},
            in_flight,
        )

    def _check(
        self, uid: str, twin_of: TwinOf, snapshot_at: float | None, now: float, landing: list[tuple[float, str]]
    ) -> None:
        """Whether the counted pod `uid` is in flight, from its twin as the node's view sees it now."""
        held = self._held.get(uid)
        if held is None:
            return  # gone since it was queued
        twin = twin_of(held.namespace, held.name)
        if twin is None or twin.unplaced_since is not None:
            self._fly(uid, held)
            return
        placed = self._placed_at.setdefault(uid, now)
        if snapshot_at is None or snapshot_at >= placed + self.snapshot_lag_s:
            self._land(uid, held)
            return
        self._fly(uid, held)
        heapq.heappush(landing, (placed, uid))
