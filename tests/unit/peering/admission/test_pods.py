"""The pod admission policy as rendered (peering.admission.pods): its structure (every rule one
validation, what it matches, fail closed) and its binding.

There is no CEL engine here: the expressions were evaluated with kube-apiserver's own
ValidatingAdmissionPolicy code (k8s.io/apiserver v0.36.3) against the table of pods in
tests/unit/vkprovider/forge/test_podpolicy.py, with the refusals the Python mirror words; the e2e
attack suites run them on the real API servers. These tests pin the structure those runs rely on.
"""

from __future__ import annotations

from gpufed.apis.wire import CONSUMER_LABEL
from peering import podsecurity as ps
from peering.admission.objects import objects_binding, objects_policy
from peering.admission.pods import admission_binding, admission_policy


def test_every_rule_is_one_forbidding_validation_that_names_its_remedy() -> None:
    policy = admission_policy()
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
    policy = admission_policy()
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
        (admission_policy(), admission_binding(), ps.POLICY_NAME),
        (objects_policy("gpufed:consumers"), objects_binding(), ps.OBJECTS_POLICY_NAME),
    ):
        assert binding["spec"]["policyName"] == policy["metadata"]["name"] == name
        assert binding["spec"]["validationActions"] == ["Deny"]
        assert binding["spec"]["matchResources"]["namespaceSelector"] == {
            "matchExpressions": [{"key": CONSUMER_LABEL, "operator": "Exists"}]
        }
