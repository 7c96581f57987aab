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
  30 s — the kubelet's defaults — bounded in size.

Does not: terminate TLS (the server does) or log tokens.
"""

from __future__ import annotations

import hashlib
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from gpufed.kube import rest
from gpufed.kube.client import KubeError

TOKEN_TTL_S = 120.0
ALLOW_TTL_S = 300.0
DENY_TTL_S = 30.0
CACHE_SIZE = 1024

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
    """Bearer tokens -> users through the consumer's TokenReview API."""

    def __init__(self, api: Any) -> None:
        self.api = api
        #: A 1-tuple so that "not authenticated" (None) can be cached too.
        self._cache: TTLCache[str, tuple[User | None]] = TTLCache()

    async def from_token(self, token: str) -> User | None:
        """The user `token` authenticates, or None. A token that is not printable ASCII (bearer tokens
        are base64url JWTs or `id.secret`) is refused here: the header's bytes may not even encode."""
        if not token.isascii() or not token.isprintable():
            return None
        key = hashlib.sha256(token.encode()).hexdigest()
        hit = self._cache.get(key)
        if hit is not None:
            return hit[0]
        review = await rest.request(
            self.api,
            "POST",
            "/apis/authentication.k8s.io/v1/tokenreviews",
            body={"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview", "spec": {"token": token}},
            what="TokenReview",
        )
        status = review.get("status") or {}
        user: User | None = None
        if status.get("authenticated"):
            u = status.get("user") or {}
            user = User(
                str(u.get("username") or ""),
                tuple(str(g) for g in u.get("groups") or ()),
                str(u.get("uid") or ""),
                tuple(sorted((str(k), tuple(str(x) for x in v)) for k, v in (u.get("extra") or {}).items())),
            )
        self._cache.put(key, (user,), TOKEN_TTL_S)
        return user


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


__all__ = ["Authenticator", "Authorizer", "KubeError", "TTLCache", "User", "attributes", "user_from_peercert"]
