"""A pod's ConfigMaps and Secrets copied into its twin namespace before its twin: the reflector's
copy, once per resourceVersion, never over a stranger's object, refusals the user can read."""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from typing import Any

import pytest

from gpufed.apis.wire import ORIGIN_CLUSTER_LABEL, ORIGIN_UID_LABEL
from tests.unit.fakes import FakeApiServer, serve
from vkprovider.forge.meta import Target
from vkprovider.forge.pods import Reference
from vkprovider.node.provider import ProviderError
from vkprovider.remote.references import ReferenceCopier

CONSUMER = "consumer-1a2b3c4d"
TWIN_NS = "team-consumer-1a2b3c4d"
TARGET = Target(CONSUMER, "gpufed-gpu-a", TWIN_NS, "gpu-a")
CONFIG = Reference("ConfigMap", "settings", optional=False)


class World:
    def __init__(self, consumer: FakeApiServer, provider: FakeApiServer, copier: ReferenceCopier) -> None:
        self.consumer = consumer
        self.provider = provider
        self.copier = copier
        self.annotations: dict[str, str] = {}

    def applies(self) -> int:
        return len(self.provider.calls("PATCH", f"/api/v1/namespaces/{TWIN_NS}/configmaps/settings"))


@pytest.fixture
async def world() -> AsyncIterator[World]:
    async with serve() as (consumer, local_api), serve() as (provider, remote_api):
        box: list[World] = []

        def namespace_annotations(_ns: str) -> Mapping[str, str]:
            return box[0].annotations

        w = World(consumer, provider, ReferenceCopier(local_api, remote_api, CONSUMER, "gpu-a", namespace_annotations))
        box.append(w)
        yield w


def config_map(**annotations: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "settings", "namespace": "team", "annotations": annotations},
        "data": {"lr": "0.1"},
    }


async def test_the_copy_is_the_reflectors_and_made_once_per_version(world: World) -> None:
    local = world.consumer.create("configmaps", config_map())
    await world.copier.copy("team", CONFIG, TARGET)
    copy = world.provider.get("configmaps", TWIN_NS, "settings")
    assert copy is not None and copy["data"] == {"lr": "0.1"}
    labels = copy["metadata"]["labels"]
    assert (labels[ORIGIN_CLUSTER_LABEL], labels[ORIGIN_UID_LABEL]) == (CONSUMER, local["metadata"]["uid"])
    await world.copier.copy("team", CONFIG, TARGET)
    assert world.applies() == 1


async def test_a_missing_reference_is_refused_unless_optional(world: World) -> None:
    # the kubelet's conventional reasons: the pod starts without an optional one, never without the other
    assert await world.copier.copy("team", Reference("Secret", "absent", optional=True), TARGET) is False
    with pytest.raises(ProviderError) as e:
        await world.copier.copy("team", Reference("Secret", "absent", optional=False), TARGET)
    assert e.value.reason == "MandatorySecretNotFound" and e.value.retry
    assert str(e.value).startswith('Secret "absent" not found in namespace team')
    with pytest.raises(ProviderError) as e:
        await world.copier.copy("team", Reference("ConfigMap", "absent", optional=False), TARGET)
    assert e.value.reason == "MandatoryConfigMapNotFound"


async def test_a_reference_the_reflector_would_remove_is_refused(world: World) -> None:
    world.consumer.create("configmaps", config_map(**{"gpufed.io/skip-reflection": "true"}))
    with pytest.raises(ProviderError) as e:
        await world.copier.copy("team", CONFIG, TARGET)
    assert e.value.reason == "ReferenceNotReflected"
    assert world.provider.get("configmaps", TWIN_NS, "settings") is None


async def test_a_strangers_object_is_left_alone(world: World) -> None:
    world.consumer.create("configmaps", config_map())
    world.provider.create("configmaps", {"metadata": {"name": "settings", "namespace": TWIN_NS}, "data": {"x": "1"}})
    with pytest.raises(ProviderError) as e:
        await world.copier.copy("team", CONFIG, TARGET)
    assert e.value.reason == "NameCollision"
    stranger = world.provider.get("configmaps", TWIN_NS, "settings")
    assert stranger is not None and stranger["data"] == {"x": "1"}
    assert world.applies() == 0


def bump(config: dict[str, Any], lr: str) -> None:
    """A new version of the ConfigMap (the fake leaves resourceVersions alone)."""
    config["data"]["lr"] = lr
    config["metadata"]["resourceVersion"] = f"rv-{lr}"


async def test_objects_reflections_watches_hold_are_not_read_again(world: World) -> None:
    local = world.consumer.create("configmaps", config_map())
    held: dict[tuple[str, str], Mapping[str, Any]] = {("local", "ConfigMap"): local}
    copier = ReferenceCopier(
        world.copier.local,
        world.copier.remote,
        CONSUMER,
        "gpu-a",
        lambda _ns: {},
        lambda side, kind, _ns, _name: held.get((side, kind)),
    )
    consumer_reads = len(world.consumer.calls("GET", "/api/v1/namespaces/team/configmaps/settings"))
    await copier.copy("team", CONFIG, TARGET)
    assert len(world.consumer.calls("GET", "/api/v1/namespaces/team/configmaps/settings")) == consumer_reads
    assert world.applies() == 1, "no copy held: read on the provider, then written"
    copy = world.provider.get("configmaps", TWIN_NS, "settings")
    assert copy is not None

    # A new version whose copy the reflector has made already: nothing is read or written.
    world.consumer.update("configmaps", "team", "settings", lambda o: bump(o, "0.2"))
    world.provider.update("configmaps", TWIN_NS, "settings", lambda o: o["data"].update(lr="0.2"))
    held[("local", "ConfigMap")] = world.consumer.get("configmaps", "team", "settings") or {}
    held[("remote", "ConfigMap")] = world.provider.get("configmaps", TWIN_NS, "settings") or {}
    provider_requests = len(world.provider.requests)
    assert await copier.copy("team", CONFIG, TARGET) is True
    assert len(world.provider.requests) == provider_requests

    # A held copy with other contents is written (and not read first).
    world.consumer.update("configmaps", "team", "settings", lambda o: bump(o, "0.3"))
    held[("local", "ConfigMap")] = world.consumer.get("configmaps", "team", "settings") or {}
    await copier.copy("team", CONFIG, TARGET)
    final = world.provider.get("configmaps", TWIN_NS, "settings")
    assert final is not None and final["data"] == {"lr": "0.3"}
    assert world.applies() == 2
    assert not world.provider.calls("GET", f"/api/v1/namespaces/{TWIN_NS}/configmaps/settings")[1:], (
        "only the first copy read the provider"
    )


async def test_a_held_copy_the_consumer_does_not_own_is_never_taken_for_its_own(world: World) -> None:
    local = world.consumer.create("configmaps", config_map())
    stranger = world.provider.create(
        "configmaps", {"metadata": {"name": "settings", "namespace": TWIN_NS}, "data": {"lr": "0.1"}}
    )
    held = {"local": local, "remote": stranger}  # the provider's own object, same contents
    copier = ReferenceCopier(
        world.copier.local, world.copier.remote, CONSUMER, "gpu-a", lambda _ns: {}, lambda s, _k, _ns, _n: held[s]
    )
    with pytest.raises(ProviderError) as e:
        await copier.copy("team", CONFIG, TARGET)
    assert e.value.reason == "NameCollision"
    assert world.applies() == 0
