"""metrics-server's command line and the objects that register it: verified TLS, least privilege, wiring."""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

from gpufed.localenv import metricsserver


def _args() -> list[str]:
    return metricsserver.args(
        Path("/bin/metrics-server"),
        port=17007,
        kubeconfig=Path("/s/metrics-server.kubeconfig"),
        ca_cert=Path("/s/pki/ca.crt"),
        client_cert=Path("/s/pki/metrics-server.crt"),
        client_key=Path("/s/pki/metrics-server.key"),
        serving_cert=Path("/s/pki/metrics-server-serving.crt"),
        serving_key=Path("/s/pki/metrics-server-serving.key"),
    )


def _flags(args: list[str]) -> dict[str, str]:
    return dict(a.removeprefix("--").partition("=")[::2] for a in args[1:])


def test_kubelets_are_scraped_at_their_status_port_and_verified_against_the_cluster_ca() -> None:
    args = _args()
    assert args[0] == "/bin/metrics-server"
    flags = _flags(args)
    assert flags["kubelet-preferred-address-types"] == "InternalIP"
    assert "kubelet-use-node-status-port" in flags
    assert flags["kubelet-certificate-authority"] == "/s/pki/ca.crt"
    assert not any("insecure" in a for a in args), args
    # Its own identity towards the kubelets too, which authorise nodes/metrics with a SubjectAccessReview.
    assert flags["kubelet-client-certificate"] == "/s/pki/metrics-server.crt"
    assert flags["kubelet-client-key"] == "/s/pki/metrics-server.key"


def test_serves_on_loopback_with_its_ca_signed_certificate_and_one_identity() -> None:
    flags = _flags(_args())
    assert (flags["bind-address"], flags["secure-port"]) == ("127.0.0.1", "17007")
    assert flags["tls-cert-file"] == "/s/pki/metrics-server-serving.crt"
    assert flags["tls-private-key-file"] == "/s/pki/metrics-server-serving.key"
    kc = "/s/metrics-server.kubeconfig"
    assert flags["kubeconfig"] == flags["authentication-kubeconfig"] == flags["authorization-kubeconfig"] == kc


def test_resolution_is_short_and_valid_for_metrics_server() -> None:
    flags = _flags(_args())
    resolution = int(flags["metric-resolution"].removesuffix("s"))
    timeout = int(flags["kubelet-request-timeout"].removesuffix("s"))
    assert resolution == 10, "metrics-server's minimum: tests wait one to two of these"
    assert timeout < resolution * 0.9, "metrics-server refuses a timeout of 90 % of the resolution or more"


def _by_kind(docs: list[dict[str, Any]]) -> dict[tuple[str, str], dict[str, Any]]:
    return {(d["kind"], d["metadata"]["name"]): d for d in docs}


def test_rbac_is_least_privilege_for_one_user() -> None:
    docs = _by_kind(metricsserver.rbac())
    role = docs[("ClusterRole", "system:metrics-server")]
    assert role["rules"] == [
        {"apiGroups": [""], "resources": ["nodes/metrics", "nodes/stats"], "verbs": ["get"]},
        {"apiGroups": [""], "resources": ["nodes", "pods"], "verbs": ["get", "list", "watch"]},
    ]
    bound = {
        (d["kind"], d["roleRef"]["kind"], d["roleRef"]["name"], d["metadata"].get("namespace"))
        for d in docs.values()
        if "roleRef" in d
    }
    assert bound == {
        ("ClusterRoleBinding", "ClusterRole", "system:metrics-server", None),
        ("ClusterRoleBinding", "ClusterRole", "system:auth-delegator", None),
        ("RoleBinding", "Role", "extension-apiserver-authentication-reader", "kube-system"),
    }
    for d in docs.values():
        if "subjects" in d:
            assert d["subjects"] == [
                {"kind": "User", "apiGroup": "rbac.authorization.k8s.io", "name": "system:metrics-server"}
            ]
    reader = docs[("ClusterRole", "system:aggregated-metrics-reader")]
    assert reader["rules"] == [
        {"apiGroups": ["metrics.k8s.io"], "resources": ["pods", "nodes"], "verbs": ["get", "list", "watch"]}
    ]
    assert reader["metadata"]["labels"]["rbac.authorization.k8s.io/aggregate-to-view"] == "true"


def test_apiservice_points_at_an_external_name_service_the_aggregator_resolves() -> None:
    svc = metricsserver.service(17007)
    assert (svc["metadata"]["namespace"], svc["metadata"]["name"]) == ("kube-system", "metrics-server")
    assert svc["spec"]["type"] == "ExternalName"
    assert svc["spec"]["externalName"] == "127.0.0.1"
    ca = b"-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n"
    api = metricsserver.apiservice(17007, ca)
    assert api["metadata"]["name"] == "v1beta1.metrics.k8s.io"
    spec = api["spec"]
    assert (spec["group"], spec["version"]) == ("metrics.k8s.io", "v1beta1")
    assert spec["service"] == {"namespace": "kube-system", "name": "metrics-server", "port": 17007}
    assert base64.b64decode(spec["caBundle"]) == ca
    assert spec["insecureSkipTLSVerify"] is False
    assert metricsserver.SERVICE_DNS == "metrics-server.kube-system.svc"


def test_available_reads_the_condition() -> None:
    def obj(*conds: tuple[str, str]) -> dict[str, Any]:
        return {"status": {"conditions": [{"type": t, "status": s} for t, s in conds]}}

    assert metricsserver.available(obj(("Available", "True")))
    assert not metricsserver.available(obj(("Available", "False")))
    assert not metricsserver.available(obj())
    assert not metricsserver.available({})
    assert not metricsserver.available(None)
