"""Closing a listener loses no connection accepted just before (tidewire.server.listening):
on asyncio's own loop a connection accepted in one step gets its transport in the next, and a
server closed in between used to leave that socket open, served by nobody, until the garbage
collector found it (an unclosed-transport warning in whichever test ran then)."""

from __future__ import annotations

import asyncio
import gc
import socket
import warnings
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.server._support import serve
from tidewire.server.listening import close_listener

Closer = Callable[[asyncio.AbstractServer], None]


async def _close_between_accept_and_transport(
    server: asyncio.AbstractServer, port: int, close: Closer
) -> socket.socket:
    """Connect a client, then run ``close(server)`` after the loop has accepted the connection
    and before the accepted connection's transport is made (the step after)."""
    client = socket.create_connection(("127.0.0.1", port))  # in the listen backlog now
    client.settimeout(2)
    loop = asyncio.get_running_loop()
    closed = loop.create_future()

    def then_close() -> None:
        close(server)
        closed.set_result(None)

    # This step's callbacks run before the accept the next poll finds; the callback it
    # schedules runs after that accept, and before the transport's task it starts.
    loop.call_soon(lambda: loop.call_soon(then_close))
    await closed
    for _ in range(3):
        await asyncio.sleep(0)
    return client


def _ends(client: socket.socket) -> bool:
    """Whether the server's side of ``client`` is gone (closed or reset) within 2 s."""
    try:
        return client.recv(10) == b""
    except ConnectionError:
        return True
    except TimeoutError:
        return False


async def _raced(
    close: Closer,
) -> tuple[asyncio.AbstractServer, int, socket.socket, list[asyncio.StreamWriter]]:
    """A server that records the connections it is handed, closed by ``close`` between the
    accept of a client's connection and its transport: the server, its port, the client's
    socket, and the connections handed to the server."""
    served: list[asyncio.StreamWriter] = []

    async def handler(_: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        served.append(w)

    server = await asyncio.start_server(handler, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    client = await _close_between_accept_and_transport(server, port, close)
    return server, port, client, served


def test_a_plain_close_there_loses_the_connection() -> None:
    """The race itself, on this Python: without close_listener the accepted socket is lost
    (so the test below shows what close_listener changes)."""

    async def main() -> None:
        server, _, client, served = await _raced(lambda s: s.close())
        try:
            if served:
                pytest.skip("this Python makes the transport in the accepting step")
            assert not _ends(client)  # nobody serves it, and nobody closes it
        finally:
            client.close()
            await server.wait_closed()

    asyncio.run(main())
    with warnings.catch_warnings():  # the lost transport's warning: the point of this test
        warnings.simplefilter("ignore", ResourceWarning)
        gc.collect()


def test_close_listener_there_keeps_the_connection_and_refuses_new_ones() -> None:
    async def main() -> None:
        server, port, client, served = await _raced(close_listener)
        try:
            assert len(served) == 1  # it joined the server, which can end it
            with pytest.raises(ConnectionRefusedError):
                socket.create_connection(("127.0.0.1", port), timeout=2).close()
            served[0].close()
            await served[0].wait_closed()
            assert _ends(client)
        finally:
            client.close()
            await server.wait_closed()
        assert not server.is_serving()

    asyncio.run(main())


def test_close_listener_refuses_at_once() -> None:
    """New connections are refused from the call on, before the server's close runs."""

    async def main() -> None:
        server = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        close_listener(server)
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection(("127.0.0.1", port), timeout=2).close()
        await server.wait_closed()

    asyncio.run(main())


def test_the_binary_listener_ends_a_connection_accepted_as_it_stopped(tmp_path: Path) -> None:
    """TcpServer's stop: the connection accepted in the step before is drained with the
    others (it hears the broker going away and is closed), not left open."""

    async def main() -> None:
        async with serve(tmp_path) as (_, server):
            assert server._server is not None
            client = await _close_between_accept_and_transport(
                server._server, server.port, lambda _: server.stop_accepting()
            )
            try:
                await server.close(grace_s=1)
                data = b""
                while chunk := await asyncio.to_thread(client.recv, 65536):
                    data += chunk
                assert data  # the going-away error frame, then the close
            finally:
                client.close()

    asyncio.run(main())


def test_the_http_drain_ends_a_connection_accepted_as_it_stopped() -> None:
    """The HTTP gateway's drain tells a connection that joined its server after the drain
    began (accepted in the step before the listener stopped) to close, as it tells the
    others: the drain ends at once instead of waiting for the connection's header timeout
    (10 s) or the grace period."""
    from tidewire.server.http.gateway import HttpGateway

    async def app(scope: dict[str, object], receive: object, send: object) -> None:
        pass  # no request is made

    async def main() -> None:
        g = HttpGateway(grace_s=30)
        g.add_app("native", app, "127.0.0.1", 0)
        await g.start()
        uvicorn_server = g._listeners["native"].server
        assert uvicorn_server is not None
        server = uvicorn_server.servers[0]

        def stop(_: asyncio.AbstractServer) -> None:
            g.stop_accepting()
            g.begin_drain()

        loop = asyncio.get_running_loop()
        client = await _close_between_accept_and_transport(server, g.port, stop)
        try:
            assert g.connections() == 1
            started = loop.time()
            await g.wait_in_flight(started + 30)
            assert g.connections() == 0
            assert loop.time() - started < 5  # told to close, not timed out (10 s)
            await g.finish()
        finally:
            client.close()

    asyncio.run(main())
