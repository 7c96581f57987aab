"""The request budget: burst passes at once, then requests are spaced at 1/qps."""

from __future__ import annotations

import asyncio

import pytest

from peering.kube.budget import Budget, budget_of, set_budget


async def test_burst_then_rate() -> None:
    b = Budget(qps=50, burst=5)
    for _ in range(5):
        await b.acquire()
    assert b.waited == 0
    for _ in range(5):
        await b.acquire()
    assert b.waited == 5
    assert b.wait_s == pytest.approx(0.1, abs=0.03)  # 5 tokens at 50/s


async def test_concurrent_waiters_all_served() -> None:
    b = Budget(qps=200, burst=1)
    await asyncio.gather(*(b.acquire() for _ in range(10)))
    assert b.waited == 9


def test_invalid_budget_and_attachment() -> None:
    with pytest.raises(ValueError, match="qps > 0"):
        Budget(0, 1)

    class Api:
        pass

    api = Api()
    assert budget_of(api) is None
    b = set_budget(api, 10, 20)
    assert budget_of(api) is b and b.burst == 20
