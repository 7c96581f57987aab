"""What unknown bearer tokens may cost the consumer's API server (vkprovider.kubelet.auth): TokenReview
answers cached with a TTL in a bounded cache, reviews of unknown tokens limited per source and
overall, one review for concurrent requests with the same token, overlong tokens never reviewed."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from tests.unit.fakes import FakeApiServer, serve
from vkprovider.kubelet import auth
from vkprovider.kubelet.auth import Authenticator, ReviewLimitedError, ReviewLimiter, TokenBucket, TTLCache

REVIEWS = "/apis/authentication.k8s.io/v1/tokenreviews"


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _review(body: dict[str, Any]) -> dict[str, Any]:
    token = body["spec"]["token"]
    if token.startswith("good-"):
        return {**body, "status": {"authenticated": True, "user": {"username": token, "groups": ["g"]}}}
    return {**body, "status": {"authenticated": False}}


def _reviews(server: FakeApiServer) -> int:
    return len(server.calls("POST", REVIEWS))


def test_a_bucket_spends_its_burst_then_refills_at_its_rate() -> None:
    clock = Clock()
    bucket = TokenBucket(3, 2.0, clock)
    assert [bucket.take() for _ in range(4)] == [True, True, True, False]
    clock.now += 0.5  # one token back
    assert bucket.take() and not bucket.take()
    clock.now += 100  # never more than the burst
    assert sum(bucket.take() for _ in range(10)) == 3


def test_the_limiter_is_per_source_and_global_and_remembers_few_sources() -> None:
    clock = Clock()
    limiter = ReviewLimiter(burst=2, rate=1.0, global_burst=5, global_rate=1.0, sources=3, clock=clock)
    assert [limiter.allow("a") for _ in range(3)] == [True, True, False]
    assert limiter.allow("b") and limiter.allow("b") and not limiter.allow("b")
    assert limiter.allow("c")
    assert not limiter.allow("d"), "the global budget is spent whatever the source"
    clock.now += 1.0
    assert limiter.allow("a")
    assert len(limiter._per_source) == 3
    for s in ("e", "f", "g", "h"):
        limiter.allow(s)
    assert len(limiter._per_source) == 3, "the sources remembered are bounded"


def test_the_ttl_cache_expires_and_is_bounded() -> None:
    cache: TTLCache[str, int] = TTLCache(size=2)
    cache.put("a", 1, 60)
    cache.put("b", 2, 60)
    cache.put("c", 3, 60)
    assert cache.get("a") is None and cache.get("c") == 3
    cache.put("d", 4, -1)
    assert cache.get("d") is None


async def test_a_flood_of_unknown_tokens_from_one_source_makes_a_bounded_number_of_reviews() -> None:
    async with serve() as (server, api):
        server.reviewers["tokenreviews"] = _review
        authn = Authenticator(api, ReviewLimiter(burst=5, rate=0.0001, global_burst=8, global_rate=0.0001))
        limited = 0
        for i in range(200):
            try:
                assert await authn.from_token(f"bad-{i}", "10.0.0.9") is None
            except ReviewLimitedError:
                limited += 1
        assert _reviews(server) == 5 and limited == 195
        assert authn.reviews == 5 and authn.limited == 195
        # Another source has a budget of its own, within the global one.
        assert await authn.from_token("good-b", "10.0.0.10") is not None
        assert await authn.from_token("bad-b", "10.0.0.10") is None
        assert await authn.from_token("bad-c", "10.0.0.10") is None
        with pytest.raises(ReviewLimitedError):
            await authn.from_token("bad-d", "10.0.0.10")
        assert _reviews(server) == 8


async def test_cached_answers_cost_no_review_and_are_never_limited() -> None:
    async with serve() as (server, api):
        server.reviewers["tokenreviews"] = _review
        authn = Authenticator(api, ReviewLimiter(burst=2, rate=0.0001))
        user = await authn.from_token("good-1", "s")
        assert user is not None and user.name == "good-1"
        assert await authn.from_token("bad-1", "s") is None
        for _ in range(50):
            assert await authn.from_token("good-1", "s") == user
            assert await authn.from_token("bad-1", "s") is None  # the negative answer is cached too
        assert _reviews(server) == 2


async def test_concurrent_requests_with_one_token_share_one_review() -> None:
    async with serve() as (server, api):
        gate = asyncio.Event()
        server.reviewers["tokenreviews"] = _review
        authn = Authenticator(api)
        original = authn._review

        async def slow(token: str) -> Any:
            await gate.wait()
            return await original(token)

        authn._review = slow  # type: ignore[method-assign]
        tasks = [asyncio.create_task(authn.from_token("good-x", "s")) for _ in range(20)]
        await asyncio.sleep(0.05)
        gate.set()
        users = await asyncio.gather(*tasks)
        assert {u.name for u in users if u is not None} == {"good-x"} and len(users) == 20
        assert _reviews(server) == 1 and authn.reviews == 1


async def test_tokens_that_cannot_be_tokens_are_refused_without_a_review() -> None:
    async with serve() as (server, api):
        server.reviewers["tokenreviews"] = _review
        authn = Authenticator(api)
        assert await authn.from_token("good-" + "a" * auth.MAX_TOKEN_BYTES, "s") is None
        assert await authn.from_token("good-\u00e9", "s") is None
        assert await authn.from_token("good-\x00", "s") is None
        assert _reviews(server) == 0
