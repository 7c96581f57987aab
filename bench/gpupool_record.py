"""What one gpu-pool run observed, and the figures and verdicts read from it (pure but for the clock).

Owns:
- `Observer`: the watch callbacks of one mode's run (the consumer's pods, Jobs, virtual nodes and,
  with Kueue, Workloads; the twins on each provider) and `record`, which turns what they saw into
  plain data (`ModeRecord`, one `JobResult` per Job, `RemoteWait` per twin that sat Pending);
- where a pod ran: its consumer virtual node, and its *place*, `provider/product`, read from the
  provider node its twin was bound to (the product of that node in the topology). A static virtual
  node stands for a whole provider, so only the twin's node tells which product a pod got;
- `summarise`: a mode's figures — makespan, utilisation (GPU-seconds of every pod that succeeded,
  over all GPUs x the span), outcomes, remote waits, and for groups: split groups, groups never all
  Running at once, time from submit to all of a group's pods Running;
- `verdicts`: the targets, read on the live run (utilisation, pods stuck Pending remotely, split
  groups) and on the Kueue run (split groups).

A group counts as **split** when the pods that completed it ran in more than one place, or when pods
of one attempt ran at the same time in more than one place (a half-placed group failed back later
still counts). `groups_split_nodes` counts the groups whose completing pods ran on more than one
consumer virtual node, the consumer's own view.

Does not: talk to clusters (bench.gpupool runs the watches) or render anything (bench.gpupool_report).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from bench.bursts import percentile
from bench.gpupool_trace import TOTAL_GPUS, TraceJob, rounded, utilisation
from gpufed.apis.wire import GANG_LABEL, POOL_ANNOTATION

GPU = "nvidia.com/gpu"
JOB_NAME_LABELS = ("batch.kubernetes.io/job-name", "job-name")
COMPLETION_INDEX = "batch.kubernetes.io/job-completion-index"
HOSTNAME_LABEL = "kubernetes.io/hostname"

#: Targets: live utilisation against the ideal, pods stuck Pending remotely, groups split.
TARGET_UTILISATION_RATIO_MIN = 0.9
TARGET_STUCK_MAX = 0
TARGET_SPLIT_MAX = 0


@dataclass
class JobResult:
    """One Job's outcome; times in seconds since the first submit."""

    name: str
    gpus: int
    duration_s: float
    #: Pods the Job runs at once (1: a single pod; more: a group).
    size: int = 1
    #: The first of its pods seen Running.
    started_s: float | None = None
    #: The last of the pods that completed it seen Running: the whole group up.
    all_running_s: float | None = None
    #: Every index Succeeded (the last of them).
    finished_s: float | None = None
    failed: bool = False
    node: str = ""
    #: Consumer virtual nodes, and places (`provider/product`), of the pods that completed it.
    nodes: tuple[str, ...] = ()
    places: tuple[str, ...] = ()
    #: Split across places (see the module's docstring).
    split: bool = False
    #: A group: its completing pods were all Running at one moment (None: not a finished group).
    together: bool | None = None
    pods: int = 0
    #: GPUs x run seconds of its pods that succeeded (planned time when Running was not seen).
    gpu_seconds: float = 0.0
    #: Unfinished at the end: not-admitted (Kueue), no-pod (e.g. Job backoff), gated, unscheduled,
    #: remote-pending, running.
    state: str = ""
    #: Unfinished: the node its live pods are pinned to (nodeSelector kubernetes.io/hostname).
    pinned: str = ""
    #: Kueue: the flavor its workload was admitted to.
    flavor: str = ""

    @property
    def run_s(self) -> float | None:
        if self.started_s is None or self.finished_s is None:
            return None
        return max(0.0, self.finished_s - self.started_s)


@dataclass(frozen=True)
class RemoteWait:
    provider: str
    pod: str
    gpus: int
    wait_s: float
    resolved: bool


@dataclass
class ModeRecord:
    """Everything one mode's run observed, as plain data."""

    mode: str
    total_gpus: int
    ideal_s: float
    limit_s: float
    jobs: list[JobResult]
    elapsed_s: float
    ended: str
    submit_s: float = 0.0
    failed_pods: dict[str, int] = field(default_factory=dict)
    remote_waits: list[RemoteWait] = field(default_factory=list)
    create_errors: list[str] = field(default_factory=list)
    running_unseen: int = 0
    #: Pods that succeeded without their twin seen bound to a provider node (their place is unknown).
    pods_unplaced: int = 0
    #: Pods that carried gpufed's gang label (held by its webhook until their group was placed).
    pods_gated: int = 0
    #: Per virtual node: status updates seen, the most GPUs it advertised, its pool's total GPUs
    #: (from its gpufed.io/gpu-pool figures) and how many updates advertised more than that total.
    nodes: dict[str, dict[str, Any]] = field(default_factory=dict)


# ------------------------------------------------------------------------------------ observation


@dataclass
class _Pod:
    job: str
    index: str = ""
    phase: str = "Pending"
    node: str = ""
    pinned: str = ""
    gang: bool = False
    gated: bool = False
    running_at: float | None = None
    finished_at: float | None = None
    failed_reason: str = ""


@dataclass
class _Twin:
    gpus: int
    first_seen: float
    node: str = ""
    unschedulable_at: float | None = None
    scheduled_at: float | None = None
    gone_at: float | None = None


def _job_of(obj: Mapping[str, Any]) -> str:
    labels = obj["metadata"].get("labels") or {}
    for key in JOB_NAME_LABELS:
        if labels.get(key):
            return str(labels[key])
    return str(obj["metadata"]["name"]).rsplit("-", 1)[0]


def _index_of(obj: Mapping[str, Any]) -> str:
    meta = obj["metadata"]
    found = (meta.get("annotations") or {}).get(COMPLETION_INDEX) or (meta.get("labels") or {}).get(COMPLETION_INDEX)
    return str(found or "")


def _unschedulable(obj: Mapping[str, Any]) -> bool:
    for c in (obj.get("status") or {}).get("conditions") or []:
        if c.get("type") == "PodScheduled" and c.get("status") == "False" and c.get("reason") == "Unschedulable":
            return True
    return False


def _overlap(a: tuple[float, float], b: tuple[float, float]) -> bool:
    return a[0] < b[1] and b[0] < a[1]


class Observer:
    """What the watches saw of one mode's Jobs (times from `clock`, monotonic). `places`: provider node
    name -> `provider/product` (`gpupool_trace.node_places`)."""

    def __init__(
        self,
        trace: list[TraceJob],
        places: Mapping[str, str] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.clock = clock
        self.trace = {j.name: j for j in trace}
        self.places = dict(places or {})
        self.pods: dict[str, _Pod] = {}
        self.failed_jobs: set[str] = set()
        self.suspended: set[str] = set()
        self.twins: dict[str, _Twin] = {}
        self.twin_node: dict[str, tuple[str, str]] = {}
        self.nodes: dict[str, dict[str, Any]] = {}
        #: Kueue: Job -> the flavor its workload was admitted to.
        self.flavors: dict[str, str] = {}
        self.last_change = clock()
        self.changed = asyncio.Event()

    def _touch(self) -> None:
        self.last_change = self.clock()
        self.changed.set()

    def on_pod(self, kind: str, obj: dict[str, Any]) -> None:
        job = _job_of(obj)
        if job not in self.trace or kind == "DELETED":
            return
        name = obj["metadata"]["name"]
        now = self.clock()
        pod = self.pods.get(name)
        if pod is None:
            pod = self.pods[name] = _Pod(job, _index_of(obj))
            self._touch()
        spec = obj.get("spec") or {}
        status = obj.get("status") or {}
        phase = str(status.get("phase") or "Pending")
        pod.node = str(spec.get("nodeName") or pod.node)
        pod.pinned = str((spec.get("nodeSelector") or {}).get(HOSTNAME_LABEL) or pod.pinned)
        pod.gang = pod.gang or GANG_LABEL in (obj["metadata"].get("labels") or {})
        pod.gated = bool(spec.get("schedulingGates"))
        if phase == pod.phase:
            return
        pod.phase = phase
        if phase == "Running" and pod.running_at is None:
            pod.running_at = now
        elif phase in ("Succeeded", "Failed") and pod.finished_at is None:
            pod.finished_at = now
            if phase == "Failed":
                pod.failed_reason = str(status.get("reason") or "Failed")
        self._touch()

    def on_job(self, kind: str, obj: dict[str, Any]) -> None:
        name = obj["metadata"]["name"]
        if name not in self.trace or kind == "DELETED":
            return
        if (obj.get("spec") or {}).get("suspend"):
            self.suspended.add(name)
        elif name in self.suspended:
            self.suspended.discard(name)
            self._touch()
        for c in (obj.get("status") or {}).get("conditions") or []:
            if c.get("type") == "Failed" and c.get("status") == "True" and name not in self.failed_jobs:
                self.failed_jobs.add(name)
                self._touch()

    def on_workload(self, kind: str, obj: dict[str, Any]) -> None:
        """Kueue's Workloads: the flavor each Job's workload was admitted to."""
        if kind == "DELETED":
            return
        owners = [o.get("name") for o in obj["metadata"].get("ownerReferences") or [] if o.get("kind") == "Job"]
        job = next((str(o) for o in owners if o in self.trace), None)
        if job is None:
            return
        for ps in ((obj.get("status") or {}).get("admission") or {}).get("podSetAssignments") or []:
            flavors = ps.get("flavors") or {}
            flavor = flavors.get(GPU) or next(iter(flavors.values()), None)
            if flavor and self.flavors.get(job) != flavor:
                self.flavors[job] = str(flavor)
                self._touch()

    def on_node(self, kind: str, obj: dict[str, Any]) -> None:
        """Virtual nodes: what they advertise, against their pool's total GPUs."""
        if kind == "DELETED":
            return
        meta = obj["metadata"]
        gpus = int(((obj.get("status") or {}).get("allocatable") or {}).get(GPU, "0"))
        try:
            figures = json.loads((meta.get("annotations") or {}).get(POOL_ANNOTATION) or "{}")
        except ValueError:
            figures = {}
        total = figures.get("total") if isinstance(figures, dict) else None
        row = self.nodes.setdefault(meta["name"], {"updates": 0, "max_allocatable": 0, "total": None, "above_total": 0})
        if row.get("last") == (gpus, total):
            return
        row["last"] = (gpus, total)
        row["updates"] += 1
        row["max_allocatable"] = max(row["max_allocatable"], gpus)
        if isinstance(total, int):
            row["total"] = total
            if gpus > total:
                row["above_total"] += 1

    def on_twin(self, provider: str) -> Callable[[str, dict[str, Any]], None]:
        def on_event(kind: str, obj: dict[str, Any]) -> None:
            job = _job_of(obj)
            if job not in self.trace:
                return
            name = obj["metadata"]["name"]
            key = f"{provider}/{name}"
            now = self.clock()
            twin = self.twins.get(key)
            if twin is None:
                if kind == "DELETED":
                    return
                twin = self.twins[key] = _Twin(self.trace[job].gpus, now)
            if kind == "DELETED":
                twin.gone_at = twin.gone_at or now
                return
            if _unschedulable(obj) and twin.unschedulable_at is None and twin.scheduled_at is None:
                twin.unschedulable_at = now
            node = (obj.get("spec") or {}).get("nodeName")
            if node:
                twin.node = str(node)
                self.twin_node[name] = (provider, twin.node)
                if twin.scheduled_at is None:
                    twin.scheduled_at = now

        return on_event

    def running(self) -> int:
        return sum(1 for p in self.pods.values() if p.phase == "Running")

    def _succeeded(self) -> dict[str, dict[str, tuple[str, _Pod]]]:
        """Job -> completion index -> (name, pod) of the first of its pods that succeeded with that index."""
        out: dict[str, dict[str, tuple[str, _Pod]]] = {}
        for name, p in sorted(self.pods.items(), key=lambda kv: kv[1].finished_at or 0.0):
            if p.phase == "Succeeded":
                out.setdefault(p.job, {}).setdefault(p.index, (name, p))
        return out

    def done(self, trace: Iterable[TraceJob]) -> bool:
        ok = self._succeeded()
        return all(len(ok.get(j.name, {})) >= j.pods or j.name in self.failed_jobs for j in trace)

    def place(self, pod_name: str) -> str | None:
        """`provider/product` of the provider node the pod's twin was bound to (None: no twin seen bound)."""
        seen = self.twin_node.get(pod_name)
        if seen is None:
            return None
        provider, node = seen
        return self.places.get(node, f"{provider}/{node}")

    def _split_running(self, pods: list[tuple[str, _Pod]], end: float) -> bool:
        """Pods of the Job ran at the same time in more than one place (pods whose place is unknown
        are left out)."""
        spans = []
        for name, p in pods:
            where = self.place(name)
            if p.running_at is not None and where is not None:
                spans.append((where, (p.running_at, p.finished_at or end)))
        return any(a[0] != b[0] and _overlap(a[1], b[1]) for i, a in enumerate(spans) for b in spans[i + 1 :])

    def record(
        self,
        mode: str,
        trace: list[TraceJob],
        t0: float,
        *,
        ideal_s: float,
        limit_s: float,
        elapsed_s: float,
        ended: str,
        submit_s: float,
        create_errors: list[str],
    ) -> ModeRecord:
        end = t0 + elapsed_s
        by_job: dict[str, list[tuple[str, _Pod]]] = {}
        for name, p in self.pods.items():
            by_job.setdefault(p.job, []).append((name, p))
        succeeded = self._succeeded()
        jobs: list[JobResult] = []
        unseen = unplaced = 0
        for j in trace:
            pods = by_job.get(j.name, [])
            ok = list(succeeded.get(j.name, {}).values())
            res = JobResult(
                j.name,
                j.gpus,
                j.duration_s,
                size=j.pods,
                pods=len(pods),
                failed=j.name in self.failed_jobs,
                flavor=self.flavors.get(j.name, ""),
            )
            for _, p in ok:
                assert p.finished_at is not None
                run = p.finished_at - p.running_at if p.running_at is not None else j.duration_s
                res.gpu_seconds += j.gpus * max(0.0, run)
                unseen += p.running_at is None
            res.split = self._split_running(pods, end)
            started = [p.running_at for _, p in pods if p.running_at is not None]
            res.started_s = min(started) - t0 if started else None
            if ok:
                res.nodes = tuple(sorted({p.node for _, p in ok}))
                known = [self.place(n) for n, _ in ok]
                res.places = tuple(sorted({w for w in known if w is not None}))
                unplaced += sum(1 for w in known if w is None)
                res.node = ok[0][1].node
                res.split = res.split or len(res.places) > 1
            if len(ok) >= j.pods:
                finished = [p.finished_at for _, p in ok if p.finished_at is not None]
                res.finished_s = max(finished) - t0
                ran = [p.running_at for _, p in ok if p.running_at is not None]
                if len(ran) == len(ok):
                    res.all_running_s = max(ran) - t0
                    if j.group:
                        res.together = max(ran) < min(finished)
            else:
                live = [p for _, p in pods if p.phase not in ("Succeeded", "Failed")]
                res.pinned = next((p.pinned for p in live if p.pinned), "")
                if not live:
                    res.state = "not-admitted" if j.name in self.suspended else "no-pod"
                elif any(p.phase == "Running" for p in live):
                    res.state = "running"
                elif any(p.node for p in live):
                    res.state = "remote-pending"
                elif any(p.gated for p in live):
                    res.state = "gated"
                else:
                    res.state = "unscheduled"
            jobs.append(res)
        failed = Counter(p.failed_reason for p in self.pods.values() if p.phase == "Failed")
        waits = []
        for key, tw in sorted(self.twins.items()):
            if tw.unschedulable_at is None:
                continue
            stop = min(x for x in (tw.scheduled_at, tw.gone_at, end) if x is not None)
            provider, pod = key.split("/", 1)
            resolved = tw.scheduled_at is not None
            waits.append(RemoteWait(provider, pod, tw.gpus, max(0.0, stop - tw.first_seen), resolved))
        return ModeRecord(
            mode,
            TOTAL_GPUS,
            ideal_s,
            limit_s,
            jobs,
            elapsed_s,
            ended,
            submit_s=submit_s,
            failed_pods=dict(failed),
            remote_waits=waits,
            create_errors=create_errors,
            running_unseen=unseen,
            pods_unplaced=unplaced,
            pods_gated=sum(1 for p in self.pods.values() if p.gang),
            nodes={k: {f: v for f, v in row.items() if f != "last"} for k, row in self.nodes.items()},
        )


# ------------------------------------------------------------------------------------ figures


def _quantiles(values: list[float]) -> dict[str, float | None] | None:
    if not values:
        return None
    return {"p50": rounded(percentile(values, 50)), "p90": rounded(percentile(values, 90)), "max": rounded(max(values))}


def _by(rows: Iterable[tuple[str, JobResult]]) -> dict[str, dict[str, float]]:
    out: dict[str, dict[str, float]] = {}
    for key, j in rows:
        row = out.setdefault(key, {"jobs": 0, "gpu_seconds": 0.0})
        row["jobs"] += 1
        row["gpu_seconds"] = round(row["gpu_seconds"] + j.gpu_seconds, 1)
    return dict(sorted(out.items()))


def _group_row(j: JobResult) -> dict[str, Any]:
    skew = j.all_running_s - j.started_s if j.all_running_s is not None and j.started_s is not None else None
    return {
        "job": j.name,
        "shape": f"{j.size}x{j.gpus}",
        "places": list(j.places),
        "first_running_s": rounded(j.started_s, 1),
        "all_running_s": rounded(j.all_running_s, 1),
        "skew_s": rounded(skew, 1),
        "duration_s": j.duration_s,
    }


def group_figures(jobs: list[JobResult]) -> dict[str, Any]:
    """The figures of a run's groups: how many, finished, split, never all Running at once, and the time
    from submit to all of a group's pods Running."""
    groups = [j for j in jobs if j.size > 1]
    done = [j for j in groups if j.finished_s is not None]
    split = [j for j in groups if j.split]
    skews = [j.all_running_s - j.started_s for j in done if j.all_running_s is not None and j.started_s is not None]
    return {
        "groups": len(groups),
        "groups_finished": len(done),
        "groups_split": len(split),
        "groups_split_nodes": sum(1 for j in done if len(j.nodes) > 1),
        "split_groups": [{"job": j.name, "shape": f"{j.size}x{j.gpus}", "places": list(j.places)} for j in split][:10],
        "groups_not_together": sum(1 for j in done if j.together is False),
        "not_together_groups": [_group_row(j) for j in done if j.together is False][:10],
        "last_groups_up": [
            _group_row(j) for j in sorted(done, key=lambda j: -(j.all_running_s or 0.0)) if j.all_running_s
        ][:5],
        "group_all_running_s": _quantiles([j.all_running_s for j in done if j.all_running_s is not None]),
        "group_start_skew_s": _quantiles(skews),
        "groups_by_place": dict(sorted(Counter(" + ".join(j.places) for j in done).items())),
    }


def summarise(rec: ModeRecord) -> dict[str, Any]:
    """The mode's figures: makespan, utilisation and their ratios to the ideal, outcomes, remote waits, groups."""
    finished = [j for j in rec.jobs if j.finished_s is not None]
    failed = [j for j in rec.jobs if j.failed and j.finished_s is None]
    unfinished = [j for j in rec.jobs if j.finished_s is None and not j.failed]
    complete = not unfinished and not failed and bool(rec.jobs)
    last = max((j.finished_s for j in finished if j.finished_s is not None), default=None)
    makespan = last if complete else None
    span = last if last is not None else rec.elapsed_s
    # Every pod that succeeded counts, also those of a group that did not finish.
    work = sum(j.gpu_seconds for j in rec.jobs)
    util = utilisation(work, rec.total_gpus, span) if work else 0.0
    waits = [w.wait_s for w in rec.remote_waits]
    starts = [j.started_s for j in rec.jobs if j.started_s is not None]
    left = [*unfinished, *failed]
    return {
        "mode": rec.mode,
        "ended": rec.ended,
        "complete": complete,
        "elapsed_s": rounded(rec.elapsed_s),
        "limit_s": rounded(rec.limit_s, 1),
        "submit_s": rounded(rec.submit_s),
        "makespan_s": rounded(makespan),
        "span_s": rounded(span),
        "ideal_s": rounded(rec.ideal_s),
        "makespan_over_ideal": rounded(makespan / rec.ideal_s if makespan else None),
        "gpu_seconds_run": round(work, 1),
        "utilisation": rounded(util),
        # The ideal schedule keeps every GPU busy: its utilisation is 1.0.
        "utilisation_over_ideal": rounded(util),
        "jobs": len(rec.jobs),
        "jobs_finished": len(finished),
        "jobs_failed": len(failed),
        "jobs_unfinished": len(unfinished),
        "unfinished_by_state": dict(sorted(Counter(j.state or "?" for j in unfinished).items())),
        "unfinished_by_gpus": {str(g): n for g, n in sorted(Counter(j.gpus for j in left).items())},
        "unfinished_jobs": [
            {
                "job": j.name,
                "shape": f"{j.size}x{j.gpus}",
                "state": j.state or "failed",
                "pinned": j.pinned,
                "flavor": j.flavor,
            }
            for j in left
        ][:12],
        "pods_gated": rec.pods_gated,
        "pods_failed_back": sum(rec.failed_pods.values()),
        "failed_pods_by_reason": dict(sorted(rec.failed_pods.items())),
        "stuck_remote": len(rec.remote_waits),
        "stuck_remote_unresolved": sum(1 for w in rec.remote_waits if not w.resolved),
        "stuck_remote_by_provider": dict(sorted(Counter(w.provider for w in rec.remote_waits).items())),
        "stuck_remote_by_gpus": {str(g): n for g, n in sorted(Counter(w.gpus for w in rec.remote_waits).items())},
        "max_remote_wait_s": rounded(max(waits)) if waits else 0.0,
        "queue_wait_s": _quantiles(starts),
        **group_figures(rec.jobs),
        "by_node": _by((j.node or "?", j) for j in finished),
        "by_place": _by((" + ".join(j.places) or "?", j) for j in finished),
        "admitted_by_flavor": dict(sorted(Counter(j.flavor for j in rec.jobs if j.flavor).items())),
        "create_errors": len(rec.create_errors),
        "first_create_errors": rec.create_errors[:3],
        "running_unseen": rec.running_unseen,
        "pods_unplaced": rec.pods_unplaced,
        "node_updates": dict(sorted(rec.nodes.items())),
        "allocatable_above_total": sum(int(n.get("above_total", 0)) for n in rec.nodes.values()),
    }


def _split_verdict(r: Mapping[str, Any] | None, mode: str) -> dict[str, Any]:
    if not r:
        return {"value": None, "target": f"= {TARGET_SPLIT_MAX}", "met": None, "note": f"no {mode} run"}
    split, done, groups = r.get("groups_split"), r.get("groups_finished", 0), r.get("groups", 0)
    note = "" if r.get("complete") else f"{done} of {groups} groups finished"
    return {
        "value": split,
        "target": f"= {TARGET_SPLIT_MAX}",
        "met": split is not None and split <= TARGET_SPLIT_MAX and bool(done) and "error" not in r,
        "note": note,
    }


def verdicts(live: Mapping[str, Any] | None, kueue: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The targets, read on the live run (the static run is the baseline beside them) and, for split
    groups, on the Kueue run."""
    live = live or {}
    ratio = live.get("utilisation_over_ideal") if live.get("complete") else None
    stuck = live.get("stuck_remote")
    note = "" if live.get("complete") or not live else f"run {live.get('ended')}: not every Job finished"
    return {
        "utilisation": {
            "value": ratio,
            "target": f">= {TARGET_UTILISATION_RATIO_MIN} of ideal",
            "met": ratio is not None and ratio >= TARGET_UTILISATION_RATIO_MIN,
            "note": note,
        },
        "stuck": {
            "value": stuck,
            "target": f"= {TARGET_STUCK_MAX}",
            "met": stuck is not None and stuck <= TARGET_STUCK_MAX and "error" not in live,
            "note": "",
        },
        "split_groups": _split_verdict(live, "live"),
        "kueue_split_groups": _split_verdict(kueue, "kueue"),
    }
