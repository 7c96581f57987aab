"""Gang placement (gpupool.gang): which pods form a group, and which pool holds a whole group."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpufed.apis.wire import (
    JOBSET_NAME_LABEL,
    JOBSET_REPLICATED_JOB_LABEL,
    JOBSET_RESTART_LABEL,
    JOBSET_UID_LABEL,
    KUEUE_POD_GROUP_COUNT_ANNOTATION,
    KUEUE_POD_GROUP_LABEL,
    KUEUE_QUEUE_LABEL,
    POD_GROUP_LABEL,
    POD_GROUP_SIZE_ANNOTATION,
)
from gpupool.capacity import Bucket, best_fit
from gpupool.gang import (
    MAX_GROUP,
    Group,
    GroupError,
    JobSetRef,
    Offer,
    Waiting,
    group_of,
    job_owner,
    jobset_owner,
    jobset_size,
    largest_group,
    place,
    reservations,
)

H100, A100 = "NVIDIA-H100-80GB-HBM3", "NVIDIA-A100-SXM4-40GB"


def pod(
    labels: dict[str, str] | None = None, annotations: dict[str, str] | None = None, job: str = ""
) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": "p", "namespace": "team", "labels": labels or {}, "annotations": annotations or {}}
    if job:
        meta["ownerReferences"] = [{"apiVersion": "batch/v1", "kind": "Job", "name": job, "controller": True}]
    return {"metadata": meta, "spec": {}}


def job(
    parallelism: int | None, completions: int | None = None, labels: dict[str, str] | None = None
) -> dict[str, Any]:
    spec: dict[str, Any] = {}
    if parallelism is not None:
        spec["parallelism"] = parallelism
    if completions is not None:
        spec["completions"] = completions
    return {"metadata": {"name": "train", "uid": "0123456789abcdef", "labels": labels or {}}, "spec": spec}


# ---- groups


def test_a_jobs_pods_that_run_together_form_a_group() -> None:
    p = pod(job="train")
    assert job_owner(p) == "train"
    assert group_of(p, job(4)) == Group("team", "job-train-01234567", 4)
    assert group_of(p, job(4, completions=2)) == Group("team", "job-train-01234567", 2)
    # one pod at a time: no group, today's path
    assert group_of(p, job(1)) is None
    assert group_of(p, job(None, completions=8)) is None
    assert group_of(p, None) is None


def rjob(name: str, replicas: Any, parallelism: Any, completions: int | None = None, **extra: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {}
    if parallelism is not None:
        spec["parallelism"] = parallelism
    if completions is not None:
        spec["completions"] = completions
    out: dict[str, Any] = {"name": name, "template": {"spec": spec}, **extra}
    if replicas is not None:
        out["replicas"] = replicas
    return out


def jobset(*rjobs: dict[str, Any], labels: dict[str, str] | None = None, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "jobset.x-k8s.io/v1alpha2",
        "kind": "JobSet",
        "metadata": {"name": "llm", "uid": "fedcba9876543210", "labels": labels or {}},
        "spec": {"replicatedJobs": list(rjobs), **spec},
    }


def jobset_pod(rjob_name: str = "workers", attempt: str = "0", **labels: str) -> dict[str, Any]:
    return pod(
        {
            JOBSET_NAME_LABEL: "llm",
            JOBSET_UID_LABEL: "fedcba9876543210",
            JOBSET_REPLICATED_JOB_LABEL: rjob_name,
            JOBSET_RESTART_LABEL: attempt,
            **labels,
        },
        job=f"llm-{rjob_name}-0",
    )


def test_a_jobsets_pods_form_one_group_of_every_pod_it_runs_at_once() -> None:
    js = jobset(rjob("leader", 1, 1), rjob("workers", 3, 2, completions=2))
    assert jobset_owner(jobset_pod()) == JobSetRef("llm", "fedcba9876543210", "workers", 0)
    # leader 1 x 1 + workers 3 x 2: one group for the pods of both replicatedJobs
    assert group_of(jobset_pod("leader"), js) == Group("team", "jobset-llm-fedcba98-r0", 7)
    assert group_of(jobset_pod("workers"), js) == Group("team", "jobset-llm-fedcba98-r0", 7)
    # completions below parallelism bound the pods at once; replicas and parallelism default to 1
    assert jobset_size(jobset(rjob("a", None, 4, completions=1), rjob("b", 2, None)), "a") == ("", 3)
    # a restarted JobSet's pods are a new group
    assert group_of(jobset_pod(attempt="2"), js) == Group("team", "jobset-llm-fedcba98-r2", 7)
    # one pod in all: today's path
    assert group_of(jobset_pod("solo"), jobset(rjob("solo", 1, 1))) is None


def test_a_jobset_whose_replicated_jobs_start_one_after_another_is_a_group_per_stage() -> None:
    ordered = jobset(rjob("leader", 1, 2), rjob("workers", 3, 2), startupPolicy={"startupPolicyOrder": "InOrder"})
    assert group_of(jobset_pod("leader"), ordered) == Group("team", "jobset-llm-fedcba98-leader-r0", 2)
    assert group_of(jobset_pod("workers"), ordered) == Group("team", "jobset-llm-fedcba98-workers-r0", 6)
    staged = jobset(
        rjob("init", 1, 1),
        rjob("cache", 2, 1),
        rjob("train", 4, 2, dependsOn=[{"name": "init", "status": "Complete"}]),
    )
    assert group_of(jobset_pod("init"), staged) == Group("team", "jobset-llm-fedcba98-init-r0", 3)
    assert group_of(jobset_pod("cache"), staged) == Group("team", "jobset-llm-fedcba98-init-r0", 3)
    assert group_of(jobset_pod("train"), staged) == Group("team", "jobset-llm-fedcba98-train-r0", 8)


def test_a_jobset_kueue_admits_is_left_to_kueue() -> None:
    js = jobset(rjob("leader", 1, 1), rjob("workers", 3, 2), labels={KUEUE_QUEUE_LABEL: "team-a"})
    assert group_of(jobset_pod(), js) is None


@pytest.mark.parametrize(
    "labels",
    [
        {JOBSET_RESTART_LABEL: "-1"},
        {JOBSET_RESTART_LABEL: "9" * 12},
        {JOBSET_REPLICATED_JOB_LABEL: ""},
        {JOBSET_REPLICATED_JOB_LABEL: "x" * 64},
        {JOBSET_REPLICATED_JOB_LABEL: "nobody"},
        {JOBSET_NAME_LABEL: "other"},
    ],
)
def test_a_jobset_pods_labels_are_checked_before_they_count(labels: dict[str, str]) -> None:
    js = jobset(rjob("leader", 1, 1), rjob("workers", 3, 2))
    p = jobset_pod()
    p["metadata"]["labels"].update(labels)
    with pytest.raises(GroupError):
        group_of(p, js)


@pytest.mark.parametrize(
    "bad",
    [
        rjob("workers", MAX_GROUP, 2),
        rjob("workers", -1, 2),
        rjob("workers", 2, "8"),
        rjob("workers", True, 2),
    ],
)
def test_a_jobset_too_large_or_malformed_is_refused(bad: dict[str, Any]) -> None:
    with pytest.raises(GroupError):
        group_of(jobset_pod(), jobset(rjob("leader", 1, 1), bad))


def test_pods_with_a_group_label_form_a_group_of_the_declared_size() -> None:
    p = pod({POD_GROUP_LABEL: "ring"}, {POD_GROUP_SIZE_ANNOTATION: "3"})
    assert group_of(p) == Group("team", "group-ring", 3)
    kueue = pod({KUEUE_POD_GROUP_LABEL: "ring"}, {KUEUE_POD_GROUP_COUNT_ANNOTATION: "2"})
    assert group_of(kueue) == Group("team", "group-ring", 2)


@pytest.mark.parametrize("size", ["", "zero", "0", "-2", "1001", "2.5"])
def test_a_group_size_that_is_no_whole_number_of_pods_is_refused(size: str) -> None:
    with pytest.raises(GroupError, match=POD_GROUP_SIZE_ANNOTATION):
        group_of(pod({POD_GROUP_LABEL: "ring"}, {POD_GROUP_SIZE_ANNOTATION: size}))


def test_what_kueue_admits_is_left_to_kueue() -> None:
    assert group_of(pod({KUEUE_QUEUE_LABEL: "team-a"}, job="train"), job(4)) is None
    assert group_of(pod(job="train"), job(4, labels={KUEUE_QUEUE_LABEL: "team-a"})) is None


# ---- pools


def offer(node: str, free: list[tuple[int, int]] | None, headroom: int = 64, product: str = H100) -> Offer:
    buckets = None if free is None else tuple(Bucket(f, n) for f, n in free)
    return Offer(node, node.removeprefix("gpufed-"), product, headroom, buckets, total=64, granted=64)


def test_the_largest_group_a_pool_takes_packs_onto_the_fullest_nodes() -> None:
    o = offer("gpufed-a", [(8, 1), (4, 1), (2, 2)])
    assert largest_group(o, [2, 2, 2, 2]) == 4  # 8 on one node
    assert largest_group(o, [2] * 8) == 8
    assert largest_group(o, [2] * 9) == 8
    assert largest_group(o, [8, 8]) == 1
    assert largest_group(offer("gpufed-a", [(8, 4)], headroom=6), [2, 2, 2, 2]) == 3  # the grant caps it
    # static figures: the headroom alone
    assert largest_group(offer("gpufed-a", None, headroom=6), [2, 2, 2, 2]) == 3


def test_a_group_goes_whole_to_one_pool_and_the_tightest_one() -> None:
    offers = [offer("gpufed-a", [(8, 4)]), offer("gpufed-b", [(4, 2)], product=A100)]
    # both hold it and leave as much of their grant unused: the first by name
    d = place([2, 2, 2, 2], offers)
    assert d.node == "gpufed-a" and "fits on gpufed-a" in d.reason
    # gpufed-b holds 4 x 2 exactly and leaves less of its grant unused: best fit
    tight = [offer("gpufed-a", [(8, 4)], headroom=64), offer("gpufed-b", [(4, 2)], headroom=8, product=A100)]
    assert place([2, 2, 2, 2], tight).node == "gpufed-b"
    assert place([8, 8, 8], tight).node == "gpufed-a"
    assert place([2, 2, 2, 2], tight, product=H100).node == "gpufed-a"


def test_a_group_no_pool_takes_now_waits_with_what_each_pool_takes() -> None:
    offers = [offer("gpufed-a", [(8, 1), (2, 1)]), offer("gpufed-b", [(4, 1)], product=A100)]
    d = place([4, 4, 4], offers)
    assert d.node is None and not d.never
    assert "3 pods (4 GPUs each, 12 in all)" in d.reason
    assert "gpufed-a: 2, gpufed-b: 1" in d.reason


def test_a_group_larger_than_any_grant_is_refused_at_once() -> None:
    d = place([8] * 9, [offer("gpufed-a", [(8, 8)])])  # 72 GPUs > the grant of 64
    assert d.node is None and d.never and "more than any provider grants" in d.reason
    assert place([1, 1], [], product=H100).never


def test_a_group_larger_than_a_grant_shrunk_by_the_providers_own_load_waits() -> None:
    # the provider's own pods took 24 of 32 GPUs: the live grant is 8, the slices still ask for 32
    shrunk = Offer("gpufed-a", "a", H100, 8, (Bucket(8, 1),), total=32, granted=8, requested=32)
    d = place([8, 8], [shrunk])
    assert d.node is None and not d.never and "gpufed-a: 1" in d.reason
    # beyond what the slices ask for it is a refusal
    assert place([8] * 5, [shrunk]).never


@given(
    st.lists(st.tuples(st.integers(1, 8), st.integers(1, 3)), max_size=5),
    st.lists(st.integers(1, 8), min_size=1, max_size=6),
    st.integers(0, 64),
)
def test_the_chosen_pool_really_holds_the_whole_group(
    free: list[tuple[int, int]], gpus: list[int], headroom: int
) -> None:
    o = offer("gpufed-a", free, headroom=headroom)
    d = place(gpus, [o])
    if d.node is not None:
        assert sum(gpus) <= headroom
        assert not best_fit(o.free_nodes or (), gpus)[1]
    assert largest_group(o, gpus) <= len(gpus)


def waits(name: str, since: str, gpus: list[int], pools: set[str]) -> Waiting:
    return Waiting(("team", name), since, tuple(gpus), frozenset(pools))


def test_the_longest_waiting_group_reserves_the_pool_closest_to_holding_it_one_group_per_pool() -> None:
    offers = [
        offer("gpufed-a", [(8, 1)]),  # holds one of two 8-GPU pods now
        offer("gpufed-b", [], product=A100),  # holds none now
        Offer("gpufed-c", "c", H100, 8, (Bucket(8, 1),), total=64, granted=8),  # a grant of 8 never holds 16
    ]
    older = waits("older", "2026-11-28T10:00:00Z", [8, 8], {"gpufed-a", "gpufed-b", "gpufed-c"})
    newer = waits("newer", "2026-11-28T10:05:00Z", [8, 8], {"gpufed-a", "gpufed-b"})
    only_a = waits("only-a", "2026-11-28T10:06:00Z", [4, 4], {"gpufed-a"})
    got = reservations([newer, only_a, older], offers)
    # the oldest first, on the pool that takes the most of it now; the next one on what is left; a
    # group whose only pool is taken reserves nothing
    assert got == {("team", "older"): "gpufed-a", ("team", "newer"): "gpufed-b"}
    # equal waits: by name; no pool it may use that could ever hold it: nothing
    same = waits("a", "2026-11-28T10:00:00Z", [8, 8], {"gpufed-a"})
    assert reservations([waits("b", "2026-11-28T10:00:00Z", [8, 8], {"gpufed-a"}), same], offers) == {
        ("team", "a"): "gpufed-a"
    }
    assert reservations([waits("x", "2026-11-28T10:00:00Z", [8, 8], {"gpufed-c", "gone"})], offers) == {}
