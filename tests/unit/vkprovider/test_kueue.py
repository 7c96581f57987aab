"""The flavor keeper (vkprovider.kueue) against the in-memory API server: one ResourceFlavor per pool
node, ClusterQueue GPU quotas kept within the grant and given back when it grows."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
import structlog

from gpufed.apis.wire import POOL_ANNOTATION, TYPE_LABEL, VIRTUAL_NODE_TYPE
from gpufed.kube import rest as rest_module
from gpufed.kube.client import KubeError
from gpupool.flavors import KUEUE_GROUP, KUEUE_VERSION, gpu_quotas
from tests.unit.fakes import FakeApiServer, serve
from vkprovider.forge.pools import PoolFigures
from vkprovider.kueue import (
    APPLIED_ANNOTATION,
    REQUESTED_ANNOTATION,
    FlavorKeeper,
    KueueSettings,
    asked_of,
    pool_of,
    served_version,
)

AV = f"{KUEUE_GROUP}/{KUEUE_VERSION}"
POOL = "gpufed-gpu-a"


def node(name: str = POOL, granted: int = 8, total: int | None = 32) -> dict[str, Any]:
    figures = PoolFigures(
        provider="gpu-a",
        node=name,
        product="H100",
        total=total,
        granted=granted,
        in_use=0,
        free=total,
        largest_placeable=8,
        capacity_source="Live",
    )
    return {
        "kind": "Node",
        "metadata": {
            "name": name,
            "labels": {TYPE_LABEL: VIRTUAL_NODE_TYPE},
            "annotations": {POOL_ANNOTATION: figures.annotation()},
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
    assert pool.pod_gpus is None  # the node does not say
    sized = node()
    sized["metadata"].setdefault("labels", {})["gpufed.io/pod-gpus-max"] = "8"
    assert (pool := pool_of(sized)) is not None and pool.pod_gpus == 8
    for bad in ("0", "-1", "eight", ""):
        sized["metadata"]["labels"]["gpufed.io/pod-gpus-max"] = bad
        assert (pool := pool_of(sized)) is not None and pool.pod_gpus is None
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


def test_the_preferred_served_version_is_used() -> None:
    def group(*versions: str) -> dict[str, Any]:
        return {"kind": "APIGroup", "name": KUEUE_GROUP, "versions": [{"version": v} for v in versions]}

    assert served_version(group("v1beta2", "v1beta1")) == "v1beta2"  # Kueue >= 0.15 (v1beta1 deprecated)
    assert served_version(group("v1beta1")) == "v1beta1"  # older Kueue
    assert served_version(group("v1alpha1")) is None
    assert served_version(None) is None and served_version({}) is None


async def test_flavors_and_quotas_are_written_in_the_version_kueue_serves() -> None:
    async with serve() as (server, api):
        k = FlavorKeeper(api)
        k.version = "v1beta1"
        k.on_node("ADDED", node(granted=8))
        cq = server.create("clusterqueues", queue("team-a", 12), api_version=f"{KUEUE_GROUP}/v1beta1")
        k.on_queue("ADDED", cq)
        k._synced.update({"nodes", "queues", "flavors"})
        await k.reconcile()
        fl = server.get("resourceflavors", "", POOL)
        assert fl is not None and fl["apiVersion"] == f"{KUEUE_GROUP}/v1beta1"
        writes = [r.path for r in server.requests if r.method == "PATCH"]
        assert f"/apis/{KUEUE_GROUP}/v1beta1/resourceflavors/{POOL}" in writes
        assert f"/apis/{KUEUE_GROUP}/v1beta1/clusterqueues/team-a" in writes
        (event,) = [e for e in server.items("events") if e["reason"] == "GPUQuotaClamped"]
        assert event["involvedObject"]["apiVersion"] == f"{KUEUE_GROUP}/v1beta1"


async def test_a_deleted_flavor_waiting_for_kueues_finalizer_is_not_deleted_again() -> None:
    async with serve() as (server, api):
        k = await keeper_with(server, api, [], [])
        gone = {"metadata": {"name": "gpufed-old", "deletionTimestamp": "2026-01-01T00:00:00Z"}}
        k.on_flavor("MODIFIED", gone)
        await k.reconcile()
        assert not [r for r in server.requests if r.method == "DELETE"]


async def test_without_kueue_the_keeper_looks_again_every_few_seconds_and_says_so_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    answers: list[str | KubeError | None] = [None, None, None, KubeError("forbidden", status=403)] * 2
    waits: list[float] = []

    async def served() -> str | None:
        answer = answers.pop(0)
        if isinstance(answer, KubeError):
            raise answer
        return answer

    async def sleep(seconds: float) -> None:
        waits.append(seconds)
        if not answers:
            raise asyncio.CancelledError

    with structlog.testing.capture_logs() as logs:
        k = FlavorKeeper(object(), KueueSettings(retry_s=5.0, max_backoff_s=60.0))
        monkeypatch.setattr(k, "_served", served)
        monkeypatch.setattr(asyncio, "sleep", sleep)
        with pytest.raises(asyncio.CancelledError):
            await k.run()
    # not served: every retry_s; a failure: retry_s, then twice that (not served again resets it)
    assert waits == [5.0] * 8
    assert k.version is None
    assert len([e for e in logs if "not served" in e["event"]]) == 1
    assert len([e for e in logs if e["log_level"] == "warning"]) == 2, "each failure is a warning"


async def test_repeated_failures_back_off_up_to_the_limit(monkeypatch: pytest.MonkeyPatch) -> None:
    k = FlavorKeeper(object(), KueueSettings(retry_s=5.0, max_backoff_s=30.0))
    waits: list[float] = []

    async def served() -> str | None:
        raise KubeError("forbidden", status=403)

    async def sleep(seconds: float) -> None:
        waits.append(seconds)
        if len(waits) == 5:
            raise asyncio.CancelledError

    monkeypatch.setattr(k, "_served", served)
    monkeypatch.setattr(asyncio, "sleep", sleep)
    with pytest.raises(asyncio.CancelledError):
        await k.run()
    assert waits == [5.0, 10.0, 20.0, 30.0, 30.0]


async def test_pools_that_change_while_a_flavor_is_written_are_taken_next_time(monkeypatch: pytest.MonkeyPatch) -> None:
    async with serve() as (server, api):
        k = await keeper_with(server, api, [], [])
        k.on_node("ADDED", node("gpufed-one"))
        k.on_node("ADDED", node("gpufed-two"))
        real_apply = rest_module.apply

        async def apply(api_: Any, path: str, obj: Any, **kw: Any) -> Any:
            # the node watch delivers while the write awaits: a pool appears, another goes
            k.on_node("ADDED", node("gpufed-three"))
            k.on_node("DELETED", node("gpufed-one"))
            return await real_apply(api_, path, obj, **kw)

        monkeypatch.setattr(rest_module, "apply", apply)
        await k.reconcile()  # no "dictionary changed size during iteration"
        monkeypatch.setattr(rest_module, "apply", real_apply)
        await k.reconcile()
        assert server.get("resourceflavors", "", "gpufed-three") is not None
