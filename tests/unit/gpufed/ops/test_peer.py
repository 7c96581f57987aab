"""`gpufed peer`'s virtual-node step: it returns once the provider's virtual nodes are Ready and
fails with an explanation when they are not."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from gpufed.apis.wire import REMOTE_CLUSTER_LABEL, TYPE_LABEL, VIRTUAL_NODE_TYPE, ClusterID
from gpufed.ops.peer import VirtualNodeReady
from peering.ops.peer import PeerError, Peers
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
