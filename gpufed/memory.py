"""Handing the memory a long-running process has freed back to the operating system.

Owns: `trim` (one call of glibc's `malloc_trim(0)`) and `trim_heap` (a task that calls it every
`interval_s` seconds while the process runs; `gpufed.cli.common.serve` runs it beside every
long-running component).

Why: a burst of work (a thousand pods offloaded at once: request and response bodies, decoded watch
events, forged objects) allocates far more than the process keeps once the burst is over. glibc's
malloc keeps the pages it freed for reuse, and gives back only the free memory at the very top of
its heap, so without this the resident size stays at the burst's peak for as long as the process
runs: memory that a pod's limit counts and the node cannot use. `malloc_trim(0)` also releases the
free pages inside the heap (madvise). It costs about 12 ms when there is much to release and under
1 ms when there is none, and blocks the calling thread meanwhile. The figures it bought are in
docs/benchmarks.md (the virtual kubelet's footprint).

Does not: shrink Python's own small-object arenas (pymalloc returns an arena only once every object
in it is freed), or do anything where the C library is not glibc (musl, macOS): there `trim` returns
False and `trim_heap` returns at once.
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
from collections.abc import Callable
from functools import cache

import structlog

#: Seconds between two trims of a running process.
TRIM_INTERVAL_S = 10.0


@cache
def _malloc_trim() -> Callable[[int], int] | None:
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        fn: Callable[[int], int] = getattr(ctypes.CDLL(name), "malloc_trim")  # noqa: B009 (a C symbol)
    except (OSError, AttributeError):  # not glibc
        return None
    return fn


def trim() -> bool:
    """Return the free pages of the C heap to the operating system; False where that is not possible."""
    fn = _malloc_trim()
    if fn is None:
        return False
    fn(0)
    return True


async def trim_heap(interval_s: float = TRIM_INTERVAL_S, trimmer: Callable[[], bool] = trim) -> None:
    """Call `trimmer` every `interval_s` seconds until cancelled; returns at once when it cannot trim
    (not glibc) or `interval_s` is not positive."""
    if interval_s <= 0:
        return
    while True:
        await asyncio.sleep(interval_s)
        if not trimmer():
            structlog.get_logger().debug("heap trimming unavailable here (not glibc)")
            return
