"""Bounded, rate-limited recording of the Events a provider's view causes on consumer objects.

A provider decides how many Events its twins get, how many objects it writes and how often its
view changes; none of that may decide how much memory, how many tasks or how many API calls the
consumer's virtual kubelet spends on Events. Every Event the remote side of a provider causes
(twin Events relayed onto local pods, reports about what the provider claimed, reflection status)
goes through one `EventRelay` per component and provider.

Owns `EventRelay`, with:
- a bounded queue (`RelayLimits.capacity`) drained by a fixed number of workers (`workers`) that
  record the Events (`gpufed.kube.events.emit`, which counts repeats of one message on one Event,
  also when workers record it at once): an offer that finds the queue full is dropped, never waited for;
- a correlator per (object, reason), like the kubelet's event correlator: within `window_s`, the
  first `max_similar` distinct messages are recorded as they are, later ones under one combined
  message per reason (`combined`), which `emit` counts on one Event instead of creating new ones;
- token buckets: one per object (`burst`, then one Event per `refill_s`) and one for the whole relay
  (`total_burst`, then `total_per_s`); an offer over either is dropped;
- the per-object state of at most `max_objects` objects (least recently offered go first: forgetting
  one only resets its limits);
- `gpufed_relayed_events_dropped_total{remote_cluster, cause}`: offers dropped (`queue_full`,
  `rate_limited`).

Does not: decide what is worth an Event or check what a provider supplied in it (the callers do),
or retry one: an Event is a courtesy, a failed one is logged by `emit`.
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import structlog
from prometheus_client import Counter

from gpufed.kube import events
from gpufed.kube.client import KubeError

#: Causes of a dropped offer (the `cause` label).
QUEUE_FULL = "queue_full"
RATE_LIMITED = "rate_limited"

DROPPED = Counter(
    "gpufed_relayed_events_dropped_total",
    "Events about consumer objects caused by a provider (twin Events relayed onto local pods, reports of what "
    "it claimed, reflection status) that were dropped: the relay's queue was full, or the object's or the "
    "relay's rate limit was spent.",
    ["remote_cluster", "cause"],
)

#: Awaited by a worker just before recording: the object to record the Event on (None: record nothing).
Resolve = Callable[[], Awaitable[Mapping[str, Any] | None]]


@dataclass(frozen=True)
class RelayLimits:
    """How much one relay may hold and send (defaults: the kubelet's event spam filter and correlator)."""

    #: Events waiting to be recorded.
    capacity: int = 256
    #: Events recorded concurrently (`emit` counts each occurrence once when workers race for one Event).
    workers: int = 4
    #: Events one object may get at once, then one more every `refill_s` seconds.
    burst: int = 25
    refill_s: float = 60.0
    #: Seconds during which one object's Events of one reason are correlated.
    window_s: float = 600.0
    #: Distinct messages of one reason and object recorded as they are within a window; more are combined.
    max_similar: int = 10
    #: Events the whole relay may record at once, then `total_per_s` a second.
    total_burst: int = 200
    total_per_s: float = 10.0
    #: Objects whose limits are remembered.
    max_objects: int = 4096


def combined(reason: str) -> str:
    """The one message of the combined Events of `reason` (constant, so `emit` counts them on one Event)."""
    return f"(combined from similar events): more {reason} events than are shown one by one"


class _Bucket:
    __slots__ = ("stamp", "tokens")

    def __init__(self, tokens: float, stamp: float) -> None:
        self.tokens = tokens
        self.stamp = stamp

    def take(self, now: float, burst: float, per_s: float) -> bool:
        self.tokens = min(burst, self.tokens + max(now - self.stamp, 0.0) * per_s)
        self.stamp = now
        if self.tokens < 1.0:
            return False
        self.tokens -= 1.0
        return True


@dataclass
class _Object:
    bucket: _Bucket
    #: reason -> (start of its window, the distinct messages recorded as they are in it).
    similar: dict[str, tuple[float, set[str]]] = field(default_factory=dict)


@dataclass(frozen=True)
class _Item:
    obj: Mapping[str, Any]
    type_: str
    reason: str
    message: str
    resolve: Resolve | None


def object_key(obj: Mapping[str, Any]) -> str:
    """Whose limits an offer about `obj` counts against: its UID, else its kind, namespace and name."""
    meta = obj.get("metadata") or {}
    uid = meta.get("uid")
    return str(uid) if uid else f"{obj.get('kind')}/{meta.get('namespace') or ''}/{meta.get('name') or ''}"


class EventRelay:
    """Records Events on consumer objects through `api`, within `limits`, for `remote_cluster`."""

    def __init__(
        self,
        api: Any,
        remote_cluster: str,
        component: str,
        limits: RelayLimits | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.api = api
        self.remote_cluster = remote_cluster
        self.component = component
        self.limits = limits or RelayLimits()
        self._clock = clock
        self._queue: asyncio.Queue[_Item] = asyncio.Queue(maxsize=self.limits.capacity)
        self._objects: OrderedDict[str, _Object] = OrderedDict()
        self._total = _Bucket(float(self.limits.total_burst), clock())
        self._dropped = {c: DROPPED.labels(remote_cluster, c) for c in (QUEUE_FULL, RATE_LIMITED)}
        #: Offers dropped since start, by cause (tests and logs read it).
        self.dropped: dict[str, int] = {QUEUE_FULL: 0, RATE_LIMITED: 0}
        self._log = structlog.get_logger().bind(remote_cluster=remote_cluster, component=component)

    def offer(
        self,
        obj: Mapping[str, Any],
        *,
        type_: str,
        reason: str,
        message: str,
        resolve: Resolve | None = None,
    ) -> bool:
        """Queue an Event about `obj` (`resolve`: how a worker finds the object when `obj` is only its
        name); False when it was dropped. Never blocks and never raises."""
        now = self._clock()
        limits = self.limits
        key = object_key(obj)
        state = self._objects.get(key)
        if state is None:
            state = _Object(_Bucket(float(limits.burst), now))
            self._objects[key] = state
            while len(self._objects) > limits.max_objects:
                self._objects.popitem(last=False)
        else:
            self._objects.move_to_end(key)
        window = state.similar.get(reason)
        if window is None or now - window[0] > limits.window_s:
            if len(state.similar) >= 2 * limits.burst:  # reasons of old windows: forget them
                state.similar = {r: w for r, w in state.similar.items() if now - w[0] <= limits.window_s}
            window = (now, set())
        seen = window[1]
        text = message if message in seen or len(seen) < limits.max_similar else combined(reason)
        if not state.bucket.take(now, limits.burst, 1.0 / limits.refill_s) or not self._total.take(
            now, limits.total_burst, limits.total_per_s
        ):
            return self._drop(RATE_LIMITED, reason)
        try:
            self._queue.put_nowait(_Item(obj, type_, reason, text, resolve))
        except asyncio.QueueFull:
            return self._drop(QUEUE_FULL, reason)
        if text == message:
            seen.add(message)
        state.similar[reason] = window
        return True

    def _drop(self, cause: str, reason: str) -> bool:
        self._dropped[cause].inc()
        self.dropped[cause] += 1
        if self.dropped[cause] & (self.dropped[cause] - 1) == 0:  # the 1st, 2nd, 4th, 8th, ... drop
            self._log.warning("events dropped", cause=cause, reason=reason, dropped=self.dropped[cause])
        return False

    def pending(self) -> int:
        """Events waiting to be recorded."""
        return self._queue.qsize()

    async def flushed(self) -> None:
        """Wait until every Event offered so far has been recorded (or failed)."""
        await self._queue.join()

    async def run(self) -> None:
        """Record queued Events until cancelled."""
        async with asyncio.TaskGroup() as tg:
            for i in range(self.limits.workers):
                tg.create_task(self._work(), name=f"events-{self.component}-{self.remote_cluster}-{i}")

    async def _work(self) -> None:
        while True:
            item = await self._queue.get()
            try:
                obj: Mapping[str, Any] | None = item.obj
                if item.resolve is not None:
                    obj = await item.resolve()
                if obj is not None:
                    await events.emit(
                        self.api,
                        obj,
                        type_=item.type_,
                        reason=item.reason,
                        message=item.message,
                        component=self.component,
                    )
            except KubeError as e:  # from `resolve`: `emit` logs its own failures
                self._log.warning("event not recorded", reason=item.reason, error=str(e))
            finally:
                self._queue.task_done()


__all__ = ["DROPPED", "QUEUE_FULL", "RATE_LIMITED", "EventRelay", "RelayLimits", "Resolve", "combined", "object_key"]
