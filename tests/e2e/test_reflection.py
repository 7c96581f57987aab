"""Reflection on the real local clusters: ConfigMaps, Secrets, Services, EndpointSlices and Ingresses
of an offloaded consumer namespace appear in its twin namespace on gpu-a (and follow updates and
deletions, with drift reverted), policies are respected, collisions are reported, a Service in the
consumer lists offloaded pods' addresses, and offloaded pods get consumer-issued tokens.

Every check uses kubectl as a user would, on both clusters. The module peers with gpu-a only; each
test offloads its own fresh namespace (strategy LocalAndRemote unless it says otherwise).
"""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import Iterator
from ipaddress import IPv4Address, IPv4Network
from typing import Any

import pytest
import yaml

from gpufed.apis.wire import ClusterID
from gpufed.kube import rest
from gpufed.kube.client import client_from_dict
from tests.e2e.conftest import Clusters
from tests.e2e.helpers import deployment, eventually, gpufed, offload, out, peered_session
from vkprovider.forge.meta import Target
from vkprovider.remote.tokens import PodTokens, TokenSettings

pytestmark = pytest.mark.e2e

SMALL = {"cpu": "10m", "memory": "16Mi"}


@pytest.fixture(scope="module")
def ids(clusters: Clusters) -> Iterator[dict[str, ClusterID]]:
    yield from peered_session(clusters, {"gpu-a": ("--gpus", "8")})


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


def events_about(clusters: Clusters, namespace: str, name: str, reason: str) -> list[dict[str, Any]]:
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

    # A pod that needs a skipped ConfigMap is refused, saying why.
    clusters.create(
        "consumer",
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "needs-private", "namespace": namespace},
            "spec": {
                "nodeSelector": {"gpufed.io/type": "virtual-node"},
                "containers": [
                    {
                        "name": "main",
                        "image": "x",
                        "resources": {"requests": SMALL},
                        "envFrom": [{"configMapRef": {"name": "private"}}],
                    }
                ],
            },
        },
    )
    refused = eventually(
        "refusal Event", lambda: events_about(clusters, namespace, "needs-private", "ReferenceNotReflected")
    )
    assert "private" in refused[0]["message"] and "skip-reflection" in refused[0]["message"]
    assert remote(clusters, ids, namespace, "pod", "needs-private") is None


def test_unowned_object_on_the_provider_is_left_alone_and_reported(
    clusters: Clusters, ids: dict[str, ClusterID], namespace: str
) -> None:
    offload(clusters, namespace)
    theirs = config_map(twin(ids, namespace), "shared", {"owner": "provider-admin"})
    apply(clusters, "gpu-a", theirs)
    apply(clusters, "consumer", config_map(namespace, "shared", {"owner": "consumer"}))
    events = eventually(
        "collision reported", lambda: events_about(clusters, namespace, "shared", "ReflectionCollision")
    )
    assert "not created by gpufed" in events[0]["message"]
    obj = remote(clusters, ids, namespace, "configmap", "shared")
    assert obj is not None and obj["data"] == {"owner": "provider-admin"}
    assert "gpufed.io/origin-cluster-id" not in (obj["metadata"].get("labels") or {})


def test_status_event_on_the_namespace_offloading(
    clusters: Clusters, ids: dict[str, ClusterID], namespace: str
) -> None:
    offload(clusters, namespace)
    events = eventually("Reflecting event", lambda: events_about(clusters, namespace, "offloading", "Reflecting"))
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
    apply(clusters, "consumer", deployment("web", namespace, 2, nodeSelector={"gpufed.io/type": "virtual-node"}))
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

    # Both clusters use 10.244.0.0/16, so the fabric remaps: the provider's copy lists every backend
    # as the PROVIDER reaches it — offloaded pods at their real addresses there, the consumer's own
    # pod at its address in the provider's view of the consumer (arithmetic on the RemoteNetwork).
    rn = clusters.kubectl_json("consumer", "get", "remotenetwork", "-n", "gpufed", ids["gpu-a"])["spec"]

    def moved(ip: IPv4Address, src: str, dst: str) -> str:
        return str(IPv4Network(dst).network_address + (int(ip) - int(IPv4Network(src).network_address)))

    def provider_view(ip: str) -> str:
        a = IPv4Address(ip)
        if a in IPv4Network(rn["mapped"]["podCidr"]):
            return moved(a, rn["mapped"]["podCidr"], rn["real"]["podCidr"])
        return moved(a, "10.244.0.0/16", rn["peerView"]["podCidr"])

    def converged(count: int) -> set[str] | None:
        ips = pod_ips()
        if ips is None or len(ips) != count:
            return None
        want = set(ips.values())
        local, remote_ = _addresses(slices("consumer", namespace)), _addresses(slices("gpu-a", twin(ids, namespace)))
        return want if local == want and remote_ == {provider_view(i) for i in want} else None

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
    # gpu-a admits a tenant's Ingresses only for the hosts its Tenant policy lists.
    allow_hosts = {"spec": {"policy": {"ingressHosts": ["web.example.com"]}}}
    clusters.kubectl("gpu-a", "patch", "tenant", ids["consumer"], "--type=merge", "-p", json.dumps(allow_hosts))
    try:
        offload(clusters, namespace)
        apply(clusters, "consumer", _ingress(namespace, "web", cls))
        apply(clusters, "consumer", _ingress(namespace, "elsewhere", "no-such-class"))
        ing = eventually("Ingress on gpu-a", lambda: remote(clusters, ids, namespace, "ingress", "web"))
        assert ing["spec"]["ingressClassName"] == cls
        assert ing["spec"]["rules"][0]["host"] == "web.example.com"
        events = eventually(
            "missing class reported", lambda: events_about(clusters, namespace, "elsewhere", "IngressClassMissing")
        )
        assert "no-such-class" in events[0]["message"]
        assert remote(clusters, ids, namespace, "ingress", "elsewhere") is None
        clusters.kubectl("consumer", "delete", "ingress", "web", "-n", namespace)
        gone(clusters, ids, namespace, "ingress", "web")
    finally:
        clusters.kubectl("gpu-a", "delete", "ingressclass", cls, check=False)
        reset = {"spec": {"policy": {"ingressHosts": None}}}
        clusters.kubectl("gpu-a", "patch", "tenant", ids["consumer"], "--type=merge", "-p", json.dumps(reset))


# ---------------------------------------------------------------------------- ServiceAccount tokens


def token_review(clusters: Clusters, token: str) -> dict[str, Any]:
    review = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview", "spec": {"token": token}}
    p = clusters.kubectl("consumer", "create", "-f", "-", "-o", "json", input_text=json.dumps(review))
    status: dict[str, Any] = json.loads(p.stdout)["status"]
    return status


def _token(secret: dict[str, Any]) -> str:
    return base64.b64decode(secret["data"]["token-0"]).decode()


def test_offloaded_pod_gets_a_consumer_token_mounted_where_it_expects_it(
    clusters: Clusters, ids: dict[str, ClusterID], namespace: str
) -> None:
    offload(clusters, namespace, "--pod-strategy", "Remote")
    clusters.run_pod("consumer", namespace, "api-client", container={"resources": {"requests": SMALL}})
    local = clusters.kubectl_json("consumer", "get", "pod", "api-client", "-n", namespace)
    token_volume = next(v for v in local["spec"]["volumes"] if v["name"].startswith("kube-api-access-"))

    twin_pod = remote(clusters, ids, namespace, "pod", "api-client")
    assert twin_pod is not None
    volumes = {v["name"]: v for v in twin_pod["spec"]["volumes"]}
    sources = volumes[token_volume["name"]]["projected"]["sources"]
    paths = {i["path"]: (s["secret"]["name"], i["key"]) for s in sources if "secret" in s for i in s["secret"]["items"]}
    assert paths == {
        "token": ("gpufed-token-api-client", "token-0"),
        "ca.crt": ("gpufed-token-api-client", "ca.crt"),
        "namespace": ("gpufed-token-api-client", "namespace"),
    }
    mounts = twin_pod["spec"]["containers"][0]["volumeMounts"]
    assert {
        "name": token_volume["name"],
        "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount",
        "readOnly": True,
    } in mounts
    env = {e["name"]: e.get("value") for e in twin_pod["spec"]["containers"][0]["env"]}
    server = clusters.kubectl_json("consumer", "config", "view", "--minify", "--raw")["clusters"][0]["cluster"][
        "server"
    ]
    assert f"https://{env['KUBERNETES_SERVICE_HOST']}:{env['KUBERNETES_SERVICE_PORT']}" == server
    assert twin_pod["spec"]["automountServiceAccountToken"] is False

    secret = remote(clusters, ids, namespace, "secret", "gpufed-token-api-client")
    assert secret is not None
    assert base64.b64decode(secret["data"]["namespace"]).decode() == namespace
    ca = clusters.kubectl_json("consumer", "get", "configmap", "kube-root-ca.crt", "-n", namespace)["data"]["ca.crt"]
    assert base64.b64decode(secret["data"]["ca.crt"]).decode() == ca
    status = token_review(clusters, _token(secret))
    assert status["authenticated"] is True, status
    assert status["user"]["username"] == f"system:serviceaccount:{namespace}:default"
    assert status["user"]["extra"]["authentication.kubernetes.io/pod-name"] == ["api-client"]

    # Owned by the twin: the provider's garbage collector removes it with the twin (no delete of ours).
    assert secret["metadata"]["ownerReferences"] == [
        {"apiVersion": "v1", "kind": "Pod", "name": "api-client", "uid": twin_pod["metadata"]["uid"]}
    ]
    # The token is bound to the local pod: deleting the pod removes the Secret and voids the token.
    clusters.kubectl("consumer", "delete", "pod", "api-client", "-n", namespace, "--wait=true", timeout=90)
    gone(clusters, ids, namespace, "secret", "gpufed-token-api-client")
    # (the API server checks the bound pod through its informer cache: give it a moment)
    eventually(
        "token voided with its pod", lambda: token_review(clusters, _token(secret)).get("authenticated") is not True
    )


async def test_tokens_are_refreshed_before_expiry(
    clusters: Clusters, ids: dict[str, ClusterID], namespace: str, api: dict[str, Any]
) -> None:
    """A `PodTokens` with a tiny refresh fraction (3600 s tokens renewed after ~7 s) against the real
    clusters; its pod runs on a consumer node, so the virtual kubelet's own refresher (80 %) never
    competes for the Secret."""
    offload(clusters, namespace)
    local_node = clusters.kubectl_json("consumer", "get", "nodes", "-l", "!gpufed.io/type")["items"][0]
    clusters.create(
        "consumer",
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "bound", "namespace": namespace},
            "spec": {
                "nodeName": local_node["metadata"]["name"],
                "containers": [{"name": "main", "image": "x", "resources": {"requests": SMALL}}],
            },
        },
    )
    pod = await rest.get(api["consumer"], rest.path("v1", "pods", "bound", namespace=namespace))
    assert pod is not None
    creds = await rest.get(
        api["consumer"], rest.path("v1", "secrets", f"gpufed-remote-{ids['gpu-a']}", namespace="gpufed")
    )
    assert creds is not None
    remote_api = await client_from_dict(yaml.safe_load(base64.b64decode(creds["data"]["kubeconfig"])))
    try:
        tokens = PodTokens(
            api["consumer"],
            remote_api,
            ids["consumer"],
            TokenSettings("127.0.0.1", 443, refresh_fraction=0.002, resync_s=1.0),
        )
        twin_ns = twin(ids, namespace)
        identity = await tokens.ensure(pod, Target(ids["consumer"], "", twin_ns, ids["gpu-a"]))
        assert identity is not None and identity.secret_name == "gpufed-token-bound"
        secret = remote(clusters, ids, namespace, "secret", "gpufed-token-bound")
        assert secret is not None
        first = _token(secret)
        assert token_review(clusters, first)["authenticated"] is True

        async def refreshed() -> str:
            while True:
                got = remote(clusters, ids, namespace, "secret", "gpufed-token-bound")
                if got is not None and _token(got) != first:
                    return _token(got)
                await asyncio.sleep(0.5)

        runner = asyncio.create_task(tokens.run(lambda: [twin_ns]))
        try:
            second = await asyncio.wait_for(refreshed(), 60)
        finally:
            runner.cancel()
        status = token_review(clusters, second)
        assert status["authenticated"] is True, status
        assert status["user"]["extra"]["authentication.kubernetes.io/pod-name"] == ["bound"]
    finally:
        await remote_api.close()


def test_offloading_grants_the_virtual_kubelets_read_access_and_unoffloading_revokes_it(
    clusters: Clusters, ids: dict[str, ClusterID], namespace: str
) -> None:
    offload(clusters, namespace)
    binding = clusters.kubectl_json("consumer", "get", "rolebinding", "gpufed-reflection", "-n", namespace)
    assert binding["roleRef"]["name"] == "gpufed-virtual-kubelet-reflection"
    vk = ["--as=gpufed:virtual-kubelet"]
    assert (
        clusters.kubectl("consumer", "auth", "can-i", "list", "secrets", "-n", namespace, *vk).stdout.strip() == "yes"
    )
    # Nothing outside offloaded namespaces.
    denied = clusters.kubectl("consumer", "auth", "can-i", "list", "secrets", "-n", "kube-system", *vk, check=False)
    assert denied.stdout.strip() == "no"
    apply(clusters, "consumer", config_map(namespace, "settings", {"lr": "0.1"}))
    eventually("ConfigMap on gpu-a", lambda: remote(clusters, ids, namespace, "configmap", "settings"))

    p = gpufed("unoffload-namespace", namespace, "--kubeconfig", str(clusters.kubeconfig), "--context", "consumer")
    assert p.returncode == 0, out(p)
    # The twin namespace (with every copy in it) is gone, and so is the virtual kubelets' access.
    eventually(
        "twin namespace deleted",
        lambda: "NotFound" in clusters.kubectl("gpu-a", "get", "namespace", twin(ids, namespace), check=False).stderr,
    )
    assert clusters.kubectl(
        "consumer", "get", "rolebinding", "gpufed-reflection", "-n", namespace, check=False
    ).returncode
    again = clusters.kubectl("consumer", "auth", "can-i", "list", "secrets", "-n", namespace, *vk, check=False)
    assert again.stdout.strip() == "no"
