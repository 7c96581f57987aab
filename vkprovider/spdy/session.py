"""SPDY/3.1 framing, header compression, flow control and stream multiplexing over one byte stream.

The kubelet API speaks SPDY/3.1 after an HTTP/1.1 `Upgrade: SPDY/3.1`: API servers open streams for
exec/attach/port-forward on our virtual kubelet (we are the SPDY server), and we open streams on
another cluster's API server (we are the client). No maintained Python implementation exists
(spdy-py 0.2.0 is abandoned, python-spdylay is dead, the kubernetes Python clients never implemented
SPDY), so this is written from the SPDY Protocol Draft 3.1 (M. Belshe, R. Peon;
draft-mbelshe-httpbis-spdy-00 / chromium.org "SPDY Protocol - Draft 3.1"), with facts checked in
github.com/moby/spdystream v0.5.1 and its `spdy` framer (from golang.org/x/net/spdy), which Kubernetes
uses. No code was copied; the header dictionary is the spec's constant, verified byte for byte.

Owns: frames, the zlib header contexts (one per direction, SPDY/3 dictionary, Z_SYNC_FLUSH per block),
stream ids and states, PING, GOAWAY, SETTINGS_INITIAL_WINDOW_SIZE, stream and session windows. Does not:
HTTP upgrade, TLS, Kubernetes stream semantics (`streamtype` etc. are plain headers; see `streams`),
priorities (sent, never acted on), server push, CREDENTIAL frames.

Invariants: a frame is encoded and written in one synchronous step, so frames never interleave and
header blocks are compressed in wire order; drains share one lock. `run()` raises only SpdyError (or
CancelledError); when it ends every stream sees EOF or the error. Headers: sent lower-case, non-empty,
NUL-free and never hop-by-hop (strict); received names are lower-cased (lenient), duplicate or empty
names are a stream PROTOCOL_ERROR, NUL-separated values are joined with ", " (Kubernetes sends one).

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
import struct
import zlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol

VERSION = 3
DEFAULT_WINDOW = 64 * 1024
MAX_WINDOW = 2**31 - 1
MAX_STREAM_ID = 2**31 - 1
MAX_FRAME_LENGTH = 2**24 - 1
#: Decompressed header block and header count limits (spdystream: 1 MiB per field, 1000 headers).
MAX_HEADER_BLOCK = 1 << 20
MAX_HEADERS = 1000
#: Largest DATA payload we send in one frame.
SEND_CHUNK = 16 * 1024
#: Streams the peer opened that accept() has not taken yet; more are refused.
MAX_PENDING_ACCEPTS = 1024
#: Closed stream ids remembered to tell late frames (ignored) from bogus ones (INVALID_STREAM).
_GONE_MEMORY = 1024

SYN_STREAM, SYN_REPLY, RST_STREAM, SETTINGS, PING, GOAWAY, HEADERS, WINDOW_UPDATE = 1, 2, 3, 4, 6, 7, 8, 9
FLAG_FIN = 0x01
FLAG_UNIDIRECTIONAL = 0x02
SETTINGS_INITIAL_WINDOW_SIZE = 7
# RST_STREAM status codes.
PROTOCOL_ERROR, INVALID_STREAM, REFUSED_STREAM, UNSUPPORTED_VERSION, CANCEL = 1, 2, 3, 4, 5
INTERNAL_ERROR, FLOW_CONTROL_ERROR, STREAM_IN_USE, STREAM_ALREADY_CLOSED, FRAME_TOO_LARGE = 6, 7, 8, 9, 11
# GOAWAY status codes.
GOAWAY_OK, GOAWAY_PROTOCOL_ERROR, GOAWAY_INTERNAL_ERROR = 0, 1, 2

_RST_NAMES = {
    PROTOCOL_ERROR: "PROTOCOL_ERROR", INVALID_STREAM: "INVALID_STREAM", REFUSED_STREAM: "REFUSED_STREAM",
    UNSUPPORTED_VERSION: "UNSUPPORTED_VERSION", CANCEL: "CANCEL", INTERNAL_ERROR: "INTERNAL_ERROR",
    FLOW_CONTROL_ERROR: "FLOW_CONTROL_ERROR", STREAM_IN_USE: "STREAM_IN_USE",
    STREAM_ALREADY_CLOSED: "STREAM_ALREADY_CLOSED", FRAME_TOO_LARGE: "FRAME_TOO_LARGE",
}  # fmt: skip
#: Hop-by-hop headers spdystream refuses (spdy/types.go invalidReqHeaders); we never send them.
_FORBIDDEN_HEADERS = frozenset({"connection", "host", "keep-alive", "proxy-connection", "transfer-encoding"})


def _length_prefixed(words: str) -> bytes:
    return b"".join(struct.pack(">I", len(w)) + w.encode() for w in words.split(","))


_DICT_WORDS = (
    "options,head,post,put,delete,trace,accept,accept-charset,accept-encoding,accept-language,"
    "accept-ranges,age,allow,authorization,cache-control,connection,content-base,content-encoding,"
    "content-language,content-length,content-location,content-md5,content-range,content-type,date,etag,"
    "expect,expires,from,host,if-match,if-modified-since,if-none-match,if-range,if-unmodified-since,"
    "last-modified,location,max-forwards,pragma,proxy-authenticate,proxy-authorization,range,referer,"
    "retry-after,server,te,trailer,transfer-encoding,upgrade,user-agent,vary,via,warning,"
    "www-authenticate,method,get,status,200 OK,version,HTTP/1.1,url,public,set-cookie,keep-alive,origin"
)
_DICT_TAIL = (
    "100101201202205206300302303304305306307402405406407408409410411412413414415416417502504505"
    "203 Non-Authoritative Information204 No Content301 Moved Permanently400 Bad Request401 Unauthorized"
    "403 Forbidden404 Not Found500 Internal Server Error501 Not Implemented503 Service Unavailable"
    "Jan Feb Mar Apr May Jun Jul Aug Sept Oct Nov Dec 00:00:00 Mon, Tue, Wed, Thu, Fri, Sat, Sun, GMT"
    "chunked,text/html,image/png,image/jpg,image/gif,application/xml,application/xhtml+xml,text/plain,"
    "text/javascript,publicprivatemax-age=gzip,deflate,sdchcharset=utf-8charset=iso-8859-1,utf-,*,enq=0."
)
#: The SPDY/3 header compression dictionary (spec §2.6.10.1; 1423 bytes, = spdystream's headerDictionary):
#: 65 length-prefixed words, then a run of status codes, phrases and common values.
HEADER_DICTIONARY = _length_prefixed(_DICT_WORDS) + _DICT_TAIL.encode()


class ByteReader(Protocol):
    async def readexactly(self, n: int) -> bytes: ...


class ByteWriter(Protocol):
    def write(self, data: bytes) -> None: ...
    async def drain(self) -> None: ...
    def close(self) -> None: ...


class SpdyError(Exception):
    """A SPDY protocol error; `status` is the GOAWAY or RST_STREAM status it maps to."""

    def __init__(self, message: str, status: int = PROTOCOL_ERROR) -> None:
        super().__init__(message)
        self.status = status


class SessionClosedError(SpdyError):
    """The session ended (EOF, GOAWAY, close() or an error, chained as __cause__)."""


class StreamReset(SpdyError):  # noqa: N818 -- the name the callers know (spdystream: ErrReset)
    """The stream was reset by the peer (RST_STREAM, or refused by GOAWAY) or by us."""

    def __init__(self, stream_id: int, status: int, *, by_peer: bool) -> None:
        who = "the peer" if by_peer else "us"
        super().__init__(f"stream {stream_id} reset by {who}: {_RST_NAMES.get(status, status)}", status)
        self.stream_id = stream_id
        self.by_peer = by_peer


class HeaderBlockError(SpdyError):
    """A header block decompressed fine but its content is invalid: a stream error, not a session one."""

    def __init__(self, message: str, stream_id: int, frame_type: int) -> None:
        super().__init__(message)
        self.stream_id = stream_id
        self.frame_type = frame_type


# --- frames ---------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class DataFrame:
    stream_id: int
    data: bytes
    flags: int = 0


@dataclass(frozen=True)
class SynStreamFrame:
    stream_id: int
    headers: Mapping[str, str]
    flags: int = 0
    associated_id: int = 0
    priority: int = 0
    slot: int = 0


@dataclass(frozen=True)
class SynReplyFrame:
    stream_id: int
    headers: Mapping[str, str]
    flags: int = 0


@dataclass(frozen=True)
class RstStreamFrame:
    stream_id: int
    status: int


@dataclass(frozen=True)
class SettingsFrame:
    entries: tuple[tuple[int, int, int], ...] = ()  # (flags, id, value)
    flags: int = 0


@dataclass(frozen=True)
class PingFrame:
    ping_id: int


@dataclass(frozen=True)
class GoAwayFrame:
    last_good_id: int
    status: int = GOAWAY_OK


@dataclass(frozen=True)
class HeadersFrame:
    stream_id: int
    headers: Mapping[str, str]
    flags: int = 0


@dataclass(frozen=True)
class WindowUpdateFrame:
    stream_id: int
    delta: int


@dataclass(frozen=True)
class UnknownControlFrame:
    frame_type: int
    flags: int
    payload: bytes


Frame = (
    DataFrame | SynStreamFrame | SynReplyFrame | RstStreamFrame | SettingsFrame | PingFrame | GoAwayFrame
    | HeadersFrame | WindowUpdateFrame | UnknownControlFrame
)  # fmt: skip


def encode_header_block(headers: Mapping[str, str]) -> bytes:
    """The uncompressed SPDY/3 name/value block (32-bit counts and lengths); ValueError if not sendable."""
    if len(headers) > MAX_HEADERS:
        raise ValueError(f"{len(headers)} headers: at most {MAX_HEADERS} may be sent")
    parts = [struct.pack(">I", len(headers))]
    for name, value in headers.items():
        if not name or name != name.lower() or "\x00" in name:
            raise ValueError(f"header name {name!r}: SPDY/3 needs non-empty lower-case names without NUL")
        if name in _FORBIDDEN_HEADERS:
            raise ValueError(f"header {name!r} is hop-by-hop; spdystream drops the session on it")
        if "\x00" in value:
            raise ValueError(f"header {name!r}: a NUL in a value would split it into several values")
        try:
            n, v = name.encode(), value.encode()
        except UnicodeEncodeError as e:
            raise ValueError(f"header {name!r} cannot be sent as UTF-8: {e.reason}") from None
        parts += [struct.pack(">I", len(n)), n, struct.pack(">I", len(v)), v]
    block = b"".join(parts)
    if len(block) > MAX_HEADER_BLOCK:
        raise ValueError(f"header block of {len(block)} bytes exceeds {MAX_HEADER_BLOCK}")
    return block


def decode_header_block(raw: bytes) -> dict[str, str]:
    """Parse an uncompressed name/value block; ValueError with a clear message if it is invalid."""
    pos = 0

    def take(n: int) -> bytes:
        nonlocal pos
        if pos + n > len(raw):
            raise ValueError("truncated header block")
        pos += n
        return raw[pos - n : pos]

    count = int.from_bytes(take(4))
    if count > MAX_HEADERS:
        raise ValueError(f"header block announces {count} headers (limit {MAX_HEADERS})")
    out: dict[str, str] = {}
    for _ in range(count):
        try:
            name = take(int.from_bytes(take(4))).decode().lower()
            value = take(int.from_bytes(take(4))).decode()
        except UnicodeDecodeError as e:
            raise ValueError(f"header name or value is not UTF-8: {e}") from None
        if not name:
            raise ValueError("empty header name")
        if name in out:
            raise ValueError(f"duplicate header {name!r}")
        out[name] = value.replace("\x00", ", ")
    if pos != len(raw):
        raise ValueError(f"{len(raw) - pos} stray bytes after the last header")
    return out


class HeaderCompressor:
    """The sending zlib context: one per session, dictionary-primed, each block ends with Z_SYNC_FLUSH."""

    def __init__(self) -> None:
        self._z = zlib.compressobj(level=9, zdict=HEADER_DICTIONARY)

    def compress(self, headers: Mapping[str, str]) -> bytes:
        raw = encode_header_block(headers)  # validates before touching the shared context
        return self._z.compress(raw) + self._z.flush(zlib.Z_SYNC_FLUSH)


class HeaderDecompressor:
    """The receiving zlib context: one per session; a zlib error desynchronises it for good."""

    def __init__(self) -> None:
        self._z = zlib.decompressobj(zdict=HEADER_DICTIONARY)

    def decompress(self, block: bytes) -> bytes:
        try:
            raw = self._z.decompress(block, MAX_HEADER_BLOCK + 1)
        except zlib.error as e:
            raise SpdyError(f"header block does not decompress: {e}") from None
        if len(raw) > MAX_HEADER_BLOCK or self._z.unconsumed_tail:
            raise SpdyError(f"header block decompresses to more than {MAX_HEADER_BLOCK} bytes")
        if self._z.unused_data:
            raise SpdyError("header block continues past the end of the zlib stream")
        return raw


def _control(frame_type: int, flags: int, payload: bytes) -> bytes:
    if len(payload) > MAX_FRAME_LENGTH:
        raise ValueError(f"control frame payload of {len(payload)} bytes is too long")
    return struct.pack(">HHI", 0x8000 | VERSION, frame_type, flags << 24 | len(payload)) + payload


def encode_frame(frame: Frame, compressor: HeaderCompressor | None = None) -> bytes:
    """Wire bytes of `frame`; frames with headers need the session's compressor (and advance it)."""

    def block(headers: Mapping[str, str]) -> bytes:
        if compressor is None:
            raise ValueError(f"{type(frame).__name__} needs a HeaderCompressor")
        return compressor.compress(headers)

    match frame:
        case DataFrame(sid, data, flags):
            if len(data) > MAX_FRAME_LENGTH:
                raise ValueError(f"DATA payload of {len(data)} bytes is too long")
            return struct.pack(">II", sid & MAX_STREAM_ID, flags << 24 | len(data)) + data
        case SynStreamFrame(sid, headers, flags, assoc, priority, slot):
            fixed = struct.pack(">IIBB", sid & MAX_STREAM_ID, assoc & MAX_STREAM_ID, (priority & 7) << 5, slot)
            return _control(SYN_STREAM, flags, fixed + block(headers))
        case SynReplyFrame(sid, headers, flags):
            return _control(SYN_REPLY, flags, struct.pack(">I", sid & MAX_STREAM_ID) + block(headers))
        case HeadersFrame(sid, headers, flags):
            return _control(HEADERS, flags, struct.pack(">I", sid & MAX_STREAM_ID) + block(headers))
        case RstStreamFrame(sid, status):
            return _control(RST_STREAM, 0, struct.pack(">II", sid & MAX_STREAM_ID, status))
        case SettingsFrame(entries, flags):
            body = b"".join(struct.pack(">II", (f & 0xFF) << 24 | (i & 0xFFFFFF), v) for f, i, v in entries)
            return _control(SETTINGS, flags, struct.pack(">I", len(entries)) + body)
        case PingFrame(ping_id):
            return _control(PING, 0, struct.pack(">I", ping_id))
        case GoAwayFrame(last_good, status):
            return _control(GOAWAY, 0, struct.pack(">II", last_good & MAX_STREAM_ID, status))
        case WindowUpdateFrame(sid, delta):
            return _control(WINDOW_UPDATE, 0, struct.pack(">II", sid & MAX_STREAM_ID, delta & MAX_WINDOW))
        case UnknownControlFrame(frame_type, flags, payload):
            return _control(frame_type, flags, payload)


class FrameReader:
    """Decodes frames from a ByteReader with the session's receiving header context."""

    def __init__(self, reader: ByteReader, max_frame_bytes: int = MAX_FRAME_LENGTH) -> None:
        self._r = reader
        self.max_frame_bytes = max_frame_bytes
        self._headers = HeaderDecompressor()

    async def read_frame(self) -> Frame | None:
        """The next frame, or None at EOF between frames. Raises SpdyError (HeaderBlockError: stream error)."""
        try:
            head = await self._r.readexactly(8)
        except asyncio.IncompleteReadError as e:
            if e.partial:
                raise SpdyError("connection closed inside a frame header") from None
            return None
        word, flags_length = struct.unpack(">II", head)
        flags, length = flags_length >> 24, flags_length & 0xFFFFFF
        if word & 0x8000_0000 and (version := word >> 16 & 0x7FFF) != VERSION:
            raise SpdyError(f"control frame of SPDY version {version}; only {VERSION} is spoken", UNSUPPORTED_VERSION)
        if length > self.max_frame_bytes:
            raise SpdyError(f"frame of {length} bytes exceeds the limit of {self.max_frame_bytes}", FRAME_TOO_LARGE)
        try:
            payload = await self._r.readexactly(length)
        except asyncio.IncompleteReadError as e:
            raise SpdyError(f"connection closed after {len(e.partial)} of a frame's {length} bytes") from None
        if not word & 0x8000_0000:
            return DataFrame(word & MAX_STREAM_ID, payload, flags)
        return self._control(word & 0xFFFF, flags, payload)

    def _control(self, ftype: int, flags: int, p: bytes) -> Frame:
        exact = {RST_STREAM: 8, PING: 4, GOAWAY: 8, WINDOW_UPDATE: 8}.get(ftype)
        minimum = {SYN_STREAM: 10, SYN_REPLY: 4, HEADERS: 4, SETTINGS: 4}.get(ftype, 0)
        if (exact is not None and len(p) != exact) or len(p) < minimum:
            raise SpdyError(f"control frame type {ftype} with a malformed length of {len(p)} bytes")
        match ftype:
            case 1:  # SYN_STREAM
                sid, assoc, priority, slot = struct.unpack_from(">IIBB", p)
                sid &= MAX_STREAM_ID
                headers = self._header_block(p[10:], sid, ftype)
                return SynStreamFrame(sid, headers, flags, assoc & MAX_STREAM_ID, priority >> 5, slot)
            case 2 | 8:  # SYN_REPLY, HEADERS
                sid = int.from_bytes(p[:4]) & MAX_STREAM_ID
                headers = self._header_block(p[4:], sid, ftype)
                return (SynReplyFrame if ftype == SYN_REPLY else HeadersFrame)(sid, headers, flags)
            case 3:  # RST_STREAM
                sid, status = struct.unpack(">II", p)
                return RstStreamFrame(sid & MAX_STREAM_ID, status)
            case 4:  # SETTINGS
                (count,) = struct.unpack_from(">I", p)
                if len(p) != 4 + 8 * count:
                    raise SpdyError(f"SETTINGS announces {count} entries in {len(p) - 4} bytes")
                pairs = struct.iter_unpack(">II", p[4:])
                return SettingsFrame(tuple((fi >> 24, fi & 0xFFFFFF, v) for fi, v in pairs), flags)
            case 6:  # PING
                return PingFrame(int.from_bytes(p))
            case 7:  # GOAWAY
                last_good, status = struct.unpack(">II", p)
                return GoAwayFrame(last_good & MAX_STREAM_ID, status)
            case 9:  # WINDOW_UPDATE
                sid, delta = struct.unpack(">II", p)
                return WindowUpdateFrame(sid & MAX_STREAM_ID, delta & MAX_WINDOW)
        return UnknownControlFrame(ftype, flags, p)

    def _header_block(self, block: bytes, sid: int, ftype: int) -> dict[str, str]:
        raw = self._headers.decompress(block)  # always, so the shared context stays in step
        try:
            return decode_header_block(raw)
        except ValueError as e:
            raise HeaderBlockError(f"stream {sid}: {e}", sid, ftype) from None


# --- session --------------------------------------------------------------------------------------------------


class _Signal:
    """Broadcast wake-up: waiters re-check their condition after every notify()."""

    def __init__(self) -> None:
        self._event = asyncio.Event()

    def notify(self) -> None:
        self._event.set()
        self._event = asyncio.Event()

    async def wait(self) -> None:
        await self._event.wait()


class Stream:
    """One SPDY stream. `headers`: the SYN_STREAM's (incoming) or the SYN_REPLY's (outgoing, once received)."""

    def __init__(self, session: Session, stream_id: int, *, incoming: bool, headers: dict[str, str]) -> None:
        self.id = stream_id
        self.incoming = incoming
        self.headers = headers
        self._s = session
        self._buf = bytearray()
        self._replied = False  # incoming: we sent SYN_REPLY; outgoing: we received it
        self._local_closed = False
        self._remote_closed = False
        self._reset: tuple[int, bool] | None = None  # (status, by the peer)
        self._send_window = session._peer_initial_window
        self._recv_window = session._initial_window  # what the peer may still send
        self._unacked = 0  # read by the application, not yet returned with WINDOW_UPDATE
        self._wake = _Signal()

    @property
    def local_closed(self) -> bool:
        """We sent FIN (or the peer opened the stream unidirectional)."""
        return self._local_closed

    @property
    def remote_closed(self) -> bool:
        """The peer sent FIN."""
        return self._remote_closed

    @property
    def replied(self) -> bool:
        """SYN_REPLY sent (incoming stream) or received (outgoing stream)."""
        return self._replied

    @property
    def send_window(self) -> int:
        """Bytes the peer's window lets us send now (not enforced against a peer without flow control)."""
        return self._send_window

    @property
    def buffered(self) -> int:
        """Received bytes the application has not read yet."""
        return len(self._buf)

    @property
    def reset_status(self) -> int | None:
        """The RST_STREAM status if the stream was reset (by either side)."""
        return None if self._reset is None else self._reset[0]

    def _reset_error(self) -> StreamReset:
        assert self._reset is not None
        return StreamReset(self.id, self._reset[0], by_peer=self._reset[1])

    def __repr__(self) -> str:
        return f"<Stream {self.id} local_closed={self._local_closed} remote_closed={self._remote_closed}>"

    def _check_open(self) -> None:
        if self._reset is not None:
            raise self._reset_error()
        if self._s._ended:
            raise self._s._closed_error()

    async def reply(self, headers: Mapping[str, str] | None = None, *, fin: bool = False) -> None:
        """Send SYN_REPLY on a stream the peer opened (once)."""
        if not self.incoming or self._replied:
            raise SpdyError(f"stream {self.id}: reply() is for streams the peer opened, once")
        self._check_open()
        self._s._send(SynReplyFrame(self.id, dict(headers or {}), FLAG_FIN if fin else 0))
        self._replied = True
        if fin:
            self._local_fin()
        await self._s._drain()

    async def wait_reply(self) -> dict[str, str]:
        """Wait for the peer's SYN_REPLY on a stream we opened; its headers."""
        while not self._replied:
            self._check_open()
            await self._wake.wait()
        return self.headers

    async def read(self, n: int = -1) -> bytes:
        """Up to `n` bytes (all buffered if n < 0); b"" once the peer half-closed or the session ended;
        StreamReset once the stream was reset (after what the peer sent before resetting it)."""
        while True:
            # Data that arrived before a reset is delivered first: Kubernetes' stream servers end
            # streams with RST_STREAM right after their last DATA (spdystream's Reset on close).
            if self._buf and (self._reset is None or self._reset[1]):
                break
            if self._reset is not None:
                raise self._reset_error()
            if self._remote_closed:
                return b""
            if self._s._ended:
                if self._s.error is not None:
                    raise self._s._closed_error()
                return b""
            await self._wake.wait()
        take = len(self._buf) if n < 0 else min(n, len(self._buf))
        data = bytes(self._buf[:take])
        del self._buf[:take]
        self._unacked += take
        self._wake.notify()  # a legacy-paused read loop may go on
        if self._unacked >= self._s._initial_window // 2 and self._s._grants_windows(self):
            self._s._send(WindowUpdateFrame(self.id, self._unacked))
            self._recv_window += self._unacked
            self._unacked = 0
            await self._s._drain()
        return data

    async def write(self, data: bytes) -> None:
        """Send `data` in DATA frames, waiting for send window where the peer does flow control."""
        if self.incoming and not self._replied:
            raise SpdyError(f"stream {self.id}: reply() before writing")
        view = memoryview(data)
        while True:
            self._check_open()
            if self._local_closed:
                raise SpdyError(f"stream {self.id}: write after close()")
            if not view:
                return
            budget = self._s._send_budget(self)
            if budget <= 0:
                await self._wake.wait()
                continue
            chunk = bytes(view[: min(budget, SEND_CHUNK)])
            self._s._send(DataFrame(self.id, chunk))
            self._send_window -= len(chunk)
            self._s._send_window -= len(chunk)
            view = view[len(chunk) :]
            await self._s._drain()

    async def close(self) -> None:
        """Half-close: an empty DATA frame with FIN (a FIN SYN_REPLY if not replied yet). Idempotent."""
        if self._local_closed or self._reset is not None or self._s._ended:
            return
        if self.incoming and not self._replied:
            await self.reply(fin=True)
            return
        self._s._send(DataFrame(self.id, b"", FLAG_FIN))
        self._local_fin()
        await self._s._drain()

    def reset(self, status: int = CANCEL) -> None:
        """Abort the stream with RST_STREAM `status`; later reads and writes raise StreamReset."""
        if self._reset is not None or (self._local_closed and self._remote_closed):
            return
        if not self._s._ended:
            self._s._send(RstStreamFrame(self.id, status))
        self._mark_reset(status, by_peer=False)

    def _mark_reset(self, status: int, *, by_peer: bool) -> None:
        self._reset = (status, by_peer)
        if not by_peer:  # what the peer sent before its reset stays readable (see read())
            self._buf.clear()
        self._s._forget(self, fin=False)
        self._wake.notify()

    def _local_fin(self) -> None:
        self._local_closed = True
        if self._remote_closed:
            self._s._forget(self, fin=True)

    def _remote_fin(self) -> None:
        self._remote_closed = True
        if self._local_closed:
            self._s._forget(self, fin=True)


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
        self._accept_wake = _Signal()
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
