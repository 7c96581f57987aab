"""The peering kinds: ForeignCluster, ResourceSlice and Tenant, and the handshake messages they carry.

Owns: the spec/status shapes of ForeignCluster (both sides: one per peer), ResourceSlice (consumer
side; mirrored into the tenant namespace on the provider; its status carries the StorageClasses the
provider offers with a storage grant, `StorageClassOffer`) and Tenant (provider side: one per
consumer, with its policy), the challenge and answer of the handshake as these objects carry them
(the CLI is the courier between the clusters), the resource names a slice or a policy may hold
(`GRANT_RESOURCES`: the node resources of `SLICE_RESOURCES` plus claim storage), and the validation
of their resource maps (known resource names, non-negative quantities).

Does not: judge a handshake (`peering.handshake`), decide a grant (`peering.grants`), or reconcile
these objects (`peering.controllers`).

Pure: no I/O.
"""

from __future__ import annotations

from typing import Annotated, ClassVar, Literal

from pydantic import Field, field_validator

from gpufed.apis.meta import AGE_COLUMN, CLUSTER_ID_PATTERN, READY_COLUMN, Condition, Model, conditions_field
from gpufed.apis.offloading import OffloadPodSecurity
from gpufed.apis.pool import SLICE_RESOURCES
from gpufed.apis.quantity import QuantityError, parse
from gpufed.apis.wire import MAX_CLUSTER_ID, STORAGE_RESOURCE

#: An Ingress host a tenant may claim: a DNS name, or `*.` and a domain.
INGRESS_HOST_PATTERN = r"^(\*\.)?[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
#: An annotation key, or a key prefix ending in `*`.
ANNOTATION_PATTERN = r"^[A-Za-z0-9]([-A-Za-z0-9_./]*[A-Za-z0-9/])?\*?$"
#: A StorageClass name (a DNS subdomain).
STORAGE_CLASS_PATTERN = r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$"
#: Resource names a ResourceSlice may request and a Tenant's policy may cap: the node resources,
#: and the storage of PersistentVolumeClaims in the twin namespaces.
GRANT_RESOURCES = (*SLICE_RESOURCES, STORAGE_RESOURCE)
#: The conditions that make each kind Ready, in the order they are settled (the first one not True
#: gives Ready its reason). A ForeignCluster's are its consumer side's (the peer is a provider).
FOREIGN_CLUSTER_READY = ("Authentication", "ProviderReachable")
#: A ForeignCluster that is only a consumer of this cluster: Ready follows its Tenant's Ready here.
CONSUMER_PEER_READY = ("TenantReady",)
RESOURCE_SLICE_READY = ("Authentication", "Resources")
TENANT_READY = ("Authentication", "Namespaces", "PodSecurity")
#: The access modes of the PersistentVolume API.
AccessMode = Literal["ReadWriteOnce", "ReadOnlyMany", "ReadWriteMany", "ReadWriteOncePod"]
ACCESS_MODES: tuple[AccessMode, ...] = ("ReadWriteOnce", "ReadOnlyMany", "ReadWriteMany", "ReadWriteOncePod")


def _check_quantities(v: dict[str, str]) -> dict[str, str]:
    for name, q in v.items():
        if name not in GRANT_RESOURCES:
            raise ValueError(f"unknown resource {name!r}: use one of {', '.join(GRANT_RESOURCES)}")
        try:
            if parse(q) < 0:
                raise ValueError(f"{name} must not be negative")
        except QuantityError as e:
            raise ValueError(f"{name}: {e}") from e
    return v


# ---- handshake messages carried by the CRs (the CLI is the courier between the clusters)


class ChallengeWire(Model):
    """A provider's challenge, as `peering.handshake.Challenge.to_wire()` writes it."""

    provider: str
    consumer: str
    nonce: str = Field(description="Base64 of the random nonce.")
    expires_at: str = Field(description="RFC 3339 UTC time after which the challenge is refused.")


class Answer(Model):
    """The consumer's answer: a CSR and its Ed25519 signature over the challenge and the CSR."""

    nonce: str = Field(description="Base64 nonce of the challenge this answers.")
    csr: str = Field(description="PEM certificate request for the consumer's client certificate.")
    signature: str = Field(description="Base64 Ed25519 signature of the handshake payload.")


# ---- ForeignCluster (both sides: one per peer)


class ForeignClusterSpec(Model):
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


class ForeignClusterStatus(Model):
    phase: Literal["Pending", "Authenticating", "Peered", "Failed", "Unpeering"] = "Pending"
    conditions: list[Condition] = conditions_field(
        FOREIGN_CLUSTER_READY,
        "For a peer that is a provider: Authentication (our credentials there), ProviderReachable (its API "
        "answers with them) and Ready. A peer that is only a consumer has TenantReady instead (the Ready "
        "condition of its Tenant on this cluster), and Ready follows it.",
    )
    answer: Answer | None = Field(default=None, description="Provider peers: our answer to its challenge.")
    kubeconfig_secret: str = Field(
        default="", description="Provider peers: Secret in the gpufed namespace with our credentials there."
    )


class ForeignCluster(Model):
    kind: ClassVar[str] = "ForeignCluster"
    plural: ClassVar[str] = "foreignclusters"
    scope: ClassVar[str] = "Cluster"
    short_names: ClassVar[list[str]] = ["fc"]
    columns: ClassVar[list[tuple[str, str, str]]] = [
        ("ClusterID", "string", ".spec.clusterId"),
        ("Roles", "string", ".spec.roles"),
        ("Phase", "string", ".status.phase"),
        READY_COLUMN,
        AGE_COLUMN,
    ]
    spec: ForeignClusterSpec
    status: ForeignClusterStatus | None = None


# ---- ResourceSlice (consumer side; mirrored into the tenant namespace on the provider)


class ResourceSliceSpec(Model):
    provider_cluster_id: str = Field(max_length=MAX_CLUSTER_ID, pattern=CLUSTER_ID_PATTERN)
    resources: dict[str, str] = Field(
        description="Requested quantities: cpu, memory, pods, nvidia.com/gpu, and storage (the total size of "
        "the PersistentVolumeClaims the consumer may create in its twin namespaces)."
    )
    gpu_product: str | None = Field(default=None, description="Only GPUs of this nvidia.com/gpu.product.")

    _resources = field_validator("resources")(_check_quantities)


class StorageClassOffer(Model):
    """A StorageClass of the provider that the consumer's claims may use."""

    name: str = Field(max_length=253, pattern=STORAGE_CLASS_PATTERN, description="The provider's StorageClass.")
    default: bool = Field(default=False, description="The class to use when a claim names none.")
    access_modes: list[AccessMode] = Field(
        min_length=1, max_length=4, description="Access modes a claim of this class may ask for."
    )


class ResourceSliceStatus(Model):
    conditions: list[Condition] = conditions_field(
        RESOURCE_SLICE_READY, "Authentication, Resources (Accepted or Denied, with a reason) and Ready."
    )
    granted: dict[str, str] = Field(default_factory=dict, description="What the provider granted.")
    used: dict[str, str] = Field(default_factory=dict, description="What the consumer's pods use of the grant.")
    node_labels: dict[str, str] = Field(
        default_factory=dict,
        description="nvidia.com/* labels every GPU node behind the grant shares (copied onto the virtual node).",
    )
    storage_classes: list[StorageClassOffer] = Field(
        default_factory=list,
        max_length=64,
        description="With a storage grant: the provider's StorageClasses the consumer's claims may use (exactly "
        "one marked default); empty without one.",
    )


class ResourceSlice(Model):
    kind: ClassVar[str] = "ResourceSlice"
    plural: ClassVar[str] = "resourceslices"
    scope: ClassVar[str] = "Namespaced"
    short_names: ClassVar[list[str]] = ["rslice"]
    columns: ClassVar[list[tuple[str, str, str]]] = [
        ("Provider", "string", ".spec.providerClusterId"),
        ("GPUs", "string", ".spec.resources.nvidia\\.com/gpu"),
        ("Granted GPUs", "string", ".status.granted.nvidia\\.com/gpu"),
        ("Resources", "string", '.status.conditions[?(@.type=="Resources")].reason'),
        READY_COLUMN,
        AGE_COLUMN,
    ]
    spec: ResourceSliceSpec
    status: ResourceSliceStatus | None = None


# ---- Tenant (provider side: one per consumer)


class TenantPolicy(Model):
    max_resources: dict[str, str] = Field(default_factory=dict, description="Per-resource ceiling for this consumer.")
    allowed_gpu_products: list[str] | None = Field(default=None, description="Allowed products; unset allows all.")
    allow_partial: bool = Field(default=True, description="Grant less than asked when that is all there is.")
    pod_security: OffloadPodSecurity = Field(
        default_factory=OffloadPodSecurity,
        description="What the consumer's pods may ask of this cluster's nodes: Pod Security baseline (or "
        "restricted) plus gpufed's rules (volume types, tolerations, priority classes, node names); privileged "
        "containers, host namespaces, host ports, hostPath volumes and added capabilities are refused unless "
        "allowed here.",
    )
    ingress_hosts: list[Annotated[str, Field(pattern=INGRESS_HOST_PATTERN, max_length=253)]] = Field(
        default_factory=list,
        max_length=64,
        description="Hosts the consumer's Ingresses may claim: exact names or `*.domain` (any name under "
        "domain). Empty (default): every Ingress of the consumer is refused. Rules without a host and default "
        "backends are always refused.",
    )
    ingress_annotations: list[Annotated[str, Field(pattern=ANNOTATION_PATTERN, max_length=317)]] = Field(
        default_factory=list,
        max_length=64,
        description="Annotations the consumer's Ingresses may carry beside `kubernetes.io/ingress.class`: exact "
        "keys, or a prefix ending in `*`. Any other annotation (an ingress controller's configuration snippet, "
        "say) refuses the Ingress.",
    )

    storage_classes: list[Annotated[str, Field(pattern=STORAGE_CLASS_PATTERN, max_length=253)]] | None = Field(
        default=None,
        max_length=64,
        description="StorageClasses of this cluster the consumer's claims may use, offered with a storage grant. "
        "Unset (default): the cluster's default class only (annotated "
        "storageclass.kubernetes.io/is-default-class=true); empty: none (storage is not granted).",
    )

    _max = field_validator("max_resources")(_check_quantities)


class TenantSpec(Model):
    consumer_cluster_id: str = Field(max_length=MAX_CLUSTER_ID, pattern=CLUSTER_ID_PATTERN)
    public_key: str = Field(description="The consumer's Ed25519 identity key (PEM).")
    policy: TenantPolicy = Field(default_factory=TenantPolicy)
    auth_generation: int = Field(
        default=1, ge=1, description="Raise to ask for a new handshake (new challenge, new certificate)."
    )
    answer: Answer | None = Field(default=None, description="The consumer's answer to the challenge.")


class TenantStatus(Model):
    phase: Literal["Pending", "Challenged", "Authenticated", "Refused"] = "Pending"
    conditions: list[Condition] = conditions_field(
        TENANT_READY,
        "Authentication (the handshake), Namespaces (the tenant namespace is the consumer's), PodSecurity "
        "(the offload policy in force) and Ready.",
    )
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


class Tenant(Model):
    kind: ClassVar[str] = "Tenant"
    plural: ClassVar[str] = "tenants"
    scope: ClassVar[str] = "Cluster"
    short_names: ClassVar[list[str]] = ["gftenant"]
    columns: ClassVar[list[tuple[str, str, str]]] = [
        ("Consumer", "string", ".spec.consumerClusterId"),
        ("Phase", "string", ".status.phase"),
        ("Granted GPUs", "string", ".status.granted.nvidia\\.com/gpu"),
        READY_COLUMN,
        AGE_COLUMN,
    ]
    spec: TenantSpec
    status: TenantStatus | None = None
