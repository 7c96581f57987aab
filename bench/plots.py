"""PNG plots of benchmark results for docs/benchmarks.md (matplotlib, Agg backend, no display).

Owns: one function per figure, each taking a part's results dict and writing one PNG under
docs/img/ (or a directory given), returning the path relative to docs/ for the page to link, or
None when the results hold nothing to plot. `plot_all` draws every figure the results allow.

Does not: measure, or decide verdicts (bench.report does); it only draws what the JSON holds.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

DOCS = Path(__file__).resolve().parents[1] / "docs"
IMG_DIR = DOCS / "img"
QUANTILES = [q / 100 for q in range(0, 101, 5)]


def _save(fig: Any, out_dir: Path, name: str) -> str:
    out_dir.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(out_dir / name, dpi=90)
    plt.close(fig)
    return f"img/{name}"


def offload_latency(data: dict[str, Any], out_dir: Path = IMG_DIR) -> str | None:
    """Start-latency distributions (CDF from the stored quantiles), baseline vs virtual, per burst."""
    runs = [r for r in data.get("runs") or [] if (r.get("virtual") or {}).get("latency_quantiles_s")]
    if not runs:
        return None
    fig, ax = plt.subplots(figsize=(8, 4.5))
    for i, r in enumerate(runs):
        color = f"C{i}"
        label = f"N={r['pods']} {r.get('mode', 'pre-bound')}"
        for side, style in (("baseline", "--"), ("virtual", "-")):
            q = (r.get(side) or {}).get("latency_quantiles_s")
            if q:
                ax.plot(q, QUANTILES[: len(q)], style, color=color, label=f"{label}, {side}")
    ax.set_xlabel("pod start latency (s): create returned -> watch saw Running")
    ax.set_ylabel("fraction of pods")
    ax.set_title("offload: start latency, local kwok nodes (dashed) vs virtual node (solid)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    return _save(fig, out_dir, "bench-offload-latency.png")


def offload_scaling(data: dict[str, Any], out_dir: Path = IMG_DIR) -> str | None:
    """Time to all Running vs N (both paths), and steady RSS / CPU of the virtual kubelet vs N."""
    pre = sorted(
        (r for r in data.get("runs") or [] if r.get("mode", "pre-bound") == "pre-bound"), key=lambda r: r["pods"]
    )
    foot = sorted(data.get("footprint") or [], key=lambda f: f["pods"])
    if len(pre) < 2 and len(foot) < 2:
        return None
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    for side, marker in (("baseline", "s"), ("virtual", "o")):
        pts = [(r["pods"], r[side]["all_running_s"]) for r in pre if r[side].get("all_running_s")]
        if pts:
            left.plot(*zip(*pts, strict=True), marker=marker, label=side)
    left.set_xlabel("pods in the burst (pre-bound)")
    left.set_ylabel("time to all Running (s)")
    left.set_title("burst time vs N")
    left.grid(alpha=0.3)
    left.legend()
    target = (data.get("targets") or {}).get("vk_rss_mb_max")
    for name, marker in (("virtual-kubelet", "o"), ("controller", "s")):
        pts = [(f["pods"], f[name]["rss_mb"]) for f in foot if name in f]
        if pts:
            right.plot(*zip(*pts, strict=True), marker=marker, label=f"{name} RSS")
    if target:
        right.axhline(target, color="red", linestyle=":", label=f"target {target:g} MB")
    right.set_xlabel("offloaded pods Running (steady state)")
    right.set_ylabel("RSS (MB)")
    right.set_title("footprint vs N")
    right.grid(alpha=0.3)
    right.legend(fontsize=8)
    return _save(fig, out_dir, "bench-offload-scaling.png")


def reflection_latency(data: dict[str, Any], out_dir: Path = IMG_DIR) -> str | None:
    """p50/p90/p99/max of the provider copy per kind, against the p99 target."""
    kinds = sorted((data.get("kinds") or {}).items())
    if not kinds:
        return None
    fig, ax = plt.subplots(figsize=(7, 4))
    stats = ("p50_ms", "p90_ms", "p99_ms", "max_ms")
    width = 0.8 / len(stats)
    for j, stat in enumerate(stats):
        values = [(r.get("remote") or {}).get(stat) or 0 for _, r in kinds]
        ax.bar([i + j * width for i in range(len(kinds))], values, width, label=stat.removesuffix("_ms"))
    target = next(((r.get("verdict") or {}).get("target_p99_ms") for _, r in kinds), None)
    if target:
        ax.axhline(target, color="red", linestyle=":", label=f"p99 target {target:g} ms")
    ax.set_xticks([i + 0.3 for i in range(len(kinds))], [k for k, _ in kinds])
    ax.set_ylabel("ms, local write -> provider watch")
    ax.set_yscale("log")
    ax.set_title("reflection latency per kind")
    ax.legend(fontsize=8)
    return _save(fig, out_dir, "bench-reflection-latency.png")


def gpupool_modes(data: dict[str, Any], out_dir: Path = IMG_DIR) -> str | None:
    """Per mode (live, kueue, static): GPU utilisation (hatched: over the span to the last completion of
    a run that did not finish), makespan / ideal, and groups split across providers or products."""
    order = {m: i for i, m in enumerate(("live", "kueue", "static"))}
    ran = [(m, r) for m, r in (data.get("modes") or {}).items() if isinstance(r, dict) and "error" not in r]
    modes = sorted(ran, key=lambda x: order.get(x[0], len(order)))
    if not modes:
        return None
    fig, (left, middle, right) = plt.subplots(1, 3, figsize=(12, 3.6))
    names = [m for m, _ in modes]
    colors = [f"C{i}" for i in range(len(modes))]
    bars = left.bar(names, [r.get("utilisation") or 0 for _, r in modes], color=colors)
    for bar, (_, r) in zip(bars, modes, strict=True):
        if not r.get("complete"):
            bar.set_hatch("//")
    left.axhline(0.9, color="red", linestyle=":", label="target 0.9")
    left.set_ylim(0, 1)
    left.set_title("GPU utilisation (hatched: run unfinished)", fontsize=9)
    left.legend(fontsize=8)
    middle.bar(names, [r.get("makespan_over_ideal") or 0 for _, r in modes], color=colors)
    middle.axhline(1.0, color="grey", linestyle=":", label="ideal")
    middle.set_title("makespan / ideal (0: never finished)", fontsize=9)
    middle.legend(fontsize=8)
    right.bar(names, [r.get("groups_split") or 0 for _, r in modes], color=colors)
    right.set_title("groups split across providers or products (target 0)", fontsize=9)
    right.yaxis.get_major_locator().set_params(integer=True)
    return _save(fig, out_dir, "bench-gpupool.png")


def plot_all(results: dict[str, dict[str, Any]], out_dir: Path = IMG_DIR) -> dict[str, list[str]]:
    """Every figure the results allow: part -> page-relative PNG paths."""
    figures: dict[str, list[str]] = {}
    makers = {
        "offload": (offload_latency, offload_scaling),
        "reflection": (reflection_latency,),
        "gpu-pool": (gpupool_modes,),
    }
    for part, fns in makers.items():
        if part in results:
            paths = [p for p in (fn(results[part], out_dir) for fn in fns) if p]
            if paths:
                figures[part] = paths
    return figures
