"""A generic runner of narrated, timed steps: what `gpufed local demo` tells its story with.

Owns: the step (a title, why it matters, the work, its timeout; a clean-up step, a network step), its
result (ok, failed, skipped, not run, with its seconds and the reason), the narrator (a header per
step with its why, the commands and their output, each step's outcome, banners; ANSI colours only on
a terminal), the run (in order, each under its timeout, timed), the summary table (every step's
seconds, the clean-up steps set apart, the total) and the exit status (non-zero when a step failed).

Semantics: after a failed story step the rest of the story is "not run", but every clean-up step
still runs. With a reason for skipping network steps, every network step is "skipped" with it. A
step raising `StepSkipped` is "skipped" with its message; one raising `StepError` failed with its
message; any other exception failed with its type and message; one running past its timeout failed.

Pure apart from the clock and the output stream. Does not: know what the steps do or which story
they tell (`demo` does).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Literal, TextIO

from gpufed.errors import GpufedError

#: Seconds one step may take before it counts as failed.
DEFAULT_STEP_TIMEOUT_S = 300.0

Outcome = Literal["ok", "failed", "skipped", "not run"]


class StepError(GpufedError):
    """A step did not show what it should; the message says what happened instead."""


class StepSkipped(Exception):  # noqa: N818 -- not an error: a step that has nothing to do here
    """Raised by a step that cannot or need not run here; the message says why."""


@dataclass(frozen=True)
class Step:
    """One step: a title, why it matters (printed under the header), the work."""

    title: str
    why: str
    run: Callable[[], Awaitable[None]]
    #: Clean-up steps run even after a failed story step.
    cleanup: bool = False
    #: Needs the data plane (root, TUN, ...); skipped where it cannot run.
    network: bool = False
    timeout_s: float = DEFAULT_STEP_TIMEOUT_S


@dataclass(frozen=True)
class StepResult:
    number: int
    title: str
    outcome: Outcome
    #: Wall-clock seconds the step ran (0 when it did not run).
    seconds: float
    #: Why it failed or was skipped ("" when it passed).
    detail: str = ""
    cleanup: bool = False


class Narrator:
    """Everything a run prints: headers, commands and their output, outcomes, the summary.

    Plain text; ANSI colours only when `out` is a terminal."""

    WIDTH = 100

    def __init__(self, out: TextIO) -> None:
        self.out = out
        self.color = bool(getattr(out, "isatty", lambda: False)())

    def _style(self, text: str, code: str) -> str:
        return f"\x1b[{code}m{text}\x1b[0m" if self.color else text

    def print(self, text: str = "") -> None:
        print(text, file=self.out, flush=True)

    def banner(self, lines: Sequence[str], code: str = "1") -> None:
        rule = "═" * self.WIDTH
        self.print(self._style(rule, code))
        for line in lines:
            self.print(self._style(f" {line}", code))
        self.print(self._style(rule, code))

    def header(self, number: int, total: int, step: Step) -> None:
        label = f"━━━ Step {number}/{total} · {step.title} "
        self.print()
        self.print(self._style(label + "━" * max(3, self.WIDTH - len(label)), "1;36"))
        for line in step.why.strip().splitlines():
            self.print(self._style(line.strip(), "2"))

    def note(self, text: str) -> None:
        self.print(f"  {text}")

    def command(self, display: str) -> None:
        self.print(self._style(f"$ {display}", "1"))

    def output(self, line: str) -> None:
        self.print(f"  │ {line}")

    def outcome(self, number: int, total: int, result: StepResult) -> None:
        where = f"Step {number}/{total}"
        if result.outcome == "ok":
            self.print(self._style(f"✓ {where} ok in {result.seconds:.1f} s", "32"))
        elif result.outcome == "failed":
            self.print(self._style(f"✗ {where} FAILED after {result.seconds:.1f} s: {result.detail}", "1;31"))
        elif result.outcome == "skipped":
            self.print(self._style(f"– {where} ({result.title}) skipped: {result.detail}", "33"))
        else:
            self.print(self._style(f"· {where} ({result.title}) not run: {result.detail}", "33"))


async def run_steps(
    steps: Sequence[Step],
    narrator: Narrator,
    *,
    network_skip: str | None = None,
    clock: Callable[[], float] = time.monotonic,
) -> list[StepResult]:
    """Run the steps in order, each under its timeout, timing each one.

    A story step that fails stops the story: later story steps are "not run". Clean-up steps always
    run. With `network_skip` set, network steps are "skipped" with that reason. A step raising
    StepSkipped is "skipped" with its message."""
    results: list[StepResult] = []
    failed: str | None = None
    total = len(steps)
    for number, step in enumerate(steps, start=1):
        if step.network and network_skip is not None:
            result = StepResult(number, step.title, "skipped", 0.0, network_skip, step.cleanup)
        elif failed is not None and not step.cleanup:
            result = StepResult(number, step.title, "not run", 0.0, f"step {failed} failed", step.cleanup)
        else:
            narrator.header(number, total, step)
            start = clock()
            outcome: Outcome = "ok"
            detail = ""
            try:
                async with asyncio.timeout(step.timeout_s):
                    await step.run()
            except StepSkipped as e:
                outcome, detail = "skipped", str(e)
            except TimeoutError:
                outcome, detail = "failed", f"did not finish within {step.timeout_s:g} s"
            except Exception as e:
                outcome, detail = "failed", str(e) if isinstance(e, StepError) else f"{type(e).__name__}: {e}"
            result = StepResult(number, step.title, outcome, clock() - start, detail, step.cleanup)
            if outcome == "failed" and not step.cleanup and failed is None:
                failed = str(number)
        narrator.outcome(number, total, result)
        results.append(result)
    return results


def summary_table(results: Sequence[StepResult]) -> str:
    """One row per step (number, title, result, seconds), the clean-up steps set apart, and the total."""
    width = max([len("step"), *(len(r.title) for r in results)])
    rule = "-" * (width + 27)
    lines = [f"{'#':>3}  {'step':<{width}}  {'result':<8}  {'seconds':>8}", rule]
    for i, r in enumerate(results):
        if r.cleanup and (i == 0 or not results[i - 1].cleanup):
            lines.append(f"{'':>3}  {'(clean-up)':<{width}}")
        seconds = f"{r.seconds:8.1f}" if r.outcome in ("ok", "failed") else f"{'-':>8}"
        lines.append(f"{r.number:>3}  {r.title:<{width}}  {r.outcome:<8}  {seconds}")
    lines += [rule, f"{'':>3}  {'total':<{width}}  {'':<8}  {sum(r.seconds for r in results):8.1f}"]
    return "\n".join(lines)


def failures(results: Sequence[StepResult]) -> list[str]:
    return [f"step {r.number} ({r.title}) failed: {r.detail}" for r in results if r.outcome == "failed"]


def exit_code(results: Sequence[StepResult]) -> int:
    return 1 if failures(results) else 0
