"""Raw-JSON REST calls through a kubernetes-asyncio ApiClient: get, create, server-side apply, delete.

Owns: the few verbs the controllers, the CLI and `watch` need, on plain dicts (no generated models,
so core kinds and gpufed's CRDs are handled alike), URL paths and owner references for objects
(every name, namespace and subresource is one quoted path segment: `segment` refuses what would
leave it, so no caller can build a traversal), paginated lists (with `kind`/`apiVersion` filled in
on the items, which the API server leaves out, and a restart when a continue token expires), and
the mapping of every failure to `KubeError`
with the API server's own message (e.g. "pods is forbidden: User ... cannot list resource ...").
Writes use server-side apply with ONE field manager, `gpufed`; deletes can carry a UID
precondition.

Does not: retry, cache or watch (see `watch` and `queue`).
"""

from __future__ import annotations

import json
import urllib.parse
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from typing import Any

import aiohttp
import orjson
from prometheus_client import Counter

from gpufed.kube.budget import budget_of
from gpufed.kube.client import ApiException, KubeError

FIELD_MANAGER = "gpufed"
#: Items per page of a list.
PAGE_SIZE = 500
#: Seconds a single request may take (watches use their own timeouts).
REQUEST_TIMEOUT_S = 30.0


class InvalidPathError(KubeError):
    """A name, namespace or subresource that cannot be one segment of a REST path (e.g. `..`, `a/b`).

    Raised before any request is sent; a KubeError with status 400 and reason `Invalid`, so every
    caller treats it as the final refusal the API server would give an invalid name.
    """

    def __init__(self, message: str) -> None:
        super().__init__(message, status=400, reason="Invalid")


#: Characters a path segment may hold unquoted besides letters, digits and `-._~` (RBAC names such
#: as `system:controller:foo` use `:`).
_SEGMENT_SAFE = ":"


def segment(value: str, what: str = "name") -> str:
    """`value` as one quoted REST path segment; InvalidPathError when it cannot be one.

    Refused: the empty string, `.` and `..` (a client or proxy normalises them away, climbing out of
    the namespace), anything holding `/` or `\\`, and control characters. Everything else is
    percent-quoted (`%`, `?`, `#`, spaces, ... never reach the server as syntax).
    """
    if not value or value in (".", "..") or "/" in value or "\\" in value:
        raise InvalidPathError(f"invalid {what} {value!r}: not a single path segment")
    if any(ord(c) < 0x20 or ord(c) == 0x7F for c in value):
        raise InvalidPathError(f"invalid {what} {value!r}: control characters")
    return urllib.parse.quote(value, safe=_SEGMENT_SAFE)


def path(api_version: str, plural: str, name: str = "", namespace: str | None = None, sub: str = "") -> str:
    """URL path of a collection (`name` empty) or an object, optionally a subresource.

    `namespace`, `name` and `sub` are each one path segment (`segment`): a name such as
    `../../gpufed/secrets/x` raises InvalidPathError instead of naming another object.
    """
    base = "/api/v1" if api_version == "v1" else f"/apis/{api_version}"
    p = base + (f"/namespaces/{segment(namespace, 'namespace')}" if namespace else "") + f"/{plural}"
    if name:
        p += f"/{segment(name)}"
    if sub:
        p += f"/{segment(sub, 'subresource')}"
    return p


def owner_ref(obj: Mapping[str, Any]) -> dict[str, Any]:
    """An ownerReference to `obj` (as read from the API server), for garbage collection."""
    meta = obj["metadata"]
    return {"apiVersion": obj["apiVersion"], "kind": obj["kind"], "name": meta["name"], "uid": meta["uid"]}


def error_from(status: int, text: str, what: str) -> KubeError:
    """KubeError for a non-2xx answer, with the message of the API server's Status object."""
    try:
        body = json.loads(text)
    except ValueError:
        body = None
    if isinstance(body, dict):
        message, reason = str(body.get("message") or f"HTTP {status}"), str(body.get("reason") or "")
    else:
        message, reason = text.strip()[:300] or f"HTTP {status}", ""
    return KubeError(f"{what}: {status} {message}", status=status, reason=reason)


API_REQUESTS = Counter(
    "gpufed_api_requests_total",
    "Requests gpufed made to Kubernetes API servers (any cluster), by HTTP method, resource (plural, with "
    "its subresource) and status code (0: no answer).",
    ["method", "resource", "code"],
)


def resource_of(url_path: str) -> str:
    """The resource a request path names: `pods`, `pods/status`, `secrets`, `leases` ... (`-` for
    discovery and other non-resource paths). Low cardinality: never a name or a namespace."""
    parts = [p for p in url_path.split("?", 1)[0].split("/") if p]
    if parts[:1] == ["api"]:
        parts = parts[2:]
    elif parts[:1] == ["apis"]:
        parts = parts[3:]
    else:
        return "-"
    if len(parts) >= 2 and parts[0] == "namespaces" and len(parts) != 2:
        parts = parts[2:]
    if not parts:
        return "-"
    return f"{parts[0]}/{parts[2]}" if len(parts) >= 3 else parts[0]


async def request(
    api: Any,
    method: str,
    url_path: str,
    *,
    body: Any = None,
    params: Mapping[str, str] | None = None,
    content_type: str = "application/json",
    what: str = "",
    request_timeout: float = REQUEST_TIMEOUT_S,
) -> dict[str, Any]:
    """One request; the decoded JSON response, or KubeError (status 0 when no answer came)."""
    what = what or f"{method} {url_path}"
    headers = {"Accept": "application/json", "Content-Type": content_type}
    budget = budget_of(api)
    if budget is not None:
        await budget.acquire()
    try:
        resp = await api.call_api(
            url_path,
            method,
            query_params=list((params or {}).items()),
            header_params=headers,
            body=body,
            auth_settings=["BearerToken"],
            _preload_content=False,
            _request_timeout=request_timeout,
        )
        async with resp:
            data = await resp.read()
            status = resp.status
    except (aiohttp.ClientError, OSError, TimeoutError) as e:
        API_REQUESTS.labels(method, resource_of(url_path), "0").inc()
        raise KubeError(f"{what}: cannot reach the API server ({type(e).__name__}: {e})") from e
    except ApiException as e:  # the library raises it (status 0) for transport failures it sees itself
        API_REQUESTS.labels(method, resource_of(url_path), str(int(e.status or 0))).inc()
        raise KubeError(f"{what}: {e.reason}", status=int(e.status or 0)) from e
    API_REQUESTS.labels(method, resource_of(url_path), str(status)).inc()
    if not 200 <= status < 300:
        raise error_from(status, data.decode(errors="replace"), what)
    if not data:
        return {}
    try:
        out = orjson.loads(data)
    except ValueError as e:
        raise KubeError(f"{what}: the API server sent something that is not JSON") from e
    return out if isinstance(out, dict) else {"items": out}


async def get(api: Any, url_path: str, *, what: str = "") -> dict[str, Any] | None:
    """The object, or None when it does not exist."""
    try:
        return await request(api, "GET", url_path, what=what)
    except KubeError as e:
        if e.not_found:
            return None
        raise


async def serves(api: Any, group_version_path: str) -> bool:
    """Whether the API server serves a group version (`/apis/resource.k8s.io/v1`): discovery answers it."""
    return await get(api, group_version_path, what=f"discovery of {group_version_path}") is not None


async def list_with_version(
    api: Any, url_path: str, *, params: Mapping[str, str] | None = None
) -> tuple[list[dict[str, Any]], str]:
    """Every item of a collection (paginated) and the list's resourceVersion.

    A continue token that expires mid-list (410) restarts the list, up to three times in all.
    """
    for attempt in range(3):
        try:
            return await _list_pages(api, url_path, params)
        except KubeError as e:
            if e.status != 410 or attempt == 2:
                raise
    raise AssertionError("unreachable")


async def _list_pages(api: Any, url_path: str, params: Mapping[str, str] | None) -> tuple[list[dict[str, Any]], str]:
    items: list[dict[str, Any]] = []
    rv = ""
    token = ""
    while True:
        p = {**(params or {}), "limit": str(PAGE_SIZE)}
        if token:
            p["continue"] = token
        page = await request(api, "GET", url_path, params=p, what=f"LIST {url_path}")
        meta = page.get("metadata") or {}
        rv = rv or str(meta.get("resourceVersion") or "")
        kind = str(page.get("kind") or "")
        for item in page.get("items") or []:
            if not isinstance(item, dict):
                continue
            if kind.endswith("List"):
                item.setdefault("kind", kind.removesuffix("List"))
            if page.get("apiVersion"):
                item.setdefault("apiVersion", page["apiVersion"])
            items.append(item)
        token = str(meta.get("continue") or "")
        if not token:
            return items, rv


async def list_items(api: Any, url_path: str, *, params: Mapping[str, str] | None = None) -> list[dict[str, Any]]:
    """Every item of a collection (see `list_with_version`)."""
    items, _rv = await list_with_version(api, url_path, params=params)
    return items


async def apply(api: Any, url_path: str, obj: Mapping[str, Any], *, what: str = "") -> dict[str, Any]:
    """Server-side apply `obj` at its object path (or `.../status`), as field manager `gpufed`.

    Empty maps and lists directly under `status` are left out: the API server turns an applied
    `{}` that replaces owned keys into null, which a typed CRD schema then refuses. Leaving the
    field out releases it, which is what an empty value means here.
    """
    body = dict(obj)
    if isinstance(body.get("status"), dict):
        body["status"] = {k: v for k, v in body["status"].items() if v not in ({}, [], None)}
    return await request(
        api,
        "PATCH",
        url_path,
        body=body,
        params={"fieldManager": FIELD_MANAGER, "force": "true"},
        content_type="application/apply-patch+yaml",
        what=what or f"apply {url_path}",
    )


async def merge_patch(api: Any, url_path: str, patch: Mapping[str, Any], *, what: str = "") -> dict[str, Any]:
    return await request(
        api, "PATCH", url_path, body=dict(patch), content_type="application/merge-patch+json", what=what
    )


async def strategic_patch(api: Any, url_path: str, patch: Mapping[str, Any], *, what: str = "") -> dict[str, Any]:
    """Strategic-merge patch (core kinds): lists with merge keys, e.g. conditions by `type`, are merged
    item by item, so conditions other components own are kept."""
    return await request(
        api, "PATCH", url_path, body=dict(patch), content_type="application/strategic-merge-patch+json", what=what
    )


async def create(api: Any, url_path: str, obj: Mapping[str, Any], *, what: str = "") -> dict[str, Any]:
    """POST `obj` to its collection path; KubeError with `conflict` when it already exists."""
    return await request(api, "POST", url_path, body=dict(obj), what=what or f"create {url_path}")


async def delete(
    api: Any,
    url_path: str,
    *,
    uid: str | None = None,
    propagation: str = "Background",
    grace_period_s: int | None = None,
    what: str = "",
) -> bool:
    """Delete; False when it was already gone. With `uid`, only that incarnation is deleted."""
    body: dict[str, Any] = {"kind": "DeleteOptions", "apiVersion": "v1", "propagationPolicy": propagation}
    if uid:
        body["preconditions"] = {"uid": uid}
    if grace_period_s is not None:
        body["gracePeriodSeconds"] = grace_period_s
    try:
        await request(api, "DELETE", url_path, body=body, what=what or f"delete {url_path}")
    except KubeError as e:
        if e.not_found:
            return False
        raise
    return True


@asynccontextmanager
async def stream(
    api: Any,
    url_path: str,
    *,
    params: Mapping[str, str] | None = None,
    what: str = "",
    read_timeout: float | None = None,
) -> AsyncIterator[aiohttp.StreamReader]:
    """A GET whose body is read as it arrives (logs, follow): the body stream, or KubeError.

    No overall deadline: connecting has `REQUEST_TIMEOUT_S`, reading `read_timeout` between chunks
    (None: wait as long as the server keeps the stream open).
    """
    what = what or f"GET {url_path}"
    budget = budget_of(api)
    if budget is not None:
        await budget.acquire()
    timeout = aiohttp.ClientTimeout(
        total=None, connect=REQUEST_TIMEOUT_S, sock_connect=REQUEST_TIMEOUT_S, sock_read=read_timeout
    )
    try:
        resp = await api.call_api(
            url_path,
            "GET",
            query_params=list((params or {}).items()),
            header_params={"Accept": "*/*"},
            auth_settings=["BearerToken"],
            _preload_content=False,
            _request_timeout=timeout,
        )
    except (aiohttp.ClientError, OSError, TimeoutError) as e:
        raise KubeError(f"{what}: cannot reach the API server ({type(e).__name__}: {e})") from e
    except ApiException as e:
        raise KubeError(f"{what}: {e.reason}", status=int(e.status or 0)) from e
    async with resp:
        if not 200 <= resp.status < 300:
            raise error_from(resp.status, await resp.text(), what)
        yield resp.content


__all__ = [
    "FIELD_MANAGER",
    "PAGE_SIZE",
    "InvalidPathError",
    "apply",
    "create",
    "delete",
    "error_from",
    "get",
    "list_items",
    "list_with_version",
    "merge_patch",
    "owner_ref",
    "path",
    "request",
    "segment",
    "strategic_patch",
    "stream",
]
