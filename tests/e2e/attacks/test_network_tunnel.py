"""Attacks through the WireGuard tunnel, from the provider's position, with real packets.

The provider controls its API server, its objects and its end of the tunnel. Here it has taken its
gateway over: its agent is stopped, the filter chains of its own table are deleted, its WireGuard
device accepts every destination for the consumer (allowed IPs 0.0.0.0/0) and it routes the
consumer's API server, a node, the metadata address and an unexposed Service into the tunnel. The
consumer's gateway must not forward any of it: each attack is dropped by the consumer's own filter,
counted in its nftables counter and in `gpufed_gateway_dropped_packets_total` of the consumer's
agent, and no packet reaches the victim (a counter in the victim's namespace stays at 0). The flows
the fabric exists for — a consumer pod to the offloaded pod, the provider's pod to a consumer pod and
to an exposed consumer Service — still pass.

Topology (tests/e2e/test_fabric.py's `Fabric`, plus victims linked to the consumer's gateway as its
cluster would route them):

    c-pod (10.244.1.10) ─┐                                                ┌─ p-pod (the twin's podIP)
    c-svc (10.96.0.10) ──┼─ c-gw ══ WireGuard over the underlay ══ p-gw ──┘
    victims ─────────────┘  (API server, node, metadata, unexposed Service)

Data-plane attacks have no user-facing refusal: the drop counter and its metric are what the
attacked side records.
"""

from __future__ import annotations

import json
import secrets
import socket
import subprocess
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from ipaddress import IPv4Address, IPv4Network
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families
from wireguard_tools.wireguard_uapi import WireguardUAPIDevice

from netfabric.render import FILTER_CHAINS, interface_name, table_name
from tests.e2e.conftest import Clusters
from tests.e2e.helpers import eventually, gpufed, out, peered_session
from tests.e2e.test_fabric import CONSUMER_POD, CONSUMER_SVC, HTTP_PORT, Fabric, _missing, ns_exec, offload_a_pod, sh

pytestmark = pytest.mark.timeout(900)

#: Victims on the consumer's side, each a namespace linked to the consumer's gateway (role -> address).
#: The API server is the consumer's `kubernetes` Service address (read from the cluster); the node a
#: kubelet's address on the node network; the Service an address of the service range never exposed.
NODE = "172.18.0.2"
METADATA = "169.254.169.254"
UNEXPOSED_SVC = "10.96.0.20"
#: The provider pod's side of its link to the provider's gateway (`Fabric.link("pgw", "ppod", ...)`).
PPOD_LINK = "ppod-pgw"


@dataclass
class Tunnel:
    fabric: Fabric
    metrics_port: int
    #: role -> address of the victims on the defending side.
    victims: dict[str, str] = field(default_factory=dict)
    #: (consumer namespace, the offloaded pod's IP on the consumer, the twin's real podIP).
    pod: tuple[str, str, str] = ("", "", "")
    #: The side whose gateway stays gpufed's and must refuse ("consumer" or "gpu-a").
    defender: str = "consumer"

    @property
    def provider_id(self) -> str:
        return str(self.fabric.ids["gpu-a"])

    @property
    def attacker_id(self) -> str:
        return str(self.fabric.ids["gpu-a" if self.defender == "consumer" else "consumer"])

    def victim_ns(self, role: str) -> str:
        return self.fabric.ns(role)

    def dropped_metric(self, direction: str = "from_peer") -> float:
        """`gpufed_gateway_dropped_packets_total` of the defender's agent for this peering."""
        with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=5) as r:
            text = r.read().decode()
        for family in text_string_to_metric_families(text):
            for s in family.samples:
                if (
                    s.name == "gpufed_gateway_dropped_packets_total"
                    and s.labels.get("remote_cluster") == self.attacker_id
                    and s.labels.get("direction") == direction
                ):
                    return float(s.value)
        return 0.0

    def dropped_counter(self) -> int:
        """The defending gateway's nftables counter of packets from the peer it dropped."""
        table = table_name(self.attacker_id)
        gw = "cgw" if self.defender == "consumer" else "pgw"
        got = ns_exec(self.fabric.ns(gw), "nft", "-j", "list", "counters", "table", "ip", table)
        items = json.loads(got.stdout)["nftables"]
        return next(
            int(i["counter"]["packets"]) for i in items if i.get("counter", {}).get("name") == "dropped_from_peer"
        )

    def watch(self, role: str) -> None:
        """A counter in a victim's namespace of every TCP and ICMP packet that arrives there."""
        probe = (
            "table inet gfvictim {\n"
            "  chain c {\n"
            "    type filter hook prerouting priority -400; policy accept;\n"
            "    meta l4proto { tcp, icmp } counter\n"
            "  }\n"
            "}\n"
        )
        ns_exec(self.fabric.ns(role), "nft", "delete", "table", "inet", "gfvictim", check=False)
        subprocess.run(
            ["ip", "netns", "exec", self.fabric.ns(role), "nft", "-f", "-"], input=probe, text=True, check=True
        )

    def delivered(self, role: str) -> int:
        rules = json.loads(ns_exec(self.fabric.ns(role), "nft", "-j", "list", "table", "inet", "gfvictim").stdout)
        return sum(int(r["rule"]["expr"][-1]["counter"]["packets"]) for r in rules["nftables"] if "rule" in r)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def take_over(t: Tunnel, gw: str, peer_id: str, context: str, routed: list[str] | None = None) -> None:
    """What a peer that controls its end does: its agent stopped (`context`), no filter of its own
    (the filter chains of its table in gateway namespace `gw` deleted), every destination allowed to
    its WireGuard peer and the victims' addresses (`routed`; None: every victim's) routed into the
    tunnel. Its NAT stays (legitimate flows keep working)."""
    f = t.fabric
    f.stop_agent(context)
    for name in FILTER_CHAINS:
        ns_exec(f.ns(gw), "nft", "delete", "chain", "ip", table_name(peer_id), name)
    iface = interface_name(peer_id)
    device = WireguardUAPIDevice(Path(f"/var/run/wireguard/{iface}.sock"))
    try:
        (peer,) = device.get_config().peers.values()
    finally:
        device.close()
    with socket.socket(socket.AF_UNIX) as s:
        s.connect(f"/var/run/wireguard/{iface}.sock")
        s.sendall(f"set=1\npublic_key={peer.public_key.hex}\nallowed_ip=0.0.0.0/0\n\n".encode())
        assert s.recv(64).startswith(b"errno=0"), f"{context} could not widen its allowed IPs"
    for address in t.victims.values() if routed is None else routed:
        sh("ip", "-n", f.ns(gw), "route", "replace", f"{address}/32", "dev", iface)


def clean_up(t: Tunnel, extra: list[str]) -> None:
    """The offloaded namespace, the fabric and the victims' namespaces, whatever state they are in."""
    clusters = t.fabric.clusters
    ns, _, _ = t.pod
    if ns:
        gpufed("unoffload-namespace", ns, "--kubeconfig", str(clusters.kubeconfig), "--context", "consumer")
        clusters.kubectl("consumer", "delete", "namespace", ns, "--wait=false", check=False)
    t.fabric.destroy()
    for name in extra:
        sh("ip", "netns", "del", name, check=False)


@pytest.fixture(scope="module")
def tunnel(clusters: Clusters, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Tunnel]:
    missing = _missing()
    if missing:
        pytest.fail("the data-plane tests cannot run on this machine: " + "; ".join(missing), pytrace=False)
    for ids in peered_session(clusters, {"gpu-a": ("--gpus", "8")}):
        f = Fabric(clusters, ids, secrets.token_hex(2), tmp_path_factory.mktemp("tunnel"))
        api = clusters.kubectl_json("consumer", "get", "service", "kubernetes", "-n", "default")["spec"]["clusterIP"]
        t = Tunnel(
            f,
            _free_port(),
            {"vapi": str(api), "vnode": NODE, "vmeta": METADATA, "vsvc": UNEXPOSED_SVC},
        )
        extra: list[str] = []
        try:
            f.build()
            for role, address in t.victims.items():
                sh("ip", "netns", "add", f.ns(role))
                extra.append(f.ns(role))
                sh("ip", "-n", f.ns(role), "link", "set", "lo", "up")
                f.link("cgw", role, address)
                f.serve(role, address)
            with pytest.MonkeyPatch.context() as mp:
                mp.setenv("GPUFED_METRICS_PORT", str(t.metrics_port))
                mp.setenv("GPUFED_METRICS_HOST", "127.0.0.1")
                f.start_agent("consumer")
            f.start_agent("gpu-a")
            f.serve("csvc", CONSUMER_SVC)
            f.serve("cpod", CONSUMER_POD)
            f.wait_phase("Connected")
            t.pod = offload_a_pod(f, f"tunnel-{f.tag}", with_service=False)
            kc = str(clusters.kubeconfig)
            exposed = gpufed("network", "expose", CONSUMER_SVC, "--kubeconfig", kc, "--context", "consumer")
            assert exposed.returncode == 0, out(exposed)
            # before the takeover: the exposed Service answers the provider's pod (the legitimate path)
            there = _exposed_there(t)
            eventually("the exposed Service answers gpu-a's pod", lambda: f.curl("ppod", there, 2))  # noqa: B023
            take_over(t, "pgw", str(f.ids["consumer"]), "gpu-a")
            yield t
        except BaseException:
            print(f.diagnostics())
            raise
        finally:
            clean_up(t, extra)


def _exposed_there(t: Tunnel) -> str:
    """Where gpu-a's pods reach the exposed consumer Service (the consumer's external address as gpu-a maps it)."""
    f = t.fabric
    cfg = f.clusters.kubectl_json("consumer", "get", "networkconfig", "-n", "gpufed", "local")["spec"]
    ext = next(e["externalAddress"] for e in cfg["externalIps"] if e["address"] == CONSUMER_SVC)
    mapped = IPv4Network(f.remote_network("gpu-a")["mapped"]["externalCidr"])
    offset = int(IPv4Address(ext)) - int(IPv4Network(cfg["externalCidr"]).network_address)
    return str(mapped.network_address + offset)


def _consumer_pod_there(t: Tunnel) -> str:
    """Where gpu-a's pods reach the consumer's pod (the consumer's pod range as gpu-a maps it)."""
    p = t.fabric.remote_network("gpu-a")
    offset = int(IPv4Address(CONSUMER_POD)) - int(IPv4Network(p["real"]["podCidr"]).network_address)
    return str(IPv4Network(p["mapped"]["podCidr"]).network_address + offset)


def _attack(t: Tunnel, role: str, target: str, *curl_flags: str) -> None:
    """From the attacker's pod, HTTP to `target` through the tunnel: refused by the defender's gateway
    (the request times out), counted (nftables counter and metric), and nothing reaches the victim."""
    metric, counter = t.dropped_metric(), t.dropped_counter()
    t.watch(role)
    attacker = "ppod" if t.defender == "consumer" else "cpod"
    got = ns_exec(
        t.fabric.ns(attacker), "curl", "-s", "-m", "3", *curl_flags, f"http://{target}:{HTTP_PORT}/", check=False
    )
    assert got.returncode == 28, f"curl to {target}: exit {got.returncode} (28: timed out), {got.stdout!r}"
    assert t.delivered(role) == 0, f"packets from the provider reached {role} ({target})"
    assert t.dropped_counter() > counter
    eventually("the drop in gpufed_gateway_dropped_packets_total", lambda: t.dropped_metric() > metric, timeout=15)


def test_provider_pod_cannot_reach_the_consumer_api_server(tunnel: Tunnel) -> None:
    _attack(tunnel, "vapi", tunnel.victims["vapi"])


def test_provider_pod_cannot_reach_a_consumer_node(tunnel: Tunnel) -> None:
    _attack(tunnel, "vnode", NODE)


def test_provider_pod_cannot_reach_the_metadata_address(tunnel: Tunnel) -> None:
    _attack(tunnel, "vmeta", METADATA)


def test_provider_pod_cannot_reach_an_unexposed_consumer_service(tunnel: Tunnel) -> None:
    _attack(tunnel, "vsvc", UNEXPOSED_SVC)


def test_provider_pod_cannot_reach_the_consumer_gateway_itself(tunnel: Tunnel) -> None:
    # the consumer's tunnel address is routed to the provider's WireGuard peer by design (the probes):
    # only the peer gateway's echo request may reach it, not a pod's connection (without the filter the
    # gateway would answer with a reset, exit 7)
    gw = tunnel.fabric.clusters.kubectl_json("consumer", "get", "gateway", "-n", "gpufed", tunnel.provider_id)
    address = gw["spec"]["tunnelAddress"]
    metric, counter = tunnel.dropped_metric(), tunnel.dropped_counter()
    got = ns_exec(tunnel.fabric.ns("ppod"), "curl", "-s", "-m", "3", f"http://{address}:{HTTP_PORT}/", check=False)
    assert got.returncode == 28, f"curl to the consumer gateway {address}: exit {got.returncode} (28: timed out)"
    assert tunnel.dropped_counter() > counter
    eventually("the drop in the metric", lambda: tunnel.dropped_metric() > metric, timeout=15)
    # the tunnel itself is unharmed: the consumer still sees it Connected
    assert tunnel.fabric.in_phase("consumer", "Connected")


def test_provider_cannot_spoof_a_source_outside_its_pod_range(tunnel: Tunnel) -> None:
    # WireGuard accepts the provider's whole external range as a source; the filter accepts new flows
    # only from its pod range
    f = tunnel.fabric
    external = IPv4Network(f.remote_network("consumer")["real"]["externalCidr"])  # gpu-a's own, real
    spoofed = str(external.network_address + 66)
    ns_exec(f.ns("ppod"), "ip", "addr", "add", f"{spoofed}/32", "dev", PPOD_LINK)
    try:
        _attack(tunnel, "cpod", _consumer_pod_there(tunnel), "--interface", spoofed)
    finally:
        ns_exec(f.ns("ppod"), "ip", "addr", "del", f"{spoofed}/32", "dev", PPOD_LINK, check=False)


def test_provider_pod_that_is_no_twin_cannot_reach_a_consumer_pod(tunnel: Tunnel) -> None:
    # a pod of the provider's own (or another tenant's), at an address of its real pod range that is
    # no twin of the consumer's: the consumer's filter lets only the pods it offloaded there open flows
    f = tunnel.fabric
    provider_pods = IPv4Network(f.remote_network("consumer")["real"]["podCidr"])  # gpu-a's own, real
    other = str(provider_pods.broadcast_address - 2)
    assert other != tunnel.pod[2], "the address chosen for a non-twin pod is the twin's"
    ns_exec(f.ns("ppod"), "ip", "addr", "add", f"{other}/32", "dev", PPOD_LINK)
    try:
        _attack(tunnel, "cpod", _consumer_pod_there(tunnel), "--interface", other)
    finally:
        ns_exec(f.ns("ppod"), "ip", "addr", "del", f"{other}/32", "dev", PPOD_LINK, check=False)


def test_legitimate_flows_still_pass_the_filter(tunnel: Tunnel) -> None:
    f = tunnel.fabric
    _ns, local_ip, _remote = tunnel.pod
    dropped = tunnel.dropped_counter()
    # a consumer pod to the offloaded pod, by the address the consumer API shows
    eventually("the offloaded pod answers the consumer pod", lambda: f.curl("cpod", local_ip, 2), timeout=30)
    # the provider's twin pod to the exposed consumer Service and to a consumer pod
    assert f.curl("ppod", _exposed_there(tunnel)) == local_ip
    assert f.curl("ppod", _consumer_pod_there(tunnel)) == local_ip
    ping = f.ping("cpod", local_ip, count=3)
    assert ping.returncode == 0, ping.stdout + ping.stderr
    assert tunnel.dropped_counter() == dropped, "the consumer's filter dropped legitimate packets"
