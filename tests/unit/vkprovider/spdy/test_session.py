"""Tests for `vkprovider.spdy.session`: frames, header compression, sessions, malformed input, Go interop.

Sessions talk over real socket pairs (asyncio streams over `socket.socketpair()`); malformed input
comes from `RawPeer`, which speaks bare frames. The interop tests build `spdy_interop/` (a
github.com/moby/spdystream peer, what Kubernetes uses) once into `.cache/spdyinterop/` and run our
client against its server and our server against its client over loopback TCP.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import random
import re
import shutil
import socket
import subprocess
import zlib
from collections.abc import AsyncIterator, Callable, Mapping
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.paths import REPO
from vkprovider.spdy.session import (
    CANCEL,
    DEFAULT_WINDOW,
    FLAG_FIN,
    FLAG_UNIDIRECTIONAL,
    FLOW_CONTROL_ERROR,
    GOAWAY_PROTOCOL_ERROR,
    HEADER_DICTIONARY,
    INVALID_STREAM,
    PROTOCOL_ERROR,
    REFUSED_STREAM,
    SETTINGS_INITIAL_WINDOW_SIZE,
    STREAM_ALREADY_CLOSED,
    STREAM_IN_USE,
    DataFrame,
    Frame,
    FrameReader,
    GoAwayFrame,
    HeaderBlockError,
    HeaderCompressor,
    HeaderDecompressor,
    HeadersFrame,
    PingFrame,
    RstStreamFrame,
    Session,
    SessionClosedError,
    SettingsFrame,
    SpdyError,
    Stream,
    StreamReset,
    SynReplyFrame,
    SynStreamFrame,
    UnknownControlFrame,
    WindowUpdateFrame,
    decode_header_block,
    encode_frame,
    encode_header_block,
)

INTEROP_SRC = REPO / "tests" / "unit" / "spdy_interop"
#: sha256 of spdystream v0.5.1's spdy/dictionary.go headerDictionary (1423 bytes).
DICTIONARY_SHA256 = "51d27341373f923f3cd88e1eb7162aeaa3723d7585ff2399201dc06498407f02"
#: Frames written by spdystream v0.5.1's framer (one zlib context): SYN_STREAM 1 {streamtype: error},
#: then SYN_REPLY 1 {port: 8080}.
GO_SYN_STREAM = bytes.fromhex(
    "80030001000000290000000100000000000078f9e3c6a7c26260606004a7b392a2d4c45c6851c29a0a0a6800000000ffff"
)
GO_SYN_REPLY = bytes.fromhex("800300020000001600000001824ab114e41781738185818501000000ffff")
WAIT = 10.0  # seconds any single await in these tests may take before the test counts as hung


# --- helpers --------------------------------------------------------------------------------------------------


class BytesReader:
    """A ByteReader over fixed bytes (EOF at the end)."""

    def __init__(self, data: bytes) -> None:
        self._data = data
        self._pos = 0

    async def readexactly(self, n: int) -> bytes:
        chunk = self._data[self._pos : self._pos + n]
        self._pos += len(chunk)
        if len(chunk) < n:
            raise asyncio.IncompleteReadError(chunk, n)
        return chunk


class Collector:
    """A ByteWriter that keeps what it is given."""

    def __init__(self) -> None:
        self.data = bytearray()
        self.closed = False

    def write(self, data: bytes) -> None:
        self.data += data

    async def drain(self) -> None:
        return None

    def close(self) -> None:
        self.closed = True


async def socket_pair() -> tuple[tuple[asyncio.StreamReader, asyncio.StreamWriter], ...]:
    a, b = socket.socketpair()
    return await asyncio.open_connection(sock=a), await asyncio.open_connection(sock=b)


async def decode_all(data: bytes) -> list[Frame]:
    reader, frames = FrameReader(BytesReader(data)), []
    while (frame := await reader.read_frame()) is not None:
        frames.append(frame)
    return frames


async def finish(task: asyncio.Task[None]) -> BaseException | None:
    """Wait for a Session.run() task; its exception (or None)."""
    done, _ = await asyncio.wait([task], timeout=WAIT)
    assert done, "Session.run() did not end"
    return None if task.cancelled() else task.exception()


async def until(predicate: Callable[[], bool], what: str) -> None:
    """Poll a state predicate (no timing assertion: only a bound against hanging)."""
    async with asyncio.timeout(WAIT):
        while not predicate():
            await asyncio.sleep(0.005)
    assert predicate(), what


@contextlib.asynccontextmanager
async def session_pair(
    client_kw: Mapping[str, Any] | None = None, server_kw: Mapping[str, Any] | None = None
) -> AsyncIterator[tuple[Session, Session]]:
    (rc, wc), (rs, ws) = await socket_pair()
    client = Session(rc, wc, client=True, **(client_kw or {}))
    server = Session(rs, ws, client=False, **(server_kw or {}))
    tasks = [asyncio.create_task(s.run()) for s in (client, server)]
    try:
        yield client, server
    finally:
        await client.close()
        await server.close()
        for task in tasks:
            await finish(task)


class RawPeer:
    """The far end of a Session as bare frames, with its own header contexts."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, *, client: bool) -> None:
        self.frames = FrameReader(reader)
        self.writer = writer
        self.compressor = HeaderCompressor()
        self._next_ping = 1001 if client else 1000

    def send(self, *frames: Frame) -> None:
        for frame in frames:
            self.writer.write(encode_frame(frame, self.compressor))

    async def next(self, *types: type) -> Frame:
        """The next frame of one of `types` (others are skipped); AssertionError at EOF."""
        async with asyncio.timeout(WAIT):
            while True:
                frame = await self.frames.read_frame()
                assert frame is not None, f"EOF while waiting for {types}"
                if not types or isinstance(frame, types):
                    return frame

    async def barrier(self) -> None:
        """Send a PING and wait for its echo: everything sent before it has been processed."""
        ping = PingFrame(self._next_ping)
        self._next_ping += 2
        self.send(ping)
        while (await self.next(PingFrame)) != ping:
            pass

    async def rest(self) -> list[Frame]:
        out = []
        async with asyncio.timeout(WAIT):
            while (frame := await self.frames.read_frame()) is not None:
                out.append(frame)
        return out


@contextlib.asynccontextmanager
async def raw_peer(*, client: bool = False, **kw: Any) -> AsyncIterator[tuple[Session, RawPeer, asyncio.Task[None]]]:
    """A Session (server unless `client`) whose peer is a RawPeer; the peer's odd/even ids are the test's job."""
    (rs, ws), (rp, wp) = await socket_pair()
    session = Session(rs, ws, client=client, **kw)
    task = asyncio.create_task(session.run())
    try:
        yield session, RawPeer(rp, wp, client=not client), task
    finally:
        await session.close()
        wp.close()
        await finish(task)


async def echo(stream: Stream) -> None:
    while data := await stream.read(50_000):
        await stream.write(data)
    await stream.close()


async def send_and_collect(stream: Stream, payload: bytes) -> bytes:
    async def send() -> None:
        view = memoryview(payload)
        for off in range(0, len(payload), 40_000):  # odd-sized writes straddle frames and windows
            await stream.write(bytes(view[off : off + 40_000]))
        await stream.close()

    sender = asyncio.create_task(send())
    got = bytearray()
    while chunk := await stream.read():
        got += chunk
    await sender
    return bytes(got)


# --- frames and header blocks ---------------------------------------------------------------------------------


async def test_dictionary_is_spdy3s_byte_for_byte() -> None:
    assert len(HEADER_DICTIONARY) == 1423
    assert hashlib.sha256(HEADER_DICTIONARY).hexdigest() == DICTIONARY_SHA256
    go = shutil.which("go")
    if go is None:
        return
    modcache = subprocess.run([go, "env", "GOMODCACHE"], capture_output=True, text=True, check=True).stdout.strip()
    source = Path(modcache) / "github.com/moby/spdystream@v0.5.1/spdy/dictionary.go"
    if source.exists():
        body = source.read_text().split("headerDictionary = []byte{", 1)[1].split("}", 1)[0]
        assert bytes(int(h, 16) for h in re.findall(r"0x([0-9a-fA-F]{2})", body)) == HEADER_DICTIONARY


ALL_FRAMES: list[Frame] = [
    DataFrame(1, b"hello", FLAG_FIN),
    DataFrame(0x7FFFFFFF, b""),
    SynStreamFrame(3, {"streamtype": "stdin", "port": "8080"}, FLAG_FIN | FLAG_UNIDIRECTIONAL, 1, 7, 2),
    SynReplyFrame(3, {"x": "é"}, FLAG_FIN),
    SynReplyFrame(5, {}),
    RstStreamFrame(3, CANCEL),
    SettingsFrame(((1, SETTINGS_INITIAL_WINDOW_SIZE, 1 << 20), (0, 4, 100)), 1),
    SettingsFrame(),
    PingFrame(0xFFFFFFFF),
    GoAwayFrame(7, GOAWAY_PROTOCOL_ERROR),
    HeadersFrame(9, {"a": "b"}, FLAG_FIN),
    WindowUpdateFrame(0, 0x7FFFFFFF),
    UnknownControlFrame(0x0A, 3, b"\x00\x01"),
]


@pytest.mark.parametrize("frame", ALL_FRAMES, ids=lambda f: type(f).__name__)
async def test_every_frame_round_trips(frame: Frame) -> None:
    assert await decode_all(encode_frame(frame, HeaderCompressor())) == [frame]


async def test_a_sequence_shares_one_header_context_per_direction() -> None:
    compressor = HeaderCompressor()
    wire = b"".join(encode_frame(f, compressor) for f in ALL_FRAMES * 3)
    assert await decode_all(wire) == ALL_FRAMES * 3
    # the second identical block compresses to less: the context is shared, not reset per frame
    first = encode_frame(SynReplyFrame(1, {"streamtype": "stdout"}), compressor)
    assert len(encode_frame(SynReplyFrame(1, {"streamtype": "stdout"}), compressor)) < len(first)


async def test_header_block_known_vectors() -> None:
    raw = encode_header_block({"streamtype": "error"})
    assert raw == b"\x00\x00\x00\x01\x00\x00\x00\x0astreamtype\x00\x00\x00\x05error"
    # ours decompresses with a plain zlib decompressor primed with the dictionary
    plain = zlib.decompressobj(zdict=HEADER_DICTIONARY)
    compressor = HeaderCompressor()
    assert plain.decompress(compressor.compress({"streamtype": "error"})) == raw
    assert plain.decompress(compressor.compress({"port": "80"})) == encode_header_block({"port": "80"})
    # blocks compressed independently (one zlib stream, Z_SYNC_FLUSH) decode in order
    z = zlib.compressobj(zdict=HEADER_DICTIONARY)
    blocks = [z.compress(encode_header_block(h)) + z.flush(zlib.Z_SYNC_FLUSH) for h in ({"a": "1"}, {"b": "2"})]
    ours = HeaderDecompressor()
    assert [decode_header_block(ours.decompress(b)) for b in blocks] == [{"a": "1"}, {"b": "2"}]
    # and spdystream's framer output decodes, with its context carried from one frame to the next
    assert await decode_all(GO_SYN_STREAM + GO_SYN_REPLY) == [
        SynStreamFrame(1, {"streamtype": "error"}),
        SynReplyFrame(1, {"port": "8080"}),
    ]
    # (Go's deflate differs from C zlib's byte for byte; that spdystream reads ours is the interop tests' job)


@pytest.mark.parametrize(
    "headers",
    [
        {"Streamtype": "x"},
        {"": "x"},
        {"a\x00b": "x"},
        {"a": "x\x00y"},
        {"connection": "close"},
        {"host": "h"},
        {"a": "\ud800"},
    ],
)
async def test_headers_are_strict_on_send(headers: dict[str, str]) -> None:
    compressor = HeaderCompressor()
    with pytest.raises(ValueError, match="header"):
        compressor.compress(headers)
    assert compressor.compress({"ok": "1"})  # the context is untouched by a refused block
    with pytest.raises(ValueError, match="header"):
        encode_frame(SynStreamFrame(1, headers), compressor)


def raw_block(*pairs: tuple[bytes, bytes], count: int | None = None) -> bytes:
    out = (len(pairs) if count is None else count).to_bytes(4)
    for name, value in pairs:
        out += len(name).to_bytes(4) + name + len(value).to_bytes(4) + value
    return out


async def test_headers_are_lenient_on_receive_where_safe() -> None:
    assert decode_header_block(raw_block((b"StreamType", b"stdout"))) == {"streamtype": "stdout"}
    assert decode_header_block(raw_block((b"accept", b"a\x00b"))) == {"accept": "a, b"}
    bad = {
        "duplicate": raw_block((b"a", b"1"), (b"A", b"2")),
        "empty header name": raw_block((b"", b"1")),
        "truncated": raw_block((b"a", b"1"), count=2),
        "stray bytes": raw_block((b"a", b"1")) + b"x",
        "UTF-8": raw_block((b"\xff", b"1")),
        "announces": raw_block(count=5000),
    }
    for message, block in bad.items():
        with pytest.raises(ValueError, match=message):
            decode_header_block(block)


def control(frame_type: int, payload: bytes, *, version: int = 3, flags: int = 0) -> bytes:
    return (0x8000 | version).to_bytes(2) + frame_type.to_bytes(2) + (flags << 24 | len(payload)).to_bytes(4) + payload


@pytest.mark.parametrize(
    ("wire", "message"),
    [
        (control(6, b"\x00\x00\x00\x01", version=2), "version 2"),
        (control(3, b"\x00" * 7), "malformed length"),
        (control(7, b"\x00" * 4), "malformed length"),
        (control(4, b"\x00\x00\x00\x02" + b"\x00" * 8), "announces 2 entries"),
        (control(1, b"\x00\x00\x00\x01" + b"\x00" * 6 + b"not zlib"), "does not decompress"),
        (control(6, b"\x00\x00"), "malformed length"),
        (b"\x00\x00\x00\x01\x00\x00\x00", "inside a frame header"),
        (b"\x00\x00\x00\x01\x00\x00\x00\x05ab", "2 of a frame's 5 bytes"),
        (b"\x00\x00\x00\x01\x00\x01\x00\x00", "exceeds the limit of 4096"),
    ],
)
async def test_decoder_rejects_malformed_frames(wire: bytes, message: str) -> None:
    reader = FrameReader(BytesReader(wire), max_frame_bytes=4096)
    with pytest.raises(SpdyError, match=message):
        await reader.read_frame()


async def test_decoder_reports_bad_header_content_as_a_stream_error_and_stays_in_step() -> None:
    z = zlib.compressobj(zdict=HEADER_DICTIONARY)
    bad = z.compress(raw_block((b"a", b"1"), (b"a", b"2"))) + z.flush(zlib.Z_SYNC_FLUSH)
    good = z.compress(raw_block((b"b", b"2"))) + z.flush(zlib.Z_SYNC_FLUSH)
    reader = FrameReader(BytesReader(control(2, (5).to_bytes(4) + bad) + control(2, (7).to_bytes(4) + good)))
    with pytest.raises(HeaderBlockError, match="duplicate") as caught:
        await reader.read_frame()
    assert (caught.value.stream_id, caught.value.frame_type) == (5, 2)
    assert await reader.read_frame() == SynReplyFrame(7, {"b": "2"})
    assert await reader.read_frame() is None


@settings(max_examples=300, deadline=None, database=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.binary(max_size=2000))
@pytest.mark.timeout(120)
async def test_decoder_never_raises_anything_but_spdy_error(data: bytes) -> None:
    reader = FrameReader(BytesReader(data), max_frame_bytes=1024)
    with contextlib.suppress(SpdyError):
        async with asyncio.timeout(WAIT):
            while await reader.read_frame() is not None:
                pass


_ids = st.integers(0, 12)
_values = st.text(st.characters(min_codepoint=1, codec="utf-8"), max_size=8)  # sendable
_headers = st.dictionaries(st.sampled_from(["streamtype", "port", "requestid", "x"]), _values)
_frames = st.one_of(
    st.builds(DataFrame, _ids, st.binary(max_size=300), st.integers(0, 3)),
    st.builds(SynStreamFrame, _ids, _headers, st.integers(0, 3)),
    st.builds(SynReplyFrame, _ids, _headers, st.integers(0, 1)),
    st.builds(HeadersFrame, _ids, _headers, st.integers(0, 1)),
    st.builds(RstStreamFrame, _ids, st.integers(0, 12)),
    st.builds(SettingsFrame, st.lists(st.tuples(st.integers(0, 3), st.integers(0, 8), st.integers(0, 2**32 - 1)))),
    st.builds(PingFrame, st.integers(0, 6)),
    st.builds(GoAwayFrame, _ids, st.integers(0, 3)),
    st.builds(WindowUpdateFrame, _ids, st.integers(0, 2**31 - 1)),
    st.builds(UnknownControlFrame, st.integers(10, 0x7FFF), st.integers(0, 255), st.binary(max_size=20)),
)


@settings(max_examples=200, deadline=None, database=None)
@given(
    st.lists(_frames, max_size=25),
    st.lists(st.tuples(st.integers(0, 10_000), st.integers(0, 255)), max_size=3),
    st.booleans(),
)
@pytest.mark.timeout(180)
async def test_a_session_fed_random_frames_ends_with_spdy_error_or_eof(
    frames: list[Frame], flips: list[tuple[int, int]], client: bool
) -> None:
    compressor = HeaderCompressor()
    wire = bytearray(b"".join(encode_frame(f, compressor) for f in frames))
    for pos, value in flips:
        if wire:
            wire[pos % len(wire)] = value
    out = Collector()
    session = Session(BytesReader(bytes(wire)), out, client=client, max_frame_bytes=4096)
    with contextlib.suppress(SpdyError):
        async with asyncio.timeout(WAIT):
            await session.run()
    assert session.closed.is_set() and out.closed
    for frame in await decode_all(bytes(out.data)):  # what it answered is well-formed
        assert not isinstance(frame, UnknownControlFrame)


# --- sessions -------------------------------------------------------------------------------------------------


async def test_open_reply_data_both_ways_and_half_close() -> None:
    async with session_pair() as (client, server):
        out = await client.open_stream({"streamtype": "stdin", "port": "80"})
        incoming = await server.accept()
        assert (incoming.id, incoming.headers) == (1, {"streamtype": "stdin", "port": "80"})
        await incoming.reply({"x-ok": "yes"})
        assert await out.wait_reply() == {"x-ok": "yes"} and out.headers == {"x-ok": "yes"}
        await out.write(b"ping")
        assert await incoming.read() == b"ping"
        await incoming.write(b"pong")
        assert await out.read(2) == b"po" and await out.read() == b"ng"
        await out.close()
        await out.close()  # idempotent
        assert await incoming.read() == b"" and incoming.remote_closed and out.local_closed
        await incoming.write(b"still open this way")
        assert await out.read() == b"still open this way"
        await incoming.close()
        assert await out.read() == b"" and out.remote_closed
        with pytest.raises(SpdyError, match="write after close"):
            await out.write(b"x")
        # a server opens even ids, a reply with FIN ends the stream both ways
        back = await server.open_stream({"dir": "back"}, fin=True)
        theirs = await client.accept()
        assert back.id == 2 and theirs.remote_closed and await theirs.read() == b""
        await theirs.reply(fin=True)
        await back.wait_reply()
        assert back.remote_closed and back.local_closed


async def test_reply_timeout_resets_the_stream() -> None:
    async with session_pair() as (client, server):
        with pytest.raises(TimeoutError, match="no SYN_REPLY on stream 1"):
            await client.open_stream({"a": "1"}, reply_timeout=0.05)
        incoming = await server.accept()
        with pytest.raises(StreamReset, match="reset by the peer: CANCEL") as caught:
            await incoming.read()
        assert caught.value.status == CANCEL and caught.value.by_peer
        with pytest.raises(StreamReset):
            await incoming.reply()


async def test_reset_both_ways() -> None:
    async with session_pair() as (client, server):
        a = await client.open_stream({"n": "a"})
        a_in = await server.accept()
        await a_in.reply()
        reader = asyncio.create_task(a.read())
        a_in.reset(REFUSED_STREAM)
        with pytest.raises(StreamReset, match="REFUSED_STREAM"):
            await reader
        with pytest.raises(StreamReset):
            await a.write(b"x")
        assert a.reset_status == REFUSED_STREAM and a_in.reset_status == REFUSED_STREAM
        a_in.reset()  # idempotent, nothing sent twice
        with pytest.raises(StreamReset, match="reset by us"):
            await a_in.read()

        b = await client.open_stream({"n": "b"})
        b_in = await server.accept()
        await b_in.reply()
        await b.write(b"data in flight")
        b.reset()
        with pytest.raises(StreamReset, match="by the peer: CANCEL"):
            while await b_in.read():
                pass
        assert await client.ping(WAIT) >= 0  # the session carries on


async def test_data_sent_before_the_peers_reset_is_still_read() -> None:
    # Kubernetes' stream servers end with RST_STREAM right after their last DATA frame.
    async with session_pair() as (client, server):
        s = await client.open_stream({"n": "out"})
        s_in = await server.accept()
        await s_in.reply()
        await s_in.write(b"last words")
        s_in.reset()
        await until(lambda: s.reset_status is not None, "the reset to arrive")
        assert await s.read() == b"last words"
        with pytest.raises(StreamReset, match="by the peer"):
            await s.read()


async def test_many_concurrent_streams() -> None:
    async with session_pair() as (client, server):

        async def serve() -> None:
            async with asyncio.TaskGroup() as tg:
                for _ in range(64):
                    stream = await server.accept()
                    await stream.reply({"echo": stream.headers["n"]})
                    tg.create_task(echo(stream))

        server_task = asyncio.create_task(serve())

        async def one(n: int) -> None:
            stream = await client.open_stream({"n": str(n)}, reply_timeout=WAIT)
            assert stream.headers == {"echo": str(n)}
            payload = random.Random(n).randbytes(n * 997)
            assert await send_and_collect(stream, payload) == payload

        async with asyncio.timeout(WAIT * 3):
            await asyncio.gather(*(one(n) for n in range(64)))
            await server_task


async def test_one_mib_both_ways_crosses_windows() -> None:
    async with session_pair() as (client, server):
        stream = await client.open_stream({"streamtype": "data"})
        incoming = await server.accept()
        await incoming.reply()
        up, down = random.Random(1).randbytes(1 << 20), random.Random(2).randbytes(1 << 20)
        async with asyncio.timeout(WAIT * 3):
            got_down, got_up = await asyncio.gather(send_and_collect(stream, up), send_and_collect(incoming, down))
        assert got_up == up and got_down == down
        assert client.peer_flow_control is True and server.peer_flow_control is True


async def test_a_slow_reader_blocks_the_writer_until_it_reads() -> None:
    async with session_pair() as (client, server):
        stream = await client.open_stream({"streamtype": "stdout"})
        incoming = await server.accept()
        await incoming.reply()
        await until(lambda: client.peer_flow_control is True, "peer flow control seen")
        writer = asyncio.create_task(stream.write(b"x" * (300 * 1024)))
        await until(lambda: incoming.buffered == DEFAULT_WINDOW, "the window filled")
        await client.ping(WAIT)  # and nothing more is on its way: the writer waits for a WINDOW_UPDATE
        assert incoming.buffered == DEFAULT_WINDOW and stream.send_window == 0 and not writer.done()
        got = 0
        while got < 300 * 1024:
            got += len(await incoming.read())
            assert incoming.buffered <= DEFAULT_WINDOW
        await writer


async def test_settings_initial_window_sizes_new_and_open_streams() -> None:
    async with session_pair(server_kw={"initial_window": 256 * 1024}) as (client, server):
        await until(lambda: client.peer_flow_control is True, "the server's SETTINGS arrived")
        stream = await client.open_stream({"a": "1"})
        assert stream.send_window == 256 * 1024
        incoming = await server.accept()
        await incoming.reply()
        writer = asyncio.create_task(stream.write(b"y" * (400 * 1024)))
        await until(lambda: incoming.buffered == 256 * 1024, "a 256 KiB window filled")
        assert not writer.done()
        writer.cancel()

    async with raw_peer(client=True) as (session, peer, _):
        stream = await session.open_stream({"a": "1"})
        assert stream.send_window == DEFAULT_WINDOW
        peer.send(SettingsFrame(((0, SETTINGS_INITIAL_WINDOW_SIZE, 100_000),)))
        await peer.barrier()
        assert stream.send_window == 100_000 and session.peer_flow_control is True
        peer.send(SettingsFrame(((0, SETTINGS_INITIAL_WINDOW_SIZE, 1000),)))
        await peer.barrier()
        assert stream.send_window == 1000


async def test_ping_round_trip_both_ways() -> None:
    async with session_pair() as (client, server):
        assert 0 <= await client.ping(WAIT) < WAIT
        assert 0 <= await server.ping(WAIT) < WAIT


async def test_goaway_ends_accept_and_run() -> None:
    (rc, wc), (rs, ws) = await socket_pair()
    client, server = Session(rc, wc, client=True), Session(rs, ws, client=False)
    tasks = [asyncio.create_task(s.run()) for s in (client, server)]
    waiting = asyncio.create_task(server.accept())
    await client.ping(WAIT)
    await client.close()
    with pytest.raises(SessionClosedError):
        await waiting
    assert await finish(tasks[0]) is None and await finish(tasks[1]) is None
    with pytest.raises(SessionClosedError):
        await client.open_stream({"a": "1"})
    await client.close()  # idempotent


async def test_close_before_run_is_clean() -> None:
    session = Session(BytesReader(b""), out := Collector(), client=True)
    await session.close()
    await session.run()
    assert out.closed and await decode_all(bytes(out.data)) == [
        SettingsFrame(((0, SETTINGS_INITIAL_WINDOW_SIZE, DEFAULT_WINDOW),)),
        PingFrame(1),
        GoAwayFrame(0),
    ]


class BreakingWriter(Collector):
    """A Collector whose drain() fails like a transport the peer stopped reading from, once `broken`."""

    broken = False

    async def drain(self) -> None:
        if self.broken:
            raise ConnectionResetError("Connection lost")


async def test_a_broken_write_side_does_not_lose_what_is_left_to_read() -> None:
    peer = HeaderCompressor()
    wire = b"".join(
        encode_frame(f, peer)
        for f in (PingFrame(2), SynReplyFrame(1, {}), DataFrame(1, b"status"), PingFrame(4), DataFrame(1, b"", 1))
    )
    writer = BreakingWriter()
    session = Session(BytesReader(wire), writer, client=True)
    stream = await session.open_stream({"streamtype": "error"})
    writer.broken = True  # the peer said its last word and closed: our echoes cannot be sent
    with pytest.raises(SessionClosedError, match="connection lost"):
        await stream.write(b"x")
    await session.run()
    assert await stream.read() == b"status" and await stream.read() == b""


async def test_goaway_from_the_peer_refuses_streams_above_last_good() -> None:
    async with raw_peer(client=True) as (session, peer, task):
        kept, refused = await session.open_stream({"n": "1"}), await session.open_stream({"n": "3"})
        peer.send(SynReplyFrame(1, {}), GoAwayFrame(1), DataFrame(1, b"last", FLAG_FIN))
        with pytest.raises(StreamReset, match="REFUSED_STREAM"):
            await refused.wait_reply()
        assert await kept.read() == b"last" and await kept.read() == b""
        with pytest.raises(SessionClosedError):
            await session.accept()
        with pytest.raises(SessionClosedError):
            await session.open_stream({"n": "5"})
        await kept.close()  # its last stream is done: the session ends
        assert await finish(task) is None


async def test_close_gives_streams_their_data_then_eof() -> None:
    async with session_pair() as (client, server):
        stream = await client.open_stream({"a": "1"})
        incoming = await server.accept()
        await incoming.reply()
        await incoming.write(b"buffered")
        await until(lambda: stream.buffered == 8, "data arrived")
        reading = asyncio.create_task(incoming.read())
        await client.close()
        assert await stream.read() == b"buffered" and await stream.read() == b""
        with pytest.raises(SessionClosedError):
            await stream.write(b"x")
        assert await reading == b""  # the server saw GOAWAY, then EOF


async def test_run_cancelled_sends_goaway_and_ends_streams() -> None:
    async with raw_peer(client=True) as (session, peer, task):
        stream = await session.open_stream({"a": "1"})
        waiter = asyncio.create_task(stream.wait_reply())
        pinger = asyncio.create_task(session.ping(WAIT))
        await peer.next(SynStreamFrame)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert session.closed.is_set()
        with pytest.raises(SessionClosedError):
            await waiter
        with pytest.raises(SessionClosedError):
            await pinger
        assert await stream.read() == b""
        frames = await peer.rest()
        assert GoAwayFrame(0) in frames


# --- malformed input against a live session --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("wire", "message"),
    [
        (control(1, b"\x00" * 14, version=2), "SPDY version 2"),
        (b"\x00\x00\x00\x01" + (5000).to_bytes(4), "exceeds the limit of 4096"),
        (control(1, b"\x00\x00\x00\x01\x00\x00\x00\x00\x00\x00garbage!"), "does not decompress"),
        (control(7, b"\x00" * 4), "malformed length"),
        (control(9, b"\x00" * 8), "session WINDOW_UPDATE of 0"),
        (DataFrame(0, b"x"), "DATA frame on stream 0"),
        (SynStreamFrame(2, {}), "the peer must open odd ids"),
        (SynStreamFrame(0, {}), "stream id 0"),
        (SettingsFrame(((0, SETTINGS_INITIAL_WINDOW_SIZE, 2**31),)), "exceeds 2"),
    ],
)
async def test_session_errors_end_the_session_with_goaway(wire: bytes | Frame, message: str) -> None:
    async with raw_peer(max_frame_bytes=4096) as (session, peer, task):
        opened = None
        if message == "stream id 0":
            peer.send(SynStreamFrame(3, {}))
            opened = await session.accept()
        if isinstance(wire, bytes):
            peer.writer.write(wire)
        else:
            peer.send(wire)
        error = await finish(task)
        assert isinstance(error, SpdyError) and re.search(message, str(error)), error
        goaway = await peer.next(GoAwayFrame)
        assert goaway == GoAwayFrame(3 if opened else 0, GOAWAY_PROTOCOL_ERROR)
        with pytest.raises(SessionClosedError, match="session failed"):
            await session.accept()
        if opened is not None:
            with pytest.raises(SessionClosedError, match="session failed"):
                await opened.read()


async def test_non_increasing_stream_id_is_a_session_error() -> None:
    async with raw_peer() as (session, peer, task):
        peer.send(SynStreamFrame(5, {}), SynStreamFrame(3, {}))
        assert (await session.accept()).id == 5
        error = await finish(task)
        assert isinstance(error, SpdyError) and "not above the previous 5" in str(error)
        assert await peer.next(GoAwayFrame) == GoAwayFrame(5, GOAWAY_PROTOCOL_ERROR)


async def test_truncated_frame_at_eof_is_an_error() -> None:
    async with raw_peer() as (_, peer, task):
        peer.writer.write(control(6, b"\x00\x00\x00\x01")[:10])
        peer.writer.write_eof()
        error = await finish(task)
        assert isinstance(error, SpdyError) and "connection closed after 2 of a frame's 4 bytes" in str(error)


async def test_stream_errors_reset_the_stream_and_the_session_goes_on() -> None:
    async with raw_peer() as (session, peer, task):
        # data for a stream that never existed
        peer.send(DataFrame(9, b"?"))
        assert await peer.next(RstStreamFrame) == RstStreamFrame(9, INVALID_STREAM)
        # an invalid header block (duplicate names) on a SYN_STREAM: refused, decoder stays in step
        z = peer.compressor._z  # the peer's own context, so the next frames still decode
        block = z.compress(raw_block((b"a", b"1"), (b"a", b"2"))) + z.flush(zlib.Z_SYNC_FLUSH)
        peer.writer.write(control(1, (11).to_bytes(4) + b"\x00" * 6 + block))
        assert await peer.next(RstStreamFrame) == RstStreamFrame(11, PROTOCOL_ERROR)
        # a truncated header block: same
        block = z.compress(raw_block((b"a", b"1"), count=3)) + z.flush(zlib.Z_SYNC_FLUSH)
        peer.writer.write(control(1, (13).to_bytes(4) + b"\x00" * 6 + block))
        assert await peer.next(RstStreamFrame) == RstStreamFrame(13, PROTOCOL_ERROR)
        # data after FIN
        peer.send(SynStreamFrame(15, {"a": "1"}, FLAG_FIN))
        stream = await session.accept()
        assert stream.id == 15 and stream.remote_closed
        peer.send(DataFrame(15, b"late"))
        assert await peer.next(RstStreamFrame) == RstStreamFrame(15, STREAM_ALREADY_CLOSED)
        assert stream.reset_status == STREAM_ALREADY_CLOSED
        # an unknown control frame type is ignored; a PING from the peer is echoed
        peer.send(UnknownControlFrame(0x0B, 0, b"whatever"), PingFrame(7))
        assert await peer.next(PingFrame) == PingFrame(7)
        # data after a stream we reset is dropped quietly (it was in flight)
        peer.send(SynStreamFrame(17, {}))
        doomed = await session.accept()
        doomed.reset()
        assert await peer.next(RstStreamFrame) == RstStreamFrame(17, CANCEL)
        peer.send(DataFrame(17, b"in flight"), PingFrame(9))
        assert await peer.next(RstStreamFrame, PingFrame) == PingFrame(9)
        await peer.barrier()
        assert not task.done()


async def test_reply_frames_out_of_place_are_stream_errors() -> None:
    async with raw_peer(client=True) as (session, peer, _):
        stream = await session.open_stream({"a": "1"})
        peer.send(SynReplyFrame(1, {"r": "1"}), SynReplyFrame(1, {"r": "2"}))
        assert await peer.next(RstStreamFrame) == RstStreamFrame(1, STREAM_IN_USE)
        with pytest.raises(StreamReset, match="STREAM_IN_USE"):
            await stream.read()
        peer.send(SynReplyFrame(99, {}))
        assert await peer.next(RstStreamFrame) == RstStreamFrame(99, INVALID_STREAM)
        # HEADERS add to the reply's headers; FIN on them half-closes
        other = await session.open_stream({"a": "2"})
        peer.send(SynReplyFrame(3, {"r": "1"}), HeadersFrame(3, {"trailer": "t"}, FLAG_FIN))
        assert await other.read() == b"" and other.headers == {"r": "1", "trailer": "t"}


async def test_a_peer_with_flow_control_that_overruns_a_window_is_reset() -> None:
    async with raw_peer() as (session, peer, _):
        peer.send(SettingsFrame(), SynStreamFrame(1, {}))
        stream = await session.accept()
        await stream.reply()
        assert session.peer_flow_control is True
        for _ in range(4):
            peer.send(DataFrame(1, b"z" * 16384))
        peer.send(DataFrame(1, b"one too many"))
        assert await peer.next(RstStreamFrame) == RstStreamFrame(1, FLOW_CONTROL_ERROR)
        with pytest.raises(StreamReset, match="FLOW_CONTROL_ERROR"):
            await stream.read()


async def test_a_legacy_peer_is_detected_and_neither_side_stalls() -> None:
    async with raw_peer(client=True) as (session, peer, _):
        settings_frame = await peer.next()
        assert settings_frame == SettingsFrame(((0, SETTINGS_INITIAL_WINDOW_SIZE, DEFAULT_WINDOW),))
        probe = await peer.next(PingFrame)
        stream = await session.open_stream({"streamtype": "stdin"})
        peer.send(SynReplyFrame(stream.id, {}))
        writer = asyncio.create_task(stream.write(b"w" * (200 * 1024)))
        received = 0
        while received < DEFAULT_WINDOW:  # sends respect the default window until the probe is answered
            frame = await peer.next(DataFrame)
            assert isinstance(frame, DataFrame)
            received += len(frame.data)
        assert received == DEFAULT_WINDOW and not writer.done()
        peer.send(probe)  # echoed, with no SETTINGS or WINDOW_UPDATE before it: a spdystream-like peer
        while received < 200 * 1024:
            frame = await peer.next(DataFrame)
            assert isinstance(frame, DataFrame)
            received += len(frame.data)
        await writer
        assert session.peer_flow_control is False
        # receiving: the session stops reading while the application lags by a window
        for _ in range(8):
            peer.send(DataFrame(stream.id, b"r" * 16384))
        peer.send(PingFrame(2))
        await until(lambda: stream.buffered >= DEFAULT_WINDOW, "a window buffered")
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(0.2):
                await peer.next(PingFrame)  # not answered: the read loop waits for the application
        assert stream.buffered == DEFAULT_WINDOW
        got = 0
        while got < 8 * 16384:
            got += len(await stream.read())
        assert await peer.next(PingFrame) == PingFrame(2)


async def test_legacy_mode_sends_no_window_updates() -> None:
    async with raw_peer(peer_flow_control=False) as (session, peer, _):
        assert (await peer.next()) == SettingsFrame(((0, SETTINGS_INITIAL_WINDOW_SIZE, DEFAULT_WINDOW),))
        peer.send(SynStreamFrame(1, {}))
        stream = await session.accept()
        await stream.reply()
        for _ in range(6):
            peer.send(DataFrame(1, b"d" * 16384))
        got = 0
        while got < 6 * 16384:
            got += len(await stream.read())
        await peer.barrier()
        await session.close()
        rest = await peer.rest()
        assert not [f for f in rest if isinstance(f, WindowUpdateFrame)]


async def test_api_misuse_is_reported() -> None:
    with pytest.raises(ValueError, match="initial_window"):
        Session(BytesReader(b""), Collector(), client=True, initial_window=1000)
    async with session_pair() as (client, server):
        out = await client.open_stream({"a": "1"})
        with pytest.raises(SpdyError, match="reply"):
            await out.reply()
        incoming = await server.accept()
        with pytest.raises(SpdyError, match="reply"):
            await incoming.write(b"x")
        await incoming.close()  # unreplied: a SYN_REPLY with FIN
        await out.wait_reply()
        assert await out.read() == b"" and incoming.replied
        with pytest.raises(ValueError, match="lower-case"):
            await client.open_stream({"Bad": "1"})
        assert (await client.open_stream({"a": "2"})).id == 3  # the refused one used no id


# --- interop with spdystream (Go) -------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def interop_binary() -> Path:
    """Build spdy_interop/ once per source version; a failed build fails the tests (no skip)."""
    sources = sorted(p for p in INTEROP_SRC.iterdir() if p.suffix in {".go", ".mod", ".sum"})
    digest = hashlib.sha256(b"".join(p.name.encode() + p.read_bytes() for p in sources)).hexdigest()[:16]
    binary = REPO / ".cache" / "spdyinterop" / f"spdyinterop-{digest}"
    if binary.exists():
        return binary
    go = shutil.which("go") or "/usr/local/go/bin/go"
    binary.parent.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "GOFLAGS": f"{os.environ.get('GOFLAGS', '')} -mod=mod -buildvcs=false".strip()}
    try:
        built = subprocess.run(
            [go, "build", "-o", str(binary), "."], cwd=INTEROP_SRC, env=env, capture_output=True, text=True, timeout=300
        )
    except (OSError, subprocess.TimeoutExpired) as e:
        pytest.fail(f"cannot build the spdystream interop peer: {e}")
    if built.returncode != 0:
        pytest.fail(f"building the spdystream interop peer failed:\n{built.stdout}{built.stderr}")
    return binary


async def go_lines(proc: asyncio.subprocess.Process) -> list[str]:
    assert proc.stdout is not None
    out, _ = await asyncio.wait_for(proc.communicate(), WAIT * 3)
    return out.decode().splitlines()


@pytest.mark.timeout(120)
async def test_interop_our_client_against_a_spdystream_server(interop_binary: Path) -> None:
    proc = await asyncio.create_subprocess_exec(str(interop_binary), "server", stdout=subprocess.PIPE)
    try:
        assert proc.stdout is not None
        line = (await asyncio.wait_for(proc.stdout.readline(), WAIT)).decode()
        port = int(line.split()[1])
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        session = Session(reader, writer, client=True)
        runner = asyncio.create_task(session.run())

        async def echo_one(n: int) -> None:
            stream = await session.open_stream({"x-test": "echo", "streamtype": f"s{n}"}, reply_timeout=WAIT)
            payload = random.Random(n).randbytes(512 * 1024 + n)
            assert await send_and_collect(stream, payload) == payload

        async with asyncio.timeout(WAIT * 3):
            await asyncio.gather(*(echo_one(n) for n in range(4)))
        assert session.peer_flow_control is False  # spdystream never sends SETTINGS or WINDOW_UPDATE
        assert await session.ping(WAIT) >= 0

        with pytest.raises(StreamReset, match="REFUSED_STREAM") as refused:
            await session.open_stream({"x-test": "refuse"}, reply_timeout=WAIT)
        assert refused.value.by_peer

        stream = await session.open_stream({"x-test": "reset"}, reply_timeout=WAIT)
        await stream.write(b"!")
        with pytest.raises(StreamReset, match="by the peer: CANCEL"):
            await stream.read()

        await session.close()
        assert await finish(runner) is None
        lines = await go_lines(proc)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    assert proc.returncode == 0, lines
    assert "PING ok" in lines and "DONE" in lines, lines
    for n in range(4):
        assert any(re.fullmatch(rf"STREAM \d+ x-test=echo streamtype=s{n}", line) for line in lines), lines
        assert any(re.fullmatch(rf"ECHOED \d+ {512 * 1024 + n} err=<nil>", line) for line in lines), lines
    assert any(line.startswith("RESET ") for line in lines), lines


@pytest.mark.timeout(120)
async def test_interop_a_spdystream_client_against_our_server(interop_binary: Path) -> None:
    done = asyncio.get_running_loop().create_future()
    seen: list[dict[str, str]] = []

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        session = Session(reader, writer, client=False)
        runner = asyncio.create_task(session.run())
        try:
            async with asyncio.TaskGroup() as tg:
                while True:
                    try:
                        stream = await session.accept()
                    except SessionClosedError:
                        break
                    seen.append(stream.headers)
                    match stream.headers.get("x-test"):
                        case "echo":
                            await stream.reply({"x-got-streamtype": stream.headers.get("streamtype", "")})
                            tg.create_task(echo(stream))
                        case "reset":
                            await stream.reply()
                            await stream.read(1)
                            stream.reset()
                        case _:
                            stream.reset(REFUSED_STREAM)
            done.set_result(await finish(runner))
        except BaseException as e:
            done.set_exception(e)
            raise

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    proc = await asyncio.create_subprocess_exec(
        str(interop_binary), "client", str(port), str(384 * 1024), stdout=subprocess.PIPE
    )
    try:
        lines = await go_lines(proc)
        assert await asyncio.wait_for(done, WAIT) is None
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
        server.close()
    assert proc.returncode == 0, lines
    assert lines == ["PING ok", "ECHO ok", "REFUSED ok", "RESET ok", "DONE"], lines
    assert sorted(h["streamtype"] for h in seen if h.get("x-test") == "echo") == [f"data-{i}" for i in range(4)]
