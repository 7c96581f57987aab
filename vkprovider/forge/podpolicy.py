"""The consumer's early check of a provider's offload pod-security policy.

Owns: `violations(pod, policy)`, what in a local pod the provider's policy
(`gpufed.apis.offloading.OffloadPodSecurity`, published in the TwinNamespace status) refuses — privileged
containers, hostNetwork/hostPID/hostIPC, hostPath volumes, added capabilities not allowed — and
`refusal(provider, violations)`, the message the user reads on the pod, which names the offending
fields and the Tenant field that would allow them. The rules are those of the provider's
ValidatingAdmissionPolicy (`peering.podsecurity`), so a pod refused here would be refused there
with the same reason, only later and after a round trip.

Does not: enforce anything (the provider's API server does; this check only saves the round trip
and words the reason), or decide what happens to a refused pod (vkprovider.remote / node).

Pure: no I/O, no client imports; the pod is never mutated.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gpufed.apis.offloading import ALL_CAPABILITIES, OffloadPodSecurity, capability_name
from peering.podsecurity import CONTAINER_KINDS, FIELD, HOST_NAMESPACE_FIELDS

#: Event reason of a pod refused by a provider's offload policy (the pod's status reason stays ProviderFailed).
REASON = "OffloadPolicyRefused"


@dataclass(frozen=True)
class Violation:
    """One thing the policy refuses: which rule, where in the pod, and the field that would allow it."""

    #: What is refused, as the message says it ("privileged containers").
    what: str
    #: Where: "container main: securityContext.privileged=true".
    where: str
    #: The OffloadPodSecurity field (camelCase) that would allow it.
    allow_field: str


def _containers(spec: Mapping[str, Any]) -> list[tuple[str, Mapping[str, Any]]]:
    return [(noun, c) for field, noun in CONTAINER_KINDS for c in spec.get(field) or []]


def violations(pod: Mapping[str, Any], policy: OffloadPodSecurity) -> list[Violation]:
    """Everything in `pod` that `policy` refuses (empty: the provider admits it), in a stable order."""
    spec = pod.get("spec") or {}
    out: list[Violation] = []
    allowed_caps = set(policy.allowed_capabilities)
    for noun, c in _containers(spec):
        sc = c.get("securityContext") or {}
        if sc.get("privileged") and not policy.allow_privileged:
            out.append(
                Violation(
                    "privileged containers",
                    f"{noun} {c.get('name')}: securityContext.privileged=true",
                    "allowPrivileged",
                )
            )
        added = [str(a) for a in (sc.get("capabilities") or {}).get("add") or []]
        refused = [a for a in added if capability_name(a) not in allowed_caps]
        if refused and ALL_CAPABILITIES not in allowed_caps:
            out.append(
                Violation(
                    "added capabilities",
                    f"{noun} {c.get('name')}: securityContext.capabilities.add={','.join(refused)}",
                    "allowedCapabilities",
                )
            )
    if not policy.allow_host_namespaces:
        for field in HOST_NAMESPACE_FIELDS:
            if spec.get(field):
                out.append(Violation("host namespaces", f"spec.{field}=true", "allowHostNamespaces"))
    if not policy.allow_host_path:
        for v in spec.get("volumes") or []:
            if "hostPath" in v:
                path = (v.get("hostPath") or {}).get("path", "")
                out.append(Violation("hostPath volumes", f"volume {v.get('name')}: hostPath {path}", "allowHostPath"))
    return out


def refusal(provider: str, found: Sequence[Violation]) -> str:
    """The user's reason: per refused rule, where the pod asks for it and what would allow it."""
    rules: dict[str, list[Violation]] = {}
    for v in found:
        rules.setdefault(v.what, []).append(v)
    parts = [
        f"provider {provider} refuses {what} ({', '.join(v.where for v in vs)}); "
        f"ask the provider to allow it in {FIELD}.{vs[0].allow_field}"
        for what, vs in rules.items()
    ]
    return "; ".join(parts)
