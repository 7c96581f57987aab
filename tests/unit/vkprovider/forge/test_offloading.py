"""The offloading webhook's pod mutation (`vkprovider.forge.offloading.mutate`): the patch applied to
a pod gives the strategy's toleration and affinity, keeps the user's settings, and is idempotent."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from gpufed.apis.wire import GANG_GATE, GANG_GROUP_ANNOTATION, GANG_LABEL, GANG_SIZE_ANNOTATION
from gpupool.gang import Group
from vkprovider.forge.offloading import NOT_ON_VIRTUAL, ON_VIRTUAL, TOLERATION, gate, gpus_of, mutate

H100 = {"key": "nvidia.com/gpu.product", "operator": "In", "values": ["NVIDIA-H100-80GB-HBM3"]}
CLUSTER_B = {"key": "gpufed.io/remote-cluster-id", "operator": "In", "values": ["gpu-b-1"]}
SELECTOR = {"nodeSelectorTerms": [{"matchExpressions": [H100]}]}
ZONE = {"key": "zone", "operator": "In", "values": ["z1"]}
RACK = {"key": "rack", "operator": "Exists"}


def _unescape(s: str) -> str:
    return s.replace("~1", "/").replace("~0", "~")


def apply_patch(doc: dict[str, Any], ops: list[dict[str, Any]]) -> dict[str, Any]:
    """A tiny RFC 6902 applier for the ops `mutate` emits (add, replace)."""
    out = copy.deepcopy(doc)
    for op in ops:
        assert op["op"] in ("add", "replace"), op
        *parents, last = [_unescape(p) for p in op["path"].split("/")[1:]]
        node: Any = out
        for p in parents:
            node = node[int(p)] if isinstance(node, list) else node[p]
        if isinstance(node, list):
            if last == "-":
                node.append(op["value"])
            else:
                node.insert(int(last), op["value"])
        else:
            if op["op"] == "replace":
                assert last in node, op
            node[last] = op["value"]
    return out


def pod(**spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "p"},
        "spec": {"containers": [{"name": "c"}], **spec},
    }


def required(p: dict[str, Any]) -> list[list[dict[str, Any]]]:
    terms = p["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    return [t.get("matchExpressions", []) for t in terms]


def mutated(p: dict[str, Any], strategy: str, selector: dict[str, Any] | None = None) -> dict[str, Any]:
    ops = mutate(p, strategy, selector)
    out = apply_patch(p, ops)
    assert mutate(out, strategy, selector) == [], "a second invocation must change nothing"
    return out


def test_remote_without_selector() -> None:
    out = mutated(pod(), "Remote")
    assert out["spec"]["tolerations"] == [TOLERATION]
    assert required(out) == [[ON_VIRTUAL]]


def test_remote_with_selector_ands_every_term() -> None:
    sel = {"nodeSelectorTerms": [{"matchExpressions": [H100]}, {"matchExpressions": [CLUSTER_B]}]}
    out = mutated(pod(), "Remote", sel)
    assert required(out) == [[ON_VIRTUAL, H100], [ON_VIRTUAL, CLUSTER_B]]


def test_local_and_remote_without_selector_only_tolerates() -> None:
    out = mutated(pod(), "LocalAndRemote")
    assert out["spec"]["tolerations"] == [TOLERATION]
    assert "affinity" not in out["spec"]
    # An empty selector is no selector.
    assert mutate(pod(), "LocalAndRemote", {"nodeSelectorTerms": []}) == mutate(pod(), "LocalAndRemote", None)


def test_local_and_remote_with_selector_keeps_local_nodes_allowed() -> None:
    out = mutated(pod(), "LocalAndRemote", SELECTOR)
    assert out["spec"]["tolerations"] == [TOLERATION]
    assert required(out) == [[NOT_ON_VIRTUAL], [ON_VIRTUAL, H100]]


def test_local_adds_not_in_and_no_toleration() -> None:
    out = mutated(pod(), "Local", SELECTOR)
    assert "tolerations" not in out["spec"]
    assert required(out) == [[NOT_ON_VIRTUAL]]


def test_user_terms_are_crossed_with_ours_and_nothing_is_removed() -> None:
    user_affinity: dict[str, Any] = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {"matchExpressions": [ZONE]},
                    {
                        "matchExpressions": [RACK],
                        "matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n"]}],
                    },
                ]
            },
            "preferredDuringSchedulingIgnoredDuringExecution": [
                {"weight": 1, "preference": {"matchExpressions": [ZONE]}}
            ],
        },
        "podAntiAffinity": {"x": 1},
    }
    user_tol = {"key": "dedicated", "operator": "Equal", "value": "ml", "effect": "NoSchedule"}
    p = pod(affinity=user_affinity, tolerations=[user_tol], nodeSelector={"disk": "ssd"})
    out = mutated(p, "LocalAndRemote", SELECTOR)
    assert out["spec"]["tolerations"] == [user_tol, TOLERATION]
    assert out["spec"]["nodeSelector"] == {"disk": "ssd"}
    assert out["spec"]["affinity"]["podAntiAffinity"] == {"x": 1}
    na = out["spec"]["affinity"]["nodeAffinity"]
    assert (
        na["preferredDuringSchedulingIgnoredDuringExecution"]
        == user_affinity["nodeAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
    )
    assert required(out) == [
        [ZONE, NOT_ON_VIRTUAL],
        [ZONE, ON_VIRTUAL, H100],
        [RACK, NOT_ON_VIRTUAL],
        [RACK, ON_VIRTUAL, H100],
    ]
    terms = na["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert all(t["matchFields"] == [{"key": "metadata.name", "operator": "In", "values": ["n"]}] for t in terms[2:])
    assert p["spec"]["affinity"] == user_affinity, "the input is not modified"


@pytest.mark.parametrize(
    "affinity",
    [
        {},
        {"podAffinity": {"y": 1}},
        {"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": []}},
        {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {}}},
    ],
)
def test_partial_affinity_objects_are_completed(affinity: dict[str, Any]) -> None:
    out = mutated(pod(affinity=affinity), "Remote", SELECTOR)
    assert required(out) == [[ON_VIRTUAL, H100]]
    for k, v in affinity.items():
        if k != "nodeAffinity":
            assert out["spec"]["affinity"][k] == v


def test_existing_tolerations_that_already_cover_the_taint() -> None:
    for tol in (
        {"operator": "Exists"},
        {"key": "gpufed.io/virtual-node", "operator": "Exists"},
        {"key": "gpufed.io/virtual-node", "operator": "Equal", "value": "true", "effect": "NoExecute"},
    ):
        assert not [o for o in mutate(pod(tolerations=[tol]), "Remote", None) if "tolerations" in o["path"]]
    # A toleration that would evict the pod after a while does not count.
    timed = {"key": "gpufed.io/virtual-node", "operator": "Exists", "tolerationSeconds": 30}
    out = mutated(pod(tolerations=[timed]), "Remote")
    assert out["spec"]["tolerations"] == [timed, TOLERATION]


def test_a_pod_already_restricted_to_our_terms_is_left_alone() -> None:
    p = pod(
        tolerations=[TOLERATION],
        affinity={
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [{"matchExpressions": [ZONE, ON_VIRTUAL, H100]}]
                }
            }
        },
    )
    assert mutate(p, "Remote", SELECTOR) == []
    assert mutate(p, "LocalAndRemote", SELECTOR) == []


def test_unknown_strategy_is_an_error() -> None:
    with pytest.raises(ValueError, match="unknown pod offloading strategy"):
        mutate(pod(), "Sometimes", None)


def test_gate_only_gpu_pods_of_groups_once_and_never_in_local_namespaces() -> None:
    owned = {"apiVersion": "batch/v1", "kind": "Job", "name": "train", "controller": True}
    pod: dict[str, Any] = {
        "metadata": {"name": "w-0", "namespace": "team", "ownerReferences": [owned]},
        "spec": {"containers": [{"name": "c", "resources": {"requests": {"nvidia.com/gpu": "2"}}}]},
    }
    job = {"metadata": {"name": "train", "uid": "j"}, "spec": {"parallelism": 3}}
    group = Group("team", "job-train-j", 3)
    assert gate(pod, "Remote", job) == [
        {"op": "add", "path": "/spec/schedulingGates", "value": [{"name": GANG_GATE}]},
        {"op": "add", "path": "/metadata/labels", "value": {GANG_LABEL: group.label}},
        {
            "op": "add",
            "path": "/metadata/annotations",
            "value": {GANG_GROUP_ANNOTATION: group.name, GANG_SIZE_ANNOTATION: "3"},
        },
    ]
    assert gate(pod, "LocalAndRemote", job) != []
    assert gate(pod, "Local", job) == []
    gated = {**pod, "spec": {**pod["spec"], "schedulingGates": [{"name": GANG_GATE}]}}
    assert gate(gated, "Remote", job) == []
    other = {**pod, "spec": {**pod["spec"], "schedulingGates": [{"name": "example.com/wait"}]}}
    other["metadata"] = {**pod["metadata"], "labels": {"app": "train"}}
    appended = {"op": "add", "path": "/spec/schedulingGates/-", "value": {"name": GANG_GATE}}
    labelled = {"op": "add", "path": "/metadata/labels/gpufed.io~1gang", "value": group.label}
    assert gate(other, "Remote", job)[:2] == [appended, labelled]
    cpu = {**pod, "spec": {"containers": [{"name": "c", "resources": {"requests": {"cpu": "1"}}}]}}
    assert gate(cpu, "Remote", job) == []
    assert gpus_of({"spec": {"containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": "4"}}}]}}) == 4
