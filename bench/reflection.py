"""The `reflection` part: how long a local change takes to reach the provider copy, per kind, under a
steady change rate.

Owns: the measurement on the bench environment (the same topology and namespace as `offload`:
consumer -> gpu-a, `bench-vk` offloaded): K objects of a kind in the offloaded namespace (ConfigMaps;
EndpointSlices of a reflected Service), updated round-robin at R changes/s for D seconds with the
admin identity, each change stamped with a sequence number (annotation `bench.gpufed.io/seq`). Two
watches observe every change: one on the consumer (baseline: the API server's own write -> watch
delay, which any controller pays) and one on the provider's twin namespace (the reflected copy).
Latency per change = the watch event's arrival minus the moment the local write returned.

Targets: p99 <= 500 ms per kind. Does not: tune the product; a missed target is reported as missed.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench import offload
from bench.bursts import percentile, until
from bench.offload import CONSUMER, PROVIDER, VK_NS
from gpufed.kube import rest
from gpufed.kube.client import api_client
from gpufed.kube.watch import watch
from gpufed.localenv.launcher import LocalEnvironment

SEQ = "bench.gpufed.io/seq"
DEFAULT_RATE = 20.0
DEFAULT_DURATION_S = 20.0
DEFAULT_OBJECTS = 20
#: Seconds to wait for the last changes to arrive after the writes stop.
DRAIN_S = 5.0
TARGET_P99_MS = 500.0
SERVICE = "bench-reflect"

Progress = Callable[[str], None]


@dataclass(frozen=True)
class ReflectionOptions:
    state_dir: Path
    bin_dir: Path
    base_port: int
    rate: float = DEFAULT_RATE
    duration_s: float = DEFAULT_DURATION_S
    objects: int = DEFAULT_OBJECTS
    keep: bool = False


@dataclass(frozen=True)
class KindUnderTest:
    kind: str
    api_version: str
    plural: str

    def path(self, namespace: str, name: str = "") -> str:
        return rest.path(self.api_version, self.plural, name, namespace=namespace)

    def body(self, namespace: str, name: str, seq: int) -> dict[str, Any]:
        meta = {"name": name, "namespace": namespace, "annotations": {SEQ: str(seq)}}
        if self.kind == "ConfigMap":
            return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta, "data": {"seq": str(seq)}}
        meta["labels"] = {
            "kubernetes.io/service-name": SERVICE,
            "endpointslice.kubernetes.io/managed-by": "bench.gpufed.io",
        }
        address = f"10.71.{seq // 250 % 250}.{seq % 250 + 1}"
        return {
            "apiVersion": "discovery.k8s.io/v1",
            "kind": "EndpointSlice",
            "metadata": meta,
            "addressType": "IPv4",
            "endpoints": [{"addresses": [address], "conditions": {"ready": True}}],
            "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}],
        }


KINDS = (
    KindUnderTest("ConfigMap", "v1", "configmaps"),
    KindUnderTest("EndpointSlice", "discovery.k8s.io/v1", "endpointslices"),
)


def _stats(latencies_ms: list[float]) -> dict[str, Any]:
    if not latencies_ms:
        return {"n": 0}
    return {
        "n": len(latencies_ms),
        "p50_ms": round(percentile(latencies_ms, 50), 1),
        "p90_ms": round(percentile(latencies_ms, 90), 1),
        "p99_ms": round(percentile(latencies_ms, 99), 1),
        "max_ms": round(max(latencies_ms), 1),
    }


async def _measure(
    consumer: Any, provider: Any, twin_ns: str, kind: KindUnderTest, opts: ReflectionOptions, progress: Progress
) -> dict[str, Any]:
    names = [f"bench-{kind.plural}-{i}" for i in range(opts.objects)]
    for name in names:
        await rest.apply(consumer, kind.path(VK_NS, name), kind.body(VK_NS, name, -1))

    async def reflected() -> bool:
        items = await rest.list_items(provider, kind.path(twin_ns))
        return {i["metadata"]["name"] for i in items} >= set(names)

    await until(f"{opts.objects} {kind.plural} reflected", reflected, 120)
    written: dict[int, float] = {}
    seen: dict[str, dict[int, float]] = {"local": {}, "remote": {}}

    def observer(side: str) -> Callable[[str, dict[str, Any]], None]:
        def on_event(t: str, obj: dict[str, Any]) -> None:
            if t not in ("ADDED", "MODIFIED"):
                return
            raw = (obj["metadata"].get("annotations") or {}).get(SEQ)
            if raw is not None and int(raw) >= 0:
                seen[side].setdefault(int(raw), time.monotonic())

        return on_event

    synced = {"local": asyncio.Event(), "remote": asyncio.Event()}
    watches = [
        asyncio.create_task(watch(api, kind.path(ns), observer(side), what=f"bench {side}", on_synced=synced[side].set))
        for side, api, ns in (("local", consumer, VK_NS), ("remote", provider, twin_ns))
    ]
    try:
        await asyncio.wait_for(asyncio.gather(*(e.wait() for e in synced.values())), 60)
        total = int(opts.rate * opts.duration_s)
        progress(f"reflection: {total} {kind.kind} changes at {opts.rate:g}/s over {opts.objects} objects")
        start = time.monotonic()
        for seq in range(total):
            await asyncio.sleep(max(0.0, start + seq / opts.rate - time.monotonic()))
            name = names[seq % len(names)]
            await rest.apply(consumer, kind.path(VK_NS, name), kind.body(VK_NS, name, seq))
            written[seq] = time.monotonic()
        achieved = total / (time.monotonic() - start)
        await asyncio.sleep(DRAIN_S)
    finally:
        for w in watches:
            w.cancel()
        for w in watches:
            with contextlib.suppress(asyncio.CancelledError):
                await w
    out: dict[str, Any] = {"changes": len(written), "rate_per_s": round(achieved, 1)}
    for side in ("local", "remote"):
        lat = [max(0.0, (seen[side][s] - t) * 1000) for s, t in written.items() if s in seen[side]]
        out[side] = {**_stats(lat), "unobserved": len(written) - len(lat)}
    p99 = out["remote"].get("p99_ms")
    out["verdict"] = {"target_p99_ms": TARGET_P99_MS, "p99_ms": p99, "met": p99 is not None and p99 <= TARGET_P99_MS}
    for name in names:
        await rest.delete(consumer, kind.path(VK_NS, name))
    return out


async def _run(env: LocalEnvironment, opts: ReflectionOptions, progress: Progress) -> dict[str, Any]:
    await env.up(progress)
    kc = env.merged_kubeconfig
    async with api_client(kc, CONSUMER) as consumer, api_client(kc, PROVIDER) as provider:
        ids = {CONSUMER: await offload.cluster_id(consumer), PROVIDER: await offload.cluster_id(provider)}
        await offload.peer(kc, pods=110)
        await offload.ensure_namespace(consumer, VK_NS)
        how, twin_ns = await offload.offload_namespace(env, consumer, provider, ids)
        progress(f"{VK_NS} offloaded ({how}); twin namespace {PROVIDER}/{twin_ns}")
        await rest.apply(
            consumer,
            rest.path("v1", "services", SERVICE, namespace=VK_NS),
            {
                "apiVersion": "v1",
                "kind": "Service",
                "metadata": {"name": SERVICE, "namespace": VK_NS},
                "spec": {"ports": [{"name": "http", "port": 80, "targetPort": 8080}]},
            },
        )
        kinds = {k.kind: await _measure(consumer, provider, twin_ns, k, opts, progress) for k in KINDS}
    return {
        "part": "reflection",
        "environment": {"twin_namespace": twin_ns, "objects": opts.objects, "duration_s": opts.duration_s},
        "targets": {"p99_ms_max": TARGET_P99_MS},
        "kinds": kinds,
    }


def run(opts: ReflectionOptions, progress: Progress) -> dict[str, Any]:
    env = offload.environment(opts.state_dir, opts.bin_dir, opts.base_port)
    try:
        return asyncio.run(_run(env, opts, progress))
    finally:
        if not opts.keep:
            env.down(progress)
