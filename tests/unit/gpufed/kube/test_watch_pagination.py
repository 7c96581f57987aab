"""`watch`'s (re)list is paginated (`limit`/`continue`, `rest.PAGE_SIZE` items a page, 500 unless
set): a collection of several pages is delivered whole, each object once, before `on_synced`, and
the watch starts from the list's resourceVersion; a continue token that expires (410) restarts the
list from its first page, and nothing of the abandoned pages is delivered."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import pytest
from aiohttp import web
from kubernetes_asyncio import client

from gpufed.kube import rest
from tests.unit.gpufed.kube.test_watch import HANG, PATH, FakeApi, Recorder, cm, ev, until, watching


@dataclass
class ExpiringApi(FakeApi):
    """FakeApi whose continue tokens expire as `continue_statuses` says; `on_expire` changes the
    collection when one does (the list restarted from scratch sees the collection as it is then)."""

    on_expire: Callable[[FakeApi], None] | None = None

    async def collection(self, request: web.Request) -> web.StreamResponse:
        if request.query.get("continue") and self.continue_statuses and self.on_expire is not None:
            self.on_expire(self)
        return await super().collection(request)


@pytest.fixture
async def paged() -> AsyncIterator[tuple[ExpiringApi, Any]]:
    state = ExpiringApi()
    app = web.Application()
    app.router.add_get(PATH, state.collection)
    runner = web.AppRunner(app, shutdown_timeout=0.1)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    api = client.ApiClient(client.Configuration(host=f"http://127.0.0.1:{runner.addresses[0][1]}"))
    try:
        yield state, api
    finally:
        state.stop.set()
        await api.close()
        await runner.cleanup()


def names(n: int) -> list[str]:
    return [f"cm-{i:05d}" for i in range(n)]


async def test_a_collection_of_several_default_pages_is_listed_whole_then_watched(
    paged: tuple[ExpiringApi, Any],
) -> None:
    server, api = paged
    assert rest.PAGE_SIZE == 500
    server.objects = {n: cm(n, "90") for n in names(1203)}
    server.rv = "4242"
    server.watches = [[ev("ADDED", cm("new", "4243")), HANG]]
    rec = Recorder()
    async with watching(api, rec):
        await rec.wait_for(1203 + 2)
    assert rec.names() == [("SYNC", n) for n in names(1203)] + [("SYNCED", ""), ("ADDED", "new")]
    assert [(q["limit"], q.get("continue")) for q in server.list_queries] == [
        ("500", None),
        ("500", "500"),
        ("500", "1000"),
    ]
    (wq,) = server.watch_queries
    assert wq["resourceVersion"] == "4242"  # the list's (every page of one list has the same)


def _grow(server: FakeApi) -> None:
    server.objects["b2"] = cm("b2", "150")
    server.objects["a"] = cm("a", "151", "changed")
    server.rv = "200"


async def test_an_expired_continue_token_restarts_the_list_from_scratch(
    paged: tuple[ExpiringApi, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    server, api = paged
    monkeypatch.setattr(rest, "PAGE_SIZE", 2)
    server.objects = {n: cm(n, "90") for n in ("a", "b", "c", "d", "e")}
    server.continue_statuses = [410]  # the token of the first page expires...
    server.on_expire = _grow  # ...while the collection changes
    rec = Recorder()
    async with watching(api, rec):
        await rec.wait_for(7)
        await until(lambda: len(server.watch_queries) == 1)
    # each object of the new list once (none of the abandoned first page twice), then on_synced once
    assert rec.names() == [("SYNC", n) for n in ("a", "b", "b2", "c", "d", "e")] + [("SYNCED", "")]
    assert rec.events[0][1]["data"] == {"v": "changed"}
    assert [q.get("continue") for q in server.list_queries] == [None, "2", None, "2", "4"]
    assert server.watch_queries[0]["resourceVersion"] == "200"  # the restarted list's, not the first one's


async def test_a_token_that_keeps_expiring_relists_until_a_list_completes(
    paged: tuple[ExpiringApi, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    server, api = paged
    monkeypatch.setattr(rest, "PAGE_SIZE", 2)
    server.objects = {n: cm(n, "90") for n in ("a", "b", "c")}
    server.continue_statuses = [410, 410, 410, 410]
    rec = Recorder()
    async with watching(api, rec, max_backoff=0.05):
        await rec.wait_for(4)
        await until(lambda: len(server.watch_queries) == 1)
    assert rec.names() == [("SYNC", "a"), ("SYNC", "b"), ("SYNC", "c"), ("SYNCED", "")]
    assert [q.get("continue") for q in server.list_queries] == [None, "2"] * 5
    assert server.watch_queries[0]["resourceVersion"] == "100"
