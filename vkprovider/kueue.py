"""Kueue over the federated pool (consumer side): gpufed keeps Kueue's flavors and GPU quotas in line
with what the providers granted.

Owns, while Kueue's API is served (looked for every `retry_s` until it is):
- one ResourceFlavor per pool virtual node (`gpupool.flavors.flavor`: pinned to that node, tolerating
  virtual nodes), created when the pool appears and deleted when it goes; Kueue admits a whole
  workload to one flavor, so an admitted Job lands on one provider and GPU product;
- the nominal GPU quota of every ClusterQueue in those flavors: never more, summed over all
  ClusterQueues, than the flavor's GPUs and the provider's grant (`gpupool.flavors.clamp`). What a
  ClusterQueue asked is kept in its annotation `gpufed.io/requested-gpu-quota` (JSON, flavor ->
  GPUs) when gpufed lowers it, and given back as far as the grant allows when the grant grows; an
  edit of the quota by its owner is a new ask. Each change is a Warning Event `GPUQuotaClamped` (or
  Normal `GPUQuotaRestored`) on the ClusterQueue. A changed grant reaches the quotas within
  `debounce_s` of the virtual node's figures changing.

Does not: create ClusterQueues or LocalQueues (the cluster's admins do), admit workloads (Kueue
does), or touch flavors it did not create.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import structlog

from gpufed.apis.wire import MANAGED_BY, MANAGED_BY_LABEL, POOL_ANNOTATION, TYPE_LABEL, VIRTUAL_NODE_TYPE
from gpufed.kube import events, meta, rest
from gpufed.kube.client import KubeError
from gpufed.kube.watch import watch
from gpupool.flavors import KUEUE_GROUP, KUEUE_VERSION, Pool, clamp, flavor, gpu_quotas, with_gpu_quotas

COMPONENT = "gpufed-kueue"
REQUESTED_ANNOTATION = "gpufed.io/requested-gpu-quota"
APPLIED_ANNOTATION = "gpufed.io/applied-gpu-quota"
API = f"/apis/{KUEUE_GROUP}/{KUEUE_VERSION}"


@dataclass(frozen=True)
class KueueSettings:
    debounce_s: float = 0.5
    retry_s: float = 60.0


def pool_of(node: Mapping[str, Any]) -> Pool | None:
    """The pool a virtual node's figures describe (None: none readable)."""
    try:
        figures = json.loads(meta.annotations(node).get(POOL_ANNOTATION) or "")
        total = figures.get("total")
        return Pool(
            node=meta.name(node),
            provider=str(figures["provider"]),
            total=None if total is None else int(total),
            granted=int(figures.get("granted") or 0),
        )
    except (ValueError, KeyError, TypeError, AttributeError):
        return None


def _json(text: str | None) -> dict[str, int]:
    try:
        raw = json.loads(text or "{}")
        return {str(k): int(v) for k, v in raw.items()} if isinstance(raw, dict) else {}
    except (ValueError, TypeError, AttributeError):
        return {}


def asked_of(cq: Mapping[str, Any], flavors: set[str]) -> dict[str, int]:
    """What a ClusterQueue asks of gpufed's flavors: its quota now, unless that is what gpufed last
    wrote, in which case what it asked before (the annotation)."""
    now = {f: q for f, q in gpu_quotas(cq).items() if f in flavors}
    applied = _json(meta.annotations(cq).get(APPLIED_ANNOTATION))
    requested = _json(meta.annotations(cq).get(REQUESTED_ANNOTATION))
    return {f: requested.get(f, q) if applied.get(f) == q else q for f, q in now.items()}


class FlavorKeeper:
    def __init__(self, api: Any, settings: KueueSettings | None = None) -> None:
        self.api = api
        self.settings = settings or KueueSettings()
        self.pools: dict[str, Pool] = {}
        self.queues: dict[str, dict[str, Any]] = {}
        self.flavors: dict[str, dict[str, Any]] = {}
        self.dirty = asyncio.Event()
        self._synced: set[str] = set()
        self._log = structlog.get_logger().bind(component="kueue")

    # ---- caches

    def on_node(self, event: str, node: dict[str, Any]) -> None:
        pool = pool_of(node) if event != "DELETED" else None
        if pool is None:
            self.pools.pop(meta.name(node), None)
        else:
            self.pools[pool.node] = pool
        self.dirty.set()

    def on_queue(self, event: str, cq: dict[str, Any]) -> None:
        if event == "DELETED":
            self.queues.pop(meta.name(cq), None)
        else:
            self.queues[meta.name(cq)] = cq
        self.dirty.set()

    def on_flavor(self, event: str, fl: dict[str, Any]) -> None:
        if event == "DELETED":
            self.flavors.pop(meta.name(fl), None)
        else:
            self.flavors[meta.name(fl)] = fl
        self.dirty.set()

    # ---- reconcile

    async def reconcile(self) -> None:
        if not {"nodes", "queues", "flavors"} <= self._synced:
            return
        for name, pool in self.pools.items():
            want = flavor(pool)
            have = self.flavors.get(name)
            if have is None or have.get("spec") != want["spec"]:
                try:
                    await rest.apply(self.api, f"{API}/resourceflavors/{rest.segment(name)}", want)
                except KubeError as e:
                    self._log.warning("flavor not written", flavor=name, error=str(e)[:200])
        for name in [n for n in self.flavors if n not in self.pools]:
            with contextlib.suppress(KubeError):
                await rest.delete(self.api, f"{API}/resourceflavors/{rest.segment(name)}")
        ours = set(self.pools)
        asked: dict[tuple[str, str], int] = {}
        for cq_name, cq in self.queues.items():
            for f, q in asked_of(cq, ours).items():
                asked[(cq_name, f)] = q
        allowed = clamp(asked, self.pools)
        for cq_name, cq in sorted(self.queues.items()):
            mine = {f: q for (c, f), q in allowed.items() if c == cq_name}
            if not mine:
                continue
            now = {f: q for f, q in gpu_quotas(cq).items() if f in mine}
            if now == mine:
                continue
            want_asked = {f: q for (c, f), q in asked.items() if c == cq_name}
            await self._write(cq, mine, want_asked, now)

    async def _write(
        self, cq: dict[str, Any], quotas: dict[str, int], asked: dict[str, int], before: dict[str, int]
    ) -> None:
        name = meta.name(cq)
        patch = {
            "metadata": {
                "resourceVersion": meta.resource_version(cq),
                "annotations": {
                    REQUESTED_ANNOTATION: json.dumps(asked, sort_keys=True),
                    APPLIED_ANNOTATION: json.dumps(quotas, sort_keys=True),
                },
            },
            "spec": {"resourceGroups": with_gpu_quotas(cq, quotas)},
        }
        try:
            await rest.merge_patch(self.api, f"{API}/clusterqueues/{rest.segment(name)}", patch)
        except KubeError as e:
            self._log.warning("cluster queue quota not written", queue=name, error=str(e)[:200])
            self.dirty.set()
            return
        lowered = {f: (before.get(f), q) for f, q in quotas.items() if q < asked.get(f, q)}
        if lowered:
            parts = ", ".join(f"{f}: {asked[f]} asked, {q} promised" for f, (_, q) in sorted(lowered.items()))
            message = f"nominal nvidia.com/gpu quota kept within what the providers granted ({parts})"
            reason, type_ = "GPUQuotaClamped", "Warning"
        else:
            parts = ", ".join(f"{f}: {q}" for f, q in sorted(quotas.items()))
            message = f"nominal nvidia.com/gpu quota back to what was asked ({parts})"
            reason, type_ = "GPUQuotaRestored", "Normal"
        obj = {**cq, "apiVersion": f"{KUEUE_GROUP}/{KUEUE_VERSION}", "kind": "ClusterQueue"}
        await events.emit(self.api, obj, type_=type_, reason=reason, message=message, component=COMPONENT)
        self._log.info("cluster queue quota", queue=name, quotas=quotas, asked=asked)

    # ---- loops

    async def _served(self) -> bool:
        try:
            await rest.request(self.api, "GET", API)
        except KubeError as e:
            if e.status == 404:
                return False
            raise
        return True

    def _listed(self, what: str) -> None:
        self._synced.add(what)
        self.dirty.set()

    async def run(self) -> None:
        """Keep the flavors until cancelled; an API error (Kueue removed, a permission missing) is
        logged and the whole keeper starts again after `retry_s`, never ending the controller."""
        while True:
            try:
                if await self._served():
                    await self._keep()
                else:
                    self._log.info("Kueue's API is not served here: no flavors to keep", retry_s=self.settings.retry_s)
            except* KubeError as group:
                self._log.warning("keeping Kueue's flavors failed", error=str(group.exceptions[0])[:300])
            self._synced.clear()
            await asyncio.sleep(self.settings.retry_s)

    async def _keep(self) -> None:
        for cache in (self.pools, self.queues, self.flavors):
            cache.clear()  # the watches list everything again
        async with asyncio.TaskGroup() as tg:
            nodes = {"labelSelector": f"{TYPE_LABEL}={VIRTUAL_NODE_TYPE}"}
            flavors = {"labelSelector": f"{MANAGED_BY_LABEL}={MANAGED_BY}"}
            tg.create_task(
                watch(
                    self.api,
                    "/api/v1/nodes",
                    self.on_node,
                    what="pool nodes",
                    params=nodes,
                    on_synced=lambda: self._listed("nodes"),
                )
            )
            tg.create_task(
                watch(
                    self.api,
                    f"{API}/clusterqueues",
                    self.on_queue,
                    what="cluster queues",
                    on_synced=lambda: self._listed("queues"),
                )
            )
            tg.create_task(
                watch(
                    self.api,
                    f"{API}/resourceflavors",
                    self.on_flavor,
                    what="resource flavors",
                    params=flavors,
                    on_synced=lambda: self._listed("flavors"),
                )
            )
            while True:
                await self.dirty.wait()
                await asyncio.sleep(self.settings.debounce_s)
                self.dirty.clear()
                await self.reconcile()
