"""The tunnel filter's member pods (netfabric.controllers.members): which pods count on each end of a
peering, decided by this cluster's own namespace and node labels, live against an in-memory API server."""

from __future__ import annotations

import asyncio
import contextlib
from ipaddress import IPv4Address
from typing import Any

from gpufed.apis.wire import CONSUMER_LABEL, ORIGIN_CLUSTER_LABEL, REMOTE_CLUSTER_LABEL
from netfabric.controllers.members import Members, pod_address
from tests.unit.fakes import serve, until

A = IPv4Address
PEER = "consumer-1"


def pod(ns: str, name: str, ip: str | None, node: str = "", phase: str = "Running", **spec: Any) -> dict[str, Any]:
    status: dict[str, Any] = {"phase": phase}
    if ip:
        status["podIP"] = ip
    return {
        "kind": "Pod",
        "metadata": {"name": name, "namespace": ns, "labels": {ORIGIN_CLUSTER_LABEL: PEER}},
        "spec": {"nodeName": node, **spec},
        "status": status,
    }


def namespace(name: str, consumer: str | None) -> dict[str, Any]:
    labels = {CONSUMER_LABEL: consumer} if consumer else {}
    return {"kind": "Namespace", "metadata": {"name": name, "labels": labels}}


def node(name: str, peer: str | None) -> dict[str, Any]:
    labels = {REMOTE_CLUSTER_LABEL: peer} if peer else {}
    return {"kind": "Node", "metadata": {"name": name, "labels": labels}}


class SeenMembers(Members):
    """Members that also record the name of every pod its watches deliver."""

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.seen: list[str] = []

    def on_pod(self, event: str, pod: dict[str, Any]) -> None:
        self.seen.append(pod["metadata"]["name"])
        super().on_pod(event, pod)


def test_a_pod_counts_while_it_has_an_address_is_not_host_network_and_has_not_finished() -> None:
    assert pod_address(pod("a", "p", "10.244.0.7")) == A("10.244.0.7")
    assert pod_address(pod("a", "p", None)) is None
    assert pod_address(pod("a", "p", "not-an-ip")) is None
    assert pod_address(pod("a", "p", "10.244.0.7", hostNetwork=True)) is None
    assert pod_address(pod("a", "p", "10.244.0.7", phase="Succeeded")) is None
    assert pod_address(pod("a", "p", "10.244.0.7", phase="Failed")) is None


def provider_members() -> tuple[Members, list[int]]:
    changes: list[int] = []
    m = Members(None, PEER, "Server", lambda: changes.append(1))
    m._listed_one("pods")
    m._listed_one("groups")
    return m, changes


def test_on_a_provider_only_pods_of_the_consumers_namespaces_are_members() -> None:
    m, changes = provider_members()
    m.on_group("ADDED", namespace("twin-1", PEER))
    m.on_group("ADDED", namespace("other-tenant", "consumer-2"))
    m.on_pod("ADDED", pod("twin-1", "a", "10.244.0.7"))
    # a pod labelled as the consumer's in someone else's namespace is not a member: the label is the
    # consumer's word, the namespace label the provider's own
    m.on_pod("ADDED", pod("other-tenant", "b", "10.244.0.8"))
    m.on_pod("ADDED", pod("kube-system", "c", "10.244.0.9"))
    assert m.addresses() == {A("10.244.0.7")}
    m.on_pod("MODIFIED", pod("twin-1", "a", "10.244.0.7", phase="Succeeded"))
    assert m.addresses() == frozenset()
    m.on_pod("MODIFIED", pod("twin-1", "a", "10.244.0.7"))
    m.on_group("MODIFIED", namespace("twin-1", "consumer-2"))  # relabelled away: its pods leave
    assert m.addresses() == frozenset()
    m.on_group("MODIFIED", namespace("twin-1", PEER))
    m.on_pod("DELETED", pod("twin-1", "a", "10.244.0.7"))
    assert m.addresses() == frozenset()
    # synced, then each change of the set: a in, out (finished), in, out (relabelled), in, out (deleted)
    assert len(changes) == 7


def test_on_a_consumer_only_pods_on_the_providers_virtual_nodes_are_members() -> None:
    changes: list[int] = []
    m = Members(None, "gpu-a", "Client", lambda: changes.append(1))
    m.on_group("ADDED", node("gpufed-gpu-a", "gpu-a"))
    m.on_group("ADDED", node("gpufed-gpu-b", "gpu-b"))  # another provider's: not watched here
    m.on_pod("ADDED", pod("team", "offloaded", "10.64.0.7", node="gpufed-gpu-a"))
    m.on_pod("ADDED", pod("team", "elsewhere", "10.65.0.7", node="gpufed-gpu-b"))
    m.on_pod("ADDED", pod("team", "local", "10.244.1.5", node="worker-1"))
    # nothing before both watches have listed: the filter fails closed
    assert m.addresses() == frozenset() and not changes
    m._listed_one("groups")
    assert m.addresses() == frozenset()
    m._listed_one("pods gpufed-gpu-a")  # the pods of each virtual node known when the nodes listed
    assert m.addresses() == {A("10.64.0.7")} and changes == [1]
    m.on_group("DELETED", node("gpufed-gpu-a", "gpu-a"))
    assert m.addresses() == frozenset()


async def test_members_follow_the_api_server() -> None:
    async with serve() as (server, api):
        server.create("namespaces", namespace("twin-1", PEER))
        server.create("namespaces", namespace("unrelated", None))
        server.create("pods", pod("twin-1", "a", "10.244.0.7"))
        server.create("pods", pod("unrelated", "b", "10.244.0.8"))
        changed = asyncio.Event()
        m = Members(api, PEER, "Server", changed.set)
        task = asyncio.create_task(m.run())
        try:
            await until(lambda: m.synced.is_set())
            assert m.addresses() == {A("10.244.0.7")}
            changed.clear()
            server.create("pods", pod("twin-1", "c", "10.244.0.9"))
            await asyncio.wait_for(changed.wait(), 5)
            assert m.addresses() == {A("10.244.0.7"), A("10.244.0.9")}
            server.create("namespaces", namespace("twin-2", PEER))
            server.create("pods", pod("twin-2", "d", "10.244.1.1"))
            await until(lambda: A("10.244.1.1") in m.addresses())
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task


async def test_a_consumer_watches_the_pods_of_the_providers_virtual_nodes_only() -> None:
    async with serve() as (server, api):
        server.create("nodes", node("gpufed-gpu-a", "gpu-a"))
        server.create("nodes", node("worker-1", None))
        server.create("pods", pod("team", "offloaded", "10.64.0.7", node="gpufed-gpu-a"))
        server.create("pods", pod("team", "local", "10.244.1.5", node="worker-1"))
        m = SeenMembers(api, "gpu-a", "Client", lambda: None)
        seen = m.seen
        task = asyncio.create_task(m.run())
        try:
            await until(lambda: m.synced.is_set())
            assert m.addresses() == {A("10.64.0.7")}
            # a second virtual node of the provider (a new GPU product): its pods join once it is there
            server.create("pods", pod("team", "early", "10.64.0.9", node="gpufed-gpu-a-l4"))
            server.create("nodes", node("gpufed-gpu-a-l4", "gpu-a"))
            await until(lambda: A("10.64.0.9") in m.addresses())
            server.create("pods", pod("team", "local-2", "10.244.1.6", node="worker-1"))
            server.remove("nodes", "", "gpufed-gpu-a-l4")
            await until(lambda: m.addresses() == {A("10.64.0.7")})
            # the cluster's other pods never reach the gateway
            assert "local" not in seen and "local-2" not in seen
            assert "offloaded" in seen and "early" in seen
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
