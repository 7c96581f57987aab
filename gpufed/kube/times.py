"""RFC 3339 times as the Kubernetes API writes and reads them.

Owns: formatting a time as `metav1.Time` (seconds, `2026-11-27T00:24:53Z`) or `metav1.MicroTime`
(microseconds, leases and events), and parsing any RFC 3339 time the API server or a peer writes
(`Z` or an offset, with or without a fraction) into an aware UTC datetime.

Pure: no I/O; the one place a timestamp string is built or read.
"""

from __future__ import annotations

import datetime as dt

_SECONDS = "%Y-%m-%dT%H:%M:%SZ"
_MICRO = "%Y-%m-%dT%H:%M:%S.%fZ"


def rfc3339(when: float | dt.datetime | None = None, *, micro: bool = False) -> str:
    """`when` (Unix seconds, an aware datetime, or None for now) as `metav1.Time`, or as
    `metav1.MicroTime` with `micro`."""
    if when is None:
        moment = dt.datetime.now(dt.UTC)
    elif isinstance(when, dt.datetime):
        moment = when.astimezone(dt.UTC)
    else:
        moment = dt.datetime.fromtimestamp(when, dt.UTC)
    return moment.strftime(_MICRO if micro else _SECONDS)


def parse_rfc3339(text: str) -> dt.datetime:
    """An RFC 3339 time as an aware UTC datetime (in its own offset when its UTC is past year 9999);
    ValueError when `text` is not one."""
    parsed = dt.datetime.fromisoformat(text.strip().replace("z", "Z").replace("Z", "+00:00"))
    if parsed.tzinfo is None:
        raise ValueError(f"time {text!r} has no time zone (RFC 3339 needs Z or an offset)")
    try:
        return parsed.astimezone(dt.UTC)
    except OverflowError:  # a valid time whose UTC is past year 9999 (e.g. 9999-12-31T23:59:59-01:00)
        return parsed


def time_or_none(value: object) -> dt.datetime | None:
    """A time field read from an object (Time, MicroTime, an annotation) as `parse_rfc3339` gives it;
    None when the field is absent or not RFC 3339 (the caller decides what an unreadable time means)."""
    if not isinstance(value, str) or not value:
        return None
    try:
        return parse_rfc3339(value)
    except ValueError:
        return None
