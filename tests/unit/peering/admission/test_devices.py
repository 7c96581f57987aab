"""The admission policy for the ResourceClaims a consumer writes, as rendered
(peering.admission.devices): what it matches and that each validation names one cause.

There is no CEL engine here: tests/e2e/attacks/test_dra_attacks.py runs the expressions on a real
API server. These tests pin the structure those runs rely on.
"""

from __future__ import annotations

from gpufed.apis.wire import CONSUMER_LABEL
from peering import podsecurity as ps
from peering.admission.devices import MAX_DEVICES_PER_REQUEST, device_claims_binding, device_claims_policy


def test_the_policy_matches_only_the_consumer_group_writing_resource_claims() -> None:
    policy = device_claims_policy("gpufed:consumers")
    assert policy["metadata"]["name"] == ps.DEVICE_CLAIMS_POLICY_NAME
    spec = policy["spec"]
    assert spec["failurePolicy"] == "Fail"
    (rule,) = spec["matchConstraints"]["resourceRules"]
    assert rule["apiGroups"] == ["resource.k8s.io"] and rule["resources"] == ["resourceclaims"]
    assert rule["operations"] == ["CREATE", "UPDATE"]
    assert "'gpufed:consumers'" in spec["matchConditions"][0]["expression"]
    binding = device_claims_binding()
    assert binding["spec"]["policyName"] == ps.DEVICE_CLAIMS_POLICY_NAME
    assert binding["spec"]["matchResources"]["namespaceSelector"]["matchExpressions"][0]["key"] == CONSUMER_LABEL


def test_each_validation_names_one_cause() -> None:
    validations = device_claims_policy("g")["spec"]["validations"]
    assert all(v["reason"] == "Forbidden" and v["message"] and v["messageExpression"] for v in validations)
    prioritized, admin, mode, count, config = (v["expression"] for v in validations)
    assert "has(r.exactly)" in prioritized
    assert "adminAccess" in admin
    assert "'ExactCount'" in mode
    assert f"<= {MAX_DEVICES_PER_REQUEST}" in count
    assert "config" in config
