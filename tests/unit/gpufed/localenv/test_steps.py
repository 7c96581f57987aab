"""The generic step runner without clusters: order, timing, failures, skips, clean-up, summary, exit status."""

from __future__ import annotations

import asyncio
import io
from collections.abc import Awaitable, Callable

from gpufed.localenv.steps import (
    Narrator,
    Step,
    StepError,
    StepResult,
    StepSkipped,
    exit_code,
    failures,
    run_steps,
    summary_table,
)


class FakeClock:
    """Each step advances it by the seconds its work says."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def work(
    clock: FakeClock, seconds: float, log: list[str], name: str, error: Exception | None = None
) -> Callable[[], Awaitable[None]]:
    async def run() -> None:
        log.append(name)
        clock.now += seconds
        if error is not None:
            raise error

    return run


async def run(steps: list[Step], clock: FakeClock, network_skip: str | None = None) -> tuple[list[StepResult], str]:
    out = io.StringIO()
    results = await run_steps(steps, Narrator(out), network_skip=network_skip, clock=clock)
    return results, out.getvalue()


async def test_every_step_runs_in_order_with_a_header_and_its_duration() -> None:
    clock, log = FakeClock(), list[str]()
    steps = [
        Step("Start the clusters", "why one", work(clock, 2.5, log, "a")),
        Step("Peer them", "why two\nsecond line", work(clock, 4.0, log, "b")),
        Step("Clean up", "why three", work(clock, 1.0, log, "c"), cleanup=True),
    ]
    results, text = await run(steps, clock)
    assert log == ["a", "b", "c"]
    assert [(r.number, r.outcome, r.seconds) for r in results] == [(1, "ok", 2.5), (2, "ok", 4.0), (3, "ok", 1.0)]
    assert "Step 1/3 · Start the clusters" in text and "why two\nsecond line" in text
    assert "✓ Step 2/3 ok in 4.0 s" in text
    assert exit_code(results) == 0 and failures(results) == []


async def test_a_failed_story_step_stops_the_story_but_every_clean_up_step_runs() -> None:
    clock, log = FakeClock(), list[str]()
    steps = [
        Step("one", "", work(clock, 1, log, "one")),
        Step("two", "", work(clock, 3, log, "two", StepError("job/train not Complete"))),
        Step("three", "", work(clock, 1, log, "three")),
        Step("undo", "", work(clock, 1, log, "undo", RuntimeError("boom")), cleanup=True),
        Step("check", "", work(clock, 2, log, "check"), cleanup=True),
    ]
    results, text = await run(steps, clock)
    assert log == ["one", "two", "undo", "check"]
    assert [r.outcome for r in results] == ["ok", "failed", "not run", "failed", "ok"]
    assert results[1].seconds == 3 and results[1].detail == "job/train not Complete"
    assert results[2].detail == "step 2 failed" and results[2].seconds == 0
    # an unexpected exception names its type; a StepError is already a sentence
    assert results[3].detail == "RuntimeError: boom"
    assert "✗ Step 2/5 FAILED after 3.0 s: job/train not Complete" in text
    assert exit_code(results) == 1
    assert failures(results) == [
        "step 2 (two) failed: job/train not Complete",
        "step 4 (undo) failed: RuntimeError: boom",
    ]


async def test_network_steps_are_skipped_loudly_with_the_reason() -> None:
    clock, log = FakeClock(), list[str]()
    steps = [
        Step("peer", "", work(clock, 1, log, "peer")),
        Step("tunnels", "", work(clock, 1, log, "tunnels"), network=True),
        Step("request", "", work(clock, 1, log, "request"), network=True),
        Step("teardown", "", work(clock, 1, log, "teardown"), cleanup=True, network=True),
    ]
    results, text = await run(steps, clock, network_skip="network steps skipped: not root")
    assert log == ["peer"]
    assert [r.outcome for r in results] == ["ok", "skipped", "skipped", "skipped"]
    assert "Step 2/4 (tunnels) skipped: network steps skipped: not root" in text
    assert exit_code(results) == 0  # skipping is not failing


async def test_a_step_may_skip_itself_and_a_slow_one_fails_at_its_timeout() -> None:
    clock, log = FakeClock(), list[str]()

    async def nothing_to_do() -> None:
        raise StepSkipped("namespace team-a does not exist")

    async def hangs() -> None:
        await asyncio.sleep(10)

    steps = [
        Step("stuck", "", hangs, timeout_s=0.05),
        Step("undo", "", nothing_to_do, cleanup=True),
        Step("check", "", work(clock, 1, log, "check"), cleanup=True),
    ]
    results, _ = await run(steps, clock)
    assert [r.outcome for r in results] == ["failed", "skipped", "ok"]
    assert results[0].detail == "did not finish within 0.05 s"
    assert results[1].detail == "namespace team-a does not exist"


def test_summary_table_lists_every_step_with_seconds_and_the_total() -> None:
    results = [
        StepResult(1, "Start the local clusters", "ok", 3.94),
        StepResult(2, "WireGuard tunnels", "skipped", 0.0, "not root"),
        StepResult(3, "kubectl create a GPU Job", "failed", 120.0, "timed out"),
        StepResult(4, "Unpeer", "ok", 8.0, cleanup=True),
        StepResult(5, "Nothing is left behind", "not run", 0.0, cleanup=True),
    ]
    table = summary_table(results).splitlines()
    assert table[0].split() == ["#", "step", "result", "seconds"]
    rows = {line.split()[0]: line for line in table if line.strip() and line.split()[0].isdigit()}
    assert rows["1"].endswith("3.9") and " ok " in rows["1"]
    assert rows["2"].rstrip().endswith("-") and " skipped " in rows["2"]
    assert rows["3"].endswith("120.0") and " failed " in rows["3"]
    # the clean-up steps are set apart, right before the first of them
    assert any("(clean-up)" in line for line in table)
    assert table.index(next(line for line in table if "(clean-up)" in line)) == table.index(rows["4"]) - 1
    assert table[-1].split() == ["total", "131.9"]
