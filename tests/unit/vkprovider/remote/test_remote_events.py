"""`remote.remote_events`: the provider's Events about twins reach the local pods, bounded by the
relay — first `RemoteEvents` alone, with a relay nobody runs (what it offers stays in the queue),
then through a running `RemoteProvider` between two fake API servers."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pytest

from gpufed.apis.wire import ORIGIN_CLUSTER_LABEL, ORIGIN_UID_LABEL
from tests.unit.fakes import until
from tests.unit.vkprovider.remote.worlds import CONSUMER, PROVIDER, World, world_of
from vkprovider.remote.events_relay import EventRelay, RelayLimits, Resolve, combined
from vkprovider.remote.remote_events import RemoteEvents

TWIN_NS = f"team-{CONSUMER}"


def twin_pod(name: str = "train") -> dict[str, Any]:
    labels = {ORIGIN_CLUSTER_LABEL: CONSUMER, ORIGIN_UID_LABEL: f"uid-{name}"}
    return {"kind": "Pod", "metadata": {"namespace": TWIN_NS, "name": name, "labels": labels}}


def remote_event(i: int, reason: str = "BackOff", type_: str = "Warning", pod: str = "train") -> dict[str, Any]:
    return {
        "kind": "Event",
        "metadata": {"namespace": TWIN_NS, "name": f"{pod}.{i}"},
        "involvedObject": {"kind": "Pod", "namespace": TWIN_NS, "name": pod},
        "reason": reason,
        "type": type_,
        "message": f"message {i}",
    }


# ---------------------------------------------------------------- RemoteEvents alone


class Recorder(EventRelay):
    """A relay nobody runs that remembers what it was offered."""

    def __init__(self) -> None:
        super().__init__(None, PROVIDER, "test")
        self.offered: list[tuple[Mapping[str, Any], str, str, str]] = []

    def offer(
        self, obj: Mapping[str, Any], *, type_: str, reason: str, message: str, resolve: Resolve | None = None
    ) -> bool:
        self.offered.append((obj, type_, reason, message))
        return super().offer(obj, type_=type_, reason=reason, message=message, resolve=resolve)


def mirror(relay: EventRelay, twins: Mapping[tuple[str, str], Mapping[str, Any]] | None = None) -> RemoteEvents:
    known = {("team", "train"): twin_pod()} if twins is None else twins
    return RemoteEvents(None, PROVIDER, relay, {TWIN_NS: "team"}.get, lambda ns, name: known.get((ns, name)))


def test_a_new_event_of_a_twin_is_offered_about_its_local_pod() -> None:
    relay = Recorder()
    mirror(relay).on_event("ADDED", remote_event(1))
    ((obj, type_, reason, message),) = relay.offered
    local = {"namespace": "team", "name": "train", "uid": "uid-train"}
    assert obj == {"apiVersion": "v1", "kind": "Pod", "metadata": local}
    assert (type_, reason, message) == ("Warning", "BackOff", f"message 1 (on {PROVIDER})")
    assert relay.pending() == 1


@pytest.mark.parametrize(
    ("kind", "event"),
    [
        ("SYNC", remote_event(1)),  # the history a relist replays
        ("DELETED", remote_event(1)),
        ("ADDED", remote_event(1, reason="Scheduled")),  # the consumer's scheduler said so already
        ("ADDED", remote_event(1, pod="not-a-twin")),
        ("ADDED", {**remote_event(1), "involvedObject": {"kind": "Pod", "namespace": "other", "name": "train"}}),
        ("ADDED", {**remote_event(1), "involvedObject": {"kind": "Secret", "namespace": TWIN_NS, "name": "train"}}),
    ],
    ids=["replayed", "deleted", "scheduled", "unknown-twin", "unfollowed-namespace", "not-a-pod"],
)
def test_what_is_not_mirrored(kind: str, event: dict[str, Any]) -> None:
    relay = Recorder()
    mirror(relay).on_event(kind, event)
    assert relay.offered == [] and relay.pending() == 0


def test_a_flood_costs_at_most_the_relays_queue() -> None:
    relay = EventRelay(None, PROVIDER, "test", RelayLimits(capacity=5, burst=10**6, total_burst=10**6))
    twins = {("team", f"p{i}"): twin_pod(f"p{i}") for i in range(1000)}
    events = mirror(relay, twins)
    for i in range(1000):
        events.on_event("ADDED", remote_event(i, pod=f"p{i}"))
    assert relay.pending() == 5 and relay.dropped["queue_full"] == 995


# ---------------------------------------------------------------- through a running RemoteProvider


EVENTS_PATH = f"/api/v1/namespaces/{TWIN_NS}/events"


async def offloaded_with_a_twin(w: World) -> None:
    """A twin of team/train, and the twin namespace's Events listed (what comes later is new)."""
    w.offload("team", PROVIDER)
    w.claim("team")
    w.remote.create("pods", twin_pod())
    await until(lambda: w.provider.twin("team", "train") is not None, what="the twin")
    await until(lambda: bool(w.remote.calls("GET", EVENTS_PATH)), what="the Events listed")


async def test_a_flood_of_provider_events_for_one_twin_makes_a_bounded_number_of_consumer_events(world: World) -> None:
    await offloaded_with_a_twin(world)
    for i in range(2000):
        world.remote.create("events", remote_event(i, reason=f"Reason{i % 50}"))
    limits = world.provider.events.limits
    await until(lambda: world.provider.events.dropped["rate_limited"] >= 2000 - limits.burst, what="the flood seen")
    await world.provider.events.flushed()
    relayed = [e for e in world.local.items("events", "team") if e["involvedObject"]["kind"] == "Pod"]
    assert 0 < len(relayed) <= limits.burst
    assert {e["involvedObject"]["uid"] for e in relayed} == {"uid-train"}


async def test_relayed_events_of_one_reason_are_combined_on_one_counted_event() -> None:
    async with world_of(event_limits=RelayLimits(burst=40, max_similar=3)) as w:
        await offloaded_with_a_twin(w)
        for i in range(30):
            w.remote.create("events", remote_event(i))
        await until(lambda: sum(e.get("count", 0) for e in w.events("team", "BackOff")) == 30, what="all counted")
        backoffs = w.events("team", "BackOff")
        assert len(backoffs) == 4  # three shown as they are, then one combined Event counting the rest
        (summary,) = [e for e in backoffs if e["message"] == combined("BackOff")]
        assert summary["count"] == 27


async def test_a_relayed_event_keeps_to_the_reasons_and_types_kubernetes_writes(world: World) -> None:
    await offloaded_with_a_twin(world)
    world.remote.create("events", remote_event(1, reason="../../etc passwd", type_="Critical"))
    await until(lambda: bool(world.events("team", "Remote")), what="the relayed Event")
    (event,) = world.events("team", "Remote")
    assert event["type"] == "Normal" and event["message"] == f"message 1 (on {PROVIDER})"


async def test_events_of_other_objects_than_pods_are_not_even_watched(world: World) -> None:
    await offloaded_with_a_twin(world)
    reads = world.remote.calls("GET", EVENTS_PATH)
    assert reads and all(r.query.get("fieldSelector") == "involvedObject.kind=Pod" for r in reads)
