"""What every verb shares: logging set-up (the only place it is configured) and error exits."""

from __future__ import annotations

import logging
import sys

import structlog
import typer
from rich.console import Console

console = Console(stderr=True)
LEVELS = ("debug", "info", "warning", "error")


def configure_logging(level: str = "info", *, json_logs: bool | None = None) -> None:
    """Console logs on a TTY, JSON lines otherwise (in a cluster or a log file); fixed keys."""
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
