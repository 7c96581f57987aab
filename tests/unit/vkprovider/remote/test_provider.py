"""`RemoteProvider` against two fake API servers (consumer and provider), as a malicious provider
would drive it: TwinNamespaces it writes are only claims (the consumer's NamespaceOffloadings
decide), its node labels are allow-listed, the addresses it reports for twins are checked, and a
pod naming objects by invalid names is refused before anything is read for it."""

from __future__ import annotations

from typing import Any

import pytest

from gpufed.apis.meta import API_VERSION
from gpufed.apis.wire import (
    ORIGIN_CLUSTER_LABEL,
    ORIGIN_UID_LABEL,
)
from tests.unit.fakes import until
from tests.unit.vkprovider.remote.worlds import CONSUMER, PROVIDER, TENANT, World, pod, world_of
from vkprovider.node.provider import ProviderError
from vkprovider.remote.events_relay import RelayLimits, combined
from vkprovider.remote.provider import RemoteProvider, RemoteSettings


async def test_a_pod_naming_a_secret_outside_its_namespace_is_refused_before_any_read(world: World) -> None:
    world.offload("team", PROVIDER)
    world.claim("team")
    await until(lambda: "team" in world.provider.twin_ns, what="the twin namespace")
    before = len(world.local.requests)
    with pytest.raises(ProviderError) as refused:
        await world.provider.create_pod(pod("team", imagePullSecrets=[{"name": "../../gpufed/secrets/x"}]))
    assert refused.value.reason == "InvalidName" and not refused.value.retry
    assert "../../gpufed/secrets/x" in str(refused.value)
    assert world.local.requests[before:] == []
    assert world.remote.items("pods") == []


def test_twin_names_from_the_provider_must_be_kubernetes_names() -> None:
    provider = RemoteProvider(None, None, RemoteSettings(CONSUMER, PROVIDER, "gpufed-gpu-a"))
    provider.local_ns[f"team-{CONSUMER}"] = "team"
    labels = {ORIGIN_CLUSTER_LABEL: CONSUMER, ORIGIN_UID_LABEL: "u"}
    provider._on_twin("ADDED", {"metadata": {"namespace": f"team-{CONSUMER}", "name": "../x", "labels": labels}})
    assert provider.twins() == []


# ---------------------------------------------------------------- the provider's Events


def twin_pod(name: str = "train") -> dict[str, Any]:
    labels = {ORIGIN_CLUSTER_LABEL: CONSUMER, ORIGIN_UID_LABEL: f"uid-{name}"}
    return {"kind": "Pod", "metadata": {"namespace": f"team-{CONSUMER}", "name": name, "labels": labels}}


def remote_event(i: int, reason: str = "BackOff", type_: str = "Warning", pod: str = "train") -> dict[str, Any]:
    return {
        "kind": "Event",
        "metadata": {"namespace": f"team-{CONSUMER}", "name": f"{pod}.{i}"},
        "involvedObject": {"kind": "Pod", "namespace": f"team-{CONSUMER}", "name": pod},
        "reason": reason,
        "type": type_,
        "message": f"message {i}",
    }


EVENTS_PATH = f"/api/v1/namespaces/team-{CONSUMER}/events"


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


async def test_the_ingress_annotations_a_provider_publishes_reach_reflection(world: World) -> None:
    world.offload("team", PROVIDER)
    obj = {
        "kind": "TwinNamespace",
        "metadata": {"name": "team", "namespace": TENANT},
        "spec": {"namespace": "team"},
        "status": {"phase": "Ready", "twin": f"team-{CONSUMER}", "ingressAnnotations": ["example.com/*"]},
    }
    world.remote.create("twinnamespaces", obj, API_VERSION)
    await until(lambda: world.reflection.ingress_annotations.get("team") == ["example.com/*"], what="published")
    world.claim("other")
    world.offload("other", PROVIDER)
    await until(lambda: "other" in world.reflection.started, what="the second namespace")
    assert world.reflection.ingress_annotations["other"] is None, "nothing published: nothing allowed beyond the class"
