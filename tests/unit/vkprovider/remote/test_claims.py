"""`remote.claims`: TwinNamespaces a provider writes are only claims; the consumer's
NamespaceOffloadings decide."""

from __future__ import annotations

import pytest

from tests.unit.fakes import until
from tests.unit.vkprovider.remote.worlds import CONSUMER, OTHER, PROVIDER, World, pod
from vkprovider.node.provider import ProviderError


async def test_a_claim_on_a_namespace_offloaded_to_another_provider_starts_nothing(world: World) -> None:
    world.offload("payments", OTHER)
    world.claim("payments")
    await until(lambda: bool(world.events("payments", "TwinNamespaceRefused")), what="the refusal Event")
    assert world.reflection.started == {}, "nothing of payments is reflected to gpu-a"
    assert world.provider.twin_ns == {}
    (event,) = world.events("payments", "TwinNamespaceRefused")
    assert event["involvedObject"]["kind"] == "NamespaceOffloading" and PROVIDER in event["message"]
    with pytest.raises(ProviderError) as refused:
        await world.provider.create_pod(pod("payments"))
    assert refused.value.reason == "NamespaceNotOffloaded"
    assert not [r for r in world.local.requests if "/secrets" in r.path or "/configmaps" in r.path]


async def test_a_claim_on_a_namespace_never_offloaded_is_reported_on_the_foreign_cluster(world: World) -> None:
    world.claim("kube-system")
    await until(lambda: bool(world.events("default", "TwinNamespaceRefused")), what="the refusal Event")
    (event,) = world.events("default", "TwinNamespaceRefused")
    assert event["involvedObject"]["kind"] == "ForeignCluster" and event["involvedObject"]["name"] == PROVIDER
    assert world.reflection.started == {}


async def test_the_consumers_record_decides_when_reflection_starts_and_stops(world: World) -> None:
    world.claim("team")
    await until(lambda: not world.provider.claims.pending, what="the grace")
    assert world.reflection.started == {}
    world.offload("team", PROVIDER)
    await until(lambda: world.reflection.started == {"team": f"team-{CONSUMER}"}, what="reflection started")
    assert world.events("team", "TwinNamespaceRefused") == [], "a claim confirmed within the grace is no alarm"
    world.offload("team", PROVIDER, phase="Terminating")  # the consumer no longer selects gpu-a
    await until(lambda: world.reflection.started == {}, what="reflection stopped")
    assert world.provider.twin_ns == {}


async def test_a_claim_with_an_invalid_twin_name_is_refused(world: World) -> None:
    world.offload("team", PROVIDER)
    world.claim("team", twin="../../gpufed")
    await until(lambda: bool(world.events("team", "TwinNamespaceRefused")), what="the refusal Event")
    assert world.reflection.started == {}


# ---------------------------------------------------------------- node labels
