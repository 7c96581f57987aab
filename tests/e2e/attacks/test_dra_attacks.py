"""Attacks from the CONSUMER position on the providers' DRA devices, on the real local clusters: the
consumer's identity (user `gpufed:consumer:<id>`, group `gpufed:consumers`, here through
impersonation by the provider's admin) writes ResourceClaims and pods straight into its twin
namespace, skipping everything its own virtual kubelet would check.

What refuses each attack is the provider's own API server: the ValidatingAdmissionPolicy
`gpufed-consumer-device-claims` (no admin access, no driver configuration, exact counts of at most
16 devices, no prioritized lists), the pod policy `gpufed-offload-policy` (claims by name only, never
a template a pod could make claims from), RBAC (no claim status, no namespace labels such as DRA's
admin-access label), and the grant's quota (Kubernetes counts a claim of a class that maps
nvidia.com/gpu against `requests.nvidia.com/gpu`). Each test asserts the refusal, its words, and that
nothing was created. Beside them: a legitimate claim admitted.

The provider-position attacks (device groups with forged names, reserved attribute domains,
oversized values; allocations with names that are no DNS names) are refused in pure code, tested in
tests/unit/vkprovider/forge/test_devices.py and test_dra_claims.py.

The module peers the consumer with gpu-a asking for 8 GPUs and offloads one namespace to it.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Iterator
from typing import Any

import pytest

from gpufed.apis.wire import ClusterID, twin_namespace
from peering import podsecurity
from peering.handshake import CONSUMER_GROUP, consumer_user
from tests.e2e.conftest import Clusters
from tests.e2e.helpers import eventually, offload, peered_session

pytestmark = pytest.mark.e2e

POLICY = f"ValidatingAdmissionPolicy '{podsecurity.DEVICE_CLAIMS_POLICY_NAME}'"
GRANTED_GPUS = 8


@pytest.fixture(scope="module")
def ids(clusters: Clusters) -> Iterator[dict[str, ClusterID]]:
    yield from peered_session(clusters, {"gpu-a": ("--gpus", str(GRANTED_GPUS))})


def as_consumer(ids: dict[str, ClusterID]) -> list[str]:
    return [f"--as={consumer_user(ids['consumer'])}", f"--as-group={CONSUMER_GROUP}"]


@pytest.fixture(scope="module")
def twin(clusters: Clusters, ids: dict[str, ClusterID]) -> Iterator[str]:
    namespace = f"dra-at-{secrets.token_hex(3)}"
    clusters.kubectl("consumer", "create", "namespace", namespace)
    try:
        offload(clusters, namespace)
        name = twin_namespace(namespace, ids["consumer"])

        def opened() -> bool:
            p = clusters.kubectl(
                "gpu-a",
                "auth",
                "can-i",
                "create",
                "resourceclaims.resource.k8s.io",
                "-n",
                name,
                *as_consumer(ids),
                check=False,
            )
            return p.stdout.strip() == "yes"

        eventually(f"twin namespace {name} open to the consumer's resource claims", opened, timeout=90)
        yield name
    finally:
        clusters.kubectl("consumer", "delete", "namespace", namespace, "--wait=false", check=False)


def claim(name: str, namespace: str, request: dict[str, Any] | None = None, **devices: Any) -> dict[str, Any]:
    exactly = {"deviceClassName": "gpu.nvidia.com", **(request or {})}
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": exactly}], **devices}},
    }


def refused(clusters: Clusters, ids: dict[str, ClusterID], obj: dict[str, Any], *words: str) -> str:
    p = clusters.kubectl("gpu-a", "create", "-f", "-", *as_consumer(ids), input_text=json.dumps(obj), check=False)
    assert p.returncode != 0, f"{obj['kind']} {obj['metadata']['name']} was admitted:\n{p.stdout}"
    meta = obj["metadata"]
    kind = "resourceclaims.resource.k8s.io" if obj["kind"] == "ResourceClaim" else "pod"
    got = clusters.kubectl("gpu-a", "get", kind, meta["name"], "-n", meta["namespace"], check=False)
    assert got.returncode != 0 and "NotFound" in got.stderr, f"{meta['name']} exists:\n{got.stdout}"
    for w in words:
        assert w in p.stderr, p.stderr
    return p.stderr


def test_admin_access_is_refused(clusters: Clusters, ids: dict[str, ClusterID], twin: str) -> None:
    # Kubernetes refuses it first (the twin namespace lacks DRA's admin-access label, which the
    # consumer cannot set: see the last test); gpufed's policy refuses it in a labelled namespace too.
    stderr = refused(clusters, ids, claim("admin", twin, {"adminAccess": True}))
    assert "adminAccess" in stderr and "Forbidden" in stderr, stderr


def test_all_devices_is_refused(clusters: Clusters, ids: dict[str, ClusterID], twin: str) -> None:
    refused(clusters, ids, claim("every", twin, {"allocationMode": "All"}), POLICY, "allocationMode All is refused")


def test_more_than_a_nodes_worth_of_devices_in_one_request_is_refused(
    clusters: Clusters, ids: dict[str, ClusterID], twin: str
) -> None:
    refused(clusters, ids, claim("many", twin, {"count": 17}), POLICY, "at most 16 devices")


def test_driver_configuration_is_refused(clusters: Clusters, ids: dict[str, ClusterID], twin: str) -> None:
    config = [{"opaque": {"driver": "gpu.nvidia.com", "parameters": {"sharing": {"strategy": "MPS"}}}}]
    refused(clusters, ids, claim("tuned", twin, config=config), POLICY, "driver configuration")


def test_a_prioritized_list_is_refused(clusters: Clusters, ids: dict[str, ClusterID], twin: str) -> None:
    obj = claim("either", twin)
    obj["spec"]["devices"]["requests"] = [
        {"name": "gpu", "firstAvailable": [{"name": "a", "deviceClassName": "gpu.nvidia.com"}]}
    ]
    refused(clusters, ids, obj, POLICY, "prioritized lists")


def test_more_devices_than_the_grant_are_refused_by_the_quota(
    clusters: Clusters, ids: dict[str, ClusterID], twin: str
) -> None:
    # The namespace's share of the grant (split over the consumer's twin namespaces, so it may grow
    # while other twin namespaces go): a legitimate claim takes it, and one more than the whole grant
    # leaves is refused whatever the share is by then.
    quota = clusters.kubectl_json("gpu-a", "get", "resourcequota", "gpufed-grant", "-n", twin)
    share = int(quota["spec"]["hard"]["requests.nvidia.com/gpu"])
    assert 0 < share <= GRANTED_GPUS, quota["spec"]["hard"]
    ok = claim(f"fits-{secrets.token_hex(2)}", twin, {"count": share})
    p = clusters.kubectl("gpu-a", "create", "-f", "-", *as_consumer(ids), input_text=json.dumps(ok), check=False)
    assert p.returncode == 0, p.stderr  # a legitimate claim, the whole grant
    try:
        refused(
            clusters,
            ids,
            claim("beyond", twin, {"count": GRANTED_GPUS - share + 1}),
            "exceeded quota",
            "requests.nvidia.com/gpu",
        )
    finally:
        clusters.kubectl("gpu-a", "delete", "resourceclaims.resource.k8s.io", ok["metadata"]["name"], "-n", twin)


def test_a_pod_may_not_make_claims_from_a_template(clusters: Clusters, ids: dict[str, ClusterID], twin: str) -> None:
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "templated", "namespace": twin},
        "spec": {
            "containers": [{"name": "main", "image": "x:1", "resources": {"claims": [{"name": "gpu"}]}}],
            "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "anything"}],
        },
    }
    refused(clusters, ids, pod, podsecurity.POLICY_NAME, "spec.resourceClaims gpu")


def test_claim_status_and_the_admin_access_label_are_out_of_reach(
    clusters: Clusters, ids: dict[str, ClusterID], twin: str
) -> None:
    for verb, resource in (("update", "resourceclaims/status"), ("patch", "namespaces")):
        p = clusters.kubectl(
            "gpu-a",
            "auth",
            "can-i",
            verb,
            f"{resource}.resource.k8s.io" if "claims" in resource else resource,
            "-n",
            twin,
            *as_consumer(ids),
            check=False,
        )
        assert p.stdout.strip() == "no", (verb, resource, p.stdout)
    label = clusters.kubectl(
        "gpu-a", "label", "namespace", twin, "resource.kubernetes.io/admin-access=true", *as_consumer(ids), check=False
    )
    assert label.returncode != 0 and "forbidden" in label.stderr.lower(), label.stderr
