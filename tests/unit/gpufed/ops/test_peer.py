"""gpufed.ops.peer: `gpufed peer`'s virtual-node step (it returns once the provider's virtual nodes
are Ready and fails with an explanation when they are not), and how `peer` and `unpeer` compose the
handshake, the network fabric and that wait."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from gpufed.apis.wire import REMOTE_CLUSTER_LABEL, TYPE_LABEL, VIRTUAL_NODE_TYPE, ClusterID
from gpufed.ops import force_unpeer
from gpufed.ops import peer as ops
from gpufed.ops.peer import VirtualNodeReady
from netfabric import ops as network_ops
from netfabric.ops import NetworkOptions, NetworkStep
from peering.ops import peer as peering_ops
from peering.ops.peer import ClusterRef, PeerError, PeerRequest, PeerResult, Peers
from tests.unit.fakes import FakeApiServer, Recorder, serve

PROVIDER = ClusterID("gpu-a-12345678")


def _peers(api: Any) -> Peers:
    return Peers(api, None, ClusterID("consumer-12345678"), PROVIDER, "", "", "")


def _node(server: FakeApiServer, name: str, provider: str, *, ready: bool) -> None:
    server.create(
        "nodes",
        {
            "kind": "Node",
            "metadata": {"name": name, "labels": {TYPE_LABEL: VIRTUAL_NODE_TYPE, REMOTE_CLUSTER_LABEL: provider}},
            "status": {"conditions": [{"type": "Ready", "status": "True" if ready else "False"}]},
        },
    )


async def test_returns_when_the_virtual_node_becomes_ready() -> None:
    async with serve() as (server, api):
        _node(server, "gpufed-other", "other-cluster", ready=True)  # another provider's node does not count
        report = Recorder()
        task = asyncio.create_task(VirtualNodeReady(5).run(_peers(api), report))
        await asyncio.sleep(0.6)
        assert not task.done()
        _node(server, f"gpufed-{PROVIDER}", PROVIDER, ready=False)
        await asyncio.sleep(0.6)
        assert not task.done()

        def ready(node: dict[str, Any]) -> None:
            node["status"]["conditions"][0]["status"] = "True"

        server.update("nodes", "", f"gpufed-{PROVIDER}", ready)
        await asyncio.wait_for(task, 10)
        assert report.lines == [f"done virtual node gpufed-{PROVIDER} Ready"]


async def test_times_out_naming_the_node_that_is_not_ready() -> None:
    async with serve() as (server, api):
        _node(server, f"gpufed-{PROVIDER}", PROVIDER, ready=False)
        with pytest.raises(PeerError, match=rf"not Ready after 1 s \(gpufed-{PROVIDER} not Ready\)"):
            await VirtualNodeReady(1).run(_peers(api), Recorder())


async def test_times_out_when_no_node_registers() -> None:
    async with serve() as (_server, api):
        with pytest.raises(PeerError, match=r"no virtual node registered yet.*gpufed controller"):
            await VirtualNodeReady(0.5).run(_peers(api), Recorder())


def _request() -> PeerRequest:
    kc = Path("/nonexistent")
    return PeerRequest(ClusterRef(kc, None, "consumer"), ClusterRef(kc, None, "provider"), {"cpu": "1"}, timeout_s=7)


def _result() -> PeerResult:
    return PeerResult("consumer-12345678", str(PROVIDER), True, "Granted", "", {"cpu": "1"}, {"cpu": "1"})


async def test_peer_runs_the_network_after_authentication_and_waits_for_the_node_after_the_grant(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    seen: dict[str, Any] = {}

    async def fake_peer(req: PeerRequest, report: Any, *, after_auth: Any = (), after_grant: Any = ()) -> PeerResult:
        seen.update(req=req, report=report, after_auth=list(after_auth), after_grant=list(after_grant))
        return _result()

    monkeypatch.setattr(peering_ops, "peer", fake_peer)
    req, report, opts = _request(), Recorder(), NetworkOptions(mtu=1400)
    assert await ops.peer(ops.PeerSettings(req, opts), report) == _result()
    assert seen["req"] is req and seen["report"] is report
    assert [type(s) for s in seen["after_auth"]] == [NetworkStep] and seen["after_auth"][0].opts is opts
    assert [type(s) for s in seen["after_grant"]] == [VirtualNodeReady]
    assert seen["after_grant"][0].timeout_s == 7

    await ops.peer(ops.PeerSettings(req, None), report)
    assert seen["after_auth"] == [], "no network options: control plane only"


async def test_unpeer_removes_the_network_first_then_the_peering(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str] = []

    async def fake_disconnect(consumer: ClusterRef, provider: ClusterRef, report: Any) -> list[str]:
        calls.append(f"disconnect {consumer.role} {provider.role}")
        return []

    async def fake_unpeer(
        consumer: ClusterRef, provider: ClusterRef, report: Any, timeout_s: float, *, delete_volumes: bool
    ) -> int:
        calls.append(f"unpeer {consumer.role} {provider.role} {timeout_s:g} {delete_volumes}")
        return 3

    async def fake_check(consumer: ClusterRef, provider: ClusterRef, report: Any, *, delete_volumes: bool) -> None:
        calls.append(f"check claims {delete_volumes}")

    async def fake_probe(consumer: ClusterRef, provider: ClusterRef) -> None:
        calls.append(f"both answer? {consumer.role} {provider.role}")

    monkeypatch.setattr(network_ops, "disconnect", fake_disconnect)
    monkeypatch.setattr(peering_ops, "unpeer", fake_unpeer)
    monkeypatch.setattr(peering_ops, "check_claims", fake_check)
    monkeypatch.setattr(force_unpeer, "unreachable_hint", fake_probe)
    req = _request()
    assert await ops.unpeer(req.consumer, req.provider, Recorder(), 9) == 3
    # both sides must answer, and the claims are checked, before anything is removed
    assert calls == [
        "both answer? consumer provider",
        "check claims False",
        "disconnect consumer provider",
        "unpeer consumer provider 9 False",
    ]
