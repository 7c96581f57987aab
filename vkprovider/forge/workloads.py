"""Per-peering workloads from templates: pure translation of a chart-provided template into the
objects one peering needs (the virtual kubelet of a provider, the gateway of a peer).

Owns: checking a template (YAML documents: exactly one `apps/v1` Deployment, optionally `v1`
Services; nothing else, so a template cannot smuggle RBAC or cluster-scoped objects through the
controller's identity), and `render`: per peer, each document with its name suffixed by the peer's
ClusterID (shortened with a hash past Kubernetes' 63-character limit), the labels
`app.kubernetes.io/managed-by=gpufed`, `gpufed.io/component=<component>` and
`gpufed.io/remote-cluster-id=<peer>` on the object, the Deployment's selector and pod template,
the Services' selectors pointing at those pods, the peer passed to the named container as an
environment variable, and an owner reference to the peering's object (garbage collection removes
the workload with its peering). A client-side gateway gets no Service.

Does not: read templates from disk or talk to an API server (gpufed.app.workloads does).
"""

from __future__ import annotations

import copy
import hashlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from gpufed.apis.wire import MANAGED_BY, MANAGED_BY_LABEL, REMOTE_CLUSTER_LABEL

COMPONENT_LABEL = "gpufed.io/component"
#: Kinds a template may hold: (apiVersion, kind).
ALLOWED = {("apps/v1", "Deployment"), ("v1", "Service")}
MAX_NAME = 63


class TemplateError(ValueError):
    """A template the controller refuses; the message says what is wrong and where."""


@dataclass(frozen=True)
class Template:
    #: `virtual-kubelet` or `gateway`: the `gpufed.io/component` label value.
    component: str
    #: The container that gets the peer's ClusterID, and the variable it gets it in.
    container: str
    env: str
    documents: tuple[Mapping[str, Any], ...]


def check(component: str, container: str, env: str, documents: Iterable[Any], *, source: str) -> Template:
    """A Template from parsed YAML documents, or TemplateError naming `source`."""
    docs = [d for d in documents if d is not None]
    deployments = 0
    for i, doc in enumerate(docs):
        where = f"{source}: document {i + 1}"
        if not isinstance(doc, Mapping):
            raise TemplateError(f"{where} is not a Kubernetes object")
        kind = (doc.get("apiVersion"), doc.get("kind"))
        if kind not in ALLOWED:
            allowed = ", ".join(f"{a} {k}" for a, k in sorted(ALLOWED))
            raise TemplateError(f"{where}: {kind[0]} {kind[1]} is not allowed in a template (only {allowed})")
        name = (doc.get("metadata") or {}).get("name")
        if not isinstance(name, str) or not name:
            raise TemplateError(f"{where}: metadata.name is missing")
        if kind[1] == "Deployment":
            deployments += 1
            containers = ((doc.get("spec") or {}).get("template") or {}).get("spec", {}).get("containers") or []
            if not any(isinstance(c, Mapping) and c.get("name") == container for c in containers):
                raise TemplateError(f"{where}: the Deployment has no container named {container!r}")
    if deployments != 1:
        raise TemplateError(f"{source}: a template holds exactly one Deployment (found {deployments})")
    return Template(component, container, env, tuple(docs))


def name_for(base: str, peer: str) -> str:
    """`<base>-<peer>`, shortened with a stable hash when longer than 63 characters."""
    name = f"{base}-{peer}"
    if len(name) <= MAX_NAME:
        return name
    digest = hashlib.sha256(name.encode()).hexdigest()[:8]
    return f"{name[: MAX_NAME - 9].rstrip('-')}-{digest}"


def selector(component: str, peer: str) -> dict[str, str]:
    return {COMPONENT_LABEL: component, REMOTE_CLUSTER_LABEL: peer}


def render(
    template: Template, peer: str, namespace: str, owner: Mapping[str, Any], *, services: bool = True
) -> list[dict[str, Any]]:
    """The objects `peer` needs, ready for server-side apply in `namespace`.

    `services=False` leaves the template's Services out: a client-side gateway dials its peer and
    needs no address of its own (a LoadBalancer for it would only cost money and expose a port).
    """
    labels = {MANAGED_BY_LABEL: MANAGED_BY, **selector(template.component, peer)}
    out: list[dict[str, Any]] = []
    for doc in template.documents:
        if not services and doc["kind"] == "Service":
            continue
        obj = copy.deepcopy(dict(doc))
        meta = obj.setdefault("metadata", {})
        meta["name"] = name_for(meta["name"], peer)
        meta["namespace"] = namespace
        meta["labels"] = {**(meta.get("labels") or {}), **labels}
        meta["ownerReferences"] = [dict(owner)]
        spec = obj.setdefault("spec", {})
        if obj["kind"] == "Deployment":
            spec["selector"] = {"matchLabels": selector(template.component, peer)}
            pod = spec.setdefault("template", {})
            pod_meta = pod.setdefault("metadata", {})
            pod_meta["labels"] = {**(pod_meta.get("labels") or {}), **labels}
            for c in pod.setdefault("spec", {}).get("containers") or []:
                if c.get("name") == template.container:
                    env = [e for e in c.get("env") or [] if e.get("name") != template.env]
                    c["env"] = [*env, {"name": template.env, "value": peer}]
        else:
            spec["selector"] = selector(template.component, peer)
        out.append(obj)
    return out


def owner_reference(api_version: str, kind: str, obj: Mapping[str, Any]) -> dict[str, Any]:
    """An owner reference to a peering object (not a controller reference: the workload has its own)."""
    meta = obj["metadata"]
    return {"apiVersion": api_version, "kind": kind, "name": meta["name"], "uid": meta["uid"]}
