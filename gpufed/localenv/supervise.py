"""The long-running processes of the local clusters, seen from outside: started, recognised, stopped.

Owns: starting a component detached (its own session, so it outlives the caller and is stopped by
process group) with its output appended to a log file; a process's identity (pid plus its start time,
so a reused pid is never mistaken for ours); finding our processes without a state file (`orphans`);
stopping a set of processes (SIGTERM, a grace period, then SIGKILL); whether a loopback port is free;
the tail of a log for error messages.

Linux only (reads /proc). Does not: know which components a cluster has or what they do (`components`
and `launcher` do), or run short commands (`process` does).
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Sequence
from pathlib import Path

#: Lines of a component log shown when it fails.
LOG_TAIL_LINES = 30


def start_time(pid: int) -> int | None:
    """Start time (clock ticks since boot) of a live process, else None.

    A zombie thread-group leader whose other threads are still exiting counts as alive: those
    threads may still hold its sockets and files (Go programs exit with many threads).
    """
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name may contain spaces and parentheses: fields start after the last ')'.
    fields = stat[stat.rindex(")") + 2 :].split()
    if fields[0] in ("Z", "X"):
        try:
            threads = sum(1 for _ in Path(f"/proc/{pid}/task").iterdir())
        except OSError:
            threads = 0
        if threads > 1:
            return int(fields[19])
        with contextlib.suppress(ChildProcessError, OSError):
            os.waitpid(pid, os.WNOHANG)
        return None
    return int(fields[19])


def alive(pid: int | None, started: int | None) -> bool:
    """Whether `pid` runs and is the process that started at `started` (None: any start time)."""
    if pid is None:
        return False
    now = start_time(pid)
    return now is not None and (started is None or now == started)


def port_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def tail(path: Path, lines: int = LOG_TAIL_LINES) -> str:
    try:
        data = path.read_text(errors="replace").splitlines()
    except OSError:
        return "(no log)"
    return "\n".join(data[-lines:]) or "(empty log)"


def spawn(argv: Sequence[str], log: Path, cwd: Path, what: str) -> tuple[int, int | None]:
    """Start `argv` in its own session, appending its output to `log` after a line naming `what`;
    returns its identity (pid, start time)."""
    with log.open("ab") as out:
        out.write(f"\n=== starting {what} at {time.strftime('%Y-%m-%dT%H:%M:%S')} ===\n".encode())
        out.flush()
        proc = subprocess.Popen(
            argv,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            cwd=cwd,
        )
    return proc.pid, start_time(proc.pid)


def orphans(directory: Path, bin_dir: Path) -> list[int]:
    """Pids of our binaries whose command line points into `directory` (found without a state file).

    Only processes whose executable lives in `bin_dir`, and gpufed controllers, qualify, so a shell
    or test runner that merely mentions the directory is never touched.
    """
    # With the separator: /x/.cache/e2e must not match the processes of /x/.cache/e2e-offload.
    needle = (str(directory).rstrip("/") + "/").encode()
    bins = bin_dir.resolve()
    out = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            exe = (entry / "exe").readlink()
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        ours = exe.parent == bins or any(
            b"gpufed.cli\x00" + verb in cmdline for verb in (b"controller", b"virtual-kubelet")
        )
        if ours and needle in cmdline:
            out.append(int(entry.name))
    return out


def stop(pids: set[int], progress: Callable[[str], None], grace_s: float) -> None:
    """SIGTERM each process (its whole group when it leads one), SIGKILL those still running after
    `grace_s`, then wait (up to 5 s each) until they are gone."""
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, signal.SIGTERM) if os.getpgid(pid) == pid else os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and any(start_time(p) is not None for p in pids):
        time.sleep(0.1)
    for pid in pids:
        if start_time(pid) is not None:
            progress(f"pid {pid} ignored SIGTERM for {grace_s:.0f}s; killing it")
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
    for pid in pids:
        for _ in range(50):
            if start_time(pid) is None:
                break
            time.sleep(0.1)
