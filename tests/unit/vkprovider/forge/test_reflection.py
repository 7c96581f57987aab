"""Reflection forge: policy, provider copies of ConfigMaps/Secrets/Services/EndpointSlices/Ingresses, drift."""

from __future__ import annotations

import copy
import ipaddress
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpufed.apis.wire import MANAGED_BY, MANAGED_BY_LABEL, ORIGIN_CLUSTER_LABEL, ORIGIN_NODE_LABEL, ORIGIN_UID_LABEL
from vkprovider.forge.meta import LAST_APPLIED_ANNOTATION, Target
from vkprovider.forge.reflection import (
    ALLOW_ANNOTATION,
    CONFIG_MAP,
    ENDPOINT_SLICE,
    ENDPOINTSLICE_MANAGED_BY_LABEL,
    INGRESS,
    KINDS,
    KINDS_BY_NAME,
    REFLECTION_MANAGER,
    SECRET,
    SERVICE,
    SERVICE_NAME_LABEL,
    SKIP_ANNOTATION,
    Decision,
    covers,
    ingress_annotation_allowed,
    needs_apply,
    needs_recreate,
    policy,
    reflection_owned,
    remote_config_map,
    remote_endpoint_slice,
    remote_ingress,
    remote_secret,
    remote_service,
)

CONSUMER = "consumer-1a2b3c4d"
UID = "0b6a7c1e-5d2f-4f7a-8e3b-9c1d2e3f4a5b"
TARGET = Target(consumer=CONSUMER, node="gpufed-gpu-a-3f2c91d0", namespace="team-consumer-1a2b3c4d", provider="gpu-a")
ORIGIN = {ORIGIN_CLUSTER_LABEL: CONSUMER, ORIGIN_UID_LABEL: UID, MANAGED_BY_LABEL: MANAGED_BY}
#: Local labels that try to claim another owner: the origin labels must win.
FORGED = {ORIGIN_CLUSTER_LABEL: "intruder", ORIGIN_UID_LABEL: "not-the-uid", MANAGED_BY_LABEL: "helm", "app": "web"}


def meta(name: str, **extra: Any) -> dict[str, Any]:
    return {
        "name": name,
        "namespace": "team",
        "uid": UID,
        "resourceVersion": "4711",
        "creationTimestamp": "2024-05-01T10:00:00Z",
        "generation": 3,
        "ownerReferences": [{"apiVersion": "apps/v1", "kind": "Deployment", "name": "web", "uid": "d-uid"}],
        "finalizers": ["example.com/keep"],
        "managedFields": [{"manager": "kubectl", "operation": "Update"}],
        **extra,
    }


def annotated(**annotations: str) -> dict[str, Any]:
    return {"metadata": {"name": "obj", "annotations": annotations}}


# ---------------------------------------------------------------- kinds


def test_kinds_name_their_api() -> None:
    assert [k.kind for k in KINDS] == ["ConfigMap", "Secret", "Service", "EndpointSlice", "Ingress"]
    assert KINDS_BY_NAME["EndpointSlice"] is ENDPOINT_SLICE
    # Paths are built by gpufed.kube.rest (one quoted segment per name) from these.
    assert (CONFIG_MAP.api_version, CONFIG_MAP.plural) == ("v1", "configmaps")
    assert (SECRET.api_version, SECRET.plural) == ("v1", "secrets")
    assert (ENDPOINT_SLICE.api_version, ENDPOINT_SLICE.plural) == ("discovery.k8s.io/v1", "endpointslices")
    assert INGRESS.api_version == "networking.k8s.io/v1"
    assert SERVICE.plural == "services"


# ---------------------------------------------------------------- policy


@pytest.mark.parametrize(
    ("obj_annotations", "ns_annotations", "expected"),
    [
        ({}, {}, Decision(True, "Reflected", "obj is reflected")),
        ({SKIP_ANNOTATION: "true"}, {}, Decision(False, "Skipped", f"obj is annotated {SKIP_ANNOTATION}=true")),
        ({SKIP_ANNOTATION: "TRUE"}, {}, Decision(False, "Skipped", f"obj is annotated {SKIP_ANNOTATION}=true")),
        ({SKIP_ANNOTATION: "false"}, {}, Decision(True, "Reflected", "obj is reflected")),
        ({SKIP_ANNOTATION: "yes"}, {}, Decision(True, "Reflected", "obj is reflected")),
        # the namespace's allow annotation alone does not skip, nor does the object's allow alone matter
        ({ALLOW_ANNOTATION: "true"}, {}, Decision(True, "Reflected", "obj is reflected")),
        ({ALLOW_ANNOTATION: "True"}, {ALLOW_ANNOTATION: "true"}, Decision(True, "Reflected", "obj is reflected")),
        ({}, {ALLOW_ANNOTATION: "false"}, Decision(True, "Reflected", "obj is reflected")),
        (
            {SKIP_ANNOTATION: "true", ALLOW_ANNOTATION: "true"},
            {ALLOW_ANNOTATION: "true"},
            Decision(False, "Skipped", f"obj is annotated {SKIP_ANNOTATION}=true"),
        ),
    ],
)
def test_policy_matrix(obj_annotations: dict[str, str], ns_annotations: dict[str, str], expected: Decision) -> None:
    assert policy(annotated(**obj_annotations), ns_annotations) == expected


@pytest.mark.parametrize("value", [None, "false", "1"])
def test_allow_list_namespace_refuses_objects_not_allowed(value: str | None) -> None:
    obj = annotated() if value is None else annotated(**{ALLOW_ANNOTATION: value})
    decision = policy(obj, {ALLOW_ANNOTATION: "TRUE"})
    assert (decision.reflect, decision.reason) == (False, "NotAllowed")
    assert ALLOW_ANNOTATION in decision.message


@pytest.mark.parametrize("secret_type", ["kubernetes.io/service-account-token", "bootstrap.kubernetes.io/token"])
def test_policy_refuses_cluster_bound_secrets_even_when_allowed(secret_type: str) -> None:
    obj = {**annotated(**{ALLOW_ANNOTATION: "true"}), "type": secret_type}
    decision = policy(obj, {ALLOW_ANNOTATION: "true"})
    assert (decision.reflect, decision.reason) == (False, "ClusterBound")
    assert secret_type in decision.message


def test_policy_reflects_ordinary_secret_types() -> None:
    assert policy({**annotated(), "type": "kubernetes.io/tls"}, {}).reflect is True


# ---------------------------------------------------------------- ConfigMaps and Secrets


def config_map(name: str = "settings") -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": meta(
            name,
            labels=dict(FORGED),
            annotations={LAST_APPLIED_ANNOTATION: "{}", "gpufed.io/note": "kept", "team": "ml"},
        ),
        "data": {"model": "llama"},
        "binaryData": {"blob": "AAEC"},
        "immutable": True,
    }


def test_config_map_copy() -> None:
    assert remote_config_map(config_map(), TARGET) == {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": "settings",
            "namespace": TARGET.namespace,
            "labels": {"app": "web", **ORIGIN},
            # only last-applied goes: annotations on ConfigMaps are the user's data
            "annotations": {"gpufed.io/note": "kept", "team": "ml"},
        },
        "data": {"model": "llama"},
        "binaryData": {"blob": "AAEC"},
        "immutable": True,
    }


def test_config_map_without_kind_field_still_gets_its_kind() -> None:
    item = config_map()
    del item["kind"], item["apiVersion"]  # list items come without them
    body = remote_config_map(item, TARGET)
    assert body is not None
    assert (body["apiVersion"], body["kind"]) == ("v1", "ConfigMap")


def test_root_ca_config_map_is_the_providers() -> None:
    assert remote_config_map(config_map("kube-root-ca.crt"), TARGET) is None


def secret(secret_type: str | None) -> dict[str, Any]:
    body: dict[str, Any] = {
        "metadata": meta("creds", labels=dict(FORGED)),
        "data": {"token": "c2VjcmV0"},
    }
    if secret_type is not None:
        body["type"] = secret_type
    return body


@pytest.mark.parametrize("secret_type", ["kubernetes.io/service-account-token", "bootstrap.kubernetes.io/token"])
def test_cluster_bound_secrets_are_not_copied(secret_type: str) -> None:
    assert remote_secret(secret(secret_type), TARGET) is None


@pytest.mark.parametrize("secret_type", ["Opaque", "kubernetes.io/tls", "kubernetes.io/dockerconfigjson", None])
def test_secret_copy(secret_type: str | None) -> None:
    body = remote_secret(secret(secret_type), TARGET)
    assert body is not None
    expected: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {
            "name": "creds",
            "namespace": TARGET.namespace,
            "labels": {"app": "web", **ORIGIN},
            "annotations": {},
        },
        "data": {"token": "c2VjcmV0"},
    }
    if secret_type is not None:
        expected["type"] = secret_type
    assert body == expected


# ---------------------------------------------------------------- Services


def service(spec: dict[str, Any], annotations: dict[str, str] | None = None) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": meta("web", labels=dict(FORGED), annotations=annotations or {}),
        "spec": spec,
        "status": {"loadBalancer": {"ingress": [{"ip": "203.0.113.7"}]}},
    }


HTTP_PORT = {"name": "http", "protocol": "TCP", "port": 80, "targetPort": 8080, "appProtocol": "http"}
COMMON_SPEC: dict[str, Any] = {
    "selector": {"app": "web"},
    "clusterIP": "10.96.12.34",
    "clusterIPs": ["10.96.12.34"],
    "ipFamilies": ["IPv4"],
    "ipFamilyPolicy": "SingleStack",
    "sessionAffinity": "ClientIP",
    "sessionAffinityConfig": {"clientIP": {"timeoutSeconds": 600}},
    "internalTrafficPolicy": "Cluster",
    "publishNotReadyAddresses": True,
}
COPIED_SPEC: dict[str, Any] = {
    "type": "ClusterIP",
    "sessionAffinity": "ClientIP",
    "sessionAffinityConfig": {"clientIP": {"timeoutSeconds": 600}},
    "publishNotReadyAddresses": True,
    "ports": [HTTP_PORT],
}


def test_cluster_ip_service_loses_selector_and_ip() -> None:
    body = remote_service(service({**COMMON_SPEC, "type": "ClusterIP", "ports": [HTTP_PORT]}), TARGET)
    assert body == {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {
            "name": "web",
            "namespace": TARGET.namespace,
            "labels": {"app": "web", **ORIGIN},
            "annotations": {},
        },
        "spec": COPIED_SPEC,
    }


def test_node_port_service_becomes_cluster_ip_without_node_ports() -> None:
    ports = [{**HTTP_PORT, "nodePort": 30080}, {"name": "metrics", "protocol": "TCP", "port": 9090, "nodePort": 30090}]
    spec = {**COMMON_SPEC, "type": "NodePort", "ports": ports, "externalTrafficPolicy": "Local"}
    body = remote_service(service(spec), TARGET)
    assert body["spec"] == {**COPIED_SPEC, "ports": [HTTP_PORT, {"name": "metrics", "protocol": "TCP", "port": 9090}]}


def test_load_balancer_service_becomes_cluster_ip_without_load_balancer_annotations() -> None:
    spec = {
        **COMMON_SPEC,
        "type": "LoadBalancer",
        "ports": [{**HTTP_PORT, "nodePort": 31000}],
        "externalIPs": ["198.51.100.9"],
        "loadBalancerIP": "203.0.113.7",
        "loadBalancerSourceRanges": ["0.0.0.0/0"],
        "loadBalancerClass": "example.com/lb",
        "externalTrafficPolicy": "Local",
        "healthCheckNodePort": 32000,
        "allocateLoadBalancerNodePorts": True,
    }
    annotations = {
        "service.beta.kubernetes.io/aws-load-balancer-type": "nlb",
        "metallb.universe.tf/loadBalancerIPs": "203.0.113.7",
        "cloud.google.com/LoadBalancer-type": "Internal",
        "gpufed.io/decision": "offloaded",
        LAST_APPLIED_ANNOTATION: "{}",
        "prometheus.io/scrape": "true",
    }
    body = remote_service(service(spec, annotations), TARGET)
    assert body["spec"] == COPIED_SPEC
    assert body["metadata"]["annotations"] == {"prometheus.io/scrape": "true"}
    assert "status" not in body


def test_headless_service_stays_headless() -> None:
    spec: dict[str, Any] = {"type": "ClusterIP", "clusterIP": "None", "clusterIPs": ["None"], "selector": {"app": "db"}}
    spec["ports"] = [{"name": "pg", "protocol": "TCP", "port": 5432, "targetPort": 5432}]
    body = remote_service(service(spec), TARGET)
    assert body["spec"] == {"type": "ClusterIP", "clusterIP": "None", "ports": spec["ports"]}


def test_headless_service_without_ports() -> None:
    body = remote_service(service({"type": "ClusterIP", "clusterIP": "None", "selector": {"app": "db"}}), TARGET)
    assert body["spec"] == {"type": "ClusterIP", "clusterIP": "None"}


def test_external_name_service_is_copied_as_external_name() -> None:
    spec = {
        "type": "ExternalName",
        "externalName": "db.example.com",
        "sessionAffinity": "None",
        "ports": [{"name": "pg", "protocol": "TCP", "port": 5432, "targetPort": 5432}],
    }
    body = remote_service(service(spec), TARGET)
    assert body["spec"] == {"type": "ExternalName", "externalName": "db.example.com", "ports": spec["ports"]}


# ---------------------------------------------------------------- EndpointSlices


def to_remote_ip(ip: str) -> str:
    """10.244.x.y (consumer pod CIDR) -> 10.71.x.y (its remap on the provider); anything else: no route."""
    address = ipaddress.ip_address(ip)
    if address not in ipaddress.ip_network("10.244.0.0/16"):
        raise ValueError(f"{ip} has no remote address")
    return "10.71." + ".".join(ip.split(".")[2:])


def endpoint(ip: str, *, ready: bool = True, **extra: Any) -> dict[str, Any]:
    return {
        "addresses": [ip],
        "conditions": {"ready": ready, "serving": ready, "terminating": False},
        "nodeName": "worker-1",
        "zone": "eu-west-1a",
        "hints": {"forZones": [{"name": "eu-west-1a"}]},
        "targetRef": {"kind": "Pod", "namespace": "team", "name": "web-7d9f", "uid": "pod-uid"},
        **extra,
    }


PORTS = [{"name": "http", "protocol": "TCP", "port": 8080, "appProtocol": "http"}]


def endpoint_slice(
    endpoints: list[dict[str, Any]],
    *,
    address_type: str = "IPv4",
    service_name: str | None = "web",
    managed_by: str = "endpointslice-controller.k8s.io",
) -> dict[str, Any]:
    labels = {**FORGED, ENDPOINTSLICE_MANAGED_BY_LABEL: managed_by}
    if service_name is not None:
        labels[SERVICE_NAME_LABEL] = service_name
    return {
        "apiVersion": "discovery.k8s.io/v1",
        "kind": "EndpointSlice",
        "metadata": meta(
            "web-x8k2p",
            labels=labels,
            annotations={"endpoints.kubernetes.io/last-change-trigger-time": "2024-05-01T10:00:00Z"},
        ),
        "addressType": address_type,
        "endpoints": endpoints,
        "ports": PORTS,
    }


def test_endpoint_slice_addresses_are_translated_and_consumer_names_dropped() -> None:
    local = endpoint_slice(
        [
            endpoint("10.244.1.7", hostname="web-0"),
            endpoint("10.244.2.9", ready=False),
            endpoint("192.168.5.5"),  # no route from the provider: left out
        ]
    )
    body = remote_endpoint_slice(local, TARGET, to_remote_ip, {"web", "db"})
    assert body == {
        "apiVersion": "discovery.k8s.io/v1",
        "kind": "EndpointSlice",
        "metadata": {
            "name": "web-x8k2p",
            "namespace": TARGET.namespace,
            "labels": {
                "app": "web",
                SERVICE_NAME_LABEL: "web",
                ENDPOINTSLICE_MANAGED_BY_LABEL: REFLECTION_MANAGER,
                **ORIGIN,
            },
            "annotations": {"endpoints.kubernetes.io/last-change-trigger-time": "2024-05-01T10:00:00Z"},
        },
        "addressType": "IPv4",
        "endpoints": [
            {
                "addresses": ["10.71.1.7"],
                "conditions": {"ready": True, "serving": True, "terminating": False},
                "hostname": "web-0",
            },
            {"addresses": ["10.71.2.9"], "conditions": {"ready": False, "serving": False, "terminating": False}},
        ],
        "ports": PORTS,
    }


def test_fqdn_endpoints_are_not_translated() -> None:
    local = endpoint_slice([endpoint("db.example.com")], address_type="FQDN")
    body = remote_endpoint_slice(local, TARGET, to_remote_ip, {"web"})
    assert body is not None
    assert body["endpoints"] == [
        {"addresses": ["db.example.com"], "conditions": {"ready": True, "serving": True, "terminating": False}}
    ]


def test_ipv6_endpoints_go_through_the_translator() -> None:
    calls: list[str] = []

    def record(ip: str) -> str:
        calls.append(ip)
        return "fd00:71::7"

    local = endpoint_slice([endpoint("fd00:244::7")], address_type="IPv6")
    body = remote_endpoint_slice(local, TARGET, record, {"web"})
    assert calls == ["fd00:244::7"]
    assert body is not None
    assert body["endpoints"][0]["addresses"] == ["fd00:71::7"]


@pytest.mark.parametrize(
    ("service_name", "reflected"),
    [("web", set()), ("web", {"db"}), (None, {"web"}), ("", {""})],
)
def test_slices_of_services_not_reflected_are_not_copied(service_name: str | None, reflected: set[str]) -> None:
    local = endpoint_slice([endpoint("10.244.1.7")], service_name=service_name)
    assert remote_endpoint_slice(local, TARGET, to_remote_ip, reflected) is None


def test_our_own_slices_are_never_reflected_back() -> None:
    local = endpoint_slice([endpoint("10.244.1.7")], managed_by=REFLECTION_MANAGER)
    assert remote_endpoint_slice(local, TARGET, to_remote_ip, {"web"}) is None


def test_slice_without_endpoints_or_ports_has_empty_lists() -> None:
    local = endpoint_slice([])
    del local["endpoints"], local["ports"]
    body = remote_endpoint_slice(local, TARGET, to_remote_ip, {"web"})
    assert body is not None
    assert (body["endpoints"], body["ports"]) == ([], [])


# ---------------------------------------------------------------- Ingresses


def ingress(class_name: str | None = None, class_annotation: str | None = None) -> dict[str, Any]:
    annotations = {"nginx.ingress.kubernetes.io/rewrite-target": "/", "gpufed.io/x": "y", LAST_APPLIED_ANNOTATION: "{}"}
    if class_annotation is not None:
        annotations["kubernetes.io/ingress.class"] = class_annotation
    spec: dict[str, Any] = {
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
        "tls": [{"hosts": ["web.example.com"], "secretName": "web-tls"}],
        "defaultBackend": {"service": {"name": "fallback", "port": {"name": "http"}}},
    }
    if class_name is not None:
        spec["ingressClassName"] = class_name
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "Ingress",
        "metadata": meta("web", labels=dict(FORGED), annotations=annotations),
        "spec": spec,
        "status": {"loadBalancer": {"ingress": [{"ip": "203.0.113.7"}]}},
    }


def test_ingress_with_existing_class_is_copied() -> None:
    local = ingress("nginx")
    outcome = remote_ingress(local, TARGET, {"nginx", "traefik"}, None, ["nginx.ingress.kubernetes.io/rewrite-target"])
    assert (outcome.reason, outcome.message) == ("Reflected", "ingress web reflected with class 'nginx' of gpu-a")
    assert outcome.dropped == ()
    assert outcome.body == {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "Ingress",
        "metadata": {
            "name": "web",
            "namespace": TARGET.namespace,
            "labels": {"app": "web", **ORIGIN},
            "annotations": {"nginx.ingress.kubernetes.io/rewrite-target": "/"},
        },
        "spec": local["spec"],  # the TLS Secret keeps its name: Secrets are reflected under theirs
    }


def test_ingress_annotations_the_provider_does_not_publish_as_allowed_are_left_out_and_named() -> None:
    local = ingress(class_annotation="nginx")
    local["metadata"]["annotations"]["nginx.ingress.kubernetes.io/configuration-snippet"] = "deny all;"
    outcome = remote_ingress(local, TARGET, {"nginx"}, None)
    assert outcome.body is not None
    # Only the class annotation is sure to pass the provider's gpufed-consumer-objects policy.
    assert outcome.body["metadata"]["annotations"] == {"kubernetes.io/ingress.class": "nginx"}
    assert outcome.dropped == (
        "nginx.ingress.kubernetes.io/configuration-snippet",
        "nginx.ingress.kubernetes.io/rewrite-target",
    )
    assert "left out: nginx.ingress.kubernetes.io/configuration-snippet" in outcome.message


def test_ingress_annotations_follow_the_published_allow_list_exact_and_prefix() -> None:
    local = ingress("nginx")
    local["metadata"]["annotations"].update({"example.com/a": "1", "example.com/b": "2", "other.io/c": "3"})
    outcome = remote_ingress(local, TARGET, {"nginx"}, None, ["example.com/*", "other.io/d"])
    assert outcome.body is not None
    assert outcome.body["metadata"]["annotations"] == {"example.com/a": "1", "example.com/b": "2"}
    assert outcome.dropped == ("nginx.ingress.kubernetes.io/rewrite-target", "other.io/c")


@pytest.mark.parametrize(
    ("key", "allowed", "expected"),
    [
        ("kubernetes.io/ingress.class", [], True),
        ("nginx.ingress.kubernetes.io/server-snippet", [], False),
        ("nginx.ingress.kubernetes.io/server-snippet", ["nginx.ingress.kubernetes.io/*"], True),
        ("nginx.ingress.kubernetes.io/server-snippet", ["nginx.ingress.kubernetes.io/ssl-redirect"], False),
        ("nginx.ingress.kubernetes.io/ssl-redirect", ["nginx.ingress.kubernetes.io/ssl-redirect"], True),
        ("example.com/ab", ["example.com/a"], False),
    ],
)
def test_ingress_annotation_allowed_decides_as_the_providers_policy(
    key: str, allowed: list[str], expected: bool
) -> None:
    assert ingress_annotation_allowed(key, allowed) is expected


def test_ingress_with_missing_class_is_refused() -> None:
    outcome = remote_ingress(ingress("nginx"), TARGET, {"traefik"}, "traefik")
    assert outcome.body is None
    assert outcome.reason == "IngressClassMissing"
    assert "'nginx'" in outcome.message
    assert "gpu-a" in outcome.message


def test_ingress_class_from_the_deprecated_annotation() -> None:
    missing = remote_ingress(ingress(class_annotation="nginx"), TARGET, set(), "traefik")
    assert (missing.body, missing.reason) == (None, "IngressClassMissing")
    present = remote_ingress(ingress(class_annotation="nginx"), TARGET, {"nginx"}, None)
    assert present.body is not None
    # kept as the annotation: an Ingress carrying both the annotation and the field is rejected
    assert present.body["metadata"]["annotations"]["kubernetes.io/ingress.class"] == "nginx"
    assert "ingressClassName" not in present.body["spec"]


def test_ingress_without_class_uses_the_providers_default() -> None:
    outcome = remote_ingress(ingress(), TARGET, {"traefik"}, "traefik")
    assert outcome.reason == "Reflected"
    assert "default class 'traefik'" in outcome.message
    assert outcome.body is not None
    assert "ingressClassName" not in outcome.body["spec"]


def test_ingress_without_class_and_without_default_is_refused() -> None:
    outcome = remote_ingress(ingress(), Target(CONSUMER, "vn", "ns-x"), {"traefik"}, None)
    assert (outcome.body, outcome.reason) == (None, "IngressClassMissing")
    assert outcome.message == "ingress web names no class and the provider has no default IngressClass"


# ---------------------------------------------------------------- covers and drift


def test_covers_basics() -> None:
    assert covers({"a": 1, "b": {"c": [1, {"d": 2, "e": 3}]}}, {"b": {"c": [1, {"d": 2}]}})
    assert not covers({"a": 1}, {"a": 1, "b": 2})
    assert not covers({"a": [1, 2, 3]}, {"a": [1, 2]})
    assert not covers({"a": "1"}, {"a": 1})
    assert not covers({"a": 1}, {"a": True})
    assert not covers([{"a": 1}], {"a": 1})
    assert covers({"a": None}, {"a": None})
    assert not covers({}, {"a": None})
    assert covers({"a": 1.0}, {"a": 1})


def applied(body: dict[str, Any] | None, **server: Any) -> dict[str, Any]:
    """`body` as the API server returns it: server-side metadata and defaults added."""
    assert body is not None
    have = copy.deepcopy(body)
    have["metadata"].update(uid="remote-uid", resourceVersion="99", creationTimestamp="2024-05-02T00:00:00Z")
    have["metadata"]["labels"]["added-by-provider"] = "x"
    for key, value in server.items():
        if isinstance(value, dict) and isinstance(have.get(key), dict):
            have[key].update(value)
        else:
            have[key] = value
    return have


def test_needs_apply_when_absent() -> None:
    assert needs_apply({"kind": "ConfigMap", "metadata": {}}, None)


def test_service_with_server_defaults_is_no_drift() -> None:
    want = remote_service(service({**COMMON_SPEC, "ports": [{"name": "http", "port": 80}]}), TARGET)
    have = applied(
        want,
        spec={
            "clusterIP": "10.43.0.17",
            "clusterIPs": ["10.43.0.17"],
            "ipFamilies": ["IPv4"],
            "ipFamilyPolicy": "SingleStack",
            "internalTrafficPolicy": "Cluster",
            "ports": [{"name": "http", "port": 80, "protocol": "TCP", "targetPort": 80}],
        },
        status={"loadBalancer": {}},
    )
    assert not needs_apply(want, have)
    assert not needs_recreate(want, have)
    changed = copy.deepcopy(have)
    changed["spec"]["ports"][0]["port"] = 81
    assert needs_apply(want, changed)
    extra_port = copy.deepcopy(have)
    extra_port["spec"]["ports"].append({"name": "grpc", "port": 9000, "protocol": "TCP", "targetPort": 9000})
    assert needs_apply(want, extra_port)


def test_config_map_drift() -> None:
    want = remote_config_map({**config_map(), "immutable": False}, TARGET)
    assert want is not None
    have = applied(want)
    assert not needs_apply(want, have)
    changed = applied(want, data={"model": "mistral"})
    assert needs_apply(want, changed)
    assert not needs_recreate(want, changed)
    extra_key = applied(want, data={"model": "llama", "stale": "1"})
    assert needs_apply(want, extra_key)
    missing_label = copy.deepcopy(have)
    del missing_label["metadata"]["labels"][ORIGIN_UID_LABEL]
    assert needs_apply(want, missing_label)
    changed_annotation = copy.deepcopy(have)
    changed_annotation["metadata"]["annotations"]["team"] = "infra"
    assert needs_apply(want, changed_annotation)


def test_config_map_missing_data_equals_empty() -> None:
    local = {"metadata": meta("empty"), "data": {}}
    want = remote_config_map(local, TARGET)
    assert want is not None
    have = applied(want)
    del have["data"]
    assert not needs_apply(want, have)
    assert not needs_apply({**want, "immutable": False}, have)


def test_immutable_config_map_with_new_data_must_be_recreated() -> None:
    want = remote_config_map(config_map(), TARGET)
    assert want is not None
    assert not needs_recreate(want, applied(want))
    stale = applied(want, data={"model": "old"})
    assert needs_apply(want, stale)
    assert needs_recreate(want, stale)


def test_secret_type_change_must_be_recreated() -> None:
    want = remote_secret(secret(None), TARGET)
    assert want is not None
    opaque = applied(want, type="Opaque")  # the server's default type
    assert not needs_apply(want, opaque)
    assert not needs_recreate(want, opaque)
    tls = applied(want, type="kubernetes.io/tls")
    assert needs_apply(want, tls)
    assert needs_recreate(want, tls)


def test_service_switching_headless_must_be_recreated() -> None:
    headless = remote_service(service({"clusterIP": "None", "ports": [HTTP_PORT]}), TARGET)
    allocated = applied(remote_service(service({"ports": [HTTP_PORT]}), TARGET), spec={"clusterIP": "10.43.0.9"})
    assert needs_apply(headless, allocated)
    assert needs_recreate(headless, allocated)
    normal = remote_service(service({"ports": [HTTP_PORT]}), TARGET)
    assert needs_recreate(normal, applied(headless))
    external = remote_service(service({"type": "ExternalName", "externalName": "a.example.com"}), TARGET)
    assert needs_apply(external, allocated)
    assert not needs_recreate(external, allocated)
    # ExternalName has no cluster IP: switching to or from it, headless or not, is an ordinary apply
    assert not needs_recreate(headless, applied(external))
    assert not needs_recreate(external, applied(headless))


def test_endpoint_slice_empty_endpoints_equal_missing() -> None:
    want = remote_endpoint_slice(endpoint_slice([]), TARGET, to_remote_ip, {"web"})
    assert want is not None
    have = applied(want)
    del have["endpoints"]
    assert not needs_apply(want, have)
    have["endpoints"] = None
    assert not needs_apply(want, have)


def test_endpoint_slice_drift() -> None:
    want = remote_endpoint_slice(endpoint_slice([endpoint("10.244.1.7")]), TARGET, to_remote_ip, {"web"})
    assert want is not None
    have = applied(want)
    assert not needs_apply(want, have)
    flipped = copy.deepcopy(have)
    flipped["endpoints"][0]["conditions"]["ready"] = False
    assert needs_apply(want, flipped)
    assert not needs_recreate(want, flipped)
    moved = copy.deepcopy(have)
    moved["endpoints"][0]["addresses"] = ["10.71.1.8"]
    assert needs_apply(want, moved)
    ipv6 = applied(want, addressType="IPv6")
    assert needs_apply(want, ipv6)
    assert needs_recreate(want, ipv6)


def test_ingress_with_class_defaulted_remotely_is_no_drift() -> None:
    want = remote_ingress(ingress(), TARGET, set(), "traefik").body
    assert want is not None
    have = applied(want, spec={"ingressClassName": "traefik"})
    assert not needs_apply(want, have)
    retargeted = copy.deepcopy(have)
    retargeted["spec"]["rules"][0]["host"] = "other.example.com"
    assert needs_apply(want, retargeted)


def test_needs_apply_for_other_kinds_compares_every_content_field() -> None:
    want = {"kind": "Widget", "metadata": {}, "spec": {"size": 2}}
    assert not needs_apply(want, {"kind": "Widget", "metadata": {}, "spec": {"size": 2, "default": 1}})
    assert needs_apply(want, {"kind": "Widget", "metadata": {}, "spec": {"size": 3}})


# ---------------------------------------------------------------- ownership


def test_reflection_owned() -> None:
    body = remote_secret(secret("Opaque"), TARGET)
    assert body is not None
    assert reflection_owned(body, CONSUMER)
    assert not reflection_owned(body, "other-consumer")
    assert not reflection_owned({"metadata": {"name": "made-by-a-provider-user"}}, CONSUMER)


# ---------------------------------------------------------------- purity and properties


def forge_all(local: dict[str, Any]) -> list[dict[str, Any] | None]:
    slice_local = {
        **local,
        "metadata": {
            **local["metadata"],
            "labels": {**(local["metadata"].get("labels") or {}), SERVICE_NAME_LABEL: "web"},
        },
    }
    return [
        remote_config_map(local, TARGET),
        remote_secret(local, TARGET),
        remote_service(local, TARGET),
        remote_endpoint_slice(slice_local, TARGET, to_remote_ip, {"web"}),
        remote_ingress(local, TARGET, {"nginx"}, "nginx").body,
    ]


@pytest.mark.parametrize(
    "local",
    [
        config_map(),
        secret("Opaque"),
        service({**COMMON_SPEC, "type": "LoadBalancer", "ports": [{**HTTP_PORT, "nodePort": 30080}]}),
        endpoint_slice([endpoint("10.244.1.7"), endpoint("8.8.8.8")]),
        ingress("nginx"),
    ],
)
def test_inputs_are_not_mutated(local: dict[str, Any]) -> None:
    before = copy.deepcopy(local)
    bodies = forge_all(local)
    assert local == before
    # and the bodies share no mutable state with the input: wrecking them leaves it intact
    for body in bodies:
        wreck(body)
    assert local == before


def wreck(value: Any) -> None:
    """Empty every dict and list inside `value`, innermost first."""
    if isinstance(value, dict):
        for item in value.values():
            wreck(item)
        value.clear()
    elif isinstance(value, list):
        for item in value:
            wreck(item)
        value.clear()


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=5),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=5), children, max_size=4),
    max_leaves=20,
)


@settings(max_examples=200, deadline=None, database=None)
@given(JSON)
def test_covers_is_reflexive(value: Any) -> None:
    assert covers(value, value)
    assert covers(copy.deepcopy(value), value)


@settings(max_examples=200, deadline=None, database=None)
@given(JSON, st.dictionaries(st.text(max_size=5), JSON, max_size=3))
def test_extra_fields_in_have_never_count_as_drift(want: Any, extra: dict[str, Any]) -> None:
    have = {**extra, "want": want}
    assert covers(have, {"want": want})


LABEL_KEYS = st.sampled_from([ORIGIN_CLUSTER_LABEL, ORIGIN_UID_LABEL, ORIGIN_NODE_LABEL, MANAGED_BY_LABEL, "app", "x"])
METADATA = st.fixed_dictionaries(
    {
        "name": st.sampled_from(["web", "kube-root-ca.crt", "db"]),
        "uid": st.just(UID),
        "resourceVersion": st.text(min_size=1, max_size=5),
        "ownerReferences": st.lists(st.fixed_dictionaries({"kind": st.just("Deployment"), "name": st.text()})),
        "labels": st.dictionaries(LABEL_KEYS, st.text(max_size=8), max_size=4),
        "annotations": st.dictionaries(st.text(max_size=10), st.text(max_size=5), max_size=3),
    }
)


@settings(max_examples=150, deadline=None, database=None)
@given(
    METADATA,
    st.sampled_from(["ClusterIP", "NodePort", "LoadBalancer", "ExternalName"]),
    st.sampled_from(["Opaque", "kubernetes.io/tls"]),
)
def test_forged_bodies_carry_no_server_fields_and_always_the_origin(
    metadata: dict[str, Any], service_type: str, secret_type: str
) -> None:
    local = {
        "metadata": metadata,
        "type": secret_type,
        "data": {"k": "dg=="},
        "spec": {"type": service_type, "selector": {"app": "web"}, "ports": [{"port": 80, "nodePort": 30001}]},
        "addressType": "IPv4",
        "endpoints": [endpoint("10.244.0.1")],
    }
    for body in forge_all(local):
        if body is None:
            continue
        forged_meta = body["metadata"]
        assert set(forged_meta) == {"name", "namespace", "labels", "annotations"}
        assert forged_meta["namespace"] == TARGET.namespace
        assert {k: forged_meta["labels"][k] for k in ORIGIN} == ORIGIN
        assert ORIGIN_NODE_LABEL not in forged_meta["labels"]
        assert reflection_owned(body, CONSUMER)
        assert "status" not in body
        spec = body.get("spec") or {}
        assert "selector" not in spec
        assert all("nodePort" not in p for p in spec.get("ports") or [])
