"""The gang controller (vkprovider.gangs) against the in-memory API server: a group is released whole
onto one pool, waits with its reason when no pool holds it, and never gets GPUs promised twice."""

from __future__ import annotations

import asyncio
import contextlib
import json
from typing import Any

from gpufed.apis.wire import (
    GANG_GATE,
    GANG_GROUP_ANNOTATION,
    GANG_LABEL,
    GANG_NODE_ANNOTATION,
    GANG_RESERVE_ANNOTATION,
    GANG_SIZE_ANNOTATION,
    POOL_ANNOTATION,
    TYPE_LABEL,
    VIRTUAL_NODE_TYPE,
)
from tests.unit.fakes import FakeApiServer, serve, until
from vkprovider.gangs import CONDITION, GangController, GangSettings, release_patch

H100, A100 = "NVIDIA-H100-80GB-HBM3", "NVIDIA-A100-SXM4-40GB"


def pool(
    name: str, provider: str, product: str, free: list[list[int]], headroom: int, granted: int = 64
) -> dict[str, Any]:
    figures = {
        "provider": provider,
        "node": name,
        "product": product,
        "total": 64,
        "granted": granted,
        "in_use": 0,
        "free": sum(f * n for f, n in free),
        "largest_placeable": max((f for f, _ in free), default=0),
        "capacity_source": "Live",
        "in_flight": 0,
        "headroom": headroom,
        "free_nodes": free,
    }
    labels = {TYPE_LABEL: VIRTUAL_NODE_TYPE, "kubernetes.io/hostname": name, "nvidia.com/gpu.product": product}
    return {
        "kind": "Node",
        "metadata": {"name": name, "labels": labels, "annotations": {POOL_ANNOTATION: json.dumps(figures)}},
    }


def member(i: int, group: str = "train", size: int = 4, gpus: int = 2, **spec: dict[str, Any]) -> dict[str, Any]:
    return {
        "kind": "Pod",
        "metadata": {
            "name": f"{group}-{i}",
            "namespace": "team",
            "labels": {GANG_LABEL: group},
            "annotations": {GANG_GROUP_ANNOTATION: f"job-{group}", GANG_SIZE_ANNOTATION: str(size)},
        },
        "spec": {
            "schedulingGates": [{"name": GANG_GATE}],
            "containers": [{"name": "c", "resources": {"requests": {"nvidia.com/gpu": str(gpus)}}}],
            **spec,
        },
    }


def seed(server: FakeApiServer, nodes: list[dict[str, Any]], pods: list[dict[str, Any]]) -> None:
    for n in nodes:
        server.create("nodes", n)
    for p in pods:
        server.create("pods", p)


@contextlib.asynccontextmanager
async def running(ctl: GangController) -> Any:
    task = asyncio.create_task(ctl.run())
    try:
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


FAST = GangSettings(debounce_s=0.01, recheck_s=0.2)


def released_to(server: FakeApiServer, name: str) -> str | None:
    pod = server.get("pods", "team", name)
    assert pod is not None
    if any(g.get("name") == GANG_GATE for g in pod["spec"].get("schedulingGates") or []):
        return None
    return str(pod["spec"]["nodeSelector"]["kubernetes.io/hostname"])


def bound_to(server: FakeApiServer, name: str) -> str:
    pod = server.get("pods", "team", name) or {}
    return str((pod.get("spec") or {}).get("nodeName") or "")


def test_release_patch_keeps_other_gates_and_selectors() -> None:
    pod = member(0, nodeSelector={"zone": "a"})
    pod["spec"]["schedulingGates"].append({"name": "example.com/wait"})
    ops = release_patch(pod, "gpufed-a")
    assert ops[0]["op"] == "test"
    assert {"op": "replace", "path": "/spec/schedulingGates", "value": [{"name": "example.com/wait"}]} in ops
    assert {"op": "add", "path": "/spec/nodeSelector/kubernetes.io~1hostname", "value": "gpufed-a"} in ops


async def test_a_whole_group_is_released_onto_one_pool() -> None:
    async with serve() as (server, api):
        nodes = [pool("gpufed-a", "a", H100, [[8, 1]], headroom=8), pool("gpufed-b", "b", A100, [[2, 2]], headroom=4)]
        seed(server, nodes, [member(i) for i in range(4)])
        async with running(GangController(api, FAST)):
            # released, and bound together to the pool node, not left to be bound one by one
            await until(
                lambda: all((server.get("pods", "team", f"train-{i}") or {})["spec"].get("nodeName") for i in range(4))
            )
        assert {released_to(server, f"train-{i}") for i in range(4)} == {"gpufed-a"}
        pod = server.get("pods", "team", "train-0")
        assert pod is not None and pod["metadata"]["annotations"][GANG_NODE_ANNOTATION] == "gpufed-a"
        for i in range(4):
            (binding,) = [r.body for r in server.calls("POST", f"/api/v1/namespaces/team/pods/train-{i}/binding")]
            assert binding["target"] == {"apiVersion": "v1", "kind": "Node", "name": "gpufed-a"}
            assert bound_to(server, f"train-{i}") == "gpufed-a"


async def test_an_incomplete_group_waits_for_its_last_pod() -> None:
    async with serve() as (server, api):
        seed(server, [pool("gpufed-a", "a", H100, [[8, 1]], headroom=8)], [member(i) for i in range(3)])
        ctl = GangController(api, FAST)
        async with running(ctl):
            await until(lambda: ("team", "train") in ctl.groups and len(ctl.groups[("team", "train")]) == 3)
            await asyncio.sleep(0.3)
            assert released_to(server, "train-0") is None
            server.create("pods", member(3))
            await until(lambda: all(released_to(server, f"train-{i}") for i in range(4)))


async def test_a_group_no_pool_holds_waits_with_its_reason_then_starts_when_capacity_frees() -> None:
    async with serve() as (server, api):
        seed(
            server,
            [pool("gpufed-a", "a", H100, [[8, 1], [2, 1]], headroom=16), pool("gpufed-b", "b", A100, [[4, 1]], 16)],
            [member(i, gpus=4, size=3) for i in range(3)],
        )
        async with running(GangController(api, FAST)):

            def waiting() -> dict[str, Any] | None:
                pod = server.get("pods", "team", "train-0") or {}
                return next(
                    (c for c in (pod.get("status") or {}).get("conditions") or [] if c["type"] == CONDITION), None
                )

            await until(lambda: waiting() is not None)
            cond = waiting()
            assert cond is not None and cond["reason"] == "Waiting"
            assert (
                "3 pods (4 GPUs each, 12 in all)" in cond["message"] and "gpufed-a: 2, gpufed-b: 1" in cond["message"]
            )
            await until(lambda: any(e["reason"] == "GangWaiting" for e in server.items("events")))
            events = [e for e in server.items("events") if e["reason"] == "GangWaiting"]
            assert len(events) == 1 and "job-train" in events[0]["message"]
            assert released_to(server, "train-0") is None
            # gpu-a's other 2-GPU node frees up to 4: the pool now holds the group
            server.update(
                "nodes",
                "",
                "gpufed-a",
                lambda n: n["metadata"]["annotations"].update(
                    {
                        POOL_ANNOTATION: pool("gpufed-a", "a", H100, [[8, 1], [4, 1]], headroom=16)["metadata"][
                            "annotations"
                        ][POOL_ANNOTATION]
                    }
                ),
            )
            await until(lambda: all(released_to(server, f"train-{i}") == "gpufed-a" for i in range(3)))


async def test_a_group_larger_than_any_grant_is_refused_at_once() -> None:
    async with serve() as (server, api):
        seed(
            server, [pool("gpufed-a", "a", H100, [[8, 8]], headroom=64)], [member(i, gpus=8, size=9) for i in range(9)]
        )
        async with running(GangController(api, FAST)):
            await until(lambda: any(e["reason"] == "GangUnplaceable" for e in server.items("events")))
        pod = server.get("pods", "team", "train-0")
        assert pod is not None
        (cond,) = [c for c in pod["status"]["conditions"] if c["type"] == CONDITION]
        assert cond["reason"] == "NeverFits" and "more than any provider grants" in cond["message"]


async def test_a_jobsets_group_that_waits_says_so_on_the_jobset() -> None:
    async with serve() as (server, api):
        labels = {
            "jobset.sigs.k8s.io/jobset-name": "llm",
            "jobset.sigs.k8s.io/replicatedjob-name": "workers",
            "jobset.sigs.k8s.io/restart-attempt": "0",
        }
        pods = [member(i, gpus=8, size=2) for i in range(2)]
        for p in pods:
            p["metadata"]["labels"].update(labels)
        seed(server, [pool("gpufed-a", "a", H100, [[4, 4]], headroom=64)], pods)
        server.create(
            "jobsets",
            {"kind": "JobSet", "metadata": {"name": "llm", "namespace": "team"}, "spec": {}},
            api_version="jobset.x-k8s.io/v1alpha2",
        )
        async with running(GangController(api, FAST)):
            await until(lambda: any(e["reason"] == "GangWaiting" for e in server.items("events")))
        (event,) = [e for e in server.items("events") if e["reason"] == "GangWaiting"]
        assert event["involvedObject"]["kind"] == "JobSet" and event["involvedObject"]["name"] == "llm"
        assert event["involvedObject"]["apiVersion"] == "jobset.x-k8s.io/v1alpha2"


async def test_two_groups_are_never_promised_the_same_gpus() -> None:
    async with serve() as (server, api):
        pods = [member(i, "one", size=2, gpus=4) for i in range(2)] + [
            member(i, "two", size=2, gpus=4) for i in range(2)
        ]
        seed(server, [pool("gpufed-a", "a", H100, [[8, 1]], headroom=16)], pods)
        server.bindings = False  # left to a scheduler (none here): the first group stays unbound
        async with running(GangController(api, FAST)):
            await until(lambda: released_to(server, "one-0") is not None or released_to(server, "two-0") is not None)
            await asyncio.sleep(0.5)
            placed = [g for g in ("one", "two") if released_to(server, f"{g}-0")]
            # the pool's 8 free GPUs hold one group of 2 x 4; the other waits until the first is bound
            assert len(placed) == 1


def reserved_on(server: FakeApiServer, name: str) -> str | None:
    pod = server.get("pods", "team", name) or {}
    mark = ((pod.get("metadata") or {}).get("annotations") or {}).get(GANG_RESERVE_ANNOTATION)
    return None if mark is None else str(mark)


def set_free(server: FakeApiServer, name: str, free: list[list[int]]) -> None:
    figures = pool(name, "a", H100, free, headroom=32)["metadata"]["annotations"][POOL_ANNOTATION]
    server.update("nodes", "", name, lambda n: n["metadata"]["annotations"].update({POOL_ANNOTATION: figures}))


async def test_the_longest_waiting_group_holds_freed_gpus_back_from_later_groups() -> None:
    async with serve() as (server, api):
        big = [member(i, "big", size=2, gpus=8) for i in range(2)]
        small = [member(i, "small", size=2, gpus=4) for i in range(2)]
        for p in big:
            p["metadata"]["creationTimestamp"] = "2026-11-28T10:00:00Z"
        for p in small:
            p["metadata"]["creationTimestamp"] = "2026-11-28T10:01:00Z"
        seed(server, [pool("gpufed-a", "a", H100, [[8, 1]], headroom=32)], big + small)
        server.bindings = False  # released pods stay unbound: their GPUs stay set aside
        async with running(GangController(api, FAST)):
            # the 2 x 8 group waits for a second free node, and the free one is held back for it
            await until(lambda: all(reserved_on(server, f"big-{i}") == "gpufed-a" for i in range(2)))
            await asyncio.sleep(0.5)
            assert released_to(server, "small-0") is None, "a later group took the GPUs the first one waits for"
            assert reserved_on(server, "small-0") is None  # one group per pool
            pod = server.get("pods", "team", "big-0") or {}
            (cond,) = [c for c in pod["status"]["conditions"] if c["type"] == CONDITION]
            assert "16 GPUs on gpufed-a are held back for it" in cond["message"], cond
            # a second node frees: the group goes, without its mark; the next group waits for what it
            # took and reserves the pool
            set_free(server, "gpufed-a", [[8, 2]])
            await until(lambda: all(released_to(server, f"big-{i}") == "gpufed-a" for i in range(2)))
            assert all(reserved_on(server, f"big-{i}") is None for i in range(2))
            await until(lambda: all(reserved_on(server, f"small-{i}") == "gpufed-a" for i in range(2)))


async def test_a_reservation_lapses_after_its_longest_hold_then_pauses() -> None:
    async with serve() as (server, api):
        seed(
            server, [pool("gpufed-a", "a", H100, [[8, 1]], headroom=32)], [member(i, size=2, gpus=8) for i in range(2)]
        )
        settings = GangSettings(debounce_s=0.01, recheck_s=0.05, reserve_max_s=0.5)
        async with running(GangController(api, settings)):
            await until(lambda: reserved_on(server, "train-0") == "gpufed-a")
            await until(lambda: reserved_on(server, "train-0") is None, timeout=5)  # held too long: let go
            await until(lambda: reserved_on(server, "train-0") == "gpufed-a", timeout=5)  # the pause is over


async def test_a_pool_the_pods_own_selection_excludes_is_not_chosen() -> None:
    async with serve() as (server, api):
        only_a100: dict[str, Any] = {"nodeSelector": {"nvidia.com/gpu.product": A100}}
        nodes = [pool("gpufed-a", "a", H100, [[8, 1]], headroom=8), pool("gpufed-b", "b", A100, [[8, 1]], headroom=64)]
        seed(server, nodes, [member(i, nodeSelector=only_a100["nodeSelector"]) for i in range(4)])
        async with running(GangController(api, FAST)):
            await until(lambda: all(released_to(server, f"train-{i}") for i in range(4)))
        assert {released_to(server, f"train-{i}") for i in range(4)} == {"gpufed-b"}


async def test_a_jobs_next_pods_join_their_running_group_and_finished_pods_attract_none() -> None:
    async with serve() as (server, api):
        # gpufed-b has room for 2 more GPUs only: too little for the replacement group "old" (2 x 2)
        nodes = [pool("gpufed-a", "a", H100, [[8, 1]], headroom=8), pool("gpufed-b", "b", A100, [[8, 1]], headroom=2)]
        running_pod = member(0)
        running_pod["spec"].pop("schedulingGates")
        running_pod["spec"]["nodeName"] = "gpufed-b"
        running_pod["metadata"]["annotations"][GANG_NODE_ANNOTATION] = "gpufed-b"
        running_pod["status"] = {"phase": "Running"}
        failed = member(0, group="old")
        failed["spec"].pop("schedulingGates")
        failed["metadata"]["annotations"][GANG_NODE_ANNOTATION] = "gpufed-b"
        failed["status"] = {"phase": "Failed"}
        # one next pod of "train" (size 4): joins the running one although it is alone
        seed(server, nodes, [running_pod, member(1), failed, *[member(i, group="old", size=2) for i in (1, 2)]])
        async with running(GangController(api, FAST)):
            await until(lambda: released_to(server, "train-1") == "gpufed-b")
            # the replacement pods of a group failed back whole are placed afresh, not sent after the
            # failed pod's node
            await until(lambda: released_to(server, "old-1") is not None and released_to(server, "old-2") is not None)
        assert released_to(server, "old-1") == released_to(server, "old-2") == "gpufed-a"


async def test_a_next_pod_waits_for_room_on_its_groups_pool_and_never_goes_elsewhere() -> None:
    async with serve() as (server, api):
        # the group runs on gpufed-b, which has no GPU left; gpufed-a has plenty
        nodes = [pool("gpufed-a", "a", H100, [[8, 2]], headroom=16), pool("gpufed-b", "b", A100, [], headroom=0)]
        running_pod = member(0)
        running_pod["spec"].pop("schedulingGates")
        running_pod["spec"]["nodeName"] = "gpufed-b"
        running_pod["metadata"]["annotations"][GANG_NODE_ANNOTATION] = "gpufed-b"
        running_pod["status"] = {"phase": "Running"}
        seed(server, nodes, [running_pod, member(1)])
        async with running(GangController(api, FAST)):

            def waiting() -> dict[str, Any] | None:
                pod = server.get("pods", "team", "train-1") or {}
                return next(
                    (c for c in (pod.get("status") or {}).get("conditions") or [] if c["type"] == CONDITION), None
                )

            await until(lambda: waiting() is not None)
            cond = waiting()
            assert cond is not None and cond["reason"] == "Waiting" and "the group runs on gpufed-b" in cond["message"]
            assert released_to(server, "train-1") is None
            server.update(
                "nodes",
                "",
                "gpufed-b",
                lambda n: n["metadata"]["annotations"].update(
                    {
                        POOL_ANNOTATION: pool("gpufed-b", "b", A100, [[4, 1]], headroom=4)["metadata"]["annotations"][
                            POOL_ANNOTATION
                        ]
                    }
                ),
            )
            await until(lambda: released_to(server, "train-1") == "gpufed-b")


async def test_replacements_of_a_group_failed_back_whole_are_placed_again_at_once() -> None:
    async with serve() as (server, api):
        seed(server, [pool("gpufed-a", "a", H100, [[8, 2]], headroom=16)], [member(i, size=2) for i in range(2)])
        async with running(GangController(api, FAST)):
            await until(lambda: released_to(server, "train-0") == released_to(server, "train-1") == "gpufed-a")
            for i in range(2):  # bound, then failed back whole by the virtual kubelet

                def failed(p: dict[str, Any]) -> None:
                    p["spec"]["nodeName"] = "gpufed-a"
                    p["status"] = {"phase": "Failed", "reason": "GangFailedBack"}

                server.update("pods", "team", f"train-{i}", failed)
            # the Job's replacements: new pods of the same group, gated by the webhook
            for i in (2, 3):
                server.create("pods", member(i, size=2))
            await until(lambda: released_to(server, "train-2") == released_to(server, "train-3") == "gpufed-a")


async def test_marking_reservations_survives_groups_that_come_and_go_meanwhile(monkeypatch: Any) -> None:
    ctl = GangController(api=None, settings=FAST)
    for p in [member(i, "big", size=2, gpus=8) for i in range(2)]:
        ctl.on_pod("ADDED", p)
    ctl.reserved = {("team", "big"): ("gpufed-a", (8, 8))}
    patched: list[str] = []

    async def patch(_api: Any, path: str, body: Any, **_: Any) -> dict[str, Any]:
        # the watches deliver events while a patch is under way: a new group, and one gone
        patched.append(path)
        ctl.on_pod("ADDED", member(len(patched), f"new{len(patched)}", size=2))
        ctl.on_pod("DELETED", member(0, "big", size=2, gpus=8))
        return {}

    monkeypatch.setattr("vkprovider.gangs.rest.merge_patch", patch)
    await ctl._mark_reservations()
    assert len(patched) == 2 and all("/pods/big-" in p for p in patched)
