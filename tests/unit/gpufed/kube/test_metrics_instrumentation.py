"""The metrics the components keep: the pod controller (offload latency, pods by phase, fail-backs),
the work queue, the virtual node, the estimator, the peering roles, the gateway and the GPU agent,
each driven through the fakes its own tests use. The registry is global (other tests move the same
series), so every check compares a sample before and after."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import Callable, Iterator, MutableMapping
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from prometheus_client import REGISTRY
from structlog.testing import capture_logs

from gpufed.apis.meta import API_VERSION
from gpufed.apis.wire import ClusterID
from gpufed.kube.queue import WorkQueue
from gpupool.agent.agent import GPUAgent, GPUAgentError, GPUAgentSettings
from gpupool.capacity import PodShape
from gpupool.estimator.client import EstimatorError
from netfabric.controllers.gateway import GatewayAgent, GatewaySettings, Health
from netfabric.drivers.wireguard import PeerStats
from peering.controllers.consumer import ConsumerRole
from peering.controllers.identity import Identity
from peering.controllers.provider import ProviderRole
from tests.unit.fakes import FakeProvider, node_state, running, serve, until
from tests.unit.gpupool.agent.test_agent import StubReader, add_node, read
from tests.unit.gpupool.estimator import test_estimator as est
from tests.unit.vkprovider.node import test_pods as pc
from vkprovider.node.node import NodeController, NodeSettings
from vkprovider.node.provider import ProviderError


@pytest.fixture(autouse=True)
def _logs() -> Iterator[list[MutableMapping[str, Any]]]:
    with capture_logs() as logs:
        yield logs


def value(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


def counter(name: str, **labels: str) -> Callable[[], float]:
    """The increase of a sample since this call."""
    start = value(name, **labels)
    return lambda: value(name, **labels) - start


# ---- pod controller


async def test_offload_latency_and_phases_when_a_pod_goes_running() -> None:
    created = counter("gpufed_offload_latency_seconds_count", node=pc.NODE, stage="created")
    ran = counter("gpufed_offload_latency_seconds_count", node=pc.NODE, stage="running")
    took = counter("gpufed_offload_latency_seconds_sum", node=pc.NODE, stage="running")
    pending = counter("gpufed_offloaded_pods", node=pc.NODE, phase="Pending")
    running_pods = counter("gpufed_offloaded_pods", node=pc.NODE, phase="Running")
    async with pc.started() as env:
        env.server.create("pods", pc.pod("web"))
        await until(lambda: pending() == 1, what="one pod pending")
        await until(lambda: env.provider.twin(pc.NS, "web") is not None, what="twin created")
        await until(lambda: created() == 1, what="created stage observed")
        assert ran() == 0
        env.provider.set_phase(pc.NS, "web", "Running")
        await until(lambda: ran() == 1, what="running stage observed")
        await until(lambda: (pending(), running_pods()) == (0, 1), what="the pod counted as running")
        assert 0 < took() < 1.5
        env.provider.set_phase(pc.NS, "web", "Running", pod_ip="10.244.1.8")  # Running again: not counted again
        await until(lambda: env.status("web").get("podIP") == "10.244.1.8", what="new IP")
        env.provider.set_phase(pc.NS, "web", "Failed")
        await until(lambda: env.status("web").get("phase") == "Failed", what="status Failed")
        assert (created(), ran()) == (1, 1)
        await until(lambda: running_pods() == 0, what="no longer running")
        assert value("gpufed_offloaded_pods", node=pc.NODE, phase="Failed") >= 1
    # The controller stopped: its node's pods are no longer counted.
    assert value("gpufed_offloaded_pods", node=pc.NODE, phase="Failed") == 0


async def test_a_pod_running_when_first_seen_is_not_an_offload() -> None:
    ran = counter("gpufed_offload_latency_seconds_count", node=pc.NODE, stage="running")
    provider = FakeProvider()
    provider.seed(pc.NS, "adopted", "uid-adopted")
    async with pc.started(provider, [pc.pod("adopted", "uid-adopted", phase="Running")]) as env:
        await until(lambda: any(k == (pc.NS, "adopted") for k, _ in env.controller.handled), what="reconciled")
        assert value("gpufed_offloaded_pods", node=pc.NODE, phase="Running") == 1
    assert ran() == 0


async def test_failed_back_pods_are_counted_by_reason() -> None:
    failed_back = counter("gpufed_pods_failed_back_total", node=pc.NODE, reason="GPUUnplaceable")
    provider = FakeProvider()
    provider.refuse[(pc.NS, "train")] = ProviderError("no node has 8 GPUs", reason="GPUUnplaceable", fail_back=True)
    async with pc.started(provider) as env:
        env.server.create("pods", pc.pod("train"))
        await until(lambda: env.status("train").get("phase") == "Failed", what="failed back")
        await until(lambda: failed_back() == 1, what="counted")


# ---- work queue


async def test_queue_depth_latency_work_and_retries_move() -> None:
    name = f"metrics-{uuid.uuid4().hex[:8]}"
    q: WorkQueue[str] = WorkQueue(name, base_delay=0.01)
    labels = {"queue": name}
    q.add("a")
    q.add("b")
    q.add("c", delay=30)
    assert value("gpufed_workqueue_depth", **labels) == 3
    release = asyncio.Event()
    failed_once: set[str] = set()

    async def handler(key: str) -> None:
        await release.wait()
        if key == "b" and key not in failed_once:
            failed_once.add(key)
            raise RuntimeError("boom")

    task = asyncio.create_task(q.run(handler, workers=2))
    try:
        await until(lambda: value("gpufed_workqueue_depth", **labels) == 1, what="two keys taken")
        assert value("gpufed_workqueue_latency_seconds_count", **labels) == 2
        await asyncio.sleep(0.05)
        release.set()
        await until(lambda: value("gpufed_workqueue_work_seconds_count", **labels) == 3, what="a, b, b again")
        assert value("gpufed_workqueue_retries_total", **labels) == 1
        assert value("gpufed_workqueue_latency_seconds_count", **labels) == 3
        assert value("gpufed_workqueue_work_seconds_sum", **labels) >= 0.1  # a and b waited 0.05 s each
        assert value("gpufed_workqueue_depth", **labels) == 1  # c, due later
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


# ---- virtual node


async def test_node_ready_allocatable_and_lease_renewals() -> None:
    name = "gpufed-metrics-node"
    renewals = counter("gpufed_node_lease_renewals_total", node=name, outcome="ok")
    settings = NodeSettings(name=name, lease_renew_s=0.02, state_poll_s=0.02)
    async with serve() as (_server, api):
        provider = FakeProvider(state=node_state(gpus="8"))
        controller = NodeController(api, provider, settings)
        async with running(controller.run()):
            await until(controller.ready.is_set, what="node registered")
            assert value("gpufed_node_ready", node=name) == 1
            assert value("gpufed_node_allocatable", node=name, resource="nvidia.com/gpu", unit="integer") == 8
            assert value("gpufed_node_allocatable", node=name, resource="cpu", unit="core") > 0
            assert value("gpufed_node_allocatable", node=name, resource="memory", unit="byte") > 0
            provider.state = node_state(ready=False, gpus="2")
            controller.poke()
            await until(lambda: value("gpufed_node_ready", node=name) == 0, what="not ready")
            assert value("gpufed_node_allocatable", node=name, resource="nvidia.com/gpu", unit="integer") == 2
            await until(lambda: renewals() >= 2, what="lease renewed")
        await controller.remove()
    assert REGISTRY.get_sample_value("gpufed_node_ready", {"node": name}) is None
    gone = {"node": name, "resource": "nvidia.com/gpu", "unit": "integer"}
    assert REGISTRY.get_sample_value("gpufed_node_allocatable", gone) is None


# ---- estimator


async def test_estimator_counts_answers_refusals_and_watch_streams() -> None:
    ok = counter("gpufed_estimator_requests_total", method="GetCapacity", outcome="ok")
    placed = counter("gpufed_estimator_requests_total", method="CanPlace", outcome="ok")
    denied = counter("gpufed_estimator_requests_total", method="GetCapacity", outcome="permission_denied")
    watches = counter("gpufed_estimator_requests_total", method="Watch", outcome="ok")
    streams = counter("gpufed_estimator_watch_streams")
    async with est.started() as r:
        async with r.client() as c:
            await c.get_capacity()
            await c.can_place(PodShape(gpus=1))
            stream = c.watch(idle_timeout_s=2)
            await anext(stream)
            await until(lambda: streams() == 1, what="a stream open")
            await stream.aclose()
        await until(lambda: streams() == 0, what="the stream closed")
        async with r.client(est.CLUSTER_CA.issue("gpufed:virtual-kubelet")) as stranger:
            with pytest.raises(EstimatorError):
                await stranger.get_capacity()
    assert (ok(), placed(), watches(), denied()) == (1, 1, 1, 1)


# ---- peering roles


def _identity(cluster: str) -> Identity:
    return Identity(ClusterID(cluster), "", Ed25519PrivateKey.generate())


def phases(remote: str, role: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for family in REGISTRY.collect():
        for s in family.samples:
            if s.name == "gpufed_peering_phase" and (s.labels["remote_cluster"], s.labels["role"]) == (remote, role):
                out[s.labels["phase"]] = s.value
    return out


async def test_peering_phase_of_both_roles() -> None:
    consumer_id, provider_id = "cons-metrics-0001", "prov-metrics-0001"
    async with serve() as (server, api):
        server.create(
            "tenants",
            {"metadata": {"name": consumer_id}, "spec": {"consumerClusterId": consumer_id, "publicKey": "k"}},
            api_version=API_VERSION,
        )
        server.create(
            "foreignclusters",
            {"metadata": {"name": provider_id}, "spec": {"clusterId": provider_id, "roles": ["Provider"]}},
            api_version=API_VERSION,
        )
        await ProviderRole(api, _identity(provider_id)).reconcile(consumer_id)
        assert phases(consumer_id, "provider") == {"Pending": 0, "Challenged": 1, "Authenticated": 0, "Refused": 0}
        await ConsumerRole(api, _identity(consumer_id)).reconcile(provider_id)
        assert phases(provider_id, "consumer") == {"Pending": 1, "Authenticating": 0, "Peered": 0}
        server.remove("tenants", "", consumer_id)
        server.remove("foreignclusters", "", provider_id)
        await ProviderRole(api, _identity(provider_id)).reconcile(consumer_id)
        await ConsumerRole(api, _identity(consumer_id)).reconcile(provider_id)
    assert phases(consumer_id, "provider") == {} and phases(provider_id, "consumer") == {}


# ---- gateway


async def test_tunnel_up_rtt_and_handshake_follow_the_probes() -> None:
    peer = "gw-metrics-0001"
    async with serve() as (_server, api):
        agent = GatewayAgent(api, GatewaySettings(name=peer), drivers=[], clock=lambda: 1_700_000_100.0)
        agent.health = Health(0, 0.42, PeerStats(1_700_000_000.0, 1, 1))
        await agent.publish()
        assert value("gpufed_tunnel_up", remote_cluster=peer) == 1
        assert value("gpufed_tunnel_rtt_seconds", remote_cluster=peer) == pytest.approx(0.00042)
        assert value("gpufed_tunnel_last_handshake_timestamp_seconds", remote_cluster=peer) == 1_700_000_000.0
        agent.health = Health(5, None, PeerStats(None, 1, 1))
        await agent.publish()
        assert value("gpufed_tunnel_up", remote_cluster=peer) == 0
        assert value("gpufed_tunnel_last_handshake_timestamp_seconds", remote_cluster=peer) == 0


# ---- GPU agent


async def test_gpu_agent_counts_passes_by_outcome() -> None:
    changed = counter("gpufed_gpu_agent_publishes_total", outcome="changed")
    unchanged = counter("gpufed_gpu_agent_publishes_total", outcome="unchanged")
    failed = counter("gpufed_gpu_agent_publishes_total", outcome="failed")
    async with serve() as (server, api):
        add_node(server)
        agent = GPUAgent(api, StubReader(read("h100x8")[0]), GPUAgentSettings(node="gpu-node-1"))
        await agent.sync()
        await agent.sync()
        assert value("gpufed_gpu_agent_gpus") == 8
        missing = GPUAgent(api, StubReader(read("h100x8")[0]), GPUAgentSettings(node="no-such-node"))
        with pytest.raises(GPUAgentError):
            await missing.sync()
    assert (changed(), unchanged(), failed()) == (1, 1, 1)
