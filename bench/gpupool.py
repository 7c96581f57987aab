"""The `gpu-pool` part: a seeded trace of GPU Jobs — single pods and groups of 2-4 pods — through the
global GPU pool: live capacity, the same through Kueue, and the static-slice baseline, in one run on
the same clusters.

Owns: its own environment (the default topology — consumer with 2 CPU nodes and Kueue, gpu-a 4 x 8
H100, gpu-b 2 x 4 A100 + 4 x 1 L4: 44 GPUs — in .cache/bench-gpupool, ports from 16100, so it never
collides with the `offload`/`reflection` environment, `make demo` or the e2e sessions), peering
consumer -> gpu-a (32 GPUs) and consumer -> gpu-b (12 GPUs, no product) and offloading namespace
`bench-gpu` to both with the gpufed CLI, submitting the trace (`bench.gpupool_trace`) and watching
each mode's run (`bench.gpupool_record`), and the part's result.

Every Job is POSTed to the consumer at t = 0 (batch/v1, as `kubectl create` would, bounded
concurrency, admin identity), backoffLimit 6 so a failed-back pod gets a replacement; a group is an
Indexed Job with parallelism = completions = its pods. Jobs are named `<mode>-<i>` so the runs never
mix. kwok runs each pod for the duration in its annotation `local.gpufed.io/run-duration`.

Modes, run in this order on the same peerings, with every Job and pod deleted in between:
- live: the product's default (`gpufed.io/capacity` absent on the consumer's ForeignClusters): one
  virtual node per provider GPU product, allocatable capped at the largest shape one provider node
  can still take, fit check and fail-back in the virtual kubelet; a group's pods are held by gpufed's
  webhook and released whole onto one pool node by its gang controller;
- kueue: live capacity, and every Job carries `kueue.x-k8s.io/queue-name` of a LocalQueue whose
  ClusterQueue covers gpufed's ResourceFlavors (`bench.gpupool_kueue`): Kueue admits each Job whole
  to one flavor, gpufed's gang path steps aside;
- static: the baseline other federations use (`gpufed.io/capacity=static` on both ForeignClusters):
  one virtual node per provider, allocatable = grant, no fit check, no fail-back; groups are still
  released whole onto one provider's node, whose scheduler places each pod on any of its products.
Before submitting, the consumer's virtual nodes must be what the mode implies (`expected_nodes`).

A run ends when every Job is done, at the time limit (default 3 x ideal + 60 s), or when it stalls:
no pod Running and nothing changing for the stall window (static: 60 s; live and kueue: 150 s,
beyond the virtual kubelet's 120 s unplaced timeout, so a fail-back still gets its chance). An
unfinished run reports its unfinished Jobs and where they sat, and "> elapsed" as its makespan.

Targets (read by `bench.gpupool_record.verdicts`): live utilisation >= 0.9 of the ideal, 0 pods stuck
Pending remotely in live mode, 0 groups split across providers or products in live and kueue mode.
Does not: tune or change the product; a missed target is reported as missed.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench import gpupool_kueue, procstat
from bench.bursts import delete_all, until
from bench.gpupool_record import (
    GPU,
    TARGET_SPLIT_MAX,
    TARGET_STUCK_MAX,
    TARGET_UTILISATION_RATIO_MIN,
    ModeRecord,
    Observer,
    summarise,
    verdicts,
)
from bench.gpupool_trace import (
    DEFAULT_DURATIONS_S,
    DEFAULT_GROUP_SHARE,
    DEFAULT_JOBS,
    DEFAULT_LIMIT_FACTOR,
    DEFAULT_SEED,
    GPU_WEIGHTS,
    GROUP_SIZES,
    MAX_GROUP_GPUS,
    PROVIDERS,
    TOTAL_GPUS,
    TraceJob,
    for_mode,
    ideal_makespan,
    make_trace,
    node_places,
    pool_nodes,
    references,
    time_limit,
    trace_summary,
)
from bench.offload import (
    REPO,
    cluster_id,
    ensure_namespace,
    environment,
    gpufed_cli,
    log_findings,
    peer,
    twin_namespace,
)
from gpufed.apis.wire import CAPACITY_ANNOTATION
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
#: Seconds with no pod Running and nothing changing after which a static run counts as stalled.
DEFAULT_STALL_S = 60.0
#: The same for live and kueue runs: above the virtual kubelet's 120 s unplaced timeout (fail-back).
LIVE_STALL_S = 150.0
MODES = ("live", "kueue", "static")
BACKOFF_LIMIT = 6
NAMESPACE = "bench-gpu"
CONSUMER = "consumer"
REQUESTS = {"cpu": "100m", "memory": "128Mi"}
IMAGE = "registry.example/gpu-train:1"
MODE_LABEL = "bench.gpufed.io/mode"
VIRTUAL_NODE_SELECTOR = "gpufed.io/type=virtual-node"
#: Seconds to wait for the consumer's virtual nodes to match a mode (the virtual kubelets restart).
NODES_TIMEOUT_S = 180.0

Progress = Callable[[str], None]


@dataclass(frozen=True)
class GpuPoolOptions:
    state_dir: Path = DEFAULT_STATE_DIR
    bin_dir: Path = REPO / ".cache" / "bin"
    base_port: int = DEFAULT_BASE_PORT
    jobs: int = DEFAULT_JOBS
    seed: int = DEFAULT_SEED
    durations_s: tuple[float, float] = DEFAULT_DURATIONS_S
    group_share: float = DEFAULT_GROUP_SHARE
    limit_factor: float = DEFAULT_LIMIT_FACTOR
    stall_s: float = DEFAULT_STALL_S
    modes: tuple[str, ...] = MODES
    concurrency: int = 64
    keep: bool = False


def capacity_mode(mode: str) -> str:
    """The consumer's capacity mode a bench mode runs on (kueue: live)."""
    return "static" if mode == "static" else "live"


def stall_window(mode: str, stall_s: float) -> float:
    return stall_s if capacity_mode(mode) == "static" else max(stall_s, LIVE_STALL_S)


def run_duration(seconds: float) -> str:
    """The kwok annotation's value (a Go duration)."""
    return f"{seconds:g}s"


def job_body(job: TraceJob, namespace: str, mode: str) -> dict[str, Any]:
    """A plain GPU Job, as a user would `kubectl create -f` it (no node, no toleration: the scheduler
    and gpufed's offloading webhook do the rest); a group is an Indexed Job running all its pods at
    once. In kueue mode it names the bench LocalQueue and is created suspended."""
    body = manifests.job(
        job.name,
        namespace,
        gpus=str(job.gpus),
        requests=REQUESTS,
        image=IMAGE,
        container="train",
        backoff_limit=BACKOFF_LIMIT,
        completions=job.pods if job.group else None,
        parallelism=job.pods if job.group else None,
        labels={MODE_LABEL: mode},
        pod_labels={MODE_LABEL: mode},
        pod_annotations={RUN_DURATION_ANNOTATION: run_duration(job.duration_s)},
    )
    if job.group:
        body["spec"]["completionMode"] = "Indexed"
    return gpupool_kueue.queued(body) if mode == "kueue" else body


def expected_nodes(mode: str, ids: Mapping[str, str], topology: Topology) -> dict[str, int]:
    """The consumer's virtual nodes a mode implies and their allocatable GPUs while nothing runs.

    static: one node per provider, allocatable = grant. live (and kueue): one node per provider GPU
    product (unsuffixed when the provider has one product), allocatable = the most GPUs one node of
    that product has."""
    if capacity_mode(mode) == "static":
        return {f"gpufed-{ids[p]}": grant for p, grant in PROVIDERS.items()}
    return {name: row["largest"] for name, row in pool_nodes(ids, topology).items()}


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
        value = "static" if capacity_mode(mode) == "static" else None
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
    places: Mapping[str, str],
) -> ModeRecord:
    """Submit the whole trace at t = 0 and watch until it is done, stalls or hits the time limit.
    `places`: provider node -> `provider/product`."""
    ideal = ideal_makespan(sum(j.gpu_seconds for j in trace), TOTAL_GPUS)
    limit = time_limit(ideal, opts.limit_factor)
    stall = stall_window(mode, opts.stall_s)
    obs = Observer(trace, places)
    kueue = mode == "kueue"
    synced = {k: asyncio.Event() for k in ("pods", "jobs", "nodes", *providers, *(["workloads"] if kueue else []))}
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
    if kueue:
        watches.append(
            asyncio.create_task(
                watch(
                    consumer,
                    rest.path(gpupool_kueue.API, "workloads", namespace=NAMESPACE),
                    obs.on_workload,
                    what="bench workloads",
                    on_synced=synced["workloads"].set,
                )
            )
        )
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

        pods = sum(j.pods for j in trace)
        progress(f"{mode}: submitting {len(trace)} Jobs, {pods} pods (ideal makespan {ideal:.1f}s, limit {limit:.0f}s)")
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
                progress(f"{mode}: t={now - t0:.0f}s, {finished} of {pods} pods done, {obs.running()} Running")
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


async def _run_one(
    consumer: Any,
    providers: Mapping[str, Any],
    twins: Mapping[str, str],
    ids: Mapping[str, str],
    env: LocalEnvironment,
    base: list[TraceJob],
    mode: str,
    opts: GpuPoolOptions,
    progress: Progress,
) -> dict[str, Any]:
    """One mode: switch the capacity mode, (kueue) set up the queues, run the trace, clean up."""
    t_switch = time.monotonic()
    kueue: dict[str, Any] | None = None
    try:
        await set_mode(consumer, ids, mode)
        want = expected_nodes(mode, ids, env.topology)
        nodes = await wait_for_nodes(consumer, want, mode)
        if mode == "kueue":
            quotas = {name: row["gpus"] for name, row in pool_nodes(ids, env.topology).items()}
            kueue = await gpupool_kueue.setup(consumer, NAMESPACE, quotas)
            progress(f"kueue: ClusterQueue {kueue['cluster_queue']} Active, GPU quotas {kueue['gpu_quota_held']}")
    except (RuntimeError, KubeError) as e:
        progress(f"{mode}: {e}")
        return {"mode": mode, "error": str(e)}
    switch_s = time.monotonic() - t_switch
    progress(f"{mode}: virtual nodes {nodes} after {switch_s:.1f}s")
    offsets = procstat.log_offsets(env.log_path(CONSUMER, CONTROLLER))
    rec = await run_mode(
        consumer, providers, twins, for_mode(base, mode), mode, opts, progress, node_places(env.topology)
    )
    out = summarise(rec)
    out["virtual_nodes"] = nodes
    out["mode_switch_s"] = round(switch_s, 1)
    out["stall_window_s"] = stall_window(mode, opts.stall_s)
    if kueue is not None:
        out["kueue"] = kueue
    out["logs"] = [log_findings(p, off) for p, off in offsets.items()]
    progress(
        f"{mode}: {out['ended']} after {out['elapsed_s']:.1f}s: {out['jobs_finished']}/{out['jobs']} Jobs, "
        f"utilisation {out['utilisation']}, split groups {out['groups_split']} of {out['groups_finished']} finished, "
        f"stuck remotely {out['stuck_remote']}"
    )
    out["cleanup_s"] = round(await delete_jobs(consumer, providers, twins), 1)
    if mode == "kueue":
        try:
            await gpupool_kueue.teardown(consumer, NAMESPACE)
        except (RuntimeError, KubeError) as e:
            progress(f"kueue: the queues were not deleted: {e}")
    return out


async def _run(env: LocalEnvironment, opts: GpuPoolOptions, progress: Progress) -> dict[str, Any]:
    await env.up(progress)
    kc = env.merged_kubeconfig
    base = make_trace(opts.jobs, opts.seed, opts.durations_s, group_share=opts.group_share)
    async with (
        api_client(kc, CONSUMER) as consumer,
        api_client(kc, "gpu-a") as gpu_a,
        api_client(kc, "gpu-b") as gpu_b,
    ):
        providers = {"gpu-a": gpu_a, "gpu-b": gpu_b}
        ids = {CONSUMER: await cluster_id(consumer)}
        for name, api in providers.items():
            ids[name] = await cluster_id(api)
        pods = sum(j.pods for j in base)
        for name, gpus in PROVIDERS.items():
            progress(f"peering {CONSUMER} ({ids[CONSUMER]}) with {name} ({ids[name]}): {gpus} GPUs")
            await peer(kc, provider=name, gpus=gpus, cpu="32", memory="128Gi", pods=pods + 50)
        await ensure_namespace(consumer, NAMESPACE)
        twins = await _offload(kc, providers, ids[CONSUMER])
        progress(f"{NAMESPACE} offloaded; twin namespaces {twins}")
        await delete_jobs(consumer, providers, twins)  # leftovers of an interrupted --keep run

        modes: dict[str, dict[str, Any]] = {}
        for mode in opts.modes:
            modes[mode] = await _run_one(consumer, providers, twins, ids, env, base, mode, opts, progress)
        if opts.keep and "static" in opts.modes:
            await set_mode(consumer, ids, "live")

    return {
        "part": "gpu-pool",
        "environment": {
            "consumer": f"{CONSUMER} ({ids[CONSUMER]}): 2 kwok CPU nodes, Kueue",
            "providers": {
                "gpu-a": f"gpu-a ({ids['gpu-a']}): 4 kwok nodes x 8 H100, peered with --gpus {PROVIDERS['gpu-a']}",
                "gpu-b": f"gpu-b ({ids['gpu-b']}): 2 x 4 A100 + 4 x 1 L4, peered with --gpus {PROVIDERS['gpu-b']}",
            },
            "total_gpus": TOTAL_GPUS,
            "state_dir": _shown(env.state_dir),
            "base_port": opts.base_port,
            "namespace": NAMESPACE,
            "twin_namespaces": twins,
            "concurrency": opts.concurrency,
            "backoff_limit": BACKOFF_LIMIT,
            "limit_factor": opts.limit_factor,
            "stall_s": opts.stall_s,
            "live_stall_s": stall_window("live", opts.stall_s),
            "modes": list(opts.modes),
        },
        "trace": {
            "seed": opts.seed,
            "durations_s": list(opts.durations_s),
            "weights": {str(g): w for g, w in GPU_WEIGHTS},
            "group_share": opts.group_share,
            "group_sizes": list(GROUP_SIZES),
            "max_group_gpus": MAX_GROUP_GPUS,
            **trace_summary(base, TOTAL_GPUS),
            "reference": references(base, env.topology),
        },
        "targets": {
            "utilisation_ratio_min": TARGET_UTILISATION_RATIO_MIN,
            "stuck_max": TARGET_STUCK_MAX,
            "split_max": TARGET_SPLIT_MAX,
        },
        "modes": modes,
        "verdicts": verdicts(modes.get("live"), modes.get("kueue")),
    }


def run(opts: GpuPoolOptions, progress: Progress) -> dict[str, Any]:
    """Start the gpu-pool environment, run each mode, stop the environment unless `opts.keep`."""
    unknown = [m for m in opts.modes if m not in MODES]
    if unknown or not opts.modes:
        raise ValueError(f"gpu-pool modes must be among {MODES}, got {opts.modes}")
    topology = default_topology(base_port=opts.base_port)
    if "kueue" in opts.modes and not topology.cluster(CONSUMER).kueue:
        raise ValueError("gpu-pool kueue mode needs Kueue on the consumer (topology flag `kueue`)")
    env = environment(opts.state_dir, opts.bin_dir, opts.base_port, topology)
    try:
        return asyncio.run(_run(env, opts, progress))
    finally:
        if opts.keep:
            progress(
                f"leaving the gpu-pool clusters running (state in {env.state_dir}; KUBECONFIG={env.merged_kubeconfig})"
            )
        else:
            env.down(progress)
