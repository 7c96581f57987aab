"""What every verb shares: logging set-up (the only place it is configured), the stderr console for
progress, notes and errors, and error exits.

A command ends with a message and exit code for a `gpufed.errors.GpufedError` only; `gpufed.errors`
imports nothing, so catching it costs a verb no start-up time. Local checks (`checked`) end with
their error's code before anything connects: 2 for a `UsageError`.

Does not: resolve kubeconfigs (`gpufed.cli.kubeconfig`) or print a verb's data (`gpufed.cli.output`)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import sys
from collections.abc import Awaitable, Callable, Coroutine
from typing import Annotated, Any, TypeVar

import typer
from rich.console import Console

from gpufed.errors import GpufedError

#: Progress, notes and errors; a verb's data goes to stdout (gpufed.cli.output). Lines are not
#: wrapped at the console's width, so a long message stays one line in a log.
console = Console(stderr=True, soft_wrap=True)
LEVELS = ("debug", "info", "warning", "error")


def configure_logging(level: str = "info", *, json_logs: bool | None = None) -> None:
    """Console logs on a TTY, JSON lines otherwise (in a cluster or a log file); fixed keys."""
    import structlog  # only the long-running verbs log: a short command does not load it

    if level not in LEVELS:
        raise typer.BadParameter(f"--log-level must be one of {', '.join(LEVELS)}")
    if json_logs is None:
        json_logs = not sys.stderr.isatty()
    renderer: structlog.typing.Processor = (
        structlog.processors.JSONRenderer() if json_logs else structlog.dev.ConsoleRenderer()
    )
    structlog.configure(
        processors=[
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso" if json_logs else "%H:%M:%S"),
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(getattr(logging, level.upper())),
        logger_factory=structlog.PrintLoggerFactory(file=sys.stderr),
        cache_logger_on_first_use=True,
    )


def fail(message: object, code: int = 1) -> typer.Exit:
    console.print(f"[bold red]error:[/] {message}")
    return typer.Exit(code)


class Report:
    """Progress of a long command on the console: a step being taken, then what it did."""

    def step(self, text: str) -> None:
        console.print(f"[cyan]•[/] {text} …")

    def done(self, text: str) -> None:
        console.print(f"  [green]✓[/] {text}")


def serve(component: Callable[[], Awaitable[None]]) -> None:
    """Run a long-running component until SIGTERM or SIGINT (a clean stop); a GpufedError ends the
    process with its message and exit code. Beside it, the memory the process frees is handed back
    to the operating system every few seconds (`gpufed.memory`)."""

    async def main() -> None:
        from gpufed.memory import trim_heap  # only the long-running verbs need it

        task = asyncio.current_task()
        assert task is not None
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, task.cancel)
        trimming = asyncio.create_task(trim_heap())
        try:
            with contextlib.suppress(asyncio.CancelledError):
                await component()
        finally:
            trimming.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await trimming

    try:
        asyncio.run(main())
    except GpufedError as e:
        raise fail(e, e.exit_code) from None


T = TypeVar("T")

Timeout = Annotated[float, typer.Option("--timeout", help="seconds the whole operation may take")]
#: The Prometheus metrics server every long-running verb offers (gpufed.kube.metrics).
MetricsPort = Annotated[
    int | None,
    typer.Option(
        "--metrics-port",
        envvar="GPUFED_METRICS_PORT",
        min=1,
        max=65535,
        help="serve Prometheus metrics on this port (GET /metrics, /healthz); unset: no metrics server",
    ),
]
MetricsHost = Annotated[
    str,
    typer.Option(
        "--metrics-host",
        envvar="GPUFED_METRICS_HOST",
        help="address the metrics server listens on (with --metrics-port)",
    ),
]


def checked(value: Callable[[], T]) -> T:
    """The result of a local check (a kubeconfig, a request built from flags); its GpufedError ends
    the command with its message and code (2 for a UsageError) before anything connects."""
    try:
        return value()
    except GpufedError as e:
        raise fail(e, e.exit_code) from None


def check_timeout(timeout: float, flag: str = "--timeout") -> None:
    if not timeout > 0:  # also NaN
        raise fail(f"{flag} must be a positive number of seconds", code=2)


def run_op(coro: Coroutine[Any, Any, T]) -> T:
    """Run one operation to its end; a GpufedError ends the process with its message and exit code."""
    try:
        return asyncio.run(coro)
    except GpufedError as e:
        raise fail(e, e.exit_code) from None


def parse_ports(text: str) -> tuple[int, int]:
    """FIRST-LAST -> (first, last), or a BadParameter that shows the expected form."""
    try:
        first, last = (int(p) for p in text.split("-", 1))
        if not 0 < first <= last < 65536:
            raise ValueError
    except ValueError:
        raise typer.BadParameter(f"ports must be FIRST-LAST, e.g. 10250-10259 (got {text!r})") from None
    return first, last
