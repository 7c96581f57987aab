"""`remote.grant`: the provider's node labels are allow-listed, the dropped reported once."""

from __future__ import annotations

from typing import Any

from gpufed.apis.meta import API_VERSION
from gpufed.apis.wire import SYSTEM_NAMESPACE
from tests.unit.fakes import until
from tests.unit.vkprovider.remote.worlds import PROVIDER, World, world_of


def slice_(labels: dict[str, str]) -> dict[str, Any]:
    return {
        "kind": "ResourceSlice",
        "metadata": {"name": "s1", "namespace": SYSTEM_NAMESPACE},
        "spec": {"providerClusterId": PROVIDER, "resources": {"nvidia.com/gpu": "16", "cpu": "bad"}},
        "status": {
            "conditions": [{"type": "Resources", "status": "True"}],
            "granted": {"nvidia.com/gpu": "8"},
            "nodeLabels": labels,
        },
    }


async def test_provider_node_labels_are_allow_listed_and_the_dropped_reported_once(world: World) -> None:
    world.local.create(
        "resourceslices",
        slice_({"nvidia.com/gpu.product": "H100", "topology.kubernetes.io/region": "eu", "kubernetes.io/os": "x"}),
        API_VERSION,
    )
    await until(lambda: "s1" in world.provider.grants.slices, what="the slice")
    assert dict(world.provider.grant().labels) == {"nvidia.com/gpu.product": "H100"}
    # what the slice asks for is kept beside what the provider's live capacity grants now (an
    # unreadable quantity counts for nothing)
    assert dict(world.provider.grant().requested) == {"nvidia.com/gpu": 16}
    await until(lambda: bool(world.events("default", "NodeLabelsDropped")), what="the Event")
    world.local.update("resourceslices", SYSTEM_NAMESPACE, "s1", lambda o: o["status"].update(granted={"cpu": "1"}))
    await until(lambda: world.provider.grants.slices["s1"]["status"]["granted"] == {"cpu": "1"}, what="the update")
    (event,) = world.events("default", "NodeLabelsDropped")
    assert "topology.kubernetes.io/region=eu" in event["message"] and "nvidia.com" not in event["message"]


async def test_an_allow_listed_label_passes_but_never_a_reserved_one() -> None:
    async with world_of(node_label_allow=("example.com/rack", "topology.kubernetes.io/*")) as w:
        w.local.create(
            "resourceslices", slice_({"example.com/rack": "r1", "topology.kubernetes.io/region": "eu"}), API_VERSION
        )
        await until(lambda: "s1" in w.provider.grants.slices, what="the slice")
        assert dict(w.provider.grant().labels) == {"example.com/rack": "r1"}


# ---------------------------------------------------------------- twin addresses
