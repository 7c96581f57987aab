"""Tests for `vkprovider.spdy.frames`: the header dictionary, every frame's round trip, header blocks and
their compression contexts, and the decoder against malformed and random bytes (`peers` supplies the fakes).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import re
import shutil
import subprocess
import zlib
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.unit.vkprovider.spdy.peers import WAIT, BytesReader, control, decode_all, raw_block
from vkprovider.spdy.frames import (
    CANCEL,
    FLAG_FIN,
    FLAG_UNIDIRECTIONAL,
    GOAWAY_PROTOCOL_ERROR,
    HEADER_DICTIONARY,
    SETTINGS_INITIAL_WINDOW_SIZE,
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
    SettingsFrame,
    SpdyError,
    SynReplyFrame,
    SynStreamFrame,
    UnknownControlFrame,
    WindowUpdateFrame,
    decode_header_block,
    encode_frame,
    encode_header_block,
)

#: sha256 of spdystream v0.5.1's spdy/dictionary.go headerDictionary (1423 bytes).
DICTIONARY_SHA256 = "51d27341373f923f3cd88e1eb7162aeaa3723d7585ff2399201dc06498407f02"
#: Frames written by spdystream v0.5.1's framer (one zlib context): SYN_STREAM 1 {streamtype: error},
#: then SYN_REPLY 1 {port: 8080}.
GO_SYN_STREAM = bytes.fromhex(
    "80030001000000290000000100000000000078f9e3c6a7c26260606004a7b392a2d4c45c6851c29a0a0a6800000000ffff"
)
GO_SYN_REPLY = bytes.fromhex("800300020000001600000001824ab114e41781738185818501000000ffff")


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
