"""The gpu-pool benchmark's workload and its references (pure): the seeded trace of GPU Jobs, the pools
it runs on, and what a scheduler with no overhead at all could do with it.

Owns:
- the trace (`make_trace`): N Jobs (default 160, seed 8). A share of them (default 0.25) are groups:
  Indexed Jobs of k pods (k uniform in 2..4, parallelism = completions = k) that must run together on
  one provider and GPU product; the rest run one pod. GPUs per pod are drawn from 1/2/4/8 with weights
  0.40/0.25/0.20/0.15 for both; a group's draw is repeated until the group asks at most
  `MAX_GROUP_GPUS` (16, half of gpu-a): larger groups (3 x 8, 4 x 8) are left out of the trace,
  because such a group can only start on an emptied gpu-a, which measures draining, not placement.
  Every group of the trace fits on gpu-a (4 x 8 H100); 2 x 4 or smaller also fit on gpu-b's A100s,
  k x 1 on its L4s. Run time per Job uniform in [4, 16] s (0.1 s steps), the same for all pods of a
  group. The same seed gives the same trace; `for_mode` renames it per run;
- the pools (`pools`): the peered providers' nodes grouped by provider and GPU product, as the
  topology declares them, and which pools can ever hold a Job (`fits`);
- the arithmetic shared by the run and the report: the ideal makespan (planned GPU-seconds / all
  GPUs), a lower bound that also counts what only some pools can hold (`lower_bound`), the time
  limit, utilisation;
- `simulate`: a greedy list scheduler with no overhead on the real node shapes, placing a group whole
  on one pool, in submission order or largest first (`references`).

Does not: talk to clusters, submit Jobs, or measure anything (bench.gpupool and bench.gpupool_record do).
"""

from __future__ import annotations

import heapq
import itertools
import random
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from gpufed.localenv.topology import Topology

DEFAULT_JOBS = 160
DEFAULT_SEED = 8
DEFAULT_DURATIONS_S = (4.0, 16.0)
#: GPUs per pod and their weights in the trace (single pods and the pods of a group alike).
GPU_WEIGHTS: tuple[tuple[int, float], ...] = ((1, 0.40), (2, 0.25), (4, 0.20), (8, 0.15))
#: Share of the Jobs that are groups, and the sizes a group is drawn from (uniform).
DEFAULT_GROUP_SHARE = 0.25
GROUP_SIZES = (2, 3, 4)
#: The most GPUs one group asks for: half of the largest pool (gpu-a's 32).
MAX_GROUP_GPUS = 16
#: Time limit of one mode's run = factor x ideal makespan + LIMIT_EXTRA_S.
DEFAULT_LIMIT_FACTOR = 3.0
LIMIT_EXTRA_S = 60.0
#: Providers and the GPUs the consumer asks each for (all they have).
PROVIDERS: dict[str, int] = {"gpu-a": 32, "gpu-b": 12}
TOTAL_GPUS = sum(PROVIDERS.values())


@dataclass(frozen=True)
class TraceJob:
    """One Job of the trace: `pods` pods (1: a single pod; more: a group) of `gpus` GPUs each."""

    name: str
    gpus: int
    duration_s: float
    pods: int = 1

    @property
    def gpu_seconds(self) -> float:
        return self.pods * self.gpus * self.duration_s

    @property
    def group(self) -> bool:
        return self.pods > 1


def make_trace(
    n: int,
    seed: int,
    durations_s: tuple[float, float] = DEFAULT_DURATIONS_S,
    weights: tuple[tuple[int, float], ...] = GPU_WEIGHTS,
    group_share: float = DEFAULT_GROUP_SHARE,
) -> list[TraceJob]:
    """N jobs, the same for the same seed. Names are `job-000`...; `for_mode` prefixes them per run."""
    lo, hi = durations_s
    if n < 1 or lo <= 0 or hi < lo:
        raise ValueError(f"trace: need n >= 1 and 0 < min <= max duration, got n={n}, durations={durations_s}")
    if not 0 <= group_share <= 1:
        raise ValueError(f"trace: the share of groups must be in [0, 1], got {group_share}")
    sizes = [g for g, _ in weights]
    probs = [w for _, w in weights]
    if min(sizes) * min(GROUP_SIZES) > MAX_GROUP_GPUS:
        raise ValueError(f"trace: no group of {GROUP_SIZES} pods of {sizes} GPUs stays within {MAX_GROUP_GPUS}")
    rng = random.Random(seed)  # noqa: S311 -- a reproducible workload, not a secret
    out = []
    for i in range(n):
        pods = rng.choice(GROUP_SIZES) if rng.random() < group_share else 1
        gpus = rng.choices(sizes, probs)[0]
        while pods * gpus > MAX_GROUP_GPUS and pods > 1:
            gpus = rng.choices(sizes, probs)[0]
        duration = round(rng.uniform(lo, hi), 1)
        out.append(TraceJob(f"job-{i:03d}", gpus, duration, pods))
    return out


def for_mode(trace: Iterable[TraceJob], mode: str) -> list[TraceJob]:
    return [replace(j, name=f"{mode}-{j.name.removeprefix('job-')}") for j in trace]


def shape(job: TraceJob) -> str:
    """`8 GPU` for a single pod, `3 x 4 GPU` for a group."""
    return f"{job.pods} x {job.gpus} GPU" if job.group else f"{job.gpus} GPU"


def trace_summary(trace: list[TraceJob], total_gpus: int) -> dict[str, Any]:
    durations = [j.duration_s for j in trace]
    work = sum(j.gpu_seconds for j in trace)
    singles = [j for j in trace if not j.group]
    groups = [j for j in trace if j.group]
    return {
        "jobs": len(trace),
        "pods": sum(j.pods for j in trace),
        "single_pod_jobs": len(singles),
        "groups": len(groups),
        "by_gpus": {str(g): n for g, n in sorted(Counter(j.gpus for j in singles).items())},
        "groups_by_shape": {f"{k}x{g}": n for (k, g), n in sorted(Counter((j.pods, j.gpus) for j in groups).items())},
        "group_gpu_seconds": round(sum(j.gpu_seconds for j in groups), 1),
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
    """Every GPU busy all the time (total GPU-seconds / total GPUs): the figure utilisation is read against."""
    return gpu_seconds / total_gpus


def time_limit(ideal_s: float, factor: float = DEFAULT_LIMIT_FACTOR) -> float:
    return factor * ideal_s + LIMIT_EXTRA_S


def utilisation(gpu_seconds: float, total_gpus: int, span_s: float) -> float | None:
    return gpu_seconds / (total_gpus * span_s) if span_s > 0 else None


def rounded(v: float | None, nd: int = 3) -> float | None:
    return None if v is None else round(v, nd)


# ------------------------------------------------------------------------------------ pools


def pools(topology: Topology) -> dict[str, list[int]]:
    """`provider/product` -> the GPUs of each of its nodes, for the peered providers."""
    out: dict[str, list[int]] = {}
    for name in PROVIDERS:
        for node in topology.cluster(name).nodes():
            if node.pool.gpus:
                out.setdefault(f"{name}/{node.pool.gpu_product}", []).append(node.pool.gpus)
    return out


def node_places(topology: Topology) -> dict[str, str]:
    """Provider node name -> `provider/product` (where a twin bound to that node runs)."""
    return {
        node.name: f"{name}/{node.pool.gpu_product}"
        for name in PROVIDERS
        for node in topology.cluster(name).nodes()
        if node.pool.gpus
    }


def product_node_suffix(product: str) -> str:
    return product.lower()


def pool_nodes(ids: Mapping[str, str], topology: Topology) -> dict[str, dict[str, int]]:
    """The consumer's pool virtual nodes with live capacity (one per provider GPU product, unsuffixed
    when the provider has one product; Kueue's flavors carry the same names): node -> `gpus`, the
    product's GPUs at the provider, and `largest`, the most GPUs one of its nodes has."""
    out: dict[str, dict[str, int]] = {}
    for provider in PROVIDERS:
        by_product: dict[str, dict[str, int]] = {}
        for pool in topology.cluster(provider).node_pools:
            if pool.gpus and pool.gpu_product:
                row = by_product.setdefault(pool.gpu_product, {"gpus": 0, "largest": 0})
                row["gpus"] += pool.count * pool.gpus
                row["largest"] = max(row["largest"], pool.gpus)
        base = f"gpufed-{ids[provider]}"
        for product, row in by_product.items():
            out[base if len(by_product) == 1 else f"{base}-{product_node_suffix(product)}"] = row
    return out


def node_shapes(topology: Topology) -> list[int]:
    """GPUs of every node of the peered providers (what a perfect placer could use)."""
    return [g for shapes in pools(topology).values() for g in shapes]


def _pack(free: Sequence[int], gpus: int, pods: int) -> list[int] | None:
    """Node indexes for `pods` pods of `gpus` GPUs on nodes with `free` GPUs, each pod on the fullest
    node that still takes it (best fit); None when they do not all fit."""
    left = list(free)
    chosen = []
    for _ in range(pods):
        fits = [i for i, f in enumerate(left) if f >= gpus]
        if not fits:
            return None
        i = min(fits, key=lambda n: (left[n], n))
        left[i] -= gpus
        chosen.append(i)
    return chosen


def fits(job: TraceJob, shapes: Sequence[int]) -> bool:
    """Whether a pool with nodes of `shapes` GPUs, all free, holds the whole Job."""
    return _pack(shapes, job.gpus, job.pods) is not None


def lower_bound(trace: Sequence[TraceJob], by_pool: Mapping[str, Sequence[int]]) -> float:
    """A makespan no schedule beats: the longest Job, and for every set of pools the work of the Jobs
    only those pools can hold over their GPUs (all pools: the ideal makespan). inf when a Job fits
    no pool."""
    names = sorted(by_pool)
    where = {j.name: frozenset(p for p in names if fits(j, by_pool[p])) for j in trace}
    if any(not w for w in where.values()):
        return float("inf")
    bound = max((j.duration_s for j in trace), default=0.0)
    for k in range(1, len(names) + 1):
        for subset in itertools.combinations(names, k):
            s = frozenset(subset)
            work = sum(j.gpu_seconds for j in trace if where[j.name] <= s)
            bound = max(bound, work / sum(sum(by_pool[p]) for p in s))
    return bound


def simulate(trace: list[TraceJob], by_pool: Mapping[str, Sequence[int]], *, largest_first: bool = False) -> float:
    """Makespan of a zero-overhead greedy list scheduler on the real node shapes: at t = 0 and at every
    completion it walks the queue in order (submission order, or most GPUs first) and starts every Job
    some pool can take now: a single pod on the fullest node that still fits it (any pool), a group
    whole on the pool that keeps the fewest GPUs free after it (ties by name), each pod best fit on
    that pool's nodes. A reference for what queue order, node shapes and whole groups allow; not a
    bound any scheduler must meet. inf when a Job fits no pool."""
    if any(not any(fits(j, s) for s in by_pool.values()) for j in trace):
        return float("inf")
    names = sorted(by_pool)
    free = {p: list(by_pool[p]) for p in names}
    queue = sorted(trace, key=lambda j: (-j.pods * j.gpus, -j.duration_s)) if largest_first else list(trace)
    running: list[tuple[float, int, str, list[int], int]] = []  # (end, seq, pool, node indexes, gpus)
    now, seq = 0.0, 0
    while queue or running:
        waiting = []
        for job in queue:
            options = []
            for p in names:
                chosen = _pack(free[p], job.gpus, job.pods)
                if chosen is None:
                    continue
                after = sum(free[p]) - job.pods * job.gpus
                # a single pod: the fullest node anywhere; a group: the fullest pool
                key = (min(free[p][i] for i in chosen) if not job.group else after, p)
                options.append((key, p, chosen))
            if not options:
                waiting.append(job)
                continue
            _, pool, chosen = min(options, key=lambda o: o[0])
            for i in chosen:
                free[pool][i] -= job.gpus
            heapq.heappush(running, (now + job.duration_s, seq, pool, chosen, job.gpus))
            seq += 1
        queue = waiting
        now, _, pool, chosen, gpus = heapq.heappop(running)
        for i in chosen:
            free[pool][i] += gpus
        while running and running[0][0] <= now:
            _, _, pool, chosen, gpus = heapq.heappop(running)
            for i in chosen:
                free[pool][i] += gpus
    return now


def references(trace: list[TraceJob], topology: Topology) -> dict[str, Any]:
    """The greedy references (FIFO, largest first) and the lower bound, with their utilisation."""
    by_pool = pools(topology)
    total = sum(sum(s) for s in by_pool.values())
    work = sum(j.gpu_seconds for j in trace)
    bound = lower_bound(trace, by_pool)
    out: dict[str, Any] = {
        "lower_bound_s": round(bound, 1),
        "lower_bound_utilisation": rounded(utilisation(work, total, bound)),
    }
    for key, largest in (("fifo", False), ("largest_first", True)):
        makespan = simulate(trace, by_pool, largest_first=largest)
        out[f"{key}_makespan_s"] = round(makespan, 1)
        out[f"{key}_utilisation"] = rounded(utilisation(work, total, makespan))
    return out
