"""The request budget: burst passes at once, then requests are spaced at 1/qps."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest

from gpufed.kube import budget
from gpufed.kube.budget import Budget, budget_of, set_budget


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """A clock that moves only by what the budget sleeps. On a busy machine a real sleep overshoots
    and a waiter finds a token already refilled (that made these tests flaky, not the budget wrong)."""
    now = [1000.0]

    async def sleep(delay: float) -> None:
        now[0] += delay
        await asyncio.sleep(0)

    monkeypatch.setattr(budget, "time", SimpleNamespace(monotonic=lambda: now[0]))
    monkeypatch.setattr(budget, "asyncio", SimpleNamespace(sleep=sleep, Lock=asyncio.Lock))
    return now


async def test_burst_then_rate(clock: list[float]) -> None:
    b = Budget(qps=50, burst=5)
    for _ in range(5):
        await b.acquire()
    assert b.waited == 0
    for _ in range(5):
        await b.acquire()
    assert b.waited == 5
    assert b.wait_s == pytest.approx(0.1)  # 5 tokens at 50/s
    assert clock[0] == pytest.approx(1000.1)


async def test_concurrent_waiters_all_served(clock: list[float]) -> None:
    b = Budget(qps=200, burst=1)
    await asyncio.gather(*(b.acquire() for _ in range(10)))
    assert b.waited == 9  # all but the burst's one
    assert b.wait_s == pytest.approx(9 / 200)  # each waited exactly one token's time
    assert clock[0] == pytest.approx(1000 + 9 / 200)


def test_invalid_budget_and_attachment() -> None:
    with pytest.raises(ValueError, match="qps > 0"):
        Budget(0, 1)

    class Api:
        pass

    api = Api()
    assert budget_of(api) is None
    b = set_budget(api, 10, 20)
    assert budget_of(api) is b and b.burst == 20
