"""The gateway agent (netfabric.controllers.gateway): judging the Connection from probes, and the agent
against an in-memory API server with a fake WireGuard driver and a fake network namespace."""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import datetime as dt
import json
from collections.abc import Callable, Sequence
from ipaddress import IPv4Address, IPv4Network
from typing import Any, TypeVar
from unittest.mock import MagicMock

import pytest
from wireguard_tools import WireguardKey

from gpufed.apis.meta import API_VERSION
from gpufed.apis.wire import SYSTEM_NAMESPACE
from gpufed.kube import rest
from gpufed.kube.client import KubeError
from netfabric.controllers.gateway import (
    DOWN_AFTER,
    GATEWAY_DROPPED,
    HANDSHAKE_STALE_S,
    GatewayAgent,
    GatewaySettings,
    Health,
    judge,
)
from netfabric.controllers.members import Members, Role
from netfabric.drivers.netns import COMMAND_TIMEOUT_S, DataplaneError, Netns
from netfabric.drivers.wireguard import PeerStats, TunnelConfig, TunnelDriver
from netfabric.ipam import RangeMap
from netfabric.render import GatewayPlan, interface_name, mark_for, nft_ruleset, nft_sets, nft_update, table_name
from tests.unit.fakes import FakeApiServer, running, serve, until

T = TypeVar("T")
N = IPv4Network
A = IPv4Address
NS = SYSTEM_NAMESPACE
PEER = "gpu-a-12345678"
IFACE = interface_name(PEER)
TABLE = table_name(PEER)
MARK = mark_for(PEER)
KEY = WireguardKey.generate()
PEER_KEY = WireguardKey.generate()
NOW = 1_700_000_000.0
PING_OK = "64 bytes from 169.254.64.1: icmp_seq=1 ttl=64 time=0.42 ms\n"
STATUS_PATH = f"/apis/{API_VERSION}/namespaces/{NS}/connections/{PEER}/status"


def _iso(t: float) -> str:
    return dt.datetime.fromtimestamp(t, dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


# ---- judge


def test_judge_error_is_down_configuration_failed() -> None:
    health = Health(0, 0.4, PeerStats(NOW - 5, 1, 1))
    assert judge(health, "the peer's public key is not known yet", NOW) == (
        "Down",
        "ConfigurationFailed",
        "the peer's public key is not known yet",
    )


def test_judge_no_stats_is_down_interface_missing() -> None:
    phase, reason, _ = judge(Health(0, 0.4, None), None, NOW)
    assert (phase, reason) == ("Down", "InterfaceMissing")


def test_judge_no_failures_is_connected_with_the_rtt() -> None:
    phase, reason, message = judge(Health(0, 0.42, PeerStats(NOW - 5, 1, 1)), None, NOW)
    assert (phase, reason) == ("Connected", "ProbeSucceeded")
    assert "0.42 ms" in message


@pytest.mark.parametrize("failures", range(1, DOWN_AFTER))
def test_judge_a_few_lost_probes_is_degraded(failures: int) -> None:
    phase, reason, message = judge(Health(failures, None, PeerStats(NOW - 5, 1, 1)), None, NOW)
    assert (phase, reason) == ("Degraded", "ProbeLoss")
    assert str(failures) in message


@pytest.mark.parametrize("failures", [DOWN_AFTER, DOWN_AFTER + 5])
def test_judge_down_without_any_handshake(failures: int) -> None:
    phase, reason, _ = judge(Health(failures, None, PeerStats(None, 0, 0)), None, NOW)
    assert (phase, reason) == ("Down", "NoHandshake")


def test_judge_down_with_a_stale_handshake() -> None:
    phase, reason, message = judge(Health(DOWN_AFTER, None, PeerStats(NOW - HANDSHAKE_STALE_S - 20, 0, 0)), None, NOW)
    assert (phase, reason) == ("Down", "HandshakeStale")
    assert f"{HANDSHAKE_STALE_S + 20:.0f} s" in message


def test_judge_down_with_a_recent_handshake_is_probe_failing() -> None:
    phase, reason, message = judge(Health(DOWN_AFTER, None, PeerStats(NOW - 10, 0, 0)), None, NOW)
    assert (phase, reason) == ("Down", "ProbeFailing")
    assert "10 s" in message


def test_judge_handshake_at_exactly_the_stale_age_is_not_stale() -> None:
    _, reason, _ = judge(Health(DOWN_AFTER, None, PeerStats(NOW - HANDSHAKE_STALE_S, 0, 0)), None, NOW)
    assert reason == "ProbeFailing"


# ---- fakes of the data plane


class FakeNs(Netns):
    """A network namespace that runs nothing: records commands and netlink operations; `ping` answers
    `ping_answer` (None: the probe is lost); `tables` are the nftables tables that exist;
    `forwarding` is net.ipv4.ip_forward; `drops` are the packets of our table's named counters (None:
    no table to read them from); `refuse_update`: nftables refuses an in-place update of our table."""

    def __init__(self, ipr: MagicMock) -> None:
        super().__init__(None)
        self.ipr = ipr
        self.runs: list[tuple[list[str], str | None]] = []
        self.netlinks: list[str] = []
        self.ping_answer: str | None = PING_OK
        self.tables: set[str] = set()
        self.forwarding = "0"
        self.drops: dict[str, int] | None = None
        self.refuse_update = False

    async def run(
        self,
        argv: Sequence[str],
        stdin: str | None = None,
        env: dict[str, str] | None = None,
        timeout_s: float = COMMAND_TIMEOUT_S,
    ) -> str:
        args = list(argv)
        self.runs.append((args, stdin))
        if args[0] == "ping":
            if self.ping_answer is None:
                raise DataplaneError("`ping -n -q` in this network namespace failed (1): ")
            return self.ping_answer
        if args[:3] == ["nft", "list", "table"]:
            if args[-1] not in self.tables:
                raise DataplaneError(f"Error: No such file or directory; did you mean table '{args[-1]}'?")
            return ""
        if args == ["sysctl", "-n", "net.ipv4.ip_forward"]:
            return self.forwarding + "\n"
        if args == ["sysctl", "-qw", "net.ipv4.ip_forward=1"]:
            self.forwarding = "1"
            return ""
        if args[:4] == ["nft", "-j", "list", "counters"]:
            if self.drops is None:
                raise DataplaneError(f"Error: No such file or directory\nlist counters table ip {args[-1]}")
            counters = [
                {
                    "counter": {
                        "family": "ip",
                        "name": name,
                        "table": args[-1],
                        "packets": packets,
                        "bytes": 84 * packets,
                    }
                }
                for name, packets in self.drops.items()
            ]
            return json.dumps({"nftables": [{"metainfo": {"version": "1.0.6"}}, *counters]})
        if args == ["nft", "-f", "-"] and self.refuse_update and "delete table" not in (stdin or ""):
            raise DataplaneError("`nft -f -` in this network namespace failed (1): Error: Operation not supported")
        if args[0] == "nft":
            return ""
        raise AssertionError(f"unexpected command {args}")

    async def netlink(self, fn: Callable[[Any], T], what: str) -> T:
        self.netlinks.append(what)
        return fn(self.ipr)

    def commands(self, program: str) -> list[tuple[list[str], str | None]]:
        return [r for r in self.runs if r[0][0] == program]


def fake_ipr(underlay_mtu: int | None = None) -> MagicMock:
    """pyroute2's IPRoute as far as the agent uses it: the tunnel is link 7; the underlay towards the
    endpoint is eth0 (link 2) with `underlay_mtu`, or no route at all."""
    ipr = MagicMock()
    ipr.link_lookup.return_value = [7]
    ipr.get_addr.return_value = []
    ipr.get_rules.return_value = []
    route = MagicMock()
    route.get_attr.return_value = 2
    ipr.route.return_value = [route] if underlay_mtu else []
    link = MagicMock()
    link.get_attr.side_effect = lambda attr: {"IFLA_IFNAME": "eth0", "IFLA_MTU": underlay_mtu}[attr]
    ipr.get_links.return_value = [link]
    return ipr


class FakeDriver:
    """A TunnelDriver that records what it is asked and returns scripted stats."""

    def __init__(self, name: str = "kernel", available: bool = True) -> None:
        self.name = name
        self.is_available = available
        self.ensured: list[tuple[str, TunnelConfig]] = []
        self.removed: list[str] = []
        self.stats_asked: list[str] = []
        self.peer_stats: PeerStats | None = PeerStats(NOW - 5, 100, 200)
        self.stats_error: DataplaneError | None = None
        self.ensure_error: DataplaneError | None = None

    async def available(self, ns: Netns) -> bool:
        return self.is_available

    async def ensure(self, ns: Netns, iface: str, config: TunnelConfig) -> None:
        if self.ensure_error is not None:
            raise self.ensure_error
        self.ensured.append((iface, config))

    async def stats(self, ns: Netns, iface: str) -> PeerStats | None:
        self.stats_asked.append(iface)
        if self.stats_error is not None:
            raise self.stats_error
        return self.peer_stats

    async def remove(self, ns: Netns, iface: str) -> bool:
        self.removed.append(iface)
        return True


class Clock:
    def __init__(self, now: float = NOW) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


# ---- the cluster's objects for one peering (as `gpufed network connect` leaves them)

# Both clusters use 10.244.0.0/16 for pods; we reach the peer's pods at 10.64.0.0/16 and its external
# CIDR 10.200.0.0/24 at 10.65.0.0/24. Our kube-dns 10.96.0.10 is exposed as 10.70.0.5.
NETWORK = {"podCidr": "10.244.0.0/16", "externalIps": [{"address": "10.96.0.10", "externalAddress": "10.70.0.5"}]}
REMOTE = {
    "clusterId": PEER,
    "real": {"podCidr": "10.244.0.0/16", "externalCidr": "10.200.0.0/24"},
    "mapped": {"podCidr": "10.64.0.0/16", "externalCidr": "10.65.0.0/24"},
}
CLIENT = {
    "clusterId": PEER,
    "role": "Client",
    "endpoint": "192.168.77.11:51820",
    "tunnelAddress": "169.254.64.2",
    "peerTunnelAddress": "169.254.64.1",
    "privateKeySecret": f"gpufed-wg-{PEER}",
    "publicKey": str(KEY.public_key()),
    "peerPublicKey": str(PEER_KEY.public_key()),
}
SERVER = {
    **{k: v for k, v in CLIENT.items() if k != "endpoint"},
    "role": "Server",
    "listenPort": 51820,
    "tunnelAddress": "169.254.64.1",
    "peerTunnelAddress": "169.254.64.2",
}
# What the data plane must be for NETWORK + REMOTE, built here rather than through netfabric.plan.
PLAN = GatewayPlan(
    interface=IFACE,
    table=TABLE,
    mark=MARK,
    local_pod=N("10.244.0.0/16"),
    peer_pod=RangeMap(N("10.244.0.0/16"), N("10.64.0.0/16")),
    peer_external=RangeMap(N("10.200.0.0/24"), N("10.65.0.0/24")),
    external_ips={A("10.70.0.5"): A("10.96.0.10")},
    tunnel_address=A("169.254.64.2"),
    peer_tunnel_address=A("169.254.64.1"),
    # the client (consumer) end lets only the pods it offloaded to the peer through: none before the
    # member watch has listed
    peer_members=frozenset(),
)
#: The same on the server side of the tunnel, which lets only its twin pods be reached.
SERVER_PLAN = dataclasses.replace(
    PLAN,
    tunnel_address=A("169.254.64.1"),
    peer_tunnel_address=A("169.254.64.2"),
    peer_members=None,
    local_members=frozenset(),
)


def _cr(plural: str, kind: str, name: str, spec: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    return plural, {"apiVersion": API_VERSION, "kind": kind, "metadata": {"name": name, "namespace": NS}, "spec": spec}


def seed(
    server: FakeApiServer,
    gateway: dict[str, Any] | None = None,
    *,
    connection: bool = True,
    secret: bool = True,
    remote: bool = True,
) -> None:
    objs = [
        _cr("gateways", "Gateway", PEER, CLIENT if gateway is None else gateway),
        _cr("networkconfigs", "NetworkConfig", "local", NETWORK),
    ]
    if remote:
        objs.append(_cr("remotenetworks", "RemoteNetwork", PEER, REMOTE))
    if connection:
        objs.append(_cr("connections", "Connection", PEER, {"clusterId": PEER}))
    for plural, obj in objs:
        server.create(plural, obj, api_version=API_VERSION)
    if secret:
        server.create(
            "secrets",
            {
                "kind": "Secret",
                "metadata": {"name": f"gpufed-wg-{PEER}", "namespace": NS},
                "data": {"privateKey": base64.b64encode(str(KEY).encode()).decode()},
            },
        )


def agent_for(
    api: Any,
    drivers: Sequence[TunnelDriver],
    *,
    ipr: MagicMock | None = None,
    clock: Callable[[], float] | None = None,
    **settings: Any,
) -> tuple[GatewayAgent, FakeNs]:
    agent = GatewayAgent(api, GatewaySettings(name=PEER, netns=None, **settings), list(drivers), clock or Clock())
    ns = FakeNs(ipr if ipr is not None else fake_ipr())
    agent.ns = ns
    return agent, ns


def connection_status(server: FakeApiServer) -> dict[str, Any]:
    conn = server.get("connections", NS, PEER)
    assert conn is not None
    status: dict[str, Any] = conn.get("status") or {}
    return status


def error_of(agent: GatewayAgent) -> str | None:
    """The agent's error, read afresh (mypy keeps the narrowing of an attribute across awaits)."""
    return agent.error


def status_patches(server: FakeApiServer) -> int:
    return len(server.calls("PATCH", STATUS_PATH))


# ---- reconcile: inputs to data plane


async def test_reconcile_configures_a_client_tunnel() -> None:
    async with serve() as (server, api):
        seed(server)
        driver = FakeDriver()
        agent, ns = agent_for(api, [driver], ipr=fake_ipr(underlay_mtu=1450))
        await agent.reconcile()
        assert agent.error is None and agent.ready.is_set() and not agent.gone.is_set()
        assert driver.ensured == [
            (
                IFACE,
                TunnelConfig(
                    private_key=str(KEY),
                    peer_public_key=str(PEER_KEY.public_key()),
                    allowed_ips=(N("10.244.0.0/16"), N("10.200.0.0/24"), N("169.254.64.1/32")),
                    listen_port=None,
                    endpoint=("192.168.77.11", 51820),
                    keepalive_s=10,
                ),
            )
        ]
        assert agent.driver is driver
        # the prefix-NAT and filter table, updated in place in one transaction through `nft -f -`
        assert ns.commands("nft") == [(["nft", "-f", "-"], nft_update(PLAN))]
        assert (["sysctl", "-qw", "net.ipv4.ip_forward=1"], None) in ns.runs
        assert ns.forwarding == "1"


async def test_gateway_status_is_written_when_it_changes_not_on_every_reapply() -> None:
    async with serve() as (server, api):
        seed(server)
        agent, _ = agent_for(api, [FakeDriver()], ipr=fake_ipr(underlay_mtu=1450))
        path = f"/apis/{API_VERSION}/namespaces/{NS}/gateways/{PEER}/status"
        await agent.reconcile()
        await agent.reconcile()  # the periodic re-apply: same data plane
        (patch,) = server.calls("PATCH", path)
        (ready,) = patch.body["status"].pop("conditions")
        assert patch.body["status"] == {"driver": "kernel", "interface": IFACE, "mtu": 1370}
        assert (ready["type"], ready["status"], ready["reason"], ready["observedGeneration"]) == (
            "Ready",
            "True",
            "Applied",
            1,
        )
        gateway = server.get("gateways", NS, PEER)
        assert gateway is not None
        gateway["spec"]["mtu"] = 1300
        gateway["metadata"]["generation"] = 2
        await agent.reconcile()
        patches = server.calls("PATCH", path)
        assert [c.body["status"]["mtu"] for c in patches] == [1370, 1300]
        assert patches[1].body["status"]["conditions"][0]["observedGeneration"] == 2


async def test_reconcile_leaves_forwarding_alone_when_it_is_on() -> None:
    async with serve() as (server, api):
        seed(server)
        agent, ns = agent_for(api, [FakeDriver()])
        ns.forwarding = "1"
        await agent.reconcile()
        assert agent.error is None
        assert [argv for argv, _ in ns.commands("sysctl")] == [["sysctl", "-n", "net.ipv4.ip_forward"]]


async def test_reconcile_configures_the_link_and_the_policy_routing() -> None:
    async with serve() as (server, api):
        seed(server)
        ipr = fake_ipr(underlay_mtu=1450)
        agent, _ns = agent_for(api, [FakeDriver()], ipr=ipr)
        await agent.reconcile()
        assert agent.error is None
        # MTU: the underlay towards the endpoint (1450) minus WireGuard-over-IPv6's 80 bytes
        ipr.route.assert_any_call("get", dst="192.168.77.11")
        ipr.link.assert_any_call("set", index=7, mtu=1370, state="up")
        ipr.addr.assert_any_call("add", index=7, local="169.254.64.2", address="169.254.64.1", prefixlen=32)
        ipr.route.assert_any_call("replace", dst="0.0.0.0/0", oif=7, table=MARK)
        ipr.route.assert_any_call("replace", dst="10.64.0.0/16", oif=7)
        ipr.route.assert_any_call("replace", dst="10.65.0.0/24", oif=7)
        assert next(c for c in ipr.rule.call_args_list if c.args[0] == "add").kwargs["fwmark"] == MARK
        gw = server.get("gateways", NS, PEER)
        assert gw is not None
        assert {k: v for k, v in gw["status"].items() if k != "conditions"} == {
            "driver": "kernel",
            "interface": IFACE,
            "mtu": 1370,
        }


async def test_reconcile_uses_the_default_mtu_without_a_route_and_the_spec_mtu_when_set() -> None:
    async with serve() as (server, api):
        seed(server)
        agent, _ns = agent_for(api, [FakeDriver()], ipr=fake_ipr(underlay_mtu=None))
        await agent.reconcile()
        gw = server.get("gateways", NS, PEER)
        assert gw is not None and gw["status"]["mtu"] == 1420

        def set_mtu(obj: dict[str, Any]) -> None:
            obj["spec"]["mtu"] = 1300

        server.update("gateways", NS, PEER, set_mtu)
        ipr = fake_ipr(underlay_mtu=1450)
        agent, _ns = agent_for(api, [FakeDriver()], ipr=ipr)
        await agent.reconcile()
        ipr.link.assert_any_call("set", index=7, mtu=1300, state="up")
        gw = server.get("gateways", NS, PEER)
        assert gw is not None and gw["status"]["mtu"] == 1300


async def test_reconcile_configures_a_server_tunnel() -> None:
    async with serve() as (server, api):
        seed(server, {**SERVER, "keepaliveS": 0, "masquerade": True})
        driver = FakeDriver()
        agent, ns = agent_for(api, [driver])
        await agent.reconcile()
        assert agent.error is None
        ((iface, cfg),) = driver.ensured
        assert iface == IFACE
        assert cfg.listen_port == 51820 and cfg.endpoint is None and cfg.keepalive_s is None
        assert cfg.allowed_ips == (N("10.244.0.0/16"), N("10.200.0.0/24"), N("169.254.64.2/32"))
        assert ns.commands("nft") == [
            (["nft", "-f", "-"], nft_update(dataclasses.replace(SERVER_PLAN, masquerade=True)))
        ]


class StaticMembers(Members):
    """Member pods the test sets (`become`), without watching anything."""

    def __init__(self, role: Role, changed: Callable[[], None]) -> None:
        super().__init__(None, PEER, role, changed)
        self.synced.set()

    def become(self, *addresses: str) -> None:
        self._current = frozenset(A(a) for a in addresses)
        self.on_change()

    async def run(self) -> None:
        await asyncio.Event().wait()


async def test_a_change_of_member_pods_refills_only_the_filter_sets() -> None:
    async with serve() as (server, api):
        seed(server, {**SERVER, "keepaliveS": 0})
        made: list[StaticMembers] = []

        def members(role: Role, changed: Callable[[], None]) -> StaticMembers:
            made.append(StaticMembers(role, changed))
            return made[-1]

        agent = GatewayAgent(api, GatewaySettings(name=PEER, netns=None), [FakeDriver()], Clock(), members=members)
        ns = FakeNs(fake_ipr())
        agent.ns = ns
        await agent.reconcile()
        (m,) = made
        assert m.role == "Server"
        assert ns.commands("nft") == [(["nft", "-f", "-"], nft_update(SERVER_PLAN))]
        m.become("10.244.0.7", "10.99.0.1")  # the second is outside our pod CIDR: not a pod of ours
        assert agent.members_changed.is_set()
        await agent.refresh_members()
        with_pod = dataclasses.replace(SERVER_PLAN, local_members=frozenset({A("10.244.0.7")}))
        assert ns.commands("nft")[1:] == [(["nft", "-f", "-"], nft_sets(with_pod))]
        await agent.refresh_members()  # nothing changed: nothing applied
        assert len(ns.commands("nft")) == 2
        # a full re-apply keeps the members
        await agent.reconcile()
        assert ns.commands("nft")[2:] == [(["nft", "-f", "-"], nft_update(with_pod))]
        assert len(made) == 1  # the same watch, not a new one per pass


async def test_a_failed_refill_asks_for_a_full_reapply() -> None:
    async with serve() as (server, api):
        seed(server)
        made: list[StaticMembers] = []

        def members(role: Role, changed: Callable[[], None]) -> StaticMembers:
            made.append(StaticMembers(role, changed))
            return made[-1]

        agent = GatewayAgent(api, GatewaySettings(name=PEER, netns=None), [FakeDriver()], Clock(), members=members)
        ns = FakeNs(fake_ipr())
        agent.ns = ns
        await agent.reconcile()
        assert made[0].role == "Client"
        agent.dirty.clear()
        made[0].become("10.64.0.9")  # the peer's pod as we see it
        ns.refuse_update = True  # nftables refuses the refill (say, the table was flushed by hand)
        await agent.refresh_members()
        assert agent.dirty.is_set()
        assert agent.plan is not None and agent.plan.peer_members == frozenset()


async def test_reconcile_rebuilds_the_table_when_nftables_refuses_the_update() -> None:
    async with serve() as (server, api):
        seed(server)
        agent, ns = agent_for(api, [FakeDriver()])
        ns.refuse_update = True  # e.g. a chain of our table hooked elsewhere
        await agent.reconcile()
        assert agent.error is None
        assert ns.commands("nft") == [(["nft", "-f", "-"], nft_update(PLAN)), (["nft", "-f", "-"], nft_ruleset(PLAN))]


async def test_a_newly_exposed_address_is_allowed_by_updating_the_table_in_place() -> None:
    async with serve() as (server, api):
        seed(server)
        agent, ns = agent_for(api, [FakeDriver()])
        await agent.reconcile()

        def expose(obj: dict[str, Any]) -> None:
            obj["spec"]["externalIps"].append({"address": "10.96.0.1", "externalAddress": "10.70.0.6"})

        server.update("networkconfigs", NS, "local", expose)
        await agent.reconcile()
        (_, first), (_, second) = ns.commands("nft")
        assert "delete table" not in (first or "") + (second or "")
        assert "add element ip " + TABLE + " local_reachable { 10.96.0.10/32, 10.244.0.0/16 }" in (first or "")
        assert "local_reachable { 10.96.0.1/32, 10.96.0.10/32, 10.244.0.0/16 }" in (second or "")
        assert 'iifname "' + IFACE + '" ip daddr 10.70.0.6 dnat ip to 10.96.0.1' in (second or "")


def dropped(direction: str) -> float:
    """The metric's value for this peering and direction (0 when it has no sample)."""
    labels = {"remote_cluster": PEER, "direction": direction}
    samples = [s for m in GATEWAY_DROPPED.collect() for s in m.samples if s.name.endswith("_total")]
    return sum(s.value for s in samples if s.labels == labels)


async def test_probe_adds_the_filters_drops_to_the_metric() -> None:
    async with serve() as (server, api):
        seed(server)
        agent, ns = agent_for(api, [FakeDriver()])
        await agent.reconcile()
        before = dropped("from_peer"), dropped("to_peer")
        ns.drops = {"dropped_from_peer": 5, "dropped_to_peer": 0}
        await agent.probe()
        assert (["nft", "-j", "list", "counters", "table", "ip", TABLE], None) in ns.runs
        assert (dropped("from_peer") - before[0], dropped("to_peer") - before[1]) == (5, 0)
        ns.drops = {"dropped_from_peer": 7, "dropped_to_peer": 2}
        await agent.probe()
        assert (dropped("from_peer") - before[0], dropped("to_peer") - before[1]) == (7, 2)
        # the table was rebuilt (its counters start again at zero): the metric never goes down
        ns.drops = {"dropped_from_peer": 3, "dropped_to_peer": 2}
        await agent.probe()
        assert (dropped("from_peer") - before[0], dropped("to_peer") - before[1]) == (10, 2)


async def test_probe_without_our_table_counts_nothing_and_still_probes() -> None:
    async with serve() as (server, api):
        seed(server)
        agent, _ns = agent_for(api, [FakeDriver()])
        await agent.reconcile()
        before = dropped("from_peer")
        await agent.probe()
        assert agent.health.failures == 0 and dropped("from_peer") == before


async def test_teardown_removes_the_drop_metric() -> None:
    async with serve() as (server, api):
        seed(server)
        agent, ns = agent_for(api, [FakeDriver()])
        await agent.reconcile()
        ns.drops = {"dropped_from_peer": 1, "dropped_to_peer": 1}
        await agent.probe()
        await agent.teardown()
        samples = [s for m in GATEWAY_DROPPED.collect() for s in m.samples if s.labels.get("remote_cluster") == PEER]
        assert samples == []


async def test_a_gateway_without_the_peer_key_is_not_applied() -> None:
    async with serve() as (server, api):
        seed(server, {**CLIENT, "peerPublicKey": ""})
        driver = FakeDriver()
        agent, ns = agent_for(api, [driver])
        await agent.reconcile()
        assert agent.error is not None and "public key" in agent.error
        assert driver.ensured == [] and ns.commands("nft") == []
        assert agent.ready.is_set()
        await agent.publish()
        status = connection_status(server)
        assert (status["phase"], status["reason"]) == ("Down", "ConfigurationFailed")
        assert status["message"] == agent.error
        assert [(c["type"], c["status"], c["reason"]) for c in status["conditions"]] == [
            ("Ready", "False", "ConfigurationFailed")
        ]
        gw = server.get("gateways", NS, PEER)
        assert gw is not None
        ((ready,),) = [gw["status"]["conditions"]]
        assert (ready["status"], ready["reason"], ready["message"]) == ("False", "ConfigurationFailed", agent.error)

        def add_key(obj: dict[str, Any]) -> None:
            obj["spec"]["peerPublicKey"] = str(PEER_KEY.public_key())

        # fixed by `gpufed network connect`: the next pass applies it and clears the error
        server.update("gateways", NS, PEER, add_key)
        await agent.reconcile()
        assert error_of(agent) is None and len(driver.ensured) == 1


async def test_a_client_gateway_without_an_endpoint_is_not_applied() -> None:
    async with serve() as (server, api):
        seed(server, {k: v for k, v in CLIENT.items() if k != "endpoint"})
        driver = FakeDriver()
        agent, _ns = agent_for(api, [driver])
        await agent.reconcile()
        assert agent.error is not None and "spec.endpoint" in agent.error
        assert driver.ensured == []


@pytest.mark.parametrize(
    ("missing", "message"),
    [
        ("secret", f"Secret {NS}/gpufed-wg-{PEER} has no privateKey"),
        ("remote", f"RemoteNetwork {NS}/{PEER} not found"),
    ],
)
async def test_missing_inputs_are_reported(missing: str, message: str) -> None:
    async with serve() as (server, api):
        seed(server, secret=missing != "secret", remote=missing != "remote")
        driver = FakeDriver()
        agent, _ns = agent_for(api, [driver])
        await agent.reconcile()
        assert agent.error is not None and message in agent.error
        assert driver.ensured == [] and not agent.gone.is_set()


async def test_an_invalid_remote_network_is_reported() -> None:
    async with serve() as (server, api):
        seed(server, remote=False)
        bad = {**REMOTE, "mapped": {"podCidr": "10.64.0.0/24", "externalCidr": "10.65.0.0/24"}}
        server.create("remotenetworks", _cr("remotenetworks", "RemoteNetwork", PEER, bad)[1], api_version=API_VERSION)
        agent, _ns = agent_for(api, [FakeDriver()])
        await agent.reconcile()
        assert agent.error is not None and f"RemoteNetwork {NS}/{PEER} is invalid" in agent.error
        # ... and marked so on the object itself
        remote = ready_of(server, "remotenetworks", PEER)
        assert summary(remote) == ("False", "Invalid", 1)
        assert remote["message"].startswith(f"RemoteNetwork {NS}/{PEER} is invalid")
        assert "must have the size of the real" in remote["message"]
        assert summary(ready_of(server, "networkconfigs", "local")) == ("True", "Accepted", 1)


# ---- the Ready conditions of the NetworkConfig and the RemoteNetwork

NETWORK_STATUS_PATH = f"/apis/{API_VERSION}/namespaces/{NS}/networkconfigs/local/status"
REMOTE_STATUS_PATH = f"/apis/{API_VERSION}/namespaces/{NS}/remotenetworks/{PEER}/status"


def ready_of(server: FakeApiServer, plural: str, name: str) -> dict[str, Any]:
    obj = server.get(plural, NS, name)
    assert obj is not None
    (ready,) = (obj.get("status") or {}).get("conditions") or [{}]
    assert isinstance(ready, dict)
    return ready


def summary(ready: dict[str, Any]) -> tuple[Any, ...]:
    return ready.get("status"), ready.get("reason"), ready.get("observedGeneration")


def set_generation(server: FakeApiServer, plural: str, name: str, generation: int) -> None:
    def change(obj: dict[str, Any]) -> None:
        obj["metadata"]["generation"] = generation

    server.update(plural, NS, name, change)


async def test_an_applied_pass_marks_the_network_config_accepted_and_the_remote_network_applied() -> None:
    async with serve() as (server, api):
        seed(server)
        set_generation(server, "networkconfigs", "local", 3)
        set_generation(server, "remotenetworks", PEER, 2)
        agent, _ns = agent_for(api, [FakeDriver()])
        await agent.reconcile()
        assert agent.error is None
        network = ready_of(server, "networkconfigs", "local")
        assert (network["type"], *summary(network)) == ("Ready", "True", "Accepted", 3)
        assert network["message"] == "pod CIDR 10.244.0.0/16, external CIDR 10.70.0.0/16"
        assert network["lastTransitionTime"] == _iso(NOW)
        remote = ready_of(server, "remotenetworks", PEER)
        assert (remote["type"], *summary(remote)) == ("Ready", "True", "Applied", 2)
        assert "10.244.0.0/16 are reached as 10.64.0.0/16" in remote["message"]
        assert "10.200.0.0/24 as 10.65.0.0/24" in remote["message"]
        # the re-apply of an unchanged pass writes neither again
        await agent.reconcile()
        assert len(server.calls("PATCH", NETWORK_STATUS_PATH)) == len(server.calls("PATCH", REMOTE_STATUS_PATH)) == 1


async def test_the_conditions_follow_a_new_generation_and_keep_their_transition_time() -> None:
    async with serve() as (server, api):
        seed(server)
        clock = Clock()
        agent, _ns = agent_for(api, [FakeDriver()], clock=clock)
        await agent.reconcile()
        clock.now = NOW + 60
        set_generation(server, "remotenetworks", PEER, 2)
        await agent.reconcile()
        remote = ready_of(server, "remotenetworks", PEER)
        assert summary(remote) == ("True", "Applied", 2)
        assert remote["lastTransitionTime"] == _iso(NOW)
        assert len(server.calls("PATCH", NETWORK_STATUS_PATH)) == 1  # its generation did not change


async def test_a_network_config_another_agent_marked_is_not_rewritten() -> None:
    # every gateway agent of a cluster reads the one NetworkConfig and concludes the same
    async with serve() as (server, api):
        seed(server)
        first, _ = agent_for(api, [FakeDriver()])
        await first.reconcile()
        second, _ = agent_for(api, [FakeDriver()], clock=Clock(NOW + 30))
        await second.reconcile()
        assert len(server.calls("PATCH", NETWORK_STATUS_PATH)) == 1
        assert ready_of(server, "networkconfigs", "local")["lastTransitionTime"] == _iso(NOW)


async def test_an_invalid_network_config_is_marked_invalid_and_its_peer_not_applied() -> None:
    async with serve() as (server, api):
        seed(server)

        def overlap(obj: dict[str, Any]) -> None:
            obj["spec"]["externalCidr"] = "10.244.128.0/24"  # inside the pod CIDR

        server.update("networkconfigs", NS, "local", overlap)
        driver = FakeDriver()
        agent, _ns = agent_for(api, [driver])
        await agent.reconcile()
        assert driver.ensured == []
        network = ready_of(server, "networkconfigs", "local")
        assert summary(network) == ("False", "Invalid", 1)
        assert network["message"].startswith(f"NetworkConfig {NS}/local is invalid")
        assert "overlaps podCidr" in network["message"]
        remote = ready_of(server, "remotenetworks", PEER)
        assert summary(remote) == ("False", "ConfigurationFailed", 1)
        assert remote["message"] == agent.error


async def test_a_remote_network_is_applied_only_once_the_data_plane_is() -> None:
    async with serve() as (server, api):
        seed(server, {**CLIENT, "peerPublicKey": ""})
        clock = Clock()
        agent, _ns = agent_for(api, [FakeDriver()], clock=clock)
        await agent.reconcile()
        remote = ready_of(server, "remotenetworks", PEER)
        assert summary(remote) == ("False", "ConfigurationFailed", 1)
        assert "public key" in remote["message"]
        assert summary(ready_of(server, "networkconfigs", "local")) == ("True", "Accepted", 1)

        def add_key(obj: dict[str, Any]) -> None:
            obj["spec"]["peerPublicKey"] = str(PEER_KEY.public_key())

        server.update("gateways", NS, PEER, add_key)
        clock.now = NOW + 5
        await agent.reconcile()
        remote = ready_of(server, "remotenetworks", PEER)
        assert summary(remote) == ("True", "Applied", 1)
        assert remote["lastTransitionTime"] == _iso(NOW + 5)


async def test_a_pass_that_cannot_read_the_objects_writes_no_condition(monkeypatch: pytest.MonkeyPatch) -> None:
    async with serve() as (server, api):
        seed(server)
        agent, _ns = agent_for(api, [FakeDriver()])
        await agent.reconcile()
        get = rest.get

        async def flaky_get(api: Any, url_path: str, *, what: str = "") -> dict[str, Any] | None:
            if "/remotenetworks/" in url_path:
                raise KubeError("the API server is not answering", 503)
            return await get(api, url_path, what=what)

        monkeypatch.setattr(rest, "get", flaky_get)
        set_generation(server, "networkconfigs", "local", 2)
        await agent.reconcile()
        assert agent.error == "the API server is not answering"
        # neither object was read in full: the conditions stay as the last complete pass wrote them
        assert len(server.calls("PATCH", NETWORK_STATUS_PATH)) == len(server.calls("PATCH", REMOTE_STATUS_PATH)) == 1
        assert summary(ready_of(server, "remotenetworks", PEER)) == ("True", "Applied", 1)


async def test_teardown_marks_the_remote_network_gateway_removed() -> None:
    async with serve() as (server, api):
        seed(server)
        agent, _ns = agent_for(api, [FakeDriver()])
        await agent.reconcile()
        await agent.teardown()
        remote = ready_of(server, "remotenetworks", PEER)
        assert summary(remote) == ("False", "GatewayRemoved", 1)
        server.remove("remotenetworks", NS, PEER)
        await agent.teardown()  # deleted with its Gateway: nothing to mark
        assert len(server.calls("PATCH", REMOTE_STATUS_PATH)) == 2


async def test_a_driver_failure_is_recorded() -> None:
    async with serve() as (server, api):
        seed(server)
        driver = FakeDriver()
        driver.ensure_error = DataplaneError("RTNETLINK answers: Operation not supported")
        agent, ns = agent_for(api, [driver])
        await agent.reconcile()
        assert agent.error == "RTNETLINK answers: Operation not supported"
        assert agent.driver is None and ns.commands("nft") == []


async def test_no_available_driver_is_reported() -> None:
    async with serve() as (server, api):
        seed(server)
        agent, _ns = agent_for(api, [FakeDriver("kernel", available=False), FakeDriver("wireguard-go", False)])
        await agent.reconcile()
        assert agent.error is not None and "no WireGuard data plane" in agent.error
        assert "kernel, wireguard-go" in agent.error


async def test_the_driver_follows_the_spec() -> None:
    async with serve() as (server, api):
        seed(server, {**CLIENT, "driver": "wireguard-go"})
        kernel, go = FakeDriver("kernel"), FakeDriver("wireguard-go")
        agent, _ns = agent_for(api, [kernel, go])
        await agent.reconcile()
        assert agent.error is None and agent.driver is go
        assert kernel.ensured == [] and len(go.ensured) == 1

        def auto(obj: dict[str, Any]) -> None:
            obj["spec"]["driver"] = "auto"

        # "auto" keeps the driver in use
        server.update("gateways", NS, PEER, auto)
        await agent.reconcile()
        assert agent.driver is go and len(go.ensured) == 2

        def kernel_only(obj: dict[str, Any]) -> None:
            obj["spec"]["driver"] = "kernel"

        server.update("gateways", NS, PEER, kernel_only)
        await agent.reconcile()
        assert agent.driver is kernel and len(kernel.ensured) == 1


async def test_auto_takes_the_first_available_driver() -> None:
    async with serve() as (server, api):
        seed(server)
        kernel, go = FakeDriver("kernel", available=False), FakeDriver("wireguard-go")
        agent, _ns = agent_for(api, [kernel, go])
        await agent.reconcile()
        assert agent.driver is go


async def test_a_deleted_gateway_makes_reconcile_set_gone() -> None:
    async with serve() as (server, api):
        seed(server)
        agent, _ns = agent_for(api, [FakeDriver()])
        await agent.reconcile()
        assert not agent.gone.is_set()
        server.remove("gateways", NS, PEER)
        await agent.reconcile()
        assert agent.gone.is_set()


async def test_reconcile_without_a_gateway_at_all_sets_gone() -> None:
    async with serve() as (_server, api):
        driver = FakeDriver()
        agent, _ns = agent_for(api, [driver])
        await agent.reconcile()
        assert agent.gone.is_set() and driver.ensured == []


# ---- probe


async def test_probe_measures_the_rtt_and_reads_the_stats() -> None:
    async with serve() as (server, api):
        seed(server)
        driver = FakeDriver()
        agent, ns = agent_for(api, [driver])
        await agent.reconcile()
        await agent.probe()
        assert agent.health == Health(0, 0.42, PeerStats(NOW - 5, 100, 200))
        assert driver.stats_asked == [IFACE]
        assert ns.commands("ping") == [(["ping", "-n", "-q", "-c", "1", "-W", "1", "169.254.64.1"], None)]


async def test_probe_reads_the_rtt_from_the_quiet_summary() -> None:
    async with serve() as (server, api):
        seed(server)
        agent, ns = agent_for(api, [FakeDriver()])
        await agent.reconcile()
        ns.ping_answer = (
            "--- 169.254.64.1 ping statistics ---\n"
            "1 packets transmitted, 1 received, 0% packet loss, time 0ms\n"
            "rtt min/avg/max/mdev = 0.380/0.455/0.530/0.010 ms\n"
        )
        await agent.probe()
        assert agent.health.failures == 0 and agent.health.rtt_ms == 0.455


async def test_probe_counts_lost_probes_and_recovers() -> None:
    async with serve() as (server, api):
        seed(server)
        agent, ns = agent_for(api, [FakeDriver()])
        await agent.reconcile()
        ns.ping_answer = None
        await agent.probe()
        await agent.probe()
        assert agent.health.failures == 2 and agent.health.rtt_ms is None
        assert agent.health.stats == PeerStats(NOW - 5, 100, 200)
        ns.ping_answer = PING_OK
        await agent.probe()
        assert agent.health.failures == 0 and agent.health.rtt_ms == 0.42


async def test_probe_without_an_interface_has_no_stats() -> None:
    async with serve() as (server, api):
        seed(server)
        driver = FakeDriver()
        agent, _ns = agent_for(api, [driver])
        await agent.reconcile()
        driver.stats_error = DataplaneError("no such device")
        await agent.probe()
        assert agent.health.stats is None
        assert judge(agent.health, None, NOW)[1] == "InterfaceMissing"


async def test_probe_before_the_tunnel_is_applied_counts_a_failure() -> None:
    async with serve() as (server, api):
        seed(server, {**CLIENT, "peerPublicKey": ""})
        agent, ns = agent_for(api, [FakeDriver()])
        await agent.reconcile()
        await agent.probe()
        assert agent.health.failures == 1 and ns.commands("ping") == []


# ---- publish


async def test_publish_writes_the_connection_status_with_a_merge_patch() -> None:
    async with serve() as (server, api):
        seed(server)
        clock = Clock()
        agent, _ns = agent_for(api, [FakeDriver()], clock=clock)
        await agent.reconcile()
        await agent.probe()
        await agent.publish()
        (patch,) = server.calls("PATCH", STATUS_PATH)
        assert patch.content_type == "application/merge-patch+json"
        assert connection_status(server) == {
            "phase": "Connected",
            "reason": "ProbeSucceeded",
            "message": "peer answers across the tunnel in 0.42 ms",
            "rttMs": 0.42,
            "latestHandshake": _iso(NOW - 5),
            "lastProbe": _iso(NOW),
            "lastTransitionTime": _iso(NOW),
            "conditions": [
                {
                    "type": "Ready",
                    "status": "True",
                    "reason": "ProbeSucceeded",
                    "message": "peer answers across the tunnel in 0.42 ms",
                    "lastTransitionTime": _iso(NOW),
                    "observedGeneration": 1,
                }
            ],
        }
        conn = server.get("connections", NS, PEER)
        assert conn is not None and conn["spec"] == {"clusterId": PEER}  # the spec is left alone


async def test_publish_writes_again_only_on_change_or_after_the_refresh_period() -> None:
    async with serve() as (server, api):
        seed(server)
        clock = Clock()
        agent, ns = agent_for(api, [FakeDriver()], clock=clock, status_refresh_s=30.0)
        await agent.reconcile()
        await agent.probe()
        await agent.publish()
        assert status_patches(server) == 1
        # nothing changed, within the refresh period: no write
        clock.now += 10
        await agent.probe()
        await agent.publish()
        clock.now += 19
        await agent.publish()
        assert status_patches(server) == 1
        # the refresh period is over: written again, the transition time kept
        clock.now += 1
        await agent.publish()
        assert status_patches(server) == 2
        status = connection_status(server)
        assert status["lastProbe"] == _iso(NOW + 30) and status["lastTransitionTime"] == _iso(NOW)
        # a phase change is written at once, with a new transition time
        clock.now += 1
        ns.ping_answer = None
        await agent.probe()
        await agent.publish()
        assert status_patches(server) == 3
        status = connection_status(server)
        assert (status["phase"], status["reason"]) == ("Degraded", "ProbeLoss")
        assert status["lastTransitionTime"] == _iso(NOW + 31)
        assert "rttMs" not in status  # null in a merge patch removes it
        ready = status["conditions"][0]
        assert (ready["status"], ready["reason"]) == ("True", "ProbeLoss"), "degraded still carries traffic"
        assert ready["lastTransitionTime"] == _iso(NOW)
        # a second lost probe changes the message, not the phase: not written yet
        clock.now += 1
        await agent.probe()
        await agent.publish()
        assert status_patches(server) == 3
        # until forced (as after each reconcile)
        await agent.publish(force=True)
        assert status_patches(server) == 4
        assert connection_status(server)["message"] == "2 probe(s) in a row lost"


async def test_publish_reports_down_after_enough_lost_probes() -> None:
    async with serve() as (server, api):
        seed(server)
        clock = Clock()
        driver = FakeDriver()
        driver.peer_stats = PeerStats(NOW - HANDSHAKE_STALE_S - 60, 1, 1)
        agent, ns = agent_for(api, [driver], clock=clock)
        await agent.reconcile()
        ns.ping_answer = None
        for _ in range(DOWN_AFTER):
            await agent.probe()
        await agent.publish()
        status = connection_status(server)
        assert (status["phase"], status["reason"]) == ("Down", "HandshakeStale")
        assert status["latestHandshake"] == _iso(NOW - HANDSHAKE_STALE_S - 60)
        assert [(c["type"], c["status"], c["reason"]) for c in status["conditions"]] == [
            ("Ready", "False", "HandshakeStale")
        ]


async def test_the_connection_condition_follows_the_generation_its_write_returns() -> None:
    async with serve() as (server, api):
        seed(server)
        server.update("connections", NS, PEER, lambda o: o["metadata"].update(generation=2))
        clock = Clock()
        agent, _ns = agent_for(api, [FakeDriver()], clock=clock)
        await agent.reconcile()
        await agent.probe()
        await agent.publish()
        assert connection_status(server)["conditions"][0]["observedGeneration"] == 1
        clock.now += 1
        await agent.probe()
        await agent.publish()  # within the refresh period, yet written: the generation was wrong
        assert status_patches(server) == 2
        assert connection_status(server)["conditions"][0]["observedGeneration"] == 2


async def test_publish_never_creates_a_missing_connection() -> None:
    async with serve() as (server, api):
        seed(server, connection=False)
        agent, _ns = agent_for(api, [FakeDriver()])
        await agent.reconcile()
        await agent.probe()
        await agent.publish()  # a 404, logged, not raised
        assert server.get("connections", NS, PEER) is None
        assert not [r for r in server.requests if r.method in ("POST", "PUT") and "/connections" in r.path]
        assert [r.path for r in server.requests if r.method == "PATCH" and "/connections" in r.path] == [STATUS_PATH]
        # not counted as written: the next pass tries again
        await agent.publish()
        assert status_patches(server) == 2
        assert server.get("connections", NS, PEER) is None


# ---- teardown and the whole agent


async def test_teardown_removes_what_the_agent_created() -> None:
    async with serve() as (server, api):
        seed(server)
        ipr = fake_ipr()
        kernel, go = FakeDriver("kernel"), FakeDriver("wireguard-go")
        agent, ns = agent_for(api, [kernel, go], ipr=ipr)
        ns.tables.add(TABLE)
        await agent.teardown()
        assert kernel.removed == [IFACE] and go.removed == [IFACE]
        assert (["nft", "delete", "table", "ip", TABLE], None) in ns.runs
        ipr.flush_routes.assert_called_once_with(table=MARK)


async def test_teardown_without_our_table_deletes_no_table() -> None:
    async with serve() as (server, api):
        seed(server)
        agent, ns = agent_for(api, [FakeDriver()])
        await agent.teardown()
        assert [argv for argv, _ in ns.commands("nft")] == [["nft", "list", "table", "ip", TABLE]]


async def test_run_applies_probes_publishes_and_tears_down_when_the_gateway_is_deleted() -> None:
    async with serve() as (server, api):
        seed(server)
        driver = FakeDriver()
        agent, ns = agent_for(api, [driver], clock=lambda: NOW, probe_interval_s=0.02)
        async with running(agent.run()) as task:
            await until(lambda: connection_status(server).get("phase") == "Connected", 3, "Connected")
            assert driver.ensured and driver.ensured[0][0] == IFACE

            def new_port(obj: dict[str, Any]) -> None:
                obj["spec"]["endpoint"] = "192.168.77.11:51999"

            # a change of the Gateway is applied without waiting for the resync
            server.update("gateways", NS, PEER, new_port)
            await until(lambda: driver.ensured[-1][1].endpoint == ("192.168.77.11", 51999), 3, "re-applied")
            ns.tables.add(TABLE)
            server.remove("gateways", NS, PEER)
            await asyncio.wait_for(asyncio.shield(task), 3)
        assert driver.removed == [IFACE]
        assert (["nft", "delete", "table", "ip", TABLE], None) in ns.runs


async def test_run_returns_at_once_when_there_is_no_gateway() -> None:
    async with serve() as (_server, api):
        driver = FakeDriver()
        agent, _ns = agent_for(api, [driver])
        await asyncio.wait_for(agent.run(), 3)
        assert driver.ensured == [] and driver.removed == [IFACE]


async def test_a_cancelled_agent_leaves_the_data_plane_up() -> None:
    async with serve() as (server, api):
        seed(server)
        driver = FakeDriver()
        agent, ns = agent_for(api, [driver], probe_interval_s=0.02)
        ns.tables.add(TABLE)
        async with running(agent.run()):
            await until(lambda: bool(driver.ensured), 3, "applied")
        assert driver.removed == []
        assert not [argv for argv, _ in ns.commands("nft") if argv[1] == "delete"]


async def test_the_first_status_after_applying_describes_the_tunnel_just_applied() -> None:
    # the status forced after each reconcile follows a probe of the tunnel just applied: it never
    # says the interface is missing merely because no probe has run yet
    async with serve() as (server, api):
        seed(server)
        agent, _ns = agent_for(api, [FakeDriver()], clock=lambda: NOW, probe_interval_s=30)
        async with running(agent.run()):
            await until(lambda: status_patches(server) > 0, 3, "a status")
        first = server.calls("PATCH", STATUS_PATH)[0].body["status"]
        assert (first["phase"], first["reason"], first["rttMs"]) == ("Connected", "ProbeSucceeded", 0.42)


async def test_endpoint_host_names_are_resolved_for_wireguard() -> None:
    from netfabric.controllers.gateway import _resolve

    assert await _resolve(("192.168.77.11", 51820)) == ("192.168.77.11", 51820)
    assert await _resolve(("localhost", 51821)) == ("127.0.0.1", 51821)
    with pytest.raises(DataplaneError, match="cannot resolve the gateway endpoint"):
        await _resolve(("no-such-host.invalid", 51820))
