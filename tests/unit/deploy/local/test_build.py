"""deploy/local/build.sh refuses clearly when Go is missing or too old (no build is attempted)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from tests.paths import REPO

SCRIPT = REPO / "deploy" / "local" / "build.sh"


def _path_without_go(tmp_path: Path) -> str:
    """A PATH with the basic tools the script needs but no `go`."""
    tools = tmp_path / "tools"
    tools.mkdir()
    for t in (
        "bash",
        "awk",
        "sed",
        "sort",
        "head",
        "cat",
        "dirname",
        "mkdir",
        "sha256sum",
        "cut",
        "find",
        "xargs",
        "date",
        "printf",
        "tr",
        "ls",
    ):
        found = shutil.which(t)
        if found:
            (tools / t).symlink_to(found)
    return str(tools)


def _run(path: str, out: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "PATH"} | {"PATH": path}
    return subprocess.run(
        [shutil.which("bash") or "/bin/bash", str(SCRIPT), str(out)],
        capture_output=True,
        text=True,
        env=env,
        timeout=30,
        check=False,
    )


def test_missing_go_is_named(tmp_path: Path) -> None:
    proc = _run(_path_without_go(tmp_path), tmp_path / "bin")
    assert proc.returncode == 1
    assert "Go is not installed" in proc.stderr and ">= 1." in proc.stderr


def test_old_go_is_refused_with_the_needed_version(tmp_path: Path) -> None:
    path = _path_without_go(tmp_path)
    fake = Path(path) / "go"
    fake.write_text('#!/bin/sh\n[ "$1 $2" = "env GOVERSION" ] && echo go1.20.4 && exit 0\nexit 99\n')
    fake.chmod(0o755)
    proc = _run(path, tmp_path / "bin")
    assert proc.returncode == 1
    needed = next(
        line.split()[1] for line in (REPO / "deploy/local/go.mod").read_text().splitlines() if line.startswith("go ")
    )
    assert "Go 1.20.4 is too old" in proc.stderr and f">= {needed}" in proc.stderr, proc.stderr
    assert not (tmp_path / "bin" / "gpufed-k8s").exists()
