"""`CapacityFeed`: the provider's live GPU capacity, as its capacity estimator streams it.

Owns, for one provider: the estimator's Watch stream (reconnected with capped backoff and jitter
when it breaks; the endpoint and CA re-read from the provider's ConfigMap on each connect), the
latest `Snapshot` (dropped when the stream is down for longer than `stale_after_s`, so pool nodes
fall back to the grant and say why), listeners called on every new snapshot, and `can_place`
for the pod controller's fail-back check.

A provider without an estimator (no ConfigMap `gpufed/gpufed-estimator`) is not an error: the feed
says so once and keeps looking every `retry_max_s`.

Metrics (label `remote_cluster` = the provider): `gpufed_capacity_stream_up` (1 while the Watch
stream delivers, 0 while it is down) and `gpufed_capacity_snapshot_timestamp_seconds` (Unix time
the latest snapshot or heartbeat arrived: `time() - x` is its age).

Does not: decide what a pool advertises (forge.pools) or fail pods (vkprovider.node).
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import structlog
from prometheus_client import Gauge

from gpupool.capacity import Placement, Snapshot, shape_of
from gpupool.estimator.client import EstimatorClient, EstimatorError, from_provider
from vkprovider.forge.pods import remote_scheduling

#: Backoff (s) between reconnects of a broken stream: doubles up to the cap.
RETRY_S = 1.0
RETRY_MAX_S = 30.0
#: Seconds without a stream after which the last snapshot no longer counts.
STALE_AFTER_S = 30.0
#: Seconds the virtual kubelet waits for a first snapshot before it plans its pools without one.
FIRST_SNAPSHOT_WAIT_S = 5.0

STREAM_UP = Gauge(
    "gpufed_capacity_stream_up",
    "Whether the provider's capacity estimator stream delivers snapshots (1) or is down (0).",
    ["remote_cluster"],
)
SNAPSHOT_TIMESTAMP = Gauge(
    "gpufed_capacity_snapshot_timestamp_seconds",
    "Unix time the latest capacity snapshot (or heartbeat) from the provider's estimator arrived.",
    ["remote_cluster"],
)


@dataclass(frozen=True)
class FeedSettings:
    retry_s: float = RETRY_S
    retry_max_s: float = RETRY_MAX_S
    stale_after_s: float = STALE_AFTER_S


class CapacityFeed:
    def __init__(
        self,
        remote_api: Any,
        kubeconfig: Mapping[str, Any],
        settings: FeedSettings | None = None,
        *,
        remote_cluster: str = "",
    ) -> None:
        self.remote = remote_api
        self.kubeconfig = kubeconfig
        self.settings = settings or FeedSettings()
        self._up = STREAM_UP.labels(remote_cluster)
        self._received = SNAPSHOT_TIMESTAMP.labels(remote_cluster)
        self._snapshot: Snapshot | None = None
        #: Monotonic time the latest snapshot arrived.
        self.received_at = 0.0
        self._down_since: float | None = time.monotonic()
        #: Why there is no live snapshot (for the pool figures).
        self.why = "the capacity estimator has not answered yet"
        self.listeners: list[Callable[[], None]] = []
        self.first = asyncio.Event()
        self._client: EstimatorClient | None = None
        self._log = structlog.get_logger().bind(component="capacity-feed")

    def use_credentials(self, kubeconfig: Mapping[str, Any]) -> None:
        """Renewed provider credentials: the next connection to the estimator presents them."""
        self.kubeconfig = kubeconfig

    @property
    def snapshot(self) -> Snapshot | None:
        """The latest snapshot, or None when there is none or the stream has been down too long."""
        if self._snapshot is None:
            return None
        if self._down_since is not None and time.monotonic() - self._down_since > self.settings.stale_after_s:
            return None
        return self._snapshot

    @property
    def last_snapshot(self) -> Snapshot | None:
        """The latest snapshot however old (e.g. which GPU products the provider had): pools keep
        their shape while the estimator is away; only their capacity falls back to the grant."""
        return self._snapshot

    def _changed(self) -> None:
        for listener in self.listeners:
            listener()

    async def run(self) -> None:
        delay = self.settings.retry_s
        told: str | None = None
        try:
            while True:
                try:
                    client = await from_provider(self.remote, self.kubeconfig)
                    if client is None:
                        self.why = "the provider runs no capacity estimator (no ConfigMap gpufed/gpufed-estimator)"
                    else:
                        self._client = client
                        try:
                            async for snap in client.watch():
                                self._snapshot, self._down_since = snap, None
                                self.received_at = time.monotonic()
                                self._up.set(1)
                                self._received.set(time.time())
                                delay = self.settings.retry_s
                                if told is not None:
                                    self._log.info("capacity estimator answers again")
                                    told = None
                                self.first.set()
                                self._changed()
                        finally:
                            self._client = None
                            await client.close()
                        self.why = "the capacity estimator closed its stream"
                except EstimatorError as e:
                    self.why = f"the capacity estimator does not answer: {e}"
                self._up.set(0)
                if self._down_since is None:
                    self._down_since = time.monotonic()
                if told != self.why:
                    self._log.warning("no live GPU capacity; pools advertise the grant", why=self.why)
                    told = self.why
                self.first.set()  # nobody waits for a first snapshot that is not coming
                self._changed()
                await asyncio.sleep(delay * (1 + random.uniform(-0.1, 0.1)))  # noqa: S311 -- jitter
                delay = min(delay * 2, self.settings.retry_max_s)
        finally:
            if self._client is not None:
                await self._client.close()

    async def can_place(self, pod: Mapping[str, Any], product: str | None) -> Placement | None:
        """The estimator's answer for one more pod like `pod` (None: it cannot be asked now), asked
        with the node selection its twin will have (`forge.pods.remote_scheduling`)."""
        client = self._client
        if client is None:
            return None
        try:
            return await client.can_place(shape_of(remote_scheduling(pod), gpu_product=product))
        except EstimatorError as e:
            self._log.warning("placement not checked", error=str(e))
            return None
