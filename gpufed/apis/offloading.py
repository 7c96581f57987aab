"""The offloading kinds: TwinNamespace, NamespaceOffloading, and the offload pod-security policy.

Owns: the spec/status shapes of TwinNamespace (provider side, in the tenant namespace: the
consumer's request for a twin namespace; the names a twin may never take) and NamespaceOffloading
(consumer side, in the offloaded namespace, always named `offloading`: pod and namespace-mapping
strategies, the cluster selector and its node-affinity matching), and `OffloadPodSecurity`, the
policy a provider sets per tenant and publishes in each twin namespace's status (with the
canonical form of a capability name).

Does not: enforce the policy (`peering.admission` on the provider, `vkprovider.forge.podpolicy`
on the consumer), or reconcile these objects (`peering.controllers`).

Pure: no I/O.
"""

from __future__ import annotations

from typing import Annotated, ClassVar, Literal

from pydantic import ConfigDict, Field, field_validator, model_validator

from gpufed.apis.meta import AGE_COLUMN, CLUSTER_ID_PATTERN, READY_COLUMN, Condition, Model, conditions_field
from gpufed.apis.wire import NAMESPACE_OFFLOADING, SYSTEM_NAMESPACE

#: Namespaces a twin may never be: the provider's system ones and gpufed's install namespace.
RESERVED_NAMESPACES = frozenset({"default", "kube-system", "kube-public", "kube-node-lease", SYSTEM_NAMESPACE})
#: Prefixes a twin's name may never start with: Kubernetes' own and every name gpufed derives
#: (tenant namespaces `gpufed-tenant-...`, and any future gpufed namespace).
RESERVED_NAMESPACE_PREFIXES = ("kube-", f"{SYSTEM_NAMESPACE}-")


def reserved_namespace(name: str) -> bool:
    """Whether `name` is a namespace no twin may take."""
    return name in RESERVED_NAMESPACES or name.startswith(RESERVED_NAMESPACE_PREFIXES)


# ---- the offload pod-security policy (a Tenant's spec.policy.podSecurity, a TwinNamespace's status)

#: A Linux capability as pods name it (`NET_ADMIN`, also `net_admin` or `CAP_NET_ADMIN`), or `ALL`.
CAPABILITY_PATTERN = r"^[A-Za-z0-9_]+$"
#: A pod volume source as the pod spec names it (`nfs`, `csi`, `ephemeral`, ...).
VOLUME_TYPE_PATTERN = r"^[a-z][A-Za-z0-9]*$"
#: A taint key (`nvidia.com/gpu`, `dedicated`): an optional DNS prefix and a name.
TAINT_KEY_PATTERN = r"^([a-z0-9]([-a-z0-9.]*[a-z0-9])?/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$"
#: A PriorityClass name (a DNS subdomain).
PRIORITY_CLASS_PATTERN = r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$"
#: The Pod Security levels a provider can hold a tenant's pods to (gpufed's own rules on top).
POD_SECURITY_LEVELS: tuple[str, ...] = ("baseline", "restricted")
#: The entry of `allowedCapabilities` that allows adding any capability.
ALL_CAPABILITIES = "ALL"


def capability_name(name: str) -> str:
    """The canonical form of a capability name: upper case, without the `CAP_` prefix."""
    upper = name.upper()
    return upper[4:] if upper.startswith("CAP_") else upper


class OffloadPodSecurity(Model):
    """The offload pod-security policy: what a consumer's pods may ask of this provider's nodes."""

    # Everything is refused unless allowed; the provider's own API server enforces it in the
    # consumer's namespaces (peering.admission), the consumer checks it early (vkprovider.forge.podpolicy).

    level: Literal["baseline", "restricted"] = Field(
        default="baseline",
        description="The Pod Security Standard every pod is held to: `baseline` (default: no host ports, no "
        "Unconfined seccomp/AppArmor, only container SELinux types, safe sysctls, default /proc mount, no Windows "
        "host processes) or `restricted` (also: non-root users, no privilege escalation, a RuntimeDefault or "
        "Localhost seccomp profile, every capability dropped). The allowances below are exceptions to it.",
    )
    allow_privileged: bool = Field(
        default=False, description="Allow privileged containers (`securityContext.privileged: true`)."
    )
    allow_host_namespaces: bool = Field(
        default=False, description="Allow pods sharing the node's namespaces (`hostNetwork`, `hostPID`, `hostIPC`)."
    )
    allow_host_path: bool = Field(default=False, description="Allow `hostPath` volumes.")
    allowed_capabilities: list[Annotated[str, Field(pattern=CAPABILITY_PATTERN, max_length=64)]] = Field(
        default_factory=list,
        max_length=64,
        description="Capabilities containers may add (`securityContext.capabilities.add`; case and a `CAP_` "
        "prefix are ignored); `ALL` allows any. Dropping capabilities is always allowed.",
    )

    allow_host_ports: bool = Field(
        default=False, description="Allow `hostPort` on container ports (hostNetwork pods with ports need it too)."
    )
    allowed_volume_types: list[Annotated[str, Field(pattern=VOLUME_TYPE_PATTERN, max_length=64)]] = Field(
        default_factory=list,
        max_length=32,
        description="Volume types allowed beside configMap, secret, downwardAPI, emptyDir, projected and "
        "persistentVolumeClaim, e.g. `ephemeral`, `csi`, `nfs` (hostPath: allowHostPath).",
    )
    allowed_tolerations: list[Annotated[str, Field(pattern=TAINT_KEY_PATTERN, max_length=317)]] = Field(
        default_factory=list,
        max_length=32,
        description="Taint keys pods may tolerate beside `nvidia.com/gpu` (and the provider's own not-ready/"
        "unreachable tolerations with a time limit). A toleration without a key (tolerating every taint) is "
        "always refused.",
    )
    allowed_priority_classes: list[Annotated[str, Field(pattern=PRIORITY_CLASS_PATTERN, max_length=253)]] = Field(
        default_factory=list,
        max_length=32,
        description="PriorityClasses pods may name beside the provider's global default one.",
    )

    @field_validator("allowed_capabilities")
    @classmethod
    def _canonical(cls, v: list[str]) -> list[str]:
        return sorted({capability_name(c) for c in v})

    @field_validator("allowed_volume_types", "allowed_tolerations", "allowed_priority_classes")
    @classmethod
    def _sorted(cls, v: list[str]) -> list[str]:
        return sorted(set(v))

    @field_validator("allowed_volume_types")
    @classmethod
    def _not_host_path(cls, v: list[str]) -> list[str]:
        if "hostPath" in v:
            raise ValueError("hostPath volumes are allowed with allowHostPath, not allowedVolumeTypes")
        return v


# ---- TwinNamespace (provider side, in the tenant namespace: the consumer's request for a twin)


class TwinNamespaceSpec(Model):
    namespace: str = Field(
        max_length=63,
        pattern=CLUSTER_ID_PATTERN,
        description="The consumer namespace to twin (its default twin name must fit in 63 characters).",
    )
    twin_name: str | None = Field(
        default=None,
        max_length=63,
        pattern=CLUSTER_ID_PATTERN,
        description="Name of the twin namespace; unset: `<namespace>-<consumer-id>`.",
    )

    @field_validator("twin_name")
    @classmethod
    def _not_reserved(cls, v: str | None) -> str | None:
        if v is not None and reserved_namespace(v):
            raise ValueError(f"twin namespace name {v!r} is reserved")
        return v


class TwinNamespaceStatus(Model):
    phase: Literal["Pending", "Ready", "Refused"] = "Pending"
    twin: str = Field(default="", description="Name of the twin namespace.")
    conditions: list[Condition] = conditions_field(
        detail="Ready: True once the twin namespace exists, is the consumer's and its quota is in force; False "
        "with the reason (NamespaceTaken, NamespaceReserved, InvalidRequest, QuotaPending) otherwise."
    )
    pod_security: OffloadPodSecurity | None = Field(
        default=None,
        description="The offload pod-security policy the provider enforces in the twin namespace (its Tenant's "
        "spec.policy.podSecurity), so that the consumer can refuse a pod early with the same reason.",
    )
    ingress_annotations: list[str] = Field(
        default_factory=list,
        description="Annotations the provider admits on the consumer's Ingresses beside kubernetes.io/ingress.class "
        "(its Tenant's spec.policy.ingressAnnotations: exact keys, or prefixes ending in `*`), so that reflection "
        "sends only those.",
    )


class TwinNamespace(Model):
    kind: ClassVar[str] = "TwinNamespace"
    plural: ClassVar[str] = "twinnamespaces"
    scope: ClassVar[str] = "Namespaced"
    short_names: ClassVar[list[str]] = ["twinns"]
    columns: ClassVar[list[tuple[str, str, str]]] = [
        ("Namespace", "string", ".spec.namespace"),
        ("Twin", "string", ".status.twin"),
        ("Phase", "string", ".status.phase"),
        READY_COLUMN,
        AGE_COLUMN,
    ]
    spec: TwinNamespaceSpec
    status: TwinNamespaceStatus | None = None


# ---- NamespaceOffloading (consumer side, in the offloaded namespace, always named `offloading`)

PodOffloadingStrategy = Literal["Local", "Remote", "LocalAndRemote"]
NamespaceMappingStrategy = Literal["DefaultName", "EnforceSameName", "SelectedName"]
POD_STRATEGIES: tuple[str, ...] = ("Local", "Remote", "LocalAndRemote")
MAPPING_STRATEGIES: tuple[str, ...] = ("DefaultName", "EnforceSameName", "SelectedName")
SELECTOR_OPERATORS: tuple[str, ...] = ("In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt")


class NodeSelectorRequirement(Model):
    """One expression over a virtual node's labels (Kubernetes' NodeSelectorRequirement)."""

    key: str = Field(min_length=1, max_length=317, description="Label key, e.g. nvidia.com/gpu.product.")
    operator: Literal["In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt"]
    values: list[str] = Field(
        default_factory=list,
        description="In/NotIn: one or more values; Exists/DoesNotExist: none; Gt/Lt: one integer.",
    )

    @model_validator(mode="after")
    def _values_fit_operator(self) -> NodeSelectorRequirement:
        n = len(self.values)
        if self.operator in ("In", "NotIn") and n == 0:
            raise ValueError(f"{self.key}: operator {self.operator} needs at least one value")
        if self.operator in ("Exists", "DoesNotExist") and n:
            raise ValueError(f"{self.key}: operator {self.operator} takes no values")
        if self.operator in ("Gt", "Lt"):
            if n != 1:
                raise ValueError(f"{self.key}: operator {self.operator} needs exactly one value")
            try:
                int(self.values[0])
            except ValueError:
                msg = f"{self.key}: operator {self.operator} needs an integer, not {self.values[0]!r}"
                raise ValueError(msg) from None
        return self

    def matches(self, labels: dict[str, str]) -> bool:
        value = labels.get(self.key)
        if self.operator == "In":
            return value is not None and value in self.values
        if self.operator == "NotIn":
            return value is None or value not in self.values
        if self.operator == "Exists":
            return value is not None
        if self.operator == "DoesNotExist":
            return value is None
        try:
            have, want = int(value or ""), int(self.values[0])
        except ValueError:
            return False
        return have > want if self.operator == "Gt" else have < want


class NodeSelectorTerm(Model):
    match_expressions: list[NodeSelectorRequirement] = Field(default_factory=list, description="All must hold (AND).")

    def matches(self, labels: dict[str, str]) -> bool:
        # As in Kubernetes, a term without expressions matches nothing.
        return bool(self.match_expressions) and all(e.matches(labels) for e in self.match_expressions)


class NodeSelector(Model):
    node_selector_terms: list[NodeSelectorTerm] = Field(
        default_factory=list, description="Any may hold (OR); none: every provider."
    )

    def matches(self, labels: dict[str, str]) -> bool:
        """True when a node with `labels` is selected; an empty selector selects every node."""
        if not self.node_selector_terms:
            return True
        return any(t.matches(labels) for t in self.node_selector_terms)


class NamespaceOffloadingSpec(Model):
    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                {
                    "rule": "(has(self.namespaceMappingStrategy) && self.namespaceMappingStrategy == 'SelectedName')"
                    " == has(self.remoteNamespaceName)",
                    "message": "remoteNamespaceName is required with, and only allowed with, "
                    "namespaceMappingStrategy SelectedName",
                }
            ]
        }
    )

    pod_offloading_strategy: PodOffloadingStrategy = Field(
        default="LocalAndRemote",
        description="Where the namespace's pods may run: Local (never offloaded), Remote (only on virtual "
        "nodes) or LocalAndRemote (wherever the scheduler puts them). Default LocalAndRemote.",
    )
    namespace_mapping_strategy: NamespaceMappingStrategy = Field(
        default="DefaultName",
        description="Name of the twin namespace on each provider: DefaultName (`<namespace>-<consumer-id>`), "
        "EnforceSameName (the same name) or SelectedName (remoteNamespaceName). Default DefaultName.",
    )
    remote_namespace_name: str | None = Field(
        default=None,
        max_length=63,
        pattern=CLUSTER_ID_PATTERN,
        description="The twin namespace's name with namespaceMappingStrategy SelectedName.",
    )
    cluster_selector: NodeSelector = Field(
        default_factory=NodeSelector,
        description="Providers whose virtual node matches (node-affinity semantics over virtual node labels, "
        "e.g. nvidia.com/gpu.product, gpufed.io/remote-cluster-id); empty: every provider.",
    )

    @model_validator(mode="after")
    def _remote_name_only_when_selected(self) -> NamespaceOffloadingSpec:
        if (self.namespace_mapping_strategy == "SelectedName") != (self.remote_namespace_name is not None):
            raise ValueError(
                "remoteNamespaceName is required with, and only allowed with, namespaceMappingStrategy SelectedName"
            )
        return self

    def twin_name(self, namespace: str) -> str | None:
        """`TwinNamespace.spec.twinName` for the consumer namespace `namespace` (None: the provider's default)."""
        if self.namespace_mapping_strategy == "EnforceSameName":
            return namespace
        if self.namespace_mapping_strategy == "SelectedName":
            return self.remote_namespace_name
        return None


class RemoteNamespaceStatus(Model):
    cluster_id: str = Field(description="The provider.")
    namespace: str = Field(default="", description="The twin namespace on that provider.")
    phase: Literal["Pending", "Ready", "Refused", "Unreachable", "Terminating"] = "Pending"
    message: str = Field(default="", description="What a human needs to know.")


class NamespaceOffloadingStatus(Model):
    phase: Literal["Pending", "Ready", "Partial", "Failed", "Terminating"] = "Pending"
    remote_namespaces: list[RemoteNamespaceStatus] = Field(
        default_factory=list, description="One entry per selected provider."
    )
    conditions: list[Condition] = conditions_field(
        detail="Ready: True when every selected provider holds a Ready twin namespace (False with the reason "
        "otherwise, e.g. InvalidSpec); ProvidersReachable: whether every peered provider answers."
    )
    observed_generation: int | None = Field(default=None, description="The spec generation the status describes.")


class NamespaceOffloading(Model):
    kind: ClassVar[str] = "NamespaceOffloading"
    plural: ClassVar[str] = "namespaceoffloadings"
    scope: ClassVar[str] = "Namespaced"
    short_names: ClassVar[list[str]] = ["nsoff"]
    columns: ClassVar[list[tuple[str, str, str]]] = [
        ("Pods", "string", ".spec.podOffloadingStrategy"),
        ("Mapping", "string", ".spec.namespaceMappingStrategy"),
        ("Phase", "string", ".status.phase"),
        READY_COLUMN,
        AGE_COLUMN,
    ]
    root_validations: ClassVar[list[dict[str, str]]] = [
        {
            "rule": f"self.metadata.name == '{NAMESPACE_OFFLOADING}'",
            "message": f"a NamespaceOffloading must be named {NAMESPACE_OFFLOADING!r} (one per namespace)",
        }
    ]
    spec: NamespaceOffloadingSpec
    status: NamespaceOffloadingStatus | None = None
