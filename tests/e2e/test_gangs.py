"""Groups of pods placed whole, on the real local clusters (gpu-a 4 x 8 H100; gpu-b 2 x 4 A100 + 4 x 1
L4): the offloading webhook gates a group's pods, the consumer's gang controller releases them onto one
pool (one provider, one GPU product) once one holds them all, a group no pool holds waits with its
reason (the pool's free GPUs held back for it from a later pod) and starts when capacity frees, its
twins wait gated at the provider until it holds them all and then start together, a group larger
than any grant is refused at once, a bad group declaration is refused at creation, and a JobSet
(upstream's controller runs in the consumer) lands whole like a Job.

The module peers the consumer with gpu-a (all 32 GPUs) and gpu-b (all 12: two pools).
"""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Iterator
from typing import Any

import pytest

from gpufed.apis.wire import (
    GANG_GATE,
    GANG_GROUP_ANNOTATION,
    GANG_LABEL,
    GANG_RESERVE_ANNOTATION,
    GANG_SIZE_ANNOTATION,
    JOBSET_API_VERSION,
    JOBSET_NAME_LABEL,
    TWIN_GROUP_GATE,
    UNPLACED_TIMEOUT_ANNOTATION,
    ClusterID,
)
from gpufed.localenv import manifests
from gpufed.localenv.kwokcfg import RUN_DURATION_ANNOTATION
from gpupool.capacity import PodShape
from tests.e2e.conftest import Clusters
from tests.e2e.helpers import H100, estimator_max_replicas, eventually, gpu_load, offload, peered_session, processes

pytestmark = pytest.mark.e2e

GPU = "nvidia.com/gpu"


@pytest.fixture(scope="module")
def ids(clusters: Clusters) -> Iterator[dict[str, ClusterID]]:
    yield from peered_session(clusters, {"gpu-a": ("--gpus", "32"), "gpu-b": ("--gpus", "12")})


def group_job(name: str, namespace: str, pods: int, gpus: int) -> dict[str, Any]:
    job = manifests.job(name, namespace, gpus=str(gpus), completions=pods, parallelism=pods, pod_labels={"job": name})
    job["spec"]["completionMode"] = "Indexed"
    return job


def job_pods(clusters: Clusters, namespace: str, name: str, selector: str = "job") -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = clusters.kubectl_json(
        "consumer", "get", "pods", "-n", namespace, "-l", f"{selector}={name}"
    )["items"]
    return items


def bound(clusters: Clusters, namespace: str, name: str, count: int, selector: str = "job") -> dict[str, str] | None:
    """pod -> node once `count` pods of the job (`selector`: the label naming it) are bound."""
    placed = {p["metadata"]["name"]: p["spec"].get("nodeName") for p in job_pods(clusters, namespace, name, selector)}
    nodes = {k: v for k, v in placed.items() if v}
    return nodes if len(nodes) >= count else None


def gated(pod: dict[str, Any]) -> bool:
    return any(g["name"] == GANG_GATE for g in pod["spec"].get("schedulingGates") or [])


def condition(pod: dict[str, Any]) -> dict[str, Any] | None:
    return next(
        (c for c in (pod.get("status") or {}).get("conditions") or [] if c["type"] == "gpufed.io/GangPlaced"), None
    )


def test_a_four_by_two_gpu_job_lands_whole_on_one_pool(
    clusters: Clusters, ids: dict[str, ClusterID], namespace: str
) -> None:
    offload(clusters, namespace)
    clusters.create("consumer", group_job("ring", namespace, 4, 2))
    placed = eventually("the 4 pods bound", lambda: bound(clusters, namespace, "ring", 4), timeout=90)
    assert len(set(placed.values())) == 1, f"the group was split: {placed}"
    (node,) = set(placed.values())
    assert node.startswith("gpufed-"), node
    pods = job_pods(clusters, namespace, "ring")
    assert all(p["metadata"]["labels"].get(GANG_LABEL) for p in pods), "the webhook did not mark the group"
    assert all(p["metadata"]["annotations"].get("gpufed.io/gang-node") == node for p in pods)
    clusters.kubectl(
        "consumer", "wait", "-n", namespace, "--for=condition=Complete", "job/ring", "--timeout=120s", timeout=130
    )


def test_an_eight_gpu_group_goes_to_the_provider_that_can_hold_it(
    clusters: Clusters, ids: dict[str, ClusterID], namespace: str
) -> None:
    offload(clusters, namespace)
    clusters.create("consumer", group_job("big", namespace, 3, 8))
    placed = eventually("the 3 pods bound", lambda: bound(clusters, namespace, "big", 3), timeout=90)
    assert set(placed.values()) == {f"gpufed-{ids['gpu-a']}"}, placed


def test_a_group_no_pool_holds_waits_with_its_reason_then_starts(
    clusters: Clusters, ids: dict[str, ClusterID], namespace: str
) -> None:
    offload(clusters, namespace)
    # gpu-a's own workloads take three of its four 8-GPU nodes; gpu-b has no node with 8 GPUs
    load_ns = f"load-{namespace}"[:63]
    clusters.kubectl("gpu-a", "create", "namespace", load_ns)
    try:
        for i in range(3):
            clusters.create("gpu-a", gpu_load(f"load-{i}", load_ns, f"gpu-a-h100-{i}", 8))
        # the pool's figures follow the provider's load (the estimator, then the virtual kubelet):
        # the group is created once they show it, so it is judged on what the provider holds now
        pool_node = f"gpufed-{ids['gpu-a']}"

        def loaded() -> bool:
            node = clusters.kubectl_json("consumer", "get", "node", pool_node)
            figures = json.loads(node["metadata"]["annotations"].get("gpufed.io/gpu-pool") or "{}")
            return bool(figures.get("free_nodes") == [[8, 1]])

        eventually("gpu-a's pool figures showing its load", loaded, timeout=60)
        clusters.create("consumer", group_job("wait", namespace, 2, 8))

        def waiting() -> dict[str, Any] | None:
            pods = job_pods(clusters, namespace, "wait")
            if len(pods) < 2 or not all(gated(p) for p in pods):
                return None
            return condition(pods[0])

        cond = eventually("the group waiting with its reason", waiting, timeout=90)
        assert cond["reason"] == "Waiting" and "2 pods (8 GPUs each, 16 in all)" in cond["message"], cond
        events = clusters.kubectl_json(
            "consumer", "get", "events", "-n", namespace, "--field-selector", "involvedObject.name=wait"
        )["items"]
        assert any(e["reason"] == "GangWaiting" for e in events), events

        # The group waits longest: gpu-a's free node is held back for it. A single 8-GPU pod that
        # comes later is not bound there (it would take the node, and the group would wait on).
        def reserved() -> dict[str, Any] | None:
            pods = job_pods(clusters, namespace, "wait")
            marks = {p["metadata"].get("annotations", {}).get(GANG_RESERVE_ANNOTATION) for p in pods}
            node = clusters.kubectl_json("consumer", "get", "node", pool_node)
            figures = json.loads(node["metadata"]["annotations"].get("gpufed.io/gpu-pool") or "{}")
            held = marks == {pool_node} and figures.get("reserved") == 16
            return {"allocatable": node["status"]["allocatable"].get(GPU), **figures} if held else None

        figures = eventually("the free node held back for the group", reserved, timeout=60)
        # nothing beyond what its pods hold, though the figures still show the free node
        assert int(figures["allocatable"]) == figures["in_use"] and figures["free_nodes"] == [[8, 1]], figures
        assert "16 GPUs on" in (condition(job_pods(clusters, namespace, "wait")[0]) or {}).get("message", "")
        single = manifests.job(
            "single", namespace, gpus="8", completions=1, parallelism=1, pod_labels={"job": "single"}
        )
        clusters.create("consumer", single)

        def refused() -> str | None:
            pods = job_pods(clusters, namespace, "single")
            if not pods:
                return None
            assert not pods[0]["spec"].get("nodeName"), "the single pod took the GPUs held back for the group"
            conditions: list[dict[str, Any]] = pods[0]["status"].get("conditions") or []
            cond = next((c for c in conditions if c["type"] == "PodScheduled"), {})
            return str(cond.get("message")) if cond.get("reason") == "Unschedulable" else None

        assert "Insufficient nvidia.com/gpu" in eventually("the single pod unschedulable", refused, timeout=60)
        # one of gpu-a's nodes frees up: the group fits and starts, on the held node and the freed one
        clusters.kubectl("gpu-a", "delete", "pod", "-n", load_ns, "load-0", "--wait=false")
        placed = eventually(
            "the group bound once capacity freed", lambda: bound(clusters, namespace, "wait", 2), timeout=120
        )
        assert set(placed.values()) == {f"gpufed-{ids['gpu-a']}"}, placed
        assert not bound(clusters, namespace, "single", 1), "the single pod was bound before the group"
        # the next node that frees goes to the single pod
        clusters.kubectl("gpu-a", "delete", "pod", "-n", load_ns, "load-1", "--wait=false")
        eventually("the single pod bound", lambda: bound(clusters, namespace, "single", 1), timeout=120)
    finally:
        clusters.kubectl("gpu-a", "delete", "namespace", load_ns, "--wait=false", check=False)


def test_a_group_larger_than_any_grant_is_refused_at_once(
    clusters: Clusters, ids: dict[str, ClusterID], namespace: str
) -> None:
    offload(clusters, namespace)
    clusters.create("consumer", group_job("huge", namespace, 5, 8))  # 40 GPUs: gpu-a grants 32

    def refused() -> dict[str, Any] | None:
        pods = job_pods(clusters, namespace, "huge")
        return condition(pods[0]) if len(pods) == 5 else None

    cond = eventually("the refusal", refused, timeout=60)
    assert cond["reason"] == "NeverFits" and "more than any provider grants" in cond["message"], cond
    assert all(gated(p) and not p["spec"].get("nodeName") for p in job_pods(clusters, namespace, "huge"))


def test_a_bad_group_declaration_is_refused_at_creation(
    clusters: Clusters, ids: dict[str, ClusterID], namespace: str
) -> None:
    offload(clusters, namespace)
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": "member",
            "namespace": namespace,
            "labels": {"gpufed.io/pod-group": "ring"},
            "annotations": {"gpufed.io/pod-group-size": "many"},
        },
        "spec": {"containers": [{"name": "main", "image": "local/train:1", "resources": {"limits": {GPU: "1"}}}]},
    }
    p = clusters.kubectl("consumer", "create", "-f", "-", input_text=json.dumps(pod), check=False)
    assert p.returncode != 0 and "gpufed.io/pod-group-size" in p.stderr, p.stderr
    assert clusters.kubectl("consumer", "get", "pod", "-n", namespace, "member", check=False).returncode != 0


def test_a_group_whose_twin_the_provider_cannot_schedule_is_failed_back_whole(
    clusters: Clusters, ids: dict[str, ClusterID], namespace: str
) -> None:
    """The pool's figures say gpu-a holds the group (its nodes have every GPU free), but the workers
    keep away from gpu-a's `hog` pods (required anti-affinity, which the provider's kube-scheduler
    honours and the GPU estimator does not model): one twin binds, the other stays Pending at the
    provider. After the unplaced timeout the virtual kubelet fails the whole group back, twins
    deleted, and the Job's replacements run whole, side by side, once a second node is free of hogs."""
    offload(clusters, namespace)
    # gpu-a's own pods, no GPUs, on three of its four nodes; the group's namespace exists there too
    for i in range(3):
        clusters.create(
            "gpu-a",
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": f"hog-{i}", "namespace": namespace, "labels": {"app": "hog"}},
                "spec": {
                    "nodeSelector": {"kubernetes.io/hostname": f"gpu-a-h100-{i}"},
                    "tolerations": [{"operator": "Exists"}],
                    "containers": [{"name": "main", "image": "local/load:1"}],
                },
            },
        )
    job = group_job("apart", namespace, 2, 8)
    job["spec"]["backoffLimit"] = 4
    # the workers run until the test ends (kwok's run time), so they must run side by side
    # the pods ask for a 30 s unplaced timeout, shorter than the virtual kubelet's 120 s
    job["spec"]["template"]["metadata"]["annotations"] = {
        RUN_DURATION_ANNOTATION: "900s",
        UNPLACED_TIMEOUT_ANNOTATION: "30",
    }
    job["spec"]["template"]["spec"]["affinity"] = {
        "podAntiAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": [
                {
                    "labelSelector": {"matchLabels": {"app": "hog"}},
                    "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}},
                    "topologyKey": "kubernetes.io/hostname",
                }
            ]
        }
    }
    clusters.create("consumer", job)
    placed = eventually("the group released onto gpu-a", lambda: bound(clusters, namespace, "apart", 2), timeout=90)
    assert set(placed.values()) == {f"gpufed-{ids['gpu-a']}"}, placed
    first = set(placed)

    def failed_back() -> list[dict[str, Any]] | None:
        pods = [p for p in job_pods(clusters, namespace, "apart") if p["metadata"]["name"] in first]
        return pods if all(p["status"].get("phase") == "Failed" for p in pods) else None

    # the pods' unplaced timeout (30 s) plus the twin's deletion
    pods = eventually("both pods of the group failed back", failed_back, timeout=120)
    reasons = sorted(p["status"].get("reason") for p in pods)
    assert reasons == ["GangFailedBack", "ProviderPendingTimeout"], [p["status"] for p in pods]
    gang = next(p for p in pods if p["status"]["reason"] == "GangFailedBack")
    assert "the group runs whole or not at all" in gang["status"]["message"], gang["status"]
    assert all(
        any(c["type"] == "DisruptionTarget" and c["status"] == "True" for c in p["status"]["conditions"]) for p in pods
    )
    # nothing of the group is left holding gpu-a's GPUs
    twin_ns = f"{namespace}-{ids['consumer']}"
    left = clusters.kubectl_json("gpu-a", "get", "pods", "-n", twin_ns)["items"]
    assert not [t for t in left if t["metadata"]["name"] in first], left
    # a hog goes: the replacements (a new group of 2) run whole on gpu-a, side by side
    clusters.kubectl("gpu-a", "delete", "pod", "-n", namespace, "hog-1", "--wait=false")

    def replacements_running() -> list[dict[str, Any]] | None:
        pods = [p for p in job_pods(clusters, namespace, "apart") if p["metadata"]["name"] not in first]
        up = [p for p in pods if p["status"].get("phase") == "Running"]
        return up if len(up) == 2 else None

    up = eventually("the replacement group running", replacements_running, timeout=120)
    assert {p["spec"]["nodeName"] for p in up} == {f"gpufed-{ids['gpu-a']}"}, up
    remote = {
        t["metadata"]["name"]: t["spec"].get("nodeName")
        for t in clusters.kubectl_json("gpu-a", "get", "pods", "-n", twin_ns)["items"]
    }
    assert {remote.get(p["metadata"]["name"]) for p in up} <= {"gpu-a-h100-1", "gpu-a-h100-3"}, remote


def test_a_groups_twins_wait_gated_until_the_provider_holds_them_all_then_start_together(
    clusters: Clusters, ids: dict[str, ClusterID], namespace: str
) -> None:
    """The gang controller releases a 2 x 8-GPU group onto gpu-a while two of its nodes are free;
    before the virtual kubelet creates the twins (it is paused here to hold that window open),
    gpu-a's own workload takes one of the two. One twin alone would still fit, but the group does
    not: the twin that is created waits with the group gate (gpu-a's grant shrank with its free
    GPUs, so its quota refuses the other twin for now), and no part of the group runs. Once a node
    frees, the second twin is created and both start together."""
    offload(clusters, namespace)
    load_ns = f"load-{namespace}"[:63]
    clusters.kubectl("gpu-a", "create", "namespace", load_ns)
    vk = 0
    try:
        for i in range(2):
            clusters.create("gpu-a", gpu_load(f"load-{i}", load_ns, f"gpu-a-h100-{i}", 8))
        pool_node = f"gpufed-{ids['gpu-a']}"

        def figures() -> dict[str, Any]:
            node = clusters.kubectl_json("consumer", "get", "node", pool_node)
            return dict(json.loads(node["metadata"]["annotations"].get("gpufed.io/gpu-pool") or "{}"))

        eventually("gpu-a's pool figures showing two free nodes", lambda: figures().get("free_nodes") == [[8, 2]])
        (vk,) = processes(str(clusters.env.state_dir), "virtual-kubelet", f"--provider-cluster-id={ids['gpu-a']}")
        os.kill(vk, signal.SIGSTOP)
        job = group_job("together", namespace, 2, 8)
        job["spec"]["template"]["metadata"]["annotations"] = {RUN_DURATION_ANNOTATION: "300s"}
        clusters.create("consumer", job)
        placed = eventually("the group released onto gpu-a", lambda: bound(clusters, namespace, "together", 2))
        assert set(placed.values()) == {pool_node}, placed
        clusters.create("gpu-a", gpu_load("load-2", load_ns, "gpu-a-h100-2", 8))
        eventually(
            "gpu-a's own pod on its third node",
            lambda: (
                clusters.kubectl_json("gpu-a", "get", "pod", "-n", load_ns, "load-2")["status"].get("phase")
                == "Running"
            ),
        )
        # the estimator has the change before the virtual kubelet wakes (its stream then delivers it)
        eventually(
            "gpu-a's estimator counting one free H100 node",
            lambda: estimator_max_replicas(clusters, ids["gpu-a"], PodShape(gpus=8, gpu_product=H100)) == 1,
        )
    finally:
        if vk:
            os.kill(vk, signal.SIGCONT)
    try:
        twin_ns = f"{namespace}-{ids['consumer']}"

        def twins() -> list[dict[str, Any]]:
            items: list[dict[str, Any]] = clusters.kubectl_json("gpu-a", "get", "pods", "-n", twin_ns)["items"]
            return [t for t in items if t["metadata"]["name"] in placed]

        def held() -> list[dict[str, Any]]:
            """The group's twins so far, each gated and on no node."""
            found = twins()
            for t in found:
                gates = [g["name"] for g in t["spec"].get("schedulingGates") or []]
                assert gates == [TWIN_GROUP_GATE] and not t["spec"].get("nodeName"), (gates, t["spec"].get("nodeName"))
            return found

        eventually("a twin of the group created with the group gate", held)
        for _ in range(20):  # ~10 s: no part of the group starts while gpu-a cannot hold all of it
            held()
            time.sleep(0.5)
        local = job_pods(clusters, namespace, "together")
        assert not [p for p in local if p["status"].get("phase") == "Running"], [p["status"] for p in local]
        # a node frees: both start, on two nodes
        clusters.kubectl("gpu-a", "delete", "pod", "-n", load_ns, "load-1", "--wait=false")

        def running() -> dict[str, str] | None:
            found = twins()
            up = {
                t["metadata"]["name"]: t["spec"].get("nodeName") for t in found if t["status"].get("phase") == "Running"
            }
            return up if len(up) == 2 else None

        # the grant grows back, the quota with it, and the refused twin's create is retried (backoff)
        nodes = eventually("both twins running once a node freed", running, timeout=150)
        assert sorted(nodes.values()) == ["gpu-a-h100-1", "gpu-a-h100-3"], nodes
        eventually(
            "both pods Running on the consumer",
            lambda: all(p["status"].get("phase") == "Running" for p in job_pods(clusters, namespace, "together")),
            timeout=60,
        )
    finally:
        clusters.kubectl("gpu-a", "delete", "namespace", load_ns, "--wait=false", check=False)


def replicated_job(name: str, replicas: int, gpus: int) -> dict[str, Any]:
    """A replicatedJob of `replicas` Jobs of one pod each, `gpus` GPUs a pod."""
    pod = manifests.job(name, "", gpus=gpus, completions=1, parallelism=1)["spec"]
    return {"name": name, "replicas": replicas, "template": {"spec": pod}}


def test_a_jobsets_leader_and_workers_land_whole_on_one_pool(
    clusters: Clusters, ids: dict[str, ClusterID], namespace: str
) -> None:
    """A JobSet of a leader (1 x 2 GPUs) and workers (3 x 2 GPUs): one group of 4 pods (from four
    Jobs of one pod each, none a group on its own), released onto one pool together."""
    offload(clusters, namespace)
    jobset = {
        "apiVersion": JOBSET_API_VERSION,
        "kind": "JobSet",
        "metadata": {"name": "llm", "namespace": namespace},
        "spec": {"replicatedJobs": [replicated_job("leader", 1, 2), replicated_job("workers", 3, 2)]},
    }
    clusters.create("consumer", jobset)
    placed = eventually(
        "the JobSet's 4 pods bound",
        lambda: bound(clusters, namespace, "llm", 4, selector=JOBSET_NAME_LABEL),
        timeout=90,
    )
    assert len(set(placed.values())) == 1, f"the JobSet was split: {placed}"
    (node,) = set(placed.values())
    assert node.startswith("gpufed-"), node
    pods = job_pods(clusters, namespace, "llm", JOBSET_NAME_LABEL)
    groups = {
        (
            p["metadata"]["annotations"].get(GANG_GROUP_ANNOTATION),
            p["metadata"]["annotations"].get(GANG_SIZE_ANNOTATION),
        )
        for p in pods
    }
    assert len(groups) == 1 and next(iter(groups))[1] == "4", groups
    assert all(p["metadata"]["labels"].get(GANG_LABEL) for p in pods), "the webhook did not mark the group"
    assert all(p["metadata"]["annotations"].get("gpufed.io/gang-node") == node for p in pods)
    clusters.kubectl(
        "consumer", "wait", "-n", namespace, "--for=condition=Completed", "jobset/llm", "--timeout=60s", timeout=70
    )
