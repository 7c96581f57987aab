"""Typed accessors for the metadata of a Kubernetes object held as a plain dict.

Owns: reading `metadata.name`, `namespace`, `uid`, `labels`, `annotations`, `resourceVersion`,
`generation` and `deletionTimestamp` from any Mapping the API server returned, with the defaults
the API uses for an absent field ("" for strings, empty maps, no deletion), so callers stop
spelling `(obj.get("metadata") or {}).get(...)`.

Does not: build or change metadata (owner references are `gpufed.kube.rest.owner_ref`), or parse
the deletion time (`gpufed.kube.times.parse_rfc3339` does).

Pure: no I/O.
"""

# No `from __future__ import annotations` here: that name is the accessor below.
from collections.abc import Mapping
from typing import Any


def metadata(obj: Mapping[str, Any] | None) -> Mapping[str, Any]:
    """`obj.metadata`, or an empty mapping when `obj` or its metadata is absent."""
    return (obj or {}).get("metadata") or {}


def name(obj: Mapping[str, Any] | None) -> str:
    return str(metadata(obj).get("name") or "")


def namespace(obj: Mapping[str, Any] | None) -> str:
    """The object's namespace; "" for cluster-scoped objects."""
    return str(metadata(obj).get("namespace") or "")


def uid(obj: Mapping[str, Any] | None) -> str:
    return str(metadata(obj).get("uid") or "")


def resource_version(obj: Mapping[str, Any] | None) -> str:
    return str(metadata(obj).get("resourceVersion") or "")


def generation(obj: Mapping[str, Any] | None, default: int = 1) -> int:
    """`metadata.generation`; `default` when the API server has not set one (objects without a spec)."""
    value = metadata(obj).get("generation")
    return default if value is None else int(value)


def labels(obj: Mapping[str, Any] | None) -> Mapping[str, str]:
    return metadata(obj).get("labels") or {}


def annotations(obj: Mapping[str, Any] | None) -> Mapping[str, str]:
    return metadata(obj).get("annotations") or {}


def deletion_timestamp(obj: Mapping[str, Any] | None) -> str | None:
    """The RFC 3339 time deletion was asked for, or None while the object is not being deleted."""
    value = metadata(obj).get("deletionTimestamp")
    return str(value) if value else None


def is_deleting(obj: Mapping[str, Any] | None) -> bool:
    """Whether the object carries a deletion timestamp (finalizers may still hold it)."""
    return deletion_timestamp(obj) is not None
