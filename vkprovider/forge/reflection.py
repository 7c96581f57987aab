"""Reflection forge: objects of an offloaded consumer namespace -> their copies in its twin namespace.

Owns: which objects are reflected (`policy`: the skip/allow annotations and cluster-bound Secret
types), what the provider copy of a ConfigMap, Secret, Service, EndpointSlice and Ingress looks
like, whether a remote copy has drifted from what we want (`covers`, `needs_apply`) or can only be
fixed by deleting and recreating it (`needs_recreate`), and the ownership test every update or
delete of a remote copy must pass (`reflection_owned`).

Invariants: a remote copy always carries the origin labels (consumer ClusterID, local UID, managed-by
gpufed; never the origin-node label: every virtual node of the namespace shares its objects), and a
local label can never override them; nothing bound to the consumer cluster reaches the provider
(service-account and bootstrap tokens, the consumer's `kube-root-ca.crt`, EndpointSlice node names,
zones and target references); a provider Service never selects pods, never allocates node ports and
never asks for a load balancer (external exposure stays on the consumer); an EndpointSlice we wrote
(managed-by `reflection.gpufed.io`) is never reflected again; an Ingress copy carries only the
annotations the provider's policy lets a consumer set (`kubernetes.io/ingress.class`, plus what the
provider publishes as allowed): an ingress controller's configuration (snippets, auth, rewrites) is
the provider's to allow, and the copy says which annotations it left out (`IngressOutcome.dropped`).

Does not: talk to any API server, watch anything, decide when to apply or delete, or translate IPs
itself (the caller hands in `to_remote_ip`). A function returning None means "this object must not
exist remotely": the I/O layer deletes a remote copy it owns. The I/O layer must also never modify
or delete a remote object `reflection_owned` rejects (a same-named object the provider's users made).

Pure: no I/O, no client imports; inputs are the dicts the API server returns (list items without
`kind` are fine: each function knows its kind) and are never mutated.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from typing import Any

from gpufed.apis.wire import ORIGIN_NODE_LABEL
from peering import podsecurity
from vkprovider.forge.meta import ROOT_CA_CONFIGMAP, Target, origin_labels, owned_by, twin_annotations, twin_metadata

__all__ = [
    "ALLOW_ANNOTATION",
    "CLUSTER_BOUND_SECRET_TYPES",
    "CONFIG_MAP",
    "ENDPOINTSLICE_MANAGED_BY_LABEL",
    "ENDPOINT_SLICE",
    "INGRESS",
    "INGRESS_CLASS_ANNOTATION",
    "KINDS",
    "KINDS_BY_NAME",
    "REFLECTION_MANAGER",
    "SA_TOKEN_SECRET_TYPE",
    "SECRET",
    "SERVICE",
    "SERVICE_NAME_LABEL",
    "SKIP_ANNOTATION",
    "Decision",
    "IngressOutcome",
    "Kind",
    "covers",
    "ingress_annotation_allowed",
    "needs_apply",
    "needs_recreate",
    "policy",
    "reflection_owned",
    "remote_config_map",
    "remote_endpoint_slice",
    "remote_ingress",
    "remote_secret",
    "remote_service",
]

#: On a consumer object: "true" (any case) keeps it from being reflected.
SKIP_ANNOTATION = "gpufed.io/skip-reflection"
#: On a consumer namespace: "true" switches to allow-list mode; on an object: "true" allows it there.
ALLOW_ANNOTATION = "gpufed.io/allow-reflection"
ENDPOINTSLICE_MANAGED_BY_LABEL = "endpointslice.kubernetes.io/managed-by"
#: Our value of ENDPOINTSLICE_MANAGED_BY_LABEL on the EndpointSlices we write.
REFLECTION_MANAGER = "reflection.gpufed.io"
#: Joins an EndpointSlice to its Service (kube-proxy and CoreDNS look slices up by it).
SERVICE_NAME_LABEL = "kubernetes.io/service-name"
#: Deprecated way of naming an Ingress's class (still honoured by most controllers); the one Ingress
#: annotation every provider lets a consumer set.
INGRESS_CLASS_ANNOTATION = podsecurity.INGRESS_CLASS_ANNOTATION
SA_TOKEN_SECRET_TYPE = "kubernetes.io/service-account-token"  # noqa: S105 -- a Secret type, not a password
#: Secrets whose content only means something to the consumer's API server.
CLUSTER_BOUND_SECRET_TYPES = frozenset({SA_TOKEN_SECRET_TYPE, "bootstrap.kubernetes.io/token"})
_OPAQUE = "Opaque"
_EXTERNAL_NAME = "ExternalName"
_HEADLESS = "None"
_TRUE = "true"


@dataclass(frozen=True)
class Kind:
    """A reflected kind and where its API lives."""

    kind: str
    api_version: str
    plural: str
    #: API group ("" for the core group) and version.
    group: str
    version: str


CONFIG_MAP = Kind("ConfigMap", "v1", "configmaps", "", "v1")
SECRET = Kind("Secret", "v1", "secrets", "", "v1")
SERVICE = Kind("Service", "v1", "services", "", "v1")
ENDPOINT_SLICE = Kind("EndpointSlice", "discovery.k8s.io/v1", "endpointslices", "discovery.k8s.io", "v1")
INGRESS = Kind("Ingress", "networking.k8s.io/v1", "ingresses", "networking.k8s.io", "v1")
#: In dependency order: Services before their EndpointSlices, Secrets before the Ingresses naming them.
KINDS: tuple[Kind, ...] = (CONFIG_MAP, SECRET, SERVICE, ENDPOINT_SLICE, INGRESS)
KINDS_BY_NAME: Mapping[str, Kind] = {k.kind: k for k in KINDS}


# ---------------------------------------------------------------- policy


@dataclass(frozen=True)
class Decision:
    """Whether an object is reflected; `reason` is a CamelCase word for Events/conditions."""

    reflect: bool
    reason: str
    message: str


def _is_true(annotations: Mapping[str, Any], key: str) -> bool:
    value = annotations.get(key)
    return isinstance(value, str) and value.lower() == _TRUE


def policy(obj: Mapping[str, Any], namespace_annotations: Mapping[str, str]) -> Decision:
    """Whether `obj` (any reflected kind) of a namespace with `namespace_annotations` is reflected.

    Skipped (the object's skip annotation) wins over everything; cluster-bound Secret types are never
    reflected; in allow-list mode (the namespace's allow annotation) only allowed objects are.
    Kind-specific refusals (`kube-root-ca.crt`, our own EndpointSlices, a missing Ingress class) are
    the forge functions' to make.
    """
    meta = obj.get("metadata") or {}
    annotations = meta.get("annotations") or {}
    name = meta.get("name", "")
    if _is_true(annotations, SKIP_ANNOTATION):
        return Decision(False, "Skipped", f"{name} is annotated {SKIP_ANNOTATION}=true")
    # Only Secrets have a top-level `type` among the reflected kinds: no kind needed to tell.
    secret_type = obj.get("type")
    if secret_type in CLUSTER_BOUND_SECRET_TYPES:
        return Decision(False, "ClusterBound", f"{name} is a {secret_type} Secret, valid on the consumer only")
    if _is_true(namespace_annotations, ALLOW_ANNOTATION) and not _is_true(annotations, ALLOW_ANNOTATION):
        return Decision(
            False,
            "NotAllowed",
            f"the namespace reflects only objects annotated {ALLOW_ANNOTATION}=true, and {name} is not",
        )
    return Decision(True, "Reflected", f"{name} is reflected")


# ---------------------------------------------------------------- ConfigMaps and Secrets


def _metadata(local: Mapping[str, Any], target: Target, extra: Mapping[str, str] | None = None) -> dict[str, Any]:
    meta = local.get("metadata") or {}
    # origin labels last (inside twin_metadata): a local label cannot forge ownership.
    metadata = twin_metadata(local, target, {**(extra or {}), **origin_labels(meta, target)})
    # Not even a local one: the origin node marks pod twins of one virtual node, and reflected
    # objects belong to none (every virtual node of the namespace shares them).
    metadata["labels"].pop(ORIGIN_NODE_LABEL, None)
    return metadata


def _data_object(local: Mapping[str, Any], target: Target, kind: Kind, fields: tuple[str, ...]) -> dict[str, Any]:
    metadata = _metadata(local, target)
    # Only last-applied is dropped: annotations on ConfigMaps/Secrets are the user's data (as in pods).
    metadata["annotations"] = twin_annotations(local.get("metadata") or {}, drop_gpufed=False)
    out: dict[str, Any] = {"apiVersion": kind.api_version, "kind": kind.kind, "metadata": metadata}
    for field in fields:
        if field in local:
            out[field] = copy.deepcopy(local[field])
    return out


def remote_config_map(local: Mapping[str, Any], target: Target) -> dict[str, Any] | None:
    """Copy of a ConfigMap; None for `kube-root-ca.crt`."""
    # Every provider namespace gets its own kube-root-ca.crt from the provider's controller-manager
    # (the provider's CA, which is what pods there need); the consumer's would fight it.
    if (local.get("metadata") or {}).get("name") == ROOT_CA_CONFIGMAP:
        return None
    return _data_object(local, target, CONFIG_MAP, ("data", "binaryData", "immutable"))


def remote_secret(local: Mapping[str, Any], target: Target) -> dict[str, Any] | None:
    """Copy of a Secret; None for cluster-bound types (service-account and bootstrap tokens)."""
    # Their tokens authenticate against the consumer's API server only: useless and a leak remotely.
    if local.get("type") in CLUSTER_BOUND_SECRET_TYPES:
        return None
    return _data_object(local, target, SECRET, ("type", "data", "immutable"))


# ---------------------------------------------------------------- Services

#: What a Service port keeps; nodePort is the consumer's (the provider copy is never a NodePort).
_PORT_FIELDS = ("name", "protocol", "port", "targetPort", "appProtocol")
#: Service spec fields that mean the same on the provider (everything else is dropped).
_SERVICE_FIELDS = ("sessionAffinity", "sessionAffinityConfig", "publishNotReadyAddresses")


def _ports(ports: Any) -> list[dict[str, Any]]:
    return [{k: copy.deepcopy(p[k]) for k in _PORT_FIELDS if k in p} for p in ports or []]


def _is_headless(spec: Mapping[str, Any]) -> bool:
    return spec.get("clusterIP") == _HEADLESS or list(spec.get("clusterIPs") or []) == [_HEADLESS]


def _service_annotation(key: str) -> bool:
    # Cloud controllers and load-balancer implementations (AWS, GCP, Azure, MetalLB, ...) read these;
    # the copy is a ClusterIP so they should not act, but some act on annotations alone, and the
    # values describe the consumer's external exposure, which stays on the consumer.
    lowered = key.lower()
    return "load-balancer" not in lowered and "loadbalancer" not in lowered


def remote_service(local: Mapping[str, Any], target: Target) -> dict[str, Any]:
    """Copy of a Service: same DNS name and ports for offloaded pods, no external exposure.

    ExternalName stays ExternalName; every other type becomes ClusterIP (headless stays headless;
    else the provider allocates the cluster IP). Never a selector: see the comment below.
    """
    metadata = _metadata(local, target)
    metadata["annotations"] = {k: v for k, v in metadata["annotations"].items() if _service_annotation(k)}
    spec = local.get("spec") or {}
    out_spec: dict[str, Any]
    if spec.get("type") == _EXTERNAL_NAME:
        out_spec = {"type": _EXTERNAL_NAME, "externalName": spec.get("externalName", "")}
    else:
        # No selector: the endpoints are the consumer's (reflected EndpointSlices, with addresses the
        # provider can reach), and a selector would make the provider's EndpointSlice controller
        # manage slices of its own from the provider's pods, beside or instead of ours.
        # No clusterIP(s) unless headless: the consumer's IPs are from the consumer's service range.
        # No ipFamilies/ipFamilyPolicy: the provider's families decide. No node ports, external IPs,
        # load balancer or traffic policies: external exposure stays on the consumer.
        out_spec = {"type": "ClusterIP"}
        if _is_headless(spec):
            out_spec["clusterIP"] = _HEADLESS
        for field in _SERVICE_FIELDS:
            if field in spec:
                out_spec[field] = copy.deepcopy(spec[field])
    if "ports" in spec:
        out_spec["ports"] = _ports(spec["ports"])
    return {"apiVersion": SERVICE.api_version, "kind": SERVICE.kind, "metadata": metadata, "spec": out_spec}


# ---------------------------------------------------------------- EndpointSlices

#: What an endpoint keeps; nodeName, zone, hints, targetRef and deprecatedTopology name consumer
#: objects (a provider controller following targetRef would find a pod of the same name, or none).
_ENDPOINT_FIELDS = ("conditions", "hostname")
_IP_ADDRESS_TYPES = frozenset({"IPv4", "IPv6"})


def _endpoint(endpoint: Mapping[str, Any], translate: Callable[[str], str] | None) -> dict[str, Any] | None:
    addresses = [str(a) for a in endpoint.get("addresses") or []]
    if translate is not None:
        try:
            addresses = [translate(a) for a in addresses]
        except ValueError:
            # An address the provider cannot reach (no route to it yet): leaving it out is better
            # than sending traffic to an address that means something else there.
            return None
    out: dict[str, Any] = {"addresses": addresses}
    for field in _ENDPOINT_FIELDS:
        if field in endpoint:
            out[field] = copy.deepcopy(endpoint[field])
    return out


def remote_endpoint_slice(
    local: Mapping[str, Any],
    target: Target,
    to_remote_ip: Callable[[str], str],
    reflected_services: Collection[str],
) -> dict[str, Any] | None:
    """Copy of an EndpointSlice of a reflected Service, addresses as the provider reaches them.

    None for slices of no Service or of a Service not in `reflected_services`, and for slices we
    wrote ourselves (managed-by REFLECTION_MANAGER: never reflect a copy back, whichever way).
    An endpoint whose address `to_remote_ip` rejects (ValueError) is left out.
    """
    meta = local.get("metadata") or {}
    labels = meta.get("labels") or {}
    if labels.get(ENDPOINTSLICE_MANAGED_BY_LABEL) == REFLECTION_MANAGER:
        return None
    service = labels.get(SERVICE_NAME_LABEL)
    if not service or service not in reflected_services:
        return None
    # SERVICE_NAME_LABEL stays (local labels are kept): it joins the copy to the copied Service for
    # kube-proxy and DNS. Our managed-by value keeps the provider's EndpointSlice controller (and the
    # mirroring controller) from adopting, rewriting or garbage-collecting the copy.
    metadata = _metadata(local, target, {ENDPOINTSLICE_MANAGED_BY_LABEL: REFLECTION_MANAGER})
    # endpoints.kubernetes.io/last-change-trigger-time stays: only the controller that wrote it reads
    # it (for a latency metric), and it changes only together with the endpoints.
    address_type = local.get("addressType", "")
    translate = to_remote_ip if address_type in _IP_ADDRESS_TYPES else None  # FQDN: names, not IPs
    endpoints = []
    for endpoint in local.get("endpoints") or []:
        remote = _endpoint(endpoint, translate)
        if remote is not None:
            endpoints.append(remote)
    return {
        "apiVersion": ENDPOINT_SLICE.api_version,
        "kind": ENDPOINT_SLICE.kind,
        "metadata": metadata,
        "addressType": address_type,
        "endpoints": endpoints,
        "ports": copy.deepcopy(list(local.get("ports") or [])),
    }


# ---------------------------------------------------------------- Ingresses

_INGRESS_FIELDS = ("ingressClassName", "defaultBackend", "rules", "tls")


@dataclass(frozen=True)
class IngressOutcome:
    """The copy of an Ingress (None: none may exist remotely) and why, for an Event on the local one."""

    body: dict[str, Any] | None
    reason: str
    message: str
    #: The local Ingress's annotations the copy leaves out (the provider's policy would refuse them).
    dropped: tuple[str, ...] = ()


def ingress_annotation_allowed(key: str, allowed: Collection[str]) -> bool:
    """Whether the provider's objects policy lets a consumer's Ingress carry the annotation `key`:
    the class annotation always, else an entry of `allowed` (the tenant's `ingressAnnotations`: an
    exact key, or a prefix ending in `*`), as `peering.admission.objects` decides it."""
    if key == INGRESS_CLASS_ANNOTATION:
        return True
    return any(key.startswith(p[:-1]) if p.endswith("*") else key == p for p in allowed)


def remote_ingress(
    local: Mapping[str, Any],
    target: Target,
    provider_classes: Collection[str],
    default_class: str | None,
    allowed_annotations: Collection[str] | None = None,
) -> IngressOutcome:
    """Copy of an Ingress, if the provider has its class (or, when none is named, a default class).

    The class is `spec.ingressClassName`, else the deprecated annotation; it is kept as the local
    object names it (the API server rejects an Ingress carrying both). TLS Secret names stay:
    Secrets are reflected under their own names. Annotations: only those
    `ingress_annotation_allowed` with `allowed_annotations` (what the provider publishes; None: it
    publishes nothing, so only the class annotation is sure to pass), the others in `dropped`.
    """
    meta = local.get("metadata") or {}
    spec = local.get("spec") or {}
    name = meta.get("name", "")
    provider = target.provider or "the provider"
    requested = spec.get("ingressClassName") or (meta.get("annotations") or {}).get(INGRESS_CLASS_ANNOTATION)
    if requested:
        if requested not in provider_classes:
            return IngressOutcome(
                None, "IngressClassMissing", f"ingress {name}: class {requested!r} does not exist on {provider}"
            )
        message = f"ingress {name} reflected with class {requested!r} of {provider}"
    elif default_class is None:
        return IngressOutcome(
            None,
            "IngressClassMissing",
            f"ingress {name} names no class and {provider} has no default IngressClass",
        )
    else:
        # No class in the copy: the provider's admission gives it the default class on create.
        message = f"ingress {name} reflected with the default class {default_class!r} of {provider}"
    metadata = _metadata(local, target)
    allowed = allowed_annotations or ()
    kept = {k: v for k, v in metadata["annotations"].items() if ingress_annotation_allowed(k, allowed)}
    dropped = tuple(sorted(set(metadata["annotations"]) - set(kept)))
    metadata["annotations"] = kept
    if dropped:
        message += f"; annotations {provider} does not allow left out: {', '.join(dropped)}"
    body = {
        "apiVersion": INGRESS.api_version,
        "kind": INGRESS.kind,
        "metadata": metadata,
        "spec": {k: copy.deepcopy(spec[k]) for k in _INGRESS_FIELDS if k in spec},
    }
    return IngressOutcome(body, "Reflected", message, dropped)


# ---------------------------------------------------------------- drift


def covers(have: Any, want: Any) -> bool:
    """Whether every field of `want` is present and equal in `have` (what the server added is no drift).

    Mappings: `want`'s keys are a subset, each value covered; lists: same length, covered element by
    element; scalars: equal (a bool never equals a number).
    """
    if isinstance(want, Mapping):
        return isinstance(have, Mapping) and all(k in have and covers(have[k], v) for k, v in want.items())
    if isinstance(want, list | tuple):
        return (
            isinstance(have, list | tuple)
            and len(have) == len(want)
            and all(covers(h, w) for h, w in zip(have, want, strict=True))
        )
    if isinstance(want, bool) or isinstance(have, bool):
        return isinstance(want, bool) and isinstance(have, bool) and want == have
    return bool(have == want)


def _same_map(have: Any, want: Any) -> bool:
    # data/binaryData: the exact key set matters (a key removed locally is drift); absent == {}.
    return dict(have or {}) == dict(want or {})


def _content_matches(want: Mapping[str, Any], have: Mapping[str, Any]) -> bool:
    kind = want.get("kind")
    if kind in (CONFIG_MAP.kind, SECRET.kind):
        if kind == SECRET.kind and (want.get("type") or _OPAQUE) != (have.get("type") or _OPAQUE):
            return False
        return (
            _same_map(have.get("data"), want.get("data"))
            and _same_map(have.get("binaryData"), want.get("binaryData"))
            and bool(want.get("immutable")) == bool(have.get("immutable"))
        )
    if kind in (SERVICE.kind, INGRESS.kind):
        return covers(have.get("spec") or {}, want.get("spec") or {})
    if kind == ENDPOINT_SLICE.kind:
        # null and [] are the same list to the API server (it does not keep the difference).
        return (
            have.get("addressType") == want.get("addressType")
            and covers(have.get("endpoints") or [], want.get("endpoints") or [])
            and covers(have.get("ports") or [], want.get("ports") or [])
        )
    content = {k: v for k, v in want.items() if k not in ("apiVersion", "kind", "metadata", "status")}
    return covers(have, content)


def needs_apply(want: Mapping[str, Any], have: Mapping[str, Any] | None) -> bool:
    """Whether the remote copy `have` (None: absent) differs from the forged `want`.

    Labels and annotations: `want`'s must be present (others on the remote are left alone, so one
    removed locally goes at the next apply something else triggers); content by kind, see
    `_content_matches`.
    """
    if have is None:
        return True
    want_meta = want.get("metadata") or {}
    have_meta = have.get("metadata") or {}
    for field in ("labels", "annotations"):
        if not covers(have_meta.get(field) or {}, want_meta.get(field) or {}):
            return True
    return not _content_matches(want, have)


def needs_recreate(want: Mapping[str, Any], have: Mapping[str, Any] | None) -> bool:
    """Whether `have` differs from `want` in a field the API server will not let an apply change.

    An immutable ConfigMap/Secret whose content changed, a Secret whose type changed, a Service
    switching between headless and not, an EndpointSlice whose addressType changed: the caller must
    delete the remote copy (if `reflection_owned`) and create it again.
    """
    if have is None:
        return False
    kind = want.get("kind")
    if kind in (CONFIG_MAP.kind, SECRET.kind):
        if kind == SECRET.kind and (want.get("type") or _OPAQUE) != (have.get("type") or _OPAQUE):
            return True
        return bool(have.get("immutable")) and not _content_matches(want, have)
    if kind == SERVICE.kind:
        want_spec = want.get("spec") or {}
        have_spec = have.get("spec") or {}
        if _EXTERNAL_NAME in (want_spec.get("type"), have_spec.get("type")):
            return False  # ExternalName has no cluster IP to keep: the type may change either way
        return _is_headless(want_spec) != _is_headless(have_spec)
    if kind == ENDPOINT_SLICE.kind:
        return have.get("addressType") != want.get("addressType")
    return False


def reflection_owned(remote: Mapping[str, Any], consumer: str) -> bool:
    """Whether the remote object is a copy made for `consumer`: the only ones callers may change or delete."""
    return owned_by(remote, consumer)
