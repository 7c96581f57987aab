"""The JobSet module the local clusters are built from (deploy/local/jobset, pinned; `make binaries`
downloads it before this tier runs): upstream's own manifests read as gpufed.localenv.jobset expects.
Without the module this fails saying so; it is never skipped."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from gpufed.localenv import jobset
from tests.paths import REPO


def test_the_pinned_modules_manifests_read_as_expected() -> None:
    found = subprocess.run(
        jobset.SOURCE_DIR_ARGV,
        cwd=REPO / "deploy" / "local" / "jobset",
        env={**os.environ, "GOTOOLCHAIN": "local", "GOFLAGS": "-mod=readonly"},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert found.returncode == 0 and found.stdout.strip(), f"JobSet's module is not downloaded: {found.stderr}"
    src = jobset.sources(Path(found.stdout.strip()))
    names = {w["name"] for c in src.webhooks for w in c["webhooks"]}
    assert names == {"mjobset.kb.io", "mpod.kb.io", "vjobset.kb.io", "vpod.kb.io"}
    assert any(r.get("resources") == ["jobs"] for r in src.role["rules"])
