"""`gpufed network connect | disconnect | status | expose` (netfabric.ops) against two in-memory API
servers: IPAM per side and the exchange of mappings, keys, Gateways, Connections and RBAC, and the
idempotence of all of it."""

from __future__ import annotations

import base64
import contextlib
import copy
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import pytest
from wireguard_tools import WireguardKey

from gpufed.apis.meta import API_VERSION
from gpufed.apis.network import GatewaySpec, NetworkConfigSpec, RemoteNetworkSpec
from gpufed.apis.wire import MANAGED_BY, MANAGED_BY_LABEL, SYSTEM_NAMESPACE, ClusterID
from netfabric import ops
from netfabric import plan as plans
from peering.ops.peer import PeerError, Peers
from tests.unit.fakes import FakeApiServer, Recorder, serve

NS = SYSTEM_NAMESPACE
CONSUMER = ClusterID("consumer-12345678")
PROVIDER = ClusterID("gpu-a-12345678")
ENDPOINT = "192.168.77.11:51820"
POD_CIDR = "10.244.0.0/16"


@dataclass
class Sides:
    consumer: FakeApiServer
    provider: FakeApiServer
    peers: Peers

    def obj(self, server: FakeApiServer, resource: str, name: str) -> dict[str, Any]:
        found = server.get(resource, NS, name)
        assert found is not None, f"{resource}/{name} missing"
        return found


def network_config(server: FakeApiServer, **spec: Any) -> None:
    server.create(
        "networkconfigs",
        {
            "apiVersion": API_VERSION,
            "kind": "NetworkConfig",
            "metadata": {"name": "local", "namespace": NS},
            "spec": spec,
        },
        api_version=API_VERSION,
    )


@contextlib.asynccontextmanager
async def sides(*, consumer_net: bool = True, provider_net: dict[str, Any] | None = None) -> AsyncIterator[Sides]:
    """Two clusters, both with pods in 10.244.0.0/16 and the default external CIDR 10.70.0.0/16.

    The provider reserves 10.64.0.0/16 (the first range of the pool) so that the two sides remap
    each other differently: the consumer reaches the provider at 10.64/10.65, the provider reaches
    the consumer at 10.65/10.66, and a mix-up of the two directions shows.
    """
    async with serve() as (consumer, consumer_api), serve() as (provider, provider_api):
        if consumer_net:
            network_config(consumer, podCidr=POD_CIDR)
        network_config(
            provider,
            **(
                provider_net
                if provider_net is not None
                else {"podCidr": POD_CIDR, "gatewayEndpoint": ENDPOINT, "reservedCidrs": ["10.64.0.0/16"]}
            ),
        )
        peers = Peers(consumer_api, provider_api, CONSUMER, PROVIDER, "consumer-key", "provider-key", "https://p:6443")
        yield Sides(consumer, provider, peers)


def _public_of_secret(secret: dict[str, Any]) -> str:
    raw = secret["data"]["privateKey"]
    return str(WireguardKey(base64.b64decode(raw).decode()).public_key())


# ---- connect


SECOND = ClusterID("gpu-b-87654321")


@contextlib.asynccontextmanager
async def second_provider(s: Sides) -> AsyncIterator[Peers]:
    """Another provider with the same pod CIDR, peered with the same consumer."""
    async with serve() as (other, other_api):
        network_config(other, podCidr=POD_CIDR, gatewayEndpoint="192.168.77.13")
        yield Peers(s.peers.consumer_api, other_api, CONSUMER, SECOND, "", "", "")


async def test_connect_allocates_and_exchanges_the_mappings() -> None:
    async with sides() as s:
        out = await ops.connect_peers(s.peers, ops.NetworkOptions(), Recorder())
        c_net = RemoteNetworkSpec.model_validate(s.obj(s.consumer, "remotenetworks", PROVIDER)["spec"])
        p_net = RemoteNetworkSpec.model_validate(s.obj(s.provider, "remotenetworks", CONSUMER)["spec"])
        assert c_net.cluster_id == PROVIDER and p_net.cluster_id == CONSUMER
        # the colliding pod CIDR is remapped on both sides
        assert c_net.real.pod_cidr == p_net.real.pod_cidr == POD_CIDR
        assert c_net.mapped.pod_cidr != c_net.real.pod_cidr
        assert p_net.mapped.pod_cidr != p_net.real.pod_cidr
        assert (c_net.mapped.pod_cidr, c_net.mapped.external_cidr) == ("10.64.0.0/16", "10.65.0.0/16")
        assert (p_net.mapped.pod_cidr, p_net.mapped.external_cidr) == ("10.65.0.0/16", "10.66.0.0/16")
        # each side knows how the other reaches it
        assert c_net.peer_view == p_net.mapped
        assert p_net.peer_view == c_net.mapped
        assert out == {
            "consumer": CONSUMER,
            "provider": PROVIDER,
            "endpoint": ENDPOINT,
            "providerPodsSeenAt": "10.64.0.0/16",
            "consumerPodsSeenAt": "10.65.0.0/16",
        }


async def test_connect_creates_keys_and_exchanges_the_public_ones() -> None:
    async with sides() as s:
        await ops.connect_peers(s.peers, ops.NetworkOptions(), Recorder())
        c_secret = s.obj(s.consumer, "secrets", f"gpufed-wg-{PROVIDER}")
        p_secret = s.obj(s.provider, "secrets", f"gpufed-wg-{CONSUMER}")
        c_gw = GatewaySpec.model_validate(s.obj(s.consumer, "gateways", PROVIDER)["spec"])
        p_gw = GatewaySpec.model_validate(s.obj(s.provider, "gateways", CONSUMER)["spec"])
        c_pub, p_pub = _public_of_secret(c_secret), _public_of_secret(p_secret)
        assert c_pub != p_pub
        assert c_gw.public_key == c_pub and p_gw.public_key == p_pub
        assert c_gw.peer_public_key == p_pub and p_gw.peer_public_key == c_pub
        assert c_gw.private_key_secret == f"gpufed-wg-{PROVIDER}"
        assert p_gw.private_key_secret == f"gpufed-wg-{CONSUMER}"
        # the private key never leaves its cluster
        for server in (s.consumer, s.provider):
            for kind in ("gateways", "remotenetworks", "connections"):
                for o in server.items(kind):
                    for secret in (c_secret, p_secret):
                        assert secret["data"]["privateKey"] not in str(o)
        assert c_secret["metadata"]["labels"][MANAGED_BY_LABEL] == MANAGED_BY


async def test_connect_creates_a_client_and_a_server_gateway() -> None:
    async with sides() as s:
        await ops.connect_peers(s.peers, ops.NetworkOptions(), Recorder())
        c_gw = GatewaySpec.model_validate(s.obj(s.consumer, "gateways", PROVIDER)["spec"])
        p_gw = GatewaySpec.model_validate(s.obj(s.provider, "gateways", CONSUMER)["spec"])
        assert c_gw.cluster_id == PROVIDER and c_gw.role == "Client" and c_gw.endpoint == ENDPOINT
        assert p_gw.cluster_id == CONSUMER and p_gw.role == "Server" and p_gw.listen_port == 51820
        assert p_gw.endpoint == ""
        server_ip, client_ip = plans.tunnel_addresses(CONSUMER, PROVIDER)
        assert (c_gw.tunnel_address, c_gw.peer_tunnel_address) == (str(client_ip), str(server_ip))
        assert (p_gw.tunnel_address, p_gw.peer_tunnel_address) == (str(server_ip), str(client_ip))


async def test_connect_passes_the_options_to_both_gateways() -> None:
    async with sides() as s:
        opts = ops.NetworkOptions(
            gateway_endpoint="192.168.77.12:4500", mtu=1380, masquerade=True, driver="wireguard-go", keepalive_s=0
        )
        out = await ops.connect_peers(s.peers, opts, Recorder())
        c_gw = GatewaySpec.model_validate(s.obj(s.consumer, "gateways", PROVIDER)["spec"])
        p_gw = GatewaySpec.model_validate(s.obj(s.provider, "gateways", CONSUMER)["spec"])
        # the option wins over the provider's NetworkConfig, and the server listens on its port
        assert out["endpoint"] == c_gw.endpoint == "192.168.77.12:4500"
        assert p_gw.listen_port == 4500
        for gw in (c_gw, p_gw):
            assert (gw.mtu, gw.masquerade, gw.driver, gw.keepalive_s) == (1380, True, "wireguard-go", 0)


async def test_connect_defaults_the_port_of_an_endpoint_without_one() -> None:
    async with sides() as s:
        await ops.connect_peers(s.peers, ops.NetworkOptions(gateway_endpoint="192.168.77.12"), Recorder())
        p_gw = GatewaySpec.model_validate(s.obj(s.provider, "gateways", CONSUMER)["spec"])
        assert p_gw.listen_port == 51820


async def test_connect_creates_connections_owned_by_the_gateways() -> None:
    async with sides() as s:
        await ops.connect_peers(s.peers, ops.NetworkOptions(), Recorder())
        for server, name in ((s.consumer, PROVIDER), (s.provider, CONSUMER)):
            gw = s.obj(server, "gateways", name)
            conn = s.obj(server, "connections", name)
            assert conn["spec"] == {"clusterId": name}
            assert conn.get("status") is None  # the gateway agent fills it
            assert conn["metadata"]["ownerReferences"] == [
                {"apiVersion": API_VERSION, "kind": "Gateway", "name": name, "uid": gw["metadata"]["uid"]}
            ]


async def test_connect_grants_the_gateway_its_key_secret_only() -> None:
    async with sides() as s:
        await ops.connect_peers(s.peers, ops.NetworkOptions(), Recorder())
        for server, name in ((s.consumer, PROVIDER), (s.provider, CONSUMER)):
            role = s.obj(server, "roles", f"gpufed-gateway-{name}")
            assert role["rules"] == [
                {"apiGroups": [""], "resources": ["secrets"], "verbs": ["get"], "resourceNames": [f"gpufed-wg-{name}"]}
            ]
            binding = s.obj(server, "rolebindings", f"gpufed-gateway-{name}")
            assert binding["roleRef"] == {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "Role",
                "name": f"gpufed-gateway-{name}",
            }
            assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "gpufed-gateway", "namespace": NS}]


async def test_connect_again_changes_neither_mappings_nor_keys() -> None:
    async with sides() as s:
        await ops.connect_peers(s.peers, ops.NetworkOptions(), Recorder())

        def snapshot() -> list[Any]:
            return [
                s.obj(s.consumer, "remotenetworks", PROVIDER)["spec"],
                s.obj(s.provider, "remotenetworks", CONSUMER)["spec"],
                s.obj(s.consumer, "secrets", f"gpufed-wg-{PROVIDER}")["data"],
                s.obj(s.provider, "secrets", f"gpufed-wg-{CONSUMER}")["data"],
                s.obj(s.consumer, "gateways", PROVIDER)["spec"],
                s.obj(s.provider, "gateways", CONSUMER)["spec"],
                s.obj(s.consumer, "connections", PROVIDER)["metadata"]["uid"],
                s.obj(s.provider, "connections", CONSUMER)["metadata"]["uid"],
            ]

        before = copy.deepcopy(snapshot())
        out = await ops.connect_peers(s.peers, ops.NetworkOptions(), Recorder())
        assert snapshot() == before
        assert out["providerPodsSeenAt"] == "10.64.0.0/16" and out["consumerPodsSeenAt"] == "10.65.0.0/16"
        # the Connection is created once, never again
        for server in (s.consumer, s.provider):
            assert len([r for r in server.requests if r.method == "POST" and r.path.endswith("/connections")]) == 1


async def test_connect_replaces_a_damaged_key() -> None:
    async with sides() as s:
        s.consumer.create(
            "secrets",
            {
                "kind": "Secret",
                "metadata": {"name": f"gpufed-wg-{PROVIDER}", "namespace": NS},
                "data": {"privateKey": base64.b64encode(b"not a key").decode()},
            },
        )
        await ops.connect_peers(s.peers, ops.NetworkOptions(), Recorder())
        pub = _public_of_secret(s.obj(s.consumer, "secrets", f"gpufed-wg-{PROVIDER}"))
        assert s.obj(s.consumer, "gateways", PROVIDER)["spec"]["publicKey"] == pub
        assert s.obj(s.provider, "gateways", CONSUMER)["spec"]["peerPublicKey"] == pub


async def test_connect_reallocates_when_the_peer_ranges_change() -> None:
    async with sides() as s:
        await ops.connect_peers(s.peers, ops.NetworkOptions(), Recorder())

        def move(obj: dict[str, Any]) -> None:
            obj["spec"]["podCidr"] = "10.245.0.0/16"

        s.provider.update("networkconfigs", NS, "local", move)
        await ops.connect_peers(s.peers, ops.NetworkOptions(), Recorder())
        c_net = RemoteNetworkSpec.model_validate(s.obj(s.consumer, "remotenetworks", PROVIDER)["spec"])
        # 10.245.0.0/16 collides with nothing on the consumer: reached as it is
        assert c_net.real.pod_cidr == c_net.mapped.pod_cidr == "10.245.0.0/16"
        p_net = RemoteNetworkSpec.model_validate(s.obj(s.provider, "remotenetworks", CONSUMER)["spec"])
        assert p_net.peer_view == c_net.mapped


async def test_a_second_provider_gets_other_ranges_on_the_consumer() -> None:
    async with sides() as s, second_provider(s) as peers_b:
        await ops.connect_peers(s.peers, ops.NetworkOptions(), Recorder())
        await ops.connect_peers(peers_b, ops.NetworkOptions(), Recorder())
        a = RemoteNetworkSpec.model_validate(s.obj(s.consumer, "remotenetworks", PROVIDER)["spec"])
        b = RemoteNetworkSpec.model_validate(s.obj(s.consumer, "remotenetworks", SECOND)["spec"])
        assert a.real == b.real
        taken = {a.mapped.pod_cidr, a.mapped.external_cidr}
        assert b.mapped.pod_cidr not in taken and b.mapped.external_cidr not in taken
        # and its own key Secret, Gateway and Connection
        assert s.consumer.get("secrets", NS, f"gpufed-wg-{SECOND}") is not None
        assert s.consumer.get("gateways", NS, SECOND) is not None
        assert s.consumer.get("connections", NS, SECOND) is not None


async def test_connect_without_an_endpoint_says_how_to_give_one() -> None:
    async with sides(provider_net={"podCidr": POD_CIDR}) as s:
        with pytest.raises(PeerError, match="--gateway-endpoint"):
            await ops.connect_peers(s.peers, ops.NetworkOptions(), Recorder())
        # nothing was configured
        for server in (s.consumer, s.provider):
            assert server.items("gateways") == [] and server.items("remotenetworks") == []
            assert server.items("secrets") == []


async def test_connect_with_an_invalid_endpoint_is_refused() -> None:
    async with sides() as s:
        with pytest.raises(PeerError, match="must be host"):
            await ops.connect_peers(s.peers, ops.NetworkOptions(gateway_endpoint="192.168.77.11:99999"), Recorder())


async def test_connect_without_a_network_config_asks_for_the_pod_cidr() -> None:
    async with sides(consumer_net=False) as s:
        with pytest.raises(PeerError, match=r"consumer.*--pod-cidr"):
            await ops.connect_peers(s.peers, ops.NetworkOptions(), Recorder())
        assert s.consumer.items("networkconfigs") == []


async def test_connect_without_the_provider_network_config_asks_for_its_pod_cidr() -> None:
    async with sides() as s:
        s.provider.remove("networkconfigs", NS, "local")
        with pytest.raises(PeerError, match=r"provider.*--remote-pod-cidr"):
            await ops.connect_peers(s.peers, ops.NetworkOptions(gateway_endpoint=ENDPOINT), Recorder())


async def test_connect_creates_a_missing_network_config_from_the_pod_cidr() -> None:
    async with sides(consumer_net=False) as s:
        await ops.connect_peers(s.peers, ops.NetworkOptions(pod_cidr="10.250.0.0/16"), Recorder())
        created = s.obj(s.consumer, "networkconfigs", "local")
        spec = NetworkConfigSpec.model_validate(created["spec"])
        assert spec.pod_cidr == "10.250.0.0/16"
        assert created["metadata"]["labels"][MANAGED_BY_LABEL] == MANAGED_BY
        # no collision with the provider's pods any more: each reaches the other's pods as they are
        c_net = RemoteNetworkSpec.model_validate(s.obj(s.consumer, "remotenetworks", PROVIDER)["spec"])
        p_net = RemoteNetworkSpec.model_validate(s.obj(s.provider, "remotenetworks", CONSUMER)["spec"])
        assert c_net.mapped.pod_cidr == POD_CIDR
        assert p_net.mapped.pod_cidr == "10.250.0.0/16"


async def test_connect_refuses_an_invalid_pod_cidr() -> None:
    async with sides(consumer_net=False) as s:
        with pytest.raises(PeerError, match="invalid pod CIDR"):
            await ops.connect_peers(s.peers, ops.NetworkOptions(pod_cidr="10.250.0.1/16"), Recorder())


async def test_an_invalid_network_config_is_reported() -> None:
    async with sides(consumer_net=False) as s:
        network_config(s.consumer, podCidr="not-a-cidr")
        with pytest.raises(PeerError, match="consumer's NetworkConfig is invalid"):
            await ops.connect_peers(s.peers, ops.NetworkOptions(), Recorder())


async def test_connect_waits_for_both_connections_when_asked() -> None:
    async with sides() as s:
        await ops.connect_peers(s.peers, ops.NetworkOptions(), Recorder())

        def connected(obj: dict[str, Any]) -> None:
            obj["status"] = {"phase": "Connected"}

        s.consumer.update("connections", NS, PROVIDER, connected)
        s.provider.update("connections", NS, CONSUMER, connected)
        report = Recorder()
        await ops.connect_peers(s.peers, ops.NetworkOptions(wait_s=5), report)
        assert report.lines[-1] == "done tunnel up: both sides Connected"


async def test_wait_connected_times_out_with_both_phases() -> None:
    async with sides() as s:
        await ops.connect_peers(s.peers, ops.NetworkOptions(), Recorder())

        def down(obj: dict[str, Any]) -> None:
            obj["status"] = {"phase": "Down", "message": "no handshake"}

        s.provider.update("connections", NS, CONSUMER, down)
        with pytest.raises(PeerError, match=r"consumer side Pending .*provider side Down \(no handshake\)"):
            await ops.wait_connected(s.peers, 0.1, Recorder())


# ---- disconnect


async def test_disconnect_removes_everything_on_both_sides_and_is_idempotent() -> None:
    async with sides() as s:
        await ops.connect_peers(s.peers, ops.NetworkOptions(), Recorder())
        removed = await ops.disconnect_peers(s.peers, Recorder())
        assert len(removed) == 12
        assert set(removed) == {
            f"{side}: {what} {peer}"
            for side, peer in (("consumer", PROVIDER), ("provider", CONSUMER))
            for what in ("Gateway.gpufed.io", "Connection", "RemoteNetwork", "key Secret", "RoleBinding", "Role")
        }
        for server in (s.consumer, s.provider):
            for kind in ("gateways", "connections", "remotenetworks", "secrets", "roles", "rolebindings"):
                assert server.items(kind) == [], kind
            # the cluster's own configuration stays
            assert server.get("networkconfigs", NS, "local") is not None
        report = Recorder()
        assert await ops.disconnect_peers(s.peers, report) == []
        assert report.lines[-1] == "done nothing to remove"


async def test_disconnect_leaves_other_peerings_alone() -> None:
    async with sides() as s, second_provider(s) as peers_b:
        await ops.connect_peers(s.peers, ops.NetworkOptions(), Recorder())
        await ops.connect_peers(peers_b, ops.NetworkOptions(), Recorder())
        await ops.disconnect_peers(s.peers, Recorder())
        for kind, name in (
            ("gateways", SECOND),
            ("connections", SECOND),
            ("remotenetworks", SECOND),
            ("secrets", f"gpufed-wg-{SECOND}"),
            ("roles", f"gpufed-gateway-{SECOND}"),
            ("rolebindings", f"gpufed-gateway-{SECOND}"),
        ):
            assert s.consumer.get(kind, NS, name) is not None, kind
        assert s.consumer.get("gateways", NS, PROVIDER) is None


async def test_disconnect_releases_the_allocation() -> None:
    async with sides() as s, second_provider(s) as peers_b:
        await ops.connect_peers(s.peers, ops.NetworkOptions(), Recorder())
        await ops.disconnect_peers(s.peers, Recorder())
        await ops.connect_peers(peers_b, ops.NetworkOptions(), Recorder())
        b = RemoteNetworkSpec.model_validate(s.obj(s.consumer, "remotenetworks", SECOND)["spec"])
        # the first provider's ranges are free again
        assert (b.mapped.pod_cidr, b.mapped.external_cidr) == ("10.64.0.0/16", "10.65.0.0/16")


# ---- status


async def test_status_has_a_row_per_peer() -> None:
    async with sides() as s:
        await ops.connect_peers(s.peers, ops.NetworkOptions(), Recorder())
        rows = await ops.status(s.peers.consumer_api)
        assert rows == [
            {
                "cluster": PROVIDER,
                "role": "Client",
                "endpoint": ENDPOINT,
                "driver": "",
                "mtu": 0,
                "phase": "Pending",
                "reason": "",
                "message": "no gateway agent has reported yet",
                "rttMs": None,
                "latestHandshake": None,
                "podCidr": POD_CIDR,
                "mappedPodCidr": "10.64.0.0/16",
                "externalCidr": "10.70.0.0/16",
                "mappedExternalCidr": "10.65.0.0/16",
            }
        ]

        def reported(obj: dict[str, Any]) -> None:
            obj["status"] = {
                "phase": "Connected",
                "reason": "ProbeSucceeded",
                "message": "peer answers",
                "rttMs": 0.42,
                "latestHandshake": "2024-01-01T00:00:00Z",
            }

        def gw_status(obj: dict[str, Any]) -> None:
            obj["status"] = {"driver": "kernel", "interface": "gf-x", "mtu": 1420}

        s.consumer.update("connections", NS, PROVIDER, reported)
        s.consumer.update("gateways", NS, PROVIDER, gw_status)
        (row,) = await ops.status(s.peers.consumer_api)
        assert (row["phase"], row["reason"], row["message"], row["rttMs"]) == (
            "Connected",
            "ProbeSucceeded",
            "peer answers",
            0.42,
        )
        assert (row["driver"], row["mtu"], row["latestHandshake"]) == ("kernel", 1420, "2024-01-01T00:00:00Z")
        (prow,) = await ops.status(s.peers.provider_api)
        assert (prow["cluster"], prow["role"], prow["mappedPodCidr"]) == (CONSUMER, "Server", "10.65.0.0/16")


async def test_status_rows_are_sorted_and_name_a_missing_gateway() -> None:
    async with sides() as s:
        await ops.connect_peers(s.peers, ops.NetworkOptions(), Recorder())
        s.consumer.remove("gateways", NS, PROVIDER)
        s.consumer.create(
            "remotenetworks",
            {
                "apiVersion": API_VERSION,
                "kind": "RemoteNetwork",
                "metadata": {"name": "aaa-first", "namespace": NS},
                "spec": {
                    "clusterId": "aaa-first",
                    "real": {"podCidr": "10.1.0.0/16", "externalCidr": "10.2.0.0/16"},
                    "mapped": {"podCidr": "10.1.0.0/16", "externalCidr": "10.2.0.0/16"},
                },
            },
            api_version=API_VERSION,
        )
        rows = await ops.status(s.peers.consumer_api)
        assert [r["cluster"] for r in rows] == ["aaa-first", PROVIDER]
        assert rows[0]["message"] == "no Gateway.gpufed.io" and rows[0]["role"] == ""
        assert rows[1]["message"] == "no Gateway.gpufed.io"
        assert await ops.status(s.peers.provider_api) != []


async def test_status_of_a_cluster_without_peers_is_empty() -> None:
    async with sides() as s:
        assert await ops.status(s.peers.consumer_api) == []


# ---- expose


async def test_expose_refuses_what_is_not_an_ipv4_address() -> None:
    async with sides() as s:
        for bad in ("not-an-ip", "fd00::10", "10.96.0.0/12"):
            with pytest.raises(PeerError, match="is not an IPv4 address"):
                await ops.expose(s.peers.consumer_api, bad)


async def test_expose_refuses_a_pod_address() -> None:
    async with sides() as s:
        with pytest.raises(PeerError, match="is a pod address"):
            await ops.expose(s.peers.consumer_api, "10.244.3.4")
        assert s.obj(s.consumer, "networkconfigs", "local")["spec"].get("externalIps") in (None, [])


async def test_expose_stores_the_address_and_says_where_each_peer_reaches_it() -> None:
    async with sides() as s:
        await ops.connect_peers(s.peers, ops.NetworkOptions(), Recorder())
        out = await ops.expose(s.peers.consumer_api, "10.96.0.10")
        # the provider reaches our external CIDR 10.70.0.0/16 at 10.66.0.0/16 (its mapping of it)
        assert out == {
            "address": "10.96.0.10",
            "externalAddress": "10.70.0.1",
            "peersReachItAt": {PROVIDER: "10.66.0.1"},
        }
        spec = NetworkConfigSpec.model_validate(s.obj(s.consumer, "networkconfigs", "local")["spec"])
        assert [(e.address, e.external_address) for e in spec.external_ips] == [("10.96.0.10", "10.70.0.1")]
        assert spec.pod_cidr == POD_CIDR  # the rest of the spec is kept
        # again: the same answer, still one entry
        assert await ops.expose(s.peers.consumer_api, "10.96.0.10") == out
        spec = NetworkConfigSpec.model_validate(s.obj(s.consumer, "networkconfigs", "local")["spec"])
        assert len(spec.external_ips) == 1
        # another address gets the next one, the first stays
        second = await ops.expose(s.peers.consumer_api, "10.96.0.1")
        assert second["externalAddress"] == "10.70.0.2"
        assert second["peersReachItAt"] == {PROVIDER: "10.66.0.2"}
        spec = NetworkConfigSpec.model_validate(s.obj(s.consumer, "networkconfigs", "local")["spec"])
        assert {(e.address, e.external_address) for e in spec.external_ips} == {
            ("10.96.0.10", "10.70.0.1"),
            ("10.96.0.1", "10.70.0.2"),
        }


async def test_expose_before_any_peering_answers_no_peers() -> None:
    async with sides() as s:
        out = await ops.expose(s.peers.provider_api, "10.96.0.10")
        assert out == {"address": "10.96.0.10", "externalAddress": "10.70.0.1", "peersReachItAt": {}}
        spec = NetworkConfigSpec.model_validate(s.obj(s.provider, "networkconfigs", "local")["spec"])
        # the rest of the provider's configuration is kept
        assert spec.gateway_endpoint == ENDPOINT and spec.reserved_cidrs == ["10.64.0.0/16"]


async def test_expose_without_a_network_config_is_refused() -> None:
    async with sides(consumer_net=False) as s:
        with pytest.raises(PeerError, match="no NetworkConfig"):
            await ops.expose(s.peers.consumer_api, "10.96.0.10")


async def test_expose_without_a_network_config_does_not_point_at_a_connect_flag() -> None:
    async with sides(consumer_net=False) as s:
        with pytest.raises(PeerError) as e:
            await ops.expose(s.peers.consumer_api, "10.96.0.10")
        assert "--remote-pod-cidr" not in str(e.value)


async def test_an_allocation_stays_when_ranges_before_it_are_released() -> None:
    async with sides() as s, second_provider(s) as peers_b:
        await ops.connect_peers(s.peers, ops.NetworkOptions(), Recorder())
        await ops.connect_peers(peers_b, ops.NetworkOptions(), Recorder())
        before = copy.deepcopy(s.obj(s.consumer, "remotenetworks", SECOND)["spec"]["mapped"])
        assert before == {"podCidr": "10.66.0.0/16", "externalCidr": "10.67.0.0/16"}
        await ops.disconnect_peers(s.peers, Recorder())
        # 10.64/10.65 are free again, but the live peering keeps the ranges its pods are known by
        await ops.connect_peers(peers_b, ops.NetworkOptions(), Recorder())
        assert s.obj(s.consumer, "remotenetworks", SECOND)["spec"]["mapped"] == before
