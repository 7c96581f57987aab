"""WorkQueue: one entry per waiting key, one call per key at a time, backoff on failure, cancellation."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

import pytest
from structlog.testing import capture_logs

from gpufed.kube.queue import Handler, WorkQueue


@asynccontextmanager
async def running(q: WorkQueue[str], handler: Handler[str], workers: int = 4) -> AsyncIterator[asyncio.Task[None]]:
    task = asyncio.create_task(q.run(handler, workers))
    try:
        yield task
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def eventually(pred: Callable[[], bool], timeout: float = 10.0) -> None:
    async with asyncio.timeout(timeout):
        while not pred():
            await asyncio.sleep(0.002)


async def test_waiting_key_is_queued_once() -> None:
    q: WorkQueue[str] = WorkQueue("t")
    q.add("a")
    q.add("a")
    q.add("b")
    assert len(q) == 2
    calls: list[str] = []

    async def handler(key: str) -> None:
        calls.append(key)

    async with running(q, handler):
        await eventually(lambda: len(calls) == 2)
        await asyncio.sleep(0.05)
    assert sorted(calls) == ["a", "b"]
    assert len(q) == 0


async def test_re_adding_keeps_the_earliest_due_time() -> None:
    q: WorkQueue[str] = WorkQueue("t")
    q.add("sooner-later", delay=10)
    q.add("sooner-later", delay=0)  # earlier: wins
    q.add("now-then-later", delay=0)
    q.add("now-then-later", delay=10)  # later: ignored
    assert len(q) == 2
    calls: list[str] = []

    async def handler(key: str) -> None:
        calls.append(key)

    async with running(q, handler):
        await eventually(lambda: len(calls) == 2, timeout=5)
    assert sorted(calls) == ["now-then-later", "sooner-later"]


async def test_delayed_key_waits_for_its_due_time() -> None:
    q: WorkQueue[str] = WorkQueue("t")
    handled: list[float] = []

    async def handler(key: str) -> None:
        handled.append(time.monotonic())

    async with running(q, handler):
        start = time.monotonic()
        q.add("k", delay=0.1)
        await asyncio.sleep(0.05)
        assert handled == []
        await eventually(lambda: len(handled) == 1)
    assert handled[0] - start >= 0.095


async def test_one_key_is_never_handled_concurrently() -> None:
    q: WorkQueue[str] = WorkQueue("t")
    active = {"k": 0}
    peak = 0
    calls = 0

    async def handler(key: str) -> None:
        nonlocal peak, calls
        calls += 1
        active[key] += 1
        peak = max(peak, active[key])
        if calls == 1:
            await release.wait()  # the first call stays in flight until the test has added "k" again
        active[key] -= 1

    release = asyncio.Event()
    async with running(q, handler, workers=4):
        q.add("k")
        await eventually(lambda: calls == 1)
        for _ in range(5):  # all while the first call is in flight (free workers could take them)
            q.add("k")
            await asyncio.sleep(0.001)
        assert calls == 1 and active["k"] == 1, "no second call while the first is in flight"
        release.set()
        await eventually(lambda: calls == 2 and active["k"] == 0, timeout=5)
        await asyncio.sleep(0.08)
    assert peak == 1
    assert calls == 2  # the adds during flight coalesce into one more call


async def test_key_added_in_flight_is_handled_again_after_the_call() -> None:
    q: WorkQueue[str] = WorkQueue("t")
    release = asyncio.Event()
    log: list[str] = []

    async def handler(key: str) -> None:
        log.append(f"start{len(log) // 2}")
        if len(log) == 1:
            await release.wait()
        log.append(f"end{len(log) // 2}")

    async with running(q, handler):
        q.add("k")
        await eventually(lambda: log == ["start0"])
        q.add("k")
        assert len(q) == 0  # in flight; the re-add waits aside
        await asyncio.sleep(0.05)
        assert log == ["start0"]  # not started on a second worker
        release.set()
        await eventually(lambda: len(log) == 4)
    assert log == ["start0", "end0", "start1", "end1"]


async def test_workers_are_bounded() -> None:
    q: WorkQueue[str] = WorkQueue("t")
    active = 0
    peak = 0
    done = 0

    async def handler(key: str) -> None:
        nonlocal active, peak, done
        active += 1
        peak = max(peak, active)
        await asyncio.sleep(0.02)
        active -= 1
        done += 1

    for i in range(10):
        q.add(f"k{i}")
    async with running(q, handler, workers=3):
        await eventually(lambda: done == 10)
    assert peak == 3


async def test_failures_back_off_exponentially_and_success_resets() -> None:
    q: WorkQueue[str] = WorkQueue("t", base_delay=0.02, max_delay=1.0)
    times: list[float] = []

    async def handler(key: str) -> None:
        times.append(time.monotonic())
        if len(times) <= 3:
            raise RuntimeError(f"boom {len(times)}")

    with capture_logs() as logs:
        async with running(q, handler):
            q.add("k")
            await eventually(lambda: len(times) == 4)
            await asyncio.sleep(0.01)
            assert q.failures("k") == 0
    gaps = [b - a for a, b in itertools.pairwise(times)]
    for gap, base in zip(gaps, [0.02, 0.04, 0.08], strict=True):
        assert gap >= base * 0.9 - 0.002, gaps
    assert gaps[2] > gaps[0]
    failed = [e for e in logs if e["event"] == "reconcile failed"]
    assert [e["attempt"] for e in failed] == [1, 2, 3]
    assert failed[0]["queue"] == "t"
    assert failed[0]["key"] == "k"
    assert failed[0]["error"] == "boom 1"
    assert failed[0]["log_level"] == "error"


async def test_backoff_is_capped_at_max_delay() -> None:
    q: WorkQueue[str] = WorkQueue("t", base_delay=0.05, max_delay=0.05)
    times: list[float] = []

    async def handler(key: str) -> None:
        times.append(time.monotonic())
        raise ValueError("always")

    with capture_logs():
        async with running(q, handler):
            q.add("k")
            await eventually(lambda: len(times) >= 7)
            assert q.failures("k") >= 6
    # Uncapped, 6 retries wait 0.05 * (1 + 2 + ... + 32) = 3.15 s (at least 2.8 s with jitter);
    # capped, about 0.3 s: a margin that no loaded machine closes.
    assert times[6] - times[0] < 2.0


async def test_forget_resets_the_failure_count() -> None:
    q: WorkQueue[str] = WorkQueue("t", base_delay=0.01)
    calls = 0

    async def handler(key: str) -> None:
        nonlocal calls
        calls += 1
        raise RuntimeError("no")

    with capture_logs():
        async with running(q, handler):
            q.add("k")
            await eventually(lambda: calls >= 2 and q.failures("k") >= 2)  # it keeps failing meanwhile
    q.forget("k")
    assert q.failures("k") == 0


async def test_returned_float_requeues_after_that_many_seconds() -> None:
    q: WorkQueue[str] = WorkQueue("t")
    times: list[float] = []

    async def handler(key: str) -> float | None:
        times.append(time.monotonic())
        return 0.1 if len(times) == 1 else None

    async with running(q, handler):
        q.add("k")
        await eventually(lambda: len(times) == 2)
        await asyncio.sleep(0.15)
    assert len(times) == 2  # None: no further requeue
    assert times[1] - times[0] >= 0.095


async def test_cancelling_run_cancels_handlers_and_keeps_the_key() -> None:
    q: WorkQueue[str] = WorkQueue("t")
    started = asyncio.Event()
    cancelled = False

    async def handler(key: str) -> None:
        nonlocal cancelled
        started.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cancelled = True
            raise

    task = asyncio.create_task(q.run(handler, workers=2))
    q.add("k")
    async with asyncio.timeout(10):
        await started.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        async with asyncio.timeout(5):
            await task
    assert task.cancelled()
    assert cancelled
    assert len(q) == 1  # unfinished work goes back to waiting


async def test_stray_cancelled_error_from_a_handler_is_a_failure_not_a_dead_worker() -> None:
    q: WorkQueue[str] = WorkQueue("t", base_delay=0.01)
    calls = 0

    async def handler(key: str) -> None:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise asyncio.CancelledError

    with capture_logs() as logs:
        async with running(q, handler, workers=1) as task:
            q.add("k")
            await eventually(lambda: calls == 2)
            assert not task.done()
    assert [e["attempt"] for e in logs if e["event"] == "reconcile failed"] == [1]


def test_bad_arguments_are_refused() -> None:
    with pytest.raises(ValueError, match="delays"):
        WorkQueue("t", base_delay=-1)
