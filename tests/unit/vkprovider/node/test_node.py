"""NodeController against the fake API server and FakeProvider: registration, status patches that
keep others' conditions, the node lease, recreation after deletion, others' labels and taints, removal."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator, Iterator, MutableMapping
from typing import Any

import pytest
from structlog.testing import capture_logs

from gpufed.apis.wire import VIRTUAL_NODE_TAINT
from gpufed.kube import rest
from tests.unit.fakes import FakeApiServer, FakeProvider, node_state, running, serve, until
from vkprovider.node.node import NodeController, NodeSettings

NODE = "gpufed-prov-a"
LEASES = "leases"
SETTINGS = NodeSettings(
    name=NODE,
    address="10.9.8.7",
    kubelet_port=10555,
    lease_renew_s=0.05,
    state_poll_s=0.02,
    labels={"gpufed.io/remote-cluster-id": "prov-a"},
)
GPU = {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}


@pytest.fixture(autouse=True)
def _logs() -> Iterator[list[MutableMapping[str, Any]]]:
    with capture_logs() as logs:
        yield logs


@pytest.fixture
async def cluster() -> AsyncIterator[tuple[FakeApiServer, Any]]:
    async with serve() as (server, api):
        yield server, api


def node(server: FakeApiServer) -> dict[str, Any]:
    found = server.get("nodes", "", NODE)
    assert found is not None
    return found


def conditions(server: FakeApiServer) -> dict[str, dict[str, Any]]:
    return {c["type"]: c for c in node(server)["status"].get("conditions") or []}


def lease(server: FakeApiServer) -> dict[str, Any] | None:
    return server.get(LEASES, "kube-node-lease", NODE)


async def test_registers_the_node(cluster: tuple[FakeApiServer, Any]) -> None:
    server, api = cluster
    provider = FakeProvider(state=node_state(labels=GPU))
    controller = NodeController(api, provider, SETTINGS)
    async with running(controller.run()):
        await until(controller.ready.is_set)
    n = node(server)
    labels = n["metadata"]["labels"]
    assert labels["nvidia.com/gpu.product"] == "NVIDIA-H100-80GB-HBM3"  # the provider's
    assert labels["gpufed.io/remote-cluster-id"] == "prov-a"  # the settings'
    assert labels["kubernetes.io/hostname"] == NODE
    assert labels["kubernetes.io/os"] == "linux"
    assert labels["node.kubernetes.io/exclude-from-external-load-balancers"] == "true", "kept off load balancers"
    assert labels["node.kubernetes.io/exclude-disruption"] == "true"
    assert n["spec"]["taints"] == [{"key": "gpufed.io/virtual-node", "value": "true", "effect": "NoExecute"}]
    status = n["status"]
    resources = {"cpu": "64", "memory": "256Gi", "pods": "110", "nvidia.com/gpu": "4"}
    assert status["capacity"] == resources
    assert status["allocatable"] == resources
    assert status["addresses"] == [{"type": "InternalIP", "address": "10.9.8.7"}], "no Hostname: it resolves nowhere"
    assert status["daemonEndpoints"] == {"kubeletEndpoint": {"Port": 10555}}
    conds = conditions(server)
    assert sorted(conds) == ["DiskPressure", "MemoryPressure", "NetworkUnavailable", "PIDPressure", "Ready"]
    assert (conds["Ready"]["status"], conds["Ready"]["reason"]) == ("True", "KubeletReady")
    assert all(conds[t]["status"] == "False" for t in conds if t != "Ready")
    assert len(server.calls("POST", "/api/v1/nodes")) == 1


async def test_status_change_is_patched_at_once_keeping_others_conditions(cluster: tuple[FakeApiServer, Any]) -> None:
    server, api = cluster
    provider = FakeProvider()
    # A heartbeat far away: what follows can only be the patch "at once on change".
    controller = NodeController(api, provider, dataclasses.replace(SETTINGS, status_interval_s=60))
    async with running(controller.run()):
        await until(controller.ready.is_set)
        foreign = {"type": "GPUHealthy", "status": "True", "reason": "DCGM", "message": "ok"}
        server.update("nodes", "", NODE, lambda n: n["status"]["conditions"].append(foreign))
        patches = len(server.calls("PATCH", f"/api/v1/nodes/{NODE}/status"))
        provider.state = node_state(ready=False, gpus="2")
        await until(lambda: conditions(server)["Ready"]["status"] == "False", timeout=5)
        # Nothing changes any more: no further patch in the next rounds (the heartbeat is not due).
        settled = len(server.calls("PATCH", f"/api/v1/nodes/{NODE}/status"))
        rounds = provider.state_reads
        gets = len(server.calls("GET", f"/api/v1/nodes/{NODE}"))
        await until(lambda: provider.state_reads >= rounds + 5)
        assert len(server.calls("PATCH", f"/api/v1/nodes/{NODE}/status")) == settled
        # The Node comes from the watch on its name: rounds read nothing from the API server.
        assert len(server.calls("GET", f"/api/v1/nodes/{NODE}")) == gets
    assert settled == patches + 1
    conds = conditions(server)
    assert conds["GPUHealthy"] == foreign
    assert conds["Ready"]["reason"] == "ProviderUnreachable"
    assert conds["Ready"]["message"] == "the provider's API does not answer"
    assert node(server)["status"]["allocatable"]["nvidia.com/gpu"] == "2"
    assert len(conds) == 6


async def test_lease_is_owned_by_the_node_and_renewed(cluster: tuple[FakeApiServer, Any]) -> None:
    server, api = cluster
    controller = NodeController(api, FakeProvider(), SETTINGS)
    async with running(controller.run()):
        await until(lambda: lease(server) is not None)
        first = lease(server)
        assert first is not None
        first_renew = first["spec"]["renewTime"]
        await until(lambda: (lease(server) or {})["spec"]["renewTime"] != first_renew)
    current = lease(server)
    assert current is not None
    assert current["spec"]["holderIdentity"] == NODE
    assert current["spec"]["leaseDurationSeconds"] == 40
    assert current["metadata"]["ownerReferences"] == [
        {"apiVersion": "v1", "kind": "Node", "name": NODE, "uid": node(server)["metadata"]["uid"]}
    ]
    assert current["metadata"]["uid"] == first["metadata"]["uid"]  # renewed, not recreated
    path = f"/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/{NODE}"
    assert len(server.calls("PUT", path)) >= 1
    assert len(server.calls("POST", "/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases")) == 1


async def test_a_deleted_node_is_registered_again(cluster: tuple[FakeApiServer, Any]) -> None:
    server, api = cluster
    controller = NodeController(api, FakeProvider(), SETTINGS)
    async with running(controller.run()):
        await until(controller.ready.is_set)
        old_uid = node(server)["metadata"]["uid"]
        server.remove("nodes", "", NODE)
        await until(lambda: server.get("nodes", "", NODE) is not None)
        await until(lambda: len(conditions(server)) == 5)
    assert node(server)["metadata"]["uid"] != old_uid
    assert node(server)["spec"]["taints"] == [VIRTUAL_NODE_TAINT]
    assert len(server.calls("POST", "/api/v1/nodes")) == 2


async def test_others_labels_and_taints_are_kept(cluster: tuple[FakeApiServer, Any]) -> None:
    server, api = cluster
    provider = FakeProvider()
    controller = NodeController(api, provider, SETTINGS)
    async with running(controller.run()):
        await until(controller.ready.is_set)
        theirs = {"key": "maintenance", "value": "yes", "effect": "NoSchedule"}

        def others(n: dict[str, Any]) -> None:
            n["metadata"]["labels"]["team"] = "ml"
            n["spec"]["taints"] = [theirs]  # someone replaced the list, dropping ours

        server.update("nodes", "", NODE, others)
        provider.state = node_state(labels=GPU)  # our labels change too
        await until(lambda: "nvidia.com/gpu.product" in node(server)["metadata"]["labels"])
        await until(lambda: len(node(server)["spec"]["taints"]) == 2)
    n = node(server)
    assert n["metadata"]["labels"]["team"] == "ml"
    assert n["metadata"]["labels"]["kubernetes.io/hostname"] == NODE
    assert n["spec"]["taints"] == [theirs, VIRTUAL_NODE_TAINT]
    label_patches = server.calls("PATCH", f"/api/v1/nodes/{NODE}")
    assert label_patches and all(r.content_type == "application/merge-patch+json" for r in label_patches)


async def test_remove_deletes_the_node(cluster: tuple[FakeApiServer, Any]) -> None:
    server, api = cluster
    controller = NodeController(api, FakeProvider(), SETTINGS)
    async with running(controller.run()):
        await until(controller.ready.is_set)
    await controller.remove()
    assert server.get("nodes", "", NODE) is None
    assert len(server.calls("DELETE", f"/api/v1/nodes/{NODE}")) == 1


async def test_heartbeat_patches_an_unchanged_status(cluster: tuple[FakeApiServer, Any]) -> None:
    server, api = cluster
    controller = NodeController(api, FakeProvider(), dataclasses.replace(SETTINGS, status_interval_s=0.05))
    path = f"/api/v1/nodes/{NODE}/status"
    async with running(controller.run()):
        await until(controller.ready.is_set)
        await until(lambda: len(server.calls("PATCH", path)) >= 3, what="heartbeats")
    beats = [r.body["status"]["conditions"] for r in server.calls("PATCH", path)]
    assert all([c["type"] for c in b] == [c["type"] for c in beats[0]] for b in beats)


async def test_an_existing_node_is_adopted_not_created(cluster: tuple[FakeApiServer, Any]) -> None:
    server, api = cluster
    theirs = {"key": "maintenance", "value": "yes", "effect": "NoSchedule"}
    foreign = {"type": "GPUHealthy", "status": "True", "reason": "DCGM", "message": "ok"}
    server.create(
        "nodes",
        {
            "metadata": {"name": NODE, "labels": {"team": "ml"}},
            "spec": {"taints": [theirs]},
            "status": {"conditions": [foreign]},
        },
    )
    uid = node(server)["metadata"]["uid"]
    controller = NodeController(api, FakeProvider(), SETTINGS)
    async with running(controller.run()):
        await until(controller.ready.is_set)
        await until(lambda: lease(server) is not None)
    n = node(server)
    assert n["metadata"]["uid"] == uid
    assert server.calls("POST", "/api/v1/nodes") == []
    assert n["metadata"]["labels"]["team"] == "ml"
    assert n["metadata"]["labels"]["gpufed.io/remote-cluster-id"] == "prov-a"
    assert n["spec"]["taints"] == [theirs, VIRTUAL_NODE_TAINT]
    assert conditions(server)["GPUHealthy"] == foreign
    assert len(conditions(server)) == 6
    current = lease(server)
    assert current is not None and current["metadata"]["ownerReferences"][0]["uid"] == uid


async def test_a_poke_as_the_controller_is_cancelled_does_not_keep_it_running(
    cluster: tuple[FakeApiServer, Any],
) -> None:
    # Pool nodes are poked on every pod event; a wake-up that lands with the cancellation must not
    # swallow it (Python 3.11's asyncio.wait_for does), or unpeer and SIGTERM never end the process.
    _server, api = cluster
    provider = FakeProvider()
    controller = NodeController(api, provider, dataclasses.replace(SETTINGS, state_poll_s=5.0))
    stuck = 0
    for _ in range(2):
        task = asyncio.create_task(controller.run())
        await until(controller.ready.is_set)
        await asyncio.sleep(0.05)  # waiting for a wake-up now
        controller.poke()
        task.cancel()
        done, _ = await asyncio.wait([task], timeout=5.0)
        if not done:
            stuck += 1
            task.cancel()
            await asyncio.wait([task], timeout=1.0)
    assert stuck == 0


async def test_coalesced_syncs_start_after_each_call_and_are_shared(
    cluster: tuple[FakeApiServer, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A burst of callers shares syncs (one running, at most one more waiting), and each caller returns
    only after a sync that started after its call; a failure reaches every waiter."""
    _server, api = cluster
    controller = NodeController(api, FakeProvider(), SETTINGS)
    started: list[int] = []
    gate = asyncio.Event()
    fail = False

    async def sync() -> None:
        started.append(len(started))
        await gate.wait()
        if fail:
            raise RuntimeError("API server down")

    monkeypatch.setattr(controller, "sync", sync)
    first = asyncio.create_task(controller.sync_coalesced())
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    assert started == [0], "the first caller's sync runs"
    later = [asyncio.create_task(controller.sync_coalesced()) for _ in range(10)]
    await asyncio.sleep(0)
    assert started == [0], "callers during a sync wait for the next one, not this one"
    gate.set()
    await asyncio.gather(first, *later)
    assert started == [0, 1], "ten callers, one more sync"
    gate.clear()
    fail = True
    failing = [asyncio.create_task(controller.sync_coalesced()) for _ in range(3)]
    await asyncio.sleep(0)
    gate.set()
    results = await asyncio.gather(*failing, return_exceptions=True)
    assert all(isinstance(r, RuntimeError) for r in results), results


async def test_a_status_read_earlier_is_never_written_after_one_read_later(
    cluster: tuple[FakeApiServer, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The status loop and a coalesced sync (a pod ending) may sync at once. When the first one's
    write is slow, the second must not write its newer state first: the first would then leave the
    older allocatable on the Node (a grant already lowered would look free to the scheduler)."""
    server, api = cluster
    provider = FakeProvider(state=node_state(gpus="8"))
    controller = NodeController(api, provider, dataclasses.replace(SETTINGS, status_interval_s=60))
    await controller.sync()  # registered
    provider.state = node_state(gpus="6")
    real_patch = rest.strategic_patch
    gate, held = asyncio.Event(), asyncio.Event()

    async def slow_first_patch(*args: Any, **kwargs: Any) -> Any:
        print("PATCH", args[2]["status"]["allocatable"]["nvidia.com/gpu"], held.is_set())
        if not held.is_set():
            held.set()
            await gate.wait()
        return await real_patch(*args, **kwargs)

    monkeypatch.setattr(rest, "strategic_patch", slow_first_patch)
    older = asyncio.create_task(controller.sync())  # reads 6 GPUs, then its write is slow
    await asyncio.wait_for(held.wait(), 5)
    provider.state = node_state(gpus="2")  # the grant is lowered meanwhile
    newer = asyncio.create_task(controller.sync())
    # Given its chance to write first (it cannot while the older sync holds the node, which is right).
    await asyncio.wait([newer], timeout=1.0)
    gate.set()
    await asyncio.gather(older, newer)
    print("FINAL", node(server)["status"]["allocatable"], newer.done())
    assert node(server)["status"]["allocatable"]["nvidia.com/gpu"] == "2", "the older read was written last"
