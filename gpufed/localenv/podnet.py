"""Real network stacks for the local environment's pods and gateways, in network namespaces.

kwok gives every pod an IP address but no network stack, and the local clusters run no gateway
pods. To send real packets through gpufed's fabric, this module builds on this machine what real
clusters would have (the topology of tests/e2e/test_fabric.py and bench/fabric.py, for N peerings):

    client pod ─┬─ cgw0 ══ underlay veth ══ pgw0 ─ twin pods on provider 0 (their real pod IPs)
    (consumer)  └─ cgw1 ══ underlay veth ══ pgw1 ─ twin pods on provider 1

- per peering, two gateway namespaces (consumer side `cgw<i>`, provider side `pgw<i>`) joined by an
  "underlay" veth carrying the addresses the clusters' NetworkConfigs advertise (192.168.77.10+i),
  each running gpufed's own gateway agent (`gpufed gateway --netns`), which alone configures
  WireGuard, nftables and routes there;
- pod namespaces linked point-to-point to their cluster's gateway (the gateway's side 169.254.1.1/32
  with a /32 route to the pod); the consumer's client pod has one link per peering and routes each
  provider's remapped pod range to that peering's gateway;
- a tiny HTTP server per twin pod, bound to the twin's real pod IP, answering with who it is and the
  address it saw the client at;
- a kube-proxy stand-in in the client pod: an nftables table that DNATs a Service's ClusterIP:port to
  its endpoints, round-robin, as kube-proxy's nftables mode would (chain per endpoint, numgen vmap).

Each gateway agent runs in a private mount namespace with its own /run/wireguard (as a gateway pod
has its own filesystem): wireguard-go's UAPI socket is named after the *peer's* cluster ID, so both
providers' gateways for one consumer would otherwise claim the same socket path on one host.

Needs root, /dev/net/tun, `ip`, `nft`, `ping` (the agents' probes), `unshare` and wireguard-go
(`missing_requirements` says which are missing). Every name carries a random tag. `teardown` removes
everything this object created, WireGuard links before their namespaces (wireguard-go keeps a
deleted namespace alive otherwise).

A run that is killed (SIGKILL, a machine snapshot, a session that ends) cannot tear down. So each
object holds an exclusive lock on `<registry>/<tag>.lock` from before its first namespace until its
teardown; the kernel drops the lock with the process. `prepare` (called before the first namespace)
removes the namespaces of every tag whose lock nobody holds: the processes left in them, their
WireGuard links, the namespaces.

Does not: configure the fabric (`gpufed peer` / `network connect` do, through the clusters), choose
any address (the clusters and their RemoteNetworks do), or touch namespaces, links or processes
outside the namespaces of its own prefix; of those, it removes only ones no living run holds.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import fcntl
import json
import os
import secrets
import shutil
import signal
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from ipaddress import IPv4Address, IPv4Network
from pathlib import Path
from typing import Any

from gpufed import process
from gpufed.errors import GpufedError
from netfabric.render import INTERFACE_PREFIX

#: The gateway's address on every pod-side link (what pods route through).
GW_LINK = "169.254.1.1"
#: Prefix of every namespace this module creates (then a random tag, then the role).
NS_PREFIX = "gfdemo"
#: Where each living run holds the lock of its tag (see the module docstring).
REGISTRY = Path("/run/gpufed/podnet")
#: Where wireguard-go opens its UAPI sockets (made private per gateway agent).
WIREGUARD_RUN_DIR = "/run/wireguard"
#: nftables table of the kube-proxy stand-in in the client pod.
SERVICE_TABLE = "gpufed_demo_services"
#: Seconds a command may take.
COMMAND_TIMEOUT_S = 30.0
#: Seconds a process may take to exit after SIGTERM before it is killed.
STOP_GRACE_S = 10.0

# A tiny HTTP server: GET answers one JSON line, the server's identity plus the client address it saw.
HTTP_SERVER = """
import http.server, json, sys
address, port, identity = sys.argv[1], int(sys.argv[2]), json.loads(sys.argv[3])
class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = (json.dumps({**identity, "clientSeenAs": self.client_address[0]}) + "\\n").encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *args):
        pass
server = http.server.ThreadingHTTPServer((address, port), Handler)
print("ready", flush=True)
server.serve_forever()
"""

# One HTTP GET; prints the body, or exits non-zero with the reason.
HTTP_CLIENT = """
import sys, urllib.request
with urllib.request.urlopen(sys.argv[1], timeout=float(sys.argv[2])) as r:
    sys.stdout.write(r.read().decode())
"""


class PodNetworkError(GpufedError, RuntimeError):
    """A namespace, link or process did not come out as asked; the message says which. (A command
    that fails raises `process.CommandError`, naming the command and what it said.)"""


def missing_requirements(wireguard_go: Path) -> list[str]:
    """Why the data plane cannot run on this machine (empty: it can)."""
    why = []
    if os.geteuid() != 0:
        why.append("not root (network namespaces, WireGuard and nftables need CAP_NET_ADMIN)")
    if not Path("/dev/net/tun").exists():
        why.append("no /dev/net/tun (wireguard-go needs TUN)")
    for tool, package in (("ip", "iproute2"), ("nft", "nftables"), ("ping", "iputils-ping"), ("unshare", "util-linux")):
        if shutil.which(tool) is None:
            why.append(f"no `{tool}` on PATH (Debian package {package}; `make deps` installs it)")
    if not os.access(wireguard_go, os.X_OK):
        why.append(f"no wireguard-go at {wireguard_go} (run `make binaries`)")
    return why


def service_ruleset(cluster_ip: str, port: int, endpoints: Sequence[tuple[str, int]]) -> str:
    """The kube-proxy stand-in: TCP to cluster_ip:port is DNATed to one of the endpoints, round-robin.

    Pure. Raises ValueError on an empty endpoint list or a malformed address."""
    if not endpoints:
        raise ValueError("a Service without endpoints has nothing to forward to")
    vip = IPv4Address(cluster_ip)
    lines = [
        f"table ip {SERVICE_TABLE} {{",
        "\tchain output {",
        "\t\ttype nat hook output priority -100; policy accept;",
        f"\t\tip daddr {vip} tcp dport {int(port)} jump service",
        "\t}",
        "\tchain service {",
        f"\t\tnumgen inc mod {len(endpoints)} vmap {{ "
        + ", ".join(f"{i} : goto endpoint{i}" for i in range(len(endpoints)))
        + " }",
        "\t}",
    ]
    for i, (ip, target) in enumerate(endpoints):
        lines += [f"\tchain endpoint{i} {{", f"\t\tmeta l4proto tcp dnat to {IPv4Address(ip)}:{int(target)}", "\t}"]
    lines.append("}")
    return "\n".join(lines) + "\n"


async def _run(argv: Sequence[str], stdin: str | None = None, timeout_s: float = COMMAND_TIMEOUT_S) -> str:
    """stdout of a command that must succeed (CommandError naming it and its stderr otherwise)."""
    return (await process.run(argv, stdin=stdin, timeout_s=timeout_s)).stdout


@dataclass
class _Process:
    what: str
    proc: asyncio.subprocess.Process
    log: Path | None = None


@dataclass
class PodNetwork:
    """The namespaces, links and processes of one demo run (see the module docstring).

    `gpufed` is the command line that runs gpufed (e.g. [python, -m, gpufed.cli]); `logs` the
    directory for the gateway agents' logs."""

    wireguard_go: Path
    kubeconfig: Path
    gpufed: Sequence[str]
    logs: Path
    tag: str = field(default_factory=lambda: secrets.token_hex(2))
    registry: Path = REGISTRY
    namespaces: list[str] = field(default_factory=list)
    agents: dict[str, _Process] = field(default_factory=dict)
    servers: list[_Process] = field(default_factory=list)
    _links: dict[str, int] = field(default_factory=dict)
    _lock: int | None = None

    def ns(self, role: str) -> str:
        return f"{NS_PREFIX}{self.tag}-{role}"

    @property
    def client(self) -> str:
        return self.ns("cpod")

    def _next_link(self, ns: str, prefix: str) -> str:
        n = self._links.get(f"{ns}/{prefix}", 0)
        self._links[f"{ns}/{prefix}"] = n + 1
        return f"{prefix}{n}"

    async def prepare(self) -> list[str]:
        """Hold this run's tag (a new one if a living run holds it), then remove what killed runs
        left (`reap_stale`); returns what was removed. Idempotent: once held, does nothing."""
        if self._lock is not None:
            return []
        while (fd := hold_tag(self.registry, self.tag)) is None:
            self.tag = secrets.token_hex(2)
        self._lock = fd
        return await reap_stale(self.registry)

    def _release(self) -> None:
        if self._lock is not None:
            with contextlib.suppress(FileNotFoundError):
                (self.registry / f"{self.tag}.lock").unlink()
            os.close(self._lock)
            self._lock = None

    async def _add_ns(self, role: str) -> str:
        name = self.ns(role)
        if name in self.namespaces:
            return name
        await self.prepare()
        await _run(["ip", "netns", "add", name])
        self.namespaces.append(name)
        await _run(["ip", "-n", name, "link", "set", "lo", "up"])
        return name

    async def _veth(self, a_ns: str, a: str, b_ns: str, b: str) -> None:
        await _run(["ip", "link", "add", a, "netns", a_ns, "type", "veth", "peer", b, "netns", b_ns])

    # ---- topology

    async def add_peering(self, index: int, consumer_endpoint: str, provider_endpoint: str) -> tuple[str, str]:
        """Gateway namespaces cgw<index> and pgw<index> joined by an underlay veth carrying the two
        endpoint addresses (host or host:port); returns their names."""
        cgw, pgw = await self._add_ns(f"cgw{index}"), await self._add_ns(f"pgw{index}")
        await self._veth(cgw, "ul0", pgw, "ul0")
        for ns, endpoint in ((cgw, consumer_endpoint), (pgw, provider_endpoint)):
            await _run(["ip", "-n", ns, "addr", "add", f"{IPv4Address(endpoint.split(':')[0])}/24", "dev", "ul0"])
            await _run(["ip", "-n", ns, "link", "set", "ul0", "up"])
        return cgw, pgw

    async def _pod_link(self, gw: str, pod: str, address: str) -> str:
        """A point-to-point link gateway <-> pod; returns the pod-side link name."""
        g, p = self._next_link(gw, "pod"), self._next_link(pod, "eth")
        await self._veth(gw, g, pod, p)
        await _run(["ip", "-n", gw, "addr", "add", f"{GW_LINK}/32", "dev", g])
        await _run(["ip", "-n", gw, "link", "set", g, "up"])
        await _run(["ip", "-n", gw, "route", "replace", f"{IPv4Address(address)}/32", "dev", g])
        await _run(["ip", "-n", pod, "link", "set", p, "up"])
        return p

    async def add_client(self, address: str, routes: Sequence[tuple[int, str]]) -> None:
        """The consumer's client pod at `address`, linked to each cgw<index> in `routes` and routing
        that peering's remapped provider pod range (CIDR) there; its default route goes to the first."""
        pod = await self._add_ns("cpod")
        for n, (index, cidr) in enumerate(routes):
            dev = await self._pod_link(self.ns(f"cgw{index}"), pod, address)
            if n == 0:
                await _run(["ip", "-n", pod, "addr", "add", f"{IPv4Address(address)}/32", "dev", dev])
                await _run(["ip", "-n", pod, "route", "add", "default", "via", GW_LINK, "dev", dev, "onlink"])
            await _run(
                ["ip", "-n", pod, "route", "add", str(IPv4Network(cidr)), "via", GW_LINK, "dev", dev, "onlink",
                 "src", str(IPv4Address(address))]
            )  # fmt: skip

    async def add_server(self, index: int, name: str, address: str, port: int, identity: dict[str, Any]) -> str:
        """A twin pod behind pgw<index> at its real `address`, with an HTTP server on `port` answering
        `identity` plus the client address it saw; returns the namespace."""
        pod = await self._add_ns(f"p{index}-{name}"[:40])
        dev = await self._pod_link(self.ns(f"pgw{index}"), pod, address)
        await _run(["ip", "-n", pod, "addr", "add", f"{IPv4Address(address)}/32", "dev", dev])
        await _run(["ip", "-n", pod, "route", "add", f"{GW_LINK}/32", "dev", dev])
        await _run(["ip", "-n", pod, "route", "add", "default", "via", GW_LINK])
        proc = await asyncio.create_subprocess_exec(
            "ip", "netns", "exec", pod, sys.executable, "-u", "-c", HTTP_SERVER, address, str(port),
            json.dumps(identity),
            stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
        )  # fmt: skip
        self.servers.append(_Process(f"HTTP server of {name}", proc))
        assert proc.stdout is not None
        try:
            async with asyncio.timeout(COMMAND_TIMEOUT_S):
                line = (await proc.stdout.readline()).decode(errors="replace").strip()
        except TimeoutError:
            line = "(no answer)"
        if line != "ready":
            rest = (await proc.stdout.read(2000)).decode(errors="replace") if proc.returncode is not None else ""
            raise PodNetworkError(f"the HTTP server of {name} at {address}:{port} did not start: {line} {rest}")
        return pod

    async def add_service(self, cluster_ip: str, port: int, endpoints: Sequence[tuple[str, int]]) -> str:
        """Install the kube-proxy stand-in for one Service in the client pod; returns the ruleset."""
        ruleset = service_ruleset(cluster_ip, port, endpoints)
        with contextlib.suppress(process.CommandError):  # replace a previous version atomically enough for a demo
            await _run(["ip", "netns", "exec", self.client, "nft", "delete", "table", "ip", SERVICE_TABLE])
        await _run(["ip", "netns", "exec", self.client, "nft", "-f", "-"], stdin=ruleset)
        return ruleset

    async def get(self, url: str, timeout_s: float = 5.0) -> str:
        """One HTTP GET from the client pod; the body, or CommandError with the reason."""
        return await _run(
            ["ip", "netns", "exec", self.client, sys.executable, "-c", HTTP_CLIENT, url, str(timeout_s)],
            timeout_s=timeout_s + 10,
        )

    # ---- gateway agents

    async def start_agent(
        self, key: str, peer_id: str, context: str, netns: str, probe_interval_s: float = 1.0
    ) -> Path:
        """`gpufed gateway` for one side of one peering, in `netns`, with a private /run/wireguard;
        returns its log file."""
        self.logs.mkdir(parents=True, exist_ok=True)
        log = self.logs / f"gateway-{key}.log"
        agent = [
            *self.gpufed, "gateway", "--name", peer_id, "--kubeconfig", str(self.kubeconfig), "--context", context,
            "--netns", netns, "--wireguard-go", str(self.wireguard_go), "--probe-interval", f"{probe_interval_s:g}",
        ]  # fmt: skip
        private_run = (
            f'mkdir -p {WIREGUARD_RUN_DIR} && mount -t tmpfs -o mode=0755 gpufed-gw {WIREGUARD_RUN_DIR} && exec "$@"'
        )
        with log.open("ab") as out:
            proc = await asyncio.create_subprocess_exec(
                "unshare", "--mount", "--propagation", "private", "--", "sh", "-c", private_run, f"gateway-{key}",
                *agent,
                stdin=asyncio.subprocess.DEVNULL, stdout=out, stderr=asyncio.subprocess.STDOUT,
            )  # fmt: skip
        self.agents[key] = _Process(f"gateway agent {key}", proc, log)
        return log

    def agent_exited(self, key: str) -> int | None:
        """The exit status of an agent, None while it runs."""
        return self.agents[key].proc.returncode

    def log_tail(self, key: str, lines: int = 15) -> str:
        log = self.agents[key].log
        try:
            return "\n".join((log.read_text(errors="replace") if log else "").splitlines()[-lines:])
        except OSError as e:
            return f"(no log: {e})"

    async def wait_agents_exit(self, timeout_s: float) -> list[str]:
        """Wait until every agent has exited on its own (their Gateways are gone); returns the keys of
        those still running after `timeout_s`."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while True:
            running = [k for k, a in self.agents.items() if a.proc.returncode is None]
            if not running or loop.time() > deadline:
                return running
            await asyncio.sleep(0.2)

    # ---- teardown

    @staticmethod
    async def _stop(p: _Process) -> None:
        if p.proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                p.proc.send_signal(signal.SIGTERM)
            try:
                async with asyncio.timeout(STOP_GRACE_S):
                    await p.proc.wait()
            except TimeoutError:
                with contextlib.suppress(ProcessLookupError):
                    p.proc.kill()
                await p.proc.wait()

    async def teardown(self) -> list[str]:
        """Stop every process, delete the WireGuard links left in gateway namespaces, then every
        namespace; returns what it removed (for the narration). Idempotent; errors are collected and
        raised together at the end, after everything possible was removed."""
        done: list[str] = []
        errors: list[str] = []
        for p in [*self.agents.values(), *self.servers]:
            running = p.proc.returncode is None
            await self._stop(p)
            if running:
                done.append(f"stopped {p.what}")
        self.servers.clear()
        self.agents.clear()
        for ns in self.namespaces:
            if "-cgw" not in ns and "-pgw" not in ns:
                continue
            try:
                links = await _run(["ip", "-n", ns, "-br", "link"])
            except process.CommandError as e:
                errors.append(str(e))
                continue
            for name in (line.split()[0].split("@")[0] for line in links.splitlines() if line.strip()):
                if name.startswith(INTERFACE_PREFIX):
                    try:
                        await _run(["ip", "-n", ns, "link", "del", name])
                        done.append(f"deleted WireGuard link {name} in {ns}")
                    except process.CommandError as e:
                        errors.append(str(e))
        for ns in reversed(self.namespaces):
            try:
                await _run(["ip", "netns", "del", ns])
                done.append(f"deleted netns {ns}")
            except process.CommandError as e:
                errors.append(str(e))
        self.namespaces.clear()
        self._links.clear()
        if errors:
            raise PodNetworkError("; ".join(errors))
        self._release()
        return done


def hold_tag(registry: Path, tag: str) -> int | None:
    """An open descriptor holding the exclusive lock of `tag`, or None when a living run holds it.

    The lock file may be removed by a reaper between open and lock; the lock then holds a file no
    one else can find, so it is taken again on the file now at the path."""
    registry.mkdir(parents=True, exist_ok=True)
    path = registry / f"{tag}.lock"
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            os.close(fd)
            if e.errno in (errno.EAGAIN, errno.EWOULDBLOCK):
                return None
            raise
        try:
            if os.fstat(fd).st_ino == path.stat().st_ino:
                return fd
        except FileNotFoundError:
            pass
        os.close(fd)


def _tag_of(namespace: str) -> str:
    return namespace[len(NS_PREFIX) :].split("-", 1)[0]


async def reap_stale(registry: Path = REGISTRY) -> list[str]:
    """Remove the namespaces of this module whose tag no living run holds: kill the processes left
    in them, delete their WireGuard links, then the namespaces; returns what was removed. A namespace
    that cannot be removed is named in PodNetworkError, after everything possible was removed."""
    done: list[str] = []
    errors: list[str] = []
    by_tag: dict[str, list[str]] = {}
    for ns in await leftover_namespaces():
        by_tag.setdefault(_tag_of(ns), []).append(ns)
    for tag, namespaces in sorted(by_tag.items()):
        fd = hold_tag(registry, tag)
        if fd is None:
            continue  # a living run's
        try:
            for ns in namespaces:
                try:
                    pids = [int(p) for p in (await _run(["ip", "netns", "pids", ns])).split()]
                except (process.CommandError, ValueError):
                    pids = []
                for pid in pids:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGKILL)
                if pids:
                    done.append(f"killed {len(pids)} process(es) left in {ns}")
                with contextlib.suppress(process.CommandError):
                    links = await _run(["ip", "-n", ns, "-br", "link"])
                    for name in (line.split()[0].split("@")[0] for line in links.splitlines() if line.strip()):
                        if name.startswith(INTERFACE_PREFIX):
                            await _run(["ip", "-n", ns, "link", "del", name])
                try:
                    await _run(["ip", "netns", "del", ns])
                    done.append(f"deleted netns {ns}")
                except process.CommandError as e:
                    errors.append(str(e))
        finally:
            with contextlib.suppress(FileNotFoundError):
                (registry / f"{tag}.lock").unlink()
            os.close(fd)
    if errors:
        raise PodNetworkError("; ".join(errors))
    return done


async def leftover_namespaces(tag: str | None = None) -> list[str]:
    """Network namespaces of this module (of one run when `tag` is given) that still exist."""
    out = await _run(["ip", "netns", "list"])
    prefix = f"{NS_PREFIX}{tag}-" if tag else NS_PREFIX
    return [line.split()[0] for line in out.splitlines() if line.strip() and line.split()[0].startswith(prefix)]
