"""The flavor keeper (vkprovider.kueue) against the in-memory API server: one ResourceFlavor per pool
node, ClusterQueue GPU quotas kept within the grant and given back when it grows."""

from __future__ import annotations

import json
from typing import Any

from gpufed.apis.wire import POOL_ANNOTATION, TYPE_LABEL, VIRTUAL_NODE_TYPE
from gpupool.flavors import KUEUE_GROUP, KUEUE_VERSION, gpu_quotas
from tests.unit.fakes import FakeApiServer, serve
from vkprovider.kueue import APPLIED_ANNOTATION, REQUESTED_ANNOTATION, FlavorKeeper, asked_of, pool_of

AV = f"{KUEUE_GROUP}/{KUEUE_VERSION}"
POOL = "gpufed-gpu-a"


def node(name: str = POOL, granted: int = 8, total: int | None = 32) -> dict[str, Any]:
    figures = {"provider": "gpu-a", "node": name, "product": "H100", "total": total, "granted": granted}
    return {
        "kind": "Node",
        "metadata": {
            "name": name,
            "labels": {TYPE_LABEL: VIRTUAL_NODE_TYPE},
            "annotations": {POOL_ANNOTATION: json.dumps(figures)},
        },
    }


def queue(name: str, gpus: int, flavor: str = POOL) -> dict[str, Any]:
    return {
        "apiVersion": AV,
        "kind": "ClusterQueue",
        "metadata": {"name": name, "annotations": {}},
        "spec": {
            "cohort": "research",
            "resourceGroups": [
                {
                    "coveredResources": ["nvidia.com/gpu"],
                    "flavors": [{"name": flavor, "resources": [{"name": "nvidia.com/gpu", "nominalQuota": str(gpus)}]}],
                }
            ],
        },
    }


async def keeper_with(
    server: FakeApiServer, api: Any, nodes: list[dict[str, Any]], queues: list[dict[str, Any]]
) -> FlavorKeeper:
    k = FlavorKeeper(api)
    for n in nodes:
        k.on_node("ADDED", n)
    for q in queues:
        created = server.create("clusterqueues", q, api_version=AV)
        k.on_queue("ADDED", created)
    k._synced.update({"nodes", "queues", "flavors"})
    await k.reconcile()
    return k


def test_pools_and_asks_are_read_from_their_objects() -> None:
    pool = pool_of(node())
    assert pool is not None and (pool.node, pool.provider, pool.total, pool.granted) == (POOL, "gpu-a", 32, 8)
    assert pool_of({"metadata": {"name": "x", "annotations": {POOL_ANNOTATION: "not json"}}}) is None
    cq = queue("team-a", 4)
    assert asked_of(cq, {POOL}) == {POOL: 4}
    # what gpufed wrote last stands for what was asked before it
    cq["metadata"]["annotations"] = {
        APPLIED_ANNOTATION: json.dumps({POOL: 4}),
        REQUESTED_ANNOTATION: json.dumps({POOL: 12}),
    }
    assert asked_of(cq, {POOL}) == {POOL: 12}
    # the owner changed it since: a new ask
    cq["spec"]["resourceGroups"][0]["flavors"][0]["resources"][0]["nominalQuota"] = "6"
    assert asked_of(cq, {POOL}) == {POOL: 6}


async def test_each_pool_gets_a_flavor_pinned_to_its_node() -> None:
    async with serve() as (server, api):
        await keeper_with(server, api, [node()], [])
        fl = server.get("resourceflavors", "", POOL)
        assert fl is not None
        assert fl["spec"]["nodeLabels"] == {"kubernetes.io/hostname": POOL}


async def test_quotas_over_the_grant_are_lowered_then_given_back_when_it_grows() -> None:
    async with serve() as (server, api):
        k = await keeper_with(server, api, [node(granted=8)], [queue("team-a", 8), queue("team-b", 8)])
        a, b = server.get("clusterqueues", "", "team-a"), server.get("clusterqueues", "", "team-b")
        assert a is not None and b is not None
        assert gpu_quotas(a)[POOL] + gpu_quotas(b)[POOL] == 8
        assert json.loads(a["metadata"]["annotations"][REQUESTED_ANNOTATION]) == {POOL: 8}
        clamped = [e for e in server.items("events") if e["reason"] == "GPUQuotaClamped"]
        assert len(clamped) == 2 and "8 asked, 4 promised" in clamped[0]["message"]
        # the provider grants 16 now: both get what they asked
        for name in ("team-a", "team-b"):
            obj = server.get("clusterqueues", "", name)
            assert obj is not None
            k.on_queue("MODIFIED", obj)
        k.on_node("MODIFIED", node(granted=16))
        await k.reconcile()
        for name in ("team-a", "team-b"):
            obj = server.get("clusterqueues", "", name)
            assert obj is not None and gpu_quotas(obj)[POOL] == 8
        assert any(e["reason"] == "GPUQuotaRestored" for e in server.items("events"))


async def test_a_queue_within_the_grant_and_other_flavors_are_left_alone() -> None:
    async with serve() as (server, api):
        await keeper_with(server, api, [node(granted=8)], [queue("team-a", 6), queue("on-prem", 100, flavor="local")])
        writes = [r for r in server.requests if r.method == "PATCH" and "clusterqueues" in r.path]
        assert writes == []
