"""Kube-apiserver audit logs, read: one event's fields (`parse_event`), the requests received in a
time window (`count_window`), and the lines a log gained since a mark, rotation included (`mark`,
`read_since`).

Owns: the audit event's shape as the bench parts use it (level Metadata, JSON lines) and the rule that
counts each request once. Does not: classify who sent a request or judge what it costs (the parts
that read the logs: `bench.apicost`, `bench.requestcount`).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import parse_qsl, urlsplit


def _epoch(stamp: str) -> float:
    return dt.datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()


@dataclass(frozen=True)
class AuditEvent:
    """The fields of one audit event (level Metadata) this part uses; times in epoch seconds."""

    audit_id: str
    stage: str
    verb: str
    user: str
    user_agent: str
    #: `pods`, `pods/status`, `leases.coordination.k8s.io`; for non-resource requests the URL path.
    resource: str
    namespace: str
    name: str
    #: labelSelector / fieldSelector of the request, `k=v&k=v` (empty when none).
    selectors: str
    code: int
    received: float
    at: float

    @property
    def long_running(self) -> bool:
        """A watch (the only long-running verb gpufed uses at steady state; see `count_window`)."""
        return self.verb == "watch"


def parse_event(line: str) -> AuditEvent | None:
    """One JSON line of a kube-apiserver audit log (None for anything that is not an audit event)."""
    try:
        ev = json.loads(line)
    except ValueError:
        return None
    if not isinstance(ev, dict) or ev.get("kind") != "Event" or "stage" not in ev:
        return None
    uri = str(ev.get("requestURI") or "")
    parts = urlsplit(uri)
    query = dict(parse_qsl(parts.query))
    ref = ev.get("objectRef") or {}
    if ref.get("resource"):
        resource = str(ref["resource"]) + (f"/{ref['subresource']}" if ref.get("subresource") else "")
        if ref.get("apiGroup"):
            resource += f".{ref['apiGroup']}"
    else:
        resource = parts.path or uri
    received = str(ev.get("requestReceivedTimestamp") or ev.get("stageTimestamp") or "")
    try:
        t_recv = _epoch(received)
        t_stage = _epoch(str(ev.get("stageTimestamp") or received))
    except ValueError:
        return None
    selectors = "&".join(f"{k}={query[k]}" for k in ("labelSelector", "fieldSelector") if query.get(k))
    return AuditEvent(
        audit_id=str(ev.get("auditID") or ""),
        stage=str(ev["stage"]),
        verb=str(ev.get("verb") or ""),
        user=str((ev.get("user") or {}).get("username") or ""),
        user_agent=str(ev.get("userAgent") or ""),
        resource=resource,
        namespace=str(ref.get("namespace") or ""),
        name=str(ref.get("name") or ""),
        selectors=selectors,
        code=int((ev.get("responseStatus") or {}).get("code") or 0),
        received=t_recv,
        at=t_stage,
    )


def parse_lines(lines: Iterable[str]) -> list[AuditEvent]:
    return [e for e in (parse_event(line) for line in lines if line.strip()) if e is not None]


@dataclass
class Window:
    """What one audit log says about [t0, t1): requests received in it, and watches that ended in it."""

    requests: list[AuditEvent] = field(default_factory=list)
    watch_ends: list[AuditEvent] = field(default_factory=list)


def count_window(events: Iterable[AuditEvent], t0: float, t1: float) -> Window:
    """Each request once, by the time the API server received it: a long-running one (ResponseStarted)
    when it starts, any other at ResponseComplete (or Panic). The ResponseComplete of a long-running
    request that did start is its end, kept apart (a watch that ends and restarts shows as an end plus
    a new start); a watch refused before it started (e.g. 429) has no ResponseStarted and is a request."""
    out = Window()
    events = list(events)
    started = {e.audit_id for e in events if e.stage == "ResponseStarted"}
    for e in events:
        if e.stage == "ResponseStarted":
            if t0 <= e.received < t1:
                out.requests.append(e)
        elif e.stage == "ResponseComplete" and (e.audit_id in started or (e.long_running and e.code < 400)):
            if t0 <= e.at < t1:
                out.watch_ends.append(e)
        elif e.stage in ("ResponseComplete", "Panic") and t0 <= e.received < t1:
            out.requests.append(e)
    return out


@dataclass
class AuditMark:
    """Where one audit log stood when a window began."""

    path: Path
    inode: int
    offset: int


def mark(path: Path) -> AuditMark:
    try:
        st = path.stat()
    except OSError:
        return AuditMark(path, 0, 0)
    return AuditMark(path, st.st_ino, st.st_size)


def read_since(m: AuditMark) -> list[str]:
    """The lines written since `m`, rotated files included (the caller filters by time anyway)."""
    lines: list[str] = []
    try:
        st = m.path.stat()
    except OSError:
        return lines
    same = st.st_ino == m.inode and st.st_size >= m.offset
    if not same:
        # Rotated (audit-<time>.log next to it): take every rotated file newer than the mark, whole.
        for p in sorted(m.path.parent.glob(f"{m.path.stem}-*{m.path.suffix}")):
            with contextlib.suppress(OSError):
                lines += p.read_text(errors="replace").splitlines()
    with m.path.open("rb") as f:
        f.seek(m.offset if same else 0)
        lines += f.read().decode(errors="replace").splitlines()
    return lines
