"""`PoolManager`: the pool nodes of one provider inside one virtual-kubelet process.

Owns, for one provider: which pool nodes run (`forge.pools.plan_pools` over the products of the
live capacity snapshot and the grant; nodes of this provider that already exist are adopted, and
those no longer wanted keep running as *draining* pools — advertising only what their pods hold —
until no pod is bound to them, then their Node is deleted); per pool a `PoolView`, a
`NodeController`, a `PodController`, a `ServingCertManager` and a `KubeletAPI` on its own port from
the process's range; the consumer's usage per pool (what `PoolView.node_state` advertises
against), kept by a `UsageLedger` fed the pod controllers' events, releases and twin notifications;
and waking every pool's node controller when pods, twins, the grant or the capacity change, so a
bound pod lowers the pool's allocatable within milliseconds.

The shared `RemoteProvider` runs here once: this manager subscribes to it when constructed and fans
twin notifications out to every pool's view (each pool's controller ignores twins of other pools).

Does not: compute what a pool advertises (forge.pools) or talk to the estimator (remote.capacity).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import structlog

from gpufed.apis.pool import GPU_PRODUCT_LABEL
from gpufed.apis.wire import POOL_PRODUCT_LABEL, REMOTE_CLUSTER_LABEL
from gpufed.kube import rest
from gpufed.kube.client import KubeError
from vkprovider.forge.pools import Pool, plan_pools
from vkprovider.kubelet.server import DEFAULT_STREAM_IDLE_S, KubeletAPI, KubeletAPISettings
from vkprovider.kubelet.servingcert import ServingCertManager, ServingCertSettings, ServingTLS
from vkprovider.node.node import NodeController, NodeSettings
from vkprovider.node.pods import PodController, PodSettings
from vkprovider.node.provider import StreamingProvider
from vkprovider.remote.capacity import FIRST_SNAPSHOT_WAIT_S, CapacityFeed
from vkprovider.remote.devices import ClaimCache, SlicePublisher
from vkprovider.remote.pools import PoolView, Usage
from vkprovider.remote.provider import RemoteProvider
from vkprovider.remote.reservations import GangReservations
from vkprovider.remote.usage import UsageLedger

#: Seconds between checks whether draining pools are empty (changes also trigger one).
REPLAN_S = 10.0
#: A pod placed at the provider counts as in flight until a capacity snapshot arrives this long
#: after we saw it placed: the estimator sees the placement about when we do, then debounces 0.2 s.
SNAPSHOT_LAG_S = 0.2


@dataclass(frozen=True)
class PoolSettings:
    #: Address the pool nodes publish and their kubelet APIs listen on.
    node_address: str
    #: First and last kubelet port of this process (one per pool node).
    kubelet_ports: tuple[int, int]
    listen_address: str | None = None
    #: One pool per GPU product when the provider has several (else one node for all of it).
    per_product: bool = True
    version: str = "v0.0.0-gpufed"
    owner_references: tuple[Mapping[str, Any], ...] = ()
    pods: PodSettings = field(default_factory=PodSettings)
    serving_cert: ServingCertSettings = field(default_factory=ServingCertSettings)
    stream_idle_timeout_s: float = DEFAULT_STREAM_IDLE_S


@dataclass
class Running:
    view: PoolView
    node: NodeController
    pods: PodController
    port: int
    task: asyncio.Task[None]


@dataclass(frozen=True)
class DeviceSide:
    """The consumer's DRA parts a provider's pools share: its claims, and the slice writer."""

    claims: ClaimCache
    publisher: SlicePublisher


class PoolManager:
    def __init__(
        self,
        api: Any,
        provider: RemoteProvider,
        feed: CapacityFeed | None,
        streaming: StreamingProvider,
        settings: PoolSettings,
        *,
        devices: DeviceSide | None = None,
        reservations: GangReservations | None = None,
    ) -> None:
        self.api = api
        #: GPUs the gang controller holds back on pool nodes for a waiting group (None: not watched).
        self.reservations = reservations
        #: Dynamic Resource Allocation on the consumer (None: it serves no resource.k8s.io/v1).
        self.devices = devices
        self.provider = provider
        self.feed = feed
        self.streaming = streaming
        self.settings = settings
        self.pools: dict[str, Running] = {}
        self.ready = asyncio.Event()
        self._replan = asyncio.Event()
        self._tg: asyncio.TaskGroup | None = None
        #: What the consumer's pods hold on each pool node, kept per pod event.
        self.ledger = UsageLedger(SNAPSHOT_LAG_S)
        self._log = structlog.get_logger().bind(remote_cluster=provider.settings.provider)
        provider.subscribe(self._broadcast)
        provider.slice_listeners.append(self._on_grant)
        if feed is not None:
            feed.listeners.append(self._on_capacity)
        if devices is not None:
            devices.claims.listeners.append(self._poke)
        if reservations is not None:
            reservations.listeners.append(self._poke_node)

    # ---- usage and wake-ups

    def usage(self, node: str) -> Usage:
        running = self.pools.get(node)
        twin_of = running.view.twin if running is not None else (lambda namespace, name: None)
        total, here, in_flight = self.ledger.usage(
            node, twin_of, self.feed.received_at if self.feed is not None else None
        )
        reserved = self.reservations.reserved(node) if self.reservations is not None else ()
        if self.devices is None:
            return Usage(total, here, in_flight, reserved=reserved)
        claims = self.devices.claims
        return Usage(
            total,
            here,
            in_flight,
            held_devices=frozenset(claims.held(node)),
            held_all=claims.held_count(lambda pool: pool in self.pools),
            reserved=reserved,
        )

    def _on_pod(self, node: str, kind: str, pod: Mapping[str, Any]) -> None:
        self.ledger.on_pod(node, kind, pod)
        self._poke()

    async def _release(self, node: str, pod: Mapping[str, Any]) -> None:
        """Before a pod's resources are freed in the scheduler's eyes (terminal, deleted), advertise
        the node without them: the scheduler never sees the pod gone while the node still offers
        what the pod held on top of what the provider can place (capacity capping stays a bound)."""
        self.ledger.release(pod["metadata"]["uid"])
        running = self.pools.get(node)
        if running is not None:
            try:
                await running.node.sync_coalesced()
            except KubeError as e:
                self._log.warning("node not re-advertised before a pod ended", node=node, error=str(e))

    def _poke(self) -> None:
        for running in self.pools.values():
            running.node.poke()

    def _poke_node(self, node: str) -> None:
        running = self.pools.get(node)
        if running is not None:
            running.node.poke()

    def _on_grant(self) -> None:
        self._replan.set()
        self._poke()

    def _on_capacity(self) -> None:
        self._replan.set()
        self._poke()

    def _broadcast(self, namespace: str, name: str) -> None:
        self.ledger.twin_changed(namespace, name)
        for running in list(self.pools.values()):
            running.view.notify(namespace, name)
        self._poke()

    # ---- pools

    def _free_port(self) -> int | None:
        used = {r.port for r in self.pools.values()}
        first, last = self.settings.kubelet_ports
        return next((p for p in range(first, last + 1) if p not in used), None)

    def _start(self, pool: Pool, draining: bool) -> None:
        assert self._tg is not None
        port = self._free_port()
        if port is None:
            first, last = self.settings.kubelet_ports
            self._log.error(
                "no kubelet port left for another pool node; it is not served",
                node=pool.node,
                ports=f"{first}-{last}",
            )
            return
        s = self.settings
        self.provider.pool_products[pool.node] = pool.product
        view = PoolView(
            self.provider,
            self.feed,
            pool,
            self.usage,
            draining=draining,
            publisher=self.devices.publisher if self.devices is not None else None,
        )
        node = NodeController(
            self.api,
            view,
            NodeSettings(
                name=pool.node,
                address=s.node_address,
                kubelet_port=port,
                owner_references=s.owner_references,
                version=s.version,
            ),
        )
        pods = PodController(
            self.api,
            view,
            pool.node,
            s.pods,
            on_change=functools.partial(self._on_pod, pool.node),
            releasing=functools.partial(self._release, pool.node),
        )
        tls = ServingTLS()
        certs = ServingCertManager(self.api, pool.node, s.node_address, tls, s.serving_cert)
        kubelet = KubeletAPI(
            self.api,
            KubeletAPISettings(
                node=pool.node,
                host=s.listen_address or s.node_address,
                port=port,
                stream_idle_timeout_s=s.stream_idle_timeout_s,
            ),
            pods,
            self.streaming,
            tls,
        )

        async def serve() -> None:
            async with asyncio.TaskGroup() as tg:
                for part in (node.run(), pods.run(), certs.run(), kubelet.run()):
                    tg.create_task(part)

        task = self._tg.create_task(serve())
        self.pools[pool.node] = Running(view, node, pods, port, task)
        self._log.info(
            "pool node started", node=pool.node, product=pool.product or "(all)", port=port, draining=draining
        )

    async def _stop(self, name: str, *, delete: bool) -> None:
        running = self.pools.pop(name)
        running.task.cancel()
        await asyncio.wait([running.task])  # its CancelledError is not ours (ours still propagates)
        self.ledger.forget_node(name)
        self.provider.pool_products.pop(name, None)
        if delete:
            with contextlib.suppress(KubeError):
                await running.node.remove()
            if self.devices is not None:
                with contextlib.suppress(KubeError):
                    await self.devices.publisher.remove(name)
            self._log.info("drained pool node removed", node=name)

    def _wanted(self) -> list[Pool]:
        grant = self.provider.grant()
        snapshot = self.feed.last_snapshot if self.feed is not None else None
        products = snapshot.gpu_products() if snapshot is not None else []
        return plan_pools(self.provider.settings.node, products, grant.gpu_product, self.settings.per_product)

    async def _existing(self) -> list[Pool]:
        """Nodes of this provider from an earlier run (adopted: their pods keep running)."""
        nodes = await rest.list_items(
            self.api,
            "/api/v1/nodes",
            params={"labelSelector": f"{REMOTE_CLUSTER_LABEL}={self.provider.settings.provider}"},
        )
        out = []
        for n in nodes:
            labels = n["metadata"].get("labels") or {}
            product = labels.get(GPU_PRODUCT_LABEL) if POOL_PRODUCT_LABEL in labels else None
            out.append(Pool(n["metadata"]["name"], product))
        return out

    async def reconcile(self, existing: list[Pool]) -> None:
        wanted = {p.node: p for p in self._wanted()}
        for pool in wanted.values():
            running = self.pools.get(pool.node)
            if running is not None and running.view.pool != pool:
                await self._stop(pool.node, delete=False)  # the product changed: serve it anew
                running = None
            if running is None:
                self._start(pool, draining=False)
            else:
                running.view.draining = False
        for pool in existing:
            if pool.node not in self.pools:
                self._start(pool, draining=True)
        for name, running in list(self.pools.items()):
            if name in wanted:
                continue
            if not running.view.draining:
                running.view.draining = True
                running.node.poke()
                self._log.info("pool node draining", node=name)
            if running.pods.ready.is_set() and not running.pods.bound_pods():
                await self._stop(name, delete=True)

    async def run(self) -> None:
        async with asyncio.TaskGroup() as tg:
            self._tg = tg
            tg.create_task(self.provider.run())
            if self.devices is not None:
                tg.create_task(self.devices.claims.run())
            if self.reservations is not None:
                tg.create_task(self.reservations.run())
            if self.feed is not None:
                tg.create_task(self.feed.run())
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(FIRST_SNAPSHOT_WAIT_S):
                        await self.feed.first.wait()
            await self.provider.slices_synced.wait()
            existing = await self._existing()
            while True:
                self._replan.clear()
                await self.reconcile(existing)
                existing = []
                self.ready.set()
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(REPLAN_S):  # not wait_for: see NodeController._status_loop
                        await self._replan.wait()

    async def remove_nodes(self) -> None:
        """Unpeer: delete every pool node (their pods go with the peering)."""
        for name, running in self.pools.items():
            with contextlib.suppress(KubeError):
                await running.node.remove()
            if self.devices is not None:
                with contextlib.suppress(KubeError):
                    await self.devices.publisher.remove(name)
