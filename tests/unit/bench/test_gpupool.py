"""The gpu-pool benchmark's pure helpers: the seeded trace, the Jobs it submits, the virtual nodes a
capacity mode implies, makespan/utilisation/ideal arithmetic, what the watches record, the verdicts
and its section of docs/benchmarks.md. Plain data only: no clusters."""

from __future__ import annotations

import argparse
from collections import Counter
from typing import Any

import pytest

from bench import gpupool, report
from bench.__main__ import PARTS, _durations, _modes, _parts
from bench.gpupool import JobResult, ModeRecord, RemoteWait, TraceJob
from gpufed.localenv.topology import default_topology

IDS = {"consumer": "c0nsumer", "gpu-a": "aaaa1111", "gpu-b": "bbbb2222"}


def test_trace_is_deterministic_per_seed_and_has_the_asked_size() -> None:
    a = gpupool.make_trace(200, 8)
    assert a == gpupool.make_trace(200, 8)
    assert a != gpupool.make_trace(200, 9)
    assert len(a) == 200
    assert len({j.name for j in a}) == 200
    assert a[0].name == "job-000" and a[-1].name == "job-199"


def test_trace_mix_and_durations() -> None:
    trace = gpupool.make_trace(200, 8)
    counts = Counter(j.gpus for j in trace)
    assert set(counts) == {1, 2, 4, 8}
    # Weights 0.40/0.25/0.20/0.15: each size within a generous band around its expectation.
    for gpus, weight in gpupool.GPU_WEIGHTS:
        assert abs(counts[gpus] - 200 * weight) < 25, counts
    assert counts[1] > counts[8]
    assert all(4.0 <= j.duration_s <= 16.0 for j in trace)
    assert all(round(j.duration_s, 1) == j.duration_s for j in trace)
    assert max(j.duration_s for j in trace) - min(j.duration_s for j in trace) > 8  # spread, not constant


def test_trace_refuses_nonsense() -> None:
    with pytest.raises(ValueError, match="n >= 1"):
        gpupool.make_trace(0, 8)
    with pytest.raises(ValueError):
        gpupool.make_trace(10, 8, (5.0, 4.0))


def test_trace_per_mode_keeps_the_jobs_and_renames_them() -> None:
    base = gpupool.make_trace(5, 8)
    live = gpupool.for_mode(base, "live")
    assert [j.name for j in live] == [f"live-{i:03d}" for i in range(5)]
    assert [(j.gpus, j.duration_s) for j in live] == [(j.gpus, j.duration_s) for j in base]


def test_trace_summary_and_ideal() -> None:
    trace = [TraceJob("job-000", 8, 10.0), TraceJob("job-001", 1, 4.0), TraceJob("job-002", 2, 6.0)]
    s = gpupool.trace_summary(trace, 44)
    assert s["gpu_seconds"] == 80 + 4 + 12
    assert s["ideal_makespan_s"] == round(96 / 44, 1)
    assert s["by_gpus"] == {"1": 1, "2": 1, "8": 1}
    assert s["duration_s"] == {"min": 4.0, "mean": 6.67, "max": 10.0}
    assert gpupool.ideal_makespan(440, 44) == 10
    assert gpupool.time_limit(100) == 3 * 100 + 60
    assert gpupool.time_limit(100, 2) == 260


def test_default_trace_fits_the_time_budget() -> None:
    s = gpupool.trace_summary(gpupool.make_trace(200, 8), 44)
    # About 2 minutes of ideal makespan: two modes stay within the ~10 minutes `make bench` allows the part.
    assert 90 < s["ideal_makespan_s"] < 180


def test_job_body_is_a_plain_gpu_job() -> None:
    body = gpupool.job_body(TraceJob("live-007", 4, 7.5), "bench-gpu", "live")
    assert (body["apiVersion"], body["kind"]) == ("batch/v1", "Job")
    assert body["metadata"] == {"name": "live-007", "namespace": "bench-gpu", "labels": {gpupool.MODE_LABEL: "live"}}
    spec = body["spec"]
    assert spec["backoffLimit"] == 6
    tmpl = spec["template"]
    assert tmpl["metadata"]["annotations"] == {"local.gpufed.io/run-duration": "7.5s"}
    pod = tmpl["spec"]
    assert pod["restartPolicy"] == "Never"
    assert "nodeName" not in pod and "tolerations" not in pod and "nodeSelector" not in pod
    assert pod["containers"][0]["resources"]["limits"] == {"nvidia.com/gpu": "4"}
    assert gpupool.run_duration(12.0) == "12s"


def test_expected_nodes_per_mode() -> None:
    topo = default_topology()
    assert gpupool.expected_nodes("static", IDS, topo) == {"gpufed-aaaa1111": 32, "gpufed-bbbb2222": 12}
    assert gpupool.expected_nodes("live", IDS, topo) == {
        "gpufed-aaaa1111": 8,
        "gpufed-bbbb2222-nvidia-a100-sxm4-40gb": 4,
        "gpufed-bbbb2222-nvidia-l4": 1,
    }


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


def test_node_shapes_of_the_default_topology() -> None:
    assert sorted(gpupool.node_shapes(default_topology())) == [1, 1, 1, 1, 4, 4, 8, 8, 8, 8]


def test_simulated_references() -> None:
    one = [TraceJob("a", 8, 10.0), TraceJob("b", 8, 5.0)]
    assert gpupool.simulate(one, [8]) == 15.0
    # Best fit: both 2-GPU jobs share one 4-GPU node, the 4-GPU job takes the other.
    packed = [TraceJob("a", 2, 10.0), TraceJob("b", 2, 10.0), TraceJob("c", 4, 10.0)]
    assert gpupool.simulate(packed, [4, 4]) == 10.0
    assert gpupool.simulate([TraceJob("a", 8, 1.0)], [4, 4]) == float("inf")
    trace = gpupool.make_trace(200, 8)
    topo = default_topology()
    ref = gpupool.references(trace, topo)
    ideal = gpupool.trace_summary(trace, 44)["ideal_makespan_s"]
    assert ideal <= ref["largest_first_makespan_s"] <= ref["fifo_makespan_s"]
    assert ref["fifo_utilisation"] == round(sum(j.gpu_seconds for j in trace) / (44 * ref["fifo_makespan_s"]), 3)


def _record(jobs: list[JobResult], **kw: Any) -> ModeRecord:
    args: dict[str, Any] = {"total_gpus": 4, "ideal_s": 10.0, "limit_s": 90.0, "elapsed_s": 16.5, "ended": "complete"}
    args.update(kw)
    return ModeRecord("live", args.pop("total_gpus"), args.pop("ideal_s"), args.pop("limit_s"), jobs, **args)


def test_summary_arithmetic_of_a_complete_run() -> None:
    jobs = [
        JobResult("live-000", 2, 10.0, started_s=1.0, finished_s=11.0, node="n1", pods=1),
        JobResult("live-001", 4, 5.0, started_s=11.0, finished_s=16.0, node="n2", pods=2),
    ]
    s = gpupool.summarise(_record(jobs, failed_pods={"GPUUnplaceable": 1}))
    assert s["complete"] and s["ended"] == "complete"
    assert s["makespan_s"] == 16.0
    assert s["gpu_seconds_run"] == 2 * 10 + 4 * 5
    assert s["utilisation"] == round(40 / (4 * 16), 3)
    assert s["utilisation_over_ideal"] == s["utilisation"]
    assert s["makespan_over_ideal"] == 1.6
    assert (s["jobs_finished"], s["jobs_failed"], s["jobs_unfinished"]) == (2, 0, 0)
    assert s["pods_failed_back"] == 1 and s["failed_pods_by_reason"] == {"GPUUnplaceable": 1}
    assert s["stuck_remote"] == 0 and s["max_remote_wait_s"] == 0.0
    assert s["queue_wait_s"] == {"p50": 1.0, "p90": 11.0, "max": 11.0}
    assert s["by_node"] == {"n1": {"jobs": 1, "gpu_seconds": 20.0}, "n2": {"jobs": 1, "gpu_seconds": 20.0}}


def test_summary_of_an_unfinished_run() -> None:
    jobs = [
        JobResult("static-000", 1, 10.0, started_s=0.5, finished_s=10.5, node="a"),
        JobResult("static-001", 8, 10.0, state="remote-pending"),
        JobResult("static-002", 8, 10.0, state="remote-pending"),
        JobResult("static-003", 2, 10.0, failed=True),
    ]
    waits = [
        RemoteWait("gpu-b", "static-001-x", 8, 80.0, resolved=False),
        RemoteWait("gpu-b", "static-002-y", 8, 79.0, resolved=False),
        RemoteWait("gpu-a", "static-004-z", 4, 3.0, resolved=True),
    ]
    s = gpupool.summarise(_record(jobs, elapsed_s=80.0, ended="stalled", remote_waits=waits))
    assert not s["complete"]
    assert s["makespan_s"] is None and s["makespan_over_ideal"] is None
    assert s["span_s"] == 10.5  # utilisation to the last completion
    assert s["utilisation"] == round(10 / (4 * 10.5), 3)
    assert (s["jobs_finished"], s["jobs_failed"], s["jobs_unfinished"]) == (1, 1, 2)
    assert s["unfinished_by_state"] == {"remote-pending": 2}
    assert s["unfinished_by_gpus"] == {"2": 1, "8": 2}
    assert s["stuck_remote"] == 3 and s["stuck_remote_unresolved"] == 2
    assert s["stuck_remote_by_provider"] == {"gpu-a": 1, "gpu-b": 2}
    assert s["max_remote_wait_s"] == 80.0


def test_summary_counts_planned_time_when_running_was_not_seen() -> None:
    jobs = [JobResult("live-000", 2, 6.0, finished_s=8.0)]
    s = gpupool.summarise(_record(jobs))
    assert s["gpu_seconds_run"] == 12.0


def test_verdicts() -> None:
    good = {"complete": True, "utilisation_over_ideal": 0.93, "stuck_remote": 0, "ended": "complete"}
    v = gpupool.verdicts(good)
    assert v["utilisation"]["met"] and v["stuck"]["met"]
    v = gpupool.verdicts({**good, "utilisation_over_ideal": 0.85, "stuck_remote": 2})
    assert not v["utilisation"]["met"] and not v["stuck"]["met"] and v["stuck"]["value"] == 2
    # An unfinished live run cannot meet the utilisation target, whatever its partial figure.
    v = gpupool.verdicts({**good, "complete": False, "ended": "time limit"})
    assert not v["utilisation"]["met"] and v["utilisation"]["value"] is None
    assert "time limit" in v["utilisation"]["note"]
    v = gpupool.verdicts({"mode": "live", "error": "no nodes"})
    assert not v["utilisation"]["met"] and not v["stuck"]["met"]
    assert not gpupool.verdicts(None)["stuck"]["met"]


def _pod(name: str, job: str, phase: str, node: str = "", status: dict[str, Any] | None = None) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "labels": {"batch.kubernetes.io/job-name": job}},
        "spec": {"nodeName": node} if node else {},
        "status": {"phase": phase, **(status or {})},
    }


def test_observer_records_jobs_failures_and_remote_waits() -> None:
    trace = [TraceJob("live-000", 2, 5.0), TraceJob("live-001", 8, 5.0), TraceJob("live-002", 1, 5.0)]
    obs = gpupool.Observer(trace)
    obs.on_pod("ADDED", _pod("other-000-q", "other-000", "Running", "n"))  # not ours
    obs.on_pod("ADDED", _pod("live-000-a", "live-000", "Pending"))
    obs.on_pod("MODIFIED", _pod("live-000-a", "live-000", "Running", "vn-a"))
    obs.on_pod("MODIFIED", _pod("live-000-a", "live-000", "Succeeded", "vn-a"))
    obs.on_pod("ADDED", _pod("live-001-b", "live-001", "Pending", "vn-b"))
    obs.on_pod("MODIFIED", _pod("live-001-b", "live-001", "Failed", "vn-b", {"reason": "GPUUnplaceable"}))
    obs.on_pod("ADDED", _pod("live-001-c", "live-001", "Pending", "vn-a"))
    obs.on_pod("ADDED", _pod("live-002-d", "live-002", "Pending"))
    unsched = {"conditions": [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}]}
    on_b = obs.on_twin("gpu-b")
    on_b("ADDED", _pod("live-001-b", "live-001", "Pending", status=unsched))
    on_b("DELETED", _pod("live-001-b", "live-001", "Pending", status=unsched))
    obs.on_twin("gpu-a")("ADDED", _pod("live-000-a", "live-000", "Running", "gpu-a-h100-0"))
    assert obs.running() == 0
    assert not obs.done(trace)
    obs.on_job("MODIFIED", {"metadata": {"name": "live-002"}, "status": {"conditions": [
        {"type": "Failed", "status": "True"}]}})  # fmt: skip

    t0 = min(p.running_at or 1e18 for p in obs.pods.values()) - 1.0
    rec = obs.record(
        "live", trace, t0, ideal_s=1.0, limit_s=63.0, elapsed_s=9.0, ended="stalled", submit_s=0.1, create_errors=[]
    )
    by = {j.name: j for j in rec.jobs}
    assert by["live-000"].finished_s is not None and by["live-000"].node == "vn-a" and by["live-000"].pods == 1
    assert by["live-001"].finished_s is None and by["live-001"].state == "remote-pending" and by["live-001"].pods == 2
    assert by["live-002"].failed and by["live-002"].state == "unscheduled"
    assert rec.failed_pods == {"GPUUnplaceable": 1}
    assert [(w.provider, w.pod, w.gpus, w.resolved) for w in rec.remote_waits] == [("gpu-b", "live-001-b", 8, False)]
    assert rec.total_gpus == 44
    s = gpupool.summarise(rec)
    assert (s["jobs_finished"], s["jobs_failed"], s["jobs_unfinished"], s["stuck_remote"]) == (1, 1, 1, 1)


def _node(name: str, gpus: int, total: int) -> dict[str, Any]:
    figures = f'{{"total": {total}, "node": "{name}"}}'
    return {
        "metadata": {"name": name, "annotations": {"gpufed.io/gpu-pool": figures}},
        "status": {"allocatable": {"nvidia.com/gpu": str(gpus)}},
    }


def test_observer_notes_virtual_nodes_advertising_more_than_their_pool() -> None:
    trace = [TraceJob("live-000", 1, 5.0)]
    obs = gpupool.Observer(trace)
    for gpus in (4, 4, 8, 9, 9, 3):
        obs.on_node("MODIFIED", _node("pool-a100", gpus, 8))
    obs.on_node("MODIFIED", {"metadata": {"name": "static"}, "status": {"allocatable": {"nvidia.com/gpu": "12"}}})
    rec = obs.record(
        "live", trace, 0.0, ideal_s=1.0, limit_s=63.0, elapsed_s=9.0, ended="stalled", submit_s=0.1, create_errors=[]
    )
    assert rec.nodes["pool-a100"] == {"updates": 4, "max_allocatable": 9, "total": 8, "above_total": 1}
    assert rec.nodes["static"]["total"] is None and rec.nodes["static"]["above_total"] == 0
    assert gpupool.summarise(rec)["allocatable_above_total"] == 1


def test_observer_done_when_every_job_succeeded_or_failed() -> None:
    trace = [TraceJob("live-000", 1, 5.0), TraceJob("live-001", 1, 5.0)]
    obs = gpupool.Observer(trace)
    obs.on_pod("ADDED", _pod("live-000-a", "live-000", "Succeeded", "n"))
    assert not obs.done(trace)
    obs.on_job("MODIFIED", {"metadata": {"name": "live-001"}, "status": {"conditions": [
        {"type": "Failed", "status": "True"}]}})  # fmt: skip
    assert obs.done(trace)


def test_command_line_knows_the_part_and_its_options() -> None:
    assert "gpu-pool" in PARTS
    assert _parts("gpu-pool") == ("gpu-pool",)
    assert _durations("4,16") == (4.0, 16.0)
    assert _modes("static") == ("static",)
    for bad in ("16,4", "0,3", "x"):
        with pytest.raises(argparse.ArgumentTypeError):
            _durations(bad)
    with pytest.raises(argparse.ArgumentTypeError):
        _modes("elastic")


def _result() -> dict[str, Any]:
    live = gpupool.summarise(
        _record([JobResult("live-000", 2, 10.0, started_s=1.0, finished_s=11.0, node="gpufed-aaaa1111")])
    )
    live.update(virtual_nodes={"gpufed-aaaa1111": {"gpus": 8, "ready": True}}, mode_switch_s=3.0, cleanup_s=4.0)
    live["logs"] = [
        {"log": "virtual-kubelet-aaaa1111.log", "lines": 10, "levels": {"info": 8, "warning": 2}, "top": []}
    ]
    static = gpupool.summarise(
        _record(
            [JobResult("static-000", 8, 10.0, state="remote-pending")],
            ended="stalled",
            elapsed_s=70.0,
            remote_waits=[RemoteWait("gpu-b", "static-000-x", 8, 70.0, resolved=False)],
        )
    )
    return {
        "part": "gpu-pool",
        "machine": {"date": "2025-01-01 00:00 UTC", "cores": 16, "cpu": "cpu"},
        "environment": {"consumer": "consumer (c)", "providers": {"gpu-a": "gpu-a (a)"}, "total_gpus": 44},
        "trace": {
            "jobs": 1,
            "seed": 8,
            "by_gpus": {"2": 1},
            "gpu_seconds": 20.0,
            "ideal_makespan_s": 0.5,
            "reference": {"fifo_makespan_s": 10.0, "fifo_utilisation": 0.05, "largest_first_makespan_s": 10.0},
        },
        "targets": {"utilisation_ratio_min": 0.9, "stuck_max": 0},
        "modes": {"live": live, "static": static},
        "verdicts": gpupool.verdicts(live),
    }


def test_report_renders_a_gpu_pool_section_and_a_table() -> None:
    data = _result()
    doc = report.render({"gpu-pool": data})
    assert "## gpu-pool" in doc
    assert "| makespan | 11.0 s | > 70.0 s (1 Job never finished) |" in doc
    assert "virtual-kubelet-aaaa1111.log" in doc
    assert "stalled" in doc and "remote-pending" in doc
    assert "Verdict (live run)" in doc
    assert "in submission order" in doc
    assert "most GPUs each virtual node advertised" in doc
    table = report.TABLES["gpu-pool"](data)
    assert "live" in table and "static" in table and "stalled" in table


def test_report_shows_a_mode_that_could_not_run() -> None:
    data = _result()
    data["modes"]["static"] = {"mode": "static", "error": "the consumer's virtual nodes did not become static"}
    doc = report.render({"gpu-pool": data})
    assert "static: could not run" in doc
    assert "error" in report.TABLES["gpu-pool"](data)
