"""`EventRelay`: what a provider's flood of Events costs the consumer is bounded — one queue of
`capacity`, per-object and total rate limits, similar Events of one object combined onto one counted
Event, per-object state for at most `max_objects` objects — and every drop is counted."""

from __future__ import annotations

from typing import Any

from prometheus_client import REGISTRY

from tests.unit.fakes import running, serve
from vkprovider.remote.events_relay import QUEUE_FULL, RATE_LIMITED, EventRelay, RelayLimits, combined, object_key


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def pod(name: str = "train", uid: str | None = None) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"namespace": "team", "name": name, "uid": uid or f"u-{name}"},
    }


def dropped(remote: str, cause: str) -> float:
    return (
        REGISTRY.get_sample_value("gpufed_relayed_events_dropped_total", {"remote_cluster": remote, "cause": cause})
        or 0.0
    )


async def test_five_thousand_events_for_one_pod_make_a_bounded_number_of_consumer_events() -> None:
    limits = RelayLimits(burst=25, max_similar=10)
    async with serve() as (local, api):
        relay = EventRelay(api, "flood-a", "test", limits)
        before = dropped("flood-a", RATE_LIMITED)
        async with running(relay.run()):
            for i in range(5000):
                relay.offer(pod(), type_="Warning", reason="BackOff", message=f"back-off {i}")
            await relay.flushed()
        recorded = local.items("events", "team")
        # 10 distinct messages, then the combined one counted on one Event: 11 objects for 25 offers.
        assert len(recorded) == limits.max_similar + 1
        (summary,) = [e for e in recorded if e["message"] == combined("BackOff")]
        assert summary["count"] == limits.burst - limits.max_similar
        assert relay.dropped[RATE_LIMITED] == 5000 - limits.burst
        assert dropped("flood-a", RATE_LIMITED) - before == 5000 - limits.burst
        # Every recorded Event names the pod: nothing is recorded on another object.
        assert {e["involvedObject"]["uid"] for e in recorded} == {"u-train"}


async def test_varying_the_reason_does_not_escape_the_per_pod_limit() -> None:
    async with serve() as (local, api):
        relay = EventRelay(api, "flood-b", "test", RelayLimits(burst=25))
        async with running(relay.run()):
            accepted = sum(relay.offer(pod(), type_="Normal", reason=f"R{i}", message="m") for i in range(5000))
            await relay.flushed()
        assert accepted == 25
        assert len(local.items("events", "team")) == 25


def test_the_queue_is_bounded_and_a_full_queue_drops() -> None:
    relay = EventRelay(None, "flood-c", "test", RelayLimits(capacity=3))
    before = dropped("flood-c", QUEUE_FULL)
    results = [relay.offer(pod(f"p{i}"), type_="Normal", reason="Pulled", message="m") for i in range(10)]
    assert results == [True] * 3 + [False] * 7
    assert relay.pending() == 3
    assert dropped("flood-c", QUEUE_FULL) - before == 7


def test_an_object_gets_one_more_event_per_refill_and_similar_ones_are_combined_in_a_window() -> None:
    clock = Clock()
    relay = EventRelay(
        None, "flood-d", "test", RelayLimits(burst=2, refill_s=60, max_similar=1, window_s=600), clock=clock
    )
    assert relay.offer(pod(), type_="Normal", reason="Pulling", message="a")
    assert relay.offer(pod(), type_="Normal", reason="Pulling", message="b")
    assert not relay.offer(pod(), type_="Normal", reason="Pulling", message="c")
    clock.now += 60
    assert relay.offer(pod(), type_="Normal", reason="Pulling", message="d")
    messages = [relay._queue.get_nowait().message for _ in range(relay.pending())]
    assert messages == ["a", combined("Pulling"), combined("Pulling")]
    clock.now += 601  # a new window: the next distinct message is shown again
    assert relay.offer(pod(), type_="Normal", reason="Pulling", message="e")
    assert relay._queue.get_nowait().message == "e"


def test_the_whole_relay_has_a_rate_limit_too() -> None:
    relay = EventRelay(None, "flood-e", "test", RelayLimits(total_burst=5, total_per_s=0.001, capacity=100))
    accepted = sum(relay.offer(pod(f"p{i}"), type_="Normal", reason="Pulled", message="m") for i in range(50))
    assert accepted == 5


def test_per_object_state_is_bounded() -> None:
    relay = EventRelay(None, "flood-f", "test", RelayLimits(max_objects=100, capacity=1, total_burst=10**6))
    for i in range(10_000):
        relay.offer(pod(f"p{i}"), type_="Normal", reason="Pulled", message="m")
    assert len(relay._objects) == 100


async def test_an_unresolved_object_gets_no_event() -> None:
    async with serve() as (local, api):
        relay = EventRelay(api, "flood-g", "test")

        async def gone() -> None:
            return None

        async with running(relay.run()):
            relay.offer(
                {"kind": "ForeignCluster", "metadata": {"name": "x"}},
                type_="Warning",
                reason="R",
                message="m",
                resolve=gone,
            )
            await relay.flushed()
        assert local.items("events") == []


def test_objects_without_a_uid_are_told_apart_by_kind_namespace_and_name() -> None:
    assert object_key({"kind": "ForeignCluster", "metadata": {"name": "gpu-a"}}) == "ForeignCluster//gpu-a"
    assert object_key(pod(uid="abc")) == "abc"
