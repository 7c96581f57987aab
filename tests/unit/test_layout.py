"""tests/unit mirrors the repository: a module's tests are found by its path.

`tests/unit/<dir>/test_<name>[_<aspect>].py` (or `test_fuzz_<name>...`) tests `<dir>/<name>.py`, the
package `<dir>/<name>/`, or the package `<dir>` itself when `<name>` is its own name; outside the
Python packages (`deploy/local/build.sh`) the same rule holds for any file. Shared helpers of a
test directory (fakes, scenarios) are modules without the `test_` prefix.
"""

from __future__ import annotations

from pathlib import Path

from tests.paths import REPO

UNIT = REPO / "tests" / "unit"


def _subject(test: Path) -> bool:
    rel = test.relative_to(UNIT)
    folder = REPO / Path(*rel.parts[:-1])
    stem = rel.stem.removeprefix("test_").removeprefix("fuzz_")
    names = {p.stem for p in folder.iterdir() if p.name != "__init__.py" and not p.name.startswith(".")}
    names.add(folder.name)
    return folder.is_dir() and any(stem == n or stem.startswith(f"{n}_") for n in names)


def test_every_unit_test_module_sits_where_its_subject_sits() -> None:
    tests = sorted(UNIT.rglob("test_*.py"))
    assert len(tests) > 90
    strays = [str(t.relative_to(REPO)) for t in tests if t.parent != UNIT and not _subject(t)]
    assert strays == [], f"unit tests whose path names no module of the repository: {strays}"


def test_only_this_check_sits_at_the_top() -> None:
    top = sorted(p.name for p in UNIT.glob("test_*.py"))
    assert top == ["test_layout.py"], f"unit tests belong under the path of the module they test: {top}"


def test_every_test_directory_is_a_package() -> None:
    missing = [
        str(d.relative_to(REPO))
        for d in UNIT.rglob("*")
        if d.is_dir() and any(d.glob("test_*.py")) and not (d / "__init__.py").exists()
    ]
    assert missing == [], f"test directories without __init__.py (their module names would collide): {missing}"
