"""Pod offloading on the real local clusters: a user's plain `kubectl create` in an offloaded
namespace lands on a virtual node through the consumer's real kube-scheduler and runs as a twin in
the twin namespace of a provider (kwok runs the twin's containers there).

The module peers the consumer with gpu-a (8 H100) and gpu-b (4 A100) for its duration; each test
offloads its own fresh namespace with `gpufed offload-namespace`, as a user would.
"""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpufed.apis.wire import ClusterID
from gpufed.localenv import manifests, nodeaddr
from tests.e2e.conftest import Clusters
from tests.e2e.helpers import deployment, eventually, offload, peered_session

pytestmark = pytest.mark.e2e

A100 = "NVIDIA-A100-SXM4-40GB"
SMALL = {"cpu": "10m", "memory": "16Mi"}
TOLERATION = {"key": "gpufed.io/virtual-node", "operator": "Exists", "effect": "NoExecute"}


@pytest.fixture(scope="module")
def ids(clusters: Clusters) -> Iterator[dict[str, ClusterID]]:
    yield from peered_session(clusters, {"gpu-a": ("--gpus", "8"), "gpu-b": ("--gpus", "4", "--gpu-product", A100)})


def vnode(ids: dict[str, ClusterID], provider: str) -> str:
    return f"gpufed-{ids[provider]}"


def twin_ns(ids: dict[str, ClusterID], namespace: str) -> str:
    return f"{namespace}-{ids['consumer']}"


def pods(clusters: Clusters, context: str, namespace: str, *selector: str) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = clusters.kubectl_json(context, "get", "pods", "-n", namespace, *selector)["items"]
    return items


def twins(clusters: Clusters, ids: dict[str, ClusterID], namespace: str) -> dict[str, list[dict[str, Any]]]:
    """Remote twins per provider context (a twin namespace that does not exist has none)."""
    found: dict[str, list[dict[str, Any]]] = {}
    for provider in ("gpu-a", "gpu-b"):
        p = clusters.kubectl(provider, "get", "pods", "-n", twin_ns(ids, namespace), "-o", "json", check=False)
        found[provider] = [] if p.returncode else json.loads(p.stdout)["items"]
    return found


def wait_ready(clusters: Clusters, namespace: str, count: int, selector: str) -> list[dict[str, Any]]:
    def ready() -> list[dict[str, Any]] | None:
        items = pods(clusters, "consumer", namespace, "-l", selector)
        running = [
            p for p in items if p["status"].get("phase") == "Running" and not p["metadata"].get("deletionTimestamp")
        ]
        return items if len(items) == count and len(running) == count else None

    result: list[dict[str, Any]] = eventually(f"{count} running pods ({selector})", ready, timeout=90)
    return result


# ---------------------------------------------------------------------------- the main story


def test_gpu_job_runs_on_a_provider_through_the_real_scheduler(
    clusters: Clusters, ids: dict[str, ClusterID], namespace: str
) -> None:
    offload(clusters, namespace)
    clusters.create("consumer", manifests.job("train", namespace, gpus="2", completions=3, parallelism=3))
    clusters.kubectl(
        "consumer", "wait", "-n", namespace, "--for=condition=Complete", "job/train", "--timeout=90s", timeout=100
    )
    local = pods(clusters, "consumer", namespace, "-l", "job-name=train")
    assert len(local) == 3
    virtual = {vnode(ids, "gpu-a"): "gpu-a", vnode(ids, "gpu-b"): "gpu-b"}
    remote = twins(clusters, ids, namespace)
    for p in local:
        node = p["spec"]["nodeName"]
        assert node in virtual, f"{p['metadata']['name']} ran on {node}, not on a virtual node"
        assert p["status"]["phase"] == "Succeeded"
        # The twin on that provider was created for exactly this pod and ran on a real GPU node there.
        mine = [t for t in remote[virtual[node]] if t["metadata"]["name"] == p["metadata"]["name"]]
        assert len(mine) == 1, remote
        t = mine[0]
        assert t["metadata"]["labels"]["gpufed.io/origin-uid"] == p["metadata"]["uid"]
        assert t["metadata"]["labels"]["gpufed.io/origin-cluster-id"] == ids["consumer"]
        assert t["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == "2"
        assert t["status"]["phase"] == "Succeeded"
        assert t["spec"]["nodeName"].startswith(virtual[node])
    wide = clusters.kubectl("consumer", "get", "pods", "-n", namespace, "-o", "wide").stdout
    assert any(v in wide for v in virtual), wide
    # The user sees the scheduler's decision as usual.
    events = clusters.kubectl_json("consumer", "get", "events", "-n", namespace)["items"]
    assert any(e["reason"] == "Scheduled" and "gpufed-" in e["message"] for e in events)


def test_deployment_scale_and_namespace_deletion(clusters: Clusters, ids: dict[str, ClusterID], namespace: str) -> None:
    offload(
        clusters, namespace, "--pod-strategy", "Remote", "--selector", f"gpufed.io/remote-cluster-id={ids['gpu-a']}"
    )
    clusters.create("consumer", deployment("web", namespace, 0))

    def remote_names() -> set[str]:
        return {
            t["metadata"]["name"]
            for t in twins(clusters, ids, namespace)["gpu-a"]
            if not t["metadata"].get("deletionTimestamp")
        }

    for replicas in (5, 2):
        clusters.kubectl("consumer", "scale", "deployment/web", "-n", namespace, f"--replicas={replicas}")
        local = wait_ready(clusters, namespace, replicas, "app=web")
        names = {p["metadata"]["name"] for p in local}
        assert all(p["spec"]["nodeName"] == vnode(ids, "gpu-a") for p in local)

        def matching(n: set[str] = names) -> bool:
            return remote_names() == n

        eventually(f"{replicas} twins matching the local pods", matching)
    # An Event about a twin on the provider (as its kubelet would record) shows up on the local pod.
    twin = next(t for t in twins(clusters, ids, namespace)["gpu-a"] if not t["metadata"].get("deletionTimestamp"))
    clusters.create(
        "gpu-a",
        {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"name": "pulled-1", "namespace": twin_ns(ids, namespace)},
            "involvedObject": {
                "apiVersion": "v1",
                "kind": "Pod",
                "name": twin["metadata"]["name"],
                "namespace": twin_ns(ids, namespace),
                "uid": twin["metadata"]["uid"],
            },
            "type": "Normal",
            "reason": "Pulled",
            "message": 'Successfully pulled image "nginx:1.27"',
            "source": {"component": "kubelet"},
        },
    )

    def mirrored() -> bool:
        evs = clusters.kubectl_json("consumer", "get", "events", "-n", namespace)["items"]
        return any(
            e["reason"] == "Pulled"
            and e["involvedObject"]["name"] == twin["metadata"]["name"]
            and e["involvedObject"].get("uid") == twin["metadata"]["labels"]["gpufed.io/origin-uid"]
            and f"(on {ids['gpu-a']})" in e["message"]
            for e in evs
        )

    eventually("the provider's event mirrored onto the local pod", mirrored)
    # Deleting the namespace removes its twins and the twin namespace on the provider.
    clusters.kubectl("consumer", "delete", "namespace", namespace, "--wait=false")

    def twin_namespace_gone() -> bool:
        p = clusters.kubectl("gpu-a", "get", "namespace", twin_ns(ids, namespace), check=False)
        return p.returncode != 0 and "NotFound" in p.stderr

    eventually("the twin namespace removed", twin_namespace_gone, timeout=90)


def test_cluster_selector_and_local_strategy(clusters: Clusters, ids: dict[str, ClusterID], namespace: str) -> None:
    offload(clusters, namespace, "--selector", f"nvidia.com/gpu.product={A100}")
    clusters.create(
        "consumer",
        deployment(
            "a100",
            namespace,
            2,
            containers=[{"name": "main", "image": "cuda:12", "resources": {"limits": {"nvidia.com/gpu": "1"}}}],
        ),
    )
    local = wait_ready(clusters, namespace, 2, "app=a100")
    assert {p["spec"]["nodeName"] for p in local} == {vnode(ids, "gpu-b")}
    assert len(twins(clusters, ids, namespace)["gpu-b"]) == 2
    p = clusters.kubectl("gpu-a", "get", "namespace", twin_ns(ids, namespace), check=False)
    assert p.returncode != 0, "gpu-a does not match the selector and must get no twin namespace"

    # Local: pods stay on the consumer's own nodes even though virtual nodes have room.
    offload(clusters, namespace, "--pod-strategy", "Local")
    clusters.create("consumer", deployment("home", namespace, 3))
    local = wait_ready(clusters, namespace, 3, "app=home")
    assert all(p["spec"]["nodeName"].startswith("consumer-") for p in local), [p["spec"]["nodeName"] for p in local]


def test_missing_configmap_is_reported_and_the_pod_starts_once_it_exists(
    clusters: Clusters, ids: dict[str, ClusterID], namespace: str
) -> None:
    offload(
        clusters, namespace, "--pod-strategy", "Remote", "--selector", f"gpufed.io/remote-cluster-id={ids['gpu-a']}"
    )
    clusters.create(
        "consumer",
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "needs-cm", "namespace": namespace},
            "spec": {
                "containers": [
                    {
                        "name": "main",
                        "image": "x",
                        "envFrom": [{"configMapRef": {"name": "settings"}}],
                        "volumeMounts": [{"name": "creds", "mountPath": "/creds"}],
                    }
                ],
                "volumes": [{"name": "creds", "secret": {"secretName": "creds"}}],
            },
        },
    )

    def warned() -> bool:
        evs = clusters.kubectl_json("consumer", "get", "events", "-n", namespace)["items"]
        return any(
            e["type"] == "Warning"
            and e["involvedObject"]["name"] == "needs-cm"
            and e["reason"] in ("MandatoryConfigMapNotFound", "MandatorySecretNotFound")
            and "not found in namespace" in e["message"]
            for e in evs
        )

    eventually("a Warning Event about the missing references", warned)
    pod = clusters.kubectl_json("consumer", "get", "pod", "needs-cm", "-n", namespace)
    assert pod["status"]["phase"] == "Pending"
    assert pod["status"].get("reason") == "ProviderFailed"
    clusters.kubectl("consumer", "create", "configmap", "settings", "-n", namespace, "--from-literal=mode=fast")
    clusters.kubectl("consumer", "create", "secret", "generic", "creds", "-n", namespace, "--from-literal=k=v")
    clusters.kubectl(
        "consumer", "wait", "-n", namespace, "--for=condition=Ready", "pod/needs-cm", "--timeout=90s", timeout=100
    )
    pod = clusters.kubectl_json("consumer", "get", "pod", "needs-cm", "-n", namespace)
    assert pod["status"].get("reason") in (None, ""), pod["status"]
    # The references were copied into the twin namespace, marked as gpufed's.
    cm = clusters.kubectl_json("gpu-a", "get", "configmap", "settings", "-n", twin_ns(ids, namespace))
    assert cm["data"] == {"mode": "fast"}
    assert cm["metadata"]["labels"]["gpufed.io/origin-cluster-id"] == ids["consumer"]
    secret = clusters.kubectl_json("gpu-a", "get", "secret", "creds", "-n", twin_ns(ids, namespace))
    assert secret["metadata"]["labels"]["gpufed.io/origin-uid"]


def test_quota_refusal_is_provider_failed_with_the_quota_message(
    clusters: Clusters, ids: dict[str, ClusterID], namespace: str
) -> None:
    offload(
        clusters, namespace, "--pod-strategy", "Remote", "--selector", f"gpufed.io/remote-cluster-id={ids['gpu-a']}"
    )
    # Bound directly (as a scheduler bug or a user with nodeName would): 20 CPUs exceed the 16
    # granted, though a provider node could take them (a GPU pod no node can take is failed back
    # before it reaches the quota: test_gpu_pool).
    clusters.create(
        "consumer",
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "greedy", "namespace": namespace},
            "spec": {
                "nodeName": vnode(ids, "gpu-a"),
                "tolerations": [TOLERATION],
                "containers": [{"name": "main", "image": "x", "resources": {"limits": {"cpu": "20", "memory": "1Gi"}}}],
            },
        },
    )

    def refused() -> dict[str, Any] | None:
        pod: dict[str, Any] = clusters.kubectl_json("consumer", "get", "pod", "greedy", "-n", namespace)
        return pod if pod["status"].get("reason") == "ProviderFailed" else None

    pod = eventually("status.reason ProviderFailed", refused)
    assert "exceeded quota" in pod["status"]["message"] and "cpu=20" in pod["status"]["message"]
    evs = clusters.kubectl_json("consumer", "get", "events", "-n", namespace)["items"]
    assert any(e["type"] == "Warning" and e["reason"] == "QuotaExceeded" for e in evs)
    assert twins(clusters, ids, namespace)["gpu-a"] == []
    # Deleting a pod that never ran elsewhere completes at once.
    clusters.kubectl("consumer", "delete", "pod", "greedy", "-n", namespace, "--timeout=30s", timeout=40)


def test_the_virtual_node_follows_the_node_contract(clusters: Clusters, ids: dict[str, ClusterID]) -> None:
    name = vnode(ids, "gpu-a")
    node = clusters.kubectl_json("consumer", "get", "node", name)
    labels = node["metadata"]["labels"]
    assert labels["type"] == "virtual-kubelet" and labels["gpufed.io/type"] == "virtual-node"
    assert labels["kubernetes.io/role"] == "agent"
    assert labels["gpufed.io/remote-cluster-id"] == ids["gpu-a"]
    assert labels["nvidia.com/gpu.product"] == "NVIDIA-H100-80GB-HBM3"
    assert {"key": "gpufed.io/virtual-node", "value": "true", "effect": "NoExecute"} in node["spec"]["taints"]
    assert node["status"]["capacity"]["nvidia.com/gpu"] == "8"
    assert node["status"]["allocatable"]["nvidia.com/gpu"] == "8"
    conds = {c["type"]: c["status"] for c in node["status"]["conditions"]}
    assert conds == {
        "Ready": "True",
        "MemoryPressure": "False",
        "DiskPressure": "False",
        "PIDPressure": "False",
        "NetworkUnavailable": "False",
    }
    port = node["status"]["daemonEndpoints"]["kubeletEndpoint"]["Port"]
    assert (
        port in range(*clusters.topology.ports("consumer").kubelet_ports)
        or port == clusters.topology.ports("consumer").kubelet_ports[1]
    )
    # An address the API server may proxy to, on this machine (gpufed.localenv.nodeaddr).
    assert {"type": "InternalIP", "address": clusters.env.node_address()} in node["status"]["addresses"]
    assert nodeaddr.proxyable(clusters.env.node_address())
    owner = node["metadata"]["ownerReferences"][0]
    assert (owner["kind"], owner["name"]) == ("ForeignCluster", ids["gpu-a"])
    lease = clusters.kubectl_json("consumer", "get", "lease", "-n", "kube-node-lease", name)
    assert lease["spec"]["leaseDurationSeconds"] == 40 and lease["spec"]["holderIdentity"] == name
    renewed = lease["spec"]["renewTime"]
    eventually(
        "the lease renewed",
        lambda: (
            clusters.kubectl_json("consumer", "get", "lease", "-n", "kube-node-lease", name)["spec"]["renewTime"]
            != renewed
        ),
        timeout=30,
    )
    # Someone deletes the Node: it is registered again.
    uid = node["metadata"]["uid"]
    clusters.kubectl("consumer", "delete", "node", name)

    def back() -> bool:
        p = clusters.kubectl("consumer", "get", "node", name, "-o", "jsonpath={.metadata.uid}", check=False)
        return p.returncode == 0 and p.stdout not in ("", uid)

    eventually("the virtual node registered again", back, timeout=30)


# ---------------------------------------------------------------------------- crash survival


def _vk_pid(provider_id: str) -> int:
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"virtual-kubelet" in cmdline and f"--provider-cluster-id={provider_id}".encode() in cmdline:
            return int(entry.name)
    raise AssertionError(f"no virtual kubelet process for {provider_id}")


def test_kill_9_during_a_50_pod_burst_loses_and_duplicates_nothing(
    clusters: Clusters, ids: dict[str, ClusterID], namespace: str
) -> None:
    offload(
        clusters, namespace, "--pod-strategy", "Remote", "--selector", f"gpufed.io/remote-cluster-id={ids['gpu-a']}"
    )
    clusters.create(
        "consumer", manifests.job("burst", namespace, image="x", requests=SMALL, completions=50, parallelism=50)
    )
    # Kill the virtual kubelet while the burst is being offloaded: some twins exist, some do not.
    eventually("first twins created", lambda: len(twins(clusters, ids, namespace)["gpu-a"]) >= 5, timeout=60)
    before = _vk_pid(ids["gpu-a"])
    os.kill(before, signal.SIGKILL)
    started = time.monotonic()
    eventually("the supervisor restarting the virtual kubelet", lambda: _pid_changed(ids["gpu-a"], before), timeout=30)
    clusters.kubectl(
        "consumer", "wait", "-n", namespace, "--for=condition=Complete", "job/burst", "--timeout=120s", timeout=130
    )
    print(f"recovered and completed {time.monotonic() - started:.1f}s after kill -9")
    job = clusters.kubectl_json("consumer", "get", "job", "burst", "-n", namespace)
    assert job["status"].get("succeeded") == 50 and not job["status"].get("failed"), job["status"]
    local = pods(clusters, "consumer", namespace, "-l", "job-name=burst")
    remote = twins(clusters, ids, namespace)["gpu-a"]
    # Exactly one twin per local pod, none without one, and all terminal on both sides.
    assert sorted(p["metadata"]["uid"] for p in local) == sorted(
        t["metadata"]["labels"]["gpufed.io/origin-uid"] for t in remote
    )
    assert len(local) == 50
    assert all(p["status"]["phase"] == "Succeeded" for p in local)
    assert all(t["status"]["phase"] == "Succeeded" for t in remote)
    # Completed pods stay completed: another restart resurrects nothing.
    os.kill(_vk_pid(ids["gpu-a"]), signal.SIGKILL)
    eventually("restarted again", lambda: _pid_changed(ids["gpu-a"], before), timeout=30)
    time.sleep(5)
    assert all(
        p["status"]["phase"] == "Succeeded" for p in pods(clusters, "consumer", namespace, "-l", "job-name=burst")
    )
    assert len(twins(clusters, ids, namespace)["gpu-a"]) == 50


def _pid_changed(provider_id: str, old: int) -> bool:
    try:
        return _vk_pid(provider_id) != old
    except AssertionError:
        return False


def _synced_since(clusters: Clusters, provider_id: str) -> bool:
    """The restarted virtual kubelet logged that its pod controller finished the startup reconciliation."""
    log = clusters.env.log_path("consumer", f"virtual-kubelet-{provider_id}")
    lines = log.read_text(errors="replace").splitlines()
    # The log is appended to by every incarnation; look after the last "starting" line.
    starts = [i for i, line in enumerate(lines) if "virtual kubelet starting" in line]
    return bool(starts) and any("pod controller synced" in line for line in lines[starts[-1] :])
