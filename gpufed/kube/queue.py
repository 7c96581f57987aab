"""A per-key work queue for reconcilers, in the manner of client-go's workqueue.

Owns: `WorkQueue`, which holds keys with a due time, hands due keys to a bounded set of workers,
and requeues them after failures (capped exponential backoff with jitter) or when the handler asks
("requeue after N seconds").

Invariants:
- a key is waiting at most once; adding a waiting key again keeps the earlier of the two due times;
- a key is never handled by two workers at once; a key added while it is being handled waits
  aside and is handled again after the current call finishes (no earlier);
- a handler failure is logged and requeues its key after `base_delay * 2**failures` (capped at
  `max_delay`, then ±10% jitter); a success resets the count; `forget` resets it too;
- cancelling `run` cancels the handlers in flight and propagates; their keys go back to waiting
  (due at once, failure count unchanged), so a later `run` picks them up.

Metrics (label `queue` = the queue's name): `gpufed_workqueue_depth` (keys waiting, as `len`),
`gpufed_workqueue_latency_seconds` (from a key's due time — its `add`, or the end of its requeue
delay — until a worker takes it; a key added while in flight also waits for that call),
`gpufed_workqueue_work_seconds` (one handler call) and `gpufed_workqueue_retries_total` (failed
calls requeued with backoff).

Does not: rate-limit across keys, persist anything, or know what a key means. Handler results other
than a number of seconds or None are a caller bug. Only asyncio primitives are used; idle workers
sleep until the earliest due time or the next `add` (no polling).
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import random
import time
from collections.abc import Awaitable, Callable, Hashable
from typing import Generic, TypeVar

import structlog
from prometheus_client import Counter, Gauge, Histogram

K = TypeVar("K", bound=Hashable)
Handler = Callable[[K], Awaitable[float | None]]

_JITTER = 0.1
_MAX_EXPONENT = 62  # 2**62 * any sane base_delay is far past any max_delay; avoids float overflow
#: Buckets (s) of the queue's histograms: a millisecond to a minute.
_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)

DEPTH = Gauge("gpufed_workqueue_depth", "Keys waiting in a work queue (not counting keys being handled).", ["queue"])
LATENCY = Histogram(
    "gpufed_workqueue_latency_seconds",
    "Seconds a key waited from its due time (its add, or the end of its requeue delay) until a worker took it.",
    ["queue"],
    buckets=_BUCKETS,
)
WORK = Histogram(
    "gpufed_workqueue_work_seconds", "Seconds one handler call of a work queue took.", ["queue"], buckets=_BUCKETS
)
RETRIES = Counter("gpufed_workqueue_retries_total", "Failed handler calls requeued with backoff.", ["queue"])


class WorkQueue(Generic[K]):
    """Keys waiting for a due time, handled by at most `workers` concurrent calls, one per key."""

    def __init__(self, name: str, *, base_delay: float = 0.05, max_delay: float = 30.0) -> None:
        if base_delay < 0 or max_delay < 0:
            raise ValueError("delays must not be negative")
        self.name = name
        self.base_delay = base_delay
        self.max_delay = max_delay
        self._seq = itertools.count()
        # Waiting keys: key -> (due, seq). The heap may hold stale entries (a key re-added earlier,
        # or taken); an entry is live only while it equals the key's value here.
        self._due: dict[K, tuple[float, int]] = {}
        self._heap: list[tuple[float, int, K]] = []
        self._in_flight: set[K] = set()
        # Keys added while in flight: key -> earliest due time asked for; they wait here, outside
        # the heap, until their current call finishes.
        self._deferred: dict[K, float] = {}
        self._failures: dict[K, int] = {}
        self._wakeup = asyncio.Event()
        self._depth = DEPTH.labels(name)
        self._latency = LATENCY.labels(name)
        self._work = WORK.labels(name)
        self._retries = RETRIES.labels(name)

    def add(self, key: K, delay: float = 0.0) -> None:
        """Queue `key` to be handled in `delay` seconds (or sooner, if it is already due sooner)."""
        self._schedule(key, time.monotonic() + max(delay, 0.0))

    def forget(self, key: K) -> None:
        """Reset the failure count (and so the backoff) of `key`. Does not dequeue it."""
        self._failures.pop(key, None)

    def __len__(self) -> int:
        """Keys waiting and not in flight (a key re-added while in flight counts once it is done)."""
        return len(self._due)

    def failures(self, key: K) -> int:
        """Consecutive failed calls for `key` since its last success or `forget`."""
        return self._failures.get(key, 0)

    async def run(self, handler: Handler[K], workers: int = 4) -> None:
        """Handle keys with `workers` concurrent workers until cancelled.

        A handler's exception (other than a cancellation of this task) is logged and its key is
        retried with backoff; it never stops the queue. Returns only by raising CancelledError
        (or an ExceptionGroup if the queue itself has a bug).
        """
        if workers < 1:
            raise ValueError("workers must be at least 1")
        async with asyncio.TaskGroup() as tg:
            for i in range(workers):
                tg.create_task(self._worker(handler), name=f"workqueue-{self.name}-{i}")

    # internals

    def _schedule(self, key: K, due: float) -> None:
        if key in self._in_flight:
            prev = self._deferred.get(key)
            self._deferred[key] = due if prev is None else min(prev, due)
            return
        prev_due = self._due.get(key)
        if prev_due is not None and prev_due[0] <= due:
            return
        seq = next(self._seq)
        self._due[key] = (due, seq)
        heapq.heappush(self._heap, (due, seq, key))
        self._depth.set(len(self._due))
        self._wakeup.set()

    def _take_due(self) -> tuple[K | None, float | None]:
        """Pop the earliest key that is due now, else (None, seconds until the next one, or None)."""
        while self._heap:
            due, seq, key = self._heap[0]
            if self._due.get(key) != (due, seq):
                heapq.heappop(self._heap)  # stale
                continue
            wait = due - time.monotonic()
            if wait > 0:
                return None, wait
            heapq.heappop(self._heap)
            del self._due[key]
            self._in_flight.add(key)
            self._depth.set(len(self._due))
            self._latency.observe(-wait)
            return key, None
        return None, None

    async def _next(self) -> K:
        while True:
            # No await between clear(), the check and wait(): an add() cannot slip in between.
            self._wakeup.clear()
            key, wait = self._take_due()
            if key is not None:
                return key
            try:
                async with asyncio.timeout(wait):
                    await self._wakeup.wait()
            except TimeoutError:
                pass

    def _finish(self, key: K, requeue_after: float | None) -> None:
        self._in_flight.discard(key)
        due = self._deferred.pop(key, None)
        if requeue_after is not None:
            at = time.monotonic() + max(requeue_after, 0.0)
            due = at if due is None else min(due, at)
        if due is not None:
            self._schedule(key, due)
        # Another worker may sleep on a wait computed before this key came back.
        self._wakeup.set()

    def _backoff(self, failures: int) -> float:
        delay = min(self.base_delay * float(2 ** min(failures - 1, _MAX_EXPONENT)), self.max_delay)
        return delay * random.uniform(1 - _JITTER, 1 + _JITTER)  # noqa: S311 - jitter, not crypto

    async def _worker(self, handler: Handler[K]) -> None:
        while True:
            key = await self._next()
            try:
                with self._work.time():
                    result = await handler(key)
            except asyncio.CancelledError:
                task = asyncio.current_task()
                if task is not None and task.cancelling():
                    self._finish(key, 0.0)  # unfinished: back to waiting, due at once
                    raise
                # The handler let through a cancellation meant for something else: a failure of
                # this key, not of the queue (otherwise the worker would die silently).
                self._failed(key, "handler raised CancelledError")
            except Exception as e:
                self._failed(key, str(e) or type(e).__name__)
            else:
                self._failures.pop(key, None)
                self._finish(key, result)

    def _failed(self, key: K, error: str) -> None:
        attempt = self._failures.get(key, 0) + 1
        self._failures[key] = attempt
        self._retries.inc()
        delay = self._backoff(attempt)
        structlog.get_logger().error(
            "reconcile failed", queue=self.name, key=str(key), error=error, attempt=attempt, retry_in=round(delay, 3)
        )
        self._finish(key, delay)


__all__ = ["Handler", "WorkQueue"]
