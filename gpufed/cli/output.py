"""What a read verb prints on stdout, in the `-o` format asked for.

Owns: the formats (`table`, `wide`, `json`, `yaml`) and their check, `emit` for the data formats
(JSON and YAML with sorted keys, so the same data prints the same bytes), `stdout_console` and
`table` for the human ones. Data goes to stdout; progress, notes and errors go to stderr
(`gpufed.cli.common.console`), so `gpufed pool -o json | jq` and `gpufed pool > file` get the data
alone.

A table never cuts a value: every column folds a long value onto the next line instead of ending
it with an ellipsis, and when stdout is not a terminal (a pipe, a file) the console is as wide as
the rows are, so each row stays on one line for grep and awk.

Does not decide which columns a verb shows (each verb does; `wide` adds its extra columns).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from gpufed.cli.common import fail

FORMATS = ("table", "wide", "json", "yaml")
#: Width of the stdout console when it is not a terminal: wider than any row, so none wraps.
PIPE_WIDTH = 100_000

Output = Annotated[str, typer.Option("-o", "--output", help="output format: table, wide, json or yaml")]


def check_output(output: str) -> None:
    """Exit 2 unless `output` is one of FORMATS (before the verb connects to anything)."""
    if output not in FORMATS:
        raise fail(f"--output must be one of {', '.join(FORMATS)} (got {output!r})", code=2)


def emit(data: Any, output: str) -> bool:
    """Print `data` on stdout as JSON or YAML when `output` asks for one; False for table and wide
    (the verb draws its tables)."""
    if output == "json":
        typer.echo(json.dumps(data, indent=2, sort_keys=True))
        return True
    if output == "yaml":
        import yaml

        typer.echo(yaml.safe_dump(data, sort_keys=True, default_flow_style=False, allow_unicode=True), nl=False)
        return True
    return False


def stdout_console() -> Console:
    """The console for a verb's data: the terminal's width on a terminal, unbounded otherwise."""
    out = sys.stdout
    if out.isatty():
        return Console(file=out)
    return Console(file=out, width=PIPE_WIDTH, soft_wrap=True)


def table(title: str | None, columns: Sequence[str], *, right: Sequence[str] = ()) -> Table:
    """A table whose columns fold long values instead of cutting them; `right`: columns of numbers."""
    t = Table(title=title)
    for col in columns:
        t.add_column(col, overflow="fold", justify="right" if col in right else "left")
    return t
