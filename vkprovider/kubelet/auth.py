"""Who may use a virtual node's kubelet API: authentication and authorization as a kubelet does it.

Owns (facts: Kubernetes docs "Kubelet authentication/authorization", KEP-2862):
- authentication: a client certificate the TLS layer verified against the consumer's client CA
  (user = CN, groups = O), else a bearer token checked with a TokenReview; neither -> anonymous,
  which the API answers with 401 (anonymous access is never allowed here);
- authorization: a SubjectAccessReview for `verb` on `nodes/<node>` with the subresource the path
  maps to (`/stats/*` -> stats, `/metrics/*` -> metrics, `/logs/*` -> log, `/pods` -> pods and
  `/healthz` -> healthz with the kubelet's fallback to proxy, everything else -> proxy). The verb
  follows the HTTP method, except that exec, attach and port-forward always need `create`: a
  GET-only `nodes/proxy` grant (what monitoring tools get) must not open a shell in a pod;
- caches: TokenReview answers 2 min (keyed by a hash, never the token), SAR allows 5 min and denies
  30 s — the kubelet's defaults — bounded in size;
- bounds on what unknown tokens cost the consumer's API server (`ReviewLimiter`): a token not in
  the cache is reviewed only while its source (the client's address) has budget left — a burst of
  `UNKNOWN_TOKEN_BURST`, then `UNKNOWN_TOKEN_RATE` per second — and while all sources together
  have (`GLOBAL_REVIEW_BURST`, `GLOBAL_REVIEW_RATE`); beyond that the request is answered 429
  without a TokenReview (`ReviewLimitedError`). Concurrent requests with the same token share one
  review, at most `MAX_REVIEWS_IN_FLIGHT` reviews run at once, tokens longer than
  `MAX_TOKEN_BYTES` are refused unreviewed, and the sources remembered are bounded (LRU). Cached
  tokens (known good or known bad) cost nothing and are never limited.

Does not: terminate TLS (the server does) or log tokens.
"""

from __future__ import annotations

import asyncio
import hashlib
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from gpufed.kube import rest
from gpufed.kube.client import KubeError

TOKEN_TTL_S = 120.0
ALLOW_TTL_S = 300.0
DENY_TTL_S = 30.0
CACHE_SIZE = 1024
#: TokenReviews of unknown tokens one source may cause: a burst, then this many per second.
UNKNOWN_TOKEN_BURST = 10
UNKNOWN_TOKEN_RATE = 1.0
#: The same for all sources together (many sources do not multiply the load on the API server).
GLOBAL_REVIEW_BURST = 50
GLOBAL_REVIEW_RATE = 10.0
#: Sources whose budgets are remembered (least recently seen forgotten first).
SOURCES_KEPT = 4096
#: TokenReviews running at once; more wait for a slot.
MAX_REVIEWS_IN_FLIGHT = 8
#: Longer bearer tokens are refused without a review (service-account JWTs are ~1 KiB).
MAX_TOKEN_BYTES = 16 * 1024

#: Paths whose stream handlers must be authorised for `create` whatever the method.
STREAMING_PREFIXES = ("/exec/", "/attach/", "/portForward/")

K = TypeVar("K")
V = TypeVar("V")


class TTLCache(Generic[K, V]):
    """A small LRU cache whose entries expire."""

    def __init__(self, size: int = CACHE_SIZE) -> None:
        self.size = size
        self._items: OrderedDict[K, tuple[float, V]] = OrderedDict()

    def get(self, key: K) -> V | None:
        hit = self._items.get(key)
        if hit is None:
            return None
        expires, value = hit
        if expires < time.monotonic():
            del self._items[key]
            return None
        self._items.move_to_end(key)
        return value

    def put(self, key: K, value: V, ttl_s: float) -> None:
        self._items[key] = (time.monotonic() + ttl_s, value)
        self._items.move_to_end(key)
        while len(self._items) > self.size:
            self._items.popitem(last=False)


class ReviewLimitedError(Exception):
    """A TokenReview was not made: the source (or every source together) used up its budget."""


class TokenBucket:
    """`burst` tokens, refilled at `rate` per second; `take` spends one if there is one."""

    def __init__(self, burst: float, rate: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.burst = burst
        self.rate = rate
        self._clock = clock
        self._tokens = burst
        self._at = clock()

    def take(self) -> bool:
        now = self._clock()
        self._tokens = min(self.burst, self._tokens + (now - self._at) * self.rate)
        self._at = now
        if self._tokens >= 1.0:
            self._tokens -= 1.0
            return True
        return False


class ReviewLimiter:
    """Per-source and global budgets for TokenReviews of unknown tokens."""

    def __init__(
        self,
        *,
        burst: float = UNKNOWN_TOKEN_BURST,
        rate: float = UNKNOWN_TOKEN_RATE,
        global_burst: float = GLOBAL_REVIEW_BURST,
        global_rate: float = GLOBAL_REVIEW_RATE,
        sources: int = SOURCES_KEPT,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.burst = burst
        self.rate = rate
        self.sources = sources
        self._clock = clock
        self._global = TokenBucket(global_burst, global_rate, clock)
        self._per_source: OrderedDict[str, TokenBucket] = OrderedDict()

    def allow(self, source: str) -> bool:
        bucket = self._per_source.get(source)
        if bucket is None:
            bucket = self._per_source[source] = TokenBucket(self.burst, self.rate, self._clock)
            while len(self._per_source) > self.sources:
                self._per_source.popitem(last=False)
        self._per_source.move_to_end(source)
        # The source's budget first: one source out of budget does not spend the global one.
        return bucket.take() and self._global.take()


@dataclass(frozen=True)
class User:
    name: str
    groups: tuple[str, ...] = ()
    uid: str = ""
    extra: tuple[tuple[str, tuple[str, ...]], ...] = field(default=())

    def spec(self) -> dict[str, Any]:
        out: dict[str, Any] = {"user": self.name, "groups": list(self.groups)}
        if self.uid:
            out["uid"] = self.uid
        if self.extra:
            out["extra"] = {k: list(v) for k, v in self.extra}
        return out


def user_from_peercert(cert: dict[str, Any] | None) -> User | None:
    """The user a verified client certificate names (as `ssl.SSLSocket.getpeercert()` returns it)."""
    if not cert:
        return None
    cn = ""
    groups: list[str] = []
    for rdn in cert.get("subject") or ():
        for key, value in rdn:
            if key == "commonName":
                cn = str(value)
            elif key == "organizationName":
                groups.append(str(value))
    return User(cn, (*groups, "system:authenticated")) if cn else None


def attributes(method: str, path: str) -> tuple[str, list[str]]:
    """(verb, subresources to try in order) for a request to the kubelet API."""
    verb = {"GET": "get", "HEAD": "get", "POST": "create", "PUT": "update", "PATCH": "patch", "DELETE": "delete"}.get(
        method.upper(), method.lower()
    )
    if path.startswith(STREAMING_PREFIXES):
        return "create", ["proxy"]
    if path.startswith("/stats/") or path == "/stats":
        return verb, ["stats"]
    if path.startswith("/metrics/") or path == "/metrics":
        return verb, ["metrics"]
    if path.startswith("/logs/") or path == "/logs":
        return verb, ["log"]
    if path in ("/pods", "/pods/", "/runningpods", "/runningpods/"):
        return verb, ["pods", "proxy"]
    if path.startswith("/healthz"):
        return verb, ["healthz", "proxy"]
    return verb, ["proxy"]


class Authenticator:
    """Bearer tokens -> users through the consumer's TokenReview API, within `limiter`'s budgets."""

    def __init__(self, api: Any, limiter: ReviewLimiter | None = None) -> None:
        self.api = api
        self.limiter = limiter if limiter is not None else ReviewLimiter()
        #: A 1-tuple so that "not authenticated" (None) can be cached too.
        self._cache: TTLCache[str, tuple[User | None]] = TTLCache()
        self._inflight: dict[str, asyncio.Future[User | None]] = {}
        self._slots = asyncio.Semaphore(MAX_REVIEWS_IN_FLIGHT)
        #: TokenReviews made, and requests refused for want of budget (for tests and logs).
        self.reviews = 0
        self.limited = 0

    async def from_token(self, token: str, source: str = "") -> User | None:
        """The user `token` authenticates, or None. A token that is not printable ASCII (bearer tokens
        are base64url JWTs or `id.secret`) is refused here: the header's bytes may not even encode.
        ReviewLimitedError when the token is unknown and `source` has no budget left."""
        if not token.isascii() or not token.isprintable() or len(token) > MAX_TOKEN_BYTES:
            return None
        key = hashlib.sha256(token.encode()).hexdigest()
        hit = self._cache.get(key)
        if hit is not None:
            return hit[0]
        shared = self._inflight.get(key)
        if shared is not None:
            return await asyncio.shield(shared)
        if not self.limiter.allow(source):
            self.limited += 1
            raise ReviewLimitedError(f"too many unknown tokens from {source or 'this source'}")
        future: asyncio.Future[User | None] = asyncio.get_running_loop().create_future()
        self._inflight[key] = future
        try:
            user = await self._review(token)
        except asyncio.CancelledError:
            # This caller went away; those sharing its review retry with their own.
            future.set_exception(KubeError("TokenReview: interrupted"))
            future.exception()  # retrieved: only the callers sharing it re-raise it
            raise
        except Exception as e:
            future.set_exception(e)
            future.exception()
            raise
        else:
            future.set_result(user)
            self._cache.put(key, (user,), TOKEN_TTL_S)
            return user
        finally:
            del self._inflight[key]

    async def _review(self, token: str) -> User | None:
        async with self._slots:
            self.reviews += 1
            review = await rest.request(
                self.api,
                "POST",
                "/apis/authentication.k8s.io/v1/tokenreviews",
                body={"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview", "spec": {"token": token}},
                what="TokenReview",
            )
        status = review.get("status") or {}
        if not status.get("authenticated"):
            return None
        u = status.get("user") or {}
        return User(
            str(u.get("username") or ""),
            tuple(str(g) for g in u.get("groups") or ()),
            str(u.get("uid") or ""),
            tuple(sorted((str(k), tuple(str(x) for x in v)) for k, v in (u.get("extra") or {}).items())),
        )


class Authorizer:
    """SubjectAccessReviews on `nodes/<node>` through the consumer's API."""

    def __init__(self, api: Any, node: str) -> None:
        self.api = api
        self.node = node
        self._cache: TTLCache[tuple[User, str, str], bool] = TTLCache()

    async def allowed(self, user: User, verb: str, subresource: str) -> bool:
        key = (user, verb, subresource)
        hit = self._cache.get(key)
        if hit is not None:
            return hit
        review = await rest.request(
            self.api,
            "POST",
            "/apis/authorization.k8s.io/v1/subjectaccessreviews",
            body={
                "apiVersion": "authorization.k8s.io/v1",
                "kind": "SubjectAccessReview",
                "spec": {
                    **user.spec(),
                    "resourceAttributes": {
                        "verb": verb,
                        "group": "",
                        "version": "v1",
                        "resource": "nodes",
                        "subresource": subresource,
                        "name": self.node,
                    },
                },
            },
            what="SubjectAccessReview",
        )
        allowed = bool((review.get("status") or {}).get("allowed"))
        self._cache.put(key, allowed, ALLOW_TTL_S if allowed else DENY_TTL_S)
        return allowed

    async def allowed_any(self, user: User, verb: str, subresources: list[str]) -> bool:
        for sub in subresources:
            if await self.allowed(user, verb, sub):
                return True
        return False


__all__ = [
    "Authenticator",
    "Authorizer",
    "KubeError",
    "ReviewLimitedError",
    "ReviewLimiter",
    "TTLCache",
    "TokenBucket",
    "User",
    "attributes",
    "user_from_peercert",
]
