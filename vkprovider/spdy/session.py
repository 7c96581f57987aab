"""A SPDY/3.1 session over one byte stream: stream multiplexing, flow control, PING, GOAWAY, the reader.

API servers open streams for exec/attach/port-forward on our virtual kubelet (we are the SPDY server), and
we open streams on another cluster's API server (we are the client); `frames` says where the protocol
facts come from. Owns: stream ids and states, PING, GOAWAY, SETTINGS_INITIAL_WINDOW_SIZE, the session
windows and the read loop that dispatches every frame. Does not: encode or decode frames (`frames`), the
application's side of a stream (`stream`), HTTP upgrade, TLS, Kubernetes stream semantics (`streamtype`
etc. are plain headers; see `vkprovider.kubelet.streams`), priorities (sent, never acted on), server
push, CREDENTIAL frames.

Invariants: a frame is encoded and written in one synchronous step, so frames never interleave and
header blocks are compressed in wire order; drains share one lock. `run()` raises only SpdyError (or
CancelledError); when it ends every stream sees EOF or the error.

spdystream v0.5.1 facts that shape flow control (file:line in that module):
- It never sends WINDOW_UPDATE or SETTINGS and ignores both: parsed (spdy/read.go:101-116), queued by
  Serve's `default` branch (connection.go:397-401), dropped as "unhandled frame type"
  (connection.go:449-450). WriteData sends one DATA frame per Write, no window check (stream.go:57-80).
- Its receiving side blocks a frame worker on an unbuffered channel until the application reads
  (connection.go:612-620, 481); a full 50-frame queue stops Serve reading (priority.go:79-91): TCP
  back-pressure, head-of-line blocking.
- Any frame it cannot parse ends its read loop for good (connection.go:352-363): unknown control types
  (spdy/read.go:118-124), upper-case or duplicate names (spdy/read.go:224-231), the hop-by-hop headers
  of spdy/types.go:245-258, RST_STREAM status 0, PING id 0. It echoes PINGs of the other parity
  (connection.go:628-641); GOAWAY stops its reading, the connection closes once its streams are gone
  (connection.go:393-396, 643-664). Kubernetes waits 30 s per SYN_REPLY (k8s.io/streaming
  pkg/httpstream/spdy/connection.go:103,141).
A strict SPDY/3.1 sender would stall after 64 KiB against every real peer. So each Session sends
SETTINGS(INITIAL_WINDOW_SIZE) as its first frame, then a probe PING. A peer that sends SETTINGS or
WINDOW_UPDATE does flow control (gpufed does, first thing); if the probe's echo comes first, the peer
ignores windows: we then stop enforcing them on send and sending WINDOW_UPDATEs, and push back the
spdystream way (the read loop waits while a stream holds `initial_window` unread bytes). Until the probe
is answered, sends respect the windows. The session receive window is returned when data is buffered,
not when read: stream windows already bound memory, and an unread stream (a port-forward error stream)
must not starve its siblings.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
from collections.abc import Mapping
from typing import Protocol

from vkprovider.spdy.frames import (
    CANCEL,
    DEFAULT_WINDOW,
    FLAG_FIN,
    FLAG_UNIDIRECTIONAL,
    FLOW_CONTROL_ERROR,
    GOAWAY_INTERNAL_ERROR,
    GOAWAY_OK,
    GOAWAY_PROTOCOL_ERROR,
    INTERNAL_ERROR,
    INVALID_STREAM,
    MAX_FRAME_LENGTH,
    MAX_STREAM_ID,
    MAX_WINDOW,
    PROTOCOL_ERROR,
    REFUSED_STREAM,
    SEND_CHUNK,
    SETTINGS_INITIAL_WINDOW_SIZE,
    STREAM_ALREADY_CLOSED,
    STREAM_IN_USE,
    SYN_STREAM,
    ByteReader,
    DataFrame,
    Frame,
    FrameReader,
    GoAwayFrame,
    HeaderBlockError,
    HeaderCompressor,
    HeadersFrame,
    PingFrame,
    RstStreamFrame,
    SessionClosedError,
    SettingsFrame,
    SpdyError,
    SynReplyFrame,
    SynStreamFrame,
    UnknownControlFrame,
    WindowUpdateFrame,
    encode_frame,
)
from vkprovider.spdy.stream import Signal, Stream

#: Streams the peer opened that accept() has not taken yet; more are refused.
MAX_PENDING_ACCEPTS = 1024
#: Closed stream ids remembered to tell late frames (ignored) from bogus ones (INVALID_STREAM).
_GONE_MEMORY = 1024


class ByteWriter(Protocol):
    def write(self, data: bytes) -> None: ...
    async def drain(self) -> None: ...
    def close(self) -> None: ...


class Session:
    """A SPDY/3.1 session over one connection; `client` picks odd stream/ping ids (server: even)."""

    def __init__(
        self,
        reader: ByteReader,
        writer: ByteWriter,
        *,
        client: bool,
        max_frame_bytes: int = MAX_FRAME_LENGTH,
        initial_window: int = DEFAULT_WINDOW,
        peer_flow_control: bool | None = None,
    ) -> None:
        """`initial_window`: receive window per stream (64 KiB … 2^31-1), announced in SETTINGS.
        `max_frame_bytes`: largest frame payload accepted. `peer_flow_control`: None probes (see module doc)."""
        if not DEFAULT_WINDOW <= initial_window <= MAX_WINDOW:
            raise ValueError(f"initial_window must be within [{DEFAULT_WINDOW}, {MAX_WINDOW}]")
        if not 16 <= max_frame_bytes <= MAX_FRAME_LENGTH:
            raise ValueError(f"max_frame_bytes must be within [16, {MAX_FRAME_LENGTH}]")
        self.client = client
        self._frames = FrameReader(reader, max_frame_bytes)
        self._w = writer
        self._compressor = HeaderCompressor()
        self._initial_window = initial_window
        self._peer_initial_window = DEFAULT_WINDOW
        self._send_window = DEFAULT_WINDOW  # session level, granted by the peer
        self._recv_window = DEFAULT_WINDOW  # session level, granted to the peer
        self._recv_unacked = 0
        self._peer_fc = peer_flow_control
        self._probe_id: int | None = None
        self._streams: dict[int, Stream] = {}
        self._gone: collections.OrderedDict[int, bool] = collections.OrderedDict()  # id -> peer had sent FIN
        self._pending: collections.deque[Stream] = collections.deque()
        self._accept_wake = Signal()
        self._parity = 1 if client else 0
        self._next_id = 1 if client else 2
        self._next_ping = self._next_id
        self._last_peer_id = 0
        self._pings: dict[int, asyncio.Future[None]] = {}
        self._preface_sent = self._goaway_sent = self._goaway_received = self._ended = self._running = False
        self._write_failed = False
        self._drain_lock = asyncio.Lock()
        self.error: SpdyError | None = None
        self.closed = asyncio.Event()

    @property
    def peer_flow_control(self) -> bool | None:
        """True: the peer does SPDY/3.1 flow control; False: it ignores windows; None: not known yet."""
        return self._peer_fc

    @property
    def goaway_received(self) -> bool:
        return self._goaway_received

    # -- public API --

    async def run(self) -> None:
        """Read and dispatch frames until EOF, a GOAWAY with no streams left, close() or a protocol error."""
        if self._running:
            raise RuntimeError("Session.run() is already running")
        self._running = True
        reading = asyncio.create_task(self._read_loop(), name=f"spdy-read-{'client' if self.client else 'server'}")
        closing = asyncio.create_task(self.closed.wait())
        error: SpdyError | None = None
        try:
            await asyncio.wait((reading, closing), return_when=asyncio.FIRST_COMPLETED)
        finally:  # synchronous up to _finish, so a second cancellation cannot skip it
            closing.cancel()
            if reading.done() and not reading.cancelled() and not self._ended:  # ended: closed cleanly first
                error = reading.result()
            reading.cancel()
            if error is None:
                self._send_goaway(GOAWAY_OK)
            self._finish(error)
            await asyncio.wait((reading, closing))
        if error is not None:
            raise error

    async def accept(self) -> Stream:
        """The next stream the peer opened; SessionClosedError once no more can come."""
        while not self._pending:
            if self._ended or self._goaway_received or self._goaway_sent:
                raise self._closed_error()
            await self._accept_wake.wait()
        return self._pending.popleft()

    async def open_stream(
        self, headers: Mapping[str, str], *, fin: bool = False, reply_timeout: float | None = None, priority: int = 0
    ) -> Stream:
        """Send SYN_STREAM; with `reply_timeout`, wait that long for SYN_REPLY (else reset, TimeoutError)."""
        if self._ended or self._goaway_received or self._goaway_sent:
            raise self._closed_error()
        sid = self._next_id
        if sid > MAX_STREAM_ID:
            raise SpdyError("stream ids exhausted; open a new session")
        frame = encode_frame(SynStreamFrame(sid, headers, FLAG_FIN if fin else 0, priority=priority), self._compressor)
        self._next_id += 2
        stream = self._streams[sid] = Stream(self, sid, incoming=False, headers={})
        stream._local_closed = fin
        self._write(frame)
        await self._drain()
        if reply_timeout is not None:
            try:
                async with asyncio.timeout(reply_timeout):
                    await stream.wait_reply()
            except TimeoutError:
                stream.reset(CANCEL)
                raise TimeoutError(f"no SYN_REPLY on stream {sid} within {reply_timeout} s") from None
        return stream

    async def ping(self, timeout: float) -> float:  # noqa: ASYNC109 -- the session's API; kubelet pings carry one
        """Round-trip time of a PING in seconds; TimeoutError after `timeout`."""
        if self._ended:
            raise self._closed_error()
        loop = asyncio.get_running_loop()
        pid = self._new_ping_id()
        self._pings[pid] = done = loop.create_future()
        start = loop.time()
        try:
            self._send(PingFrame(pid))
            await self._drain()
            async with asyncio.timeout(timeout):
                await done
        finally:
            self._pings.pop(pid, None)
        return loop.time() - start

    async def close(self, status: int = GOAWAY_OK) -> None:
        """GOAWAY with `status`, then close the writer; streams see EOF. Idempotent."""
        self._send_goaway(status)
        self._finish(None)

    # -- sending --

    def _write(self, data: bytes) -> None:
        if self._ended:
            raise self._closed_error()
        if self._write_failed:
            return  # the connection takes no more; _drain() tells the application
        if not self._preface_sent:
            self._preface_sent = True
            preface = encode_frame(SettingsFrame(((0, SETTINGS_INITIAL_WINDOW_SIZE, self._initial_window),)))
            if self._initial_window > DEFAULT_WINDOW:  # the session window (always 64 KiB at first) grows to match
                preface += encode_frame(WindowUpdateFrame(0, self._initial_window - DEFAULT_WINDOW))
                self._recv_window = self._initial_window
            if self._peer_fc is None:
                self._probe_id = self._new_ping_id()
                preface += encode_frame(PingFrame(self._probe_id))
            self._w.write(preface)
        self._w.write(data)

    def _send(self, frame: Frame) -> None:
        self._write(encode_frame(frame, self._compressor))

    async def _drain(self) -> None:
        if self._ended:
            return  # the writer is closed; whatever was written is flushed by the transport
        if self._write_failed:
            raise SessionClosedError("connection lost")
        async with self._drain_lock:
            try:
                await self._w.drain()
            except OSError as e:
                self._write_failed = True
                if not self._ended:
                    raise SessionClosedError(f"connection lost: {e}") from e

    async def _drain_replies(self) -> None:
        with contextlib.suppress(SessionClosedError):  # the peer may have stopped reading: frames remain to read
            await self._drain()

    def _send_goaway(self, status: int) -> None:
        if not self._goaway_sent and not self._ended:
            self._goaway_sent = True
            with contextlib.suppress(OSError, RuntimeError):
                self._send(GoAwayFrame(self._last_peer_id, status))

    def _send_budget(self, stream: Stream) -> int:
        if self._peer_fc is False:
            return SEND_CHUNK
        return min(stream._send_window, self._send_window)

    def _grants_windows(self, stream: Stream) -> bool:
        return self._peer_fc is not False and not stream._remote_closed and stream.id in self._streams

    def _new_ping_id(self) -> int:
        pid = self._next_ping
        self._next_ping = pid + 2 if pid + 2 <= MAX_STREAM_ID else 2 - self._parity
        return pid

    def _reset_stream(self, stream: Stream, status: int) -> None:
        self._send(RstStreamFrame(stream.id, status))
        stream._mark_reset(status, by_peer=False)

    # -- state --

    def _closed_error(self) -> SessionClosedError:
        if self.error is not None:
            err = SessionClosedError(f"session failed: {self.error}", self.error.status)
            err.__cause__ = self.error
            return err
        return SessionClosedError("session closed")

    def _forget(self, stream: Stream, *, fin: bool) -> None:
        if self._streams.pop(stream.id, None) is not None:
            self._gone[stream.id] = fin
            while len(self._gone) > _GONE_MEMORY:
                self._gone.popitem(last=False)
        if self._goaway_received and not self._streams:
            self._finish(None)  # the peer is going away and nothing is left to finish

    def _wake_all(self) -> None:
        for stream in self._streams.values():
            stream._wake.notify()

    def _finish(self, error: SpdyError | None) -> None:
        if self._ended:
            return
        self._ended = True
        self.error = error
        with contextlib.suppress(OSError, RuntimeError):
            self._w.close()
        self._wake_all()
        self._streams.clear()
        self._accept_wake.notify()
        for fut in self._pings.values():
            if not fut.done():
                fut.set_exception(self._closed_error())
        self.closed.set()

    # -- receiving --

    async def _read_loop(self) -> SpdyError | None:
        if self._ended:
            return None
        try:
            if not self._preface_sent:
                self._write(b"")
                await self._drain_replies()
            while True:
                try:
                    frame = await self._frames.read_frame()
                except HeaderBlockError as e:
                    self._on_bad_header_block(e)
                    await self._drain_replies()
                    continue
                if frame is None:
                    return None
                await self._dispatch(frame)
                await self._drain_replies()
        except SpdyError as e:
            self._send_goaway(GOAWAY_PROTOCOL_ERROR)
            return e
        except OSError as e:
            return SessionClosedError(f"connection lost: {e}")
        except Exception as e:  # a bug here must still end the session cleanly
            self._send_goaway(GOAWAY_INTERNAL_ERROR)
            err = SpdyError(f"internal error: {e!r}", INTERNAL_ERROR)
            err.__cause__ = e
            return err

    async def _dispatch(self, frame: Frame) -> None:
        match frame:
            case DataFrame():
                await self._on_data(frame)
            case SynStreamFrame():
                self._on_syn_stream(frame)
            case SynReplyFrame() | HeadersFrame():
                self._on_reply_or_headers(frame)
            case RstStreamFrame(sid, status):
                if (stream := self._streams.get(sid)) is not None:
                    stream._mark_reset(status, by_peer=True)  # never answer a RST with a RST
            case SettingsFrame():
                self._on_settings(frame)
            case PingFrame(pid):
                self._on_ping(pid)
            case GoAwayFrame(last_good):
                self._goaway_received = True
                for stream in list(self._streams.values()):
                    if not stream.incoming and stream.id > last_good:
                        stream._mark_reset(REFUSED_STREAM, by_peer=True)
                self._accept_wake.notify()
                if not self._streams:
                    self._finish(None)
            case WindowUpdateFrame():
                self._on_window_update(frame)
            case UnknownControlFrame():
                pass  # spec §2.2.1: unknown control frames are ignored

    def _check_new_peer_id(self, sid: int) -> None:
        if sid == 0 or sid % 2 == self._parity:
            want = "even" if self.client else "odd"
            raise SpdyError(f"SYN_STREAM with stream id {sid}: the peer must open {want} ids")
        if sid <= self._last_peer_id:
            raise SpdyError(f"SYN_STREAM with stream id {sid}, not above the previous {self._last_peer_id}")
        self._last_peer_id = sid

    def _on_syn_stream(self, f: SynStreamFrame) -> None:
        if self._goaway_sent:
            return  # after our GOAWAY new streams are ignored
        self._check_new_peer_id(f.stream_id)
        if self._goaway_received or len(self._pending) >= MAX_PENDING_ACCEPTS:
            self._send(RstStreamFrame(f.stream_id, REFUSED_STREAM))
            return
        stream = self._streams[f.stream_id] = Stream(self, f.stream_id, incoming=True, headers=dict(f.headers))
        if f.flags & FLAG_UNIDIRECTIONAL:
            stream._local_fin()
        if f.flags & FLAG_FIN:
            stream._remote_fin()
        self._pending.append(stream)
        self._accept_wake.notify()

    def _on_bad_header_block(self, e: HeaderBlockError) -> None:
        if e.frame_type == SYN_STREAM:
            if self._goaway_sent:
                return
            self._check_new_peer_id(e.stream_id)
            self._send(RstStreamFrame(e.stream_id, PROTOCOL_ERROR))
        elif (stream := self._streams.get(e.stream_id)) is not None:
            self._reset_stream(stream, PROTOCOL_ERROR)

    def _on_reply_or_headers(self, f: SynReplyFrame | HeadersFrame) -> None:
        stream = self._streams.get(f.stream_id)
        if stream is None:
            self._unknown_stream(f.stream_id, data=False)
        elif isinstance(f, SynReplyFrame) and (stream.incoming or stream._replied):
            self._reset_stream(stream, PROTOCOL_ERROR if stream.incoming else STREAM_IN_USE)
        elif stream._remote_closed:
            self._reset_stream(stream, STREAM_ALREADY_CLOSED)
        else:
            if isinstance(f, SynReplyFrame):
                stream.headers, stream._replied = dict(f.headers), True
            else:
                stream.headers.update(f.headers)
            if f.flags & FLAG_FIN:
                stream._remote_fin()
            stream._wake.notify()

    def _unknown_stream(self, sid: int, *, data: bool) -> None:
        if sid == 0:
            raise SpdyError("stream frame on stream 0")
        if sid in self._gone:
            if data and self._gone[sid]:  # the peer had finished it: data after FIN
                self._send(RstStreamFrame(sid, STREAM_ALREADY_CLOSED))
            return  # a reset stream: frames in flight are expected
        self._send(RstStreamFrame(sid, INVALID_STREAM))

    async def _on_data(self, f: DataFrame) -> None:
        n = len(f.data)
        if f.stream_id == 0:
            raise SpdyError("DATA frame on stream 0")
        if self._peer_fc is True and n > self._recv_window:
            raise SpdyError(f"peer overran the session window ({n} > {self._recv_window} bytes)")
        self._recv_window -= n
        self._recv_unacked += n
        if self._recv_unacked >= DEFAULT_WINDOW // 2:  # returned on receipt: see module doc
            if self._peer_fc is not False:
                self._send(WindowUpdateFrame(0, self._recv_unacked))
            self._recv_window += self._recv_unacked
            self._recv_unacked = 0
        stream = self._streams.get(f.stream_id)
        if stream is None:
            self._unknown_stream(f.stream_id, data=True)
            return
        if stream._remote_closed:
            self._reset_stream(stream, STREAM_ALREADY_CLOSED)
            return
        if self._peer_fc is True and n > stream._recv_window:
            self._reset_stream(stream, FLOW_CONTROL_ERROR)
            return
        stream._recv_window -= n
        stream._buf += f.data
        if f.flags & FLAG_FIN:
            stream._remote_fin()
        stream._wake.notify()
        if self._peer_fc is not True:  # it ignores our windows: stop reading until the application catches up
            while len(stream._buf) >= self._initial_window and stream._reset is None and not self._ended:
                await stream._wake.wait()

    def _on_settings(self, f: SettingsFrame) -> None:
        if self._peer_fc is None:
            self._peer_fc = True
        for _flags, sid, value in f.entries:
            if sid == SETTINGS_INITIAL_WINDOW_SIZE:
                if value > MAX_WINDOW:
                    raise SpdyError(f"SETTINGS_INITIAL_WINDOW_SIZE of {value} exceeds 2^31-1")
                delta, self._peer_initial_window = value - self._peer_initial_window, value
                for stream in self._streams.values():
                    stream._send_window += delta
        self._wake_all()

    def _on_ping(self, pid: int) -> None:
        if pid % 2 != self._parity:
            self._send(PingFrame(pid))  # the peer's ping: echo it
            return
        if pid == self._probe_id:
            self._probe_id = None
            if self._peer_fc is None:
                self._peer_fc = False
                self._wake_all()
        if (fut := self._pings.get(pid)) is not None and not fut.done():
            fut.set_result(None)

    def _on_window_update(self, f: WindowUpdateFrame) -> None:
        if self._peer_fc is None:
            self._peer_fc = True
        if f.stream_id == 0:
            if f.delta == 0 or self._send_window + f.delta > MAX_WINDOW:
                raise SpdyError(f"session WINDOW_UPDATE of {f.delta} is invalid or overflows the window")
            self._send_window += f.delta
            self._wake_all()
        elif (stream := self._streams.get(f.stream_id)) is not None:
            if f.delta == 0:
                self._reset_stream(stream, PROTOCOL_ERROR)
            elif stream._send_window + f.delta > MAX_WINDOW:
                self._reset_stream(stream, FLOW_CONTROL_ERROR)
            else:
                stream._send_window += f.delta
                stream._wake.notify()
