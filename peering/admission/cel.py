"""CEL building blocks both admission policies share: string and list literals, the namespace's labels
and annotations as variables (flags and comma-separated lists), and the binding of a policy to every
namespace that carries the consumer label.

Does not: render a policy's validations (`peering.admission.pods`, `peering.admission.objects`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from gpufed.apis.wire import CONSUMER_LABEL, MANAGED_BY, MANAGED_BY_LABEL


def literal(value: str) -> str:
    """A CEL string literal."""
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


def literal_list(values: Sequence[str]) -> str:
    """A CEL list literal of strings."""
    return "[" + ", ".join(literal(v) for v in values) + "]"


def label_is_true(name: str) -> str:
    """CEL: the namespace's label `name` is `true` (a missing label is false)."""
    return f"variables.labels[?'{name}'].orValue('') == 'true'"


def csv_list(annotation: str) -> str:
    """CEL: the namespace's comma-separated annotation as a list (a missing one is empty)."""
    value = f"variables.annotations[?'{annotation}'].orValue('')"
    return f"{value} == '' ? [] : {value}.split(',')"


def namespace_variables() -> list[dict[str, str]]:
    """The variables `labels` and `annotations`: the namespace's own, empty where it has none."""
    return [
        {
            "name": "labels",
            "expression": "has(namespaceObject.metadata.labels) ? namespaceObject.metadata.labels : {}",
        },
        {
            "name": "annotations",
            "expression": "has(namespaceObject.metadata.annotations) ? namespaceObject.metadata.annotations : {}",
        },
    ]


def rule(expression: str, message_expression: str, message: str) -> dict[str, str]:
    """One validation of a consumer policy: refused as Forbidden, with a sentence saying why."""
    return {
        "expression": expression,
        "messageExpression": message_expression,
        "message": message,
        "reason": "Forbidden",
    }


def consumer_policy(
    name: str,
    consumer_group: str,
    resource_rules: list[dict[str, Any]],
    validations: list[dict[str, str]],
    variables: list[dict[str, str]] | None = None,
) -> dict[str, Any]:
    """A ValidatingAdmissionPolicy that holds writes by members of `consumer_group` (and nobody
    else: the provider's controllers and administrators are not matched) to `validations`."""
    spec: dict[str, Any] = {
        "failurePolicy": "Fail",
        "matchConstraints": {"resourceRules": resource_rules},
        "matchConditions": [
            {
                "name": "consumer",
                "expression": f"request.userInfo.?groups.orValue([]).exists(g, g == {literal(consumer_group)})",
            }
        ],
    }
    if variables:
        spec["variables"] = variables
    spec["validations"] = validations
    return {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicy",
        "metadata": {"name": name, "labels": {MANAGED_BY_LABEL: MANAGED_BY}},
        "spec": spec,
    }


def binding(name: str) -> dict[str, Any]:
    """Binds the policy `name` to every namespace a consumer has on this provider (tenant and twins)."""
    return {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicyBinding",
        "metadata": {"name": name, "labels": {MANAGED_BY_LABEL: MANAGED_BY}},
        "spec": {
            "policyName": name,
            "validationActions": ["Deny"],
            "matchResources": {
                "namespaceSelector": {"matchExpressions": [{"key": CONSUMER_LABEL, "operator": "Exists"}]}
            },
        },
    }
