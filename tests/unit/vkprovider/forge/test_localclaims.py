"""Pure translators for claims of the virtual class bound to the consumer's own storage
(vkprovider.forge.localclaims): node selection as Kubernetes reads it, the volume kube-scheduler's
binder would pick, the shadow claim and the claimRef."""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from vkprovider.forge.localclaims import claim_ref, node_selects, pick_volume, shadow_claim, shadow_name

NODE = {"metadata": {"name": "consumer-cpu-0", "labels": {"kubernetes.io/hostname": "consumer-cpu-0", "zone": "a"}}}


def claim(size: str = "10Gi", modes: tuple[str, ...] = ("ReadWriteOnce",)) -> dict[str, Any]:
    return {
        "metadata": {"name": "data", "namespace": "team", "uid": "u-1"},
        "spec": {
            "storageClassName": "gpufed",
            "accessModes": list(modes),
            "resources": {"requests": {"storage": size}},
        },
    }


def volume(
    name: str,
    size: str = "50Gi",
    node: str = "consumer-cpu-0",
    cls: str = "local-disk",
    phase: str = "Available",
    **spec: Any,
) -> dict[str, Any]:
    return {
        "metadata": {"name": name},
        "spec": {
            "capacity": {"storage": size},
            "accessModes": ["ReadWriteOnce"],
            "storageClassName": cls,
            "nodeAffinity": {
                "required": {
                    "nodeSelectorTerms": [
                        {"matchExpressions": [{"key": "kubernetes.io/hostname", "operator": "In", "values": [node]}]}
                    ]
                }
            },
            **spec,
        },
        "status": {"phase": phase},
    }


def test_node_selection_follows_kubernetes() -> None:
    def expr(op: str, *values: str, key: str = "zone") -> list[dict[str, Any]]:
        return [{"matchExpressions": [{"key": key, "operator": op, "values": list(values)}]}]

    assert node_selects(None, NODE)
    assert node_selects(expr("In", "a", "b"), NODE) and not node_selects(expr("In", "b"), NODE)
    assert node_selects(expr("NotIn", "b"), NODE) and not node_selects(expr("NotIn", "a"), NODE)
    assert node_selects(expr("Exists"), NODE) and not node_selects(expr("DoesNotExist"), NODE)
    assert node_selects(expr("DoesNotExist", key="gpu"), NODE)
    assert not node_selects(expr("Gt", "1"), NODE), "a label that is no integer never satisfies Gt"
    numbered = {"metadata": {"name": "n", "labels": {"cores": "8"}}}
    assert node_selects(expr("Gt", "4", key="cores"), numbered) and not node_selects(
        expr("Lt", "4", key="cores"), numbered
    )
    assert not node_selects([{}], NODE), "an empty term selects nothing"
    assert node_selects([{}, *expr("In", "a")], NODE), "terms are ORed"
    both = [
        {
            "matchExpressions": [
                *expr("In", "a")[0]["matchExpressions"],
                *expr("In", "z", key="kubernetes.io/hostname")[0]["matchExpressions"],
            ]
        }
    ]
    assert not node_selects(both, NODE), "expressions are ANDed"
    fields = [{"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["consumer-cpu-0"]}]}]
    assert node_selects(fields, NODE) and not node_selects(fields, {"metadata": {"name": "other"}})


def test_the_smallest_free_fitting_volume_on_the_node_is_picked() -> None:
    volumes = [
        volume("big", "100Gi"),
        volume("small", "20Gi"),
        volume("tiny", "5Gi"),
        volume("elsewhere", "20Gi", node="consumer-cpu-1"),
        volume("other-class", "20Gi", cls="fast"),
        volume("bound", "20Gi", claimRef={"name": "x"}),
        volume("released", "20Gi", phase="Released"),
        volume("block", "20Gi", volumeMode="Block"),
    ]
    picked = pick_volume(claim(), volumes, NODE, "local-disk")
    assert picked is not None and picked["metadata"]["name"] == "small"
    assert pick_volume(claim("200Gi"), volumes, NODE, "local-disk") is None
    assert pick_volume(claim(modes=("ReadWriteMany",)), volumes, NODE, "local-disk") is None
    deleting = volume("small", "20Gi")
    deleting["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    assert pick_volume(claim(), [deleting], NODE, "local-disk") is None


@given(
    st.lists(st.integers(min_value=1, max_value=200), min_size=1, max_size=8), st.integers(min_value=1, max_value=200)
)
def test_the_pick_is_the_smallest_that_holds_the_claim(sizes: list[int], want: int) -> None:
    volumes = [volume(f"v{i}", f"{s}Gi") for i, s in enumerate(sizes)]
    picked = pick_volume(claim(f"{want}Gi"), volumes, NODE, "local-disk")
    fitting = [s for s in sizes if s >= want]
    if not fitting:
        assert picked is None
    else:
        assert picked is not None and picked["spec"]["capacity"]["storage"] == f"{min(fitting)}Gi"


def test_the_shadow_claim_asks_the_local_class_for_the_same_volume_on_the_same_node() -> None:
    c = claim()
    c["spec"]["volumeMode"] = "Filesystem"
    shadow = shadow_claim(c, "fast-local", "consumer-cpu-0")
    assert shadow["metadata"]["name"] == shadow_name(c) == "gpufed-local-u-1"
    assert shadow["metadata"]["namespace"] == "team"
    assert shadow["metadata"]["annotations"] == {"volume.kubernetes.io/selected-node": "consumer-cpu-0"}
    assert shadow["metadata"]["labels"]["gpufed.io/origin-uid"] == "u-1"
    assert shadow["metadata"]["ownerReferences"] == [
        {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "name": "data", "uid": "u-1"}
    ]
    assert shadow["spec"] == {
        "storageClassName": "fast-local",
        "accessModes": ["ReadWriteOnce"],
        "resources": {"requests": {"storage": "10Gi"}},
        "volumeMode": "Filesystem",
    }
    assert claim_ref(c) == {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "namespace": "team",
        "name": "data",
        "uid": "u-1",
    }
