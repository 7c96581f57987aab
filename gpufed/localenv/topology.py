"""The shape of a local multi-cluster environment: clusters, CIDRs, node pools, ports.

Owns: the topology model (pydantic, loadable from YAML), the default topology (a CPU-only
`consumer` and two GPU providers `gpu-a`/`gpu-b` that share the consumer's pod and service CIDRs on
purpose: overlapping CIDRs are the case the network fabric must solve; the consumer also runs Kueue,
the providers do not; one node of gpu-a's H100 pool and one of gpu-b's L4 pool are DRA-managed),
validation, and the deterministic assignment of loopback ports to each
cluster's components.

DRA-managed nodes (`NodePool.dra_nodes`, the last ones of their pool; `gpufed.localenv.dra` says
what their driver publishes) keep every label of their pool but not `nvidia.com/gpu` in their
capacity: their GPUs are DRA devices, and advertising both would count each GPU twice.

A topology that cannot be read or is invalid raises `TopologyError` (a GpufedError: the message names
the file and the offending field). Pure: no I/O except `load_topology` reading the file it is given.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass
from pathlib import Path

import yaml
from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, field_validator, model_validator

from gpufed import defaults
from gpufed.apis.pool import GPU_PRODUCT_LABEL, GPU_RESOURCE
from gpufed.errors import GpufedError

#: Default pod CIDR of every local cluster (deliberately the same everywhere).
DEFAULT_POD_CIDR = "10.244.0.0/16"
#: The local environment's gateway underlay (a veth network between gateway network namespaces).
UNDERLAY_CIDR = "192.168.77.0/24"
GATEWAY_PORT = 51820
#: Default service CIDR of every local cluster (deliberately the same everywhere).
DEFAULT_SERVICE_CIDR = "10.96.0.0/16"
#: First loopback port handed out; each cluster gets a block of `PORTS_PER_CLUSTER`.
DEFAULT_BASE_PORT = defaults.LOCAL_BASE_PORT
#: Ports reserved per cluster (see `ClusterPorts`).
PORTS_PER_CLUSTER = 25
#: Seconds a Job's pod runs on a kwok node before it completes with exit code 0.
DEFAULT_JOB_SECONDS = defaults.LOCAL_JOB_SECONDS

GPU_MEMORY_LABEL = "nvidia.com/gpu.memory"
GPU_COUNT_LABEL = "nvidia.com/gpu.count"

_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


class NodePool(BaseModel):
    """`count` identical kwok nodes named `<cluster>-<name>-<i>`."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str
    count: int = Field(ge=1, le=500)
    cpu: str = "32"
    memory: str = "256Gi"
    #: Local disk for pods' writable layers, logs and emptyDirs, as a kubelet reports it (providers put
    #: a default ephemeral-storage request on twin pods, which a node without it could not fit).
    ephemeral_storage: str = Field(default="500Gi", alias="ephemeralStorage")
    pods: int = Field(default=110, ge=1)
    gpus: int = Field(default=0, ge=0, le=64)
    gpu_product: str | None = Field(default=None, alias="gpuProduct")
    gpu_memory_mib: int | None = Field(default=None, alias="gpuMemoryMiB", ge=1)
    labels: dict[str, str] = Field(default_factory=dict)
    #: How many of the pool's nodes (the last ones) are DRA-managed: their GPUs are published as
    #: resource.k8s.io devices (`gpufed.localenv.dra`), not as `nvidia.com/gpu` capacity. 0 to `count`;
    #: needs `gpus` > 0. Default 0.
    dra_nodes: int = Field(default=0, alias="draNodes", ge=0)
    #: Set on the copy `dra_view` makes: the pool as seen from one of its DRA-managed nodes.
    _dra_view: bool = PrivateAttr(default=False)

    @field_validator("name")
    @classmethod
    def _dns(cls, v: str) -> str:
        if not _DNS_LABEL.match(v) or len(v) > 40:
            raise ValueError(f"node pool name {v!r} must be a DNS label of at most 40 characters")
        return v

    @model_validator(mode="after")
    def _gpu_fields(self) -> NodePool:
        if self.gpus == 0 and (self.gpu_product or self.gpu_memory_mib):
            raise ValueError(f"node pool {self.name!r}: gpuProduct/gpuMemoryMiB given but gpus is 0")
        if self.gpus > 0 and not self.gpu_product:
            raise ValueError(f"node pool {self.name!r}: gpus > 0 needs gpuProduct")
        if self.dra_nodes > 0 and self.gpus == 0:
            raise ValueError(f"node pool {self.name!r}: draNodes > 0 needs gpus > 0")
        if self.dra_nodes > self.count:
            raise ValueError(f"node pool {self.name!r}: draNodes {self.dra_nodes} exceeds count {self.count}")
        return self

    def is_dra_node(self, index: int) -> bool:
        """Whether the pool's node number `index` (0-based) is DRA-managed: the last `dra_nodes` are."""
        return index >= self.count - self.dra_nodes

    def dra_view(self) -> NodePool:
        """This pool as seen from one of its DRA-managed nodes: equal labels, `capacity()` without
        `nvidia.com/gpu` (what `ClusterSpec.nodes` hands such a node as its `pool`)."""
        view = self.model_copy()
        view._dra_view = True
        return view

    def node_labels(self) -> dict[str, str]:
        labels = {"gpufed.io/local-pool": self.name}
        if self.gpus:
            assert self.gpu_product is not None
            labels[GPU_PRODUCT_LABEL] = self.gpu_product
            labels[GPU_COUNT_LABEL] = str(self.gpus)
            if self.gpu_memory_mib:
                labels[GPU_MEMORY_LABEL] = str(self.gpu_memory_mib)
        labels.update(self.labels)
        return labels

    def capacity(self) -> dict[str, str]:
        """A node's capacity (= allocatable); `nvidia.com/gpu` only on nodes that are not DRA-managed."""
        cap = {
            "cpu": self.cpu,
            "memory": self.memory,
            "ephemeral-storage": self.ephemeral_storage,
            "pods": str(self.pods),
        }
        if self.gpus and not self._dra_view:
            cap[GPU_RESOURCE] = str(self.gpus)
        return cap


class ClusterSpec(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str
    pod_cidr: str = Field(default=DEFAULT_POD_CIDR, alias="podCIDR")
    service_cidr: str = Field(default=DEFAULT_SERVICE_CIDR, alias="serviceCIDR")
    node_pools: tuple[NodePool, ...] = Field(alias="nodePools", min_length=1)
    #: Run Kueue (its CRDs, webhooks and manager, `gpufed.localenv.kueue`) in this cluster: a
    #: consumer's job queueing; off by default (the default topology turns it on for `consumer`).
    kueue: bool = False
    #: Run JobSet (its CRD, webhooks and controller manager, `gpufed.localenv.jobset`) in this
    #: cluster: a consumer's multi-job workloads; off by default (the default topology turns it on
    #: for `consumer`).
    jobset: bool = False

    @field_validator("name")
    @classmethod
    def _dns(cls, v: str) -> str:
        if not _DNS_LABEL.match(v) or len(v) > 30:
            raise ValueError(f"cluster name {v!r} must be a DNS label of at most 30 characters")
        return v

    @field_validator("pod_cidr", "service_cidr")
    @classmethod
    def _cidr(cls, v: str) -> str:
        try:
            net = ipaddress.ip_network(v, strict=True)
        except ValueError as e:
            raise ValueError(f"{v!r} is not a CIDR: {e}") from e
        if net.version != 4:
            raise ValueError(f"{v!r}: only IPv4 CIDRs are supported by the local environment")
        return v

    @model_validator(mode="after")
    def _check(self) -> ClusterSpec:
        pods = ipaddress.ip_network(self.pod_cidr)
        svc = ipaddress.ip_network(self.service_cidr)
        if pods.overlaps(svc):
            raise ValueError(f"cluster {self.name!r}: pod CIDR {pods} overlaps service CIDR {svc}")
        if pods.prefixlen > 24 - max(0, (self.node_count() - 1).bit_length()):
            raise ValueError(
                f"cluster {self.name!r}: pod CIDR {pods} is too small for {self.node_count()} nodes with a /24 each"
            )
        names = [p.name for p in self.node_pools]
        if len(set(names)) != len(names):
            raise ValueError(f"cluster {self.name!r}: node pool names must be unique")
        return self

    def node_count(self) -> int:
        return sum(p.count for p in self.node_pools)

    def nodes(self) -> list[NodeSpec]:
        """Every node of the cluster with its pod CIDR (one /24 each, in order); a DRA-managed node's
        `pool` is its pool's `dra_view`."""
        subnets = ipaddress.ip_network(self.pod_cidr).subnets(new_prefix=24)
        out: list[NodeSpec] = []
        for pool in self.node_pools:
            view = pool.dra_view() if pool.dra_nodes else pool
            for i in range(pool.count):
                dra = pool.is_dra_node(i)
                out.append(NodeSpec(f"{self.name}-{pool.name}-{i}", view if dra else pool, str(next(subnets)), dra))
        return out

    def gpu_total(self) -> int:
        """Every GPU of the cluster, DRA-managed ones included."""
        return sum(p.count * p.gpus for p in self.node_pools)

    def dra_gpu_total(self) -> int:
        """The GPUs of the cluster's DRA-managed nodes (published as devices, not as `nvidia.com/gpu`)."""
        return sum(p.dra_nodes * p.gpus for p in self.node_pools)


@dataclass(frozen=True)
class NodeSpec:
    name: str
    #: The node's pool; for a DRA-managed node its `dra_view` (no `nvidia.com/gpu` in `capacity()`).
    pool: NodePool
    pod_cidr: str
    #: Whether the node's GPUs are DRA devices (`NodePool.dra_nodes`).
    dra: bool = False


class Topology(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    clusters: tuple[ClusterSpec, ...] = Field(min_length=1, max_length=20)
    base_port: int = Field(default=DEFAULT_BASE_PORT, alias="basePort", ge=1024, le=60000)
    job_seconds: float = Field(default=DEFAULT_JOB_SECONDS, alias="jobSeconds", ge=0, le=3600)
    #: The address the virtual nodes publish as InternalIP and listen on (`gpufed.localenv.nodeaddr`).
    node_address: str = Field(default=defaults.LOCAL_NODE_ADDRESS, alias="nodeAddress")

    @field_validator("node_address")
    @classmethod
    def _address(cls, v: str) -> str:
        try:
            return str(ipaddress.ip_address(v))
        except ValueError:
            raise ValueError(f"nodeAddress must be an IP address, got {v!r}") from None

    @model_validator(mode="after")
    def _unique(self) -> Topology:
        names = [c.name for c in self.clusters]
        if len(set(names)) != len(names):
            raise ValueError(f"cluster names must be unique, got {names}")
        if self.base_port + PORTS_PER_CLUSTER * len(self.clusters) > 65535:
            raise ValueError("basePort too high for this many clusters")
        return self

    def cluster(self, name: str) -> ClusterSpec:
        for c in self.clusters:
            if c.name == name:
                return c
        raise KeyError(f"no cluster named {name!r} in the topology (have {[c.name for c in self.clusters]})")

    def gateway_endpoint(self, name: str) -> str:
        """Where the cluster's gateway listens on the local underlay (UNDERLAY_CIDR): the data-plane
        tests give a network namespace this address; the clusters' NetworkConfigs advertise it."""
        idx = [c.name for c in self.clusters].index(self.cluster(name).name)
        return f"{ipaddress.ip_network(UNDERLAY_CIDR).network_address + 10 + idx}:{GATEWAY_PORT}"

    def ports(self, name: str) -> ClusterPorts:
        idx = [c.name for c in self.clusters].index(self.cluster(name).name)
        return ClusterPorts(self.base_port + idx * PORTS_PER_CLUSTER)


@dataclass(frozen=True)
class ClusterPorts:
    """Loopback ports of one cluster's components, laid out from `base`.

    +0 apiserver, +1/+2 etcd client/peer, +3 controller-manager, +4 scheduler, +5 kwok's kubelet
    API (every fake node), +6 gpufed's webhook, +7 metrics-server, +8 gpufed's capacity estimator,
    +9/+10/+11 Kueue's webhook server, metrics and health probes (reserved in every cluster, bound
    only where Kueue runs), +12/+13 JobSet's webhook server and health probes (the same), +14 to the
    block's end (+24) the virtual kubelets' kubelet APIs.
    """

    base: int

    @property
    def apiserver(self) -> int:
        return self.base

    @property
    def etcd_client(self) -> int:
        return self.base + 1

    @property
    def etcd_peer(self) -> int:
        return self.base + 2

    @property
    def controller_manager(self) -> int:
        return self.base + 3

    @property
    def scheduler(self) -> int:
        return self.base + 4

    @property
    def kwok(self) -> int:
        return self.base + 5

    @property
    def webhook(self) -> int:
        """gpufed's admission webhook (served by the controller)."""
        return self.base + 6

    @property
    def metrics_server(self) -> int:
        """metrics-server's HTTPS port: the aggregated `metrics.k8s.io` API the apiserver proxies to."""
        return self.base + 7

    @property
    def estimator(self) -> int:
        """gpufed's capacity estimator (gRPC, served by the controller to the cluster's consumers)."""
        return self.base + 8

    @property
    def kueue_webhook(self) -> int:
        """Kueue's webhook server (admission and CRD conversion; HTTPS, the apiserver calls it by URL)."""
        return self.base + 9

    @property
    def kueue_metrics(self) -> int:
        """Kueue's metrics endpoint (HTTPS, authenticated and authorized by the apiserver)."""
        return self.base + 10

    @property
    def kueue_health(self) -> int:
        """Kueue's health probes (`/healthz`, `/readyz`; plain HTTP)."""
        return self.base + 11

    @property
    def jobset_webhook(self) -> int:
        """JobSet's webhook server (admission; HTTPS, the apiserver calls it by URL)."""
        return self.base + 12

    @property
    def jobset_health(self) -> int:
        """JobSet's health probes (`/healthz`, `/readyz`; plain HTTP)."""
        return self.base + 13

    @property
    def kubelet_ports(self) -> tuple[int, int]:
        """First and last port for virtual kubelets' kubelet APIs (one per virtual node)."""
        return (self.base + 14, self.base + PORTS_PER_CLUSTER - 1)

    def all(self) -> dict[str, int]:
        return {
            "kube-apiserver": self.apiserver,
            "etcd (client)": self.etcd_client,
            "etcd (peer)": self.etcd_peer,
            "kube-controller-manager": self.controller_manager,
            "kube-scheduler": self.scheduler,
            "kwok (kubelet API)": self.kwok,
            "gpufed webhook": self.webhook,
            "metrics-server": self.metrics_server,
            "gpufed estimator": self.estimator,
            "Kueue webhook": self.kueue_webhook,
            "Kueue metrics": self.kueue_metrics,
            "Kueue health": self.kueue_health,
            "JobSet webhook": self.jobset_webhook,
            "JobSet health": self.jobset_health,
        }


class TopologyError(GpufedError):
    """A topology that cannot be read or is invalid; the message says which file and field."""


def default_topology(*, base_port: int = DEFAULT_BASE_PORT, job_seconds: float = DEFAULT_JOB_SECONDS) -> Topology:
    """consumer (2 CPU nodes, Kueue, JobSet), gpu-a (4 x 8 H100, the last node DRA-managed), gpu-b (2 x 4
    A100 + 4 x 1 L4, the last L4 node DRA-managed); TopologyError when `base_port` or `job_seconds` is out
    of range."""
    return _validated(
        {
            "basePort": base_port,
            "jobSeconds": job_seconds,
            "clusters": [
                {
                    "name": "consumer",
                    "kueue": True,
                    "jobset": True,
                    "nodePools": [{"name": "cpu", "count": 2, "cpu": "16", "memory": "64Gi"}],
                },
                {
                    "name": "gpu-a",
                    "nodePools": [
                        {
                            "name": "h100",
                            "count": 4,
                            "cpu": "96",
                            "memory": "1024Gi",
                            "gpus": 8,
                            "gpuProduct": "NVIDIA-H100-80GB-HBM3",
                            "gpuMemoryMiB": 81559,
                            "draNodes": 1,
                        },
                    ],
                },
                {
                    "name": "gpu-b",
                    "nodePools": [
                        {
                            "name": "a100",
                            "count": 2,
                            "cpu": "64",
                            "memory": "512Gi",
                            "gpus": 4,
                            "gpuProduct": "NVIDIA-A100-SXM4-40GB",
                            "gpuMemoryMiB": 40960,
                        },
                        {
                            "name": "l4",
                            "count": 4,
                            "cpu": "16",
                            "memory": "64Gi",
                            "gpus": 1,
                            "gpuProduct": "NVIDIA-L4",
                            "gpuMemoryMiB": 23034,
                            "draNodes": 1,
                        },
                    ],
                },
            ],
        },
        "",
    )


def load_topology(path: Path) -> Topology:
    """Read a topology from YAML; TopologyError naming the file and the offending field."""
    try:
        raw = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as e:
        raise TopologyError(f"cannot read topology {path}: {e}") from e
    return _validated(raw, f"invalid topology {path}: ")


def _validated(raw: object, prefix: str) -> Topology:
    try:
        return Topology.model_validate(raw)
    except ValueError as e:
        raise TopologyError(f"{prefix}{e}") from e
