"""`UsageLedger`: running totals of what the consumer's pods hold on a provider's pool nodes.

A pool node advertises its provider's free capacity against what the consumer's pods already hold
there (`PoolView.node_state`, read at every node status write). Summing every bound pod at every
read costs O(pods) per read; at 10,000 pods it was half of the virtual kubelet's CPU. The ledger
keeps the sums instead, updated per pod event:

- a pod counts on its node from its first watch event bound there until it is released (its
  controller is about to end it: terminal, deleted, failed back), becomes terminal, or is gone;
  a released pod never counts again (released is final for a UID);
- `all` sums the counted pods of every pool node of the provider, `here` those of one node;
- a counted pod is *unsettled* until its twin is placed at the provider and a capacity snapshot has
  arrived `snapshot_lag_s` after that placement (before, the snapshot may still show its GPUs as
  free, so it counts in flight); each `usage` read looks at the unsettled pods of its node only,
  and a twin notification makes a pod unsettled again until it is checked once more.

Does not: watch anything (the pool manager feeds it the pod controllers' events, releases and twin
notifications), parse the provider's snapshot, or count DRA claims (`ClaimCache` does).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from peering.grants import pod_requests
from vkprovider.forge.pods import is_terminal
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
        #: node -> UIDs of counted pods to look at in the next read of that node.
        self._unsettled: dict[str, set[str]] = {}
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
        self._unsettled.setdefault(node, set()).add(uid)

    def release(self, uid: str) -> None:
        """The pod's controller is about to end it: it holds nothing from now on."""
        self._drop(uid)
        self._released.add(uid)

    def twin_changed(self, namespace: str, name: str) -> None:
        """The twin under this name changed: its pod is looked at again at the next read."""
        uid = self._by_key.get((namespace, name))
        if uid is not None:
            self._unsettled.setdefault(self._held[uid].node, set()).add(uid)

    def forget_node(self, node: str) -> None:
        """The node's pod controller stopped: none of its pods counts any more."""
        for uid in [u for u, h in self._held.items() if h.node == node]:
            self._drop(uid)
        self._here.pop(node, None)
        self._unsettled.pop(node, None)

    def _drop(self, uid: str) -> None:
        held = self._held.pop(uid, None)
        if held is None:
            return
        _add(self._all, held.requests, -1)
        _add(self._here.setdefault(held.node, {}), held.requests, -1)
        if self._by_key.get((held.namespace, held.name)) == uid:
            del self._by_key[(held.namespace, held.name)]
        self._unsettled.get(held.node, set()).discard(uid)

    # ---- reads

    def usage(
        self, node: str, twin_of: TwinOf, snapshot_at: float | None
    ) -> tuple[dict[str, Decimal], dict[str, Decimal], tuple[Resources, ...]]:
        """(all, here, in flight) for `node`. `twin_of` is that node's view of twins; `snapshot_at`
        the monotonic time the last capacity snapshot arrived (None: no capacity feed)."""
        in_flight: list[Resources] = []
        unsettled = self._unsettled.get(node, set())
        now = time.monotonic()
        for uid in list(unsettled):
            held = self._held[uid]
            twin = twin_of(held.namespace, held.name)
            if twin is None or twin.unplaced_since is not None:
                in_flight.append(held.requests)
                continue
            placed = self._placed_at.setdefault(uid, now)
            if snapshot_at is not None and snapshot_at < placed + self.snapshot_lag_s:
                in_flight.append(held.requests)
                continue
            unsettled.discard(uid)
        return (
            {r: v for r, v in self._all.items() if v},
            {r: v for r, v in self._here.get(node, {}).items() if v},
            tuple(in_flight),
        )
