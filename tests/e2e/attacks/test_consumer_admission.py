"""Attacks from the CONSUMER position on the real local clusters: the consumer's identity on gpu-a
(the user `gpufed:consumer:<id>` of its client certificate, group `gpufed:consumers`, here through
impersonation by gpu-a's admin as tests/e2e/test_offload_policy.py does) writes straight into its
twin and tenant namespaces, skipping everything its own virtual kubelet would check or strip.

What refuses each attack is gpu-a's own API server: the ValidatingAdmissionPolicies
`gpufed-offload-policy` (pods: Pod Security baseline, or restricted when the tenant is held to it,
plus gpufed's rules) and `gpufed-consumer-objects` (Services, EndpointSlices, Ingresses), the
grant's ResourceQuota, and the provider's controller for twin namespace names (a TwinNamespace
status and a Warning Event), with Pod Security Admission (the twin namespace's `enforce` label) as a
first layer for pods. Each test (or case) is one attack; it asserts the refusal (and the rule it
names) and that nothing was created. The module peers the consumer with gpu-a; each test offloads its
own namespace.

Pods: one test parametrized over the rule table (`peering.podsecurity.RULES`, one or more attacks per
rule from `tests.e2e.helpers.POD_ATTACKS`, ids: the rule's id and the variant), each case refused by
Pod Security Admission in its words where its level covers the attack, else by gpufed's policy naming
the rule, where the pod breaks it and the Tenant field or standard; the same pod without the attack is
admitted. A second test takes Pod Security Admission away (the twin relabelled `enforce=privileged`)
and shows that gpufed's policy alone refuses every attack the first layer refused, at baseline and at
restricted.
"""

from __future__ import annotations

import contextlib
import json
import secrets
from collections.abc import Iterator
from typing import Any

import pytest

from gpufed.apis.pool import GPU_PRODUCT_LABEL
from gpufed.apis.wire import CONSUMER_LABEL, ClusterID, tenant_namespace, twin_namespace
from peering import podsecurity
from peering.handshake import CONSUMER_GROUP, consumer_user
from tests.e2e.attacks.podattacks import POD_ATTACKS, PodAttack, pod_attacks
from tests.e2e.conftest import Clusters
from tests.e2e.helpers import component_paused, eventually, offload, peered_session

pytestmark = pytest.mark.e2e

SMALL = {"cpu": "10m", "memory": "16Mi"}
PROVIDER = "gpu-a"
#: Pod Security Admission's label that makes it enforce a level in a namespace.
PSA_ENFORCE = f"{podsecurity.PSA_PREFIX}enforce"
#: The namespace flags that grant a rule's exception (what a Tenant's allow* field is projected to), by rule id.
ALLOW_LABELS = {
    podsecurity.PRIVILEGED.id: podsecurity.ALLOW_PRIVILEGED_LABEL,
    podsecurity.HOST_NAMESPACES.id: podsecurity.ALLOW_HOST_NAMESPACES_LABEL,
    podsecurity.HOST_PATH_VOLUMES.id: podsecurity.ALLOW_HOST_PATH_LABEL,
    podsecurity.HOST_PORTS.id: podsecurity.ALLOW_HOST_PORTS_LABEL,
}


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


def by_policy(stderr: str, attack: PodAttack, node: str = "") -> bool:
    """gpufed's pod policy refused the attack: its refusal names the rule, where the pod breaks it, and
    the Tenant field that would allow it (or the standard that refuses it)."""
    rule = attack.rule
    return (
        f"ValidatingAdmissionPolicy '{podsecurity.POLICY_NAME}'" in stderr
        and f"{rule.what} are refused (" in stderr
        and attack.where(node) in stderr
        and rule.tail in stderr
    )


def refused_pod(
    clusters: Clusters, ids: dict[str, ClusterID], namespace: str, attack: PodAttack, node: str = ""
) -> str:
    """The attack pod is refused, and no pod exists. Pod Security Admission (the twin namespace's enforce
    label) runs before the admission policies and refuses what its level covers, in its words; gpufed's
    policy refuses the rest in its own (test_consumer_pod_is_refused_by_gpufed_policy_alone shows that
    it refuses the first too)."""
    obj = attack.pod("attack", namespace, node)
    stderr = attempt(clusters, ids, obj)
    assert "Forbidden" in stderr, stderr
    if attack.psa:
        assert "violates PodSecurity" in stderr and attack.psa in stderr, stderr
    else:
        assert by_policy(stderr, attack, node), stderr
    absent(clusters, "pod", obj["metadata"]["name"], namespace)
    return stderr


def admitted(clusters: Clusters, ids: dict[str, ClusterID], obj: dict[str, Any]) -> None:
    """The consumer may create `obj` (a server-side dry run: nothing is created)."""
    p = clusters.kubectl(
        PROVIDER, "create", "--dry-run=server", "-f", "-", *as_consumer(ids), input_text=json.dumps(obj), check=False
    )
    assert p.returncode == 0, p.stderr


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


def labels(clusters: Clusters, namespace: str) -> dict[str, str]:
    found: dict[str, str] = clusters.kubectl_json(PROVIDER, "get", "namespace", namespace)["metadata"]["labels"]
    return found


def relabel(clusters: Clusters, namespace: str, values: dict[str, str]) -> None:
    """gpu-a's admin sets labels of `namespace`."""
    if values:
        clusters.kubectl(
            PROVIDER, "label", "namespace", namespace, "--overwrite", *(f"{k}={v}" for k, v in values.items())
        )


@contextlib.contextmanager
def held_to_restricted(clusters: Clusters, ids: dict[str, ClusterID], ns: str) -> Iterator[None]:
    """gpu-a's admin holds the consumer to Pod Security restricted, projected onto `ns` (gpufed's level
    annotation, and Pod Security Admission's enforce label); the default is restored afterwards."""
    try:
        set_policy(clusters, ids, {"podSecurity": {"level": "restricted"}})
        eventually(
            "level restricted projected", lambda: annotation(clusters, ns, podsecurity.LEVEL_ANNOTATION) == "restricted"
        )
        assert labels(clusters, ns)[PSA_ENFORCE] == "restricted"
        yield
    finally:
        set_policy(clusters, ids, {"podSecurity": None})


@contextlib.contextmanager
def gpu_products_limited(clusters: Clusters, ids: dict[str, ClusterID], ns: str) -> Iterator[None]:
    """gpu-a's admin lets the consumer pin the GPU products gpu-a has, and no other (a Tenant allows any by
    default), projected onto `ns`; the default is restored afterwards."""
    nodes = clusters.kubectl_json(PROVIDER, "get", "nodes", "-l", GPU_PRODUCT_LABEL)["items"]
    products = sorted({n["metadata"]["labels"][GPU_PRODUCT_LABEL] for n in nodes})
    assert products, "gpu-a has GPU nodes"
    try:
        set_policy(clusters, ids, {"allowedGpuProducts": products})
        eventually(
            "the allowed products projected",
            lambda: annotation(clusters, ns, podsecurity.ALLOWED_GPU_PRODUCTS_ANNOTATION) == ",".join(products),
        )
        yield
    finally:
        set_policy(clusters, ids, {"allowedGpuProducts": None})


def provider_policy(
    clusters: Clusters, ids: dict[str, ClusterID], ns: str, rule: podsecurity.Rule
) -> contextlib.AbstractContextManager[None]:
    """What gpu-a's admin sets in the consumer's Tenant for `rule` to apply (nothing for most rules)."""
    if rule.level == "restricted":
        return held_to_restricted(clusters, ids, ns)
    if rule is podsecurity.GPU_PRODUCTS:
        return gpu_products_limited(clusters, ids, ns)
    return contextlib.nullcontext()


# ---------------------------------------------------------------------------- pods: one case per attack on a rule


@pytest.mark.parametrize("attack", pod_attacks())
def test_consumer_pod_breaking_a_rule_is_refused(
    clusters: Clusters, ids: dict[str, ClusterID], namespace: str, attack: PodAttack
) -> None:
    ns = twin(clusters, ids, namespace)
    # A pod naming its node names a real one of gpu-a.
    node = clusters.kubectl_json(PROVIDER, "get", "nodes")["items"][0]["metadata"]["name"] if attack.names_node else ""
    with provider_policy(clusters, ids, ns, attack.rule):
        refused_pod(clusters, ids, ns, attack, node)
        # The same pod without the attack is admitted: the refusal is the attack's (and what the level
        # asks is satisfiable).
        admitted(clusters, ids, attack.control("control", ns))


@pytest.mark.parametrize("level", ["baseline", "restricted"])
def test_consumer_pod_is_refused_by_gpufed_policy_alone(
    clusters: Clusters, ids: dict[str, ClusterID], namespace: str, level: str
) -> None:
    """Every attack Pod Security Admission refuses at `level` (the case above accepts its refusal) is
    refused by gpufed's policy alone, in its words, when the twin namespace no longer enforces Pod
    Security (`enforce=privileged`, as for a tenant allowed an exception). gpu-a's controller is paused
    meanwhile: it would put the label back."""
    ns = twin(clusters, ids, namespace)
    attacks = [a for a in POD_ATTACKS if a.psa and a.rule.level == level]
    assert attacks
    restricted = held_to_restricted(clusters, ids, ns) if level == "restricted" else contextlib.nullcontext()
    with restricted, component_paused(clusters, PROVIDER, "gpufed-controller"):
        before = labels(clusters, ns)
        relabel(clusters, ns, {PSA_ENFORCE: "privileged"})
        try:
            assert labels(clusters, ns)[PSA_ENFORCE] == "privileged"
            for attack in attacks:
                refused_by_policy_alone(clusters, ids, ns, attack)
        finally:
            relabel(clusters, ns, {PSA_ENFORCE: before[PSA_ENFORCE]})
        assert labels(clusters, ns) == before


def refused_by_policy_alone(clusters: Clusters, ids: dict[str, ClusterID], ns: str, attack: PodAttack) -> None:
    """`attack` is refused by gpufed's policy in `ns`; the rules it cannot help breaking too are allowed
    meanwhile (the policy names the first rule a pod breaks), so the refusal is the rule's own."""
    allow = {ALLOW_LABELS[r.id]: "true" for r in attack.besides}
    before = labels(clusters, ns)
    relabel(clusters, ns, allow)
    try:
        obj = attack.pod("attack", ns)

        def refused() -> str | None:
            # Every try is refused; Pod Security Admission and the policy read the namespace from their
            # caches, which follow a relabelling shortly.
            stderr = attempt(clusters, ids, obj)
            return stderr if by_policy(stderr, attack) else None

        stderr = eventually(f"{attack.id}: refused by {podsecurity.POLICY_NAME} alone", refused, timeout=20)
        assert "violates PodSecurity" not in stderr, stderr
        absent(clusters, "pod", obj["metadata"]["name"], ns)
    finally:
        relabel(clusters, ns, {k: before[k] for k in allow})


# ---------------------------------------------------------------------------- pods: the grant's quota


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
