"""TokenSecretWatch against the fake API server: which namespaces it watches, what it selects, and
that a failed watch is started again."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

from gpufed.apis.wire import ORIGIN_CLUSTER_LABEL
from tests.unit.fakes import FakeApiServer, serve, until
from vkprovider.forge.tokens import TOKEN_FOR_POD_LABEL
from vkprovider.remote.token_watch import TokenSecretWatch

CONSUMER = "consumer-1"


def secret(namespace: str, name: str, *, consumer: str = CONSUMER, token: bool = True) -> dict[str, Any]:
    labels = {ORIGIN_CLUSTER_LABEL: consumer}
    if token:
        labels[TOKEN_FOR_POD_LABEL] = name
    return {
        "metadata": {"name": name, "namespace": namespace, "labels": labels},
        "type": "Opaque",
        "data": {"token-0": "c2VjcmV0"},
    }


@pytest.fixture
async def cluster() -> AsyncIterator[tuple[FakeApiServer, Any]]:
    async with serve() as (server, api):
        yield server, api


async def test_watches_the_followed_namespaces_token_secrets_of_this_consumer_only(
    cluster: tuple[FakeApiServer, Any],
) -> None:
    server, api = cluster
    seen: list[tuple[str, str, str]] = []
    with_data: list[str] = []

    def on_secret(kind: str, obj: dict[str, Any]) -> None:
        seen.append((kind, obj["metadata"]["namespace"], obj["metadata"]["name"]))
        if "data" in obj:
            with_data.append(obj["metadata"]["name"])

    watches = TokenSecretWatch(api, CONSUMER, on_secret)
    server.create("secrets", secret("twin-a", "listed"))
    try:
        watches.follow(["twin-a", "twin-b"])
        await until(lambda: ("SYNC", "twin-a", "listed") in seen, what="the listed Secret")
        server.create("secrets", secret("twin-b", "added"))
        server.create("secrets", secret("twin-b", "other-consumers", consumer="consumer-2"))
        server.create("secrets", secret("twin-b", "not-a-token", token=False))
        server.create("secrets", secret("twin-c", "not-followed"))
        server.create("secrets", secret("twin-b", "last"))
        await until(lambda: ("ADDED", "twin-b", "last") in seen, what="the last Secret")
        assert {name for _, _, name in seen} == {"listed", "added", "last"}
        assert with_data == [], "the tokens were handed on (and so held in the watch's cache)"
        watches.follow(["twin-a"])
        assert watches.namespaces == {"twin-a"}
        server.create("secrets", secret("twin-b", "after"))
        server.create("secrets", secret("twin-a", "still"))
        await until(lambda: ("ADDED", "twin-a", "still") in seen, what="twin-a still watched")
        assert ("ADDED", "twin-b", "after") not in seen, "twin-b is no longer watched"
    finally:
        await watches.close()
    assert watches.namespaces == frozenset()


async def test_a_failed_watch_is_started_again(cluster: tuple[FakeApiServer, Any]) -> None:
    server, api = cluster
    seen: list[str] = []
    failures = [RuntimeError("a handler's bug")]

    def on_secret(kind: str, obj: dict[str, Any]) -> None:
        if failures:
            raise failures.pop()
        seen.append(obj["metadata"]["name"])

    watches = TokenSecretWatch(api, CONSUMER, on_secret, retry_s=0.01)
    server.create("secrets", secret("twin-a", "first"))
    try:
        watches.follow(["twin-a"])
        await until(lambda: "first" in seen, what="the Secret, listed again after the failure")
        server.create("secrets", secret("twin-a", "second"))
        await until(lambda: "second" in seen, what="events after the restart")
    finally:
        await watches.close()
