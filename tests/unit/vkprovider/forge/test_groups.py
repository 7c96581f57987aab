"""forge.groups: which twins of a group start, when, and the patch that starts one."""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from gpufed.apis.wire import GANG_LABEL, GANG_SIZE_ANNOTATION, TWIN_GROUP_GATE
from gpupool.capacity import Bucket
from tests.unit.fakes import json_patch
from vkprovider.forge import groups


def local(label: str | None = "g1", size: str | None = "3") -> dict[str, Any]:
    meta: dict[str, Any] = {"name": "p", "namespace": "team", "labels": {}, "annotations": {}}
    if label is not None:
        meta["labels"][GANG_LABEL] = label
    if size is not None:
        meta["annotations"][GANG_SIZE_ANNOTATION] = size
    return {"metadata": meta, "spec": {}}


def twin(name: str, group: str = "g1", gated: bool = True, phase: str = "Pending") -> dict[str, Any]:
    spec: dict[str, Any] = {"containers": [{"name": "c"}]}
    if gated:
        spec["schedulingGates"] = [{"name": "provider.example/other"}, {"name": TWIN_GROUP_GATE}]
    return {"metadata": {"name": name, "labels": {GANG_LABEL: group}}, "spec": spec, "status": {"phase": phase}}


def test_a_group_is_its_label_and_a_size_of_two_or_more() -> None:
    assert groups.group_of(local()) == ("g1", 3)
    assert groups.group_of(local(size="1")) is None
    assert groups.group_of(local(size="three")) is None
    assert groups.group_of(local(label=None)) is None
    assert groups.group_of(local(size=None)) is None


def test_the_patch_removes_only_the_group_gate_and_fails_when_the_gates_moved() -> None:
    t = twin("a")
    started = twin("a")
    json_patch(started, groups.ungate_patch(t))
    assert started["spec"]["schedulingGates"] == [{"name": "provider.example/other"}]
    assert groups.gated(started) is None and groups.ungate_patch(started) == []
    moved = twin("a")
    moved["spec"]["schedulingGates"].reverse()
    try:
        json_patch(moved, groups.ungate_patch(t))
    except ValueError:
        pass
    else:
        raise AssertionError("the patch removed a gate at an index that no longer holds the group gate")
    spec: dict[str, Any] = {}
    groups.add_gate(spec)
    assert spec == {"schedulingGates": [{"name": TWIN_GROUP_GATE}]}


def answer(fits: bool | None, asked: list[int] | None = None) -> groups.Fits:
    def fits_now(waiting: Sequence[Mapping[str, Any]]) -> bool | None:
        if asked is not None:
            asked.append(len(waiting))
        return fits

    return fits_now


def test_a_group_starts_whole_once_every_twin_exists_and_fits() -> None:
    two = [twin("a"), twin("b")]
    asked: list[int] = []
    assert groups.to_start(two, 3, answer(True, asked)) == [] and asked == []  # one twin still to come
    three = [*two, twin("c")]
    assert groups.to_start(three, 3, answer(False)) == []  # the provider cannot hold them all now
    assert groups.to_start(three, 3, answer(True, asked)) == three and asked == [3]
    assert groups.to_start(three, 3, answer(None)) == three  # nobody can say: the provider's scheduler decides


def test_a_twin_of_a_started_group_joins_it() -> None:
    group = [twin("a", gated=False, phase="Running"), twin("b")]
    assert groups.started(group)
    asked: list[int] = []
    assert groups.to_start(group, 3, answer(False, asked)) == [group[1]] and asked == []


def test_deleted_twins_and_other_groups_are_no_members_and_finished_ones_started_it() -> None:
    done = twin("a", gated=False, phase="Succeeded")
    going = twin("b")
    going["metadata"]["deletionTimestamp"] = "2026-11-28T08:00:00Z"
    other = twin("c", group="g2", gated=False)
    group = groups.members([done, going, other, twin("d")], "g1")
    assert group == [done, twin("d")]
    assert groups.started(group) and groups.to_start(group, 4, answer(False)) == [twin("d")]  # the next index joins


def nodes(free: list[int]) -> tuple[Bucket, ...]:
    counts: dict[int, int] = {}
    for f in free:
        counts[f] = counts.get(f, 0) + 1
    return tuple(Bucket(f, n) for f, n in sorted(counts.items(), reverse=True))


def test_holds_places_the_pods_on_their_way_first() -> None:
    assert groups.holds(nodes([4, 4]), [], [2, 2, 2])
    assert not groups.holds(nodes([4, 4]), [4], [2, 2, 2])  # a 4-GPU twin already on its way takes a node
    assert groups.holds(nodes([4, 4]), [2], [2, 2, 2])
    assert not groups.holds(nodes([8]), [], [4, 4, 4])


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.integers(0, 8), min_size=1, max_size=4),
    st.lists(st.sampled_from([1, 2, 4, 8]), max_size=3),
)
def test_holds_never_promises_a_group_no_assignment_could_place(free: list[int], group: list[int]) -> None:
    if groups.holds(nodes(free), [], group):
        # some assignment of the group's pods to nodes respects every node's free GPUs
        def placeable() -> bool:
            for choice in itertools.product(range(len(free)), repeat=len(group)):
                left = list(free)
                for pod, node in zip(group, choice, strict=True):
                    left[node] -= pod
                if min(left, default=0) >= 0:
                    return True
            return not group

        assert placeable()
