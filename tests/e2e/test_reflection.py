"""Reflection on the real local clusters: ConfigMaps, Secrets, Services, EndpointSlices and Ingresses
of an offloaded consumer namespace appear in its twin namespace on gpu-a (and follow updates and
deletions, with drift reverted), policies are respected, collisions are reported, a Service in the
consumer lists offloaded pods' addresses, and offloaded pods get consumer-issued tokens.

Every check uses kubectl as a user would, on both clusters. The module peers with gpu-a only; each
test offloads its own fresh namespace (strategy LocalAndRemote unless it says otherwise).
"""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from typing import Any

import pytest

from peering.ids import ClusterID
from tests.e2e.conftest import Clusters
from tests.e2e.helpers import eventually, gpufed, out, peered_session

pytestmark = pytest.mark.e2e

SMALL = {"cpu": "10m", "memory": "16Mi"}


@pytest.fixture(scope="module")
def ids(clusters: Clusters) -> Iterator[dict[str, ClusterID]]:
    yield from peered_session(clusters, {"gpu-a": ("--gpus", "8")})


def offload(clusters: Clusters, namespace: str, *flags: str) -> None:
    p = gpufed(
        "offload-namespace", namespace, "--kubeconfig", str(clusters.kubeconfig), "--context", "consumer", *flags
    )
    assert p.returncode == 0, out(p)


def twin(ids: dict[str, ClusterID], namespace: str) -> str:
    return f"{namespace}-{ids['consumer']}"


def remote(
    clusters: Clusters, ids: dict[str, ClusterID], namespace: str, kind: str, name: str
) -> dict[str, Any] | None:
    p = clusters.kubectl("gpu-a", "get", kind, name, "-n", twin(ids, namespace), "-o", "json", check=False)
    if p.returncode:
        assert "NotFound" in p.stderr, p.stderr
        return None
    obj: dict[str, Any] = json.loads(p.stdout)
    return obj


def gone(clusters: Clusters, ids: dict[str, ClusterID], namespace: str, kind: str, name: str) -> None:
    eventually(f"{kind} {name} gone from gpu-a", lambda: remote(clusters, ids, namespace, kind, name) is None)


def apply(clusters: Clusters, context: str, obj: dict[str, Any]) -> None:
    clusters.kubectl(context, "apply", "-f", "-", input_text=json.dumps(obj))


def config_map(namespace: str, name: str, data: dict[str, str], **annotations: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": name, "namespace": namespace, "annotations": annotations},
        "data": data,
    }


def warnings(clusters: Clusters, namespace: str, name: str, reason: str) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = clusters.kubectl_json(
        "consumer", "get", "events", "-n", namespace, "--field-selector", f"involvedObject.name={name},reason={reason}"
    )["items"]
    return items


# ---------------------------------------------------------------------------- ConfigMaps and Secrets


def test_config_maps_and_secrets_follow_create_update_delete(
    clusters: Clusters, ids: dict[str, ClusterID], namespace: str
) -> None:
    offload(clusters, namespace)
    apply(clusters, "consumer", config_map(namespace, "settings", {"lr": "0.1"}))
    clusters.kubectl("consumer", "create", "secret", "generic", "creds", "-n", namespace, "--from-literal=key=s3cr3t")

    cm = eventually("ConfigMap on gpu-a", lambda: remote(clusters, ids, namespace, "configmap", "settings"))
    assert cm["data"] == {"lr": "0.1"}
    assert cm["metadata"]["labels"]["gpufed.io/origin-cluster-id"] == ids["consumer"]
    secret = eventually("Secret on gpu-a", lambda: remote(clusters, ids, namespace, "secret", "creds"))
    assert base64.b64decode(secret["data"]["key"]) == b"s3cr3t"

    apply(clusters, "consumer", config_map(namespace, "settings", {"lr": "0.2", "epochs": "3"}))
    eventually(
        "update on gpu-a",
        lambda: (
            (remote(clusters, ids, namespace, "configmap", "settings") or {}).get("data")
            == {"lr": "0.2", "epochs": "3"}
        ),
    )

    clusters.kubectl("consumer", "delete", "configmap", "settings", "-n", namespace)
    clusters.kubectl("consumer", "delete", "secret", "creds", "-n", namespace)
    gone(clusters, ids, namespace, "configmap", "settings")
    gone(clusters, ids, namespace, "secret", "creds")
    # The provider's own CA ConfigMap in the twin namespace is the provider's, never overwritten.
    root_ca = remote(clusters, ids, namespace, "configmap", "kube-root-ca.crt")
    assert root_ca is not None and "gpufed.io/origin-cluster-id" not in (root_ca["metadata"].get("labels") or {})


def test_remote_drift_is_reverted(clusters: Clusters, ids: dict[str, ClusterID], namespace: str) -> None:
    offload(clusters, namespace)
    apply(clusters, "consumer", config_map(namespace, "settings", {"lr": "0.1"}))
    eventually("ConfigMap on gpu-a", lambda: remote(clusters, ids, namespace, "configmap", "settings"))
    clusters.kubectl(
        "gpu-a",
        "patch",
        "configmap",
        "settings",
        "-n",
        twin(ids, namespace),
        "--type=merge",
        "-p",
        json.dumps({"data": {"lr": "9.9"}}),
    )
    eventually(
        "drift reverted",
        lambda: (remote(clusters, ids, namespace, "configmap", "settings") or {}).get("data") == {"lr": "0.1"},
    )
    clusters.kubectl("gpu-a", "delete", "configmap", "settings", "-n", twin(ids, namespace))
    eventually("deleted copy recreated", lambda: remote(clusters, ids, namespace, "configmap", "settings"))


def test_skip_and_allow_annotations(clusters: Clusters, ids: dict[str, ClusterID], namespace: str) -> None:
    offload(clusters, namespace)
    apply(clusters, "consumer", config_map(namespace, "private", {"a": "1"}, **{"gpufed.io/skip-reflection": "true"}))
    apply(clusters, "consumer", config_map(namespace, "plain", {"a": "1"}))
    apply(clusters, "consumer", config_map(namespace, "chosen", {"a": "1"}, **{"gpufed.io/allow-reflection": "true"}))
    eventually("plain reflected", lambda: remote(clusters, ids, namespace, "configmap", "plain"))
    eventually("chosen reflected", lambda: remote(clusters, ids, namespace, "configmap", "chosen"))
    assert remote(clusters, ids, namespace, "configmap", "private") is None

    # Skipping a reflected object removes its copy.
    clusters.kubectl("consumer", "annotate", "configmap", "plain", "-n", namespace, "gpufed.io/skip-reflection=true")
    gone(clusters, ids, namespace, "configmap", "plain")
    clusters.kubectl("consumer", "annotate", "configmap", "plain", "-n", namespace, "gpufed.io/skip-reflection-")
    eventually("plain back", lambda: remote(clusters, ids, namespace, "configmap", "plain"))

    # Allow-list mode: only annotated objects stay.
    clusters.kubectl("consumer", "annotate", "namespace", namespace, "gpufed.io/allow-reflection=true")
    gone(clusters, ids, namespace, "configmap", "plain")
    assert remote(clusters, ids, namespace, "configmap", "chosen") is not None
    assert remote(clusters, ids, namespace, "configmap", "private") is None
    clusters.kubectl("consumer", "annotate", "namespace", namespace, "gpufed.io/allow-reflection-")
    eventually("plain back after allow-list mode", lambda: remote(clusters, ids, namespace, "configmap", "plain"))
    assert remote(clusters, ids, namespace, "configmap", "private") is None


def test_unowned_object_on_the_provider_is_left_alone_and_reported(
    clusters: Clusters, ids: dict[str, ClusterID], namespace: str
) -> None:
    offload(clusters, namespace)
    theirs = config_map(twin(ids, namespace), "shared", {"owner": "provider-admin"})
    apply(clusters, "gpu-a", theirs)
    apply(clusters, "consumer", config_map(namespace, "shared", {"owner": "consumer"}))
    events = eventually("collision reported", lambda: warnings(clusters, namespace, "shared", "ReflectionCollision"))
    assert "not created by gpufed" in events[0]["message"]
    obj = remote(clusters, ids, namespace, "configmap", "shared")
    assert obj is not None and obj["data"] == {"owner": "provider-admin"}
    assert "gpufed.io/origin-cluster-id" not in (obj["metadata"].get("labels") or {})


def test_status_event_on_the_namespace_offloading(
    clusters: Clusters, ids: dict[str, ClusterID], namespace: str
) -> None:
    offload(clusters, namespace)
    events = eventually("Reflecting event", lambda: warnings(clusters, namespace, "offloading", "Reflecting"))
    assert f"reflecting into {twin(ids, namespace)} on {ids['gpu-a']}" in events[0]["message"]


# ---------------------------------------------------------------------------- Services, EndpointSlices


def _service(namespace: str, name: str, kind: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"type": kind, "selector": {"app": "web"}, "ports": [{"name": "http", "port": 80, "targetPort": 8080}]},
    }


def test_services_are_cluster_ip_without_selector_on_the_provider(
    clusters: Clusters, ids: dict[str, ClusterID], namespace: str
) -> None:
    offload(clusters, namespace)
    apply(clusters, "consumer", _service(namespace, "web-np", "NodePort"))
    svc = eventually("Service on gpu-a", lambda: remote(clusters, ids, namespace, "service", "web-np"))
    assert svc["spec"]["type"] == "ClusterIP"
    assert "selector" not in svc["spec"]
    assert [(p["port"], p.get("nodePort")) for p in svc["spec"]["ports"]] == [(80, None)]
    clusters.kubectl("consumer", "delete", "service", "web-np", "-n", namespace)
    gone(clusters, ids, namespace, "service", "web-np")


def _addresses(slices: list[dict[str, Any]]) -> set[str]:
    return {a for s in slices for e in s.get("endpoints") or [] for a in e.get("addresses") or []}


def test_service_endpoints_include_offloaded_pods_and_follow_scaling(
    clusters: Clusters, ids: dict[str, ClusterID], namespace: str
) -> None:
    offload(clusters, namespace)
    apply(clusters, "consumer", _service(namespace, "web", "ClusterIP"))
    virtual = {"gpufed.io/type": "virtual-node"}
    apply(
        clusters,
        "consumer",
        {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": "web", "namespace": namespace},
            "spec": {
                "replicas": 2,
                "selector": {"matchLabels": {"app": "web"}},
                "template": {
                    "metadata": {"labels": {"app": "web"}},
                    "spec": {
                        "nodeSelector": virtual,
                        "containers": [{"name": "main", "image": "nginx:1.27", "resources": {"requests": SMALL}}],
                    },
                },
            },
        },
    )
    # One consumer-local backend beside them.
    clusters.create(
        "consumer",
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "web-local", "namespace": namespace, "labels": {"app": "web"}},
            "spec": {
                "affinity": {
                    "nodeAffinity": {
                        "requiredDuringSchedulingIgnoredDuringExecution": {
                            "nodeSelectorTerms": [
                                {"matchExpressions": [{"key": "gpufed.io/type", "operator": "DoesNotExist"}]}
                            ]
                        }
                    }
                },
                "containers": [{"name": "main", "image": "nginx:1.27", "resources": {"requests": SMALL}}],
            },
        },
    )

    def pod_ips() -> dict[str, str] | None:
        items = clusters.kubectl_json("consumer", "get", "pods", "-n", namespace, "-l", "app=web")["items"]
        ips = {p["metadata"]["name"]: p["status"].get("podIP") for p in items if p["status"].get("phase") == "Running"}
        return ips if len(ips) == len(items) and all(ips.values()) else None

    def slices(context: str, ns: str) -> list[dict[str, Any]]:
        got: list[dict[str, Any]] = clusters.kubectl_json(
            context, "get", "endpointslices", "-n", ns, "-l", "kubernetes.io/service-name=web"
        )["items"]
        return got

    def converged(count: int) -> set[str] | None:
        ips = pod_ips()
        if ips is None or len(ips) != count:
            return None
        want = set(ips.values())
        local, remote_ = _addresses(slices("consumer", namespace)), _addresses(slices("gpu-a", twin(ids, namespace)))
        return want if local == want and remote_ == want else None

    ips = eventually("3 backends in both clusters' EndpointSlices", lambda: converged(3), timeout=90)
    nodes = {p["spec"]["nodeName"] for p in clusters.kubectl_json("consumer", "get", "pods", "-n", namespace)["items"]}
    assert f"gpufed-{ids['gpu-a']}" in nodes and len(nodes) == 2, nodes
    remote_slice = slices("gpu-a", twin(ids, namespace))[0]
    assert remote_slice["metadata"]["labels"]["endpointslice.kubernetes.io/managed-by"] == "reflection.gpufed.io"

    clusters.kubectl("consumer", "scale", "deployment", "web", "-n", namespace, "--replicas=4")
    bigger = eventually("5 backends after scaling up", lambda: converged(5), timeout=90)
    assert ips < bigger
    clusters.kubectl("consumer", "scale", "deployment", "web", "-n", namespace, "--replicas=1")
    eventually("2 backends after scaling down", lambda: converged(2), timeout=90)


# ---------------------------------------------------------------------------- Ingress


def _ingress(namespace: str, name: str, cls: str) -> dict[str, Any]:
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "Ingress",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "ingressClassName": cls,
            "rules": [
                {
                    "host": "web.example.com",
                    "http": {
                        "paths": [
                            {
                                "path": "/",
                                "pathType": "Prefix",
                                "backend": {"service": {"name": "web", "port": {"number": 80}}},
                            }
                        ]
                    },
                }
            ],
        },
    }


def test_ingress_reflected_only_where_the_provider_has_its_class(
    clusters: Clusters, ids: dict[str, ClusterID], namespace: str
) -> None:
    cls = f"nginx-{namespace[-6:]}"
    apply(
        clusters,
        "gpu-a",
        {
            "apiVersion": "networking.k8s.io/v1",
            "kind": "IngressClass",
            "metadata": {"name": cls},
            "spec": {"controller": "example.com/ingress"},
        },
    )
    try:
        offload(clusters, namespace)
        apply(clusters, "consumer", _ingress(namespace, "web", cls))
        apply(clusters, "consumer", _ingress(namespace, "elsewhere", "no-such-class"))
        ing = eventually("Ingress on gpu-a", lambda: remote(clusters, ids, namespace, "ingress", "web"))
        assert ing["spec"]["ingressClassName"] == cls
        assert ing["spec"]["rules"][0]["host"] == "web.example.com"
        events = eventually(
            "missing class reported", lambda: warnings(clusters, namespace, "elsewhere", "IngressClassMissing")
        )
        assert "no-such-class" in events[0]["message"]
        assert remote(clusters, ids, namespace, "ingress", "elsewhere") is None
        clusters.kubectl("consumer", "delete", "ingress", "web", "-n", namespace)
        gone(clusters, ids, namespace, "ingress", "web")
    finally:
        clusters.kubectl("gpu-a", "delete", "ingressclass", cls, check=False)
