"""The virtual node's kubelet API in-process: TLS, authn/authz, routes, logs, exec and port-forward.

A real aiohttp HTTPS server (`KubeletAPI`) with a test CA, reviews answered by the fake API server,
and a fake StreamingProvider; exec and port-forward run our own SPDY client against it (the
real API server talks to it in tests/e2e/test_kubelet_api.py).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import datetime as dt
import ipaddress
import itertools
import json
import ssl
from collections.abc import AsyncIterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
from prometheus_client import REGISTRY
from prometheus_client.parser import text_string_to_metric_families

from gpufed.kube.upgrade import open_upgraded
from gpufed.localenv.pki import issue_leaf, make_ca
from peering import handshake
from tests.unit.fakes import FakeApiServer, serve, until
from vkprovider.kubelet import auth as kubeletauth
from vkprovider.kubelet import server as kubeletapi
from vkprovider.kubelet import streams
from vkprovider.kubelet.server import KubeletAPI, KubeletAPISettings, log_options, metrics_text, stats_summary
from vkprovider.kubelet.servingcert import (
    ServingCertManager,
    ServingCertSettings,
    ServingTLS,
    new_key_and_csr,
    renew_time,
    serving_csr_problems,
)
from vkprovider.node.provider import (
    NOT_FOUND,
    ContainerUsage,
    Duplex,
    ExecIO,
    ExecResult,
    LogOptions,
    PodUsage,
    ProviderError,
)
from vkprovider.spdy.session import Session

NODE = "gpufed-test"
LOCALHOST = ipaddress.ip_address("127.0.0.1")


def _pem(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


# ---------------------------------------------------------------------------------------- pure parts


@pytest.mark.parametrize(
    ("method", "path", "verb", "subs"),
    [
        ("GET", "/containerLogs/ns/p/c", "get", ["proxy"]),
        ("GET", "/stats/summary", "get", ["stats"]),
        ("GET", "/metrics/resource", "get", ["metrics"]),
        ("GET", "/logs/x", "get", ["log"]),
        ("GET", "/pods", "get", ["pods", "proxy"]),
        ("GET", "/healthz", "get", ["healthz", "proxy"]),
        # Streams need create whatever the method: a GET-only nodes/proxy grant opens no shell.
        ("GET", "/exec/ns/p/c", "create", ["proxy"]),
        ("POST", "/exec/ns/p/c", "create", ["proxy"]),
        ("GET", "/portForward/ns/p", "create", ["proxy"]),
        ("POST", "/attach/ns/p/c", "create", ["proxy"]),
    ],
)
def test_request_attributes(method: str, path: str, verb: str, subs: list[str]) -> None:
    assert kubeletauth.attributes(method, path) == (verb, subs)


def test_user_from_a_verified_certificate() -> None:
    cert = {"subject": ((("organizationName", "system:masters"),), (("commonName", "kube-apiserver-kubelet-client"),))}
    user = kubeletauth.user_from_peercert(cert)
    assert user is not None
    assert user.name == "kube-apiserver-kubelet-client"
    assert user.groups == ("system:masters", "system:authenticated")
    assert kubeletauth.user_from_peercert({}) is None
    assert kubeletauth.user_from_peercert(None) is None


def test_ttl_cache_expires_and_evicts(monkeypatch: pytest.MonkeyPatch) -> None:
    now = [1000.0]
    monkeypatch.setattr("vkprovider.kubelet.auth.time.monotonic", lambda: now[0])
    cache: kubeletauth.TTLCache[str, int] = kubeletauth.TTLCache(size=2)
    cache.put("a", 1, 10)
    cache.put("b", 2, 100)
    assert cache.get("a") == 1
    now[0] += 11
    assert cache.get("a") is None
    assert cache.get("b") == 2
    cache.put("c", 3, 100)
    cache.put("d", 4, 100)
    assert cache.get("b") is None  # least recently used went first


def test_log_options_are_validated_like_the_kubelet() -> None:
    opts = log_options({"follow": "true", "timestamps": "1", "tailLines": "0", "limitBytes": "10", "sinceSeconds": "5"})
    assert opts == LogOptions(follow=True, timestamps=True, tail_lines=0, limit_bytes=10, since_seconds=5)
    assert log_options({"sinceTime": "2026-11-21T10:00:00Z"}).since_time == "2026-11-21T10:00:00Z"
    for good in ("2026-11-21T11:00:00.5+01:00", "9999-12-31T23:59:59-01:00"):  # the last: past datetime's UTC range
        assert log_options({"sinceTime": good}).since_time == good
    for bad in (
        {"tailLines": "-1"},
        {"tailLines": "x"},
        {"limitBytes": "0"},
        {"sinceSeconds": "0"},
        {"follow": "yes"},
        {"sinceTime": "yesterday"},
        {"sinceTime": "2026-11-21T10:00:00"},  # no zone: RFC 3339 needs Z or an offset, as the kubelet's parser does
        {"sinceSeconds": "5", "sinceTime": "2026-11-21T10:00:00Z"},
        {"stream": "Both"},
    ):
        with pytest.raises(kubeletapi.BadRequestError):
            log_options(bad)
    with pytest.raises(kubeletapi.BadRequestError, match=r"invalid sinceTime 'yesterday': not RFC 3339"):
        log_options({"sinceTime": "yesterday"})


USAGE = [
    PodUsage(
        "team-a",
        "train-0",
        "uid-1",
        1_800_000_000.0,
        (
            ContainerUsage("main", 12.5, 0.25, 300 * 2**20, 1_799_999_000.0),
            ContainerUsage("side", 1.0, 0.01, 20 * 2**20, 1_799_999_000.0),
        ),
    )
]


def test_metrics_resource_is_what_metrics_server_reads() -> None:
    families = {f.name: f for f in text_string_to_metric_families(metrics_text(USAGE).decode())}
    # metrics-server's decoder reads these names; container series need container/pod/namespace.
    cpu = families["container_cpu_usage_seconds"]
    assert cpu.type == "counter"
    samples = {s.labels["container"]: s for s in cpu.samples}
    assert samples["main"].name == "container_cpu_usage_seconds_total"
    assert samples["main"].labels == {"container": "main", "pod": "train-0", "namespace": "team-a"}
    assert samples["main"].value == 12.5
    assert samples["main"].timestamp == 1_800_000_000.0
    mem = {s.labels["container"]: s.value for s in families["container_memory_working_set_bytes"].samples}
    assert mem == {"main": 300 * 2**20, "side": 20 * 2**20}
    node_cpu = families["node_cpu_usage_seconds"].samples[0]
    assert node_cpu.name == "node_cpu_usage_seconds_total" and node_cpu.value == 13.5
    assert families["node_memory_working_set_bytes"].samples[0].value == 320 * 2**20
    assert families["container_start_time_seconds"].samples[0].value == 1_799_999_000.0
    # No pods: no node series (metrics-server would drop a node reporting zero anyway).
    empty = {f.name: f for f in text_string_to_metric_families(metrics_text([]).decode())}
    assert empty["node_cpu_usage_seconds"].samples == []


def test_stats_summary_shape() -> None:
    s = stats_summary(NODE, 1_799_990_000.0, USAGE)
    assert s["node"]["nodeName"] == NODE
    pod = s["pods"][0]
    assert pod["podRef"] == {"name": "train-0", "namespace": "team-a", "uid": "uid-1"}
    assert pod["cpu"]["usageNanoCores"] == 260_000_000
    assert pod["cpu"]["usageCoreNanoSeconds"] == 13_500_000_000
    assert pod["memory"]["workingSetBytes"] == 320 * 2**20
    assert [c["name"] for c in pod["containers"]] == ["main", "side"]
    assert s["node"]["memory"]["workingSetBytes"] == 320 * 2**20
    # metav1.Time: whole seconds in UTC
    assert s["node"]["startTime"] == "2027-01-15T05:13:20Z"
    assert (pod["startTime"], pod["containers"][0]["startTime"]) == ("2027-01-15T07:43:20Z", "2027-01-15T07:43:20Z")
    assert pod["cpu"]["time"] == pod["memory"]["time"] == "2027-01-15T08:00:00Z"


def test_serving_csr_checks() -> None:
    _key, pem = new_key_and_csr(NODE, "127.0.0.1")
    usages = ["digital signature", "server auth"]
    assert serving_csr_problems(pem, usages, NODE, {"127.0.0.1"}) == []
    assert any("common name" in p for p in serving_csr_problems(pem, usages, "other-node", {"127.0.0.1"}))
    assert any("IP addresses" in p for p in serving_csr_problems(pem, usages, NODE, {"10.0.0.1"}))
    assert any("usages" in p for p in serving_csr_problems(pem, ["client auth"], NODE, {"127.0.0.1"}))
    assert serving_csr_problems(b"garbage", usages, NODE, {"127.0.0.1"})[0].startswith("not a PEM")


# ---------------------------------------------------------------------------------------- the server


class FakeStreaming:
    """StreamingProvider in memory: canned logs, an exec that echoes stdin, an uppercasing forward."""

    def __init__(self) -> None:
        self.log_calls: list[tuple[str, str, LogOptions]] = []
        self.follow_gate = asyncio.Event()
        self.resizes: list[tuple[int, int]] = []

    async def container_logs(self, pod: Mapping[str, Any], container: str, opts: LogOptions) -> AsyncIterator[bytes]:
        self.log_calls.append((pod["metadata"]["name"], container, opts))
        if pod["metadata"]["name"] == "gone":
            raise ProviderError("twin not found", reason=NOT_FOUND)
        yield b"line 1\n"
        if opts.follow:
            await self.follow_gate.wait()
            yield b"line 2 (followed)\n"

    async def exec_in_container(
        self, pod: Mapping[str, Any], container: str, command: Sequence[str], io: ExecIO
    ) -> ExecResult:
        if command[0] == "fail":
            return ExecResult(int(command[1]))
        if command[0] == "refuse":
            raise ProviderError("the provider refused the exec")
        assert io.stdout is not None
        await io.stdout.write(f"ran {' '.join(command)} in {container}\n".encode())
        if io.stdin is not None:
            while data := await io.stdin.read():
                await io.stdout.write(data.upper())
        if io.resize is not None:
            while (size := await io.resize.get()) is not None:
                self.resizes.append((size.width, size.height))
        if io.stderr is not None:
            await io.stderr.write(b"to stderr\n")
        return ExecResult(0)

    async def attach_to_container(self, pod: Mapping[str, Any], container: str, io: ExecIO) -> ExecResult:
        return await self.exec_in_container(pod, container, ["attached"], io)

    async def port_forward(self, pod: Mapping[str, Any], port: int, stream: Duplex) -> None:
        if port == 1:
            raise ProviderError("nothing listens on port 1")
        while data := await stream.read():
            await stream.write(f"{port}:".encode() + data.upper())

    async def pod_usage(self, pods: Sequence[Mapping[str, Any]]) -> list[PodUsage]:
        return [u for u in USAGE if any(p["metadata"]["name"] == u.name for p in pods)]


class Pods:
    def __init__(self) -> None:
        self.pods = {
            ("team-a", "train-0"): _pod("train-0", NODE),
            ("team-a", "gone"): _pod("gone", NODE),
            ("team-a", "elsewhere"): _pod("elsewhere", "kwok-node-1"),
        }

    def bound_pod(self, namespace: str, name: str) -> Mapping[str, Any] | None:
        pod = self.pods.get((namespace, name))
        return pod if pod is not None and pod["spec"]["nodeName"] == NODE else None

    def bound_pods(self) -> list[Mapping[str, Any]]:
        return [p for p in self.pods.values() if p["spec"]["nodeName"] == NODE]

    def running_pods(self) -> list[Mapping[str, Any]]:
        return [p for p in self.bound_pods() if p["metadata"]["name"] != "gone"]


def _pod(name: str, node: str) -> dict[str, Any]:
    return {
        "metadata": {"namespace": "team-a", "name": name, "uid": f"uid-{name}"},
        "spec": {"nodeName": node, "containers": [{"name": "main"}, {"name": "side"}]},
        "status": {"phase": "Running"},
    }


#: token -> (user, subresources it may use)
TOKENS = {
    "admin-token": ("alice", {"proxy", "log", "stats", "metrics", "pods", "healthz"}),
    "metrics-token": ("metrics-server", {"metrics", "stats"}),
    "get-only-token": ("monitoring", {"proxy:get"}),
    "nobody-token": ("nobody", set()),
}


def _token_review(body: dict[str, Any]) -> dict[str, Any]:
    hit = TOKENS.get(body["spec"]["token"])
    status: dict[str, Any] = {"authenticated": False}
    if hit:
        status = {"authenticated": True, "user": {"username": hit[0], "groups": ["system:authenticated"]}}
    return {**body, "status": status}


def _access_review(body: dict[str, Any]) -> dict[str, Any]:
    spec = body["spec"]
    attrs = spec["resourceAttributes"]
    allowed_subs = next((subs for user, subs in TOKENS.values() if user == spec["user"]), set())
    if spec["user"] == "cert-user":
        allowed_subs = {"proxy"}
    allowed = (
        attrs["name"] == NODE
        and attrs["resource"] == "nodes"
        and (attrs["subresource"] in allowed_subs or f"{attrs['subresource']}:{attrs['verb']}" in allowed_subs)
    )
    return {**body, "status": {"allowed": allowed}}


class Env:
    def __init__(
        self, port: int, ca: x509.Certificate, ca_file: Path, client_cert: Path, client_key: Path, fake: FakeStreaming
    ) -> None:
        self.port = port
        self.ca = ca
        self.ca_file = ca_file
        self.client_cert = client_cert
        self.client_key = client_key
        self.fake = fake
        self.base = f"https://127.0.0.1:{port}"
        #: The consumer's (fake) API server the kubelet API reviews tokens and access with.
        self.api_server: FakeApiServer | None = None

    def ssl(self, *, client_cert: bool = False) -> ssl.SSLContext:
        ctx = ssl.create_default_context(cadata=_pem(self.ca).decode())
        if client_cert:
            ctx.load_cert_chain(self.client_cert, self.client_key)
        return ctx

    async def get(self, path: str, token: str | None = None, *, client_cert: bool = False) -> tuple[int, bytes]:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        async with (
            aiohttp.ClientSession() as s,
            s.get(self.base + path, headers=headers, ssl=self.ssl(client_cert=client_cert)) as r,
        ):
            return r.status, await r.read()


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
async def env(tmp_path: Path) -> AsyncIterator[Env]:
    server_ca, server_ca_key = make_ca("kubelet-test-ca")
    client_ca, client_ca_key = make_ca("client-test-ca")
    cert, key = issue_leaf(server_ca, server_ca_key, cn=f"system:node:{NODE}", server=True, ips=(LOCALHOST,))
    ccert, ckey = issue_leaf(client_ca, client_ca_key, cn="cert-user", groups=("testers",), client=True)
    (tmp_path / "ca.crt").write_bytes(_pem(server_ca))
    (tmp_path / "client.crt").write_bytes(_pem(ccert))
    (tmp_path / "client.key").write_bytes(_key_pem(ckey))
    tls = ServingTLS()
    tls.update(cert_pem=_pem(cert), key_pem=_key_pem(key))
    tls.update(client_ca=_pem(client_ca))
    fake = FakeStreaming()
    async with serve() as (server, api):
        server.reviewers["tokenreviews"] = _token_review
        server.reviewers["subjectaccessreviews"] = _access_review
        port = _free_port()
        kapi = KubeletAPI(api, KubeletAPISettings(NODE, "127.0.0.1", port, stream_idle_timeout_s=5), Pods(), fake, tls)
        task = asyncio.create_task(kapi.run())
        await asyncio.wait_for(kapi.ready.wait(), 5)
        try:
            e = Env(port, server_ca, tmp_path / "ca.crt", tmp_path / "client.crt", tmp_path / "client.key", fake)
            e.api_server = server
            yield e
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task


async def test_anonymous_is_401_and_unauthorised_is_403(env: Env) -> None:
    assert (await env.get("/pods"))[0] == 401
    assert (await env.get("/pods", "not-a-token"))[0] == 401
    status, body = await env.get("/containerLogs/team-a/train-0/main", "nobody-token")
    assert status == 403
    assert b"user=nobody" in body and b"subresource=proxy" in body
    # metrics access does not open logs
    assert (await env.get("/containerLogs/team-a/train-0/main", "metrics-token"))[0] == 403
    assert (await env.get("/metrics/resource", "metrics-token"))[0] == 200
    assert (await env.get("/healthz", "admin-token")) == (200, b"ok")


async def test_a_flood_of_unknown_tokens_makes_a_bounded_number_of_token_reviews(env: Env) -> None:
    assert env.api_server is not None
    reviews = "/apis/authentication.k8s.io/v1/tokenreviews"
    assert (await env.get("/metrics/resource", "metrics-token"))[0] == 200  # known, now cached
    statuses = [(await env.get("/metrics/resource", f"unknown-{i}"))[0] for i in range(40)]
    made = len(env.api_server.calls("POST", reviews))
    assert made == kubeletauth.UNKNOWN_TOKEN_BURST, made
    assert statuses.count(401) == made - 1 and statuses.count(429) == 40 - (made - 1), statuses
    # A cached token costs no review: it is served while the flood's source has no budget left.
    assert (await env.get("/metrics/resource", "metrics-token"))[0] == 200
    assert len(env.api_server.calls("POST", reviews)) == made


async def test_every_path_needs_authentication_metrics_and_healthz_included(env: Env) -> None:
    for path in ("/metrics/resource", "/healthz", "/stats/summary", "/pods"):
        assert (await env.get(path))[0] == 401, path


async def test_client_certificate_from_the_client_ca_authenticates(env: Env) -> None:
    status, body = await env.get("/containerLogs/team-a/train-0/main", client_cert=True)
    assert status == 200, body
    assert body == b"line 1\n"


async def test_logs_options_pass_through_and_errors_map(env: Env) -> None:
    status, body = await env.get("/containerLogs/team-a/train-0/side?tailLines=5&timestamps=true", "admin-token")
    assert (status, body) == (200, b"line 1\n")
    assert env.fake.log_calls[-1] == ("train-0", "side", LogOptions(timestamps=True, tail_lines=5))
    assert (await env.get("/containerLogs/team-a/train-0/main?tailLines=-3", "admin-token"))[0] == 400
    assert (await env.get("/containerLogs/team-a/train-0/nope", "admin-token"))[0] == 404
    assert (await env.get("/containerLogs/team-a/missing/main", "admin-token"))[0] == 404
    # bound to another node: never served here
    status, body = await env.get("/containerLogs/team-a/elsewhere/main", "admin-token")
    assert status == 404 and b"not found on node" in body
    assert (await env.get("/containerLogs/team-a/gone/main", "admin-token"))[0] == 404
    assert (await env.get("/containerLogs/Team_A/x/main", "admin-token"))[0] == 400


async def test_follow_streams_before_the_log_ends(env: Env) -> None:
    headers = {"Authorization": "Bearer admin-token"}
    async with (
        aiohttp.ClientSession() as s,
        s.get(env.base + "/containerLogs/team-a/train-0/main?follow=true", headers=headers, ssl=env.ssl()) as r,
    ):
        assert r.status == 200
        assert await r.content.readline() == b"line 1\n"  # arrived while the provider still holds the stream
        env.fake.follow_gate.set()
        assert await r.content.readline() == b"line 2 (followed)\n"
        assert await r.content.read() == b""


async def test_pods_and_metrics(env: Env) -> None:

    status, body = await env.get("/pods", "admin-token")
    assert status == 200
    names = sorted(p["metadata"]["name"] for p in json.loads(body)["items"])
    assert names == ["gone", "train-0"]
    for path in ("/runningpods/", "/runningpods"):
        status, body = await env.get(path, "admin-token")
        assert status == 200
        # What a container runtime knows of each running pod, not the API object.
        assert json.loads(body)["items"] == [
            {
                "metadata": {"name": "train-0", "namespace": "team-a", "uid": "uid-train-0"},
                "spec": {"containers": [{"name": "main"}, {"name": "side"}]},
                "status": {},
            }
        ]
    assert (await env.get("/runningpods/", "metrics-token"))[0] == 403
    status, body = await env.get("/stats/summary", "metrics-token")
    assert status == 200 and json.loads(body)["pods"][0]["podRef"]["name"] == "train-0"
    status, body = await env.get("/metrics/resource", "metrics-token")
    fams = {f.name for f in text_string_to_metric_families(body.decode())}
    assert {"container_cpu_usage_seconds", "container_memory_working_set_bytes", "node_cpu_usage_seconds"} <= fams


class _Config:
    """The parts of a kubernetes_asyncio Configuration that open_upgraded reads."""

    def __init__(self, env: Env, token: str) -> None:
        self.host = env.base
        self.ssl_ca_cert = str(env.ca_file)
        self.cert_file: str | None = None
        self.key_file: str | None = None
        self.verify_ssl = True
        self.tls_server_name: str | None = None
        self.token = token

    async def auth_settings(self) -> dict[str, Any]:
        return {"BearerToken": {"in": "header", "key": "authorization", "value": f"Bearer {self.token}"}}


class _Api:
    def __init__(self, env: Env, token: str) -> None:
        self.configuration = _Config(env, token)


async def _session(
    env: Env, path: str, params: list[tuple[str, str]], protocols: Sequence[str], token: str
) -> tuple[Session, str]:
    up = await open_upgraded(_Api(env, token), "POST", path, params, upgrade="SPDY/3.1", protocols=protocols)
    return Session(up.reader, up.writer, client=True), up.protocol


class Buffer:
    """A ByteSink collecting what it is given; a ByteSource over fixed chunks."""

    def __init__(self, chunks: Sequence[bytes] = ()) -> None:
        self.data = b""
        self.closed = False
        self._chunks = list(chunks)

    async def write(self, data: bytes) -> None:
        self.data += data

    async def close(self) -> None:
        self.closed = True

    async def read(self, n: int = -1) -> bytes:
        return self._chunks.pop(0) if self._chunks else b""


@pytest.mark.parametrize("protocol", ["v5.channel.k8s.io", "v4.channel.k8s.io"])
async def test_exec_over_spdy_pumps_streams_and_reports_success(env: Env, protocol: str) -> None:
    session, chosen = await _session(
        env,
        "/exec/team-a/train-0/main",
        [("command", "cat"), ("input", "1"), ("output", "1"), ("error", "1")],
        [protocol],
        "admin-token",
    )
    assert chosen == protocol
    out, err = Buffer(), Buffer()
    io = ExecIO(stdin=Buffer([b"hello ", b"world\n"]), stdout=out, stderr=err, tty=False)
    result = await asyncio.wait_for(streams.client_remote_command(session, chosen, io), 10)
    assert result == ExecResult(0)
    assert out.data == b"ran cat in main\nHELLO WORLD\n"
    assert err.data == b"to stderr\n"


async def test_exec_exit_code_and_refusal_come_back_as_status(env: Env) -> None:
    params = [("command", "fail"), ("command", "7"), ("output", "1")]
    session, chosen = await _session(
        env, "/exec/team-a/train-0/main", params, streams.REMOTE_COMMAND_PROTOCOLS, "admin-token"
    )
    result = await asyncio.wait_for(
        streams.client_remote_command(session, chosen, ExecIO(None, Buffer(), None, False)), 10
    )
    assert result.exit_code == 7
    assert "non-zero exit code" in result.message
    params = [("command", "refuse"), ("output", "1")]
    session, chosen = await _session(
        env, "/exec/team-a/train-0/main", params, streams.REMOTE_COMMAND_PROTOCOLS, "admin-token"
    )
    result = await asyncio.wait_for(
        streams.client_remote_command(session, chosen, ExecIO(None, Buffer(), None, False)), 10
    )
    assert result.exit_code != 0 and "refused the exec" in result.message


async def test_tty_resize_reaches_the_provider(env: Env) -> None:
    from vkprovider.node.provider import TermSize

    params = [("command", "sh"), ("output", "1"), ("tty", "1")]
    session, chosen = await _session(env, "/exec/team-a/train-0/main", params, ["v5.channel.k8s.io"], "admin-token")
    resize: asyncio.Queue[TermSize | None] = asyncio.Queue()
    for size in (TermSize(80, 24), TermSize(120, 40), None):
        resize.put_nowait(size)
    out = Buffer()
    result = await asyncio.wait_for(
        streams.client_remote_command(session, chosen, ExecIO(None, out, None, True, resize)), 10
    )
    assert result == ExecResult(0)
    assert env.fake.resizes == [(80, 24), (120, 40)]


async def test_exec_needs_create_and_a_bound_pod(env: Env) -> None:
    from gpufed.kube.client import KubeError

    params = [("command", "ls"), ("output", "1")]
    with pytest.raises(KubeError) as e:
        await _session(env, "/exec/team-a/train-0/main", params, streams.REMOTE_COMMAND_PROTOCOLS, "get-only-token")
    assert e.value.status == 403
    with pytest.raises(KubeError) as e:
        await _session(env, "/exec/team-a/elsewhere/main", params, streams.REMOTE_COMMAND_PROTOCOLS, "admin-token")
    assert e.value.status == 404
    with pytest.raises(KubeError) as e:
        await _session(
            env, "/exec/team-a/train-0/main", [("command", "ls")], streams.REMOTE_COMMAND_PROTOCOLS, "admin-token"
        )
    assert e.value.status == 400
    with pytest.raises(KubeError) as e:
        await _session(env, "/exec/team-a/train-0/main", params, ["v9.channel.k8s.io"], "admin-token")
    assert e.value.status == 403 and "negotiation" in str(e.value)


class Conn:
    """A Duplex over fixed input; collects output."""

    def __init__(self, chunks: Sequence[bytes]) -> None:
        self.src = Buffer(chunks)
        self.out = Buffer()

    async def read(self, n: int = -1) -> bytes:
        return await self.src.read(n)

    async def write(self, data: bytes) -> None:
        await self.out.write(data)

    async def close(self) -> None:
        await self.out.close()


async def test_port_forward_over_spdy(env: Env) -> None:
    session, chosen = await _session(
        env, "/portForward/team-a/train-0", [], [streams.PORT_FORWARD_PROTOCOL], "admin-token"
    )
    assert chosen == streams.PORT_FORWARD_PROTOCOL
    conn = Conn([b"ping"])
    await asyncio.wait_for(streams.client_port_forward(session, 8080, conn), 10)
    assert conn.out.data == b"8080:PING"
    session, _ = await _session(env, "/portForward/team-a/train-0", [], [streams.PORT_FORWARD_PROTOCOL], "admin-token")
    with pytest.raises(ProviderError, match="nothing listens on port 1"):
        await asyncio.wait_for(streams.client_port_forward(session, 1, Conn([b"x"])), 10)


def test_exit_codes_from_status() -> None:
    ok = json.dumps({"metadata": {}, "status": "Success"}).encode()
    assert streams.result_from_status(ok, 5) == ExecResult(0)
    assert streams.result_from_status(b"", 4) == ExecResult(0)
    nonzero = {
        "status": "Failure",
        "reason": "NonZeroExitCode",
        "message": "command terminated with non-zero exit code: exit status 2",
        "details": {"causes": [{"reason": "ExitCode", "message": "2"}]},
    }
    assert streams.result_from_status(json.dumps(nonzero).encode(), 5).exit_code == 2
    # a runtime that only reports the code in its error text (kwok)
    wrapped = {
        "status": "Failure",
        "reason": "InternalError",
        "message": "error executing command: cmd wait: exit status 3",
    }
    assert streams.result_from_status(json.dumps(wrapped).encode(), 5).exit_code == 3
    other = {"status": "Failure", "reason": "InternalError", "message": "container not running"}
    result = streams.result_from_status(json.dumps(other).encode(), 5)
    assert result.exit_code == -1 and result.message == "container not running"
    # v1-v3 servers write plain text
    assert streams.result_from_status(b"boom", 3) == ExecResult(-1, "boom")


async def test_serving_certificate_from_a_csr_then_rotated_in_place(tmp_path: Path) -> None:
    """One CSR round against the fake API server (the test plays approver and signer), then a new
    certificate installed while the server runs: new handshakes see it, without a restart."""
    ca, ca_key = make_ca("cluster-ca")
    tls = ServingTLS()
    async with serve() as (server, api):
        manager = ServingCertManager(api, NODE, "127.0.0.1", tls, ServingCertSettings(issue_timeout_s=10))
        issuing = asyncio.create_task(manager.issue())
        await until(lambda: bool(server.items("certificatesigningrequests")), what="the CSR")
        csr = server.items("certificatesigningrequests")[0]
        assert csr["spec"]["signerName"] == "kubernetes.io/kubelet-serving"
        request = x509.load_pem_x509_csr(base64.b64decode(csr["spec"]["request"]))
        signed = (
            x509.CertificateBuilder()
            .subject_name(request.subject)
            .issuer_name(ca.subject)
            .public_key(request.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(dt.datetime.now(dt.UTC) - dt.timedelta(minutes=1))
            .not_valid_after(dt.datetime.now(dt.UTC) + dt.timedelta(hours=1))
            .add_extension(request.extensions.get_extension_for_class(x509.SubjectAlternativeName).value, False)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), False)
            .sign(ca_key, hashes.SHA256())
        )
        server.update(
            "certificatesigningrequests",
            "",
            csr["metadata"]["name"],
            lambda o: o.setdefault("status", {}).update(
                {"certificate": base64.b64encode(_pem(signed)).decode(), "conditions": [{"type": "Approved"}]}
            ),
        )
        cert_pem, key_pem = await asyncio.wait_for(issuing, 10)
        assert cert_pem == _pem(signed)
        assert server.items("certificatesigningrequests") == []  # deleted once read
        # Renewal at 80 % of the lifetime it was issued for (the signer's backdating not counted).
        issued, lifetime = handshake.issued_lifetime(signed)
        assert (renew_time(cert_pem) - issued) / lifetime == pytest.approx(0.8)

    tls.update(cert_pem=cert_pem, key_pem=key_pem)
    port = _free_port()

    async def hello(_r: web.Request) -> web.Response:
        return web.Response(text="ok")

    app = web.Application()
    app.router.add_get("/", hello)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", port, ssl_context=tls.context).start()
    try:
        first = await _served_cert(port, ca)
        assert first == signed.serial_number
        rotated, rotated_key = issue_leaf(ca, ca_key, cn=f"system:node:{NODE}", server=True, ips=(LOCALHOST,))
        tls.update(cert_pem=_pem(rotated), key_pem=_key_pem(rotated_key))
        assert await _served_cert(port, ca) == rotated.serial_number
    finally:
        await runner.cleanup()


class SigningApiServer(FakeApiServer):
    """The fake API server, playing approver and signer: each CertificateSigningRequest is created
    signed, valid for `lifetime` from the current second (X.509 times have whole seconds)."""

    def __init__(self, ca: x509.Certificate, ca_key: Any, lifetime: dt.timedelta) -> None:
        super().__init__()
        self.ca, self.ca_key, self.lifetime = ca, ca_key, lifetime

    def create(self, resource: str, obj: Mapping[str, Any], api_version: str = "v1") -> dict[str, Any]:
        new = super().create(resource, obj, api_version)
        if resource == "certificatesigningrequests":
            request = x509.load_pem_x509_csr(base64.b64decode(new["spec"]["request"]))
            start = dt.datetime.now(dt.UTC).replace(microsecond=0)
            signed = (
                x509.CertificateBuilder()
                .subject_name(request.subject)
                .issuer_name(self.ca.subject)
                .public_key(request.public_key())
                .serial_number(x509.random_serial_number())
                .not_valid_before(start)
                .not_valid_after(start + self.lifetime)
                .add_extension(request.extensions.get_extension_for_class(x509.SubjectAlternativeName).value, False)
                .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), False)
                .sign(self.ca_key, hashes.SHA256())
            )
            new["status"] = {
                "certificate": base64.b64encode(_pem(signed)).decode(),
                "conditions": [{"type": "Approved", "status": "True"}],
            }
        return new


def test_the_renew_fraction_defaults_to_the_kubelets_and_must_lie_between_0_and_1() -> None:
    assert ServingCertSettings().renew_fraction == 0.8
    assert ServingCertSettings(renew_fraction=0.05).renew_fraction == 0.05
    for bad in (0.0, 1.0, -0.1, 1.5):
        with pytest.raises(ValueError, match="must lie between 0 and 1"):
            ServingCertSettings(renew_fraction=bad)
    ca, ca_key = make_ca("cluster-ca")
    leaf, _key = issue_leaf(ca, ca_key, cn=f"system:node:{NODE}", server=True, ips=(LOCALHOST,))
    # Signed as a CSR signer does: notBefore 5 minutes before it was issued.
    issued = leaf.not_valid_before_utc + dt.timedelta(seconds=handshake.SIGNER_BACKDATE_S)
    lifetime = leaf.not_valid_after_utc - issued
    assert renew_time(_pem(leaf), 0.05) == issued + lifetime * 0.05
    assert renew_time(_pem(leaf)) == issued + lifetime * 0.8


def test_a_ten_minute_certificate_from_a_csr_signer_is_due_after_its_fraction_not_at_once() -> None:
    # The CSR API's shortest certificate: notBefore backdated 5 minutes, notAfter 10 minutes after
    # its issue. Counted from notBefore, 5 % of it would already be past, and every renewed
    # certificate would be due at once again.
    ca, ca_key = make_ca("cluster-ca")
    now = dt.datetime.now(dt.UTC).replace(microsecond=0)
    builder = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"system:node:{NODE}")]))
        .issuer_name(ca.subject)
        .public_key(ec.generate_private_key(ec.SECP256R1()).public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(seconds=handshake.SIGNER_BACKDATE_S))
        .not_valid_after(now + dt.timedelta(seconds=600))
    )
    cert = builder.sign(ca_key, hashes.SHA256())
    assert renew_time(_pem(cert), 0.05) == now + dt.timedelta(seconds=30)
    assert renew_time(_pem(cert)) == now + dt.timedelta(seconds=480)


async def test_a_csr_certificate_is_renewed_in_place_at_its_renew_fraction() -> None:
    """Two-second certificates renewed at half their lifetime: each new one is installed into the
    same ServingTLS once the previous one is due and before it expires, through a CSR deleted after."""
    ca, ca_key = make_ca("cluster-ca")
    tls = ServingTLS()
    installed: list[tuple[dt.datetime, bytes]] = []

    async def record() -> None:
        while True:
            if tls.cert_pem and (not installed or installed[-1][1] != tls.cert_pem):
                installed.append((dt.datetime.now(dt.UTC), tls.cert_pem))
            await asyncio.sleep(0.005)

    server = SigningApiServer(ca, ca_key, dt.timedelta(seconds=2))
    async with serve(server) as (_server, api):
        settings = ServingCertSettings(renew_fraction=0.5, reload_s=60)
        manager = ServingCertManager(api, NODE, "127.0.0.1", tls, settings)
        tasks = [asyncio.create_task(manager.run()), asyncio.create_task(record())]
        try:
            await until(lambda: len(installed) >= 3, timeout=6, what="two renewals")
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        assert server.items("certificatesigningrequests") == []  # each deleted once read
    serials = [x509.load_pem_x509_certificate(pem).serial_number for _t, pem in installed]
    assert len(set(serials)) == len(serials)
    for (_t, previous), (at, _pem_next) in itertools.pairwise(installed):
        not_after = x509.load_pem_x509_certificate(previous).not_valid_after_utc
        assert renew_time(previous, 0.5) <= at < not_after


async def _served_cert(port: int, ca: x509.Certificate) -> int:
    """Serial number of the certificate a fresh TLS handshake with 127.0.0.1:port presents."""
    ctx = ssl.create_default_context(cadata=_pem(ca).decode())
    _reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=ctx)
    try:
        der = writer.get_extra_info("ssl_object").getpeercert(binary_form=True)
        return x509.load_der_x509_certificate(der).serial_number
    finally:
        writer.close()


async def test_the_served_certificates_validity_is_a_metric_while_it_is_served(tmp_path: Path) -> None:
    ca, ca_key = make_ca("cluster-ca")
    leaf, leaf_key = issue_leaf(ca, ca_key, cn=f"system:node:{NODE}", server=True, ips=(LOCALHOST,))
    cert_file, key_file = tmp_path / "tls.crt", tmp_path / "tls.key"
    cert_file.write_bytes(_pem(leaf))
    key_file.write_bytes(_key_pem(leaf_key))
    labels = {"remote_cluster": NODE, "kind": "serving"}
    settings = ServingCertSettings(source="files", cert_file=cert_file, key_file=key_file, reload_s=0.05)
    async with serve() as (_server, api):
        tls = ServingTLS()
        manager = ServingCertManager(api, NODE, "127.0.0.1", tls, settings)
        task = asyncio.create_task(manager.run())
        try:
            await until(tls.ready.is_set, what="the certificate loaded")
            expires = REGISTRY.get_sample_value("gpufed_credential_expiry_timestamp_seconds", labels)
            issued = REGISTRY.get_sample_value("gpufed_credential_issued_timestamp_seconds", labels)
            assert expires == leaf.not_valid_after_utc.timestamp()
            assert issued == leaf.not_valid_before_utc.timestamp()
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
    assert REGISTRY.get_sample_value("gpufed_credential_expiry_timestamp_seconds", labels) is None
