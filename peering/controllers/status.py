"""Status helpers the reconcilers share: conditions that keep their transition time, comparison
that ignores it, and writing a status with server-side apply.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from gpufed.apis.models import API_VERSION
from gpufed.kube import rest


def now() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def condition(type_: str, ok: bool | None, reason: str, message: str, old: list[dict[str, Any]]) -> dict[str, Any]:
    """A condition; `lastTransitionTime` is kept from `old` while the status value stays the same."""
    status = "Unknown" if ok is None else ("True" if ok else "False")
    prev = next((c for c in old if c.get("type") == type_), None)
    since = prev.get("lastTransitionTime") if prev and prev.get("status") == status else None
    return {"type": type_, "status": status, "reason": reason, "message": message, "lastTransitionTime": since or now()}


def set_condition(conds: list[dict[str, Any]], new: dict[str, Any]) -> list[dict[str, Any]]:
    return [*(c for c in conds if c.get("type") != new["type"]), new]


def mark(conds: list[dict[str, Any]], type_: str, ok: bool | None, reason: str, message: str) -> list[dict[str, Any]]:
    """`conds` with condition `type_` set (see `condition`)."""
    return set_condition(conds, condition(type_, ok, reason, message, conds))


def without_times(status: dict[str, Any]) -> dict[str, Any]:
    """`status` with condition timestamps removed, to tell a real change from a rewrite."""
    out = dict(status)
    out["conditions"] = [
        {k: v for k, v in c.items() if k != "lastTransitionTime"} for c in status.get("conditions") or []
    ]
    return out


async def write(
    api: Any, kind: str, plural: str, name: str, status: dict[str, Any], namespace: str | None = None
) -> None:
    """Apply `status` to the status subresource of a gpufed object."""
    metadata = {"name": name, **({"namespace": namespace} if namespace else {})}
    await rest.apply(
        api,
        rest.path(API_VERSION, plural, name, namespace=namespace, sub="status"),
        {"apiVersion": API_VERSION, "kind": kind, "metadata": metadata, "status": status},
    )
