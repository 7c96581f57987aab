"""GroupStart inside a RemoteProvider (two fake API servers): the twins of a group are created gated
and released together once all exist and the provider's capacity snapshot holds them."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

from gpufed.apis.wire import GANG_LABEL, GANG_SIZE_ANNOTATION, ORIGIN_CLUSTER_LABEL, TWIN_GROUP_GATE
from gpupool.capacity import Snapshot
from tests.unit.fakes import until
from tests.unit.vkprovider.forge.test_pools import cap, snap
from tests.unit.vkprovider.remote.worlds import CONSUMER, World, pod, world_of

H100 = "NVIDIA-H100-80GB-HBM3"
NODE = "gpufed-gpu-a"


def member(name: str, size: int = 3, gpus: int = 2) -> dict[str, Any]:
    p = pod(
        "team",
        name,
        containers=[{"name": "main", "image": "x", "resources": {"requests": {"nvidia.com/gpu": str(gpus)}}}],
    )
    p["metadata"]["labels"] = {GANG_LABEL: "g1"}
    p["metadata"]["annotations"] = {GANG_SIZE_ANNOTATION: str(size)}
    return p


def snapshot(free_per_node: list[int]) -> Snapshot:
    return snap(cap(H100, free_per_node, per_node=4))


def gates(world: World, name: str) -> list[str]:
    twin = world.remote.get("pods", "team-c-1", name)
    assert twin is not None
    return [g["name"] for g in twin["spec"].get("schedulingGates") or []]


@pytest.fixture
async def gworld() -> AsyncIterator[tuple[World, list[Snapshot | None]]]:
    current: list[Snapshot | None] = [None]
    async with world_of() as w:
        w.provider.groups._snapshot = lambda: current[0]
        w.provider.pool_products[NODE] = H100
        w.offload("team", "gpu-a")
        w.claim("team")
        await until(lambda: "team" in w.provider.twin_ns, what="the twin namespace")
        yield w, current


async def update(world: World, name: str) -> None:
    p = member(name)
    await until(lambda: world.provider.twin("team", name) is not None, what=f"the twin of {name}")
    twin = world.provider.twin("team", name)
    assert twin is not None
    await world.provider.update_pod(p, twin)


async def test_a_group_starts_only_when_its_last_twin_exists(gworld: tuple[World, list[Snapshot | None]]) -> None:
    world, _ = gworld
    for name in ("w-0", "w-1"):
        await world.provider.create_pod(member(name))
        await update(world, name)
    assert gates(world, "w-0") == gates(world, "w-1") == [TWIN_GROUP_GATE]
    await world.provider.create_pod(member("w-2"))
    await update(world, "w-2")
    assert [gates(world, n) for n in ("w-0", "w-1", "w-2")] == [[], [], []]
    # a later pod of the started group (a replacement) joins it ungated
    await world.provider.create_pod(member("w-3"))
    assert gates(world, "w-3") == []
    # a pod of no group is never gated
    await world.provider.create_pod(pod("team", "solo"))
    assert gates(world, "solo") == []


async def test_a_group_waits_until_the_providers_free_gpus_hold_it_whole(
    gworld: tuple[World, list[Snapshot | None]],
) -> None:
    world, current = gworld
    current[0] = snapshot([4, 2])  # 3 x 2 GPUs fit on nodes with 4 and 2 free, but not after 2 more
    await world.provider.create_pod(
        pod(
            "team",
            "big",
            containers=[{"name": "main", "image": "x", "resources": {"requests": {"nvidia.com/gpu": "2"}}}],
        )
    )  # an ungated twin on its way to the same pool takes 2 of them
    for name in ("w-0", "w-1", "w-2"):
        await world.provider.create_pod(member(name))
        await update(world, name)
    assert all(gates(world, n) == [TWIN_GROUP_GATE] for n in ("w-0", "w-1", "w-2"))
    notified: list[tuple[str, str]] = []
    world.provider.subscribe(lambda ns, name: notified.append((ns, name)))
    current[0] = snapshot([4, 4])
    world.provider.capacity_changed()
    assert sorted(notified) == [("team", "w-0"), ("team", "w-1"), ("team", "w-2")]
    await update(world, "w-0")
    assert [gates(world, n) for n in ("w-0", "w-1", "w-2")] == [[], [], []]


async def test_a_provider_forging_a_member_of_a_group_only_starts_it_early(
    gworld: tuple[World, list[Snapshot | None]],
) -> None:
    """The members of a group are read from the provider's twins: a provider can put the group's label
    on a pod of its own in the twin namespace. All that buys it is starting the consumer's twins it
    schedules anyway; nothing on the consumer changes and nothing else is patched."""
    world, _ = gworld
    forged = pod("team-c-1", "forged")
    forged["metadata"]["labels"] = {GANG_LABEL: "g1", ORIGIN_CLUSTER_LABEL: CONSUMER}  # it can forge both
    world.remote.create("pods", forged)
    await until(lambda: world.provider.twin("team", "forged") is not None, what="the provider's pod in view")
    before = len(world.local.requests)
    await world.provider.create_pod(member("w-0"))
    assert gates(world, "w-0") == []  # joined the "started" group
    patched = [r.path for r in world.remote.requests if r.method == "PATCH"]
    assert all(p.startswith("/api/v1/namespaces/team-c-1/pods/") for p in patched), patched
    assert [r for r in world.local.requests[before:] if r.method not in ("GET",)] == []
