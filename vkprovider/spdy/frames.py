"""SPDY/3.1 frames: the frame types, their wire encoding and decoding, and header-block compression.

The kubelet API speaks SPDY/3.1 after an HTTP/1.1 `Upgrade: SPDY/3.1`. No maintained Python implementation
exists (spdy-py 0.2.0 is abandoned, python-spdylay is dead, the kubernetes Python clients never implemented
SPDY), so this is written from the SPDY Protocol Draft 3.1 (M. Belshe, R. Peon;
draft-mbelshe-httpbis-spdy-00 / chromium.org "SPDY Protocol - Draft 3.1"), with facts checked in
github.com/moby/spdystream v0.5.1 and its `spdy` framer (from golang.org/x/net/spdy), which Kubernetes
uses. No code was copied; the header dictionary is the spec's constant, verified byte for byte.

Owns: the protocol's constants (limits, flags, status codes), the errors (`SpdyError` and its kinds), the
frame types, `encode_frame`, `FrameReader` (decoding from any `ByteReader`), the name/value header block
and the zlib header contexts (one per direction, SPDY/3 dictionary, Z_SYNC_FLUSH per block). Pure apart
from awaiting the `ByteReader` it is given. Does not: streams, flow control, PING or GOAWAY handling
(`stream`, `session`), connections of any kind.

Headers: sent lower-case, non-empty, NUL-free and never hop-by-hop (strict: spdystream drops the session
on upper-case or duplicate names and on the hop-by-hop headers of its spdy/types.go:245-258); received
names are lower-cased (lenient), duplicate or empty names are a `HeaderBlockError` (a stream
PROTOCOL_ERROR, not a session one), NUL-separated values are joined with ", " (Kubernetes sends one).
A header block is decompressed even when its frame is refused, so the receiving context stays in step.
"""

from __future__ import annotations

import asyncio
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
