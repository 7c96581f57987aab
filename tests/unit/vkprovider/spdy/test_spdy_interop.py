"""Interop of `vkprovider.spdy` with github.com/moby/spdystream, the SPDY/3.1 library Kubernetes uses.

The tests build `tests/unit/spdy_interop/` (a spdystream peer in Go) once into `.cache/spdyinterop/` and run
our client against its server and our server against its client over loopback TCP.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import random
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.paths import REPO
from tests.unit.vkprovider.spdy.peers import WAIT, echo, finish, send_and_collect
from vkprovider.spdy.frames import REFUSED_STREAM, SessionClosedError, StreamReset
from vkprovider.spdy.session import Session

INTEROP_SRC = REPO / "tests" / "unit" / "spdy_interop"


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
