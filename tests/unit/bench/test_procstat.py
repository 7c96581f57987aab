"""Process sampling and log offsets, against this test's own processes and files."""

from __future__ import annotations

import os
from pathlib import Path

from bench import procstat


def test_log_offsets_cover_the_controller_and_every_virtual_kubelet_log(tmp_path: Path) -> None:
    controller = tmp_path / "gpufed-controller.log"
    controller.write_text("x" * 10)
    (tmp_path / "virtual-kubelet-b.log").write_text("y" * 3)
    (tmp_path / "virtual-kubelet-a.log").write_text("")
    (tmp_path / "kwok.log").write_text("not ours")
    offsets = procstat.log_offsets(controller)
    assert list(offsets.items()) == [
        (controller, 10),
        (tmp_path / "virtual-kubelet-a.log", 0),
        (tmp_path / "virtual-kubelet-b.log", 3),
    ]
    # a controller log not written yet is read from its start later
    assert procstat.log_offsets(tmp_path / "elsewhere" / "gpufed-controller.log") == {
        tmp_path / "elsewhere" / "gpufed-controller.log": 0
    }


def test_this_process_is_found_and_sampled() -> None:
    assert (procstat.rss_bytes(os.getpid()) or 0) > 0
    assert (procstat.cpu_seconds(os.getpid()) or 0.0) >= 0.0
    assert procstat.rss_bytes(2**22 + 12345) is None
