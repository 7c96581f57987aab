"""What a consumer may do in its namespaces on a provider: the rules, and their projection onto the namespaces.

A provider decides, per consumer (`Tenant.spec.policy`), what the consumer's pods may ask of its nodes
(`podSecurity`, `gpufed.apis.offloading.OffloadPodSecurity`: Pod Security "baseline" by default or
"restricted", plus gpufed's own rules, each exception allowed explicitly), which GPU products they may
pin (`allowedGpuProducts`), and which Ingress hosts and annotations the consumer may claim.

Owns:
- `RULES`: the one list of pod rules (what each refuses, the Tenant field that would allow it, or the
  standard that fixes it) and the constants they check against (safe sysctls, SELinux types, volume
  types, resources). The provider's pod admission policy (`peering.admission.pods`) is rendered from
  them, and the consumer's early check (`vkprovider.forge.podpolicy`) implements the same rules in
  Python with the same words;
- the names of the ValidatingAdmissionPolicies (`POLICY_NAME`, `OBJECTS_POLICY_NAME`,
  `CLAIMS_POLICY_NAME`, `DEVICE_CLAIMS_POLICY_NAME`), which the consumer recognizes in refusals, and
  the Ingress annotation every consumer may set;
- `Projection` and `namespace_metadata`: the projection of a tenant's policy onto each of its
  namespaces on the provider (tenant and twins) as labels and annotations the policies read from
  `namespaceObject` (booleans as `gpufed.io/allow-*` labels, lists as comma-separated
  `gpufed.io/*` annotations; the StorageClasses offered with a storage grant and their access modes
  as OFFERED_STORAGE_CLASSES_ANNOTATION and OFFERED_STORAGE_ACCESS_MODES_ANNOTATION), plus the Pod
  Security Admission labels (`pod-security.kubernetes.io/*`)
  as a second layer where they do not contradict an allowed exception (`psa_level`);
- `describe`: the pod policy in one line, for the Tenant's `PodSecurity` condition.

A namespace without the projection refuses (fail closed: no flag allows, the level is read as
restricted, no GPU product and no endpoint range is allowed), and a consumer cannot loosen it: it has
no rights on namespaces, and the policies check the object whoever sends it, so skipping the
consumer's own check gains nothing.

Why not Pod Security Admission alone: its levels are coarse. `baseline` still lets containers add
the default capability set (CHOWN, NET_BIND_SERVICE, ...) and says nothing about volume types,
tolerations, priority classes or node names, and one allowance (say hostPath for one tenant) can only
be granted by dropping to `privileged`, which lifts every other restriction too. Its labels are set
where they agree with the tenant's exceptions, and lifted (enforce `privileged`, warn and audit kept)
where an exception would contradict them: the admission policy still enforces everything else.

Does not: render the admission policies as CEL (`peering.admission`), apply anything
(peering.controllers.tenant_namespaces does), or check pods in Python (the consumer's
vkprovider.forge.podpolicy implements the same rules).

Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from gpufed.apis.offloading import ALL_CAPABILITIES, OffloadPodSecurity
from gpufed.apis.peering import StorageClassOffer
from gpufed.apis.pool import GPU_RESOURCE
from gpufed.apis.wire import OFFERED_STORAGE_ACCESS_MODES_ANNOTATION, OFFERED_STORAGE_CLASSES_ANNOTATION

#: Name of the pod ValidatingAdmissionPolicy and of its binding.
POLICY_NAME = "gpufed-offload-policy"
#: Name of the ValidatingAdmissionPolicy (and binding) for the Services, EndpointSlices and Ingresses
#: a consumer writes.
OBJECTS_POLICY_NAME = "gpufed-consumer-objects"
#: Name of the ValidatingAdmissionPolicy (and binding) for the PersistentVolumeClaims a consumer writes.
CLAIMS_POLICY_NAME = "gpufed-consumer-claims"
#: Name of the ValidatingAdmissionPolicy (and binding) for the ResourceClaims (DRA) a consumer writes.
DEVICE_CLAIMS_POLICY_NAME = "gpufed-consumer-device-claims"

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
#: The one Ingress annotation every consumer may set (the deprecated way of naming a class).
INGRESS_CLASS_ANNOTATION = "kubernetes.io/ingress.class"
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
    fixed=f"a consumer's pods may request {', '.join(GRANTED_RESOURCES)} and ResourceClaims by name only",
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
    #: The StorageClasses the consumer's claims may use here (none: every claim is refused).
    storage_classes: Sequence[StorageClassOffer] = ()


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
        OFFERED_STORAGE_CLASSES_ANNOTATION: ",".join(o.name for o in p.storage_classes),
        # `<class>:<mode>` pairs: the policy checks a claim's modes against its own class's.
        OFFERED_STORAGE_ACCESS_MODES_ANNOTATION: ",".join(
            f"{o.name}:{m}" for o in p.storage_classes for m in o.access_modes
        ),
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
