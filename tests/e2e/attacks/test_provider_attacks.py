"""Attacks from the PROVIDER position on the real local clusters: gpu-a's admin (its kubeconfig
context) controls gpu-a's API server, everything stored there and its gpufed controller, and tries
to get more from the consumer than it was given.

Each test is one attack; it asserts the refusal, the Event the consumer records where a user sees
it, and that nothing leaked within a bounded wait (no Secret or ConfigMap copied, no token issued,
no address taken over, nothing read outside the pod's namespace). The module peers the consumer
with gpu-a and gpu-b for its duration; each test uses its own namespace.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import os
import signal
import time
from collections.abc import Iterator
from ipaddress import IPv4Address
from typing import Any

import pytest

from gpufed.apis.network import NETWORK_CONFIG, NetworkConfigSpec, RemoteNetworkSpec
from gpufed.apis.wire import ClusterID
from netfabric.plan import remapper
from tests.e2e.conftest import Clusters
from tests.e2e.helpers import eventually, offload, peered_session, vk_log_lines

pytestmark = pytest.mark.e2e

SMALL = {"cpu": "10m", "memory": "16Mi"}
#: Seconds an attack is given to leak something before the test says it did not.
LEAK_WAIT_S = 20.0
#: The token refresher watches the token Secrets, and lists them every 60 s should a watch miss one:
#: a planted one is seen within this, whichever way.
TOKEN_RESYNC_WAIT_S = 90.0
#: What the virtual kubelet's refusal log line says when a watch event, not a listing, brought the Secret.
WATCHED = '"found_by": "watch"'
FOREIGN_AUDIENCE = "sts.amazonaws.com"
TEN_YEARS_S = 10 * 365 * 24 * 3600


@pytest.fixture(scope="module")
def ids(clusters: Clusters) -> Iterator[dict[str, ClusterID]]:
    yield from peered_session(clusters, {"gpu-a": ("--gpus", "8"), "gpu-b": ("--gpus", "8")})


# ---------------------------------------------------------------------------- helpers


def twin_ns(ids: dict[str, ClusterID], namespace: str) -> str:
    return f"{namespace}-{ids['consumer']}"


def tenant(ids: dict[str, ClusterID]) -> str:
    return f"gpufed-tenant-{ids['consumer']}"


def get(clusters: Clusters, context: str, *args: str) -> dict[str, Any] | None:
    p = clusters.kubectl(context, "get", *args, "-o", "json", check=False)
    if p.returncode:
        assert "NotFound" in p.stderr, p.stderr
        return None
    found: dict[str, Any] = json.loads(p.stdout)
    return found


def events(clusters: Clusters, namespace: str, reason: str, name: str = "") -> list[dict[str, Any]]:
    selector = f"reason={reason}" + (f",involvedObject.name={name}" if name else "")
    items: list[dict[str, Any]] = clusters.kubectl_json(
        "consumer", "get", "events", "-n", namespace, "--field-selector", selector
    )["items"]
    return items


def never(what: str, probe: Any, seconds: float = LEAK_WAIT_S) -> None:
    """`probe()` stays falsy for `seconds` (what leaked is in the message)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        got = probe()
        assert not got, f"{what}: {got!r}"
        time.sleep(0.5)


def apply(clusters: Clusters, context: str, obj: dict[str, Any]) -> None:
    clusters.kubectl(context, "apply", "-f", "-", input_text=json.dumps(obj))


def claim(clusters: Clusters, ids: dict[str, ClusterID], namespace: str) -> str:
    """gpu-a writes a TwinNamespace for `namespace` into the consumer's tenant namespace (named so
    the consumer's own requests never collide with it); gpu-a's controller makes it Ready."""
    name = f"claim-{namespace}"[:63]
    apply(
        clusters,
        "gpu-a",
        {
            "apiVersion": "gpufed.io/v1alpha1",
            "kind": "TwinNamespace",
            "metadata": {"name": name, "namespace": tenant(ids)},
            "spec": {"namespace": namespace},
        },
    )

    def ready() -> bool:
        obj = get(clusters, "gpu-a", "twinnamespace", name, "-n", tenant(ids))
        return bool(obj and (obj.get("status") or {}).get("phase") == "Ready")

    eventually(f"gpu-a's TwinNamespace {name} Ready", ready, timeout=60)
    return name


def drop_claim(clusters: Clusters, ids: dict[str, ClusterID], name: str) -> None:
    clusters.kubectl("gpu-a", "delete", "twinnamespace", name, "-n", tenant(ids), "--wait=false", check=False)


def offloaded_pod(clusters: Clusters, ids: dict[str, ClusterID], namespace: str, name: str = "app") -> dict[str, Any]:
    """`namespace` offloaded to gpu-a only; a running pod there (with the default token volume)."""
    offload(
        clusters, namespace, "--pod-strategy", "Remote", "--selector", f"gpufed.io/remote-cluster-id={ids['gpu-a']}"
    )
    clusters.run_pod("consumer", namespace, name, container={"resources": {"requests": SMALL}})
    pod: dict[str, Any] = clusters.kubectl_json("consumer", "get", "pod", name, "-n", namespace)
    assert pod["spec"]["nodeName"].startswith(f"gpufed-{ids['gpu-a']}"), pod["spec"]["nodeName"]
    eventually("the twin on gpu-a", lambda: get(clusters, "gpu-a", "pod", name, "-n", twin_ns(ids, namespace)))
    return pod


def component_pid(clusters: Clusters, cluster: str, name: str) -> int:
    statuses = {s.name: s for s in asyncio.run(clusters.env.status())}
    pid = next(c.pid for c in statuses[cluster].components if c.name == name)
    assert pid is not None, f"{name} of {cluster} is not running"
    return int(pid)


@contextlib.contextmanager
def provider_controller_paused(clusters: Clusters) -> Iterator[None]:
    """gpu-a's gpufed controller stopped (SIGSTOP): what gpu-a's admin writes stays as written, as
    with a provider running its own, modified controller. Resumed (SIGCONT) whatever happens."""
    pid = component_pid(clusters, "gpu-a", "gpufed-controller")
    os.kill(pid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.kill(pid, signal.SIGCONT)


def virtual_nodes(clusters: Clusters, ids: dict[str, ClusterID], provider: str) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = clusters.kubectl_json(
        "consumer", "get", "nodes", "-l", f"gpufed.io/remote-cluster-id={ids[provider]}"
    )["items"]
    return items


def token_secret(namespace: str, name: str, pod: dict[str, Any], **annotations: str) -> dict[str, Any]:
    """A token Secret as gpu-a can write it: gpufed's labels for `pod`, annotations asking for a
    foreign audience with a ten-year lifetime, long due for a refresh."""
    sources = [{"key": "token-0", "audience": FOREIGN_AUDIENCE, "expirationSeconds": TEN_YEARS_S}]
    notes = {
        "gpufed.io/token-pod": pod["metadata"]["name"],
        "gpufed.io/token-namespace": pod["metadata"]["namespace"],
        "gpufed.io/token-service-account": "default",
        "gpufed.io/token-sources": json.dumps(sources),
        "gpufed.io/token-issued-at": "2020-01-01T00:00:00Z",
        "gpufed.io/token-expires-at": "2030-01-01T00:00:00Z",
        **annotations,
    }
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "type": "Opaque",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": {
                "gpufed.io/origin-cluster-id": pod["metadata"]["labels"]["gpufed.io/origin-cluster-id"],
                "gpufed.io/origin-uid": pod["metadata"]["uid"],
                "app.kubernetes.io/managed-by": "gpufed",
                "gpufed.io/token-for-pod": pod["metadata"]["name"],
            },
            "annotations": notes,
        },
        "data": {"token-0": ""},
    }


def patch_twin_ip(clusters: Clusters, ids: dict[str, ClusterID], namespace: str, name: str, ip: str) -> None:
    patch = {"status": {"podIP": ip, "podIPs": [{"ip": ip}]}}
    clusters.kubectl(
        "gpu-a",
        "patch",
        "pod",
        name,
        "-n",
        twin_ns(ids, namespace),
        "--subresource=status",
        "--type=merge",
        "-p",
        json.dumps(patch),
    )


# ---------------------------------------------------------------------------- TwinNamespaces


def test_provider_claims_a_namespace_offloaded_only_to_another_provider(
    clusters: Clusters, ids: dict[str, ClusterID], namespace: str
) -> None:
    offload(clusters, namespace, "--selector", f"gpufed.io/remote-cluster-id={ids['gpu-b']}")
    clusters.kubectl("consumer", "create", "secret", "generic", "db-password", "-n", namespace, "--from-literal=p=s3")
    clusters.kubectl("consumer", "create", "configmap", "settings", "-n", namespace, "--from-literal=lr=0.1")
    # Reflection works where the consumer offloaded the namespace: the wait below means something.
    eventually(
        "the Secret on gpu-b", lambda: get(clusters, "gpu-b", "secret", "db-password", "-n", twin_ns(ids, namespace))
    )
    name = claim(clusters, ids, namespace)
    try:
        never(
            "a consumer object reached gpu-a",
            lambda: [
                kind
                for kind, obj in (("secret", "db-password"), ("configmap", "settings"))
                if get(clusters, "gpu-a", kind, obj, "-n", twin_ns(ids, namespace))
            ],
        )
        refused = eventually(
            "the refusal on the NamespaceOffloading",
            lambda: events(clusters, namespace, "TwinNamespaceRefused", "offloading"),
        )
        assert ids["gpu-a"] in refused[0]["message"] and refused[0]["type"] == "Warning"
    finally:
        drop_claim(clusters, ids, name)


def test_provider_claims_a_namespace_never_offloaded(
    clusters: Clusters, ids: dict[str, ClusterID], namespace: str
) -> None:
    clusters.kubectl("consumer", "create", "secret", "generic", "db-password", "-n", namespace, "--from-literal=p=s3")
    name = claim(clusters, ids, namespace)
    try:
        never(
            "a consumer Secret reached gpu-a",
            lambda: get(clusters, "gpu-a", "secret", "db-password", "-n", twin_ns(ids, namespace)),
        )

        def on_foreign_cluster() -> list[dict[str, Any]]:
            return [
                e
                for e in events(clusters, "default", "TwinNamespaceRefused", ids["gpu-a"])
                if namespace in e["message"]
            ]

        refused = eventually("the refusal on gpu-a's ForeignCluster", on_foreign_cluster)
        assert refused[0]["involvedObject"]["kind"] == "ForeignCluster"
        assert "not offloaded" in refused[0]["message"]
        binding = clusters.kubectl("consumer", "get", "rolebinding", "gpufed-reflection", "-n", namespace, check=False)
        assert binding.returncode != 0, "a namespace offloaded nowhere grants the virtual kubelets nothing"
    finally:
        drop_claim(clusters, ids, name)


# ---------------------------------------------------------------------------- node labels


def _claim_labels(clusters: Clusters, ids: dict[str, ClusterID], labels: dict[str, str]) -> None:
    """gpu-a's admin rewrites the nodeLabels of its grant (every slice mirror in the tenant namespace);
    the consumer mirrors them into its own ResourceSlices."""
    slices = clusters.kubectl_json("gpu-a", "get", "resourceslices.gpufed.io", "-n", tenant(ids))["items"]
    assert slices, "no ResourceSlice mirror on gpu-a"
    for s in slices:
        merged = {**((s.get("status") or {}).get("nodeLabels") or {}), **labels}
        clusters.kubectl(
            "gpu-a",
            "patch",
            "resourceslices.gpufed.io",
            s["metadata"]["name"],
            "-n",
            tenant(ids),
            "--subresource=status",
            "--type=merge",
            "-p",
            json.dumps({"status": {"nodeLabels": merged}}),
        )

    def arrived() -> bool:
        local = clusters.kubectl_json("consumer", "get", "resourceslices.gpufed.io", "-n", "gpufed")["items"]
        return any(
            all(((s.get("status") or {}).get("nodeLabels") or {}).get(k) == v for k, v in labels.items())
            for s in local
            if s["spec"].get("providerClusterId") == ids["gpu-a"]
        )

    eventually("the claimed labels in the consumer's ResourceSlice", arrived, timeout=60)


def _assert_labels_refused(clusters: Clusters, ids: dict[str, ClusterID], labels: dict[str, str]) -> None:
    never(
        "a claimed label on gpu-a's virtual node",
        lambda: [
            (n["metadata"]["name"], k)
            for n in virtual_nodes(clusters, ids, "gpu-a")
            for k, v in labels.items()
            if (n["metadata"].get("labels") or {}).get(k) == v
        ],
    )
    dropped = eventually(
        "the NodeLabelsDropped Event on gpu-a's ForeignCluster",
        lambda: [
            e
            for e in events(clusters, "default", "NodeLabelsDropped", ids["gpu-a"])
            if all(f"{k}={v}" in e["message"] for k, v in labels.items())
        ],
    )
    assert dropped[0]["type"] == "Warning"


def test_provider_claims_a_region_by_node_label(clusters: Clusters, ids: dict[str, ClusterID]) -> None:
    labels = {"topology.kubernetes.io/region": "eu-attack"}
    with provider_controller_paused(clusters):
        _claim_labels(clusters, ids, labels)
        _assert_labels_refused(clusters, ids, labels)
    # Offloading policies selecting by region never choose gpu-a.
    assert all(
        "topology.kubernetes.io/region" not in (n["metadata"].get("labels") or {})
        for n in virtual_nodes(clusters, ids, "gpu-a")
    )


def test_provider_impersonates_another_provider_by_node_label(clusters: Clusters, ids: dict[str, ClusterID]) -> None:
    labels = {"gpufed.io/remote-cluster-id": ids["gpu-b"], "node-role.kubernetes.io/control-plane": "true"}
    with provider_controller_paused(clusters):
        _claim_labels(clusters, ids, labels)
        _assert_labels_refused(clusters, ids, labels)


def test_provider_claims_larger_nodes_by_node_label(clusters: Clusters, ids: dict[str, ClusterID]) -> None:
    # gpufed.io/pod-gpus-max is computed on the consumer (the estimator's largest node, at most the
    # grant); a provider's own value for it is refused like every label of gpufed's domain.
    labels = {"gpufed.io/pod-gpus-max": "64"}
    with provider_controller_paused(clusters):
        _claim_labels(clusters, ids, labels)
        _assert_labels_refused(clusters, ids, labels)


# ---------------------------------------------------------------------------- tokens


def test_provider_plants_a_token_secret_for_a_foreign_audience(
    clusters: Clusters, ids: dict[str, ClusterID], namespace: str
) -> None:
    offloaded_pod(clusters, ids, namespace)
    twin = get(clusters, "gpu-a", "pod", "app", "-n", twin_ns(ids, namespace))
    assert twin is not None
    local = clusters.kubectl_json("consumer", "get", "pod", "app", "-n", namespace)
    local["metadata"]["labels"] = twin["metadata"]["labels"]  # what gpu-a knows: names, UID, our labels
    apply(clusters, "gpu-a", token_secret(twin_ns(ids, namespace), "gpufed-token-evil", local))
    refusals = eventually(
        "the refusal in the virtual kubelet's log",
        lambda: vk_log_lines(
            clusters, ids["gpu-a"], "token secret refused", twin_ns(ids, namespace), "gpufed-token-evil"
        ),
        timeout=TOKEN_RESYNC_WAIT_S,
    )
    assert all(WATCHED in line for line in refusals), f"not judged from the watch event: {refusals}"
    planted = get(clusters, "gpu-a", "secret", "gpufed-token-evil", "-n", twin_ns(ids, namespace))
    assert planted is not None and (planted.get("data") or {}).get("token-0", "") == "", "a token was issued"


def test_provider_edits_a_token_secret_to_a_foreign_audience(
    clusters: Clusters, ids: dict[str, ClusterID], namespace: str
) -> None:
    offloaded_pod(clusters, ids, namespace)
    secret_name = "gpufed-token-app"
    legit = eventually(
        "the pod's token Secret", lambda: get(clusters, "gpu-a", "secret", secret_name, "-n", twin_ns(ids, namespace))
    )
    local = clusters.kubectl_json("consumer", "get", "pod", "app", "-n", namespace)
    local["metadata"]["labels"] = legit["metadata"]["labels"]
    forged = token_secret(twin_ns(ids, namespace), secret_name, local)
    patch = {"metadata": {"annotations": forged["metadata"]["annotations"]}}
    clusters.kubectl(
        "gpu-a", "patch", "secret", secret_name, "-n", twin_ns(ids, namespace), "--type=merge", "-p", json.dumps(patch)
    )
    refused = eventually(
        "the TokenSecretRefused Event on the pod",
        lambda: events(clusters, namespace, "TokenSecretRefused", "app"),
        timeout=TOKEN_RESYNC_WAIT_S,
    )
    assert "the pod's own tokens are issued" in refused[0]["message"]
    tampered = vk_log_lines(clusters, ids["gpu-a"], "token secret refused", twin_ns(ids, namespace), '"Tampered"')
    assert tampered and all(WATCHED in line for line in tampered), f"not judged from the watch event: {tampered}"

    def restored() -> bool:
        got = get(clusters, "gpu-a", "secret", secret_name, "-n", twin_ns(ids, namespace)) or {}
        notes = (got.get("metadata") or {}).get("annotations") or {}
        return FOREIGN_AUDIENCE not in notes.get("gpufed.io/token-sources", FOREIGN_AUDIENCE)

    eventually("the Secret rewritten from the pod's spec", restored)
    got = get(clusters, "gpu-a", "secret", secret_name, "-n", twin_ns(ids, namespace)) or {}
    token = base64.b64decode((got.get("data") or {}).get("token-0", "")).decode()
    payload = token.split(".")[1] if token.count(".") == 2 else ""
    claims = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4))) if payload else {}
    assert FOREIGN_AUDIENCE not in json.dumps(claims.get("aud")), claims
    assert claims.get("exp", 0) - claims.get("iat", 0) <= 3600, "the lifetime is capped (and never extended)"


# ---------------------------------------------------------------------------- twin addresses


def _consumer_pod_as_gpu_a_sees_it(clusters: Clusters, ids: dict[str, ClusterID], namespace: str) -> tuple[str, str]:
    """(a consumer pod's real IP, the address gpu-a reaches it at through the fabric)."""
    node = clusters.kubectl_json("consumer", "get", "nodes", "-l", "!gpufed.io/type")["items"][0]["metadata"]["name"]
    clusters.create(
        "consumer",
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "victim", "namespace": namespace},
            "spec": {
                "nodeName": node,
                "containers": [{"name": "main", "image": "x", "resources": {"requests": SMALL}}],
            },
        },
    )
    ip = str(
        eventually(
            "the victim's IP",
            lambda: clusters.kubectl_json("consumer", "get", "pod", "victim", "-n", namespace)["status"].get("podIP"),
        )
    )
    net = clusters.kubectl_json("consumer", "get", "networkconfig", NETWORK_CONFIG, "-n", "gpufed")["spec"]
    remote = clusters.kubectl_json("consumer", "get", "remotenetwork", ids["gpu-a"], "-n", "gpufed")["spec"]
    mapping = remapper(NetworkConfigSpec.model_validate(net), RemoteNetworkSpec.model_validate(remote))
    return ip, mapping.to_remote_ip(ip)


def test_provider_reports_a_consumer_pods_address_for_its_twin(
    clusters: Clusters, ids: dict[str, ClusterID], namespace: str
) -> None:
    offloaded_pod(clusters, ids, namespace)
    victim, as_seen = _consumer_pod_as_gpu_a_sees_it(clusters, ids, namespace)
    assert IPv4Address(as_seen)
    patch_twin_ip(clusters, ids, namespace, "app", as_seen)
    refused = eventually(
        "the PodIPRefused Event on the pod", lambda: events(clusters, namespace, "PodIPRefused", "app"), timeout=60
    )
    assert as_seen in refused[0]["message"]
    never(
        "the offloaded pod took the consumer pod's address",
        lambda: (
            clusters.kubectl_json("consumer", "get", "pod", "app", "-n", namespace)["status"].get("podIP") == victim
        ),
    )


def test_provider_reports_the_consumers_api_service_address_for_its_twin(
    clusters: Clusters, ids: dict[str, ClusterID], namespace: str
) -> None:
    offloaded_pod(clusters, ids, namespace)
    api_ip = clusters.kubectl_json("consumer", "get", "service", "kubernetes", "-n", "default")["spec"]["clusterIP"]
    patch_twin_ip(clusters, ids, namespace, "app", api_ip)
    refused = eventually(
        "the PodIPRefused Event on the pod", lambda: events(clusters, namespace, "PodIPRefused", "app"), timeout=60
    )
    assert api_ip in refused[0]["message"] and "pod range" in refused[0]["message"]
    never(
        "the offloaded pod took the API server's address",
        lambda: (
            clusters.kubectl_json("consumer", "get", "pod", "app", "-n", namespace)["status"].get("podIP") == api_ip
        ),
    )


# ---------------------------------------------------------------------------- names into paths


def test_image_pull_secret_names_a_secret_outside_the_namespace(
    clusters: Clusters, ids: dict[str, ClusterID], namespace: str
) -> None:
    offload(
        clusters, namespace, "--pod-strategy", "Remote", "--selector", f"gpufed.io/remote-cluster-id={ids['gpu-a']}"
    )
    traversal = f"../../gpufed/secrets/gpufed-remote-{ids['gpu-a']}"
    clusters.create(
        "consumer",
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "pull", "namespace": namespace},
            "spec": {
                "imagePullSecrets": [{"name": traversal}],
                "containers": [{"name": "main", "image": "registry.example/app:1", "resources": {"requests": SMALL}}],
            },
        },
    )
    refused = eventually("the InvalidName Event on the pod", lambda: events(clusters, namespace, "InvalidName", "pull"))
    assert traversal in refused[0]["message"]
    never("a twin of the pod on gpu-a", lambda: get(clusters, "gpu-a", "pod", "pull", "-n", twin_ns(ids, namespace)))
    secrets = clusters.kubectl("gpu-a", "get", "secrets", "-n", twin_ns(ids, namespace), "-o", "json", check=False)
    copied = json.loads(secrets.stdout)["items"] if secrets.returncode == 0 else []
    assert not [s["metadata"]["name"] for s in copied if "kubeconfig" in (s.get("data") or {})], "credentials copied"
