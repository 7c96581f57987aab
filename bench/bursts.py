"""Bursts of pods against one namespace, observed with one watch: the bench parts' shared load.

Owns: `Burst` (one burst's raw observations and their summary: time to all Running, per-pod start
latency quantiles, the sampled processes), `pod_body` (a bench pod, pre-bound or for the scheduler),
`burst` (N pods created with bounded concurrency, all at once or paced at a rate, until all are
Running), `delete_all` (a namespace's pods deleted with a grace period, watched until they and their
twins are gone), and the small helpers the parts share (`until`, `percentile`).

Does not: start environments, judge targets or write results (the parts do).
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from bench import procstat
from gpufed.kube import rest
from gpufed.kube.client import KubeError
from gpufed.kube.watch import watch

TOLERATION = {"key": "gpufed.io/virtual-node", "operator": "Exists", "effect": "NoExecute"}
REQUESTS = {"cpu": "10m", "memory": "16Mi"}
MB = 1024 * 1024


async def until(what: str, probe: Callable[[], Any], limit_s: float, interval: float = 0.5) -> Any:
    """Poll the coroutine function `probe` until it returns something truthy."""
    deadline = time.monotonic() + limit_s
    last: Any = None
    while time.monotonic() < deadline:
        last = await probe()
        if last:
            return last
        await asyncio.sleep(interval)
    raise RuntimeError(f"timed out after {limit_s:.0f}s waiting for {what} (last: {last!r})")


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100) of a non-empty list."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q / 100 * len(ordered)) - 1)]


@dataclass
class Burst:
    """One burst's raw observations (client-side monotonic times)."""

    pods: int
    t0: float = 0.0
    created_at_end: float = 0.0
    create_returned: dict[str, float] | None = None
    running_seen: dict[str, float] | None = None
    failed: int = 0
    create_errors: list[str] | None = None
    timed_out: bool = False
    usage: dict[str, procstat.ProcessUsage] | None = None

    def summary(self) -> dict[str, Any]:
        created = self.create_returned or {}
        running = self.running_seen or {}
        lat = [max(0.0, running[n] - created[n]) for n in running if n in created]
        end = max(running.values()) if running else self.t0
        all_running_s = end - self.t0 if len(running) >= self.pods else None
        out: dict[str, Any] = {
            "pods": self.pods,
            "created": len(created),
            "running": len(running),
            "failed": self.failed,
            "create_errors": len(self.create_errors or []),
            "first_create_errors": (self.create_errors or [])[:3],
            "timed_out": self.timed_out,
            "create_s": round(self.created_at_end - self.t0, 3),
            "all_running_s": round(all_running_s, 3) if all_running_s is not None else None,
            "pods_per_s": round(self.pods / all_running_s, 1) if all_running_s else None,
            "latency_s": {
                "p50": round(percentile(lat, 50), 3),
                "p90": round(percentile(lat, 90), 3),
                "p99": round(percentile(lat, 99), 3),
                "max": round(max(lat), 3),
            }
            if lat
            else None,
            # 21 evenly spaced quantiles (0, 5, ..., 100 %) for the latency plots; small enough for the JSON.
            "latency_quantiles_s": [round(percentile(lat, q), 3) if q else round(min(lat), 3) for q in range(0, 101, 5)]
            if lat
            else None,
        }
        if self.usage:
            out["processes"] = {
                name: {
                    "pid": u.pid,
                    "rss_start_mb": round(u.rss_start_bytes / MB, 1),
                    "rss_peak_mb": round(u.rss_peak_bytes / MB, 1),
                    "rss_end_mb": round(u.rss_end_bytes / MB, 1),
                    "cpu_s": round(u.cpu_end_s - u.cpu_start_s, 2),
                    "cpu_cores": round(u.cpu_cores, 2),
                    "wall_s": round(u.wall_s, 3),
                    "gone": u.gone,
                }
                for name, u in self.usage.items()
            }
        return out


def pod_body(name: str, namespace: str, node: str | None, *, tolerate: bool) -> dict[str, Any]:
    """A bench pod; pre-bound to `node`, or left to the scheduler when `node` is None."""
    spec: dict[str, Any] = {
        "containers": [{"name": "main", "image": "registry.example/bench:1", "resources": {"requests": REQUESTS}}],
    }
    if node is not None:
        spec["nodeName"] = node
    if tolerate:
        spec["tolerations"] = [dict(TOLERATION)]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "labels": {"app": "gpufed-bench"}},
        "spec": spec,
    }


async def burst(
    api: Any,
    namespace: str,
    n: int,
    nodes: list[str],
    *,
    prefix: str,
    tolerate: bool,
    concurrency: int,
    sample: dict[str, int] | None = None,
    bind: bool = True,
    rate: float | None = None,
) -> Burst:
    """Create N pods (pre-bound round-robin to `nodes`, or for the scheduler when not `bind`), all at
    once (`concurrency` at a time) or paced at `rate` pods per second (the i-th create is due i/rate
    seconds after the first, so the arrivals are steady whatever each create's latency); wait
    until all are Running (or time out)."""
    b = Burst(n, create_returned={}, running_seen={}, create_errors=[])
    assert b.running_seen is not None and b.create_returned is not None and b.create_errors is not None
    running, created, errors = b.running_seen, b.create_returned, b.create_errors
    failed: set[str] = set()
    synced, done = asyncio.Event(), asyncio.Event()

    def on_event(kind: str, obj: dict[str, Any]) -> None:
        name = obj["metadata"]["name"]
        if not name.startswith(prefix) or kind == "DELETED":
            return
        phase = (obj.get("status") or {}).get("phase")
        if phase == "Running" and name not in running:
            running[name] = time.monotonic()
            if len(running) >= n:
                done.set()
        elif phase == "Failed":
            failed.add(name)

    path = f"/api/v1/namespaces/{namespace}/pods"
    watcher = asyncio.create_task(watch(api, path, on_event, what=f"pods in {namespace}", on_synced=synced.set))
    try:
        await asyncio.wait_for(synced.wait(), 30)
        sem = asyncio.Semaphore(concurrency)
        sampler = procstat.Sampler(sample) if sample else None

        async def create(i: int) -> None:
            name = f"{prefix}{i:05d}"
            if rate:
                await asyncio.sleep(max(0.0, b.t0 + i / rate - time.monotonic()))
            async with sem:
                try:
                    await rest.request(
                        api,
                        "POST",
                        path,
                        body=pod_body(name, namespace, nodes[i % len(nodes)] if bind else None, tolerate=tolerate),
                    )
                except KubeError as e:
                    errors.append(str(e))
                    return
                created[name] = time.monotonic()

        b.t0 = time.monotonic()
        if sampler:
            sampler.start()
        async with asyncio.TaskGroup() as tg:
            for i in range(n):
                tg.create_task(create(i))
        b.created_at_end = time.monotonic()
        try:
            await asyncio.wait_for(done.wait(), 60 + 1.0 * n)
        except TimeoutError:
            b.timed_out = True
        if sampler:
            b.usage = sampler.stop()
        b.failed = len(failed)
    finally:
        watcher.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await watcher
    return b


#: Collection deletes sent before giving up when the API server's own request timeout ends each.
COLLECTION_DELETE_ATTEMPTS = 5


async def delete_all(
    api: Any,
    namespace: str,
    remote_api: Any = None,
    twin_ns: str | None = None,
    *,
    grace_s: int | None = 0,
    limit_s: float = 600,
) -> float:
    """Delete the namespace's pods with grace period `grace_s` (None: each pod's own, 30 s by default)
    in one collection delete, and wait, watching rather than listing, until they and their twins are
    gone; seconds it took."""
    watched = [(api, f"/api/v1/namespaces/{namespace}/pods")]
    if twin_ns and remote_api is not None:
        watched.append((remote_api, f"/api/v1/namespaces/{twin_ns}/pods"))
    left: list[set[str]] = [set() for _ in watched]
    synced = [asyncio.Event() for _ in watched]
    empty = asyncio.Event()

    def handler(i: int) -> Callable[[str, dict[str, Any]], None]:
        def on_event(kind: str, obj: dict[str, Any]) -> None:
            name = obj["metadata"]["name"]
            if kind == "DELETED":
                left[i].discard(name)
            else:
                left[i].add(name)
            if all(e.is_set() for e in synced) and not any(left):
                empty.set()

        return on_event

    def synced_cb(i: int) -> Callable[[], None]:
        def done() -> None:
            synced[i].set()
            if all(e.is_set() for e in synced) and not any(left):
                empty.set()

        return done

    watchers = [
        asyncio.create_task(watch(a, path, handler(i), what=f"pods of {path}", on_synced=synced_cb(i)))
        for i, (a, path) in enumerate(watched)
    ]
    try:
        for e in synced:
            await asyncio.wait_for(e.wait(), 60)
        t0 = time.monotonic()
        params = {} if grace_s is None else {"gracePeriodSeconds": str(grace_s)}
        for attempt in range(1, COLLECTION_DELETE_ATTEMPTS + 1):
            try:
                # A collection delete of thousands of pods outlasts the default request timeout.
                await rest.request(
                    api, "DELETE", f"/api/v1/namespaces/{namespace}/pods", params=params, request_timeout=600
                )
                break
            except KubeError as e:
                if not e.status:
                    break  # no answer in time: the API server carries on deleting
                if e.status != 504 or attempt == COLLECTION_DELETE_ATTEMPTS:
                    raise
                # The API server's own request timeout (60 s) ended the request, perhaps midway: the
                # pods it reached are being deleted, and asking again deletes the rest.
                print(f"  collection delete of {namespace}'s pods timed out at the API server; again", flush=True)
        await asyncio.wait_for(empty.wait(), limit_s)
        return time.monotonic() - t0
    finally:
        for w in watchers:
            w.cancel()
        for w in watchers:
            with contextlib.suppress(asyncio.CancelledError):
                await w
