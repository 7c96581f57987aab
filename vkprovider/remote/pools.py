"""`PoolView`: one GPU pool's virtual node over the provider's shared `RemoteProvider`.

Owns, for one pool node: the PodProvider its pod controller talks to (the provider's twins
restricted to those whose `gpufed.io/origin-node` is this node; everything else delegated) and the
NodeProvider its node controller asks (`node_state`: the provider's health, and capacity,
allocatable, labels and figures from `forge.pools.advertise` over the live capacity snapshot, the
grant (its labels already allow-listed by the provider view), and what the consumer's pods hold —
`usage`, supplied by whoever sees every pool's pods).

With a `publisher` (the consumer serves Dynamic Resource Allocation), each node-state read also
publishes the node's ResourceSlice (`forge.devices.offer`): the devices consumer claims hold there,
and as many more of the provider's free devices as one more pod could get GPUs; held devices count
against the grant's headroom like pods' GPU requests.

A draining pool (one that is no longer wanted, e.g. its product left the provider, but still has
pods) advertises only what its pods hold: nothing new is scheduled there.

Does not: start or stop pools (gpufed.app.pools), or talk to any API itself.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

import structlog

from gpufed.apis.pool import GPU_RESOURCE
from gpufed.apis.quantity import parse
from gpufed.apis.wire import REMOTE_CLUSTER_LABEL, VIRTUAL_NODE_TYPE_LABELS
from gpufed.kube.client import KubeError
from gpupool.capacity import DeviceGroup, Snapshot
from vkprovider.forge.devices import Kind, kinds_for, offer
from vkprovider.forge.pods import origin_node
from vkprovider.forge.pools import NOTHING_IN_FLIGHT, InFlight, Pool, advertise
from vkprovider.node.provider import NodeState, Notify, Twin
from vkprovider.remote.capacity import CapacityFeed
from vkprovider.remote.devices import SlicePublisher
from vkprovider.remote.provider import RemoteProvider

Resources = Mapping[str, Decimal]


@dataclass(frozen=True)
class Usage:
    """Requests of the consumer's non-terminal pods on a provider's pools."""

    #: On every pool of the provider.
    all: Resources = field(default_factory=dict)
    #: On this pool.
    here: Resources = field(default_factory=dict)
    #: This pool's pods the provider has not placed yet (part of `here`).
    in_flight: InFlight = NOTHING_IN_FLIGHT
    #: gpufed DRA devices consumer claims hold on this pool node (by device name).
    held_devices: frozenset[str] = frozenset()
    #: gpufed DRA devices consumer claims hold on every pool node of the provider (each one GPU).
    held_all: int = 0
    #: GPUs per pod of the waiting group the gang controller reserved this pool for.
    reserved: tuple[int, ...] = ()


class PoolView:
    """One pool node's PodProvider and NodeProvider over the shared `provider`.

    Whoever runs `provider` fans its notifications out to every view's `notify`, which passes them
    all on to the view's subscribers (a twin of another pool is None in this view's `twin()`, so its
    pod controller does nothing for it). `draining` may change later (the pool stops being wanted,
    or is wanted again).
    """

    def __init__(
        self,
        provider: RemoteProvider,
        feed: CapacityFeed | None,
        pool: Pool,
        usage: Callable[[str], Usage],
        *,
        draining: bool = False,
        publisher: SlicePublisher | None = None,
    ) -> None:
        self.provider = provider
        self.feed = feed
        self.pool = pool
        self.usage = usage
        self.draining = draining
        self.publisher = publisher
        self.ready = provider.ready
        #: The provider's device groups last seen, and the publishable kinds made of them.
        self._kinds: tuple[tuple[DeviceGroup, ...], list[Kind]] = ((), [])
        self._log = structlog.get_logger().bind(node=pool.node)
        self._subscribers: list[Notify] = []

    def _mine(self, twin: Twin | None) -> Twin | None:
        if twin is None or origin_node(twin.raw, self.provider.settings.node) != self.pool.node:
            return None
        return twin

    # ---- PodProvider

    def notify(self, namespace: str, name: str) -> None:
        """A twin of the shared provider changed: tell this view's subscribers."""
        for notify in self._subscribers:
            notify(namespace, name)

    def subscribe(self, notify: Notify) -> None:
        self._subscribers.append(notify)

    async def run(self) -> None:
        """The shared provider runs elsewhere (and sets `ready`); nothing to watch here until cancelled."""
        await asyncio.Event().wait()

    def twins(self) -> list[Twin]:
        return [t for t in self.provider.twins() if self._mine(t) is not None]

    def twin(self, namespace: str, name: str) -> Twin | None:
        return self._mine(self.provider.twin(namespace, name))

    async def create_pod(self, pod: Mapping[str, Any]) -> None:
        await self.provider.create_pod(pod)

    async def update_pod(self, pod: Mapping[str, Any], twin: Twin) -> None:
        await self.provider.update_pod(pod, twin)

    async def delete_pod(self, namespace: str, name: str, uid: str, grace_period_s: int) -> None:
        await self.provider.delete_pod(namespace, name, uid, grace_period_s)

    def pod_status(self, pod: Mapping[str, Any], twin: Twin) -> dict[str, Any]:
        return self.provider.pod_status(pod, twin)

    # ---- NodeProvider

    async def _publish(self, snapshot: Snapshot | None, use: Usage, allocatable: str | None) -> None:
        """The node's DRA devices: those claims hold, and as many more as one more pod could get."""
        assert self.publisher is not None
        budget = 0
        if allocatable is not None and not self.draining:
            budget = max(0, int(parse(allocatable)) - int(use.here.get(GPU_RESOURCE, Decimal(0))))
        groups = snapshot.devices if snapshot is not None and not self.draining else ()
        if groups != self._kinds[0]:  # checked and hashed once per change of the provider's devices
            self._kinds = (groups, kinds_for(groups, self.pool.product, self.provider.settings.provider))
        kinds = self._kinds[1]
        devices = offer(self.pool.node, kinds, held=use.held_devices, budget=budget)
        try:
            await self.publisher.publish(self.pool.node, devices)
        except KubeError as e:
            self._log.warning("devices not published", error=str(e))

    async def node_state(self) -> NodeState:
        health = await self.provider.health()
        grant = self.provider.grant()
        use = self.usage(self.pool.node)
        snapshot = self.feed.snapshot if self.feed is not None else None
        why = self.feed.why if self.feed is not None else "capacity estimation is off"
        granted: Resources = grant.resources
        if self.draining:
            granted = {r: min(v, use.all.get(r, Decimal(0))) for r, v in granted.items()}
            why = "pool is draining"
        # Devices consumer claims hold are GPUs of the grant too (the pods' requests do not show them).
        used_all = dict(use.all)
        if use.held_all:
            used_all[GPU_RESOURCE] = used_all.get(GPU_RESOURCE, Decimal(0)) + use.held_all
        ad = advertise(
            self.provider.settings.provider,
            self.pool,
            None if self.draining else snapshot,
            granted=granted,
            requested=None if self.draining else grant.requested,
            used_all=used_all,
            used_here=use.here,
            in_flight=use.in_flight,
            reserved=() if self.draining else use.reserved,
            static_reason=why,
            label_allow=self.provider.settings.node_label_allow,
        )
        provider = self.provider.settings.provider
        if self.publisher is not None:
            await self._publish(snapshot, use, ad.allocatable.get(GPU_RESOURCE))
        labels = {
            **(dict(grant.labels) if self.pool.product in (None, grant.gpu_product) else {}),
            **ad.labels,
            **VIRTUAL_NODE_TYPE_LABELS,
            REMOTE_CLUSTER_LABEL: provider,
        }
        if not health.ready:
            ready, reason, message = False, health.reason, health.message
        elif not grant.accepted or not any(v > 0 for v in grant.resources.values()):
            ready, reason, message = (
                False,
                "NoGrant",
                f"no resources granted by {provider} (see `kubectl get rslice -n gpufed`)",
            )
        else:
            ready, reason, message = True, "KubeletReady", f"{health.message}; resources granted"
        return NodeState(
            capacity=ad.capacity,
            allocatable=ad.allocatable,
            labels=labels,
            ready=ready,
            reason=reason,
            message=message,
            annotations={"gpufed.io/provider": provider, **ad.annotations},
        )
