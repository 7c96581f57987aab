"""The offload pod-security policy as a provider's own API server enforces it.

A provider decides, per consumer (`Tenant.spec.policy.podSecurity`, `gpufed.apis.offloading.OffloadPodSecurity`),
whether the consumer's pods may be privileged, share the node's namespaces (hostNetwork/hostPID/
hostIPC), mount hostPath volumes or add capabilities; everything is refused unless allowed.

Owns:
- the projection of that policy onto each of the consumer's namespaces on the provider (tenant and
  twins): labels `gpufed.io/allow-privileged`, `gpufed.io/allow-host-namespaces`,
  `gpufed.io/allow-host-path` ("true"/"false") and annotation `gpufed.io/allowed-capabilities`
  (comma-separated canonical names) — `namespace_metadata`;
- the ValidatingAdmissionPolicy `gpufed-offload-policy` and its one binding (`admission_policy`,
  `admission_binding`): CEL evaluated inside kube-apiserver (no webhook to run or to fail open),
  matching pod creation (and ephemeral containers) in every namespace that carries the consumer
  label, reading the projection from `namespaceObject`. A namespace without the projection refuses
  everything (fail closed), and a consumer cannot loosen it: it has no rights on namespaces, and the
  policy checks the object whoever creates it, so skipping the consumer's own check gains nothing.
  Refusals are 403 Forbidden with a message naming the offending fields and the policy field that
  would allow them;
- `describe`: the policy in one line, for the Tenant's `PodSecurity` condition.

The consumer learns the policy from the status of its TwinNamespace requests
(`status.podSecurity`, written by the provider's controller) and refuses early with the same
reason (`vkprovider.forge.podpolicy`); that copy is informational, enforcement is here.

Why not Pod Security Admission alone: its levels are coarse. `baseline` still lets containers add
the default capability set (CHOWN, NET_BIND_SERVICE, ...), and one allowance (say hostPath for one
tenant) can only be granted by dropping to `privileged`, which lifts every other restriction too.

Does not: apply anything (peering.controllers.provider does), or check pods in Python (the
consumer's vkprovider.forge.podpolicy implements the same rules).

Pure: no I/O.
"""

from __future__ import annotations

from typing import Any

from gpufed.apis.offloading import ALL_CAPABILITIES, OffloadPodSecurity
from gpufed.apis.wire import CONSUMER_LABEL, MANAGED_BY, MANAGED_BY_LABEL

#: Name of the ValidatingAdmissionPolicy and of its binding.
POLICY_NAME = "gpufed-offload-policy"

ALLOW_PRIVILEGED_LABEL = "gpufed.io/allow-privileged"
ALLOW_HOST_NAMESPACES_LABEL = "gpufed.io/allow-host-namespaces"
ALLOW_HOST_PATH_LABEL = "gpufed.io/allow-host-path"
ALLOWED_CAPABILITIES_ANNOTATION = "gpufed.io/allowed-capabilities"

#: Where a refused pod's user is sent (the field that would allow it).
FIELD = "Tenant spec.policy.podSecurity"

#: The pod fields that hold containers, and how a message names one of them.
CONTAINER_KINDS = (
    ("containers", "container"),
    ("initContainers", "init container"),
    ("ephemeralContainers", "ephemeral container"),
)
HOST_NAMESPACE_FIELDS = ("hostNetwork", "hostPID", "hostIPC")


def _flag(value: bool) -> str:
    return "true" if value else "false"


def namespace_metadata(policy: OffloadPodSecurity) -> tuple[dict[str, str], dict[str, str]]:
    """(labels, annotations) that project `policy` onto a consumer's namespace."""
    labels = {
        ALLOW_PRIVILEGED_LABEL: _flag(policy.allow_privileged),
        ALLOW_HOST_NAMESPACES_LABEL: _flag(policy.allow_host_namespaces),
        ALLOW_HOST_PATH_LABEL: _flag(policy.allow_host_path),
    }
    return labels, {ALLOWED_CAPABILITIES_ANNOTATION: ",".join(policy.allowed_capabilities)}


def describe(policy: OffloadPodSecurity) -> str:
    """One line for humans: what the policy refuses and allows."""
    refused: list[str] = []
    allowed: list[str] = []
    for ok, what in (
        (policy.allow_privileged, "privileged containers"),
        (policy.allow_host_namespaces, "host namespaces"),
        (policy.allow_host_path, "hostPath volumes"),
    ):
        (allowed if ok else refused).append(what)
    caps = policy.allowed_capabilities
    if ALL_CAPABILITIES in caps:
        allowed.append("adding any capability")
    else:
        refused.append("added capabilities" + (f" other than {', '.join(caps)}" if caps else ""))
    parts = []
    if refused:
        parts.append("refused: " + ", ".join(refused))
    if allowed:
        parts.append("allowed: " + ", ".join(allowed))
    return "; ".join(parts)


# ---- the admission policy (CEL)


def _canonical(var: str) -> str:
    """CEL for the canonical capability name of the string `var` (as `models.capability_name`)."""
    return f"({var}.upperAscii().startsWith('CAP_') ? {var}.upperAscii().substring(4) : {var}.upperAscii())"


def _validations() -> list[dict[str, str]]:
    out: list[dict[str, str]] = []
    ask = f"; ask the provider to allow it in {FIELD}"
    for field, noun in CONTAINER_KINDS:
        items = f"object.spec.?{field}.orValue([])"
        privileged = "c.?securityContext.?privileged.orValue(false)"
        out.append(
            {
                "expression": f"variables.allowPrivileged || {items}.all(c, !{privileged})",
                "messageExpression": "'privileged containers are refused (' + "
                f"{items}.filter(c, {privileged}).map(c, '{noun} ' + c.name + ': securityContext.privileged=true')"
                f".join(', ') + '){ask}.allowPrivileged'",
                "message": f"privileged containers are refused{ask}.allowPrivileged",
                "reason": "Forbidden",
            }
        )
        added = "c.?securityContext.?capabilities.?add.orValue([])"
        refused = f"{added}.filter(a, !({_canonical('a')} in variables.allowedCapabilities))"
        out.append(
            {
                "expression": f"variables.allowAnyCapability || {items}.all(c, {refused}.size() == 0)",
                "messageExpression": "'added capabilities are refused (' + "
                f"{items}.filter(c, {refused}.size() > 0).map(c, '{noun} ' + c.name + "
                f"': securityContext.capabilities.add=' + {refused}.join(',')).join(', ') + "
                f"'){ask}.allowedCapabilities'",
                "message": f"added capabilities are refused{ask}.allowedCapabilities",
                "reason": "Forbidden",
            }
        )
    host = [f"object.spec.?{f}.orValue(false)" for f in HOST_NAMESPACE_FIELDS]
    out.append(
        {
            "expression": f"variables.allowHostNamespaces || !({' || '.join(host)})",
            "messageExpression": "'host namespaces are refused (' + ["
            + ", ".join(f"{h} ? 'spec.{f}=true' : ''" for h, f in zip(host, HOST_NAMESPACE_FIELDS, strict=True))
            + f"].filter(s, s != '').join(', ') + '){ask}.allowHostNamespaces'",
            "message": f"host namespaces are refused{ask}.allowHostNamespaces",
            "reason": "Forbidden",
        }
    )
    volumes = "object.spec.?volumes.orValue([])"
    out.append(
        {
            "expression": f"variables.allowHostPath || {volumes}.all(v, !has(v.hostPath))",
            "messageExpression": "'hostPath volumes are refused (' + "
            f"{volumes}.filter(v, has(v.hostPath)).map(v, 'volume ' + v.name + ': hostPath ' + v.hostPath.path)"
            f".join(', ') + '){ask}.allowHostPath'",
            "message": f"hostPath volumes are refused{ask}.allowHostPath",
            "reason": "Forbidden",
        }
    )
    return out


def _label(name: str) -> str:
    return f"variables.labels[?'{name}'].orValue('') == 'true'"


def admission_policy() -> dict[str, Any]:
    """The ValidatingAdmissionPolicy every consumer namespace is bound to (cluster-wide, one object)."""
    caps = f"variables.annotations[?'{ALLOWED_CAPABILITIES_ANNOTATION}'].orValue('')"
    return {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicy",
        "metadata": {"name": POLICY_NAME, "labels": {MANAGED_BY_LABEL: MANAGED_BY}},
        "spec": {
            "failurePolicy": "Fail",
            "matchConstraints": {
                "resourceRules": [
                    {"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"], "resources": ["pods"]},
                    {
                        "apiGroups": [""],
                        "apiVersions": ["v1"],
                        "operations": ["UPDATE"],
                        "resources": ["pods/ephemeralcontainers"],
                    },
                ]
            },
            "variables": [
                {
                    "name": "labels",
                    "expression": "has(namespaceObject.metadata.labels) ? namespaceObject.metadata.labels : {}",
                },
                {
                    "name": "annotations",
                    "expression": "has(namespaceObject.metadata.annotations) ? "
                    "namespaceObject.metadata.annotations : {}",
                },
                {"name": "allowPrivileged", "expression": _label(ALLOW_PRIVILEGED_LABEL)},
                {"name": "allowHostNamespaces", "expression": _label(ALLOW_HOST_NAMESPACES_LABEL)},
                {"name": "allowHostPath", "expression": _label(ALLOW_HOST_PATH_LABEL)},
                {
                    "name": "allowedCapabilities",
                    "expression": f"{caps} == '' ? [] : {caps}.split(',')",
                },
                {
                    "name": "allowAnyCapability",
                    "expression": f"'{ALL_CAPABILITIES}' in variables.allowedCapabilities",
                },
            ],
            "validations": _validations(),
        },
    }


def admission_binding() -> dict[str, Any]:
    """Binds the policy to every namespace a consumer has on this provider (tenant and twins)."""
    return {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicyBinding",
        "metadata": {"name": POLICY_NAME, "labels": {MANAGED_BY_LABEL: MANAGED_BY}},
        "spec": {
            "policyName": POLICY_NAME,
            "validationActions": ["Deny"],
            "matchResources": {
                "namespaceSelector": {"matchExpressions": [{"key": CONSUMER_LABEL, "operator": "Exists"}]}
            },
        },
    }
