"""The offload part's pure pieces: growth fits, the py-spy summary, the footprint verdicts and the
missed-targets section of docs/benchmarks.md, and the plots drawn from a results file."""

from __future__ import annotations

import argparse
import copy
from pathlib import Path
from typing import Any

import pytest

from bench import offload, plots, report


def test_fit_order_recovers_the_exponent() -> None:
    linear = offload.fit_order([(100.0, 2.0), (1000.0, 20.0), (2000.0, 40.0)])
    assert linear is not None and linear["k"] == pytest.approx(1.0, abs=0.01)
    assert offload.order_name(linear["k"]) == "O(n)"
    square = offload.fit_order([(10.0, 100.0), (100.0, 10000.0)])
    assert square is not None and square["k"] == pytest.approx(2.0, abs=0.01)
    assert offload.order_name(square["k"]) == "O(n^2.0)"
    assert offload.order_name(0.05) == "O(1)"
    assert offload.fit_order([(100.0, 1.0)]) is None, "one point fits nothing"
    assert offload.fit_order([(100.0, 0.0), (200.0, -1.0)]) is None, "non-positive values are left out"


def test_profile_summary_counts_own_and_inclusive_time() -> None:
    repo = offload.REPO
    raw = "\n".join(
        [
            "run (/usr/lib/python3.11/asyncio/base_events.py:1);handle (/x/site-packages/aiohttp/client.py:9) 30",
            f"run (/usr/lib/python3.11/asyncio/base_events.py:1);sync ({repo}/vkprovider/node/pods.py:5);"
            f"dumps ({repo}/gpufed/kube/rest.py:7) 50",
            f"run (/usr/lib/python3.11/asyncio/base_events.py:1);sync ({repo}/vkprovider/node/pods.py:5) 20",
            "garbage line",
        ]
    )
    s = offload.profile_summary(raw)
    assert s["samples"] == 100
    own = {r["function"]: r["samples"] for r in s["self"]}
    assert own == {"gpufed/kube/rest.py:dumps": 50, "aiohttp/client.py:handle": 30, "vkprovider/node/pods.py:sync": 20}
    inclusive = {r["function"]: r["share"] for r in s["inclusive_gpufed"]}
    assert inclusive == {"vkprovider/node/pods.py:sync": 0.7, "gpufed/kube/rest.py:dumps": 0.5}


def _burst(n: int, seconds: float, cpu_s: float = 1.0) -> dict[str, Any]:
    q = [round(seconds * i / 20, 3) for i in range(21)]
    return {
        "pods": n, "created": n, "running": n, "failed": 0, "create_errors": 0, "first_create_errors": [],
        "timed_out": False, "create_s": seconds / 2, "all_running_s": seconds, "pods_per_s": round(n / seconds, 1),
        "latency_s": {"p50": q[10], "p90": q[18], "p99": q[20], "max": q[20]}, "latency_quantiles_s": q,
        "processes": {
            "virtual-kubelet": {"pid": 1, "rss_start_mb": 80, "rss_peak_mb": 90, "rss_end_mb": 90, "cpu_s": cpu_s,
                                "cpu_cores": 0.1, "wall_s": seconds, "gone": False},
        },
        "twins": n, "twins_running": n, "cleanup_s": 1.0, "logs": [],
        "requests_create": {
            "consumer": {"gpufed": {"writes": 1.0, "reads": 0.5,
                                    "by_verb": {"patch pods/status": 1.0, "get pods": 0.5}}},
            "provider": {"gpufed": {"writes": 2.0, "reads": 1.0, "by_verb": {"create pods": 1.0, "create secrets": 1.0,
                                                                         "get secrets": 1.0}},
                         "kwok": {"writes": 1.0, "reads": 0.0, "by_verb": {"patch pods/status": 1.0}}},
        },
        "requests_delete": {"provider": {"gpufed": {"writes": 1.0, "reads": 0.0, "by_verb": {"delete pods": 1.0}}}},
    }  # fmt: skip


def results() -> dict[str, Any]:
    runs = []
    for n, mode in ((100, "pre-bound"), (1000, "pre-bound"), (1000, "scheduled")):
        base, virt = _burst(n, n / 50), _burst(n, n / 20, cpu_s=n / 200)
        runs.append(
            {"pods": n, "mode": mode, "baseline": base, "virtual": virt, "verdicts": offload._verdicts(n, base, virt)}
        )
    footprint = [
        {"pods": 0, "virtual-kubelet": {"rss_mb": 80.0, "cpu_cores": 0.0}, "controller": {"rss_mb": 70.0}},
        {"pods": 100, "virtual-kubelet": {"rss_mb": 85.0, "cpu_cores": 0.01}, "controller": {"rss_mb": 71.0}},
        {"pods": 1000, "virtual-kubelet": {"rss_mb": 160.0, "cpu_cores": 0.02}, "controller": {"rss_mb": 75.0}},
    ]
    machine = {
        "date": "2026-11-22 10:00 UTC", "cores": 2, "cpu": "cpu", "memory_gib": 23.5, "python": "3.11",
        "kernel": "Linux", "kubernetes": "v1.36.3", "loadavg_at_start": [1, 1, 1], "other_kube_apiservers_at_start": 0,
    }  # fmt: skip
    return {
        "offload": {
            "part": "offload",
            "machine": machine,
            "environment": {
                "consumer": "c",
                "provider": "p",
                "virtual_node": "gpufed-p",
                "offloaded_with": "cli",
                "twin_namespace": "t",
                "concurrency": 64,
                "steady_s": 10,
            },
            "targets": {
                "ratio_max": 1.2,
                "vk_pods_per_s_min": 200.0,
                "vk_rss_mb_max": 150.0,
                "vk_rss_at_pods": 1000,
                "vk_cpu_cores_max": 0.25,
            },
            "runs": runs,
            "footprint": footprint,
            "growth": offload.growth(runs, footprint),
            "profile": {"pods": 1000, "mode": "pre-bound", "samples": 10, "self": [], "inclusive_gpufed": []},
        }
    }


def test_growth_fits_the_pre_bound_sizes_only() -> None:
    g = results()["offload"]["growth"]
    assert g["virtual_all_running_s"]["k"] == pytest.approx(1.0, abs=0.01)
    assert g["virtual_all_running_s"]["points"] == 2, "the scheduled burst is not a size of the pre-bound series"
    assert g["virtual-kubelet_rss_growth_mb"]["points"] == 2
    assert g["virtual-kubelet_rss_kb_per_pod"] == pytest.approx(1024 * 80 / 1000, abs=0.1)


def test_the_page_shows_every_figure_against_its_target_and_lists_what_was_missed() -> None:
    page = report.render(results(), {"offload": ["img/bench-offload-latency.png"]})
    assert "| pre-bound | 1000 |" in page and "| scheduled | 1000 |" in page
    assert "![offload: bench-offload-latency](img/bench-offload-latency.png)" in page
    missed = {key for key, _, _ in report.missed_targets(results())}
    # 2.5x slower than baseline, 20 pods/s, and 160 MB steady at 1000 pods: all three missed.
    assert {"offload.ratio", "offload.vk_pods_per_s", "offload.footprint_rss"} <= missed
    assert "offload.footprint_cpu" not in missed, "0.02 cores is within 0.25"
    # gpufed's requests: 3 per pod on the provider when created (missed), 1 when deleted (met)
    assert "offload.gpufed_requests_create" in missed and "offload.gpufed_requests_delete" not in missed
    assert "| pre-bound | 1000 | virtual | create | provider | 2 / 1 | 1 |" in page
    assert "on the provider: create pods 1, create secrets 1, get secrets 1" in page
    assert "## Missed targets and why" in page
    for key in missed:
        assert f"**{key}.**" in page


def test_the_run_after_the_fixes_is_set_beside_the_profiled_run() -> None:
    rs = results()
    assert "No earlier profiled run is recorded" in report.render(rs, {})
    before = copy.deepcopy(rs["offload"])
    before["part"] = "offload-profiled"
    rs["offload"]["machine"]["loadavg_at_start"] = [0.5, 0.5, 0.5]
    for r in rs["offload"]["runs"]:
        r["virtual"]["all_running_s"] /= 2
        r["virtual"]["processes"]["virtual-kubelet"]["cpu_s"] /= 4
    page = report.render({**rs, "offload-profiled": before}, {})
    assert "load average at start [1, 1, 1]" in page and "load average at start [0.5, 0.5, 0.5]" in page
    assert "| 1000 pre-bound | 50 s → 25 s | " in page, "all Running before -> after at the size both measured"
    assert "| 1000 scheduled | 50 s → 25 s | " in page
    assert "| 5 s → 1.25 s |" in page, "the virtual kubelet's CPU seconds in the burst"


def test_plots_are_drawn_from_the_results(tmp_path: Path) -> None:
    figures = plots.plot_all(results(), tmp_path)
    assert figures["offload"] == ["img/bench-offload-latency.png", "img/bench-offload-scaling.png"]
    for name in ("bench-offload-latency.png", "bench-offload-scaling.png"):
        data = (tmp_path / name).read_bytes()
        assert data.startswith(b"\x89PNG") and len(data) > 5000


def test_paced_and_latency_and_delete_verdicts() -> None:
    from bench.__main__ import _rates

    assert _rates("50,100") == (50.0, 100.0) and _rates("none") == ()
    with pytest.raises(argparse.ArgumentTypeError):
        _rates("-5")
    assert offload.paced_pods(50, 30) == 1500
    opts = offload.OffloadOptions(sizes=(100,), scheduled_sizes=(), rates=(200.0,), paced_s=60)
    assert offload.largest_run(opts) == 12000, "the clusters are sized for the largest paced run"
    base, virt = _burst(1000, 10), _burst(1000, 30)
    base["cleanup_s"], virt["cleanup_s"], base["delete_grace"] = 31.0, 40.0, "default"
    v = offload._verdicts(1000, base, virt)
    assert v["p50_ratio"]["value"] == 3.0 and v["p50_ratio"]["met"] is False
    assert v["delete_ratio"]["value"] == 1.29 and v["delete_ratio"]["met"] is True
    assert "grace default" in v["delete_ratio"]["target"]
