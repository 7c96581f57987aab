"""Running one command to its end, under a timeout: gpufed's one subprocess runner.

Owns: `run` (argv, optional stdin text, environment, working directory, timeout; stdout and stderr
captured, or stderr merged into stdout; stdout optionally handed over line by line as it comes) and
what it raises: `CommandError` when the command cannot start or (with `check`) exits non-zero,
`CommandTimeoutError` when it runs past its timeout. Both are GpufedErrors whose message names the
command and ends with the tail of what it said. A command that times out or whose caller is
cancelled is killed and reaped before `run` returns.

Does not: supervise long-running processes (`gpufed.localenv.supervise` does, for the local
clusters' components; the demo's gateway agents are `gpufed.localenv.podnet`'s, daemons of the data
plane `netfabric.drivers.netns`'s), interpret output, or log.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from gpufed.errors import GpufedError

#: Characters of a failed command's output its error message ends with.
TAIL_CHARS = 400


class CommandError(GpufedError):
    """A command could not start or failed; the message names it and ends with the tail of its output."""

    def __init__(self, message: str, *, argv: Sequence[str], returncode: int | None = None, output: str = "") -> None:
        super().__init__(message)
        self.argv = tuple(argv)
        self.returncode = returncode
        #: The tail of what the command said (stderr, else stdout).
        self.output = output


class CommandTimeoutError(CommandError):
    """A command ran past its timeout and was killed."""


@dataclass(frozen=True)
class Completed:
    """A command that ran to its end: its exit status and what it wrote (decoded, errors replaced)."""

    argv: tuple[str, ...]
    returncode: int
    stdout: str
    #: Empty when stderr was merged into stdout.
    stderr: str


def command_line(argv: Sequence[str]) -> str:
    return " ".join(argv)


async def run(
    argv: Sequence[str],
    *,
    timeout_s: float,
    stdin: str | None = None,
    env: Mapping[str, str] | None = None,
    cwd: Path | None = None,
    check: bool = True,
    merge_stderr: bool = False,
    on_line: Callable[[str], None] | None = None,
) -> Completed:
    """Run `argv` to its end within `timeout_s` seconds.

    `stdin` is written to the command (no stdin: /dev/null). `env` replaces the environment (None:
    inherit). With `merge_stderr` stderr goes to stdout. With `on_line` every stdout line (without
    its newline) is handed over as it arrives; stdout is still returned whole. With `check` a
    non-zero exit raises CommandError; without it the caller reads `returncode`."""
    try:
        proc = await asyncio.create_subprocess_exec(
            *argv,
            stdin=asyncio.subprocess.PIPE if stdin is not None else asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT if merge_stderr else asyncio.subprocess.PIPE,
            env=dict(env) if env is not None else None,
            cwd=cwd,
        )
    except FileNotFoundError as e:
        raise CommandError(f"{argv[0]} is not installed: {e}", argv=argv) from e
    data = stdin.encode() if stdin is not None else None
    try:
        async with asyncio.timeout(timeout_s):
            if on_line is None:
                out, err = await proc.communicate(data)
            else:
                out, err = await _stream(proc, data, on_line)
    except TimeoutError:
        await _kill(proc)
        raise CommandTimeoutError(f"`{command_line(argv)}` did not finish within {timeout_s:g} s", argv=argv) from None
    except BaseException:
        await _kill(proc)
        raise
    rc = proc.returncode if proc.returncode is not None else -1
    done = Completed(tuple(argv), rc, out.decode(errors="replace"), (err or b"").decode(errors="replace"))
    if check and rc != 0:
        tail = (done.stderr or done.stdout).strip()[-TAIL_CHARS:]
        raise CommandError(f"`{command_line(argv)}` failed ({rc}): {tail}", argv=argv, returncode=rc, output=tail)
    return done


async def _stream(
    proc: asyncio.subprocess.Process, data: bytes | None, on_line: Callable[[str], None]
) -> tuple[bytes, bytes]:
    """Feed stdin, hand stdout over line by line, collect stderr; until the process exits."""

    async def feed() -> None:
        if proc.stdin is None:
            return
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            if data:
                proc.stdin.write(data)
                await proc.stdin.drain()
            proc.stdin.close()

    async def lines() -> bytes:
        assert proc.stdout is not None
        chunks = []
        async for raw in proc.stdout:
            chunks.append(raw)
            on_line(raw.decode(errors="replace").rstrip("\n"))
        return b"".join(chunks)

    async def errors() -> bytes:
        return await proc.stderr.read() if proc.stderr is not None else b""

    _, out, err = await asyncio.gather(feed(), lines(), errors())
    await proc.wait()
    return out, err


async def _kill(proc: asyncio.subprocess.Process) -> None:
    if proc.returncode is None:
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        await proc.wait()
