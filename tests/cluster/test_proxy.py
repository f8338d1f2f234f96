"""The fault-injection proxy itself: it forwards, delays in order, blackholes (writes succeed,
nothing arrives), refuses, cuts current connections with a reset, and heals."""

from __future__ import annotations

import asyncio
import logging
import sys
import time

import pytest

from tests.cluster._proxy import Proxy


async def _echo_server() -> tuple[asyncio.Server, int]:
    async def echo(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        try:
            while data := await r.read(65536):
                w.write(data)
                await w.drain()
        except ConnectionError:
            pass
        finally:
            w.close()

    server = await asyncio.start_server(echo, "127.0.0.1", 0)
    return server, server.sockets[0].getsockname()[1]


async def _closed(r: asyncio.StreamReader) -> bool:
    """Whether the connection ends (reset or closed) within 5 s."""
    try:
        return await asyncio.wait_for(r.read(10), 5) == b""
    except ConnectionError:
        return True


def test_forward_delay_blackhole_refuse_cut_heal() -> None:
    async def main() -> None:
        server, port = await _echo_server()
        proxy = await Proxy("127.0.0.1", port).start()
        try:
            r, w = await asyncio.open_connection("127.0.0.1", proxy.port)
            w.write(b"hello")
            assert await asyncio.wait_for(r.readexactly(5), 5) == b"hello"

            proxy.delay_s = 0.2
            t0 = time.monotonic()
            for part in (b"a", b"b", b"c"):
                w.write(part)
            got = b""
            while len(got) < 3:
                got += await asyncio.wait_for(r.read(3), 5)
            assert got == b"abc"
            assert time.monotonic() - t0 >= 0.2

            proxy.heal()
            proxy.blackhole()
            w.write(b"lost")
            await w.drain()  # the write itself succeeds
            with pytest.raises(TimeoutError):
                await asyncio.wait_for(r.read(10), 0.5)

            proxy.heal()
            w.write(b"again")
            assert await asyncio.wait_for(r.readexactly(5), 5) == b"again"

            proxy.cut()
            assert await _closed(r), "a cut connection is reset"
            w.close()

            proxy.refuse()
            r2, w2 = await asyncio.open_connection("127.0.0.1", proxy.port)
            assert await _closed(r2)  # closed at once
            w2.close()

            proxy.heal()
            r3, w3 = await asyncio.open_connection("127.0.0.1", proxy.port)
            w3.write(b"back")
            assert await asyncio.wait_for(r3.readexactly(4), 5) == b"back"
            w3.close()
        finally:
            await proxy.close()
            server.close()
            await server.wait_closed()

    asyncio.run(main())


_FOREIGN = """
import socket, sys
s = socket.create_connection(("127.0.0.1", int(sys.argv[1])), 5)
s.settimeout(float(sys.argv[2]))
s.sendall(b"ping")
try:
    print(s.recv(10).decode() or "closed")
except TimeoutError:
    print("timeout")
except ConnectionError:
    print("reset")
"""


def test_isolate_passes_own_connections_and_rejoin_resets_starved_ones() -> None:
    """``isolate()`` starves another process's connection while this process's still echoes;
    ``rejoin()`` resets the connection whose bytes were thrown away."""

    async def foreign(port: int, wait_s: float) -> asyncio.subprocess.Process:
        return await asyncio.create_subprocess_exec(
            sys.executable, "-c", _FOREIGN, str(port), str(wait_s), stdout=asyncio.subprocess.PIPE
        )

    async def main() -> None:
        server, port = await _echo_server()
        proxy = await Proxy("127.0.0.1", port).start()
        try:
            r, w = await asyncio.open_connection("127.0.0.1", proxy.port)
            proxy.isolate()
            w.write(b"mine")
            assert await asyncio.wait_for(r.readexactly(4), 5) == b"mine"
            starved = await foreign(proxy.port, 1.0)
            out, _ = await asyncio.wait_for(starved.communicate(), 30)
            assert out.decode().strip() == "timeout"
            cut = await foreign(proxy.port, 30.0)
            for _ in range(300):  # until its bytes were thrown away
                if proxy._dropped:
                    break
                await asyncio.sleep(0.05)
            proxy.rejoin()
            out, _ = await asyncio.wait_for(cut.communicate(), 30)
            assert out.decode().strip() in ("reset", "closed")
            w.write(b"still")
            assert await asyncio.wait_for(r.readexactly(5), 5) == b"still"
            w.close()
        finally:
            await proxy.close()
            server.close()
            await server.wait_closed()

    asyncio.run(main())


def test_close_ends_a_connection_still_being_accepted(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A connection the proxy accepted while its way upstream is still opening is ended by
    close() (it used to stay open, its task running on, its sockets left to the garbage
    collector once the loop was gone: an unclosed-transport warning in a later test), and
    quietly: no error logged for its cancelled task."""
    opening = asyncio.Event()
    opened = asyncio.Event()  # never set: the upstream connect hangs until cancelled
    real_open = asyncio.open_connection

    async def slow_open(*args: object, **kwargs: object) -> object:
        opening.set()
        await opened.wait()
        return await real_open(*args, **kwargs)  # type: ignore[arg-type]

    async def main() -> None:
        server, port = await _echo_server()
        proxy = await Proxy("127.0.0.1", port).start()
        monkeypatch.setattr(asyncio, "open_connection", slow_open)
        try:
            r, w = await real_open("127.0.0.1", proxy.port)
            await asyncio.wait_for(opening.wait(), 5)
            await asyncio.wait_for(proxy.close(), 5)
            assert not proxy._tasks
            assert await _closed(r)
            w.close()
            await asyncio.sleep(0)  # the stream protocol's callback for the ended task
            assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == []
        finally:
            monkeypatch.undo()
            server.close()
            await server.wait_closed()

    asyncio.run(main())
