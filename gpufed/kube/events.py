"""Kubernetes Events on objects: how users see what a controller decided (`kubectl describe`).

Owns: `emit`, which records one core/v1 Event about an object, counting repeats of the same
(object, reason, message) instead of creating a new Event each time within one process.
Failures to record are logged, never raised: an Event is a courtesy, not a transaction.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Any

import structlog

from gpufed.kube import rest
from gpufed.kube.client import KubeError
from gpufed.kube.times import rfc3339

COMPONENT = "gpufed-controller"
_log = structlog.get_logger()


async def emit(
    api: Any, obj: Mapping[str, Any], *, type_: str, reason: str, message: str, component: str = COMPONENT
) -> None:
    """Record an Event about `obj` (Normal or Warning). Events of cluster-scoped objects go to `default`."""
    meta = obj.get("metadata") or {}
    namespace = meta.get("namespace") or "default"
    digest = hashlib.sha256(f"{meta.get('uid')}/{reason}/{message}".encode()).hexdigest()[:12]
    name = f"{meta.get('name', 'object')}.{digest}"[:253]
    url = rest.path("v1", "events", name, namespace=namespace)
    try:
        existing = await rest.get(api, url)
        if existing is not None:
            await rest.merge_patch(api, url, {"count": int(existing.get("count") or 1) + 1, "lastTimestamp": rfc3339()})
            return
        await rest.request(
            api,
            "POST",
            rest.path("v1", "events", namespace=namespace),
            body={
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
            },
        )
    except KubeError as e:
        _log.warning("event not recorded", reason=reason, error=str(e))
