"""gpufed's CRDs as pydantic models (`gpufed.io/v1alpha1`), and their CustomResourceDefinitions.

Owns: the spec/status shapes of ForeignCluster, ResourceSlice, Tenant, TwinNamespace,
NamespaceOffloading and the fabric's NetworkConfig, RemoteNetwork, Gateway and Connection (camelCase
on the wire), the handshake messages they carry, their validation
(CEL rules included where the API server must enforce them), node-selector matching for
NamespaceOffloading's cluster selector, and `crd_manifests()`, which turns the models into CRDs with structural OpenAPI
schemas and `kubectl get` columns. `python -m gpufed.apis.models deploy/crds` writes them; a unit test
fails when the files drift from the models.

Version skew: reading ignores fields it does not know (`extra="ignore"`), so a component one
version behind reads objects a newer peer or controller wrote (new optional fields) instead of
failing; on writes the API server's structural schemas prune fields it does not know. New fields
are always optional with a default, and a field is never removed or retyped within `v1alpha1`.

Pure: no I/O except `main` writing the files it is asked to.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import sys
from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from pydantic.alias_generators import to_camel

from gpufed.apis.quantity import QuantityError, parse
from gpufed.apis.wire import MAX_CLUSTER_ID, NAMESPACE_OFFLOADING, SYSTEM_NAMESPACE, TENANT_PREFIX

GROUP = "gpufed.io"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
#: The extended resource NVIDIA's device plugin advertises, and the node label naming the GPU model.
GPU_RESOURCE = "nvidia.com/gpu"
GPU_PRODUCT_LABEL = "nvidia.com/gpu.product"
#: Resource names a ResourceSlice may request.
SLICE_RESOURCES = ("cpu", "memory", "pods", GPU_RESOURCE)
#: Non-negative Kubernetes quantity (no sign allowed).
QUANTITY_PATTERN = r"^([0-9]+(\.[0-9]*)?|\.[0-9]+)(Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE]|[eE][+]?[0-9]+)?$"
CLUSTER_ID_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
#: Namespaces a twin may never be (a provider's system and gpufed's own).
RESERVED_NAMESPACES = frozenset({"default", SYSTEM_NAMESPACE})
RESERVED_NAMESPACE_PREFIXES = ("kube-", TENANT_PREFIX)


class _Model(BaseModel):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="ignore", frozen=True)


class Condition(_Model):
    type: str = Field(description="Condition type, e.g. Authentication or Resources.")
    status: Literal["True", "False", "Unknown"]
    reason: str = Field(description="CamelCase reason a program can match on.")
    message: str = Field(default="", description="What a human needs to know.")
    last_transition_time: dt.datetime | None = None
    observed_generation: int | None = None


def _check_quantities(v: dict[str, str]) -> dict[str, str]:
    for name, q in v.items():
        if name not in SLICE_RESOURCES:
            raise ValueError(f"unknown resource {name!r}: use one of {', '.join(SLICE_RESOURCES)}")
        try:
            if parse(q) < 0:
                raise ValueError(f"{name} must not be negative")
        except QuantityError as e:
            raise ValueError(f"{name}: {e}") from e
    return v


# ---- handshake messages carried by the CRs (the CLI is the courier between the clusters)


class ChallengeWire(_Model):
    """A provider's challenge, as `peering.handshake.Challenge.to_wire()` writes it."""

    provider: str
    consumer: str
    nonce: str = Field(description="Base64 of the random nonce.")
    expires_at: str = Field(description="RFC 3339 UTC time after which the challenge is refused.")


class Answer(_Model):
    """The consumer's answer: a CSR and its Ed25519 signature over the challenge and the CSR."""

    nonce: str = Field(description="Base64 nonce of the challenge this answers.")
    csr: str = Field(description="PEM certificate request for the consumer's client certificate.")
    signature: str = Field(description="Base64 Ed25519 signature of the handshake payload.")


# ---- ForeignCluster (both sides: one per peer)


class ForeignClusterSpec(_Model):
    cluster_id: str = Field(max_length=MAX_CLUSTER_ID, pattern=CLUSTER_ID_PATTERN, description="The peer's ClusterID.")
    roles: list[Literal["Provider", "Consumer"]] = Field(min_length=1, description="What the peer is to us.")
    api_server_url: str = Field(default="", description="The peer's API server, as we reach it.")
    public_key: str = Field(
        default="", description="The peer's Ed25519 identity key (PEM), registered by the operator."
    )
    challenge: ChallengeWire | None = Field(
        default=None, description="Provider peers: the provider's current challenge, for our controller to answer."
    )
    certificate: str = Field(default="", description="Provider peers: our client certificate it issued (PEM).")
    ca_data: str = Field(default="", description="Provider peers: the CA of its API server (PEM).")


class ForeignClusterStatus(_Model):
    phase: Literal["Pending", "Authenticating", "Peered", "Failed", "Unpeering"] = "Pending"
    conditions: list[Condition] = Field(default_factory=list)
    answer: Answer | None = Field(default=None, description="Provider peers: our answer to its challenge.")
    kubeconfig_secret: str = Field(
        default="", description="Provider peers: Secret in the gpufed namespace with our credentials there."
    )


class ForeignCluster(_Model):
    kind: ClassVar[str] = "ForeignCluster"
    plural: ClassVar[str] = "foreignclusters"
    scope: ClassVar[str] = "Cluster"
    short_names: ClassVar[list[str]] = ["fc"]
    columns: ClassVar[list[tuple[str, str, str]]] = [
        ("ClusterID", "string", ".spec.clusterId"),
        ("Roles", "string", ".spec.roles"),
        ("Phase", "string", ".status.phase"),
        ("Age", "date", ".metadata.creationTimestamp"),
    ]
    spec: ForeignClusterSpec
    status: ForeignClusterStatus | None = None


# ---- ResourceSlice (consumer side; mirrored into the tenant namespace on the provider)


class ResourceSliceSpec(_Model):
    provider_cluster_id: str = Field(max_length=MAX_CLUSTER_ID, pattern=CLUSTER_ID_PATTERN)
    resources: dict[str, str] = Field(description="Requested quantities: cpu, memory, pods, nvidia.com/gpu.")
    gpu_product: str | None = Field(default=None, description="Only GPUs of this nvidia.com/gpu.product.")

    _resources = field_validator("resources")(_check_quantities)


class ResourceSliceStatus(_Model):
    conditions: list[Condition] = Field(
        default_factory=list, description="Authentication and Resources: Accepted or Denied, with a reason."
    )
    granted: dict[str, str] = Field(default_factory=dict, description="What the provider granted.")
    used: dict[str, str] = Field(default_factory=dict, description="What the consumer's pods use of the grant.")
    node_labels: dict[str, str] = Field(
        default_factory=dict,
        description="nvidia.com/* labels every GPU node behind the grant shares (copied onto the virtual node).",
    )


class ResourceSlice(_Model):
    kind: ClassVar[str] = "ResourceSlice"
    plural: ClassVar[str] = "resourceslices"
    scope: ClassVar[str] = "Namespaced"
    short_names: ClassVar[list[str]] = ["rslice"]
    columns: ClassVar[list[tuple[str, str, str]]] = [
        ("Provider", "string", ".spec.providerClusterId"),
        ("GPUs", "string", ".spec.resources.nvidia\\.com/gpu"),
        ("Granted GPUs", "string", ".status.granted.nvidia\\.com/gpu"),
        ("Resources", "string", '.status.conditions[?(@.type=="Resources")].reason'),
        ("Age", "date", ".metadata.creationTimestamp"),
    ]
    spec: ResourceSliceSpec
    status: ResourceSliceStatus | None = None


# ---- Tenant (provider side: one per consumer)


#: A Linux capability as pods name it (`NET_ADMIN`, also `net_admin` or `CAP_NET_ADMIN`), or `ALL`.
CAPABILITY_PATTERN = r"^[A-Za-z0-9_]+$"
#: The entry of `allowedCapabilities` that allows adding any capability.
ALL_CAPABILITIES = "ALL"


def capability_name(name: str) -> str:
    """The canonical form of a capability name: upper case, without the `CAP_` prefix."""
    upper = name.upper()
    return upper[4:] if upper.startswith("CAP_") else upper


class OffloadPodSecurity(_Model):
    """The offload pod-security policy: what a consumer's pods may ask of this provider's nodes."""

    # Everything is refused unless allowed; the provider's own API server enforces it in the
    # consumer's namespaces (peering.podsecurity), the consumer checks it early (vkprovider.forge.podpolicy).

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

    @field_validator("allowed_capabilities")
    @classmethod
    def _canonical(cls, v: list[str]) -> list[str]:
        return sorted({capability_name(c) for c in v})


class TenantPolicy(_Model):
    max_resources: dict[str, str] = Field(default_factory=dict, description="Per-resource ceiling for this consumer.")
    allowed_gpu_products: list[str] | None = Field(default=None, description="Allowed products; unset allows all.")
    allow_partial: bool = Field(default=True, description="Grant less than asked when that is all there is.")
    pod_security: OffloadPodSecurity = Field(
        default_factory=OffloadPodSecurity,
        description="Privileged containers, host namespaces, hostPath volumes and added capabilities are "
        "refused unless allowed here.",
    )

    _max = field_validator("max_resources")(_check_quantities)


class TenantSpec(_Model):
    consumer_cluster_id: str = Field(max_length=MAX_CLUSTER_ID, pattern=CLUSTER_ID_PATTERN)
    public_key: str = Field(description="The consumer's Ed25519 identity key (PEM).")
    policy: TenantPolicy = Field(default_factory=TenantPolicy)
    auth_generation: int = Field(
        default=1, ge=1, description="Raise to ask for a new handshake (new challenge, new certificate)."
    )
    answer: Answer | None = Field(default=None, description="The consumer's answer to the challenge.")


class TenantStatus(_Model):
    phase: Literal["Pending", "Challenged", "Authenticated", "Refused"] = "Pending"
    conditions: list[Condition] = Field(default_factory=list)
    granted: dict[str, str] = Field(default_factory=dict, description="Sum of the consumer's granted slices.")
    used: dict[str, str] = Field(default_factory=dict, description="What the consumer's pods request now.")
    challenge: ChallengeWire | None = Field(default=None, description="The challenge the consumer must answer.")
    auth_generation: int = Field(default=0, description="The spec.authGeneration the handshake state belongs to.")
    used_nonces: list[str] = Field(
        default_factory=list, description="SHA-256 of answered nonces (most recent last); replays are refused."
    )
    answered: str = Field(default="", description="SHA-256 of the nonce of the answer the current state results from.")
    csr_name: str = Field(
        default="", description="The CertificateSigningRequest of the consumer's current certificate."
    )
    certificate: str = Field(default="", description="The consumer's client certificate (PEM).")
    ca_data: str = Field(default="", description="This cluster's API server CA (PEM).")
    namespace: str = Field(default="", description="The tenant namespace.")
    twin_namespaces: list[str] = Field(default_factory=list, description="The consumer's twin namespaces here.")


class Tenant(_Model):
    kind: ClassVar[str] = "Tenant"
    plural: ClassVar[str] = "tenants"
    scope: ClassVar[str] = "Cluster"
    short_names: ClassVar[list[str]] = []
    columns: ClassVar[list[tuple[str, str, str]]] = [
        ("Consumer", "string", ".spec.consumerClusterId"),
        ("Phase", "string", ".status.phase"),
        ("Granted GPUs", "string", ".status.granted.nvidia\\.com/gpu"),
        ("Age", "date", ".metadata.creationTimestamp"),
    ]
    spec: TenantSpec
    status: TenantStatus | None = None


# ---- TwinNamespace (provider side, in the tenant namespace: the consumer's request for a twin)


class TwinNamespaceSpec(_Model):
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
        if v is not None and (v in RESERVED_NAMESPACES or v.startswith(RESERVED_NAMESPACE_PREFIXES)):
            raise ValueError(f"twin namespace name {v!r} is reserved")
        return v


class TwinNamespaceStatus(_Model):
    phase: Literal["Pending", "Ready", "Refused"] = "Pending"
    twin: str = Field(default="", description="Name of the twin namespace.")
    conditions: list[Condition] = Field(default_factory=list)
    pod_security: OffloadPodSecurity | None = Field(
        default=None,
        description="The offload pod-security policy the provider enforces in the twin namespace (its Tenant's "
        "spec.policy.podSecurity), so that the consumer can refuse a pod early with the same reason.",
    )


class TwinNamespace(_Model):
    kind: ClassVar[str] = "TwinNamespace"
    plural: ClassVar[str] = "twinnamespaces"
    scope: ClassVar[str] = "Namespaced"
    short_names: ClassVar[list[str]] = ["twinns"]
    columns: ClassVar[list[tuple[str, str, str]]] = [
        ("Namespace", "string", ".spec.namespace"),
        ("Twin", "string", ".status.twin"),
        ("Phase", "string", ".status.phase"),
        ("Age", "date", ".metadata.creationTimestamp"),
    ]
    spec: TwinNamespaceSpec
    status: TwinNamespaceStatus | None = None


# ---- NamespaceOffloading (consumer side, in the offloaded namespace, always named `offloading`)

PodOffloadingStrategy = Literal["Local", "Remote", "LocalAndRemote"]
NamespaceMappingStrategy = Literal["DefaultName", "EnforceSameName", "SelectedName"]
POD_STRATEGIES: tuple[str, ...] = ("Local", "Remote", "LocalAndRemote")
MAPPING_STRATEGIES: tuple[str, ...] = ("DefaultName", "EnforceSameName", "SelectedName")
SELECTOR_OPERATORS: tuple[str, ...] = ("In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt")


class NodeSelectorRequirement(_Model):
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


class NodeSelectorTerm(_Model):
    match_expressions: list[NodeSelectorRequirement] = Field(default_factory=list, description="All must hold (AND).")

    def matches(self, labels: dict[str, str]) -> bool:
        # As in Kubernetes, a term without expressions matches nothing.
        return bool(self.match_expressions) and all(e.matches(labels) for e in self.match_expressions)


class NodeSelector(_Model):
    node_selector_terms: list[NodeSelectorTerm] = Field(
        default_factory=list, description="Any may hold (OR); none: every provider."
    )

    def matches(self, labels: dict[str, str]) -> bool:
        """True when a node with `labels` is selected; an empty selector selects every node."""
        if not self.node_selector_terms:
            return True
        return any(t.matches(labels) for t in self.node_selector_terms)


class NamespaceOffloadingSpec(_Model):
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


class RemoteNamespaceStatus(_Model):
    cluster_id: str = Field(description="The provider.")
    namespace: str = Field(default="", description="The twin namespace on that provider.")
    phase: Literal["Pending", "Ready", "Refused", "Unreachable", "Terminating"] = "Pending"
    message: str = Field(default="", description="What a human needs to know.")


class NamespaceOffloadingStatus(_Model):
    phase: Literal["Pending", "Ready", "Partial", "Failed", "Terminating"] = "Pending"
    remote_namespaces: list[RemoteNamespaceStatus] = Field(
        default_factory=list, description="One entry per selected provider."
    )
    conditions: list[Condition] = Field(default_factory=list)
    observed_generation: int | None = Field(default=None, description="The spec generation the status describes.")


class NamespaceOffloading(_Model):
    kind: ClassVar[str] = "NamespaceOffloading"
    plural: ClassVar[str] = "namespaceoffloadings"
    scope: ClassVar[str] = "Namespaced"
    short_names: ClassVar[list[str]] = ["nsoff"]
    columns: ClassVar[list[tuple[str, str, str]]] = [
        ("Pods", "string", ".spec.podOffloadingStrategy"),
        ("Mapping", "string", ".spec.namespaceMappingStrategy"),
        ("Phase", "string", ".status.phase"),
        ("Age", "date", ".metadata.creationTimestamp"),
    ]
    root_validations: ClassVar[list[dict[str, str]]] = [
        {
            "rule": f"self.metadata.name == '{NAMESPACE_OFFLOADING}'",
            "message": f"a NamespaceOffloading must be named {NAMESPACE_OFFLOADING!r} (one per namespace)",
        }
    ]
    spec: NamespaceOffloadingSpec
    status: NamespaceOffloadingStatus | None = None


# ---- Network fabric (DESIGN.md §7): one NetworkConfig per cluster, and per peering one RemoteNetwork
# (address ranges and their remapping), one Gateway (the tunnel's spec) and one Connection (its health).

IPV4_CIDR_PATTERN = r"^([0-9]{1,3}\.){3}[0-9]{1,3}/([0-9]|[12][0-9]|3[0-2])$"
IPV4_PATTERN = r"^([0-9]{1,3}\.){3}[0-9]{1,3}$"
#: The one NetworkConfig of a cluster.
NETWORK_CONFIG = "local"
#: WireGuard's registered port; the provider's gateway listens on it unless configured otherwise.
DEFAULT_GATEWAY_PORT = 51820
DEFAULT_EXTERNAL_CIDR = "10.70.0.0/16"
DEFAULT_POOLS = ["10.64.0.0/10"]


def _cidr(v: str) -> str:
    try:
        net = ipaddress.IPv4Network(v, strict=True)
    except ValueError as e:
        raise ValueError(f"{v!r} is not an IPv4 network in CIDR form with no host bits: {e}") from e
    return str(net)


def _ip(v: str) -> str:
    try:
        return str(ipaddress.IPv4Address(v))
    except ValueError as e:
        raise ValueError(f"{v!r} is not an IPv4 address") from e


class ExternalIP(_Model):
    address: str = Field(pattern=IPV4_PATTERN, description="A real address of this cluster that is not a pod's.")
    external_address: str = Field(
        pattern=IPV4_PATTERN, description="The address standing for it inside this cluster's external CIDR."
    )

    @field_validator("address", "external_address")
    @classmethod
    def _valid(cls, v: str) -> str:
        return _ip(v)


class NetworkConfigSpec(_Model):
    pod_cidr: str = Field(pattern=IPV4_CIDR_PATTERN, description="This cluster's pod CIDR.")
    external_cidr: str = Field(
        default=DEFAULT_EXTERNAL_CIDR,
        pattern=IPV4_CIDR_PATTERN,
        description="Range standing for this cluster's non-pod addresses (Services, API server) as peers reach them.",
    )
    reserved_cidrs: list[str] = Field(
        default_factory=list,
        description="Ranges in use here that remapping must never hand out (service CIDR, node networks).",
    )
    pools: list[str] = Field(
        default_factory=lambda: list(DEFAULT_POOLS),
        min_length=1,
        description="Ranges from which a colliding peer CIDR gets its local stand-in.",
    )
    gateway_endpoint: str = Field(
        default="",
        description="host:port where peers reach this cluster's gateway (the provider side listens there).",
    )
    external_ips: list[ExternalIP] = Field(
        default_factory=list, description="Non-pod addresses exposed to peers through the external CIDR."
    )

    @field_validator("pod_cidr", "external_cidr")
    @classmethod
    def _one(cls, v: str) -> str:
        return _cidr(v)

    @field_validator("reserved_cidrs", "pools")
    @classmethod
    def _many(cls, v: list[str]) -> list[str]:
        return [_cidr(x) for x in v]

    @field_validator("gateway_endpoint")
    @classmethod
    def _endpoint(cls, v: str) -> str:
        if v:
            split_endpoint(v)
        return v

    @model_validator(mode="after")
    def _disjoint(self) -> NetworkConfigSpec:
        pod, ext = ipaddress.IPv4Network(self.pod_cidr), ipaddress.IPv4Network(self.external_cidr)
        if pod.overlaps(ext):
            raise ValueError(f"externalCidr {ext} overlaps podCidr {pod}")
        for e in self.external_ips:
            if ipaddress.IPv4Address(e.external_address) not in ext:
                raise ValueError(f"externalAddress {e.external_address} is outside externalCidr {ext}")
        return self


def split_endpoint(v: str) -> tuple[str, int]:
    """`host:port` (port defaults to 51820) -> (host, port); ValueError with the reason."""
    host, sep, port = v.rpartition(":")
    if not sep:
        host, port = v, str(DEFAULT_GATEWAY_PORT)
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"gateway endpoint {v!r} must be host[:port] with a port in 1..65535")
    return host, int(port)


class NetworkConfig(_Model):
    kind: ClassVar[str] = "NetworkConfig"
    plural: ClassVar[str] = "networkconfigs"
    scope: ClassVar[str] = "Namespaced"
    short_names: ClassVar[list[str]] = ["netcfg"]
    columns: ClassVar[list[tuple[str, str, str]]] = [
        ("Pod CIDR", "string", ".spec.podCidr"),
        ("External CIDR", "string", ".spec.externalCidr"),
        ("Gateway", "string", ".spec.gatewayEndpoint"),
    ]
    root_validations: ClassVar[list[dict[str, str]]] = [
        {
            "rule": f"self.metadata.name == '{NETWORK_CONFIG}'",
            "message": f"a cluster has one NetworkConfig, named {NETWORK_CONFIG!r}",
        }
    ]
    spec: NetworkConfigSpec


class CIDRPair(_Model):
    pod_cidr: str = Field(pattern=IPV4_CIDR_PATTERN)
    external_cidr: str = Field(pattern=IPV4_CIDR_PATTERN)

    @field_validator("pod_cidr", "external_cidr")
    @classmethod
    def _one(cls, v: str) -> str:
        return _cidr(v)


class RemoteNetworkSpec(_Model):
    cluster_id: str = Field(max_length=MAX_CLUSTER_ID, pattern=CLUSTER_ID_PATTERN, description="The peer.")
    real: CIDRPair = Field(description="The peer's own ranges, as it announced them.")
    mapped: CIDRPair = Field(description="How this cluster reaches them: equal to real unless they collided here.")
    peer_view: CIDRPair | None = Field(
        default=None, description="How the peer reaches THIS cluster's ranges (its mapping, copied when connecting)."
    )

    @model_validator(mode="after")
    def _sizes(self) -> RemoteNetworkSpec:
        for what in ("pod_cidr", "external_cidr"):
            a = ipaddress.IPv4Network(getattr(self.real, what))
            b = ipaddress.IPv4Network(getattr(self.mapped, what))
            if a.prefixlen != b.prefixlen:
                raise ValueError(f"mapped {what} {b} must have the size of the real {a}")
        return self


class RemoteNetwork(_Model):
    kind: ClassVar[str] = "RemoteNetwork"
    plural: ClassVar[str] = "remotenetworks"
    scope: ClassVar[str] = "Namespaced"
    short_names: ClassVar[list[str]] = ["rnet"]
    columns: ClassVar[list[tuple[str, str, str]]] = [
        ("Cluster", "string", ".spec.clusterId"),
        ("Pod CIDR", "string", ".spec.real.podCidr"),
        ("Mapped", "string", ".spec.mapped.podCidr"),
        ("External", "string", ".spec.real.externalCidr"),
        ("Mapped External", "string", ".spec.mapped.externalCidr"),
    ]
    spec: RemoteNetworkSpec


class GatewaySpec(_Model):
    cluster_id: str = Field(max_length=MAX_CLUSTER_ID, pattern=CLUSTER_ID_PATTERN, description="The peer.")
    role: Literal["Server", "Client"] = Field(description="Server listens (provider side); Client dials it.")
    endpoint: str = Field(default="", description="Client: the server gateway's host:port.")
    listen_port: int = Field(default=DEFAULT_GATEWAY_PORT, ge=1, le=65535, description="Server: UDP port.")
    mtu: int = Field(default=0, ge=0, le=9000, description="Tunnel MTU; 0 = underlay MTU minus WireGuard overhead.")
    masquerade: bool = Field(
        default=False, description="SNAT traffic from the peer to the gateway's address (strict CNIs such as Cilium)."
    )
    driver: Literal["auto", "kernel", "wireguard-go"] = Field(default="auto", description="WireGuard data plane.")
    keepalive_s: int = Field(default=10, ge=0, le=3600, description="Persistent keepalive (0: off).")
    tunnel_address: str = Field(pattern=IPV4_PATTERN, description="This gateway's address inside the tunnel.")
    peer_tunnel_address: str = Field(pattern=IPV4_PATTERN, description="The peer gateway's address in the tunnel.")
    private_key_secret: str = Field(description="Secret (same namespace) holding this gateway's private key.")
    public_key: str = Field(description="This gateway's WireGuard public key (base64).")
    peer_public_key: str = Field(default="", description="The peer gateway's public key (base64); set by connect.")

    @field_validator("endpoint")
    @classmethod
    def _endpoint(cls, v: str) -> str:
        if v:
            split_endpoint(v)
        return v


class GatewayStatus(_Model):
    driver: str = Field(default="", description="The data plane in use: kernel or wireguard-go.")
    interface: str = Field(default="", description="The WireGuard interface.")
    mtu: int = Field(default=0, description="The MTU applied.")
    conditions: list[Condition] = Field(default_factory=list)


class Gateway(_Model):
    kind: ClassVar[str] = "Gateway"
    plural: ClassVar[str] = "gateways"
    scope: ClassVar[str] = "Namespaced"
    short_names: ClassVar[list[str]] = ["gw"]
    columns: ClassVar[list[tuple[str, str, str]]] = [
        ("Cluster", "string", ".spec.clusterId"),
        ("Role", "string", ".spec.role"),
        ("Endpoint", "string", ".spec.endpoint"),
        ("Driver", "string", ".status.driver"),
        ("MTU", "integer", ".status.mtu"),
    ]
    spec: GatewaySpec
    status: GatewayStatus | None = None


class ConnectionStatus(_Model):
    phase: Literal["Pending", "Connected", "Degraded", "Down"] = "Pending"
    reason: str = Field(default="", description="CamelCase reason a program can match on.")
    message: str = Field(default="", description="What a human needs to know.")
    latest_handshake: dt.datetime | None = Field(default=None, description="Last WireGuard handshake.")
    rtt_ms: float | None = Field(default=None, description="Round trip of the last probe across the tunnel.")
    last_probe: dt.datetime | None = None
    last_transition_time: dt.datetime | None = None


class ConnectionSpec(_Model):
    cluster_id: str = Field(max_length=MAX_CLUSTER_ID, pattern=CLUSTER_ID_PATTERN, description="The peer.")


class Connection(_Model):
    kind: ClassVar[str] = "Connection"
    plural: ClassVar[str] = "connections"
    scope: ClassVar[str] = "Namespaced"
    short_names: ClassVar[list[str]] = ["conn"]
    columns: ClassVar[list[tuple[str, str, str]]] = [
        ("Cluster", "string", ".spec.clusterId"),
        ("Status", "string", ".status.phase"),
        ("Reason", "string", ".status.reason"),
        ("RTT ms", "number", ".status.rttMs"),
        ("Handshake", "date", ".status.latestHandshake"),
    ]
    spec: ConnectionSpec
    status: ConnectionStatus | None = None


CRDKind = (
    type[ForeignCluster]
    | type[ResourceSlice]
    | type[Tenant]
    | type[TwinNamespace]
    | type[NamespaceOffloading]
    | type[NetworkConfig]
    | type[RemoteNetwork]
    | type[Gateway]
    | type[Connection]
)
KINDS: tuple[CRDKind, ...] = (
    ForeignCluster,
    ResourceSlice,
    Tenant,
    TwinNamespace,
    NamespaceOffloading,
    NetworkConfig,
    RemoteNetwork,
    Gateway,
    Connection,
)


# ---- CRD generation


def _structural(schema: dict[str, Any], defs: dict[str, Any]) -> dict[str, Any]:
    """Turn pydantic's JSON schema into a Kubernetes structural schema: refs inlined, Optional
    collapsed, titles and defaults dropped, every node typed."""
    if "$ref" in schema:
        return _structural(defs[schema["$ref"].rsplit("/", 1)[1]], defs)
    if "anyOf" in schema:
        options = [o for o in schema["anyOf"] if o.get("type") != "null"]
        if len(options) != 1:
            raise ValueError(f"cannot express a union in a structural schema: {schema}")
        merged = _structural(options[0], defs)
        if "description" in schema:
            merged["description"] = schema["description"]
        return merged
    out: dict[str, Any] = {}
    for key, value in schema.items():
        if key in ("title", "default", "$defs"):
            continue
        if key == "additionalProperties" and value is False:
            continue  # structural schemas forbid it beside `properties`; the apiserver prunes instead
        if key == "properties":
            out[key] = {k: _structural(v, defs) for k, v in value.items()}
        elif key in ("items", "additionalProperties") and isinstance(value, dict):
            out[key] = _structural(value, defs)
        elif key == "const":
            out["enum"] = [value]
        else:
            out[key] = value
    if "enum" in out and "type" not in out:
        out["type"] = "string"
    if out.get("type") == "object" and "properties" not in out and "additionalProperties" not in out:
        out["x-kubernetes-preserve-unknown-fields"] = True
    return out


def _quantity_maps(schema: dict[str, Any]) -> None:
    """Resource maps hold quantities: forbid other keys and enforce the quantity pattern."""
    for name, prop in schema.get("properties", {}).items():
        if name in ("resources", "granted", "used", "maxResources"):
            prop["additionalProperties"] = {"type": "string", "pattern": QUANTITY_PATTERN}
            if name in ("resources", "maxResources"):
                prop["x-kubernetes-validations"] = [
                    {
                        "rule": "self.all(k, k in " + str(list(SLICE_RESOURCES)).replace("'", '"') + ")",
                        "message": "resources may only be " + ", ".join(SLICE_RESOURCES),
                    }
                ]
        elif prop.get("type") == "object":
            _quantity_maps(prop)


def crd(model: CRDKind) -> dict[str, Any]:
    raw = model.model_json_schema(by_alias=True)
    defs = raw.get("$defs", {})
    props = {k: _structural(v, defs) for k, v in raw["properties"].items() if k in ("spec", "status")}
    for p in props.values():
        _quantity_maps(p)
    schema = {
        "type": "object",
        "properties": {
            "apiVersion": {"type": "string"},
            "kind": {"type": "string"},
            "metadata": {"type": "object"},
            **props,
        },
        "required": ["spec"],
    }
    validations: list[dict[str, str]] = getattr(model, "root_validations", [])
    if validations:
        schema["x-kubernetes-validations"] = validations
    names: dict[str, Any] = {
        "kind": model.kind,
        "listKind": f"{model.kind}List",
        "plural": model.plural,
        "singular": model.kind.lower(),
    }
    if model.short_names:
        names["shortNames"] = model.short_names
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{model.plural}.{GROUP}"},
        "spec": {
            "group": GROUP,
            "names": names,
            "scope": model.scope,
            "versions": [
                {
                    "name": VERSION,
                    "served": True,
                    "storage": True,
                    "schema": {"openAPIV3Schema": schema},
                    "subresources": {"status": {}},
                    "additionalPrinterColumns": [{"name": n, "type": t, "jsonPath": p} for n, t, p in model.columns],
                }
            ],
        },
    }


def crd_manifests() -> dict[str, str]:
    """File name -> YAML text for every CRD."""
    header = "# Generated from gpufed/apis/models.py by `python -m gpufed.apis.models deploy/crds`; do not edit.\n"
    return {f"{GROUP}_{m.plural}.yaml": header + yaml.safe_dump(crd(m), sort_keys=False) for m in KINDS}


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m gpufed.apis.models OUT_DIR", file=sys.stderr)
        return 2
    out = Path(argv[0])
    out.mkdir(parents=True, exist_ok=True)
    for name, text in crd_manifests().items():
        (out / name).write_text(text)
        print(f"wrote {out / name}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
