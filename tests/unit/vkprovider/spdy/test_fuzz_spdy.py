"""Generated bad SPDY/3.1 input: mutated valid sessions, truncations, huge lengths, bad zlib.

Owns the properties that `vkprovider.spdy` (its `FrameReader` and `Session`) answers hostile bytes with a
protocol error (`SpdyError`, never the INTERNAL_ERROR the session's read loop maps its own bugs to, never
another exception), never hangs (every await is bounded by a timeout that fails the test), never reads a
payload it will refuse (an announced length beyond the limit is refused from the 8-byte header alone), and
keeps memory bounded on decompression bombs. test_frames.py fuzzes the decoder with random bytes and
test_session.py a session with random frames; this file starts from a realistic exchange and mutates it.
Hypothesis runs derandomized with explicit `max_examples`; counts are in docs/reliability.md.
"""

from __future__ import annotations

import asyncio
import contextlib
import tracemalloc
import zlib

from hypothesis import example, given, settings
from hypothesis import strategies as st

from tests.unit.vkprovider.spdy.peers import BytesReader, Collector, decode_all
from vkprovider.spdy.frames import (
    FLAG_FIN,
    FRAME_TOO_LARGE,
    HEADER_DICTIONARY,
    INTERNAL_ERROR,
    MAX_HEADER_BLOCK,
    SETTINGS_INITIAL_WINDOW_SIZE,
    DataFrame,
    Frame,
    FrameReader,
    GoAwayFrame,
    HeaderBlockError,
    HeaderCompressor,
    HeadersFrame,
    PingFrame,
    RstStreamFrame,
    SettingsFrame,
    SpdyError,
    SynReplyFrame,
    SynStreamFrame,
    UnknownControlFrame,
    WindowUpdateFrame,
    encode_frame,
)
from vkprovider.spdy.session import Session

WAIT = 10.0  # seconds: any await longer than this counts as a hang


def bounded(n: int) -> settings:
    """Deterministic, bounded hypothesis settings: `n` generated cases, no deadline, no database."""
    return settings(max_examples=n, derandomize=True, deadline=None, database=None)


#: What an API server sends a virtual kubelet for `kubectl exec -i` (client side, odd stream ids).
TRANSCRIPT: list[Frame] = [
    SettingsFrame(((0, SETTINGS_INITIAL_WINDOW_SIZE, 1 << 20),)),
    PingFrame(1),
    SynStreamFrame(1, {"streamtype": "error", "requestid": "0"}),
    SynStreamFrame(3, {"streamtype": "stdin", "requestid": "0"}),
    SynStreamFrame(5, {"streamtype": "stdout", "requestid": "0"}, FLAG_FIN),
    SynStreamFrame(7, {"streamtype": "resize", "requestid": "0"}),
    DataFrame(3, b"echo hello\n"),
    DataFrame(7, b'{"Width":80,"Height":24}'),
    WindowUpdateFrame(5, 65536),
    WindowUpdateFrame(0, 65536),
    HeadersFrame(3, {"x-extra": "1"}),
    DataFrame(3, b"", FLAG_FIN),
    RstStreamFrame(7, 5),
    UnknownControlFrame(0x0A, 0, b"\x00\x00"),
    PingFrame(3),
    GoAwayFrame(7),
]


def transcript() -> bytes:
    compressor = HeaderCompressor()
    return b"".join(encode_frame(f, compressor) for f in TRANSCRIPT)


WIRE = transcript()

_edits = st.lists(
    st.one_of(
        st.tuples(st.just("flip"), st.integers(0, len(WIRE) - 1), st.integers(1, 255)),
        st.tuples(st.just("cut"), st.integers(0, len(WIRE) - 1), st.integers(1, 64)),
        st.tuples(st.just("insert"), st.integers(0, len(WIRE) - 1), st.integers(0, 255)),
        st.tuples(st.just("truncate"), st.integers(0, len(WIRE) - 1), st.just(0)),
    ),
    min_size=1,
    max_size=4,
)


def mutate(wire: bytes, edits: list[tuple[str, int, int]]) -> bytes:
    out = bytearray(wire)
    for kind, pos, arg in edits:
        pos %= max(len(out), 1)
        if kind == "flip" and out:
            out[pos] = (out[pos] + arg) % 256
        elif kind == "cut":
            del out[pos : pos + arg]
        elif kind == "insert":
            out[pos:pos] = bytes([arg])
        elif kind == "truncate":
            del out[pos:]
    return bytes(out)


async def run_server(wire: bytes, *, client: bool = False, peer_flow_control: bool | None = None) -> Collector:
    """A Session fed `wire` to its end; SpdyError is fine, an internal error, another exception or a hang is not."""
    out = Collector()
    session = Session(
        BytesReader(wire), out, client=client, max_frame_bytes=64 * 1024, peer_flow_control=peer_flow_control
    )

    async def drain_accepts() -> None:  # an application that takes and reads every stream (no back-pressure stall)
        with contextlib.suppress(SpdyError):
            while True:
                stream = await session.accept()
                with contextlib.suppress(SpdyError):
                    await stream.read()

    acceptor = asyncio.create_task(drain_accepts())
    try:
        async with asyncio.timeout(WAIT):
            await session.run()
    except SpdyError as e:
        assert e.status != INTERNAL_ERROR, f"a bug in the session, not a protocol error: {e!r} from {e.__cause__!r}"
    finally:
        acceptor.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await acceptor
    assert session.closed.is_set() and out.closed
    return out


async def test_the_unmutated_transcript_is_served_cleanly() -> None:
    out = await run_server(WIRE)
    assert all(not isinstance(f, UnknownControlFrame) for f in await decode_all(bytes(out.data)))


@bounded(120)
@given(_edits, st.sampled_from([None, True, False]))
@example([("flip", 3, 1)], None)  # the first frame's type: an unknown control frame, ignored
@example([("flip", 5, 0x7F)], None)  # SETTINGS length: the stream falls out of step
@example([("truncate", len(WIRE) // 2, 0)], False)
async def test_a_mutated_session_ends_with_a_protocol_error_or_eof(
    edits: list[tuple[str, int, int]], flow_control: bool | None
) -> None:
    out = await run_server(mutate(WIRE, edits), peer_flow_control=flow_control)
    for frame in await decode_all(bytes(out.data)):  # what it answered is well-formed
        assert not isinstance(frame, UnknownControlFrame)


@bounded(60)
@given(st.integers(0, len(WIRE)))
async def test_every_truncation_is_a_clean_eof_or_a_protocol_error(cut: int) -> None:
    reader = FrameReader(BytesReader(WIRE[:cut]))
    frames: list[Frame] = []
    try:
        async with asyncio.timeout(WAIT):
            while (frame := await reader.read_frame()) is not None:
                frames.append(frame)
    except SpdyError as e:
        assert "connection closed" in str(e), e
    assert frames == TRANSCRIPT[: len(frames)]


class CountingReader(BytesReader):
    """Remembers how many bytes were asked for: a refused frame's payload must never be read."""

    def __init__(self, data: bytes) -> None:
        super().__init__(data)
        self.asked = 0

    async def readexactly(self, n: int) -> bytes:
        self.asked += n
        return await super().readexactly(n)


@bounded(60)
@given(st.integers(4097, 0xFFFFFF), st.booleans(), st.integers(0, 255))
@example(0xFFFFFF, True, 0)
@example(4097, False, 1)
async def test_a_huge_announced_length_is_refused_from_the_header_alone(length: int, control: bool, flags: int) -> None:
    word = (0x8003_0001 if control else 0x0000_0001).to_bytes(4)
    reader = CountingReader(word + (flags << 24 | length).to_bytes(4) + b"\x00" * 16)
    frames = FrameReader(reader, max_frame_bytes=4096)
    try:
        await frames.read_frame()
    except SpdyError as e:
        assert e.status == FRAME_TOO_LARGE
    else:
        raise AssertionError("a frame beyond the limit was accepted")
    assert reader.asked == 8, "the payload was read although the frame was refused"


def control(frame_type: int, payload: bytes) -> bytes:
    return (0x8003).to_bytes(2) + frame_type.to_bytes(2) + len(payload).to_bytes(4) + payload


_block = st.one_of(
    st.binary(max_size=200),
    st.binary(max_size=100).map(lambda b: zlib.compressobj(zdict=HEADER_DICTIONARY).compress(b)),
    st.binary(max_size=100).map(
        lambda b: (z := zlib.compressobj(zdict=HEADER_DICTIONARY)).compress(b) + z.flush(zlib.Z_SYNC_FLUSH)
    ),
    st.binary(max_size=100).map(lambda b: zlib.compress(b)),  # no dictionary
    st.binary(max_size=100).map(lambda b: zlib.compress(b)[:-4]),
)


@bounded(80)
@given(st.sampled_from([1, 2, 8]), st.integers(0, 8), _block)
@example(1, 1, b"not zlib")
@example(2, 1, zlib.compress(b"\x00\x00\x00\x01"))  # a complete stream: what follows cannot continue it
async def test_a_bad_header_block_is_a_protocol_error(frame_type: int, sid: int, block: bytes) -> None:
    fixed = sid.to_bytes(4) + (b"\x00" * 6 if frame_type == 1 else b"")
    reader = FrameReader(BytesReader(control(frame_type, fixed + block)))
    try:
        async with asyncio.timeout(WAIT):
            frame = await reader.read_frame()
    except HeaderBlockError as e:
        assert e.stream_id == sid and e.frame_type == frame_type  # a stream error: the session goes on
    except SpdyError as e:
        assert str(e)
    else:
        assert isinstance(frame, SynStreamFrame | SynReplyFrame | HeadersFrame)


@bounded(8)
@given(st.integers(MAX_HEADER_BLOCK + 1, 4 * MAX_HEADER_BLOCK), st.sampled_from([b"\x00", b"a", b"\xff\xfe"]))
@example(32 * MAX_HEADER_BLOCK, b"\x00")
async def test_a_decompression_bomb_is_refused_in_bounded_memory(size: int, fill: bytes) -> None:
    z = zlib.compressobj(level=9, zdict=HEADER_DICTIONARY)
    bomb = z.compress(fill * size) + z.flush(zlib.Z_SYNC_FLUSH)
    assert len(bomb) < 100 * 1024  # a small frame...
    wire = control(2, (1).to_bytes(4) + bomb)
    tracemalloc.start()
    try:
        reader = FrameReader(BytesReader(wire))
        try:
            await reader.read_frame()
        except SpdyError as e:
            assert "more than" in str(e)
        else:
            raise AssertionError("a header block beyond the limit was accepted")
        _current, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 4 * MAX_HEADER_BLOCK + len(wire), f"...must not cost {peak} bytes"  # ...nor its expansion
