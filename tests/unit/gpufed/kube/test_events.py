"""`events.emit` against the in-memory API server: repeats of one Event are counted on one object,
and writers racing for the same Event (409 AlreadyExists on create, 409 Conflict on the count's
update) all land on it, counted, with nothing raised or lost; a conflict that never ends is given
up after a bounded number of attempts, logged, not raised."""

from __future__ import annotations

import asyncio
from typing import Any

from aiohttp import web
from structlog.testing import capture_logs

from gpufed.kube import events
from tests.unit.fakes import FakeApiServer, serve

POD: dict[str, Any] = {
    "apiVersion": "v1",
    "kind": "Pod",
    "metadata": {"namespace": "team", "name": "train", "uid": "u-train"},
}


def recorded(server: FakeApiServer) -> list[dict[str, Any]]:
    return server.items("events", "team")


async def emit(api: Any, message: str = "back-off") -> None:
    await events.emit(api, POD, type_="Warning", reason="BackOff", message=message)


async def test_repeats_are_counted_on_one_event() -> None:
    async with serve() as (server, api):
        for _ in range(3):
            await emit(api)
        await emit(api, "another message")
        by_message = {e["message"]: e for e in recorded(server)}
    assert set(by_message) == {"back-off", "another message"}
    assert by_message["back-off"]["count"] == 3
    assert by_message["another message"]["count"] == 1
    assert by_message["back-off"]["involvedObject"]["uid"] == "u-train"


async def test_concurrent_emits_of_one_event_land_as_one_event_with_every_occurrence_counted() -> None:
    async with serve() as (server, api):
        with capture_logs() as logs:
            await asyncio.gather(*(emit(api) for _ in range(8)))
        (event,) = recorded(server)
    assert event["count"] == 8
    assert [e for e in logs if e["event"] == "event not recorded"] == []


class CreateRaced(FakeApiServer):
    """Another writer creates the Event (`theirs`) just before this client's create reaches the server, once."""

    theirs: dict[str, Any] | None = None
    raced = False

    async def handle(self, request: web.Request) -> web.StreamResponse:
        if self.theirs is not None and request.method == "POST" and request.path.endswith("/events"):
            self.create("events", self.theirs)
            self.theirs, self.raced = None, True
        return await super().handle(request)


async def test_a_409_on_create_reads_again_and_counts_the_occurrence() -> None:
    server = CreateRaced()
    async with serve(server) as (_server, api):
        await emit(api)
        (first,) = recorded(server)
        server.remove("events", "team", first["metadata"]["name"])
        server.theirs = {k: v for k, v in first.items() if k != "metadata"} | {
            "metadata": {"name": first["metadata"]["name"], "namespace": "team"}
        }
        server.requests.clear()
        with capture_logs() as logs:
            await emit(api)
        (event,) = recorded(server)
        posts = [r for r in server.requests if r.method == "POST"]
        patches = [r for r in server.requests if r.method == "PATCH"]
    assert server.raced, "the create was not raced"
    assert event["count"] == 2  # the other writer's occurrence and this one
    assert len(posts) == 1
    (patch,) = patches
    assert patch.body["count"] == 2
    assert patch.body["metadata"]["resourceVersion"], "the count's update is conditional"
    assert [e for e in logs if e["event"] == "event not recorded"] == []


class UpdateRaced(FakeApiServer):
    """Another writer counts one occurrence between this client's read of the Event and its update, once."""

    armed = False

    async def handle(self, request: web.Request) -> web.StreamResponse:
        if self.armed and request.method == "PATCH" and "/events/" in request.path:
            self.armed = False
            (event,) = self.items("events", "team")
            self.update("events", "team", event["metadata"]["name"], lambda o: o.update(count=o["count"] + 1))
        return await super().handle(request)


async def test_a_conflicting_count_update_reads_again_and_loses_no_occurrence() -> None:
    server = UpdateRaced()
    async with serve(server) as (_server, api):
        await emit(api)
        server.armed = True
        await emit(api)
        (event,) = recorded(server)
        patches = [r for r in server.requests if r.method == "PATCH"]
    assert not server.armed, "the update was not raced"
    assert event["count"] == 3  # ours twice, the other writer's once: none overwritten
    assert len(patches) == 2  # the conflicting update, then the one from the fresh read


class AlwaysConflicting(FakeApiServer):
    """Every update of an Event conflicts (someone else always wrote it first)."""

    updates = 0

    async def handle(self, request: web.Request) -> web.StreamResponse:
        if request.method == "PATCH" and "/events/" in request.path:
            self.updates += 1
            return web.json_response(
                {"kind": "Status", "apiVersion": "v1", "code": 409, "reason": "Conflict", "message": "modified"},
                status=409,
            )
        return await super().handle(request)


async def test_a_conflict_that_never_ends_is_given_up_logged_not_raised() -> None:
    server = AlwaysConflicting()
    async with serve(server) as (_server, api):
        await emit(api)
        with capture_logs() as logs:
            await emit(api)  # does not raise
        (event,) = recorded(server)
    assert event["count"] == 1
    assert server.updates == events.MAX_ATTEMPTS
    (warning,) = [e for e in logs if e["event"] == "event not recorded"]
    assert warning["log_level"] == "warning"
    assert warning["reason"] == "BackOff"


async def test_other_failures_are_logged_not_raised() -> None:
    async with serve() as (server, api):
        with capture_logs() as logs:
            await events.emit(
                api,
                {"kind": "Pod", "metadata": {"namespace": "..", "name": "x", "uid": "u"}},
                type_="Normal",
                reason="R",
                message="m",
            )
        assert recorded(server) == []
    (warning,) = [e for e in logs if e["event"] == "event not recorded"]
    assert "invalid namespace" in warning["error"]
