"""Where the tests find the repository and their data files, wherever the test module sits."""

from __future__ import annotations

from pathlib import Path

#: The repository root.
REPO = Path(__file__).resolve().parent.parent
#: Data files of the unit tests (recorded audit logs, NVML readings).
UNIT_DATA = REPO / "tests" / "unit" / "data"
