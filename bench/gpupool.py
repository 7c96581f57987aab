"""The `gpu-pool` part: a seeded trace of GPU Jobs through the global GPU pool, live capacity against
the static-slice baseline, in one run on the same clusters.

Owns: its own environment (the default topology — consumer with 2 CPU nodes, gpu-a 4 x 8 H100, gpu-b
2 x 4 A100 + 4 x 1 L4: 44 GPUs — in .cache/bench-gpupool, ports from 16100, so it never collides with
the `offload`/`reflection` environment, `make demo` or the e2e sessions), peering consumer -> gpu-a
(32 GPUs) and consumer -> gpu-b (12 GPUs, no product) and offloading namespace `bench-gpu` to both
with the gpufed CLI, the trace, the two runs, their measurements and this part's targets and verdicts.

The trace (`make_trace`): N Jobs (default 200, seed 8), GPUs per pod drawn from 1/2/4/8 with weights
0.40/0.25/0.20/0.15, run time uniform in [4, 16] s (kwok runs the pod for the duration in its
annotation `local.gpufed.io/run-duration`). Every Job is POSTed to the consumer at t = 0 (batch/v1,
as `kubectl create` would, bounded concurrency, admin identity), backoffLimit 6 so a failed-back pod
gets a replacement. Jobs are named `<mode>-<i>` so the two runs never mix.

Modes, run in this order on the same peerings, with every Job and pod deleted in between:
- live: the product's default (`gpufed.io/capacity` absent on the consumer's ForeignClusters): one
  virtual node per provider GPU product, allocatable capped at the largest shape one provider node
  can still take, fit check and fail-back in the virtual kubelet;
- static: the baseline other federations use (`gpufed.io/capacity=static` on both ForeignClusters):
  one virtual node per provider, allocatable = grant, no fit check, no fail-back.
Before submitting, the consumer's virtual nodes must be what the mode implies (`expected_nodes`).

Observed with watches (client monotonic clock): the consumer's pods in `bench-gpu` (a Job runs from
the moment its pod was seen Running to the moment it was seen Succeeded), the consumer's Jobs
(condition Failed), and the twin namespace on each provider: a twin with PodScheduled=False,
reason Unschedulable, at any time, "sat Pending remotely" (counted once per pod; its wait runs from
the twin's first sighting to its binding, or to the end of the run).

Per mode: makespan (first submit -> last Job's pod Succeeded), GPU utilisation = sum(gpus x run s) /
(44 x makespan), the ideal lower bound = planned GPU-seconds / 44 and the ratios to it, jobs finished
/ failed, pods failed back (by reason), pods that sat Pending remotely and the longest such wait. A run
ends when every Job is done, at the time limit (default 3 x ideal + 60 s), or when it stalls: no pod
Running and nothing changing for the stall window (static: 60 s; live: 150 s, beyond the virtual
kubelet's 120 s unplaced timeout, so a fail-back still gets its chance). An unfinished run reports its
unfinished Jobs and where they sat, and "> elapsed" as its makespan; its utilisation is then over
the span to its last completion.

For reading the figures, the result also carries two zero-overhead references computed from the
trace (`simulate`): a greedy placer on the providers' real node shapes taking Jobs in submission
order (what a FIFO queue allows) and largest first.

Targets: live utilisation >= 0.9 of the ideal (the ideal schedule keeps all 44 GPUs busy:
utilisation 1.0), 0 pods stuck Pending remotely in live mode. The static run is the baseline shown
beside them. Does not: tune or change the product; a missed target is reported as missed.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import json
import random
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench import procstat
from bench.offload import (
    REPO,
    cluster_id,
    delete_all,
    ensure_namespace,
    environment,
    gpufed_cli,
    log_findings,
    peer,
    percentile,
    twin_namespace,
    until,
)
from gpufed.apis.wire import CAPACITY_ANNOTATION, POOL_ANNOTATION
from gpufed.kube import rest
from gpufed.kube.client import KubeError, api_client
from gpufed.kube.watch import watch
from gpufed.localenv import manifests
from gpufed.localenv.components import CONTROLLER
from gpufed.localenv.kwokcfg import RUN_DURATION_ANNOTATION
from gpufed.localenv.launcher import LocalEnvironment
from gpufed.localenv.topology import Topology, default_topology

DEFAULT_STATE_DIR = REPO / ".cache" / "bench-gpupool"
#: Three clusters x 25 ports from here: 16100-16174 (the offload/reflection environment has 16000-16074).
DEFAULT_BASE_PORT = 16100
DEFAULT_JOBS = 200
DEFAULT_SEED = 8
DEFAULT_DURATIONS_S = (4.0, 16.0)
#: GPUs per pod and their weights in the trace.
GPU_WEIGHTS: tuple[tuple[int, float], ...] = ((1, 0.40), (2, 0.25), (4, 0.20), (8, 0.15))
#: Time limit of one mode's run = factor x ideal makespan + LIMIT_EXTRA_S.
DEFAULT_LIMIT_FACTOR = 3.0
LIMIT_EXTRA_S = 60.0
#: Seconds with no pod Running and nothing changing after which a static run counts as stalled.
DEFAULT_STALL_S = 60.0
#: The same for live runs: above the virtual kubelet's 120 s unplaced timeout (fail-back).
LIVE_STALL_S = 150.0
MODES = ("live", "static")
BACKOFF_LIMIT = 6
NAMESPACE = "bench-gpu"
CONSUMER = "consumer"
#: Providers and the GPUs the consumer asks each for (all they have).
PROVIDERS: dict[str, int] = {"gpu-a": 32, "gpu-b": 12}
GPU = "nvidia.com/gpu"
REQUESTS = {"cpu": "100m", "memory": "128Mi"}
IMAGE = "registry.example/gpu-train:1"
MODE_LABEL = "bench.gpufed.io/mode"
JOB_NAME_LABELS = ("batch.kubernetes.io/job-name", "job-name")
VIRTUAL_NODE_SELECTOR = "gpufed.io/type=virtual-node"
#: Seconds to wait for the consumer's virtual nodes to match a mode (the virtual kubelets restart).
NODES_TIMEOUT_S = 180.0

#: Targets: live utilisation against the ideal, pods stuck Pending remotely.
TARGET_UTILISATION_RATIO_MIN = 0.9
TARGET_STUCK_MAX = 0

Progress = Callable[[str], None]


@dataclass(frozen=True)
class GpuPoolOptions:
    state_dir: Path = DEFAULT_STATE_DIR
    bin_dir: Path = REPO / ".cache" / "bin"
    base_port: int = DEFAULT_BASE_PORT
    jobs: int = DEFAULT_JOBS
    seed: int = DEFAULT_SEED
    durations_s: tuple[float, float] = DEFAULT_DURATIONS_S
    limit_factor: float = DEFAULT_LIMIT_FACTOR
    stall_s: float = DEFAULT_STALL_S
    modes: tuple[str, ...] = MODES
    concurrency: int = 64
    keep: bool = False


# ------------------------------------------------------------------------------------ trace (pure)


@dataclass(frozen=True)
class TraceJob:
    name: str
    gpus: int
    duration_s: float

    @property
    def gpu_seconds(self) -> float:
        return self.gpus * self.duration_s


def make_trace(
    n: int,
    seed: int,
    durations_s: tuple[float, float] = DEFAULT_DURATIONS_S,
    weights: tuple[tuple[int, float], ...] = GPU_WEIGHTS,
) -> list[TraceJob]:
    """N jobs, the same for the same seed: GPUs drawn by weight, durations uniform (0.1 s steps).
    Names are `job-000`...; `for_mode` prefixes them per run."""
    lo, hi = durations_s
    if n < 1 or lo <= 0 or hi < lo:
        raise ValueError(f"trace: need n >= 1 and 0 < min <= max duration, got n={n}, durations={durations_s}")
    rng = random.Random(seed)  # noqa: S311 -- a reproducible workload, not a secret
    sizes = [g for g, _ in weights]
    probs = [w for _, w in weights]
    out = []
    for i in range(n):
        gpus = rng.choices(sizes, probs)[0]
        duration = round(rng.uniform(lo, hi), 1)
        out.append(TraceJob(f"job-{i:03d}", gpus, duration))
    return out


def for_mode(trace: Iterable[TraceJob], mode: str) -> list[TraceJob]:
    return [TraceJob(f"{mode}-{j.name.removeprefix('job-')}", j.gpus, j.duration_s) for j in trace]


def trace_summary(trace: list[TraceJob], total_gpus: int) -> dict[str, Any]:
    durations = [j.duration_s for j in trace]
    work = sum(j.gpu_seconds for j in trace)
    return {
        "jobs": len(trace),
        "by_gpus": {str(g): n for g, n in sorted(Counter(j.gpus for j in trace).items())},
        "gpu_seconds": round(work, 1),
        "duration_s": {
            "min": min(durations),
            "mean": round(sum(durations) / len(durations), 2),
            "max": max(durations),
        },
        "total_gpus": total_gpus,
        "ideal_makespan_s": round(ideal_makespan(work, total_gpus), 1),
    }


def ideal_makespan(gpu_seconds: float, total_gpus: int) -> float:
    """The lower bound: every GPU busy all the time (total GPU-seconds / total GPUs)."""
    return gpu_seconds / total_gpus


def time_limit(ideal_s: float, factor: float = DEFAULT_LIMIT_FACTOR) -> float:
    return factor * ideal_s + LIMIT_EXTRA_S


def utilisation(gpu_seconds: float, total_gpus: int, span_s: float) -> float | None:
    return gpu_seconds / (total_gpus * span_s) if span_s > 0 else None


def node_shapes(topology: Topology) -> list[int]:
    """GPUs of every node of the peered providers (what a perfect placer could use)."""
    return [n.pool.gpus for name in PROVIDERS for n in topology.cluster(name).nodes() if n.pool.gpus]


def simulate(trace: list[TraceJob], shapes: list[int], *, largest_first: bool = False) -> float:
    """Makespan of a zero-overhead greedy list scheduler on the real node shapes: at t = 0 and at
    every completion it walks the queue in order (submission order, or largest first) and starts
    every job some node can take (best fit: the node with the fewest free GPUs that still fits).
    A reference for what queue order and node shapes alone allow; not a bound any scheduler must meet."""
    if any(j.gpus > max(shapes, default=0) for j in trace):
        return float("inf")
    queue = sorted(trace, key=lambda j: (-j.gpus, -j.duration_s)) if largest_first else list(trace)
    free = list(shapes)
    running: list[tuple[float, int, int, int]] = []  # (end, seq, node, gpus)
    now, seq = 0.0, 0
    while queue or running:
        waiting = []
        for job in queue:
            fits = [i for i, f in enumerate(free) if f >= job.gpus]
            if not fits:
                waiting.append(job)
                continue
            node = min(fits, key=lambda i: (free[i], i))
            free[node] -= job.gpus
            heapq.heappush(running, (now + job.duration_s, seq, node, job.gpus))
            seq += 1
        queue = waiting
        now, _, node, gpus = heapq.heappop(running)
        free[node] += gpus
        while running and running[0][0] <= now:
            _, _, node, gpus = heapq.heappop(running)
            free[node] += gpus
    return now


def references(trace: list[TraceJob], topology: Topology) -> dict[str, Any]:
    shapes = node_shapes(topology)
    work = sum(j.gpu_seconds for j in trace)
    out: dict[str, Any] = {}
    for key, largest in (("fifo", False), ("largest_first", True)):
        makespan = simulate(trace, shapes, largest_first=largest)
        out[f"{key}_makespan_s"] = round(makespan, 1)
        out[f"{key}_utilisation"] = _r(utilisation(work, sum(shapes), makespan))
    return out


def run_duration(seconds: float) -> str:
    """The kwok annotation's value (a Go duration)."""
    return f"{seconds:g}s"


def job_body(job: TraceJob, namespace: str, mode: str) -> dict[str, Any]:
    """A plain GPU Job, as a user would `kubectl create -f` it (no node, no toleration: the scheduler
    and gpufed's offloading webhook do the rest)."""
    return manifests.job(
        job.name,
        namespace,
        gpus=str(job.gpus),
        requests=REQUESTS,
        image=IMAGE,
        container="train",
        backoff_limit=BACKOFF_LIMIT,
        labels={MODE_LABEL: mode},
        pod_labels={MODE_LABEL: mode},
        pod_annotations={RUN_DURATION_ANNOTATION: run_duration(job.duration_s)},
    )


def product_node_suffix(product: str) -> str:
    return product.lower()


def expected_nodes(mode: str, ids: Mapping[str, str], topology: Topology) -> dict[str, int]:
    """The consumer's virtual nodes a mode implies and their allocatable GPUs while nothing runs.

    static: one node per provider, allocatable = grant. live: one node per provider GPU product
    (unsuffixed when the provider has one product), allocatable = the most GPUs one node of that
    product has."""
    out: dict[str, int] = {}
    for provider, grant in PROVIDERS.items():
        base = f"gpufed-{ids[provider]}"
        if mode == "static":
            out[base] = grant
            continue
        largest: dict[str, int] = {}
        for pool in topology.cluster(provider).node_pools:
            if pool.gpus and pool.gpu_product:
                largest[pool.gpu_product] = max(largest.get(pool.gpu_product, 0), pool.gpus)
        if len(largest) == 1:
            out[base] = next(iter(largest.values()))
        else:
            for product, gpus in largest.items():
                out[f"{base}-{product_node_suffix(product)}"] = gpus
    return out


# ------------------------------------------------------------------------------------ results (pure)


@dataclass
class JobResult:
    """One Job's outcome; times in seconds since the first submit."""

    name: str
    gpus: int
    duration_s: float
    started_s: float | None = None
    finished_s: float | None = None
    failed: bool = False
    node: str = ""
    pods: int = 0
    #: Unfinished at the end: no-pod (e.g. Job backoff), unscheduled, remote-pending, running.
    state: str = ""

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
    #: Per virtual node: status updates seen, the most GPUs it advertised, its pool's total GPUs
    #: (from its gpufed.io/gpu-pool figures) and how many updates advertised more than that total.
    nodes: dict[str, dict[str, Any]] = field(default_factory=dict)


def _r(v: float | None, nd: int = 3) -> float | None:
    return None if v is None else round(v, nd)


def summarise(rec: ModeRecord) -> dict[str, Any]:
    """The mode's figures: makespan, utilisation and their ratios to the ideal, outcomes, remote waits."""
    finished = [j for j in rec.jobs if j.finished_s is not None]
    failed = [j for j in rec.jobs if j.failed and j.finished_s is None]
    unfinished = [j for j in rec.jobs if j.finished_s is None and not j.failed]
    complete = not unfinished and not failed and bool(rec.jobs)
    last = max((j.finished_s for j in finished if j.finished_s is not None), default=None)
    makespan = last if complete else None
    span = last if last is not None else rec.elapsed_s
    # A pod seen Succeeded without our watch seeing it Running: count its planned run time.
    work = sum(j.gpus * (j.run_s if j.run_s is not None else j.duration_s) for j in finished)
    util = utilisation(work, rec.total_gpus, span) if finished else 0.0
    waits = [w.wait_s for w in rec.remote_waits]
    starts = [j.started_s for j in rec.jobs if j.started_s is not None]
    by_node: dict[str, dict[str, float]] = {}
    for j in finished:
        row = by_node.setdefault(j.node or "?", {"jobs": 0, "gpu_seconds": 0.0})
        row["jobs"] += 1
        row["gpu_seconds"] = round(row["gpu_seconds"] + j.gpus * (j.run_s or j.duration_s), 1)
    return {
        "mode": rec.mode,
        "ended": rec.ended,
        "complete": complete,
        "elapsed_s": _r(rec.elapsed_s),
        "limit_s": _r(rec.limit_s, 1),
        "submit_s": _r(rec.submit_s),
        "makespan_s": _r(makespan),
        "span_s": _r(span),
        "ideal_s": _r(rec.ideal_s),
        "makespan_over_ideal": _r(makespan / rec.ideal_s if makespan else None),
        "gpu_seconds_run": round(work, 1),
        "utilisation": _r(util),
        # The ideal schedule keeps every GPU busy: its utilisation is 1.0.
        "utilisation_over_ideal": _r(util),
        "jobs": len(rec.jobs),
        "jobs_finished": len(finished),
        "jobs_failed": len(failed),
        "jobs_unfinished": len(unfinished),
        "unfinished_by_state": dict(sorted(Counter(j.state or "?" for j in unfinished).items())),
        "unfinished_by_gpus": {str(g): n for g, n in sorted(Counter(j.gpus for j in [*unfinished, *failed]).items())},
        "pods_failed_back": sum(rec.failed_pods.values()),
        "failed_pods_by_reason": dict(sorted(rec.failed_pods.items())),
        "stuck_remote": len(rec.remote_waits),
        "stuck_remote_unresolved": sum(1 for w in rec.remote_waits if not w.resolved),
        "stuck_remote_by_provider": dict(sorted(Counter(w.provider for w in rec.remote_waits).items())),
        "stuck_remote_by_gpus": {str(g): n for g, n in sorted(Counter(w.gpus for w in rec.remote_waits).items())},
        "max_remote_wait_s": _r(max(waits)) if waits else 0.0,
        "queue_wait_s": {
            "p50": _r(percentile(starts, 50)),
            "p90": _r(percentile(starts, 90)),
            "max": _r(max(starts)),
        }
        if starts
        else None,
        "by_node": dict(sorted(by_node.items())),
        "create_errors": len(rec.create_errors),
        "first_create_errors": rec.create_errors[:3],
        "running_unseen": rec.running_unseen,
        "node_updates": dict(sorted(rec.nodes.items())),
        "allocatable_above_total": sum(int(n.get("above_total", 0)) for n in rec.nodes.values()),
    }


def verdicts(live: Mapping[str, Any] | None) -> dict[str, Any]:
    """The targets, read on the live run (the static run is the baseline beside them)."""
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
    }


# ------------------------------------------------------------------------------------ observation


@dataclass
class _Pod:
    job: str
    phase: str = "Pending"
    node: str = ""
    running_at: float | None = None
    finished_at: float | None = None
    failed_reason: str = ""


@dataclass
class _Twin:
    gpus: int
    first_seen: float
    unschedulable_at: float | None = None
    scheduled_at: float | None = None
    gone_at: float | None = None


def _job_of(obj: Mapping[str, Any]) -> str:
    labels = obj["metadata"].get("labels") or {}
    for key in JOB_NAME_LABELS:
        if labels.get(key):
            return str(labels[key])
    return str(obj["metadata"]["name"]).rsplit("-", 1)[0]


def _unschedulable(obj: Mapping[str, Any]) -> bool:
    for c in (obj.get("status") or {}).get("conditions") or []:
        if c.get("type") == "PodScheduled" and c.get("status") == "False" and c.get("reason") == "Unschedulable":
            return True
    return False


class Observer:
    """What the watches saw of one mode's Jobs (monotonic times)."""

    def __init__(self, trace: list[TraceJob]) -> None:
        self.gpus = {j.name: j.gpus for j in trace}
        self.pods: dict[str, _Pod] = {}
        self.failed_jobs: set[str] = set()
        self.twins: dict[str, _Twin] = {}
        self.nodes: dict[str, dict[str, Any]] = {}
        self.last_change = time.monotonic()
        self.changed = asyncio.Event()

    def _touch(self) -> None:
        self.last_change = time.monotonic()
        self.changed.set()

    def on_pod(self, kind: str, obj: dict[str, Any]) -> None:
        job = _job_of(obj)
        if job not in self.gpus or kind == "DELETED":
            return
        name = obj["metadata"]["name"]
        now = time.monotonic()
        pod = self.pods.get(name)
        if pod is None:
            pod = self.pods[name] = _Pod(job)
            self._touch()
        status = obj.get("status") or {}
        phase = str(status.get("phase") or "Pending")
        pod.node = str((obj.get("spec") or {}).get("nodeName") or pod.node)
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
        if name not in self.gpus or kind == "DELETED":
            return
        for c in (obj.get("status") or {}).get("conditions") or []:
            if c.get("type") == "Failed" and c.get("status") == "True" and name not in self.failed_jobs:
                self.failed_jobs.add(name)
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
            if job not in self.gpus:
                return
            key = f"{provider}/{obj['metadata']['name']}"
            now = time.monotonic()
            twin = self.twins.get(key)
            if twin is None:
                if kind == "DELETED":
                    return
                twin = self.twins[key] = _Twin(self.gpus[job], now)
            if kind == "DELETED":
                twin.gone_at = twin.gone_at or now
                return
            if _unschedulable(obj) and twin.unschedulable_at is None and twin.scheduled_at is None:
                twin.unschedulable_at = now
            if (obj.get("spec") or {}).get("nodeName") and twin.scheduled_at is None:
                twin.scheduled_at = now

        return on_event

    def running(self) -> int:
        return sum(1 for p in self.pods.values() if p.phase == "Running")

    def done(self, trace: list[TraceJob]) -> bool:
        succeeded = {p.job for p in self.pods.values() if p.phase == "Succeeded"}
        return all(j.name in succeeded or j.name in self.failed_jobs for j in trace)

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
        by_job: dict[str, list[_Pod]] = {}
        for p in self.pods.values():
            by_job.setdefault(p.job, []).append(p)
        jobs: list[JobResult] = []
        unseen = 0
        for j in trace:
            pods = by_job.get(j.name, [])
            res = JobResult(j.name, j.gpus, j.duration_s, pods=len(pods), failed=j.name in self.failed_jobs)
            ok = next((p for p in pods if p.phase == "Succeeded"), None)
            if ok is not None:
                assert ok.finished_at is not None
                res.finished_s = ok.finished_at - t0
                res.started_s = ok.running_at - t0 if ok.running_at is not None else None
                unseen += ok.running_at is None
                res.node = ok.node
            else:
                live = [p for p in pods if p.phase not in ("Succeeded", "Failed")]
                if not live:
                    res.state = "no-pod"
                elif any(p.phase == "Running" for p in live):
                    res.state = "running"
                    res.started_s = min(p.running_at for p in live if p.running_at is not None) - t0
                elif any(p.node for p in live):
                    res.state = "remote-pending"
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
            sum(PROVIDERS.values()),
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
            nodes={k: {f: v for f, v in row.items() if f != "last"} for k, row in self.nodes.items()},
        )


# ------------------------------------------------------------------------------------ cluster steps


def _shown(path: Path) -> str:
    """The state directory as the report shows it (relative to the repository when inside it)."""
    try:
        return str(path.resolve().relative_to(REPO))
    except ValueError:
        return str(path)


async def _offload(kc: Path, providers: Mapping[str, Any], consumer_id: str) -> dict[str, str]:
    """`gpufed offload-namespace bench-gpu` (every provider); provider -> its Ready twin namespace."""
    code, out = await gpufed_cli("offload-namespace", NAMESPACE, "--kubeconfig", str(kc), "--context", CONSUMER)
    if code != 0:
        raise RuntimeError(f"gpufed offload-namespace failed ({code}):\n{out}")
    return {name: await twin_namespace(api, consumer_id, NAMESPACE, name) for name, api in providers.items()}


async def _foreign_cluster_path(consumer: Any, provider_id: str) -> str:
    direct = rest.path("gpufed.io/v1alpha1", "foreignclusters", provider_id)
    if await rest.get(consumer, direct) is not None:
        return direct
    for fc in await rest.list_items(consumer, rest.path("gpufed.io/v1alpha1", "foreignclusters")):
        if (fc.get("spec") or {}).get("clusterId") == provider_id:
            return rest.path("gpufed.io/v1alpha1", "foreignclusters", fc["metadata"]["name"])
    raise RuntimeError(f"the consumer has no ForeignCluster of {provider_id}")


async def set_mode(consumer: Any, ids: Mapping[str, str], mode: str) -> None:
    """`kubectl annotate foreigncluster <id> gpufed.io/capacity=static` (live: the annotation removed)."""
    for provider in PROVIDERS:
        path = await _foreign_cluster_path(consumer, ids[provider])
        value = "static" if mode == "static" else None
        await rest.merge_patch(consumer, path, {"metadata": {"annotations": {CAPACITY_ANNOTATION: value}}})


def _node_view(node: Mapping[str, Any]) -> dict[str, Any]:
    st = node.get("status") or {}
    ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in st.get("conditions") or [])
    return {"gpus": int((st.get("allocatable") or {}).get(GPU, "0")), "ready": ready}


async def virtual_nodes(consumer: Any) -> dict[str, dict[str, Any]]:
    items = await rest.list_items(consumer, "/api/v1/nodes", params={"labelSelector": VIRTUAL_NODE_SELECTOR})
    return {n["metadata"]["name"]: _node_view(n) for n in items}


def nodes_match(seen: Mapping[str, Mapping[str, Any]], want: Mapping[str, int]) -> bool:
    """Every expected node Ready with its allocatable; any other virtual node gone or not Ready."""
    for name, gpus in want.items():
        n = seen.get(name)
        if n is None or not n["ready"] or n["gpus"] != gpus:
            return False
    return not any(v["ready"] for k, v in seen.items() if k not in want)


async def wait_for_nodes(consumer: Any, want: Mapping[str, int], mode: str) -> dict[str, dict[str, Any]]:
    last: dict[str, dict[str, Any]] = {}

    async def probe() -> dict[str, dict[str, Any]] | None:
        nonlocal last
        last = await virtual_nodes(consumer)
        return last if nodes_match(last, want) else None

    try:
        found: dict[str, dict[str, Any]] = await until(f"the {mode} virtual nodes", probe, NODES_TIMEOUT_S, 1.0)
    except RuntimeError:
        raise RuntimeError(
            f"the consumer's virtual nodes did not become what {mode} mode implies within {NODES_TIMEOUT_S:.0f}s: "
            f"want {dict(want)} (Ready), have {last}"
        ) from None
    return found


async def delete_jobs(consumer: Any, providers: Mapping[str, Any], twins: Mapping[str, str]) -> float:
    """Delete every Job of the namespace, then their pods here and their twins on every provider."""
    t0 = time.monotonic()
    jobs = f"/apis/batch/v1/namespaces/{NAMESPACE}/jobs"
    opts = {"kind": "DeleteOptions", "apiVersion": "v1", "propagationPolicy": "Background"}
    await rest.request(consumer, "DELETE", jobs, body=opts)

    async def gone() -> bool:
        return not await rest.list_items(consumer, jobs)

    await until(f"the Jobs of {NAMESPACE} to be deleted", gone, 180, 1.0)
    for name, api in providers.items():
        await delete_all(consumer, NAMESPACE, api, twins[name])
    return time.monotonic() - t0


async def run_mode(
    consumer: Any,
    providers: Mapping[str, Any],
    twins: Mapping[str, str],
    trace: list[TraceJob],
    mode: str,
    opts: GpuPoolOptions,
    progress: Progress,
) -> ModeRecord:
    """Submit the whole trace at t = 0 and watch until it is done, stalls or hits the time limit."""
    total = sum(PROVIDERS.values())
    ideal = ideal_makespan(sum(j.gpu_seconds for j in trace), total)
    limit = time_limit(ideal, opts.limit_factor)
    stall = max(opts.stall_s, LIVE_STALL_S) if mode == "live" else opts.stall_s
    obs = Observer(trace)
    synced = {k: asyncio.Event() for k in ("pods", "jobs", "nodes", *providers)}
    pods_path = f"/api/v1/namespaces/{NAMESPACE}/pods"
    jobs_path = f"/apis/batch/v1/namespaces/{NAMESPACE}/jobs"
    watches = [
        asyncio.create_task(watch(consumer, pods_path, obs.on_pod, what="bench pods", on_synced=synced["pods"].set)),
        asyncio.create_task(watch(consumer, jobs_path, obs.on_job, what="bench jobs", on_synced=synced["jobs"].set)),
        asyncio.create_task(
            watch(
                consumer,
                "/api/v1/nodes",
                obs.on_node,
                what="bench virtual nodes",
                params={"labelSelector": VIRTUAL_NODE_SELECTOR},
                on_synced=synced["nodes"].set,
            )
        ),
    ]
    for name, api in providers.items():
        watches.append(
            asyncio.create_task(
                watch(
                    api,
                    f"/api/v1/namespaces/{twins[name]}/pods",
                    obs.on_twin(name),
                    what=f"bench twins on {name}",
                    on_synced=synced[name].set,
                )
            )
        )
    errors: list[str] = []
    try:
        await asyncio.wait_for(asyncio.gather(*(e.wait() for e in synced.values())), 60)
        sem = asyncio.Semaphore(opts.concurrency)

        async def create(job: TraceJob) -> None:
            async with sem:
                try:
                    await rest.request(consumer, "POST", jobs_path, body=job_body(job, NAMESPACE, mode))
                except KubeError as e:
                    errors.append(f"{job.name}: {e}")

        progress(f"{mode}: submitting {len(trace)} Jobs (ideal makespan {ideal:.1f}s, limit {limit:.0f}s)")
        t0 = time.monotonic()
        async with asyncio.TaskGroup() as tg:
            for job in trace:
                tg.create_task(create(job))
        submit_s = time.monotonic() - t0
        obs.last_change = time.monotonic()
        ended = "complete"
        next_note = t0 + 30
        while not obs.done(trace):
            now = time.monotonic()
            if now - t0 >= limit:
                ended = "time limit"
                break
            if obs.running() == 0 and now - obs.last_change >= stall:
                ended = "stalled"
                break
            if now >= next_note:
                finished = sum(1 for p in obs.pods.values() if p.phase == "Succeeded")
                progress(f"{mode}: t={now - t0:.0f}s, {finished} of {len(trace)} Jobs done, {obs.running()} Running")
                next_note = now + 30
            obs.changed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(obs.changed.wait(), 0.5)
        elapsed = time.monotonic() - t0
    finally:
        for w in watches:
            w.cancel()
        for w in watches:
            with contextlib.suppress(asyncio.CancelledError):
                await w
    return obs.record(
        mode,
        trace,
        t0,
        ideal_s=ideal,
        limit_s=limit,
        elapsed_s=elapsed,
        ended=ended,
        submit_s=submit_s,
        create_errors=errors,
    )


async def _run(env: LocalEnvironment, opts: GpuPoolOptions, progress: Progress) -> dict[str, Any]:
    await env.up(progress)
    kc = env.merged_kubeconfig
    base = make_trace(opts.jobs, opts.seed, opts.durations_s)
    total = sum(PROVIDERS.values())
    async with (
        api_client(kc, CONSUMER) as consumer,
        api_client(kc, "gpu-a") as gpu_a,
        api_client(kc, "gpu-b") as gpu_b,
    ):
        providers = {"gpu-a": gpu_a, "gpu-b": gpu_b}
        ids = {CONSUMER: await cluster_id(consumer)}
        for name, api in providers.items():
            ids[name] = await cluster_id(api)
        for name, gpus in PROVIDERS.items():
            progress(f"peering {CONSUMER} ({ids[CONSUMER]}) with {name} ({ids[name]}): {gpus} GPUs")
            await peer(kc, provider=name, gpus=gpus, cpu="32", memory="128Gi", pods=opts.jobs + 50)
        await ensure_namespace(consumer, NAMESPACE)
        twins = await _offload(kc, providers, ids[CONSUMER])
        progress(f"{NAMESPACE} offloaded; twin namespaces {twins}")
        await delete_jobs(consumer, providers, twins)  # leftovers of an interrupted --keep run

        modes: dict[str, dict[str, Any]] = {}
        for mode in opts.modes:
            t_switch = time.monotonic()
            try:
                await set_mode(consumer, ids, mode)
                want = expected_nodes(mode, ids, env.topology)
                nodes = await wait_for_nodes(consumer, want, mode)
            except (RuntimeError, KubeError) as e:
                progress(f"{mode}: {e}")
                modes[mode] = {"mode": mode, "error": str(e)}
                continue
            switch_s = time.monotonic() - t_switch
            progress(f"{mode}: virtual nodes {nodes} after {switch_s:.1f}s")
            offsets = procstat.log_offsets(env.log_path(CONSUMER, CONTROLLER))
            trace = for_mode(base, mode)
            rec = await run_mode(consumer, providers, twins, trace, mode, opts, progress)
            out = summarise(rec)
            out["virtual_nodes"] = nodes
            out["mode_switch_s"] = round(switch_s, 1)
            out["stall_window_s"] = max(opts.stall_s, LIVE_STALL_S) if mode == "live" else opts.stall_s
            out["logs"] = [log_findings(p, off) for p, off in offsets.items()]
            progress(
                f"{mode}: {out['ended']} after {out['elapsed_s']:.1f}s: {out['jobs_finished']}/{out['jobs']} Jobs, "
                f"utilisation {out['utilisation']}, stuck remotely {out['stuck_remote']}"
            )
            out["cleanup_s"] = round(await delete_jobs(consumer, providers, twins), 1)
            modes[mode] = out
        if opts.keep and "static" in opts.modes:
            await set_mode(consumer, ids, "live")

    return {
        "part": "gpu-pool",
        "environment": {
            "consumer": f"{CONSUMER} ({ids[CONSUMER]}): 2 kwok CPU nodes",
            "providers": {
                "gpu-a": f"gpu-a ({ids['gpu-a']}): 4 kwok nodes x 8 H100, peered with --gpus {PROVIDERS['gpu-a']}",
                "gpu-b": f"gpu-b ({ids['gpu-b']}): 2 x 4 A100 + 4 x 1 L4, peered with --gpus {PROVIDERS['gpu-b']}",
            },
            "total_gpus": total,
            "state_dir": _shown(env.state_dir),
            "base_port": opts.base_port,
            "namespace": NAMESPACE,
            "twin_namespaces": twins,
            "concurrency": opts.concurrency,
            "backoff_limit": BACKOFF_LIMIT,
            "limit_factor": opts.limit_factor,
            "stall_s": opts.stall_s,
            "live_stall_s": max(opts.stall_s, LIVE_STALL_S),
        },
        "trace": {
            "seed": opts.seed,
            "durations_s": list(opts.durations_s),
            "weights": {str(g): w for g, w in GPU_WEIGHTS},
            **trace_summary(base, total),
            "reference": references(base, env.topology),
        },
        "targets": {"utilisation_ratio_min": TARGET_UTILISATION_RATIO_MIN, "stuck_max": TARGET_STUCK_MAX},
        "modes": modes,
        "verdicts": verdicts(modes.get("live")),
    }


def run(opts: GpuPoolOptions, progress: Progress) -> dict[str, Any]:
    """Start the gpu-pool environment, run each mode, stop the environment unless `opts.keep`."""
    unknown = [m for m in opts.modes if m not in MODES]
    if unknown or not opts.modes:
        raise ValueError(f"gpu-pool modes must be among {MODES}, got {opts.modes}")
    env = environment(opts.state_dir, opts.bin_dir, opts.base_port, default_topology(base_port=opts.base_port))
    try:
        return asyncio.run(_run(env, opts, progress))
    finally:
        if opts.keep:
            progress(
                f"leaving the gpu-pool clusters running (state in {env.state_dir}; KUBECONFIG={env.merged_kubeconfig})"
            )
        else:
            env.down(progress)
