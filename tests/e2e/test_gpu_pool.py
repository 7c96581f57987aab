"""The global GPU pool on the real local clusters (default topology: gpu-a 4 x 8 H100; gpu-b 2 x 4
A100 + 4 x 1 L4): pool nodes per GPU product, live allocatable capped at the largest placeable
shape, placement by the consumer's ordinary kube-scheduler, fragmentation, provider load, fail-back,
the capacity estimator's authentication, the GPU node agent's fallback, and a provider going away.

The module peers the consumer with gpu-a (all 32 GPUs) and gpu-b (all 12, no product: two pools).
"""

from __future__ import annotations

import asyncio
import functools
import json
import os
import signal
import time
from collections.abc import Iterator
from typing import Any

import pytest

from gpufed.apis.wire import ClusterID
from gpufed.kube.client import client_from_dict
from gpufed.localenv import manifests, supervise
from gpupool.capacity import PodShape
from gpupool.estimator.client import EstimatorClient, EstimatorError, from_provider
from tests.e2e.conftest import Clusters
from tests.e2e.helpers import H100, consumer_credentials, eventually, gpu_load, gpufed, offload, out, peered_session

pytestmark = pytest.mark.e2e

A100 = "NVIDIA-A100-SXM4-40GB"
L4 = "NVIDIA-L4"
GPU = "nvidia.com/gpu"


@pytest.fixture(scope="module")
def ids(clusters: Clusters) -> Iterator[dict[str, ClusterID]]:
    yield from peered_session(clusters, {"gpu-a": ("--gpus", "32"), "gpu-b": ("--gpus", "12")})


def nodes_of(ids: dict[str, ClusterID]) -> dict[str, str]:
    return {
        "a": f"gpufed-{ids['gpu-a']}",
        "a100": f"gpufed-{ids['gpu-b']}-nvidia-a100-sxm4-40gb",
        "l4": f"gpufed-{ids['gpu-b']}-nvidia-l4",
    }


def allocatable(clusters: Clusters, node: str) -> int:
    n = clusters.kubectl_json("consumer", "get", "node", node)
    return int(n["status"]["allocatable"].get(GPU, "0"))


def gone(pid: int) -> bool:
    return supervise.start_time(pid) is None  # reaps it (the launcher's child) once it exited


def exists(clusters: Clusters, node: str) -> bool:
    return clusters.kubectl("consumer", "get", "node", node, check=False).returncode == 0


def has_allocatable(clusters: Clusters, node: str, gpus: int) -> bool:
    return allocatable(clusters, node) == gpus


def not_ready(clusters: Clusters, node: str) -> bool:
    return not ready(clusters, node)


def ready(clusters: Clusters, node: str) -> bool:
    n = clusters.kubectl_json("consumer", "get", "node", node)
    return any(c["type"] == "Ready" and c["status"] == "True" for c in n["status"]["conditions"])


def pool_json(clusters: Clusters) -> dict[str, Any]:
    p = gpufed("pool", "--kubeconfig", str(clusters.kubeconfig), "--context", "consumer", "-o", "json")
    assert p.returncode == 0, out(p)
    data: dict[str, Any] = json.loads(p.stdout)
    return data


def pool_row(clusters: Clusters, node: str) -> dict[str, Any]:
    rows: dict[str, dict[str, Any]] = {r["node"]: r for r in pool_json(clusters)["pools"]}
    return rows[node]


def job(name: str, namespace: str, gpus: int, *, selector: dict[str, str] | None = None) -> dict[str, Any]:
    return manifests.job(name, namespace, gpus=str(gpus), pod_labels={"job": name}, node_selector=selector)


def job_pod(clusters: Clusters, namespace: str, name: str) -> dict[str, Any]:
    def found() -> dict[str, Any] | None:
        items = clusters.kubectl_json("consumer", "get", "pods", "-n", namespace, "-l", f"job={name}")["items"]
        return items[0] if items and items[0]["spec"].get("nodeName") else None

    pod: dict[str, Any] = eventually(f"a pod of job {name} bound to a node", found)
    return pod


def twins(clusters: Clusters, context: str, ids: dict[str, ClusterID], namespace: str) -> list[dict[str, Any]]:
    p = clusters.kubectl(context, "get", "pods", "-n", f"{namespace}-{ids['consumer']}", "-o", "json", check=False)
    return [] if p.returncode else list(json.loads(p.stdout)["items"])


def load(clusters: Clusters, context: str, namespace: str, node: str, name: str, gpus: int) -> None:
    """A provider-local workload pinned to one provider node."""
    clusters.create(context, gpu_load(name, namespace, node, gpus))


def test_one_virtual_node_per_provider_gpu_product(clusters: Clusters, ids: dict[str, ClusterID]) -> None:
    n = nodes_of(ids)
    for key, product, memory, largest in (("a", H100, "81559", 8), ("a100", A100, "40960", 4), ("l4", L4, "23034", 1)):
        eventually(
            f"node {n[key]}",
            functools.partial(exists, clusters, n[key]),
        )
        labels = clusters.kubectl_json("consumer", "get", "node", n[key])["metadata"]["labels"]
        assert labels["nvidia.com/gpu.product"] == product
        assert labels["nvidia.com/gpu.memory"] == memory
        assert labels["gpufed.io/remote-cluster-id"] == (ids["gpu-a"] if key == "a" else ids["gpu-b"])
        # No more GPUs per pod than one provider node can take.
        eventually(f"{n[key]} allocatable {largest}", functools.partial(has_allocatable, clusters, n[key], largest))
    # gpu-b's whole-provider node does not exist: its GPUs are split by product.
    assert clusters.kubectl("consumer", "get", "node", f"gpufed-{ids['gpu-b']}", check=False).returncode != 0
    rows = {r["node"]: r for r in pool_json(clusters)["pools"]}
    assert (rows[n["a"]]["total"], rows[n["a"]]["granted"], rows[n["a"]]["capacity"]) == (32, 32, "Live")
    assert (rows[n["a100"]]["total"], rows[n["a100"]]["largestPlaceable"]) == (8, 4)
    assert (rows[n["l4"]]["total"], rows[n["l4"]]["free"]) == (4, 4)
    table = gpufed("pool", "--kubeconfig", str(clusters.kubeconfig), "--context", "consumer")
    assert table.returncode == 0 and L4 in table.stdout and "pending GPU demand: 0 GPUs" in out(table), out(table)


def test_jobs_land_on_pools_that_can_run_them(clusters: Clusters, ids: dict[str, ClusterID], namespace: str) -> None:
    n = nodes_of(ids)
    offload(clusters, namespace)
    clusters.create("consumer", job("eight", namespace, 8))
    clusters.create("consumer", job("four", namespace, 4))
    clusters.create("consumer", job("one", namespace, 1))
    clusters.create("consumer", job("inference", namespace, 1, selector={"nvidia.com/gpu.product": L4}))
    for name in ("eight", "four", "one", "inference"):
        clusters.kubectl(
            "consumer", "wait", "-n", namespace, "--for=condition=Complete", f"job/{name}", "--timeout=90s", timeout=100
        )
    placed = {
        name: job_pod(clusters, namespace, name)["spec"]["nodeName"] for name in ("eight", "four", "one", "inference")
    }
    assert placed["eight"] == n["a"]  # never gpu-b: none of its nodes has 8 GPUs
    assert placed["four"] in (n["a"], n["a100"])
    assert placed["inference"] == n["l4"]
    # The L4 job's twin ran on an L4 node of gpu-b.
    remote = {t["metadata"]["name"]: t for t in twins(clusters, "gpu-b", ids, namespace)}
    l4_twin = next(t for name, t in remote.items() if name.startswith("inference-"))
    assert l4_twin["spec"]["nodeName"].startswith("gpu-b-l4-")
    assert l4_twin["spec"]["nodeSelector"]["nvidia.com/gpu.product"] == L4


def test_fragmented_provider_is_never_chosen_for_a_pod_it_cannot_place(
    clusters: Clusters, ids: dict[str, ClusterID], namespace: str
) -> None:
    n = nodes_of(ids)
    offload(clusters, namespace)
    started = time.monotonic()
    for i in range(4):  # gpu-a's own users take 6 GPUs on every node: 8 free in total, 2 per node
        load(clusters, "gpu-a", namespace, f"gpu-a-h100-{i}", f"load-{i}", 6)
    eventually("gpu-a's pool node to offer 2 GPUs per pod", lambda: allocatable(clusters, n["a"]) == 2, timeout=30)
    print(f"allocatable followed the provider's load in {time.monotonic() - started:.1f}s")
    row = pool_row(clusters, n["a"])
    assert (row["free"], row["largestPlaceable"], row["inUse"]) == (8, 2, 0), row

    # Any product: the scheduler can only choose gpu-b's A100 pool.
    clusters.create("consumer", job("four", namespace, 4))
    clusters.kubectl(
        "consumer", "wait", "-n", namespace, "--for=condition=Complete", "job/four", "--timeout=90s", timeout=100
    )
    assert job_pod(clusters, namespace, "four")["spec"]["nodeName"] == n["a100"]
    # H100 only: it waits here, Pending with the scheduler's reason — not remotely, holding quota.
    clusters.create("consumer", job("h100", namespace, 4, selector={"nvidia.com/gpu.product": H100}))

    def unschedulable() -> dict[str, Any] | None:
        items = clusters.kubectl_json("consumer", "get", "pods", "-n", namespace, "-l", "job=h100")["items"]
        cond = (
            next((c for c in (items[0]["status"].get("conditions") or []) if c["type"] == "PodScheduled"), None)
            if items
            else None
        )
        return cond if cond and cond.get("reason") == "Unschedulable" else None

    cond = eventually("the H100 job to be unschedulable here", unschedulable)
    assert "Insufficient nvidia.com/gpu" in cond["message"], cond
    assert not [t for t in twins(clusters, "gpu-a", ids, namespace) if t["metadata"]["name"].startswith("h100-")]
    assert pool_json(clusters)["pending"]["gpus"] >= 4
    # The provider's load goes: the job runs there.
    for i in range(4):
        clusters.kubectl("gpu-a", "delete", "pod", "-n", namespace, f"load-{i}", "--wait=false")
    clusters.kubectl(
        "consumer", "wait", "-n", namespace, "--for=condition=Complete", "job/h100", "--timeout=90s", timeout=100
    )
    assert job_pod(clusters, namespace, "h100")["spec"]["nodeName"] == n["a"]


def test_pod_no_provider_node_can_take_is_failed_back(
    clusters: Clusters, ids: dict[str, ClusterID], namespace: str
) -> None:
    n = nodes_of(ids)
    offload(clusters, namespace)
    # Bound directly (a user's nodeName bypasses the scheduler's fit check): no A100 node has 8 GPUs.
    clusters.create(
        "consumer",
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "too-big", "namespace": namespace},
            "spec": {
                "nodeName": n["a100"],
                "tolerations": [{"key": "gpufed.io/virtual-node", "operator": "Exists", "effect": "NoExecute"}],
                "containers": [{"name": "main", "image": "x", "resources": {"limits": {GPU: "8"}}}],
            },
        },
    )

    def failed() -> dict[str, Any] | None:
        pod: dict[str, Any] = clusters.kubectl_json("consumer", "get", "pod", "too-big", "-n", namespace)
        return pod if pod["status"].get("phase") == "Failed" else None

    def waiting() -> bool:
        pod: dict[str, Any] = clusters.kubectl_json("consumer", "get", "pod", "too-big", "-n", namespace)
        return "waiting for 8 GPUs" in (pod["status"].get("message") or "") or pod["status"].get("phase") == "Failed"

    eventually("the pod to wait for GPUs (locally, no twin)", waiting)
    assert twins(clusters, "gpu-b", ids, namespace) == []
    pod = eventually("the pod to be failed back after the grace period", failed, timeout=90)
    assert pod["status"]["reason"] == "GPUUnplaceable"
    assert "8 GPUs" in pod["status"]["message"] and "largest" in pod["status"]["message"], pod["status"]["message"]
    assert any(c["type"] == "DisruptionTarget" and c["status"] == "True" for c in pod["status"]["conditions"])
    events = clusters.kubectl_json("consumer", "get", "events", "-n", namespace)["items"]
    assert any(e["reason"] == "GPUUnplaceable" and e["type"] == "Warning" for e in events)
    assert twins(clusters, "gpu-b", ids, namespace) == []  # nothing holds gpu-b's quota


def test_estimator_answers_peered_consumers_only(clusters: Clusters, ids: dict[str, ClusterID]) -> None:
    cfg = consumer_credentials(clusters, ids["gpu-a"])

    async def ask() -> tuple[bool, int, str]:
        remote = await client_from_dict(cfg)
        try:
            client = await from_provider(remote, cfg)
            assert client is not None, "gpu-a publishes no estimator endpoint"
            try:
                fits = await client.can_place(PodShape(gpus=8, gpu_product=H100))
                replicas, _ = await client.max_replicas(PodShape(gpus=2, gpu_product=H100))
                too_big = await client.can_place(PodShape(gpus=16))
            finally:
                await client.close()
            assert not too_big.placeable
            return fits.placeable, replicas, too_big.reason
        finally:
            await remote.close()

    placeable, replicas, reason = asyncio.run(ask())
    assert placeable and replicas == 16
    assert "16" in reason

    # gpu-a's admin holds a valid certificate of gpu-a's client CA but is no consumer: refused.
    pki = clusters.env.pki("gpu-a")
    cm = clusters.kubectl_json("gpu-a", "get", "configmap", "-n", "gpufed", "gpufed-estimator")

    async def as_admin() -> str:
        client = EstimatorClient(
            cm["data"]["endpoint"],
            cm["data"]["ca.crt"].encode(),
            pki.cert("admin").read_bytes(),
            pki.key("admin").read_bytes(),
        )
        try:
            await client.get_capacity()
        except EstimatorError as e:
            return str(e)
        finally:
            await client.close()
        return "answered"

    refused = asyncio.run(as_admin())
    assert "is not a gpufed consumer" in refused, refused


def test_gpu_agent_without_nvml_falls_back_to_labels(clusters: Clusters, ids: dict[str, ClusterID]) -> None:
    kc = str(clusters.env.kubeconfig_path("gpu-b"))
    p = gpufed("gpu-agent", "--kubeconfig", kc, "--node", "gpu-b-l4-0", "--once")
    assert p.returncode == 0, out(p)
    node = clusters.kubectl_json("gpu-b", "get", "node", "gpu-b-l4-0")
    ann = node["metadata"]["annotations"]
    assert ann["gpufed.io/gpu-source"] == "labels"
    assert "NVML" in ann["gpufed.io/gpu-source-reason"], ann
    assert node["metadata"]["labels"]["nvidia.com/gpu.product"] == L4  # device-plugin labels kept
    # The estimator still counts the node.
    eventually("gpu-b's L4 pool to keep 4 GPUs", lambda: pool_row(clusters, nodes_of(ids)["l4"])["total"] == 4)


def test_provider_going_away_makes_its_nodes_not_ready_and_pods_go_elsewhere(
    clusters: Clusters, ids: dict[str, ClusterID], namespace: str
) -> None:
    n = nodes_of(ids)
    offload(clusters, namespace)
    statuses = {s.name: s for s in asyncio.run(clusters.env.status())}
    apiserver = next(c for c in statuses["gpu-b"].components if c.name == "kube-apiserver")
    assert apiserver.pid is not None
    try:
        os.kill(apiserver.pid, signal.SIGKILL)  # gone at once (a graceful stop drains for a while)
        eventually("gpu-b's apiserver to be gone", functools.partial(gone, apiserver.pid))
        for key in ("a100", "l4"):
            eventually(f"{n[key]} NotReady", functools.partial(not_ready, clusters, n[key]), timeout=60)
        clusters.create("consumer", job("one", namespace, 1))
        clusters.kubectl(
            "consumer", "wait", "-n", namespace, "--for=condition=Complete", "job/one", "--timeout=90s", timeout=100
        )
        assert job_pod(clusters, namespace, "one")["spec"]["nodeName"] == n["a"]
    finally:
        asyncio.run(clusters.env.up())
    for key in ("a100", "l4"):
        eventually(f"{n[key]} Ready again", functools.partial(ready, clusters, n[key]), timeout=60)
