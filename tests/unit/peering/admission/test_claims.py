"""The admission policy for the PersistentVolumeClaims a consumer writes, as rendered
(peering.admission.claims): what it matches, the namespace annotations it reads, and what each
validation checks.

There is no CEL engine here: tests/e2e/attacks/test_storage_attacks.py runs the expressions on a
real API server. These tests pin the structure those runs rely on.
"""

from __future__ import annotations

from gpufed.apis.wire import CONSUMER_LABEL, OFFERED_STORAGE_ACCESS_MODES_ANNOTATION, OFFERED_STORAGE_CLASSES_ANNOTATION
from peering import podsecurity as ps
from peering.admission.claims import claims_binding, claims_policy


def test_the_claims_policy_matches_only_the_consumer_group_writing_claims() -> None:
    policy = claims_policy("gpufed:consumers")
    assert policy["metadata"]["name"] == ps.CLAIMS_POLICY_NAME
    spec = policy["spec"]
    assert spec["failurePolicy"] == "Fail"
    (rule,) = spec["matchConstraints"]["resourceRules"]
    assert rule["resources"] == ["persistentvolumeclaims"] and rule["operations"] == ["CREATE", "UPDATE"]
    assert "'gpufed:consumers'" in spec["matchConditions"][0]["expression"]
    variables = {v["name"]: v["expression"] for v in spec["variables"]}
    assert OFFERED_STORAGE_CLASSES_ANNOTATION in variables["storageClasses"]
    assert OFFERED_STORAGE_ACCESS_MODES_ANNOTATION in variables["storageModes"]
    binding = claims_binding()
    assert binding["spec"]["policyName"] == ps.CLAIMS_POLICY_NAME
    assert binding["spec"]["matchResources"]["namespaceSelector"]["matchExpressions"][0]["key"] == CONSUMER_LABEL


def test_each_validation_names_one_cause() -> None:
    validations = claims_policy("g")["spec"]["validations"]
    assert all(v["reason"] == "Forbidden" and v["message"] and v["messageExpression"] for v in validations)
    no_grant, no_class, not_offered, modes, volume, selector, source = (v["expression"] for v in validations)
    assert no_grant == "!(variables.storageClasses.size() == 0)"
    # The class checks hold when an earlier one refuses already, so a refusal names the first cause only.
    assert no_class.startswith("variables.storageClasses.size() == 0 ||")
    assert "in variables.storageClasses" in not_offered and "storageClassName" in not_offered
    assert "variables.storageModes" in modes and "accessModes" in modes
    assert "oldObject.spec.?volumeName" in volume, "the binder's volume name stays, none may be chosen"
    assert selector == "!has(object.spec.selector)"
    assert "dataSource)" in source and "dataSourceRef" in source
    messages = " ".join(v["message"] for v in validations)
    assert "gpufed peer --storage" in messages
