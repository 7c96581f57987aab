"""Kubernetes Events on objects: how users see what a controller decided (`kubectl describe`).

Owns: `emit`, which records one core/v1 Event about an object, counting repeats of the same
(object, reason, message) on one Event (a deterministic name) instead of creating a new Event each
time. Writers racing for the same Event (concurrent workers, other replicas) all land on it: a 409
AlreadyExists on create reads it again and counts, and the count is updated only at the
resourceVersion it was read at (409 Conflict: read again), up to `MAX_ATTEMPTS` tries with jitter.
Failures to record are logged, never raised: an Event is a courtesy, not a transaction.
"""

from __future__ import annotations

import asyncio
import hashlib
import random
from collections.abc import Mapping
from typing import Any

import structlog

from gpufed.kube import rest
from gpufed.kube.client import KubeError
from gpufed.kube.times import rfc3339

COMPONENT = "gpufed-controller"
#: Tries to record one occurrence while other writers keep winning the race for the same Event.
MAX_ATTEMPTS = 10
#: Upper bound of the random pause before retry n, times n (spreads racing writers apart).
_RETRY_JITTER_S = 0.01
_log = structlog.get_logger()


async def emit(
    api: Any, obj: Mapping[str, Any], *, type_: str, reason: str, message: str, component: str = COMPONENT
) -> None:
    """Record an Event about `obj` (Normal or Warning). Events of cluster-scoped objects go to `default`."""
    meta = obj.get("metadata") or {}
    namespace = meta.get("namespace") or "default"
    digest = hashlib.sha256(f"{meta.get('uid')}/{reason}/{message}".encode()).hexdigest()[:12]
    name = f"{meta.get('name', 'object')}.{digest}"[:253]
    try:
        url = rest.path("v1", "events", name, namespace=namespace)
        collection = rest.path("v1", "events", namespace=namespace)
        body = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"name": name, "namespace": namespace},
            "involvedObject": {
                "apiVersion": obj.get("apiVersion"),
                "kind": obj.get("kind"),
                "name": meta.get("name"),
                "namespace": meta.get("namespace"),
                "uid": meta.get("uid"),
            },
            "type": type_,
            "reason": reason,
            "message": message[:1024],
            "source": {"component": component},
            "firstTimestamp": rfc3339(),
            "lastTimestamp": rfc3339(),
            "count": 1,
            "reportingComponent": component,
        }
        for attempt in range(MAX_ATTEMPTS):
            if attempt:
                await asyncio.sleep(random.uniform(0, _RETRY_JITTER_S * attempt))  # noqa: S311 - jitter, not crypto
            if await _record_once(api, url, collection, body):
                return
        _log.warning("event not recorded", reason=reason, error=f"the Event kept changing ({MAX_ATTEMPTS} attempts)")
    except KubeError as e:
        _log.warning("event not recorded", reason=reason, error=str(e))


async def _record_once(api: Any, url: str, collection: str, body: Mapping[str, Any]) -> bool:
    """Create the Event or count one more occurrence on it; False when another writer raced this one."""
    existing = await rest.get(api, url)
    try:
        if existing is None:
            await rest.create(api, collection, body)
            return True
        patch: dict[str, Any] = {"count": int(existing.get("count") or 1) + 1, "lastTimestamp": rfc3339()}
        rv = (existing.get("metadata") or {}).get("resourceVersion")
        if rv:  # a precondition: the update conflicts if anyone wrote the Event since it was read
            patch["metadata"] = {"resourceVersion": rv}
        await rest.merge_patch(api, url, patch)
        return True
    except KubeError as e:
        # 409: created or counted by someone else first; 404: deleted since it was read.
        if e.conflict or (existing is not None and e.not_found):
            return False
        raise
