"""watch and rest reads against a small fake API server on 127.0.0.1: pagination, SYNC and
on_synced, event delivery, bookmarks, 410 relists, retries on 5xx, KubeError on 403/404.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
from collections.abc import AsyncIterator, Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any

import pytest
from aiohttp import web
from kubernetes_asyncio import client
from structlog.testing import capture_logs

from gpufed.kube import rest
from gpufed.kube import watch as kw
from gpufed.kube.client import KubeError

PATH = "/api/v1/namespaces/ns/configmaps"
HANG = "hang"  # a watch step: keep the stream open until the server stops

Step = dict[str, Any] | int | str | Callable[["FakeApi"], None]


def cm(name: str, rv: str, data: str = "") -> dict[str, Any]:
    """A ConfigMap as a list item (no kind/apiVersion, as the API server sends them)."""
    return {"metadata": {"name": name, "namespace": "ns", "resourceVersion": rv}, "data": {"v": data}}


def ev(t: str, obj: dict[str, Any]) -> dict[str, Any]:
    return {"type": t, "object": {"kind": "ConfigMap", "apiVersion": "v1", **obj}}


def status(code: int) -> dict[str, Any]:
    return {"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": code, "reason": "X", "message": "m"}


@dataclass
class FakeApi:
    """Serves PATH: LIST from `objects`, paginated; each WATCH plays the next script in `watches`."""

    objects: dict[str, dict[str, Any]] = field(default_factory=dict)
    rv: str = "100"
    list_statuses: list[int] = field(default_factory=list)  # answered (in order) before listing
    continue_statuses: list[int] = field(default_factory=list)  # the same, for requests with a continue token
    watches: list[list[Step]] = field(default_factory=list)
    list_queries: list[dict[str, str]] = field(default_factory=list)
    watch_queries: list[dict[str, str]] = field(default_factory=list)
    stop: asyncio.Event = field(default_factory=asyncio.Event)

    async def collection(self, request: web.Request) -> web.StreamResponse:
        if request.query.get("watch"):
            self.watch_queries.append(dict(request.query))
            return await self._watch(request)
        self.list_queries.append(dict(request.query))
        pending = self.continue_statuses if request.query.get("continue") else self.list_statuses
        if pending:
            code = pending.pop(0)
            return web.json_response(status(code), status=code)
        names = sorted(self.objects)
        start = int(request.query.get("continue") or 0)
        limit = int(request.query.get("limit") or len(names) or 1)
        page = names[start : start + limit]
        meta: dict[str, Any] = {"resourceVersion": self.rv}
        if start + limit < len(names):
            meta["continue"] = str(start + limit)
        body = {"kind": "ConfigMapList", "apiVersion": "v1", "metadata": meta, "items": [self.objects[n] for n in page]}
        return web.json_response(body)

    async def one(self, request: web.Request) -> web.StreamResponse:
        obj = self.objects.get(request.match_info["name"])
        if obj is None:
            return web.json_response(status(404), status=404)
        return web.json_response({"kind": "ConfigMap", "apiVersion": "v1", **obj})

    async def _watch(self, request: web.Request) -> web.StreamResponse:
        steps: list[Step] = self.watches.pop(0) if self.watches else [HANG]
        while steps:
            step = steps[0]
            if isinstance(step, dict | int | str):
                break
            steps.pop(0)
            step(self)  # a callable step: it changes the server between watches
        if steps and isinstance(steps[0], int):
            return web.json_response(status(steps[0]), status=steps[0])
        resp = web.StreamResponse()
        resp.content_type = "application/json"
        await resp.prepare(request)
        for step in steps:
            if callable(step):
                step(self)
            elif step == HANG:
                await self.stop.wait()
            elif isinstance(step, dict):
                await resp.write(json.dumps(step).encode() + b"\n")
        await resp.write_eof()
        return resp


@pytest.fixture
async def fake() -> AsyncIterator[tuple[FakeApi, Any]]:
    api_state = FakeApi()
    app = web.Application()
    app.router.add_get(PATH, api_state.collection)
    app.router.add_get(PATH + "/{name}", api_state.one)
    runner = web.AppRunner(app, shutdown_timeout=0.1)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    api = client.ApiClient(client.Configuration(host=f"http://127.0.0.1:{port}"))
    try:
        yield api_state, api
    finally:
        api_state.stop.set()
        await api.close()
        await runner.cleanup()


class Recorder:
    """Collects events (and on_synced as ("SYNCED", {})) and lets a test wait for a count."""

    def __init__(self) -> None:
        self.events: list[tuple[str, dict[str, Any]]] = []
        self.changed = asyncio.Event()

    def on_event(self, t: str, obj: dict[str, Any]) -> None:
        self.events.append((t, obj))
        self.changed.set()

    def on_synced(self) -> None:
        self.on_event("SYNCED", {})

    def names(self) -> list[tuple[str, str]]:
        return [(t, (o.get("metadata") or {}).get("name", "")) for t, o in self.events]

    async def wait_for(self, n: int, timeout: float = 10.0) -> None:
        async with asyncio.timeout(timeout):
            while len(self.events) < n:
                self.changed.clear()
                await self.changed.wait()


@contextlib.asynccontextmanager
async def watching(api: Any, rec: Recorder, **kw_args: Any) -> AsyncIterator[asyncio.Task[None]]:
    coro: Coroutine[Any, Any, None] = kw.watch(
        api, PATH, rec.on_event, what="configmaps", on_synced=rec.on_synced, **kw_args
    )
    task = asyncio.create_task(coro)
    try:
        yield task
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


def closed_port() -> int:
    """A local port nothing listens on (bound, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
    return port


async def until(pred: Callable[[], bool], timeout: float = 10.0) -> None:
    async with asyncio.timeout(timeout):
        while not pred():
            await asyncio.sleep(0.005)


async def test_lists_paginated_then_watches_and_delivers(
    fake: tuple[FakeApi, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    server, api = fake
    monkeypatch.setattr(rest, "PAGE_SIZE", 2)
    server.objects = {n: cm(n, "90") for n in ("a", "b", "c")}
    server.watches = [
        [ev("ADDED", cm("d", "101")), ev("MODIFIED", cm("a", "102", "x")), ev("DELETED", cm("b", "103")), HANG]
    ]
    rec = Recorder()
    async with watching(api, rec, params={"labelSelector": "app=x"}, timeout_seconds=17):
        await rec.wait_for(7)
    assert rec.names() == [
        ("SYNC", "a"),
        ("SYNC", "b"),
        ("SYNC", "c"),
        ("SYNCED", ""),
        ("ADDED", "d"),
        ("MODIFIED", "a"),
        ("DELETED", "b"),
    ]
    sync_a = rec.events[0][1]
    assert sync_a["kind"] == "ConfigMap"
    assert sync_a["apiVersion"] == "v1"
    assert rec.events[5][1]["data"] == {"v": "x"}
    # two pages, the second from the continue token; the selector goes on every request
    assert [q.get("continue") for q in server.list_queries] == [None, "2"]
    assert all(q["limit"] == "2" and q["labelSelector"] == "app=x" for q in server.list_queries)
    (wq,) = server.watch_queries
    assert wq["resourceVersion"] == "100"
    assert wq["allowWatchBookmarks"] == "true"
    assert wq["timeoutSeconds"] == "17"
    assert wq["labelSelector"] == "app=x"


async def test_async_callback_is_awaited(fake: tuple[FakeApi, Any]) -> None:
    server, api = fake
    server.objects = {"a": cm("a", "90")}
    server.watches = [[ev("ADDED", cm("b", "101")), HANG]]
    seen: list[str] = []
    done = asyncio.Event()

    async def on_event(t: str, obj: dict[str, Any]) -> None:
        await asyncio.sleep(0)
        seen.append(f"{t}:{obj['metadata']['name']}")
        if len(seen) == 2:
            done.set()

    task = asyncio.create_task(kw.watch(api, PATH, on_event, what="configmaps"))
    try:
        async with asyncio.timeout(10):
            await done.wait()
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
    assert seen == ["SYNC:a", "ADDED:b"]


async def test_bookmark_moves_the_resume_point_and_is_not_delivered(fake: tuple[FakeApi, Any]) -> None:
    server, api = fake
    server.objects = {"a": cm("a", "90")}
    bookmark = {"type": "BOOKMARK", "object": {"kind": "ConfigMap", "metadata": {"resourceVersion": "150"}}}
    server.watches = [[ev("ADDED", cm("b", "120")), bookmark], [ev("MODIFIED", cm("b", "160")), HANG]]
    rec = Recorder()
    async with watching(api, rec):
        await rec.wait_for(4)
        await until(lambda: len(server.watch_queries) == 2)
    assert rec.names() == [("SYNC", "a"), ("SYNCED", ""), ("ADDED", "b"), ("MODIFIED", "b")]
    assert [q["resourceVersion"] for q in server.watch_queries] == ["100", "150"]
    assert len(server.list_queries) == 1  # a normal end re-watches; it does not relist


def _vanish_b(server: FakeApi) -> None:
    del server.objects["b"]
    server.objects["a"] = cm("a", "190", "new")
    server.rv = "200"


@pytest.mark.parametrize("gone", [ev("ERROR", status(410)), 410], ids=["error-event", "http-status"])
async def test_gone_relists_and_synthesizes_deleted(fake: tuple[FakeApi, Any], gone: Step) -> None:
    server, api = fake
    server.objects = {"a": cm("a", "90"), "b": cm("b", "91")}
    server.watches = [[_vanish_b, gone]]  # b vanishes while the client is watching, then 410
    rec = Recorder()
    async with watching(api, rec):
        await rec.wait_for(6)
        await until(lambda: len(server.watch_queries) == 2)
    assert rec.names() == [
        ("SYNC", "a"),
        ("SYNC", "b"),
        ("SYNCED", ""),
        ("SYNC", "a"),
        ("DELETED", "b"),
        ("SYNCED", ""),
    ]
    assert rec.events[3][1]["data"] == {"v": "new"}
    assert rec.events[4][1]["metadata"]["resourceVersion"] == "91"  # the last known state of b
    assert [q["resourceVersion"] for q in server.watch_queries] == ["100", "200"]


async def test_dropped_fields_are_neither_delivered_nor_kept_for_the_relist(fake: tuple[FakeApi, Any]) -> None:
    server, api = fake
    server.objects = {"a": cm("a", "90", "listed"), "b": cm("b", "91", "listed")}
    server.watches = [[ev("ADDED", cm("c", "101", "watched")), _vanish_b, ev("ERROR", status(410))]]
    rec = Recorder()
    async with watching(api, rec, drop=("data",)):
        await rec.wait_for(7)
    assert ("DELETED", "b") in rec.names(), rec.names()
    assert [e for e in rec.events if "data" in e[1]] == [], "a dropped field was delivered"
    deleted = [e[1] for e in rec.events if e[0] == "DELETED"]
    assert deleted and all("data" not in o for o in deleted), "the relist cache kept the dropped field"


async def test_server_errors_are_retried_with_a_warning(fake: tuple[FakeApi, Any]) -> None:
    server, api = fake
    server.objects = {"a": cm("a", "90")}
    server.list_statuses = [500]
    server.watches = [[503], [ev("ADDED", cm("b", "101")), HANG]]
    rec = Recorder()
    with capture_logs() as logs:
        async with watching(api, rec, max_backoff=0.3):
            await rec.wait_for(5)
    assert rec.names() == [("SYNC", "a"), ("SYNCED", ""), ("SYNC", "a"), ("SYNCED", ""), ("ADDED", "b")]
    assert len(server.list_queries) == 3  # failed, listed, relisted after the failed watch
    warnings = [e for e in logs if e["event"] == "watch failed"]
    assert len(warnings) == 2
    assert warnings[0]["what"] == "configmaps"
    assert "500" in warnings[0]["error"]
    assert "503" in warnings[1]["error"]
    assert all(e["log_level"] == "warning" for e in warnings)


async def test_connection_refused_is_retried() -> None:
    dead = client.ApiClient(client.Configuration(host=f"http://127.0.0.1:{closed_port()}"))
    rec = Recorder()
    try:
        with capture_logs() as logs:
            async with watching(dead, rec, max_backoff=0.05) as task:
                await until(lambda: sum(e["event"] == "watch failed" for e in logs) >= 2)
                assert not task.done()
    finally:
        await dead.close()
    assert rec.events == []


@pytest.mark.parametrize("where", ["list", "watch"])
@pytest.mark.parametrize("code", [403, 404])
async def test_forbidden_or_missing_raises_kube_error(fake: tuple[FakeApi, Any], where: str, code: int) -> None:
    server, api = fake
    server.objects = {"a": cm("a", "90")}
    if where == "list":
        server.list_statuses = [code]
    else:
        server.watches = [[code]]
    rec = Recorder()
    with pytest.raises(KubeError) as err:
        async with asyncio.timeout(10):
            await kw.watch(api, PATH, rec.on_event, what="configmaps", forbidden_grace_s=0)
    assert err.value.status == code
    assert len(server.list_queries) == 1


async def test_a_passing_403_is_retried(fake: tuple[FakeApi, Any]) -> None:
    """A kube-apiserver that just started answers 403 until its RBAC caches have synced."""
    server, api = fake
    server.objects = {"a": cm("a", "90")}
    server.list_statuses = [403, 403]
    rec = Recorder()
    async with watching(api, rec, max_backoff=0.05):
        await until(lambda: any(t == "SYNC" and o["metadata"]["name"] == "a" for t, o in rec.events))
    assert len(server.list_queries) == 3


async def test_callback_errors_propagate_unretried(fake: tuple[FakeApi, Any]) -> None:
    server, api = fake
    server.objects = {"a": cm("a", "90")}

    def on_event(t: str, obj: dict[str, Any]) -> None:
        raise KubeError("the callback's own failure", status=500)

    with pytest.raises(KubeError, match="callback's own"):
        async with asyncio.timeout(10):
            await kw.watch(api, PATH, on_event, what="configmaps")
    assert len(server.list_queries) == 1


async def test_cancellation_propagates_promptly(fake: tuple[FakeApi, Any]) -> None:
    server, api = fake
    server.objects = {"a": cm("a", "90")}
    rec = Recorder()
    task = asyncio.create_task(kw.watch(api, PATH, rec.on_event, what="configmaps", on_synced=rec.on_synced))
    await rec.wait_for(2)
    await until(lambda: len(server.watch_queries) == 1)  # blocked reading the open stream
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        async with asyncio.timeout(5):
            await task
    assert task.cancelled()


async def test_rest_get_and_list_items(fake: tuple[FakeApi, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    server, api = fake
    monkeypatch.setattr(rest, "PAGE_SIZE", 2)
    server.objects = {n: cm(n, "90") for n in ("a", "b", "c", "d", "e")}
    got = await rest.request(api, "GET", PATH + "/c")
    assert got["metadata"]["name"] == "c"
    assert got["kind"] == "ConfigMap"
    with pytest.raises(KubeError) as err:
        await rest.request(api, "GET", PATH + "/zzz")
    assert err.value.status == 404
    assert err.value.not_found
    items = await rest.list_items(api, PATH, params={"labelSelector": "x=y"})
    assert await rest.get(api, PATH + "/zzz") is None
    assert [i["metadata"]["name"] for i in items] == ["a", "b", "c", "d", "e"]
    assert all(i["kind"] == "ConfigMap" for i in items)
    assert len(server.list_queries) == 3
    assert all(q["labelSelector"] == "x=y" for q in server.list_queries)


async def test_list_items_restarts_when_the_continue_token_expires(
    fake: tuple[FakeApi, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    server, api = fake
    monkeypatch.setattr(rest, "PAGE_SIZE", 2)
    server.objects = {n: cm(n, "90") for n in ("a", "b", "c")}
    server.continue_statuses = [410]
    items = await rest.list_items(api, PATH)
    assert [i["metadata"]["name"] for i in items] == ["a", "b", "c"]
    assert [q.get("continue") for q in server.list_queries] == [None, "2", None, "2"]


async def test_unreachable_server_is_kube_error_with_status_zero() -> None:
    dead = client.ApiClient(client.Configuration(host=f"http://127.0.0.1:{closed_port()}"))
    try:
        with pytest.raises(KubeError) as err:
            await rest.request(dead, "GET", PATH + "/a")
    finally:
        await dead.close()
    assert err.value.status == 0
