"""What runs in each local cluster: its components, their identities and their command lines.

Owns: the components in start order (embedded etcd, kube-apiserver, kube-controller-manager,
kube-scheduler, kwok, metrics-server, and Kueue and JobSet where the topology asks for them), the DRA
device publisher of clusters with DRA-managed nodes (`DRA_PUBLISHER`: no port, started after the
apiserver like gpufed's controller), gpufed's controller as one more process of the cluster, the
binaries they need, the identities that get a kubeconfig, the ports each component listens on, where
Kueue's and JobSet's configuration and certificate directories live in a cluster's state directory,
the apiserver's optional audit policy, and the full command line of each component: every listener on
127.0.0.1, every certificate from the cluster's PKI, every kubeconfig from its state directory.

Pure: builds argument lists from paths it is handed (`Paths`, which `LocalEnvironment` provides) and
from the topology; does no I/O. Does not: start, watch or stop anything (`launcher`, `supervise`).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from gpufed.localenv import jobset, kueue, kwokcfg, metricsserver
from gpufed.localenv.topology import ClusterPorts, ClusterSpec

if TYPE_CHECKING:
    from gpufed.localenv.pki import ClusterPKI

#: The components of every cluster, in start order.
COMPONENTS = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kwok", "metrics-server")
#: Kueue's manager: a component of the clusters whose topology sets `kueue` (`components_of`).
KUEUE = "kueue"
#: Kueue's configuration file and its certificate directory (tls.crt/tls.key), in the cluster's directory.
KUEUE_CONFIG_FILE = "kueue.yaml"
KUEUE_CERT_DIR = "kueue-certs"
#: JobSet's controller manager: a component of the clusters whose topology sets `jobset` (`components_of`).
JOBSET = "jobset"
#: JobSet's configuration file and its certificate directory (tls.crt/tls.key), in the cluster's directory.
JOBSET_CONFIG_FILE = "jobset.yaml"
JOBSET_CERT_DIR = "jobset-certs"
#: The DRA device publisher (gpufed-k8s's `dra-publisher` applet): a process of the clusters with
#: DRA-managed nodes (`has_dra`); it listens on no port. It runs as kwok's identity: it stands in for
#: the kubelet plugin of the nodes kwok simulates.
DRA_PUBLISHER = "dra-publisher"
#: Its --config file (`dra.publisher_config`, JSON), in the cluster's directory.
DRA_CONFIG_FILE = "dra-publisher.json"
#: gpufed's own per-cluster process, started after the cluster is healthy when manifests_dir is set.
CONTROLLER = "gpufed-controller"
#: Identity of the virtual kubelets the controller starts (one process per virtual node).
VIRTUAL_KUBELET = "gpufed-virtual-kubelet"
BINARIES = (
    "etcd",
    "kube-apiserver",
    "kube-controller-manager",
    "kube-scheduler",
    "kubectl",
    "kwok",
    "metrics-server",
    KUEUE,
    JOBSET,
    DRA_PUBLISHER,
)
#: The client identities that get a kubeconfig in every cluster's state directory.
IDENTITIES = (
    "admin",
    "controller-manager",
    "scheduler",
    "kwok",
    metricsserver.IDENTITY,
    kueue.IDENTITY,
    jobset.IDENTITY,
    CONTROLLER,
    VIRTUAL_KUBELET,
)

#: The audit policy of `LocalSettings.audit`: who did what to which object, no bodies; one event per
#: request at ResponseComplete (long-running requests such as watches also log ResponseStarted).
AUDIT_POLICY = """apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [RequestReceived]
rules:
  - level: Metadata
"""
#: Rotation of the audit log: MB per file, rotated files kept.
AUDIT_LOG_MAX_MB = 100
AUDIT_LOG_BACKUPS = 2
#: The audit policy file in a cluster's state directory.
AUDIT_POLICY_FILE = "audit-policy.yaml"


class Paths(Protocol):
    """Where an environment keeps each cluster's files (LocalEnvironment is one)."""

    def cluster_dir(self, name: str) -> Path: ...

    def pki(self, name: str) -> ClusterPKI: ...

    def kubeconfig_path(self, name: str, identity: str = "admin") -> Path: ...

    def audit_log_path(self, cluster: str) -> Path: ...

    def binary(self, name: str) -> Path: ...

    def node_address(self) -> str: ...


def components_of(spec: ClusterSpec) -> tuple[str, ...]:
    """The components of the cluster `spec`, in start order: `COMPONENTS`, then Kueue and JobSet where
    they run."""
    return (*COMPONENTS, *((KUEUE,) if spec.kueue else ()), *((JOBSET,) if spec.jobset else ()))


def has_dra(spec: ClusterSpec) -> bool:
    """Whether the cluster has DRA-managed nodes, and so runs `DRA_PUBLISHER`."""
    return any(p.dra_nodes for p in spec.node_pools)


def ports_of(ports: ClusterPorts, *, kueue: bool = False, jobset: bool = False) -> dict[str, int]:
    """The port each component listens on (etcd: its client port; Kueue and JobSet: their webhook
    servers), for `COMPONENTS` and, with `kueue` and `jobset`, Kueue and JobSet."""
    out = {
        "etcd": ports.etcd_client,
        "kube-apiserver": ports.apiserver,
        "kube-controller-manager": ports.controller_manager,
        "kube-scheduler": ports.scheduler,
        "kwok": ports.kwok,
        "metrics-server": ports.metrics_server,
    }
    if kueue:
        out[KUEUE] = ports.kueue_webhook
    if jobset:
        out[JOBSET] = ports.jobset_webhook
    return out


def other_ports(ports: ClusterPorts, component: str) -> tuple[int, ...]:
    """The ports a component binds besides its `ports_of` one (etcd's peer port, Kueue's metrics and
    probes, JobSet's probes)."""
    if component == "etcd":
        return (ports.etcd_peer,)
    if component == KUEUE:
        return (ports.kueue_metrics, ports.kueue_health)
    if component == JOBSET:
        return (ports.jobset_health,)
    return ()


def kueue_config(paths: Paths, spec: ClusterSpec, ports: ClusterPorts) -> dict[str, object]:
    """Kueue's configuration for the cluster `spec` (written to `KUEUE_CONFIG_FILE`)."""
    return kueue.configuration(
        webhook_port=ports.kueue_webhook,
        metrics_port=ports.kueue_metrics,
        health_port=ports.kueue_health,
        cert_dir=paths.cluster_dir(spec.name) / KUEUE_CERT_DIR,
    )


def jobset_config(paths: Paths, spec: ClusterSpec, ports: ClusterPorts) -> dict[str, object]:
    """JobSet's configuration for the cluster `spec` (written to `JOBSET_CONFIG_FILE`)."""
    return jobset.configuration(
        webhook_port=ports.jobset_webhook,
        health_port=ports.jobset_health,
        cert_dir=paths.cluster_dir(spec.name) / JOBSET_CERT_DIR,
    )


def command(paths: Paths, spec: ClusterSpec, ports: ClusterPorts, component: str, *, audit: bool) -> list[str]:
    """The command line of one component of the cluster `spec` (ValueError for an unknown one)."""
    d = paths.cluster_dir(spec.name)
    pki = paths.pki(spec.name)
    if component == "etcd":
        return [
            str(paths.binary("etcd")),
            f"--name={spec.name}",
            f"--data-dir={d / 'etcd'}",
            f"--listen-client-urls=http://127.0.0.1:{ports.etcd_client}",
            f"--listen-peer-urls=http://127.0.0.1:{ports.etcd_peer}",
            "--unsafe-no-fsync",
            "--log-level=error",
        ]
    if component == "kube-apiserver":
        audit_flags = (
            [
                f"--audit-policy-file={d / AUDIT_POLICY_FILE}",
                f"--audit-log-path={paths.audit_log_path(spec.name)}",
                "--audit-log-format=json",
                f"--audit-log-maxsize={AUDIT_LOG_MAX_MB}",
                f"--audit-log-maxbackup={AUDIT_LOG_BACKUPS}",
            ]
            if audit
            else []
        )
        return [
            str(paths.binary("kube-apiserver")),
            f"--etcd-servers=http://127.0.0.1:{ports.etcd_client}",
            "--bind-address=127.0.0.1",
            "--advertise-address=127.0.0.1",
            f"--secure-port={ports.apiserver}",
            f"--cert-dir={d / 'apiserver-certs'}",
            f"--tls-cert-file={pki.cert('apiserver')}",
            f"--tls-private-key-file={pki.key('apiserver')}",
            f"--client-ca-file={pki.ca_cert}",
            f"--service-account-key-file={pki.sa_pub}",
            f"--service-account-signing-key-file={pki.sa_key}",
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
            f"--service-cluster-ip-range={spec.service_cidr}",
            "--authorization-mode=Node,RBAC",
            "--enable-admission-plugins=NodeRestriction",
            "--allow-privileged=true",
            f"--kubelet-client-certificate={pki.cert('apiserver-kubelet-client')}",
            f"--kubelet-client-key={pki.key('apiserver-kubelet-client')}",
            f"--kubelet-certificate-authority={pki.ca_cert}",
            "--kubelet-preferred-address-types=InternalIP",
            f"--requestheader-client-ca-file={pki.front_proxy_ca_cert}",
            "--requestheader-allowed-names=front-proxy-client",
            "--requestheader-username-headers=X-Remote-User",
            "--requestheader-group-headers=X-Remote-Group",
            "--requestheader-extra-headers-prefix=X-Remote-Extra-",
            f"--proxy-client-cert-file={pki.cert('front-proxy-client')}",
            f"--proxy-client-key-file={pki.key('front-proxy-client')}",
            # The kubernetes Service would point at 127.0.0.1, which Endpoints reject.
            "--endpoint-reconciler-type=none",
            "--profiling=false",
            *audit_flags,
        ]
    if component in ("kube-controller-manager", "kube-scheduler"):
        kc = paths.kubeconfig_path(
            spec.name, "controller-manager" if component == "kube-controller-manager" else "scheduler"
        )
        common = [
            f"--kubeconfig={kc}",
            f"--authentication-kubeconfig={kc}",
            f"--authorization-kubeconfig={kc}",
            "--bind-address=127.0.0.1",
            "--leader-elect=false",
            "--profiling=false",
        ]
        if component == "kube-scheduler":
            return [str(paths.binary("kube-scheduler")), *common, f"--secure-port={ports.scheduler}"]
        return [
            str(paths.binary("kube-controller-manager")),
            *common,
            f"--secure-port={ports.controller_manager}",
            f"--cert-dir={d / 'kcm-certs'}",
            # The CSR API signs kubernetes.io/kube-apiserver-client certificates with the cluster CA.
            f"--cluster-signing-cert-file={pki.ca_cert}",
            f"--cluster-signing-key-file={pki.ca_key}",
            f"--root-ca-file={pki.ca_cert}",
            f"--service-account-private-key-file={pki.sa_key}",
            "--use-service-account-credentials=true",
            f"--cluster-cidr={spec.pod_cidr}",
            f"--service-cluster-ip-range={spec.service_cidr}",
            "--allocate-node-cidrs=false",
        ]
    if component == CONTROLLER:
        return [
            sys.executable,
            "-m",
            "gpufed.cli",
            "controller",
            f"--kubeconfig={paths.kubeconfig_path(spec.name, CONTROLLER)}",
            f"--cluster-name={spec.name}",
            "--log-level=info",
            f"--webhook-port={ports.webhook}",
            "--webhook-host=127.0.0.1",
            f"--estimator-port={ports.estimator}",
            "--estimator-host=127.0.0.1",
            f"--virtual-kubelet-kubeconfig={paths.kubeconfig_path(spec.name, VIRTUAL_KUBELET)}",
            f"--kubelet-ports={ports.kubelet_ports[0]}-{ports.kubelet_ports[1]}",
            f"--node-address={paths.node_address()}",
            f"--log-dir={d / 'logs'}",
        ]
    if component == "kwok":
        return [
            str(paths.binary("kwok")),
            f"--kubeconfig={paths.kubeconfig_path(spec.name, 'kwok')}",
            f"--config={d / 'kwok.yaml'}",
            "--manage-all-nodes=false",
            f"--manage-nodes-with-annotation-selector={kwokcfg.KWOK_NODE_ANNOTATION}=fake",
            "--node-ip=127.0.0.1",
            f"--node-port={ports.kwok}",
            f"--server-address=127.0.0.1:{ports.kwok}",
            f"--tls-cert-file={pki.cert('kwok-serving')}",
            f"--tls-private-key-file={pki.key('kwok-serving')}",
            f"--cidr={spec.pod_cidr}",
            "--node-lease-duration-seconds=40",
            # At WARN, kwok logs five lines per resource-metrics scrape of every node without pods.
            "--v=ERROR",
        ]
    if component == DRA_PUBLISHER:
        return [
            str(paths.binary(DRA_PUBLISHER)),
            f"--kubeconfig={paths.kubeconfig_path(spec.name, 'kwok')}",
            f"--config={d / DRA_CONFIG_FILE}",
        ]
    if component == KUEUE:
        return kueue.args(
            paths.binary("kueue"),
            config=d / KUEUE_CONFIG_FILE,
            kubeconfig=paths.kubeconfig_path(spec.name, kueue.IDENTITY),
            cert_dir=d / KUEUE_CERT_DIR,
        )
    if component == JOBSET:
        return jobset.args(
            paths.binary("jobset"),
            config=d / JOBSET_CONFIG_FILE,
            kubeconfig=paths.kubeconfig_path(spec.name, jobset.IDENTITY),
        )
    if component == "metrics-server":
        return metricsserver.args(
            paths.binary("metrics-server"),
            port=ports.metrics_server,
            kubeconfig=paths.kubeconfig_path(spec.name, metricsserver.IDENTITY),
            ca_cert=pki.ca_cert,
            client_cert=pki.cert(metricsserver.IDENTITY),
            client_key=pki.key(metricsserver.IDENTITY),
            serving_cert=pki.cert(metricsserver.SERVING_STEM),
            serving_key=pki.key(metricsserver.SERVING_STEM),
        )
    raise ValueError(component)
