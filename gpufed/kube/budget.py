"""A client-side request budget (token bucket), like client-go's QPS/burst, attached to an ApiClient.

Owns: `Budget` (`qps` tokens per second, at most `burst` saved up) and `set_budget`, which makes
every `rest.request` through that ApiClient take a token first. Watches are long-running streams
and take none. Without a budget requests are not limited (the controller's default).

Why: a virtual kubelet bursts hundreds of writes when a Job fans out; an unlimited client can
starve the API server, and client-go's 5 QPS default would make offloading crawl. Kubelets run with
50 QPS / burst 100; a virtual kubelet stands for many nodes, so its default is higher (see
vkprovider.node settings) and configurable.

Does not: share budgets across processes or react to 429s (the API server's priority-and-fairness
answers those; callers retry).
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

_ATTR = "_gpufed_budget"


class Budget:
    """Token bucket: `acquire` waits until a token is available. Fair in arrival order."""

    def __init__(self, qps: float, burst: int) -> None:
        if qps <= 0 or burst < 1:
            raise ValueError(f"a budget needs qps > 0 and burst >= 1 (got qps={qps}, burst={burst})")
        self.qps = qps
        self.burst = burst
        self._tokens = float(burst)
        self._stamp = time.monotonic()
        self._lock = asyncio.Lock()
        #: Requests that had to wait, and the seconds they waited in all (for benchmarks and metrics).
        self.waited = 0
        self.wait_s = 0.0

    def _refill(self) -> None:
        now = time.monotonic()
        self._tokens = min(float(self.burst), self._tokens + (now - self._stamp) * self.qps)
        self._stamp = now

    async def acquire(self) -> None:
        async with self._lock:  # one waiter at a time keeps arrival order
            self._refill()
            if self._tokens < 1:
                delay = (1 - self._tokens) / self.qps
                self.waited += 1
                self.wait_s += delay
                await asyncio.sleep(delay)
                self._refill()
            self._tokens -= 1


def set_budget(api: Any, qps: float, burst: int) -> Budget:
    """Limit the requests made through `api` (an ApiClient) to `qps`/`burst`."""
    budget = Budget(qps, burst)
    setattr(api, _ATTR, budget)
    return budget


def budget_of(api: Any) -> Budget | None:
    b = getattr(api, _ATTR, None)
    return b if isinstance(b, Budget) else None
