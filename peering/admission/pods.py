"""The pod ValidatingAdmissionPolicy `gpufed-offload-policy` and its binding (`admission_policy`,
`admission_binding`): one validation per rule of `peering.podsecurity.RULES`, in its order, matching
pod creation, ephemeral containers and pod updates (tolerations can be added to a running pod) in
every namespace that carries the consumer label, whoever sends them. Its variables read the
namespace's projection (`peering.podsecurity.namespace_metadata`); a namespace without it refuses.
Refusals are 403 Forbidden with a message naming the offending fields and the Tenant field that would
allow them (or the standard that refuses them).

Does not: define the rules or the constants they check against (`peering.podsecurity`), or the
policy for Services, EndpointSlices and Ingresses (`peering.admission.objects`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from gpufed.apis.offloading import ALL_CAPABILITIES
from gpufed.apis.pool import GPU_PRODUCT_LABEL
from gpufed.apis.wire import MANAGED_BY, MANAGED_BY_LABEL
from peering.admission.cel import binding, csv_list, label_is_true, literal, literal_list, namespace_variables
from peering.podsecurity import (
    ALLOW_HOST_NAMESPACES_LABEL,
    ALLOW_HOST_PATH_LABEL,
    ALLOW_HOST_PORTS_LABEL,
    ALLOW_PRIVILEGED_LABEL,
    ALLOWED_CAPABILITIES_ANNOTATION,
    ALLOWED_GPU_PRODUCTS_ANNOTATION,
    ALLOWED_PRIORITY_CLASSES_ANNOTATION,
    ALLOWED_TOLERATIONS_ANNOTATION,
    ALLOWED_VOLUME_TYPES_ANNOTATION,
    ANY,
    APPARMOR,
    APPARMOR_ANNOTATION_PREFIX,
    CAPABILITIES,
    CONFINED_PROFILE_TYPES,
    CONTAINER_KINDS,
    DEFAULT_VOLUME_TYPES,
    DROP_ALL,
    GPU_PRODUCTS,
    GRANTED_RESOURCES,
    HOST_NAMESPACE_FIELDS,
    HOST_NAMESPACES,
    HOST_PATH,
    HOST_PATH_VOLUMES,
    HOST_PORTS,
    HOST_PROCESS,
    LEVEL_ANNOTATION,
    NODE_CONDITION_TAINTS,
    NODE_NAME,
    OTHER_VOLUME_TYPES,
    POLICY_NAME,
    PRIORITY_CLASSES,
    PRIVILEGE_ESCALATION,
    PRIVILEGED,
    PROC_MOUNT,
    RESOURCES,
    RULES,
    RUN_AS_NON_ROOT,
    RUN_AS_ROOT,
    SAFE_SYSCTLS,
    SECCOMP,
    SECCOMP_REQUIRED,
    SELINUX,
    SELINUX_TYPES,
    SYSCTLS,
    TOLERATIONS,
    VOLUME_TYPES,
    Rule,
)


def _canonical(var: str) -> str:
    """CEL for the canonical capability name of the string `var` (as `models.capability_name`)."""
    return f"({var}.upperAscii().startsWith('CAP_') ? {var}.upperAscii().substring(4) : {var}.upperAscii())"


def _items(kind: str) -> str:
    return f"object.spec.?{kind}.orValue([])"


def _containers_where(bad: str, detail: str) -> str:
    """CEL for the list of "<noun> <name>: <detail>" of every container (all kinds) for which `bad` holds."""
    parts = [
        f"{_items(kind)}.filter(c, {bad}).map(c, '{noun} ' + c.name + ': ' + {detail})"
        for kind, noun in CONTAINER_KINDS
    ]
    return " + ".join(parts)


def _containers_ok(bad: str) -> str:
    return " && ".join(f"{_items(kind)}.all(c, !({bad}))" for kind, _ in CONTAINER_KINDS)


def _pod_where(checks: Sequence[tuple[str, str]]) -> str:
    """CEL for the list of `detail` of every pod-level (bad, detail) check that holds."""
    return "[" + ", ".join(f"{bad} ? {detail} : ''" for bad, detail in checks) + "].filter(s, s != '')"


@dataclass(frozen=True)
class _Check:
    """A rule's CEL: what must hold, the list of offending places, and when the rule applies at all."""

    rule: Rule
    ok: str
    where: str
    #: CEL that, when true, exempts the request (an allowance, another level, another operation).
    exempt: str = "false"


def _validation(check: _Check) -> dict[str, str]:
    rule = check.rule
    return {
        "expression": f"({check.exempt}) || ({check.ok})",
        "messageExpression": (
            f"{literal(rule.what + ' are refused (')} + ({check.where}).join(', ') + ')' + {literal(rule.tail)}"
        ),
        "message": f"{rule.what} are refused{rule.tail}",
        "reason": "Forbidden",
    }


def _container_check(rule: Rule, bad: str, detail: str, exempt: str = "false") -> _Check:
    return _Check(rule, _containers_ok(bad), _containers_where(bad, detail), exempt)


def _both_check(rule: Rule, pod: Sequence[tuple[str, str]], bad: str, detail: str, exempt: str = "false") -> _Check:
    """A rule over the pod's own fields (`pod`: (bad, detail) pairs) and every container's."""
    ok = " && ".join([*(f"!({b})" for b, _ in pod), _containers_ok(bad)])
    return _Check(rule, ok, f"{_pod_where(pod)} + {_containers_where(bad, detail)}", exempt)


def _volume_type() -> str:
    """CEL for the type of volume `v` (its source field), 'unknown' for none this policy knows."""
    expr = "'unknown'"
    for t in reversed((*DEFAULT_VOLUME_TYPES, HOST_PATH, *OTHER_VOLUME_TYPES)):
        expr = f"has(v.{t}) ? '{t}' : {expr}"
    return f"({expr})"


def _volume_ok() -> str:
    """CEL: volume `v` is of a default type, hostPath (its own rule), or an allowed other type."""
    known = [f"has(v.{t})" for t in (*DEFAULT_VOLUME_TYPES, HOST_PATH)]
    others = [f"(has(v.{t}) && '{t}' in variables.allowedVolumeTypes)" for t in OTHER_VOLUME_TYPES]
    return "(" + " || ".join(known + others) + ")"


_PSC = "object.spec.?securityContext"
_SC = "c.?securityContext"
_SPEC_ONLY = "!variables.specRules"


def _checks() -> list[_Check]:
    out: list[_Check] = []
    spec = _SPEC_ONLY
    # privileged, capabilities
    privileged = f"{_SC}.?privileged.orValue(false)"
    out.append(
        _container_check(
            PRIVILEGED, privileged, "'securityContext.privileged=true'", f"{spec} || variables.allowPrivileged"
        )
    )
    added = f"{_SC}.?capabilities.?add.orValue([])"
    refused = f"{added}.filter(a, !({_canonical('a')} in variables.allowedCapabilities))"
    out.append(
        _container_check(
            CAPABILITIES,
            f"{refused}.size() > 0",
            f"'securityContext.capabilities.add=' + {refused}.join(',')",
            f"{spec} || variables.allowAnyCapability",
        )
    )
    # host namespaces, hostPath, host ports
    host = [(f"object.spec.?{f}.orValue(false)", f"'spec.{f}=true'") for f in HOST_NAMESPACE_FIELDS]
    out.append(
        _Check(
            HOST_NAMESPACES,
            " && ".join(f"!{b}" for b, _ in host),
            _pod_where(host),
            f"{spec} || variables.allowHostNamespaces",
        )
    )
    volumes = "object.spec.?volumes.orValue([])"
    out.append(
        _Check(
            HOST_PATH_VOLUMES,
            f"{volumes}.all(v, !has(v.hostPath))",
            f"{volumes}.filter(v, has(v.hostPath)).map(v, 'volume ' + v.name + ': hostPath ' + v.hostPath.path)",
            f"{spec} || variables.allowHostPath",
        )
    )
    host_port = "p.?hostPort.orValue(0) != 0"
    out.append(
        _container_check(
            HOST_PORTS,
            f"c.?ports.orValue([]).exists(p, {host_port})",
            f"'ports.hostPort=' + c.ports.filter(p, {host_port}).map(p, string(p.hostPort)).join(',')",
            f"{spec} || variables.allowHostPorts",
        )
    )
    out.append(
        _Check(
            VOLUME_TYPES,
            f"{volumes}.all(v, {_volume_ok()})",
            f"{volumes}.filter(v, !{_volume_ok()}).map(v, 'volume ' + v.name + ': ' + {_volume_type()})",
            spec,
        )
    )
    # Pod Security baseline
    out.append(
        _both_check(
            HOST_PROCESS,
            [
                (
                    f"{_PSC}.?windowsOptions.?hostProcess.orValue(false)",
                    "'spec.securityContext.windowsOptions.hostProcess=true'",
                )
            ],
            f"{_SC}.?windowsOptions.?hostProcess.orValue(false)",
            "'securityContext.windowsOptions.hostProcess=true'",
            spec,
        )
    )
    out.append(
        _both_check(
            SECCOMP,
            [
                (
                    f"{_PSC}.?seccompProfile.?type.orValue('') == 'Unconfined'",
                    "'spec.securityContext.seccompProfile.type=Unconfined'",
                )
            ],
            f"{_SC}.?seccompProfile.?type.orValue('') == 'Unconfined'",
            "'securityContext.seccompProfile.type=Unconfined'",
            spec,
        )
    )
    confined = literal_list(CONFINED_PROFILE_TYPES)
    apparmor_bad = (
        "(variables.podAnnotations[k].startsWith('localhost/') || variables.podAnnotations[k] == 'runtime/default')"
    )
    aa_keys = f"variables.podAnnotations.filter(k, k.startsWith('{APPARMOR_ANNOTATION_PREFIX}') && !{apparmor_bad})"
    pod_aa = f"{_PSC}.?appArmorProfile.?type.orValue('')"
    c_aa = f"{_SC}.?appArmorProfile.?type.orValue('')"
    out.append(
        _Check(
            APPARMOR,
            f"!({pod_aa} != '' && !({pod_aa} in {confined})) && {aa_keys}.size() == 0 && "
            + _containers_ok(f"{c_aa} != '' && !({c_aa} in {confined})"),
            _pod_where(
                [
                    (
                        f"{pod_aa} != '' && !({pod_aa} in {confined})",
                        f"'spec.securityContext.appArmorProfile.type=' + {pod_aa}",
                    )
                ]
            )
            + f" + {aa_keys}.map(k, 'annotation ' + k + '=' + variables.podAnnotations[k])"
            + " + "
            + _containers_where(
                f"{c_aa} != '' && !({c_aa} in {confined})", f"'securityContext.appArmorProfile.type=' + {c_aa}"
            ),
            spec,
        )
    )
    types = literal_list(SELINUX_TYPES)

    def selinux(o: str, prefix: str) -> tuple[str, str]:
        t, u, r = (f"{o}.?seLinuxOptions.?{f}.orValue('')" for f in ("type", "user", "role"))
        bad = f"(!({t} in {types}) || {u} != '' || {r} != '')"
        detail = f"(!({t} in {types}) ? '{prefix}seLinuxOptions.type=' + {t} : '{prefix}seLinuxOptions.user/role set')"
        return bad, detail

    pod_bad, pod_detail = selinux(_PSC, "spec.securityContext.")
    c_bad, c_detail = selinux(_SC, "securityContext.")
    out.append(_both_check(SELINUX, [(pod_bad, pod_detail)], c_bad, c_detail, spec))
    proc = f"{_SC}.?procMount.orValue('Default')"
    out.append(_container_check(PROC_MOUNT, f"{proc} != 'Default'", f"'securityContext.procMount=' + {proc}", spec))
    sysctls = f"{_PSC}.?sysctls.orValue([]).filter(s, !(s.name in {literal_list(SAFE_SYSCTLS)}))"
    out.append(
        _Check(
            SYSCTLS,
            f"{sysctls}.size() == 0",
            f"({sysctls}.size() > 0 ? ['spec.securityContext.sysctls ' + {sysctls}.map(s, s.name).join(',')] : [])",
            spec,
        )
    )
    # gpufed's own: node names, tolerations, priority classes, resources, GPU products
    node = "object.spec.?nodeName.orValue('')"
    out.append(_Check(NODE_NAME, f"{node} == ''", f"['spec.nodeName=' + {node}]", "request.operation != 'CREATE'"))
    condition_taints = literal_list(NODE_CONDITION_TAINTS)
    toleration_ok = (
        "(t.?key.orValue('') != '' && (t.key in variables.allowedTolerations || "
        f"(t.key in {condition_taints} && t.?effect.orValue('') == 'NoExecute' && has(t.tolerationSeconds))))"
    )
    tolerations = "object.spec.?tolerations.orValue([])"
    out.append(
        _Check(
            TOLERATIONS,
            f"{tolerations}.all(t, {toleration_ok})",
            f"{tolerations}.filter(t, !{toleration_ok}).map(t, 'toleration ' + "
            "(t.?key.orValue('') == '' ? '(every taint)' : t.key) + "
            "(t.?effect.orValue('') == '' ? '' : ':' + t.effect))",
            # An update that leaves the tolerations as they were (a label, an image) is not held to a
            # policy that changed since the pod was admitted.
            "request.operation == 'UPDATE' && "
            "object.spec.?tolerations.orValue([]) == oldObject.spec.?tolerations.orValue([])",
        )
    )
    priority = "object.spec.?priorityClassName.orValue('')"
    out.append(
        _Check(
            PRIORITY_CLASSES,
            f"{priority} == '' || {priority} in variables.allowedPriorityClasses",
            f"['spec.priorityClassName=' + {priority}]",
            spec,
        )
    )
    granted = literal_list(GRANTED_RESOURCES)
    names = (
        f"(c.?resources.?requests.orValue({{}}).filter(r, !(r in {granted})) + "
        f"c.?resources.?limits.orValue({{}}).filter(r, !(r in {granted})))"
    )
    pod_res = (
        f"(object.spec.?resources.?requests.orValue({{}}).filter(r, !(r in {granted})) + "
        f"object.spec.?resources.?limits.orValue({{}}).filter(r, !(r in {granted})))"
    )
    # ResourceClaims by name only: the twin claims the consumer creates, which the device-claims
    # policy and the grant's quota hold; a template would let a pod make claims of its own.
    pod_claims = "object.spec.?resourceClaims.orValue([]).filter(x, !has(x.resourceClaimName))"
    out.append(
        _Check(
            RESOURCES,
            f"{pod_res}.size() == 0 && {pod_claims}.size() == 0 && " + _containers_ok(f"{names}.size() > 0"),
            f"({pod_res}.size() > 0 ? ['spec.resources ' + {pod_res}.join(',')] : []) + "
            f"{pod_claims}.map(x, 'spec.resourceClaims ' + x.name) + "
            + _containers_where(f"{names}.size() > 0", f"'resources ' + {names}.join(',')"),
            spec,
        )
    )
    product = literal(GPU_PRODUCT_LABEL)
    selector = f"object.spec.?nodeSelector[?{product}]"
    expression_bad = f"e.key == {product} && e.operator == 'In' && e.values.exists(x, !(x in variables.gpuProducts))"
    terms = (
        "object.spec.?affinity.?nodeAffinity.?requiredDuringSchedulingIgnoredDuringExecution"
        ".?nodeSelectorTerms.orValue([])"
    )
    term_bad = f"t.?matchExpressions.orValue([]).exists(e, {expression_bad})"
    selector_bad = f"({selector}.hasValue() && !({selector}.value() in variables.gpuProducts))"
    out.append(
        _Check(
            GPU_PRODUCTS,
            f"!{selector_bad} && {terms}.all(t, !({term_bad}))",
            f"({selector_bad} ? ['spec.nodeSelector {GPU_PRODUCT_LABEL}=' + {selector}.value()] : []) + "
            f"{terms}.filter(t, {term_bad}).map(t, 'spec.affinity {GPU_PRODUCT_LABEL} In ' + "
            f"t.matchExpressions.filter(e, {expression_bad}).map(e, e.values.join(',')).join(','))",
            f"{spec} || variables.anyGpuProduct",
        )
    )
    # Pod Security restricted
    restricted = f"{spec} || variables.level != 'restricted'"
    escalation = f"{_SC}.?allowPrivilegeEscalation.orValue(true) && !(variables.allowPrivileged && {privileged})"
    out.append(
        _container_check(
            PRIVILEGE_ESCALATION, escalation, "'securityContext.allowPrivilegeEscalation is not false'", restricted
        )
    )
    non_root = f"!{_SC}.?runAsNonRoot.orValue({_PSC}.?runAsNonRoot.orValue(false))"
    out.append(_container_check(RUN_AS_NON_ROOT, non_root, "'securityContext.runAsNonRoot is not true'", restricted))
    out.append(
        _both_check(
            RUN_AS_ROOT,
            [(f"{_PSC}.?runAsUser.orValue(1) == 0", "'spec.securityContext.runAsUser=0'")],
            f"{_SC}.?runAsUser.orValue(1) == 0",
            "'securityContext.runAsUser=0'",
            restricted,
        )
    )
    seccomp = f"!({_SC}.?seccompProfile.?type.orValue({_PSC}.?seccompProfile.?type.orValue('')) in {confined})"
    out.append(
        _container_check(SECCOMP_REQUIRED, seccomp, "'no RuntimeDefault or Localhost seccomp profile'", restricted)
    )
    drop = f"!{_SC}.?capabilities.?drop.orValue([]).exists(d, d == 'ALL')"
    out.append(_container_check(DROP_ALL, drop, "'securityContext.capabilities.drop lacks ALL'", restricted))
    assert [c.rule for c in out] == list(RULES)
    return out


def admission_policy() -> dict[str, Any]:
    """The pod ValidatingAdmissionPolicy every consumer namespace is bound to (cluster-wide, one object)."""
    pods = {"apiGroups": [""], "apiVersions": ["v1"], "resources": ["pods"]}
    return {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicy",
        "metadata": {"name": POLICY_NAME, "labels": {MANAGED_BY_LABEL: MANAGED_BY}},
        "spec": {
            "failurePolicy": "Fail",
            "matchConstraints": {
                "resourceRules": [
                    # UPDATE: tolerations may be added to a running pod (the one rule checked on updates).
                    {**pods, "operations": ["CREATE", "UPDATE"]},
                    {**pods, "operations": ["UPDATE"], "resources": ["pods/ephemeralcontainers"]},
                ]
            },
            "variables": [
                *namespace_variables(),
                {
                    "name": "specRules",
                    "expression": (
                        "request.operation == 'CREATE' || request.?subResource.orValue('') == 'ephemeralcontainers'"
                    ),
                },
                {
                    "name": "podAnnotations",
                    "expression": "has(object.metadata.annotations) ? object.metadata.annotations : {}",
                },
                {"name": "level", "expression": f"variables.annotations[?'{LEVEL_ANNOTATION}'].orValue('restricted')"},
                {"name": "allowPrivileged", "expression": label_is_true(ALLOW_PRIVILEGED_LABEL)},
                {"name": "allowHostNamespaces", "expression": label_is_true(ALLOW_HOST_NAMESPACES_LABEL)},
                {"name": "allowHostPath", "expression": label_is_true(ALLOW_HOST_PATH_LABEL)},
                {"name": "allowHostPorts", "expression": label_is_true(ALLOW_HOST_PORTS_LABEL)},
                {"name": "allowedCapabilities", "expression": csv_list(ALLOWED_CAPABILITIES_ANNOTATION)},
                {
                    "name": "allowAnyCapability",
                    "expression": f"'{ALL_CAPABILITIES}' in variables.allowedCapabilities",
                },
                {"name": "allowedVolumeTypes", "expression": csv_list(ALLOWED_VOLUME_TYPES_ANNOTATION)},
                {"name": "allowedTolerations", "expression": csv_list(ALLOWED_TOLERATIONS_ANNOTATION)},
                {"name": "allowedPriorityClasses", "expression": csv_list(ALLOWED_PRIORITY_CLASSES_ANNOTATION)},
                {"name": "gpuProducts", "expression": csv_list(ALLOWED_GPU_PRODUCTS_ANNOTATION)},
                {"name": "anyGpuProduct", "expression": f"'{ANY}' in variables.gpuProducts"},
            ],
            "validations": [_validation(c) for c in _checks()],
        },
    }


def admission_binding() -> dict[str, Any]:
    """Binds the pod policy to every namespace a consumer has on this provider (tenant and twins)."""
    return binding(POLICY_NAME)
