"""The `api-cost` part: what gpufed asks of the API servers at steady state, and its footprint, at 1 and 5 providers.

Owns: its own environment (consumer with 1 CPU kwok node and N small providers `gpu-1`..`gpu-N`,
default 5, each 1 kwok node x 4 L4, in .cache/bench-apicost, ports from 16200; the kubelet APIs of the
consumer's virtual kubelets right after the clusters' blocks, 3 ports per provider, because a cluster's
own block holds only 4 virtual kubelets; every kube-apiserver writes an audit log: `LocalSettings.audit`),
the two phases, reading and aggregating the audit logs, the poller detection, the process sampling, and
this part's targets and verdicts.

Phase 1: peer consumer -> gpu-1 (`gpufed peer`), offload namespace `bench-api` to every provider
(`gpufed offload-namespace`, no selector: later peers are picked up), create P pods (default 20)
pre-bound to gpu-1's virtual node, wait until all are Running, let it settle, then measure over a window
(default 45 s) in which the benchmark itself makes no request. Phase 2: peer gpu-2..gpu-N (concurrently),
add P pods on each new virtual node (so every virtual kubelet has P pods in both phases), settle,
measure again. Nothing is created, changed or deleted during a window.

API cost is counted from the API servers' side: audit events (level Metadata; stage ResponseComplete for
ordinary requests, ResponseStarted for long-running ones, so a watch counts once, when it starts; a watch
that ends inside the window is counted as a watch end as well) whose request was received inside the
window, nothing subtracted. Requests are attributed by authenticated user name:
- consumer API server: `gpufed:controller` (the consumer's controller), `gpufed:virtual-kubelet` (every
  virtual kubelet: one shared identity, so the N processes show up as one row);
- provider API servers: `gpufed:controller` (the provider's own controller), `gpufed:consumer:<id>`
  (the consumer's controller AND the consumer's virtual kubelet for that provider: one identity,
  and kubernetes-asyncio sends the same User-Agent from both, so they cannot be told apart);
- everything else (kube-controller-manager, kube-scheduler, kwok, metrics-server, the apiserver
  itself) is shown as one "others" figure, for scale.
A poller is a get or list of the same thing (verb, resource, namespace, name, selectors) more often than
once per POLL_PERIOD_S inside the window (at least 3, median gap under 0.95 x POLL_PERIOD_S), flagged by
name whoever sends it.

Footprint: RSS (VmRSS at the end of the window, and its peak sampled every 0.2 s) and CPU (cores = CPU
seconds / window) of the consumer's controller, each virtual kubelet and gpu-1's controller, from /proc.

Does not: tune or change the product; a missed target is reported as missed. Measured at the sizes it
runs (P pods per virtual kubelet), not at the 1000 pods the footprint target names.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import statistics
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench import procstat
from bench.audit import AuditEvent, Window, count_window, mark, parse_lines, read_since
from bench.bursts import burst
from bench.offload import (
    cluster_id,
    ensure_namespace,
    gpufed_cli,
    log_findings,
    peer,
    twin_namespace,
)
from gpufed.app.supervisor import PORTS_PER_VIRTUAL_KUBELET
from gpufed.kube import rest
from gpufed.kube.client import api_client
from gpufed.localenv.components import CONTROLLER
from gpufed.localenv.launcher import LocalEnvironment, LocalSettings
from gpufed.localenv.topology import PORTS_PER_CLUSTER, ClusterSpec, Topology

REPO = Path(__file__).resolve().parents[1]
DEFAULT_STATE_DIR = REPO / ".cache" / "bench-apicost"
DEFAULT_BASE_PORT = 16200
DEFAULT_PROVIDERS = 5
DEFAULT_PODS_PER_PROVIDER = 20
DEFAULT_WINDOW_S = 45.0
DEFAULT_SETTLE_S = 10.0
DEFAULT_CONCURRENCY = 32
CONSUMER = "consumer"
NAMESPACE = "bench-api"
GPUS_PER_PROVIDER = 4
GPU_PRODUCT = "NVIDIA-L4"

#: A get/list of the same thing more often than once per this many seconds is a poller.
POLL_PERIOD_S = 10.0
#: The verbs shown in their own columns (anything else is listed under "other").
VERBS = ("get", "list", "watch", "create", "update", "patch", "delete")
WRITE_VERBS = frozenset({"create", "update", "patch", "delete", "deletecollection"})

#: Component labels (rows of the report).
C_CONTROLLER = "controller"
C_VKS = "virtual-kubelets"
C_PROVIDER_CONTROLLER = "provider-controller"
C_CONSUMER_IDENTITY = "consumer-identity"
C_OTHERS = "others"
GPUFED = (C_CONTROLLER, C_VKS, C_PROVIDER_CONTROLLER, C_CONSUMER_IDENTITY)
LABELS = {
    C_CONTROLLER: "consumer controller (`gpufed:controller`)",
    C_VKS: "virtual kubelets (`gpufed:virtual-kubelet`, all of them)",
    C_PROVIDER_CONTROLLER: "provider controller (`gpufed:controller`)",
    C_CONSUMER_IDENTITY: "consumer's identity: its controller + virtual kubelet (`gpufed:consumer:<id>`)",
    C_OTHERS: "others: Kubernetes itself, kwok, metrics-server",
}

#: Targets: the virtual kubelet's footprint at TARGET_AT_PODS pods, and no polling client.
TARGET_VK_RSS_MB_MAX = 150.0
TARGET_VK_CORES_MAX = 0.25
TARGET_AT_PODS = 1000
TARGET_POLLERS_MAX = 0

Progress = Callable[[str], None]
MB = 1024 * 1024


@dataclass(frozen=True)
class ApiCostOptions:
    state_dir: Path = DEFAULT_STATE_DIR
    bin_dir: Path = REPO / ".cache" / "bin"
    base_port: int = DEFAULT_BASE_PORT
    providers: int = DEFAULT_PROVIDERS
    pods_per_provider: int = DEFAULT_PODS_PER_PROVIDER
    window_s: float = DEFAULT_WINDOW_S
    settle_s: float = DEFAULT_SETTLE_S
    concurrency: int = DEFAULT_CONCURRENCY
    keep: bool = False


def provider_names(n: int) -> list[str]:
    return [f"gpu-{i}" for i in range(1, n + 1)]


def apicost_topology(base_port: int, providers: int = DEFAULT_PROVIDERS) -> Topology:
    """consumer: 1 CPU node; gpu-1..gpu-N: 1 node x 4 L4 each (as small as the launcher allows)."""
    return Topology.model_validate(
        {
            "basePort": base_port,
            "jobSeconds": 5,
            "clusters": [
                {"name": CONSUMER, "nodePools": [{"name": "cpu", "count": 1, "cpu": "32", "memory": "128Gi"}]},
                *(
                    {
                        "name": name,
                        "nodePools": [
                            {
                                "name": "l4",
                                "count": 1,
                                "cpu": "64",
                                "memory": "256Gi",
                                "pods": 110,
                                "gpus": GPUS_PER_PROVIDER,
                                "gpuProduct": GPU_PRODUCT,
                                "gpuMemoryMiB": 23034,
                            }
                        ],
                    }
                    for name in provider_names(providers)
                ),
            ],
        }
    )


# ------------------------------------------------------------------------------------ who asked (pure)


def classify(user: str, identities: Mapping[str, str]) -> str:
    """The component a user name belongs to on one API server (`identities`: user -> component)."""
    return identities.get(user, C_OTHERS)


def poll_key(e: AuditEvent) -> tuple[str, str, str, str, str]:
    return (e.verb, e.resource, e.namespace, e.name, e.selectors)


def repeated_reads(requests: Iterable[AuditEvent], period_s: float = POLL_PERIOD_S) -> list[dict[str, Any]]:
    """Gets and lists of the same thing (`poll_key`) seen at least 3 times in the window, with their median
    gap; `flagged` when that gap is under 0.95 x `period_s`, i.e. more often than once per `period_s` (a
    heartbeat every `period_s`, like a node Lease renewal every 10 s, is not flagged; one every 9 s is).
    Most frequent first."""
    times: dict[tuple[str, str, str, str, str], list[float]] = defaultdict(list)
    for e in requests:
        if e.verb in ("get", "list"):
            times[poll_key(e)].append(e.received)
    out = []
    for (verb, resource, namespace, name, selectors), ts in times.items():
        if len(ts) < 3:
            continue
        ts.sort()
        gap = statistics.median(b - a for a, b in itertools.pairwise(ts))
        out.append(
            {
                "verb": verb,
                "resource": resource,
                "namespace": namespace,
                "name": name,
                "selectors": selectors,
                "count": len(ts),
                "every_s": round(gap, 2),
                "flagged": gap < 0.95 * period_s,
            }
        )
    return sorted(out, key=lambda p: (-p["count"], p["resource"], p["name"], p["verb"]))


def find_pollers(requests: Iterable[AuditEvent], period_s: float = POLL_PERIOD_S) -> list[dict[str, Any]]:
    """The flagged `repeated_reads`: a get or list of the same thing more often than once per `period_s`."""
    return [r for r in repeated_reads(requests, period_s) if r["flagged"]]


def _rate(n: int, window_s: float) -> float:
    return round(n / window_s, 3) if window_s > 0 else 0.0


def component_stats(window: Window, window_s: float, top: int = 5) -> dict[str, Any]:
    """Requests/s in total, by verb and by resource, watch starts and ends, errors, user agents, pollers."""
    reqs = window.requests
    verbs = Counter(e.verb for e in reqs)
    by_resource: dict[str, Counter[str]] = defaultdict(Counter)
    for e in reqs:
        by_resource[e.resource][e.verb] += 1
    ranked = sorted(by_resource.items(), key=lambda kv: (-sum(kv[1].values()), kv[0]))
    return {
        "requests": len(reqs),
        "rps": _rate(len(reqs), window_s),
        "by_verb": dict(sorted(verbs.items())),
        "rps_by_verb": {v: _rate(n, window_s) for v, n in sorted(verbs.items())},
        "writes": sum(n for v, n in verbs.items() if v in WRITE_VERBS),
        "top_resources": [
            {"resource": r, "requests": sum(c.values()), "rps": _rate(sum(c.values()), window_s), "verbs": dict(c)}
            for r, c in ranked[:top]
        ],
        "watch_starts": verbs.get("watch", 0),
        "watch_ends": len(window.watch_ends),
        "errors": dict(Counter(str(e.code) for e in reqs if e.code >= 400)),
        "users": sorted({e.user for e in reqs}),
        "user_agents": sorted({e.user_agent for e in reqs}),
        "repeated_reads": (reads := repeated_reads(reqs)),
        "pollers": [r for r in reads if r["flagged"]],
    }


def aggregate(
    events: Iterable[AuditEvent], t0: float, t1: float, identities: Mapping[str, str]
) -> dict[str, dict[str, Any]]:
    """One API server's window, per component (every gpufed component present, even with 0 requests)."""
    window = count_window(events, t0, t1)
    split: dict[str, Window] = {c: Window() for c in set(identities.values())}
    for e in window.requests:
        split.setdefault(classify(e.user, identities), Window()).requests.append(e)
    for e in window.watch_ends:
        split.setdefault(classify(e.user, identities), Window()).watch_ends.append(e)
    out = {c: component_stats(w, t1 - t0) for c, w in sorted(split.items())}
    if C_OTHERS in out:  # Kubernetes's own clients: only their volume is of interest here
        others = out[C_OTHERS]
        others["pollers"] = others["repeated_reads"] = []
        others["users"] = sorted(Counter(e.user for e in split[C_OTHERS].requests))
    return out


# ------------------------------------------------------------------------------------ measuring


def identities(cluster: str, consumer_id: str) -> dict[str, str]:
    if cluster == CONSUMER:
        return {"gpufed:controller": C_CONTROLLER, "gpufed:virtual-kubelet": C_VKS}
    return {"gpufed:controller": C_PROVIDER_CONTROLLER, f"gpufed:consumer:{consumer_id}": C_CONSUMER_IDENTITY}


def _usage(u: procstat.ProcessUsage) -> dict[str, Any]:
    return {
        "pid": u.pid,
        "rss_mb": round(u.rss_end_bytes / MB, 1),
        "rss_peak_mb": round(u.rss_peak_bytes / MB, 1),
        "cpu_s": round(u.cpu_end_s - u.cpu_start_s, 2),
        "cpu_cores": round(u.cpu_cores, 3),
        "gone": u.gone,
    }


def find_processes(env: LocalEnvironment, ids: Mapping[str, str], peered: list[str]) -> dict[str, int]:
    """name -> pid of the consumer's controller, each peered provider's virtual kubelet, gpu-1's controller."""
    want = {
        "controller": ("controller", f"--kubeconfig={env.kubeconfig_path(CONSUMER, CONTROLLER)}"),
        f"provider-controller:{peered[0]}": (
            "controller",
            f"--kubeconfig={env.kubeconfig_path(peered[0], CONTROLLER)}",
        ),
        **{f"vk:{p}": ("virtual-kubelet", f"--provider-cluster-id={ids[p]}") for p in peered},
    }
    out: dict[str, int] = {}
    for name, needles in want.items():
        pid = procstat.find_pid(*needles)
        if pid is None:
            raise RuntimeError(f"process not found: {name} ({' '.join(needles)})")
        out[name] = pid
    return out


async def measure(
    env: LocalEnvironment,
    ids: Mapping[str, str],
    peered: list[str],
    window_s: float,
    progress: Progress,
) -> dict[str, Any]:
    """One steady-state window: audit events of every API server, process usage; the client stays silent."""
    clusters = [CONSUMER, *peered]
    pids = find_processes(env, ids, peered)
    marks = {c: mark(env.audit_log_path(c)) for c in clusters}
    sampler = procstat.Sampler(pids)
    t0 = time.time()
    sampler.start()
    await asyncio.sleep(window_s)
    usage = sampler.stop()
    t1 = time.time()
    await asyncio.sleep(1.5)  # events of requests received before t1 that complete just after it
    servers: dict[str, Any] = {}
    for c in clusters:
        lines = await asyncio.to_thread(read_since, marks[c])
        events = parse_lines(lines)
        servers[c] = aggregate(events, t0, t1, identities(c, ids[CONSUMER]))
    progress(
        f"{len(peered)} provider(s): window of {t1 - t0:.1f}s; gpufed requests/s "
        + ", ".join(f"{c}: {sum(s[k]['rps'] for k in GPUFED if k in s):.2f}" for c, s in servers.items())
    )
    return {
        "providers": len(peered),
        "peered": peered,
        "window_s": round(t1 - t0, 2),
        "servers": servers,
        "processes": {n: _usage(u) for n, u in usage.items()},
        "summary": summarise(servers, {n: _usage(u) for n, u in usage.items()}, t1 - t0),
    }


def _sum_requests(
    servers: Mapping[str, Mapping[str, Any]], comps: Iterable[str], only: Iterable[str] | None = None
) -> float:
    keep = set(only) if only is not None else None
    total = 0.0
    for cluster, comp in servers.items():
        if keep is not None and cluster not in keep:
            continue
        total += sum(comp[c]["requests"] for c in comps if c in comp)
    return total


def summarise(servers: Mapping[str, Mapping[str, Any]], procs: Mapping[str, Any], window_s: float) -> dict[str, Any]:
    """The figures the comparison uses: requests/s per side, pollers, footprint."""
    providers = [c for c in servers if c != CONSUMER]
    consumer_reqs = _sum_requests(servers, GPUFED, [CONSUMER])
    provider_reqs = _sum_requests(servers, GPUFED, providers)
    pollers = [
        {"api_server": cluster, "component": comp, **p}
        for cluster, comps in servers.items()
        for comp, st in comps.items()
        if comp != C_OTHERS
        for p in st["pollers"]
    ]
    vks = {n.split(":", 1)[1]: u for n, u in procs.items() if n.startswith("vk:")}
    return {
        "gpufed_rps_consumer": _rate(int(consumer_reqs), window_s),
        "gpufed_rps_providers": _rate(int(provider_reqs), window_s),
        "gpufed_rps_total": _rate(int(consumer_reqs + provider_reqs), window_s),
        "gpufed_rps_per_provider": _rate(int(consumer_reqs + provider_reqs), window_s * max(1, len(providers))),
        "others_rps_total": _rate(int(_sum_requests(servers, (C_OTHERS,))), window_s),
        "gpufed_writes": sum(st["writes"] for comps in servers.values() for c, st in comps.items() if c in GPUFED),
        "gpufed_watch_starts": sum(
            st["watch_starts"] for comps in servers.values() for c, st in comps.items() if c in GPUFED
        ),
        "pollers": pollers,
        "controller": procs.get("controller"),
        "vk_rss_mb_mean": round(sum(u["rss_mb"] for u in vks.values()) / len(vks), 1) if vks else None,
        "vk_rss_mb_max": max((u["rss_peak_mb"] for u in vks.values()), default=None),
        "vk_cores_mean": round(sum(u["cpu_cores"] for u in vks.values()) / len(vks), 3) if vks else None,
        "vk_cores_max": max((u["cpu_cores"] for u in vks.values()), default=None),
    }


def _ratio(a: float | None, b: float | None) -> float | None:
    return round(b / a, 2) if a and b is not None else None


def compare(one: Mapping[str, Any], many: Mapping[str, Any]) -> dict[str, Any]:
    """How the figures grow from the first phase to the second: ratio, and per added provider."""
    added = many["providers"] - one["providers"]
    s1, s5 = one["summary"], many["summary"]
    rows: dict[str, Any] = {}
    pairs = {
        "controller_rss_mb": ((s1["controller"] or {}).get("rss_mb"), (s5["controller"] or {}).get("rss_mb")),
        "controller_cores": ((s1["controller"] or {}).get("cpu_cores"), (s5["controller"] or {}).get("cpu_cores")),
        "vk_rss_mb_mean": (s1["vk_rss_mb_mean"], s5["vk_rss_mb_mean"]),
        "vk_cores_mean": (s1["vk_cores_mean"], s5["vk_cores_mean"]),
        "gpufed_rps_consumer": (s1["gpufed_rps_consumer"], s5["gpufed_rps_consumer"]),
        "gpufed_rps_providers": (s1["gpufed_rps_providers"], s5["gpufed_rps_providers"]),
        "gpufed_rps_total": (s1["gpufed_rps_total"], s5["gpufed_rps_total"]),
        "gpufed_rps_per_provider": (s1["gpufed_rps_per_provider"], s5["gpufed_rps_per_provider"]),
    }
    for k, (a, b) in pairs.items():
        rows[k] = {
            "one": a,
            "many": b,
            "ratio": _ratio(a, b),
            "per_added_provider": round((b - a) / added, 3) if a is not None and b is not None and added else None,
        }
    return rows


def verdicts(phases: Sequence[Mapping[str, Any]], pods_per_vk: int) -> dict[str, Any]:
    last = phases[-1]["summary"]
    # Distinct series (API server, component, what): one poller seen in both windows counts once.
    pollers = len(
        {
            tuple(p[k] for k in ("api_server", "component", "verb", "resource", "namespace", "name", "selectors"))
            for ph in phases
            for p in ph["summary"]["pollers"]
        }
    )
    out: dict[str, Any] = {
        "pollers": {
            "value": pollers,
            "target": f"<= {TARGET_POLLERS_MAX} (a get/list of the same thing more than once per "
            f"{POLL_PERIOD_S:g} s, any gpufed component)",
            "met": pollers <= TARGET_POLLERS_MAX,
        }
    }
    for key, value, limit, unit in (
        ("vk_rss_mb", last["vk_rss_mb_max"], TARGET_VK_RSS_MB_MAX, "MB"),
        ("vk_cores", last["vk_cores_max"], TARGET_VK_CORES_MAX, "cores"),
    ):
        v: dict[str, Any] = {
            "value": value,
            "target": f"<= {limit:g} {unit} per virtual kubelet at {TARGET_AT_PODS} pods",
            "met": None,
            "note": f"measured at {pods_per_vk} pods per virtual kubelet (worst of them)",
        }
        if value is not None and value > limit:
            v["met"] = False
            v["note"] = f"already above at {pods_per_vk} pods"
        out[key] = v
    return out


# ------------------------------------------------------------------------------------ the part


async def _all_running(api: Any, namespace: str) -> tuple[int, int]:
    pods = await rest.list_items(api, f"/api/v1/namespaces/{namespace}/pods")
    return len(pods), sum(1 for p in pods if (p.get("status") or {}).get("phase") == "Running")


async def _run(env: LocalEnvironment, opts: ApiCostOptions, progress: Progress) -> dict[str, Any]:
    t_start = time.monotonic()
    await env.up(progress)
    t_up = time.monotonic() - t_start
    kc = env.merged_kubeconfig
    names = provider_names(opts.providers)
    grant_pods = str(opts.pods_per_provider + 50)
    phases: list[dict[str, Any]] = []
    timings: dict[str, float] = {"clusters_up_s": round(t_up, 1)}
    async with contextlib.AsyncExitStack() as stack:
        consumer = await stack.enter_async_context(api_client(kc, CONSUMER))
        providers = {n: await stack.enter_async_context(api_client(kc, n)) for n in names}
        ids = {CONSUMER: await cluster_id(consumer)}
        for n, api in providers.items():
            ids[n] = await cluster_id(api)

        async def peer_one(name: str) -> None:
            await peer(kc, provider=name, pods=opts.pods_per_provider + 50, gpus=GPUS_PER_PROVIDER, cpu="32",
                       memory="128Gi")  # fmt: skip

        async def fill(batch: list[str], prefix: str) -> dict[str, Any]:
            twins = {n: await twin_namespace(providers[n], ids[CONSUMER], NAMESPACE, n) for n in batch}
            b = await burst(
                consumer,
                NAMESPACE,
                opts.pods_per_provider * len(batch),
                [f"gpufed-{ids[n]}" for n in batch],
                prefix=prefix,
                tolerate=True,
                concurrency=opts.concurrency,
            )
            s = b.summary()
            if s["running"] < s["pods"]:
                raise RuntimeError(f"only {s['running']} of {s['pods']} pods Running ({s})")
            return {"twins": twins, "pods": s["pods"], "all_running_s": s["all_running_s"]}

        first, others_ = names[:1], names[1:]
        t = time.monotonic()
        progress(f"peering {CONSUMER} ({ids[CONSUMER]}) with {first[0]} ({ids[first[0]]})")
        await peer_one(first[0])
        await ensure_namespace(consumer, NAMESPACE)
        code, out = await gpufed_cli("offload-namespace", NAMESPACE, "--kubeconfig", str(kc), "--context", CONSUMER)
        if code != 0:
            raise RuntimeError(f"gpufed offload-namespace failed ({code}):\n{out}")
        timings["peer_and_offload_1_s"] = round(time.monotonic() - t, 1)
        filled = [await fill(first, "p1-")]
        progress(f"{filled[0]['pods']} pods Running on {first[0]} after {filled[0]['all_running_s']}s; settling")
        log_offsets = procstat.log_offsets(env.log_path(CONSUMER, CONTROLLER))
        await asyncio.sleep(opts.settle_s)
        phases.append(await measure(env, ids, first, opts.window_s, progress))

        if others_:
            t = time.monotonic()
            progress(f"peering {CONSUMER} with {', '.join(others_)} (concurrently)")
            await asyncio.gather(*(peer_one(n) for n in others_))
            timings["peer_others_s"] = round(time.monotonic() - t, 1)
            filled.append(await fill(others_, "p5-"))
            progress(f"{filled[-1]['pods']} more pods Running on {len(others_)} providers; settling")
            await asyncio.sleep(opts.settle_s)
            phases.append(await measure(env, ids, names, opts.window_s, progress))
        total, running = await _all_running(consumer, NAMESPACE)
        logs = [log_findings(p, off) for p, off in log_offsets.items()]

    timings["total_s"] = round(time.monotonic() - t_start, 1)
    return {
        "part": "api-cost",
        "environment": {
            "consumer": f"{CONSUMER} ({ids[CONSUMER]}): 1 kwok CPU node",
            "providers": {
                n: f"{n} ({ids[n]}): 1 kwok node x {GPUS_PER_PROVIDER} {GPU_PRODUCT}, peered with --gpus "
                f"{GPUS_PER_PROVIDER} --pods {grant_pods}"
                for n in names
            },
            "namespace": NAMESPACE,
            "pods_per_provider": opts.pods_per_provider,
            "pods_total": opts.pods_per_provider * len(names),
            "window_s": opts.window_s,
            "settle_s": opts.settle_s,
            "poll_period_s": POLL_PERIOD_S,
            "state_dir": _shown(env.state_dir),
            "base_port": opts.base_port,
            "audit": "kube-apiserver --audit-log-* (level Metadata, omitStages RequestReceived, JSON)",
        },
        "fills": filled,
        "pods_at_end": {"total": total, "running": running},
        "targets": {
            "vk_rss_mb_max": TARGET_VK_RSS_MB_MAX,
            "vk_cores_max": TARGET_VK_CORES_MAX,
            "at_pods": TARGET_AT_PODS,
            "pollers_max": TARGET_POLLERS_MAX,
        },
        "phases": phases,
        "growth": compare(phases[0], phases[-1]) if len(phases) > 1 else None,
        "verdicts": verdicts(phases, opts.pods_per_provider),
        "logs": logs,
        "timings": timings,
    }


def _shown(path: Path) -> str:
    try:
        return str(path.resolve().relative_to(REPO))
    except ValueError:
        return str(path)


class _Environment(LocalEnvironment):
    """The local environment with a wider kubelet port range for the consumer's virtual kubelets.

    The launcher gives each cluster 11 kubelet ports (topology `ClusterPorts.kubelet_ports`) and the
    controller's supervisor takes 3 per virtual kubelet, so a consumer there runs at most 3 of them.
    Here the consumer's controller gets `kubelet_port_range` instead: 3 ports per provider, right after
    the last cluster's block of ports. Nothing else of the command changes."""

    def kubelet_port_range(self) -> tuple[int, int]:
        first = self.topology.base_port + PORTS_PER_CLUSTER * len(self.topology.clusters)
        return first, first + PORTS_PER_VIRTUAL_KUBELET * (len(self.topology.clusters) - 1) - 1

    def _command(self, spec: ClusterSpec, component: str) -> list[str]:
        cmd = super()._command(spec, component)
        if component == CONTROLLER and spec.name == CONSUMER:
            first, last = self.kubelet_port_range()
            cmd = [f"--kubelet-ports={first}-{last}" if a.startswith("--kubelet-ports=") else a for a in cmd]
        return cmd


def environment(opts: ApiCostOptions) -> LocalEnvironment:
    return _Environment(
        LocalSettings(
            opts.state_dir,
            opts.bin_dir,
            build_script=REPO / "deploy" / "local" / "build.sh",
            manifests_dir=REPO / "deploy",
            audit=True,
        ),
        apicost_topology(opts.base_port, opts.providers),
    )


def run(opts: ApiCostOptions, progress: Progress) -> dict[str, Any]:
    """Start the api-cost environment, measure both phases, stop the environment unless `opts.keep`."""
    if opts.providers < 1 or opts.pods_per_provider < 1 or opts.window_s <= 0:
        raise ValueError("api-cost wants at least 1 provider, 1 pod per provider and a positive window")
    env = environment(opts)
    try:
        return asyncio.run(_run(env, opts, progress))
    finally:
        if opts.keep:
            progress(
                f"leaving the api-cost clusters running (state in {env.state_dir}; KUBECONFIG={env.merged_kubeconfig})"
            )
        else:
            env.down(progress)


# ------------------------------------------------------------------------------------ rendering


def _f(v: Any, unit: str = "") -> str:
    if v is None:
        return "—"
    return f"{v:g}{unit}" if isinstance(v, (int, float)) else str(v)


def _verdict(v: Mapping[str, Any]) -> str:
    met = v.get("met")
    text = "n/a" if met is None else ("**met**" if met else "**missed**")
    return f"{text} ({v['note']})" if v.get("note") else text


def _merge(stats: Iterable[Mapping[str, Any]], window_s: float) -> dict[str, Any]:
    """Several API servers' stats of one component as one row (sums)."""
    verbs: Counter[str] = Counter()
    resources: dict[str, int] = defaultdict(int)
    n = watch_ends = 0
    pollers = 0
    for s in stats:
        n += s["requests"]
        verbs.update(s["by_verb"])
        watch_ends += s["watch_ends"]
        pollers += len(s["pollers"])
        for r in s["top_resources"]:
            resources[r["resource"]] += r["requests"]
    top = sorted(resources.items(), key=lambda kv: (-kv[1], kv[0]))[:3]
    return {
        "rps": _rate(n, window_s),
        "verbs": {v: _rate(c, window_s) for v, c in verbs.items()},
        "top": ", ".join(f"{r} {_rate(c, window_s):g}" for r, c in top) or "—",
        "watch_ends": watch_ends,
        "pollers": pollers,
    }


def table(data: Mapping[str, Any]) -> str:
    """The part's section as markdown: requests/s per component and API server, growth, footprint, pollers."""
    env, phases = data["environment"], data["phases"]
    lines = [
        "## api-cost: API requests and footprint at steady state, 1 and 5 providers",
        "",
        f"Counted from the API servers' audit logs over a {env['window_s']:g} s window after a "
        f"{env['settle_s']:g} s settle, {env['pods_per_provider']} pods Running per provider (every virtual kubelet "
        f"has {env['pods_per_provider']} pods in both phases), nothing changing. A watch counts once, when it starts. "
        "Requests/s, nothing subtracted; the provider rows sum every peered provider's API server.",
        "",
        "| providers | API server | who | req/s | " + " | ".join(VERBS) + " | other | top resources (req/s) | "
        "watch ends | pollers |",
        "|---|---|---|---|" + "---|" * len(VERBS) + "---|---|---|---|",
    ]
    for ph in phases:
        w = ph["window_s"]
        servers = ph["servers"]
        provs = [c for c in servers if c != CONSUMER]
        groups = [
            (CONSUMER, [servers[CONSUMER]], (C_CONTROLLER, C_VKS, C_OTHERS)),
            (
                provs[0] if len(provs) == 1 else f"{provs[0]}..{provs[-1]} (sum of {len(provs)})",
                [servers[c] for c in provs],
                (C_PROVIDER_CONTROLLER, C_CONSUMER_IDENTITY, C_OTHERS),
            ),
        ]
        for server, stats, comps in groups:
            for comp in comps:
                m = _merge([s[comp] for s in stats if comp in s], w)
                other = sum(v for k, v in m["verbs"].items() if k not in VERBS)
                lines.append(
                    f"| {ph['providers']} | {server} | {LABELS[comp]} | **{_f(m['rps'])}** | "
                    + " | ".join(_f(m["verbs"].get(v, 0)) for v in VERBS)
                    + f" | {_f(round(other, 3))} | {m['top']} | {m['watch_ends']} | "
                    + ("—" if comp == C_OTHERS else str(m["pollers"]))
                    + " |"
                )
    g = data.get("growth")
    if g:
        n1, n5 = phases[0]["providers"], phases[-1]["providers"]
        lines += [
            "",
            f"Growth from {n1} to {n5} providers ({env['pods_per_provider'] * n1} to {env['pods_total']} pods):",
            "",
            f"| figure | {n1} provider | {n5} providers | ratio | per added provider |",
            "|---|---|---|---|---|",
        ]
        names = {
            "gpufed_rps_consumer": "gpufed req/s to the consumer API server",
            "gpufed_rps_providers": "gpufed req/s to the provider API servers (sum)",
            "gpufed_rps_total": "gpufed req/s, total",
            "gpufed_rps_per_provider": "gpufed req/s, total per provider",
            "controller_rss_mb": "consumer controller RSS (MB, end of window)",
            "controller_cores": "consumer controller CPU (cores over the window)",
            "vk_rss_mb_mean": "virtual kubelet RSS (MB, mean of all)",
            "vk_cores_mean": "virtual kubelet CPU (cores, mean of all)",
        }
        for k, label in names.items():
            r = g[k]
            lines.append(
                f"| {label} | {_f(r['one'])} | {_f(r['many'])} | {_f(r['ratio'])} | {_f(r['per_added_provider'])} |"
            )
    lines += [
        "",
        "Footprint per process (over each window):",
        "",
        "| providers | process | RSS MB (peak) | CPU cores |",
    ]
    lines.append("|---|---|---|---|")
    for ph in phases:
        for name, u in ph["processes"].items():
            lines.append(
                f"| {ph['providers']} | {name} | {_f(u['rss_mb'])} ({_f(u['rss_peak_mb'])}) | {_f(u['cpu_cores'])} |"
            )
    vd = data["verdicts"]
    lines += [
        "",
        "| target | measured | verdict |",
        "|---|---|---|",
        f"| virtual kubelet RSS {vd['vk_rss_mb']['target']} | {_f(vd['vk_rss_mb']['value'], ' MB')} | "
        f"{_verdict(vd['vk_rss_mb'])} |",
        f"| virtual kubelet CPU {vd['vk_cores']['target']} | {_f(vd['vk_cores']['value'], ' cores')} | "
        f"{_verdict(vd['vk_cores'])} |",
        f"| pollers {vd['pollers']['target']} | {vd['pollers']['value']} | {_verdict(vd['pollers'])} |",
        "",
    ]
    pollers = [(ph["providers"], p) for ph in phases for p in ph["summary"]["pollers"]]
    if pollers:
        lines += ["Pollers (flagged by name):", ""]
        for n, p in pollers:
            lines.append(
                f"- {n} provider(s), {p['api_server']}, {LABELS[p['component']]}: `{_what(p)}` "
                f"{p['count']} times in the window (every {p['every_s']:g} s)"
            )
        lines.append("")
    first = phases[0]
    periodic = [
        (server, comp, r)
        for server, comps in first["servers"].items()
        for comp, st in comps.items()
        if comp != C_OTHERS
        for r in st.get("repeated_reads") or []
        if not r["flagged"]
    ]
    if periodic:
        lines += [
            f"Repeated reads at most once per {POLL_PERIOD_S:g} s (not flagged; {first['providers']} provider(s), "
            "every such series of the window):",
            "",
        ]
        for server, comp, r in periodic:
            lines.append(f"- {server}, {LABELS[comp]}: `{_what(r)}` {r['count']} times (every {r['every_s']:g} s)")
        later = sum(
            1
            for comps in phases[-1]["servers"].values()
            for comp, st in comps.items()
            if comp != C_OTHERS
            for r in st.get("repeated_reads") or []
            if not r["flagged"]
        )
        if len(phases) > 1:
            lines.append(f"- at {phases[-1]['providers']} providers: {later} such series in all")
        lines.append("")
    lines += [
        "Identities: on a provider, the consumer's controller and its virtual kubelet for that provider both "
        "authenticate as `gpufed:consumer:<id>` and send the same User-Agent "
        f"({', '.join(f'`{a}`' for a in _agents(phases)) or 'none seen'}), so they share a row; on the consumer, all "
        "virtual kubelets share `gpufed:virtual-kubelet`.",
        "",
    ]
    return "\n".join(lines)


def _what(r: Mapping[str, Any]) -> str:
    """`get secrets gpufed/name (labelSelector=...)`: one repeated read."""
    ns, name = r["namespace"], r["name"]
    where = f"{ns}/{name}" if ns and name else (f"in {ns}" if ns else name)
    sel = f" ({r['selectors']})" if r["selectors"] else ""
    return f"{r['verb']} {r['resource']} {where}".strip() + sel


def _agents(phases: Iterable[Mapping[str, Any]]) -> list[str]:
    agents: set[str] = set()
    for ph in phases:
        for comps in ph["servers"].values():
            agents.update((comps.get(C_CONSUMER_IDENTITY) or {}).get("user_agents") or [])
    return sorted(agents)


if __name__ == "__main__":
    import sys

    from bench import report

    started = time.monotonic()

    def _progress(msg: str) -> None:
        print(f"[api-cost {time.monotonic() - started:6.1f}s] {msg}", flush=True)

    o = ApiCostOptions(
        bin_dir=Path(os.environ.get("GPUFED_BIN_DIR", REPO / ".cache" / "bin")),
        window_s=float(os.environ.get("APICOST_WINDOW_S", DEFAULT_WINDOW_S)),
        keep="--keep" in sys.argv,
    )
    machine = report.machine_info(o.bin_dir, o.state_dir)
    result = run(o, _progress)
    result["machine"] = machine
    print(table(result))
    print(f"wrote {report.write_result('api-cost', result)}")
