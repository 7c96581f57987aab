"""The storage fabric on the real local clusters: claims of the consumer's virtual StorageClass
`gpufed` bound on the provider their first pod is offloaded to (the provider's static local volumes
of class `local-disk`, bound by its own kube-controller-manager when the twin is scheduled), the data
keeping later pods on that provider, the virtual volume mirroring the provider's volume (size,
access modes, phase), refusals said as Events on the claim (a class not offered, the storage quota,
the claim count quota), and deletion following the reclaim policy, held while pods use the claim.

The module peers the consumer with gpu-a (32 GPUs, 40Gi of storage) and gpu-b (12 GPUs, 40Gi, and
4 pod slots: its twin namespaces' quota allows 4 claims in all, so a refusal by the claim count
costs a handful of claims).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import pytest

from gpufed.apis.quantity import parse
from gpufed.apis.wire import (
    CLAIMS_RESOURCE,
    PROVIDER_STORAGE_CLASS_ANNOTATION,
    REMOTE_CLUSTER_LABEL,
    REMOTE_PHASE_ANNOTATION,
    ClusterID,
)
from gpufed.localenv import manifests
from gpufed.localenv.kwokcfg import RUN_DURATION_ANNOTATION
from tests.e2e.conftest import Clusters
from tests.e2e.helpers import eventually, gpufed, offload, out, peered_session, unpeer_args
from vkprovider.forge.claims import SELECTED_NODE_ANNOTATION

pytestmark = pytest.mark.e2e

#: Pod slots asked of gpu-b: its twin namespaces' quota allows as many claims, in all.
GPU_B_PODS = 4


@pytest.fixture(scope="module")
def ids(clusters: Clusters) -> Iterator[dict[str, ClusterID]]:
    yield from peered_session(
        clusters,
        {
            "gpu-a": ("--gpus", "32", "--storage", "40Gi"),
            # few pod slots: the twin namespaces' claim count quota is one claim per slot
            "gpu-b": ("--gpus", "12", "--storage", "40Gi", "--pods", str(GPU_B_PODS)),
        },
    )


def claim(name: str, namespace: str, size: str = "10Gi", **annotations: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": name, "namespace": namespace, "annotations": annotations},
        "spec": {
            "storageClassName": "gpufed",
            "accessModes": ["ReadWriteOnce"],
            "resources": {"requests": {"storage": size}},
        },
    }


def job_with(name: str, namespace: str, claim_name: str, **pod_spec: Any) -> dict[str, Any]:
    job = manifests.job(name, namespace, gpus=1, pod_labels={"job": name}, pod_annotations={})
    template = job["spec"]["template"]
    template["metadata"]["annotations"] = {RUN_DURATION_ANNOTATION: "3s"}
    template["spec"]["volumes"] = [{"name": "data", "persistentVolumeClaim": {"claimName": claim_name}}]
    template["spec"]["containers"][0]["volumeMounts"] = [{"name": "data", "mountPath": "/data"}]
    template["spec"].update(pod_spec)
    return job


def get(clusters: Clusters, context: str, *args: str) -> dict[str, Any] | None:
    p = clusters.kubectl(context, "get", *args, "-o", "json", check=False)
    if p.returncode:
        return None
    found: dict[str, Any] = json.loads(p.stdout)
    return found


def pod_of(clusters: Clusters, namespace: str, job: str) -> dict[str, Any] | None:
    items = clusters.kubectl_json("consumer", "get", "pods", "-n", namespace, "-l", f"job={job}")["items"]
    return items[0] if items else None


def claim_events(clusters: Clusters, namespace: str, name: str) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = clusters.kubectl_json(
        "consumer", "get", "events", "-n", namespace, "--field-selector", f"involvedObject.name={name}"
    )["items"]
    return items


def delete_claims(clusters: Clusters, namespace: str) -> None:
    """Jobs and claims go; the virtual volumes and the providers' claims with them (reclaim Delete)."""
    clusters.kubectl(
        "consumer", "delete", "jobs", "--all", "-n", namespace, "--wait=true", "--timeout=60s", check=False
    )
    clusters.kubectl(
        "consumer", "delete", "pods", "--all", "-n", namespace, "--wait=true", "--timeout=60s", check=False
    )
    clusters.kubectl("consumer", "delete", "pvc", "--all", "-n", namespace, "--wait=true", "--timeout=60s", check=False)

    eventually("the namespace's virtual volumes gone", lambda: not volumes_of(clusters, namespace), timeout=60)


def volumes_of(clusters: Clusters, namespace: str) -> list[dict[str, Any]]:
    pvs: list[dict[str, Any]] = clusters.kubectl_json("consumer", "get", "pv")["items"]
    return [pv for pv in pvs if (pv["spec"].get("claimRef") or {}).get("namespace") == namespace]


def test_a_claim_binds_on_the_provider_and_keeps_later_pods_there(
    clusters: Clusters, ids: dict[str, ClusterID], namespace: str
) -> None:
    offload(clusters, namespace)
    try:
        clusters.create("consumer", claim("data", namespace))
        # the first pod goes to gpu-a (its own choice): the claim is bound there
        pin_a = {REMOTE_CLUSTER_LABEL: ids["gpu-a"]}
        clusters.create("consumer", job_with("writer", namespace, "data", nodeSelector=pin_a))

        def bound() -> dict[str, Any] | None:
            pvc = get(clusters, "consumer", "pvc", "data", "-n", namespace)
            return pvc if pvc and pvc["status"].get("phase") == "Bound" else None

        pvc = eventually("the consumer's claim Bound", bound, timeout=90)
        pv = get(clusters, "consumer", "pv", pvc["spec"]["volumeName"])
        assert pv is not None and pv["status"]["phase"] == "Bound"
        assert pv["metadata"]["labels"][REMOTE_CLUSTER_LABEL] == ids["gpu-a"]
        assert pv["spec"]["claimRef"]["name"] == "data"
        twin_ns = f"{namespace}-{ids['consumer']}"

        def remote_bound() -> dict[str, Any] | None:
            remote = get(clusters, "gpu-a", "pvc", "data", "-n", twin_ns)
            return remote if remote and remote["status"].get("phase") == "Bound" else None

        remote = eventually("the provider's claim bound to one of its local volumes", remote_bound, timeout=90)
        assert remote["spec"]["storageClassName"] == "local-disk"
        # the virtual volume mirrors the provider's volume: its size (a static local-disk volume, larger
        # than the 10Gi asked for), its access modes, and the phase of the provider's claim
        provider_pv = get(clusters, "gpu-a", "pv", remote["spec"]["volumeName"])
        assert provider_pv is not None, remote["spec"]
        provider_size = provider_pv["spec"]["capacity"]["storage"]
        provider_modes = set(provider_pv["spec"]["accessModes"])
        assert parse(provider_size) > parse("10Gi"), provider_pv["spec"]

        def mirrored() -> dict[str, Any] | None:
            now = get(clusters, "consumer", "pv", pv["metadata"]["name"])
            if now is None or now["metadata"].get("annotations", {}).get(REMOTE_PHASE_ANNOTATION) != "Bound":
                return None
            spec = now["spec"]
            same = parse(spec["capacity"]["storage"]) == parse(provider_size)
            return now if same and set(spec["accessModes"]) == provider_modes | {"ReadWriteOnce"} else None

        eventually("the virtual volume mirroring the provider's volume", mirrored, timeout=90)
        events = claim_events(clusters, namespace, "data")
        assert any(e["reason"] == "Provisioned" and ids["gpu-a"] in e["message"] for e in events), events
        clusters.kubectl(
            "consumer", "wait", "-n", namespace, "--for=condition=Complete", "job/writer", "--timeout=120s", timeout=130
        )
        # the reader prefers gpu-b (more free GPUs, and its own strong preference), but the data is on gpu-a
        prefer_b = {
            "nodeAffinity": {
                "preferredDuringSchedulingIgnoredDuringExecution": [
                    {
                        "weight": 100,
                        "preference": {
                            "matchExpressions": [
                                {"key": REMOTE_CLUSTER_LABEL, "operator": "In", "values": [ids["gpu-b"]]}
                            ]
                        },
                    }
                ]
            }
        }
        clusters.create("consumer", job_with("reader", namespace, "data", affinity=prefer_b))

        def placed() -> str | None:
            pod = pod_of(clusters, namespace, "reader")
            return (pod["spec"].get("nodeName") or None) if pod else None

        node = eventually("the reader bound", placed, timeout=90)
        assert node.startswith(f"gpufed-{ids['gpu-a']}"), node
        clusters.kubectl(
            "consumer", "wait", "-n", namespace, "--for=condition=Complete", "job/reader", "--timeout=120s", timeout=130
        )
        # the operator sees the claim where its data is
        kc = ("--kubeconfig", str(clusters.kubeconfig), "--context", "consumer")
        p = gpufed("info", *kc, "-o", "json")
        assert p.returncode == 0, out(p)
        provider_a = next(x for x in json.loads(p.stdout)["providers"] if x["clusterId"] == ids["gpu-a"])
        assert provider_a["claims"] == [{"claim": f"{namespace}/data", "size": provider_size}], provider_a
        p = gpufed("pool", *kc, "-o", "json")
        assert p.returncode == 0, out(p)
        on_a = json.loads(p.stdout)["claims"][ids["gpu-a"]]
        assert on_a["claims"] == 1 and on_a["items"][0]["claim"] == f"{namespace}/data", on_a
        assert on_a["items"][0]["remotePhase"] == "Bound" and on_a["items"][0]["size"] == provider_size, on_a
        # a pod that must run on gpu-b never mounts the claim bound on gpu-a: it stays Pending
        pin_b = {REMOTE_CLUSTER_LABEL: ids["gpu-b"]}
        clusters.create("consumer", job_with("elsewhere", namespace, "data", nodeSelector=pin_b))
        time.sleep(10)
        pod = eventually("the pinned pod", lambda: pod_of(clusters, namespace, "elsewhere"))
        assert not pod["spec"].get("nodeName") and pod["status"]["phase"] == "Pending", pod["status"]
        unschedulable = [c for c in pod["status"].get("conditions") or [] if c["type"] == "PodScheduled"]
        assert unschedulable and unschedulable[0]["reason"] == "Unschedulable", pod["status"]
        # the claim is deleted while the finished writer's and reader's pods still name it: Kubernetes
        # keeps it (kubernetes.io/pvc-protection), gpufed says so, and the provider's copy stays
        clusters.kubectl("consumer", "delete", "pvc", "data", "-n", namespace, "--wait=false")

        def held() -> list[dict[str, Any]]:
            return [e for e in claim_events(clusters, namespace, "data") if e["reason"] == "ClaimInUse"]

        (in_use,) = eventually("the ClaimInUse Event on the claim", held, timeout=60)
        assert in_use["type"] == "Warning" and f"its data on provider {ids['gpu-a']}" in in_use["message"], in_use
        time.sleep(3)
        deleting = get(clusters, "consumer", "pvc", "data", "-n", namespace)
        assert deleting is not None and deleting["metadata"].get("deletionTimestamp"), "held while pods use it"
        assert get(clusters, "gpu-a", "pvc", "data", "-n", twin_ns) is not None, "the provider's copy stays"
        assert len(held()) == 1, "said once"
        # the pods go: the claim goes, and the provider's copy with it (reclaim policy Delete)
        clusters.kubectl(
            "consumer", "delete", "jobs", "--all", "-n", namespace, "--cascade=foreground", "--timeout=60s", timeout=70
        )
        eventually(
            "the consumer's claim gone", lambda: get(clusters, "consumer", "pvc", "data", "-n", namespace) is None
        )
        eventually(
            "the provider's copy gone", lambda: get(clusters, "gpu-a", "pvc", "data", "-n", twin_ns) is None, timeout=90
        )
    finally:
        delete_claims(clusters, namespace)
    # deleting the claim deleted the provider's copy (reclaim policy Delete)
    assert get(clusters, "gpu-a", "pvc", "data", "-n", f"{namespace}-{ids['consumer']}") is None


def test_a_claim_whose_first_pod_stays_local_binds_to_local_storage_and_keeps_later_pods_local(
    clusters: Clusters, ids: dict[str, ClusterID], namespace: str
) -> None:
    """The claim's first pod is scheduled to one of the consumer's own nodes: gpufed's controller hands
    the claim a static volume of the consumer's default class `local-disk` on that node, the
    consumer's kube-controller-manager binds it, and a later GPU pod mounting the claim is kept local
    (never offloaded) with the Event `KeptLocal` saying why."""
    offload(clusters, namespace)
    local_node = "consumer-cpu-0"
    bound_volume = ""
    try:
        clusters.create("consumer", claim("scratch", namespace))
        first = job_with("first", namespace, "scratch", nodeSelector={"kubernetes.io/hostname": local_node})
        first["spec"]["template"]["spec"]["containers"][0]["resources"] = {}  # no GPU: a local node fits
        clusters.create("consumer", first)

        def bound() -> dict[str, Any] | None:
            pvc = get(clusters, "consumer", "pvc", "scratch", "-n", namespace)
            return pvc if pvc is not None and pvc["status"].get("phase") == "Bound" else None

        pvc = eventually("the claim bound to a local volume", bound, timeout=90)
        bound_volume = pvc["spec"]["volumeName"]
        assert bound_volume.startswith(f"{local_node}-vol-"), pvc["spec"]
        pv = get(clusters, "consumer", "pv", bound_volume)
        assert pv is not None and pv["spec"]["storageClassName"] == "local-disk"
        assert pv["spec"]["claimRef"]["uid"] == pvc["metadata"]["uid"]
        events = claim_events(clusters, namespace, "scratch")
        said = [e for e in events if e["reason"] == "BoundLocally"]
        assert said and bound_volume in said[0]["message"] and local_node in said[0]["message"], events
        pod = eventually(
            "the first pod running on the local node",
            lambda: (p := pod_of(clusters, namespace, "first")) and p["spec"].get("nodeName") == local_node and p,
            timeout=60,
        )
        assert pod["spec"]["nodeName"] == local_node

        # a GPU pod mounting it may not be offloaded: kept local (Pending: no local node has GPUs), and told
        clusters.create("consumer", job_with("later", namespace, "scratch"))
        later = eventually("the later pod admitted", lambda: pod_of(clusters, namespace, "later"), timeout=30)
        assert later["metadata"]["labels"].get("gpufed.io/kept-local") == "local", later["metadata"]
        terms = later["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
        assert all(
            {"key": "gpufed.io/type", "operator": "NotIn", "values": ["virtual-node"]} in t["matchExpressions"]
            for t in terms["nodeSelectorTerms"]
        ), terms

        def kept_local() -> list[dict[str, Any]]:
            return [
                e for e in claim_events(clusters, namespace, later["metadata"]["name"]) if e["reason"] == "KeptLocal"
            ]

        (event,) = eventually("the KeptLocal Event on the pod", kept_local, timeout=30)
        assert "(scratch)" in event["message"] and "runs on local nodes only" in event["message"], event
        time.sleep(3)
        later = pod_of(clusters, namespace, "later") or later
        assert not later["spec"].get("nodeName"), "never on a virtual node"
        twin_ns = f"{namespace}-{ids['consumer']}"
        for provider in ("gpu-a", "gpu-b"):
            assert get(clusters, provider, "pvc", "scratch", "-n", twin_ns) is None
    finally:
        for kind in ("jobs", "pods", "pvc"):
            clusters.kubectl(
                "consumer", "delete", kind, "--all", "-n", namespace, "--wait=true", "--timeout=60s", check=False
            )
        if bound_volume:
            # the consumer's local-disk class keeps its data (Retain): the volume is Released, then
            # made Available again for the tests that follow
            eventually(
                "the local volume released",
                lambda: (
                    ((get(clusters, "consumer", "pv", bound_volume) or {}).get("status") or {}).get("phase")
                    == "Released"
                ),
                timeout=60,
            )
            clusters.kubectl(
                "consumer",
                "patch",
                "pv",
                bound_volume,
                "--type",
                "json",
                "-p",
                '[{"op": "remove", "path": "/spec/claimRef"}]',
            )


def test_claims_the_provider_cannot_take_are_refused_on_the_claim(
    clusters: Clusters, ids: dict[str, ClusterID], namespace: str
) -> None:
    offload(clusters, namespace)
    pin_a = {REMOTE_CLUSTER_LABEL: ids["gpu-a"]}
    try:
        # a class gpu-a does not offer
        clusters.create("consumer", claim("gold", namespace, **{PROVIDER_STORAGE_CLASS_ANNOTATION: "gold"}))
        clusters.create("consumer", job_with("gold", namespace, "gold", nodeSelector=pin_a))
        # more than the 40Gi gpu-a granted: its quota refuses the claim
        clusters.create("consumer", claim("huge", namespace, size="100Gi"))
        clusters.create("consumer", job_with("huge", namespace, "huge", nodeSelector=pin_a))

        def reasons(name: str) -> set[str]:
            return {e["reason"] for e in claim_events(clusters, namespace, name)}

        eventually("the class refusal", lambda: "StorageNotOffered" in reasons("gold"), timeout=90)
        gold = next(e for e in claim_events(clusters, namespace, "gold") if e["reason"] == "StorageNotOffered")
        assert "does not offer StorageClass 'gold'" in gold["message"] and "local-disk" in gold["message"], gold
        eventually("the quota refusal", lambda: "ProvisioningFailed" in reasons("huge"), timeout=90)
        huge = next(e for e in claim_events(clusters, namespace, "huge") if e["reason"] == "ProvisioningFailed")
        assert "exceeded quota" in huge["message"], huge
        for name in ("gold", "huge"):
            pvc = get(clusters, "consumer", "pvc", name, "-n", namespace)
            assert pvc is not None and pvc["status"]["phase"] == "Pending"
            pod = pod_of(clusters, namespace, name)
            assert pod is not None and not pod["spec"].get("nodeName")
        twin_ns = f"{namespace}-{ids['consumer']}"
        assert get(clusters, "gpu-a", "pvc", "gold", "-n", twin_ns) is None
        assert get(clusters, "gpu-a", "pvc", "huge", "-n", twin_ns) is None
        over_the_claim_count(clusters, ids, namespace)
    finally:
        delete_claims(clusters, namespace)


def over_the_claim_count(clusters: Clusters, ids: dict[str, ClusterID], namespace: str) -> None:
    """One claim more than the twin namespace's quota on gpu-b counts (`persistentvolumeclaims`, one
    per granted pod slot): every claim but one is bound there, and that one is refused by the
    provider's quota, said as a Warning Event on the consumer's claim. The claims carry the node
    kube-scheduler writes for a claim's first pod (one of gpu-b's virtual nodes), so no pod is needed
    to hand them to gpu-b's virtual kubelet."""
    twin_ns = f"{namespace}-{ids['consumer']}"

    def claim_quota() -> tuple[int, int] | None:
        for q in clusters.kubectl_json("gpu-b", "get", "resourcequota", "-n", twin_ns)["items"]:
            status = q.get("status") or {}
            if CLAIMS_RESOURCE in (status.get("hard") or {}):
                hard = int(status["hard"][CLAIMS_RESOURCE])
                used = int((status.get("used") or {}).get(CLAIMS_RESOURCE, 0))
                # the grant is shared by the consumer's twin namespaces on gpu-b: the earlier tests'
                # namespaces are being deleted, and then this one holds it all
                return (hard, used) if hard == GPU_B_PODS else None
        return None

    hard, used = eventually("the twin namespace's claim count quota on gpu-b", claim_quota, timeout=90)
    assert used == 0, used
    nodes = clusters.kubectl_json("consumer", "get", "nodes", "-l", f"{REMOTE_CLUSTER_LABEL}={ids['gpu-b']}")["items"]
    assert nodes, f"no virtual node of {ids['gpu-b']}"
    node = nodes[0]["metadata"]["name"]
    names = [f"many-{i}" for i in range(hard + 1)]
    clusters.create(
        "consumer",
        {
            "apiVersion": "v1",
            "kind": "List",
            "items": [claim(n, namespace, size="1Gi", **{SELECTED_NODE_ANNOTATION: node}) for n in names],
        },
    )

    def outcomes() -> dict[str, set[str]] | None:
        seen = {n: {e["reason"] for e in claim_events(clusters, namespace, n)} for n in names}
        provisioned = [n for n in names if "Provisioned" in seen[n]]
        refused = [n for n in names if "ProvisioningFailed" in seen[n]]
        return seen if len(provisioned) == hard and len(refused) == 1 else None

    seen = eventually("all claims but one bound on gpu-b, one refused", outcomes, timeout=90)
    (refused,) = [n for n in names if "ProvisioningFailed" in seen[n]]
    assert "Provisioned" not in seen[refused], seen
    event = next(e for e in claim_events(clusters, namespace, refused) if e["reason"] == "ProvisioningFailed")
    assert event["type"] == "Warning" and ids["gpu-b"] in event["message"], event
    assert "exceeded quota" in event["message"] and f"{CLAIMS_RESOURCE}=1" in event["message"], event
    pvc = get(clusters, "consumer", "pvc", refused, "-n", namespace)
    assert pvc is not None and pvc["status"]["phase"] == "Pending"
    assert get(clusters, "gpu-b", "pvc", refused, "-n", twin_ns) is None


def test_unoffloading_and_unpeering_refuse_while_claims_keep_data_on_a_provider(
    clusters: Clusters, ids: dict[str, ClusterID], namespace: str
) -> None:
    offload(clusters, namespace)
    twin_ns = f"{namespace}-{ids['consumer']}"
    try:
        clusters.create("consumer", claim("data", namespace))
        clusters.create(
            "consumer", job_with("writer", namespace, "data", nodeSelector={REMOTE_CLUSTER_LABEL: ids["gpu-a"]})
        )
        clusters.kubectl(
            "consumer", "wait", "-n", namespace, "--for=condition=Complete", "job/writer", "--timeout=120s", timeout=130
        )
        kc = ("--kubeconfig", str(clusters.kubeconfig), "--context", "consumer")
        p = gpufed("unoffload-namespace", namespace, *kc)
        assert p.returncode != 0 and "keep their data on providers" in out(p) and f"{namespace}/data" in out(p), out(p)
        assert "--delete-volumes" in out(p)
        p = gpufed(*unpeer_args(clusters, "gpu-a"))
        assert p.returncode != 0 and f"keep their data on provider {ids['gpu-a']}" in out(p), out(p)
        # nothing was removed: the peering, the twin namespace and both claims are all there
        assert get(clusters, "consumer", "pvc", "data", "-n", namespace) is not None
        assert get(clusters, "gpu-a", "pvc", "data", "-n", twin_ns) is not None
        assert get(clusters, "consumer", "foreigncluster", ids["gpu-a"]) is not None
        # the operator names the data loss: the claims go, and their copies on the provider; the
        # finished writer's pod still names the claim, so Kubernetes keeps it until the pod goes
        p = gpufed("unoffload-namespace", namespace, *kc, "--delete-volumes", "--force")
        assert p.returncode == 0 and f"deleted claim {namespace}/data" in out(p), out(p)
        eventually("the provider's claim gone", lambda: get(clusters, "gpu-a", "pvc", "data", "-n", twin_ns) is None)
        clusters.kubectl("consumer", "delete", "job", "writer", "-n", namespace, "--cascade=foreground")
        eventually(
            "the consumer's claim gone", lambda: get(clusters, "consumer", "pvc", "data", "-n", namespace) is None
        )
        eventually("its virtual volume gone", lambda: not volumes_of(clusters, namespace))
    finally:
        delete_claims(clusters, namespace)
