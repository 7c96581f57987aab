"""The rules and their projection (peering.podsecurity): a tenant's policy projected onto its
namespaces (gpufed's labels and annotations, Pod Security Admission's labels beside them) and
`describe`. The admission policies rendered from them: tests/unit/peering/admission/.
"""

from __future__ import annotations

import pytest

from gpufed.apis.offloading import OffloadPodSecurity
from gpufed.apis.peering import StorageClassOffer
from gpufed.apis.wire import OFFERED_STORAGE_ACCESS_MODES_ANNOTATION, OFFERED_STORAGE_CLASSES_ANNOTATION
from peering import podsecurity as ps

DEFAULT = OffloadPodSecurity()


# ---- the projection


def test_the_default_policy_is_projected_fail_closed_with_pod_security_admission_beside_it() -> None:
    labels, annotations = ps.namespace_metadata(DEFAULT)
    assert labels == {
        ps.ALLOW_PRIVILEGED_LABEL: "false",
        ps.ALLOW_HOST_NAMESPACES_LABEL: "false",
        ps.ALLOW_HOST_PATH_LABEL: "false",
        ps.ALLOW_HOST_PORTS_LABEL: "false",
        "pod-security.kubernetes.io/enforce": "baseline",
        "pod-security.kubernetes.io/enforce-version": "latest",
        "pod-security.kubernetes.io/warn": "baseline",
        "pod-security.kubernetes.io/warn-version": "latest",
        "pod-security.kubernetes.io/audit": "baseline",
        "pod-security.kubernetes.io/audit-version": "latest",
    }
    assert annotations == {
        ps.ALLOWED_CAPABILITIES_ANNOTATION: "",
        ps.LEVEL_ANNOTATION: "baseline",
        ps.ALLOWED_VOLUME_TYPES_ANNOTATION: "",
        ps.ALLOWED_TOLERATIONS_ANNOTATION: "nvidia.com/gpu",
        ps.ALLOWED_PRIORITY_CLASSES_ANNOTATION: "",
        ps.ALLOWED_GPU_PRODUCTS_ANNOTATION: "*",
        ps.ENDPOINT_CIDRS_ANNOTATION: ",".join(ps.PRIVATE_CIDRS),
        ps.INGRESS_HOSTS_ANNOTATION: "",
        ps.INGRESS_ANNOTATIONS_ANNOTATION: "",
        OFFERED_STORAGE_CLASSES_ANNOTATION: "",
        OFFERED_STORAGE_ACCESS_MODES_ANNOTATION: "",
    }


def test_offered_storage_classes_are_projected_with_their_access_modes_per_class() -> None:
    offers = (
        StorageClassOffer(name="local-disk", default=True, access_modes=["ReadWriteOnce"]),
        StorageClassOffer(name="shared", access_modes=["ReadWriteOnce", "ReadWriteMany"]),
    )
    _labels, annotations = ps.namespace_metadata(ps.Projection(storage_classes=offers))
    assert annotations[OFFERED_STORAGE_CLASSES_ANNOTATION] == "local-disk,shared"
    assert annotations[OFFERED_STORAGE_ACCESS_MODES_ANNOTATION] == (
        "local-disk:ReadWriteOnce,shared:ReadWriteOnce,shared:ReadWriteMany"
    )


def test_a_projection_carries_the_tenant_the_grant_and_the_network() -> None:
    policy = OffloadPodSecurity(
        allow_privileged=True,
        allowed_capabilities=["SYS_TIME", "NET_ADMIN"],
        allowed_volume_types=["nfs", "csi"],
        allowed_tolerations=["dedicated"],
        allowed_priority_classes=["batch"],
    )
    projection = ps.Projection(
        pod_security=policy,
        gpu_products=["L4", "H100"],
        default_priority_class="standard",
        endpoint_cidrs=("10.244.0.0/16", "10.80.0.0/16"),
        ingress_hosts=("*.team.example.com",),
        ingress_annotations=("example.com/*",),
    )
    labels, annotations = ps.namespace_metadata(projection)
    assert labels[ps.ALLOW_PRIVILEGED_LABEL] == "true"
    assert annotations[ps.ALLOWED_CAPABILITIES_ANNOTATION] == "NET_ADMIN,SYS_TIME"
    assert annotations[ps.ALLOWED_VOLUME_TYPES_ANNOTATION] == "csi,nfs"
    assert annotations[ps.ALLOWED_TOLERATIONS_ANNOTATION] == "dedicated,nvidia.com/gpu"
    assert annotations[ps.ALLOWED_PRIORITY_CLASSES_ANNOTATION] == "batch,standard"
    assert annotations[ps.ALLOWED_GPU_PRODUCTS_ANNOTATION] == "H100,L4"
    assert annotations[ps.ENDPOINT_CIDRS_ANNOTATION] == "10.244.0.0/16,10.80.0.0/16"
    assert annotations[ps.INGRESS_HOSTS_ANNOTATION] == "*.team.example.com"
    assert ps.namespace_metadata(ps.Projection(gpu_products=[]))[1][ps.ALLOWED_GPU_PRODUCTS_ANNOTATION] == ""


@pytest.mark.parametrize(
    "policy,enforce",
    [
        (OffloadPodSecurity(), "baseline"),
        (OffloadPodSecurity(level="restricted"), "restricted"),
        (OffloadPodSecurity(allowed_capabilities=["CHOWN", "NET_BIND_SERVICE"]), "baseline"),
        (OffloadPodSecurity(allowed_volume_types=["nfs"]), "baseline"),
        # An exception Pod Security Admission would refuse lifts its enforcement (warn/audit stay):
        (OffloadPodSecurity(allow_host_path=True), "privileged"),
        (OffloadPodSecurity(allow_privileged=True), "privileged"),
        (OffloadPodSecurity(allow_host_namespaces=True), "privileged"),
        (OffloadPodSecurity(allow_host_ports=True), "privileged"),
        (OffloadPodSecurity(allowed_capabilities=["NET_ADMIN"]), "privileged"),
        (OffloadPodSecurity(level="restricted", allowed_capabilities=["CHOWN"]), "privileged"),
        (OffloadPodSecurity(level="restricted", allowed_volume_types=["nfs"]), "privileged"),
        (OffloadPodSecurity(level="restricted", allowed_volume_types=["ephemeral"]), "restricted"),
    ],
)
def test_pod_security_admission_is_enforced_where_no_exception_contradicts_it(
    policy: OffloadPodSecurity, enforce: str
) -> None:
    assert ps.psa_level(policy) == enforce
    labels, _ = ps.namespace_metadata(policy)
    assert labels["pod-security.kubernetes.io/enforce"] == enforce
    assert labels["pod-security.kubernetes.io/warn"] == labels["pod-security.kubernetes.io/audit"] == policy.level


# ---- describe


def test_describe_says_the_level_what_is_refused_and_allowed() -> None:
    text = ps.describe(DEFAULT)
    assert text.startswith("Pod Security baseline; refused: privileged containers, host namespaces, hostPath volumes")
    assert "host ports" in text and "node names" in text and "allowed:" not in text
    text = ps.describe(OffloadPodSecurity(level="restricted", allow_host_path=True, allowed_capabilities=["NET_ADMIN"]))
    assert text.startswith("Pod Security restricted; ")
    assert "added capabilities other than NET_ADMIN" in text
    assert text.endswith("allowed: hostPath volumes")
