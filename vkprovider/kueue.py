"""Kueue over the federated pool (consumer side): gpufed keeps Kueue's flavors and GPU quotas in line
with what the providers granted.

Owns, while Kueue's API is served (its group's discovery document, looked at every `retry_s` until
it serves one of `gpupool.flavors.KUEUE_VERSIONS`; the keeper then reads and writes that version):
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
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import structlog

from gpufed.apis.wire import MANAGED_BY, MANAGED_BY_LABEL, POD_GPUS_LABEL, TYPE_LABEL, VIRTUAL_NODE_TYPE
from gpufed.kube import events, meta, rest
from gpufed.kube.client import KubeError
from gpufed.kube.watch import watch
from gpupool.flavors import KUEUE_GROUP, KUEUE_VERSIONS, Pool, clamp, flavor, gpu_quotas, with_gpu_quotas
from vkprovider.forge.pools import figures_of

COMPONENT = "gpufed-kueue"
REQUESTED_ANNOTATION = "gpufed.io/requested-gpu-quota"
APPLIED_ANNOTATION = "gpufed.io/applied-gpu-quota"
GROUP_PATH = f"/apis/{KUEUE_GROUP}"


@dataclass(frozen=True)
class KueueSettings:
    #: Seconds the figures may keep changing before the flavors and quotas are written.
    debounce_s: float = 0.5
    #: Seconds between looks for Kueue's API while it is not served. One discovery GET each time, on
    #: every cluster gpufed runs on: at 5 s that is 12 cheap requests a minute, and Kueue installed
    #: after gpufed (or started beside it, as the local clusters do) gets its flavors within seconds.
    retry_s: float = 5.0
    #: After a failure (a permission missing, Kueue removed under a watch) the next try waits twice
    #: as long as the last, from `retry_s` up to this.
    max_backoff_s: float = 60.0


def served_version(group: Mapping[str, Any] | None) -> str | None:
    """The version of `KUEUE_VERSIONS` to use, from the API group's discovery document (None: none served)."""
    served = {v.get("version") for v in (group or {}).get("versions") or [] if isinstance(v, Mapping)}
    return next((v for v in KUEUE_VERSIONS if v in served), None)


def pool_of(node: Mapping[str, Any]) -> Pool | None:
    """The pool a virtual node's figures describe (None: none readable)."""
    figures = figures_of(node)
    if figures is None:
        return None
    try:
        total = None if figures.total is None else int(figures.total)
        pod_gpus = meta.labels(node).get(POD_GPUS_LABEL, "")
        return Pool(
            node=meta.name(node),
            provider=str(figures.provider),
            total=total,
            granted=int(figures.granted or 0),
            pod_gpus=int(pod_gpus) if pod_gpus.isdigit() and int(pod_gpus) > 0 else None,
        )
    except (TypeError, ValueError):
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
        #: The Kueue API version in use (None: not served, or not looked at yet).
        self.version: str | None = None
        self._synced: set[str] = set()
        self._log = structlog.get_logger().bind(component="kueue")

    @property
    def api_version(self) -> str:
        """`kueue.x-k8s.io/<version>` of the objects read and written (the preferred one before discovery)."""
        return f"{KUEUE_GROUP}/{self.version or KUEUE_VERSIONS[0]}"

    @property
    def api_path(self) -> str:
        return f"/apis/{self.api_version}"

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
        api = self.api_path
        # the watches change the caches while a write awaits: iterate over copies
        for name, pool in list(self.pools.items()):
            want = flavor(pool, self.version or KUEUE_VERSIONS[0])
            have = self.flavors.get(name)
            if have is None or have.get("spec") != want["spec"]:
                try:
                    await rest.apply(self.api, f"{api}/resourceflavors/{rest.segment(name)}", want)
                except KubeError as e:
                    self._log.warning("flavor not written", flavor=name, error=str(e)[:200])
        for name in [n for n in self.flavors if n not in self.pools]:
            if meta.is_deleting(self.flavors[name]):
                continue  # deleted, waiting for Kueue's finalizer (a ClusterQueue still names it)
            with contextlib.suppress(KubeError):
                await rest.delete(self.api, f"{api}/resourceflavors/{rest.segment(name)}")
        ours = set(self.pools)
        asked: dict[tuple[str, str], int] = {}
        for cq_name, cq in list(self.queues.items()):
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
            await rest.merge_patch(self.api, f"{self.api_path}/clusterqueues/{rest.segment(name)}", patch)
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
        obj = {**cq, "apiVersion": self.api_version, "kind": "ClusterQueue"}
        await events.emit(self.api, obj, type_=type_, reason=reason, message=message, component=COMPONENT)
        self._log.info("cluster queue quota", queue=name, quotas=quotas, asked=asked)

    # ---- loops

    async def _served(self) -> str | None:
        """The Kueue API version to use, from discovery (None: Kueue's API is not served here)."""
        try:
            group = await rest.get(self.api, GROUP_PATH)
        except KubeError as e:
            if e.status == 404:
                return None
            raise
        return served_version(group)

    def _listed(self, what: str) -> None:
        self._synced.add(what)
        self.dirty.set()

    async def run(self) -> None:
        """Keep the flavors until cancelled; an API error (Kueue removed, a permission missing) is
        logged and the whole keeper starts again after a backoff (`retry_s`, doubling with each
        failure in a row up to `max_backoff_s`), never ending the controller. While Kueue's API is
        not served it looks again every `retry_s`, and says so once."""
        said_absent = False
        failures = 0
        while True:
            wait = self.settings.retry_s
            began = time.monotonic()
            try:
                self.version = await self._served()
                if self.version is None:
                    if not said_absent:
                        self._log.info("Kueue's API is not served here: no flavors to keep until it is")
                        said_absent = True
                    failures = 0
                else:
                    said_absent = False
                    self._log.info("keeping Kueue's flavors", api=self.api_version)
                    await self._keep()
            except* Exception as group:  # whatever fails here must not end the controller
                # a keeper that ran for a while before failing starts its backoff again
                failures = 1 if time.monotonic() - began > self.settings.max_backoff_s else failures + 1
                wait = min(self.settings.retry_s * 2 ** (failures - 1), self.settings.max_backoff_s)
                first = group.exceptions[0]
                self._log.warning(
                    "keeping Kueue's flavors failed", error=f"{type(first).__name__}: {first}"[:300], retry_s=wait
                )
            self._synced.clear()
            await asyncio.sleep(wait)

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
                    f"{self.api_path}/clusterqueues",
                    self.on_queue,
                    what="cluster queues",
                    on_synced=lambda: self._listed("queues"),
                )
            )
            tg.create_task(
                watch(
                    self.api,
                    f"{self.api_path}/resourceflavors",
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
