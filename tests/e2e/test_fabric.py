"""The network fabric with real packets: network namespaces, wireguard-go, nftables, real clusters.

Topology (all on this machine, no traffic leaves it):

    c-pod (10.244.1.10) ─ c-gw ══ underlay veth 192.168.77.10 ↔ .11 ══ p-gw ─ p-pod (kwok's podIP)
    c-svc (10.96.0.10) ──┘                                                   (inside 10.244.0.0/16 too)

`gpufed peer` configures the fabric (IPAM on both sides, keys, Gateways; the local environment's
NetworkConfigs advertise the gateways at 192.168.77.10+i); the two gateway agents (`gpufed gateway
--netns`) are the only thing that configures the gateway namespaces. The test builds the namespaces
and links that stand for the clusters' pod networks, reads addresses from the consumer API as a user
would, and sends packets. Without root, TUN, nft, ip or ping the module FAILS with the reason: CI has them.
"""

from __future__ import annotations

import base64
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from ipaddress import IPv4Address, IPv4Network
from pathlib import Path
from typing import Any

import pytest
from wireguard_tools import WireguardKey
from wireguard_tools.wireguard_uapi import WireguardUAPIDevice

from gpufed.apis.wire import ClusterID
from netfabric.render import interface_name
from tests.e2e.conftest import REPO, Clusters
from tests.e2e.helpers import eventually, gpufed, offload, out, peered_session

pytestmark = pytest.mark.timeout(900)

CONSUMER_POD = "10.244.1.10"
CONSUMER_SVC = "10.96.0.10"
GW_LINK = "169.254.1.1"  # the gateway's address on its pod-side links (and the masquerade source)
HTTP_PORT = 8080

# A tiny HTTP server that answers with the source address it sees.
ECHO = (
    "import http.server,sys\n"
    "class H(http.server.BaseHTTPRequestHandler):\n"
    "    def do_GET(self):\n"
    "        b=self.client_address[0].encode(); self.send_response(200)\n"
    "        self.send_header('Content-Length',str(len(b))); self.end_headers(); self.wfile.write(b)\n"
    "    def log_message(self,*a): pass\n"
    "http.server.ThreadingHTTPServer((sys.argv[1],int(sys.argv[2])),H).serve_forever()\n"
)


def _missing() -> list[str]:
    why = []
    if os.geteuid() != 0:
        why.append("not root (network namespaces and nftables need CAP_NET_ADMIN)")
    if not Path("/dev/net/tun").exists():
        why.append("no /dev/net/tun (wireguard-go needs TUN)")
    for tool in ("ip", "nft", "ping"):
        if shutil.which(tool) is None:
            why.append(f"no `{tool}` (run `make deps`: Debian packages iproute2, nftables, iputils-ping)")
    return why


def sh(*argv: str, check: bool = True, timeout: float = 30) -> subprocess.CompletedProcess[str]:
    p = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
    if check and p.returncode != 0:
        raise AssertionError(f"{' '.join(argv)} -> {p.returncode}: {p.stdout}{p.stderr}")
    return p


def ns_exec(ns: str, *argv: str, check: bool = True, timeout: float = 30) -> subprocess.CompletedProcess[str]:
    return sh("ip", "netns", "exec", ns, *argv, check=check, timeout=timeout)


@dataclass
class Fabric:
    clusters: Clusters
    ids: dict[str, ClusterID]
    tag: str
    logs: Path
    agents: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    servers: list[subprocess.Popen[bytes]] = field(default_factory=list)

    def ns(self, role: str) -> str:
        return f"gf{self.tag}-{role}"

    @property
    def names(self) -> list[str]:
        return [self.ns(r) for r in ("cpod", "csvc", "cgw", "pgw", "ppod")]

    def endpoint(self, context: str) -> IPv4Address:
        return IPv4Address(self.clusters.topology.gateway_endpoint(context).split(":")[0])

    # ---- topology the clusters' pod networks stand for

    def build(self) -> None:
        for n in self.names:
            sh("ip", "netns", "add", n)
            sh("ip", "-n", n, "link", "set", "lo", "up")
        self.link("cgw", "cpod", CONSUMER_POD)
        self.link("cgw", "csvc", CONSUMER_SVC)
        c, p = self.endpoint("consumer"), self.endpoint("gpu-a")
        sh(
            "ip",
            "link",
            "add",
            "ul-c",
            "netns",
            self.ns("cgw"),
            "type",
            "veth",
            "peer",
            "ul-p",
            "netns",
            self.ns("pgw"),
        )
        sh("ip", "-n", self.ns("cgw"), "addr", "add", f"{c}/24", "dev", "ul-c")
        sh("ip", "-n", self.ns("pgw"), "addr", "add", f"{p}/24", "dev", "ul-p")
        for ns, dev in ((self.ns("cgw"), "ul-c"), (self.ns("pgw"), "ul-p")):
            sh("ip", "-n", ns, "link", "set", dev, "up")

    def link(self, gw: str, pod: str, address: str) -> None:
        """A point-to-point link gateway <-> pod: the pod's /32 routed to it, its default route to us."""
        g, p = f"{gw}-{pod}"[:15], f"{pod}-{gw}"[:15]
        sh("ip", "link", "add", g, "netns", self.ns(gw), "type", "veth", "peer", p, "netns", self.ns(pod))
        sh("ip", "-n", self.ns(gw), "addr", "add", f"{GW_LINK}/32", "dev", g)
        sh("ip", "-n", self.ns(gw), "link", "set", g, "up")
        sh("ip", "-n", self.ns(gw), "route", "replace", f"{address}/32", "dev", g)
        sh("ip", "-n", self.ns(pod), "addr", "add", f"{address}/32", "dev", p)
        sh("ip", "-n", self.ns(pod), "link", "set", p, "up")
        sh("ip", "-n", self.ns(pod), "route", "add", f"{GW_LINK}/32", "dev", p)
        sh("ip", "-n", self.ns(pod), "route", "add", "default", "via", GW_LINK)

    def serve(self, role: str, address: str) -> None:
        proc = subprocess.Popen(
            ["ip", "netns", "exec", self.ns(role), sys.executable, "-c", ECHO, address, str(HTTP_PORT)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        self.servers.append(proc)

    # ---- gateway agents

    def start_agent(self, context: str) -> None:
        peer = self.ids["gpu-a"] if context == "consumer" else self.ids["consumer"]
        ns = self.ns("cgw") if context == "consumer" else self.ns("pgw")
        log = (self.logs / f"gateway-{context}.log").open("ab")
        self.agents[context] = subprocess.Popen(
            [sys.executable, "-m", "gpufed.cli", "gateway", "--name", peer, "--kubeconfig",
             str(self.clusters.kubeconfig), "--context", context, "--netns", ns,
             "--wireguard-go", str(self.clusters.env.binary("wireguard-go")), "--probe-interval", "1"],
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=REPO,
        )  # fmt: skip

    def stop_agent(self, context: str) -> None:
        proc = self.agents.pop(context)
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=20)

    def network(self, verb: str, *flags: str) -> subprocess.CompletedProcess[str]:
        """`gpufed network <verb>` for this peering, as a user runs it."""
        kc = str(self.clusters.kubeconfig)
        pair = ["--kubeconfig", kc, "--context", "consumer", "--remote-kubeconfig", kc, "--remote-context", "gpu-a"]
        return gpufed("network", verb, *pair, *flags)

    def tunnel(self, context: str) -> tuple[int, str]:
        """(interface index, public key) of the running WireGuard device, read from the device."""
        peer = self.ids["gpu-a"] if context == "consumer" else self.ids["consumer"]
        ns = self.ns("cgw") if context == "consumer" else self.ns("pgw")
        iface = interface_name(peer)
        index = json.loads(ns_exec(ns, "ip", "-j", "link", "show", "dev", iface).stdout)[0]["ifindex"]
        device = WireguardUAPIDevice(Path(f"/var/run/wireguard/{iface}.sock"))
        try:
            key = device.get_config().private_key
        finally:
            device.close()
        assert key is not None
        return int(index), str(key.public_key())

    def connection(self, context: str) -> dict[str, Any]:
        peer = self.ids["gpu-a"] if context == "consumer" else self.ids["consumer"]
        got = self.clusters.kubectl(context, "get", "connection", "-n", "gpufed", peer, "-o", "json", check=False)
        return ((json.loads(got.stdout) if got.returncode == 0 else {}).get("status")) or {}

    def in_phase(self, context: str, phase: str) -> bool:
        return self.connection(context).get("phase") == phase

    def wait_phase(self, phase: str, timeout: float = 60) -> None:
        eventually(
            f"both Connections {phase}",
            lambda: self.in_phase("consumer", phase) and self.in_phase("gpu-a", phase),
            timeout=timeout,
        )

    def remote_network(self, context: str) -> dict[str, Any]:
        peer = self.ids["gpu-a"] if context == "consumer" else self.ids["consumer"]
        spec: dict[str, Any] = self.clusters.kubectl_json(context, "get", "remotenetwork", "-n", "gpufed", peer)["spec"]
        return spec

    def curl(self, role: str, ip: str, timeout: float = 5) -> str:
        """The source address the server saw; "" when the request failed."""
        got = ns_exec(self.ns(role), "curl", "-s", "-m", str(timeout), f"http://{ip}:{HTTP_PORT}/", check=False)
        return got.stdout if got.returncode == 0 else ""

    def ping(self, role: str, ip: str, count: int = 3) -> subprocess.CompletedProcess[str]:
        return ns_exec(self.ns(role), "ping", "-n", "-c", str(count), "-W", "2", ip, check=False)

    def diagnostics(self) -> str:
        parts = []
        for f in sorted(self.logs.glob("gateway-*.log")):
            parts.append(f"--- {f.name}\n" + "\n".join(f.read_text(errors="replace").splitlines()[-30:]))
        for role in ("cgw", "pgw"):
            parts.append(f"--- nft {role}\n" + ns_exec(self.ns(role), "nft", "list", "ruleset", check=False).stdout)
            parts.append(f"--- ip {role}\n" + ns_exec(self.ns(role), "ip", "-br", "addr", check=False).stdout)
        return "\n".join(parts)

    def destroy(self) -> None:
        for proc in [*self.agents.values(), *self.servers]:
            proc.kill()
            proc.wait(timeout=10)
        # wireguard-go keeps a deleted namespace alive: remove the tunnels first, which ends it
        for role in ("cgw", "pgw"):
            links = ns_exec(self.ns(role), "ip", "-br", "link", check=False).stdout.split("\n")
            for name in (line.split()[0].split("@")[0] for line in links if line.startswith("gf-")):
                ns_exec(self.ns(role), "ip", "link", "del", name, check=False)
        for n in self.names:
            sh("ip", "netns", "del", n, check=False)


@pytest.fixture(scope="module")
def fabric(clusters: Clusters, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fabric]:
    missing = _missing()
    if missing:
        pytest.fail("the data-plane tests cannot run on this machine: " + "; ".join(missing), pytrace=False)
    for ids in peered_session(clusters, {"gpu-a": ("--gpus", "8")}):
        f = Fabric(clusters, ids, secrets.token_hex(2), tmp_path_factory.mktemp("fabric"))
        try:
            f.build()
            f.start_agent("consumer")
            f.start_agent("gpu-a")
            f.serve("csvc", CONSUMER_SVC)
            f.wait_phase("Connected")
            yield f
        except BaseException:
            print(f.diagnostics())
            raise
        finally:
            f.destroy()


def offload_a_pod(fabric: Fabric, ns: str, *, with_service: bool = True) -> tuple[str, str, str]:
    """A GPU pod `trainer` offloaded to gpu-a from the new namespace `ns` (and its Service), its twin
    linked to gpu-a's gateway and serving HTTP: (ns, local pod IP as the consumer API shows it, the
    twin's real podIP)."""
    clusters = fabric.clusters
    clusters.kubectl("consumer", "create", "namespace", ns)
    eventually(
        "default ServiceAccount",
        lambda: clusters.kubectl("consumer", "get", "sa", "default", "-n", ns, check=False).returncode == 0,
    )
    offload(clusters, ns)
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "trainer", "namespace": ns, "labels": {"app": "trainer"}},
        "spec": {
            "containers": [
                {
                    "name": "main",
                    "image": "nvcr.io/nvidia/pytorch:24.01",
                    "ports": [{"containerPort": HTTP_PORT}],
                    "resources": {"limits": {"nvidia.com/gpu": "1"}},
                }
            ]
        },
    }
    svc = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": "trainer", "namespace": ns},
        "spec": {"selector": {"app": "trainer"}, "ports": [{"port": HTTP_PORT, "targetPort": HTTP_PORT}]},
    }
    for obj in (pod, svc) if with_service else (pod,):
        clusters.kubectl("consumer", "apply", "-f", "-", input_text=json.dumps(obj))
    local = eventually(
        "the offloaded pod's IP on the consumer",
        lambda: clusters.kubectl_json("consumer", "get", "pod", "trainer", "-n", ns)["status"].get("podIP"),
        timeout=90,
    )
    twin_ns = f"{ns}-{fabric.ids['consumer']}"
    remote = eventually(
        "the twin's podIP on gpu-a",
        lambda: clusters.kubectl_json("gpu-a", "get", "pod", "trainer", "-n", twin_ns)["status"].get("podIP"),
    )
    fabric.link("pgw", "ppod", remote)
    fabric.serve("ppod", remote)
    return ns, str(local), str(remote)


@pytest.fixture(scope="module")
def offloaded(fabric: Fabric) -> Iterator[tuple[str, str, str]]:
    """(consumer namespace, local pod IP as the consumer API shows it, the twin's real podIP)."""
    clusters = fabric.clusters
    ns = f"fabric-{fabric.tag}"
    try:
        yield offload_a_pod(fabric, ns)
    finally:
        gpufed("unoffload-namespace", ns, "--kubeconfig", str(clusters.kubeconfig), "--context", "consumer")
        clusters.kubectl("consumer", "delete", "namespace", ns, "--wait=false", check=False)


def test_peer_configured_both_sides_and_the_remapping_is_consistent(fabric: Fabric) -> None:
    c, p = fabric.remote_network("consumer"), fabric.remote_network("gpu-a")
    # Both clusters use 10.244.0.0/16: each side reaches the other's pods through a remapped range.
    assert c["real"]["podCidr"] == p["real"]["podCidr"] == "10.244.0.0/16"
    assert IPv4Network(c["mapped"]["podCidr"]).prefixlen == 16 and c["mapped"]["podCidr"] != "10.244.0.0/16"
    assert IPv4Network(c["mapped"]["podCidr"]).subnet_of(IPv4Network("10.64.0.0/10"))
    assert c["peerView"] == p["mapped"] and p["peerView"] == c["mapped"]
    gw = fabric.clusters.kubectl_json("consumer", "get", "gateway", "-n", "gpufed", fabric.ids["gpu-a"])
    assert gw["spec"]["role"] == "Client" and gw["status"]["driver"] == "wireguard-go"
    assert gw["status"]["mtu"] == 1420
    # private keys only in Secrets; the Gateways carry public keys that match them
    secret = fabric.clusters.kubectl_json("consumer", "get", "secret", "-n", "gpufed", gw["spec"]["privateKeySecret"])
    private = base64.b64decode(secret["data"]["privateKey"]).decode()
    assert str(WireguardKey(private).public_key()) == gw["spec"]["publicKey"]
    assert private not in json.dumps(gw)
    pgw = fabric.clusters.kubectl_json("gpu-a", "get", "gateway", "-n", "gpufed", fabric.ids["consumer"])
    assert (
        pgw["spec"]["peerPublicKey"] == gw["spec"]["publicKey"]
        and gw["spec"]["peerPublicKey"] == pgw["spec"]["publicKey"]
    )
    status = gpufed(
        "network", "status", "--kubeconfig", str(fabric.clusters.kubeconfig), "--context", "consumer", "-o", "json"
    )
    assert status.returncode == 0, out(status)
    row = json.loads(status.stdout)[0]
    assert row["phase"] == "Connected" and row["rttMs"] is not None and row["mappedPodCidr"] == c["mapped"]["podCidr"]
    # The fabric's kinds have a Ready condition scripts can wait on, observed at each object's current
    # spec: the gateway agent accepted the NetworkConfig and put the RemoteNetwork's remapping in place.
    peer = fabric.ids["gpu-a"]
    fabric.clusters.kubectl(
        "consumer",
        "wait",
        "-n",
        "gpufed",
        "--for=condition=Ready",
        f"gateway.gpufed.io/{peer}",
        f"connection.gpufed.io/{peer}",
        f"remotenetwork.gpufed.io/{peer}",
        "networkconfig.gpufed.io/local",
        "--timeout=30s",
        timeout=40,
    )
    for kind, name, reason in (
        ("gateway.gpufed.io", peer, "Applied"),
        ("remotenetwork.gpufed.io", peer, "Applied"),
        ("networkconfig.gpufed.io", "local", "Accepted"),
    ):
        obj = fabric.clusters.kubectl_json("consumer", "get", kind, "-n", "gpufed", name)
        ready = next(c for c in obj["status"]["conditions"] if c["type"] == "Ready")
        assert ready["observedGeneration"] == obj["metadata"]["generation"], (kind, obj["status"])
        assert ready["reason"] == reason, (kind, obj["status"])


def test_consumer_pod_reaches_the_offloaded_pod_by_its_remapped_ip(
    fabric: Fabric, offloaded: tuple[str, str, str]
) -> None:
    ns, local_ip, remote_ip = offloaded
    c = fabric.remote_network("consumer")
    mapped, real = IPv4Network(c["mapped"]["podCidr"]), IPv4Network(c["real"]["podCidr"])
    # the consumer API shows the twin's address translated into the remapped range
    assert IPv4Address(local_ip) in mapped
    assert int(IPv4Address(local_ip)) - int(mapped.network_address) == int(IPv4Address(remote_ip)) - int(
        real.network_address
    )

    def endpoints() -> list[str]:
        got = fabric.clusters.kubectl_json(
            "consumer", "get", "endpointslices", "-n", ns, "-l", "kubernetes.io/service-name=trainer"
        )
        return [a for s in got["items"] for e in s.get("endpoints") or [] for a in e["addresses"]]

    assert eventually("the Service's EndpointSlice lists the offloaded pod", endpoints) == [local_ip]
    # the first packets of a fresh path may be lost while neighbours resolve; then no loss at all
    eventually("a first reply across the tunnel", lambda: fabric.ping("cpod", local_ip, count=1).returncode == 0, 20)
    ping = fabric.ping("cpod", local_ip, count=5)
    assert ping.returncode == 0 and " 0% packet loss" in ping.stdout, ping.stdout + ping.stderr + fabric.diagnostics()
    seen = fabric.curl("cpod", local_ip)
    # the provider pod sees the consumer pod at its address in the provider's view (the mirror SNAT)
    p = fabric.remote_network("gpu-a")
    assert IPv4Address(seen) in IPv4Network(p["mapped"]["podCidr"]), seen
    assert int(IPv4Address(seen)) - int(IPv4Network(p["mapped"]["podCidr"]).network_address) == int(
        IPv4Address(CONSUMER_POD)
    ) - int(IPv4Network("10.244.0.0/16").network_address)


def test_provider_pod_reaches_a_consumer_service_through_the_external_cidr(
    fabric: Fabric, offloaded: tuple[str, str, str]
) -> None:
    kc = str(fabric.clusters.kubeconfig)
    exposed = gpufed("network", "expose", CONSUMER_SVC, "--kubeconfig", kc, "--context", "consumer")
    assert exposed.returncode == 0, out(exposed)
    again = gpufed("network", "expose", CONSUMER_SVC, "--kubeconfig", kc, "--context", "consumer")
    assert out(again) == out(exposed)  # idempotent: the same address
    cfg = fabric.clusters.kubectl_json("consumer", "get", "networkconfig", "-n", "gpufed", "local")["spec"]
    ext = next(e["externalAddress"] for e in cfg["externalIps"] if e["address"] == CONSUMER_SVC)
    assert IPv4Address(ext) in IPv4Network(cfg["externalCidr"])
    # where gpu-a's pods reach it: the consumer's external range as gpu-a maps it (both use 10.70.0.0/16)
    p = fabric.remote_network("gpu-a")
    there = IPv4Network(p["mapped"]["externalCidr"]).network_address + (
        int(IPv4Address(ext)) - int(IPv4Network(cfg["externalCidr"]).network_address)
    )
    assert f"reach it at {there}" in out(exposed)
    seen = eventually("the consumer Service answers gpu-a's pod", lambda: fabric.curl("ppod", str(there), timeout=2))
    # and sees the provider pod at its remapped address on the consumer
    assert seen == offloaded[1]


def test_the_underlay_carries_only_wireguard(fabric: Fabric, offloaded: tuple[str, str, str]) -> None:
    port = fabric.clusters.topology.gateway_endpoint("gpu-a").split(":")[1]
    probe = (
        "table inet gfprobe {\n"
        "  chain c {\n"
        "    type filter hook prerouting priority -400; policy accept;\n"
        f'    iifname "ul-p" udp dport {port} counter\n'
        '    iifname "ul-p" meta l4proto { icmp, tcp } counter\n'
        "  }\n"
        "}\n"
    )
    subprocess.run(["ip", "netns", "exec", fabric.ns("pgw"), "nft", "-f", "-"], input=probe, text=True, check=True)
    try:
        assert fabric.ping("cpod", offloaded[1], count=5).returncode == 0
        assert fabric.curl("cpod", offloaded[1])
        rules = json.loads(ns_exec(fabric.ns("pgw"), "nft", "-j", "list", "table", "inet", "gfprobe").stdout)[
            "nftables"
        ]
        counters = [r["rule"]["expr"][-1]["counter"]["packets"] for r in rules if "rule" in r]
        wireguard, plain = counters
        assert wireguard >= 5 + 5 and plain == 0, counters  # pings and the HTTP exchange, all encrypted
    finally:
        ns_exec(fabric.ns("pgw"), "nft", "delete", "table", "inet", "gfprobe", check=False)


def test_masquerade_mode_shows_the_gateway_address(fabric: Fabric, offloaded: tuple[str, str, str]) -> None:
    on = fabric.network("connect", "--masquerade")
    assert on.returncode == 0, out(on)
    try:
        eventually("masqueraded source", lambda: fabric.curl("cpod", offloaded[1], timeout=2) == GW_LINK, timeout=30)
    finally:
        off = fabric.network("connect")
        assert off.returncode == 0, out(off)
    eventually(
        "mirror SNAT again", lambda: fabric.curl("cpod", offloaded[1], timeout=2) not in ("", GW_LINK), timeout=30
    )


def test_a_cut_underlay_goes_down_then_recovers(fabric: Fabric, offloaded: tuple[str, str, str]) -> None:
    cut = time.monotonic()
    sh("ip", "-n", fabric.ns("cgw"), "link", "set", "ul-c", "down")
    try:
        eventually("consumer Connection Down", lambda: fabric.connection("consumer").get("phase") == "Down", timeout=30)
        assert fabric.ping("cpod", offloaded[1], count=1).returncode != 0
        time.sleep(max(0.0, 20 - (time.monotonic() - cut)))
    finally:
        sh("ip", "-n", fabric.ns("cgw"), "link", "set", "ul-c", "up")
    fabric.wait_phase("Connected", timeout=60)
    assert fabric.ping("cpod", offloaded[1]).returncode == 0
    assert fabric.curl("cpod", offloaded[1])


def test_a_restarted_gateway_keeps_mappings_and_keys(fabric: Fabric, offloaded: tuple[str, str, str]) -> None:
    before = (
        fabric.remote_network("consumer"),
        fabric.clusters.kubectl_json("consumer", "get", "gateway", "-n", "gpufed", fabric.ids["gpu-a"])["spec"],
    )
    tunnel = fabric.tunnel("consumer")
    assert tunnel[1] == before[1]["publicKey"]  # the data plane runs with the key of the Secret
    fabric.stop_agent("consumer")
    fabric.start_agent("consumer")
    fabric.wait_phase("Connected")
    # the restarted agent adopted the running tunnel (same interface) and configured the same key
    assert fabric.tunnel("consumer") == tunnel
    after = (
        fabric.remote_network("consumer"),
        fabric.clusters.kubectl_json("consumer", "get", "gateway", "-n", "gpufed", fabric.ids["gpu-a"])["spec"],
    )
    assert after == before
    # re-running the network step (as `gpufed peer` does again) keeps them too
    again = fabric.network("connect")
    assert again.returncode == 0, out(again)
    assert fabric.remote_network("consumer") == before[0]
    assert fabric.ping("cpod", offloaded[1]).returncode == 0


def test_disconnect_tears_the_data_plane_down(fabric: Fabric, offloaded: tuple[str, str, str]) -> None:
    gone = fabric.network("disconnect")
    assert gone.returncode == 0, out(gone)
    agents = [fabric.agents["consumer"], fabric.agents["gpu-a"]]
    eventually("both gateway agents exit", lambda: all(a.poll() is not None for a in agents), timeout=30)
    assert [a.returncode for a in agents] == [0, 0]
    for role in ("cgw", "pgw"):
        assert "gpufed_" not in ns_exec(fabric.ns(role), "nft", "list", "tables").stdout
        assert "gf-" not in ns_exec(fabric.ns(role), "ip", "-br", "link").stdout
    for context in ("consumer", "gpu-a"):
        for kind in ("gateways", "connections", "remotenetworks"):
            assert fabric.clusters.kubectl_json(context, "get", kind, "-n", "gpufed")["items"] == []
    assert fabric.ping("cpod", offloaded[1], count=1).returncode != 0
    fabric.agents.clear()  # they exited on their own
