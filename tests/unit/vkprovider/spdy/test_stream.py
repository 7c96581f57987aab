"""Tests for `vkprovider.spdy.stream`: opening, replying, reading and writing both ways, half-close, reply
timeouts and resets, between two sessions over a socket pair (`peers`).
"""

from __future__ import annotations

import asyncio

import pytest

from tests.unit.vkprovider.spdy.peers import WAIT, session_pair, until
from vkprovider.spdy.frames import CANCEL, REFUSED_STREAM, SpdyError, StreamReset


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
