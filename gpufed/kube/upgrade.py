"""HTTP/1.1 connection upgrades to an API server with a client's own credentials (exec, attach, port-forward).

Owns: `open_upgraded`, which dials the API server of a kubernetes-asyncio ApiClient over TLS with
that client's CA, client certificate and bearer token, sends one request asking to upgrade (e.g.
`Upgrade: SPDY/3.1` with the `X-Stream-Protocol-Version` list a kubelet stream endpoint expects),
and hands back the raw streams once the server answered `101 Switching Protocols`, with the
protocol version it chose. Anything but 101 is a `KubeError` carrying the API server's status and
message (e.g. 403 "pods "x" is forbidden: ... cannot create resource "pods/exec"", or 404), so
callers can map refusals like any other API error.

aiohttp's client knows WebSocket upgrades only; SPDY needs the bare connection, hence this small
hand-written request. Does not: speak the upgraded protocol (see `vkprovider.spdy.session`), retry, or
follow redirects.
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlencode, urlsplit

from gpufed.kube.budget import budget_of
from gpufed.kube.client import KubeError
from gpufed.kube.rest import error_from

#: Seconds to connect, finish TLS and receive the answer to the upgrade request.
UPGRADE_TIMEOUT_S = 30.0
#: Largest response head accepted (status line + headers).
MAX_HEAD_BYTES = 64 * 1024
#: Largest error body read from a refused upgrade.
MAX_ERROR_BODY = 64 * 1024


@dataclass
class Upgraded:
    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter
    #: The protocol version the server chose (header X-Stream-Protocol-Version), "" when none.
    protocol: str


def ssl_context(configuration: Any) -> ssl.SSLContext:
    """The TLS settings kubernetes-asyncio uses for this configuration (CA, client cert, verify)."""
    ctx = ssl.create_default_context(cafile=configuration.ssl_ca_cert)
    if configuration.cert_file:
        ctx.load_cert_chain(configuration.cert_file, keyfile=configuration.key_file)
    if not configuration.verify_ssl:
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
    ctx.set_alpn_protocols(["http/1.1"])
    return ctx


async def _auth_headers(configuration: Any) -> dict[str, str]:
    out: dict[str, str] = {}
    for setting in (await configuration.auth_settings()).values():
        if setting.get("in") == "header" and setting.get("value"):
            out[str(setting["key"])] = str(setting["value"])
    return out


def _parse_head(head: bytes) -> tuple[int, dict[str, str]]:
    lines = head.decode("latin-1").split("\r\n")
    parts = lines[0].split(" ", 2)
    if len(parts) < 2 or not parts[0].startswith("HTTP/1.") or not parts[1].isdigit():
        raise ValueError(f"not an HTTP/1.1 status line: {lines[0][:80]!r}")
    headers: dict[str, str] = {}
    for line in lines[1:]:
        if not line:
            continue
        name, sep, value = line.partition(":")
        if not sep:
            raise ValueError(f"malformed header line {line[:80]!r}")
        headers[name.strip().lower()] = value.strip()
    return int(parts[1]), headers


async def open_upgraded(
    api: Any,
    method: str,
    url_path: str,
    params: Sequence[tuple[str, str]],
    *,
    upgrade: str,
    protocols: Sequence[str],
    connect_timeout: float = UPGRADE_TIMEOUT_S,
) -> Upgraded:
    """Connect, ask for `upgrade` with `protocols`, and return the raw streams after a 101."""
    what = f"{method} {url_path}"
    cfg = api.configuration
    url = urlsplit(cfg.host)
    host = url.hostname or "localhost"
    port = url.port or (443 if url.scheme == "https" else 80)
    ctx = ssl_context(cfg) if url.scheme == "https" else None
    budget = budget_of(api)
    if budget is not None:
        await budget.acquire()
    target = (url.path.rstrip("/") + url_path) + ("?" + urlencode(list(params)) if params else "")
    headers = {
        "Host": url.netloc,
        "Connection": "Upgrade",
        "Upgrade": upgrade,
        "X-Stream-Protocol-Version": ", ".join(protocols),
        "User-Agent": "gpufed",
        "Content-Length": "0",
        **await _auth_headers(cfg),
    }
    request = f"{method} {target} HTTP/1.1\r\n" + "".join(f"{k}: {v}\r\n" for k, v in headers.items()) + "\r\n"
    try:
        async with asyncio.timeout(connect_timeout):
            reader, writer = await asyncio.open_connection(
                host,
                port,
                ssl=ctx,
                server_hostname=(cfg.tls_server_name or host) if ctx is not None else None,
                limit=MAX_HEAD_BYTES,
            )
            try:
                writer.write(request.encode("latin-1"))
                await writer.drain()
                head = await reader.readuntil(b"\r\n\r\n")
                status, resp_headers = _parse_head(head[:-4])
                if status != 101:
                    # The API server's refusals carry a Status with a Content-Length; anything else is
                    # read up to a bound (the message is for the user, not parsed further).
                    length = int(resp_headers.get("content-length") or -1)
                    body = await (
                        reader.readexactly(length) if 0 <= length <= MAX_ERROR_BODY else reader.read(MAX_ERROR_BODY)
                    )
                    raise error_from(status, body.decode("utf-8", "replace"), what)
            except BaseException:
                writer.close()
                raise
    except KubeError:
        raise
    except (OSError, TimeoutError, ssl.SSLError, asyncio.IncompleteReadError, asyncio.LimitOverrunError) as e:
        raise KubeError(f"{what}: cannot reach the API server ({type(e).__name__}: {e})") from e
    except ValueError as e:
        raise KubeError(f"{what}: unexpected answer to the upgrade request ({e})") from e
    if resp_headers.get("upgrade", "").lower() != upgrade.lower():
        writer.close()
        raise KubeError(f"{what}: the server switched to {resp_headers.get('upgrade')!r}, not {upgrade}")
    return Upgraded(reader, writer, resp_headers.get("x-stream-protocol-version", ""))


__all__ = ["Upgraded", "open_upgraded", "ssl_context"]
