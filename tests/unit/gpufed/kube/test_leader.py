"""Leader election (gpufed.kube.leader) against the in-memory API server: one leader among racing
candidates, takeover only after expiry on the candidate's own clock, release hands over at once, a
leader that cannot renew steps down; and serving-certificate issuance shared by racing replicas."""

from __future__ import annotations

import asyncio

import pytest
from aiohttp import web

from gpufed.kube import servingtls
from gpufed.kube.leader import LeaderElector, LeaderSettings, LostLeadershipError
from tests.unit.fakes import FakeApiServer, serve

LEASE = "/apis/coordination.k8s.io/v1/namespaces/gpufed/leases/gpufed-controller"


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def settings(identity: str, **kw: float) -> LeaderSettings:
    return LeaderSettings(
        namespace="gpufed", name="gpufed-controller", identity=identity, **{"retry_period_s": 0.01, **kw}
    )


async def test_of_racing_candidates_exactly_one_leads() -> None:
    async with serve() as (server, api):
        clock = Clock()
        electors = [LeaderElector(api, settings(f"pod-{i}"), clock=clock) for i in range(4)]
        results = await asyncio.gather(*(e.try_acquire_or_renew() for e in electors))
        assert sum(results) == 1, results
        leader = electors[results.index(True)]
        lease = server.get("leases", "gpufed", "gpufed-controller")
        assert lease is not None
        assert lease["spec"]["holderIdentity"] == leader.settings.identity
        assert lease["spec"]["leaseDurationSeconds"] == 15
        # The others keep failing while the leader renews, whatever their clocks say short of expiry.
        clock.now += 14
        assert await leader.try_acquire_or_renew()
        clock.now += 14
        assert not any([await e.try_acquire_or_renew() for e in electors if e is not leader])


async def test_an_expired_lease_is_taken_over_and_counted() -> None:
    async with serve() as (server, api):
        clock = Clock()
        old, new = LeaderElector(api, settings("old"), clock=clock), LeaderElector(api, settings("new"), clock=clock)
        assert await old.try_acquire_or_renew()
        assert not await new.try_acquire_or_renew(), "held and fresh"
        clock.now += 14.9
        assert not await new.try_acquire_or_renew(), "not yet expired on the candidate's clock"
        clock.now += 0.2
        assert await new.try_acquire_or_renew()
        lease = server.get("leases", "gpufed", "gpufed-controller")
        assert lease is not None
        assert lease["spec"]["holderIdentity"] == "new"
        assert lease["spec"]["leaseTransitions"] == 1
        assert not await old.try_acquire_or_renew(), "the old leader sees another holder"
        assert not old.is_leader


async def test_release_hands_over_without_waiting_for_expiry() -> None:
    async with serve() as (_server, api):
        clock = Clock()
        a, b = LeaderElector(api, settings("a"), clock=clock), LeaderElector(api, settings("b"), clock=clock)
        await a.acquire()
        await a.release()
        assert not a.is_leader
        clock.now += 0.1
        assert await b.try_acquire_or_renew(), "an empty holder is free"


async def test_a_leader_that_cannot_renew_steps_down() -> None:
    server = FakeApiServer()
    async with serve(server) as (_server, api):
        clock = Clock()
        leader = LeaderElector(api, settings("a", renew_deadline_s=1.0, lease_duration_s=2.0), clock=clock)
        await leader.acquire()
        holding = asyncio.create_task(leader.hold())
        await asyncio.sleep(0.05)
        assert not holding.done(), "renewing"
        # Another candidate took it (e.g. after a long pause of this process): step down at once.
        server.update("leases", "gpufed", "gpufed-controller", lambda o: o["spec"].update(holderIdentity="b"))
        with pytest.raises(LostLeadershipError, match="held by b"):
            await asyncio.wait_for(holding, 2)
        assert not leader.is_leader


class Sniped(FakeApiServer):
    """Lets another candidate ("b") take the lease between a renewal's read and its write, once."""

    armed = False

    async def handle(self, request: web.Request) -> web.StreamResponse:
        if self.armed and request.method == "PUT":
            self.armed = False
            self.update("leases", "gpufed", "gpufed-controller", lambda o: o["spec"].update(holderIdentity="b"))
        return await super().handle(request)


async def test_a_renewal_that_conflicts_reads_again_and_names_the_new_holder() -> None:
    server = Sniped()
    async with serve(server) as (_server, api):
        leader = LeaderElector(api, settings("a"), clock=Clock())
        await leader.acquire()
        server.armed = True
        with pytest.raises(LostLeadershipError, match="held by b"):
            await asyncio.wait_for(leader.hold(), 2)
        assert not server.armed, "the write raced"
        lease = server.get("leases", "gpufed", "gpufed-controller")
        assert lease is not None and lease["spec"]["holderIdentity"] == "b", "b's write was not overwritten"
        assert not leader.is_leader


class Flaky(FakeApiServer):
    """Answers 503 to everything while `broken`."""

    broken = False

    async def handle(self, request: web.Request) -> web.StreamResponse:
        if self.broken:
            return web.Response(status=503, text="unavailable")
        return await super().handle(request)


async def test_renewal_failures_past_the_deadline_end_leadership() -> None:
    server = Flaky()
    async with serve(server) as (_server, api):
        clock = Clock()
        leader = LeaderElector(api, settings("a", renew_deadline_s=1.0, lease_duration_s=2.0), clock=clock)
        await leader.acquire()
        server.broken = True
        holding = asyncio.create_task(leader.hold())
        await asyncio.sleep(0.05)
        assert not holding.done(), "failures within the deadline are retried"
        clock.now += 1.5
        with pytest.raises(LostLeadershipError, match="not renewed"):
            await asyncio.wait_for(holding, 2)


def test_settings_are_checked() -> None:
    with pytest.raises(ValueError, match="identity"):
        LeaderSettings(namespace="gpufed", name="l", identity="")
    with pytest.raises(ValueError, match="retry period < renew deadline < lease duration"):
        LeaderSettings(namespace="gpufed", name="l", identity="a", renew_deadline_s=20)


async def test_racing_replicas_end_up_with_one_serving_certificate() -> None:
    async with serve() as (server, api):
        got = await asyncio.gather(
            *(servingtls.ensure(api, "gpufed", "gpufed-webhook-tls", "gpufed-webhook.gpufed.svc") for _ in range(3))
        )
        stored = server.get("secrets", "gpufed", "gpufed-webhook-tls")
        assert stored is not None
        materials = {m for m, _new in got}
        # Whoever lost the race re-read the Secret: everyone serves what it holds.
        assert len(materials) == 1, "replicas serve different certificates"
        assert sum(new for _m, new in got) == 1
        again, new = await servingtls.ensure(api, "gpufed", "gpufed-webhook-tls", "gpufed-webhook.gpufed.svc")
        assert (again, new) == (next(iter(materials)), False)
