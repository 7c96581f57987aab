"""The offloading webhook's decision: how a new pod of an offloaded namespace must change.

Owns `mutate`, which turns a pod, the namespace's pod offloading strategy and its cluster selector
into RFC 6902 JSON-patch operations for an AdmissionReview response:

- Remote: the virtual-node toleration, and required node affinity `gpufed.io/type In
  [virtual-node]` AND the selector's expressions (one term per selector term);
- LocalAndRemote: the toleration; with a selector also required affinity of the terms
  [`gpufed.io/type NotIn [virtual-node]`] OR [`In [virtual-node]` AND selector…], so local nodes
  stay allowed while only the selected virtual nodes qualify;
- Local: required affinity `gpufed.io/type NotIn [virtual-node]` (no toleration);
- pinned expressions (where the pod's claims keep their data) are ANDed into every alternative
  (`pinned_terms`): a claim bound on a provider admits only that provider's virtual nodes, a claim of
  the consumer's own storage only local nodes; a pod so kept local is labelled
  `gpufed.io/kept-local` (`mark_kept_local`: the controller says why in an Event on it);
- `gate`: the scheduling gate `gpufed.io/gang` on a pod that asks for GPUs and belongs to a group
  (`gpupool.gang.group_of`) in a namespace whose pods may go remote: the gang controller releases
  the group's pods together, pinned to one pool, once one holds them all. Single pods, pods without
  GPUs and what Kueue admits are not gated; `gang_gated` says whether a pod carries the gate;
- `pointer_segment`: a key as one segment of a JSON patch path.

Invariants:
- the user's settings are never removed: required node-selector terms are ORed by Kubernetes, so
  our expressions are ANDed into every existing term (the cross product with ours); preferred
  affinity, nodeSelector and other tolerations are left as they are;
- idempotent: a pod that already tolerates the taint and whose every required term already implies
  one of ours gets no operations (the API server may reinvoke the webhook; reinvocationPolicy
  IfNeeded);
- pure: no I/O; the input pod is never modified;
- a malformed pod or selector (a part of the wrong JSON type where `mutate` reads) raises
  ValueError naming the part, never another exception (the webhook answers it with 400).

Does not: decide which namespaces are offloaded (the webhook's cache of NamespaceOffloadings does),
or validate the selector (the CRD schema and `gpufed.apis.offloading.NodeSelector` do).
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from typing import Any

from gpufed.apis.pool import GPU_RESOURCE
from gpufed.apis.wire import (
    GANG_GATE,
    GANG_GROUP_ANNOTATION,
    GANG_LABEL,
    GANG_SIZE_ANNOTATION,
    KEPT_LOCAL_LABEL,
    REMOTE_CLUSTER_LABEL,
    TYPE_LABEL,
    VIRTUAL_NODE_TAINT,
    VIRTUAL_NODE_TAINT_KEY,
    VIRTUAL_NODE_TYPE,
)
from gpupool.gang import group_of
from peering.grants import pod_requests

STRATEGIES = ("Local", "Remote", "LocalAndRemote")
#: The toleration pods that may run on virtual nodes receive.
TOLERATION: dict[str, str] = {"key": VIRTUAL_NODE_TAINT_KEY, "operator": "Exists", "effect": "NoExecute"}
ON_VIRTUAL: dict[str, Any] = {"key": TYPE_LABEL, "operator": "In", "values": [VIRTUAL_NODE_TYPE]}
NOT_ON_VIRTUAL: dict[str, Any] = {"key": TYPE_LABEL, "operator": "NotIn", "values": [VIRTUAL_NODE_TYPE]}
_REQUIRED = "requiredDuringSchedulingIgnoredDuringExecution"

Expr = dict[str, Any]


def _tolerates(tol: Mapping[str, Any], taint: Mapping[str, str]) -> bool:
    """Whether `tol` tolerates `taint` for good (a tolerationSeconds would evict the pod later)."""
    if tol.get("tolerationSeconds") is not None:
        return False
    if tol.get("effect") and tol.get("effect") != taint["effect"]:
        return False
    op = tol.get("operator") or "Equal"
    if not tol.get("key"):
        return op == "Exists"
    if tol.get("key") != taint["key"]:
        return False
    return op == "Exists" or tol.get("value", "") == taint["value"]


def selector_terms(cluster_selector: Mapping[str, Any] | None) -> list[list[Expr]]:
    """The selector's terms as lists of expressions; [] for no selector (or one without terms)."""
    terms = (cluster_selector or {}).get("nodeSelectorTerms") or []
    return [[dict(e) for e in (t.get("matchExpressions") or [])] for t in terms]


def required_terms(strategy: str, cluster_selector: Mapping[str, Any] | None) -> list[list[Expr]]:
    """What the strategy requires, as alternatives (OR) of expression lists (AND); [] for nothing."""
    if strategy not in STRATEGIES:
        raise ValueError(f"unknown pod offloading strategy {strategy!r}: use one of {', '.join(STRATEGIES)}")
    selected = [[dict(ON_VIRTUAL), *t] for t in selector_terms(cluster_selector) if t]
    if strategy == "Local":
        return [[dict(NOT_ON_VIRTUAL)]]
    if strategy == "Remote":
        return selected or [[dict(ON_VIRTUAL)]]
    return [[dict(NOT_ON_VIRTUAL)], *selected] if selected else []


def _implies(term: Mapping[str, Any], ours: Sequence[Expr]) -> bool:
    have = term.get("matchExpressions") or []
    return all(e in have for e in ours)


def _merge(existing: Sequence[Mapping[str, Any]], ours: Sequence[Sequence[Expr]]) -> list[dict[str, Any]]:
    """`existing` AND `ours`, in disjunctive form: terms that already imply one of ours stay as they
    are; every other term is crossed with each of ours."""
    if not existing:
        return [{"matchExpressions": [dict(e) for e in o]} for o in ours]
    out: list[dict[str, Any]] = []
    for term in existing:
        if any(_implies(term, o) for o in ours):
            out.append(copy.deepcopy(dict(term)))
            continue
        for o in ours:
            t = copy.deepcopy(dict(term))
            have = list(t.get("matchExpressions") or [])
            t["matchExpressions"] = have + [dict(e) for e in o if e not in have]
            if t not in out:
                out.append(t)
    return out


def pointer_segment(key: str) -> str:
    """`key` as one segment of a JSON pointer (a JSON patch path)."""
    return key.replace("~", "~0").replace("/", "~1")


def gang_gated(pod: Mapping[str, Any]) -> bool:
    """Whether the pod carries the gang gate (its group is not released yet)."""
    gates = (pod.get("spec") or {}).get("schedulingGates") or []
    return any(isinstance(g, Mapping) and g.get("name") == GANG_GATE for g in gates)


def _mapping(value: Any, where: str) -> Mapping[str, Any] | None:
    if value is not None and not isinstance(value, Mapping):
        raise ValueError(f"{where} must be an object, not {type(value).__name__}")
    return value


def _mappings(value: Any, where: str) -> list[Mapping[str, Any]]:
    """A list of objects (None: empty); ValueError otherwise."""
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(v, Mapping) for v in value):
        raise ValueError(f"{where} must be a list of objects")
    return value


def _check_terms(terms: Any, where: str) -> None:
    for i, term in enumerate(_mappings(terms, where)):
        _mappings(term.get("matchExpressions"), f"{where}[{i}].matchExpressions")


def _check_shape(pod: Any, cluster_selector: Any) -> None:
    """ValueError unless every part `mutate` reads has the JSON type it expects."""
    if not isinstance(pod, Mapping):
        raise ValueError(f"the pod must be an object, not {type(pod).__name__}")
    spec = _mapping(pod.get("spec"), "spec") or {}
    _mappings(spec.get("tolerations"), "spec.tolerations")
    affinity = _mapping(spec.get("affinity"), "spec.affinity") or {}
    node_affinity = _mapping(affinity.get("nodeAffinity"), "spec.affinity.nodeAffinity") or {}
    required = _mapping(node_affinity.get(_REQUIRED), f"spec.affinity.nodeAffinity.{_REQUIRED}") or {}
    _check_terms(required.get("nodeSelectorTerms"), f"spec.affinity.nodeAffinity.{_REQUIRED}.nodeSelectorTerms")
    selector = _mapping(cluster_selector, "clusterSelector") or {}
    _check_terms(selector.get("nodeSelectorTerms"), "clusterSelector.nodeSelectorTerms")


class ClaimConflictError(Exception):
    """A pod whose claims keep their data in places no one node reaches (message for its owner)."""


def claim_pin(places: Mapping[str, str | None]) -> list[Expr]:
    """What the pod's claims require of its node: `places` maps a claim to the provider it is bound
    on, or to None when it is the consumer's own storage (claims with no place yet are left out).
    ClaimConflictError when they are bound in different places."""
    where = {p for p in places.values()}
    if not where:
        return []
    if len(where) > 1:
        shown = ", ".join(f"{c} on {p or 'this cluster'}" for c, p in sorted(places.items()))
        raise ClaimConflictError(
            f"the pod's claims keep their data in different clusters ({shown}): no node reaches all"
        )
    (provider,) = where
    if provider is None:
        return [dict(NOT_ON_VIRTUAL)]
    return [{"key": REMOTE_CLUSTER_LABEL, "operator": "In", "values": [provider]}]


def mark_kept_local(pod: Mapping[str, Any], strategy: str) -> list[dict[str, Any]]:
    """JSON-patch operations that label `pod`, which its claims keep on local nodes, with
    KEPT_LOCAL_LABEL: `pending` in a namespace whose pods run remotely only, else `local`; none for a
    Local namespace (nothing would have been offloaded) or a pod that already says so."""
    if strategy == "Local":
        return []
    value = "pending" if strategy == "Remote" else "local"
    meta = _mapping(pod.get("metadata"), "metadata") or {}
    labels = _mapping(meta.get("labels"), "metadata.labels")
    if labels is None:
        return [{"op": "add", "path": "/metadata/labels", "value": {KEPT_LOCAL_LABEL: value}}]
    if labels.get(KEPT_LOCAL_LABEL) == value:
        return []
    return [{"op": "add", "path": f"/metadata/labels/{pointer_segment(KEPT_LOCAL_LABEL)}", "value": value}]


def pinned_terms(ours: list[list[Expr]], pinned: Sequence[Expr]) -> list[list[Expr]]:
    """`ours` with `pinned` ANDed into every alternative; alternatives `pinned` contradicts (local
    nodes when pinned to a provider's virtual nodes, virtual nodes when pinned to local ones) go,
    unless none would be left."""
    if not pinned:
        return ours
    if not ours:
        return [list(pinned)]
    to_provider = any(e.get("key") != TYPE_LABEL for e in pinned)
    contradicts = NOT_ON_VIRTUAL if to_provider else ON_VIRTUAL
    kept = [o for o in ours if contradicts not in o] or ours
    return [[*o, *(dict(e) for e in pinned if e not in o)] for o in kept]


def mutate(
    pod: Mapping[str, Any],
    strategy: str,
    cluster_selector: Mapping[str, Any] | None,
    pinned: Sequence[Expr] = (),
) -> list[dict[str, Any]]:
    """JSON-patch operations that make `pod` follow `strategy` and `cluster_selector` (see module doc),
    with `pinned` (where the pod's claims hold their data: `forge.claims.claim_pin`) ANDed into what
    is required; ValueError for a malformed pod or selector."""
    _check_shape(pod, cluster_selector)
    spec: Mapping[str, Any] = pod.get("spec") or {}
    ops: list[dict[str, Any]] = []
    if strategy in ("Remote", "LocalAndRemote"):
        tolerations = spec.get("tolerations")
        if not any(_tolerates(t, VIRTUAL_NODE_TAINT) for t in tolerations or []):
            if tolerations is None:
                ops.append({"op": "add", "path": "/spec/tolerations", "value": [dict(TOLERATION)]})
            else:
                ops.append({"op": "add", "path": "/spec/tolerations/-", "value": dict(TOLERATION)})
    ours = pinned_terms(required_terms(strategy, cluster_selector), pinned)
    if not ours:
        return ops
    affinity: Mapping[str, Any] | None = spec.get("affinity")
    node_affinity: Mapping[str, Any] | None = (affinity or {}).get("nodeAffinity")
    required: Mapping[str, Any] | None = (node_affinity or {}).get(_REQUIRED)
    existing = list((required or {}).get("nodeSelectorTerms") or [])
    if existing and all(any(_implies(t, o) for o in ours) for t in existing):
        return ops
    terms = _merge(existing, ours)
    if affinity is None:
        value: Any = {"nodeAffinity": {_REQUIRED: {"nodeSelectorTerms": terms}}}
        ops.append({"op": "add", "path": "/spec/affinity", "value": value})
    elif node_affinity is None:
        ops.append(
            {"op": "add", "path": "/spec/affinity/nodeAffinity", "value": {_REQUIRED: {"nodeSelectorTerms": terms}}}
        )
    elif required is None:
        ops.append(
            {
                "op": "add",
                "path": f"/spec/affinity/nodeAffinity/{pointer_segment(_REQUIRED)}",
                "value": {"nodeSelectorTerms": terms},
            }
        )
    else:
        path = f"/spec/affinity/nodeAffinity/{pointer_segment(_REQUIRED)}/nodeSelectorTerms"
        ops.append({"op": "add" if "nodeSelectorTerms" not in required else "replace", "path": path, "value": terms})
    return ops


__all__ = [
    "NOT_ON_VIRTUAL",
    "ON_VIRTUAL",
    "STRATEGIES",
    "TOLERATION",
    "ClaimConflictError",
    "claim_pin",
    "mark_kept_local",
    "mutate",
    "pinned_terms",
    "required_terms",
    "selector_terms",
]


def _requesting(container: Mapping[str, Any]) -> dict[str, Any]:
    resources = container.get("resources") or {}
    return {
        **container,
        "resources": {"requests": {**(resources.get("limits") or {}), **(resources.get("requests") or {})}},
    }


def gpus_of(pod: Mapping[str, Any]) -> int:
    """GPUs the pod asks for (requests, or limits where a container names no request: the API server
    defaults one from the other, but a webhook may see the pod before that)."""
    spec: Mapping[str, Any] = pod.get("spec") or {}
    containers = {
        part: [_requesting(c) for c in _mappings(spec.get(part), f"spec.{part}")]
        for part in ("containers", "initContainers")
    }
    return int(pod_requests({**pod, "spec": {**spec, **containers}}).get(GPU_RESOURCE, 0))


def gate(pod: Mapping[str, Any], strategy: str, job: Mapping[str, Any] | None) -> list[dict[str, Any]]:
    """JSON-patch operations that add the gang gate to `pod`, with the group's label and annotations
    (see module doc); none when it already has it or is no group pod. `job`: the Job controlling the
    pod, if any. Raises `gpupool.gang.GroupError` for a group label whose size is no whole number of pods."""
    if strategy == "Local":
        return []
    group = group_of(pod, job)
    if group is None or gpus_of(pod) <= 0:
        return []
    spec: Mapping[str, Any] = pod.get("spec") or {}
    gates = _mappings(spec.get("schedulingGates"), "spec.schedulingGates")
    if gang_gated(pod):
        return []
    ops: list[dict[str, Any]] = []
    if not gates:
        ops.append({"op": "add", "path": "/spec/schedulingGates", "value": [{"name": GANG_GATE}]})
    else:
        ops.append({"op": "add", "path": "/spec/schedulingGates/-", "value": {"name": GANG_GATE}})
    meta = _mapping(pod.get("metadata"), "metadata") or {}
    marks = {
        "labels": {GANG_LABEL: group.label},
        "annotations": {GANG_GROUP_ANNOTATION: group.name, GANG_SIZE_ANNOTATION: str(group.size)},
    }
    for part, values in marks.items():
        if _mapping(meta.get(part), f"metadata.{part}") is None:
            ops.append({"op": "add", "path": f"/metadata/{part}", "value": values})
        else:
            at = f"/metadata/{part}"
            ops += [{"op": "add", "path": f"{at}/{pointer_segment(k)}", "value": v} for k, v in values.items()]
    return ops
