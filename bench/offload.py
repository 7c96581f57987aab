"""The `offload` part: N pods on a virtual node against the same N pods on local kwok nodes.

Owns: the bench topology (consumer with 4 CPU kwok nodes, gpu-a with 4 x 8 H100; no gpu-b), the
dedicated local environment in .cache/bench (ports from 16000, so it never collides with
`make demo` or the e2e sessions), peering consumer -> gpu-a and offloading namespace `bench-vk`
through the gpufed CLI (or a TwinNamespace request when the CLI has no `offload-namespace`), the
bursts, their repeats and medians, the cleanup between bursts, and this part's targets and verdicts.

One burst = N pods created concurrently (bounded) with the admin identity, observed with one
watch, in one of two modes: *pre-bound* (spec.nodeName set, so the scheduler is not part of either
path) or *scheduled* (no nodeName: the consumer's kube-scheduler binds them). Baseline: the
consumer's kwok nodes in `bench-local` (round-robin when pre-bound). Virtual: node
`gpufed-<gpu-a id>` in `bench-vk` (the offloading webhook adds the affinity when scheduled), while
the virtual kubelet and the consumer's gpufed controller are sampled from /proc (peak RSS every
0.2 s, CPU over the burst). Per-pod start latency = the time our watch saw phase Running minus the
time its create returned.

Repeats: each planned row (mode, N, rate) runs baseline then virtual, alternately, `repeats_for`
times (`--repeats`; by default 3 for bursts of up to REPEAT_MAX_PODS pods, once for larger bursts
and paced runs). A row reports the median of each figure over its repeats (`median_arm`; a repeat
whose pods never all ran counts as slower than any), each repeat's all-Running times and ratio, and
the median of those ratios; its verdicts compare the median arms. Deletes (`grace_plan`): grace 0
for scheduled and paced rows; for pre-bound rows each pod's own grace (30 s), and every second
repeat grace 0, so each grace has its own delete medians and verdict. Footprint: after the first
virtual burst of each pre-bound row, with all N pods Running and nothing changing, both processes
are sampled for `STEADY_S` seconds (and once before the first burst, at 0 pods). With `profile`,
py-spy samples the virtual kubelet during the first repeat of the largest pre-bound burst and the
part keeps the functions that took the most samples.

Does not: tune or change the product; a missed target is reported as missed.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import sys
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench import procstat, requestcount
from bench.bursts import MB, burst, delete_all, until
from bench.medians import median, median_arm, median_tree, ratio
from gpufed import PACKAGES, process
from gpufed.apis.wire import IDENTITY_CONFIGMAP, SYSTEM_NAMESPACE, TENANT_PREFIX
from gpufed.kube import rest
from gpufed.kube.client import KubeError, api_client
from gpufed.localenv.components import CONTROLLER
from gpufed.localenv.launcher import LocalEnvironment, LocalSettings
from gpufed.localenv.topology import Topology

REPO = Path(__file__).resolve().parents[1]
DEFAULT_STATE_DIR = REPO / ".cache" / "bench"
DEFAULT_BASE_PORT = 16000
DEFAULT_SIZES = (100, 1000)
DEFAULT_SCHEDULED_SIZES = (500,)
DEFAULT_RATES = (50.0, 100.0)
DEFAULT_PACED_S = 30.0
#: Seconds of steady-state sampling after each virtual burst (footprint at N pods).
STEADY_S = 10.0
DEFAULT_CONCURRENCY = 64
#: Repeats of a row when none is asked for: bursts of up to REPEAT_MAX_PODS pods run DEFAULT_REPEATS
#: times, larger bursts and paced runs (minutes each) once.
DEFAULT_REPEATS = 3
REPEAT_MAX_PODS = 2000
LOCAL_NS = "bench-local"
VK_NS = "bench-vk"
CONSUMER = "consumer"
PROVIDER = "gpu-a"
#: Pods per kwok node: each node gets a /24 of the pod CIDR, so about 250 pods fit on one.
NODE_PODS = 260
PROVIDER_NODE_PODS = 300
#: Pods one node takes in a burst (its /24 less a margin).
PODS_PER_NODE = 250

#: Targets: offloaded against local figures as ratios within one run, and the virtual kubelet's own
#: throughput and footprint.
#: On this shared 2-core machine: an offloaded pod costs at least one more write per side than a local
#: one (the twin, and its status reported back), so the floor is not 1.
TARGET_RATIO_MAX = 2.0
#: Per-pod start latency at the median, and deleting them all, offloaded against local.
TARGET_P50_RATIO_MAX = 2.0
TARGET_DELETE_RATIO_MAX = 1.5
#: gpufed's own requests per offloaded pod on each side (API server), on create and on delete.
TARGET_GPUFED_REQUESTS_PER_POD = 2.0
TARGET_VK_PODS_PER_S_MIN = 200.0
TARGET_VK_RSS_MB_MAX = 150.0
TARGET_VK_RSS_AT_PODS = 1000
TARGET_VK_CPU_CORES_MAX = 0.25

Progress = Callable[[str], None]


@dataclass(frozen=True)
class OffloadOptions:
    sizes: tuple[int, ...] = DEFAULT_SIZES
    state_dir: Path = DEFAULT_STATE_DIR
    bin_dir: Path = REPO / ".cache" / "bin"
    base_port: int = DEFAULT_BASE_PORT
    concurrency: int = DEFAULT_CONCURRENCY
    keep: bool = False
    scheduled_sizes: tuple[int, ...] = DEFAULT_SCHEDULED_SIZES
    steady_s: float = STEADY_S
    profile: bool = False
    #: Paced runs: pods per second, each for `paced_s` seconds.
    rates: tuple[float, ...] = DEFAULT_RATES
    paced_s: float = DEFAULT_PACED_S
    #: Repeats of every row; None: the default rule (`repeats_for`).
    repeats: int | None = None


def paced_pods(rate: float, seconds: float) -> int:
    """Pods a paced run creates."""
    return max(1, round(rate * seconds))


def repeats_for(opts: OffloadOptions, mode: str, pods: int) -> int:
    """How many times a row runs its two arms: `opts.repeats`, or by default DEFAULT_REPEATS for a
    burst (pre-bound or scheduled) of up to REPEAT_MAX_PODS pods and once for larger bursts and paced runs."""
    if opts.repeats is not None:
        return opts.repeats
    return 1 if mode.startswith("paced") or pods > REPEAT_MAX_PODS else DEFAULT_REPEATS


def grace_plan(mode: str, repeats: int) -> list[int | None]:
    """The grace period each repeat deletes its pods with (None: each pod's own, 30 s): pre-bound rows
    alternate it, the 1st, 3rd, ... repeat the pod's own and the 2nd, 4th, ... 0; other rows always 0."""
    if mode != "pre-bound":
        return [0] * repeats
    return [None if i % 2 == 0 else 0 for i in range(repeats)]


def grace_label(grace: int | None) -> int | str:
    """How the results name a delete grace period: "default" (each pod's own) or the seconds."""
    return "default" if grace is None else grace


def largest_run(opts: OffloadOptions) -> int:
    """Pods of the largest run of the plan (what the clusters and the grant are sized for)."""
    return max((*opts.sizes, *opts.scheduled_sizes, *(paced_pods(r, opts.paced_s) for r in opts.rates)))


def nodes_for(pods: int) -> int:
    """kwok nodes per side for bursts of up to `pods` (at least 4)."""
    return max(4, math.ceil(pods / PODS_PER_NODE))


def bench_topology(base_port: int, nodes: int = 4) -> Topology:
    """consumer: `nodes` CPU nodes; gpu-a: `nodes` x 8 H100, room for `nodes` x 250 twins."""
    return Topology.model_validate(
        {
            "basePort": base_port,
            "jobSeconds": 5,
            "clusters": [
                {
                    "name": CONSUMER,
                    "nodePools": [{"name": "cpu", "count": nodes, "cpu": "64", "memory": "256Gi", "pods": NODE_PODS}],
                },
                {
                    "name": PROVIDER,
                    "nodePools": [
                        {
                            "name": "h100",
                            "count": nodes,
                            "cpu": "128",
                            "memory": "1024Gi",
                            # Above the ~250 addresses of a node's /24 so that a grant of max N + 50 pods fits.
                            "pods": PROVIDER_NODE_PODS,
                            "gpus": 8,
                            "gpuProduct": "NVIDIA-H100-80GB-HBM3",
                            "gpuMemoryMiB": 81559,
                        }
                    ],
                },
            ],
        }
    )


def max_pods(topology: Topology) -> int:
    """The largest burst both sides can hold (about 250 pods per node: a /24 each)."""
    return min(c.node_count() * PODS_PER_NODE for c in topology.clusters)


# ------------------------------------------------------------------------------------ helpers


async def gpufed_cli(*args: str, limit_s: float = 300) -> tuple[int, str]:
    """Run `python -m gpufed.cli ARGS` as a user would; (exit code, stdout + stderr)."""
    try:
        done = await process.run(
            [sys.executable, "-m", "gpufed.cli", *args],
            timeout_s=limit_s,
            cwd=REPO,
            env={**os.environ, "COLUMNS": "200"},
            check=False,
            merge_stderr=True,
        )
    except process.CommandTimeoutError:
        return 124, f"timed out after {limit_s:.0f}s"
    return done.returncode, done.stdout


async def cluster_id(api: Any) -> str:
    cm = await rest.get(api, rest.path("v1", "configmaps", IDENTITY_CONFIGMAP, namespace=SYSTEM_NAMESPACE))
    if cm is None:
        raise RuntimeError("no gpufed identity ConfigMap: is gpufed installed?")
    return str(cm["data"]["clusterId"])


async def ensure_namespace(api: Any, name: str) -> None:
    try:
        await rest.request(
            api,
            "POST",
            "/api/v1/namespaces",
            body={"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}},
        )
    except KubeError as e:
        if not e.conflict:
            raise

    async def sa() -> bool:
        return await rest.get(api, rest.path("v1", "serviceaccounts", "default", namespace=name)) is not None

    await until(f"the default ServiceAccount of {name}", sa, 60)


def _log_offset(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def log_findings(path: Path, offset: int, limit: int = 5) -> dict[str, Any]:
    """Warnings and errors a JSON-lines log got since `offset`: counts per level, most frequent events."""
    try:
        with path.open("rb") as f:
            f.seek(offset)
            lines = f.read().decode(errors="replace").splitlines()
    except OSError as e:
        return {"log": str(path), "error": str(e)}
    levels: Counter[str] = Counter()
    events: Counter[str] = Counter()
    for line in lines:
        try:
            rec = json.loads(line)
        except ValueError:
            if line.strip():
                levels["unparsed"] += 1
                events[f"unparsed: {line.strip()[:160]}"] += 1
            continue
        level = str(rec.get("level", "?"))
        levels[level] += 1
        if level in ("warning", "error", "critical", "exception"):
            detail = rec.get("error") or rec.get("reason") or ""
            events[f"{level}: {rec.get('event', '')} {str(detail)[:120]}".strip()] += 1
    return {
        "log": path.name,
        "lines": len(lines),
        "levels": dict(levels),
        "top": [{"count": c, "event": e} for e, c in events.most_common(limit)],
    }


def describe_findings(log: dict[str, Any], where: str = "") -> str | None:
    """One line for a report about what `log_findings` found (`where` follows the log's name); None
    when the log had nothing above info."""
    levels = log.get("levels") or {}
    bad = {k: n for k, n in levels.items() if k not in ("info", "debug")}
    if bad:
        top = "; ".join(f"{x['count']}× `{x['event']}`" for x in log.get("top") or [])
        return f"`{log['log']}`{where}: {log['lines']} lines, {bad}" + (f" — {top}" if top else "")
    if "error" in log:
        return f"`{log['log']}`{where} unreadable: {log['error']}"
    return None


# ------------------------------------------------------------------------------------ the part


async def peer(
    kc: Path, *, pods: int, provider: str = PROVIDER, gpus: int = 8, cpu: str = "400", memory: str = "2Ti"
) -> None:
    """Peer consumer -> `provider` with the CLI (it returns once the virtual node is Ready)."""
    code, out = await gpufed_cli(
        "peer", "--kubeconfig", str(kc), "--context", CONSUMER,
        "--remote-kubeconfig", str(kc), "--remote-context", provider,
        "--gpus", str(gpus), "--cpu", cpu, "--memory", memory, "--pods", str(pods),
    )  # fmt: skip
    if code != 0:
        raise RuntimeError(f"gpufed peer {provider} failed ({code}):\n{out}")


async def twin_namespace(provider: Any, consumer_id: str, namespace: str, what: str) -> str:
    """Name of the Ready twin namespace of `namespace` on a provider (waits up to 120 s)."""
    tenant = f"{TENANT_PREFIX}{consumer_id}"

    async def twin() -> str | None:
        for t in await rest.list_items(provider, rest.path("gpufed.io/v1alpha1", "twinnamespaces", namespace=tenant)):
            st = t.get("status") or {}
            if t["spec"].get("namespace") == namespace and st.get("phase") == "Ready" and st.get("twin"):
                return str(st["twin"])
        return None

    name: str = await until(f"the twin namespace of {namespace} on {what}", twin, 120)
    return name


async def offload_namespace(
    env: LocalEnvironment, consumer: Any, provider: Any, ids: dict[str, str]
) -> tuple[str, str]:
    """Offload VK_NS to gpu-a; (how, twin namespace name)."""
    kc = str(env.merged_kubeconfig)
    how = "gpufed offload-namespace"
    code, out = await gpufed_cli(
        "offload-namespace", VK_NS, "--kubeconfig", kc, "--context", CONSUMER,
        "--selector", f"gpufed.io/remote-cluster-id={ids[PROVIDER]}",
    )  # fmt: skip
    if code != 0:
        raise RuntimeError(f"gpufed offload-namespace failed ({code}):\n{out}")
    return how, await twin_namespace(provider, ids[CONSUMER], VK_NS, PROVIDER)


def aggregate(pods: int, mode: str, rate: float | None, repeats: list[dict[str, Any]]) -> dict[str, Any]:
    """One row of the results from its repeats, in the order they ran, each {"grace": label,
    "baseline": summary, "virtual": summary}: the median arms (their cleanup_s, delete_grace and
    requests_delete those of the first repeat's grace), the per-repeat spread, the deletes per grace
    (each from its own repeats) and the verdicts, all from medians."""
    base = median_arm([r["baseline"] for r in repeats])
    virt = median_arm([r["virtual"] for r in repeats])
    deletes = []
    for grace in dict.fromkeys(r["grace"] for r in repeats):
        these = [(i, r) for i, r in enumerate(repeats, 1) if r["grace"] == grace]
        d: dict[str, Any] = {"grace": grace, "repeats": [i for i, _ in these]}
        for arm in ("baseline", "virtual"):
            d[f"{arm}_cleanup_values"] = [r[arm].get("cleanup_s") for _, r in these]
            d[f"{arm}_cleanup_s"] = median(d[f"{arm}_cleanup_values"])
            d[f"{arm}_requests_delete"] = median_tree([r[arm].get("requests_delete") for _, r in these])
        d["ratio"] = ratio(d["baseline_cleanup_s"], d["virtual_cleanup_s"])
        deletes.append(d)
    for name, median_of in (("baseline", base), ("virtual", virt)):
        median_of["cleanup_s"] = deletes[0][f"{name}_cleanup_s"]
        median_of["delete_grace"] = deletes[0]["grace"]
        median_of["requests_delete"] = deletes[0][f"{name}_requests_delete"]
    ratios = [ratio(r["baseline"].get("all_running_s"), r["virtual"].get("all_running_s")) for r in repeats]
    ratio_median = median(ratios)
    spread = {
        "baseline_all_running_s": [r["baseline"].get("all_running_s") for r in repeats],
        "virtual_all_running_s": [r["virtual"].get("all_running_s") for r in repeats],
        "ratio": ratios,
        "ratio_median": None if ratio_median is None else round(ratio_median, 2),
    }
    return {
        "pods": pods,
        "mode": mode,
        "rate": rate,
        "repeats": len(repeats),
        "baseline": base,
        "virtual": virt,
        "spread": spread,
        "deletes": deletes,
        "verdicts": _verdicts(pods, base, virt, deletes, spread),
        "per_repeat": repeats,
    }


def _verdicts(
    n: int, baseline: dict[str, Any], virtual: dict[str, Any], deletes: list[dict[str, Any]], spread: dict[str, Any]
) -> dict[str, Any]:
    """A row's targets from its median arms, and per grace in `deletes` a delete ratio and gpufed's
    requests per pod on delete (the first grace's as `delete_ratio`, another's as `delete_ratio_grace_<grace>`)."""
    out: dict[str, Any] = {}

    def at_most(key: str, b: float | None, v: float | None, limit: float, note: str = "") -> None:
        """The offloaded figure `v` against the local `b`, as a ratio of at most `limit`."""
        value = ratio(b, v)
        out[key] = {"value": value, "target": f"<= {limit:g}{note}", "met": value is not None and value <= limit}

    at_most("ratio", baseline.get("all_running_s"), virtual.get("all_running_s"), TARGET_RATIO_MAX)
    out["ratio"] |= {"per_repeat": spread["ratio"], "median_of_ratios": spread["ratio_median"]}
    p50 = [(arm.get("latency_s") or {}).get("p50") for arm in (baseline, virtual)]
    at_most("p50_ratio", p50[0], p50[1], TARGET_P50_RATIO_MAX)
    requests = {"gpufed_requests_create": _requests_verdict(virtual.get("requests_create"))}
    for i, d in enumerate(deletes):
        suffix = "" if i == 0 else f"_grace_{d['grace']}"
        samples = len(d["repeats"])
        note = f" (grace {d['grace']}, {samples} repeat{'' if samples == 1 else 's'})"
        at_most(f"delete_ratio{suffix}", d["baseline_cleanup_s"], d["virtual_cleanup_s"], TARGET_DELETE_RATIO_MAX, note)
        requests[f"gpufed_requests_delete{suffix}"] = _requests_verdict(d.get("virtual_requests_delete"))
    pps = virtual.get("pods_per_s")
    out["vk_pods_per_s"] = {
        "value": pps,
        "target": f">= {TARGET_VK_PODS_PER_S_MIN:.0f}",
        "met": pps is not None and pps >= TARGET_VK_PODS_PER_S_MIN,
    }
    rss = (virtual.get("processes") or {}).get("virtual-kubelet", {}).get("rss_peak_mb")
    out["vk_rss_mb"] = {
        "value": rss,
        "target": f"<= {TARGET_VK_RSS_MB_MAX:.0f} MB at {TARGET_VK_RSS_AT_PODS} pods",
        "note": "",
        # The target is defined at 1000 pods: a smaller burst can only say "not measured there".
        "met": (rss is not None and rss <= TARGET_VK_RSS_MB_MAX) if n >= TARGET_VK_RSS_AT_PODS else None,
    }
    if n < TARGET_VK_RSS_AT_PODS and rss is not None and rss > TARGET_VK_RSS_MB_MAX:
        # Already above the limit with fewer pods than the target's size: it cannot be met there.
        out["vk_rss_mb"]["met"] = False
        out["vk_rss_mb"]["note"] = f"already above at {n} pods"
    return out | requests


def _requests_verdict(counts: dict[str, Any] | None) -> dict[str, Any]:
    """gpufed's pod requests per pod (`requestcount.POD_RESOURCES`) on the side that made the most,
    against its target; the note gives each side's pod requests, all its requests per pod, and its
    background requests per second (counts without the split: all requests are judged)."""
    gpufed = {side: a.get(requestcount.GPUFED) or {} for side, a in (counts or {}).items()}
    total = {side: round(g.get("writes", 0) + g.get("reads", 0), 2) for side, g in gpufed.items()}
    pod = {side: g.get("pod", total[side]) for side, g in gpufed.items()}
    worst = max(pod.values(), default=None)
    notes = [
        f"{side} {pod[side]:g}"
        + (f" (all {total[side]:g}, background {g['background_per_s']:g}/s)" if "background_per_s" in g else "")
        for side, g in gpufed.items()
    ]
    return {
        "value": worst,
        "target": f"<= {TARGET_GPUFED_REQUESTS_PER_POD:g} per pod per side",
        "note": ", ".join(notes),
        "met": worst is not None and worst <= TARGET_GPUFED_REQUESTS_PER_POD,
    }


def _usage(usage: dict[str, procstat.ProcessUsage]) -> dict[str, Any]:
    return {
        name: {
            "rss_mb": round(u.rss_end_bytes / MB, 1),
            "rss_peak_mb": round(u.rss_peak_bytes / MB, 1),
            "cpu_cores": round(u.cpu_cores, 3),
            "cpu_s": round(u.cpu_end_s - u.cpu_start_s, 3),
            "wall_s": round(u.wall_s, 2),
        }
        for name, u in usage.items()
    }


async def steady(pids: dict[str, int], seconds: float) -> dict[str, Any]:
    """RSS and CPU of `pids` over `seconds` of nothing happening (the footprint at this size)."""
    sampler = procstat.Sampler(pids)
    sampler.start()
    await asyncio.sleep(seconds)
    return _usage(sampler.stop())


class Profiler:
    """py-spy sampling one process (100 Hz, raw collapsed stacks), stopped with SIGINT."""

    def __init__(self, pid: int, out: Path) -> None:
        self.pid, self.out = pid, out
        self.proc: asyncio.subprocess.Process | None = None
        self.error = ""

    async def start(self) -> None:
        exe = Path(sys.executable).with_name("py-spy")
        if not exe.exists():
            self.error = f"py-spy is not installed in {exe.parent} (pip install -e '.[bench]')"
            return
        self.out.parent.mkdir(parents=True, exist_ok=True)
        self.proc = await asyncio.create_subprocess_exec(
            str(exe), "record", "--pid", str(self.pid), "--rate", "100", "--format", "raw",
            "--output", str(self.out), "--nonblocking",
            stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip

    async def stop(self) -> dict[str, Any]:
        if self.proc is None:
            return {"error": self.error or "not started"}
        if self.proc.returncode is None:
            self.proc.send_signal(2)
        try:
            _, err = await asyncio.wait_for(self.proc.communicate(), 60)
        except TimeoutError:
            self.proc.kill()
            return {"error": "py-spy did not stop within 60 s"}
        if not self.out.exists():
            return {"error": f"py-spy wrote nothing ({err.decode(errors='replace').strip()[-300:]})"}
        return profile_summary(self.out.read_text(errors="replace"))


def _frame_name(frame: str) -> str:
    """`func (path/to/module.py:12)` -> `path/to/module.py:func`, paths relative to site-packages or the repo."""
    func, _, where = frame.partition(" (")
    file = where.rstrip(")").rsplit(":", 1)[0]
    for root in ("/site-packages/", f"{REPO}/"):
        if root in file:
            file = file.split(root, 1)[1]
            break
    return f"{file}:{func}"


def profile_summary(raw: str, top: int = 12) -> dict[str, Any]:
    """Self and inclusive sample counts per function from py-spy's raw (collapsed) output."""
    own: Counter[str] = Counter()
    inclusive: Counter[str] = Counter()
    total = 0
    for line in raw.splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        n = int(count)
        total += n
        frames = [_frame_name(f) for f in stack.split(";") if f]
        if not frames:
            continue
        own[frames[-1]] += n
        for name in set(frames):
            inclusive[name] += n

    def rows(counter: Counter[str]) -> list[dict[str, Any]]:
        return [{"function": f, "samples": c, "share": round(c / total, 3)} for f, c in counter.most_common(top)]

    ours = Counter({f: c for f, c in inclusive.items() if f.startswith(tuple(f"{p}/" for p in PACKAGES))})
    return {"samples": total, "self": rows(own), "inclusive_gpufed": rows(ours)}


async def _run(env: LocalEnvironment, opts: OffloadOptions, progress: Progress) -> dict[str, Any]:
    await env.up(progress)
    kc = env.merged_kubeconfig
    consumer_nodes = [node.name for node in env.topology.cluster(CONSUMER).nodes()]
    largest = largest_run(opts)
    async with api_client(kc, CONSUMER) as consumer, api_client(kc, PROVIDER) as provider:
        ids = {CONSUMER: await cluster_id(consumer), PROVIDER: await cluster_id(provider)}
        vnode = f"gpufed-{ids[PROVIDER]}"
        progress(f"peering {CONSUMER} ({ids[CONSUMER]}) with {PROVIDER} ({ids[PROVIDER]})")
        await peer(kc, pods=largest + 50)
        progress(f"virtual node {vnode} Ready")
        for ns in (LOCAL_NS, VK_NS):
            await ensure_namespace(consumer, ns)
        how, twin_ns = await offload_namespace(env, consumer, provider, ids)
        progress(f"{VK_NS} offloaded ({how}); twin namespace {PROVIDER}/{twin_ns}")
        # Leftovers of an interrupted earlier run (--keep) would be counted otherwise.
        await delete_all(consumer, LOCAL_NS)
        await delete_all(consumer, VK_NS, provider, twin_ns)

        audit_logs = {side: env.audit_log_path(side) for side in (CONSUMER, PROVIDER)}
        vk_log = env.log_path(CONSUMER, f"virtual-kubelet-{ids[PROVIDER]}")
        ctl_log = env.log_path(CONSUMER, CONTROLLER)

        def pids() -> dict[str, int]:
            vk_pid = procstat.find_pid("virtual-kubelet", f"--provider-cluster-id={ids[PROVIDER]}")
            ctl_pid = procstat.find_pid("controller", f"--kubeconfig={env.kubeconfig_path(CONSUMER, CONTROLLER)}")
            if vk_pid is None or ctl_pid is None:
                raise RuntimeError(f"process not found: virtual kubelet pid {vk_pid}, controller pid {ctl_pid}")
            return {"virtual-kubelet": vk_pid, "controller": ctl_pid}

        progress(f"footprint at 0 pods ({opts.steady_s:.0f} s)")
        footprint = [{"pods": 0, **await steady(pids(), opts.steady_s)}]
        runs: list[dict[str, Any]] = []
        profile: dict[str, Any] | None = None
        plan: list[tuple[str, int, float | None]] = [
            *(("pre-bound", n, None) for n in opts.sizes),
            *(("scheduled", n, None) for n in opts.scheduled_sizes),
            *((f"paced {r:g}/s", paced_pods(r, opts.paced_s), r) for r in opts.rates),
        ]

        async def one_repeat(mode: str, n: int, rate: float | None, i: int, grace: int | None) -> dict[str, Any]:
            """Repeat `i` (from 1) of a row: its baseline burst and delete, then its virtual burst and delete
            (on the first repeat with the footprint, and the profile when this row is profiled)."""
            nonlocal profile
            bind = mode != "scheduled"
            tag = f"N={n} {mode} repeat {i}"
            progress(f"{tag}: baseline, {n} pods on {len(consumer_nodes)} local kwok nodes")
            window = requestcount.Window.open(audit_logs)
            base = await burst(
                consumer, LOCAL_NS, n, consumer_nodes, prefix=f"l{n}{mode[0]}{i}-", tolerate=False,
                concurrency=opts.concurrency, bind=bind, rate=rate,
            )  # fmt: skip
            baseline = base.summary()
            baseline["requests_create"] = window.close(n)
            window = requestcount.Window.open(audit_logs)
            baseline["cleanup_s"] = round(await delete_all(consumer, LOCAL_NS, grace_s=grace), 2)
            baseline["delete_grace"] = grace_label(grace)
            baseline["requests_delete"] = window.close(n)
            progress(f"{tag}: baseline all Running in {baseline['all_running_s']}s")

            sample = pids()
            offsets = {vk_log: _log_offset(vk_log), ctl_log: _log_offset(ctl_log)}
            profiler = None
            if opts.profile and mode == "pre-bound" and n == max(opts.sizes) and profile is None:
                profiler = Profiler(sample["virtual-kubelet"], env.state_dir / "profiles" / f"vk-{n}.txt")
                await profiler.start()
            progress(f"{tag}: virtual node, {n} pods on {vnode} (virtual kubelet pid {sample['virtual-kubelet']})")
            window = requestcount.Window.open(audit_logs)
            virt = await burst(
                consumer, VK_NS, n, [vnode], prefix=f"v{n}{mode[0]}{i}-", tolerate=True,
                concurrency=opts.concurrency, sample=sample, bind=bind, rate=rate,
            )  # fmt: skip
            if profiler is not None:
                profile = {"pods": n, "mode": mode, **await profiler.stop()}
            virtual = virt.summary()
            virtual["requests_create"] = window.close(n)
            twins = await rest.list_items(provider, f"/api/v1/namespaces/{twin_ns}/pods")
            virtual["twins"] = len(twins)
            virtual["twins_running"] = sum(1 for t in twins if (t.get("status") or {}).get("phase") == "Running")
            virtual["on_virtual_node"] = sum(
                1 for t in await rest.list_items(consumer, f"/api/v1/namespaces/{VK_NS}/pods")
                if (t.get("spec") or {}).get("nodeName") == vnode
            )  # fmt: skip
            virtual["vk_pid_after"] = procstat.find_pid("virtual-kubelet", f"--provider-cluster-id={ids[PROVIDER]}")
            if i == 1 and mode == "pre-bound" and not virt.timed_out:
                progress(f"{tag}: footprint with {n} pods Running ({opts.steady_s:.0f} s)")
                footprint.append({"pods": n, **await steady(pids(), opts.steady_s)})
            window = requestcount.Window.open(audit_logs)
            virtual["cleanup_s"] = round(await delete_all(consumer, VK_NS, provider, twin_ns, grace_s=grace), 2)
            virtual["delete_grace"] = grace_label(grace)
            virtual["requests_delete"] = window.close(n)
            progress(f"{tag}: gpufed's requests per pod on create: {requestcount.summary(virtual['requests_create'])}")
            progress(f"{tag}: gpufed's requests per pod on delete: {requestcount.summary(virtual['requests_delete'])}")
            virtual["logs"] = [log_findings(p, off) for p, off in offsets.items()]
            progress(f"{tag}: virtual node all Running in {virtual['all_running_s']}s")
            return {"repeat": i, "grace": grace_label(grace), "baseline": baseline, "virtual": virtual}

        for mode, n, rate in plan:
            graces = grace_plan(mode, repeats_for(opts, mode, n))
            repeats = [await one_repeat(mode, n, rate, i, grace) for i, grace in enumerate(graces, 1)]
            row = aggregate(n, mode, rate, repeats)
            progress(
                f"N={n} {mode}: medians over {len(repeats)} repeat(s): all Running baseline "
                f"{row['baseline']['all_running_s']}s, virtual {row['virtual']['all_running_s']}s, "
                f"ratio {row['verdicts']['ratio']['value']} (per repeat {row['spread']['ratio']})"
            )
            runs.append(row)

    return {
        "part": "offload",
        "environment": {
            "consumer": f"{CONSUMER} ({ids[CONSUMER]}): {len(consumer_nodes)} kwok CPU nodes, {NODE_PODS} pods each",
            "provider": f"{PROVIDER} ({ids[PROVIDER]}): {len(consumer_nodes)} kwok nodes x 8 H100, "
            f"{PROVIDER_NODE_PODS} pods each",
            "virtual_node": vnode,
            "offloaded_with": how,
            "twin_namespace": twin_ns,
            "concurrency": opts.concurrency,
            "steady_s": opts.steady_s,
            # None: each row's repeats followed the default rule (repeats_for).
            "repeats": opts.repeats,
        },
        "targets": {
            "ratio_max": TARGET_RATIO_MAX,
            "p50_ratio_max": TARGET_P50_RATIO_MAX,
            "delete_ratio_max": TARGET_DELETE_RATIO_MAX,
            "vk_pods_per_s_min": TARGET_VK_PODS_PER_S_MIN,
            "vk_rss_mb_max": TARGET_VK_RSS_MB_MAX,
            "vk_rss_at_pods": TARGET_VK_RSS_AT_PODS,
            "vk_cpu_cores_max": TARGET_VK_CPU_CORES_MAX,
        },
        "runs": runs,
        "footprint": footprint,
        "growth": growth(runs, footprint),
        "profile": profile,
    }


def fit_order(points: list[tuple[float, float]]) -> dict[str, Any] | None:
    """Least-squares fit of y = a * x^k on log-log axes over points with x, y > 0: k and a."""
    pts = [(math.log(x), math.log(y)) for x, y in points if x > 0 and y > 0]
    if len(pts) < 2:
        return None
    mx = sum(x for x, _ in pts) / len(pts)
    my = sum(y for _, y in pts) / len(pts)
    sxx = sum((x - mx) ** 2 for x, _ in pts)
    if sxx == 0:
        return None
    k = sum((x - mx) * (y - my) for x, y in pts) / sxx
    return {"k": round(k, 2), "a": round(math.exp(my - k * mx), 6), "points": len(pts)}


def order_name(k: float | None) -> str:
    """O(1) / O(n) / O(n log n)-ish / O(n^k) for an exponent fitted on log-log axes."""
    if k is None:
        return "n/a"
    if k < 0.25:
        return "O(1)"
    if k < 1.15:
        return "O(n)"
    if k < 1.35:
        return "O(n log n) or worse"
    return f"O(n^{k:.1f})"


def growth(runs: list[dict[str, Any]], footprint: list[dict[str, Any]]) -> dict[str, Any]:
    """How the pre-bound figures grow with N: time to all Running, CPU per burst, steady RSS above 0 pods."""
    pre = [r for r in runs if r["mode"] == "pre-bound"]
    out: dict[str, Any] = {}
    for path in ("baseline", "virtual"):
        pts = [(float(r["pods"]), float(r[path]["all_running_s"])) for r in pre if r[path].get("all_running_s")]
        out[f"{path}_all_running_s"] = fit_order(pts)
    cpu = [
        (float(r["pods"]), float(r["virtual"]["processes"]["virtual-kubelet"]["cpu_s"]))
        for r in pre
        if (r["virtual"].get("processes") or {}).get("virtual-kubelet")
    ]
    out["vk_cpu_s_per_burst"] = fit_order(cpu)
    zero = next((f for f in footprint if f["pods"] == 0), None)
    if zero:
        for name in ("virtual-kubelet", "controller"):
            base = zero.get(name, {}).get("rss_mb")
            pts = [
                (float(f["pods"]), float(f[name]["rss_mb"]) - float(base))
                for f in footprint
                if f["pods"] and name in f and base is not None
            ]
            out[f"{name}_rss_growth_mb"] = fit_order(pts)
            if pts:
                out[f"{name}_rss_kb_per_pod"] = round(1024 * pts[-1][1] / pts[-1][0], 1)
    for fit in out.values():
        if isinstance(fit, dict):
            fit["order"] = order_name(fit.get("k"))
    return out


def environment(
    state_dir: Path,
    bin_dir: Path,
    base_port: int,
    topology: Topology | None = None,
    nodes: int = 4,
    *,
    audit: bool = False,
) -> LocalEnvironment:
    """A bench environment with gpufed installed: the bench topology (every part but gpu-pool) or
    `topology`; with `audit`, every API server writes its audit log (the requests are counted)."""
    return LocalEnvironment(
        LocalSettings(
            state_dir,
            bin_dir,
            build_script=REPO / "deploy" / "local" / "build.sh",
            manifests_dir=REPO / "deploy",
            audit=audit,
        ),
        topology or bench_topology(base_port, nodes),
    )


def run(opts: OffloadOptions, progress: Progress) -> dict[str, Any]:
    """Start the bench environment, run every size, stop the environment unless `opts.keep`."""
    largest = largest_run(opts)
    env = environment(opts.state_dir, opts.bin_dir, opts.base_port, nodes=nodes_for(largest), audit=True)
    try:
        return asyncio.run(_run(env, opts, progress))
    finally:
        if opts.keep:
            progress(
                f"leaving the bench clusters running (state in {env.state_dir}; KUBECONFIG={env.merged_kubeconfig})"
            )
        else:
            env.down(progress)
