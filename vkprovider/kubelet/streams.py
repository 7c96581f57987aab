"""Kubernetes' stream protocols for exec, attach and port-forward, spoken over a SPDY/3.1 session.

Owns both ends of the two protocols a kubelet endpoint speaks (facts from the Kubernetes sources:
`apimachinery/pkg/util/remotecommand`, `kubelet/pkg/cri/streaming/{remotecommand,portforward}`):

- remote command (`channel.k8s.io`, `v2`…`v5.channel.k8s.io`): the client opens one SPDY stream per
  channel with header `streamtype` = error | stdin | stdout | stderr | resize; the server replies to
  each, pumps the data, and ends with the outcome on the error stream — for v4/v5 a JSON
  metav1.Status (`Success`, or `Failure` / `NonZeroExitCode` with the exit code as a cause), for
  older versions the error text. Resize carries JSON `{"Width": w, "Height": h}` objects.
- port-forward (`portforward.k8s.io`): per client connection an `error` and a `data` stream with
  headers `port` and `requestid`; bytes flow on data, a failure is written as text on error.

Server side (`serve_remote_command`, `serve_port_forward`): what the virtual node's kubelet API
runs after the consumer's API server upgraded a connection; it turns the streams into `ExecIO` /
`Duplex` and calls the `StreamingProvider`. Client side (`client_remote_command`,
`client_port_forward`): what a provider implementation runs against another API server's
pods/exec|attach|portforward after `gpufed.kube.upgrade` switched the connection to SPDY.

Does not: upgrade HTTP connections, authenticate anyone, or frame SPDY (`vkprovider.spdy`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

import structlog

from vkprovider.node.provider import ByteSink, ByteSource, Duplex, ExecIO, ExecResult, ProviderError, TermSize
from vkprovider.spdy.frames import SpdyError
from vkprovider.spdy.session import Session
from vkprovider.spdy.stream import Stream

#: Remote-command protocol versions, most preferred first (the API server picks v5 since 1.29).
REMOTE_COMMAND_PROTOCOLS = ("v5.channel.k8s.io", "v4.channel.k8s.io", "v3.channel.k8s.io", "v2.channel.k8s.io")
PORT_FORWARD_PROTOCOL = "portforward.k8s.io"
#: Seconds the client has to open every stream it announced (kubelet: 30 s).
STREAM_CREATION_TIMEOUT_S = 30.0
#: Seconds to wait for the other end's reply to a stream we open.
STREAM_REPLY_TIMEOUT_S = 30.0
CHUNK = 32 * 1024
#: Seconds to wait for the user's first terminal size before starting a tty command without it.
FIRST_SIZE_WAIT_S = 1.0

_log = structlog.get_logger()


def negotiate(offered: str, supported: tuple[str, ...]) -> str | None:
    """The first of the client's offered protocol versions (comma separated) that we support."""
    for p in (x.strip() for x in offered.split(",")):
        if p in supported:
            return p
    return None


_EXIT_STATUS = re.compile(r"exit status (\d{1,3})$")


def _version(protocol: str) -> int:
    return int(protocol[1]) if protocol.startswith("v") and protocol[1:2].isdigit() else 1


async def _end(session: Session, runner: asyncio.Task[None]) -> None:
    """Close `session` (GOAWAY) and wait for its `run()` task to finish."""
    await session.close()
    runner.cancel()
    with contextlib.suppress(asyncio.CancelledError, SpdyError, OSError):
        await runner


# ---- adapters between SPDY streams and the provider's byte interfaces


class StreamIO:
    """A SPDY stream as ByteSource / ByteSink / Duplex."""

    def __init__(self, stream: Stream) -> None:
        self.stream = stream

    async def read(self, n: int = -1) -> bytes:
        try:
            return await self.stream.read(n if n > 0 else CHUNK)
        except SpdyError:
            return b""

    async def write(self, data: bytes) -> None:
        await self.stream.write(data)

    async def close(self) -> None:
        with contextlib.suppress(SpdyError, OSError):
            await self.stream.close()


async def pump(src: ByteSource, dst: ByteSink, *, close: bool = True) -> None:
    """Copy until `src` ends, then half-close `dst` (when `close`)."""
    try:
        while data := await src.read(CHUNK):
            await dst.write(data)
    finally:
        if close:
            await dst.close()


def _status(result: ExecResult) -> dict[str, Any]:
    if result.exit_code == 0 and not result.message:
        return {"metadata": {}, "status": "Success"}
    if result.exit_code > 0:
        return {
            "metadata": {},
            "status": "Failure",
            "message": result.message or f"command terminated with non-zero exit code: {result.exit_code}",
            "reason": "NonZeroExitCode",
            "details": {"causes": [{"reason": "ExitCode", "message": str(result.exit_code)}]},
        }
    return {"metadata": {}, "status": "Failure", "message": result.message or "command failed"}


def result_from_status(data: bytes, version: int) -> ExecResult:
    """ExecResult from what a server wrote on the error stream (empty = success)."""
    text = data.decode("utf-8", "replace").strip()
    if not text:
        return ExecResult(0)
    if version < 4:
        return ExecResult(-1, text)
    try:
        status = json.loads(text)
    except ValueError:
        return ExecResult(-1, text)
    if not isinstance(status, dict) or status.get("status") == "Success":
        return ExecResult(0)
    message = str(status.get("message") or text)
    if status.get("reason") == "NonZeroExitCode":
        for cause in (status.get("details") or {}).get("causes") or []:
            if cause.get("reason") == "ExitCode" and str(cause.get("message", "")).isdigit():
                return ExecResult(int(cause["message"]), message)
    # Some runtimes (kwok among them) wrap the process's exit error before the kubelet's stream
    # server sees it, so the code only survives as Go's text "...: exit status N": recovered here
    # so that the user's kubectl still exits with the command's code.
    if status.get("reason") == "InternalError" and (m := _EXIT_STATUS.search(message)):
        return ExecResult(int(m.group(1)), message)
    return ExecResult(-1, message)


async def _read_all(stream: Stream, limit: int = 64 * 1024) -> bytes:
    out = b""
    with contextlib.suppress(SpdyError):
        while len(out) < limit and (chunk := await stream.read(CHUNK)):
            out += chunk
    return out


async def _resize_reader(stream: Stream, queue: asyncio.Queue[TermSize | None]) -> None:
    """Decode the JSON objects of a resize stream into `queue` (None at the end)."""
    decoder = json.JSONDecoder()
    buf = ""
    try:
        with contextlib.suppress(SpdyError):
            while chunk := await stream.read(CHUNK):
                buf += chunk.decode("utf-8", "replace")
                while True:
                    buf = buf.lstrip()
                    if not buf:
                        break
                    try:
                        obj, end = decoder.raw_decode(buf)
                    except ValueError:
                        break  # incomplete object: wait for more
                    buf = buf[end:]
                    if isinstance(obj, dict):
                        w, h = obj.get("Width"), obj.get("Height")
                        if isinstance(w, int) and isinstance(h, int) and w >= 0 and h >= 0:
                            queue.put_nowait(TermSize(w, h))
    finally:
        queue.put_nowait(None)


# ---- server side


@dataclass(frozen=True)
class CommandRequest:
    """What the kubelet URL asked for (`input`, `output`, `error`, `tty` query parameters)."""

    stdin: bool
    stdout: bool
    stderr: bool
    tty: bool


RunCommand = Callable[[ExecIO], Awaitable[ExecResult]]


async def _accept_streams(session: Session, expected: set[str], *, what: str) -> dict[str, Stream] | None:
    """Reply to the client's streams until each expected kind is there (None: it gave up or timed out)."""
    streams: dict[str, Stream] = {}
    try:
        async with asyncio.timeout(STREAM_CREATION_TIMEOUT_S):
            while not expected <= streams.keys():
                s = await session.accept()
                kind = s.headers.get("streamtype", "")
                await s.reply()
                if kind not in expected or kind in streams:
                    s.reset()
                    continue
                streams[kind] = s
    except TimeoutError:
        _log.info("stream client did not open its streams", what=what, missing=sorted(expected - streams.keys()))
        return None
    except (SpdyError, EOFError, ConnectionError):
        return None
    return streams


def _outcome(result: ExecResult, version: int) -> bytes:
    """What the error stream carries at the end: a metav1.Status (v4+), else the error text or nothing."""
    if version >= 4:
        return json.dumps(_status(result)).encode()
    if result.exit_code != 0 or result.message:
        return (result.message or f"command terminated with non-zero exit code: {result.exit_code}").encode()
    return b""


async def serve_remote_command(
    session: Session, protocol: str, req: CommandRequest, run_command: RunCommand, *, what: str
) -> None:
    """Collect the client's streams, run the command, report its outcome; the session is closed after."""
    version = _version(protocol)
    expected = {"error"}
    if req.stdin:
        expected.add("stdin")
    if req.stdout:
        expected.add("stdout")
    if req.stderr and not req.tty:
        expected.add("stderr")
    if req.tty and version >= 3:
        expected.add("resize")
    runner = asyncio.create_task(session.run())
    resizer: asyncio.Task[None] | None = None
    try:
        streams = await _accept_streams(session, expected, what=what)
        if streams is None:
            return
        resize: asyncio.Queue[TermSize | None] | None = asyncio.Queue() if "resize" in streams else None
        if resize is not None:
            resizer = asyncio.create_task(_resize_reader(streams["resize"], resize))
        io = ExecIO(
            stdin=StreamIO(streams["stdin"]) if "stdin" in streams else None,
            stdout=StreamIO(streams["stdout"]) if "stdout" in streams else None,
            stderr=StreamIO(streams["stderr"]) if "stderr" in streams else None,
            tty=req.tty,
            resize=resize,
        )
        try:
            result = await run_command(io)
        except ProviderError as e:
            result = ExecResult(-1, str(e))
        for kind in ("stdout", "stderr"):
            if kind in streams:
                await StreamIO(streams[kind]).close()
        payload = _outcome(result, version)
        with contextlib.suppress(SpdyError, OSError):
            if payload:
                await streams["error"].write(payload)
            await streams["error"].close()
    finally:
        if resizer is not None:
            resizer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await resizer
        await _end(session, runner)


Forward = Callable[[int, Duplex], Awaitable[None]]


async def serve_port_forward(session: Session, forward: Forward, *, what: str, idle_timeout_s: float) -> None:
    """Serve every (error, data) stream pair the client opens until it closes the session."""
    pairs: dict[str, dict[str, Stream]] = {}
    tasks: set[asyncio.Task[None]] = set()
    runner = asyncio.create_task(session.run())

    async def one(error: Stream, data: Stream, port: int) -> None:
        try:
            await forward(port, StreamIO(data))
        except ProviderError as e:
            with contextlib.suppress(SpdyError, OSError):
                await error.write(f"error forwarding port {port}: {e}".encode())
        finally:
            await StreamIO(data).close()
            await StreamIO(error).close()

    try:
        while True:
            try:
                async with asyncio.timeout(idle_timeout_s if not tasks else None):
                    s = await session.accept()
            except TimeoutError:
                _log.info("port-forward idle; closing", what=what)
                return
            except (SpdyError, EOFError, ConnectionError):
                return
            await s.reply()
            kind, rid, port_s = s.headers.get("streamtype"), s.headers.get("requestid", ""), s.headers.get("port", "")
            if kind not in ("error", "data") or not port_s.isdigit() or not 0 < int(port_s) < 65536:
                s.reset()
                continue
            pair = pairs.setdefault(rid, {})
            if kind in pair:
                s.reset()
                continue
            pair[kind] = s
            if len(pair) == 2:
                del pairs[rid]
                t = asyncio.create_task(one(pair["error"], pair["data"], int(port_s)))
                tasks.add(t)
                t.add_done_callback(tasks.discard)
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await _end(session, runner)


# ---- client side


async def client_remote_command(session: Session, protocol: str, io: ExecIO) -> ExecResult:
    """Run one exec/attach against a kubelet stream endpoint, pumping `io` until it ends."""
    version = _version(protocol)
    runner = asyncio.create_task(session.run())
    tasks: list[asyncio.Task[None]] = []
    try:
        opened: dict[str, Stream] = {}
        # resize before the data streams, with the terminal's first size written at once: the
        # server starts the command when the last stream arrives, and `stty size` or a TUI
        # should see the user's terminal, not 0x0.
        kinds = ["error"]
        if io.tty and version >= 3:
            kinds.append("resize")
        if io.stdin is not None:
            kinds.append("stdin")
        if io.stdout is not None:
            kinds.append("stdout")
        if io.stderr is not None and not io.tty:
            kinds.append("stderr")
        resize_open = False
        for kind in kinds:
            opened[kind] = await session.open_stream({"streamtype": kind}, reply_timeout=STREAM_REPLY_TIMEOUT_S)
            if kind == "resize" and io.resize is not None:
                resize_open = await _first_size(io.resize, opened[kind])
        # The client never writes on the error stream.
        await StreamIO(opened["error"]).close()
        outputs: list[asyncio.Task[None]] = []
        if io.stdin is not None:
            tasks.append(asyncio.create_task(pump(io.stdin, StreamIO(opened["stdin"]))))
        if io.stdout is not None:
            outputs.append(asyncio.create_task(pump(StreamIO(opened["stdout"]), io.stdout, close=False)))
        if "stderr" in opened and io.stderr is not None:
            outputs.append(asyncio.create_task(pump(StreamIO(opened["stderr"]), io.stderr, close=False)))
        if resize_open and io.resize is not None:
            tasks.append(asyncio.create_task(_resize_writer(io.resize, opened["resize"])))
        status = await _read_all(opened["error"])
        # The outcome comes last on the server's side; the output streams end with it.
        await asyncio.gather(*outputs, return_exceptions=True)
        return result_from_status(status, version)
    except (SpdyError, TimeoutError, ConnectionError) as e:
        raise ProviderError(f"stream to the provider failed: {e}", retry=False) from e
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await _end(session, runner)


async def _first_size(queue: asyncio.Queue[TermSize | None], stream: Stream) -> bool:
    """Forward the first terminal size (waiting briefly for it); False when the sizes already ended."""
    try:
        size = await asyncio.wait_for(queue.get(), FIRST_SIZE_WAIT_S)
    except TimeoutError:
        return True
    if size is None:
        await StreamIO(stream).close()
        return False
    await stream.write(json.dumps({"Width": size.width, "Height": size.height}).encode())
    return True


async def _resize_writer(queue: asyncio.Queue[TermSize | None], stream: Stream) -> None:
    while (size := await queue.get()) is not None:
        await stream.write(json.dumps({"Width": size.width, "Height": size.height}).encode())
    await StreamIO(stream).close()


async def client_port_forward(session: Session, port: int, conn: Duplex) -> None:
    """Join `conn` to `port` through a kubelet port-forward endpoint; ProviderError on refusal."""
    runner = asyncio.create_task(session.run())
    headers: Mapping[str, str] = {"port": str(port), "requestid": "0"}
    try:
        error = await session.open_stream({"streamtype": "error", **headers}, reply_timeout=STREAM_REPLY_TIMEOUT_S)
        await StreamIO(error).close()
        data = await session.open_stream({"streamtype": "data", **headers}, reply_timeout=STREAM_REPLY_TIMEOUT_S)
        remote = StreamIO(data)
        upstream = asyncio.create_task(pump(conn, remote))
        downstream = asyncio.create_task(pump(remote, conn))
        failure = await _read_all(error)
        if failure:
            upstream.cancel()
            downstream.cancel()
            await asyncio.gather(upstream, downstream, return_exceptions=True)
            raise ProviderError(failure.decode("utf-8", "replace").strip(), retry=False)
        await asyncio.gather(downstream, return_exceptions=True)
        upstream.cancel()
        await asyncio.gather(upstream, return_exceptions=True)
    except (SpdyError, TimeoutError, ConnectionError) as e:
        raise ProviderError(f"port-forward stream to the provider failed: {e}", retry=False) from e
    finally:
        await _end(session, runner)
