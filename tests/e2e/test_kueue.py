"""Kueue over the federated pool, on the real local clusters: the consumer runs Kueue (built from its Go
module, the default topology's `kueue: true`), peers with gpu-a (4 x 8 H100) and two teams share the
pool node through the ResourceFlavor gpufed keeps for it.

- gpufed creates the flavor for the pool node (pinned to it, tolerating virtual nodes, saying the
  most GPUs one pod can get there);
- with gpu-b (2 x 4 A100, 4 x 1 L4) peered too, a ClusterQueue lists gpu-b's A100 flavor before
  gpu-a's: a queued Job of 8-GPU pods gets the fit affinity from gpufed's webhook and Kueue admits it
  to gpu-a's flavor (quota alone would have put it on the A100s, where it could never start), while
  a 2-GPU Job still goes to the A100 flavor; both run on their flavor's pool node;
- a JobSet with the queue label (a leader and 3 workers, 2 GPUs each, more than team-a's own quota)
  is Kueue's, not gpufed's gang path's: Kueue admits it whole to the flavor by borrowing, its 4 pods
  run ungated on the pool node, it completes and gives the quota back;
- two ClusterQueues in one cohort, 4 GPUs each in that flavor, reclaimWithinCohort: Any, a LocalQueue
  each in an offloaded namespace: team-a's first Job (2 pods x 2 GPUs) is admitted within its quota,
  its second by borrowing team-b's idle quota, and every pod of both runs on the pool node; team-b's
  Job then reclaims its quota: Kueue preempts a team-a workload and team-b's pods run;
- an admin raising team-a's quota above the grant sees it clamped (Event GPUQuotaClamped on the
  ClusterQueue), and a larger grant (a second `gpufed peer` with more GPUs) gives it back within
  seconds (GPUQuotaRestored).

The grant is 16 GPUs, twice the cohort's 8: the provider splits a grant between the consumer's twin
namespaces (each keeps what it uses, the rest is shared evenly), so with a grant of exactly 8 team-a's
twin namespace could never hold all 8 GPUs Kueue lets it borrow while team-b's holds its even share.
"""

from __future__ import annotations

import functools
import json
import secrets
import time
from collections.abc import Iterator
from typing import Any

import pytest

from gpufed.apis.wire import (
    GANG_GATE,
    GANG_LABEL,
    JOBSET_API_VERSION,
    JOBSET_NAME_LABEL,
    POD_GPUS_LABEL,
    REMOTE_CLUSTER_LABEL,
    ClusterID,
)
from gpufed.localenv import kueue, kwokcfg, manifests
from tests.e2e.conftest import Clusters
from tests.e2e.helpers import eventually, offload, out, peer, peered_session

pytestmark = pytest.mark.e2e

GPU = "nvidia.com/gpu"
#: The Kueue API the test writes (served by Kueue v0.17 as its storage version).
API = "kueue.x-k8s.io/v1beta2"
GRANT = 16
A100 = "NVIDIA-A100-SXM4-40GB"
#: Each team's nominal GPU quota in the pool's flavor.
NOMINAL = 4


def cluster_queue(name: str, cohort: str, flavor: str, gpus: int) -> dict[str, Any]:
    return {
        "apiVersion": API,
        "kind": "ClusterQueue",
        "metadata": {"name": name},
        "spec": {
            "cohortName": cohort,
            "namespaceSelector": {},
            "preemption": {"reclaimWithinCohort": "Any"},
            "resourceGroups": [
                {
                    "coveredResources": [GPU],
                    "flavors": [{"name": flavor, "resources": [{"name": GPU, "nominalQuota": str(gpus)}]}],
                }
            ],
        },
    }


def local_queue(name: str, namespace: str, cluster_queue: str) -> dict[str, Any]:
    return {
        "apiVersion": API,
        "kind": "LocalQueue",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"clusterQueue": cluster_queue},
    }


def queued_job(name: str, namespace: str, queue: str, *, pods: int = 2, gpus: int = 2) -> dict[str, Any]:
    """A suspended Job Kueue admits: `pods` pods of `gpus` GPUs that run until deleted (30 minutes)."""
    job = manifests.job(
        name,
        namespace,
        gpus=str(gpus),
        completions=pods,
        parallelism=pods,
        labels={kueue.QUEUE_NAME_LABEL: queue},
        pod_labels={"job": name},
        pod_annotations={kwokcfg.RUN_DURATION_ANNOTATION: "30m"},
    )
    job["spec"]["suspend"] = True
    return job


def replicated_job(name: str, replicas: int, gpus: int) -> dict[str, Any]:
    """A replicatedJob of `replicas` Jobs of one pod each, `gpus` GPUs a pod."""
    pod = manifests.job(name, "", gpus=str(gpus), completions=1, parallelism=1)["spec"]
    return {"name": name, "replicas": replicas, "template": {"spec": pod}}


def queued_jobset(name: str, namespace: str, queue: str) -> dict[str, Any]:
    """A JobSet of a leader (1 x 2 GPUs) and workers (3 x 2 GPUs) handed to `queue`; Kueue's webhook
    suspends it until Kueue admits it."""
    return {
        "apiVersion": JOBSET_API_VERSION,
        "kind": "JobSet",
        "metadata": {"name": name, "namespace": namespace, "labels": {kueue.QUEUE_NAME_LABEL: queue}},
        "spec": {"replicatedJobs": [replicated_job("leader", 1, 2), replicated_job("workers", 3, 2)]},
    }


@pytest.fixture(scope="module")
def ids(clusters: Clusters) -> Iterator[dict[str, ClusterID]]:
    yield from peered_session(clusters, {"gpu-a": ("--gpus", str(GRANT)), "gpu-b": ("--gpus", "8")})


@pytest.fixture(scope="module")
def flavor(clusters: Clusters, ids: dict[str, ClusterID]) -> str:
    name = f"gpufed-{ids['gpu-a']}"
    eventually(
        f"gpufed's ResourceFlavor {name}",
        lambda: clusters.kubectl("consumer", "get", "resourceflavor", name, check=False).returncode == 0,
        timeout=30,
    )
    return name


@pytest.fixture(scope="module")
def teams(clusters: Clusters, flavor: str) -> Iterator[dict[str, str]]:
    """team -> its name (ClusterQueue, offloaded namespace, LocalQueue): two ClusterQueues in one cohort."""
    suffix = secrets.token_hex(3)
    names = {team: f"{team}-{suffix}" for team in ("team-a", "team-b")}
    try:
        for name in names.values():
            clusters.create("consumer", cluster_queue(name, f"research-{suffix}", flavor, NOMINAL))
            clusters.kubectl("consumer", "create", "namespace", name)
            offload(clusters, name)
            clusters.create("consumer", local_queue(name, name, name))
        yield names
    finally:
        for name in names.values():
            clusters.kubectl("consumer", "delete", "namespace", name, "--wait=false", check=False)
            clusters.kubectl("consumer", "delete", "clusterqueue", name, "--wait=false", check=False)


def workload(clusters: Clusters, namespace: str, job: str) -> dict[str, Any] | None:
    """The Workload Kueue made for `job`."""
    items = clusters.kubectl_json("consumer", "get", "workloads", "-n", namespace)["items"]
    return next((w for w in items if any(o["name"] == job for o in w["metadata"].get("ownerReferences") or [])), None)


def condition(obj: dict[str, Any] | None, type_: str) -> dict[str, Any] | None:
    conds = ((obj or {}).get("status") or {}).get("conditions") or []
    return next((c for c in conds if c["type"] == type_ and c["status"] == "True"), None)


def admitted(clusters: Clusters, namespace: str, job: str) -> dict[str, Any] | None:
    wl = workload(clusters, namespace, job)
    return wl if condition(wl, "Admitted") else None


def running_on(clusters: Clusters, namespace: str, job: str, pods: int) -> set[str] | None:
    """The nodes of `job`'s pods once `pods` of them are Running."""
    items = clusters.kubectl_json("consumer", "get", "pods", "-n", namespace, "-l", f"job={job}")["items"]
    live = [p for p in items if not p["metadata"].get("deletionTimestamp")]
    if len(live) != pods or any(p["status"].get("phase") != "Running" for p in live):
        return None
    return {p["spec"]["nodeName"] for p in live}


def gpu_quota(clusters: Clusters, name: str) -> int:
    cq = clusters.kubectl_json("consumer", "get", "clusterqueue", name)
    (resource,) = cq["spec"]["resourceGroups"][0]["flavors"][0]["resources"]
    return int(resource["nominalQuota"])


def borrowed(clusters: Clusters, name: str, flavor: str) -> int:
    """GPUs `name` holds beyond its nominal quota (Kueue's `status.flavorsReservation`)."""
    status = clusters.kubectl_json("consumer", "get", "clusterqueue", name).get("status") or {}
    for fl in status.get("flavorsReservation") or []:
        if fl["name"] == flavor:
            for r in fl["resources"]:
                if r["name"] == GPU:
                    return int(r.get("borrowed") or 0)
    return 0


def events(clusters: Clusters, cluster_queue: str, reason: str) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = clusters.kubectl_json(
        "consumer",
        "get",
        "events",
        "-n",
        "default",
        "--field-selector",
        f"involvedObject.kind=ClusterQueue,involvedObject.name={cluster_queue},reason={reason}",
    )["items"]
    return items


def test_gpufed_keeps_a_flavor_pinned_to_the_pool_node(
    clusters: Clusters, ids: dict[str, ClusterID], flavor: str
) -> None:
    rf = clusters.kubectl_json("consumer", "get", "resourceflavor", flavor)
    assert rf["apiVersion"] == API
    assert rf["metadata"]["labels"] == {
        "app.kubernetes.io/managed-by": "gpufed",
        "gpufed.io/remote-cluster-id": ids["gpu-a"],
    }
    # gpu-a's H100 nodes have 8 GPUs each, the grant 16: one pod can get 8
    assert rf["spec"]["nodeLabels"] == {"kubernetes.io/hostname": flavor, POD_GPUS_LABEL: "8"}
    assert {"key": "gpufed.io/virtual-node", "operator": "Exists", "effect": "NoExecute"} in rf["spec"]["tolerations"]
    node = clusters.kubectl_json("consumer", "get", "node", flavor)
    assert node["metadata"]["labels"]["kubernetes.io/hostname"] == flavor


def test_a_queued_job_goes_only_to_a_flavor_whose_pool_holds_one_of_its_pods(
    clusters: Clusters, ids: dict[str, ClusterID], flavor: str
) -> None:
    def a100_pool() -> str | None:
        nodes = clusters.kubectl_json(
            "consumer", "get", "nodes", "-l", f"{REMOTE_CLUSTER_LABEL}={ids['gpu-b']},nvidia.com/gpu.product={A100}"
        )["items"]
        return str(nodes[0]["metadata"]["name"]) if nodes else None

    a100 = eventually("gpu-b's A100 pool node", a100_pool, timeout=60)

    def labels_of(name: str) -> dict[str, str] | None:
        got = clusters.kubectl("consumer", "get", "resourceflavor", name, "-o", "json", check=False)
        return json.loads(got.stdout)["spec"]["nodeLabels"] if got.returncode == 0 else None

    eventually("the A100 flavor says 4 GPUs a pod", lambda: (labels_of(a100) or {}).get(POD_GPUS_LABEL) == "4")
    assert (labels_of(flavor) or {}).get(POD_GPUS_LABEL) == "8"

    name = f"fit-{secrets.token_hex(3)}"
    cq = cluster_queue(name, name, a100, 8)  # a cohort of its own
    cq["spec"]["resourceGroups"][0]["flavors"].append(
        {"name": flavor, "resources": [{"name": GPU, "nominalQuota": "8"}]}
    )
    try:
        clusters.create("consumer", cq)
        clusters.kubectl("consumer", "create", "namespace", name)
        offload(clusters, name)
        clusters.create("consumer", local_queue(name, name, name))
        clusters.create("consumer", queued_job("big", name, name, pods=1, gpus=8))
        clusters.create("consumer", queued_job("small", name, name, pods=1, gpus=2))
        big = clusters.kubectl_json("consumer", "get", "job", "big", "-n", name)
        terms = big["spec"]["template"]["spec"]["affinity"]["nodeAffinity"][
            "requiredDuringSchedulingIgnoredDuringExecution"
        ]["nodeSelectorTerms"]
        assert {"key": POD_GPUS_LABEL, "operator": "Gt", "values": ["7"]} in [
            e for t in terms for e in t["matchExpressions"]
        ]
        for job, want in (("big", flavor), ("small", a100)):
            wl = eventually(f"{job} admitted", functools.partial(admitted, clusters, name, job), timeout=30)
            (assignment,) = wl["status"]["admission"]["podSetAssignments"]
            assert assignment["flavors"] == {GPU: want}, (job, assignment)
            nodes = eventually(
                f"{job}'s pod Running", functools.partial(running_on, clusters, name, job, 1), timeout=60
            )
            assert nodes == {want}, (job, nodes)
    finally:
        clusters.kubectl("consumer", "delete", "namespace", name, "--wait=false", check=False)
        clusters.kubectl("consumer", "delete", "clusterqueue", name, "--wait=false", check=False)


def test_a_queued_jobset_is_admitted_whole_to_one_flavor_and_runs_on_its_pool_node(
    clusters: Clusters, teams: dict[str, str], flavor: str
) -> None:
    a = teams["team-a"]
    created = clusters.kubectl(
        "consumer", "create", "-o", "json", "-f", "-", input_text=json.dumps(queued_jobset("llm", a, a))
    )
    assert json.loads(created.stdout)["spec"]["suspend"] is True, "Kueue's webhook suspends a queued JobSet"
    wl = eventually("the JobSet's Workload admitted", lambda: admitted(clusters, a, "llm"), timeout=30)
    # One pod set per replicatedJob, both in the one flavor: 8 GPUs, twice team-a's own quota (the
    # rest borrowed from team-b's idle quota).
    assignments = wl["status"]["admission"]["podSetAssignments"]
    assert sorted((p["name"], p["count"]) for p in assignments) == [("leader", 1), ("workers", 3)], assignments
    assert all(p["flavors"] == {GPU: flavor} for p in assignments), assignments
    assert sum(int(p["resourceUsage"][GPU]) for p in assignments) == 2 * NOMINAL, assignments

    def bound() -> list[dict[str, Any]] | None:
        items: list[dict[str, Any]] = clusters.kubectl_json(
            "consumer", "get", "pods", "-n", a, "-l", f"{JOBSET_NAME_LABEL}=llm"
        )["items"]
        return items if len(items) == 4 and all(p["spec"].get("nodeName") for p in items) else None

    pods = eventually("the JobSet's 4 pods bound", bound, timeout=60)
    assert {p["spec"]["nodeName"] for p in pods} == {flavor}, [p["spec"]["nodeName"] for p in pods]
    # Kueue's, so gpufed's gang path stepped aside: no gang gate or group label on any pod.
    for p in pods:
        assert GANG_LABEL not in (p["metadata"].get("labels") or {}), p["metadata"]
        assert GANG_GATE not in {g["name"] for g in p["spec"].get("schedulingGates") or []}, p["spec"]
        assert p["spec"]["nodeSelector"]["kubernetes.io/hostname"] == flavor, "the flavor's nodeLabels"
    clusters.kubectl(
        "consumer", "wait", "-n", a, "--for=condition=Completed", "jobset/llm", "--timeout=60s", timeout=70
    )
    eventually("the Workload finished", lambda: condition(workload(clusters, a, "llm"), "Finished"), timeout=15)
    eventually("team-a's borrowed GPUs given back", lambda: borrowed(clusters, a, flavor) == 0, timeout=15)


def test_jobs_are_admitted_within_quota_by_borrowing_and_reclaimed_by_the_lender(
    clusters: Clusters, teams: dict[str, str], flavor: str
) -> None:
    a, b = teams["team-a"], teams["team-b"]
    # Within team-a's nominal 4 GPUs.
    clusters.create("consumer", queued_job("a1", a, a))
    eventually("team-a's first Job admitted", lambda: admitted(clusters, a, "a1"), timeout=30)
    nodes = eventually("a1's 2 pods Running", lambda: running_on(clusters, a, "a1", 2), timeout=60)
    assert nodes == {flavor}, nodes
    assert borrowed(clusters, a, flavor) == 0

    # 4 more GPUs: only by borrowing team-b's idle quota.
    clusters.create("consumer", queued_job("a2", a, a))
    eventually("team-a's second Job admitted", lambda: admitted(clusters, a, "a2"), timeout=30)
    eventually("team-a borrowing 4 GPUs", lambda: borrowed(clusters, a, flavor) == NOMINAL, timeout=15)
    nodes = eventually("a2's 2 pods Running", lambda: running_on(clusters, a, "a2", 2), timeout=60)
    assert nodes == {flavor}, nodes

    # team-b wants its quota back: Kueue preempts a team-a workload to admit team-b's Job.
    clusters.create("consumer", queued_job("b1", b, b))
    eventually("team-b's Job admitted", lambda: admitted(clusters, b, "b1"), timeout=60)

    def preempted() -> str | None:
        for job in ("a1", "a2"):
            cond = condition(workload(clusters, a, job), "Preempted")
            if cond:
                assert "reclamation within the cohort" in cond["message"], cond
                return job
        return None

    victim = eventually("a team-a workload preempted", preempted, timeout=30)
    survivor = "a2" if victim == "a1" else "a1"
    job = clusters.kubectl_json("consumer", "get", "job", "-n", a, victim)
    assert job["spec"]["suspend"] is True, "the preempted Job is suspended again"
    eventually(
        f"the pods of the preempted {victim} gone",
        lambda: not clusters.kubectl_json("consumer", "get", "pods", "-n", a, "-l", f"job={victim}")["items"],
        timeout=60,
    )
    nodes = eventually("b1's 2 pods Running", lambda: running_on(clusters, b, "b1", 2), timeout=60)
    assert nodes == {flavor}, nodes
    assert admitted(clusters, a, survivor) and not admitted(clusters, a, victim)
    eventually(
        "each team within its own quota",
        lambda: borrowed(clusters, a, flavor) == 0 and borrowed(clusters, b, flavor) == 0,
        timeout=15,
    )


def test_a_quota_over_the_grant_is_clamped_and_follows_the_grant(
    clusters: Clusters, teams: dict[str, str], flavor: str
) -> None:
    a, b = teams["team-a"], teams["team-b"]
    assert (gpu_quota(clusters, a), gpu_quota(clusters, b)) == (NOMINAL, NOMINAL), "within the grant: as asked"
    # 16 + 4 asked of a 16-GPU grant: shared in proportion (12.8 and 3.2; the larger remainder to team-a).
    patch = [{"op": "replace", "path": "/spec/resourceGroups/0/flavors/0/resources/0/nominalQuota", "value": "16"}]
    clusters.kubectl("consumer", "patch", "clusterqueue", a, "--type=json", "-p", json.dumps(patch))
    eventually(
        "team-a's quota clamped",
        lambda: (gpu_quota(clusters, a), gpu_quota(clusters, b)) == (13, 3),
        timeout=15,
    )
    (clamped,) = events(clusters, a, "GPUQuotaClamped")
    assert clamped["type"] == "Warning" and f"{flavor}: 16 asked, 13 promised" in clamped["message"], clamped
    assert events(clusters, b, "GPUQuotaClamped"), "team-b's share was lowered too, and it was told"

    # The provider grants 20: both asks fit again, and the quotas follow within seconds.
    p = peer(clusters, "gpu-a", "--gpus", "20")
    assert p.returncode == 0, out(p)
    granted = time.monotonic()
    eventually(
        "the quotas given back",
        lambda: (gpu_quota(clusters, a), gpu_quota(clusters, b)) == (16, NOMINAL),
        timeout=15,
    )
    followed_s = time.monotonic() - granted
    print(f"[kueue] quotas followed the new grant {followed_s:.1f} s after `gpufed peer` returned")
    assert followed_s < 10, followed_s
    for name in (a, b):
        (restored,) = events(clusters, name, "GPUQuotaRestored")
        assert restored["type"] == "Normal", restored
