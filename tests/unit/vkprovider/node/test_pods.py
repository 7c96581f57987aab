"""PodController against the fake API server and FakeProvider: twin creation and status, refusals,
graceful and forced deletion, startup reconciliation, and terminal pods left alone."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping, MutableMapping, Sequence
from dataclasses import dataclass
from typing import Any

import pytest
from structlog.testing import capture_logs

from gpufed.apis.wire import GANG_LABEL
from tests.unit.fakes import FakeApiServer, FakeProvider, running, serve, until
from vkprovider.node.pods import Key, PodController, PodSettings, uneventful, unplaced_timeout
from vkprovider.node.provider import ProviderError

NODE = "gpufed-prov-a"
NS = "team"
SETTINGS = PodSettings(workers=4, max_retry_s=0.05, deletion_poll_s=0.05, status_debounce_s=0.0)


@pytest.fixture(autouse=True)
def _logs() -> Iterator[list[MutableMapping[str, Any]]]:
    with capture_logs() as logs:
        yield logs


class Recording(PodController):
    """Records each finished reconcile with the phase of the twin it saw (None: no twin)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.handled: list[tuple[Key, str | None]] = []

    async def reconcile(self, key: Key) -> float | None:
        twin = self.provider.twin(*key)
        seen = (twin.raw.get("status") or {}).get("phase") if twin is not None else None
        try:
            return await super().reconcile(key)
        finally:
            self.handled.append((key, seen))


@dataclass
class Env:
    server: FakeApiServer
    api: Any
    provider: FakeProvider
    controller: Recording

    def status(self, name: str) -> dict[str, Any]:
        pod = self.server.get("pods", NS, name)
        assert pod is not None, f"pod {name} is gone"
        status: dict[str, Any] = pod["status"]
        return status

    def status_patches(self, name: str) -> list[dict[str, Any]]:
        return [r.body for r in self.server.calls("PATCH", f"/api/v1/namespaces/{NS}/pods/{name}/status")]


def pod(name: str, uid: str = "", *, phase: str = "Pending", node: str = NODE, grace: int = 45) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": NS, "uid": uid or str(uuid.uuid4())},
        "spec": {
            "nodeName": node,
            "terminationGracePeriodSeconds": grace,
            "containers": [{"name": "main", "image": "registry.example/train:1"}],
        },
        "status": {"phase": phase, "qosClass": "Guaranteed"},
    }


@contextlib.asynccontextmanager
async def started(
    provider: FakeProvider | None = None,
    pods: Sequence[dict[str, Any]] = (),
    releasing: Callable[[Mapping[str, Any]], Awaitable[None]] | None = None,
) -> AsyncIterator[Env]:
    async with serve() as (server, api):
        for p in pods:
            server.create("pods", p)
        provider = provider or FakeProvider()
        env = Env(server, api, provider, Recording(api, provider, NODE, SETTINGS, releasing=releasing))
        async with running(env.controller.run()):
            await until(env.controller.ready.is_set)
            yield env


async def running_twin(env: Env, name: str) -> str:
    """Creates a local pod and waits until its twin runs and the local status says so; its UID."""
    p = pod(name)
    env.server.create("pods", p)
    await until(lambda: env.provider.twin(NS, name) is not None, what="twin created")
    env.provider.set_phase(NS, name, "Running")
    await until(lambda: env.status(name).get("phase") == "Running", what="status Running")
    uid: str = p["metadata"]["uid"]
    return uid


async def test_twin_created_and_status_reflected() -> None:
    elsewhere = pod("elsewhere", node="another-node")
    async with started(pods=[elsewhere]) as env:
        p = pod("web")
        env.server.create("pods", p)
        await until(lambda: env.provider.twin(NS, "web") is not None)
        env.provider.set_phase(NS, "web", "Running", pod_ip="10.244.1.7")
        await until(lambda: env.status("web").get("phase") == "Running")
        status = env.status("web")
        patches = env.status_patches("web")
    assert env.provider.creates == [(NS, "web", p["metadata"]["uid"])]
    assert status["podIP"] == "10.244.1.7"
    assert status["podIPs"] == [{"ip": "10.244.1.7"}]
    assert status["hostIP"] == env.provider.host_ip
    assert status["hostIPs"] == [{"ip": env.provider.host_ip}]
    assert status["containerStatuses"][0]["state"] == {"running": {"startedAt": "2024-01-01T00:00:01Z"}}
    assert status["qosClass"] == "Guaranteed"
    assert patches and all("qosClass" not in body["status"] for body in patches)
    requests = env.server.calls("PATCH", f"/api/v1/namespaces/{NS}/pods/web/status")
    assert {r.content_type for r in requests} == {"application/strategic-merge-patch+json"}
    assert ("another-node", "elsewhere") not in env.provider.create_attempts
    assert (NS, "elsewhere") not in env.provider.create_attempts


async def test_refusal_is_reported_retried_and_cleared() -> None:
    provider = FakeProvider()
    message = "exceeded quota: gpufed-grant, requested: nvidia.com/gpu=8"
    provider.refuse[(NS, "web")] = ProviderError(message, reason="QuotaExceeded")
    async with started(provider) as env:
        p = pod("web")
        env.server.create("pods", p)
        await until(lambda: env.status("web").get("reason") == "ProviderFailed")
        assert env.status("web")["message"] == message
        await until(lambda: provider.create_attempts.get((NS, "web"), 0) >= 3, what="retries")
        await until(lambda: env.server.items("events", NS)[0]["count"] >= 2, what="repeats counted")
        (event,) = env.server.items("events", NS)
        del provider.refuse[(NS, "web")]
        await until(lambda: provider.twin(NS, "web") is not None)
        await until(lambda: "reason" not in env.status("web"), what="reason cleared")
        status = env.status("web")
    assert "message" not in status
    assert status["phase"] == "Pending"
    assert provider.creates == [(NS, "web", p["metadata"]["uid"])]
    assert event["type"] == "Warning"
    assert event["reason"] == "QuotaExceeded"
    assert event["message"] == message
    assert event["involvedObject"] == {
        "apiVersion": "v1",
        "kind": "Pod",
        "name": "web",
        "namespace": NS,
        "uid": p["metadata"]["uid"],
    }


async def test_graceful_deletion() -> None:
    async with started() as env:
        uid = await running_twin(env, "web")

        def kubectl_delete(p: dict[str, Any]) -> None:  # what the API server does with a grace period
            p["metadata"]["deletionTimestamp"] = "2024-01-01T00:10:00Z"
            p["metadata"]["deletionGracePeriodSeconds"] = 45

        env.server.update("pods", NS, "web", kubectl_delete)
        await until(lambda: env.provider.deletes == [(NS, "web", uid, 45)], what="twin stopped")
        twin = env.provider.twin(NS, "web")
        assert twin is not None and twin.deleting
        # Its containers still run until the twin is gone: the node still lists it as running.
        assert [p["metadata"]["uid"] for p in env.controller.running_pods()] == [uid]
        # The twin is still stopping: the local pod stays.
        await until(lambda: any(k == (NS, "web") and phase == "Running" for k, phase in env.controller.handled[-3:]))
        assert env.server.get("pods", NS, "web") is not None
        assert env.server.calls("DELETE", f"/api/v1/namespaces/{NS}/pods/web") == []
        env.provider.vanish(NS, "web")
        await until(lambda: env.server.get("pods", NS, "web") is None, what="local pod deleted")
        assert env.controller.running_pods() == []
    final = env.server.deleted("pods", NS, "web")
    assert final is not None
    (container,) = final["status"]["containerStatuses"]
    terminated = container["state"]["terminated"]
    assert (terminated["exitCode"], terminated["reason"]) == (137, "Killed")
    assert terminated["startedAt"] == "2024-01-01T00:00:01Z"
    assert container["ready"] is False
    conditions = {c["type"]: c for c in final["status"]["conditions"]}
    assert conditions["Ready"]["status"] == "False" and conditions["Ready"]["reason"] == "PodDeleted"
    # One delete: a reconcile started by an event from before the DELETED event does not repeat it.
    (delete,) = env.server.calls("DELETE", f"/api/v1/namespaces/{NS}/pods/web")
    assert delete.body["gracePeriodSeconds"] == 0
    assert delete.body["preconditions"] == {"uid": uid}
    assert env.provider.deletes == [(NS, "web", uid, 45)]


async def test_force_deleted_pod_removes_its_twin() -> None:
    async with started() as env:
        uid = await running_twin(env, "web")
        assert [p["metadata"]["uid"] for p in env.controller.running_pods()] == [uid]
        env.server.remove("pods", NS, "web")
        # Gone here: no longer listed as running, whatever its twin is still doing.
        await until(lambda: env.controller.running_pods() == [], what="pod no longer listed as running")
        await until(lambda: env.provider.twin(NS, "web") is None, what="twin deleted")
    assert env.provider.deletes == [(NS, "web", uid, 0)]
    assert env.server.calls("DELETE", f"/api/v1/namespaces/{NS}/pods/web") == []


async def test_startup_reconciliation() -> None:
    provider = FakeProvider()
    provider.seed(NS, "orphan", "uid-orphan")  # its local pod is gone
    provider.seed(NS, "web-0", "uid-old")  # an earlier pod of the same name
    provider.seed(NS, "adopted", "uid-adopted")  # still the twin of its pod
    local = [
        pod("web-0", "uid-new"),
        pod("adopted", "uid-adopted"),
        pod("done", "uid-done", phase="Succeeded"),
        pod("lost", "uid-lost"),
    ]
    async with started(provider, local) as env:
        await until(lambda: env.status("adopted").get("phase") == "Running", what="adopted status")
        await until(lambda: getattr(provider.twin(NS, "web-0"), "origin_uid", "") == "uid-new", what="web-0 again")
        await until(lambda: provider.twin(NS, "lost") is not None, what="lost recreated")
        await until(lambda: provider.twin(NS, "orphan") is None, what="orphan deleted")
        await until(lambda: any(k == (NS, "done") for k, _ in env.controller.handled), what="done reconciled")
    assert sorted(provider.creates) == [(NS, "lost", "uid-lost"), (NS, "web-0", "uid-new")]
    assert sorted(provider.deletes) == [(NS, "orphan", "uid-orphan", 0), (NS, "web-0", "uid-old", 0)]
    assert (NS, "done") not in provider.create_attempts
    assert env.status_patches("done") == []
    assert (NS, "adopted") not in provider.create_attempts


async def test_succeeded_pod_is_never_patched_again() -> None:
    async with started() as env:
        await running_twin(env, "job")
        # The controller's own write of the terminal phase has not come back through its watch yet
        # when the twin changes again: the terminal phase must stick all the same.
        env.server.flowing.clear()
        env.provider.set_phase(NS, "job", "Succeeded")
        await until(lambda: env.status("job").get("phase") == "Succeeded")
        env.provider.set_phase(NS, "job", "Failed")  # the twin changes afterwards
        await until(lambda: ((NS, "job"), "Failed") in env.controller.handled, what="reconciled after the change")
        assert all(body["status"]["phase"] != "Failed" for body in env.status_patches("job"))
        env.server.flowing.set()
        patches = len(env.status_patches("job"))
        mark = len(env.controller.handled)
        env.provider.set_phase(NS, "job", "Running")  # even a twin that looks alive again
        await until(lambda: ((NS, "job"), "Running") in env.controller.handled[mark:], what="reconciled again")
        status = env.status("job")
    assert len(env.status_patches("job")) == patches
    assert status["phase"] == "Succeeded"
    assert status["containerStatuses"][0]["state"]["terminated"]["exitCode"] == 0
    assert env.server.calls("DELETE", f"/api/v1/namespaces/{NS}/pods/job") == []


async def test_container_state_is_replaced_when_the_twin_starts() -> None:
    async with started() as env:
        env.server.create("pods", pod("web"))
        await until(lambda: env.provider.twin(NS, "web") is not None)
        env.provider.set_phase(NS, "web", "Pending")  # waiting: ContainerCreating
        await until(lambda: "containerStatuses" in env.status("web"))
        env.provider.set_phase(NS, "web", "Running")
        await until(lambda: env.status("web").get("phase") == "Running")
        state = env.status("web")["containerStatuses"][0]["state"]
    assert state == {"running": {"startedAt": "2024-01-01T00:00:01Z"}}


async def test_container_state_of_a_deleted_pod_is_only_terminated() -> None:
    async with started() as env:
        await running_twin(env, "web")
        env.server.update("pods", NS, "web", lambda p: p["metadata"].update(deletionTimestamp="2024-01-01T00:10:00Z"))
        await until(lambda: env.provider.twin(NS, "web") is None)  # grace 0: gone at once
        await until(lambda: env.server.get("pods", NS, "web") is None)
    final = env.server.deleted("pods", NS, "web")
    assert final is not None
    assert list(final["status"]["containerStatuses"][0]["state"]) == ["terminated"]


async def test_pod_the_provider_cannot_place_is_failed_back() -> None:
    provider = FakeProvider()
    message = "provider prov-a cannot place this pod (8 GPUs): no node has 8 free GPUs (largest: 4)"
    provider.refuse[(NS, "train")] = ProviderError(message, reason="GPUUnplaceable", fail_back=True)
    async with started(provider) as env:
        p = pod("train")
        env.server.create("pods", p)
        await until(lambda: env.status("train").get("phase") == "Failed", what="failed back")
        await until(lambda: bool(env.server.items("events", NS)), what="event")
        status = env.status("train")
        (event,) = env.server.items("events", NS)
        attempts = provider.create_attempts[(NS, "train")]
    assert attempts == 1  # never retried: the pod's owner replaces it
    assert provider.creates == []
    assert (status["reason"], status["message"]) == ("GPUUnplaceable", message)
    disruption = [c for c in status["conditions"] if c["type"] == "DisruptionTarget"]
    assert disruption and disruption[0]["status"] == "True"
    assert status["containerStatuses"][0]["state"]["terminated"]["exitCode"] == 137
    assert (event["type"], event["reason"], event["message"]) == ("Warning", "GPUUnplaceable", message)


async def test_twin_left_unplaced_is_deleted_then_the_pod_failed_back() -> None:
    provider = FakeProvider()
    settings = PodSettings(workers=4, max_retry_s=0.05, deletion_poll_s=0.05, unplaced_timeout_s=0.4)
    async with serve() as (server, api):
        env = Env(server, api, provider, Recording(api, provider, NODE, settings))
        async with running(env.controller.run()):
            await until(env.controller.ready.is_set)
            p = pod("train")
            server.create("pods", p)
            await until(lambda: provider.twin(NS, "train") is not None, what="twin created")
            uid = p["metadata"]["uid"]
            provider.unplaced(NS, "train", time.time())
            await until(lambda: env.status("train").get("phase") == "Failed", what="failed back", timeout=5)
            status = env.status("train")
            await asyncio.sleep(0.2)  # nothing creates it again
    assert status["reason"] == "ProviderPendingTimeout"
    assert "did not place the pod within 0.4s" in status["message"]
    assert (NS, "train", uid, 0) in provider.deletes
    assert provider.twin(NS, "train") is None
    assert provider.creates == [(NS, "train", uid)]


async def test_a_group_is_failed_back_whole_when_one_twin_is_not_placed() -> None:
    provider = FakeProvider()
    settings = PodSettings(workers=4, max_retry_s=0.05, deletion_poll_s=0.05, unplaced_timeout_s=0.4)
    async with serve() as (server, api):
        env = Env(server, api, provider, Recording(api, provider, NODE, settings))
        async with running(env.controller.run()):
            await until(env.controller.ready.is_set)
            members = [pod(f"w-{i}") for i in range(3)]
            alone = pod("alone")
            for p in [*members, alone]:
                if p is not alone:
                    p["metadata"]["labels"] = {GANG_LABEL: "ring"}
                server.create("pods", p)
            await until(lambda: all(provider.twin(NS, f"w-{i}") is not None for i in range(3)), what="twins")
            await until(lambda: provider.twin(NS, "alone") is not None, what="twin of the pod on its own")
            for i in range(3):
                provider.set_phase(NS, f"w-{i}", "Running")
            provider.set_phase(NS, "alone", "Running")
            await until(lambda: env.status("w-1").get("phase") == "Running", what="running")
            # the provider loses one twin's placement: it stays unplaced past the timeout
            provider.set_phase(NS, "w-0", "Pending")
            provider.unplaced(NS, "w-0", time.time())
            await until(
                lambda: all(env.status(f"w-{i}").get("phase") == "Failed" for i in range(3)), what="group failed back"
            )
            await asyncio.sleep(0.2)
            statuses = {f"w-{i}": env.status(f"w-{i}") for i in range(3)}
            alone_phase = env.status("alone").get("phase")
    assert statuses["w-0"]["reason"] == "ProviderPendingTimeout"
    for name in ("w-1", "w-2"):
        assert statuses[name]["reason"] == "GangFailedBack"
        assert "w-0 of its group was failed back" in statuses[name]["message"]
        assert provider.twin(NS, name) is None
    assert alone_phase == "Running", "a pod of no group is left alone"


async def test_twin_placed_before_the_timeout_is_kept() -> None:
    provider = FakeProvider()
    settings = PodSettings(workers=4, max_retry_s=0.05, deletion_poll_s=0.05, unplaced_timeout_s=0.5)
    async with serve() as (server, api):
        env = Env(server, api, provider, Recording(api, provider, NODE, settings))
        async with running(env.controller.run()):
            await until(env.controller.ready.is_set)
            server.create("pods", pod("train"))
            await until(lambda: provider.twin(NS, "train") is not None, what="twin created")
            provider.unplaced(NS, "train", time.time())
            await asyncio.sleep(0.2)
            provider.unplaced(NS, "train", None)
            provider.set_phase(NS, "train", "Running")
            await until(lambda: env.status("train").get("phase") == "Running", what="running")
            await asyncio.sleep(0.6)  # past the timeout
            status = env.status("train")
    assert status["phase"] == "Running"
    assert provider.deletes == []


async def test_node_is_told_before_a_pod_stops_holding_its_resources() -> None:
    provider = FakeProvider()
    order: list[str] = []
    envs: list[Env] = []

    async def releasing(pod: Any) -> None:
        phase = envs[0].status(pod["metadata"]["name"]).get("phase")
        order.append(f"release while {phase}")

    async with started(provider, releasing=releasing) as env:
        envs.append(env)
        await running_twin(env, "job")
        provider.set_phase(NS, "job", "Succeeded")
        await until(lambda: env.status("job").get("phase") == "Succeeded", what="succeeded")
    assert order == ["release while Running"]  # awaited before the terminal status was written


def test_a_pod_may_ask_for_a_shorter_unplaced_timeout_only() -> None:
    def pod(value: str | None) -> dict[str, Any]:
        annotations = {} if value is None else {"gpufed.io/unplaced-timeout-seconds": value}
        return {"metadata": {"name": "p", "annotations": annotations}}

    assert unplaced_timeout(pod(None), 120.0) == 120.0
    assert unplaced_timeout(pod("30"), 120.0) == 30.0
    assert unplaced_timeout(pod("12.5"), 120.0) == 12.5
    for ignored in ("600", "5", "-1", "nan", "inf", "soon", ""):
        assert unplaced_timeout(pod(ignored), 120.0) == 120.0, ignored
    assert unplaced_timeout(pod("30"), None) is None, "a node that never fails back keeps never"


async def test_a_new_twins_pending_states_are_held_back_so_one_that_runs_at_once_costs_one_patch() -> None:
    provider = FakeProvider()
    settings = dataclasses.replace(SETTINGS, status_debounce_s=2.0)
    async with serve() as (server, api):
        env = Env(server, api, provider, Recording(api, provider, NODE, settings))
        async with running(env.controller.run()):
            await until(env.controller.ready.is_set)
            for name in ("quick", "slow", "broken"):
                server.create("pods", pod(name))
            await until(lambda: all(provider.twin(NS, n) is not None for n in ("quick", "slow", "broken")))
            provider.set_phase(NS, "slow", "Pending")
            provider.set_phase(NS, "quick", "Pending")
            # a waiting reason that says more than "starting" is reported at once
            provider.set_phase(NS, "broken", "Pending", waiting="ErrImagePull")
            await until(lambda: bool(env.status_patches("broken")), what="broken reported")
            assert env.status_patches("quick") == [] and env.status_patches("slow") == []
            provider.set_phase(NS, "quick", "Running", pod_ip="10.244.1.9")
            await until(lambda: env.status("quick").get("phase") == "Running", what="quick Running")
            # the one still Pending is reported once the hold is over
            await until(lambda: "containerStatuses" in env.status("slow"), what="slow reported", timeout=6)
    assert [b["status"].get("phase") for b in env.status_patches("quick")] == ["Running"]
    assert [b["status"].get("phase") for b in env.status_patches("slow")] == ["Pending"]


def test_only_a_starting_pods_status_is_uneventful() -> None:
    waiting = {"name": "main", "state": {"waiting": {"reason": "ContainerCreating"}, "running": None}}
    assert uneventful({"status": {"phase": "Pending", "containerStatuses": [waiting]}})
    assert uneventful({"status": {"phase": "Pending"}})
    pulling = {"name": "main", "state": {"waiting": {"reason": "ErrImagePull"}}}
    assert not uneventful({"status": {"phase": "Pending", "containerStatuses": [pulling]}})
    unschedulable = {"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}
    assert not uneventful({"status": {"phase": "Pending", "conditions": [unschedulable]}})
    assert not uneventful({"status": {"phase": "Running"}})
