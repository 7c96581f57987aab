"""One SPDY/3.1 stream as the application sees it: reply, read, write, half-close, reset.

Owns a stream's state (replied, half-closed each way, reset), its receive buffer, its two windows, and
handing read bytes back to the peer with WINDOW_UPDATE. Does not: read frames, keep the session's
windows or decide what the peer's frames mean (`session`, whose reader updates the stream as frames
arrive), or frame anything (`frames`); Kubernetes stream semantics (`vkprovider.kubelet.streams`).

A Stream and its Session are the two halves of one state machine and share state both ways: the
session's reader fills a stream's buffer, moves its send window and marks FIN or reset; a stream sends
through the session and spends the session's send window. Streams are made only by their Session.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import TYPE_CHECKING

from vkprovider.spdy.frames import (
    CANCEL,
    FLAG_FIN,
    SEND_CHUNK,
    DataFrame,
    RstStreamFrame,
    SpdyError,
    StreamReset,
    SynReplyFrame,
    WindowUpdateFrame,
)

if TYPE_CHECKING:
    from vkprovider.spdy.session import Session


class Signal:
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
        self._wake = Signal()

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
