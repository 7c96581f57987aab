"""Control-plane fault drills on the real local clusters: a component dies or its state is
compacted away mid-work, and afterwards no pod is lost, duplicated or resurrected (`ledger.Ledger`)
and the time to full recovery is printed as `DRILL <name> recovery_s=<x>` (and appended to
$GPUFED_DRILL_RESULTS).

The module peers the consumer with gpu-a and gpu-b, offloads one namespace (`--pod-strategy Remote`:
virtual nodes only) and first runs a Job to completion and one to failure there; after every drill
both are still terminal and their twins never run again. The drills run in file order and share
the namespace, so later drills run with the earlier drills' pods in place:

1. kill -9 gpu-a's virtual kubelet during a 200-pod burst; the controller's supervisor restarts it;
2. gpu-b's apiserver is gone for 60 s: its virtual node goes NotReady, no consumer pod is deleted,
   and after the restart the node is Ready and statuses flow again;
3. the consumer's apiserver is killed and restarted during a burst;
4. etcd compaction: gpu-a's virtual kubelet is paused (SIGSTOP) while pods are deleted and created,
   both etcds are compacted to their current revision and both apiservers restarted, so every watch
   position from before is gone (a watch from one answers 410 Gone); then SIGCONT: it relists;
10. gpu-a's Tenant policy shrinks the CPU ceiling below what runs there: running pods keep running,
   a new pod is refused visibly (Unschedulable by the consumer's scheduler; bound directly, the
   provider's quota refusal is on the pod's status and in a Warning Event), and raising the
   ceiling again lets it run.

Fixed timeouts are only upper bounds for waiting.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from gpufed.apis.quantity import parse
from gpufed.apis.wire import REMOTE_CLUSTER_LABEL, ClusterID
from gpufed.localenv import supervise
from gpufed.localenv.kwokcfg import EXIT_CODE_ANNOTATION
from peering.grants import pod_requests
from tests.e2e.conftest import Clusters
from tests.e2e.drills.ledger import Ledger, PodRecord, Snapshot, record, running
from tests.e2e.helpers import deployment, eventually, offload, peered_session, processes, vk_log_lines

pytestmark = [pytest.mark.e2e, pytest.mark.drill, pytest.mark.timeout(900)]

A100 = "NVIDIA-A100-SXM4-40GB"
BURST = 200
#: The consumer's kube-controller-manager runs with the default --node-monitor-grace-period.
NODE_MONITOR_GRACE_S = 50.0
OUTAGE_S = 60.0


@dataclass
class Drills:
    clusters: Clusters
    ids: dict[str, ClusterID]
    ns: str
    ledger: Ledger

    def vnode(self, provider: str) -> str:
        return f"gpufed-{self.ids[provider]}"

    def on(self, provider: str) -> dict[str, str]:
        return {REMOTE_CLUSTER_LABEL: self.ids[provider]}


@pytest.fixture(scope="module")
def drills(clusters: Clusters) -> Iterator[Drills]:
    peers = {
        "gpu-a": ("--gpus", "8", "--pods", "400", "--no-network"),
        "gpu-b": ("--gpus", "4", "--gpu-product", A100, "--pods", "400", "--no-network"),
    }
    ns = "drills-cp"
    with contextlib.contextmanager(peered_session)(clusters, peers) as ids:
        clusters.kubectl("consumer", "create", "namespace", ns)
        eventually(
            "the default ServiceAccount",
            lambda: (
                clusters.kubectl("consumer", "get", "serviceaccount", "default", "-n", ns, check=False).returncode == 0
            ),
            timeout=30,
        )
        offload(clusters, ns, "--pod-strategy", "Remote")
        # Drill 9: a succeeded and a failed Job, terminal before any fault.
        clusters.run_job("consumer", ns, "done")
        clusters.run_job("consumer", ns, "crash", annotations={EXIT_CODE_ANNOTATION: "3"}, until="Failed")
        ledger = Ledger(clusters, (ns,))
        ledger.settle("the Jobs' pods", timeout=60)
        try:
            yield Drills(clusters, ids, ns, ledger)
        finally:
            clusters.kubectl("consumer", "delete", "namespace", ns, "--wait=false", check=False)
            # Hundreds of graceful deletions take minutes; removing the pods at once is as good a
            # cleanup (their virtual kubelets delete the twins of force-deleted pods).
            clusters.kubectl(
                "consumer", "delete", "pods", "--all", "-n", ns, "--grace-period=0", "--force", check=False, timeout=120
            )
            # Unpeering with hundreds of twins still terminating is slow; let the namespace go first.
            eventually(
                "the drill namespace to go",
                lambda: clusters.kubectl("consumer", "get", "namespace", ns, check=False).returncode != 0,
                timeout=300,
            )


# ---------------------------------------------------------------------------- helpers


def pids_of(clusters: Clusters, *needles: str) -> list[int]:
    """Processes of this environment (their command line names its state directory) matching all needles."""
    return sorted(processes(str(clusters.env.state_dir), *needles))


def virtual_kubelet(d: Drills, provider: str) -> int:
    def one() -> int | None:
        pids = pids_of(d.clusters, "virtual-kubelet", f"--provider-cluster-id={d.ids[provider]}")
        return pids[0] if len(pids) == 1 else None

    pid: int = eventually(f"the virtual kubelet of {provider}", one, timeout=90)
    return pid


def component(clusters: Clusters, cluster: str, name: str) -> int:
    statuses = {s.name: s for s in asyncio.run(clusters.env.status())}
    pid = next(c.pid for c in statuses[cluster].components if c.name == name)
    assert pid is not None, f"{name} of {cluster} is not running"
    return pid


def gone(pid: int) -> bool:
    # start_time also reaps the launcher's own children.
    if supervise.start_time(pid) is None:
        return True
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:  # reaped by its parent (e.g. the controller's supervisor) since the line above
        return True
    return stat[stat.rindex(")") + 2 :].split()[0] == "Z"  # a zombie: exited, not yet reaped


def stop(pid: int, sig: signal.Signals = signal.SIGKILL, timeout: float = 90) -> None:
    os.kill(pid, sig)
    try:
        eventually(f"process {pid} to exit", lambda: gone(pid), timeout=timeout)
    except AssertionError:
        os.kill(pid, signal.SIGKILL)
        eventually(f"process {pid} to exit", lambda: gone(pid), timeout=30)


def restart_missing(clusters: Clusters) -> None:
    """`gpufed local up` semantics: start what is not running, leave the rest alone."""
    asyncio.run(clusters.env.up())


def node_ready(clusters: Clusters, node: str) -> bool:
    n = clusters.kubectl_json("consumer", "get", "node", node)
    return any(c["type"] == "Ready" and c["status"] == "True" for c in n["status"]["conditions"])


def twin_count(d: Drills, provider: str) -> int:
    p = d.clusters.kubectl(
        provider, "get", "pods", "-n", f"{d.ns}-{d.ids['consumer']}", "-o", "name", check=False, timeout=20
    )
    return len(p.stdout.split()) if p.returncode == 0 else 0


def wave(name: str, namespace: str, replicas: int) -> dict[str, Any]:
    """A Deployment of tiny pods (10m CPU, 16Mi each)."""
    return deployment(name, namespace, replicas)


def jobs_terminal(d: Drills) -> None:
    """Drill 9: the Jobs stay terminal and their pods (and twins) never run again (the ledger checks the twins)."""
    for name, cond in (("done", "Complete"), ("crash", "Failed")):
        job = d.clusters.kubectl_json("consumer", "get", "job", name, "-n", d.ns)
        conds = {c["type"]: c["status"] for c in job["status"].get("conditions") or []}
        assert conds.get(cond) == "True", f"job {name}: {conds}"
        assert not job["status"].get("active"), f"job {name} has active pods again: {job['status']}"
    pods = [p for p in (d.ledger.last or d.ledger.observe()).pods.values() if p.name.startswith(("done-", "crash-"))]
    assert sorted(p.phase for p in pods) == ["Failed", "Succeeded"], pods


def settle(d: Drills, what: str, until: Any = None, timeout: float = 300) -> Snapshot:
    snap = d.ledger.settle(what, timeout=timeout, until=until or (lambda _s: True))
    jobs_terminal(d)
    return snap


def etcd_compact(clusters: Clusters, cluster: str) -> int:
    """Compact (physically) the cluster's etcd at its current revision; returns the revision."""
    base = f"http://127.0.0.1:{clusters.topology.ports(cluster).etcd_client}/v3/kv"

    def post(path: str, body: dict[str, Any]) -> dict[str, Any]:
        req = urllib.request.Request(f"{base}/{path}", data=json.dumps(body).encode(), method="POST")
        with urllib.request.urlopen(req, timeout=30) as resp:
            out: dict[str, Any] = json.loads(resp.read())
            return out

    rev = int(post("range", {"key": "AA==", "limit": 1})["header"]["revision"])
    post("compaction", {"revision": str(rev), "physical": True})
    return rev


def list_rv(clusters: Clusters, context: str, path: str) -> str:
    rv: str = json.loads(clusters.kubectl(context, "get", "--raw", f"{path}?limit=1").stdout)["metadata"][
        "resourceVersion"
    ]
    return rv


def watch_answer(clusters: Clusters, context: str, path: str, rv: str) -> dict[str, Any]:
    """The first event of a watch from `rv` (an ERROR event carries the Status, e.g. 410 Expired)."""
    p = clusters.kubectl(context, "get", "--raw", f"{path}?watch=1&resourceVersion={rv}&timeoutSeconds=3", timeout=30)
    first = p.stdout.splitlines()[0] if p.stdout.strip() else "{}"
    answer: dict[str, Any] = json.loads(first)
    return answer


# ---------------------------------------------------------------------------- drills


def test_kill_virtual_kubelet_during_burst(drills: Drills) -> None:
    d, c = drills, drills.clusters
    old = virtual_kubelet(d, "gpu-a")
    c.create("consumer", wave("burst", d.ns, BURST))
    # Mid-burst: some twins exist at gpu-a, the rest are still to come.
    eventually("the burst to reach gpu-a", lambda: twin_count(d, "gpu-a") >= 20, timeout=180)
    t0 = time.monotonic()
    stop(old, signal.SIGKILL)
    killed_with = twin_count(d, "gpu-a")
    new = virtual_kubelet(d, "gpu-a")
    assert new != old
    restarted = time.monotonic() - t0
    settle(d, f"{BURST} pods after kill -9", running(d.ns, BURST, selector=lambda p: p.name.startswith("burst-")))
    record(
        "vk-kill-9-during-burst",
        time.monotonic() - t0,
        pods=BURST,
        twins_at_kill=killed_with,
        vk_restart_s=round(restarted, 2),
    )


def test_provider_apiserver_gone_for_60s(drills: Drills) -> None:
    d, c = drills, drills.clusters
    node = d.vnode("gpu-b")
    assert node_ready(c, node)
    on_b = d.ledger.uids(d.ns, lambda p: p.node == node and not p.terminal)
    t0 = time.monotonic()
    stop(component(c, "gpu-b", "kube-apiserver"), signal.SIGKILL)  # gone at once
    not_ready_after: float | None = None
    try:
        while (elapsed := time.monotonic() - t0) < OUTAGE_S:
            if not_ready_after is None and not node_ready(c, node):
                not_ready_after = elapsed
            # gpu-b cannot be asked for twins now: judge the consumer's pods alone.
            snap = d.ledger.observe(providers=("gpu-a",))
            lost = [p for p in d.ledger.problems(snap) if p.startswith(("lost", "resurrected"))]
            assert not lost, lost
            time.sleep(2)
    finally:
        t1 = time.monotonic()
        restart_missing(c)  # returns once gpu-b's apiserver is healthy again
    api_back = time.monotonic()
    assert not_ready_after is not None, f"{node} stayed Ready through a {OUTAGE_S:.0f}s outage of its provider"
    assert not_ready_after <= NODE_MONITOR_GRACE_S + 10, not_ready_after
    eventually(f"{node} Ready again", lambda: node_ready(c, node), timeout=180)
    # Statuses flow again: a new pod on gpu-b runs to completion and its phase comes back.
    c.create(
        "consumer",
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "after-outage", "namespace": d.ns},
            "spec": {
                "restartPolicy": "Never",
                "nodeSelector": d.on("gpu-b"),
                "containers": [{"name": "main", "image": "registry.example/app:1"}],
            },
        },
    )
    settle(
        d,
        "gpu-b after its apiserver came back",
        lambda s: any(p.name == "after-outage" and p.phase == "Succeeded" for p in s.pods.values()),
    )
    assert on_b <= set(d.ledger.last.pods if d.ledger.last else {}), "a pod on gpu-b was deleted"
    # Measured from the provider's API answering again (its own start-up is not gpufed's).
    record(
        "provider-apiserver-down-60s",
        time.monotonic() - api_back,
        apiserver_restart_s=round(api_back - t1, 2),
        not_ready_after_s=round(not_ready_after, 2),
        pods_on_provider=len(on_b),
    )


def test_consumer_apiserver_restart_mid_offload(drills: Drills) -> None:
    d, c = drills, drills.clusters
    n = 60
    c.create("consumer", wave("wave", d.ns, n))

    def started() -> bool:
        return len(c.kubectl_json("consumer", "get", "pods", "-n", d.ns, "-l", "app=wave")["items"]) >= 10

    eventually("the wave to start", started, timeout=60)
    t0 = time.monotonic()
    stop(component(c, "consumer", "kube-apiserver"), signal.SIGKILL)
    restart_missing(c)
    api_back = time.monotonic()
    settle(d, "the wave after the consumer apiserver restart", running(d.ns, n, selector=_app("wave")))
    record(
        "consumer-apiserver-restart-mid-offload",
        time.monotonic() - api_back,
        apiserver_restart_s=round(api_back - t0, 2),
        pods=n,
    )


def _app(name: str) -> Any:
    def match(p: PodRecord) -> bool:
        return p.name.startswith(f"{name}-")

    return match


def test_etcd_compaction_forces_relists(drills: Drills) -> None:
    d, c = drills, drills.clusters
    twin_ns = f"{d.ns}-{d.ids['consumer']}"
    watched = {
        "consumer": f"/api/v1/namespaces/{d.ns}/pods",
        "gpu-a": f"/api/v1/namespaces/{twin_ns}/pods",
    }
    vk = virtual_kubelet(d, "gpu-a")
    before = {ctx: list_rv(c, ctx, path) for ctx, path in watched.items()}
    os.kill(vk, signal.SIGSTOP)
    try:
        # Missed while paused: deletions (twins to remove) and new pods (twins to create) on gpu-a.
        victims = [p for p in d.ledger.observe().pods.values() if p.name.startswith("wave-") and not p.deleting]
        victims = [p for p in victims if p.node == d.vnode("gpu-a")][:8] + [
            p for p in victims if p.node == d.vnode("gpu-b")
        ][:4]
        d.ledger.release(p.uid for p in victims)
        c.kubectl("consumer", "delete", "pod", "-n", d.ns, "--wait=false", *(p.name for p in victims))
        c.kubectl("consumer", "scale", "deployment/wave", "-n", d.ns, "--replicas=70")
        revisions = {ctx: etcd_compact(c, ctx) for ctx in watched}
        # The watch caches would still serve the old positions: restart the apiservers (gracefully,
        # so the paused watcher's streams end cleanly and it resumes from its old resourceVersion).
        for ctx in watched:
            stop(component(c, ctx, "kube-apiserver"), signal.SIGTERM)
        restart_missing(c)
        for ctx, path in watched.items():
            answer = watch_answer(c, ctx, path, before[ctx])
            assert (answer.get("object") or {}).get("code") == 410, (ctx, answer)
    finally:
        os.kill(vk, signal.SIGCONT)
    t0 = time.monotonic()
    settle(d, "after compaction", running(d.ns, 70, selector=_app("wave")))
    record("etcd-compaction-relist", time.monotonic() - t0, compacted_at=json.dumps(revisions).replace(" ", ""))


def test_quota_shrinks_below_usage(drills: Drills) -> None:
    d, c = drills, drills.clusters
    tenant = c.kubectl_json("gpu-a", "get", "tenants.gpufed.io", "-A")["items"]
    tenant = [t for t in tenant if t["spec"]["consumerClusterId"] == d.ids["consumer"]]
    assert len(tenant) == 1, tenant
    name = tenant[0]["metadata"]["name"]
    scope = ["-n", tenant[0]["metadata"]["namespace"]] if tenant[0]["metadata"].get("namespace") else []
    node = d.vnode("gpu-a")
    on_a = d.ledger.uids(d.ns, lambda p: p.node == node and not p.terminal)
    assert on_a

    def ceiling(cpu: str | None) -> None:
        patch = {"spec": {"policy": {"maxResources": {"cpu": cpu}}}}
        c.kubectl("gpu-a", "patch", "tenants.gpufed.io", name, *scope, "--type=merge", "-p", json.dumps(patch))

    def cpu_allocatable() -> str:
        alloc: str = c.kubectl_json("consumer", "get", "node", node)["status"]["allocatable"]["cpu"]
        return alloc

    def cpu_held() -> Decimal:
        """CPU the node's pods request, as the scheduler counts it (non-terminal pods bound there)."""
        pods = c.kubectl_json("consumer", "get", "pods", "-A", "--field-selector", f"spec.nodeName={node}")["items"]
        live = [p for p in pods if (p.get("status") or {}).get("phase") not in ("Succeeded", "Failed")]
        return sum((pod_requests(p).get("cpu", Decimal(0)) for p in live), Decimal(0))

    def node_statuses() -> list[str]:
        """The virtual kubelet's last log lines about the node's status (what it wrote, in order)."""
        return vk_log_lines(c, d.ids["gpu-a"], "node status", node)[-6:]

    seen: list[tuple[str, Decimal]] = []

    def no_room() -> bool:
        # The node advertises the grant, less than what already runs there (~1 CPU): nothing is left
        # for one more 10m pod, even while a pod there ends. The first change of allocatable may
        # still be an intermediate figure, so this waits for the settled one.
        alloc, held = cpu_allocatable(), cpu_held()
        seen.append((alloc, held))
        return parse(alloc) < held + Decimal("0.01")

    ceiling("100m")  # far below the ~1 CPU gpu-a's pods request now
    try:
        try:
            eventually("the smaller grant on the virtual node", no_room, timeout=120)
        except AssertionError as e:
            raise AssertionError(f"{e}; (allocatable, held) seen: {sorted(set(seen))[-5:]}") from None
        shrunk = cpu_allocatable()
        pinned = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "over-quota", "namespace": d.ns},
            "spec": {
                "nodeSelector": d.on("gpu-a"),
                "containers": [
                    {
                        "name": "main",
                        "image": "registry.example/app:1",
                        "resources": {"requests": {"cpu": "10m", "memory": "16Mi"}},
                    }
                ],
            },
        }
        c.create("consumer", pinned)
        # Bound past the scheduler (as a controller with nodeName would): the provider's quota says no.
        bound = json.loads(json.dumps(pinned))
        bound["metadata"]["name"] = "over-quota-bound"
        bound["spec"]["nodeName"] = node
        c.create("consumer", bound)

        refusals: list[str] = []

        def refused() -> bool:
            pod = c.kubectl_json("consumer", "get", "pod", "over-quota", "-n", d.ns)
            cond = {x["type"]: x for x in pod["status"].get("conditions") or []}.get("PodScheduled") or {}
            bound_to = pod["spec"].get("nodeName")
            refusals.append(
                f"{cond.get('status')}/{cond.get('reason')}: {cond.get('message')} (bound to {bound_to}, "
                f"{node} advertising {cpu_allocatable()})"
            )
            return cond.get("reason") == "Unschedulable" and "Insufficient cpu" in cond.get("message", "")

        try:
            eventually("the new pod to be Unschedulable for lack of CPU", refused, timeout=120)
        except AssertionError as e:
            looks = refusals[:1] + refusals[-1:]  # the first look and the last
            raise AssertionError(
                f"{e}; its PodScheduled condition: {looks}, node: {cpu_allocatable()}; "
                f"the statuses the virtual kubelet wrote last: {node_statuses()}"
            ) from None

        def quota_refusal() -> str | None:
            pod = c.kubectl_json("consumer", "get", "pod", "over-quota-bound", "-n", d.ns)
            evs = c.kubectl_json(
                "consumer", "get", "events", "-n", d.ns, "--field-selector", "involvedObject.name=over-quota-bound"
            )["items"]
            warned = [e for e in evs if e["type"] == "Warning" and "exceeded quota" in e.get("message", "")]
            if pod["status"].get("reason") == "ProviderFailed" and "exceeded quota" in pod["status"].get("message", ""):
                return warned[0]["reason"] if warned else None
            return None

        reason = eventually("the bound pod's quota refusal", quota_refusal, timeout=120)
        assert reason == "QuotaExceeded", reason
        # Nothing that ran before is touched.
        snap = d.ledger.observe()
        assert all(snap.pods[u].phase == "Running" for u in on_a), "a running pod stopped when the quota shrank"
        assert not [p for p in d.ledger.problems(snap) if p.startswith(("lost", "resurrected", "duplicated"))]
    finally:
        t0 = time.monotonic()
        ceiling(None)
    settle(
        d,
        "after the ceiling was raised",
        lambda s: sum(p.name.startswith("over-quota") and p.phase == "Running" for p in s.pods.values()) == 2,
        timeout=240,
    )
    record("quota-below-usage", time.monotonic() - t0, pods_kept=len(on_a), allocatable_cpu=shrunk)
