"""gpufed.kube.selectors: node selection as Kubernetes reads it (the cases the gang controller's and
the local volume binder's predictions depend on)."""

from __future__ import annotations

from gpufed.kube.selectors import requirement_holds, terms_select

LABELS = {"zone": "a", "cores": "8"}


def expr(op: str, *values: str, key: str = "zone") -> dict[str, object]:
    return {"key": key, "operator": op, "values": list(values)}


def test_each_operator() -> None:
    assert requirement_holds(expr("In", "a", "b"), "a") and not requirement_holds(expr("In", "b"), "a")
    assert not requirement_holds(expr("In", "a"), None)
    assert requirement_holds(expr("NotIn", "b"), "a") and requirement_holds(expr("NotIn", "b"), None)
    assert requirement_holds(expr("Exists"), "") and not requirement_holds(expr("Exists"), None)
    assert requirement_holds(expr("DoesNotExist"), None) and not requirement_holds(expr("DoesNotExist"), "a")
    assert requirement_holds(expr("Gt", "4"), "8") and not requirement_holds(expr("Lt", "4"), "8")
    assert not requirement_holds(expr("Gt", "4"), "eight") and not requirement_holds(expr("Gt", "4", "5"), "8")
    assert not requirement_holds(expr("Near", "a"), "a"), "an unknown operator never holds"


def test_terms_are_ored_expressions_anded_and_an_empty_term_selects_nothing() -> None:
    a = {"matchExpressions": [expr("In", "a")]}
    b = {"matchExpressions": [expr("In", "b")]}
    both = {"matchExpressions": [expr("In", "a"), expr("Gt", "16", key="cores")]}
    assert terms_select([b, a], LABELS, "n1") and not terms_select([b], LABELS, "n1")
    assert not terms_select([both], LABELS, "n1")
    assert not terms_select([{}], LABELS, "n1") and not terms_select([], LABELS, "n1")
    named = {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n1"]}]}
    assert terms_select([named], {}, "n1") and not terms_select([named], {}, "n2")
