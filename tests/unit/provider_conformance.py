"""The written contract of `vkprovider.node.provider.PodProvider`, as checks any implementation must pass.

Each check is a plain async function taking a `ConformanceHarness`: the provider under test (not yet
running: the check subscribes to it, runs it and cancels it), how to make a local pod, and how to drive the backend
behind the provider. Nothing here knows any implementation: the unit tests run the checks against
`fakes.FakeProvider`, the e2e suite against `RemoteProvider` on real clusters. Each check uses fresh
pod names (so a shared backend is fine) and deletes the twins it created, with grace 0, on the way out.

Checked: ready after run; a created twin is seen with the local UID; create is idempotent; deleting
a missing twin succeeds; delete removes; a twin of another UID keeps being reported with that UID
(and is neither replaced by a create nor deleted by a delete of the other UID); every subscriber is
notified with the LOCAL key on create, change and removal; pod_status is a `{"status": {...}}` patch
with the twin's phase; Succeeded/Failed twins are terminal.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from vkprovider.node.provider import PodProvider, ProviderError, Twin


@dataclass
class ConformanceHarness:
    #: The provider under test, not running yet (a fresh one per check).
    provider: PodProvider
    #: Local namespace the checks' pods live in (for a real provider: an offloaded one).
    namespace: str
    #: A local pod dict (as the consumer's API server returns it) for (namespace, name, uid).
    make_pod: Callable[[str, str, str], dict[str, Any]]
    #: Moves the twin of the LOCAL pod (namespace, name) to a phase (Running, Succeeded, Failed).
    set_phase: Callable[[str, str, str], Awaitable[None]]
    #: Makes the twin of the LOCAL pod (namespace, name) disappear at the backend, behind the provider's back.
    vanish: Callable[[str, str], Awaitable[None]]
    #: Waits until the predicate holds; fails (raises) after the harness's own deadline.
    wait_for: Callable[[Callable[[], bool]], Awaitable[None]]


@dataclass
class _Run:
    h: ConformanceHarness
    #: LOCAL keys passed to notify, in order.
    notified: list[tuple[str, str]] = field(default_factory=list)
    #: LOCAL keys passed to a second subscriber, in order.
    also_notified: list[tuple[str, str]] = field(default_factory=list)
    created: list[tuple[str, str, str]] = field(default_factory=list)

    def notify(self, namespace: str, name: str) -> None:
        self.notified.append((namespace, name))

    def also_notify(self, namespace: str, name: str) -> None:
        self.also_notified.append((namespace, name))

    def name(self, what: str) -> str:
        return f"conf-{what}-{uuid.uuid4().hex[:6]}"

    async def create(self, name: str, uid: str | None = None) -> tuple[dict[str, Any], str]:
        uid = uid or str(uuid.uuid4())
        pod = self.h.make_pod(self.h.namespace, name, uid)
        self.created.append((self.h.namespace, name, uid))
        await self.h.provider.create_pod(pod)
        return pod, uid

    def twin(self, name: str) -> Twin | None:
        return self.h.provider.twin(self.h.namespace, name)

    def phase(self, pod: dict[str, Any], name: str) -> str | None:
        twin = self.twin(name)
        if twin is None:
            return None
        status = self.h.provider.pod_status(pod, twin).get("status") or {}
        phase = status.get("phase")
        return str(phase) if phase is not None else None


@contextlib.asynccontextmanager
async def _running(h: ConformanceHarness) -> AsyncIterator[_Run]:
    run = _Run(h)
    h.provider.subscribe(run.notify)
    h.provider.subscribe(run.also_notify)
    task = asyncio.create_task(h.provider.run())
    try:
        await h.wait_for(lambda: h.provider.ready.is_set() or task.done())
        if task.done():
            task.result()  # run() must not return: raise what it raised
            raise AssertionError("run() returned")
        yield run
    finally:
        for namespace, name, uid in run.created:
            with contextlib.suppress(ProviderError):
                await h.provider.delete_pod(namespace, name, uid, 0)
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


# ---------------------------------------------------------------------------------------- checks


async def check_ready_after_run(h: ConformanceHarness) -> None:
    assert not h.provider.ready.is_set()
    async with _running(h):
        assert h.provider.ready.is_set()


async def check_create_shows_twin_with_local_uid(h: ConformanceHarness) -> None:
    async with _running(h) as r:
        name = r.name("create")
        assert r.twin(name) is None
        _pod, uid = await r.create(name)
        await h.wait_for(lambda: r.twin(name) is not None)
        twin = r.twin(name)
        assert twin is not None
        assert (twin.namespace, twin.name, twin.origin_uid) == (h.namespace, name, uid)
        assert not twin.terminal
        assert not twin.deleting
        assert [(t.namespace, t.origin_uid) for t in h.provider.twins() if t.name == name] == [(h.namespace, uid)]


async def check_create_is_idempotent(h: ConformanceHarness) -> None:
    async with _running(h) as r:
        name = r.name("idem")
        pod, uid = await r.create(name)
        await h.wait_for(lambda: r.twin(name) is not None)
        await h.set_phase(h.namespace, name, "Running")
        await h.wait_for(lambda: r.phase(pod, name) == "Running")
        await h.provider.create_pod(pod)  # the same UID again: success, and the running twin stays
        assert r.phase(pod, name) == "Running"
        twin = r.twin(name)
        assert twin is not None and twin.origin_uid == uid
        assert len([t for t in h.provider.twins() if (t.namespace, t.name) == (h.namespace, name)]) == 1


async def check_delete_of_missing_twin_succeeds(h: ConformanceHarness) -> None:
    async with _running(h) as r:
        name = r.name("missing")
        await h.provider.delete_pod(h.namespace, name, str(uuid.uuid4()), 0)
        await h.provider.delete_pod(h.namespace, name, str(uuid.uuid4()), 30)
        assert r.twin(name) is None


async def check_delete_removes(h: ConformanceHarness) -> None:
    async with _running(h) as r:
        name = r.name("delete")
        _pod, uid = await r.create(name)
        await h.wait_for(lambda: r.twin(name) is not None)
        await h.provider.delete_pod(h.namespace, name, uid, 0)
        await h.wait_for(lambda: r.twin(name) is None)
        assert all(t.name != name for t in h.provider.twins())


async def check_graceful_delete_stops(h: ConformanceHarness) -> None:
    async with _running(h) as r:
        name = r.name("graceful")
        pod, uid = await r.create(name)
        await h.set_phase(h.namespace, name, "Running")
        await h.wait_for(lambda: r.phase(pod, name) == "Running")
        await h.provider.delete_pod(h.namespace, name, uid, 30)

        def stopping() -> bool:
            twin = r.twin(name)
            return twin is None or twin.deleting or twin.terminal

        await h.wait_for(stopping)


async def check_twin_of_another_uid_keeps_its_uid(h: ConformanceHarness) -> None:
    async with _running(h) as r:
        name = r.name("stale")
        _old, old_uid = await r.create(name)
        await h.wait_for(lambda: r.twin(name) is not None)
        new_uid = str(uuid.uuid4())
        new = h.make_pod(h.namespace, name, new_uid)
        # A new local pod with the same name: its create must not adopt or replace the old twin.
        with contextlib.suppress(ProviderError):
            await h.provider.create_pod(new)
        twin = r.twin(name)
        assert twin is not None and twin.origin_uid == old_uid
        # A delete names the UID it means: the old twin is not the new pod's.
        await h.provider.delete_pod(h.namespace, name, new_uid, 0)
        twin = r.twin(name)
        assert twin is not None and twin.origin_uid == old_uid
        await h.provider.delete_pod(h.namespace, name, old_uid, 0)
        await h.wait_for(lambda: r.twin(name) is None)


async def check_notify_uses_the_local_key(h: ConformanceHarness) -> None:
    async with _running(h) as r:
        name = r.name("notify")
        key = (h.namespace, name)
        pod, _uid = await r.create(name)
        await h.wait_for(lambda: key in r.notified)
        await h.set_phase(h.namespace, name, "Running")
        # Appearing and then changing are two notifications at least. (Not "one after set_phase":
        # a real backend may have moved the twin to Running before set_phase was even called.)
        await h.wait_for(lambda: r.notified.count(key) >= 2 and r.phase(pod, name) == "Running")
        seen = len(r.notified)
        await h.vanish(h.namespace, name)
        await h.wait_for(lambda: key in r.notified[seen:] and r.twin(name) is None)
        ours = [k for k in r.notified if k[1] == name]
        assert ours and all(k == key for k in ours)


async def check_every_subscriber_is_notified(h: ConformanceHarness) -> None:
    async with _running(h) as r:
        name = r.name("subscribers")
        key = (h.namespace, name)
        _pod, uid = await r.create(name)
        await h.wait_for(lambda: key in r.notified and key in r.also_notified)
        seen, also_seen = len(r.notified), len(r.also_notified)
        await h.provider.delete_pod(h.namespace, name, uid, 0)
        # The removal reaches both subscribers.
        await h.wait_for(
            lambda: r.twin(name) is None and key in r.notified[seen:] and key in r.also_notified[also_seen:]
        )


async def check_pod_status_is_a_status_patch_with_the_phase(h: ConformanceHarness) -> None:
    async with _running(h) as r:
        name = r.name("status")
        pod, _uid = await r.create(name)
        await h.set_phase(h.namespace, name, "Running")
        await h.wait_for(lambda: r.phase(pod, name) == "Running")
        twin = r.twin(name)
        assert twin is not None
        patch = h.provider.pod_status(pod, twin)
        assert list(patch) == ["status"]
        assert patch["status"]["phase"] == "Running"
        assert "qosClass" not in patch["status"]
        assert not twin.terminal


async def check_terminal_twins(h: ConformanceHarness) -> None:
    async with _running(h) as r:
        for phase in ("Succeeded", "Failed"):
            name = r.name(phase.lower())
            pod, _uid = await r.create(name)
            await h.set_phase(h.namespace, name, phase)

            def terminal(name: str = name) -> bool:
                twin = r.twin(name)
                return twin is not None and twin.terminal

            await h.wait_for(terminal)
            twin = r.twin(name)
            assert twin is not None
            assert h.provider.pod_status(pod, twin)["status"]["phase"] == phase


Check = Callable[[ConformanceHarness], Awaitable[None]]

CHECKS: tuple[Check, ...] = (
    check_ready_after_run,
    check_create_shows_twin_with_local_uid,
    check_create_is_idempotent,
    check_delete_of_missing_twin_succeeds,
    check_delete_removes,
    check_graceful_delete_stops,
    check_twin_of_another_uid_keeps_its_uid,
    check_notify_uses_the_local_key,
    check_every_subscriber_is_notified,
    check_pod_status_is_a_status_patch_with_the_phase,
    check_terminal_twins,
)

__all__ = ["CHECKS", "Check", "ConformanceHarness"]
