"""The offload part's section of docs/benchmarks.md and its terminal summary.

Owns: how an offload results file is read (`rows`: every row as `bench.offload.aggregate` writes it,
a row of a file written before rows had repeats read as one repeat), the method paragraph the page
opens the offload part with (`METHOD`), the section itself (`section`: medians per row, the spread
over the repeats, the deletes per grace, requests per pod, footprint, growth, profile, each row's
notes and the verdicts), the names of its verdicts (`OFFLOAD_VERDICTS`), `text_table` (the summary
printed after a run) and the small formatters bench.report shares (`fmt`, `mode_of`).

Does not: measure, compute medians or verdicts (bench.offload does), or explain missed targets
(bench.report's EXPLANATIONS).
"""

from __future__ import annotations

from typing import Any

from bench.offload import TARGET_DELETE_RATIO_MAX, aggregate, describe_findings

METHOD = (
    "How the offload part measures: N pods, each requesting 10m CPU / 16Mi, created concurrently with "
    "kubernetes-asyncio, either pre-bound with `spec.nodeName` (so the scheduler is not part of either path) or "
    "left to the consumer's kube-scheduler. The baseline puts them on the consumer's kwok nodes (kwok marks them "
    "Running); the virtual path puts them on the virtual node, where they also pass gpufed's offloading webhook "
    "and the virtual kubelet creates a twin on the provider, whose kwok marks it Running, and copies the status "
    "back. Time to all Running is from the first create to the last pod our watch saw Running; start latency "
    "per pod is from its create returning to the watch seeing it Running; pods/s = N / time to all Running. RSS "
    "is VmRSS sampled every 0.2 s; CPU is utime+stime over a window divided by its wall time. Client, API "
    "servers, etcd, kwok and gpufed all share the machine's cores. Each row (mode, N, rate) runs its baseline "
    "and its virtual burst alternately, baseline first, several times (`--repeats`; by default 3 for bursts of "
    "up to 2000 pods, once for larger bursts and for paced runs), deleting each arm's pods before the next "
    "burst. A row shows the median of every figure over its repeats (a repeat whose pods never all ran counts "
    "as slower than any); its ratios and verdicts compare the median baseline with the median virtual arm, and "
    "the spread table lists each repeat's times and ratio beside the median of those ratios. Deletes: scheduled "
    "and paced rows delete with grace 0; pre-bound rows with each pod's own grace period (30 s, *default*) on "
    "the 1st, 3rd, … repeat and with grace 0 on the 2nd, 4th, …, and each grace's delete times are medians "
    "over its own repeats only (the deletes table gives how many). The footprint at steady state and the "
    "py-spy profile come from a row's first repeat."
)

#: The offload part's verdicts per row, and how the report names them.
OFFLOAD_VERDICTS = {
    "ratio": "time ratio",
    "p50_ratio": "p50 start latency ratio",
    "delete_ratio": "delete time ratio",
    "delete_ratio_grace_0": "delete time ratio with grace 0",
    "vk_pods_per_s": "pods/s per virtual kubelet",
    "vk_rss_mb": "virtual kubelet RSS",
    "gpufed_requests_create": "gpufed's requests per pod per side on create",
    "gpufed_requests_delete": "gpufed's requests per pod per side on delete",
    "gpufed_requests_delete_grace_0": "gpufed's requests per pod per side on delete with grace 0",
}


def fmt(v: float | None, unit: str = " s") -> str:
    return "—" if v is None else f"{v:g}{unit}"


def mode_of(r: dict[str, Any]) -> str:
    return str(r.get("mode", "pre-bound"))


def proc(run: dict[str, Any], name: str) -> dict[str, Any]:
    procs: dict[str, Any] = run["virtual"].get("processes") or {}
    p: dict[str, Any] = procs.get(name) or {}
    return p


def as_repeated(row: dict[str, Any]) -> dict[str, Any]:
    """A row as `bench.offload.aggregate` writes it: a row of a results file written before rows had
    repeats is read as one repeat (its figures are their own medians) and keeps the verdicts it was given."""
    if "per_repeat" in row:
        return row
    grace = row["baseline"].get("delete_grace", 0)
    one = [{"repeat": 1, "grace": grace, "baseline": row["baseline"], "virtual": row["virtual"]}]
    return {**aggregate(row["pods"], mode_of(row), row.get("rate"), one), "verdicts": row["verdicts"]}


def rows(data: dict[str, Any]) -> list[dict[str, Any]]:
    """The rows of an offload results file, each with its repeats (see `as_repeated`)."""
    return [as_repeated(r) for r in data.get("runs") or []]


def _verdict(v: dict[str, Any]) -> str:
    met = v.get("met")
    text = "n/a" if met is None else ("**met**" if met else "**missed**")
    return f"{text} ({v['note']})" if v.get("note") else text


def _values(xs: list[float | None], unit: str = "") -> str:
    return ", ".join(fmt(x, unit) for x in xs) or "—"


def _times(n: int) -> str:
    return "once" if n == 1 else f"{n} times"


def _repeats(n: int) -> str:
    return "1 repeat" if n == 1 else f"median of {n} repeats"


def _footprint_rows(data: dict[str, Any]) -> list[str]:
    t = data["targets"]
    at, rss_max = t["vk_rss_at_pods"], t["vk_rss_mb_max"]
    cpu_max = t.get("vk_cpu_cores_max", 0.25)
    lines = [
        "### Footprint at steady state",
        "",
        f"After the first repeat's virtual burst of each pre-bound row, with all N pods Running and nothing "
        f"changing, both processes are sampled for {data['environment'].get('steady_s', '?')} s (RSS at the end, "
        "CPU over the window); 0 pods is before the first burst. Target: virtual kubelet ≤ "
        f"{rss_max:g} MB and ≤ {cpu_max:g} core at {at} pods.",
        "",
        "| offloaded pods | virtual kubelet RSS | virtual kubelet CPU | controller RSS | controller CPU | target | "
        "verdict |",
        "|---:|---:|---:|---:|---:|---|---|",
    ]
    for f in data.get("footprint") or []:
        vk, ctl = f.get("virtual-kubelet") or {}, f.get("controller") or {}
        target, verdict = "", ""
        if f["pods"] == at:
            target = f"≤ {rss_max:g} MB, ≤ {cpu_max:g} core"
            ok = (vk.get("rss_mb") or 1e9) <= rss_max and (vk.get("cpu_cores") or 0) <= cpu_max
            verdict = "**met**" if ok else "**missed**"
        lines.append(
            f"| {f['pods']} | {fmt(vk.get('rss_mb'), ' MB')} | {fmt(vk.get('cpu_cores'), ' cores')} | "
            f"{fmt(ctl.get('rss_mb'), ' MB')} | {fmt(ctl.get('cpu_cores'), ' cores')} | {target} | {verdict} |"
        )
    return [*lines, ""]


def _growth_rows(data: dict[str, Any]) -> list[str]:
    g = data.get("growth") or {}
    labels = {
        "baseline_all_running_s": "baseline: time to all Running",
        "virtual_all_running_s": "virtual node: time to all Running",
        "vk_cpu_s_per_burst": "virtual kubelet CPU seconds per burst",
        "virtual-kubelet_rss_growth_mb": "virtual kubelet RSS above 0 pods (steady)",
        "controller_rss_growth_mb": "controller RSS above 0 pods (steady)",
    }
    found = [(labels[k], v) for k, v in g.items() if k in labels and isinstance(v, dict) and v.get("k") is not None]
    if not found:
        return []
    lines = [
        "### How the figures grow with N",
        "",
        "A least-squares fit of y = a·N^k on log-log axes over the pre-bound sizes of this run (their medians; "
        "k ≈ 1: linear; k ≈ 0: flat). With three or four sizes this states the order, not a precise law.",
        "",
        "| figure | fitted k | order | sizes |",
        "|---|---:|---|---:|",
        *[f"| {label} | {v['k']:g} | {v.get('order', '')} | {v['points']} |" for label, v in found],
    ]
    for name in ("virtual-kubelet", "controller"):
        per = g.get(f"{name}_rss_kb_per_pod")
        if per is not None:
            lines.append("")
            lines.append(f"{name}: {per:g} KB of steady RSS per offloaded pod at the largest size.")
    return [*lines, ""]


def _profile_rows(data: dict[str, Any]) -> list[str]:
    prof = data.get("profile")
    if not prof:
        return []
    if prof.get("error"):
        return ["### Profile", "", f"py-spy could not profile the virtual kubelet: {prof['error']}", ""]
    lines = [
        "### Where the virtual kubelet spends its CPU",
        "",
        f"py-spy sampled the virtual kubelet at 100 Hz during the first repeat of the {prof['pods']}-pod "
        f"{prof['mode']} burst ({prof['samples']} samples, idle threads excluded). Own time is the frame on top of "
        "the stack; gpufed inclusive counts every sample a gpufed function is on the stack.",
        "",
        "| own time: function | share | | gpufed inclusive: function | share |",
        "|---|---:|---|---|---:|",
    ]
    own, inc = prof.get("self") or [], prof.get("inclusive_gpufed") or []

    def cell(row: dict[str, Any] | None) -> str:
        return f"`{row['function']}` | {row['share']:.0%}" if row else " | "

    for i in range(max(len(own), len(inc))):
        lines.append(f"| {cell(own[i] if i < len(own) else None)} | | {cell(inc[i] if i < len(inc) else None)} |")
    return [*lines, ""]


def _request_rows(runs: list[dict[str, Any]]) -> list[str]:
    """Requests per pod per side, actor and verb, for both arms of every row that counted them: on
    create, and on delete once per grace the row deleted with."""
    runs = [r for r in runs if (r["virtual"].get("requests_create") or {})]
    if not runs:
        return []
    lines = [
        "### Requests per pod",
        "",
        "Counted from both API servers' audit logs over each burst (create: from the first create until all "
        "pods are Running; delete: the collection delete until every pod and twin is gone, with the grace "
        "period in the phase column), divided by the pods; medians over the repeats (a delete's over the "
        "repeats with that grace). Writes are what etcd stores (a TokenRequest or a review is not). *client* "
        "is the bench's own creates and deletes, the same in both arms. *gpufed pod / background*: gpufed's "
        "requests on a pod or what belongs to it (its status, token, token Secret, references, Events) per pod, "
        "which the per-pod target judges, and its other requests (node status, leases, health probes, quota "
        "and slice status), which follow time rather than pods, per second of the window.",
        "",
        "| mode | N | arm | phase | side | gpufed writes / reads | gpufed pod / background | kwok writes | "
        "control plane writes | client writes | gpufed's requests by verb |",
        "|---|---:|---|---|---|---|---|---:|---:|---:|---|",
    ]
    for r in runs:
        for arm in ("baseline", "virtual"):
            phases = [("create", r[arm].get("requests_create"))]
            phases += [(f"delete (grace {d['grace']})", d.get(f"{arm}_requests_delete")) for d in r["deletes"]]
            for phase, counts in phases:
                for side, a in (counts or {}).items():
                    g = a.get("gpufed") or {}
                    verbs = ", ".join(f"{k} {v:g}" for k, v in (g.get("by_verb") or {}).items()) or "—"
                    lines.append(
                        f"| {mode_of(r)} | {r['pods']} | {arm} | {phase} | {side} | {g.get('writes', 0):g} / "
                        f"{g.get('reads', 0):g} | {_pod_and_background(g)} | "
                        f"{(a.get('kwok') or {}).get('writes', 0):g} | "
                        f"{(a.get('control-plane') or {}).get('writes', 0):g} | "
                        f"{(a.get('client') or {}).get('writes', 0):g} | {verbs} |"
                    )
    lines.append("")
    return lines


def _pod_and_background(gpufed: dict[str, Any]) -> str:
    """ "2 / 1.5/s": pod requests per pod and background requests per second ("—" before the split)."""
    if "pod" not in gpufed:
        return "—"
    return f"{gpufed['pod']:g} / {gpufed.get('background_per_s', 0):g}/s"


def _spread_rows(runs: list[dict[str, Any]]) -> list[str]:
    """Each repeat's time to all Running and ratio, beside the median of those ratios."""
    if all(r["repeats"] == 1 for r in runs):
        return []
    lines = [
        "### Spread over the repeats",
        "",
        "Each repeat of a row in the order it ran. *ratio of the medians* is the row's ratio above (the one "
        "judged); *median of the ratios* pairs each baseline with the virtual burst that followed it.",
        "",
        "| mode | N | baseline: all Running per repeat | virtual: all Running per repeat | ratio per repeat | "
        "median of the ratios | ratio of the medians |",
        "|---|---:|---|---|---|---:|---:|",
    ]
    for r in runs:
        sp = r["spread"]
        lines.append(
            f"| {mode_of(r)} | {r['pods']} | {_values(sp['baseline_all_running_s'], ' s')} | "
            f"{_values(sp['virtual_all_running_s'], ' s')} | {_values(sp['ratio'])} | "
            f"{fmt(sp['ratio_median'], '')} | {fmt(r['verdicts']['ratio']['value'], '')} |"
        )
    return [*lines, ""]


def _delete_rows(runs: list[dict[str, Any]], target: float) -> list[str]:
    """Deleting each row's pods, per grace period: medians over that grace's repeats, the ratio and its verdict."""
    lines = [
        "### Deletes",
        "",
        "One collection delete of the row's pods, timed until every pod (and, offloaded, every twin) is gone. "
        "*default* is each pod's own grace period (30 s: the pods set none); *0* deletes them with grace period 0. "
        "The medians of a grace come from its repeats only.",
        "",
        "| mode | N | grace | repeats (count) | baseline: delete | virtual: delete | "
        f"per repeat baseline / virtual | ratio | target ≤ {target:g} |",
        "|---|---:|---|---|---:|---:|---|---:|---|",
    ]
    for r in runs:
        for i, d in enumerate(r["deletes"]):
            v = r["verdicts"].get("delete_ratio" if i == 0 else f"delete_ratio_grace_{d['grace']}") or {}
            pairs = ", ".join(
                f"{fmt(b)} / {fmt(x)}"
                for b, x in zip(d["baseline_cleanup_values"], d["virtual_cleanup_values"], strict=True)
            )
            lines.append(
                f"| {mode_of(r)} | {r['pods']} | {d['grace']} | {', '.join(map(str, d['repeats']))} "
                f"({len(d['repeats'])}) | {fmt(d['baseline_cleanup_s'])} | {fmt(d['virtual_cleanup_s'])} | {pairs} | "
                f"{fmt(v.get('value', d['ratio']), '')} | {_verdict(v) if v else ''} |"
            )
    return [*lines, ""]


def section(data: dict[str, Any]) -> list[str]:
    """The offload part's section of docs/benchmarks.md."""
    env, t, m = data["environment"], data["targets"], data["machine"]
    runs = rows(data)
    counts = sorted({r["repeats"] for r in runs})
    lines = [
        "## offload: pods on a virtual node vs. pods on local nodes",
        "",
        f"Run {m['date']}: {m['cores']} cores ({m['cpu']}), {m['memory_gib']} GiB memory, Python {m['python']}, "
        f"{m['kernel']}, {m['kubernetes']}. Load average at start {m['loadavg_at_start']}; "
        f"{m['other_kube_apiservers_at_start']} kube-apiservers of other local environments were running on the "
        "same machine (they compete for the same cores).",
        "",
        f"- consumer {env['consumer']}; provider {env['provider']}; virtual node `{env['virtual_node']}`",
        f"- `bench-vk` offloaded with {env['offloaded_with']}; twins in `{env['twin_namespace']}`",
        f"- pods created with {env['concurrency']} concurrent requests (admin identity), observed with one watch; "
        "*pre-bound*: spec.nodeName set by the client; *scheduled*: the consumer's kube-scheduler binds them",
        f"- each row ran its baseline and virtual bursts {' or '.join(_times(n) for n in counts)} (the repeats "
        "column), alternately, baseline first; the figures are medians over a row's repeats, the ratios compare them",
        "",
        "| mode | N | repeats | baseline: all Running | virtual: all Running | ratio | "
        f"target ≤ {t['ratio_max']:g} | virtual pods/s | target ≥ {t['vk_pods_per_s_min']:g} | "
        "p50 baseline / virtual | p99 baseline / virtual | creates returned baseline / virtual |",
        "|---|---:|---:|---:|---:|---:|---|---:|---|---|---|---|",
    ]
    for r in runs:
        b, v, vd = r["baseline"], r["virtual"], r["verdicts"]
        bl, vl = b.get("latency_s") or {}, v.get("latency_s") or {}
        lines.append(
            f"| {mode_of(r)} | {r['pods']} | {r['repeats']} | {fmt(b['all_running_s'])} | {fmt(v['all_running_s'])} | "
            f"{fmt(vd['ratio']['value'], '')} | {_verdict(vd['ratio'])} | {fmt(v['pods_per_s'], '')} | "
            f"{_verdict(vd['vk_pods_per_s'])} | {fmt(bl.get('p50'))} / {fmt(vl.get('p50'))} | "
            f"{fmt(bl.get('p99'))} / {fmt(vl.get('p99'))} | {fmt(b['create_s'])} / {fmt(v['create_s'])} |"
        )
    lines.append("")
    lines += _spread_rows(runs)
    lines += _delete_rows(runs, float(t.get("delete_ratio_max", TARGET_DELETE_RATIO_MAX)))
    lines += _request_rows(runs)
    lines += _footprint_rows(data)
    lines += _growth_rows(data)
    lines += _profile_rows(data)
    lines += ["### Each row", ""]
    for r in runs:
        vk, ctl, b, v = proc(r, "virtual-kubelet"), proc(r, "controller"), r["baseline"], r["virtual"]
        deletes = "; ".join(
            f"{fmt(d['baseline_cleanup_s'])} locally and {fmt(d['virtual_cleanup_s'])} offloaded with grace "
            f"{d['grace']} ({_repeats(len(d['repeats']))})"
            for d in r["deletes"]
        )
        lines += [
            f"**N = {r['pods']}, {mode_of(r)}** ({_repeats(r['repeats'])}). Pods Running / failed / create "
            f"errors: baseline {b['running']} / {b['failed']} / {b['create_errors']}, virtual "
            f"{v['running']} / {v['failed']} / {v['create_errors']}; twins Running on the provider "
            f"{v.get('twins_running')} of {v.get('twins')}. During the burst the virtual kubelet peaked at "
            f"{fmt(vk.get('rss_peak_mb'), ' MB')} RSS and used {fmt(vk.get('cpu_cores'), ' cores')}; the consumer "
            f"controller {fmt(ctl.get('rss_peak_mb'), ' MB')} / {fmt(ctl.get('cpu_cores'), ' cores')}. Deleting "
            f"them all took {deletes}.",
            "",
            *[f"- {n}" for n in _analysis(r)],
            *[f"- {n}" for n in _observations(r)],
            "",
        ]
    lines += _summary(runs)
    return lines


def _analysis(r: dict[str, Any]) -> list[str]:
    """Sentences derived from one row's medians (no judgement beyond arithmetic)."""
    b, v, n = r["baseline"], r["virtual"], r["pods"]
    out = [
        f"creating the {n} pods took {v['create_s']:g} s in the offloaded namespace vs {b['create_s']:g} s locally "
        "(creates there also pass gpufed's offloading webhook, served by the consumer's controller)",
    ]
    if b["all_running_s"] is not None and v["all_running_s"] is not None:
        out.append(
            f"after the last create returned, all pods were Running {v['all_running_s'] - v['create_s']:.2f} s later "
            f"on the virtual node vs {b['all_running_s'] - b['create_s']:.2f} s on local nodes"
        )
    vk = proc(r, "virtual-kubelet")
    if vk.get("cpu_s") is not None:
        out.append(
            f"the virtual kubelet used {vk['cpu_s']:g} s CPU for {n} pods ({vk['cpu_s'] / n * 1000:.1f} ms per pod, "
            f"{vk['cpu_cores']:g} cores on average over the burst), and its RSS grew by "
            f"{vk['rss_peak_mb'] - vk['rss_start_mb']:.1f} MB"
        )
    return out


def _observations(r: dict[str, Any]) -> list[str]:
    """What went wrong in any repeat of a row: timeouts, create errors, a restarted virtual kubelet,
    warnings and errors in gpufed's logs."""
    out = []
    several = r["repeats"] > 1
    for rep in r["per_repeat"]:
        where = f", repeat {rep.get('repeat', '?')}" if several else ""
        for side in ("baseline", "virtual"):
            s = rep[side]
            if s["timed_out"]:
                out.append(f"{side}{where}: timed out with {s['running']} of {s['pods']} pods Running")
            for e in s.get("first_create_errors") or []:
                out.append(f"{side}{where}: create error: `{e}`")
        v = rep["virtual"]
        vk = (v.get("processes") or {}).get("virtual-kubelet") or {}
        if vk.get("gone") or (v.get("vk_pid_after") not in (None, vk.get("pid"))):
            out.append(
                f"the virtual kubelet process changed during the burst{where} "
                f"(pid {vk.get('pid')} -> {v.get('vk_pid_after')})"
            )
        out += [line for log in v.get("logs") or [] if (line := describe_findings(log, where)) is not None]
    return out


def _summary(runs: list[dict[str, Any]]) -> list[str]:
    met: list[str] = []
    missed: list[str] = []
    for r in runs:
        for key, label in OFFLOAD_VERDICTS.items():
            v = r["verdicts"].get(key)
            if v is None or v["met"] is None:
                continue
            (met if v["met"] else missed).append(f"{label} at N={r['pods']} ({v['value']}; target {v['target']})")
    return [
        "### Verdict",
        "",
        "Met: " + ("; ".join(met) if met else "none") + ".",
        "",
        "Missed: " + ("; ".join(missed) if missed else "none") + ".",
        "",
    ]


def text_table(data: dict[str, Any]) -> str:
    """A plain summary of one offload run for the terminal: medians per row, then its spread and verdicts."""
    head = f"{'N':>6} {'path':<9} {'all Running':>12} {'p50':>8} {'p99':>8} {'pods/s':>8} {'RSS MB':>8} {'CPU':>6}"
    lines = [head, "-" * len(head)]
    for r in rows(data):
        for side in ("baseline", "virtual"):
            s = r[side]
            lat = s.get("latency_s") or {}
            vk = proc(r, "virtual-kubelet") if side == "virtual" else {}
            lines.append(
                f"{r['pods']:>6} {side:<9} {fmt(s['all_running_s']):>12} {fmt(lat.get('p50')):>8} "
                f"{fmt(lat.get('p99')):>8} {fmt(s['pods_per_s'], ''):>8} {fmt(vk.get('rss_peak_mb'), ''):>8} "
                f"{fmt(vk.get('cpu_cores'), ''):>6}"
            )
        sp = r["spread"]
        lines.append(
            f"       {mode_of(r)}, medians of {r['repeats']} repeat(s); ratio per repeat {_values(sp['ratio'])}, "
            f"median of the ratios {fmt(sp['ratio_median'], '')}"
        )
        lines.append(
            "       "
            + ", ".join(
                f"{k}: {v['value']} ({v['target']}) {'n/a' if v['met'] is None else 'met' if v['met'] else 'MISSED'}"
                for k, v in r["verdicts"].items()
            )
        )
    return "\n".join(lines)
