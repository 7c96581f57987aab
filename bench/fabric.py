"""The `fabric` part: pod-to-pod TCP throughput and request RTT through gpufed's data plane (remap NAT +
tunnel filter + WireGuard) against the same path without the tunnel filter and a bare wireguard-go
tunnel without our nftables table, measured in the same run.

Owns: three throw-away topologies of network namespaces on this machine (no cluster, no traffic leaves
it), each

    client pod ─ gateway A ══ underlay veth 192.168.77.10 ↔ .11 ══ gateway B ─ server pod

with point-to-point pod links (the gateway's side 169.254.1.1/32, a /32 route to the pod; the pod's
default route via 169.254.1.1), underlay MTU 1500:

- `full`: gpufed's path. Both clusters use 10.244.0.0/16 for pods; each gateway is configured by the
  product's own code, in the order `GatewayAgent.apply` uses (`netfabric.plan.gateway_plan`, the
  wireguard-go driver, `set_link` with the MTU the agent would choose, `nft_ruleset` applied with
  `netfabric.drivers.nft`, `set_routes`, ip_forward). The client pod 10.244.1.10 dials the server pod
  10.244.0.7 at its remapped address; the server sees the client at ITS remapped address. The table
  includes the tunnel filter (`from_peer` / `to_peer`, conntrack, the allowed sets) with the member
  pods a busy peering has: the server pod among `MEMBER_PODS` twin pods, none adjacent (so the sets
  keep one element each: the worst case for the lookup), on the provider's gateway and, as the
  consumer sees them, on the consumer's; its drop counters are read after the runs (`filter_drops`:
  the measured traffic is legitimate and must not be dropped).
- `nofilter`: the full path, built the same way, whose two filter base chains (`FILTER_CHAINS`) are then
  deleted from both gateways' tables: remap NAT + WireGuard without the filter.
- `bare`: the same two wireguard-go gateways (same driver, keys, keepalive, MTU) with no nftables and no
  remapping: non-overlapping pod addresses, a plain route to the peer's range through the tunnel.
- `veth`: the same namespaces and links routed over the underlay with no tunnel at all (context only).

Measured, interleaved (full, bare, veth, full, ...) so machine noise spreads evenly: `iperf3 -c -J`
throughput (received bits/s; median of the runs) and the latency of 64-byte request/response round
trips on one TCP connection (TCP_NODELAY, timed in the client with perf_counter_ns; p50/p99 over all
runs). Targets: full/bare throughput >= 0.90 and RTT (p50) <= 1.10, and full/nofilter throughput >=
0.95 (the filter costs under 5%; its RTT p50 ratio is shown for information); a missed target is a
result. Needs root, /dev/net/tun, ip, nft, ping, iperf3 and wireguard-go: without them the part fails
saying which is missing.

Does not: tune the product, pin CPUs, or leave anything behind (WireGuard links are deleted before
their namespaces: wireguard-go keeps a deleted namespace alive otherwise).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import secrets
import shutil
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from ipaddress import IPv4Address, IPv4Network
from pathlib import Path
from typing import Any

from wireguard_tools import WireguardKey

from bench.bursts import percentile
from gpufed import process
from gpufed.apis.network import (
    DEFAULT_EXTERNAL_CIDR,
    CIDRPair,
    GatewaySpec,
    NetworkConfigSpec,
    RemoteNetworkSpec,
    split_endpoint,
)
from netfabric import plan as plans
from netfabric.drivers import nft
from netfabric.drivers.netns import (
    DataplaneError,
    Netns,
    delete_link,
    link_index,
    link_mtu,
    route_device,
    set_link,
    set_routes,
)
from netfabric.drivers.wireguard import TunnelConfig, WireguardGo
from netfabric.ipam import DEFAULT_MTU, mtu_for
from netfabric.render import (
    FILTER_CHAINS,
    INTERFACE_PREFIX,
    GatewayPlan,
    allowed_ips,
    interface_name,
    nft_ruleset,
    nft_update,
)

DEFAULT_SECONDS = 5.0
DEFAULT_RUNS = 3
DEFAULT_ROUND_TRIPS = 2000
#: Round trips before the timed ones on each connection (connection setup, caches).
WARMUP_ROUND_TRIPS = 100
REQUEST_BYTES = 64

#: Targets: the full path against the bare tunnel, measured in the same run.
TARGET_THROUGHPUT_RATIO_MIN = 0.90
TARGET_RTT_RATIO_MAX = 1.10
#: Target: the tunnel filter against the same path without it (it costs under 5% of the throughput).
TARGET_FILTER_THROUGHPUT_RATIO_MIN = 0.95

SCENARIOS = ("full", "nofilter", "bare", "veth")
LABELS = {
    "full": "gpufed: remap NAT + tunnel filter + WireGuard",
    "nofilter": "gpufed without the tunnel filter (remap NAT + WireGuard)",
    "bare": "bare wireguard-go tunnel (no NAT)",
    "veth": "plain veth routing (no tunnel)",
}

POD_CIDR = "10.244.0.0/16"
CLIENT_POD = IPv4Address("10.244.1.10")
SERVER_POD = IPv4Address("10.244.0.7")
#: Non-overlapping pod addresses of the bare and veth paths (nothing to remap).
PLAIN_CLIENT_RANGE = IPv4Network("10.1.0.0/16")
PLAIN_SERVER_RANGE = IPv4Network("10.2.0.0/16")
PLAIN_CLIENT = IPv4Address("10.1.0.10")
PLAIN_SERVER = IPv4Address("10.2.0.7")
#: Twin pods of the peering in the full path's filter sets (the server pod is one of them).
MEMBER_PODS = 1000
UNDERLAY_A = IPv4Address("192.168.77.10")
UNDERLAY_B = IPv4Address("192.168.77.11")
UNDERLAY_MTU = 1500
GW_LINK = "169.254.1.1"
IPERF_PORT = 5201
ECHO_PORT = 7007
#: How long the first packets may wait for the WireGuard handshake.
CONNECT_TIMEOUT_S = 20.0

Progress = Callable[[str], None]

# An echo server: one connection at a time, announces itself and every client address it sees.
ECHO_SERVER = """
import socket, sys
s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind((sys.argv[1], int(sys.argv[2])))
s.listen(16)
print("ready", flush=True)
while True:
    c, peer = s.accept()
    print("peer", peer[0], flush=True)
    c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    with c:
        while True:
            d = c.recv(65536)
            if not d:
                break
            c.sendall(d)
"""

# Sequential request/response round trips on one connection; prints the timed ones (ns) as JSON.
RTT_CLIENT = """
import json, socket, sys, time
host, port, n, warmup, size = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
c = socket.create_connection((host, port), timeout=10)
c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
msg = b"x" * size
out = []
clock = time.perf_counter_ns
for i in range(warmup + n):
    t0 = clock()
    c.sendall(msg)
    got = 0
    while got < size:
        b = c.recv(size - got)
        if not b:
            sys.exit("the echo server closed the connection")
        got += len(b)
    t1 = clock()
    if i >= warmup:
        out.append(t1 - t0)
c.close()
print(json.dumps(out))
"""


class FabricBenchError(RuntimeError):
    """The fabric part cannot run here, or a path does not carry what it should."""


@dataclass(frozen=True)
class FabricOptions:
    bin_dir: Path
    seconds: float = DEFAULT_SECONDS
    runs: int = DEFAULT_RUNS
    round_trips: int = DEFAULT_ROUND_TRIPS


# ------------------------------------------------------------------------------------ pure helpers


def parse_iperf3(text: str) -> dict[str, Any]:
    """The figures of one `iperf3 -c -J` run: received Mbit/s, bytes, seconds, sender retransmits.

    Raises FabricBenchError when the JSON is unreadable or carries iperf3's own error."""
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as e:
        raise FabricBenchError(f"iperf3 did not print JSON ({e}): {text[:200]!r}") from None
    if not isinstance(doc, dict):
        raise FabricBenchError(f"iperf3 printed {type(doc).__name__}, not an object")
    if doc.get("error"):
        raise FabricBenchError(f"iperf3: {doc['error']}")
    end = doc.get("end") or {}
    received = end.get("sum_received") or {}
    sent = end.get("sum_sent") or {}
    if "bits_per_second" not in received:
        raise FabricBenchError("iperf3's JSON has no end.sum_received.bits_per_second")
    return {
        "mbps": round(float(received["bits_per_second"]) / 1e6, 1),
        "bytes": int(received.get("bytes", 0)),
        "seconds": round(float(received.get("seconds", 0.0)), 2),
        "retransmits": sent.get("retransmits"),
    }


def rtt_stats(samples_ns: Sequence[int]) -> dict[str, Any]:
    """p50/p90/p99/max in ms (nearest rank) of round-trip samples in nanoseconds."""
    if not samples_ns:
        return {"n": 0, "p50_ms": None, "p90_ms": None, "p99_ms": None, "max_ms": None}
    ms = [s / 1e6 for s in samples_ns]
    return {
        "n": len(ms),
        "p50_ms": round(percentile(ms, 50), 3),
        "p90_ms": round(percentile(ms, 90), 3),
        "p99_ms": round(percentile(ms, 99), 3),
        "max_ms": round(max(ms), 3),
    }


def ratio(a: float | None, b: float | None) -> float | None:
    return round(a / b, 3) if a is not None and b else None


def spread_pct(values: Sequence[float]) -> float | None:
    """(max - min) / median in percent: how far apart the runs of one path are (None below two runs)."""
    if len(values) < 2:
        return None
    median = statistics.median(values)
    return round((max(values) - min(values)) / median * 100, 1) if median else None


def _paired(a: dict[str, Any], b: dict[str, Any]) -> tuple[list[float | None], list[float | None]]:
    """a / b of each interleaved round (neighbours in time share the machine's noise): throughput, RTT p50."""
    thr = [ratio(x, y) for x, y in zip(a["throughput_mbps"]["runs"], b["throughput_mbps"]["runs"], strict=False)]
    p50 = [ratio(x, y) for x, y in zip(a["rtt"]["per_run_p50_ms"], b["rtt"]["per_run_p50_ms"], strict=False)]
    return thr, p50


def filter_verdicts(scenarios: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """full/nofilter ratios: throughput (>= 0.95: the filter costs under 5%) and RTT p50 (for information).
    Empty when the run has no `nofilter` path (results of older runs)."""
    full, nofilter = scenarios["full"], scenarios.get("nofilter")
    if not nofilter:
        return {}
    thr = ratio(full["throughput_mbps"]["median"], nofilter["throughput_mbps"]["median"])
    p50 = ratio(full["rtt"]["p50_ms"], nofilter["rtt"]["p50_ms"])
    paired, paired_p50 = _paired(full, nofilter)
    return {
        "filter_throughput": {
            "value": thr,
            "target": f">= {TARGET_FILTER_THROUGHPUT_RATIO_MIN:.2f}",
            "met": thr is not None and thr >= TARGET_FILTER_THROUGHPUT_RATIO_MIN,
            "per_run": paired,
        },
        "filter_rtt_p50": {
            "value": p50,
            "target": "(for information)",
            "met": None,
            "informational": True,
            "per_run": paired_p50,
        },
    }


def verdicts(scenarios: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """full/bare ratios against the targets: throughput (>= 0.90) and RTT p50 (<= 1.10); the p99 ratio is
    judged against the same bound but only for information (the RTT target is read on the p50); and,
    when the run measured it, the filter's cost (`filter_verdicts`)."""
    full, bare = scenarios["full"], scenarios["bare"]
    thr = ratio(full["throughput_mbps"]["median"], bare["throughput_mbps"]["median"])
    p50 = ratio(full["rtt"]["p50_ms"], bare["rtt"]["p50_ms"])
    p99 = ratio(full["rtt"]["p99_ms"], bare["rtt"]["p99_ms"])
    paired, paired_p50 = _paired(full, bare)
    return {
        "throughput": {
            "value": thr,
            "target": f">= {TARGET_THROUGHPUT_RATIO_MIN:.2f}",
            "met": thr is not None and thr >= TARGET_THROUGHPUT_RATIO_MIN,
            # full / bare of each interleaved round (neighbours in time share the machine's noise)
            "per_run": paired,
        },
        "rtt_p50": {
            "value": p50,
            "target": f"<= {TARGET_RTT_RATIO_MAX:.2f}",
            "met": p50 is not None and p50 <= TARGET_RTT_RATIO_MAX,
            "per_run": paired_p50,
        },
        "rtt_p99": {
            "value": p99,
            "target": f"<= {TARGET_RTT_RATIO_MAX:.2f}",
            "met": p99 is not None and p99 <= TARGET_RTT_RATIO_MAX,
            "informational": True,
        },
        **filter_verdicts(scenarios),
    }


def summarize(throughput: Sequence[dict[str, Any]], rtt_runs: Sequence[Sequence[int]], label: str) -> dict[str, Any]:
    """One scenario's figures from its iperf3 runs and its RTT runs (samples in ns)."""
    mbps = [r["mbps"] for r in throughput]
    pooled = [s for run in rtt_runs for s in run]
    median = round(statistics.median(mbps), 1) if mbps else None
    return {
        "label": label,
        "throughput_mbps": {"median": median, "runs": mbps, "spread_pct": spread_pct(mbps)},
        "retransmits": [r["retransmits"] for r in throughput],
        "rtt": {**rtt_stats(pooled), "per_run_p50_ms": [rtt_stats(r)["p50_ms"] for r in rtt_runs]},
    }


def fabric_specs(consumer_id: str, provider_id: str) -> dict[str, tuple[NetworkConfigSpec, RemoteNetworkSpec]]:
    """Both sides' NetworkConfig and RemoteNetwork as `gpufed network connect` would leave them for two
    clusters that both use 10.244.0.0/16 (and the default external CIDR): each side's stand-in ranges
    come from the product's IPAM, and each side's peer_view is the other's mapping."""
    local = NetworkConfigSpec(pod_cidr=POD_CIDR)
    real = CIDRPair(pod_cidr=POD_CIDR, external_cidr=DEFAULT_EXTERNAL_CIDR)
    mapped = plans.allocate(local, real, [])  # the same on both sides: same ranges, same pools
    return {
        "consumer": (
            local,
            RemoteNetworkSpec(cluster_id=provider_id, real=real, mapped=mapped, peer_view=mapped),
        ),
        "provider": (
            local,
            RemoteNetworkSpec(cluster_id=consumer_id, real=real, mapped=mapped, peer_view=mapped),
        ),
    }


# ------------------------------------------------------------------------------------ processes


def missing_requirements(wireguard_go: Path) -> list[str]:
    why = []
    if os.geteuid() != 0:
        why.append("not root (network namespaces, WireGuard and nftables need CAP_NET_ADMIN)")
    if not Path("/dev/net/tun").exists():
        why.append("no /dev/net/tun (wireguard-go needs TUN)")
    for tool in ("ip", "nft", "ping", "iperf3", "sysctl"):
        if shutil.which(tool) is None:
            why.append(f"no `{tool}` on PATH")
    if not os.access(wireguard_go, os.X_OK):
        why.append(f"no wireguard-go at {wireguard_go} (run `make binaries`)")
    return why


async def _run(argv: Sequence[str], limit_s: float = 30.0) -> str:
    try:
        return (await process.run(argv, timeout_s=limit_s)).stdout
    except process.CommandError as e:
        raise FabricBenchError(str(e)) from None


@dataclass
class Daemon:
    """A long-running program whose output is drained into `lines` (so it never blocks on a full pipe)."""

    what: str
    proc: asyncio.subprocess.Process
    lines: list[str] = field(default_factory=list)
    task: asyncio.Task[None] | None = None

    @classmethod
    async def start(cls, what: str, argv: Sequence[str]) -> Daemon:
        proc = await asyncio.create_subprocess_exec(
            *argv, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT
        )
        d = cls(what, proc)
        d.task = asyncio.create_task(d._drain())
        return d

    async def _drain(self) -> None:
        assert self.proc.stdout is not None
        async for line in self.proc.stdout:
            self.lines.append(line.decode(errors="replace").rstrip())

    async def wait_for(self, text: str, within_s: float, after: int = 0) -> str:
        """The first line from index `after` on that contains `text`."""
        deadline = time.monotonic() + within_s
        while True:
            for line in self.lines[after:]:
                if text in line:
                    return line
            if self.proc.returncode is not None:
                raise FabricBenchError(f"{self.what} exited ({self.proc.returncode}): {' | '.join(self.lines[-5:])}")
            if time.monotonic() > deadline:
                raise FabricBenchError(f"{self.what} did not print {text!r} within {within_s:g} s")
            await asyncio.sleep(0.05)

    async def stop(self) -> None:
        if self.proc.returncode is None:
            self.proc.kill()
        await self.proc.wait()
        if self.task is not None:
            self.task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self.task


# ------------------------------------------------------------------------------------ topology


@dataclass
class Scenario:
    key: str
    tag: str
    client: IPv4Address
    server: IPv4Address
    #: The address the client dials (the server's remapped address on the full path).
    target: IPv4Address
    #: gateway role ("cgw"/"sgw") -> WireGuard interface there.
    tunnels: dict[str, str] = field(default_factory=dict)
    mtu: dict[str, int] = field(default_factory=dict)
    namespaces: list[str] = field(default_factory=list)
    iperf: Daemon | None = None
    echo: Daemon | None = None
    #: The client address the server saw (the full path: its remapped twin).
    expect_seen: IPv4Address | None = None
    #: gateway role -> gpufed's nftables table there (the paths with one).
    tables: dict[str, str] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)

    def ns(self, role: str) -> str:
        return f"gfb{self.tag}-{self.key}-{role}"

    async def _sh(self, *argv: str) -> None:
        await _run(argv)

    async def build(self) -> None:
        """Four namespaces, the two pod links and the underlay; ip_forward in the gateways."""
        for role in ("cpod", "cgw", "sgw", "spod"):
            await self._sh("ip", "netns", "add", self.ns(role))
            self.namespaces.append(self.ns(role))
            await self._sh("ip", "-n", self.ns(role), "link", "set", "lo", "up")
        await self._link("cgw", "cpod", self.client)
        await self._link("sgw", "spod", self.server)
        a, b = self.ns("cgw"), self.ns("sgw")
        await self._sh("ip", "link", "add", "ul0", "netns", a, "type", "veth", "peer", "ul0", "netns", b)
        for ns, addr in ((a, UNDERLAY_A), (b, UNDERLAY_B)):
            await self._sh("ip", "-n", ns, "link", "set", "ul0", "mtu", str(UNDERLAY_MTU))
            await self._sh("ip", "-n", ns, "addr", "add", f"{addr}/24", "dev", "ul0")
            await self._sh("ip", "-n", ns, "link", "set", "ul0", "up")
            await self._sh("ip", "netns", "exec", ns, "sysctl", "-qw", "net.ipv4.ip_forward=1")

    async def _link(self, gw: str, pod: str, address: IPv4Address) -> None:
        """Point-to-point gateway <-> pod (as tests/e2e/test_fabric.py `Fabric.link`)."""
        g, p = self.ns(gw), self.ns(pod)
        await self._sh("ip", "link", "add", "pod0", "netns", g, "type", "veth", "peer", "eth0", "netns", p)
        await self._sh("ip", "-n", g, "addr", "add", f"{GW_LINK}/32", "dev", "pod0")
        await self._sh("ip", "-n", g, "link", "set", "pod0", "up")
        await self._sh("ip", "-n", g, "route", "replace", f"{address}/32", "dev", "pod0")
        await self._sh("ip", "-n", p, "addr", "add", f"{address}/32", "dev", "eth0")
        await self._sh("ip", "-n", p, "link", "set", "eth0", "up")
        await self._sh("ip", "-n", p, "route", "add", f"{GW_LINK}/32", "dev", "eth0")
        await self._sh("ip", "-n", p, "route", "add", "default", "via", GW_LINK)

    async def destroy(self) -> None:
        for d in (self.iperf, self.echo):
            if d is not None:
                await d.stop()
        # wireguard-go keeps a deleted namespace alive: delete the tunnels (which ends the daemons) first,
        # every gf-* link, also one whose configuration failed half-way
        for role in ("cgw", "sgw"):
            if self.ns(role) in self.namespaces:
                with contextlib.suppress(DataplaneError):
                    await Netns(self.ns(role)).netlink(_delete_tunnels, "deleting the WireGuard links")
        for ns in reversed(self.namespaces):
            with contextlib.suppress(FabricBenchError):
                await _run(["ip", "netns", "del", ns])


def _delete_tunnels(ipr: Any) -> None:
    for link in ipr.get_links():
        name = str(link.get_attr("IFLA_IFNAME"))
        if name.startswith(INTERFACE_PREFIX):
            delete_link(ipr, name)


async def _agent_mtu(ns: Netns, spec: GatewaySpec) -> int:
    """The MTU `GatewayAgent._mtu` chooses: spec.mtu, else the underlay's towards the endpoint minus
    WireGuard-over-IPv6 overhead, else DEFAULT_MTU."""
    if spec.mtu:
        return spec.mtu
    target = IPv4Address(split_endpoint(spec.endpoint)[0]) if spec.endpoint else None

    def underlay(ipr: Any) -> int | None:
        dev = route_device(ipr, target) if target else None
        return link_mtu(ipr, dev) if dev else None

    under = await ns.netlink(underlay, "reading the underlay MTU")
    return mtu_for(under, ipv6_underlay=True) if under else DEFAULT_MTU


async def _apply_gateway(
    ns: Netns,
    driver: WireguardGo,
    local: NetworkConfigSpec,
    remote: RemoteNetworkSpec,
    spec: GatewaySpec,
    private_key: str,
    members: Sequence[IPv4Address],
) -> tuple[GatewayPlan, int]:
    """What `GatewayAgent.apply` does with its inputs, step for step (status writes aside). `members`:
    the real addresses of the provider's twin pods, which the provider's gateway lets be reached and
    the consumer's reaches (at their remapped addresses, as its member watch sees them)."""
    local_ip, peer_ip = IPv4Address(spec.tunnel_address), IPv4Address(spec.peer_tunnel_address)
    tunnel = (local_ip, peer_ip)
    if spec.role == "Server":
        gp = plans.gateway_plan(local, remote, spec.masquerade, tunnel, local_members=members)
    else:
        seen_as = plans.gateway_plan(local, remote, spec.masquerade, tunnel).peer_pod
        gp = plans.gateway_plan(
            local, remote, spec.masquerade, tunnel, peer_members_mapped=[seen_as.to_mapped(a) for a in members]
        )
    cfg = TunnelConfig(
        private_key=private_key,
        peer_public_key=spec.peer_public_key,
        allowed_ips=tuple(allowed_ips(gp, peer_ip)),
        listen_port=spec.listen_port if spec.role == "Server" else None,
        endpoint=split_endpoint(spec.endpoint) if spec.role == "Client" else None,
        keepalive_s=spec.keepalive_s or None,
    )
    await driver.ensure(ns, gp.interface, cfg)
    mtu = await _agent_mtu(ns, spec)
    await ns.netlink(lambda ipr: set_link(ipr, gp.interface, local_ip, peer_ip, mtu), "configuring the tunnel")
    await nft.apply_in_place(ns, nft_update(gp), nft_ruleset(gp))
    mapped = [gp.peer_pod.mapped] + ([gp.peer_external.mapped] if gp.peer_external else [])
    await ns.netlink(lambda ipr: set_routes(ipr, gp.interface, gp.mark, gp.mark, mapped), "routing into the tunnel")
    await ns.run(["sysctl", "-qw", "net.ipv4.ip_forward=1"])
    return gp, mtu


@dataclass(frozen=True)
class _Keys:
    private: str = field(repr=False)
    public: str

    @classmethod
    def generate(cls) -> _Keys:
        k = WireguardKey.generate()
        return cls(str(k), str(k.public_key()))


def _gateway_specs(consumer_id: str, provider_id: str, c: _Keys, p: _Keys) -> tuple[GatewaySpec, GatewaySpec]:
    """(consumer/client, provider/server) Gateways as `gpufed network connect` leaves them."""
    server_ip, client_ip = plans.tunnel_addresses(consumer_id, provider_id)
    provider = GatewaySpec(
        cluster_id=consumer_id,
        role="Server",
        driver="wireguard-go",
        tunnel_address=str(server_ip),
        peer_tunnel_address=str(client_ip),
        private_key_secret="bench",  # noqa: S106 -- the name of a Secret (unused here), not a key
        public_key=p.public,
        peer_public_key=c.public,
    )
    consumer = GatewaySpec(
        cluster_id=provider_id,
        role="Client",
        driver="wireguard-go",
        endpoint=f"{UNDERLAY_B}:{provider.listen_port}",
        tunnel_address=str(client_ip),
        peer_tunnel_address=str(server_ip),
        private_key_secret="bench",  # noqa: S106 -- the name of a Secret (unused here), not a key
        public_key=c.public,
        peer_public_key=p.public,
    )
    return consumer, provider


async def _setup_full(sc: Scenario, driver: WireguardGo) -> None:
    consumer_id, provider_id = f"bench-{sc.tag}-{sc.key}-c", f"bench-{sc.tag}-{sc.key}-p"
    specs = fabric_specs(consumer_id, provider_id)
    ck, pk = _Keys.generate(), _Keys.generate()
    cgw, pgw = _gateway_specs(consumer_id, provider_id, ck, pk)
    twins = member_pods(MEMBER_PODS)
    # the server first: it listens; the client's first packet starts the handshake
    gp_p, sc.mtu["sgw"] = await _apply_gateway(Netns(sc.ns("sgw")), driver, *specs["provider"], pgw, pk.private, twins)
    sc.tunnels["sgw"] = gp_p.interface
    gp_c, sc.mtu["cgw"] = await _apply_gateway(Netns(sc.ns("cgw")), driver, *specs["consumer"], cgw, ck.private, twins)
    sc.tunnels["cgw"] = gp_c.interface
    sc.target = gp_c.peer_pod.to_mapped(SERVER_POD)
    sc.expect_seen = gp_p.peer_pod.to_mapped(CLIENT_POD)
    sc.tables = {"cgw": gp_c.table, "sgw": gp_p.table}
    sc.extra = {
        "pod_cidr_both_sides": POD_CIDR,
        "consumer_sees_provider_pods_as": str(gp_c.peer_pod.mapped),
        "provider_sees_consumer_pods_as": str(gp_p.peer_pod.mapped),
        "member_pods": len(twins),
        "nft_rules_per_gateway": {
            "consumer": _rule_count(nft_ruleset(gp_c)),
            "provider": _rule_count(nft_ruleset(gp_p)),
        },
    }


def member_pods(count: int) -> list[IPv4Address]:
    """`count` twin pod addresses in the pod CIDR, the server pod first, no two adjacent (one set
    element each) and none the client's."""
    base = int(IPv4Address("10.244.16.1"))
    return [SERVER_POD, *(IPv4Address(base + 2 * i) for i in range(count - 1))]


def _rule_count(ruleset: str) -> int:
    return sum(1 for line in ruleset.splitlines() if line.startswith("\t\t") and not line.strip().startswith("type "))


async def _setup_nofilter(sc: Scenario, driver: WireguardGo) -> None:
    """The full path, then without the tunnel filter: its base chains deleted from both gateways' tables
    (nothing else changes: the same NAT, marks, routes, conntrack and WireGuard)."""
    await _setup_full(sc, driver)
    for role, table in sc.tables.items():
        for name in FILTER_CHAINS:
            await Netns(sc.ns(role)).run(["nft", "delete", "chain", "ip", table, name])
    sc.extra["filter"] = "removed: " + ", ".join(FILTER_CHAINS)


async def _filter_drops(sc: Scenario) -> dict[str, dict[str, int]] | None:
    """The tunnel filter's drop counters of both gateways (None: the path has no gpufed table)."""
    if not sc.tables:
        return None
    return {role: await nft.counters(Netns(sc.ns(role)), table) for role, table in sc.tables.items()}


async def _bare_gateway(
    ns: Netns, driver: WireguardGo, spec: GatewaySpec, private_key: str, peer_range: IPv4Network
) -> tuple[str, int]:
    """One gateway of the bare tunnel: the same driver, keys, keepalive and MTU rule as the full path,
    allowed IPs = the peer's range + its tunnel address, one plain route; no nftables, no policy routing."""
    iface = interface_name(spec.cluster_id)
    peer_ip, local_ip = IPv4Address(spec.peer_tunnel_address), IPv4Address(spec.tunnel_address)
    cfg = TunnelConfig(
        private_key=private_key,
        peer_public_key=spec.peer_public_key,
        allowed_ips=(peer_range, IPv4Network(peer_ip)),
        listen_port=spec.listen_port if spec.role == "Server" else None,
        endpoint=split_endpoint(spec.endpoint) if spec.role == "Client" else None,
        keepalive_s=spec.keepalive_s or None,
    )
    await driver.ensure(ns, iface, cfg)
    mtu = await _agent_mtu(ns, spec)

    def configure(ipr: Any) -> None:
        set_link(ipr, iface, local_ip, peer_ip, mtu)
        ipr.route("replace", dst=str(peer_range), oif=link_index(ipr, iface))

    await ns.netlink(configure, "configuring the bare tunnel")
    return iface, mtu


async def _setup_bare(sc: Scenario, driver: WireguardGo) -> None:
    consumer_id, provider_id = f"bench-{sc.tag}-bare-c", f"bench-{sc.tag}-bare-p"
    ck, pk = _Keys.generate(), _Keys.generate()
    cgw, pgw = _gateway_specs(consumer_id, provider_id, ck, pk)
    sc.tunnels["sgw"], sc.mtu["sgw"] = await _bare_gateway(
        Netns(sc.ns("sgw")), driver, pgw, pk.private, PLAIN_CLIENT_RANGE
    )
    sc.tunnels["cgw"], sc.mtu["cgw"] = await _bare_gateway(
        Netns(sc.ns("cgw")), driver, cgw, ck.private, PLAIN_SERVER_RANGE
    )


async def _setup_veth(sc: Scenario) -> None:
    await _run(["ip", "-n", sc.ns("cgw"), "route", "replace", str(PLAIN_SERVER_RANGE), "via", str(UNDERLAY_B)])
    await _run(["ip", "-n", sc.ns("sgw"), "route", "replace", str(PLAIN_CLIENT_RANGE), "via", str(UNDERLAY_A)])


async def _reachable(sc: Scenario) -> None:
    deadline = time.monotonic() + CONNECT_TIMEOUT_S
    argv = ["ip", "netns", "exec", sc.ns("cpod"), "ping", "-n", "-q", "-c", "1", "-W", "1", str(sc.target)]
    while True:
        try:
            await _run(argv)
            return
        except FabricBenchError as e:
            if time.monotonic() > deadline:
                raise FabricBenchError(
                    f"{sc.key}: the client pod cannot reach {sc.target} within {CONNECT_TIMEOUT_S:g} s: {e}"
                ) from None
            await asyncio.sleep(0.2)


async def _start_servers(sc: Scenario) -> None:
    spod = ["ip", "netns", "exec", sc.ns("spod")]
    iperf = await Daemon.start(
        f"iperf3 server ({sc.key})",
        [*spod, "iperf3", "-s", "-B", str(sc.server), "-p", str(IPERF_PORT), "--forceflush"],
    )
    sc.iperf = iperf
    sc.echo = await Daemon.start(
        f"echo server ({sc.key})", [*spod, sys.executable, "-u", "-c", ECHO_SERVER, str(sc.server), str(ECHO_PORT)]
    )
    await iperf.wait_for("Server listening", 10)
    await sc.echo.wait_for("ready", 10)


async def _throughput(sc: Scenario, seconds: float) -> dict[str, Any]:
    argv = ["ip", "netns", "exec", sc.ns("cpod"), "iperf3", "-c", str(sc.target), "-p", str(IPERF_PORT)]
    argv += ["-t", f"{seconds:g}", "-J"]
    proc = await asyncio.create_subprocess_exec(
        *argv, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )
    try:
        out, err = await asyncio.wait_for(proc.communicate(), seconds + 30)
    except TimeoutError:
        proc.kill()
        await proc.wait()
        raise FabricBenchError(f"{sc.key}: iperf3 did not finish within {seconds + 30:g} s") from None
    try:
        return parse_iperf3(out.decode(errors="replace"))
    except FabricBenchError as e:
        raise FabricBenchError(f"{sc.key}: {e} {err.decode(errors='replace').strip()[-300:]}") from None


async def _round_trips(sc: Scenario, n: int) -> list[int]:
    echo = sc.echo
    if echo is None:
        raise FabricBenchError(f"{sc.key}: the echo server is not running")
    seen_from = len(echo.lines)
    argv = ["ip", "netns", "exec", sc.ns("cpod"), sys.executable, "-c", RTT_CLIENT, str(sc.target)]
    argv += [str(ECHO_PORT), str(n), str(WARMUP_ROUND_TRIPS), str(REQUEST_BYTES)]
    out = await _run(argv, limit_s=120)
    samples = json.loads(out)
    if not isinstance(samples, list) or len(samples) != n:
        raise FabricBenchError(f"{sc.key}: the RTT client returned {len(samples)} samples, not {n}")
    peer = (await echo.wait_for("peer ", 5, after=seen_from)).split()[1]
    sc.extra["server_saw_client_as"] = peer
    if sc.expect_seen is not None and IPv4Address(peer) != sc.expect_seen:
        raise FabricBenchError(
            f"{sc.key}: the server saw the client as {peer}, not its remapped address {sc.expect_seen}: "
            "the path is not the one this part means to measure"
        )
    return [int(s) for s in samples]


async def _path_mtu(sc: Scenario) -> int | None:
    """The path MTU the client pod's kernel learned towards the server (None: no PMTU entry)."""
    out = await _run(["ip", "-n", sc.ns("cpod"), "route", "get", str(sc.target)])
    words = out.split()
    return int(words[words.index("mtu") + 1]) if "mtu" in words else None


async def _tunnel_bytes(sc: Scenario, driver: WireguardGo) -> int | None:
    iface = sc.tunnels.get("cgw")
    if iface is None:
        return None
    stats = await driver.stats(Netns(sc.ns("cgw")), iface)
    return stats.tx_bytes if stats else None


async def _version(argv: Sequence[str]) -> str:
    try:
        out = await _run(argv, limit_s=10)
    except (FabricBenchError, OSError) as e:
        return f"unknown ({e})"
    return out.strip().splitlines()[0] if out.strip() else "unknown"


async def _measure(opts: FabricOptions, progress: Progress) -> dict[str, Any]:
    driver = WireguardGo(opts.bin_dir / "wireguard-go")
    tag = secrets.token_hex(2)
    scenarios = {
        "full": Scenario("full", tag, CLIENT_POD, SERVER_POD, SERVER_POD),
        "nofilter": Scenario("nofilter", tag, CLIENT_POD, SERVER_POD, SERVER_POD),
        "bare": Scenario("bare", tag, PLAIN_CLIENT, PLAIN_SERVER, PLAIN_SERVER),
        "veth": Scenario("veth", tag, PLAIN_CLIENT, PLAIN_SERVER, PLAIN_SERVER),
    }
    durations: dict[str, float] = {}
    throughput: dict[str, list[dict[str, Any]]] = {k: [] for k in SCENARIOS}
    rtts: dict[str, list[list[int]]] = {k: [] for k in SCENARIOS}
    started = time.monotonic()
    try:
        for sc in scenarios.values():
            await sc.build()
        await _setup_full(scenarios["full"], driver)
        await _setup_nofilter(scenarios["nofilter"], driver)
        await _setup_bare(scenarios["bare"], driver)
        await _setup_veth(scenarios["veth"])
        for sc in scenarios.values():
            await _reachable(sc)
            await _start_servers(sc)
        durations["setup_s"] = round(time.monotonic() - started, 1)
        progress(
            f"fabric: {len(scenarios)} paths up in {durations['setup_s']} s (namespaces gfb{tag}-*); full path dials "
            f"{scenarios['full'].target}, MTU {scenarios['full'].mtu}"
        )
        t0 = time.monotonic()
        for i in range(opts.runs):
            for key, sc in scenarios.items():
                r = await _throughput(sc, opts.seconds)
                throughput[key].append(r)
                samples = await _round_trips(sc, opts.round_trips)
                rtts[key].append(samples)
                progress(
                    f"fabric: run {i + 1}/{opts.runs} {key}: {r['mbps']:g} Mbit/s, RTT p50 "
                    f"{rtt_stats(samples)['p50_ms']} ms p99 {rtt_stats(samples)['p99_ms']} ms"
                )
        durations["measure_s"] = round(time.monotonic() - t0, 1)
        path_mtu = {k: await _path_mtu(sc) for k, sc in scenarios.items()}
        tunnel_bytes = {k: await _tunnel_bytes(sc, driver) for k, sc in scenarios.items()}
        drops = {k: await _filter_drops(sc) for k, sc in scenarios.items()}
        versions = {
            "wireguard_go": await _version([str(driver.binary), "--version"]),
            "iperf3": await _version(["iperf3", "--version"]),
        }
    finally:
        t1 = time.monotonic()
        for sc in scenarios.values():
            await sc.destroy()
        durations["teardown_s"] = round(time.monotonic() - t1, 1)
    durations["total_s"] = round(time.monotonic() - started, 1)

    results = {k: summarize(throughput[k], rtts[k], LABELS[k]) for k in SCENARIOS}
    for k, sc in scenarios.items():
        sent = sum(r["bytes"] for r in throughput[k])
        results[k].update(
            {
                "client": str(sc.client),
                "dials": str(sc.target),
                "server": str(sc.server),
                "tunnel_mtu": sc.mtu or None,
                "path_mtu_seen_by_client": path_mtu[k],
                "tunnel_tx_bytes": tunnel_bytes[k],
                "filter_drops": drops[k],
                "iperf3_bytes": sent,
                **sc.extra,
            }
        )
        if tunnel_bytes[k] is not None and tunnel_bytes[k] < sent:
            raise FabricBenchError(f"{k}: the tunnel sent {tunnel_bytes[k]} bytes, less than iperf3's {sent}")
    mtus = {m for sc in scenarios.values() for m in sc.mtu.values()}
    return {
        "part": "fabric",
        "environment": {
            "driver": driver.name,
            "versions": versions,
            "mtu": min(mtus) if mtus else None,
            "mtus": sorted(mtus),
            "underlay_mtu": UNDERLAY_MTU,
            "pod_link_mtu": UNDERLAY_MTU,
            "seconds_per_run": opts.seconds,
            "runs": opts.runs,
            "round_trips_per_run": opts.round_trips,
            "warmup_round_trips": WARMUP_ROUND_TRIPS,
            "request_bytes": REQUEST_BYTES,
            "order": ", ".join(SCENARIOS) + f" x {opts.runs}",
        },
        "targets": {
            "throughput_ratio_min": TARGET_THROUGHPUT_RATIO_MIN,
            "rtt_p50_ratio_max": TARGET_RTT_RATIO_MAX,
            "filter_throughput_ratio_min": TARGET_FILTER_THROUGHPUT_RATIO_MIN,
        },
        "scenarios": results,
        "verdicts": verdicts(results),
        "durations_s": durations,
    }


def run(opts: FabricOptions, progress: Progress) -> dict[str, Any]:
    missing = missing_requirements(opts.bin_dir / "wireguard-go")
    if missing:
        raise FabricBenchError("the fabric part cannot run on this machine: " + "; ".join(missing))
    if opts.runs < 1 or opts.seconds <= 0 or opts.round_trips < 1:
        raise FabricBenchError("--fabric-runs, --fabric-seconds and --fabric-round-trips must be positive")
    return asyncio.run(_measure(opts, progress))
