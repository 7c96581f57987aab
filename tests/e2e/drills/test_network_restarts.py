"""Fault drills on the network fabric and on restarts (drills 5–8), on the real local clusters.

Owns five drills, each marked `drill`, each judged by the shared `Ledger` (no offloaded pod lost,
duplicated or resurrected) and each recording its recovery time (`ledger.record`):

- `tunnel-cut-30s`: UDP on the WireGuard port is dropped (nftables, in the consumer gateway's network
  namespace) for 30 s: both Connections go Down, the control plane is untouched (offloaded pods keep
  their status, a pod created during the cut is offloaded and runs), and both go Connected again
  once the rule is removed. Recovery: from the removal to both Connected.
- `gateway-restart`: the provider's gateway agent is killed (-9) and started again where its
  wireguard-go runs (it adopts the tunnel: same interface); the consumer's is stopped and started
  as a new pod would be (its own fresh /run/wireguard: a new tunnel, a new handshake). Recovery: from
  the start of the new agent to a fresh probe published as Connected.
- `controller-restart`: the provider's controller is stopped and started; the consumer's is killed
  (-9, the webhook and the virtual kubelets' supervisor with it). While the consumer's is down, pod
  creation in an offloaded namespace is refused naming the webhook (failure policy `Fail`,
  docs/offloading.md) and elsewhere succeeds; afterwards it succeeds, the old virtual kubelet is gone
  (it had to exit with its supervisor), exactly one new one serves the node, and nothing was lost.
- `peer-unpeer-cycles`: after a warm-up cycle, `gpufed peer` / `gpufed unpeer` with gpu-b, 20 times
  (CRs and objects of the network step included, no data plane), then 3 times with both gateway
  agents running until the tunnel is Connected: after each cycle nothing is left on any cluster (a
  diff of every namespace, node, CSR, RBAC object, ServiceAccount, Secret, ConfigMap, Lease and
  gpufed CR against the state before), no virtual kubelet, gateway agent or wireguard-go process,
  and the gateway namespaces' links, nftables rulesets, IPv4 rules and routes are as before.
- `client-cert-rotation`: the one credential rotation gpufed offers for a running peering (Tenant
  `spec.authGeneration` + `gpufed peer`, docs/operations.md): pods keep running, and after the
  virtual kubelet restart that makes it use the new certificate, pods, logs and new pods work.

The clusters run one module-scoped peering consumer ↔ gpu-a with the data plane (gpufed.localenv
.podnet: gateway namespaces, gpufed's own gateway agents, wireguard-go) and one offloaded namespace
with a 3-replica GPU Deployment. Without root, /dev/net/tun, ip, nft, ping, unshare or wireguard-go
the module FAILS saying what is missing (CI has them). GPUFED_DRILL_CYCLES overrides the 20 cycles.

Does not: test the data plane's packet paths (tests/e2e/test_fabric.py does) or restart the clusters'
own components.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import os
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from gpufed.apis.kinds import KINDS
from gpufed.apis.meta import GROUP
from gpufed.apis.wire import ClusterID
from gpufed.localenv import components, supervise
from gpufed.localenv.podnet import PodNetwork, missing_requirements
from netfabric.render import INTERFACE_PREFIX
from tests.e2e.conftest import Clusters
from tests.e2e.drills.ledger import Ledger, Snapshot, record
from tests.e2e.helpers import (
    cluster_id,
    eventually,
    gpufed,
    gpufed_timed,
    offload,
    out,
    peer,
    peer_args,
    processes,
    slow_steps,
    unpeer,
    unpeer_args,
)

# the module fixture (peering, namespaces, agents) counts against its first and last test
pytestmark = [pytest.mark.drill, pytest.mark.timeout(600)]

#: Seconds the tunnel stays cut.
CUT_S = 30.0
#: Peer/unpeer cycles without, then with, the data plane.
CYCLES = int(os.environ.get("GPUFED_DRILL_CYCLES", "20"))
NETWORK_CYCLES = 3
#: A step of `gpufed peer`/`unpeer` that takes longer than this is named in the cycle's progress line.
SLOW_STEP_S = 5.0
#: Replicas of the offloaded GPU Deployment the drills watch.
REPLICAS = 3
#: What the leftover diff compares (events excluded: they expire on their own).
SNAPSHOT_KINDS = ",".join(
    [
        "namespaces",
        "nodes",
        "certificatesigningrequests",
        "clusterroles",
        "clusterrolebindings",
        "roles",
        "rolebindings",
        "serviceaccounts",
        "secrets",
        "configmaps",
        "leases",
        *(f"{k.plural}.{GROUP}" for k in KINDS),
    ]
)
WEBHOOK = "pods.offloading.gpufed.io"


@dataclass
class Drill:
    clusters: Clusters
    ids: dict[str, ClusterID]
    net: PodNetwork
    gateways: tuple[str, str]  # the consumer's and gpu-a's gateway namespaces
    namespace: str
    ledger: Ledger
    #: gateway agents this module started itself (in the mount namespace of a running wireguard-go)
    restarted: dict[str, asyncio.subprocess.Process] = field(default_factory=dict)

    def agent_exited(self, key: str) -> int | None:
        proc = self.restarted.get(key)
        return proc.returncode if proc is not None else self.net.agent_exited(key)

    def connection(self, context: str, peer: str | None = None) -> dict[str, Any]:
        name = peer or (self.ids["gpu-a"] if context == "consumer" else self.ids["consumer"])
        got = self.clusters.kubectl(context, "get", "connection", "-n", "gpufed", name, "-o", "json", check=False)
        status: dict[str, Any] = (json.loads(got.stdout).get("status") or {}) if got.returncode == 0 else {}
        return status

    def phases(self) -> tuple[str, str]:
        """Both Connections' phases; fails at once when a gateway agent died (nothing would restart it)."""
        for key in ("c0", "p0"):
            code = self.agent_exited(key)
            assert code is None, f"gateway agent {key} exited ({code}):\n{self.net.log_tail(key, 40)}"
        return self.connection("consumer").get("phase", ""), self.connection("gpu-a").get("phase", "")

    def gpu_pod(self, name: str) -> dict[str, Any]:
        return {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name, "namespace": self.namespace},
            "spec": {"containers": [{"name": "main", "image": "nvcr.io/nvidia/pytorch:24.01", **GPU}]},
        }

    def on_virtual_node_running(self, name: str) -> bool:
        got = self.clusters.kubectl("consumer", "get", "pod", name, "-n", self.namespace, "-o", "json", check=False)
        if got.returncode:
            return False
        pod = json.loads(got.stdout)
        node = pod["spec"].get("nodeName") or ""
        return node.startswith(f"gpufed-{self.ids['gpu-a']}") and pod["status"].get("phase") == "Running"


GPU: dict[str, Any] = {"resources": {"limits": {"nvidia.com/gpu": "1"}}}


def _ppid(pid: int) -> int:
    stat = Path(f"/proc/{pid}/stat").read_text()
    return int(stat[stat.rindex(")") + 2 :].split()[1])


def _virtual_kubelets(clusters: Clusters, provider: ClusterID) -> dict[int, str]:
    return processes("virtual-kubelet", f"--provider-cluster-id={provider}", str(clusters.env.state_dir))


def _in_namespaces(pids: dict[int, str], namespaces: list[str]) -> dict[int, str]:
    """The processes among `pids` that run in one of these network namespaces."""
    inodes = {Path(f"/run/netns/{n}").stat().st_ino for n in namespaces}
    found = {}
    for pid, cmd in pids.items():
        try:
            if Path(f"/proc/{pid}/ns/net").stat().st_ino in inodes:
                found[pid] = cmd
        except OSError:
            continue
    return found


async def _controller_pid(clusters: Clusters, context: str) -> int:
    status = {c.name: c for c in await clusters.env.status()}[context]
    pid = next(c.pid for c in status.components if c.name == components.CONTROLLER)
    assert pid is not None, f"no gpufed controller recorded for {context}"
    return pid


async def _wait(what: str, probe: Callable[[], Any], timeout: float, interval: float = 0.3) -> Any:
    """Poll `probe` (blocking calls) until truthy; `timeout` is only an upper bound."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        last = await asyncio.to_thread(probe)
        if last:
            return last
        await asyncio.sleep(interval)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what} (last: {last!r})")


async def _gone(pid: int, timeout: float = 30) -> None:
    await _wait(f"pid {pid} to exit", lambda: supervise.start_time(pid) is None, timeout, interval=0.1)


def all_running(namespace: str) -> Callable[[Snapshot], bool]:
    """`until` condition: the Deployment's replicas and every pod a drill added are Running."""

    def check(snap: Snapshot) -> bool:
        pods = [p for p in snap.pods.values() if p.namespace == namespace and not p.deleting]
        return len(pods) >= REPLICAS and all(p.phase == "Running" for p in pods)

    return check


def _stamp(value: str | None) -> float:
    return dt.datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp() if value else 0.0


@pytest.fixture(scope="module")
async def drill(clusters: Clusters, tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Drill]:
    wireguard_go = clusters.env.binary("wireguard-go")
    missing = missing_requirements(wireguard_go)
    if missing:
        pytest.fail("the network drills cannot run on this machine: " + "; ".join(missing), pytrace=False)
    p = peer(clusters, "gpu-a", "--gpus", "8")
    assert p.returncode == 0, out(p)
    ids = {c: cluster_id(clusters, c) for c in ("consumer", "gpu-a", "gpu-b")}
    net = PodNetwork(
        wireguard_go=wireguard_go,
        kubeconfig=clusters.kubeconfig,
        gpufed=[sys.executable, "-m", "gpufed.cli"],
        logs=tmp_path_factory.mktemp("drill-gateways"),
    )
    namespace = f"drill-net-{net.tag}"
    restarted: dict[str, asyncio.subprocess.Process] = {}
    try:
        topo = clusters.topology
        cgw, pgw = await net.add_peering(0, topo.gateway_endpoint("consumer"), topo.gateway_endpoint("gpu-a"))
        await net.start_agent("c0", ids["gpu-a"], "consumer", cgw)
        await net.start_agent("p0", ids["consumer"], "gpu-a", pgw)
        clusters.kubectl("consumer", "create", "namespace", namespace)
        eventually(
            "default ServiceAccount",
            lambda: clusters.kubectl("consumer", "get", "sa", "default", "-n", namespace, check=False).returncode == 0,
        )
        offload(clusters, namespace)
        clusters.create(
            "consumer",
            {
                "apiVersion": "apps/v1",
                "kind": "Deployment",
                "metadata": {"name": "trainer", "namespace": namespace},
                "spec": {
                    "replicas": REPLICAS,
                    "selector": {"matchLabels": {"app": "trainer"}},
                    "template": {
                        "metadata": {"labels": {"app": "trainer"}},
                        "spec": {"containers": [{"name": "main", "image": "nvcr.io/nvidia/pytorch:24.01", **GPU}]},
                    },
                },
            },
        )
        d = Drill(clusters, ids, net, (cgw, pgw), namespace, Ledger(clusters, (namespace,)), restarted)
        await _wait("both Connections Connected", lambda: d.phases() == ("Connected", "Connected"), 90)
        d.ledger.settle("the offloaded Deployment", timeout=120, until=all_running(namespace))
        yield d
    except BaseException:
        for key in list(net.agents):
            print(f"--- gateway agent {key}\n{net.log_tail(key, 30)}")
        raise
    finally:
        gpufed("unoffload-namespace", namespace, "--kubeconfig", str(clusters.kubeconfig), "--context", "consumer")
        clusters.kubectl("consumer", "delete", "namespace", namespace, "--wait=false", check=False)
        p = unpeer(clusters, "gpu-a")
        await net.wait_agents_exit(30)
        for proc in restarted.values():
            if proc.returncode is None:
                proc.kill()
            await proc.wait()
        await net.teardown()
        assert p.returncode == 0, out(p)


# ---- drill 5


async def test_tunnel_cut_30s_goes_down_then_recovers_without_touching_pods(drill: Drill) -> None:
    port = drill.clusters.topology.gateway_endpoint("gpu-a").split(":")[1]
    cgw = drill.gateways[0]
    cut = (
        "table inet gfdrill {\n"
        f"  chain out {{ type filter hook output priority 0; policy accept; udp dport {port} drop; }}\n"
        f"  chain in {{ type filter hook input priority 0; policy accept; udp sport {port} drop; }}\n"
        "}\n"
    )
    ledger = drill.ledger
    ledger.settle("before the cut", timeout=60, until=all_running(drill.namespace))
    subprocess.run(["ip", "netns", "exec", cgw, "nft", "-f", "-"], input=cut, text=True, check=True)
    started = time.monotonic()
    try:
        await _wait("both Connections Down", lambda: drill.phases() == ("Down", "Down"), CUT_S)
        down_after = time.monotonic() - started
        reasons = (drill.connection("consumer")["reason"], drill.connection("gpu-a")["reason"])
        # the control plane does not use the tunnel: a pod created now is offloaded and runs
        drill.clusters.create("consumer", drill.gpu_pod("during-cut"))
        await _wait("the pod created during the cut Running", lambda: drill.on_virtual_node_running("during-cut"), 60)
        while time.monotonic() - started < CUT_S:
            snap = await asyncio.to_thread(ledger.observe)
            assert ledger.problems(snap) == [], ledger.problems(snap)
            assert all(p.phase == "Running" for p in snap.pods.values()), snap.pods
            assert drill.phases() == ("Down", "Down")
            await asyncio.sleep(2)
    finally:
        subprocess.run(["ip", "netns", "exec", cgw, "nft", "delete", "table", "inet", "gfdrill"], check=True)
    restored = time.monotonic()
    await _wait("both Connections Connected again", lambda: drill.phases() == ("Connected", "Connected"), 120)
    recovery = time.monotonic() - restored
    ledger.settle("after the cut", timeout=60, until=all_running(drill.namespace))
    record(
        "tunnel-cut-30s",
        recovery,
        cut_s=round(restored - started, 1),
        down_after_s=round(down_after, 1),
        down_reasons="/".join(reasons),
    )


# ---- drill 6


def _ifindex(ns: str) -> int:
    links = json.loads(subprocess.run(["ip", "-j", "-n", ns, "link"], capture_output=True, check=True).stdout)
    (index,) = [int(link["ifindex"]) for link in links if link["ifname"].startswith(INTERFACE_PREFIX)]
    return index


async def _restart_agent(drill: Drill, key: str, context: str, ns: str, *, adopt: bool) -> None:
    """Start the gateway agent `key` again. adopt: in the mount namespace of the wireguard-go it left
    running (podnet gives every agent a fresh private /run/wireguard, as a new gateway pod has, so
    the agent could not find the daemon's socket; a restarted agent on the same node finds it);
    otherwise as a new pod: podnet's fresh mount namespace."""
    peer_id = drill.ids["gpu-a"] if context == "consumer" else drill.ids["consumer"]
    if not adopt:
        drill.restarted.pop(key, None)
        await drill.net.start_agent(key, peer_id, context, ns)
        return
    daemons = _in_namespaces(processes(str(drill.clusters.env.binary("wireguard-go"))), [ns])
    assert len(daemons) == 1, f"one wireguard-go in {ns}: {daemons}"
    agent = [
        "nsenter", f"--target={next(iter(daemons))}", "--mount", "--",
        sys.executable, "-m", "gpufed.cli", "gateway", "--name", peer_id,
        "--kubeconfig", str(drill.clusters.kubeconfig), "--context", context, "--netns", ns,
        "--wireguard-go", str(drill.clusters.env.binary("wireguard-go")), "--probe-interval", "1",
    ]  # fmt: skip
    with (drill.net.logs / f"gateway-{key}.log").open("ab") as log:
        drill.restarted[key] = await asyncio.create_subprocess_exec(
            *agent, stdin=asyncio.subprocess.DEVNULL, stdout=log, stderr=asyncio.subprocess.STDOUT
        )


async def _stop_agent(drill: Drill, key: str, sig: signal.Signals) -> None:
    proc = drill.restarted.get(key) or drill.net.agents[key].proc
    proc.send_signal(sig)
    await asyncio.wait_for(proc.wait(), 30)


async def test_gateway_restarts_recover_the_tunnel(drill: Drill) -> None:
    measured: dict[str, float] = {}
    for key, context, ns, sig, adopt in (
        ("p0", "gpu-a", drill.gateways[1], signal.SIGKILL, True),  # a crash, restarted in place
        ("c0", "consumer", drill.gateways[0], signal.SIGTERM, False),  # a new gateway pod
    ):
        index = _ifindex(ns)
        await _stop_agent(drill, key, sig)
        stopped = time.time()
        started = time.monotonic()
        await _restart_agent(drill, key, context, ns, adopt=adopt)

        def fresh(context: str = context, stopped: float = stopped) -> bool:
            st = drill.connection(context)
            # stamps have one-second resolution: a probe of the new agent is stamped after the second of the stop
            return st.get("phase") == "Connected" and _stamp(st.get("lastProbe")) > int(stopped)

        await _wait(f"a fresh Connected probe of the restarted {context} gateway", fresh, 60)
        measured[context] = time.monotonic() - started
        if adopt:
            assert _ifindex(ns) == index, "the restarted agent replaced the tunnel instead of adopting it"
        await _wait("both Connections Connected", lambda: drill.phases() == ("Connected", "Connected"), 60)
    drill.ledger.settle("after the gateway restarts", timeout=60, until=all_running(drill.namespace))
    record(
        "gateway-restart",
        max(measured.values()),
        provider_kill9_adopted_s=round(measured["gpu-a"], 2),
        consumer_sigterm_new_mounts_s=round(measured["consumer"], 2),
    )


async def test_controller_restarts_and_the_webhook_failure_policy(drill: Drill) -> None:
    clusters, ledger, ns = drill.clusters, drill.ledger, drill.namespace
    webhook_config = ["get", "mutatingwebhookconfiguration", "gpufed-offloading"]
    ca_before = clusters.kubectl_json("consumer", *webhook_config)["webhooks"][0]["clientConfig"]["caBundle"]
    log = clusters.env.log_path("gpu-a", components.CONTROLLER)

    # the provider's controller: an ordinary stop and start
    ready_lines = log.read_text(errors="replace").count('"controller ready"')
    pid = await _controller_pid(clusters, "gpu-a")
    os.kill(pid, signal.SIGTERM)
    await _gone(pid)
    provider_started = time.monotonic()
    await clusters.env.up()
    await _wait(
        "the provider's controller ready again",
        lambda: log.read_text(errors="replace").count('"controller ready"') > ready_lines,
        60,
    )
    provider_s = time.monotonic() - provider_started
    ledger.settle("after the provider's controller restart", timeout=60, until=all_running(ns))

    # the consumer's controller crashes: its webhook and the virtual kubelets' supervisor with it
    pid = await _controller_pid(clusters, "consumer")
    vks = _virtual_kubelets(clusters, drill.ids["gpu-a"])
    assert len(vks) == 1 and _ppid(next(iter(vks))) == pid, vks
    os.kill(pid, signal.SIGKILL)
    await _gone(pid)
    await _wait(
        "the virtual kubelet to exit with its supervisor",
        lambda: not _virtual_kubelets(clusters, drill.ids["gpu-a"]),
        30,
    )
    refused = clusters.create("consumer", drill.gpu_pod("while-down"), check=False)
    assert refused.returncode != 0 and WEBHOOK in refused.stderr, refused.stderr
    assert "while-down" not in clusters.kubectl("consumer", "get", "pods", "-n", ns, "-o", "name").stdout
    plain = f"drill-plain-{secrets.token_hex(3)}"
    elsewhere = clusters.kubectl(
        "consumer", "run", plain, "-n", "default", "--image=registry.example/app:1", check=False
    )
    assert elsewhere.returncode == 0, f"a namespace that is not offloaded is affected: {elsewhere.stderr}"
    clusters.kubectl("consumer", "delete", "pod", plain, "-n", "default", "--wait=false")
    snap = await asyncio.to_thread(ledger.observe)
    assert ledger.problems(snap) == [] and all(p.phase == "Running" for p in snap.pods.values()), snap.pods

    consumer_started = time.monotonic()
    await clusters.env.up()
    await _wait(
        "the webhook admitting pods again",
        lambda: clusters.create("consumer", drill.gpu_pod("after-restart"), check=False).returncode == 0,
        60,
    )
    webhook_s = time.monotonic() - consumer_started
    await _wait("the pod created after the restart Running", lambda: drill.on_virtual_node_running("after-restart"), 90)
    consumer_s = time.monotonic() - consumer_started
    new_pid = await _controller_pid(clusters, "consumer")
    vks = _virtual_kubelets(clusters, drill.ids["gpu-a"])
    assert len(vks) == 1 and _ppid(next(iter(vks))) == new_pid, f"one virtual kubelet, the new supervisor's: {vks}"
    pod = clusters.kubectl_json("consumer", "get", "pod", "after-restart", "-n", ns)
    assert any(t.get("key") == "gpufed.io/virtual-node" for t in pod["spec"].get("tolerations") or []), pod["spec"]
    ledger.settle("after the consumer's controller restart", timeout=60, until=all_running(ns))
    assert clusters.kubectl_json("consumer", *webhook_config)["webhooks"][0]["clientConfig"]["caBundle"] == ca_before
    record(
        "controller-restart",
        consumer_s,
        provider_sigterm_s=round(provider_s, 2),
        consumer_kill9_webhook_s=round(webhook_s, 2),
    )


# ---- drill 7


def _objects(clusters: Clusters) -> set[str]:
    found = set()
    for context in ("consumer", "gpu-a", "gpu-b"):
        for i in clusters.kubectl_json(context, "get", SNAPSHOT_KINDS, "-A")["items"]:
            meta = i["metadata"]
            found.add(f"{context}: {i['kind']} {meta.get('namespace', '')}/{meta['name']}")
    return found


def _stamped(lines: list[tuple[float, str]]) -> str:
    return "\n".join(f"{at:6.1f}s {line}" for at, line in lines)


def _open_files(pid: int) -> int:
    return sum(1 for _ in Path(f"/proc/{pid}/fd").iterdir())


def _dataplane(ns: str) -> dict[str, set[str]]:
    """What gpufed's agent may change in a gateway namespace: link names, nftables, IPv4 rules and
    routes (IPv6 link-local routes come and go with link states on their own)."""

    def run(*argv: str) -> set[str]:
        got = subprocess.run(["ip", "netns", "exec", ns, *argv], capture_output=True, text=True, check=True)
        return {line.strip() for line in got.stdout.splitlines() if line.strip()}

    return {
        "links": {line.split()[0].split("@")[0] for line in run("ip", "-br", "link")},
        "nftables": run("nft", "list", "ruleset"),
        "rules": run("ip", "-4", "rule"),
        "routes": run("ip", "-4", "route", "show", "table", "all"),
    }


# ~6 min on a quiet 2-core machine (~15 s a cycle, ~20 s with the network); CI's machines have been
# up to 2.5x slower, and the cycles' progress lines say where the time went.
@pytest.mark.timeout(1800)
async def test_peer_unpeer_cycles_leave_nothing(drill: Drill) -> None:
    clusters, net = drill.clusters, drill.net
    provider = drill.ids["gpu-b"]
    state = str(clusters.env.state_dir)
    # A warm-up cycle first: what a cluster's first peering creates once for good (none today) is
    # shown, not counted as a leftover of every later cycle.
    first = await asyncio.to_thread(_objects, clusters)
    for step in (peer, unpeer):
        p = step(clusters, "gpu-b")
        assert p.returncode == 0, f"warm-up {step.__name__}: {out(p)}"
    before = await asyncio.to_thread(_objects, clusters)
    if before - first:
        print("created by the first peering with gpu-b and kept:", *sorted(before - first), sep="\n  ")
    pids_before = set(processes(state))
    topo = clusters.topology
    cgw, pgw = await net.add_peering(1, topo.gateway_endpoint("consumer"), topo.gateway_endpoint("gpu-b"))
    baseline = {ns: _dataplane(ns) for ns in (cgw, pgw)}
    fds: dict[str, int] = {}  # after the first cycle: connection pools and caches have warmed up

    def leftovers() -> list[str]:
        found = sorted(_objects(clusters) - before)
        found += [f"process {pid}: {cmd}" for pid, cmd in processes(state).items() if pid not in pids_before]
        for ns in (cgw, pgw):
            for k, now in _dataplane(ns).items():
                found += [f"{ns}: {k} + {line}" for line in sorted(now - baseline[ns][k])]
                found += [f"{ns}: {k} - {line}" for line in sorted(baseline[ns][k] - now)]
        wireguard = _in_namespaces(processes(str(clusters.env.binary("wireguard-go"))), [cgw, pgw])
        found += [f"wireguard-go {pid}: {cmd}" for pid, cmd in wireguard.items()]
        return found

    cycle_s: list[float] = []
    clean_s: list[float] = []
    for i in range(CYCLES + NETWORK_CYCLES):
        with_network = i >= CYCLES
        started = time.monotonic()
        p, peer_lines = gpufed_timed(*peer_args(clusters, "gpu-b"))
        peered = time.monotonic()
        assert p.returncode == 0, f"cycle {i}: {_stamped(peer_lines)}"
        assert _virtual_kubelets(clusters, provider), f"cycle {i}: no virtual kubelet for gpu-b"
        if with_network:
            await net.start_agent(f"c1-{i}", provider, "consumer", cgw)
            await net.start_agent(f"p1-{i}", drill.ids["consumer"], "gpu-b", pgw)

            def connected() -> bool:
                return (
                    drill.connection("consumer", provider).get("phase") == "Connected"
                    and drill.connection("gpu-b", drill.ids["consumer"]).get("phase") == "Connected"
                )

            await _wait(f"cycle {i}: the tunnel to gpu-b Connected", connected, 90)
        unpeering = time.monotonic()
        u, unpeer_lines = gpufed_timed(*unpeer_args(clusters, "gpu-b"))
        unpeered = time.monotonic()
        assert u.returncode == 0 and "nothing left on either side" in out(u), f"cycle {i}: {_stamped(unpeer_lines)}"
        if with_network:
            keys = (f"c1-{i}", f"p1-{i}")

            def exited(keys: tuple[str, str] = keys) -> bool:
                return all(net.agent_exited(k) is not None for k in keys)

            await _wait(f"cycle {i}: both gateway agents exit on their own", exited, 30)
            codes = {k: net.agent_exited(k) for k in keys}
            assert set(codes.values()) == {0}, f"cycle {i}: gateway agents exited with {codes}"
        left = await asyncio.to_thread(leftovers)
        deadline = time.monotonic() + 60  # an upper bound: namespaces and garbage collection take a moment
        while left and time.monotonic() < deadline:
            await asyncio.sleep(0.5)
            left = await asyncio.to_thread(leftovers)
        assert left == [], f"cycle {i}: left after unpeer:\n  " + "\n  ".join(left)
        clean_s.append(time.monotonic() - unpeering)
        cycle_s.append(time.monotonic() - started)
        # progress, so that a slow or stuck run shows how far it got and which step the time went to
        slow = [f"peer {x}" for x in slow_steps(peer_lines, SLOW_STEP_S)]
        slow += [f"unpeer {x}" for x in slow_steps(unpeer_lines, SLOW_STEP_S)]
        print(
            f"cycle {i}{' (with network)' if with_network else ''}: peer {peered - started:.1f}s,"
            f" unpeer {unpeered - unpeering:.1f}s, clean {time.monotonic() - unpeered:.1f}s,"
            f" total {cycle_s[-1]:.1f}s",
            *slow,
            sep="\n  slow step: ",
            flush=True,
        )
        if i == 0:
            for c in ("consumer", "gpu-b"):
                fds[c] = _open_files(await _controller_pid(clusters, c))
    drill.ledger.settle("after the cycles", timeout=60, until=all_running(drill.namespace))
    grown = {}
    for c, n in fds.items():
        grown[c] = _open_files(await _controller_pid(clusters, c)) - n
    # a leak of one descriptor per peering would show as >= the number of cycles after the first
    later = CYCLES + NETWORK_CYCLES - 1
    assert all(g < later for g in grown.values()), f"controllers' open files grew by {grown} in {later} cycles"
    record(
        "peer-unpeer-cycles",
        max(clean_s),
        cycles=CYCLES,
        network_cycles=NETWORK_CYCLES,
        cycle_mean_s=round(sum(cycle_s[:CYCLES]) / max(1, CYCLES), 2),
        network_cycle_mean_s=round(sum(cycle_s[CYCLES:]) / NETWORK_CYCLES, 2),
        controller_fd_growth="/".join(f"{c}:{g}" for c, g in grown.items()),
    )


# ---- drill 8 (what can be rotated today: the consumer's client certificate)


async def test_client_certificate_rotation_interrupts_nothing(drill: Drill) -> None:
    """Raise the Tenant's authGeneration, run `gpufed peer` again (docs/operations.md): a new
    certificate in the credentials Secret; pods keep running, statuses flow with the old certificate
    (still valid), and after the virtual kubelet restart that makes it read the new one (it reads
    credentials only when it starts) nodes, pods, logs and new pods work. Recovery: from the
    restart to a new pod Running and `kubectl logs` answering."""
    clusters, ns = drill.clusters, drill.namespace
    tenant = ["get", "tenant.gpufed.io", drill.ids["consumer"]]
    secret = ["get", "secret", "-n", "gpufed", f"gpufed-remote-{drill.ids['gpu-a']}"]
    before = clusters.kubectl_json("consumer", *secret)["data"]
    generation = int(clusters.kubectl_json("gpu-a", *tenant)["spec"].get("authGeneration") or 1)
    patch = json.dumps({"spec": {"authGeneration": generation + 1}})
    clusters.kubectl("gpu-a", "patch", "tenant.gpufed.io", drill.ids["consumer"], "--type=merge", "-p", patch)
    p = peer(clusters, "gpu-a", "--gpus", "8")
    assert p.returncode == 0, out(p)
    assert clusters.kubectl_json("consumer", *secret)["data"] != before, "the credentials were not renewed"
    clusters.create("consumer", drill.gpu_pod("rot-old"))
    await _wait("a new pod Running on the old certificate", lambda: drill.on_virtual_node_running("rot-old"), 90)
    drill.ledger.settle("after the rotation", timeout=60, until=all_running(ns))

    (vk,) = _virtual_kubelets(clusters, drill.ids["gpu-a"])
    os.kill(vk, signal.SIGTERM)
    started = time.monotonic()
    await _gone(vk)
    clusters.create("consumer", drill.gpu_pod("rot-new"))
    await _wait("a new pod Running on the new certificate", lambda: drill.on_virtual_node_running("rot-new"), 90)
    pod = next(p.name for p in drill.ledger.observe().pods.values() if p.name.startswith("trainer-"))
    await _wait(
        "kubectl logs of an offloaded pod",
        lambda: clusters.kubectl("consumer", "logs", "-n", ns, pod, check=False).returncode == 0,
        60,
    )
    recovery = time.monotonic() - started
    assert len(_virtual_kubelets(clusters, drill.ids["gpu-a"])) == 1
    drill.ledger.settle("after the virtual kubelet restart", timeout=60, until=all_running(ns))
    record("client-cert-rotation", recovery, auth_generation=generation + 1)
