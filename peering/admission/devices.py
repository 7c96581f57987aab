"""The ValidatingAdmissionPolicy `gpufed-consumer-device-claims` and its binding, for the
ResourceClaims (Dynamic Resource Allocation, resource.k8s.io) a consumer identity writes into its
namespaces: the twins of the claims its offloaded pods use.

A claim may ask devices only the way a tenant's pod may use them: each request an exact count
(`exactly`, `allocationMode: ExactCount`, at most `MAX_DEVICES_PER_REQUEST`) of a DeviceClass, no
admin access (which reaches devices other pods hold), no prioritized lists, and no opaque driver
configuration (parameters only the provider's administrators may hand to its drivers). Kubernetes
counts a claim of a class that maps an extended resource (`spec.extendedResourceName`, e.g.
nvidia.com/gpu) against the namespace's `requests.nvidia.com/gpu` quota, so the grant's quota
bounds the devices; the quota on `count/resourceclaims.resource.k8s.io` bounds their number.

Writes by anyone else (the scheduler's claims for extended resources, administrators) are not
matched: the policy applies to the consumer group only, as the other consumer policies do.

Does not: apply anything (peering.controllers.tenant_namespaces does).
"""

from __future__ import annotations

from typing import Any

from peering.admission.cel import binding, consumer_policy, rule
from peering.podsecurity import DEVICE_CLAIMS_POLICY_NAME

#: Most devices one request of a consumer's claim may ask for (a whole node's GPUs).
MAX_DEVICES_PER_REQUEST = 16
_REQUESTS = "object.spec.devices.?requests.orValue([])"


def _validations() -> list[dict[str, str]]:
    prefix = "'ResourceClaim ' + request.namespace + '/' + request.name + ': '"
    return [
        rule(
            f"{_REQUESTS}.all(r, has(r.exactly))",
            f"{prefix} + 'requests ' + {_REQUESTS}.filter(r, !has(r.exactly)).map(r, r.name).join(', ') + "
            "' are prioritized lists (firstAvailable), which a consumer may not use'",
            "a consumer's claim may not use prioritized lists (firstAvailable)",
        ),
        rule(
            f"{_REQUESTS}.all(r, !has(r.exactly) || !r.exactly.?adminAccess.orValue(false))",
            f"{prefix} + 'admin access is refused: it reaches devices that other pods hold'",
            "a consumer's claim may not ask for admin access",
        ),
        rule(
            f"{_REQUESTS}.all(r, !has(r.exactly) || r.exactly.?allocationMode.orValue('ExactCount') == 'ExactCount')",
            f"{prefix} + 'allocationMode All is refused: a consumer asks for a number of devices'",
            "a consumer's claim may not ask for all devices",
        ),
        rule(
            f"{_REQUESTS}.all(r, !has(r.exactly) || r.exactly.?count.orValue(1) <= {MAX_DEVICES_PER_REQUEST})",
            f"{prefix} + 'a request may ask for at most {MAX_DEVICES_PER_REQUEST} devices'",
            f"a consumer's claim may ask for at most {MAX_DEVICES_PER_REQUEST} devices per request",
        ),
        rule(
            "object.spec.devices.?config.orValue([]).size() == 0",
            f"{prefix} + 'driver configuration (spec.devices.config) is refused: only the provider configures its "
            "drivers'",
            "a consumer's claim may not carry driver configuration",
        ),
    ]


def device_claims_policy(consumer_group: str) -> dict[str, Any]:
    """The ValidatingAdmissionPolicy for the ResourceClaims a member of `consumer_group` writes."""
    return consumer_policy(
        DEVICE_CLAIMS_POLICY_NAME,
        consumer_group,
        [
            {
                "apiGroups": ["resource.k8s.io"],
                "apiVersions": ["v1"],
                "operations": ["CREATE", "UPDATE"],
                "resources": ["resourceclaims"],
            }
        ],
        _validations(),
    )


def device_claims_binding() -> dict[str, Any]:
    """Binds the policy to every namespace a consumer has on this provider."""
    return binding(DEVICE_CLAIMS_POLICY_NAME)
