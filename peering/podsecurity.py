"""What a consumer may do in its namespaces on a provider, as the provider's own API server enforces it.

A provider decides, per consumer (`Tenant.spec.policy`), what the consumer's pods may ask of its nodes
(`podSecurity`, `gpufed.apis.offloading.OffloadPodSecurity`: Pod Security "baseline" by default or
"restricted", plus gpufed's own rules, each exception allowed explicitly), which GPU products they may
pin (`allowedGpuProducts`), and which Ingress hosts and annotations the consumer may claim.

Owns:
- `RULES`: the one list of pod rules (what each refuses, the Tenant field that would allow it, or the
  standard that fixes it) and the constants they check against (safe sysctls, SELinux types, volume
  types, resources). The provider's admission policy below is rendered from them, and the consumer's
  early check (`vkprovider.forge.podpolicy`) implements the same rules in Python with the same words;
- `Projection` and `namespace_metadata`: the projection of a tenant's policy onto each of its
  namespaces on the provider (tenant and twins) as labels and annotations the policies read from
  `namespaceObject` (booleans as `gpufed.io/allow-*` labels, lists as comma-separated
  `gpufed.io/*` annotations), plus the Pod Security Admission labels (`pod-security.kubernetes.io/*`)
  as a second layer where they do not contradict an allowed exception (`psa_level`);
- the ValidatingAdmissionPolicy `gpufed-offload-policy` and its binding (`admission_policy`,
  `admission_binding`): CEL evaluated inside kube-apiserver (no webhook to run or to fail open),
  matching pod creation, ephemeral containers and pod updates (tolerations can be added to a running
  pod) in every namespace that carries the consumer label, whoever sends them;
- the ValidatingAdmissionPolicy `gpufed-consumer-objects` and its binding (`objects_policy`,
  `objects_binding`): Services (ClusterIP or ExternalName only: no node ports, load balancers or
  external IPs; an ExternalName never an address or a name inside a cluster), EndpointSlices
  (addresses only inside the ranges the consumer is entitled to, `gpufed.io/endpoint-cidrs`) and
  Ingresses (hosts the tenant was given, no catch-all rule or default backend, annotations from an
  allow-list) written by a consumer identity in those namespaces;
- `describe`: the pod policy in one line, for the Tenant's `PodSecurity` condition.

A namespace without the projection refuses (fail closed: no flag allows, the level is read as
restricted, no GPU product and no endpoint range is allowed), and a consumer cannot loosen it: it has
no rights on namespaces, and the policies check the object whoever sends it, so skipping the
consumer's own check gains nothing. Refusals are 403 Forbidden with a message naming the offending
fields and the Tenant field that would allow them (or the standard that refuses them).

Why not Pod Security Admission alone: its levels are coarse. `baseline` still lets containers add
the default capability set (CHOWN, NET_BIND_SERVICE, ...) and says nothing about volume types,
tolerations, priority classes or node names, and one allowance (say hostPath for one tenant) can only
be granted by dropping to `privileged`, which lifts every other restriction too. Its labels are set
where they agree with the tenant's exceptions, and lifted (enforce `privileged`, warn and audit kept)
where an exception would contradict them: the admission policy still enforces everything else.

Does not: apply anything (peering.controllers.tenant_namespaces does), or check pods in Python (the
consumer's vkprovider.forge.podpolicy implements the same rules).

Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from gpufed.apis.offloading import ALL_CAPABILITIES, OffloadPodSecurity
from gpufed.apis.pool import GPU_PRODUCT_LABEL, GPU_RESOURCE
from gpufed.apis.wire import CONSUMER_LABEL, MANAGED_BY, MANAGED_BY_LABEL

#: Name of the pod ValidatingAdmissionPolicy and of its binding.
POLICY_NAME = "gpufed-offload-policy"
#: Name of the ValidatingAdmissionPolicy (and binding) for the Services, EndpointSlices and Ingresses
#: a consumer writes.
OBJECTS_POLICY_NAME = "gpufed-consumer-objects"

ALLOW_PRIVILEGED_LABEL = "gpufed.io/allow-privileged"
ALLOW_HOST_NAMESPACES_LABEL = "gpufed.io/allow-host-namespaces"
ALLOW_HOST_PATH_LABEL = "gpufed.io/allow-host-path"
ALLOW_HOST_PORTS_LABEL = "gpufed.io/allow-host-ports"
ALLOWED_CAPABILITIES_ANNOTATION = "gpufed.io/allowed-capabilities"
LEVEL_ANNOTATION = "gpufed.io/pod-security-level"
ALLOWED_VOLUME_TYPES_ANNOTATION = "gpufed.io/allowed-volume-types"
ALLOWED_TOLERATIONS_ANNOTATION = "gpufed.io/allowed-tolerations"
ALLOWED_PRIORITY_CLASSES_ANNOTATION = "gpufed.io/allowed-priority-classes"
#: Comma-separated GPU products pods may pin; `*`: any.
ALLOWED_GPU_PRODUCTS_ANNOTATION = "gpufed.io/allowed-gpu-products"
#: Comma-separated CIDRs a consumer's EndpointSlice addresses must fall in.
ENDPOINT_CIDRS_ANNOTATION = "gpufed.io/endpoint-cidrs"
INGRESS_HOSTS_ANNOTATION = "gpufed.io/ingress-hosts"
INGRESS_ANNOTATIONS_ANNOTATION = "gpufed.io/ingress-annotations"
#: Pod Security Admission's namespace labels.
PSA_PREFIX = "pod-security.kubernetes.io/"
ANY = "*"

#: Where a refused pod's user is sent (the field that would allow it).
FIELD = "Tenant spec.policy.podSecurity"

#: The pod fields that hold containers, and how a message names one of them.
CONTAINER_KINDS = (
    ("containers", "container"),
    ("initContainers", "init container"),
    ("ephemeralContainers", "ephemeral container"),
)
HOST_NAMESPACE_FIELDS = ("hostNetwork", "hostPID", "hostIPC")

# ---- the constants the rules check against (Pod Security Standards, Kubernetes 1.36)

#: Sysctls Pod Security baseline allows (namespaced and isolated from the node).
SAFE_SYSCTLS = (
    "kernel.shm_rmid_forced",
    "net.ipv4.ip_local_port_range",
    "net.ipv4.ip_unprivileged_port_start",
    "net.ipv4.tcp_syncookies",
    "net.ipv4.ping_group_range",
    "net.ipv4.ip_local_reserved_ports",
    "net.ipv4.tcp_keepalive_time",
    "net.ipv4.tcp_fin_timeout",
    "net.ipv4.tcp_keepalive_intvl",
    "net.ipv4.tcp_keepalive_probes",
    "net.ipv4.tcp_rmem",
    "net.ipv4.tcp_wmem",
)
#: SELinux types Pod Security baseline allows (and no user or role at all).
SELINUX_TYPES = ("", "container_t", "container_init_t", "container_kvm_t", "container_engine_t")
#: seccomp and AppArmor profile types baseline allows (unset too); restricted requires one of them.
CONFINED_PROFILE_TYPES = ("RuntimeDefault", "Localhost")
APPARMOR_ANNOTATION_PREFIX = "container.apparmor.security.beta.kubernetes.io/"
#: Volume types every pod may use: data the pod's own namespace holds.
DEFAULT_VOLUME_TYPES = ("configMap", "secret", "downwardAPI", "emptyDir", "projected", "persistentVolumeClaim")
#: Every other volume source of the Pod API; a volume of none of the known types is refused too.
OTHER_VOLUME_TYPES = (
    "ephemeral",
    "csi",
    "image",
    "nfs",
    "iscsi",
    "rbd",
    "cephfs",
    "glusterfs",
    "fc",
    "flexVolume",
    "gitRepo",
    "cinder",
    "flocker",
    "azureFile",
    "azureDisk",
    "vsphereVolume",
    "quobyte",
    "photonPersistentDisk",
    "portworxVolume",
    "scaleIO",
    "storageos",
    "gcePersistentDisk",
    "awsElasticBlockStore",
)
HOST_PATH = "hostPath"
#: Taints every pod may tolerate: GPU nodes are commonly tainted for GPU pods only.
ALWAYS_TOLERATED = (GPU_RESOURCE,)
#: Tolerations the provider's own admission adds (DefaultTolerationSeconds): allowed with a time limit.
NODE_CONDITION_TAINTS = ("node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable")
#: What a consumer's containers may request: what a grant is made of (the quota counts them), nothing else.
GRANTED_RESOURCES = ("cpu", "memory", "ephemeral-storage", GPU_RESOURCE)
#: Used, when the provider does not know its own pod range, as the ranges endpoint addresses may be in.
PRIVATE_CIDRS = ("10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "100.64.0.0/10", "fc00::/7")
#: The capabilities Pod Security baseline lets containers add (its allowance is a subset of them or PSA is lifted).
BASELINE_CAPABILITIES = frozenset(
    {
        "AUDIT_WRITE",
        "CHOWN",
        "DAC_OVERRIDE",
        "FOWNER",
        "FSETID",
        "KILL",
        "MKNOD",
        "NET_BIND_SERVICE",
        "SETFCAP",
        "SETGID",
        "SETPCAP",
        "SETUID",
        "SYS_CHROOT",
    }
)
RESTRICTED_CAPABILITIES = frozenset({"NET_BIND_SERVICE"})
#: Volume types Pod Security restricted allows (else PSA is lifted for a tenant allowed more).
RESTRICTED_VOLUME_TYPES = frozenset({*DEFAULT_VOLUME_TYPES, "csi", "ephemeral"})


# ---- the rules


@dataclass(frozen=True)
class Rule:
    """One pod rule: what it refuses, and what would allow it."""

    #: Stable identifier (tests, docs).
    id: str
    #: What is refused, as a plural noun: "<what> are refused".
    what: str
    #: The OffloadPodSecurity field (camelCase) that would allow it, if a tenant can be allowed it.
    allow: str = ""
    #: Else: why it is never allowed (a standard, or gpufed's reason).
    fixed: str = ""
    #: The level it belongs to: rules of "restricted" apply only to tenants held to it.
    level: str = "baseline"

    @property
    def tail(self) -> str:
        """What follows the offending fields in a refusal."""
        if self.allow:
            path = self.allow if self.allow.startswith("Tenant ") else f"{FIELD}.{self.allow}"
            return f"; ask the provider to allow it in {path}"
        return f" ({self.fixed})"


_BASELINE = "Pod Security baseline"
_RESTRICTED = f"Pod Security restricted, {FIELD}.level"
PRIVILEGED = Rule("privileged", "privileged containers", allow="allowPrivileged")
CAPABILITIES = Rule("capabilities", "added capabilities", allow="allowedCapabilities")
HOST_NAMESPACES = Rule("hostNamespaces", "host namespaces", allow="allowHostNamespaces")
HOST_PATH_VOLUMES = Rule("hostPath", "hostPath volumes", allow="allowHostPath")
HOST_PORTS = Rule("hostPorts", "host ports", allow="allowHostPorts")
VOLUME_TYPES = Rule("volumeTypes", "volume types outside the allowed set", allow="allowedVolumeTypes")
TOLERATIONS = Rule("tolerations", "tolerations outside the allowed set", allow="allowedTolerations")
PRIORITY_CLASSES = Rule("priorityClasses", "priority classes outside the allowed set", allow="allowedPriorityClasses")
HOST_PROCESS = Rule("hostProcess", "Windows host processes", fixed=_BASELINE)
SECCOMP = Rule("seccomp", "Unconfined seccomp profiles", fixed=_BASELINE)
APPARMOR = Rule("appArmor", "Unconfined AppArmor profiles", fixed=_BASELINE)
SELINUX = Rule("seLinux", "SELinux options other than the container types", fixed=_BASELINE)
PROC_MOUNT = Rule("procMount", "unmasked /proc mounts", fixed=_BASELINE)
SYSCTLS = Rule("sysctls", "unsafe sysctls", fixed=_BASELINE)
NODE_NAME = Rule("nodeName", "pods naming their node", fixed="the provider's scheduler places every pod")
RESOURCES = Rule(
    "resources",
    "resources outside the grant",
    fixed=f"a consumer's pods may request {', '.join(GRANTED_RESOURCES)} only",
)
GPU_PRODUCTS = Rule("gpuProducts", "GPU products outside the grant", allow="Tenant spec.policy.allowedGpuProducts")
PRIVILEGE_ESCALATION = Rule(
    "privilegeEscalation", "containers allowing privilege escalation", fixed=_RESTRICTED, level="restricted"
)
RUN_AS_NON_ROOT = Rule("runAsNonRoot", "containers that may run as root", fixed=_RESTRICTED, level="restricted")
RUN_AS_ROOT = Rule("runAsUser", "root user IDs", fixed=_RESTRICTED, level="restricted")
SECCOMP_REQUIRED = Rule(
    "seccompRequired", "containers without a seccomp profile", fixed=_RESTRICTED, level="restricted"
)
DROP_ALL = Rule("dropAll", "containers not dropping ALL capabilities", fixed=_RESTRICTED, level="restricted")

#: Every pod rule, in the order refusals list them.
RULES = (
    PRIVILEGED,
    CAPABILITIES,
    HOST_NAMESPACES,
    HOST_PATH_VOLUMES,
    HOST_PORTS,
    VOLUME_TYPES,
    HOST_PROCESS,
    SECCOMP,
    APPARMOR,
    SELINUX,
    PROC_MOUNT,
    SYSCTLS,
    NODE_NAME,
    TOLERATIONS,
    PRIORITY_CLASSES,
    RESOURCES,
    GPU_PRODUCTS,
    PRIVILEGE_ESCALATION,
    RUN_AS_NON_ROOT,
    RUN_AS_ROOT,
    SECCOMP_REQUIRED,
    DROP_ALL,
)


# ---- the projection onto a consumer's namespaces


@dataclass(frozen=True)
class Projection:
    """Everything the admission policies read from one of a consumer's namespaces."""

    pod_security: OffloadPodSecurity = field(default_factory=OffloadPodSecurity)
    #: GPU products pods may pin (None: any).
    gpu_products: Sequence[str] | None = None
    #: The provider's global default PriorityClass (its Priority admission names it in pods that name none).
    default_priority_class: str | None = None
    #: CIDRs the consumer's EndpointSlice addresses must fall in.
    endpoint_cidrs: Sequence[str] = PRIVATE_CIDRS
    ingress_hosts: Sequence[str] = ()
    ingress_annotations: Sequence[str] = ()


def _flag(value: bool) -> str:
    return "true" if value else "false"


def psa_level(policy: OffloadPodSecurity) -> str:
    """The Pod Security Admission level that can be enforced beside `policy` without refusing what it allows:
    its own level, or `privileged` when one of its exceptions goes beyond that level."""
    level_caps = RESTRICTED_CAPABILITIES if policy.level == "restricted" else BASELINE_CAPABILITIES
    exceptions = (
        policy.allow_privileged
        or policy.allow_host_namespaces
        or policy.allow_host_path
        or policy.allow_host_ports
        or not set(policy.allowed_capabilities) <= level_caps
        or (policy.level == "restricted" and not set(policy.allowed_volume_types) <= RESTRICTED_VOLUME_TYPES)
    )
    return "privileged" if exceptions else policy.level


def namespace_metadata(projection: Projection | OffloadPodSecurity) -> tuple[dict[str, str], dict[str, str]]:
    """(labels, annotations) that project a tenant's policy onto one of its namespaces."""
    p = projection if isinstance(projection, Projection) else Projection(pod_security=projection)
    policy = p.pod_security
    enforce = psa_level(policy)
    labels = {
        ALLOW_PRIVILEGED_LABEL: _flag(policy.allow_privileged),
        ALLOW_HOST_NAMESPACES_LABEL: _flag(policy.allow_host_namespaces),
        ALLOW_HOST_PATH_LABEL: _flag(policy.allow_host_path),
        ALLOW_HOST_PORTS_LABEL: _flag(policy.allow_host_ports),
        f"{PSA_PREFIX}enforce": enforce,
        f"{PSA_PREFIX}enforce-version": "latest",
        f"{PSA_PREFIX}warn": policy.level,
        f"{PSA_PREFIX}warn-version": "latest",
        f"{PSA_PREFIX}audit": policy.level,
        f"{PSA_PREFIX}audit-version": "latest",
    }
    priority = sorted(
        {*policy.allowed_priority_classes, *([p.default_priority_class] if p.default_priority_class else [])}
    )
    annotations = {
        ALLOWED_CAPABILITIES_ANNOTATION: ",".join(policy.allowed_capabilities),
        LEVEL_ANNOTATION: policy.level,
        ALLOWED_VOLUME_TYPES_ANNOTATION: ",".join(policy.allowed_volume_types),
        ALLOWED_TOLERATIONS_ANNOTATION: ",".join(sorted({*ALWAYS_TOLERATED, *policy.allowed_tolerations})),
        ALLOWED_PRIORITY_CLASSES_ANNOTATION: ",".join(priority),
        ALLOWED_GPU_PRODUCTS_ANNOTATION: ANY if p.gpu_products is None else ",".join(sorted(p.gpu_products)),
        ENDPOINT_CIDRS_ANNOTATION: ",".join(p.endpoint_cidrs),
        INGRESS_HOSTS_ANNOTATION: ",".join(p.ingress_hosts),
        INGRESS_ANNOTATIONS_ANNOTATION: ",".join(p.ingress_annotations),
    }
    return labels, annotations


def describe(policy: OffloadPodSecurity) -> str:
    """One line for humans: the level, what the policy refuses and what it allows."""
    refused: list[str] = []
    allowed: list[str] = []
    for ok, what in (
        (policy.allow_privileged, "privileged containers"),
        (policy.allow_host_namespaces, "host namespaces"),
        (policy.allow_host_path, "hostPath volumes"),
        (policy.allow_host_ports, "host ports"),
    ):
        (allowed if ok else refused).append(what)
    caps = policy.allowed_capabilities
    if ALL_CAPABILITIES in caps:
        allowed.append("adding any capability")
    else:
        refused.append("added capabilities" + (f" other than {', '.join(caps)}" if caps else ""))
    refused.append("volume types other than " + ", ".join([*DEFAULT_VOLUME_TYPES, *policy.allowed_volume_types]))
    refused.append(
        "tolerations of taints other than " + ", ".join(sorted({*ALWAYS_TOLERATED, *policy.allowed_tolerations}))
    )
    refused.append(
        "priority classes"
        + (f" other than {', '.join(policy.allowed_priority_classes)}" if policy.allowed_priority_classes else "")
    )
    refused.append("node names")
    parts = [f"Pod Security {policy.level}"]
    if refused:
        parts.append("refused: " + ", ".join(refused))
    if allowed:
        parts.append("allowed: " + ", ".join(allowed))
    return "; ".join(parts)


# ---- CEL building blocks


def _str(value: str) -> str:
    """A CEL string literal."""
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


def _list(values: Sequence[str]) -> str:
    return "[" + ", ".join(_str(v) for v in values) + "]"


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
            f"{_str(rule.what + ' are refused (')} + ({check.where}).join(', ') + ')' + {_str(rule.tail)}"
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
    confined = _list(CONFINED_PROFILE_TYPES)
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
    types = _list(SELINUX_TYPES)

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
    sysctls = f"{_PSC}.?sysctls.orValue([]).filter(s, !(s.name in {_list(SAFE_SYSCTLS)}))"
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
    condition_taints = _list(NODE_CONDITION_TAINTS)
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
    granted = _list(GRANTED_RESOURCES)
    names = (
        f"(c.?resources.?requests.orValue({{}}).filter(r, !(r in {granted})) + "
        f"c.?resources.?limits.orValue({{}}).filter(r, !(r in {granted})))"
    )
    claims = "c.?resources.?claims.orValue([]).map(x, 'claim ' + x.name)"
    pod_res = (
        f"(object.spec.?resources.?requests.orValue({{}}).filter(r, !(r in {granted})) + "
        f"object.spec.?resources.?limits.orValue({{}}).filter(r, !(r in {granted})))"
    )
    pod_claims = "object.spec.?resourceClaims.orValue([])"
    out.append(
        _Check(
            RESOURCES,
            f"{pod_res}.size() == 0 && {pod_claims}.size() == 0 && "
            + _containers_ok(f"({names} + {claims}).size() > 0"),
            f"({pod_res}.size() > 0 ? ['spec.resources ' + {pod_res}.join(',')] : []) + "
            f"{pod_claims}.map(x, 'spec.resourceClaims ' + x.name) + "
            + _containers_where(f"({names} + {claims}).size() > 0", f"'resources ' + ({names} + {claims}).join(',')"),
            spec,
        )
    )
    product = _str(GPU_PRODUCT_LABEL)
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


def _label(name: str) -> str:
    return f"variables.labels[?'{name}'].orValue('') == 'true'"


def _csv(annotation: str) -> str:
    value = f"variables.annotations[?'{annotation}'].orValue('')"
    return f"{value} == '' ? [] : {value}.split(',')"


def _namespace_variables() -> list[dict[str, str]]:
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
                *_namespace_variables(),
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
                {"name": "allowPrivileged", "expression": _label(ALLOW_PRIVILEGED_LABEL)},
                {"name": "allowHostNamespaces", "expression": _label(ALLOW_HOST_NAMESPACES_LABEL)},
                {"name": "allowHostPath", "expression": _label(ALLOW_HOST_PATH_LABEL)},
                {"name": "allowHostPorts", "expression": _label(ALLOW_HOST_PORTS_LABEL)},
                {"name": "allowedCapabilities", "expression": _csv(ALLOWED_CAPABILITIES_ANNOTATION)},
                {
                    "name": "allowAnyCapability",
                    "expression": f"'{ALL_CAPABILITIES}' in variables.allowedCapabilities",
                },
                {"name": "allowedVolumeTypes", "expression": _csv(ALLOWED_VOLUME_TYPES_ANNOTATION)},
                {"name": "allowedTolerations", "expression": _csv(ALLOWED_TOLERATIONS_ANNOTATION)},
                {"name": "allowedPriorityClasses", "expression": _csv(ALLOWED_PRIORITY_CLASSES_ANNOTATION)},
                {"name": "gpuProducts", "expression": _csv(ALLOWED_GPU_PRODUCTS_ANNOTATION)},
                {"name": "anyGpuProduct", "expression": f"'{ANY}' in variables.gpuProducts"},
            ],
            "validations": [_validation(c) for c in _checks()],
        },
    }


def _binding(name: str) -> dict[str, Any]:
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


def admission_binding() -> dict[str, Any]:
    """Binds the pod policy to every namespace a consumer has on this provider (tenant and twins)."""
    return _binding(POLICY_NAME)


# ---- Services, EndpointSlices and Ingresses a consumer writes

#: What a refused object's user is told to ask for.
OBJECTS_FIELD = "Tenant spec.policy"
#: Suffixes of names that resolve inside a cluster: an ExternalName must not alias the provider's own Services.
CLUSTER_DNS_SUFFIXES = (".svc", ".cluster.local", ".local", "localhost")
#: The one Ingress annotation every consumer may set (the deprecated way of naming a class).
INGRESS_CLASS_ANNOTATION = "kubernetes.io/ingress.class"


def _object_rule(resource: str, expression: str, message_expression: str, message: str) -> dict[str, str]:
    return {
        "expression": f"request.resource.resource != '{resource}' || ({expression})",
        "messageExpression": message_expression,
        "message": message,
        "reason": "Forbidden",
    }


def _objects_validations() -> list[dict[str, str]]:
    out: list[dict[str, str]] = []
    svc_type = "object.spec.?type.orValue('ClusterIP')"
    out.append(
        _object_rule(
            "services",
            f"{svc_type} in ['ClusterIP', 'ExternalName']",
            f"'Service type ' + {svc_type} + ' is refused: a consumer may create ClusterIP and ExternalName "
            "Services only (external exposure stays on the consumer)'",
            "NodePort and LoadBalancer Services are refused",
        )
    )
    external = "object.spec.?externalIPs.orValue([])"
    lb_ip = "object.spec.?loadBalancerIP.orValue('')"
    ranges = "object.spec.?loadBalancerSourceRanges.orValue([])"
    out.append(
        _object_rule(
            "services",
            f"{external}.size() == 0 && {lb_ip} == '' && {ranges}.size() == 0",
            "'external addresses are refused (' + ("
            f"({external}.size() > 0 ? ['spec.externalIPs ' + {external}.join(',')] : []) + "
            f"({lb_ip} != '' ? ['spec.loadBalancerIP ' + {lb_ip}] : []) + "
            f"({ranges}.size() > 0 ? ['spec.loadBalancerSourceRanges ' + {ranges}.join(',')] : [])"
            ").join(', ') + '): a consumer may not claim addresses of the provider'",
            "external addresses (externalIPs, loadBalancerIP) are refused",
        )
    )
    name = "object.spec.?externalName.orValue('')"
    suffixes = " || ".join(f"{name}.lowerAscii().endsWith({_str(s)})" for s in CLUSTER_DNS_SUFFIXES)
    out.append(
        _object_rule(
            "services",
            f"{svc_type} != 'ExternalName' || !(isIP({name}) || {name}.lowerAscii().contains('.svc.') || {suffixes})",
            f"'spec.externalName ' + {name} + ' is refused: an ExternalName must be a DNS name outside the cluster, "
            "not an address or a name of the provider'",
            "an ExternalName that is an address or a cluster-internal name is refused",
        )
    )
    addresses = (
        "object.?endpoints.orValue([]).map(e, e.addresses).exists(l, l.exists(a, "
        "!variables.endpointCidrs.exists(n, cidr(n).containsIP(ip(a)))))"
    )
    out.append(
        _object_rule(
            "endpointslices",
            f"object.addressType == 'FQDN' || !({addresses})",
            "'endpoint addresses outside the consumer\\'s ranges are refused (' + "
            "object.?endpoints.orValue([]).map(e, e.addresses.filter(a, "
            "!variables.endpointCidrs.exists(n, cidr(n).containsIP(ip(a)))))"
            ".filter(l, l.size() > 0).map(l, l.join(',')).join(',') + '; allowed: ' + "
            "variables.endpointCidrs.join(',') + ')'",
            "endpoint addresses outside the consumer's ranges are refused",
        )
    )
    host_ok = (
        "variables.ingressHosts.exists(p, p.startsWith('*.') ? "
        "(h.endsWith(p.substring(1)) && !h.startsWith('*')) : h == p)"
    )
    rules = "object.spec.?rules.orValue([])"
    tls_hosts = "object.spec.?tls.orValue([]).map(t, t.?hosts.orValue([]))"
    rule_bad = f"r.?host.orValue('') == '' || ![r.host].all(h, {host_ok})"
    default = "has(object.spec.defaultBackend)"
    out.append(
        _object_rule(
            "ingresses",
            f"!{default} && {rules}.all(r, !({rule_bad})) && {tls_hosts}.all(l, l.all(h, {host_ok}))",
            "'Ingress hosts outside the allowed ones are refused (' + ("
            f"{rules}.filter(r, {rule_bad}).map(r, r.?host.orValue('(every host)')) + "
            f"{tls_hosts}.map(l, l.filter(h, !({host_ok}))).filter(l, l.size() > 0).map(l, 'tls ' + l.join(',')) + "
            f"({default} ? ['(default backend)'] : [])"
            ").join(', ') + '; allowed: ' + variables.ingressHosts.join(',') + "
            f"'); ask the provider to allow it in {OBJECTS_FIELD}.ingressHosts'",
            f"Ingress hosts outside the allowed ones are refused; ask the provider to allow it in "
            f"{OBJECTS_FIELD}.ingressHosts",
        )
    )
    key_ok = (
        f"k == '{INGRESS_CLASS_ANNOTATION}' || variables.ingressAnnotations.exists(p, "
        "p.endsWith('*') ? k.startsWith(p.substring(0, p.size() - 1)) : k == p)"
    )
    annotations = "(has(object.metadata.annotations) ? object.metadata.annotations : {})"
    out.append(
        _object_rule(
            "ingresses",
            f"{annotations}.all(k, {key_ok})",
            f"'Ingress annotations outside the allowed ones are refused (' + {annotations}.filter(k, !({key_ok}))"
            f".join(',') + '); ask the provider to allow it in {OBJECTS_FIELD}.ingressAnnotations'",
            f"Ingress annotations outside the allowed ones are refused; ask the provider to allow it in "
            f"{OBJECTS_FIELD}.ingressAnnotations",
        )
    )
    return out


def objects_policy(consumer_group: str) -> dict[str, Any]:
    """The ValidatingAdmissionPolicy for the Services, EndpointSlices and Ingresses a consumer identity
    (a member of `consumer_group`) writes into its namespaces."""
    operations = ["CREATE", "UPDATE"]
    return {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicy",
        "metadata": {"name": OBJECTS_POLICY_NAME, "labels": {MANAGED_BY_LABEL: MANAGED_BY}},
        "spec": {
            "failurePolicy": "Fail",
            "matchConstraints": {
                "resourceRules": [
                    {"apiGroups": [""], "apiVersions": ["v1"], "operations": operations, "resources": ["services"]},
                    {
                        "apiGroups": ["discovery.k8s.io"],
                        "apiVersions": ["v1"],
                        "operations": operations,
                        "resources": ["endpointslices"],
                    },
                    {
                        "apiGroups": ["networking.k8s.io"],
                        "apiVersions": ["v1"],
                        "operations": operations,
                        "resources": ["ingresses"],
                    },
                ]
            },
            "matchConditions": [
                {
                    "name": "consumer",
                    "expression": f"request.userInfo.?groups.orValue([]).exists(g, g == {_str(consumer_group)})",
                }
            ],
            "variables": [
                *_namespace_variables(),
                {"name": "endpointCidrs", "expression": _csv(ENDPOINT_CIDRS_ANNOTATION)},
                {"name": "ingressHosts", "expression": _csv(INGRESS_HOSTS_ANNOTATION)},
                {"name": "ingressAnnotations", "expression": _csv(INGRESS_ANNOTATIONS_ANNOTATION)},
            ],
            "validations": _objects_validations(),
        },
    }


def objects_binding() -> dict[str, Any]:
    """Binds the objects policy to every namespace a consumer has on this provider."""
    return _binding(OBJECTS_POLICY_NAME)
