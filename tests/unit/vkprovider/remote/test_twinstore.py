"""TwinStore: its indexes always say what a walk over every twin would."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from gpufed.apis.wire import GANG_LABEL, ORIGIN_NODE_LABEL, TWIN_GROUP_GATE
from vkprovider.forge import groups
from vkprovider.forge.pods import origin_node, unplaced
from vkprovider.remote.twinstore import TwinStore

NAMESPACES = ("team", "other")
NAMES = ("a", "b", "c", "d")


def twin(uid: str, group: str | None, node: str | None, gated: bool, placed: bool) -> dict[str, Any]:
    labels = {}
    if group is not None:
        labels[GANG_LABEL] = group
    if node is not None:
        labels[ORIGIN_NODE_LABEL] = node
    spec: dict[str, Any] = {"containers": [{"name": "main", "image": "x"}]}
    if gated:
        spec["schedulingGates"] = [{"name": "other.example/gate"}, {"name": TWIN_GROUP_GATE}]
    if placed:
        spec["nodeName"] = "h100-1"
    return {
        "metadata": {"name": "t", "namespace": "team-c-1", "uid": uid, "labels": labels},
        "spec": spec,
        "status": {"phase": "Running" if placed else "Pending"},
    }


twins = st.builds(
    twin,
    uid=st.sampled_from(("u1", "u2", "u3")),
    group=st.sampled_from((None, "g1", "g2")),
    node=st.sampled_from((None, "gpufed-a-h100", "gpufed-a-a100")),
    gated=st.booleans(),
    placed=st.booleans(),
)
keys = st.tuples(st.sampled_from(NAMESPACES), st.sampled_from(NAMES))
steps = st.lists(
    st.one_of(
        st.tuples(st.just("put"), keys, twins),
        st.tuples(st.just("setdefault"), keys, twins),
        st.tuples(st.just("pop"), keys, st.sampled_from((None, "u1", "u2"))),
    ),
    max_size=30,
)


def ids(found: Sequence[Mapping[str, Any]]) -> list[int]:
    return sorted(id(t) for t in found)


@settings(max_examples=300)
@given(steps)
def test_indexes_match_a_walk_over_every_twin(ops: list[tuple[Any, ...]]) -> None:
    store = TwinStore()
    model: dict[tuple[str, str], dict[str, Any]] = {}
    for op, key, arg in ops:
        if op == "put":
            store.put(key, arg)
            model[key] = arg
        elif op == "setdefault":
            assert store.setdefault(key, arg) is model.setdefault(key, arg)
        else:
            current = model.get(key)
            if current is not None and (arg is None or current["metadata"]["uid"] == arg):
                assert store.pop(key, uid=arg) is model.pop(key)
            else:
                assert store.pop(key, uid=arg) is None
        assert len(store) == len(model) and dict(store.items()) == model
        for ns in NAMESPACES:
            for group in ("g1", "g2"):
                walked = [
                    t for (n, _), t in model.items() if n == ns and t["metadata"]["labels"].get(GANG_LABEL) == group
                ]
                assert ids(store.group(ns, group)) == ids(walked)
        assert store.gated() == sorted(k for k, t in model.items() if groups.gated(t) is not None)
        for node in ("", "gpufed-a-h100", "gpufed-a-a100"):
            walked = [
                t for t in model.values() if origin_node(t, "") == node and unplaced(t) and groups.gated(t) is None
            ]
            assert ids(store.on_the_way(node)) == ids(walked)


def test_a_twin_replaced_under_its_key_leaves_its_old_entries() -> None:
    store = TwinStore()
    key = ("team", "a")
    store.put(key, twin("u1", "g1", "gpufed-a-h100", gated=True, placed=False))
    assert store.gated() == [key] and len(store.group("team", "g1")) == 1
    started = twin("u1", "g1", "gpufed-a-h100", gated=False, placed=False)
    store.put(key, started)
    assert store.gated() == [] and store.on_the_way("gpufed-a-h100") == [started]
    store.put(key, twin("u1", "g2", "gpufed-a-h100", gated=False, placed=True))
    assert store.group("team", "g1") == [] and store.on_the_way("gpufed-a-h100") == []
    assert store.pop(key, uid="u2") is None and key in store
