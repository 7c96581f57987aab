"""Medians over the repeats of an offload row: of one figure, of nested request counts, of a whole
arm (a burst's summary), and the offloaded-over-local ratio every verdict uses.

Owns: how a repeat that never had all its pods Running counts (worse than any), how request counts a
repeat lacks count (0), and which figures of an arm are medians. Does not: run bursts or judge
targets (bench.offload).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any


def median(values: Iterable[float | None], *, missing: str = "high") -> float | None:
    """Median of one figure over repeats, rounded to 3 places. A repeat without the figure (None: its
    pods never all ran) counts as worse than any: above every value with `missing` "high" (a time),
    below with "low" (a rate); None when the median falls on such a repeat or nothing was measured.
    An int where every value and the median are."""
    worst = math.inf if missing == "high" else -math.inf
    vs = list(values)
    xs = sorted(worst if v is None else float(v) for v in vs)
    if not xs:
        return None
    mid = xs[(len(xs) - 1) // 2 : len(xs) // 2 + 1]
    if any(math.isinf(x) for x in mid):
        return None
    m = round(sum(mid) / len(mid), 3)
    # Counts stay integers where the median is one.
    return int(m) if m.is_integer() and all(isinstance(v, int) for v in vs) else m


def median_tree(trees: list[Any]) -> Any:
    """Leaf-wise median of nested dicts of numbers, such as the requests per pod of each repeat: a key
    a repeat lacks counts as 0 (counts below 0.01 per pod are left out), a repeat without the whole
    tree (None) as worse than any (see `median`)."""
    if any(isinstance(t, dict) for t in trees):
        keys = dict.fromkeys(k for t in trees if isinstance(t, dict) for k in t)
        return {k: median_tree([t.get(k, 0) if isinstance(t, dict) else None for t in trees]) for k in keys}
    if all(t is None or isinstance(t, int | float) for t in trees):
        return median(trees)
    return trees[0]


#: An arm's figures that a row reports as the median over its repeats.
MEDIAN_FIGURES = ("created", "running", "failed", "create_errors", "create_s", "all_running_s", "twins",
                  "twins_running", "on_virtual_node")  # fmt: skip
#: Per process, the figures of the burst's /proc samples taken as medians.
PROCESS_FIGURES = ("rss_start_mb", "rss_peak_mb", "rss_end_mb", "cpu_s", "cpu_cores", "wall_s")


def median_arm(arms: list[dict[str, Any]]) -> dict[str, Any]:
    """One arm of a row from its repeats (in the order they ran): the median of every figure, the
    latency quantiles and the requests per pod taken point by point; a timeout, a process gone or
    a create error if any repeat had one; the log findings of every repeat, each with its number."""
    out = dict(arms[0])
    for key in MEDIAN_FIGURES:
        if key in out:
            out[key] = median(a.get(key) for a in arms)
    out["pods_per_s"] = median((a.get("pods_per_s") for a in arms), missing="low")
    out["timed_out"] = any(a.get("timed_out") for a in arms)
    out["first_create_errors"] = [e for a in arms for e in a.get("first_create_errors") or []][:3]
    out["latency_s"] = median_tree([a.get("latency_s") for a in arms])
    quantiles = [a["latency_quantiles_s"] for a in arms if a.get("latency_quantiles_s")]
    out["latency_quantiles_s"] = [median(q) for q in zip(*quantiles, strict=True)] if quantiles else None
    for key in ("requests_create", "requests_delete"):
        if key in out:
            out[key] = median_tree([a.get(key) for a in arms])
    if out.get("processes"):
        out["processes"] = {}
        for name, first in arms[0]["processes"].items():
            each = [(a.get("processes") or {}).get(name) or {} for a in arms]
            out["processes"][name] = {
                **first,
                **{k: median(p.get(k) for p in each) for k in PROCESS_FIGURES if k in first},
                "gone": any(p.get("gone") for p in each),
            }
    if "vk_pid_after" in out:
        out["vk_pid_after"] = arms[-1].get("vk_pid_after")
    if any("logs" in a for a in arms):
        out["logs"] = [{**log, "repeat": i} for i, a in enumerate(arms, 1) for log in a.get("logs") or []]
    return out


def ratio(baseline: float | None, virtual: float | None) -> float | None:
    """The offloaded figure over the local one, 2 places; None unless both were measured."""
    return round(virtual / baseline, 2) if baseline and virtual else None
