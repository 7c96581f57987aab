"""The one subprocess runner: output, input, environment, failures and timeouts."""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

import pytest

from gpufed import process
from gpufed.errors import GpufedError


async def test_a_command_gives_its_exit_status_and_output_apart() -> None:
    done = await process.run(["sh", "-c", "echo out; echo err >&2"], timeout_s=10)
    assert (done.returncode, done.stdout, done.stderr) == (0, "out\n", "err\n")
    assert done.argv == ("sh", "-c", "echo out; echo err >&2")


async def test_stdin_env_and_cwd_reach_the_command(tmp_path: Path) -> None:
    done = await process.run(
        ["sh", "-c", 'cat; echo "$GREETING"; pwd'], stdin="kind: Job\n", env={"GREETING": "hi"}, cwd=tmp_path,
        timeout_s=10,
    )  # fmt: skip
    assert done.stdout.splitlines() == ["kind: Job", "hi", str(tmp_path)]


async def test_lines_are_handed_over_as_they_come_with_stderr_merged() -> None:
    seen: list[tuple[float, str]] = []
    start = time.monotonic()
    done = await process.run(
        ["sh", "-c", "echo one; sleep 0.3; echo two >&2"],
        timeout_s=10, merge_stderr=True, on_line=lambda line: seen.append((time.monotonic() - start, line)),
    )  # fmt: skip
    assert [line for _, line in seen] == ["one", "two"]
    assert seen[0][0] < 0.25, "the first line came before the command ended"
    assert (done.stdout, done.stderr) == ("one\ntwo\n", "")


async def test_streaming_keeps_stderr_apart_unless_merged_and_feeds_stdin() -> None:
    lines: list[str] = []
    done = await process.run(["sh", "-c", "cat; echo oops >&2"], stdin="a\nb\n", timeout_s=10, on_line=lines.append)
    assert lines == ["a", "b"] and done.stderr == "oops\n"


async def test_a_failure_names_the_command_and_ends_with_what_it_said() -> None:
    with pytest.raises(process.CommandError, match=r"`sh -c .*` failed \(3\): went wrong$") as err:
        await process.run(["sh", "-c", "echo noise; echo went wrong >&2; exit 3"], timeout_s=10)
    assert isinstance(err.value, GpufedError)
    assert err.value.returncode == 3 and err.value.output == "went wrong"
    assert err.value.argv == ("sh", "-c", "echo noise; echo went wrong >&2; exit 3")
    # without stderr, the tail of stdout; only the last TAIL_CHARS characters
    with pytest.raises(process.CommandError) as err:
        await process.run(["sh", "-c", f"printf '%0{process.TAIL_CHARS + 50}d' 0; exit 1"], timeout_s=10)
    assert len(err.value.output) == process.TAIL_CHARS
    done = await process.run(["sh", "-c", "exit 4"], timeout_s=10, check=False)
    assert done.returncode == 4


async def test_a_missing_program_is_named() -> None:
    with pytest.raises(process.CommandError, match=r"no-such-program-here is not installed"):
        await process.run(["no-such-program-here"], timeout_s=10)


async def test_a_command_past_its_timeout_is_killed(tmp_path: Path) -> None:
    pidfile = tmp_path / "pid"
    start = time.monotonic()
    with pytest.raises(process.CommandTimeoutError, match=r"`sh -c .*` did not finish within 0\.3 s"):
        await process.run(["sh", "-c", f"echo $$ > {pidfile}; exec sleep 30"], timeout_s=0.3)
    assert time.monotonic() - start < 5
    pid = int(pidfile.read_text())
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)  # killed and reaped


async def test_a_cancelled_caller_leaves_no_process_behind(tmp_path: Path) -> None:
    pidfile = tmp_path / "pid"
    task = asyncio.create_task(
        process.run(["sh", "-c", f"echo $$ > {pidfile}; exec sleep 30"], timeout_s=60, on_line=lambda _l: None)
    )
    while not pidfile.exists() or not pidfile.read_text().strip():
        await asyncio.sleep(0.01)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    with pytest.raises(ProcessLookupError):
        os.kill(int(pidfile.read_text()), 0)
