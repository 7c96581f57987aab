"""Node selection as Kubernetes reads it, for code that must predict where a pod or volume may go.

Owns `requirement_holds` (one NodeSelectorRequirement against a value: In, NotIn, Exists,
DoesNotExist, Gt, Lt; an operator it does not know never holds) and `terms_select` (nodeSelectorTerms
against a node's labels and name: terms ORed, a term's expressions ANDed, `matchFields` on
`metadata.name`, and an empty term selects nothing, as in Kubernetes).

Pure: no I/O. Does not: read nodes, or evaluate `nodeSelector` maps or preferred terms (callers that
need them do).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any


def requirement_holds(req: Mapping[str, Any], value: str | None) -> bool:
    """Whether a NodeSelectorRequirement holds for `value` (None: the label or field is absent)."""
    op = req.get("operator")
    values = [str(v) for v in req.get("values") or []]
    if op == "In":
        return value is not None and value in values
    if op == "NotIn":
        return value is None or value not in values
    if op == "Exists":
        return value is not None
    if op == "DoesNotExist":
        return value is None
    if op in ("Gt", "Lt") and value is not None and len(values) == 1:
        try:
            have, bound = int(value), int(values[0])
        except ValueError:
            return False
        return have > bound if op == "Gt" else have < bound
    return False


def terms_select(terms: Iterable[Mapping[str, Any]], labels: Mapping[str, str], name: str) -> bool:
    """Whether any of `terms` selects the node `name` with `labels`."""
    fields = {"metadata.name": name}
    for term in terms:
        exprs = list(term.get("matchExpressions") or [])
        field_exprs = list(term.get("matchFields") or [])
        if not exprs and not field_exprs:
            continue
        if all(requirement_holds(e, labels.get(str(e.get("key")))) for e in exprs) and all(
            requirement_holds(e, fields.get(str(e.get("key")))) for e in field_exprs
        ):
            return True
    return False


__all__ = ["requirement_holds", "terms_select"]
