"""The one `main` of the generated reference pages (`refdoc`, `crdref`, `metricsdoc`).

Owns: reading the optional PATH argument, writing the rendered page there (or to the page's default
path under docs/reference/) and saying what it wrote. Does not: render anything; each generator
module renders its own page and keeps its own drift test.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path


def write_page(argv: list[str] | None, default: Path, render: Callable[[], str], what: str) -> Path:
    """Write `render()` to argv[0] (or `default`), print `wrote PATH (WHAT)`, return the path."""
    args = sys.argv[1:] if argv is None else argv
    path = Path(args[0]) if args else default
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(render())
    print(f"wrote {path} ({what})")
    return path
