"""A resilient list+watch for any Kubernetes collection, core or custom.

Owns: `watch` (list, then watch from the list's resourceVersion, forever) on JSON dicts, not
kubernetes-asyncio models, so one code path serves every kind. Lists go through
`gpufed.kube.rest.list_with_version`, paginated (`limit`/`continue`, `rest.PAGE_SIZE` items a
page, 500 unless set; a continue token that expires, 410, restarts the list from its first page);
the watch stream is read here. Requests use the caller's ApiClient
(`api_client` in `gpufed.kube.client`), so host, TLS and credentials come from the kubeconfig.

Invariants of `watch`:
- every (re)list, once its last page is in hand, delivers each listed object as ("SYNC", obj), then
  ("DELETED", last known obj) for each object seen before and absent now, then calls `on_synced`;
  the watch that follows starts from the list's resourceVersion (the same on every page of one list);
- watch events are delivered in order as ("ADDED" | "MODIFIED" | "DELETED", obj); BOOKMARKs only
  advance the resourceVersion the next watch starts from and are not delivered;
- a watch that ends normally is resumed from the last resourceVersion seen; 410 Gone (as an HTTP
  status or an ERROR event) relists; connection errors, timeouts, 408/429/5xx are logged
  ("watch failed") and retried with capped exponential backoff and jitter, then relist; 401/403
  are retried the same way for `forbidden_grace_s` (a kube-apiserver that just started answers
  403 until its RBAC caches have synced; a process must not die of that), and raise once they
  persist longer; any other 4xx (404, 400, ...) is not transient and raises `KubeError` with
  `status` set;
- exceptions raised by `on_event` / `on_synced` propagate unchanged and end the watch;
  cancellation propagates and closes the open stream.

Listed objects get `kind`/`apiVersion` from the list (`rest.list_with_version`), so SYNC objects
look like watched ones. Objects are keyed by (namespace, name); "" for cluster-scoped kinds.

Delivered objects carry no `metadata.managedFields` (nothing here reads them; caches stay smaller),
nor the top-level fields the caller names in `drop` (e.g. a Secret's `data` for a caller that reads
only metadata: neither it nor the relist cache holds them).

Does not: cache beyond what relist diffing needs, decode into models, write anything, or
rate-limit the callbacks (hand keys to a `WorkQueue` for that).
"""

from __future__ import annotations

import asyncio
import inspect
import random
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

import aiohttp
import orjson
import structlog

from gpufed.kube import rest
from gpufed.kube.client import KubeError

Event = tuple[str, dict[str, Any]]
ObjKey = tuple[str, str]

_BASE_BACKOFF = 0.2
_JITTER = 0.1
_MIN_HEALTHY_WATCH_S = 1.0  # a watch that ends sooner with no line at all counts as a failure
_TRANSIENT_STATUS = frozenset({0, 408, 429})
_AUTH_STATUS = frozenset({401, 403})
#: Seconds 401/403 are retried before they count as real (an apiserver's authorizer warms up in seconds).
FORBIDDEN_GRACE_S = 60.0


class _WatchIOError(Exception):
    """An I/O failure of the watch machinery (never raised by callbacks)."""

    def __init__(self, message: str, status: int = 0) -> None:
        super().__init__(message)
        self.status = status


def _is_transient(status: int) -> bool:
    return status in _TRANSIENT_STATUS or status >= 500


def obj_key(obj: Mapping[str, Any]) -> ObjKey:
    """(namespace, name) of a raw object; namespace "" when cluster-scoped."""
    meta = obj.get("metadata") or {}
    return str(meta.get("namespace") or ""), str(meta.get("name") or "")


def _rv(obj: Mapping[str, Any]) -> str | None:
    rv = (obj.get("metadata") or {}).get("resourceVersion")
    return str(rv) if rv else None


def _query(params: Mapping[str, str] | None, extra: Sequence[tuple[str, str]] = ()) -> list[tuple[str, str]]:
    return [*(params or {}).items(), *extra]


async def _get(api: Any, path: str, query: list[tuple[str, str]], client_timeout: aiohttp.ClientTimeout) -> Any:
    """Send a GET through `api` and return the raw aiohttp response (any status; caller releases).

    kubernetes-asyncio's `call_api` is a plain function returning a coroutine; with
    `_preload_content=False` it hands back the aiohttp ClientResponse unread and does not raise on
    error statuses. It mutates `header_params` (and `query_params` for query auth), so both are
    fresh on every call.
    """
    return await api.call_api(
        path,
        "GET",
        query_params=list(query),
        header_params={"Accept": "application/json"},
        auth_settings=["BearerToken"],
        _preload_content=False,
        _request_timeout=client_timeout,
    )


OnEvent = Callable[[str, dict[str, Any]], Awaitable[None] | None]


async def _deliver(on_event: OnEvent, t: str, obj: dict[str, Any], drop: Sequence[str] = ()) -> None:
    # managedFields are the API server's bookkeeping for server-side apply; no gpufed code reads
    # them, and every cache built from a watch would hold them for every object (a large share of
    # a cached pod: `make bench`'s footprint part measures the RSS per offloaded pod).
    meta = obj.get("metadata")
    if isinstance(meta, dict):
        meta.pop("managedFields", None)
    for name in drop:  # the same dict the relist cache holds: dropped there too
        obj.pop(name, None)
    result = on_event(t, obj)
    if inspect.isawaitable(result):
        await result


class _LineReader:
    """Newline-delimited lines of a streaming body, of any length (no reader buffer limit)."""

    def __init__(self, resp: aiohttp.ClientResponse) -> None:
        self._content = resp.content
        self._buf = bytearray()
        self._eof = False

    async def readline(self) -> bytes | None:
        """The next non-empty line, or None at the end of the stream."""
        while True:
            nl = self._buf.find(b"\n")
            if nl >= 0:
                line = bytes(self._buf[:nl])
                del self._buf[: nl + 1]
                if line.strip():
                    return line
                continue
            if self._eof:
                line = bytes(self._buf)
                self._buf.clear()
                return line if line.strip() else None
            chunk = await self._content.readany()
            if chunk:
                self._buf += chunk
            else:
                self._eof = True


class _Watcher:
    """State of one `watch` call: known objects, the resourceVersion to resume from, failures."""

    def __init__(
        self,
        api: Any,
        path: str,
        on_event: OnEvent,
        what: str,
        params: Mapping[str, str] | None,
        timeout_seconds: int,
        on_synced: Callable[[], None] | None,
        max_backoff: float,
        forbidden_grace_s: float = FORBIDDEN_GRACE_S,
        drop: Sequence[str] = (),
    ) -> None:
        self.api = api
        self.drop = tuple(drop)
        self.forbidden_grace_s = forbidden_grace_s
        self.forbidden_since: float | None = None
        self.path = path
        self.on_event = on_event
        self.what = what
        self.params = params
        self.timeout_seconds = timeout_seconds
        self.on_synced = on_synced
        self.max_backoff = max_backoff
        self.known: dict[ObjKey, dict[str, Any]] = {}
        self.rv: str | None = None
        self.failures = 0

    def backoff(self) -> float:
        delay = min(_BASE_BACKOFF * float(2 ** min(max(self.failures - 1, 0), 30)), self.max_backoff)
        return delay * random.uniform(1 - _JITTER, 1 + _JITTER)  # noqa: S311 - jitter, not crypto

    async def run(self) -> None:
        log = structlog.get_logger()
        while True:
            try:
                if self.rv is None:
                    await self.relist()
                healthy = await self.watch_once()
            except _WatchIOError as e:
                if e.status == 410:
                    # The resourceVersion is too old: relist, at once unless it keeps happening.
                    self.rv = None
                    if self.failures:
                        await asyncio.sleep(self.backoff())
                    self.failures += 1
                    continue
                if e.status in _AUTH_STATUS:
                    now = time.monotonic()
                    self.forbidden_since = self.forbidden_since or now
                    if now - self.forbidden_since >= self.forbidden_grace_s:
                        raise KubeError(f"watch {self.what}: {e}", status=e.status) from e
                elif not _is_transient(e.status):
                    raise KubeError(f"watch {self.what}: {e}", status=e.status) from e
                self.failures += 1
                delay = self.backoff()
                log.warning("watch failed", what=self.what, error=str(e), retry_in=round(delay, 3))
                self.rv = None
                await asyncio.sleep(delay)
                continue
            if not healthy:
                # Ended at once with nothing on it: resume from the same version, but not in a hot loop.
                self.failures += 1
                await asyncio.sleep(self.backoff())

    async def relist(self) -> None:
        try:
            items, rv = await rest.list_with_version(self.api, self.path, params=self.params)
        except KubeError as e:
            raise _WatchIOError(str(e), e.status) from e
        previous = self.known
        self.known = {obj_key(o): o for o in items}
        for obj in items:
            await _deliver(self.on_event, "SYNC", obj, self.drop)
        for key, obj in previous.items():
            if key not in self.known:
                await _deliver(self.on_event, "DELETED", obj, self.drop)
        self.forbidden_since = None
        self.rv = rv or None
        if self.rv is None:
            raise _WatchIOError("list returned no resourceVersion", 500)
        if self.on_synced is not None:
            self.on_synced()

    async def watch_once(self) -> bool:
        """One watch request from `self.rv`; True if it was healthy (said anything, or lasted)."""
        assert self.rv is not None
        extra = [
            ("watch", "true"),
            ("resourceVersion", self.rv),
            ("allowWatchBookmarks", "true"),
            ("timeoutSeconds", str(self.timeout_seconds)),
        ]
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=10, sock_read=self.timeout_seconds + 30)
        started = time.monotonic()
        try:
            resp = await _get(self.api, self.path, _query(self.params, extra), timeout)
        except (aiohttp.ClientError, OSError, TimeoutError) as e:
            raise _WatchIOError(f"{type(e).__name__}: {e}") from e
        try:
            if not 200 <= resp.status < 300:
                try:
                    text = await resp.text()
                except (aiohttp.ClientError, OSError, TimeoutError, ValueError):
                    text = ""
                err = rest.error_from(resp.status, text, f"WATCH {self.path}")
                raise _WatchIOError(str(err), err.status)
            reader = _LineReader(resp)
            said_anything = False
            while True:
                try:
                    line = await reader.readline()
                except (aiohttp.ClientError, OSError, TimeoutError) as e:
                    raise _WatchIOError(f"{type(e).__name__}: {e}") from e
                if line is None:
                    break
                if not said_anything:
                    said_anything = True
                    self.failures = 0
                await self.handle_line(line)
        finally:
            resp.close()
        return said_anything or time.monotonic() - started >= _MIN_HEALTHY_WATCH_S

    async def handle_line(self, line: bytes) -> None:
        try:
            event = orjson.loads(line)
            t = event["type"]
            obj = event["object"]
        except (ValueError, KeyError, TypeError) as e:
            raise _WatchIOError(f"undecodable watch event: {e}") from e
        if not isinstance(obj, dict) or not isinstance(t, str):
            raise _WatchIOError(f"malformed watch event: {line[:200]!r}")
        if t == "ERROR":
            code = obj.get("code")
            status = code if isinstance(code, int) else 500
            raise _WatchIOError(f"ERROR event: {status} {obj.get('reason', '')}: {obj.get('message', '')}", status)
        rv = _rv(obj)
        if rv:
            self.rv = rv
        if t == "BOOKMARK":
            return
        key = obj_key(obj)
        if t in ("ADDED", "MODIFIED"):
            self.known[key] = obj
        elif t == "DELETED":
            self.known.pop(key, None)
        else:
            structlog.get_logger().warning("unknown watch event type", what=self.what, type=t)
            return
        await _deliver(self.on_event, t, obj, self.drop)


async def watch(
    api: Any,
    path: str,
    on_event: OnEvent,
    *,
    what: str,
    params: Mapping[str, str] | None = None,
    timeout_seconds: int = 290,
    on_synced: Callable[[], None] | None = None,
    max_backoff: float = 30.0,
    forbidden_grace_s: float = FORBIDDEN_GRACE_S,
    drop: Sequence[str] = (),
) -> None:
    """List then watch the collection at `path` forever, delivering events to `on_event`.

    `path` is a collection path (/api/v1/pods, /api/v1/namespaces/x/configmaps,
    /apis/gpufed.io/v1alpha1/tenants); `params` are extra query parameters (labelSelector,
    fieldSelector); `what` names the watch in logs and errors. See the module docstring for the
    events and the error handling. Returns never; raises KubeError on non-transient errors.
    """
    watcher = _Watcher(
        api, path, on_event, what, params, timeout_seconds, on_synced, max_backoff, forbidden_grace_s, drop
    )
    await watcher.run()


__all__ = ["Event", "OnEvent", "obj_key", "watch"]
