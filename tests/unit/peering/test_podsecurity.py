"""The provider's admission policies as rendered (peering.podsecurity): the projection of a tenant's
policy onto its namespaces (gpufed's labels and annotations, Pod Security Admission's labels), the
pod policy's structure (every rule one validation, what it matches, fail closed), the policy for the
Services, EndpointSlices and Ingresses a consumer writes, and `describe`.

There is no CEL engine here: the expressions were evaluated with kube-apiserver's own
ValidatingAdmissionPolicy code (k8s.io/apiserver v0.36.3) against the table of pods in
tests/unit/vkprovider/forge/test_podpolicy.py, with the refusals the Python mirror words; the e2e
attack suites run them on the real API servers. These tests pin the structure those runs rely on.
"""

from __future__ import annotations

import pytest

from gpufed.apis.offloading import OffloadPodSecurity
from gpufed.apis.wire import CONSUMER_LABEL
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
    }


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


# ---- the pod policy


def test_every_rule_is_one_forbidding_validation_that_names_its_remedy() -> None:
    policy = ps.admission_policy()
    validations = policy["spec"]["validations"]
    assert len(validations) == len(ps.RULES)
    for rule, v in zip(ps.RULES, validations, strict=True):
        assert v["reason"] == "Forbidden"
        assert v["message"] == f"{rule.what} are refused{rule.tail}"
        assert v["messageExpression"].startswith(f"'{rule.what} are refused (' + ")
        if rule.allow and not rule.allow.startswith("Tenant "):
            assert rule.tail == f"; ask the provider to allow it in Tenant spec.policy.podSecurity.{rule.allow}"
        elif not rule.allow:
            assert rule.fixed and rule.tail == f" ({rule.fixed})"
        if rule.level == "restricted":
            assert "variables.level != 'restricted'" in v["expression"]
    # The rules the issue names are all there.
    ids = {r.id for r in ps.RULES}
    assert {
        "hostPorts",
        "seccomp",
        "appArmor",
        "seLinux",
        "sysctls",
        "procMount",
        "hostProcess",
        "volumeTypes",
        "nodeName",
        "tolerations",
        "priorityClasses",
        "runAsUser",
        "resources",
        "gpuProducts",
    } <= ids


def test_the_pod_policy_matches_creation_ephemeral_containers_and_updates_fail_closed() -> None:
    policy = ps.admission_policy()
    spec = policy["spec"]
    assert spec["failurePolicy"] == "Fail"
    assert {r["resources"][0]: r["operations"] for r in spec["matchConstraints"]["resourceRules"]} == {
        "pods": ["CREATE", "UPDATE"],
        "pods/ephemeralcontainers": ["UPDATE"],
    }
    variables = {v["name"]: v["expression"] for v in spec["variables"]}
    # A namespace without the projection: the level reads as restricted, no flag allows anything.
    assert "orValue('restricted')" in variables["level"]
    for flag in ("allowPrivileged", "allowHostNamespaces", "allowHostPath", "allowHostPorts"):
        assert variables[flag].endswith("orValue('') == 'true'"), flag
    assert ps.ALLOWED_GPU_PRODUCTS_ANNOTATION in variables["gpuProducts"]
    # Only the tolerations rule looks at plain updates; the node name only at creation.
    by_rule = dict(zip((r.id for r in ps.RULES), spec["validations"], strict=True))
    assert "!variables.specRules" not in by_rule["tolerations"]["expression"]
    assert "oldObject.spec.?tolerations" in by_rule["tolerations"]["expression"]
    assert by_rule["nodeName"]["expression"].startswith("(request.operation != 'CREATE')")
    for rule_id, v in by_rule.items():
        if rule_id not in ("tolerations", "nodeName"):
            assert v["expression"].startswith("(!variables.specRules"), rule_id
    text = " ".join(v["expression"] for v in spec["validations"])
    for needle in ("initContainers", "ephemeralContainers", "hostPort", "seLinuxOptions", "sysctls", "procMount"):
        assert needle in text, needle
    for name in ps.SAFE_SYSCTLS + tuple(t for t in ps.SELINUX_TYPES if t):
        assert f"'{name}'" in by_rule["sysctls"]["expression"] + by_rule["seLinux"]["expression"], name
    for volume_type in ps.OTHER_VOLUME_TYPES:
        assert f"has(v.{volume_type}) && '{volume_type}' in variables.allowedVolumeTypes" in text


def test_the_bindings_cover_every_consumer_namespace() -> None:
    for policy, binding, name in (
        (ps.admission_policy(), ps.admission_binding(), ps.POLICY_NAME),
        (ps.objects_policy("gpufed:consumers"), ps.objects_binding(), ps.OBJECTS_POLICY_NAME),
    ):
        assert binding["spec"]["policyName"] == policy["metadata"]["name"] == name
        assert binding["spec"]["validationActions"] == ["Deny"]
        assert binding["spec"]["matchResources"]["namespaceSelector"] == {
            "matchExpressions": [{"key": CONSUMER_LABEL, "operator": "Exists"}]
        }


def test_cel_string_literals_are_escaped() -> None:
    assert ps._str("the provider's") == "'the provider\\'s'"
    assert ps._str("a\\b") == "'a\\\\b'"


# ---- Services, EndpointSlices and Ingresses a consumer writes


def test_the_objects_policy_matches_only_the_consumer_group_writing_services_slices_and_ingresses() -> None:
    policy = ps.objects_policy("gpufed:consumers")
    spec = policy["spec"]
    assert spec["failurePolicy"] == "Fail"
    assert {(r["apiGroups"][0], r["resources"][0]) for r in spec["matchConstraints"]["resourceRules"]} == {
        ("", "services"),
        ("discovery.k8s.io", "endpointslices"),
        ("networking.k8s.io", "ingresses"),
    }
    assert all(r["operations"] == ["CREATE", "UPDATE"] for r in spec["matchConstraints"]["resourceRules"])
    assert "'gpufed:consumers'" in spec["matchConditions"][0]["expression"]
    by_resource: dict[str, list[str]] = {}
    for v in spec["validations"]:
        resource = v["expression"].split("'", 2)[1]
        by_resource.setdefault(resource, []).append(v["expression"])
        assert v["reason"] == "Forbidden"
    services = " ".join(by_resource["services"])
    assert "['ClusterIP', 'ExternalName']" in services
    assert "externalIPs" in services and "loadBalancerIP" in services and "isIP(" in services
    assert "cidr(n).containsIP(ip(a))" in by_resource["endpointslices"][0]
    ingresses = " ".join(by_resource["ingresses"])
    assert "defaultBackend" in ingresses and "variables.ingressHosts" in ingresses
    assert f"k == '{ps.INGRESS_CLASS_ANNOTATION}'" in ingresses


# ---- describe


def test_describe_says_the_level_what_is_refused_and_allowed() -> None:
    text = ps.describe(DEFAULT)
    assert text.startswith("Pod Security baseline; refused: privileged containers, host namespaces, hostPath volumes")
    assert "host ports" in text and "node names" in text and "allowed:" not in text
    text = ps.describe(OffloadPodSecurity(level="restricted", allow_host_path=True, allowed_capabilities=["NET_ADMIN"]))
    assert text.startswith("Pod Security restricted; ")
    assert "added capabilities other than NET_ADMIN" in text
    assert text.endswith("allowed: hostPath volumes")
