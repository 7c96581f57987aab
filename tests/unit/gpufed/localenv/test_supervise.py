"""Our long-running processes seen from outside: identity across pid reuse, zombies, orphans, stopping."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

from gpufed.localenv import supervise


def test_process_identity_survives_pid_reuse_checks() -> None:
    p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        st = supervise.start_time(p.pid)
        assert st is not None
        assert supervise.alive(p.pid, st)
        assert not supervise.alive(p.pid, st + 1), "a different start time means a different process"
    finally:
        p.kill()
        p.wait()
    assert not supervise.alive(p.pid, st)


def test_zombies_count_as_dead() -> None:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    while True:  # wait until it has exited but was not reaped
        try:
            if Path(f"/proc/{p.pid}/stat").read_text().split(")")[-1].split()[0] == "Z":
                break
        except OSError:
            break
    assert supervise.start_time(p.pid) is None


def test_orphans_only_match_our_binaries(tmp_path: Path) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    shell = bin_dir / "sh"
    shutil.copy("/bin/sh", shell)
    (tmp_path / "state").mkdir()
    # Both mention the state dir; only the one whose executable is in bin_dir is ours.
    ours = subprocess.Popen([str(shell), "-c", "sleep 30; true", str(tmp_path / "state" / "kwok.yaml")])
    theirs = subprocess.Popen(["/bin/sh", "-c", f"sleep 30; echo {tmp_path / 'state' / 'kwok.yaml'}"])
    # A sibling environment whose directory merely starts with the same name is not ours either.
    sibling = subprocess.Popen([str(shell), "-c", "sleep 30; true", str(tmp_path / "state-other" / "kwok.yaml")])
    try:
        found = supervise.orphans(tmp_path / "state", bin_dir)
        assert ours.pid in found and theirs.pid not in found and sibling.pid not in found
        assert os.getpid() not in found
    finally:
        for p in (ours, theirs, sibling):
            p.kill()
            p.wait()


def test_spawn_starts_a_detached_process_logging_to_its_file_and_stop_ends_it(tmp_path: Path) -> None:
    log = tmp_path / "c.log"
    pid, started = supervise.spawn(
        [sys.executable, "-c", "print('hello', flush=True); import time; time.sleep(60)"], log, tmp_path, "thing"
    )
    try:
        assert started is not None and supervise.alive(pid, started)
        assert os.getpgid(pid) == pid, "its own session, so it is stopped by process group"
        for _ in range(100):
            if "hello" in log.read_text():
                break
            subprocess.run(["sleep", "0.05"], check=True)
        assert "=== starting thing at " in log.read_text() and "hello" in log.read_text()
        msgs: list[str] = []
        supervise.stop({pid}, msgs.append, grace_s=5)
        assert not supervise.alive(pid, started) and msgs == []
    finally:
        if supervise.start_time(pid) is not None:
            os.killpg(pid, 9)


def test_a_busy_port_is_not_free_and_a_log_tail_is_its_last_lines(tmp_path: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        assert not supervise.port_free(s.getsockname()[1])
    log = tmp_path / "x.log"
    assert supervise.tail(log) == "(no log)"
    log.write_text("")
    assert supervise.tail(log) == "(empty log)"
    log.write_text("".join(f"line {i}\n" for i in range(50)))
    assert supervise.tail(log, 3) == "line 47\nline 48\nline 49"
