"""Status conditions as the Kubernetes API writes them, on plain dicts.

Owns: building a condition whose `lastTransitionTime` is kept while its status value stays the
same (`condition`, `mark`), replacing a condition of one type in a list (`set_condition`),
reading one back (`find`, `is_true`, `reason_of`), summing a kind's conditions up in its `Ready`
condition (`ready`: True when every condition the kind needs is True, else False with the reason of
the first that is not), stamping every condition with the generation the reconciler acted on
(`observed`), and comparing two statuses while ignoring the transition times (`without_times`), so
a reconciler writes only real changes.

Does not: write a status (the reconcilers do, with `gpufed.kube.rest.apply`), or define the
condition types of any kind (their owners do; the shape is `gpufed.apis.meta.Condition`).

Pure: no I/O; times come from `gpufed.kube.times`.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Literal

from gpufed.kube.times import rfc3339

Status = Literal["True", "False", "Unknown"]
#: The condition that sums up the others (`kubectl wait --for=condition=Ready`).
READY = "Ready"


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


def observed(conds: Iterable[Mapping[str, Any]], generation: int) -> list[dict[str, Any]]:
    """`conds` with `observedGeneration` set to `generation` (the object's metadata.generation the
    reconciler read) on each."""
    return [{**c, "observedGeneration": generation} for c in conds]


def ready(
    conds: Iterable[Mapping[str, Any]],
    requires: Sequence[str],
    generation: int,
    *,
    now: float | dt.datetime | None = None,
) -> list[dict[str, Any]]:
    """`conds` with a `Ready` condition (first, the others in their order) and every condition
    observed at `generation`.

    Ready is True when each type of `requires` is present with status True; otherwise False with the
    reason of the first type (in `requires` order) that is not, and a message naming it; a type not
    reported yet gives the reason `<Type>Pending`. Its transition time follows `condition`."""
    have = [dict(c) for c in conds]
    missing = next((t for t in requires if not is_true(have, t)), None)
    if missing is None:
        new = condition(READY, True, READY, f"{', '.join(requires)}: True", have, now=now)
    else:
        found = find(have, missing)
        if found is None:
            reason, message = f"{missing}Pending", f"{missing}: not reported yet"
        else:
            reason = str(found.get("reason") or f"{missing}Pending")
            message = f"{missing}: {found.get('message') or found.get('status')}"
        new = condition(READY, False, reason, message, have, now=now)
    return observed([new, *(c for c in have if c.get("type") != READY)], generation)
