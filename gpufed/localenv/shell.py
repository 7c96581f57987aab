"""Commands run as a user runs them, shown with their output: the demo's hands on the clusters.

Owns: `Shell` (runs kubectl and the gpufed CLI in subprocesses with the environment it is given —
KUBECONFIG included —, shows each command as the user would type it and streams its output through
the narrator, or runs it quietly; a failure names the command and what it said), how a command line
is displayed (`display`: the gpufed command line shown as `gpufed`, long paths shortened, quoting),
what a failed command said (`failure_reason`), and `eventually` (poll until a probe answers).

Every failure is a `StepError`, so the step running the command fails with that sentence. Does not:
decide what to run (`story`), or run commands itself (`process.run` does, under a timeout).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from gpufed import process
from gpufed.localenv.steps import Narrator, StepError

#: Seconds one command may take.
COMMAND_TIMEOUT_S = 180.0


def display(argv: Sequence[str], prefix: Sequence[str], replacements: Sequence[tuple[str, str]]) -> str:
    """A command line as the user would type it: the gpufed command line `prefix` shown as `gpufed`,
    long paths replaced by their short forms, words with spaces or shell characters quoted."""
    n = len(prefix)
    if n and tuple(argv[:n]) == tuple(prefix):
        argv = ["gpufed", *argv[n:]]
    words = []
    for word in argv:
        for long, short in replacements:
            word = word.replace(long, short)
        quote = any(c in word for c in " ()|&;<>*?!'\"{}") and not word.startswith("$")
        words.append(f"'{word}'" if quote else word)
    return " ".join(words)


def failure_reason(lines: Sequence[str]) -> str:
    """What a failed command said: from its last `error:` line on (gpufed's and kubectl's own message,
    which rich may have wrapped over several lines), else its last three lines."""
    text = [line.strip() for line in lines if line.strip()]
    starts = [i for i, line in enumerate(text) if line.lower().startswith(("error:", "error from server"))]
    picked = text[starts[-1] :] if starts else text[-3:]
    return " ".join(picked) if starts else " / ".join(picked) or "(no output)"


@dataclass
class Shell:
    """Runs commands with KUBECONFIG set, shows them (and their output) through the narrator."""

    narrator: Narrator
    kubectl_bin: str
    gpufed_argv: tuple[str, ...]
    env: dict[str, str]
    replacements: list[tuple[str, str]] = field(default_factory=list)

    async def run(
        self,
        argv: Sequence[str],
        *,
        show: bool = True,
        check: bool = True,
        input_text: str | None = None,
        timeout_s: float = COMMAND_TIMEOUT_S,
    ) -> tuple[int, str]:
        """(exit status, output). Shown: the command, then its output line by line as it comes (stderr
        merged). Quiet: nothing printed; the output is stdout, then stderr when the command failed."""
        shown = display(argv, self.gpufed_argv, self.replacements)
        if show:
            self.narrator.command(shown)
        lines: list[str] = []

        def output(line: str) -> None:
            lines.append(line)
            self.narrator.output(line)

        try:
            done = await process.run(
                argv,
                stdin=input_text,
                timeout_s=timeout_s,
                env=self.env,
                check=False,
                merge_stderr=show,
                on_line=output if show else None,
            )
        except process.CommandTimeoutError:
            raise StepError(f"`{shown}` did not finish within {timeout_s:g} s") from None
        if not show:
            lines.extend(done.stdout.splitlines())
            if done.returncode != 0:
                lines.extend(done.stderr.splitlines())
        text = "\n".join(lines)
        if check and done.returncode != 0:
            raise StepError(f"`{shown}` exited with {done.returncode}: {failure_reason(lines)}")
        return done.returncode, text

    async def kubectl(self, context: str, *args: str, **kw: Any) -> str:
        return (await self.run([self.kubectl_bin, "--context", context, *args], **kw))[1]

    async def kubectl_json(self, context: str, *args: str) -> Any:
        return json.loads(await self.kubectl(context, *args, "-o", "json", show=False))

    async def found(self, context: str, *args: str) -> bool:
        """Whether `kubectl get <args>` finds the object (NotFound: False; other errors raise)."""
        rc, text = await self.run([self.kubectl_bin, "--context", context, "get", *args], show=False, check=False)
        if rc != 0 and "NotFound" not in text and "not found" not in text:
            raise StepError(f"kubectl get {' '.join(args)} on {context}: {text.strip()[-300:]}")
        return rc == 0

    async def gpufed(self, *args: str, **kw: Any) -> str:
        return (await self.run([*self.gpufed_argv, *args], **kw))[1]


async def eventually(what: str, probe: Callable[[], Awaitable[Any]], timeout_s: float, interval_s: float = 0.5) -> Any:
    """The first truthy answer of `probe`, or StepError naming `what` and the last answer."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    last: Any = None
    while True:
        last = await probe()
        if last:
            return last
        if loop.time() > deadline:
            raise StepError(f"timed out after {timeout_s:g} s waiting for {what} (last: {last!r})")
        await asyncio.sleep(interval_s)
