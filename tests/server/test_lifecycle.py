"""Stopping the server: it stops accepting, finishes what is in flight (a long-poll included,
without sitting out its wait or the close grace) and closes every connection, telling each
client why (a ``ShuttingDownError`` error frame).
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from tests.server._support import (
    ALL,
    LONG_POLL_MS,
    PROMPT_S,
    Client,
    reset,
    serve,
)
from tidewire.errors import ShuttingDownError
from tidewire.protocol import ResponseReceived
from tidewire.protocol.messages import CreateTopicRequest, FetchPartition, FetchRequest

#: How long close() may take with a long-poll in flight: far below both the poll's 30 s and
#: close()'s default 10 s grace, so only a close that ends the wait passes.
CLOSE_BOUND_S = 2.0


def test_close_closes_idle_connections_and_stops_accepting(tmp_path: Path) -> None:
    async def main() -> None:
        async with serve(tmp_path) as (_, server):
            port = server.port
            async with Client.connect(server) as a, Client.connect(server) as b:
                await a.ping()
                await b.ping()
                await asyncio.wait_for(server.close(), PROMPT_S)
                assert_going_away(await a.until_closed())
                assert_going_away(await b.until_closed())
            with pytest.raises(ConnectionRefusedError):
                await asyncio.open_connection("127.0.0.1", port)

    asyncio.run(main())


def test_close_finishes_an_in_flight_long_poll(tmp_path: Path) -> None:
    async def main() -> None:
        async with serve(tmp_path) as (_, server), Client.connect(server) as c:
            await c.call(CreateTopicRequest(name="t"))
            fetch = c.send(
                FetchRequest(max_wait_ms=LONG_POLL_MS, partitions=[FetchPartition("t", 0, 0, ALL)])
            )
            await c.ping()  # sent after the fetch, so the fetch is waiting by now
            closing = asyncio.ensure_future(server.close())
            try:
                # The fetch is answered (with nothing), then the connection is closed.
                event = await c.response(fetch, timeout=CLOSE_BOUND_S)
                assert event.error is None
                assert event.body.partitions[0].size == 0
                assert_going_away(await c.until_closed(timeout=CLOSE_BOUND_S))
                await asyncio.wait_for(asyncio.shield(closing), CLOSE_BOUND_S)
            finally:
                # A reset ends the fetch for a server that still waits on it (an end of
                # stream would not: it may be a half-close), so close() returns at once.
                reset(c.writer)
                await closing

    asyncio.run(main())


def assert_going_away(events: list[ResponseReceived]) -> None:
    """The last thing a drained connection hears: the broker is shutting down (retriable)."""
    assert len(events) == 1, events
    assert events[0].correlation_id == -1
    assert isinstance(events[0].error, ShuttingDownError)
    assert events[0].error.retriable
