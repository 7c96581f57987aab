"""`RemoteProvider` against two fake API servers (consumer and provider), as a malicious provider
would drive it: TwinNamespaces it writes are only claims (the consumer's NamespaceOffloadings
decide), its node labels are allow-listed, the addresses it reports for twins are checked, and a
pod naming objects by invalid names is refused before anything is read for it. The mirroring of its
Events about twins is `remote.remote_events`' (test_remote_events)."""

from __future__ import annotations

import pytest

from gpufed.apis.meta import API_VERSION
from gpufed.apis.wire import (
    ORIGIN_CLUSTER_LABEL,
    ORIGIN_UID_LABEL,
)
from tests.unit.fakes import until
from tests.unit.vkprovider.remote.worlds import CONSUMER, PROVIDER, TENANT, World, pod
from vkprovider.node.provider import ProviderError
from vkprovider.remote.events_relay import EventRelay
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


async def test_a_twin_create_that_lost_a_quota_race_is_sent_again(world: World) -> None:
    world.offload("team", PROVIDER)
    world.claim("team")
    await until(lambda: "team" in world.provider.twin_ns, what="the twin namespace")
    world.remote.contend["pods"] = 2
    await world.provider.create_pod(pod("team"))
    assert [t["metadata"]["name"] for t in world.remote.items("pods")] == ["train"]
    assert len(world.remote.calls("POST", f"/api/v1/namespaces/team-{CONSUMER}/pods")) == 3
    world.remote.contend["pods"] = 10  # still contended after every attempt: the provider's refusal
    with pytest.raises(ProviderError) as refused:
        await world.provider.create_pod(pod("team", name="other"))
    assert "resourcequotas" in str(refused.value) and refused.value.reason != "TwinConflict"


async def test_a_twin_deleted_with_grace_0_is_not_taken_back_from_an_event_under_way(world: World) -> None:
    world.offload("team", PROVIDER)
    world.claim("team")
    await until(lambda: "team" in world.provider.twin_ns, what="the twin namespace")
    await world.provider.create_pod(pod("team"))
    twin = world.remote.items("pods")[0]
    await world.provider.delete_pod("team", "train", "uid-train", 0)
    assert world.provider.twin("team", "train") is None
    world.provider._on_twin("MODIFIED", twin)  # written before the delete, delivered after it
    assert world.provider.twin("team", "train") is None
    deletes = len(world.remote.calls("DELETE", f"/api/v1/namespaces/team-{CONSUMER}/pods/train"))
    await world.provider.delete_pod("team", "train", "uid-train", 0)
    assert len(world.remote.calls("DELETE", f"/api/v1/namespaces/team-{CONSUMER}/pods/train")) == deletes == 1
    world.provider._on_twin("DELETED", twin)
    world.provider._on_twin("ADDED", {**twin, "metadata": {**twin["metadata"], "uid": "a-new-twin"}})
    assert world.provider.twin("team", "train") is not None, "another twin of that name is seen"


def test_twin_names_from_the_provider_must_be_kubernetes_names() -> None:
    provider = RemoteProvider(None, None, RemoteSettings(CONSUMER, PROVIDER, "gpufed-gpu-a"))
    provider.local_ns[f"team-{CONSUMER}"] = "team"
    labels = {ORIGIN_CLUSTER_LABEL: CONSUMER, ORIGIN_UID_LABEL: "u"}
    provider._on_twin("ADDED", {"metadata": {"namespace": f"team-{CONSUMER}", "name": "../x", "labels": labels}})
    assert provider.twins() == []


def test_the_relay_it_is_given_carries_every_event_of_its_view() -> None:
    relay = EventRelay(None, PROVIDER, "test")
    provider = RemoteProvider(None, None, RemoteSettings(CONSUMER, PROVIDER, "gpufed-gpu-a"), events=relay)
    assert provider.events is relay
    assert provider.remote_events.events is relay and provider.addresses.events is relay
    assert provider.claims.events is relay


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
