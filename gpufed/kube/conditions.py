"""Status conditions as the Kubernetes API writes them, on plain dicts.

Owns: building a condition whose `lastTransitionTime` is kept while its status value stays the
same (`condition`, `mark`), replacing a condition of one type in a list (`set_condition`),
reading one back (`find`, `is_true`, `reason_of`), and comparing two statuses while ignoring
the transition times (`without_times`), so a reconciler writes only real changes.

Does not: write a status (the reconcilers do, with `gpufed.kube.rest.apply`), or define the
condition types of any kind (their owners do; the shape is `gpufed.apis.meta.Condition`).

Pure: no I/O; times come from `gpufed.kube.times`.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Mapping
from typing import Any, Literal

from gpufed.kube.times import rfc3339

Status = Literal["True", "False", "Unknown"]


def status_value(ok: bool | None) -> Status:
    """`True`/`False` for a known outcome, `Unknown` for None."""
    return "Unknown" if ok is None else ("True" if ok else "False")


def find(conds: Iterable[Mapping[str, Any]] | None, type_: str) -> Mapping[str, Any] | None:
    """The condition of type `type_` in `conds`, or None."""
    return next((c for c in conds or () if c.get("type") == type_), None)


def is_true(conds: Iterable[Mapping[str, Any]] | None, type_: str) -> bool:
    """Whether condition `type_` is present with status `True`."""
    found = find(conds, type_)
    return found is not None and found.get("status") == "True"


def reason_of(conds: Iterable[Mapping[str, Any]] | None, type_: str) -> str:
    """The reason of condition `type_`; "" when it is absent."""
    found = find(conds, type_)
    return "" if found is None else str(found.get("reason"))


def condition(
    type_: str,
    ok: bool | None,
    reason: str,
    message: str,
    old: Iterable[Mapping[str, Any]],
    *,
    now: float | dt.datetime | None = None,
) -> dict[str, Any]:
    """A condition; `lastTransitionTime` is kept from `old` while the status value stays the same,
    and is `now` (default: the current time) when it changes."""
    status = status_value(ok)
    prev = find(old, type_)
    since = prev.get("lastTransitionTime") if prev and prev.get("status") == status else None
    return {
        "type": type_,
        "status": status,
        "reason": reason,
        "message": message,
        "lastTransitionTime": since or rfc3339(now),
    }


def set_condition(conds: Iterable[dict[str, Any]], new: dict[str, Any]) -> list[dict[str, Any]]:
    """`conds` with the condition of `new`'s type replaced by `new` (appended last)."""
    return [*(c for c in conds if c.get("type") != new["type"]), new]


def mark(
    conds: Iterable[dict[str, Any]],
    type_: str,
    ok: bool | None,
    reason: str,
    message: str,
    *,
    now: float | dt.datetime | None = None,
) -> list[dict[str, Any]]:
    """`conds` with condition `type_` set (see `condition`)."""
    conds = list(conds)
    return set_condition(conds, condition(type_, ok, reason, message, conds, now=now))


def without_times(status: Mapping[str, Any]) -> dict[str, Any]:
    """`status` with condition timestamps removed, to tell a real change from a rewrite."""
    out = dict(status)
    out["conditions"] = [
        {k: v for k, v in c.items() if k != "lastTransitionTime"} for c in status.get("conditions") or []
    ]
    return out
