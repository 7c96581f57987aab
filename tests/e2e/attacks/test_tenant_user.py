"""Attacks from the TENANT USER position on the real local clusters: a user of the consumer cluster
with rights in an offloaded namespace only, creating pods there that ask the provider's nodes for
more than the provider's policy gives the consumer.

The consumer refuses each one before anything reaches the provider: its virtual kubelet checks the
pod, as the forge would send it, against the policy gpu-a publishes in the TwinNamespace status
(vkprovider.forge.podpolicy, the same rules as gpu-a's admission policy); the pod's status reason
is ProviderFailed and a Warning Event `OffloadPolicyRefused` on the pod names the rule and the
Tenant field that would allow it. Should the early check be skipped, gpu-a's own API server refuses
with the same words (tests/e2e/attacks/test_consumer_admission.py). Each test is one attack; it
asserts the refusal, the Event, and that no twin exists on gpu-a. The module peers the consumer
with gpu-a; each test offloads its own namespace.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import pytest

from gpufed.apis.wire import ClusterID, tenant_namespace, twin_namespace
from peering import podsecurity
from tests.e2e.conftest import Clusters
from tests.e2e.helpers import eventually, offload, peered_session

pytestmark = pytest.mark.e2e

SMALL = {"cpu": "10m", "memory": "16Mi"}
PROVIDER = "gpu-a"
REASON = "OffloadPolicyRefused"
#: Seconds a refused pod is watched for a twin appearing on gpu-a after its refusal.
LEAK_WAIT_S = 5.0


@pytest.fixture(scope="module")
def ids(clusters: Clusters) -> Iterator[dict[str, ClusterID]]:
    yield from peered_session(clusters, {PROVIDER: ("--gpus", "8")})


def published(clusters: Clusters, ids: dict[str, ClusterID], namespace: str) -> dict[str, Any] | None:
    """The policy gpu-a publishes for `namespace` (None until its TwinNamespace is Ready)."""
    items = clusters.kubectl_json(PROVIDER, "get", "twinnamespaces", "-n", tenant_namespace(ids["consumer"]))["items"]
    for t in items:
        if t["spec"]["namespace"] == namespace and (t.get("status") or {}).get("phase") == "Ready":
            found: dict[str, Any] = t["status"].get("podSecurity") or {}
            return found
    return None


def offloaded(clusters: Clusters, ids: dict[str, ClusterID], namespace: str, level: str = "baseline") -> None:
    offload(
        clusters, namespace, "--pod-strategy", "Remote", "--selector", f"gpufed.io/remote-cluster-id={ids[PROVIDER]}"
    )
    eventually(
        f"gpu-a's policy ({level}) published for {namespace}",
        lambda: (published(clusters, ids, namespace) or {}).get("level") == level,
        timeout=90,
    )


def pod(name: str, namespace: str, spec: dict[str, Any] | None = None, **main: Any) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "containers": [
                {"name": "main", "image": "registry.example/app:1", "resources": {"requests": SMALL}, **main}
            ],
            **(spec or {}),
        },
    }


def refused_before_offload(
    clusters: Clusters, ids: dict[str, ClusterID], namespace: str, obj: dict[str, Any], rule: podsecurity.Rule
) -> str:
    """The user's pod is refused on the consumer with ProviderFailed and an Event naming `rule`; no twin."""
    clusters.create("consumer", obj)
    name = obj["metadata"]["name"]

    def refused() -> dict[str, Any] | None:
        p: dict[str, Any] = clusters.kubectl_json("consumer", "get", "pod", name, "-n", namespace)
        return p if (p.get("status") or {}).get("reason") == "ProviderFailed" else None

    p = eventually(f"{name}: status.reason ProviderFailed", refused, timeout=90)
    assert p["status"]["phase"] == "Pending", p["status"]
    assert f"refuses {rule.what} (" in p["status"]["message"], p["status"]["message"]

    def warned() -> dict[str, Any] | None:
        evs = clusters.kubectl_json(
            "consumer",
            "get",
            "events",
            "-n",
            namespace,
            "--field-selector",
            f"involvedObject.name={name},reason={REASON}",
        )["items"]
        return next((e for e in evs if e["type"] == "Warning"), None)

    event = eventually(f"{name}: a Warning Event {REASON}", warned)
    assert f"{rule.what} (" in event["message"], event["message"]
    # No twin on gpu-a, and none retried into existence a moment later either.
    never_created(clusters, twin_namespace(namespace, ids["consumer"]), name)
    return str(event["message"])


def never_created(clusters: Clusters, twin: str, name: str) -> None:
    deadline = time.monotonic() + LEAK_WAIT_S
    while time.monotonic() < deadline:
        p = clusters.kubectl(PROVIDER, "get", "pod", name, "-n", twin, check=False)
        assert p.returncode != 0, f"twin {twin}/{name} appeared on gpu-a"
        time.sleep(0.5)


def test_tenant_pod_with_host_port_22_is_refused_before_offload(
    clusters: Clusters, ids: dict[str, ClusterID], namespace: str
) -> None:
    offloaded(clusters, ids, namespace)
    obj = pod("sshd", namespace, ports=[{"containerPort": 22, "hostPort": 22}])
    message = refused_before_offload(clusters, ids, namespace, obj, podsecurity.HOST_PORTS)
    assert "ports.hostPort=22" in message and "Tenant spec.policy.podSecurity.allowHostPorts" in message, message


def test_tenant_pod_with_nfs_volume_is_refused_before_offload(
    clusters: Clusters, ids: dict[str, ClusterID], namespace: str
) -> None:
    offloaded(clusters, ids, namespace)
    obj = pod(
        "nfs",
        namespace,
        {"volumes": [{"name": "data", "nfs": {"server": "10.0.0.1", "path": "/exports"}}]},
        volumeMounts=[{"name": "data", "mountPath": "/data"}],
    )
    message = refused_before_offload(clusters, ids, namespace, obj, podsecurity.VOLUME_TYPES)
    assert "volume data: nfs" in message, message


def test_tenant_pod_with_inline_csi_volume_is_refused_before_offload(
    clusters: Clusters, ids: dict[str, ClusterID], namespace: str
) -> None:
    offloaded(clusters, ids, namespace)
    obj = pod(
        "csi",
        namespace,
        {"volumes": [{"name": "secrets", "csi": {"driver": "secrets-store.csi.k8s.io", "readOnly": True}}]},
        volumeMounts=[{"name": "secrets", "mountPath": "/mnt"}],
    )
    message = refused_before_offload(clusters, ids, namespace, obj, podsecurity.VOLUME_TYPES)
    assert "volume secrets: csi" in message, message


def test_tenant_pod_with_seccomp_unconfined_is_refused_before_offload(
    clusters: Clusters, ids: dict[str, ClusterID], namespace: str
) -> None:
    offloaded(clusters, ids, namespace)
    obj = pod("unconfined", namespace, securityContext={"seccompProfile": {"type": "Unconfined"}})
    message = refused_before_offload(clusters, ids, namespace, obj, podsecurity.SECCOMP)
    assert "securityContext.seccompProfile.type=Unconfined" in message and "Pod Security baseline" in message


def test_tenant_pod_with_apparmor_unconfined_is_refused_before_offload(
    clusters: Clusters, ids: dict[str, ClusterID], namespace: str
) -> None:
    offloaded(clusters, ids, namespace)
    obj = pod("apparmor", namespace, {"securityContext": {"appArmorProfile": {"type": "Unconfined"}}})
    message = refused_before_offload(clusters, ids, namespace, obj, podsecurity.APPARMOR)
    assert "spec.securityContext.appArmorProfile.type=Unconfined" in message, message


def test_tenant_pod_with_selinux_spc_t_is_refused_before_offload(
    clusters: Clusters, ids: dict[str, ClusterID], namespace: str
) -> None:
    offloaded(clusters, ids, namespace)
    obj = pod("spc", namespace, {"securityContext": {"seLinuxOptions": {"type": "spc_t"}}})
    message = refused_before_offload(clusters, ids, namespace, obj, podsecurity.SELINUX)
    assert "seLinuxOptions.type=spc_t" in message, message


def test_tenant_pod_with_unsafe_sysctl_is_refused_before_offload(
    clusters: Clusters, ids: dict[str, ClusterID], namespace: str
) -> None:
    offloaded(clusters, ids, namespace)
    obj = pod("sysctl", namespace, {"securityContext": {"sysctls": [{"name": "kernel.msgmax", "value": "65536"}]}})
    message = refused_before_offload(clusters, ids, namespace, obj, podsecurity.SYSCTLS)
    assert "kernel.msgmax" in message, message


def test_tenant_pod_tolerating_every_taint_is_refused_before_offload(
    clusters: Clusters, ids: dict[str, ClusterID], namespace: str
) -> None:
    offloaded(clusters, ids, namespace)
    obj = pod("everywhere", namespace, {"tolerations": [{"operator": "Exists"}]})
    message = refused_before_offload(clusters, ids, namespace, obj, podsecurity.TOLERATIONS)
    assert "toleration (every taint)" in message and "allowedTolerations" in message, message


def test_tenant_pod_as_root_is_refused_before_offload_under_restricted(
    clusters: Clusters, ids: dict[str, ClusterID], namespace: str
) -> None:
    patch = {"spec": {"policy": {"podSecurity": {"level": "restricted"}}}}
    clusters.kubectl(PROVIDER, "patch", "tenant", ids["consumer"], "--type=merge", "-p", json.dumps(patch))
    try:
        offloaded(clusters, ids, namespace, level="restricted")
        confined = {
            "allowPrivilegeEscalation": False,
            "runAsNonRoot": True,
            "seccompProfile": {"type": "RuntimeDefault"},
            "capabilities": {"drop": ["ALL"]},
        }
        obj = pod("root", namespace, {"securityContext": {"runAsUser": 0}}, securityContext=confined)
        message = refused_before_offload(clusters, ids, namespace, obj, podsecurity.RUN_AS_ROOT)
        assert "spec.securityContext.runAsUser=0" in message and "Pod Security restricted" in message, message
    finally:
        reset = {"spec": {"policy": {"podSecurity": None}}}
        clusters.kubectl(PROVIDER, "patch", "tenant", ids["consumer"], "--type=merge", "-p", json.dumps(reset))
