"""metrics-server for local clusters: its command line and the API objects that wire it in.

Owns: how the upstream metrics-server (built from its Go module by deploy/local/build.sh) runs as one
more process of every local cluster, and serves the resource metrics API `metrics.k8s.io/v1beta1`
(`kubectl top`) through the apiserver's aggregation layer:

- its identity: the client certificate `IDENTITY` (user `USER`, no groups) that it presents both to
  the apiserver and to every kubelet it scrapes; RBAC grants that user exactly what upstream's
  manifests grant metrics-server (read nodes and pods, `get` on `nodes/metrics`, plus
  `nodes/stats`), delegated authentication/authorization (`system:auth-delegator`) and reading the
  `extension-apiserver-authentication` ConfigMap;
- its kubelet client: every node's `InternalIP` and `status.daemonEndpoints.kubeletEndpoint.Port`
  (`--kubelet-use-node-status-port`), TLS verified against the cluster CA (never
  `--kubelet-insecure-tls`); the path is `/metrics/resource` unless the node carries the annotation
  `metrics.k8s.io/resource-metrics-path` (kwok's nodes do: one kwok process serves every fake node
  on one port, under `/metrics/nodes/<node>/metrics/resource`; see `kwokcfg`);
- its serving side: HTTPS on 127.0.0.1 with a certificate signed by the cluster CA for
  `SERVICE_DNS`, which the APIService trusts through `caBundle`. The apiservers run without
  kube-proxy and Endpoints refuse loopback addresses, so the APIService points at an ExternalName
  Service (`127.0.0.1`): the aggregator resolves ExternalName Services itself and dials that
  address on the APIService's port, verifying the certificate for `SERVICE_DNS`.

Pure: builds argument lists and objects, does no I/O.
"""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

#: File stem of metrics-server's client certificate and kubeconfig.
IDENTITY = "metrics-server"
#: The user metrics-server authenticates as (CN of its client certificate).
USER = "system:metrics-server"
#: File stem of its serving certificate.
SERVING_STEM = "metrics-server-serving"
NAMESPACE = "kube-system"
SERVICE = "metrics-server"
#: The name the aggregator verifies the serving certificate against.
SERVICE_DNS = f"{SERVICE}.{NAMESPACE}.svc"
GROUP = "metrics.k8s.io"
VERSION = "v1beta1"
APISERVICE = f"{VERSION}.{GROUP}"
#: The address the ExternalName Service names (metrics-server binds it).
HOST = "127.0.0.1"
#: Seconds between scrapes (metrics-server's minimum is 10 s): `kubectl top` has data one to two
#: resolutions after a pod starts.
METRIC_RESOLUTION_S = 10
#: A scrape of one kubelet may take this long; metrics-server insists on less than 90 % of the resolution.
KUBELET_REQUEST_TIMEOUT_S = 5
#: ClusterRole granting metrics-server what it needs (upstream's name for it).
CLUSTER_ROLE = "system:metrics-server"
#: ClusterRole aggregated into view/edit/admin so that ordinary users may read metrics (upstream's).
READER_ROLE = "system:aggregated-metrics-reader"


def args(
    binary: Path,
    *,
    port: int,
    kubeconfig: Path,
    ca_cert: Path,
    client_cert: Path,
    client_key: Path,
    serving_cert: Path,
    serving_key: Path,
) -> list[str]:
    """metrics-server's command line; one identity (`kubeconfig`'s, = `client_cert`) for everything."""
    return [
        str(binary),
        f"--bind-address={HOST}",
        f"--secure-port={port}",
        f"--tls-cert-file={serving_cert}",
        f"--tls-private-key-file={serving_key}",
        f"--kubeconfig={kubeconfig}",
        f"--authentication-kubeconfig={kubeconfig}",
        f"--authorization-kubeconfig={kubeconfig}",
        "--kubelet-preferred-address-types=InternalIP",
        "--kubelet-use-node-status-port",
        f"--kubelet-certificate-authority={ca_cert}",
        f"--kubelet-client-certificate={client_cert}",
        f"--kubelet-client-key={client_key}",
        f"--kubelet-request-timeout={KUBELET_REQUEST_TIMEOUT_S}s",
        f"--metric-resolution={METRIC_RESOLUTION_S}s",
        "--profiling=false",
    ]


def _user() -> list[dict[str, str]]:
    return [{"kind": "User", "apiGroup": "rbac.authorization.k8s.io", "name": USER}]


def rbac() -> list[dict[str, Any]]:
    """What metrics-server may do (applied before it starts: it reads the authentication ConfigMap at once)."""
    rbac_v1 = "rbac.authorization.k8s.io/v1"
    return [
        {
            "apiVersion": rbac_v1,
            "kind": "ClusterRole",
            "metadata": {"name": CLUSTER_ROLE},
            "rules": [
                {"apiGroups": [""], "resources": ["nodes/metrics", "nodes/stats"], "verbs": ["get"]},
                {"apiGroups": [""], "resources": ["nodes", "pods"], "verbs": ["get", "list", "watch"]},
            ],
        },
        {
            "apiVersion": rbac_v1,
            "kind": "ClusterRoleBinding",
            "metadata": {"name": CLUSTER_ROLE},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": CLUSTER_ROLE},
            "subjects": _user(),
        },
        {
            # TokenReviews and SubjectAccessReviews for the requests it serves (delegated auth).
            "apiVersion": rbac_v1,
            "kind": "ClusterRoleBinding",
            "metadata": {"name": "metrics-server:system:auth-delegator"},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "ClusterRole",
                "name": "system:auth-delegator",
            },
            "subjects": _user(),
        },
        {
            # The requestheader (front-proxy) CA and allowed names, from kube-system's ConfigMap.
            "apiVersion": rbac_v1,
            "kind": "RoleBinding",
            "metadata": {"name": "metrics-server-auth-reader", "namespace": NAMESPACE},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "Role",
                "name": "extension-apiserver-authentication-reader",
            },
            "subjects": _user(),
        },
        {
            "apiVersion": rbac_v1,
            "kind": "ClusterRole",
            "metadata": {
                "name": READER_ROLE,
                "labels": {
                    "rbac.authorization.k8s.io/aggregate-to-view": "true",
                    "rbac.authorization.k8s.io/aggregate-to-edit": "true",
                    "rbac.authorization.k8s.io/aggregate-to-admin": "true",
                },
            },
            "rules": [{"apiGroups": [GROUP], "resources": ["pods", "nodes"], "verbs": ["get", "list", "watch"]}],
        },
    ]


def service(port: int) -> dict[str, Any]:
    """The Service the APIService names: ExternalName, so the aggregator dials `HOST` itself."""
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": SERVICE, "namespace": NAMESPACE, "labels": {"app.kubernetes.io/name": SERVICE}},
        "spec": {
            "type": "ExternalName",
            "externalName": HOST,
            "ports": [{"name": "https", "port": port, "protocol": "TCP"}],
        },
    }


def apiservice(port: int, ca_pem: bytes) -> dict[str, Any]:
    """`v1beta1.metrics.k8s.io`, served by metrics-server, whose certificate chains to `ca_pem`."""
    return {
        "apiVersion": "apiregistration.k8s.io/v1",
        "kind": "APIService",
        "metadata": {"name": APISERVICE, "labels": {"app.kubernetes.io/name": SERVICE}},
        "spec": {
            "group": GROUP,
            "version": VERSION,
            "service": {"namespace": NAMESPACE, "name": SERVICE, "port": port},
            "caBundle": base64.b64encode(ca_pem).decode(),
            "insecureSkipTLSVerify": False,
            "groupPriorityMinimum": 100,
            "versionPriority": 100,
        },
    }


def available(obj: dict[str, Any] | None) -> bool:
    """Whether an APIService (as read from the API server) has condition Available=True."""
    conds = ((obj or {}).get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Available" and c.get("status") == "True" for c in conds)
