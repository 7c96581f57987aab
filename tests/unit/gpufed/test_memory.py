"""gpufed.memory: trimming really returns freed heap memory to the operating system (this machine's C
library is glibc, as on every machine the project runs its tests on), and the trimming task's timing
and its stop where trimming is not possible; `serve` runs it beside a component and stops it with it."""

from __future__ import annotations

import asyncio
import ctypes.util
import itertools
import signal
import threading
from pathlib import Path

import pytest

from gpufed import memory
from gpufed.cli.common import serve


def rss_mib() -> float:
    with Path("/proc/self/status").open() as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS in /proc/self/status")


def test_this_machine_has_glibc() -> None:
    """Loud, not skipped: the trimming tests below need glibc's malloc_trim."""
    name = ctypes.util.find_library("c")
    assert name is not None and hasattr(ctypes.CDLL(name), "malloc_trim"), (
        "this machine's C library has no malloc_trim (not glibc): gpufed.memory cannot trim here"
    )


def test_trim_returns_freed_heap_memory() -> None:
    # Objects over pymalloc's 512-byte limit come from malloc. Keeping every 100th pins the heap's
    # top, so only a trim that releases free pages inside the heap brings the size down.
    buffers = [bytes(1500) + str(i).encode() for i in range(60_000)]
    kept = buffers[::100]
    before = rss_mib()
    del buffers
    freed = rss_mib()
    assert memory.trim()
    after = rss_mib()
    assert len(kept) == 600
    assert freed - after > 40, f"RSS {before:.0f} MiB with the buffers, {freed:.0f} freed, {after:.0f} trimmed"


async def test_trim_heap_trims_every_interval_until_cancelled() -> None:
    calls: list[float] = []
    three = asyncio.Event()
    loop = asyncio.get_running_loop()

    def trimmer() -> bool:
        calls.append(loop.time())
        if len(calls) == 3:
            three.set()
        return True

    started = loop.time()
    task = asyncio.create_task(memory.trim_heap(0.05, trimmer))
    await asyncio.wait_for(three.wait(), 10)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert calls[0] - started >= 0.049, "the first trim waits an interval too"
    assert all(b - a >= 0.049 for a, b in itertools.pairwise(calls))


async def test_trim_heap_stops_where_it_cannot_trim() -> None:
    calls = 0

    def cannot() -> bool:
        nonlocal calls
        calls += 1
        return False

    await asyncio.wait_for(memory.trim_heap(0.01, cannot), 1)
    assert calls == 1
    await asyncio.wait_for(memory.trim_heap(0, cannot), 1)
    assert calls == 1, "a non-positive interval never trims"


def test_serve_trims_beside_the_component_and_stops_with_it(monkeypatch: pytest.MonkeyPatch) -> None:
    states: list[str] = []

    async def trim_heap(interval_s: float = memory.TRIM_INTERVAL_S) -> None:
        states.append("trimming")
        try:
            await asyncio.Event().wait()
        finally:
            states.append("stopped")

    monkeypatch.setattr(memory, "trim_heap", trim_heap)

    async def component() -> None:
        await asyncio.sleep(0.05)
        assert states == ["trimming"]
        threading.Timer(0.01, signal.raise_signal, (signal.SIGTERM,)).start()
        await asyncio.sleep(5)

    serve(component)
    assert states == ["trimming", "stopped"]
