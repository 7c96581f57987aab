"""gpufed's names on the wire: ClusterIDs and every name, label and annotation the components share.

Owns: the ClusterID type and its rules (a DNS label short enough that `<namespace>-<consumer-id>`
twin names and `gpufed-tenant-<consumer-id>` stay valid), deriving a default ClusterID from the
kube-system namespace UID (stable across reinstalls of gpufed, unique per cluster), the names
derived from a ClusterID (tenant and twin namespaces, per-provider Secrets), and one definition of
each name another component or cluster reads: the identity objects, ownership labels, RBAC roles,
virtual-node labels and taint, the labels of remote twins, and the GPU pool's objects, node
annotations and per-peering settings.

Does not: hold the device plugin's resource and label names (`gpufed.apis.pool`) or the CRDs'
group and kinds (`gpufed.apis.meta`, `gpufed.apis.kinds`).

Pure: no I/O.
"""

from __future__ import annotations

import re
from typing import NewType

ClusterID = NewType("ClusterID", str)

#: Longest ClusterID: leaves room for a 32-character namespace in `<ns>-<id>` (63 max).
MAX_CLUSTER_ID = 30
SYSTEM_NAMESPACE = "gpufed"
TENANT_PREFIX = "gpufed-tenant-"
_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


def parse_cluster_id(value: str) -> ClusterID:
    """Validate `value` as a ClusterID, with an error that says what is allowed."""
    if not value or len(value) > MAX_CLUSTER_ID or not _LABEL.match(value):
        raise ValueError(
            f"invalid cluster ID {value!r}: use 1-{MAX_CLUSTER_ID} lowercase letters, digits and '-', "
            "starting and ending with a letter or digit"
        )
    return ClusterID(value)


def default_cluster_id(kube_system_uid: str, name_hint: str = "") -> ClusterID:
    """`<hint>-<8 hex of the kube-system UID>`, e.g. `gpu-a-3f2c91d0`; the hint is sanitised."""
    hexpart = re.sub(r"[^0-9a-f]", "", kube_system_uid.lower())[:8]
    if len(hexpart) < 8:
        raise ValueError(f"kube-system UID {kube_system_uid!r} has too few hex digits")
    hint = re.sub(r"[^a-z0-9-]+", "-", name_hint.lower()).strip("-")[: MAX_CLUSTER_ID - 9].strip("-")
    return parse_cluster_id(f"{hint}-{hexpart}" if hint else f"cluster-{hexpart}")


def tenant_namespace(consumer: ClusterID) -> str:
    """Provider-side namespace holding one consumer's control objects."""
    return f"{TENANT_PREFIX}{consumer}"


def twin_namespace(namespace: str, consumer: ClusterID) -> str:
    """Provider-side twin of a consumer namespace; refuses names that would exceed 63 characters."""
    name = f"{namespace}-{consumer}"
    if len(name) > 63:
        raise ValueError(f"twin namespace {name!r} would be longer than 63 characters; shorten {namespace!r}")
    return name


# ---- names every role shares: identity, ownership, RBAC

#: ConfigMap (namespace `gpufed`) with this cluster's ClusterID and public identity key.
IDENTITY_CONFIGMAP = "gpufed-identity"
#: Secret (namespace `gpufed`) with the Ed25519 private identity key; never logged, never copied.
IDENTITY_SECRET = "gpufed-identity-key"  # noqa: S105 -- a Secret's name, not a password
MANAGED_BY_LABEL = "app.kubernetes.io/managed-by"
MANAGED_BY = "gpufed"
#: On provider-side objects of one consumer (tenant and twin namespaces, CSRs, quotas, bindings).
CONSUMER_LABEL = "gpufed.io/consumer-cluster-id"
#: On consumer-side objects of one provider (credentials, keys).
PROVIDER_LABEL = "gpufed.io/provider-cluster-id"
#: On twin namespaces: the consumer namespace they mirror.
TWIN_OF_LABEL = "gpufed.io/twin-of"
#: On tenant namespaces.
TENANT_LABEL = "gpufed.io/tenant"
#: On provider-side namespaces: the consumer they belong to.
ORIGIN_CLUSTER_ANNOTATION = "gpufed.io/origin-cluster-id"
#: ClusterRoles (installed with gpufed) bound to a consumer's user in its namespaces only.
CONSUMER_WORKLOADS_ROLE = "gpufed-consumer-workloads"
CONSUMER_CONTROL_ROLE = "gpufed-consumer-control"
#: Consumer side: what virtual kubelets may read in an offloaded namespace (reflection, tokens),
#: bound by the offloading controller with a RoleBinding of this name in each offloaded namespace.
REFLECTION_ROLE = "gpufed-virtual-kubelet-reflection"
REFLECTION_ROLEBINDING = "gpufed-reflection"
#: The virtual kubelets' identities on the consumer (deploy/rbac/virtual-kubelet.yaml).
VIRTUAL_KUBELET_USER = "gpufed:virtual-kubelet"
VIRTUAL_KUBELET_SERVICE_ACCOUNT = "gpufed-virtual-kubelet"
#: ResourceQuota and LimitRange enforcing a consumer's grant in each of its namespaces.
GRANT_QUOTA = "gpufed-grant"


def remote_kubeconfig_secret(provider: ClusterID) -> str:
    """Consumer-side Secret with the credentials for one provider."""
    return f"gpufed-remote-{provider}"


def credentials_reader(provider: ClusterID) -> str:
    """Consumer-side Role and RoleBinding (namespace `gpufed`) that let the virtual kubelets read the
    credentials Secret of one provider, and nothing else there."""
    return f"gpufed-virtual-kubelet-{provider}"


def pending_key_secret(provider: ClusterID) -> str:
    """Consumer-side Secret holding the private key of a CSR not yet signed by `provider`."""
    return f"gpufed-csr-key-{provider}"


# ---- offloading: virtual nodes, remote twins of pods, offloaded namespaces

#: Well-known labels that keep node tooling off virtual nodes: cloud load balancers do not send
#: traffic to them, and the node lifecycle controller's zone-disruption logic ignores them.
VIRTUAL_NODE_EXCLUSION_LABELS = {
    "node.kubernetes.io/exclude-from-external-load-balancers": "true",
    "node.kubernetes.io/exclude-disruption": "true",
}
#: Every virtual node's name starts with it; the consumer's admission policy and the serving-certificate
#: approver confine the virtual kubelets to such nodes.
VIRTUAL_NODE_PREFIX = "gpufed-"
TYPE_LABEL = "gpufed.io/type"
VIRTUAL_NODE_TYPE = "virtual-node"
#: Labels of every virtual node (`TYPE_LABEL=VIRTUAL_NODE_TYPE` is what selectors use).
VIRTUAL_NODE_TYPE_LABELS = {
    "type": "virtual-kubelet",
    "kubernetes.io/role": "agent",
    TYPE_LABEL: VIRTUAL_NODE_TYPE,
}
#: On a virtual node: the provider behind it.
REMOTE_CLUSTER_LABEL = "gpufed.io/remote-cluster-id"
#: Taint of every virtual node; pods of offloaded namespaces get its toleration from the webhook.
VIRTUAL_NODE_TAINT_KEY = "gpufed.io/virtual-node"
VIRTUAL_NODE_TAINT = {"key": VIRTUAL_NODE_TAINT_KEY, "value": "true", "effect": "NoExecute"}
#: On remote twins (pods, ConfigMaps, Secrets): the consumer cluster, the local object's UID, and
#: the virtual node whose kubelet owns the twin (several virtual nodes may share a provider).
ORIGIN_CLUSTER_LABEL = "gpufed.io/origin-cluster-id"
ORIGIN_UID_LABEL = "gpufed.io/origin-uid"
ORIGIN_NODE_LABEL = "gpufed.io/origin-node"
#: On consumer namespaces that are offloaded (the webhook's namespaceSelector); value: the strategy.
OFFLOADING_LABEL = "gpufed.io/offloading"
#: Name of the NamespaceOffloading object in an offloaded namespace.
NAMESPACE_OFFLOADING = "offloading"


# ---- the global GPU pool: capacity estimator, GPU node agent, pool virtual nodes

#: Provider side, namespace `gpufed`: where the capacity estimator listens and the CA of its
#: serving certificate (data keys `endpoint`, `ca.crt`); every authenticated consumer may read it.
ESTIMATOR_CONFIGMAP = "gpufed-estimator"
#: Provider side, namespace `gpufed`: the estimator's serving key and certificate (kept across restarts).
ESTIMATOR_TLS_SECRET = "gpufed-estimator-tls"  # noqa: S105 -- a Secret's name, not a password
#: On GPU nodes, written by the GPU node agent: `Healthy` or `Unhealthy` (the estimator skips the
#: latter); the reason is in GPU_HEALTH_REASON_ANNOTATION.
GPU_HEALTH_ANNOTATION = "gpufed.io/gpu-health"
GPU_HEALTH_REASON_ANNOTATION = "gpufed.io/gpu-health-reason"
GPU_HEALTHY = "Healthy"
GPU_UNHEALTHY = "Unhealthy"
#: On GPU nodes, written by the GPU node agent: where its facts come from: `nvml`, or
#: `labels` (NVML unavailable: device-plugin capacity and existing nvidia.com/gpu.* labels).
GPU_SOURCE_ANNOTATION = "gpufed.io/gpu-source"
#: On virtual nodes (consumer side): the pool's figures as JSON (what `gpufed pool` prints).
POOL_ANNOTATION = "gpufed.io/gpu-pool"
#: Dynamic Resource Allocation's API (ResourceSlices, DeviceClasses, ResourceClaims; Kubernetes >= 1.34).
DRA_API_PATH = "/apis/resource.k8s.io/v1"
#: The DRA driver (and DeviceClass) under which virtual nodes publish their providers' devices as
#: resource.k8s.io ResourceSlices on the consumer.
DRA_DRIVER = "gpu.gpufed.io"
DRA_DEVICE_CLASS = "gpu.gpufed.io"
#: On a consumer's ResourceClaim: the devices the provider allocated ("<provider>: <driver>/<pool>/<device>, ...").
PROVIDER_ALLOCATION_ANNOTATION = "gpufed.io/provider-allocation"
#: On virtual nodes of a per-product pool: the GPU product (also in nvidia.com/gpu.product).
POOL_PRODUCT_LABEL = "gpufed.io/gpu-pool-product"
#: On a pool's virtual node and its Kueue ResourceFlavor: the most GPUs one pod can ever get there (its
#: provider's largest node of the product, at most the grant). Queued Jobs' GPU pod templates get a
#: node affinity on it, so Kueue chooses only a flavor whose pool can hold one of their pods.
POD_GPUS_LABEL = "gpufed.io/pod-gpus-max"
#: On a consumer's ForeignCluster of a provider (per peering; the virtual kubelet restarts to apply):
#: `live` (default: the provider's capacity estimator, pools, fit checks, fail-back) or `static`
#: (capacity = grant, one node, no fit check, no fail-back: how other federations behave).
CAPACITY_ANNOTATION = "gpufed.io/capacity"
#: `per-product` (default: one virtual node per GPU product when the provider has several) or `provider`.
GPU_POOLS_ANNOTATION = "gpufed.io/gpu-pools"
#: Comma-separated label keys (or prefixes ending in `/` or `*`) the provider's node labels may set on
#: its virtual nodes beyond the GPU ones; reserved domains (kubernetes.io, k8s.io, gpufed.io) never pass.
NODE_LABELS_ANNOTATION = "gpufed.io/allowed-node-labels"

# ---- gang placement (consumer side) and the Kueue names gpufed reads

#: Scheduling gate the offloading webhook puts on every pod of a group (a Job with parallelism > 1,
#: or pods carrying POD_GROUP_LABEL) in an offloaded namespace: the gang controller removes it once it
#: has chosen one pool (provider and GPU product) that holds the whole group, pinning the pod there.
GANG_GATE = "gpufed.io/gang"
#: On pods: the name of the group they belong to (pods of one namespace with the same value), with
#: POD_GROUP_SIZE_ANNOTATION saying how many pods run together.
POD_GROUP_LABEL = "gpufed.io/pod-group"
POD_GROUP_SIZE_ANNOTATION = "gpufed.io/pod-group-size"
#: On every pod the webhook gates: the group (a digest of its namespace and name, a valid label
#: value; the gang controller watches pods with this label), its name and its size.
GANG_LABEL = "gpufed.io/gang"
GANG_GROUP_ANNOTATION = "gpufed.io/gang-group"
GANG_SIZE_ANNOTATION = "gpufed.io/gang-size"
#: On a group's pods once placed: the pool (virtual node) the group was released to.
GANG_NODE_ANNOTATION = "gpufed.io/gang-node"
#: On the gated pods of the group that waits longest for a pool: the pool (virtual node) the gang
#: controller holds GPUs back on for it. That pool's virtual kubelet advertises its free GPUs less
#: what these pods need, so pods bound one by one do not take the GPUs the group waits for.
GANG_RESERVE_ANNOTATION = "gpufed.io/gang-reserve"
#: Scheduling gate on the twins of a group at the provider: the virtual kubelet removes it from all
#: of them at once when every twin of the group exists and the provider's free GPUs hold them all,
#: so no part of a group runs while the rest waits.
TWIN_GROUP_GATE = "gpufed.io/group-start"
#: Kueue's names: a Job or pod with the queue label is Kueue's to admit (gpufed's gang path steps
#: aside); plain pods of a Kueue pod group carry the group label and the total-count annotation.
KUEUE_QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
KUEUE_POD_GROUP_LABEL = "kueue.x-k8s.io/pod-group-name"
KUEUE_POD_GROUP_COUNT_ANNOTATION = "kueue.x-k8s.io/pod-group-total-count"
#: JobSet's names (sigs.k8s.io/jobset): its API group and version, and the labels its controller puts
#: on every Job and pod of a JobSet: the JobSet's name and UID, the replicatedJob the pod's Job belongs
#: to, and the restart attempt (a restarted JobSet's pods are new ones, of a new attempt).
JOBSET_API_VERSION = "jobset.x-k8s.io/v1alpha2"
JOBSET_NAME_LABEL = "jobset.sigs.k8s.io/jobset-name"
JOBSET_UID_LABEL = "jobset.sigs.k8s.io/jobset-uid"
JOBSET_REPLICATED_JOB_LABEL = "jobset.sigs.k8s.io/replicatedjob-name"
JOBSET_RESTART_LABEL = "jobset.sigs.k8s.io/restart-attempt"

#: On a consumer's pod: seconds its twin may stay unplaced at the provider before the pod is failed
#: back, shorter than the virtual kubelet's own timeout (a job that would rather run elsewhere at
#: once); a longer, malformed or too short value is ignored (`vkprovider.node.pods.unplaced_timeout`).
UNPLACED_TIMEOUT_ANNOTATION = "gpufed.io/unplaced-timeout-seconds"

# ---- the storage fabric: claims of offloaded pods bound on the provider

#: The consumer's virtual StorageClass (WaitForFirstConsumer): a claim of it is bound on the provider
#: whose virtual node its first pod is scheduled to (the default name; `gpufed controller` takes
#: another), through the provisioner STORAGE_PROVISIONER that gpufed's virtual kubelets play.
STORAGE_CLASS = "gpufed"
STORAGE_PROVISIONER = "storage.gpufed.io"
#: On a consumer's claim: which of the provider's offered StorageClasses to bind it with (default:
#: the class the provider marks default in the grant).
PROVIDER_STORAGE_CLASS_ANNOTATION = "gpufed.io/provider-storage-class"
#: On a twin namespace (provider side, written by the provider's controller): the comma-separated
#: StorageClasses the consumer's claims there may use; the claims admission policy reads it.
OFFERED_STORAGE_CLASSES_ANNOTATION = "gpufed.io/storage-classes"
#: The grant resource for claim storage (ResourceSlice `resources`/`granted`; the twin namespaces'
#: quota `requests.storage`), and for the number of claims (quota `persistentvolumeclaims`).
STORAGE_RESOURCE = "storage"
CLAIMS_RESOURCE = "persistentvolumeclaims"
#: On a twin namespace (provider side, written by the provider's controller beside
#: OFFERED_STORAGE_CLASSES_ANNOTATION): the access modes each offered class allows, comma-separated
#: `<class>:<mode>` pairs (e.g. `local-disk:ReadWriteOnce`); the claims admission policy reads it.
OFFERED_STORAGE_ACCESS_MODES_ANNOTATION = "gpufed.io/storage-access-modes"
#: On a provider's StorageClass (set by its operator): the comma-separated access modes the class's
#: volumes support, as offered to consumers (default: ReadWriteOnce).
STORAGE_CLASS_ACCESS_MODES_ANNOTATION = "gpufed.io/access-modes"
#: On the consumer's virtual PersistentVolume of a claim bound on a provider: the phase of the
#: provider's claim it stands for (written by that provider's virtual kubelet).
REMOTE_PHASE_ANNOTATION = "gpufed.io/remote-phase"
#: Kubernetes' names: the annotation that makes a StorageClass a cluster's default, and the
#: provisioner of a class of static volumes (an administrator creates them; nothing provisions).
DEFAULT_STORAGE_CLASS_ANNOTATION = "storageclass.kubernetes.io/is-default-class"
STATIC_PROVISIONER = "kubernetes.io/no-provisioner"
#: On a consumer's pod whose claims keep it on local nodes in an offloaded namespace (the offloading
#: webhook sets it; the controller says so in an Event on the pod): `local` (it runs on local nodes),
#: or `pending` (the namespace's pods run remotely only, so it stays Pending).
KEPT_LOCAL_LABEL = "gpufed.io/kept-local"
