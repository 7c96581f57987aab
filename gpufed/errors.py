"""The one base of the errors a user may see, and the exit code each means.

Owns: `GpufedError` — its message is what the user reads (what went wrong and what to do), its
`exit_code` what `gpufed` exits with. Every error a command or a component raises to say "this
cannot go on" derives from it; the CLI catches only this base (gpufed.cli.common), so a new error
type needs no new `except` anywhere. Programming errors (TypeError, KeyError, ...) are not
GpufedErrors and keep their traceback.

Pure: no I/O, no imports beyond the standard library.
"""

from __future__ import annotations


class GpufedError(Exception):
    """An error with a user-facing message; `exit_code` (default 1) is what the CLI exits with."""

    exit_code: int = 1

    def __init__(self, *args: object, exit_code: int | None = None) -> None:
        super().__init__(*args)
        if exit_code is not None:
            self.exit_code = exit_code

    @property
    def message(self) -> str:
        return str(self)


class UsageError(GpufedError):
    """The command line or its inputs are wrong (a flag, a file): exit code 2, like a bad flag."""

    exit_code = 2
