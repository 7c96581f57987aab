"""Dynamic Resource Allocation across the federation, on the real local clusters.

The providers' DRA devices are published as a driver would (the local environment's `dra-publisher`:
ResourceSlices of driver gpu.nvidia.com for gpu-a-h100-3's 8 H100 and gpu-b-l4-3's L4, with product,
memory and MIG-capable attributes; DeviceClass gpu.nvidia.com mapping nvidia.com/gpu), and the
kube-schedulers on both sides allocate for real. What kwok cannot exercise: the kubelet's prepare
step (NodePrepareResources) — a kwok node runs the pod once the scheduler allocated and bound it.

The module peers the consumer with gpu-a (all 32 GPUs) and gpu-b (all 12: an A100 pool and an L4
pool) and offloads one namespace for its duration.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Iterator
from typing import Any

import pytest

from gpufed.apis.wire import DRA_DEVICE_CLASS, DRA_DRIVER, PROVIDER_ALLOCATION_ANNOTATION, ClusterID, twin_namespace
from tests.e2e.conftest import Clusters
from tests.e2e.helpers import eventually, offload, peered_session

pytestmark = pytest.mark.e2e

H100_DRA_NODE = "gpu-a-h100-3"
BIG = "device.capacity['gpu.nvidia.com'].memory.compareTo(quantity('40Gi')) >= 0"
HUGE = "device.capacity['gpu.nvidia.com'].memory.compareTo(quantity('200Gi')) >= 0"


@pytest.fixture(scope="module")
def ids(clusters: Clusters) -> Iterator[dict[str, ClusterID]]:
    yield from peered_session(clusters, {"gpu-a": ("--gpus", "32"), "gpu-b": ("--gpus", "12")})


@pytest.fixture(scope="module")
def namespace(clusters: Clusters, ids: dict[str, ClusterID]) -> Iterator[str]:
    name = f"dra-{secrets.token_hex(3)}"
    clusters.kubectl("consumer", "create", "namespace", name)
    try:
        offload(clusters, name)
        yield name
    finally:
        clusters.kubectl("consumer", "delete", "namespace", name, "--wait=false", check=False)


def node_a(ids: dict[str, ClusterID]) -> str:
    return f"gpufed-{ids['gpu-a']}"


def node_l4(ids: dict[str, ClusterID]) -> str:
    return f"gpufed-{ids['gpu-b']}-nvidia-l4"


def published(clusters: Clusters, node: str) -> list[dict[str, Any]]:
    got = clusters.kubectl("consumer", "get", "resourceslices.resource.k8s.io", node, "-o", "json", check=False)
    if got.returncode != 0:
        return []
    s = json.loads(got.stdout)
    assert s["spec"]["driver"] == DRA_DRIVER and s["spec"]["nodeName"] == node
    devices: list[dict[str, Any]] = s["spec"].get("devices") or []  # an empty pool is published without
    return devices


def claim(name: str, namespace: str, expression: str, **extra: Any) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": _request(expression)}], **extra}},
    }


def _request(expression: str) -> dict[str, Any]:
    return {"deviceClassName": DRA_DEVICE_CLASS, "selectors": [{"cel": {"expression": expression}}]}


def pod_with_claim(name: str, namespace: str, claim_name: str, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "containers": [
                {
                    "name": "main",
                    "image": "trainer:1",
                    "resources": {"requests": {"cpu": "100m", "memory": "64Mi"}, "claims": [{"name": "gpu"}]},
                }
            ],
            "resourceClaims": [{"name": "gpu", "resourceClaimName": claim_name}],
            **spec,
        },
    }


def pod_status(clusters: Clusters, namespace: str, name: str) -> dict[str, Any]:
    got: dict[str, Any] = clusters.kubectl_json("consumer", "get", "pod", name, "-n", namespace)
    return got


def running(clusters: Clusters, namespace: str, name: str) -> bool:
    return bool(pod_status(clusters, namespace, name).get("status", {}).get("phase") == "Running")


def twin_claim(clusters: Clusters, ids: dict[str, ClusterID], provider: str, namespace: str, name: str) -> Any:
    twin = twin_namespace(namespace, ids["consumer"])
    got = clusters.kubectl(
        provider, "get", "resourceclaims.resource.k8s.io", name, "-n", twin, "-o", "json", check=False
    )
    return json.loads(got.stdout) if got.returncode == 0 else None


def events_of(clusters: Clusters, namespace: str, kind: str, name: str) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = clusters.kubectl_json(
        "consumer",
        "get",
        "events",
        "-n",
        namespace,
        "--field-selector",
        f"involvedObject.kind={kind},involvedObject.name={name}",
    )["items"]
    return items


def test_pool_nodes_publish_the_providers_devices_under_gpufeds_driver(
    clusters: Clusters, ids: dict[str, ClusterID]
) -> None:
    cls = clusters.kubectl_json("consumer", "get", "deviceclasses.resource.k8s.io", DRA_DEVICE_CLASS)
    assert cls["spec"]["selectors"] == [{"cel": {"expression": f"device.driver == '{DRA_DRIVER}'"}}]
    a = eventually(
        "gpu-a's 8 DRA H100 published on its pool node",
        lambda: len(published(clusters, node_a(ids))) == 8 and published(clusters, node_a(ids)),
    )
    attributes = a[0]["attributes"]
    assert attributes["gpu.nvidia.com/productName"] == {"string": "NVIDIA-H100-80GB-HBM3"}
    assert attributes["gpu.nvidia.com/migCapable"] == {"bool": True}
    assert attributes["provider"] == {"string": ids["gpu-a"]} and attributes["deviceClass"] == {
        "string": "gpu.nvidia.com"
    }
    assert not any("uuid" in k or "index" in k for k in attributes), attributes  # no device identities cross
    assert a[0]["capacity"]["gpu.nvidia.com/memory"] == {"value": "81559Mi"}
    owners = clusters.kubectl_json("consumer", "get", "resourceslices.resource.k8s.io", node_a(ids))["metadata"]
    # owned by the peering's ForeignCluster (as the node is): unpeering deletes it with the node
    assert [(o["kind"], o["name"]) for o in owners["ownerReferences"]] == [("ForeignCluster", ids["gpu-a"])]
    l4 = eventually("gpu-b's DRA L4 published on the L4 pool", lambda: published(clusters, node_l4(ids)))
    assert [d["attributes"]["gpu.nvidia.com/productName"]["string"] for d in l4] == ["NVIDIA-L4"]
    # A100s are not DRA-managed: their pool offers no device
    assert published(clusters, f"gpufed-{ids['gpu-b']}-nvidia-a100-sxm4-40gb") == []


def test_a_40gi_claim_lands_on_an_h100_and_the_consumer_sees_the_real_device(
    clusters: Clusters, ids: dict[str, ClusterID], namespace: str
) -> None:
    clusters.create("consumer", claim("big", namespace, BIG))
    clusters.create("consumer", pod_with_claim("big-user", namespace, "big"))
    eventually("the pod runs", lambda: running(clusters, namespace, "big-user"), timeout=90)
    assert pod_status(clusters, namespace, "big-user")["spec"]["nodeName"] == node_a(ids)  # never the L4 pool
    local = clusters.kubectl_json("consumer", "get", "resourceclaims.resource.k8s.io", "big", "-n", namespace)
    (result,) = local["status"]["allocation"]["devices"]["results"]
    assert (result["driver"], result["pool"]) == (DRA_DRIVER, node_a(ids))
    twin = eventually(
        "the twin claim allocated at gpu-a",
        lambda: (
            (t := twin_claim(clusters, ids, "gpu-a", namespace, "big")) and t.get("status", {}).get("allocation") and t
        ),
    )
    assert twin["spec"]["devices"]["requests"][0]["exactly"]["deviceClassName"] == "gpu.nvidia.com"
    (real,) = twin["status"]["allocation"]["devices"]["results"]
    assert (real["driver"], real["pool"]) == ("gpu.nvidia.com", H100_DRA_NODE)
    shown = f"{ids['gpu-a']}: gpu.nvidia.com/{H100_DRA_NODE}/{real['device']}"

    def annotated() -> bool:
        c = clusters.kubectl_json("consumer", "get", "resourceclaims.resource.k8s.io", "big", "-n", namespace)
        return (c["metadata"].get("annotations") or {}).get(PROVIDER_ALLOCATION_ANNOTATION) == shown

    eventually("the consumer's claim shows the provider's device", annotated)
    eventually(
        "an Event says so",
        lambda: any(e["reason"] == "ProviderAllocated" for e in events_of(clusters, namespace, "ResourceClaim", "big")),
    )
    # Deleting the pod releases the devices on both sides.
    clusters.kubectl("consumer", "delete", "pod", "big-user", "-n", namespace, "--wait=true", timeout=120)
    eventually(
        "the twin claim is gone with its last pod",
        lambda: twin_claim(clusters, ids, "gpu-a", namespace, "big") is None,
        timeout=90,
    )
    clusters.kubectl("consumer", "delete", "resourceclaim.resource.k8s.io", "big", "-n", namespace)


def test_a_job_of_two_pods_gets_two_claims_from_its_template_allocated_on_one_provider(
    clusters: Clusters, ids: dict[str, ClusterID], namespace: str
) -> None:
    template = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": "one-h100", "namespace": namespace},
        "spec": {"spec": {"devices": {"requests": [{"name": "gpu", "exactly": _request(BIG)}]}}},
    }
    clusters.create("consumer", template)
    pod = pod_with_claim("x", namespace, "x")["spec"]
    pod["resourceClaims"] = [{"name": "gpu", "resourceClaimTemplateName": "one-h100"}]
    job = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": "pair", "namespace": namespace},
        "spec": {"parallelism": 2, "completions": 2, "template": {"spec": {**pod, "restartPolicy": "Never"}}},
    }
    clusters.create("consumer", job)

    def twins_allocated() -> list[dict[str, Any]] | None:
        pods = clusters.kubectl_json("consumer", "get", "pods", "-n", namespace, "-l", "job-name=pair")["items"]
        names = [s["resourceClaimName"] for p in pods for s in p.get("status", {}).get("resourceClaimStatuses") or []]
        if len(names) != 2:
            return None
        twins = [twin_claim(clusters, ids, "gpu-a", namespace, n) for n in names]
        if not all(t and t.get("status", {}).get("allocation") for t in twins):
            return None
        return twins

    twins = eventually("two claims, two twins, both allocated at gpu-a", twins_allocated, timeout=120)
    devices = {r["device"] for t in twins for r in t["status"]["allocation"]["devices"]["results"]}
    pools = {r["pool"] for t in twins for r in t["status"]["allocation"]["devices"]["results"]}
    assert len(devices) == 2 and pools == {H100_DRA_NODE}
    eventually(
        "the Job completes",
        lambda: (
            clusters.kubectl_json("consumer", "get", "job", "pair", "-n", namespace).get("status", {}).get("succeeded")
            == 2
        ),
        timeout=120,
    )
    clusters.kubectl(
        "consumer", "delete", "job", "pair", "-n", namespace, "--cascade=foreground", "--wait=true", timeout=120
    )


def test_a_claim_no_provider_device_matches_waits_with_the_reason(
    clusters: Clusters, ids: dict[str, ClusterID], namespace: str
) -> None:
    clusters.create("consumer", claim("huge", namespace, HUGE))
    clusters.create("consumer", pod_with_claim("huge-user", namespace, "huge"))

    def unschedulable() -> str | None:
        conditions = pod_status(clusters, namespace, "huge-user").get("status", {}).get("conditions") or []
        c = next((c for c in conditions if c["type"] == "PodScheduled"), None)
        return c["message"] if c and c["status"] == "False" and c.get("reason") == "Unschedulable" else None

    message = eventually("the pod waits unschedulable", unschedulable)
    assert "cannot allocate all claims" in message, message
    clusters.kubectl("consumer", "delete", "pod", "huge-user", "-n", namespace, "--wait=false")


def test_a_claim_shared_with_a_pod_on_another_provider_is_refused(
    clusters: Clusters, ids: dict[str, ClusterID], namespace: str
) -> None:
    clusters.create("consumer", claim("shared", namespace, BIG))
    clusters.create("consumer", pod_with_claim("first", namespace, "shared"))
    eventually("the first pod runs on gpu-a", lambda: running(clusters, namespace, "first"), timeout=90)
    # The second pod names gpu-b's L4 pool itself (no scheduler to keep it by the claim's devices).
    second = pod_with_claim("second", namespace, "shared", nodeName=node_l4(ids))
    clusters.create("consumer", second)

    def refused() -> str | None:
        return next(
            (
                e["message"]
                for e in events_of(clusters, namespace, "Pod", "second")
                if e["reason"] == "ClaimNotOffloadable"
            ),
            None,
        )

    message = eventually("the second pod is refused with the reason", refused, timeout=60)
    assert f"not on virtual node {node_l4(ids)}" in message, message
    twin = twin_namespace(namespace, ids["consumer"])
    assert clusters.kubectl("gpu-b", "get", "pod", "second", "-n", twin, check=False).returncode != 0
    for name in ("second", "first"):
        clusters.kubectl("consumer", "delete", "pod", name, "-n", namespace, "--wait=false")


def test_published_devices_follow_the_providers_own_load(clusters: Clusters, ids: dict[str, ClusterID]) -> None:
    eventually("all 8 H100 devices offered", lambda: len(published(clusters, node_a(ids))) == 8)
    # A provider workload asking nvidia.com/gpu: 8 on the DRA node (the 1.36 extended-resource mapping).
    own = f"own-{secrets.token_hex(3)}"
    local: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": own, "namespace": "default"},
        "spec": {
            "nodeSelector": {"kubernetes.io/hostname": H100_DRA_NODE},
            "tolerations": [{"operator": "Exists"}],
            "containers": [{"name": "main", "image": "trainer:1", "resources": {"limits": {"nvidia.com/gpu": "8"}}}],
        },
    }
    clusters.create("gpu-a", local)
    try:
        eventually(
            "the provider's pod runs on DRA GPUs",
            lambda: (
                clusters.kubectl_json("gpu-a", "get", "pod", own, "-n", "default").get("status", {}).get("phase")
                == "Running"
            ),
            timeout=60,
        )
        eventually("the pool node offers none of them", lambda: published(clusters, node_a(ids)) == [], timeout=30)
    finally:
        clusters.kubectl("gpu-a", "delete", "pod", own, "-n", "default", "--grace-period=0", "--wait=true")
    eventually("offered again once the load ends", lambda: len(published(clusters, node_a(ids))) == 8, timeout=30)


def test_pods_asking_nvidia_gpu_fill_every_gpu_including_the_dra_managed_ones(
    clusters: Clusters, ids: dict[str, ClusterID], namespace: str
) -> None:
    """4 pods x 8 GPUs take gpu-a's whole grant of 32: three device-plugin nodes and the DRA node
    (the provider's scheduler makes a claim for the pod's nvidia.com/gpu there); no GPU is counted twice."""
    for i in range(4):
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": f"full-{i}", "namespace": namespace},
            "spec": {
                "nodeSelector": {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"},
                "containers": [
                    {"name": "main", "image": "trainer:1", "resources": {"limits": {"nvidia.com/gpu": "8"}}}
                ],
            },
        }
        clusters.create("consumer", pod)
    try:
        eventually(
            "all four run", lambda: all(running(clusters, namespace, f"full-{i}") for i in range(4)), timeout=120
        )
        twin = twin_namespace(namespace, ids["consumer"])
        twins = clusters.kubectl_json("gpu-a", "get", "pods", "-n", twin)["items"]
        on = {p["metadata"]["name"]: p["spec"]["nodeName"] for p in twins if p["metadata"]["name"].startswith("full-")}
        assert sorted(on.values()) == [f"gpu-a-h100-{i}" for i in range(4)], on
        dra_pod = next(p for p in twins if p["spec"].get("nodeName") == H100_DRA_NODE)
        assert dra_pod["status"].get("extendedResourceClaimStatus"), dra_pod["status"]
        eventually("the pool node offers no device while they run", lambda: published(clusters, node_a(ids)) == [])
    finally:
        for i in range(4):
            clusters.kubectl("consumer", "delete", "pod", f"full-{i}", "-n", namespace, "--wait=false", check=False)
    eventually("every device offered again", lambda: len(published(clusters, node_a(ids))) == 8, timeout=90)
