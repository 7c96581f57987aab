"""Attacks from the CONSUMER position on the providers' storage, on the real local clusters: the
consumer's identity (the user `gpufed:consumer:<id>` of its client certificate, group
`gpufed:consumers`, here through impersonation by the provider's admin, as
tests/e2e/attacks/test_consumer_admission.py does) writes PersistentVolumeClaims straight into its
twin namespaces, skipping everything its own virtual kubelet would check.

What refuses each attack is the provider's own API server: the ValidatingAdmissionPolicy
`gpufed-consumer-claims` (the StorageClasses and access modes offered with the storage grant, as the
provider's controller projects them onto the twin namespace; no chosen volume, no label selector,
no data source) and the grant's ResourceQuota (`requests.storage`, `persistentvolumeclaims`). Each
test is one attack; it asserts the refusal, its words, and that no claim was created. Beside them:
the grant and its offer as the consumer sees them, a legitimate claim admitted, the same attack
admitted when the provider's admin writes it (the policy confines consumers only), and a claim
bound by the provider's own scheduler and PersistentVolume controller to one of the local static
volumes once a pod uses it.

The module peers the consumer with gpu-a asking for 40Gi of storage and with gpu-b asking for none,
and offloads one namespace to each for its duration.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Iterator
from typing import Any

import pytest

from gpufed.apis.wire import (
    OFFERED_STORAGE_ACCESS_MODES_ANNOTATION,
    OFFERED_STORAGE_CLASSES_ANNOTATION,
    ClusterID,
    twin_namespace,
)
from gpufed.localenv.storage import STORAGE_CLASS
from peering import podsecurity
from peering.handshake import CONSUMER_GROUP, consumer_user
from tests.e2e.conftest import Clusters
from tests.e2e.helpers import eventually, offload, peered_session

pytestmark = pytest.mark.e2e

GRANTED = "40Gi"
POLICY = f"ValidatingAdmissionPolicy '{podsecurity.CLAIMS_POLICY_NAME}'"


@pytest.fixture(scope="module")
def ids(clusters: Clusters) -> Iterator[dict[str, ClusterID]]:
    yield from peered_session(clusters, {"gpu-a": ("--gpus", "8", "--storage", GRANTED), "gpu-b": ("--gpus", "4")})


def as_consumer(ids: dict[str, ClusterID]) -> list[str]:
    return [f"--as={consumer_user(ids['consumer'])}", f"--as-group={CONSUMER_GROUP}"]


def offloaded(clusters: Clusters, ids: dict[str, ClusterID], provider: str) -> Iterator[str]:
    """A consumer namespace offloaded to `provider` only; its twin there once open to the consumer."""
    namespace = f"st-{provider}-{secrets.token_hex(3)}"
    clusters.kubectl("consumer", "create", "namespace", namespace)
    try:
        offload(clusters, namespace, "--selector", f"gpufed.io/remote-cluster-id={ids[provider]}")
        twin = twin_namespace(namespace, ids["consumer"])

        def opened() -> bool:
            p = clusters.kubectl(
                provider,
                "auth",
                "can-i",
                "create",
                "persistentvolumeclaims",
                "-n",
                twin,
                *as_consumer(ids),
                check=False,
            )
            return p.stdout.strip() == "yes"

        eventually(f"twin namespace {twin} open to the consumer's claims", opened, timeout=90)
        yield twin
    finally:
        clusters.kubectl("consumer", "delete", "namespace", namespace, "--wait=false", check=False)


@pytest.fixture(scope="module")
def twin_a(clusters: Clusters, ids: dict[str, ClusterID]) -> Iterator[str]:
    for twin in offloaded(clusters, ids, "gpu-a"):
        offer_projected(clusters, twin)
        yield twin


def offer_projected(clusters: Clusters, twin: str) -> None:
    def offered() -> bool:
        return ns_annotations(clusters, "gpu-a", twin).get(OFFERED_STORAGE_CLASSES_ANNOTATION) == STORAGE_CLASS

    eventually(f"the storage offer projected onto {twin}", offered)


@pytest.fixture(scope="module")
def twin_b(clusters: Clusters, ids: dict[str, ClusterID]) -> Iterator[str]:
    yield from offloaded(clusters, ids, "gpu-b")


def ns_annotations(clusters: Clusters, context: str, namespace: str) -> dict[str, str]:
    ns = clusters.kubectl_json(context, "get", "namespace", namespace)
    found: dict[str, str] = ns["metadata"].get("annotations") or {}
    return found


def claim(name: str, namespace: str, size: str = "1Gi", **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "storageClassName": STORAGE_CLASS,
            "accessModes": ["ReadWriteOnce"],
            "resources": {"requests": {"storage": size}},
            **spec,
        },
    }


def attempt(clusters: Clusters, ids: dict[str, ClusterID], provider: str, obj: dict[str, Any]) -> str:
    """Create `obj` on `provider` as the consumer; it must be refused, and nothing created. The refusal."""
    p = clusters.kubectl(provider, "create", "-f", "-", *as_consumer(ids), input_text=json.dumps(obj), check=False)
    assert p.returncode != 0, f"claim {obj['metadata']['name']} was admitted:\n{p.stdout}"
    meta = obj["metadata"]
    got = clusters.kubectl(provider, "get", "pvc", meta["name"], "-n", meta["namespace"], check=False)
    assert got.returncode != 0 and "NotFound" in got.stderr, f"claim {meta['name']} exists:\n{got.stdout}"
    return p.stderr


def refused_by_policy(clusters: Clusters, ids: dict[str, ClusterID], obj: dict[str, Any], words: str) -> None:
    stderr = attempt(clusters, ids, "gpu-a", obj)
    assert POLICY in stderr and words in stderr, stderr


def some_volume(clusters: Clusters) -> str:
    """One of gpu-a's static local volumes (gpufed.localenv.storage)."""
    volumes = clusters.kubectl_json("gpu-a", "get", "pv", "-l", "gpufed.io/local-storage=true")["items"]
    assert volumes, "gpu-a has no local volumes"
    return str(volumes[0]["metadata"]["name"])


# ---------------------------------------------------------------------------- the grant


def test_the_grant_offers_the_providers_default_class(clusters: Clusters, ids: dict[str, ClusterID]) -> None:
    sl = clusters.kubectl_json("consumer", "get", "resourceslices.gpufed.io", ids["gpu-a"], "-n", "gpufed")
    assert sl["status"]["granted"]["storage"] == GRANTED, sl["status"]
    assert sl["status"]["storageClasses"] == [
        {"name": STORAGE_CLASS, "default": True, "accessModes": ["ReadWriteOnce"]}
    ]
    other = clusters.kubectl_json("consumer", "get", "resourceslices.gpufed.io", ids["gpu-b"], "-n", "gpufed")
    assert "storage" not in other["status"].get("granted", {}) and not other["status"].get("storageClasses")


def test_a_claim_of_the_offered_class_is_admitted(clusters: Clusters, ids: dict[str, ClusterID], twin_a: str) -> None:
    assert ns_annotations(clusters, "gpu-a", twin_a)[OFFERED_STORAGE_ACCESS_MODES_ANNOTATION] == (
        f"{STORAGE_CLASS}:ReadWriteOnce"
    )
    obj = claim("legit", twin_a)
    clusters.kubectl("gpu-a", "create", "-f", "-", *as_consumer(ids), input_text=json.dumps(obj))
    got = clusters.kubectl_json("gpu-a", "get", "pvc", "legit", "-n", twin_a)
    assert got["spec"]["storageClassName"] == STORAGE_CLASS
    quota = clusters.kubectl_json("gpu-a", "get", "resourcequota", "gpufed-grant", "-n", twin_a)
    assert quota["spec"]["hard"]["requests.storage"] == GRANTED, "the only twin holds the whole storage grant"
    clusters.kubectl("gpu-a", "delete", "pvc", "legit", "-n", twin_a, *as_consumer(ids))


# ---------------------------------------------------------------------------- the attacks


def test_a_class_that_is_not_offered_is_refused(clusters: Clusters, ids: dict[str, ClusterID], twin_a: str) -> None:
    # A real class of gpu-a, not offered to the consumer (its Tenant offers the default class only).
    other = f"premium-{secrets.token_hex(3)}"
    clusters.create(
        "gpu-a",
        {
            "apiVersion": "storage.k8s.io/v1",
            "kind": "StorageClass",
            "metadata": {"name": other},
            "provisioner": "kubernetes.io/no-provisioner",
            "volumeBindingMode": "WaitForFirstConsumer",
        },
    )
    try:
        words = f"StorageClass {other} is not offered to this consumer in namespace {twin_a} (offered: {STORAGE_CLASS})"
        refused_by_policy(clusters, ids, claim("other-class", twin_a, storageClassName=other), words)
        words = (
            f"a claim must name one of the offered StorageClasses in spec.storageClassName (offered: {STORAGE_CLASS})"
        )
        refused_by_policy(clusters, ids, claim("no-class", twin_a, storageClassName=""), words)
    finally:
        clusters.kubectl("gpu-a", "delete", "storageclass", other, check=False)


def test_binding_to_a_chosen_volume_is_refused(clusters: Clusters, ids: dict[str, ClusterID], twin_a: str) -> None:
    volume = some_volume(clusters)
    obj = claim("chosen", twin_a, volumeName=volume)
    refused_by_policy(clusters, ids, obj, f"spec.volumeName {volume} is refused")
    # The provider's own admin is not confined by the policy (a server-side dry run: nothing is created).
    p = clusters.kubectl("gpu-a", "create", "--dry-run=server", "-f", "-", input_text=json.dumps(obj), check=False)
    assert p.returncode == 0, p.stderr
    selector = {"matchLabels": {"gpufed.io/local-node": "any"}}
    refused_by_policy(clusters, ids, claim("picked", twin_a, selector=selector), "spec.selector is refused")


def test_cloning_another_claim_is_refused(clusters: Clusters, ids: dict[str, ClusterID], twin_a: str) -> None:
    clusters.kubectl("gpu-a", "create", "-f", "-", *as_consumer(ids), input_text=json.dumps(claim("source", twin_a)))
    try:
        source = {"kind": "PersistentVolumeClaim", "name": "source"}
        words = "spec.dataSource and spec.dataSourceRef are refused (PersistentVolumeClaim source)"
        refused_by_policy(clusters, ids, claim("clone", twin_a, dataSource=source), words)
        refused_by_policy(clusters, ids, claim("clone-ref", twin_a, dataSourceRef=source), words)
    finally:
        clusters.kubectl("gpu-a", "delete", "pvc", "source", "-n", twin_a, "--wait=false", check=False)


def test_an_access_mode_that_is_not_offered_is_refused(
    clusters: Clusters, ids: dict[str, ClusterID], twin_a: str
) -> None:
    obj = claim("shared", twin_a, accessModes=["ReadWriteOnce", "ReadWriteMany"])
    words = f"access modes ReadWriteMany are not offered for StorageClass {STORAGE_CLASS} (offered: ReadWriteOnce)"
    refused_by_policy(clusters, ids, obj, words)


def test_a_claim_over_the_storage_quota_is_refused(clusters: Clusters, ids: dict[str, ClusterID], twin_a: str) -> None:
    stderr = attempt(clusters, ids, "gpu-a", claim("huge", twin_a, size="41Gi"))
    assert "exceeded quota: gpufed-grant" in stderr and "requested: requests.storage=41Gi" in stderr, stderr
    assert "limited: requests.storage=" in stderr, stderr


def test_no_storage_granted_refuses_every_claim(clusters: Clusters, ids: dict[str, ClusterID], twin_b: str) -> None:
    assert ns_annotations(clusters, "gpu-b", twin_b)[OFFERED_STORAGE_CLASSES_ANNOTATION] == ""
    stderr = attempt(clusters, ids, "gpu-b", claim("any", twin_b))
    words = f"PersistentVolumeClaims are refused in namespace {twin_b}: this consumer has no storage grant here"
    assert POLICY in stderr and words in stderr, stderr
    quota = clusters.kubectl_json("gpu-b", "get", "resourcequota", "gpufed-grant", "-n", twin_b)
    assert quota["spec"]["hard"]["requests.storage"] == quota["spec"]["hard"]["persistentvolumeclaims"] == "0"


# ---------------------------------------------------------------------------- the local volumes


def test_a_claim_binds_to_a_local_volume_of_the_node_its_pod_lands_on(
    clusters: Clusters, ids: dict[str, ClusterID], twin_a: str
) -> None:
    clusters.kubectl("gpu-a", "create", "-f", "-", *as_consumer(ids), input_text=json.dumps(claim("data", twin_a)))
    pvc = clusters.kubectl_json("gpu-a", "get", "pvc", "data", "-n", twin_a)
    assert pvc["status"]["phase"] == "Pending", "WaitForFirstConsumer: nothing is bound before a pod uses it"
    # The provider's admin runs the pod here (the consumer's pods come through its virtual kubelet).
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "uses-data", "namespace": twin_a},
        "spec": {
            "containers": [
                {
                    "name": "main",
                    "image": "registry.example/app:1",
                    "volumeMounts": [{"name": "d", "mountPath": "/data"}],
                }
            ],
            "volumes": [{"name": "d", "persistentVolumeClaim": {"claimName": "data"}}],
        },
    }
    clusters.create("gpu-a", pod)
    try:
        clusters.kubectl(
            "gpu-a",
            "wait",
            "-n",
            twin_a,
            "--for=jsonpath={.status.phase}=Bound",
            "pvc/data",
            "--timeout=60s",
            timeout=70,
        )
        clusters.kubectl(
            "gpu-a", "wait", "-n", twin_a, "--for=condition=Ready", "pod/uses-data", "--timeout=60s", timeout=70
        )
        node = clusters.kubectl_json("gpu-a", "get", "pod", "uses-data", "-n", twin_a)["spec"]["nodeName"]
        volume = clusters.kubectl_json("gpu-a", "get", "pvc", "data", "-n", twin_a)["spec"]["volumeName"]
        pv = clusters.kubectl_json("gpu-a", "get", "pv", volume)
        assert pv["metadata"]["labels"]["gpufed.io/local-node"] == node, "the volume is on the pod's node"
        assert pv["spec"]["storageClassName"] == STORAGE_CLASS
    finally:
        clusters.kubectl(
            "gpu-a", "delete", "pod", "uses-data", "-n", twin_a, "--grace-period=0", "--force", check=False
        )
        clusters.kubectl("gpu-a", "delete", "pvc", "data", "-n", twin_a, "--wait=false", check=False)
