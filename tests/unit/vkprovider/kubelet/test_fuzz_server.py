"""Generated bad requests to the virtual node's kubelet API: paths, methods, queries, headers.

Owns the properties that the kubelet API (`vkprovider.kubelet.server`, authn/authz from
`kubeletauth`) answers any request — traversal attempts (`..`, `%2e%2e`, `%2f`), NUL bytes, odd
unicode, oversized headers and request lines, unknown or wrong methods, garbage query values — with
a 2xx or a 4xx that has a body, never a 5xx, never a hang, and never with data of a pod not bound to
this node; and that a principal allowed only `stats`/`metrics` never reaches logs, exec or
port-forward whatever the path's spelling. The server runs in-process over plain HTTP (TLS is not
under test here; tests/unit/vkprovider/kubelet/test_server.py covers it) with reviews answered by the fake API
server. Hypothesis runs derandomized with explicit `max_examples`; counts are in docs/reliability.md.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator, Mapping
from typing import Any

import pytest
from aiohttp import web
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from structlog.testing import capture_logs

from tests.unit.fakes import serve
from tests.unit.vkprovider.kubelet.test_server import NODE, FakeStreaming, Pods, _access_review, _token_review
from vkprovider.kubelet.server import BadRequestError, KubeletAPI, KubeletAPISettings, log_options
from vkprovider.kubelet.servingcert import ServingTLS
from vkprovider.node.provider import LogOptions

#: The pod bound to another node, and what only its data would contain (never in any answer).
FOREIGN = "elsewhere"
FOREIGN_DATA = (b"uid-elsewhere", b"log of elsewhere", b"kwok-node-1")


def bounded(n: int) -> settings:
    """Deterministic, bounded hypothesis settings: `n` generated cases, no deadline, no database."""
    return settings(
        max_examples=n,
        derandomize=True,
        deadline=None,
        database=None,
        suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    )


class NamingStreaming(FakeStreaming):
    """Logs that name their pod, so a leak of another pod's data would show in the body."""

    async def container_logs(self, pod: Mapping[str, Any], container: str, opts: LogOptions) -> AsyncIterator[bytes]:
        yield f"log of {pod['metadata']['name']}/{container}\n".encode()


@pytest.fixture(autouse=True)
def _quiet() -> Iterator[None]:
    with capture_logs():
        yield


@pytest.fixture(scope="module")
async def port() -> AsyncIterator[int]:
    async with serve() as (server, api):
        server.reviewers["tokenreviews"] = _token_review
        server.reviewers["subjectaccessreviews"] = _access_review
        kapi = KubeletAPI(api, KubeletAPISettings(NODE, "127.0.0.1", 0), Pods(), NamingStreaming(), ServingTLS())
        runner = web.AppRunner(kapi.app(), access_log=None, handler_cancellation=True)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        try:
            yield int(runner.addresses[0][1])
        finally:
            await runner.cleanup()


async def send(port: int, request: bytes) -> tuple[int, bytes]:
    """One raw HTTP/1.1 exchange (the client library would normalise what we want to send as is)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(request)
        await writer.drain()
        async with asyncio.timeout(10):  # a hang fails the test
            raw = await reader.read()
    finally:
        writer.close()
    head, _, body = raw.partition(b"\r\n\r\n")
    status_line = head.split(b"\r\n", 1)[0].split()
    assert len(status_line) >= 2 and status_line[0].startswith(b"HTTP/1."), raw[:200]
    return int(status_line[1]), body


def request(method: str, target: bytes, token: str | None = "admin-token", extra: bytes = b"") -> bytes:
    auth = f"Authorization: Bearer {token}\r\n".encode() if token else b""
    return (
        method.encode() + b" " + target + b" HTTP/1.1\r\nHost: node\r\n" + auth + extra + b"Connection: close\r\n\r\n"
    )


def check(status: int, body: bytes, method: str = "GET") -> None:
    assert status < 500, (status, body[:300])
    for secret in FOREIGN_DATA:  # (its name may be echoed in an error; its data never)
        assert secret not in body, body[:300]
    if 400 <= status < 500 and method != "HEAD":  # a HEAD answer has no body by definition
        assert body.strip(), f"a {status} says why"


_segment = st.one_of(
    st.sampled_from(
        [
            "team-a", "train-0", "main", "side", FOREIGN, "gone", "..", ".", "%2e%2e", "%2E%2e", "..%2f", "%2f",
            "%00", "train-0%00", "main%00", "%ff", "%", "%zz", "é", "%c3%a9", "a" * 300, "", "uid-train-0",
            "Team_A", "~", ";", "?", "#",
        ]
    ),
    st.text(st.characters(codec="ascii", exclude_characters="\r\n \x00?#"), max_size=12),
)  # fmt: skip
_prefix = st.sampled_from(
    ["containerLogs", "exec", "attach", "portForward", "pods", "stats", "metrics", "healthz", "logs", "run", "", ".."]
)
_query = st.lists(
    st.tuples(
        st.sampled_from(["follow", "tailLines", "limitBytes", "sinceSeconds", "sinceTime", "command", "output", "x"]),
        st.sampled_from(["1", "true", "-1", "9" * 5000, "%00", "%ff", "", "0", "yes", "ls"]),
    ),
    max_size=3,
)
_methods = st.sampled_from(["GET", "POST", "HEAD", "PUT", "DELETE", "PATCH", "OPTIONS", "TRACE", "CONNECT", "FOO"])


@bounded(150)
@given(
    _methods, _prefix, st.lists(_segment, max_size=5), _query, st.sampled_from(["admin-token", "metrics-token", None])
)
@example("GET", "containerLogs", ["team-a", "train-0", "..", FOREIGN, "main"], [], "admin-token")
@example("GET", "containerLogs", ["team-a", "%2e%2e", FOREIGN, "main"], [], "admin-token")
@example("GET", "containerLogs", ["team-a", "train-0%00", "main"], [], "admin-token")
@example("GET", "containerLogs", ["team-a", FOREIGN, "main"], [], "admin-token")
@example("GET", "stats", ["..", "containerLogs", "team-a", "train-0", "main"], [], "metrics-token")
@example("GET", "containerLogs", ["team-a", "train-0", "main"], [("tailLines", "9" * 5000)], "admin-token")
@example("POST", "exec", ["team-a", "train-0", "main"], [("command", "ls"), ("output", "1")], "admin-token")
async def test_any_request_is_answered_without_5xx_or_a_foreign_pods_data(
    port: int, method: str, prefix: str, segments: list[str], query: list[tuple[str, str]], token: str | None
) -> None:
    path = "/" + "/".join([prefix, *segments])
    target = path + ("?" + "&".join(f"{k}={v}" for k, v in query) if query else "")
    status, body = await send(port, request(method, target.encode(), token))
    check(status, body, method)
    if token is None:
        assert status in (400, 401)  # 400: the parser refused the request line before anyone looked at it
    if token == "metrics-token" and status == 200:
        assert b"log of" not in body, "stats/metrics access never reaches logs"


@bounded(60)
@given(
    st.sampled_from(["/containerLogs/team-a/train-0/main", "/pods", "/exec/team-a/train-0/main?command=ls&output=1"]),
    st.sampled_from(["Authorization", "X-Stream-Protocol-Version", "Upgrade", "X-Big", "Content-Length", "Host"]),
    st.one_of(
        st.sampled_from(["Bearer ", "Bearer \t", "bearer admin-token", "Basic abc", "-1", "SPDY/3.1", "websocket"]),
        st.integers(0, 20_000).map(lambda n: "a" * n),
        st.text(st.characters(codec="latin-1", exclude_characters="\r\n"), max_size=30),
    ),
)
@example("/pods", "X-Big", "a" * 20_000)  # beyond aiohttp's 8 KiB line limit: 400, not a hang
@example("/pods", "Authorization", "Bearer " + "a" * 8000)
@example("/pods", "Authorization", "Bearer é")  # regression: a latin-1 byte made token.encode() fail: 500
@example("/pods", "Authorization", "Bearer a\x7fb")
@example("/exec/team-a/train-0/main?command=ls&output=1", "Upgrade", "SPDY/3.1")  # no protocol offered: 403
async def test_odd_headers_are_answered_without_5xx(port: int, target: str, name: str, value: str) -> None:
    extra = f"{name}: {value}\r\n".encode("latin-1")
    token = None if name == "Authorization" else "admin-token"
    status, body = await send(port, request("GET", target.encode(), token, extra))
    check(status, body)


_values = st.one_of(
    st.sampled_from(
        ["", "0", "1", "-1", "true", "True", "yes", "9" * 5000, "1e3", "٣", "2026-11-21T10:00:00Z", "\x00"]
    ),
    st.text(max_size=30),
)


@bounded(150)
@given(
    st.dictionaries(
        st.sampled_from(
            ["follow", "previous", "timestamps", "tailLines", "limitBytes", "sinceSeconds", "sinceTime", "stream"]
        ),
        _values,
    )
)
@example({"tailLines": "9" * 5000})
@example({"sinceTime": "99999-01-01T00:00:00Z"})
@example({"sinceSeconds": "5", "sinceTime": "2026-11-21T10:00:00Z"})
def test_log_options_raise_only_bad_request(query: dict[str, str]) -> None:
    try:
        opts = log_options(query)
    except BadRequestError as e:
        assert str(e)
        return
    for value in (opts.tail_lines, opts.limit_bytes, opts.since_seconds):
        assert value is None or isinstance(value, int)
    assert opts.stream in (None, "All", "Stdout", "Stderr")
