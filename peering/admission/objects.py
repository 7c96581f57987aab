"""The ValidatingAdmissionPolicy `gpufed-consumer-objects` and its binding (`objects_policy`,
`objects_binding`), for the Services, EndpointSlices and Ingresses a consumer identity writes into its
namespaces: Services ClusterIP or ExternalName only (no node ports, load balancers or external IPs;
an ExternalName never an address or a name inside a cluster), EndpointSlices with addresses only
inside the ranges the consumer is entitled to (`gpufed.io/endpoint-cidrs`), and Ingresses with the
hosts the tenant was given, no catch-all rule or default backend, and annotations from an allow-list.
Its variables read the namespace's projection (`peering.podsecurity.namespace_metadata`).

Does not: decide the consumer's ranges, hosts or annotations (the Tenant, projected by
`peering.podsecurity`), or check pods (`peering.admission.pods`).
"""

from __future__ import annotations

from typing import Any

from peering.admission.cel import binding, consumer_policy, csv_list, literal, namespace_variables
from peering.podsecurity import (
    ENDPOINT_CIDRS_ANNOTATION,
    INGRESS_ANNOTATIONS_ANNOTATION,
    INGRESS_CLASS_ANNOTATION,
    INGRESS_HOSTS_ANNOTATION,
    OBJECTS_POLICY_NAME,
)

#: What a refused object's user is told to ask for.
OBJECTS_FIELD = "Tenant spec.policy"
#: Suffixes of names that resolve inside a cluster: an ExternalName must not alias the provider's own Services.
CLUSTER_DNS_SUFFIXES = (".svc", ".cluster.local", ".local", "localhost")


def _object_rule(resource: str, expression: str, message_expression: str, message: str) -> dict[str, str]:
    return {
        "expression": f"request.resource.resource != '{resource}' || ({expression})",
        "messageExpression": message_expression,
        "message": message,
        "reason": "Forbidden",
    }


def _objects_validations() -> list[dict[str, str]]:
    out: list[dict[str, str]] = []
    svc_type = "object.spec.?type.orValue('ClusterIP')"
    out.append(
        _object_rule(
            "services",
            f"{svc_type} in ['ClusterIP', 'ExternalName']",
            f"'Service type ' + {svc_type} + ' is refused: a consumer may create ClusterIP and ExternalName "
            "Services only (external exposure stays on the consumer)'",
            "NodePort and LoadBalancer Services are refused",
        )
    )
    external = "object.spec.?externalIPs.orValue([])"
    lb_ip = "object.spec.?loadBalancerIP.orValue('')"
    ranges = "object.spec.?loadBalancerSourceRanges.orValue([])"
    out.append(
        _object_rule(
            "services",
            f"{external}.size() == 0 && {lb_ip} == '' && {ranges}.size() == 0",
            "'external addresses are refused (' + ("
            f"({external}.size() > 0 ? ['spec.externalIPs ' + {external}.join(',')] : []) + "
            f"({lb_ip} != '' ? ['spec.loadBalancerIP ' + {lb_ip}] : []) + "
            f"({ranges}.size() > 0 ? ['spec.loadBalancerSourceRanges ' + {ranges}.join(',')] : [])"
            ").join(', ') + '): a consumer may not claim addresses of the provider'",
            "external addresses (externalIPs, loadBalancerIP) are refused",
        )
    )
    name = "object.spec.?externalName.orValue('')"
    suffixes = " || ".join(f"{name}.lowerAscii().endsWith({literal(s)})" for s in CLUSTER_DNS_SUFFIXES)
    out.append(
        _object_rule(
            "services",
            f"{svc_type} != 'ExternalName' || !(isIP({name}) || {name}.lowerAscii().contains('.svc.') || {suffixes})",
            f"'spec.externalName ' + {name} + ' is refused: an ExternalName must be a DNS name outside the cluster, "
            "not an address or a name of the provider'",
            "an ExternalName that is an address or a cluster-internal name is refused",
        )
    )
    addresses = (
        "object.?endpoints.orValue([]).map(e, e.addresses).exists(l, l.exists(a, "
        "!variables.endpointCidrs.exists(n, cidr(n).containsIP(ip(a)))))"
    )
    out.append(
        _object_rule(
            "endpointslices",
            f"object.addressType == 'FQDN' || !({addresses})",
            "'endpoint addresses outside the consumer\\'s ranges are refused (' + "
            "object.?endpoints.orValue([]).map(e, e.addresses.filter(a, "
            "!variables.endpointCidrs.exists(n, cidr(n).containsIP(ip(a)))))"
            ".filter(l, l.size() > 0).map(l, l.join(',')).join(',') + '; allowed: ' + "
            "variables.endpointCidrs.join(',') + ')'",
            "endpoint addresses outside the consumer's ranges are refused",
        )
    )
    host_ok = (
        "variables.ingressHosts.exists(p, p.startsWith('*.') ? "
        "(h.endsWith(p.substring(1)) && !h.startsWith('*')) : h == p)"
    )
    rules = "object.spec.?rules.orValue([])"
    tls_hosts = "object.spec.?tls.orValue([]).map(t, t.?hosts.orValue([]))"
    rule_bad = f"r.?host.orValue('') == '' || ![r.host].all(h, {host_ok})"
    default = "has(object.spec.defaultBackend)"
    out.append(
        _object_rule(
            "ingresses",
            f"!{default} && {rules}.all(r, !({rule_bad})) && {tls_hosts}.all(l, l.all(h, {host_ok}))",
            "'Ingress hosts outside the allowed ones are refused (' + ("
            f"{rules}.filter(r, {rule_bad}).map(r, r.?host.orValue('(every host)')) + "
            f"{tls_hosts}.map(l, l.filter(h, !({host_ok}))).filter(l, l.size() > 0).map(l, 'tls ' + l.join(',')) + "
            f"({default} ? ['(default backend)'] : [])"
            ").join(', ') + '; allowed: ' + variables.ingressHosts.join(',') + "
            f"'); ask the provider to allow it in {OBJECTS_FIELD}.ingressHosts'",
            f"Ingress hosts outside the allowed ones are refused; ask the provider to allow it in "
            f"{OBJECTS_FIELD}.ingressHosts",
        )
    )
    key_ok = (
        f"k == '{INGRESS_CLASS_ANNOTATION}' || variables.ingressAnnotations.exists(p, "
        "p.endsWith('*') ? k.startsWith(p.substring(0, p.size() - 1)) : k == p)"
    )
    annotations = "(has(object.metadata.annotations) ? object.metadata.annotations : {})"
    out.append(
        _object_rule(
            "ingresses",
            f"{annotations}.all(k, {key_ok})",
            f"'Ingress annotations outside the allowed ones are refused (' + {annotations}.filter(k, !({key_ok}))"
            f".join(',') + '); ask the provider to allow it in {OBJECTS_FIELD}.ingressAnnotations'",
            f"Ingress annotations outside the allowed ones are refused; ask the provider to allow it in "
            f"{OBJECTS_FIELD}.ingressAnnotations",
        )
    )
    return out


def objects_policy(consumer_group: str) -> dict[str, Any]:
    """The ValidatingAdmissionPolicy for the Services, EndpointSlices and Ingresses a consumer identity
    (a member of `consumer_group`) writes into its namespaces."""
    operations = ["CREATE", "UPDATE"]
    return consumer_policy(
        OBJECTS_POLICY_NAME,
        consumer_group,
        [
            {"apiGroups": [""], "apiVersions": ["v1"], "operations": operations, "resources": ["services"]},
            {
                "apiGroups": ["discovery.k8s.io"],
                "apiVersions": ["v1"],
                "operations": operations,
                "resources": ["endpointslices"],
            },
            {
                "apiGroups": ["networking.k8s.io"],
                "apiVersions": ["v1"],
                "operations": operations,
                "resources": ["ingresses"],
            },
        ],
        _objects_validations(),
        [
            *namespace_variables(),
            {"name": "endpointCidrs", "expression": csv_list(ENDPOINT_CIDRS_ANNOTATION)},
            {"name": "ingressHosts", "expression": csv_list(INGRESS_HOSTS_ANNOTATION)},
            {"name": "ingressAnnotations", "expression": csv_list(INGRESS_ANNOTATIONS_ANNOTATION)},
        ],
    )


def objects_binding() -> dict[str, Any]:
    """Binds the objects policy to every namespace a consumer has on this provider."""
    return binding(OBJECTS_POLICY_NAME)
