"""The provider's offload pod-security policy on the real local clusters.

A provider holds its tenants' pods to Pod Security baseline by default and refuses, per tenant
(`Tenant.spec.policy.podSecurity`), privileged containers, host namespaces, hostPath volumes and
added capabilities unless allowed (the attack suites tests/e2e/attacks/test_consumer_admission.py and
test_tenant_user.py cover the other rules). The consumer's virtual
kubelet refuses such pods early, from the policy the provider publishes in the TwinNamespace status
(status reason ProviderFailed, a Warning Event naming the reason, no twin, no retry loop); the
provider's own kube-apiserver refuses them anyway through the ValidatingAdmissionPolicy
`gpufed-offload-policy`, whoever creates them in a consumer's namespaces.

The module peers the consumer with gpu-a for its duration; each test offloads its own namespace.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from gpufed.apis.wire import ClusterID
from tests.e2e.conftest import Clusters
from tests.e2e.helpers import eventually, offload, peered_session

pytestmark = pytest.mark.e2e

SMALL = {"cpu": "10m", "memory": "16Mi"}
REASON = "OffloadPolicyRefused"
#: The default policy as gpu-a publishes it (Pod Security baseline; empty allow-lists are left out).
DEFAULT_PUBLISHED = {
    "level": "baseline",
    "allowPrivileged": False,
    "allowHostNamespaces": False,
    "allowHostPath": False,
    "allowHostPorts": False,
}
#: name -> (what the pod asks for, text the refusal must contain)
REFUSED: dict[str, tuple[dict[str, Any], dict[str, Any], str]] = {
    "privileged": (
        {},
        {"securityContext": {"privileged": True}},
        "privileged containers (container main: securityContext.privileged=true)",
    ),
    "host-network": ({"hostNetwork": True}, {}, "host namespaces (spec.hostNetwork=true)"),
    "host-path": (
        {"volumes": [{"name": "root", "hostPath": {"path": "/"}}]},
        {"volumeMounts": [{"name": "root", "mountPath": "/host"}]},
        "hostPath volumes (volume root: hostPath /)",
    ),
    "cap-add": (
        {},
        {"securityContext": {"capabilities": {"add": ["NET_ADMIN"], "drop": ["ALL"]}}},
        "added capabilities (container main: securityContext.capabilities.add=NET_ADMIN)",
    ),
}


@pytest.fixture(scope="module")
def ids(clusters: Clusters) -> Iterator[dict[str, ClusterID]]:
    yield from peered_session(clusters, {"gpu-a": ("--gpus", "8")})


def twin_ns(ids: dict[str, ClusterID], namespace: str) -> str:
    return f"{namespace}-{ids['consumer']}"


def pod(name: str, namespace: str, spec: dict[str, Any] | None = None, main: dict[str, Any] | None = None) -> Any:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "containers": [
                {"name": "main", "image": "registry.example/app:1", "resources": {"requests": SMALL}, **(main or {})}
            ],
            **(spec or {}),
        },
    }


def set_policy(clusters: Clusters, consumer: ClusterID, pod_security: dict[str, Any] | None) -> None:
    """The provider admin edits the consumer's Tenant (None: back to the default policy)."""
    patch = {"spec": {"policy": {"podSecurity": pod_security}}}
    clusters.kubectl("gpu-a", "patch", "tenant", consumer, "--type=merge", "-p", json.dumps(patch))


def published(clusters: Clusters, ids: dict[str, ClusterID], namespace: str) -> dict[str, Any] | None:
    """The policy gpu-a publishes to the consumer for `namespace` (TwinNamespace status)."""
    items = clusters.kubectl_json("gpu-a", "get", "twinnamespaces", "-n", f"gpufed-tenant-{ids['consumer']}")["items"]
    for t in items:
        if t["spec"]["namespace"] == namespace and (t.get("status") or {}).get("phase") == "Ready":
            found: dict[str, Any] = t["status"].get("podSecurity") or {}
            return found
    return None


def twin_names(clusters: Clusters, ids: dict[str, ClusterID], namespace: str) -> set[str]:
    items = clusters.kubectl_json("gpu-a", "get", "pods", "-n", twin_ns(ids, namespace))["items"]
    return {p["metadata"]["name"] for p in items}


def refused_event(clusters: Clusters, namespace: str, name: str) -> dict[str, Any] | None:
    evs = clusters.kubectl_json("consumer", "get", "events", "-n", namespace)["items"]
    return next(
        (e for e in evs if e["involvedObject"]["name"] == name and e["reason"] == REASON and e["type"] == "Warning"),
        None,
    )


def offload_to_gpu_a(clusters: Clusters, ids: dict[str, ClusterID], namespace: str) -> None:
    offload(
        clusters, namespace, "--pod-strategy", "Remote", "--selector", f"gpufed.io/remote-cluster-id={ids['gpu-a']}"
    )
    eventually("the policy published for the twin namespace", lambda: published(clusters, ids, namespace) is not None)


def test_the_default_policy_refuses_each_rule_with_a_clear_reason(
    clusters: Clusters, ids: dict[str, ClusterID], namespace: str
) -> None:
    offload_to_gpu_a(clusters, ids, namespace)
    assert published(clusters, ids, namespace) == DEFAULT_PUBLISHED
    for name, (spec, main, _why) in REFUSED.items():
        clusters.create("consumer", pod(name, namespace, spec, main))
    clusters.create("consumer", pod("plain", namespace))
    clusters.kubectl(
        "consumer", "wait", "-n", namespace, "--for=condition=Ready", "pod/plain", "--timeout=90s", timeout=100
    )
    for name, (_spec, _main, why) in REFUSED.items():

        def refused(n: str = name) -> dict[str, Any] | None:
            p: dict[str, Any] = clusters.kubectl_json("consumer", "get", "pod", n, "-n", namespace)
            return p if p["status"].get("reason") == "ProviderFailed" else None

        p = eventually(f"{name}: status.reason ProviderFailed", refused)
        assert p["spec"]["nodeName"].startswith("gpufed-"), p["spec"].get("nodeName")
        assert p["status"]["phase"] == "Pending"
        message = p["status"]["message"]
        assert f"provider {ids['gpu-a']} refuses {why}" in message, message
        assert "ask the provider to allow it in Tenant spec.policy.podSecurity." in message, message

        def warned(n: str = name) -> dict[str, Any] | None:
            return refused_event(clusters, namespace, n)

        event = eventually(f"{name}: a Warning Event {REASON}", warned)
        assert why in event["message"], event
    # Nothing reached the provider but the plain pod, and nothing is retried in a loop: one
    # refusal is counted once or twice (the status write wakes the pod once more), not per backoff.
    assert twin_names(clusters, ids, namespace) == {"plain"}
    for name in REFUSED:
        event = refused_event(clusters, namespace, name)
        assert event is not None and int(event.get("count") or 1) <= 2, event


def test_the_provider_enforces_even_if_the_consumer_skips_its_check(
    clusters: Clusters, ids: dict[str, ClusterID], namespace: str
) -> None:
    """The consumer's own identity on gpu-a creates pods straight in its twin namespace."""
    offload_to_gpu_a(clusters, ids, namespace)
    twin = twin_ns(ids, namespace)
    labels = clusters.kubectl_json("gpu-a", "get", "namespace", twin)["metadata"]["labels"]
    assert labels["gpufed.io/allow-privileged"] == "false", labels
    consumer = [f"--as=gpufed:consumer:{ids['consumer']}", "--as-group=gpufed:consumers"]
    # The identity may create pods there: what refuses them below is the admission policy, not RBAC.
    p = clusters.kubectl(
        "gpu-a", "create", "--dry-run=server", "-f", "-", *consumer, input_text=json.dumps(pod("ok", twin))
    )
    assert p.returncode == 0, p.stderr
    for name, (spec, main, why) in REFUSED.items():
        p = clusters.kubectl(
            "gpu-a", "create", "-f", "-", *consumer, input_text=json.dumps(pod(name, twin, spec, main)), check=False
        )
        assert p.returncode != 0, f"{name} was admitted"
        # Two layers of the provider's own API server: Pod Security Admission (the twin namespace's
        # enforce label, evaluated first) and gpufed's policy, which names the Tenant field to change.
        assert "Forbidden" in p.stderr, p.stderr
        if "violates PodSecurity" not in p.stderr:
            assert "ValidatingAdmissionPolicy 'gpufed-offload-policy'" in p.stderr, p.stderr
            assert why.split(" (", 1)[0] in p.stderr and "Tenant spec.policy.podSecurity." in p.stderr, p.stderr
    assert twin_names(clusters, ids, namespace) == set()


def test_a_tenant_allowed_privileged_gets_it_through(
    clusters: Clusters, ids: dict[str, ClusterID], namespace: str
) -> None:
    offload_to_gpu_a(clusters, ids, namespace)
    privileged, cap_add = REFUSED["privileged"], REFUSED["cap-add"]
    clusters.create("consumer", pod("privileged", namespace, privileged[0], privileged[1]))

    def refused() -> bool:
        p = clusters.kubectl_json("consumer", "get", "pod", "privileged", "-n", namespace)
        return bool(p["status"].get("reason") == "ProviderFailed")

    eventually("the privileged pod refused under the default policy", refused)
    try:
        set_policy(clusters, ids["consumer"], {"allowPrivileged": True, "allowedCapabilities": ["net_admin"]})
        eventually(
            "the new policy published",
            lambda: (published(clusters, ids, namespace) or {}).get("allowedCapabilities") == ["NET_ADMIN"],
        )
        tenant = clusters.kubectl_json("gpu-a", "get", "tenant", ids["consumer"])
        cond = next(c for c in tenant["status"]["conditions"] if c["type"] == "PodSecurity")
        assert "allowed: privileged containers" in cond["message"], cond
        # The refused pod goes again by itself once the policy allows it (no local change needed).
        clusters.kubectl(
            "consumer", "wait", "-n", namespace, "--for=condition=Ready", "pod/privileged", "--timeout=90s", timeout=100
        )
        clusters.create("consumer", pod("cap-add", namespace, cap_add[0], cap_add[1]))
        clusters.kubectl(
            "consumer", "wait", "-n", namespace, "--for=condition=Ready", "pod/cap-add", "--timeout=90s", timeout=100
        )
        twins = clusters.kubectl_json("gpu-a", "get", "pods", "-n", twin_ns(ids, namespace))["items"]
        by_name = {t["metadata"]["name"]: t for t in twins}
        assert by_name["privileged"]["spec"]["containers"][0]["securityContext"]["privileged"] is True
        # What stays refused is still refused.
        host_path = REFUSED["host-path"]
        clusters.create("consumer", pod("host-path", namespace, host_path[0], host_path[1]))
        eventually("host-path still refused", lambda: refused_event(clusters, namespace, "host-path"))
    finally:
        set_policy(clusters, ids["consumer"], None)
    eventually(
        "the default policy published again",
        lambda: published(clusters, ids, namespace) == DEFAULT_PUBLISHED,
    )
