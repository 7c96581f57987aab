"""Tests for `vkprovider.spdy.session`: many streams, windows and flow-control detection, PING, GOAWAY,
close and cancellation, and malformed or random frames against a live session.

Sessions talk over real socket pairs; malformed input comes from `RawPeer`, which speaks bare frames (`peers`).
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import re
import zlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.unit.vkprovider.spdy.peers import (
    WAIT,
    BytesReader,
    Collector,
    control,
    decode_all,
    echo,
    finish,
    raw_block,
    raw_peer,
    send_and_collect,
    session_pair,
    socket_pair,
    until,
)
from vkprovider.spdy.frames import (
    CANCEL,
    DEFAULT_WINDOW,
    FLAG_FIN,
    FLOW_CONTROL_ERROR,
    GOAWAY_PROTOCOL_ERROR,
    INVALID_STREAM,
    PROTOCOL_ERROR,
    SETTINGS_INITIAL_WINDOW_SIZE,
    STREAM_ALREADY_CLOSED,
    STREAM_IN_USE,
    DataFrame,
    Frame,
    GoAwayFrame,
    HeaderCompressor,
    HeadersFrame,
    PingFrame,
    RstStreamFrame,
    SessionClosedError,
    SettingsFrame,
    SpdyError,
    StreamReset,
    SynReplyFrame,
    SynStreamFrame,
    UnknownControlFrame,
    WindowUpdateFrame,
    encode_frame,
)
from vkprovider.spdy.session import Session

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
