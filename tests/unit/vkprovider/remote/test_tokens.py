"""Consumer-issued service-account tokens for offloaded pods: the forge (spec rewrite, Secret, refresh
rule) and `PodTokens` against two fake API servers (consumer and provider).

FakeApiServer answers neither TokenRequest (POST .../serviceaccounts/<sa>/token) nor server-side
apply of an object that does not exist yet; `_serve` here puts both in front of it: an issuer that
checks the bound pod like the API server does (404 when it is gone, 409 naming the UID when it is
another incarnation) and an apply that creates or replaces the object.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import copy
import itertools
import json
import re
import subprocess
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import structlog
from aiohttp import web
from kubernetes_asyncio import client
from prometheus_client import REGISTRY

from gpufed.apis.wire import MANAGED_BY, MANAGED_BY_LABEL, ORIGIN_CLUSTER_LABEL, ORIGIN_UID_LABEL
from gpufed.kube.times import rfc3339
from tests.unit.fakes import FakeApiServer, Request, running, until
from vkprovider.forge.meta import Target, owned_by
from vkprovider.forge.pods import remote_pod
from vkprovider.forge.tokens import (
    MAX_EXPIRATION_S,
    TOKEN_FOR_POD_LABEL,
    IssuedToken,
    PodIdentity,
    TokenSource,
    binding_of,
    read_token_secret,
    refresh_due,
    rewrite_spec,
    token_request,
    token_secret,
    token_secret_name,
    token_sources,
)
from vkprovider.node.provider import ProviderError
from vkprovider.remote.events_relay import QUEUE_FULL, RATE_LIMITED, EventRelay, RelayLimits
from vkprovider.remote.tokens import MAX_REPORTED, REFUSED_REASON, PodTokens, TokenSettings

CONSUMER = "consumer-1a2b3c4d"
TWIN_NS = "team-consumer-1a2b3c4d"
TARGET = Target(CONSUMER, "gpufed-gpu-a-3f2c91d0", TWIN_NS, "provider-9f8e7d6c")
UID = "7d0c4b7e-1f0a-4d7c-9d1e-3b5f0e2a9c11"
POD = "train-0"
SECRET = "gpufed-token-train-0"
IDENTITY = PodIdentity(SECRET, "10.96.0.1", 443)
CA = "-----BEGIN CERTIFICATE-----\nconsumer-ca\n-----END CERTIFICATE-----\n"
T0 = datetime(2024, 5, 1, 10, 0, 0, tzinfo=UTC)
DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")

KUBE_API_ACCESS: dict[str, Any] = {
    "name": "kube-api-access-abcde",
    "projected": {
        "defaultMode": 420,
        "sources": [
            {"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}},
            {"configMap": {"name": "kube-root-ca.crt", "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
            {
                "downwardAPI": {
                    "items": [
                        {"path": "namespace", "fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.namespace"}}
                    ]
                }
            },
        ],
    },
}
SA_MOUNT = {
    "name": "kube-api-access-abcde",
    "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount",
    "readOnly": True,
}
VAULT: dict[str, Any] = {
    "name": "vault-token",
    "projected": {"sources": [{"serviceAccountToken": {"audience": "vault", "expirationSeconds": 300, "path": "jwt"}}]},
}


def make_pod(*volumes: dict[str, Any], uid: str = UID, name: str = POD) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "team", "uid": uid},
        "spec": {
            "serviceAccountName": "trainer",
            "initContainers": [{"name": "fetch", "image": "busybox", "volumeMounts": [SA_MOUNT]}],
            "containers": [
                {
                    "name": "trainer",
                    "image": "pytorch",
                    "env": [{"name": "KUBERNETES_SERVICE_HOST", "value": "api.example"}, {"name": "A", "value": "1"}],
                    "volumeMounts": [{"name": "data", "mountPath": "/data"}, SA_MOUNT],
                }
            ],
            "volumes": [{"name": "data", "emptyDir": {}}, *copy.deepcopy(list(volumes))],
        },
    }


def from_secret(key: str, path: str, **extra: Any) -> dict[str, Any]:
    return {"secret": {"name": SECRET, "items": [{"key": key, "path": path, **extra}]}}


def decoded(secret: dict[str, Any]) -> dict[str, str]:
    return {k: base64.b64decode(v).decode() for k, v in secret["data"].items()}


# ---------------------------------------------------------------- forge: sources, spec, names


def test_token_sources_are_keyed_in_volume_and_source_order_and_clamped() -> None:
    other = {"name": "x", "projected": {"sources": [{"secret": {"name": "s"}}, {"serviceAccountToken": {"path": "t"}}]}}
    pod = make_pod(KUBE_API_ACCESS, VAULT, other)
    assert token_sources(pod) == [
        # 3607 s asked (and the projection's default when none is): capped at an hour, never the 3607 s
        # kube-apiserver would extend to a year.
        TokenSource("token-0", None, MAX_EXPIRATION_S),
        TokenSource("token-1", "vault", 600),  # 300 s asked: TokenRequest refuses less than 10 minutes
        TokenSource("token-2", None, MAX_EXPIRATION_S),
    ]
    assert token_sources(make_pod()) == []


def test_rewrite_of_the_kube_api_access_volume() -> None:
    pod = make_pod(KUBE_API_ACCESS)
    before = copy.deepcopy(pod)
    spec = copy.deepcopy(pod["spec"])
    rewrite_spec(spec, IDENTITY)
    assert spec["volumes"] == [
        {"name": "data", "emptyDir": {}},
        {
            "name": "kube-api-access-abcde",
            "projected": {
                "defaultMode": 420,
                "sources": [
                    from_secret("token-0", "token"),
                    from_secret("ca.crt", "ca.crt"),
                    from_secret("namespace", "namespace"),
                ],
            },
        },
    ]
    assert [c["volumeMounts"] for c in spec["containers"] + spec["initContainers"]] == [
        [{"name": "data", "mountPath": "/data"}, SA_MOUNT],
        [SA_MOUNT],
    ]
    # The user's own KUBERNETES_SERVICE_HOST stays; what is missing is appended.
    assert spec["containers"][0]["env"] == [
        {"name": "KUBERNETES_SERVICE_HOST", "value": "api.example"},
        {"name": "A", "value": "1"},
        {"name": "KUBERNETES_SERVICE_PORT", "value": "443"},
    ]
    assert spec["initContainers"][0]["env"] == [
        {"name": "KUBERNETES_SERVICE_HOST", "value": "10.96.0.1"},
        {"name": "KUBERNETES_SERVICE_PORT", "value": "443"},
    ]
    assert pod == before


def test_a_vault_audience_gets_its_own_key_and_other_sources_stay() -> None:
    labels_item = {"path": "labels", "fieldRef": {"fieldPath": "metadata.labels"}}
    mixed = {
        "name": "mixed",
        "projected": {
            "sources": [
                {"serviceAccountToken": {"audience": "vault", "expirationSeconds": 7200, "path": "vault/jwt"}},
                {"secret": {"name": "creds", "items": [{"key": "u", "path": "user"}]}},
                {
                    "downwardAPI": {
                        "items": [
                            labels_item,
                            {"path": "ns", "mode": 256, "fieldRef": {"fieldPath": "metadata.namespace"}},
                        ]
                    }
                },
                {"configMap": {"name": "kube-root-ca.crt"}},
            ]
        },
    }
    pod = make_pod(KUBE_API_ACCESS, mixed)
    # Capped at MAX_EXPIRATION_S: the token is readable on the provider.
    assert token_sources(pod)[1] == TokenSource("token-1", "vault", MAX_EXPIRATION_S)
    spec = copy.deepcopy(pod["spec"])
    rewrite_spec(spec, IDENTITY)
    assert spec["volumes"][2] == {
        "name": "mixed",
        "projected": {
            "sources": [
                from_secret("token-1", "vault/jwt"),
                {"secret": {"name": "creds", "items": [{"key": "u", "path": "user"}]}},
                {"downwardAPI": {"items": [labels_item]}},
                from_secret("namespace", "ns", mode=256),
                from_secret("ca.crt", "ca.crt"),  # a ConfigMap source without items projects every key
            ]
        },
    }


def test_token_secret_name_is_a_dns_subdomain_of_at_most_253_characters() -> None:
    assert token_secret_name("train-0") == "gpufed-token-train-0"
    long_a = ("a" * 62 + ".") * 3 + "b" * 60  # 249 characters: a valid pod name
    long_b = long_a[:-1] + "c"
    for name in (long_a, long_b, "x" * 253):
        secret = token_secret_name(name)
        assert len(secret) <= 253
        assert DNS_SUBDOMAIN.match(secret), secret
        assert token_secret_name(name) == secret, "stable"
    assert token_secret_name(long_a) != token_secret_name(long_b)
    # Cut right after a dot: the dot goes, or ".-" would make an invalid subdomain.
    dotted = "a" * 226 + "." + "b" * 26
    assert DNS_SUBDOMAIN.match(token_secret_name(dotted))


def test_refresh_due_boundaries() -> None:
    expires = T0 + timedelta(seconds=1000)
    assert not refresh_due(T0, expires, T0 + timedelta(seconds=799))
    assert refresh_due(T0, expires, T0 + timedelta(seconds=800))
    assert not refresh_due(T0, expires, T0 + timedelta(seconds=499), fraction=0.5)
    assert refresh_due(T0, expires, T0 + timedelta(seconds=500), fraction=0.5)
    # A token valid for a year is still refreshed once it is 24 h old.
    year = T0 + timedelta(days=365)
    assert not refresh_due(T0, year, T0 + timedelta(hours=24) - timedelta(seconds=1))
    assert refresh_due(T0, year, T0 + timedelta(hours=24))


def issued(token: str, issued_s: int, expires_s: int) -> IssuedToken:
    return IssuedToken(token, T0 + timedelta(seconds=issued_s), T0 + timedelta(seconds=expires_s))


def test_token_secret_contents() -> None:
    pod = make_pod(KUBE_API_ACCESS, VAULT)
    tokens = {"token-0": issued("jwt-kube", 1, 3608), "token-1": issued("jwt-vault", 0, 600)}
    before = (copy.deepcopy(pod), copy.deepcopy(tokens))
    secret = token_secret(pod, TARGET, IDENTITY, tokens, CA)
    assert secret == {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {
            "name": SECRET,
            "namespace": TWIN_NS,
            "labels": {
                ORIGIN_CLUSTER_LABEL: CONSUMER,
                ORIGIN_UID_LABEL: UID,
                MANAGED_BY_LABEL: MANAGED_BY,
                TOKEN_FOR_POD_LABEL: POD,
            },
            "annotations": {
                "gpufed.io/token-pod": POD,
                "gpufed.io/token-namespace": "team",
                "gpufed.io/token-service-account": "trainer",
                "gpufed.io/token-sources": json.dumps(
                    [
                        {"key": "token-0", "audience": None, "expirationSeconds": MAX_EXPIRATION_S},
                        {"key": "token-1", "audience": "vault", "expirationSeconds": 600},
                    ],
                    separators=(",", ":"),
                ),
                "gpufed.io/token-issued-at": "2024-05-01T10:00:00Z",
                "gpufed.io/token-expires-at": "2024-05-01T10:10:00Z",  # the earliest over the keys
            },
        },
        "type": "Opaque",
        "data": secret["data"],
    }
    assert decoded(secret) == {"token-0": "jwt-kube", "token-1": "jwt-vault", "ca.crt": CA, "namespace": "team"}
    assert (pod, tokens) == before
    assert "jwt" not in repr(tokens["token-0"]), "an IssuedToken's repr hides the token"
    with pytest.raises(ValueError, match="token-1"):
        token_secret(pod, TARGET, IDENTITY, {"token-0": tokens["token-0"]}, CA)


def test_token_secret_reads_back_without_the_pod() -> None:
    pod = make_pod(KUBE_API_ACCESS, VAULT)
    tokens = {"token-0": issued("a", 0, 3607), "token-1": issued("b", 0, 600)}
    secret = token_secret(pod, TARGET, IDENTITY, tokens, CA)
    secret["metadata"]["uid"] = "secret-uid"
    state = read_token_secret(secret)
    assert state is not None
    assert state.binding == binding_of(pod, TARGET, IDENTITY)
    assert (state.uid, state.issued_at, state.expires_at) == ("secret-uid", T0, T0 + timedelta(seconds=600))
    assert not state.due(T0 + timedelta(seconds=479))
    assert state.due(T0 + timedelta(seconds=480))
    del secret["metadata"]["annotations"]["gpufed.io/token-sources"]
    assert read_token_secret(secret) is None


def test_a_long_pod_name_is_hashed_in_the_label_and_kept_whole_in_the_annotation() -> None:
    def label_and_note(name: str) -> tuple[str, str]:
        identity = PodIdentity(token_secret_name(name), "10.96.0.1", 443)
        secret = token_secret(
            make_pod(KUBE_API_ACCESS, name=name), TARGET, identity, {"token-0": issued("t", 0, 600)}, CA
        )
        return secret["metadata"]["labels"][TOKEN_FOR_POD_LABEL], secret["metadata"]["annotations"][
            "gpufed.io/token-pod"
        ]

    name = "job-" + "x" * 70
    label, note = label_and_note(name)
    assert len(label) <= 63
    assert LABEL_VALUE.match(label)
    assert note == name
    assert label != label_and_note(name + "y")[0]


def test_token_request_is_bound_to_the_pod() -> None:
    binding = binding_of(make_pod(KUBE_API_ACCESS, VAULT), TARGET, IDENTITY)
    kube, vault = binding.sources
    assert token_request(binding, kube) == {
        "apiVersion": "authentication.k8s.io/v1",
        "kind": "TokenRequest",
        "spec": {
            "audiences": [],
            "expirationSeconds": MAX_EXPIRATION_S,
            "boundObjectRef": {"apiVersion": "v1", "kind": "Pod", "name": POD, "uid": UID},
        },
    }
    assert token_request(binding, vault)["spec"]["audiences"] == ["vault"]


def test_the_forge_modules_import_in_either_order() -> None:
    for first, second in (("tokens", "pods"), ("pods", "tokens")):
        code = f"import vkprovider.forge.{first}, vkprovider.forge.{second}"
        subprocess.run([sys.executable, "-c", code], check=True, timeout=20)


# ---------------------------------------------------------------- PodTokens against fake API servers


class Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> datetime:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += timedelta(seconds=seconds)


def _status(code: int, reason: str, message: str) -> web.Response:
    body = {"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": code, "reason": reason}
    return web.json_response({**body, "message": message}, status=code)


@dataclass
class Issuer:
    """TokenRequest as the consumer's API server answers it, checking the bound pod."""

    consumer: FakeApiServer
    clock: Clock
    #: (namespace, service account, body) of every TokenRequest.
    requests: list[tuple[str, str, dict[str, Any]]] = field(default_factory=list)
    #: When set, every TokenRequest is answered with this (code, reason, message).
    fail: tuple[int, str, str] | None = None
    _serial: itertools.count[int] = field(default_factory=itertools.count)

    async def handle(self, request: web.Request) -> web.Response:
        _api, _v1, _ns, namespace, _sa, account, _token = request.path.strip("/").split("/")
        body = json.loads(await request.text())
        self.requests.append((namespace, account, body))
        if self.fail is not None:
            return _status(*self.fail)
        ref = body["spec"]["boundObjectRef"]
        pod = self.consumer.get("pods", namespace, ref["name"])
        if pod is None:
            return _status(404, "NotFound", f'pods "{ref["name"]}" not found')
        if pod["metadata"]["uid"] != ref["uid"]:
            message = (
                f'Operation cannot be fulfilled on Pod "{ref["name"]}": the UID in the bound object reference '
                f"({ref['uid']}) does not match the UID in record. "
                "The object might have been deleted and then recreated"
            )
            return _status(409, "Conflict", message)
        expires = self.clock() + timedelta(seconds=body["spec"]["expirationSeconds"])
        status = {"token": f"jwt-{next(self._serial)}", "expirationTimestamp": rfc3339(expires)}
        return web.json_response({**body, "status": status}, status=201)

    def tokens(self) -> list[tuple[str, str, dict[str, Any]]]:
        return list(self.requests)


async def _apply(server: FakeApiServer, request: web.Request) -> web.Response:
    """Server-side apply as a create-or-replace (what the few objects here need)."""
    body = json.loads(await request.text())
    server.requests.append(
        Request("PATCH", request.path, dict(request.query), request.content_type, copy.deepcopy(body))
    )
    _api, _v1, _ns, namespace, resource, name = request.path.strip("/").split("/")
    body["metadata"]["namespace"] = namespace
    if server.get(resource, namespace, name) is None:
        return web.json_response(server.create(resource, body), status=201)

    def replace(obj: dict[str, Any]) -> None:
        keep = {k: obj["metadata"][k] for k in ("uid", "creationTimestamp") if k in obj["metadata"]}
        obj.clear()
        obj.update({**body, "metadata": {**body["metadata"], **keep}})

    server.update(resource, namespace, name, replace)
    return web.json_response(server.get(resource, namespace, name))


@contextlib.asynccontextmanager
async def _serve(server: FakeApiServer, issuer: Issuer | None = None) -> AsyncIterator[Any]:
    async def handle(request: web.Request) -> web.StreamResponse:
        if issuer is not None and request.method == "POST" and request.path.endswith("/token"):
            return await issuer.handle(request)
        if request.method == "PATCH" and request.content_type == "application/apply-patch+yaml":
            return await _apply(server, request)
        return await server.handle(request)

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", handle)
    runner = web.AppRunner(app, shutdown_timeout=0.1)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    api = client.ApiClient(client.Configuration(host=f"http://127.0.0.1:{runner.addresses[0][1]}"))
    try:
        yield api
    finally:
        server.stop_watches()
        await api.close()
        await runner.cleanup()


@dataclass
class World:
    consumer: FakeApiServer
    provider: FakeApiServer
    issuer: Issuer
    clock: Clock
    local_api: Any
    remote_api: Any

    def tokens(self, resync_s: float = 0.01, events: EventRelay | None = None) -> PodTokens:
        settings = TokenSettings(api_host="10.96.0.1", api_port=443, resync_s=resync_s)
        return PodTokens(self.local_api, self.remote_api, CONSUMER, settings, clock=self.clock, events=events)

    def secret(self) -> dict[str, Any] | None:
        return self.provider.get("secrets", TWIN_NS, SECRET)

    def live(self) -> dict[str, Any]:
        secret = self.secret()
        assert secret is not None, "the token Secret is gone"
        return secret

    def token(self, key: str = "token-0") -> str:
        return decoded(self.live())[key]

    def add_pod(self, *volumes: dict[str, Any], uid: str = UID) -> dict[str, Any]:
        pod = make_pod(*volumes, uid=uid)
        self.consumer.create("pods", pod)
        return pod


@pytest.fixture
async def world() -> AsyncIterator[World]:
    consumer, provider, clock = FakeApiServer(), FakeApiServer(), Clock()
    issuer = Issuer(consumer, clock)
    consumer.create(
        "configmaps", {"metadata": {"name": "kube-root-ca.crt", "namespace": "team"}, "data": {"ca.crt": CA}}
    )
    async with _serve(consumer, issuer) as local_api, _serve(provider) as remote_api:
        yield World(consumer, provider, issuer, clock, local_api, remote_api)


async def test_ensure_issues_one_bound_token_per_source_and_writes_the_secret(world: World) -> None:
    pod = world.add_pod(KUBE_API_ACCESS, VAULT)
    tokens = world.tokens()
    assert await tokens.ensure(pod, TARGET) == IDENTITY
    binding = binding_of(pod, TARGET, IDENTITY)
    assert world.issuer.requests == [("team", "trainer", token_request(binding, s)) for s in binding.sources]
    assert [body["spec"]["boundObjectRef"]["uid"] for _, _, body in world.issuer.requests] == [UID, UID]
    secret = world.secret()
    assert secret is not None
    assert owned_by(secret, CONSUMER, UID)
    assert decoded(secret) == {"token-0": "jwt-0", "token-1": "jwt-1", "ca.crt": CA, "namespace": "team"}
    assert secret["metadata"]["annotations"]["gpufed.io/token-expires-at"] == "2024-05-01T10:10:00Z"
    # a new pod's Secret: one request to the provider, a create (no read first), as field manager gpufed
    assert [(r.method, r.query.get("fieldManager")) for r in world.provider.requests] == [("POST", "gpufed")]
    # Due at 80% of the shortest lifetime (the vault token's 600 s).
    assert tokens.scheduled() == {(TWIN_NS, SECRET): T0 + timedelta(seconds=480)}
    # The twin built with that identity mounts exactly this Secret's keys.
    volumes = remote_pod(pod, TARGET, IDENTITY)["spec"]["volumes"]
    keys = {
        i["key"] for v in volumes for s in (v.get("projected") or {}).get("sources", []) for i in s["secret"]["items"]
    }
    assert keys == set(decoded(secret))


async def test_a_pod_without_token_sources_gets_no_identity_and_no_io(world: World) -> None:
    pod = world.add_pod()
    requests = len(world.consumer.requests)
    assert await world.tokens().ensure(pod, TARGET) is None
    assert world.issuer.requests == []
    assert len(world.consumer.requests) == requests
    assert world.provider.requests == []


async def test_a_second_ensure_before_due_requests_no_token(world: World) -> None:
    pod = world.add_pod(KUBE_API_ACCESS, VAULT)
    tokens = world.tokens()
    await tokens.ensure(pod, TARGET)
    rv = world.live()["metadata"]["resourceVersion"]
    world.clock.advance(479)
    assert await tokens.ensure(pod, TARGET) == IDENTITY
    assert len(world.issuer.requests) == 2
    assert world.live()["metadata"]["resourceVersion"] == rv
    world.clock.advance(1)
    await tokens.ensure(pod, TARGET)
    assert len(world.issuer.requests) == 4
    assert world.token("token-1") == "jwt-3"


async def test_the_refresh_loop_reissues_due_tokens(world: World) -> None:
    pod = world.add_pod(KUBE_API_ACCESS)
    with structlog.testing.capture_logs() as logs:
        tokens = world.tokens()
        await tokens.ensure(pod, TARGET)
        assert world.token() == "jwt-0"
        async with running(tokens.run(lambda: [TWIN_NS])):
            await until(tokens.ready.is_set, what="first pass")
            await until(lambda: len(world.provider.calls("GET", f"/api/v1/namespaces/{TWIN_NS}/secrets")) > 2)
            assert len(world.issuer.requests) == 1, "not due yet"
            world.clock.advance(0.8 * 3607)
            await until(lambda: world.token() == "jwt-1", what="the refreshed token")
            await until(lambda: any(e["event"] == "tokens refreshed" for e in logs), what="the refresh logged")
        notes = world.live()["metadata"]["annotations"]
        assert notes["gpufed.io/token-issued-at"] == rfc3339(world.clock.now)
        assert world.issuer.requests[1][2] == world.issuer.requests[0][2], "the same bound request again"
        assert decoded(world.live())["ca.crt"] == CA
    assert "jwt-" not in repr(logs), "a token was logged"


async def test_a_restarted_refresher_resumes_from_the_secrets_alone(world: World) -> None:
    pod = world.add_pod(KUBE_API_ACCESS, VAULT)
    await world.tokens().ensure(pod, TARGET)
    restarted = world.tokens()  # never sees the pod: the mapping twin -> local namespace is the consumer's
    async with running(restarted.run(lambda: {TWIN_NS: "team"})):
        await until(restarted.ready.is_set, what="first pass")
        assert restarted.scheduled() == {(TWIN_NS, SECRET): T0 + timedelta(seconds=480)}
        world.clock.advance(480)
        await until(lambda: world.token("token-1") == "jwt-3", what="the refreshed tokens")
    binding = binding_of(pod, TARGET, IDENTITY)
    assert [body for _, _, body in world.issuer.requests[2:]] == [token_request(binding, s) for s in binding.sources]
    assert world.token("token-0") == "jwt-2"


@pytest.mark.parametrize("recreated", [False, True], ids=["deleted", "recreated"])
async def test_a_secret_whose_bound_pod_is_gone_is_deleted(world: World, recreated: bool) -> None:
    pod = world.add_pod(KUBE_API_ACCESS)
    tokens = world.tokens()
    await tokens.ensure(pod, TARGET)
    uid = world.live()["metadata"]["uid"]
    world.consumer.remove("pods", "team", POD)
    if recreated:  # same name, another incarnation: its token must not be the old pod's
        world.add_pod(KUBE_API_ACCESS, uid="another-uid")
    async with running(tokens.run(lambda: [TWIN_NS])):
        await until(tokens.ready.is_set, what="first pass")
        world.clock.advance(3607)
        await until(lambda: world.secret() is None, what="the Secret deleted")
    (delete,) = world.provider.calls("DELETE", f"/api/v1/namespaces/{TWIN_NS}/secrets/{SECRET}")
    assert delete.body["preconditions"] == {"uid": uid}
    assert tokens.scheduled() == {}


async def test_refresh_failures_keep_the_secret_and_the_loop_and_are_retried(world: World) -> None:
    pod = world.add_pod(KUBE_API_ACCESS)
    tokens = world.tokens()
    await tokens.ensure(pod, TARGET)
    world.issuer.fail = (404, "NotFound", 'serviceaccounts "trainer" not found')
    async with running(tokens.run(lambda: [TWIN_NS])) as task:
        await until(tokens.ready.is_set, what="first pass")
        world.clock.advance(3000)
        await until(lambda: len(world.issuer.requests) >= 3, what="retries on later passes")
        assert not task.done()
        assert world.token() == "jwt-0", "a missing service account is no missing pod: the Secret stays"
        world.issuer.fail = (503, "ServiceUnavailable", "etcd is down")
        await until(lambda: len(world.issuer.requests) >= 5, what="retries on later passes")
        world.issuer.fail = None
        await until(lambda: world.token().startswith("jwt-") and world.token() != "jwt-0", what="refreshed at last")


async def test_an_unowned_secret_of_that_name_is_left_alone(world: World) -> None:
    pod = world.add_pod(KUBE_API_ACCESS)
    world.provider.create(
        "secrets",
        {"metadata": {"name": SECRET, "namespace": TWIN_NS, "labels": {"app": "mine"}}, "data": {"x": "eA=="}},
    )
    before = copy.deepcopy(world.live())
    tokens = world.tokens()
    with pytest.raises(ProviderError) as refused:
        await tokens.ensure(pod, TARGET)
    assert refused.value.reason == "NameCollision"
    # the create found the name taken: the token asked for it is dropped (written nowhere, as the
    # unchanged Secret below shows), and none is asked for again
    assert len(world.issuer.requests) == 1
    await tokens.forget("team", POD, TWIN_NS)
    assert world.live() == before


@pytest.mark.parametrize(
    ("answer", "reason"),
    [
        ((403, "Forbidden", 'serviceaccounts "trainer" is forbidden: cannot create token'), "TokenRequestFailed"),
        ((503, "ServiceUnavailable", "the server is shutting down"), "ConsumerUnavailable"),
    ],
)
async def test_token_request_refusals_are_provider_errors(
    world: World, answer: tuple[int, str, str], reason: str
) -> None:
    pod = world.add_pod(KUBE_API_ACCESS)
    world.issuer.fail = answer
    with pytest.raises(ProviderError) as refused:
        await world.tokens().ensure(pod, TARGET)
    assert refused.value.reason == reason
    assert answer[2] in str(refused.value)
    assert world.secret() is None


async def test_a_consumer_without_its_ca_configmap_is_a_provider_error(world: World) -> None:
    pod = world.add_pod(KUBE_API_ACCESS)
    world.consumer.remove("configmaps", "team", "kube-root-ca.crt")
    with pytest.raises(ProviderError) as refused:
        await world.tokens().ensure(pod, TARGET)
    assert refused.value.reason == "ReferenceNotFound"
    assert world.secret() is None


async def test_the_consumer_ca_is_read_once_for_many_pods(world: World) -> None:
    tokens = world.tokens()
    for i in range(3):
        pod = make_pod(KUBE_API_ACCESS, uid=f"uid-{i}", name=f"trainer-{i}")
        world.consumer.create("pods", pod)
        await tokens.ensure(pod, TARGET)
    assert len(world.consumer.calls("GET", "/api/v1/namespaces/team/configmaps/kube-root-ca.crt")) == 1
    assert len(world.issuer.requests) == 3


async def test_a_burst_of_pods_that_all_miss_the_ca_cache_reads_it_once(world: World) -> None:
    tokens = world.tokens()
    pods = [make_pod(KUBE_API_ACCESS, uid=f"uid-{i}", name=f"trainer-{i}") for i in range(8)]
    for pod in pods:
        world.consumer.create("pods", pod)
    await asyncio.gather(*(tokens.prepare(pod, TARGET) for pod in pods))
    assert len(world.consumer.calls("GET", "/api/v1/namespaces/team/configmaps/kube-root-ca.crt")) == 1


async def test_forget_deletes_the_secret_and_drops_it_from_the_schedule(world: World) -> None:
    pod = world.add_pod(KUBE_API_ACCESS)
    tokens = world.tokens()
    await tokens.ensure(pod, TARGET)
    uid = world.live()["metadata"]["uid"]
    await tokens.forget("team", POD, TWIN_NS, uid="an-older-incarnation")
    assert world.secret() is not None, "another incarnation's Secret stays"
    await tokens.forget("team", POD, TWIN_NS, uid=UID)
    assert world.secret() is None
    (delete,) = world.provider.calls("DELETE", f"/api/v1/namespaces/{TWIN_NS}/secrets/{SECRET}")
    assert delete.body["preconditions"] == {"uid": uid}
    assert tokens.scheduled() == {}
    await tokens.forget("team", POD, TWIN_NS)  # already gone: fine


def twin_of(pod: dict[str, Any], uid: str = "twin-uid-1") -> dict[str, Any]:
    return {"metadata": {"name": pod["metadata"]["name"], "namespace": TWIN_NS, "uid": uid}}


async def test_prepare_asks_for_the_tokens_and_ensure_writes_them_owned_by_the_twin(world: World) -> None:
    pod = world.add_pod(KUBE_API_ACCESS, VAULT)
    tokens = world.tokens()
    prepared = await tokens.prepare(pod, TARGET)
    assert prepared is not None
    assert len(world.issuer.requests) == 2, "one TokenRequest per source, before any twin exists"
    assert world.provider.requests == [], "nothing written to the provider yet"
    assert await tokens.ensure(pod, TARGET, owner=twin_of(pod), prepared=prepared) == IDENTITY
    assert len(world.issuer.requests) == 2, "the prepared tokens are written, not asked for again"
    assert [r.method for r in world.provider.requests] == ["POST"]
    assert world.live()["metadata"]["ownerReferences"] == [
        {"apiVersion": "v1", "kind": "Pod", "name": POD, "uid": "twin-uid-1"}
    ]
    assert decoded(world.live())["token-0"] == "jwt-0"
    assert await tokens.prepare(pod, TARGET) is None, "a known Secret is not prepared again"
    assert len(world.issuer.requests) == 2


async def test_a_token_secret_create_that_lost_a_quota_race_is_sent_again(world: World) -> None:
    pod = world.add_pod(KUBE_API_ACCESS)
    tokens = world.tokens()
    world.provider.contend["secrets"] = 2
    assert await tokens.ensure(pod, TARGET, owner=twin_of(pod)) == IDENTITY
    assert [r.method for r in world.provider.requests] == ["POST", "POST", "POST"], "no read: it was not there"
    assert world.token() == "jwt-0"
    assert len(world.issuer.requests) == 1, "the same tokens sent again"


async def test_a_secret_owned_by_its_twin_is_left_to_the_garbage_collector(world: World) -> None:
    pod = world.add_pod(KUBE_API_ACCESS)
    tokens = world.tokens()
    await tokens.ensure(pod, TARGET, owner=twin_of(pod))
    before = len(world.provider.requests)
    await tokens.forget("team", POD, TWIN_NS, uid=UID)
    assert len(world.provider.requests) == before, "no request: the provider's garbage collector removes it"
    assert world.secret() is not None
    assert tokens.scheduled() == {}
    # Not known to this process (restarted): read, and left alone since a twin owns it.
    await world.tokens().forget("team", POD, TWIN_NS, uid=UID)
    assert [r.method for r in world.provider.requests[before:]] == ["GET"]
    assert world.secret() is not None


async def test_a_secret_rewritten_for_a_new_incarnation_keeps_the_old_owner_and_adds_the_new(world: World) -> None:
    old = world.add_pod(KUBE_API_ACCESS)
    await world.tokens().ensure(old, TARGET, owner=twin_of(old, "twin-old"))
    world.consumer.remove("pods", "team", POD)
    new = world.add_pod(KUBE_API_ACCESS, uid="b1c2d3e4-0000-4000-8000-000000000001")
    fresh = world.tokens()  # the old Secret is not known to this process: its create conflicts
    await fresh.ensure(new, TARGET, owner=twin_of(new, "twin-new"))
    owners = [r["uid"] for r in world.live()["metadata"]["ownerReferences"]]
    assert owners == ["twin-old", "twin-new"], "removing the old twin must not remove the new twin's Secret"
    assert world.live()["metadata"]["labels"][ORIGIN_UID_LABEL] == new["metadata"]["uid"]


async def test_a_known_fresh_secret_of_another_twin_gets_this_twin_as_owner(world: World) -> None:
    pod = world.add_pod(KUBE_API_ACCESS)
    tokens = world.tokens()
    await tokens.ensure(pod, TARGET, owner=twin_of(pod, "twin-1"))
    await tokens.ensure(pod, TARGET, owner=twin_of(pod, "twin-1"))
    assert len(world.issuer.requests) == 1, "owned by this twin and fresh: nothing to do"
    await tokens.ensure(pod, TARGET, owner=twin_of(pod, "twin-2"))  # the twin was created again
    assert [r["uid"] for r in world.live()["metadata"]["ownerReferences"]] == ["twin-1", "twin-2"]


async def test_a_provider_deleting_a_token_secret_gets_it_written_at_most_once_per_listing(world: World) -> None:
    pod = world.add_pod(KUBE_API_ACCESS)
    tokens = world.tokens(resync_s=3600)  # one listing in this test
    async with running(tokens.run(lambda: {TWIN_NS: "team"})):
        await until(tokens.ready.is_set, what="first pass")
        assert tokens.missing(pod, TARGET)
        await tokens.ensure(pod, TARGET, owner=twin_of(pod))
        world.provider.remove("secrets", TWIN_NS, SECRET)
        await asyncio.sleep(0.05)
        assert not tokens.missing(pod, TARGET), "written since the listing: not missing before the next one"
    assert len(world.issuer.requests) == 1, "no TokenRequest per deletion"


async def test_a_refresh_keeps_the_owners(world: World) -> None:
    pod = world.add_pod(KUBE_API_ACCESS)
    tokens = world.tokens()
    await tokens.ensure(pod, TARGET, owner=twin_of(pod))
    async with running(tokens.run(lambda: {TWIN_NS: "team"})):
        await until(tokens.ready.is_set, what="first pass")
        world.clock.advance(0.8 * 3607)
        await until(lambda: world.token() == "jwt-1", what="the refreshed token")
    assert [r["uid"] for r in world.live()["metadata"]["ownerReferences"]] == ["twin-uid-1"]


async def test_missing_names_a_secret_to_write_again_only_once_the_secrets_were_listed(world: World) -> None:
    pod = world.add_pod(KUBE_API_ACCESS)
    tokens = world.tokens()
    assert not tokens.missing(pod, TARGET), "not listed yet: unknown is not missing"
    async with running(tokens.run(lambda: {TWIN_NS: "team"})):
        await until(tokens.ready.is_set, what="first pass")
        assert tokens.missing(pod, TARGET)
        await tokens.ensure(pod, TARGET, owner=twin_of(pod))
        assert not tokens.missing(pod, TARGET)


# ---------------------------------------------------------------- a provider's Secrets are claims only

FOREIGN_AUDIENCE = "sts.amazonaws.com"
TEN_YEARS_S = 10 * 365 * 24 * 3600


def planted(name: str, pod: str = POD, namespace: str = "team", uid: str = UID) -> dict[str, Any]:
    """A token Secret as a provider can write it: our labels, annotations asking for whatever it wants."""
    sources = [{"key": "token-0", "audience": FOREIGN_AUDIENCE, "expirationSeconds": TEN_YEARS_S}]
    return {
        "metadata": {
            "name": name,
            "namespace": TWIN_NS,
            "labels": {
                ORIGIN_CLUSTER_LABEL: CONSUMER,
                ORIGIN_UID_LABEL: uid,
                MANAGED_BY_LABEL: MANAGED_BY,
                TOKEN_FOR_POD_LABEL: pod,
            },
            "annotations": {
                "gpufed.io/token-pod": pod,
                "gpufed.io/token-namespace": namespace,
                "gpufed.io/token-service-account": "cluster-admin-sa",
                "gpufed.io/token-sources": json.dumps(sources),
                "gpufed.io/token-issued-at": "2020-01-01T00:00:00Z",
                "gpufed.io/token-expires-at": "2020-01-01T01:00:00Z",
            },
        },
        "type": "Opaque",
        "data": {"token-0": ""},
    }


def refused_count(reason: str) -> float:
    return (
        REGISTRY.get_sample_value("gpufed_token_secrets_refused_total", {"remote_cluster": "", "reason": reason}) or 0
    )


def foreign_requests(world: World) -> list[dict[str, Any]]:
    return [
        body
        for _, account, body in world.issuer.requests
        if FOREIGN_AUDIENCE in body["spec"]["audiences"]
        or body["spec"]["expirationSeconds"] > MAX_EXPIRATION_S
        or account != "trainer"
    ]


async def test_a_planted_token_secret_obtains_no_token(world: World) -> None:
    pod = world.add_pod(KUBE_API_ACCESS)
    tokens = world.tokens()
    await tokens.ensure(pod, TARGET)
    world.provider.create("secrets", planted("gpufed-token-evil"))
    before = refused_count("NotAPodsSecret")
    with structlog.testing.capture_logs() as logs:
        async with running(tokens.run(lambda: {TWIN_NS: "team"})):
            await until(lambda: len(world.provider.calls("GET", f"/api/v1/namespaces/{TWIN_NS}/secrets")) > 3)
    assert [e["found_by"] for e in logs if e["event"] == "token secret refused"] == ["listing"]
    assert foreign_requests(world) == [], "a TokenRequest was built from the provider's annotations"
    assert len(world.issuer.requests) == 1, "only the pod's own token, from ensure"
    evil = world.provider.get("secrets", TWIN_NS, "gpufed-token-evil")
    assert evil is not None and evil["data"] == {"token-0": ""}, "no token reached the planted Secret"
    assert refused_count("NotAPodsSecret") == before + 1, "refused once, not at every resync"


async def test_a_planted_secret_naming_a_pod_of_another_namespace_obtains_no_token(world: World) -> None:
    other = make_pod(KUBE_API_ACCESS, uid="uid-of-other")
    other["metadata"]["namespace"] = "payments"
    world.consumer.create("pods", other)
    world.provider.create("secrets", planted(SECRET, namespace="payments", uid="uid-of-other"))
    tokens = world.tokens()
    async with running(tokens.run(lambda: {TWIN_NS: "team"})):
        await until(lambda: len(world.provider.calls("GET", f"/api/v1/namespaces/{TWIN_NS}/secrets")) > 3)
    assert world.issuer.requests == []
    assert world.consumer.calls("GET", "/api/v1/namespaces/payments/pods/train-0") == [], "not even read"


async def test_an_edited_token_secret_gets_the_pods_own_tokens_and_is_reported(world: World) -> None:
    pod = world.add_pod(KUBE_API_ACCESS)
    tokens = world.tokens()
    await tokens.ensure(pod, TARGET)
    edited = planted(SECRET)

    def tamper(secret: dict[str, Any]) -> None:
        secret["metadata"]["annotations"] = edited["metadata"]["annotations"]

    world.provider.update("secrets", TWIN_NS, SECRET, tamper)
    async with running(tokens.run(lambda: {TWIN_NS: "team"})):
        await until(lambda: len(world.issuer.requests) >= 2, what="the refresh")
        await until(lambda: bool(world.consumer.items("events", "team")), what="the Event on the pod")
        # the tokens are requested before the Secret is written: wait for the write itself
        await until(
            lambda: world.live()["metadata"]["annotations"]["gpufed.io/token-service-account"] == "trainer",
            what="the pod's own tokens written",
        )
    assert foreign_requests(world) == []
    binding = binding_of(pod, TARGET, IDENTITY)
    assert world.issuer.requests[1] == ("team", "trainer", token_request(binding, binding.sources[0]))
    notes = world.live()["metadata"]["annotations"]
    assert (
        notes["gpufed.io/token-service-account"] == "trainer"
        and FOREIGN_AUDIENCE not in notes["gpufed.io/token-sources"]
    )
    (event,) = world.consumer.items("events", "team")
    assert event["reason"] == "TokenSecretRefused" and event["involvedObject"]["uid"] == UID


async def test_a_pod_not_bound_to_this_provider_gets_no_token(world: World) -> None:
    pod = world.add_pod(KUBE_API_ACCESS)
    tokens = world.tokens()
    await tokens.ensure(pod, TARGET)
    world.clock.advance(3607)
    async with running(tokens.run(lambda: {TWIN_NS: "team"}, lambda _pod: False)):
        await until(lambda: bool(world.consumer.items("events", "team")), what="the Event on the pod")
    assert len(world.issuer.requests) == 1, "no refresh for a pod of another node"
    (event,) = world.consumer.items("events", "team")
    assert "not offloaded to this provider" in event["message"]


# ---------------------------------------------------------------- reports go through the bounded relay


def secrets_listed(world: World) -> int:
    return len(world.provider.calls("GET", f"/api/v1/namespaces/{TWIN_NS}/secrets"))


async def test_a_report_becomes_one_event_on_the_pod_through_the_relay_it_is_given(world: World) -> None:
    relay = EventRelay(world.local_api, "", "gpufed-virtual-kubelet")
    pod = world.add_pod(KUBE_API_ACCESS)
    tokens = world.tokens(events=relay)
    assert tokens.events is relay
    await tokens.ensure(pod, TARGET)
    world.clock.advance(3607)
    async with running(relay.run()), running(tokens.run(lambda: {TWIN_NS: "team"}, lambda _pod: False)):
        await until(lambda: bool(world.consumer.items("events", "team")), what="the Event on the pod")
        listed = secrets_listed(world)
        await until(lambda: secrets_listed(world) > listed + 2, what="later resyncs refusing it again")
        await relay.flushed()
    (event,) = world.consumer.items("events", "team")
    assert (event["type"], event["reason"], event["involvedObject"]["uid"]) == ("Warning", REFUSED_REASON, UID)
    assert event.get("count", 1) == 1, "reported once, not at every resync"
    assert relay.dropped == {QUEUE_FULL: 0, RATE_LIMITED: 0}


async def test_a_flood_of_planted_secrets_costs_at_most_the_relays_queue(world: World) -> None:
    n, capacity = 60, 8
    relay = EventRelay(world.local_api, "", "test", RelayLimits(capacity=capacity))  # its owner does not run it
    for i in range(n):
        name = f"train-{i}"
        world.consumer.create("pods", make_pod(KUBE_API_ACCESS, uid=f"uid-{i}", name=name))
        world.provider.create("secrets", planted(token_secret_name(name), pod=name, uid=f"uid-{i}"))
    before = refused_count("NotOffloadedHere")
    tokens = world.tokens(events=relay)
    async with running(tokens.run(lambda: {TWIN_NS: "team"}, lambda _pod: False)):
        await until(lambda: refused_count("NotOffloadedHere") == before + n, what="every Secret refused")
        listed = secrets_listed(world)
        await until(lambda: secrets_listed(world) > listed + 2, what="later resyncs")
    assert relay.pending() == capacity, "the refresher does not run a relay it was given"
    assert relay.dropped == {QUEUE_FULL: n - capacity, RATE_LIMITED: 0}
    assert world.consumer.items("events", "team") == []
    assert world.issuer.requests == []


async def test_reports_start_no_task_and_their_memory_is_bounded() -> None:
    limits = RelayLimits(capacity=16)
    relay = EventRelay(None, "flood-tokens", "test", limits, clock=lambda: 0.0)  # no refill: exact counts
    tokens = PodTokens(None, None, CONSUMER, TokenSettings("10.96.0.1", 443), events=relay)
    n = MAX_REPORTED + 2_000
    tasks = asyncio.all_tasks()
    for i in range(n):
        pod = make_pod(uid=f"uid-{i}", name=f"p-{i}")
        tokens._report("Tampered", f"message {i}", pod, (TWIN_NS, token_secret_name(f"p-{i}")))
    assert asyncio.all_tasks() == tasks, "a report started a task"
    assert relay.pending() == limits.capacity
    assert relay.dropped == {
        QUEUE_FULL: limits.total_burst - limits.capacity,
        RATE_LIMITED: n - limits.total_burst,
    }
    assert len(tokens._reported) <= MAX_REPORTED
    tokens._report("Tampered", f"message {n - 1}", pod, (TWIN_NS, token_secret_name(f"p-{n - 1}")))
    assert sum(relay.dropped.values()) == n - limits.capacity, "a repeated report is not offered again"


def test_token_lifetimes_are_capped_whatever_the_pod_asks() -> None:
    long_lived = {
        "name": "long",
        "projected": {"sources": [{"serviceAccountToken": {"expirationSeconds": TEN_YEARS_S}}]},
    }
    (source,) = token_sources(make_pod(long_lived))
    assert source.expiration_seconds == MAX_EXPIRATION_S == 3600
    binding = binding_of(make_pod(long_lived), TARGET, IDENTITY)
    forged = TokenSource("token-0", None, TEN_YEARS_S)
    assert token_request(binding, forged)["spec"]["expirationSeconds"] == MAX_EXPIRATION_S


# ---------------------------------------------------------------- watched: judged at once, bounded


def listings(world: World) -> int:
    """Lists of the token Secrets in the twin namespace (the resync's and the watch's own), not watches."""
    path = f"/api/v1/namespaces/{TWIN_NS}/secrets"
    return len([r for r in world.provider.calls("GET", path) if r.query.get("watch") not in ("1", "true")])


def tamper(secret: dict[str, Any]) -> None:
    secret["metadata"]["annotations"] = planted(SECRET)["metadata"]["annotations"]


def counted_passes(tokens: PodTokens) -> list[int]:
    """A one-item list counting the refresh loop's passes (each walks the whole schedule)."""
    passes = [0]
    refresh_due = tokens._refresh_due

    async def counted() -> None:
        passes[0] += 1
        await refresh_due()

    tokens._refresh_due = counted  # type: ignore[method-assign]
    return passes


async def test_a_secret_the_provider_edits_gets_the_pods_own_tokens_without_waiting_for_a_listing(
    world: World,
) -> None:
    pod = world.add_pod(KUBE_API_ACCESS)
    tokens = world.tokens(resync_s=3600)  # the listing would come in an hour
    async with running(tokens.run(lambda: {TWIN_NS: "team"})):
        await until(tokens.ready.is_set, what="first pass")
        await tokens.ensure(pod, TARGET, owner=twin_of(pod))
        await until(lambda: listings(world) >= 2, what="the watch's list")
        listed = listings(world)
        with structlog.testing.capture_logs() as logs:
            world.provider.update("secrets", TWIN_NS, SECRET, tamper)
            await until(
                lambda: world.live()["metadata"]["annotations"]["gpufed.io/token-service-account"] == "trainer",
                what="the pod's own tokens written back",
            )
            await until(lambda: bool(world.consumer.items("events", "team")), what="the Event on the pod")
        assert listings(world) == listed, "judged from the watch event, not from a new listing"
        refusals = [e for e in logs if e["event"] == "token secret refused"]
        assert [(e["reason"], e["found_by"]) for e in refusals] == [("Tampered", "watch")]
    assert len(world.issuer.requests) == 2, "ensure's tokens, then the pod's own once"
    assert foreign_requests(world) == []


async def test_a_planted_secret_is_refused_without_waiting_for_a_listing(world: World) -> None:
    tokens = world.tokens(resync_s=3600)
    before = refused_count("NotAPodsSecret")
    async with running(tokens.run(lambda: {TWIN_NS: "team"})):
        await until(tokens.ready.is_set, what="first pass")
        with structlog.testing.capture_logs() as logs:
            world.provider.create("secrets", planted("gpufed-token-evil"))
            await until(lambda: refused_count("NotAPodsSecret") == before + 1, what="the refusal")
    assert world.issuer.requests == []
    assert [e["found_by"] for e in logs if e["event"] == "token secret refused"] == ["watch"]


async def test_our_own_writes_seen_by_the_watch_cost_nothing_more(world: World) -> None:
    pods = [world.add_pod(KUBE_API_ACCESS, uid=f"uid-{i}") for i in range(5)]
    for i, pod in enumerate(pods):
        pod["metadata"]["name"] = f"train-{i}"
    tokens = world.tokens(resync_s=3600)
    passes = counted_passes(tokens)
    async with running(tokens.run(lambda: {TWIN_NS: "team"})):
        await until(tokens.ready.is_set, what="first pass")
        await until(lambda: listings(world) >= 2, what="the watch's list")
        before = passes[0]
        for pod in pods:
            world.consumer.create("pods", copy.deepcopy(pod))
            await tokens.ensure(pod, TARGET, owner=twin_of(pod))
        # the watch delivers each Secret's ADDED; give the loop its chance to react to them
        await until(lambda: len(world.provider.items("secrets", TWIN_NS)) == 5, what="the Secrets")
        for _ in range(50):
            await asyncio.sleep(0)
        reads = len([r for r in world.provider.requests if r.method == "GET" and "/secrets/" in r.path])
    assert len(world.issuer.requests) == 5, "one TokenRequest per pod, none for the watch events"
    assert passes[0] == before, "the refresh loop (a walk over every Secret) woke for what needed nothing"
    assert reads == 0, "no Secret read for what this process wrote"


async def test_a_provider_editing_a_secret_in_a_loop_gets_one_token_request_per_listing(world: World) -> None:
    pod = world.add_pod(KUBE_API_ACCESS)
    tokens = world.tokens(resync_s=3600)
    async with running(tokens.run(lambda: {TWIN_NS: "team"})):
        await until(tokens.ready.is_set, what="first pass")
        await tokens.ensure(pod, TARGET, owner=twin_of(pod))
        world.provider.update("secrets", TWIN_NS, SECRET, tamper)
        await until(
            lambda: world.live()["metadata"]["annotations"]["gpufed.io/token-service-account"] == "trainer",
            what="the first edit judged at once, the Secret written back",
        )
        for _ in range(4):
            world.provider.update("secrets", TWIN_NS, SECRET, tamper)
            await asyncio.sleep(0.3)  # time enough for a refresh (one takes a few ms here), which must not come
    assert len(world.issuer.requests) == 2, "ensure's, then one for all five edits until the next listing"


async def test_a_watched_change_that_needs_no_refresh_does_not_wake_the_refresh_loop(world: World) -> None:
    """Such as the watch's event of our own write arriving before the write's answer: each wake walks
    every Secret of the schedule, which a burst of pods must not pay once per pod."""
    pod = world.add_pod(KUBE_API_ACCESS)
    tokens = world.tokens(resync_s=3600)
    passes = counted_passes(tokens)
    async with running(tokens.run(lambda: {TWIN_NS: "team"})):
        await until(tokens.ready.is_set, what="first pass")
        await tokens.ensure(pod, TARGET, owner=twin_of(pod))
        before = passes[0]
        unseen = copy.deepcopy(world.live())
        unseen["metadata"]["resourceVersion"] = "1"  # not the version this process wrote
        tokens.seen("MODIFIED", unseen)
        for _ in range(20):
            await asyncio.sleep(0)
        assert passes[0] == before, "woken for fresh tokens"
        due = copy.deepcopy(unseen)
        due["metadata"]["annotations"]["gpufed.io/token-issued-at"] = "2020-01-01T00:00:00Z"
        due["metadata"]["resourceVersion"] = "2"
        tokens.seen("MODIFIED", due)
        await until(lambda: passes[0] > before, what="woken for a Secret that claims to be due")


async def test_a_namespace_offloaded_after_the_listing_is_watched_from_its_first_pod_on(world: World) -> None:
    """Without this a new twin namespace would be watched only from the next listing (up to
    `resync_s` later): a Secret planted there meanwhile would wait for that listing."""
    pod = world.add_pod(KUBE_API_ACCESS)
    offloaded: dict[str, str] = {}
    tokens = world.tokens(resync_s=3600)
    async with running(tokens.run(lambda: dict(offloaded))):
        await until(tokens.ready.is_set, what="first pass")
        assert tokens._watches.namespaces == frozenset()
        offloaded[TWIN_NS] = "team"
        await tokens.ensure(pod, TARGET, owner=twin_of(pod))
        await until(lambda: TWIN_NS in tokens._watches.namespaces, what="the new namespace watched")
        world.provider.update("secrets", TWIN_NS, SECRET, tamper)
        await until(
            lambda: world.live()["metadata"]["annotations"]["gpufed.io/token-service-account"] == "trainer",
            what="an edit there judged without a listing",
        )
