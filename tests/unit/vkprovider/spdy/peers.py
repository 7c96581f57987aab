"""Test peers for the SPDY tests: byte fakes, connected session pairs and a raw-frame peer.

Sessions talk over real socket pairs (asyncio streams over `socket.socketpair()`); malformed input comes
from `RawPeer`, which speaks bare frames with its own header contexts. Not a test module: the test files of
`vkprovider.spdy` import from it.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any

from vkprovider.spdy.frames import Frame, FrameReader, HeaderCompressor, PingFrame, encode_frame
from vkprovider.spdy.session import Session
from vkprovider.spdy.stream import Stream

WAIT = 10.0  # seconds any single await in these tests may take before the test counts as hung


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


def raw_block(*pairs: tuple[bytes, bytes], count: int | None = None) -> bytes:
    out = (len(pairs) if count is None else count).to_bytes(4)
    for name, value in pairs:
        out += len(name).to_bytes(4) + name + len(value).to_bytes(4) + value
    return out


def control(frame_type: int, payload: bytes, *, version: int = 3, flags: int = 0) -> bytes:
    return (0x8000 | version).to_bytes(2) + frame_type.to_bytes(2) + (flags << 24 | len(payload)).to_bytes(4) + payload
