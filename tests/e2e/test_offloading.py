"""Namespace offloading on the real local clusters: `gpufed offload-namespace` / `unoffload-namespace`,
twin namespaces on the selected providers, the webhook's mutation of new pods, and cleanup.

The module peers the consumer with gpu-a (8 GPUs) and gpu-b (4 A100) for its duration. The tests
need only the labels virtual nodes carry (`gpufed.io/type`, `gpufed.io/remote-cluster-id`,
`nvidia.com/gpu.product`); when a provider's virtual node does not appear, a stand-in Node with
those labels and the taint is created for the module and deleted afterwards.
"""

from __future__ import annotations

import functools
import json
import secrets
import time
from collections.abc import Iterator
from typing import Any

import pytest

from gpufed.apis.wire import CONSUMER_LABEL, OFFLOADING_LABEL, REMOTE_CLUSTER_LABEL, TWIN_OF_LABEL, ClusterID
from tests.e2e.conftest import Clusters
from tests.e2e.helpers import eventually, gpufed, out, peered_session

pytestmark = pytest.mark.e2e

A100 = "NVIDIA-A100-SXM4-40GB"
TOLERATION = {"key": "gpufed.io/virtual-node", "operator": "Exists", "effect": "NoExecute"}
ON_VIRTUAL = {"key": "gpufed.io/type", "operator": "In", "values": ["virtual-node"]}
NOT_ON_VIRTUAL = {"key": "gpufed.io/type", "operator": "NotIn", "values": ["virtual-node"]}


def _virtual_nodes(clusters: Clusters) -> dict[str, dict[str, Any]]:
    items = clusters.kubectl_json("consumer", "get", "nodes", "-l", "gpufed.io/type=virtual-node")["items"]
    return {n["metadata"]["labels"].get(REMOTE_CLUSTER_LABEL, ""): n for n in items}


@pytest.fixture(scope="module")
def ids(clusters: Clusters) -> Iterator[dict[str, ClusterID]]:
    session = peered_session(clusters, {"gpu-a": ("--gpus", "8"), "gpu-b": ("--gpus", "4", "--gpu-product", A100)})
    found = next(session)
    created: list[str] = []
    deadline = time.monotonic() + 45
    missing = [p for p in ("gpu-a", "gpu-b") if found[p] not in _virtual_nodes(clusters)]
    while missing and time.monotonic() < deadline:
        time.sleep(1)
        missing = [p for p in missing if found[p] not in _virtual_nodes(clusters)]
    for provider in missing:  # stand-ins carrying the labels a real virtual node would
        name = f"gpufed-{found[provider]}"
        labels = {
            "type": "virtual-kubelet",
            "gpufed.io/type": "virtual-node",
            REMOTE_CLUSTER_LABEL: found[provider],
            **({"nvidia.com/gpu.product": A100} if provider == "gpu-b" else {}),
        }
        clusters.create(
            "consumer",
            {
                "apiVersion": "v1",
                "kind": "Node",
                "metadata": {"name": name, "labels": labels},
                "spec": {"taints": [{"key": "gpufed.io/virtual-node", "value": "true", "effect": "NoExecute"}]},
            },
        )
        created.append(name)
    try:
        yield found
    finally:
        for name in created:
            clusters.kubectl("consumer", "delete", "node", name, "--wait=false", check=False)
        for _ in session:  # unpeer and check
            pass


@pytest.fixture
def local_ns(clusters: Clusters, request: pytest.FixtureRequest) -> Iterator[str]:
    """A namespace on the consumer only (so EnforceSameName has no clash on the providers)."""
    name = f"o-{request.node.name[5:25].lower().replace('_', '-').strip('-')}-{secrets.token_hex(3)}"
    clusters.kubectl("consumer", "create", "namespace", name)
    eventually(
        "the default ServiceAccount",
        lambda: clusters.kubectl("consumer", "get", "sa", "default", "-n", name, check=False).returncode == 0,
    )
    yield name
    unoffload(clusters, name, "--force")
    clusters.kubectl("consumer", "delete", "namespace", name, "--wait=false", check=False)


def offload(clusters: Clusters, namespace: str, *flags: str) -> Any:
    return gpufed(
        "offload-namespace", namespace, "--kubeconfig", str(clusters.kubeconfig), "--context", "consumer", *flags
    )


def unoffload(clusters: Clusters, namespace: str, *flags: str) -> Any:
    return gpufed(
        "unoffload-namespace", namespace, "--kubeconfig", str(clusters.kubeconfig), "--context", "consumer", *flags
    )


def twin_gone(clusters: Clusters, provider: str, twin: str) -> bool:
    return provider_ns(clusters, provider, twin) is None


def nsoff(clusters: Clusters, namespace: str) -> dict[str, Any] | None:
    p = clusters.kubectl(
        "consumer", "get", "namespaceoffloadings.gpufed.io", "offloading", "-n", namespace, "-o", "json", check=False
    )
    return json.loads(p.stdout) if p.returncode == 0 else None


def ns_label(clusters: Clusters, namespace: str) -> str | None:
    labels = clusters.kubectl_json("consumer", "get", "namespace", namespace)["metadata"].get("labels") or {}
    value = labels.get(OFFLOADING_LABEL)
    return str(value) if value is not None else None


def provider_ns(clusters: Clusters, provider: str, name: str) -> dict[str, Any] | None:
    p = clusters.kubectl(provider, "get", "namespace", name, "-o", "json", check=False)
    if p.returncode:
        return None
    obj: dict[str, Any] = json.loads(p.stdout)
    return None if obj["metadata"].get("deletionTimestamp") else obj


def pending_pod(clusters: Clusters, namespace: str, name: str = "p", **spec: Any) -> dict[str, Any]:
    """Create a pod no node can take (it stays Pending) and return it as stored."""
    body = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "containers": [{"name": "main", "image": "registry.example/app:1"}],
            "nodeSelector": {"example.com/nowhere": "true"},
            **spec,
        },
    }
    clusters.create("consumer", body)
    pod: dict[str, Any] = clusters.kubectl_json("consumer", "get", "pod", name, "-n", namespace)
    return pod


def required_terms(pod: dict[str, Any]) -> list[list[dict[str, Any]]]:
    na = ((pod["spec"].get("affinity") or {}).get("nodeAffinity")) or {}
    terms = (na.get("requiredDuringSchedulingIgnoredDuringExecution") or {}).get("nodeSelectorTerms") or []
    return [t.get("matchExpressions") or [] for t in terms]


# ---------------------------------------------------------------------------- bad input first


def test_bad_input_is_refused_clearly_and_creates_nothing(
    clusters: Clusters, ids: dict[str, ClusterID], local_ns: str
) -> None:
    p = offload(clusters, "no-such-namespace-here")
    assert p.returncode == 1 and "does not exist" in out(p), out(p)
    p = offload(clusters, local_ns, "--selector", "a=b=c")
    assert p.returncode == 2 and "cannot parse selector" in out(p), out(p)
    p = offload(clusters, local_ns, "--selector", "gpu.memory>lots")
    assert p.returncode == 2 and "integer" in out(p), out(p)
    p = offload(clusters, local_ns, "--pod-strategy", "Sometimes")
    assert p.returncode == 2 and "podOffloadingStrategy" in out(p) and "LocalAndRemote" in out(p), out(p)
    p = offload(clusters, local_ns, "--remote-name", "x")
    assert p.returncode == 2 and "SelectedName" in out(p), out(p)
    assert nsoff(clusters, local_ns) is None and ns_label(clusters, local_ns) is None
    # The API server enforces the name and the mapping rule for objects made without the CLI.
    bad = clusters.create(
        "consumer",
        {
            "apiVersion": "gpufed.io/v1alpha1",
            "kind": "NamespaceOffloading",
            "metadata": {"name": "other", "namespace": local_ns},
            "spec": {},
        },
        check=False,
    )
    assert bad.returncode != 0 and "must be named 'offloading'" in bad.stderr, bad.stderr
    p = unoffload(clusters, local_ns)
    assert p.returncode == 0 and "not offloaded" in out(p), out(p)


# ---------------------------------------------------------------------------- offloading


def test_default_name_creates_twins_on_both_providers_and_is_idempotent(
    clusters: Clusters, ids: dict[str, ClusterID], local_ns: str
) -> None:
    p = offload(clusters, local_ns)
    assert p.returncode == 0, out(p)
    twin = f"{local_ns}-{ids['consumer']}"
    assert twin in out(p) and "Ready" in out(p), out(p)
    for provider in ("gpu-a", "gpu-b"):
        ns = provider_ns(clusters, provider, twin)
        assert ns is not None, f"no twin {twin} on {provider}"
        assert ns["metadata"]["labels"][CONSUMER_LABEL] == ids["consumer"]
        assert ns["metadata"]["labels"][TWIN_OF_LABEL] == local_ns
    obj = nsoff(clusters, local_ns)
    assert obj is not None and obj["status"]["phase"] == "Ready"
    assert {r["clusterId"]: r["namespace"] for r in obj["status"]["remoteNamespaces"]} == {
        ids["gpu-a"]: twin,
        ids["gpu-b"]: twin,
    }
    assert FINALIZER in obj["metadata"]["finalizers"]
    assert ns_label(clusters, local_ns) == "LocalAndRemote"
    table = clusters.kubectl("consumer", "get", "nsoff", "-n", local_ns).stdout
    assert "LocalAndRemote" in table and "DefaultName" in table and "Ready" in table, table

    again = offload(clusters, local_ns)
    assert again.returncode == 0 and "nothing changed" in out(again), out(again)
    current = nsoff(clusters, local_ns)
    assert current is not None and current["metadata"]["generation"] == obj["metadata"]["generation"]

    # LocalAndRemote without a selector: the toleration, and no affinity (local nodes stay allowed).
    pod = pending_pod(clusters, local_ns)
    assert TOLERATION in pod["spec"]["tolerations"]
    assert required_terms(pod) == []


FINALIZER = "gpufed.io/offloading"


def test_selector_picks_one_provider_and_remote_pods_get_toleration_and_affinity(
    clusters: Clusters, ids: dict[str, ClusterID], local_ns: str
) -> None:
    twin = f"{local_ns}-{ids['consumer']}"
    p = offload(clusters, local_ns, "--pod-strategy", "Remote", "--selector", f"nvidia.com/gpu.product={A100}")
    assert p.returncode == 0, out(p)
    assert provider_ns(clusters, "gpu-b", twin) is not None
    assert provider_ns(clusters, "gpu-a", twin) is None, "gpu-a has no A100 virtual node: no twin there"
    assert ns_label(clusters, local_ns) == "Remote"

    pod = pending_pod(
        clusters,
        local_ns,
        affinity={
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [{"matchExpressions": [{"key": "zone", "operator": "Exists"}]}]
                }
            }
        },
    )
    assert TOLERATION in pod["spec"]["tolerations"]
    product = {"key": "nvidia.com/gpu.product", "operator": "In", "values": [A100]}
    assert required_terms(pod) == [[{"key": "zone", "operator": "Exists"}, ON_VIRTUAL, product]]
    assert pod["spec"]["nodeSelector"] == {"example.com/nowhere": "true"}, "the user's settings stay"

    # Another selection moves the twin: gpu-a gains it, gpu-b loses it.
    p = offload(
        clusters, local_ns, "--pod-strategy", "Remote", "--selector", f"{REMOTE_CLUSTER_LABEL} in ({ids['gpu-a']})"
    )
    assert p.returncode == 0 and "NamespaceOffloading applied" in out(p), out(p)
    assert provider_ns(clusters, "gpu-a", twin) is not None
    eventually("the twin on gpu-b to go", lambda: provider_ns(clusters, "gpu-b", twin) is None)
    obj = nsoff(clusters, local_ns)
    assert obj is not None and [r["clusterId"] for r in obj["status"]["remoteNamespaces"]] == [ids["gpu-a"]]


def test_enforce_same_name_and_refusal_of_a_taken_name(
    clusters: Clusters, ids: dict[str, ClusterID], local_ns: str, namespace: str
) -> None:
    p = offload(clusters, local_ns, "--mapping", "EnforceSameName")
    assert p.returncode == 0, out(p)
    for provider in ("gpu-a", "gpu-b"):
        ns = provider_ns(clusters, provider, local_ns)
        assert ns is not None and ns["metadata"]["labels"][TWIN_OF_LABEL] == local_ns

    # `namespace` exists on every cluster already (not as a twin): the providers refuse it.
    p = offload(clusters, namespace, "--mapping", "EnforceSameName", "--timeout", "30")
    assert p.returncode == 1 and "refused" in out(p) and "already exists" in out(p), out(p)
    obj = nsoff(clusters, namespace)
    assert obj is not None and obj["status"]["phase"] == "Failed"
    assert {r["phase"] for r in obj["status"]["remoteNamespaces"]} == {"Refused"}
    events = clusters.kubectl_json(
        "consumer", "get", "events", "-n", namespace, "--field-selector", "reason=TwinRefused"
    )
    assert events["items"], "a refused twin is a Warning Event on the NamespaceOffloading"
    for provider in ("gpu-a", "gpu-b"):  # the providers' own namespace is left alone
        ns = provider_ns(clusters, provider, namespace)
        assert ns is not None and CONSUMER_LABEL not in (ns["metadata"].get("labels") or {})
    p = unoffload(clusters, namespace)
    assert p.returncode == 0, out(p)
    assert provider_ns(clusters, "gpu-a", namespace) is not None


def test_local_strategy_keeps_pods_off_virtual_nodes_and_creates_no_twin(
    clusters: Clusters, ids: dict[str, ClusterID], local_ns: str
) -> None:
    p = offload(clusters, local_ns, "--pod-strategy", "Local")
    assert p.returncode == 0, out(p)
    assert provider_ns(clusters, "gpu-a", f"{local_ns}-{ids['consumer']}") is None
    assert ns_label(clusters, local_ns) == "Local"
    pod = pending_pod(clusters, local_ns)
    assert required_terms(pod) == [[NOT_ON_VIRTUAL]]
    assert TOLERATION not in (pod["spec"].get("tolerations") or [])


def test_a_namespace_without_offloading_is_untouched(
    clusters: Clusters, ids: dict[str, ClusterID], local_ns: str
) -> None:
    pod = pending_pod(clusters, local_ns)
    assert TOLERATION not in (pod["spec"].get("tolerations") or [])
    assert "affinity" not in pod["spec"]
    assert ns_label(clusters, local_ns) is None


def test_unoffload_refuses_while_pods_run_on_virtual_nodes_then_force_removes_everything(
    clusters: Clusters, ids: dict[str, ClusterID], local_ns: str
) -> None:
    p = offload(clusters, local_ns)
    assert p.returncode == 0, out(p)
    twin = f"{local_ns}-{ids['consumer']}"
    vnode = _virtual_nodes(clusters)[ids["gpu-a"]]["metadata"]["name"]
    clusters.create(
        "consumer",
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "bound", "namespace": local_ns},
            "spec": {
                "nodeName": vnode,
                "containers": [
                    {
                        "name": "main",
                        "image": "registry.example/app:1",
                        "resources": {"requests": {"cpu": "10m", "memory": "16Mi"}},
                    }
                ],
            },
        },
    )
    p = unoffload(clusters, local_ns)
    assert p.returncode == 1 and f"bound ({vnode})" in out(p) and "--force" in out(p), out(p)
    assert nsoff(clusters, local_ns) is not None, "a refusal changes nothing"

    p = unoffload(clusters, local_ns, "--force")
    assert p.returncode == 0 and "deleted pod bound" in out(p), out(p)
    assert nsoff(clusters, local_ns) is None and ns_label(clusters, local_ns) is None
    for provider in ("gpu-a", "gpu-b"):
        eventually(f"the twin on {provider} to go", functools.partial(twin_gone, clusters, provider, twin))
    p = unoffload(clusters, local_ns)
    assert p.returncode == 0 and "not offloaded" in out(p), out(p)


def test_deleting_the_namespace_removes_its_twins(clusters: Clusters, ids: dict[str, ClusterID]) -> None:
    name = f"o-del-{secrets.token_hex(3)}"
    clusters.kubectl("consumer", "create", "namespace", name)
    p = offload(clusters, name)
    assert p.returncode == 0, out(p)
    twin = f"{name}-{ids['consumer']}"
    assert provider_ns(clusters, "gpu-b", twin) is not None
    clusters.kubectl("consumer", "delete", "namespace", name, "--wait=false")
    for provider in ("gpu-a", "gpu-b"):
        eventually(f"the twin on {provider} to go", functools.partial(twin_gone, clusters, provider, twin))
    eventually(
        "the namespace to go",
        lambda: clusters.kubectl("consumer", "get", "namespace", name, check=False).returncode != 0,
    )
