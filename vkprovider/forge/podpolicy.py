"""The consumer's early check of a provider's offload pod-security policy.

Owns: `violations(pod, policy)`, what in a pod the provider's policy (`gpufed.apis.offloading.
OffloadPodSecurity`, published in the TwinNamespace status) refuses, rule by rule as
`peering.podsecurity.RULES` lists them — Pod Security baseline (or restricted) and gpufed's own rules
(privileged containers, added capabilities, host namespaces, hostPath volumes, host ports, volume
types, tolerations, priority classes, node names, resources outside the grant) — and
`refusal(provider, violations)`, the message the user reads on the pod, which names the offending
fields and the Tenant field that would allow them (or the standard that refuses them). The rules,
their words and the constants they check against are `peering.podsecurity`'s, the same ones the
provider's ValidatingAdmissionPolicy (`peering.admission.pods`) is rendered from, so a pod refused
here would be refused there with the same reason, only later and after a round trip.

A local pod is checked as its twin will be created: what the forge drops before the twin reaches the
provider (`forge.pods`: the node name the consumer's scheduler chose, the priority class, the
virtual node's toleration and the consumer's default not-ready/unreachable tolerations) is not held
against it; `violations(twin, policy, local=False)` checks a pod exactly as the provider's policy does.

Does not: enforce anything (the provider's API server does; this check only saves the round trip
and words the reason), know the provider's GPU products (its virtual nodes only offer granted ones),
or decide what happens to a refused pod (vkprovider.remote / node).

Pure: no I/O, no client imports; the pod is never mutated.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from gpufed.apis.offloading import ALL_CAPABILITIES, OffloadPodSecurity, capability_name
from gpufed.apis.wire import VIRTUAL_NODE_TAINT_KEY
from peering import podsecurity as ps
from peering.podsecurity import CONTAINER_KINDS, FIELD, HOST_NAMESPACE_FIELDS, Rule

#: Event reason of a pod refused by a provider's offload policy (the pod's status reason stays ProviderFailed).
REASON = "OffloadPolicyRefused"


@dataclass(frozen=True)
class Violation:
    """One thing the policy refuses: which rule, where in the pod, and the field that would allow it."""

    #: What is refused, as the message says it ("privileged containers").
    what: str
    #: Where: "container main: securityContext.privileged=true".
    where: str
    #: The OffloadPodSecurity field (camelCase) that would allow it ("" when none can).
    allow_field: str
    #: The rule's identifier (`peering.podsecurity.RULES`).
    rule: str = field(default="", compare=False)
    #: What follows the offending fields in the refusal (the field to ask for, or the standard).
    tail: str = field(default="", compare=False)


def _containers(spec: Mapping[str, Any]) -> Iterator[tuple[str, Mapping[str, Any]]]:
    for kind, noun in CONTAINER_KINDS:
        for c in spec.get(kind) or []:
            yield noun, c


def _sc(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    return obj.get("securityContext") or {}


def _bool(value: Any) -> bool:
    return value is True


class _Found:
    """The violations of one pod, collected rule by rule."""

    def __init__(self) -> None:
        self.items: list[Violation] = []

    def add(self, rule: Rule, where: str) -> None:
        self.items.append(Violation(rule.what, where, rule.allow, rule.id, rule.tail))

    def each_container(
        self, rule: Rule, spec: Mapping[str, Any], detail: Callable[[Mapping[str, Any]], str | None]
    ) -> None:
        for noun, c in _containers(spec):
            d = detail(c)
            if d is not None:
                self.add(rule, f"{noun} {c.get('name')}: {d}")


def _volume_type(v: Mapping[str, Any]) -> str:
    for t in (*ps.DEFAULT_VOLUME_TYPES, ps.HOST_PATH, *ps.OTHER_VOLUME_TYPES):
        if t in v:
            return t
    return "unknown"


def _toleration_ok(t: Mapping[str, Any], allowed: frozenset[str]) -> bool:
    key = t.get("key") or ""
    if not key:
        return False
    if key in allowed:
        return True
    return key in ps.NODE_CONDITION_TAINTS and t.get("effect") == "NoExecute" and "tolerationSeconds" in t


def _dropped_by_forge(t: Mapping[str, Any]) -> bool:
    """Tolerations the forge never sends (the virtual node's, the consumer's defaults: see forge.pods)."""
    default = (
        t.get("key") in ps.NODE_CONDITION_TAINTS
        and t.get("operator") == "Exists"
        and t.get("effect") == "NoExecute"
        and t.get("tolerationSeconds") == 300
    )
    return t.get("key") == VIRTUAL_NODE_TAINT_KEY or default


def _selinux(options: Mapping[str, Any] | None, prefix: str) -> str | None:
    o = options or {}
    kind = str(o.get("type") or "")
    if kind not in ps.SELINUX_TYPES:
        return f"{prefix}seLinuxOptions.type={kind}"
    if o.get("user") or o.get("role"):
        return f"{prefix}seLinuxOptions.user/role set"
    return None


def _resources(r: Mapping[str, Any]) -> list[str]:
    granted = ps.GRANTED_RESOURCES
    names = [n for n in (r.get("requests") or {}) if n not in granted]
    names += [n for n in (r.get("limits") or {}) if n not in granted]
    return names


def _baseline(found: _Found, pod: Mapping[str, Any], policy: OffloadPodSecurity) -> None:
    spec = pod.get("spec") or {}
    psc = _sc(spec)
    allowed_caps = set(policy.allowed_capabilities)
    if not policy.allow_privileged:
        found.each_container(
            ps.PRIVILEGED,
            spec,
            lambda c: "securityContext.privileged=true" if _bool(_sc(c).get("privileged")) else None,
        )
    if ALL_CAPABILITIES not in allowed_caps:

        def caps(c: Mapping[str, Any]) -> str | None:
            added = [str(a) for a in (_sc(c).get("capabilities") or {}).get("add") or []]
            refused = [a for a in added if capability_name(a) not in allowed_caps]
            return f"securityContext.capabilities.add={','.join(refused)}" if refused else None

        found.each_container(ps.CAPABILITIES, spec, caps)
    if not policy.allow_host_namespaces:
        for name in HOST_NAMESPACE_FIELDS:
            if _bool(spec.get(name)):
                found.add(ps.HOST_NAMESPACES, f"spec.{name}=true")
    volumes = spec.get("volumes") or []
    if not policy.allow_host_path:
        for v in volumes:
            if "hostPath" in v:
                found.add(
                    ps.HOST_PATH_VOLUMES,
                    f"volume {v.get('name')}: hostPath {(v.get('hostPath') or {}).get('path', '')}",
                )
    if not policy.allow_host_ports:

        def ports(c: Mapping[str, Any]) -> str | None:
            hp = [str(p["hostPort"]) for p in c.get("ports") or [] if p.get("hostPort")]
            return f"ports.hostPort={','.join(hp)}" if hp else None

        found.each_container(ps.HOST_PORTS, spec, ports)
    extra = set(policy.allowed_volume_types)
    for v in volumes:
        t = _volume_type(v)
        if t not in ps.DEFAULT_VOLUME_TYPES and t != ps.HOST_PATH and t not in extra:
            found.add(ps.VOLUME_TYPES, f"volume {v.get('name')}: {t}")
    # Pod Security baseline
    if _bool((psc.get("windowsOptions") or {}).get("hostProcess")):
        found.add(ps.HOST_PROCESS, "spec.securityContext.windowsOptions.hostProcess=true")
    found.each_container(
        ps.HOST_PROCESS,
        spec,
        lambda c: (
            "securityContext.windowsOptions.hostProcess=true"
            if _bool((_sc(c).get("windowsOptions") or {}).get("hostProcess"))
            else None
        ),
    )
    if (psc.get("seccompProfile") or {}).get("type") == "Unconfined":
        found.add(ps.SECCOMP, "spec.securityContext.seccompProfile.type=Unconfined")
    found.each_container(
        ps.SECCOMP,
        spec,
        lambda c: (
            "securityContext.seccompProfile.type=Unconfined"
            if (_sc(c).get("seccompProfile") or {}).get("type") == "Unconfined"
            else None
        ),
    )
    pod_aa = str((psc.get("appArmorProfile") or {}).get("type") or "")
    if pod_aa and pod_aa not in ps.CONFINED_PROFILE_TYPES:
        found.add(ps.APPARMOR, f"spec.securityContext.appArmorProfile.type={pod_aa}")
    for k, value in ((pod.get("metadata") or {}).get("annotations") or {}).items():
        if k.startswith(ps.APPARMOR_ANNOTATION_PREFIX) and not (
            str(value).startswith("localhost/") or value == "runtime/default"
        ):
            found.add(ps.APPARMOR, f"annotation {k}={value}")

    def apparmor(c: Mapping[str, Any]) -> str | None:
        t = str((_sc(c).get("appArmorProfile") or {}).get("type") or "")
        return f"securityContext.appArmorProfile.type={t}" if t and t not in ps.CONFINED_PROFILE_TYPES else None

    found.each_container(ps.APPARMOR, spec, apparmor)
    pod_selinux = _selinux(psc.get("seLinuxOptions"), "spec.securityContext.")
    if pod_selinux is not None:
        found.add(ps.SELINUX, pod_selinux)
    found.each_container(ps.SELINUX, spec, lambda c: _selinux(_sc(c).get("seLinuxOptions"), "securityContext."))

    def proc(c: Mapping[str, Any]) -> str | None:
        mount = _sc(c).get("procMount") or "Default"
        return f"securityContext.procMount={mount}" if mount != "Default" else None

    found.each_container(ps.PROC_MOUNT, spec, proc)
    unsafe = [str(s.get("name")) for s in psc.get("sysctls") or [] if s.get("name") not in ps.SAFE_SYSCTLS]
    if unsafe:
        found.add(ps.SYSCTLS, f"spec.securityContext.sysctls {','.join(unsafe)}")


def _gpufed(found: _Found, pod: Mapping[str, Any], policy: OffloadPodSecurity, *, local: bool) -> None:
    spec = pod.get("spec") or {}
    if not local and spec.get("nodeName"):
        found.add(ps.NODE_NAME, f"spec.nodeName={spec['nodeName']}")
    allowed = frozenset({*ps.ALWAYS_TOLERATED, *policy.allowed_tolerations})
    for t in spec.get("tolerations") or []:
        if local and _dropped_by_forge(t):
            continue
        if not _toleration_ok(t, allowed):
            key = t.get("key") or "(every taint)"
            effect = f":{t['effect']}" if t.get("effect") else ""
            found.add(ps.TOLERATIONS, f"toleration {key}{effect}")
    priority = spec.get("priorityClassName") or ""
    if not local and priority and priority not in policy.allowed_priority_classes:
        found.add(ps.PRIORITY_CLASSES, f"spec.priorityClassName={priority}")
    pod_res = _resources(spec.get("resources") or {})
    if pod_res:
        found.add(ps.RESOURCES, f"spec.resources {','.join(pod_res)}")
    for claim in spec.get("resourceClaims") or []:
        # A twin names its twin claim; the local pod's template becomes such a claim when offloaded.
        if not claim.get("resourceClaimName") and not (local and claim.get("resourceClaimTemplateName")):
            found.add(ps.RESOURCES, f"spec.resourceClaims {claim.get('name')}")

    def resources(c: Mapping[str, Any]) -> str | None:
        names = _resources(c.get("resources") or {})
        return f"resources {','.join(names)}" if names else None

    found.each_container(ps.RESOURCES, spec, resources)


def _restricted(found: _Found, pod: Mapping[str, Any], policy: OffloadPodSecurity) -> None:
    spec = pod.get("spec") or {}
    psc = _sc(spec)

    def escalation(c: Mapping[str, Any]) -> str | None:
        sc = _sc(c)
        exempt = policy.allow_privileged and _bool(sc.get("privileged"))
        return (
            None
            if sc.get("allowPrivilegeEscalation") is False or exempt
            else "securityContext.allowPrivilegeEscalation is not false"
        )

    found.each_container(ps.PRIVILEGE_ESCALATION, spec, escalation)

    def non_root(c: Mapping[str, Any]) -> str | None:
        value = _sc(c).get("runAsNonRoot", psc.get("runAsNonRoot", False))
        return None if value is True else "securityContext.runAsNonRoot is not true"

    found.each_container(ps.RUN_AS_NON_ROOT, spec, non_root)
    if psc.get("runAsUser") == 0:
        found.add(ps.RUN_AS_ROOT, "spec.securityContext.runAsUser=0")
    found.each_container(
        ps.RUN_AS_ROOT, spec, lambda c: "securityContext.runAsUser=0" if _sc(c).get("runAsUser") == 0 else None
    )
    pod_seccomp = (psc.get("seccompProfile") or {}).get("type") or ""

    def seccomp(c: Mapping[str, Any]) -> str | None:
        t = (_sc(c).get("seccompProfile") or {}).get("type", pod_seccomp)
        return None if t in ps.CONFINED_PROFILE_TYPES else "no RuntimeDefault or Localhost seccomp profile"

    found.each_container(ps.SECCOMP_REQUIRED, spec, seccomp)

    def drop(c: Mapping[str, Any]) -> str | None:
        dropped = (_sc(c).get("capabilities") or {}).get("drop") or []
        return None if "ALL" in dropped else "securityContext.capabilities.drop lacks ALL"

    found.each_container(ps.DROP_ALL, spec, drop)


def violations(pod: Mapping[str, Any], policy: OffloadPodSecurity, *, local: bool = True) -> list[Violation]:
    """Everything in `pod` that `policy` refuses (empty: the provider admits it), in the order of the rules.

    `local`: `pod` is the consumer's pod, checked as the twin the forge makes of it (see the module
    docstring); False: `pod` is checked as it is, as the provider's admission policy checks it.
    """
    found = _Found()
    _baseline(found, pod, policy)
    _gpufed(found, pod, policy, local=local)
    if policy.level == "restricted":
        _restricted(found, pod, policy)
    order = {r.id: i for i, r in enumerate(ps.RULES)}
    return sorted(found.items, key=lambda v: order[v.rule])


def refusal(provider: str, found: Sequence[Violation]) -> str:
    """The user's reason: per refused rule, where the pod asks for it and what would allow it."""
    rules: dict[str, list[Violation]] = {}
    for v in found:
        rules.setdefault(v.what, []).append(v)
    parts = []
    for what, vs in rules.items():
        tail = vs[0].tail or f"; ask the provider to allow it in {FIELD}.{vs[0].allow_field}"
        parts.append(f"provider {provider} refuses {what} ({', '.join(v.where for v in vs)}){tail}")
    return "; ".join(parts)
