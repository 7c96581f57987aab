"""The gpu-pool part's share of docs/benchmarks.md: its section, its terminal table and the words
for its missed targets.

Owns: `section` (the gpu-pool section: clusters, trace, modes, how it is measured, one table with a
column per mode run — live, kueue, static — the targets with their verdicts, what was seen),
`table` (the summary printed after a run) and `EXPLANATIONS` (why a gpu-pool target was missed,
written from the figures of the results). Every number comes from the result dict.

Does not: measure, decide verdicts (bench.gpupool_record) or write files (bench.report does).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from bench.offload import describe_findings

#: Column order of the modes (the order the part runs them).
MODE_ORDER = ("live", "kueue", "static")
HEADINGS = {"live": "live (gpufed)", "kueue": "kueue (live + Kueue)", "static": "static slices (baseline)"}


def _s(v: float | None, unit: str = " s") -> str:
    return "—" if v is None else f"{v:g}{unit}"


def _sec(v: float | None) -> str:
    return "—" if v is None else f"{v:.1f} s"


def _verdict(v: dict[str, Any]) -> str:
    met = v.get("met")
    text = "n/a" if met is None else ("**met**" if met else "**missed**")
    return f"{text} ({v['note']})" if v.get("note") else text


def _jobs(n: int) -> str:
    return f"{n} Job" if n == 1 else f"{n} Jobs"


def _counts(d: dict[str, Any] | None, unit: str = "") -> str:
    return ", ".join(f"{k}{unit}: {v}" for k, v in (d or {}).items()) or "none"


def _makespan(r: dict[str, Any]) -> str:
    if r.get("makespan_s") is not None:
        return _sec(r["makespan_s"])
    never = r.get("jobs_unfinished", 0) + r.get("jobs_failed", 0)
    return f"> {_sec(r.get('elapsed_s'))} ({_jobs(never)} never finished)"


def _ended(r: dict[str, Any]) -> str:
    return f"{r.get('ended', '?')} after {_sec(r.get('elapsed_s'))} (limit {_sec(r.get('limit_s'))})"


def _util(r: dict[str, Any]) -> str:
    u = r.get("utilisation")
    if u is None:
        return "—"
    return f"{u:g}" if r.get("complete") else f"{u:g} (over {_sec(r.get('span_s'))}, to its last completion)"


def _nodes(r: dict[str, Any]) -> str:
    nodes = r.get("virtual_nodes") or {}
    return ", ".join(f"`{n}` {v.get('gpus')}" for n, v in sorted(nodes.items())) or "—"


def _work(key: str) -> Callable[[dict[str, Any]], str]:
    def cell(r: dict[str, Any]) -> str:
        rows = r.get(key) or {}
        return ", ".join(f"`{n}` {v['jobs']:g} Jobs / {v['gpu_seconds']:g} GPU-s" for n, v in rows.items()) or "—"

    return cell


def _advertised(r: dict[str, Any]) -> str:
    parts = []
    for name, n in sorted((r.get("node_updates") or {}).items()):
        updates = f"{n.get('updates')} update{'' if n.get('updates') == 1 else 's'}"
        total = "" if n.get("total") is None else f"of {n['total']}; "
        above = f", **{n['above_total']} above the total**" if n.get("above_total") else ""
        parts.append(f"`{name}` {n.get('max_allocatable')} ({total}{updates}{above})")
    return ", ".join(parts) or "—"


def _stuck(r: dict[str, Any]) -> str:
    if not r.get("stuck_remote"):
        return str(r.get("stuck_remote"))
    return (
        f"{r['stuck_remote']} ({_counts(r.get('stuck_remote_by_provider'))}; by GPUs per pod "
        f"{_counts(r.get('stuck_remote_by_gpus'))}; {r.get('stuck_remote_unresolved', 0)} never placed)"
    )


def _split(r: dict[str, Any]) -> str:
    if r.get("groups") is None:
        return "—"
    head = f"{r.get('groups_split')} of {r.get('groups')} ({r.get('groups_finished')} finished)"
    shown = "; ".join(f"{g['job']} {g['shape']}: {' + '.join(g['places'])}" for g in r.get("split_groups") or [])
    return f"{head}: {shown}" if shown else head


def _q(key: str) -> Callable[[dict[str, Any]], str]:
    return lambda r: " / ".join(_sec((r.get(key) or {}).get(k)) for k in ("p50", "p90", "max"))


def _kueue(r: dict[str, Any]) -> str:
    k = r.get("kueue")
    if not k:
        return "—"
    held = ", ".join(f"`{f}` {n}" for f, n in (k.get("gpu_quota_held") or {}).items())
    admitted = _counts(r.get("admitted_by_flavor"))
    return f"quotas held {held}; Jobs admitted per flavor: {admitted}"


def _where(env: dict[str, Any]) -> str:
    if env.get("state_dir") and env.get("base_port"):
        return f", state in `{env['state_dir']}`, ports from {env['base_port']}"
    return ", its own state directory and ports"


def _reference(tr: dict[str, Any]) -> list[str]:
    ref = tr.get("reference")
    if not ref:
        return []
    bound = ""
    if ref.get("lower_bound_s") is not None:
        bound = (
            f"; no schedule at all can beat {_s(ref.get('lower_bound_s'))} (the longest Job, and the work only some "
            f"pools can hold over their GPUs), i.e. utilisation {ref.get('lower_bound_utilisation')}"
        )
    return [
        "- for reading the figures (computed, not measured): a greedy placer with no overhead at all on the "
        "providers' real node shapes, placing each group whole on one pool, finishes this trace in "
        f"{_s(ref.get('fifo_makespan_s'))} (utilisation {ref.get('fifo_utilisation')}) taking Jobs in submission "
        f"order — roughly the kube-scheduler's queue order — and in {_s(ref.get('largest_first_makespan_s'))} "
        f"({ref.get('largest_first_utilisation')}) taking them largest first{bound}"
    ]


def _trace_line(tr: dict[str, Any]) -> str:
    by_gpus = ", ".join(f"{n} × {g} GPU" for g, n in (tr.get("by_gpus") or {}).items())
    shapes = ", ".join(
        f"{n} × ({s.replace('x', ' pods × ')} GPU)" for s, n in (tr.get("groups_by_shape") or {}).items()
    )
    return (
        f"- trace: {tr.get('jobs', '?')} Jobs, {tr.get('pods', '?')} pods, seed {tr.get('seed', '?')}: "
        f"{tr.get('single_pod_jobs', '?')} single pods ({by_gpus}) and {tr.get('groups', '?')} groups "
        f"(share {tr.get('group_share', '?')}, Indexed Jobs with parallelism = completions = 2–4 pods: {shapes}; "
        f"a group asks at most {tr.get('max_group_gpus', '?')} GPUs, half of gpu-a — larger draws are drawn again, "
        "since such a group could only start on an emptied gpu-a; every group fits gpu-a, 2 × 4 or smaller also "
        f"gpu-b's A100s, k × 1 its L4s); run time uniform in {tr.get('durations_s', '?')} s per Job (mean "
        f"{(tr.get('duration_s') or {}).get('mean', '?')} s); {tr.get('gpu_seconds', '?')} GPU-seconds, so the "
        f"**ideal makespan** (every GPU busy all the time) is {tr.get('gpu_seconds', '?')} / "
        f"{tr.get('total_gpus', '?')} = **{_s(tr.get('ideal_makespan_s'))}**"
    )


def section(data: dict[str, Any]) -> list[str]:
    env, tr, m = data.get("environment") or {}, data.get("trace") or {}, data.get("machine") or {}
    modes: dict[str, dict[str, Any]] = data.get("modes") or {}
    vd = data.get("verdicts") or {}
    targets = data.get("targets") or {}
    shown = [x for x in MODE_ORDER if x in modes] or ["live", "static"]
    lines = [
        "## gpu-pool: a GPU Job trace through the global pool, live capacity vs. Kueue vs. static slices",
        "",
        f"Run {m.get('date', '?')}: {m.get('cores', '?')} cores ({m.get('cpu', '?')}), {m.get('memory_gib', '?')} GiB "
        f"memory, {m.get('kubernetes', '?')}; load average at start {m.get('loadavg_at_start', '?')}, "
        f"{m.get('other_kube_apiservers_at_start', '?')} kube-apiservers of other local environments running.",
        "",
        f"- clusters (default topology{_where(env)}): {env.get('consumer', '?')}; "
        + "; ".join((env.get("providers") or {}).values())
        + f" — {env.get('total_gpus', '?')} GPUs in all",
        _trace_line(tr),
        *_reference(tr),
        f"- all Jobs POSTed to the consumer at t = 0 (batch/v1, {env.get('concurrency', '?')} concurrent requests, "
        f"backoffLimit {env.get('backoff_limit', '?')}) into `{env.get('namespace', '?')}`, offloaded to both "
        "providers; no node, no toleration: the consumer's kube-scheduler and gpufed's webhook place them",
        "- **live**: gpufed's default — one virtual node per provider GPU product, allocatable capped at the largest "
        "shape one provider node can still take, fit check and fail-back; a group's pods are gated by gpufed's "
        "webhook and released whole onto one pool node by its gang controller. **kueue**: the same capacity, and "
        "every Job names a LocalQueue (created suspended) whose ClusterQueue covers the ResourceFlavors gpufed keeps "
        "(one per pool node, nominal GPU quota = the product's GPUs at the provider, largest flavor first, "
        "BestEffortFIFO); Kueue admits each Job whole to one flavor and gpufed's gang path steps aside. **static**: "
        "the baseline other federations use (`gpufed.io/capacity=static` on the consumer's ForeignClusters) — one "
        "virtual node per provider, allocatable = grant, no fit check; groups are still released whole onto one "
        "provider's node, whose own scheduler places each pod. Same clusters, same trace, in the order "
        f"{', '.join(env.get('modes') or shown)}; every Job deleted in between",
        "- measured with watches (client clock): a Job is done when every completion index has a pod seen "
        "Succeeded; utilisation = Σ GPUs × run seconds of every pod that succeeded / (GPUs × makespan). A group is "
        "**split** when the pods that completed it ran in more than one place (provider and GPU product, read from "
        "the provider node each pod's twin was bound to — a static virtual node stands for a whole provider, so "
        "only the twin's node tells the product), or when pods of one attempt ran at once in more than one place. A "
        "pod *sat Pending remotely* when its twin on a provider ever had PodScheduled=False/Unschedulable. A run "
        f"ends when all Jobs are done, at its time limit ({env.get('limit_factor', '?')} × ideal + 60 s) or when it "
        f"stalls (no pod Running, nothing changing for {_s(env.get('stall_s'))} static, "
        f"{_s(env.get('live_stall_s'))} live and kueue)",
        "",
        f"Targets: live utilisation ≥ {targets.get('utilisation_ratio_min', 0.9)} of the ideal; "
        f"{targets.get('stuck_max', 0)} pods stuck Pending remotely (live); {targets.get('split_max', 0)} groups "
        "split across providers or products (live, and Kueue's admission).",
        "",
        "| | " + " | ".join(HEADINGS[x] for x in shown) + " | target | verdict |",
        "|---|" + "---|" * len(shown) + "---|---|",
    ]

    def row(label: str, fn: Callable[[dict[str, Any]], str], target: str = "", verdict: str = "") -> str:
        cells = []
        for x in shown:
            r = modes.get(x) or {}
            cells.append(("error: see below" if "error" in r else fn(r)) if r else "not run")
        return f"| {label} | " + " | ".join(cells) + f" | {target} | {verdict} |"

    u, st = vd.get("utilisation") or {}, vd.get("stuck") or {}
    sp, ksp = vd.get("split_groups") or {}, vd.get("kueue_split_groups") or {}
    split_verdict = "; ".join(
        f"{who}: {_verdict(v)}" for who, v in (("live", sp), ("kueue", ksp)) if v and v.get("met") is not None
    )
    lines += [
        row("virtual nodes (allocatable GPUs, idle)", _nodes),
        row("run", _ended),
        row("makespan", _makespan),
        row("makespan / ideal", lambda r: _s(r.get("makespan_over_ideal"), "")),
        row(
            "GPU utilisation (= ratio to the ideal's 1.0)",
            _util,
            str(u.get("target", "")).replace(">=", "≥"),
            f"live: {_verdict(u)}" if u else "",
        ),
        row(
            "Jobs finished / failed / unfinished",
            lambda r: (
                f"{r.get('jobs_finished')} / {r.get('jobs_failed')} / {r.get('jobs_unfinished')} of {r.get('jobs')}"
            ),
        ),
        row("groups split across providers or products", _split, str(sp.get("target", "= 0")), split_verdict),
        row("groups whose pods ran on more than one consumer virtual node", lambda r: str(r.get("groups_split_nodes"))),
        row("groups never all Running at once", lambda r: str(r.get("groups_not_together"))),
        row("group: submit → all its pods Running, p50 / p90 / max", _q("group_all_running_s")),
        row("group: first → last of its pods Running, p50 / p90 / max", _q("group_start_skew_s")),
        row("groups per place", lambda r: _counts(r.get("groups_by_place"))),
        row("pods held by gpufed's gang gate", lambda r: str(r.get("pods_gated"))),
        row(
            "pods failed back",
            lambda r: (
                f"{r.get('pods_failed_back', 0)}"
                + (f" ({_counts(r.get('failed_pods_by_reason'))})" if r.get("pods_failed_back") else "")
            ),
        ),
        row("pods that sat Pending remotely", _stuck, str(st.get("target", "")), f"live: {_verdict(st)}" if st else ""),
        row("longest remote Pending wait", lambda r: _sec(r.get("max_remote_wait_s"))),
        row("Job: submit → first pod Running, p50 / p90 / max", _q("queue_wait_s")),
        row("work done per place (provider/product)", _work("by_place")),
        row("work done per virtual node", _work("by_node")),
        row("Kueue", _kueue),
        row("most GPUs each virtual node advertised during the run (of its pool's total)", _advertised),
        row("all Jobs created after", lambda r: _sec(r.get("submit_s"))),
        row("mode switch (virtual nodes as the mode implies) took", lambda r: _sec(r.get("mode_switch_s"))),
        row("deleting the Jobs, pods and twins took", lambda r: _sec(r.get("cleanup_s"))),
        "",
    ]
    notes = observations(modes)
    if notes:
        lines += ["Seen during the runs:", "", *[f"- {n}" for n in notes], ""]
    met = [f"{k} ({v.get('value')}; target {v.get('target')})" for k, v in vd.items() if v.get("met")]
    missed = [f"{k} ({v.get('value')}; target {v.get('target')})" for k, v in vd.items() if v.get("met") is False]
    lines += [f"Verdict: met {'; '.join(met) or 'none'}. Missed: {'; '.join(missed) or 'none'}.", ""]
    return lines


def observations(modes: dict[str, dict[str, Any]]) -> list[str]:
    out: list[str] = []
    for mode, r in modes.items():
        if "error" in r:
            out.append(f"{mode}: could not run: `{r['error'][:400]}`")
            continue
        if r.get("jobs_unfinished") or r.get("jobs_failed"):
            left = "; ".join(
                f"{j['job']} {j['shape']} {j['state']}"
                + (f" pinned to `{j['pinned']}`" if j.get("pinned") else "")
                + (f" (flavor `{j['flavor']}`)" if j.get("flavor") else "")
                for j in r.get("unfinished_jobs") or []
            )
            out.append(
                f"{mode}: {_jobs(r.get('jobs_unfinished', 0))} unfinished "
                f"({_counts(r.get('unfinished_by_state'))}) and "
                f"{r.get('jobs_failed')} failed when the run ended ({r.get('ended')}); by GPUs per pod: "
                f"{_counts(r.get('unfinished_by_gpus'), ' GPU')}" + (f" — {left}" if left else "")
            )
        misfits = _misfits(r)
        if misfits:
            out.append(
                f"{mode}: {_jobs(len(misfits))} admitted to a flavor none of whose provider nodes can hold one of "
                f"their pods: {'; '.join(misfits)}. Kueue counts a flavor's quota over the whole pool, not per node, "
                "so these pods stay Pending on the consumer (the pool node never advertises that much) and hold the "
                "flavor's quota until they are deleted"
            )
        together = r.get("not_together_groups") or []
        if together:
            rows = "; ".join(
                f"{g['job']} ({g['shape']}, {g['duration_s']:g} s each, {' + '.join(g['places'])}): first pod Running "
                f"{_sec(g['first_running_s'])}, the last {_sec(g['all_running_s'])} after submit"
                for g in together
            )
            n = r.get("groups_not_together") or len(together)
            out.append(
                f"{mode}: {n} group{'' if n == 1 else 's'} never had all {'its' if n == 1 else 'their'} pods Running "
                "at once (the last "
                f"started after the first had finished): {rows}"
            )
        for e in r.get("first_create_errors") or []:
            out.append(f"{mode}: create error: `{e}`")
        if r.get("running_unseen"):
            out.append(
                f"{mode}: {r['running_unseen']} pods were seen Succeeded but never Running (their planned run time "
                "counts)"
            )
        if r.get("pods_unplaced"):
            out.append(
                f"{mode}: {r['pods_unplaced']} pods succeeded without their twin seen bound (their place is unknown "
                "and does not count towards a split)"
            )
        out += [f"{mode}: {line}" for log in r.get("logs") or [] if (line := describe_findings(log)) is not None]
    return out


def _misfits(r: dict[str, Any]) -> list[str]:
    """Unfinished Kueue Jobs whose pods ask more GPUs than the largest node of the flavor they were
    admitted to (a pool node's idle allocatable, live capacity, is that largest node)."""
    largest = {n: v.get("gpus") for n, v in (r.get("virtual_nodes") or {}).items()}
    out = []
    for j in r.get("unfinished_jobs") or []:
        pods, _, gpus = str(j.get("shape", "")).partition("x")
        most = largest.get(j.get("flavor") or "")
        if most is not None and gpus.isdigit() and int(gpus) > most:
            unit = "GPU" if most == 1 else "GPUs"
            out.append(f"{j['job']} ({pods} × {gpus} GPU) to `{j['flavor']}` (largest node {most} {unit})")
    return out


def table(data: dict[str, Any]) -> str:
    """A plain summary of one gpu-pool run for the terminal."""
    tr = data.get("trace") or {}
    rows = [
        f"trace: {tr.get('jobs')} Jobs / {tr.get('pods')} pods ({tr.get('groups')} groups, seed {tr.get('seed')}), "
        f"{tr.get('gpu_seconds')} GPU-s, ideal makespan {tr.get('ideal_makespan_s')} s on {tr.get('total_gpus')} GPUs",
        f"{'mode':<7} {'ended':<11} {'elapsed':>8} {'makespan':>9} {'/ideal':>7} {'util':>6} {'done':>5} "
        f"{'failed':>6} {'split':>5} {'failback':>8} {'stuck':>5} {'max wait':>9}",
    ]
    for mode, r in (data.get("modes") or {}).items():
        if "error" in r:
            rows.append(f"{mode:<7} error: {r['error'][:200]}")
            continue
        rows.append(
            f"{mode:<7} {r.get('ended', '?'):<11} {_s(r.get('elapsed_s')):>8} {_s(r.get('makespan_s')):>9} "
            f"{_s(r.get('makespan_over_ideal'), ''):>7} {_s(r.get('utilisation'), ''):>6} "
            f"{r.get('jobs_finished', 0):>5} {r.get('jobs_failed', 0):>6} {r.get('groups_split', 0):>5} "
            f"{r.get('pods_failed_back', 0):>8} {r.get('stuck_remote', 0):>5} {_s(r.get('max_remote_wait_s')):>9}"
        )
    for k, v in (data.get("verdicts") or {}).items():
        state = "n/a" if v.get("met") is None else "met" if v.get("met") else "MISSED"
        rows.append(f"{k}: {v.get('value')} ({v.get('target')}) {state}")
    return "\n".join(rows)


# ------------------------------------------------------------------------------------ missed targets


def _gpupool(results: dict[str, dict[str, Any]]) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    data = results.get("gpu-pool") or {}
    return data, (data.get("modes") or {}).get("live") or {}, (data.get("trace") or {}).get("reference") or {}


def why_utilisation(results: dict[str, dict[str, Any]]) -> str:
    data, live, ref = _gpupool(results)
    kueue = (data.get("modes") or {}).get("kueue") or {}
    groups = live.get("group_all_running_s") or {}
    last = ", ".join(
        f"{g['job']} ({g['shape']}) at {_sec(g['all_running_s'])}" for g in (live.get("last_groups_up") or [])[:3]
    )
    apart = ", ".join(f"{g['job']} ({g['shape']})" for g in live.get("not_together_groups") or [])
    misfits = _misfits(kueue) if kueue and "error" not in kueue else []
    text = (
        f"Live reached {live.get('utilisation')} (makespan {_s(live.get('makespan_s'))} against the ideal "
        f"{_s(live.get('ideal_s'))}). Much of the gap is the trace and the queue order, not gpufed: a greedy placer "
        "with no overhead at all on these node shapes, placing groups whole and taking Jobs in submission order as "
        f"the kube-scheduler's queue roughly does, reaches only {ref.get('fifo_utilisation')}; taking them largest "
        f"first it reaches {ref.get('largest_first_utilisation')}, so ≥ 0.9 on this trace needs a queue that orders "
        "by size, which neither the kube-scheduler nor gpufed's gang controller does. The rest: (1) groups wait "
        "for a whole pool — a group's pods were all Running "
        f"{_sec(groups.get('p50'))} after submit at the median, {_sec(groups.get('max'))} at worst, and the last "
        f"to start were {last or '—'}: a 2 × 8 group needs two H100 nodes free at once. The longest-waiting group "
        "holds back the GPUs its pool frees (`gpufed.io/gang-reserve`), so pods bound one by one no longer take "
        "each node as it frees, but a pool holds one group's reservation at a time: the 2 × 8 groups wait their "
        "turn, and a node held for a group does no work until the group's second node frees; "
        + (
            f"(2) {live.get('groups_not_together')} group(s) never had all pods Running at once ({apart}), "
            "although the gang controller binds a released group's pods to the pool node together and the "
            "virtual kubelet starts their twins together (gate `gpufed.io/group-start`): the last pod was seen "
            "Running only after the first had finished (why, this run does not show); "
            if apart
            else ""
        )
        + f"({3 if apart else 2}) pod start and completion latency across two clusters on a loaded 2-core machine "
        "(a Job's GPUs are idle from its completion to the next pod's start on them)."
    )
    if kueue and "error" not in kueue:
        text += (
            f" Through Kueue the same trace reached {kueue.get('utilisation')}"
            + (" over the span to its last completion" if not kueue.get("complete") else "")
            + (
                f", and never finished: {len(misfits)} Jobs were admitted to a flavor none of whose nodes can hold "
                "their pods (see the kueue notes above)."
                if misfits
                else "."
            )
        )
    return text


def why_stuck(results: dict[str, dict[str, Any]]) -> str:
    _data, live, _ref = _gpupool(results)
    return (
        f"{live.get('stuck_remote')} pod(s) of the live run had a twin marked Unschedulable at the provider "
        f"(by GPUs per pod: {_counts(live.get('stuck_remote_by_gpus'))}), the longest for "
        f"{_s(live.get('max_remote_wait_s'))}; {live.get('pods_failed_back', 0)} were failed back. The gang "
        "controller binds a released group's pods straight to the pool node (pods/binding), past the consumer "
        "scheduler's fit check against the capped allocatable, and the virtual kubelet's own fit check asks the "
        "provider's estimator, whose snapshot can trail the provider's scheduler by a moment: a twin then waits "
        "at the provider until the GPUs it was promised are released there."
    )


def _why_split(mode: str) -> Callable[[dict[str, dict[str, Any]]], str]:
    def why(results: dict[str, dict[str, Any]]) -> str:
        r = ((results.get("gpu-pool") or {}).get("modes") or {}).get(mode) or {}
        if "error" in r or not r:
            return f"The {mode} run did not run to a figure: {r.get('error', 'not run')}."
        if not r.get("groups_finished"):
            return f"No group finished in the {mode} run, so no group could be judged."
        listed = "; ".join(f"{g['job']} ({g['shape']}): {' + '.join(g['places'])}" for g in r.get("split_groups") or [])
        return (
            f"{r.get('groups_split')} of {r.get('groups')} groups ran split in the {mode} run: {listed or '—'}. "
            "A product bug: a group's pods must all run on one provider and GPU product."
        )

    return why


#: Why a gpu-pool target was missed (bench.report lists these beside the other parts').
EXPLANATIONS: dict[str, Callable[[dict[str, dict[str, Any]]], str]] = {
    "gpu-pool.utilisation": why_utilisation,
    "gpu-pool.stuck": why_stuck,
    "gpu-pool.split_groups": _why_split("live"),
    "gpu-pool.kueue_split_groups": _why_split("kueue"),
}
