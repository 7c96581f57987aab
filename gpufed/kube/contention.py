"""Writes that lost an optimistic-concurrency race inside the API server, tried again at once.

Owns: `retry_contended`, which runs a write again (a few times, after a short random pause) when the
API server answers 409 with reason `Conflict` to a request that carried no resourceVersion of its
own: a create or an apply whose admission had to update another object and lost a race for it (the
ResourceQuota admission controller updates the namespace's quota status with every create it
counts; under a burst of creates in one namespace it returns `Operation cannot be fulfilled on
resourcequotas ...: the object has been modified`). Nothing was written, so the same request is
safe to send again. `AlreadyExists` (also 409) is never retried: the caller decides what an
existing object means.

Does not: retry anything else (`gpufed.kube.rest` never retries; queues back off), or writes that
name a resourceVersion (their conflict is real).
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable
from typing import TypeVar

from gpufed.kube.client import KubeError

T = TypeVar("T")

#: Attempts in all (the first and the retries).
ATTEMPTS = 4
#: Longest random pause (s) before a retry, doubled each time.
PAUSE_S = 0.05


def contended(e: KubeError) -> bool:
    """Whether `e` is an API server's optimistic-concurrency conflict (not `AlreadyExists`)."""
    return e.status == 409 and e.reason == "Conflict"


async def retry_contended(write: Callable[[], Awaitable[T]], *, attempts: int = ATTEMPTS) -> T:
    """`await write()`, sent again while the API server answers `contended`; the last error is raised."""
    for attempt in range(attempts - 1):
        try:
            return await write()
        except KubeError as e:
            if not contended(e):
                raise
        await asyncio.sleep(random.uniform(0, PAUSE_S * 2**attempt))  # noqa: S311 -- jitter, not a secret
    return await write()
