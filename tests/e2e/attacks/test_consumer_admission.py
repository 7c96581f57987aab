"""Attacks from the CONSUMER position on the real local clusters: the consumer's identity on gpu-a
(the user `gpufed:consumer:<id>` of its client certificate, group `gpufed:consumers`, here through
impersonation by gpu-a's admin as tests/e2e/test_offload_policy.py does) writes straight into its
twin and tenant namespaces, skipping everything its own virtual kubelet would check or strip.

What refuses each attack is gpu-a's own API server: the ValidatingAdmissionPolicies
`gpufed-offload-policy` (pods: Pod Security baseline, or restricted when the tenant is held to it,
plus gpufed's rules) and `gpufed-consumer-objects` (Services, EndpointSlices, Ingresses), the
grant's ResourceQuota, and the provider's controller for twin namespace names (a TwinNamespace
status and a Warning Event). Each test is one attack; it asserts the refusal (and the rule it names)
and that nothing was created. The module peers the consumer with gpu-a; each test offloads its own
namespace.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Iterator
from typing import Any

import pytest

from gpufed.apis.pool import GPU_PRODUCT_LABEL
from gpufed.apis.wire import CONSUMER_LABEL, ClusterID, tenant_namespace, twin_namespace
from peering import podsecurity
from peering.handshake import CONSUMER_GROUP, consumer_user
from tests.e2e.conftest import Clusters
from tests.e2e.helpers import eventually, offload, peered_session

pytestmark = pytest.mark.e2e

SMALL = {"cpu": "10m", "memory": "16Mi"}
PROVIDER = "gpu-a"


@pytest.fixture(scope="module")
def ids(clusters: Clusters) -> Iterator[dict[str, ClusterID]]:
    yield from peered_session(clusters, {PROVIDER: ("--gpus", "8")})


# ---------------------------------------------------------------------------- helpers


def as_consumer(ids: dict[str, ClusterID]) -> list[str]:
    return [f"--as={consumer_user(ids['consumer'])}", f"--as-group={CONSUMER_GROUP}"]


def twin(clusters: Clusters, ids: dict[str, ClusterID], namespace: str) -> str:
    """Offload `namespace` to gpu-a and wait until its twin is open to the consumer."""
    offload(
        clusters, namespace, "--pod-strategy", "Remote", "--selector", f"gpufed.io/remote-cluster-id={ids[PROVIDER]}"
    )
    name = twin_namespace(namespace, ids["consumer"])

    def opened() -> bool:
        p = clusters.kubectl(PROVIDER, "auth", "can-i", "create", "pods", "-n", name, *as_consumer(ids), check=False)
        return p.stdout.strip() == "yes"

    eventually(f"twin namespace {name} open to the consumer", opened, timeout=90)
    return name


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


def attempt(clusters: Clusters, ids: dict[str, ClusterID], obj: dict[str, Any]) -> str:
    """Create `obj` on gpu-a as the consumer; it must be refused. The refusal's text."""
    p = clusters.kubectl(PROVIDER, "create", "-f", "-", *as_consumer(ids), input_text=json.dumps(obj), check=False)
    assert p.returncode != 0, f"{obj['kind']} {obj['metadata']['name']} was admitted:\n{p.stdout}"
    return p.stderr


def absent(clusters: Clusters, kind: str, name: str, namespace: str) -> None:
    p = clusters.kubectl(PROVIDER, "get", kind, name, "-n", namespace, check=False)
    assert p.returncode != 0 and "NotFound" in p.stderr, f"{kind} {namespace}/{name} exists:\n{p.stdout}"


def refused_pod(
    clusters: Clusters, ids: dict[str, ClusterID], namespace: str, obj: dict[str, Any], rule: podsecurity.Rule
) -> str:
    """The pod is refused by the offload policy for `rule`, and no pod exists."""
    stderr = attempt(clusters, ids, obj)
    assert "Forbidden" in stderr, stderr
    # Pod Security Admission (the twin namespace's enforce label) runs before the admission policies and
    # refuses what its level covers; gpufed's policy refuses the rest, naming the rule.
    by_psa = "violates PodSecurity" in stderr
    by_policy = (
        f"ValidatingAdmissionPolicy '{podsecurity.POLICY_NAME}'" in stderr and f"{rule.what} are refused (" in stderr
    )
    assert by_psa or by_policy, stderr
    absent(clusters, "pod", obj["metadata"]["name"], namespace)
    return stderr


def names(stderr: str, ours: str, psa: str) -> None:
    """The refusal names the offending field: gpufed's policy in its words, or Pod Security Admission in its."""
    assert ours in stderr or ("violates PodSecurity" in stderr and psa in stderr), stderr


def refused_object(clusters: Clusters, ids: dict[str, ClusterID], obj: dict[str, Any], words: str) -> str:
    stderr = attempt(clusters, ids, obj)
    assert f"ValidatingAdmissionPolicy '{podsecurity.OBJECTS_POLICY_NAME}'" in stderr, stderr
    assert words in stderr, stderr
    absent(clusters, obj["kind"].lower(), obj["metadata"]["name"], obj["metadata"]["namespace"])
    return stderr


def set_policy(clusters: Clusters, ids: dict[str, ClusterID], policy: dict[str, Any]) -> None:
    """gpu-a's admin edits the consumer's Tenant policy (null values restore the defaults)."""
    patch = json.dumps({"spec": {"policy": policy}})
    clusters.kubectl(PROVIDER, "patch", "tenant", ids["consumer"], "--type=merge", "-p", patch)


def annotation(clusters: Clusters, namespace: str, key: str) -> str:
    ns = clusters.kubectl_json(PROVIDER, "get", "namespace", namespace)
    return str((ns["metadata"].get("annotations") or {}).get(key, ""))


# ---------------------------------------------------------------------------- pods: Pod Security baseline


def test_consumer_pod_with_host_port_22_is_refused(
    clusters: Clusters, ids: dict[str, ClusterID], namespace: str
) -> None:
    ns = twin(clusters, ids, namespace)
    obj = pod("sshd", ns, ports=[{"containerPort": 22, "hostPort": 22}])
    stderr = refused_pod(clusters, ids, ns, obj, podsecurity.HOST_PORTS)
    names(stderr, "ports.hostPort=22", "hostPort 22")


def test_consumer_pod_with_nfs_volume_is_refused(clusters: Clusters, ids: dict[str, ClusterID], namespace: str) -> None:
    ns = twin(clusters, ids, namespace)
    obj = pod(
        "nfs",
        ns,
        {"volumes": [{"name": "data", "nfs": {"server": "10.0.0.1", "path": "/exports"}}]},
        volumeMounts=[{"name": "data", "mountPath": "/data"}],
    )
    stderr = refused_pod(clusters, ids, ns, obj, podsecurity.VOLUME_TYPES)
    assert "volume data: nfs" in stderr and "allowedVolumeTypes" in stderr, stderr


def test_consumer_pod_with_seccomp_unconfined_is_refused(
    clusters: Clusters, ids: dict[str, ClusterID], namespace: str
) -> None:
    ns = twin(clusters, ids, namespace)
    obj = pod("unconfined", ns, {"securityContext": {"seccompProfile": {"type": "Unconfined"}}})
    stderr = refused_pod(clusters, ids, ns, obj, podsecurity.SECCOMP)
    names(stderr, "spec.securityContext.seccompProfile.type=Unconfined", 'seccompProfile.type to "Unconfined"')


def test_consumer_pod_with_selinux_spc_t_is_refused(
    clusters: Clusters, ids: dict[str, ClusterID], namespace: str
) -> None:
    ns = twin(clusters, ids, namespace)
    obj = pod("spc", ns, securityContext={"seLinuxOptions": {"type": "spc_t"}})
    stderr = refused_pod(clusters, ids, ns, obj, podsecurity.SELINUX)
    names(stderr, "securityContext.seLinuxOptions.type=spc_t", 'type "spc_t"')


def test_consumer_pod_with_unsafe_sysctl_is_refused(
    clusters: Clusters, ids: dict[str, ClusterID], namespace: str
) -> None:
    ns = twin(clusters, ids, namespace)
    obj = pod("sysctl", ns, {"securityContext": {"sysctls": [{"name": "kernel.msgmax", "value": "65536"}]}})
    stderr = refused_pod(clusters, ids, ns, obj, podsecurity.SYSCTLS)
    assert "kernel.msgmax" in stderr, stderr


def test_consumer_pod_as_root_is_refused_under_restricted(
    clusters: Clusters, ids: dict[str, ClusterID], namespace: str
) -> None:
    ns = twin(clusters, ids, namespace)
    confined = {
        "allowPrivilegeEscalation": False,
        "runAsNonRoot": True,
        "seccompProfile": {"type": "RuntimeDefault"},
        "capabilities": {"drop": ["ALL"]},
    }
    try:
        set_policy(clusters, ids, {"podSecurity": {"level": "restricted"}})
        eventually(
            "level restricted projected", lambda: annotation(clusters, ns, podsecurity.LEVEL_ANNOTATION) == "restricted"
        )
        labels = clusters.kubectl_json(PROVIDER, "get", "namespace", ns)["metadata"]["labels"]
        assert labels["pod-security.kubernetes.io/enforce"] == "restricted", labels
        obj = pod("root", ns, {"securityContext": {"runAsUser": 0}}, securityContext=confined)
        stderr = refused_pod(clusters, ids, ns, obj, podsecurity.RUN_AS_ROOT)
        names(stderr, "spec.securityContext.runAsUser=0", "runAsUser=0")
        # The same pod without user 0 is admitted (what restricted asks is satisfiable).
        ok = pod("nonroot", ns, {"securityContext": {"runAsUser": 1000}}, securityContext=confined)
        p = clusters.kubectl(
            PROVIDER, "create", "--dry-run=server", "-f", "-", *as_consumer(ids), input_text=json.dumps(ok), check=False
        )
        assert p.returncode == 0, p.stderr
    finally:
        set_policy(clusters, ids, {"podSecurity": None})


# ---------------------------------------------------------------------------- pods: gpufed's own rules


def test_consumer_pod_choosing_its_node_is_refused(
    clusters: Clusters, ids: dict[str, ClusterID], namespace: str
) -> None:
    ns = twin(clusters, ids, namespace)
    node = clusters.kubectl_json(PROVIDER, "get", "nodes")["items"][0]["metadata"]["name"]
    stderr = refused_pod(clusters, ids, ns, pod("pinned", ns, {"nodeName": node}), podsecurity.NODE_NAME)
    assert f"spec.nodeName={node}" in stderr, stderr


def test_consumer_pod_tolerating_every_taint_is_refused(
    clusters: Clusters, ids: dict[str, ClusterID], namespace: str
) -> None:
    ns = twin(clusters, ids, namespace)
    obj = pod("everywhere", ns, {"tolerations": [{"operator": "Exists"}]})
    stderr = refused_pod(clusters, ids, ns, obj, podsecurity.TOLERATIONS)
    assert "toleration (every taint)" in stderr, stderr
    control_plane = [{"key": "node-role.kubernetes.io/control-plane", "operator": "Exists", "effect": "NoSchedule"}]
    refused_pod(clusters, ids, ns, pod("control-plane", ns, {"tolerations": control_plane}), podsecurity.TOLERATIONS)


def test_consumer_pod_with_a_priority_class_is_refused(
    clusters: Clusters, ids: dict[str, ClusterID], namespace: str
) -> None:
    ns = twin(clusters, ids, namespace)
    obj = pod("critical", ns, {"priorityClassName": "system-node-critical"})
    stderr = refused_pod(clusters, ids, ns, obj, podsecurity.PRIORITY_CLASSES)
    assert "spec.priorityClassName=system-node-critical" in stderr, stderr


def test_consumer_pod_requesting_an_ungranted_extended_resource_is_refused(
    clusters: Clusters, ids: dict[str, ClusterID], namespace: str
) -> None:
    ns = twin(clusters, ids, namespace)
    obj = pod(
        "mig",
        ns,
        resources={"requests": {**SMALL, "nvidia.com/mig-1g.10gb": "1"}, "limits": {"nvidia.com/mig-1g.10gb": "1"}},
    )
    stderr = refused_pod(clusters, ids, ns, obj, podsecurity.RESOURCES)
    assert "nvidia.com/mig-1g.10gb" in stderr, stderr


def test_consumer_pod_with_ephemeral_storage_over_quota_is_refused(
    clusters: Clusters, ids: dict[str, ClusterID], namespace: str
) -> None:
    ns = twin(clusters, ids, namespace)
    quota = clusters.kubectl_json(PROVIDER, "get", "resourcequota", "gpufed-grant", "-n", ns)
    assert "limits.ephemeral-storage" in quota["spec"]["hard"], quota["spec"]
    huge = {"ephemeral-storage": "100Ti"}
    stderr = attempt(clusters, ids, pod("disk", ns, resources={"requests": {**SMALL, **huge}, "limits": huge}))
    assert "exceeded quota" in stderr and "ephemeral-storage" in stderr, stderr
    absent(clusters, "pod", "disk", ns)


def test_consumer_pod_pinning_a_gpu_product_outside_the_grant_is_refused(
    clusters: Clusters, ids: dict[str, ClusterID], namespace: str
) -> None:
    ns = twin(clusters, ids, namespace)
    nodes = clusters.kubectl_json(PROVIDER, "get", "nodes", "-l", GPU_PRODUCT_LABEL)["items"]
    products = sorted({n["metadata"]["labels"][GPU_PRODUCT_LABEL] for n in nodes})
    assert products, "gpu-a has GPU nodes"
    try:
        set_policy(clusters, ids, {"allowedGpuProducts": products})
        eventually(
            "the allowed products projected",
            lambda: annotation(clusters, ns, podsecurity.ALLOWED_GPU_PRODUCTS_ANNOTATION) == ",".join(products),
        )
        obj = pod("a100", ns, {"nodeSelector": {GPU_PRODUCT_LABEL: "NVIDIA-A100-SXM4-80GB"}})
        stderr = refused_pod(clusters, ids, ns, obj, podsecurity.GPU_PRODUCTS)
        assert "allowedGpuProducts" in stderr, stderr
    finally:
        set_policy(clusters, ids, {"allowedGpuProducts": None})


# ---------------------------------------------------------------------------- Services, EndpointSlices, Ingresses


def service(name: str, namespace: str, spec: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"ports": [{"port": 80, "targetPort": 8080}], **spec},
    }


def test_consumer_load_balancer_with_external_ips_is_refused(
    clusters: Clusters, ids: dict[str, ClusterID], namespace: str
) -> None:
    ns = twin(clusters, ids, namespace)
    obj = service("exposed", ns, {"type": "LoadBalancer", "externalIPs": ["1.2.3.4"]})
    refused_object(clusters, ids, obj, "Service type LoadBalancer is refused")
    # externalIPs alone (on a ClusterIP Service) are refused too.
    only_ips = service("exposed-ips", ns, {"externalIPs": ["1.2.3.4"]})
    refused_object(clusters, ids, only_ips, "externalIPs")
    # externalIPs on a ClusterIP Service are refused as well.
    refused_object(clusters, ids, service("sneaky", ns, {"externalIPs": ["1.2.3.4"]}), "external addresses are refused")


def test_consumer_node_port_service_is_refused(clusters: Clusters, ids: dict[str, ClusterID], namespace: str) -> None:
    ns = twin(clusters, ids, namespace)
    refused_object(clusters, ids, service("np", ns, {"type": "NodePort"}), "Service type NodePort is refused")


def test_consumer_external_name_to_a_provider_service_is_refused(
    clusters: Clusters, ids: dict[str, ClusterID], namespace: str
) -> None:
    ns = twin(clusters, ids, namespace)
    obj = service("alias", ns, {"type": "ExternalName", "externalName": "kubernetes.default.svc.cluster.local"})
    obj["spec"].pop("ports")
    refused_object(clusters, ids, obj, "spec.externalName kubernetes.default.svc.cluster.local is refused")


def test_consumer_endpointslice_at_the_provider_api_is_refused(
    clusters: Clusters, ids: dict[str, ClusterID], namespace: str
) -> None:
    ns = twin(clusters, ids, namespace)
    api_ip = clusters.kubectl_json(PROVIDER, "get", "service", "kubernetes", "-n", "default")["spec"]["clusterIP"]
    obj = {
        "apiVersion": "discovery.k8s.io/v1",
        "kind": "EndpointSlice",
        "metadata": {"name": "api", "namespace": ns, "labels": {"kubernetes.io/service-name": "api"}},
        "addressType": "IPv4",
        "endpoints": [{"addresses": [api_ip]}],
        "ports": [{"name": "https", "port": 443, "protocol": "TCP"}],
    }
    stderr = refused_object(clusters, ids, obj, "endpoint addresses outside the consumer's ranges are refused")
    assert api_ip in stderr, stderr


def ingress(name: str, namespace: str, host: str, annotations: dict[str, str] | None = None) -> dict[str, Any]:
    backend = {"service": {"name": "web", "port": {"number": 80}}}
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "Ingress",
        "metadata": {"name": name, "namespace": namespace, "annotations": annotations or {}},
        "spec": {
            "rules": [{"host": host, "http": {"paths": [{"path": "/", "pathType": "Prefix", "backend": backend}]}}]
        },
    }


def test_consumer_ingress_with_an_arbitrary_host_is_refused(
    clusters: Clusters, ids: dict[str, ClusterID], namespace: str
) -> None:
    ns = twin(clusters, ids, namespace)
    stderr = refused_object(clusters, ids, ingress("hijack", ns, "login.provider.example"), "Ingress hosts outside")
    assert "login.provider.example" in stderr and "ingressHosts" in stderr, stderr


def test_consumer_ingress_with_a_configuration_snippet_is_refused(
    clusters: Clusters, ids: dict[str, ClusterID], namespace: str
) -> None:
    ns = twin(clusters, ids, namespace)
    host = f"web-{secrets.token_hex(3)}.tenant.example"
    snippet = {"nginx.ingress.kubernetes.io/configuration-snippet": "proxy_pass http://169.254.169.254;"}
    try:
        # Even with its host allowed, an annotation outside the allow-list refuses the Ingress.
        set_policy(clusters, ids, {"ingressHosts": [host]})
        eventually("the host projected", lambda: annotation(clusters, ns, podsecurity.INGRESS_HOSTS_ANNOTATION) == host)
        stderr = refused_object(clusters, ids, ingress("snippet", ns, host, snippet), "Ingress annotations outside")
        assert "configuration-snippet" in stderr, stderr
    finally:
        set_policy(clusters, ids, {"ingressHosts": None})


# ---------------------------------------------------------------------------- twin namespace names


def twin_request(ids: dict[str, ClusterID], name: str, spec: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "gpufed.io/v1alpha1",
        "kind": "TwinNamespace",
        "metadata": {"name": name, "namespace": tenant_namespace(ids["consumer"])},
        "spec": spec,
    }


def twin_refused(clusters: Clusters, ids: dict[str, ClusterID], name: str, reasons: tuple[str, ...]) -> dict[str, Any]:
    tns = tenant_namespace(ids["consumer"])

    def refused() -> dict[str, Any] | None:
        obj = clusters.kubectl_json(PROVIDER, "get", "twinnamespace", name, "-n", tns)
        st = obj.get("status") or {}
        return st if st.get("phase") == "Refused" else None

    st: dict[str, Any] = eventually(f"TwinNamespace {name} refused", refused)
    reason = next(c["reason"] for c in st["conditions"] if c["type"] == "Ready")
    assert reason in reasons, st
    events = clusters.kubectl_json(
        PROVIDER, "get", "events", "-n", tns, "--field-selector", f"involvedObject.name={name},reason={reason}"
    )["items"]
    assert events and events[0]["type"] == "Warning", events
    return st


def test_consumer_twin_name_colliding_with_another_consumers_namespace_is_refused(
    clusters: Clusters, ids: dict[str, ClusterID]
) -> None:
    victim = f"victim-{secrets.token_hex(3)}"
    labels = {CONSUMER_LABEL: "another-consumer", "gpufed.io/twin-of": "payments"}
    clusters.create(PROVIDER, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": victim, "labels": labels}})
    name = f"squat-{secrets.token_hex(3)}"
    try:
        p = clusters.kubectl(
            PROVIDER,
            "create",
            "-f",
            "-",
            *as_consumer(ids),
            input_text=json.dumps(twin_request(ids, name, {"namespace": "payments", "twinName": victim})),
        )
        assert p.returncode == 0, p.stderr
        st = twin_refused(clusters, ids, name, ("NamespaceTaken",))
        assert any(victim in c["message"] for c in st["conditions"]), st
        ns = clusters.kubectl_json(PROVIDER, "get", "namespace", victim)
        got = {k: v for k, v in ns["metadata"]["labels"].items() if k != "kubernetes.io/metadata.name"}
        assert got == labels, "the other consumer's namespace was not touched"
        assert "ownerReferences" not in ns["metadata"]
        can = clusters.kubectl(
            PROVIDER, "auth", "can-i", "create", "pods", "-n", victim, *as_consumer(ids), check=False
        )
        assert can.stdout.strip() == "no", "the consumer got no rights there"
    finally:
        clusters.kubectl(
            PROVIDER, "delete", "twinnamespace", name, "-n", tenant_namespace(ids["consumer"]), check=False
        )
        clusters.kubectl(PROVIDER, "delete", "namespace", victim, "--wait=false", check=False)


@pytest.mark.parametrize("spec", [{"namespace": "kube"}, {"namespace": "team", "twinName": "gpufed-tenant-someone"}])
def test_consumer_twin_name_with_a_reserved_prefix_is_refused(
    clusters: Clusters, ids: dict[str, ClusterID], spec: dict[str, str]
) -> None:
    name = f"reserved-{secrets.token_hex(3)}"
    wanted = spec.get("twinName") or twin_namespace(spec["namespace"], ids["consumer"])
    try:
        p = clusters.kubectl(
            PROVIDER, "create", "-f", "-", *as_consumer(ids), input_text=json.dumps(twin_request(ids, name, spec))
        )
        assert p.returncode == 0, p.stderr
        twin_refused(clusters, ids, name, ("NamespaceReserved", "InvalidRequest"))
        p = clusters.kubectl(PROVIDER, "get", "namespace", wanted, check=False)
        assert p.returncode != 0 and "NotFound" in p.stderr, f"namespace {wanted} was created"
    finally:
        clusters.kubectl(
            PROVIDER, "delete", "twinnamespace", name, "-n", tenant_namespace(ids["consumer"]), check=False
        )
