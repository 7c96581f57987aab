"""The gpu-pool benchmark's pure helpers: the seeded trace with its groups, the Jobs it submits (plain,
Indexed, queued for Kueue), the virtual nodes and flavors a mode implies, the greedy references that
place a group whole, what the watches record (where each pod ran, split groups), the figures, the
verdicts and its section of docs/benchmarks.md. Plain data only: no clusters."""

from __future__ import annotations

import argparse
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest

from bench import gpupool, gpupool_kueue, gpupool_report, report
from bench import gpupool_record as record
from bench import gpupool_trace as trace
from bench.__main__ import PARTS, _durations, _modes, _parts, _share
from bench.gpupool_record import JobResult, ModeRecord, Observer, RemoteWait
from bench.gpupool_trace import TraceJob
from gpufed.localenv.topology import default_topology

IDS = {"consumer": "c0nsumer", "gpu-a": "aaaa1111", "gpu-b": "bbbb2222"}
H100 = "gpu-a/NVIDIA-H100-80GB-HBM3"
A100 = "gpu-b/NVIDIA-A100-SXM4-40GB"
L4 = "gpu-b/NVIDIA-L4"


# ------------------------------------------------------------------------------------ trace


def test_trace_is_deterministic_per_seed_and_has_the_asked_size() -> None:
    a = trace.make_trace(160, 8)
    assert a == trace.make_trace(160, 8)
    assert a != trace.make_trace(160, 9)
    assert len(a) == 160
    assert len({j.name for j in a}) == 160
    assert a[0].name == "job-000" and a[-1].name == "job-159"


def test_trace_has_groups_of_two_to_four_pods_that_one_pool_can_hold() -> None:
    jobs = trace.make_trace(160, 8)
    groups = [j for j in jobs if j.group]
    # A share of 0.25: 40 expected.
    assert 25 <= len(groups) <= 55, len(groups)
    assert {j.pods for j in groups} == {2, 3, 4}
    assert {j.pods for j in jobs if not j.group} == {1}
    assert all(j.pods * j.gpus <= trace.MAX_GROUP_GPUS for j in groups)
    pools = trace.pools(default_topology())
    # Every Job fits gpu-a whole; some groups (2 x 8) fit nowhere else.
    assert all(trace.fits(j, pools[H100]) for j in jobs)
    only_a = [j for j in groups if not trace.fits(j, pools[A100]) and not trace.fits(j, pools[L4])]
    assert only_a and all(j.gpus == 8 or j.pods * j.gpus > 8 for j in only_a)
    assert any(trace.fits(j, pools[L4]) for j in groups)  # k x 1 groups


def test_trace_mix_of_single_pods_and_durations() -> None:
    jobs = trace.make_trace(400, 8)
    singles = Counter(j.gpus for j in jobs if not j.group)
    n = sum(singles.values())
    assert set(singles) == {1, 2, 4, 8}
    for gpus, weight in trace.GPU_WEIGHTS:
        assert abs(singles[gpus] - n * weight) < 30, singles
    assert all(4.0 <= j.duration_s <= 16.0 for j in jobs)
    assert all(round(j.duration_s, 1) == j.duration_s for j in jobs)
    assert max(j.duration_s for j in jobs) - min(j.duration_s for j in jobs) > 8


def test_trace_group_share_is_honoured() -> None:
    assert not any(j.group for j in trace.make_trace(50, 8, group_share=0.0))
    assert all(j.group for j in trace.make_trace(50, 8, group_share=1.0))


def test_trace_refuses_nonsense() -> None:
    with pytest.raises(ValueError, match="n >= 1"):
        trace.make_trace(0, 8)
    with pytest.raises(ValueError):
        trace.make_trace(10, 8, (5.0, 4.0))
    with pytest.raises(ValueError, match="share"):
        trace.make_trace(10, 8, group_share=1.5)


def test_trace_per_mode_keeps_the_jobs_and_renames_them() -> None:
    base = trace.make_trace(8, 8)
    kueue = trace.for_mode(base, "kueue")
    assert [j.name for j in kueue] == [f"kueue-{i:03d}" for i in range(8)]
    assert [(j.gpus, j.duration_s, j.pods) for j in kueue] == [(j.gpus, j.duration_s, j.pods) for j in base]


def test_trace_summary_and_ideal_count_every_pod_of_a_group() -> None:
    jobs = [TraceJob("job-000", 8, 10.0), TraceJob("job-001", 1, 4.0), TraceJob("job-002", 2, 6.0, pods=3)]
    s = trace.trace_summary(jobs, 44)
    assert s["gpu_seconds"] == 80 + 4 + 3 * 2 * 6
    assert s["group_gpu_seconds"] == 36
    assert (s["jobs"], s["pods"], s["single_pod_jobs"], s["groups"]) == (3, 5, 2, 1)
    assert s["ideal_makespan_s"] == round(120 / 44, 1)
    assert s["by_gpus"] == {"1": 1, "8": 1}
    assert s["groups_by_shape"] == {"3x2": 1}
    assert s["duration_s"] == {"min": 4.0, "mean": 6.67, "max": 10.0}
    assert trace.ideal_makespan(440, 44) == 10
    assert trace.time_limit(100) == 3 * 100 + 60
    assert trace.time_limit(100, 2) == 260


def test_default_trace_fits_the_time_budget() -> None:
    s = trace.trace_summary(trace.make_trace(trace.DEFAULT_JOBS, trace.DEFAULT_SEED), 44)
    # About 2 minutes of ideal makespan: three modes stay within the ~20 minutes the part may take.
    assert 90 < s["ideal_makespan_s"] < 160


# ------------------------------------------------------------------------------------ Jobs and nodes


def test_job_body_of_a_single_pod_is_a_plain_gpu_job() -> None:
    body = gpupool.job_body(TraceJob("live-007", 4, 7.5), "bench-gpu", "live")
    assert (body["apiVersion"], body["kind"]) == ("batch/v1", "Job")
    assert body["metadata"] == {"name": "live-007", "namespace": "bench-gpu", "labels": {gpupool.MODE_LABEL: "live"}}
    spec = body["spec"]
    assert spec["backoffLimit"] == 6
    assert "completions" not in spec and "parallelism" not in spec and "completionMode" not in spec
    assert "suspend" not in spec
    tmpl = spec["template"]
    assert tmpl["metadata"]["annotations"] == {"local.gpufed.io/run-duration": "7.5s"}
    pod = tmpl["spec"]
    assert pod["restartPolicy"] == "Never"
    assert "nodeName" not in pod and "tolerations" not in pod and "nodeSelector" not in pod
    assert pod["containers"][0]["resources"]["limits"] == {"nvidia.com/gpu": "4"}
    assert gpupool.run_duration(12.0) == "12s"


def test_job_body_of_a_group_is_an_indexed_job_running_all_its_pods_at_once() -> None:
    spec = gpupool.job_body(TraceJob("live-008", 2, 5.0, pods=3), "bench-gpu", "live")["spec"]
    assert (spec["parallelism"], spec["completions"], spec["completionMode"]) == (3, 3, "Indexed")
    assert spec["template"]["spec"]["containers"][0]["resources"]["limits"] == {"nvidia.com/gpu": "2"}


def test_job_body_in_kueue_mode_names_the_queue_and_is_suspended() -> None:
    body = gpupool.job_body(TraceJob("kueue-008", 2, 5.0, pods=3), "bench-gpu", "kueue")
    assert body["metadata"]["labels"] == {gpupool.MODE_LABEL: "kueue", "kueue.x-k8s.io/queue-name": "bench-gpu"}
    assert body["spec"]["suspend"] is True
    assert body["spec"]["completionMode"] == "Indexed"
    plain = gpupool.job_body(TraceJob("live-1", 1, 5.0), "ns", "live")
    assert "kueue.x-k8s.io/queue-name" not in plain["metadata"]["labels"]


def test_expected_nodes_per_mode() -> None:
    topo = default_topology()
    assert gpupool.expected_nodes("static", IDS, topo) == {"gpufed-aaaa1111": 32, "gpufed-bbbb2222": 12}
    live = {"gpufed-aaaa1111": 8, "gpufed-bbbb2222-nvidia-a100-sxm4-40gb": 4, "gpufed-bbbb2222-nvidia-l4": 1}
    assert gpupool.expected_nodes("live", IDS, topo) == live
    assert gpupool.expected_nodes("kueue", IDS, topo) == live
    assert gpupool.stall_window("kueue", 60) == gpupool.stall_window("live", 60) == gpupool.LIVE_STALL_S
    assert gpupool.stall_window("static", 60) == 60


def test_pool_nodes_give_the_flavors_their_products_gpus() -> None:
    assert trace.pool_nodes(IDS, default_topology()) == {
        "gpufed-aaaa1111": {"gpus": 32, "largest": 8},
        "gpufed-bbbb2222-nvidia-a100-sxm4-40gb": {"gpus": 8, "largest": 4},
        "gpufed-bbbb2222-nvidia-l4": {"gpus": 4, "largest": 1},
    }
    places = trace.node_places(default_topology())
    assert places["gpu-a-h100-3"] == H100 and places["gpu-b-a100-1"] == A100 and places["gpu-b-l4-0"] == L4
    assert len(places) == 10


def test_nodes_match() -> None:
    want = {"a": 8, "b": 4}
    ok = {"a": {"gpus": 8, "ready": True}, "b": {"gpus": 4, "ready": True}}
    assert gpupool.nodes_match(ok, want)
    assert not gpupool.nodes_match({"a": {"gpus": 8, "ready": True}}, want)
    assert not gpupool.nodes_match({**ok, "b": {"gpus": 12, "ready": True}}, want)
    assert not gpupool.nodes_match({**ok, "b": {"gpus": 4, "ready": False}}, want)
    # A node of the other mode may linger NotReady, not Ready.
    assert gpupool.nodes_match({**ok, "old": {"gpus": 12, "ready": False}}, want)
    assert not gpupool.nodes_match({**ok, "old": {"gpus": 12, "ready": True}}, want)


def test_kueue_queues_cover_the_flavors_largest_first() -> None:
    cq = gpupool_kueue.cluster_queue("bench-gpu", {"l4": 4, "h100": 32, "a100": 8})
    (group,) = cq["spec"]["resourceGroups"]
    assert group["coveredResources"] == ["cpu", "memory", "nvidia.com/gpu"]
    assert [f["name"] for f in group["flavors"]] == ["h100", "a100", "l4"]
    assert gpupool_kueue.gpu_quotas(cq) == {"h100": 32, "a100": 8, "l4": 4}
    assert cq["spec"]["queueingStrategy"] == "BestEffortFIFO" and cq["spec"]["namespaceSelector"] == {}
    lq = gpupool_kueue.local_queue("bench-gpu", "bench-gpu", "bench-gpu")
    assert lq["metadata"] == {"name": "bench-gpu", "namespace": "bench-gpu"}
    assert lq["spec"] == {"clusterQueue": "bench-gpu"}


# ------------------------------------------------------------------------------------ references


def test_simulate_places_a_group_whole_on_the_pool_it_fills_best() -> None:
    pools = {"big": [8, 8], "small": [4, 4]}
    # The 2 x 4 group fills `small`, so both 8-GPU pods run at once on `big`.
    jobs = [TraceJob("g", 4, 10.0, pods=2), TraceJob("a", 8, 10.0), TraceJob("b", 8, 10.0)]
    assert trace.simulate(jobs, pools) == 10.0
    # Alone on `big` the group would pack onto one node and the second 8-GPU pod would wait.
    assert trace.simulate(jobs, {"big": [8, 8]}) == 20.0


def test_simulate_never_splits_a_group_and_waits_for_a_whole_pool() -> None:
    # Two pools of 2 GPUs hold 2 x 2 GPUs only split: the group fits no pool.
    assert trace.simulate([TraceJob("g", 2, 5.0, pods=2)], {"x": [2], "y": [2]}) == float("inf")
    assert trace.lower_bound([TraceJob("g", 2, 5.0, pods=2)], {"x": [2], "y": [2]}) == float("inf")
    # A 2 x 4 group behind a 4-GPU pod waits for both nodes: it starts at 10, not half of it at 0.
    jobs = [TraceJob("a", 4, 10.0), TraceJob("g", 4, 5.0, pods=2)]
    assert trace.simulate(jobs, {"p": [4, 4]}) == 15.0
    # Single pods keep best fit: both 2-GPU pods share one 4-GPU node, the 4-GPU pod takes the other.
    packed = [TraceJob("a", 2, 10.0), TraceJob("b", 2, 10.0), TraceJob("c", 4, 10.0)]
    assert trace.simulate(packed, {"p": [4, 4]}) == 10.0


def test_lower_bound_counts_work_only_some_pools_can_hold() -> None:
    pools = {"a": [8], "b": [1, 1]}
    jobs = [TraceJob("x", 8, 10.0), TraceJob("y", 8, 10.0), TraceJob("s", 1, 10.0), TraceJob("t", 1, 10.0)]
    # All GPUs: 180 / 10 = 18 s; but the two 8-GPU pods only fit `a`: 160 / 8 = 20 s.
    assert trace.lower_bound(jobs, pools) == 20.0
    assert trace.lower_bound([TraceJob("z", 1, 30.0)], pools) == 30.0  # the longest Job


def test_references_of_the_default_trace() -> None:
    jobs = trace.make_trace(160, 8)
    ref = trace.references(jobs, default_topology())
    ideal = trace.trace_summary(jobs, 44)["ideal_makespan_s"]
    assert ideal <= ref["lower_bound_s"] <= ref["largest_first_makespan_s"] <= ref["fifo_makespan_s"]
    work = sum(j.gpu_seconds for j in jobs)
    assert ref["fifo_utilisation"] == round(work / (44 * ref["fifo_makespan_s"]), 3)
    assert ref["fifo_utilisation"] < 0.9 < ref["largest_first_utilisation"]


# ------------------------------------------------------------------------------------ observation


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> Iterator[Clock]:
    yield Clock()


def _pod(
    name: str,
    job: str,
    phase: str,
    node: str = "",
    status: dict[str, Any] | None = None,
    *,
    index: str | None = None,
    gang: bool = False,
    spec: dict[str, Any] | None = None,
) -> dict[str, Any]:
    labels = {"batch.kubernetes.io/job-name": job, **({"gpufed.io/gang": "abc"} if gang else {})}
    meta: dict[str, Any] = {"name": name, "labels": labels}
    if index is not None:
        meta["annotations"] = {"batch.kubernetes.io/job-completion-index": index}
    return {
        "metadata": meta,
        "spec": {**({"nodeName": node} if node else {}), **(spec or {})},
        "status": {"phase": phase, **(status or {})},
    }


def _run(obs: Observer, clock: Clock, name: str, job: str, index: str, vnode: str, provider: str, pnode: str) -> None:
    """A pod of `job` seen Running on `vnode`, its twin bound to `pnode` on `provider`."""
    obs.on_pod("ADDED", _pod(name, job, "Running", vnode, index=index, gang=True))
    obs.on_twin(provider)("ADDED", _pod(name, job, "Running", pnode))


def _done(obs: Observer, name: str, job: str, index: str, vnode: str) -> None:
    obs.on_pod("MODIFIED", _pod(name, job, "Succeeded", vnode, index=index, gang=True))


def _record(obs: Observer, jobs: list[TraceJob], elapsed: float = 30.0) -> ModeRecord:
    return obs.record(
        "live", jobs, 100.0, ideal_s=1.0, limit_s=63.0, elapsed_s=elapsed, ended="complete", submit_s=0.1,
        create_errors=[],
    )  # fmt: skip


def test_a_group_is_done_when_every_index_succeeded_and_is_whole_on_one_product(clock: Clock) -> None:
    jobs = [TraceJob("live-000", 4, 10.0, pods=2)]
    obs = Observer(jobs, trace.node_places(default_topology()), clock)
    clock.now = 101.0
    _run(obs, clock, "live-000-0-a", "live-000", "0", "vn-a", "gpu-a", "gpu-a-h100-0")
    clock.now = 102.0
    _run(obs, clock, "live-000-1-b", "live-000", "1", "vn-a", "gpu-a", "gpu-a-h100-1")
    clock.now = 111.0
    _done(obs, "live-000-0-a", "live-000", "0", "vn-a")
    assert not obs.done(jobs)
    clock.now = 112.0
    _done(obs, "live-000-1-b", "live-000", "1", "vn-a")
    assert obs.done(jobs)
    (res,) = _record(obs, jobs).jobs
    # Two provider nodes, one product: whole.
    assert res.places == (H100,) and res.nodes == ("vn-a",) and not res.split
    assert (res.started_s, res.all_running_s, res.finished_s) == (1.0, 2.0, 12.0)
    assert res.together is True
    assert res.gpu_seconds == 4 * 10 + 4 * 10


def test_a_group_on_two_products_of_one_provider_is_split(clock: Clock) -> None:
    """What static mode allows: one virtual node for gpu-b, its scheduler puts the pods on A100 and L4."""
    jobs = [TraceJob("static-000", 1, 5.0, pods=2)]
    obs = Observer(jobs, trace.node_places(default_topology()), clock)
    _run(obs, clock, "p0", "static-000", "0", "gpufed-b", "gpu-b", "gpu-b-a100-0")
    _run(obs, clock, "p1", "static-000", "1", "gpufed-b", "gpu-b", "gpu-b-l4-2")
    clock.now = 105.0
    _done(obs, "p0", "static-000", "0", "gpufed-b")
    _done(obs, "p1", "static-000", "1", "gpufed-b")
    rec = _record(obs, jobs)
    (res,) = rec.jobs
    assert res.split and res.places == (A100, L4) and res.nodes == ("gpufed-b",)
    s = record.summarise(rec)
    assert (s["groups"], s["groups_finished"], s["groups_split"], s["groups_split_nodes"]) == (1, 1, 1, 0)
    assert s["split_groups"] == [{"job": "static-000", "shape": "2x1", "places": [A100, L4]}]
    assert s["groups_by_place"] == {f"{A100} + {L4}": 1}


def test_a_half_placed_attempt_counts_as_split_even_when_the_retry_lands_whole(clock: Clock) -> None:
    jobs = [TraceJob("live-001", 2, 5.0, pods=2)]
    obs = Observer(jobs, trace.node_places(default_topology()), clock)
    _run(obs, clock, "a0", "live-001", "0", "vn-a", "gpu-a", "gpu-a-h100-0")
    _run(obs, clock, "a1", "live-001", "1", "vn-b", "gpu-b", "gpu-b-a100-0")
    clock.now = 102.0
    for name, index, node in (("a0", "0", "vn-a"), ("a1", "1", "vn-b")):
        obs.on_pod("MODIFIED", _pod(name, "live-001", "Failed", node, {"reason": "GangFailedBack"}, index=index))
    clock.now = 110.0
    _run(obs, clock, "b0", "live-001", "0", "vn-a", "gpu-a", "gpu-a-h100-0")
    _run(obs, clock, "b1", "live-001", "1", "vn-a", "gpu-a", "gpu-a-h100-0")
    clock.now = 115.0
    _done(obs, "b0", "live-001", "0", "vn-a")
    _done(obs, "b1", "live-001", "1", "vn-a")
    rec = _record(obs, jobs)
    (res,) = rec.jobs
    assert res.places == (H100,) and res.split
    assert rec.failed_pods == {"GangFailedBack": 2}
    # The same pods one after the other in two places (no overlap) would not be a split.
    seq = [TraceJob("live-002", 2, 5.0, pods=2)]
    obs2 = Observer(seq, trace.node_places(default_topology()), clock)
    clock.now = 200.0
    _run(obs2, clock, "c0", "live-002", "0", "vn-b", "gpu-b", "gpu-b-a100-0")
    clock.now = 201.0
    obs2.on_pod("MODIFIED", _pod("c0", "live-002", "Failed", "vn-b", {"reason": "GangFailedBack"}, index="0"))
    clock.now = 202.0
    _run(obs2, clock, "d0", "live-002", "0", "vn-a", "gpu-a", "gpu-a-h100-0")
    _run(obs2, clock, "d1", "live-002", "1", "vn-a", "gpu-a", "gpu-a-h100-1")
    rec2 = obs2.record("live", seq, 199.0, ideal_s=1, limit_s=9, elapsed_s=9, ended="x", submit_s=0, create_errors=[])
    assert not rec2.jobs[0].split


def test_a_pod_whose_twin_was_not_seen_neither_splits_nor_places_its_group(clock: Clock) -> None:
    jobs = [TraceJob("live-003", 1, 5.0, pods=2)]
    obs = Observer(jobs, trace.node_places(default_topology()), clock)
    _run(obs, clock, "p0", "live-003", "0", "vn-l4", "gpu-b", "gpu-b-l4-0")
    obs.on_pod("ADDED", _pod("p1", "live-003", "Running", "vn-l4", index="1"))
    clock.now = 106.0
    _done(obs, "p0", "live-003", "0", "vn-l4")
    obs.on_pod("MODIFIED", _pod("p1", "live-003", "Succeeded", "vn-l4", index="1"))
    rec = _record(obs, jobs)
    assert rec.jobs[0].places == (L4,) and not rec.jobs[0].split
    assert rec.pods_unplaced == 1 and rec.pods_gated == 1


def test_a_group_whose_last_pod_started_after_the_first_finished_never_ran_together(clock: Clock) -> None:
    jobs = [TraceJob("static-004", 1, 5.0, pods=2)]
    obs = Observer(jobs, trace.node_places(default_topology()), clock)
    _run(obs, clock, "p0", "static-004", "0", "vn", "gpu-b", "gpu-b-a100-0")
    clock.now = 105.0
    _done(obs, "p0", "static-004", "0", "vn")
    clock.now = 120.0
    _run(obs, clock, "p1", "static-004", "1", "vn", "gpu-b", "gpu-b-l4-1")
    clock.now = 125.0
    _done(obs, "p1", "static-004", "1", "vn")
    rec = _record(obs, jobs)
    (res,) = rec.jobs
    assert res.together is False
    # Never at once in two places, yet the pods that completed it ran on two products: split.
    assert res.split and res.places == (A100, L4)
    s = record.summarise(rec)
    assert s["groups_not_together"] == 1
    assert s["group_all_running_s"] == {"p50": 20.0, "p90": 20.0, "max": 20.0}
    assert s["group_start_skew_s"] == {"p50": 20.0, "p90": 20.0, "max": 20.0}


def test_unfinished_jobs_say_where_they_sat(clock: Clock) -> None:
    jobs = [
        TraceJob("kueue-000", 2, 5.0, pods=2),
        TraceJob("kueue-001", 8, 5.0),
        TraceJob("kueue-002", 1, 5.0, pods=3),
        TraceJob("kueue-003", 1, 5.0),
    ]
    obs = Observer(jobs, {}, clock)
    obs.on_job("ADDED", {"metadata": {"name": "kueue-000"}, "spec": {"suspend": True}})
    obs.on_job("ADDED", {"metadata": {"name": "kueue-001"}, "spec": {"suspend": False}})
    pinned = {"nodeSelector": {"kubernetes.io/hostname": "gpufed-b-a100"}}
    obs.on_pod("ADDED", _pod("k1", "kueue-001", "Pending", spec=pinned))
    gated = {"schedulingGates": [{"name": "gpufed.io/gang"}]}
    obs.on_pod("ADDED", _pod("k2", "kueue-002", "Pending", index="0", gang=True, spec=gated))
    flavors = {"cpu": "gpufed-b-a100", "nvidia.com/gpu": "gpufed-b-a100"}
    wl = {
        "metadata": {"name": "job-kueue-001-x", "ownerReferences": [{"kind": "Job", "name": "kueue-001"}]},
        "status": {"admission": {"podSetAssignments": [{"flavors": flavors}]}},
    }
    obs.on_workload("ADDED", wl)
    obs.on_job("MODIFIED", {"metadata": {"name": "kueue-003"}, "status": {"conditions": [
        {"type": "Failed", "status": "True"}]}})  # fmt: skip
    rec = _record(obs, jobs)
    by = {j.name: j for j in rec.jobs}
    assert by["kueue-000"].state == "not-admitted"
    assert by["kueue-001"].state == "unscheduled" and by["kueue-001"].pinned == "gpufed-b-a100"
    assert by["kueue-001"].flavor == "gpufed-b-a100"
    assert by["kueue-002"].state == "gated"
    assert by["kueue-003"].failed
    s = record.summarise(rec)
    assert s["unfinished_by_state"] == {"gated": 1, "not-admitted": 1, "unscheduled": 1}
    assert s["admitted_by_flavor"] == {"gpufed-b-a100": 1}
    assert {"job": "kueue-001", "shape": "1x8", "state": "unscheduled", "pinned": "gpufed-b-a100",
            "flavor": "gpufed-b-a100"} in s["unfinished_jobs"]  # fmt: skip
    assert s["unfinished_by_gpus"] == {"1": 2, "2": 1, "8": 1}
    assert not s["complete"] and s["makespan_s"] is None


def test_observer_records_remote_waits_and_failures(clock: Clock) -> None:
    jobs = [TraceJob("live-000", 2, 5.0), TraceJob("live-001", 8, 5.0)]
    obs = Observer(jobs, {}, clock)
    obs.on_pod("ADDED", _pod("other-000-q", "other-000", "Running", "n"))  # not ours
    obs.on_pod("ADDED", _pod("live-001-b", "live-001", "Pending", "vn-b"))
    unsched = {"conditions": [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}]}
    on_b = obs.on_twin("gpu-b")
    on_b("ADDED", _pod("live-001-b", "live-001", "Pending", status=unsched))
    clock.now = 130.0
    obs.on_pod("MODIFIED", _pod("live-001-b", "live-001", "Failed", "vn-b", {"reason": "GPUUnplaceable"}))
    on_b("DELETED", _pod("live-001-b", "live-001", "Pending", status=unsched))
    assert obs.running() == 0 and not obs.done(jobs)
    rec = _record(obs, jobs, elapsed=60.0)
    assert [(w.provider, w.pod, w.gpus, w.wait_s, w.resolved) for w in rec.remote_waits] == [
        ("gpu-b", "live-001-b", 8, 30.0, False)
    ]
    assert rec.failed_pods == {"GPUUnplaceable": 1} and rec.total_gpus == 44
    by = {j.name: j for j in rec.jobs}
    assert by["live-000"].state == "no-pod" and by["live-001"].state == "no-pod" and by["live-001"].pods == 1


def _node(name: str, gpus: int, total: int) -> dict[str, Any]:
    figures = f'{{"total": {total}, "node": "{name}"}}'
    return {
        "metadata": {"name": name, "annotations": {"gpufed.io/gpu-pool": figures}},
        "status": {"allocatable": {"nvidia.com/gpu": str(gpus)}},
    }


def test_observer_notes_virtual_nodes_advertising_more_than_their_pool() -> None:
    jobs = [TraceJob("live-000", 1, 5.0)]
    obs = Observer(jobs)
    for gpus in (4, 4, 8, 9, 9, 3):
        obs.on_node("MODIFIED", _node("pool-a100", gpus, 8))
    obs.on_node("MODIFIED", {"metadata": {"name": "static"}, "status": {"allocatable": {"nvidia.com/gpu": "12"}}})
    rec = obs.record(
        "live", jobs, 0.0, ideal_s=1.0, limit_s=63.0, elapsed_s=9.0, ended="stalled", submit_s=0.1, create_errors=[]
    )
    assert rec.nodes["pool-a100"] == {"updates": 4, "max_allocatable": 9, "total": 8, "above_total": 1}
    assert rec.nodes["static"]["total"] is None and rec.nodes["static"]["above_total"] == 0
    assert record.summarise(rec)["allocatable_above_total"] == 1


# ------------------------------------------------------------------------------------ figures and verdicts


def _mode(jobs: list[JobResult], mode: str = "live", **kw: Any) -> ModeRecord:
    args: dict[str, Any] = {"total_gpus": 4, "ideal_s": 10.0, "limit_s": 90.0, "elapsed_s": 16.5, "ended": "complete"}
    args.update(kw)
    return ModeRecord(mode, args.pop("total_gpus"), args.pop("ideal_s"), args.pop("limit_s"), jobs, **args)


def test_summary_arithmetic_of_a_complete_run() -> None:
    jobs = [
        JobResult("live-000", 2, 10.0, started_s=1.0, finished_s=11.0, node="n1", places=("p1",), gpu_seconds=20.0),
        JobResult(
            "live-001", 1, 5.0, size=2, started_s=11.0, all_running_s=12.0, finished_s=16.0, node="n2",
            places=("p2",), nodes=("n2",), together=True, gpu_seconds=9.0,
        ),
    ]  # fmt: skip
    s = record.summarise(_mode(jobs, failed_pods={"GPUUnplaceable": 1}))
    assert s["complete"] and s["ended"] == "complete"
    assert s["makespan_s"] == 16.0
    assert s["gpu_seconds_run"] == 29.0
    assert s["utilisation"] == round(29 / (4 * 16), 3) == s["utilisation_over_ideal"]
    assert s["makespan_over_ideal"] == 1.6
    assert (s["jobs_finished"], s["jobs_failed"], s["jobs_unfinished"]) == (2, 0, 0)
    assert (s["groups"], s["groups_finished"], s["groups_split"], s["groups_not_together"]) == (1, 1, 0, 0)
    assert s["group_all_running_s"] == {"p50": 12.0, "p90": 12.0, "max": 12.0}
    assert s["pods_failed_back"] == 1 and s["failed_pods_by_reason"] == {"GPUUnplaceable": 1}
    assert s["stuck_remote"] == 0 and s["max_remote_wait_s"] == 0.0
    assert s["queue_wait_s"] == {"p50": 1.0, "p90": 11.0, "max": 11.0}
    assert s["by_node"] == {"n1": {"jobs": 1, "gpu_seconds": 20.0}, "n2": {"jobs": 1, "gpu_seconds": 9.0}}
    assert s["by_place"] == {"p1": {"jobs": 1, "gpu_seconds": 20.0}, "p2": {"jobs": 1, "gpu_seconds": 9.0}}


def test_summary_of_an_unfinished_run_counts_the_pods_that_succeeded() -> None:
    jobs = [
        JobResult("static-000", 1, 10.0, started_s=0.5, finished_s=10.5, node="a", gpu_seconds=10.0),
        JobResult("static-001", 8, 10.0, state="remote-pending"),
        JobResult("static-002", 4, 10.0, size=2, state="running", gpu_seconds=40.0),  # one of two pods done
        JobResult("static-003", 2, 10.0, failed=True),
    ]
    waits = [
        RemoteWait("gpu-b", "static-001-x", 8, 80.0, resolved=False),
        RemoteWait("gpu-a", "static-004-z", 4, 3.0, resolved=True),
    ]
    s = record.summarise(_mode(jobs, elapsed_s=80.0, ended="stalled", remote_waits=waits))
    assert not s["complete"]
    assert s["makespan_s"] is None and s["makespan_over_ideal"] is None
    assert s["span_s"] == 10.5  # utilisation to the last completion
    assert s["utilisation"] == round(50 / (4 * 10.5), 3)
    assert (s["jobs_finished"], s["jobs_failed"], s["jobs_unfinished"]) == (1, 1, 2)
    assert (s["groups"], s["groups_finished"]) == (1, 0)
    assert s["unfinished_by_state"] == {"remote-pending": 1, "running": 1}
    assert s["unfinished_by_gpus"] == {"2": 1, "4": 1, "8": 1}
    assert s["stuck_remote"] == 2 and s["stuck_remote_unresolved"] == 1
    assert s["max_remote_wait_s"] == 80.0


def test_verdicts() -> None:
    good = {"complete": True, "utilisation_over_ideal": 0.93, "stuck_remote": 0, "ended": "complete",
            "groups": 10, "groups_finished": 10, "groups_split": 0}  # fmt: skip
    v = record.verdicts(good, good)
    assert v["utilisation"]["met"] and v["stuck"]["met"] and v["split_groups"]["met"] and v["kueue_split_groups"]["met"]
    v = record.verdicts({**good, "utilisation_over_ideal": 0.85, "stuck_remote": 2, "groups_split": 1})
    assert not v["utilisation"]["met"] and not v["stuck"]["met"] and v["stuck"]["value"] == 2
    assert not v["split_groups"]["met"] and v["split_groups"]["value"] == 1
    # No kueue run: no verdict either way.
    assert v["kueue_split_groups"]["met"] is None
    # An unfinished live run cannot meet the utilisation target, whatever its partial figure; its finished
    # groups are still judged.
    v = record.verdicts({**good, "complete": False, "ended": "time limit", "groups_finished": 4})
    assert not v["utilisation"]["met"] and v["utilisation"]["value"] is None
    assert "time limit" in v["utilisation"]["note"]
    assert v["split_groups"]["met"] and v["split_groups"]["note"] == "4 of 10 groups finished"
    # No group finished: nothing shows the groups land whole.
    assert not record.verdicts({**good, "groups_finished": 0})["split_groups"]["met"]
    v = record.verdicts({"mode": "live", "error": "no nodes"})
    assert not v["utilisation"]["met"] and not v["stuck"]["met"] and not v["split_groups"]["met"]
    assert not record.verdicts(None)["stuck"]["met"]


# ------------------------------------------------------------------------------------ report and command line


def test_command_line_knows_the_part_and_its_options() -> None:
    assert "gpu-pool" in PARTS
    assert _parts("gpu-pool") == ("gpu-pool",)
    assert _durations("4,16") == (4.0, 16.0)
    assert _modes("static") == ("static",)
    assert _modes("live,kueue,static") == gpupool.MODES
    assert _share("0.3") == 0.3
    for bad in ("16,4", "0,3", "x"):
        with pytest.raises(argparse.ArgumentTypeError):
            _durations(bad)
    with pytest.raises(argparse.ArgumentTypeError):
        _modes("elastic")
    with pytest.raises(argparse.ArgumentTypeError):
        _share("1.5")


def _result() -> dict[str, Any]:
    group = JobResult(
        "live-001", 4, 10.0, size=2, started_s=1.0, all_running_s=1.5, finished_s=11.5, node="gpufed-aaaa1111",
        nodes=("gpufed-aaaa1111",), places=(H100,), together=True, gpu_seconds=80.0,
    )  # fmt: skip
    live = record.summarise(
        _mode([JobResult("live-000", 2, 10.0, started_s=1.0, finished_s=11.0, node="gpufed-aaaa1111"), group])
    )
    live.update(virtual_nodes={"gpufed-aaaa1111": {"gpus": 8, "ready": True}}, mode_switch_s=3.0, cleanup_s=4.0)
    live["logs"] = [
        {"log": "virtual-kubelet-aaaa1111.log", "lines": 10, "levels": {"info": 8, "warning": 2}, "top": []}
    ]
    split = JobResult(
        "kueue-001", 1, 10.0, size=2, started_s=1.0, all_running_s=1.0, finished_s=11.0, node="x", nodes=("x",),
        places=(A100, L4), split=True, together=True, flavor="gpufed-bbbb2222",
    )  # fmt: skip
    stuck = JobResult("kueue-002", 8, 10.0, state="unscheduled", pinned="gpufed-b-a100", flavor="gpufed-b-a100")
    kueue = record.summarise(_mode([split, stuck], "kueue", ended="stalled", elapsed_s=200.0))
    kueue["kueue"] = {"gpu_quota_held": {"gpufed-aaaa1111": 32, "gpufed-b-a100": 8}}
    static = record.summarise(
        _mode(
            [JobResult("static-000", 8, 10.0, state="remote-pending")],
            "static",
            ended="stalled",
            elapsed_s=70.0,
            remote_waits=[RemoteWait("gpu-b", "static-000-x", 8, 70.0, resolved=False)],
        )
    )
    return {
        "part": "gpu-pool",
        "machine": {"date": "2025-01-01 00:00 UTC", "cores": 16, "cpu": "cpu"},
        "environment": {
            "consumer": "consumer (c)",
            "providers": {"gpu-a": "gpu-a (a)"},
            "total_gpus": 44,
            "modes": ["live", "kueue", "static"],
        },
        "trace": {
            "jobs": 2,
            "pods": 3,
            "seed": 8,
            "single_pod_jobs": 1,
            "groups": 1,
            "group_share": 0.25,
            "max_group_gpus": 16,
            "by_gpus": {"2": 1},
            "groups_by_shape": {"2x4": 1},
            "gpu_seconds": 100.0,
            "ideal_makespan_s": 2.3,
            "reference": {
                "fifo_makespan_s": 10.0,
                "fifo_utilisation": 0.05,
                "largest_first_makespan_s": 10.0,
                "lower_bound_s": 10.0,
                "lower_bound_utilisation": 0.23,
            },
        },
        "targets": {"utilisation_ratio_min": 0.9, "stuck_max": 0, "split_max": 0},
        "modes": {"live": live, "kueue": kueue, "static": static},
        "verdicts": record.verdicts(live, kueue),
    }


def test_report_renders_a_column_per_mode_with_the_split_groups_and_their_verdicts() -> None:
    data = _result()
    doc = report.render({"gpu-pool": data})
    assert "## gpu-pool" in doc
    assert "| | live (gpufed) | kueue (live + Kueue) | static slices (baseline) | target | verdict |" in doc
    assert "| makespan | 11.5 s | > 200.0 s (1 Job never finished) | > 70.0 s (1 Job never finished) |" in doc
    split_row = next(line for line in doc.splitlines() if line.startswith("| groups split across"))
    assert "| 0 of 1 (1 finished) |" in split_row
    assert f"kueue-001 2x1: {A100} + {L4}" in split_row
    assert "live: **met**; kueue: **missed**" in split_row
    assert "kueue-002 1x8 unscheduled pinned to `gpufed-b-a100` (flavor `gpufed-b-a100`)" in doc
    assert "quotas held `gpufed-aaaa1111` 32, `gpufed-b-a100` 8" in doc
    assert "virtual-kubelet-aaaa1111.log" in doc and "remote-pending" in doc
    assert "no schedule at all can beat 10 s" in doc
    assert "Missed: kueue_split_groups (1; target = 0)." in doc
    # The missed split is listed and explained with the group and where its pods ran.
    assert "| gpu-pool.kueue_split_groups | gpu-pool | 1 (target = 0) |" in doc
    assert f"kueue-001 (2x1): {A100} + {L4}" in doc
    table = report.TABLES["gpu-pool"](data)
    assert "kueue" in table and "static" in table and "stalled" in table
    assert "kueue_split_groups: 1 (= 0) MISSED" in table


def test_report_shows_a_mode_that_could_not_run() -> None:
    data = _result()
    data["modes"]["kueue"] = {"mode": "kueue", "error": "gpufed's ResourceFlavors did not all appear"}
    data["verdicts"] = record.verdicts(data["modes"]["live"], data["modes"]["kueue"])
    doc = report.render({"gpu-pool": data})
    assert "kueue: could not run" in doc
    assert "error" in report.TABLES["gpu-pool"](data)
    assert "The kueue run did not run to a figure" in doc


def test_report_of_an_older_result_without_kueue() -> None:
    data = _result()
    del data["modes"]["kueue"]
    lines = gpupool_report.section(data)
    assert "| | live (gpufed) | static slices (baseline) | target | verdict |" in lines


def test_report_says_which_kueue_jobs_went_to_a_flavor_too_small_for_their_pods() -> None:
    r = {
        "virtual_nodes": {"gpufed-b-l4": {"gpus": 1, "ready": True}, "gpufed-a": {"gpus": 8, "ready": True}},
        "unfinished_jobs": [
            {"job": "kueue-045", "shape": "1x2", "state": "unscheduled", "pinned": "l4", "flavor": "gpufed-b-l4"},
            {"job": "kueue-050", "shape": "2x4", "state": "unscheduled", "pinned": "gpufed-a", "flavor": "gpufed-a"},
            {"job": "kueue-051", "shape": "1x4", "state": "not-admitted", "pinned": "", "flavor": ""},
        ],
        "jobs_unfinished": 3,
        "not_together_groups": [
            {"job": "kueue-009", "shape": "2x4", "places": [H100], "first_running_s": 1.0, "all_running_s": 20.0,
             "skew_s": 19.0, "duration_s": 5.0},
        ],
        "groups_not_together": 1,
    }  # fmt: skip
    notes = gpupool_report.observations({"kueue": r})
    (misfit,) = [n for n in notes if "admitted to a flavor" in n]
    assert misfit.startswith("kueue: 1 Job admitted")
    assert "kueue-045 (1 × 2 GPU) to `gpufed-b-l4` (largest node 1 GPU)" in misfit
    assert "kueue-050" not in misfit and "kueue-051" not in misfit
    (apart,) = [n for n in notes if "never had all its pods Running" in n]
    assert apart.startswith("kueue: 1 group never")
    assert "kueue-009 (2x4, 5 s each" in apart and "the last 20.0 s after submit" in apart


def test_plot_of_the_modes(tmp_path: Any) -> None:
    from bench import plots

    assert plots.gpupool_modes(_result(), tmp_path) == "img/bench-gpupool.png"
    assert (tmp_path / "bench-gpupool.png").stat().st_size > 1000
    assert plots.gpupool_modes({"modes": {"live": {"error": "x"}}}, tmp_path) is None
