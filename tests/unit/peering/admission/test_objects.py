"""The admission policy for the Services, EndpointSlices and Ingresses a consumer writes, as rendered
(peering.admission.objects): what it matches and what each validation checks.

There is no CEL engine here: the e2e attack suites run the expressions on the real API servers.
These tests pin the structure those runs rely on.
"""

from __future__ import annotations

from peering import podsecurity as ps
from peering.admission.objects import objects_policy


def test_the_objects_policy_matches_only_the_consumer_group_writing_services_slices_and_ingresses() -> None:
    policy = objects_policy("gpufed:consumers")
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
