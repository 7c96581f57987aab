"""UsageLedger: its running totals, in-flight ones included, equal a full recount after any sequence
of pod events, releases, twin changes and reads, and only pods whose twin is not placed, or placed
after the last snapshot, count in flight."""

from __future__ import annotations

import time
from decimal import Decimal
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from peering.grants import pod_requests
from vkprovider.forge.pools import InFlight
from vkprovider.node.provider import Twin
from vkprovider.remote.usage import UsageLedger

NODES = ("pool-a", "pool-b")


def pod(uid: str, node: str | None, gpus: int, cpu: str = "1", phase: str = "Running") -> dict[str, Any]:
    return {
        "metadata": {"uid": uid, "namespace": "team", "name": f"p-{uid}"},
        "spec": {
            "nodeName": node,
            "containers": [{"name": "c", "resources": {"requests": {"cpu": cpu, "nvidia.com/gpu": str(gpus)}}}],
        },
        "status": {"phase": phase},
    }


def twin(uid: str, placed: bool) -> Twin:
    return Twin("team", f"p-{uid}", uid, False, False, unplaced_since=None if placed else time.time())


def test_a_pod_counts_from_its_first_event_until_it_is_released_or_ends() -> None:
    ledger = UsageLedger(snapshot_lag_s=0.0)
    ledger.on_pod("pool-a", "ADDED", pod("1", "pool-a", 2))
    ledger.on_pod("pool-b", "ADDED", pod("2", "pool-b", 4))
    total, here, in_flight = ledger.usage("pool-a", lambda ns, name: None, None)
    assert total["nvidia.com/gpu"] == 6 and here["nvidia.com/gpu"] == 2
    assert in_flight.pods == 1 and in_flight.gpus == (2,)  # no twin yet

    ledger.release("1")
    ledger.on_pod("pool-a", "MODIFIED", pod("1", "pool-a", 2))  # the watch still shows it Running
    total, here, _ = ledger.usage("pool-a", lambda ns, name: None, None)
    assert total["nvidia.com/gpu"] == 4 and "nvidia.com/gpu" not in here

    ledger.on_pod("pool-b", "MODIFIED", pod("2", "pool-b", 4, phase="Succeeded"))
    assert ledger.usage("pool-b", lambda ns, name: None, None)[0] == {}
    ledger.on_pod("pool-b", "DELETED", pod("2", "pool-b", 4, phase="Succeeded"))
    assert len(ledger) == 0


def test_another_nodes_watch_never_changes_what_a_pod_counts_on_its_own_node() -> None:
    ledger = UsageLedger(snapshot_lag_s=0.0)
    ledger.on_pod("pool-a", "ADDED", pod("1", "pool-a", 2))
    ledger.on_pod("pool-b", "DELETED", pod("1", "pool-a", 2))
    ledger.on_pod("pool-b", "MODIFIED", pod("1", "pool-b", 2))
    assert ledger.usage("pool-a", lambda ns, name: None, None)[1] == pod_requests(pod("1", "pool-a", 2))


def test_a_placed_twin_counts_in_flight_until_a_snapshot_after_its_placement() -> None:
    ledger = UsageLedger(snapshot_lag_s=0.2)
    ledger.on_pod("pool-a", "ADDED", pod("1", "pool-a", 2))
    placed = {"p-1": twin("1", placed=True)}
    before = time.monotonic()
    assert ledger.usage("pool-a", lambda ns, name: placed.get(name), before)[2].pods == 1  # snapshot too old
    assert ledger.usage("pool-a", lambda ns, name: placed.get(name), time.monotonic() + 1)[2] == InFlight()
    # landed: no longer looked at, even with an old snapshot time
    assert ledger.usage("pool-a", lambda ns, name: placed.get(name), before)[2] == InFlight()
    # the twin changes (e.g. the provider lost it): looked at again
    placed["p-1"] = twin("1", placed=False)
    ledger.twin_changed("team", "p-1")
    flight = ledger.usage("pool-a", lambda ns, name: placed.get(name), time.monotonic() + 1)[2]
    assert flight.pods == 1 and flight.requests["nvidia.com/gpu"] == 2


def test_placed_pods_land_oldest_first_as_snapshots_arrive() -> None:
    ledger = UsageLedger(snapshot_lag_s=0.2)
    twins: dict[str, Twin] = {}
    for uid in "12":
        ledger.on_pod("pool-a", "ADDED", pod(uid, "pool-a", int(uid)))
    t0 = time.monotonic()
    assert ledger.usage("pool-a", lambda ns, name: twins.get(name), t0)[2].gpus == (2, 1)  # no twins
    twins["p-1"] = twin("1", placed=True)
    ledger.twin_changed("team", "p-1")
    assert ledger.usage("pool-a", lambda ns, name: twins.get(name), t0)[2].gpus == (2, 1)  # placed, no snapshot since
    first_placed_by = time.monotonic()
    time.sleep(0.01)
    twins["p-2"] = twin("2", placed=True)
    ledger.twin_changed("team", "p-2")
    assert ledger.usage("pool-a", lambda ns, name: twins.get(name), t0)[2].pods == 2
    # a snapshot `lag` after the first placement but before `lag` after the second: only the first lands
    flight = ledger.usage("pool-a", lambda ns, name: twins.get(name), first_placed_by + 0.2)[2]
    assert flight.gpus == (2,) and flight.requests["cpu"] == 1 and flight.pods == 1
    flight = ledger.usage("pool-a", lambda ns, name: twins.get(name), time.monotonic() + 1)[2]
    assert flight == InFlight()


def test_a_stopped_pool_node_counts_nothing() -> None:
    ledger = UsageLedger(snapshot_lag_s=0.0)
    ledger.on_pod("pool-a", "ADDED", pod("1", "pool-a", 2))
    ledger.on_pod("pool-b", "ADDED", pod("2", "pool-b", 1))
    ledger.forget_node("pool-a")
    total, here, in_flight = ledger.usage("pool-a", lambda ns, name: None, None)
    assert total["nvidia.com/gpu"] == 1 and here == {} and in_flight == InFlight()


step = st.one_of(
    st.tuples(
        st.just("event"),
        st.sampled_from(NODES),
        st.sampled_from(("ADDED", "MODIFIED", "DELETED")),
        st.sampled_from("12345"),
        st.sampled_from((*NODES, None)),
        st.integers(0, 8),
        st.sampled_from(("Pending", "Running", "Succeeded", "Failed")),
    ),
    st.tuples(st.just("release"), st.sampled_from("12345")),
    st.tuples(st.just("twin"), st.sampled_from("12345"), st.sampled_from((True, False, None))),
    st.tuples(st.just("read"), st.sampled_from(NODES)),
)


@settings(max_examples=300, deadline=None)
@given(st.lists(step, max_size=40))
def test_running_totals_equal_a_full_recount(steps: list[tuple[Any, ...]]) -> None:
    ledger = UsageLedger(snapshot_lag_s=0.0)
    # The reference: each node's watch cache (what its controller lists) and the released UIDs.
    caches: dict[str, dict[str, dict[str, Any]]] = {n: {} for n in NODES}
    released: set[str] = set()
    # The twins the provider shows (no snapshot feed: a placed twin lands at once).
    twins: dict[str, Twin] = {}

    def twin_of(namespace: str, name: str) -> Twin | None:
        return twins.get(name.removeprefix("p-"))

    for s in steps:
        if s[0] == "release":
            ledger.release(s[1])
            released.add(s[1])
            continue
        if s[0] == "twin":
            if s[2] is None:
                twins.pop(s[1], None)
            else:
                twins[s[1]] = twin(s[1], placed=s[2])
            ledger.twin_changed("team", f"p-{s[1]}")
            continue
        if s[0] == "read":
            ledger.usage(s[1], twin_of, None)
            continue
        _, watcher, kind, uid, node, gpus, phase = s
        p = pod(uid, node, gpus, phase=phase)
        if node != watcher and kind != "DELETED":
            continue  # a field-selected watch never shows a pod bound elsewhere
        if kind == "DELETED":
            if caches[watcher].pop(uid, None) is None:
                continue
            p = pod(uid, watcher, gpus, phase=phase)
            released.discard(uid)
        else:
            if any(uid in caches[n] for n in NODES if n != watcher):
                continue  # a UID is bound to one node for its life
            caches[watcher][uid] = p
            if phase in ("Succeeded", "Failed"):
                released.add(uid)
        ledger.on_pod(watcher, kind, p)
    counted = {
        n: [p for uid, p in caches[n].items() if uid not in released and p["status"]["phase"] in ("Pending", "Running")]
        for n in NODES
    }
    for n in NODES:
        want_here: dict[str, Decimal] = {}
        for p in counted[n]:
            for r, v in pod_requests(p).items():
                want_here[r] = want_here.get(r, Decimal(0)) + v
        want_all: dict[str, Decimal] = {}
        for m in NODES:
            for p in counted[m]:
                for r, v in pod_requests(p).items():
                    want_all[r] = want_all.get(r, Decimal(0)) + v
        total, here, in_flight = ledger.usage(n, twin_of, None)
        assert here == {r: v for r, v in want_here.items() if v}
        assert total == {r: v for r, v in want_all.items() if v}
        unplaced = [
            p
            for p in counted[n]
            if (t := twin_of("team", p["metadata"]["name"])) is None or t.unplaced_since is not None
        ]
        assert in_flight == InFlight.of([pod_requests(p) for p in unplaced])
