"""`gpufed.kube.reloadable`: a swap sends new requests to the new client at once, keeps the old one
until its connections are released (or its deadline passes), closes it exactly once, and keeps the
attributes set on the stand-in (the request budget)."""

from __future__ import annotations

import asyncio
import time
from types import SimpleNamespace
from typing import Any

from gpufed.kube import rest
from gpufed.kube.budget import budget_of, set_budget
from gpufed.kube.reloadable import ReloadableClient, connections_in_use
from tests.unit.fakes import FakeApiServer, serve, until


class Inner:
    """An ApiClient's shape as far as the stand-in looks: a pool with checked-out connections."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.closed = 0
        #: The connections checked out of its pool (what aiohttp's connector keeps in `_acquired`).
        self.acquired: set[Any] = set()
        self.rest_client = SimpleNamespace(
            pool_manager=SimpleNamespace(connector=SimpleNamespace(_acquired=self.acquired))
        )

    async def close(self) -> None:
        self.closed += 1


async def test_new_requests_use_the_new_client_and_the_old_closes_when_its_streams_end() -> None:
    old, new = Inner("old"), Inner("new")
    old.acquired.add("a watch in flight")
    client = ReloadableClient(old, retire_poll_s=0.01)
    assert client.name == "old"
    client.swap(new, retire_by=time.time() + 60)
    assert client.name == "new" and client.current is new and client.generation == 1
    await asyncio.sleep(0.05)
    assert old.closed == 0 and client.retiring == 1, "closed under a stream still in flight"
    assert connections_in_use(old) == 1
    old.acquired.clear()
    await until(lambda: old.closed == 1, what="the old client to close")
    await until(lambda: client.retiring == 0, what="the retirement to finish")
    await client.close()
    assert new.closed == 1 and old.closed == 1


async def test_the_old_client_is_closed_at_its_deadline_even_with_a_stream_open() -> None:
    old, new = Inner("old"), Inner("new")
    old.acquired.add("a log stream that never ends")
    client = ReloadableClient(old, retire_poll_s=0.01)
    client.swap(new, retire_by=time.time() + 0.05)
    await until(lambda: old.closed == 1, timeout=2, what="the deadline to close the old client")
    await client.close()
    assert old.closed == 1, "closed twice"


async def test_close_closes_the_current_and_every_retiring_client_once() -> None:
    a, b, c = Inner("a"), Inner("b"), Inner("c")
    a.acquired.add("x")
    b.acquired.add("y")
    client = ReloadableClient(a, retire_poll_s=0.01)
    client.swap(b)
    client.swap(c)
    await asyncio.sleep(0.03)
    assert (a.closed, b.closed) == (0, 0)
    await client.close()
    assert (a.closed, b.closed, c.closed) == (1, 1, 1)


async def test_a_swap_moves_real_requests_to_the_new_server_and_keeps_the_budget() -> None:
    first, second = FakeApiServer(), FakeApiServer()
    for server, value in ((first, "first"), (second, "second")):
        server.create("configmaps", {"metadata": {"name": "which", "namespace": "default"}, "data": {"v": value}})
    async with serve(first) as (_, api1), serve(second) as (_, api2):
        client = ReloadableClient(api1, retire_poll_s=0.01)
        set_budget(client, 100, 10)
        path = rest.path("v1", "configmaps", "which", namespace="default")
        got = await rest.get(client, path)
        assert got is not None and got["data"]["v"] == "first"
        client.swap(api2)
        got = await rest.get(client, path)
        assert got is not None and got["data"]["v"] == "second"
        assert budget_of(client) is not None, "the budget stayed with the stand-in"
        calls = len(first.requests)
        await rest.get(client, path)
        assert len(first.requests) == calls, "the old client served a request after the swap"
        await until(lambda: client.retiring == 0, what="the idle old client to close")
