"""What the benchmarks observe of gpufed's processes from outside: /proc samples and log offsets.

Owns: `find_pid` (a process whose command line holds every given argument), `cpu_seconds`
(utime + stime), `rss_bytes` (VmRSS) and `Sampler`, a thread that records the peak RSS of a set
of processes every `interval_s` seconds and their CPU use between `start` and `stop`. A thread, not
an asyncio task, so a busy event loop in the benchmark client does not skew the samples. Also
`log_offsets`: where a gpufed controller's log and its virtual kubelets' logs end now, so that what
a measured run writes to them can be read afterwards (`bench.offload.log_findings`).

Linux only; a process that exits while sampled keeps its last values (and is reported as gone).
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

CLK_TCK = os.sysconf("SC_CLK_TCK")


def find_pid(*needles: str) -> int | None:
    """The lowest pid whose command line holds every `needle` as one argument (or None)."""
    want = [n.encode() for n in needles]
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            args = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if all(w in args for w in want):
            found.append(int(entry.name))
    return min(found) if found else None


def log_offsets(controller_log: Path) -> dict[Path, int]:
    """The size of a gpufed controller's log and of every virtual kubelet log beside it (its supervisor
    writes them to the same directory), controller first; a log that cannot be read counts from 0."""
    logs = [controller_log, *sorted(controller_log.parent.glob("virtual-kubelet-*.log"))]
    out: dict[Path, int] = {}
    for p in logs:
        try:
            out[p] = p.stat().st_size
        except OSError:
            out[p] = 0
    return out


def cpu_seconds(pid: int) -> float | None:
    """User + system CPU seconds the process has used so far (None when it is gone)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def rss_bytes(pid: int) -> int | None:
    """Resident set size (VmRSS) in bytes (None when the process is gone)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


@dataclass
class ProcessUsage:
    """What one sampled process used between `Sampler.start` and `Sampler.stop`."""

    pid: int
    rss_start_bytes: int = 0
    rss_peak_bytes: int = 0
    rss_end_bytes: int = 0
    cpu_start_s: float = 0.0
    cpu_end_s: float = 0.0
    wall_s: float = 0.0
    gone: bool = False

    @property
    def cpu_cores(self) -> float:
        """Average cores used over the sampled wall time."""
        return (self.cpu_end_s - self.cpu_start_s) / self.wall_s if self.wall_s > 0 else 0.0


@dataclass
class Sampler:
    """Samples the RSS of `pids` (name -> pid) every `interval_s` on a thread, and their CPU time."""

    pids: dict[str, int]
    interval_s: float = 0.2
    usage: dict[str, ProcessUsage] = field(default_factory=dict)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None
    _t0: float = 0.0

    def start(self) -> None:
        self._t0 = time.monotonic()
        for name, pid in self.pids.items():
            rss = rss_bytes(pid) or 0
            self.usage[name] = ProcessUsage(
                pid, rss_start_bytes=rss, rss_peak_bytes=rss, cpu_start_s=cpu_seconds(pid) or 0.0
            )
        self._thread = threading.Thread(target=self._run, name="bench-sampler", daemon=True)
        self._thread.start()

    def _sample(self) -> None:
        for u in self.usage.values():
            rss = rss_bytes(u.pid)
            if rss is None:
                u.gone = True
                continue
            u.rss_peak_bytes = max(u.rss_peak_bytes, rss)
            u.rss_end_bytes = rss

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self._sample()

    def stop(self) -> dict[str, ProcessUsage]:
        """Stop sampling; CPU is measured up to now (call it when the measured burst ends)."""
        wall = time.monotonic() - self._t0
        for u in self.usage.values():
            cpu = cpu_seconds(u.pid)
            if cpu is None:
                u.gone = True
            else:
                u.cpu_end_s = cpu
            u.wall_s = wall
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self._sample()
        return self.usage
