"""Shared helpers of the TCP server tests: a real broker and server on port 0 that are always
stopped, a protocol client over asyncio streams (a client-side :class:`Connection`), raw
sockets for hostile clients and the decoding of the error frame that ends a connection.

Every test runs its own event loop (``asyncio.run``). Nothing sleeps except where a timeout is
the thing under test; whatever should happen promptly is bounded by :data:`PROMPT_S`. A
long-poll is known to be waiting without looking inside the broker: requests on one connection
start in the order they were sent, so once a ping sent after the fetch is answered, the fetch
has reached its wait.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
from collections.abc import AsyncIterator, Callable, Coroutine, Sequence
from pathlib import Path
from typing import Any, TypeVar

from tidewire.broker import Broker, BrokerConfig
from tidewire.protocol import NEED_DATA, Connection, ConnectionClosed, ResponseReceived, Role
from tidewire.protocol.frames import FLAG_ERROR, FrameDecoder, FrameType
from tidewire.protocol.messages import (
    Body,
    ErrorBody,
    FetchPartition,
    FetchRequest,
    FetchResponse,
    PingRequest,
    PingResponse,
    decode_body,
)
from tidewire.records import BatchBuilder, Record, iter_batches, iter_records
from tidewire.server import ServerConfig, TcpServer

#: Record timestamps sit around this (ms since the epoch).
T0 = 1_700_000_000_000
#: The bound on anything that should happen at once (s): generous for a loaded CI machine,
#: far below the 30 s long-polls and the 10 s close grace these tests would otherwise sit out.
PROMPT_S = 5.0
#: A long-poll's max wait (ms) that no test should ever sit out.
LONG_POLL_MS = 30_000
#: A fetch budget that never limits anything in these tests.
ALL = 1 << 24
#: Tiny timeouts for the tests whose subject is a timeout (s).
TINY_TIMEOUT_S = 0.2

T = TypeVar("T")


@contextlib.asynccontextmanager
async def serve(
    tmp_path: Path, *, broker: dict[str, Any] | None = None, **server: Any
) -> AsyncIterator[tuple[Broker, TcpServer]]:
    """A started broker over ``tmp_path/data`` and a server on 127.0.0.1, port 0; both are
    stopped on the way out, whatever happens.

    Args:
        broker: extra :class:`BrokerConfig` settings.
        server: extra :class:`ServerConfig` settings.
    """
    config = BrokerConfig(data_dir=str(tmp_path / "data"), **(broker or {}))
    async with (
        Broker(config) as b,
        TcpServer(b, ServerConfig(host="127.0.0.1", port=0, **server)) as s,
    ):
        yield b, s


async def close_writer(writer: asyncio.StreamWriter) -> None:
    """Close a stream; a connection the server reset is closed all the same."""
    writer.close()
    with contextlib.suppress(ConnectionError):
        await writer.wait_closed()


def reset(writer: asyncio.StreamWriter) -> None:
    """Drop a connection with a reset (RST), as a crashed peer's kernel would; a plain close
    sends an end of stream, which the server takes for a possible half-close."""
    sock = writer.get_extra_info("socket")
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()


@contextlib.asynccontextmanager
async def raw_connection(
    server: TcpServer,
) -> AsyncIterator[tuple[asyncio.StreamReader, asyncio.StreamWriter]]:
    """A plain TCP connection to ``server``, closed on the way out."""
    reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
    try:
        yield reader, writer
    finally:
        await close_writer(writer)


async def read_until_closed(reader: asyncio.StreamReader, timeout: float = PROMPT_S) -> bytes:
    """Everything the server sends until it closes the connection (a reset ends it too).

    Raises:
        TimeoutError: the server kept the connection open for ``timeout`` seconds.
    """
    out = bytearray()

    async def drain() -> None:
        while True:
            try:
                chunk = await reader.read(65536)
            except ConnectionResetError:
                return
            if not chunk:
                return
            out.extend(chunk)

    await asyncio.wait_for(drain(), timeout)
    return bytes(out)


def closing_error(data: bytes) -> ErrorBody:
    """The ErrorBody of ``data``, which must be exactly one connection-closing error frame:
    a response with the error flag, api key -1, version 0, correlation id -1, no data."""
    decoder = FrameDecoder()
    decoder.receive_data(data)
    frame = decoder.next_frame()
    assert frame is not None, f"no whole frame in {data!r}"
    assert decoder.next_frame() is None
    assert decoder.buffered == 0, f"{decoder.buffered} bytes after the error frame"
    assert frame.frame_type is FrameType.RESPONSE
    assert frame.flags == FLAG_ERROR
    assert (frame.api_key, frame.api_version, frame.correlation_id) == (-1, 0, -1)
    assert len(frame.data) == 0
    body = decode_body(ErrorBody, frame.body)
    assert isinstance(body, ErrorBody)
    return body


class Client:
    """One protocol connection to the server, driven through a client-side
    :class:`Connection`: requests are written at once, responses are matched by correlation id
    (whatever order they come in)."""

    def __init__(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, conn: Connection
    ) -> None:
        self.reader = reader
        self.writer = writer
        self.conn = conn
        #: Responses read while waiting for another one, by correlation id.
        self.early: dict[int, ResponseReceived] = {}
        #: Correlation ids in the order their responses arrived.
        self.arrivals: list[int] = []

    @classmethod
    @contextlib.asynccontextmanager
    async def connect(cls, server: TcpServer, **conn_kwargs: Any) -> AsyncIterator[Client]:
        """A client connected to ``server``, closed on the way out."""
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        try:
            yield cls(reader, writer, Connection(Role.CLIENT, **conn_kwargs))
        finally:
            await close_writer(writer)

    def send(self, body: Body, data: Sequence[bytes] = ()) -> int:
        """Write one request (not drained); return its correlation id."""
        corr, buffers = self.conn.send_request(body, data)
        self.writer.writelines(buffers)
        return corr

    async def next_event(self) -> ResponseReceived | ConnectionClosed:
        """The next response, or ConnectionClosed once the server closed the connection."""
        while True:
            event = self.conn.next_event()
            if event is NEED_DATA:
                try:
                    chunk = await self.reader.read(65536)
                except ConnectionResetError:
                    chunk = b""
                self.conn.receive_data(chunk)
                continue
            assert isinstance(event, ResponseReceived | ConnectionClosed), event
            return event

    async def response(self, corr: int, timeout: float = PROMPT_S) -> ResponseReceived:
        """The response to request ``corr``, keeping the others that come first."""

        async def wait() -> ResponseReceived:
            while corr not in self.early:
                event = await self.next_event()
                assert isinstance(event, ResponseReceived), "the server closed the connection"
                assert event.correlation_id != -1, f"the server closed with {event.error!r}"
                self.arrivals.append(event.correlation_id)
                self.early[event.correlation_id] = event
            return self.early.pop(corr)

        return await asyncio.wait_for(wait(), timeout)

    async def rpc(self, body: Body, data: Sequence[bytes] = ()) -> ResponseReceived:
        """Send one request and return its response, whatever it is."""
        corr = self.send(body, data)
        await self.writer.drain()
        return await self.response(corr)

    async def call(self, body: Body, data: Sequence[bytes] = ()) -> Any:
        """Send one request and return its response body; an error response fails the test."""
        event = await self.rpc(body, data)
        assert event.error is None, f"{type(body).__name__} failed: {event.error!r}"
        return event.body

    async def ping(self) -> None:
        """One round trip: the connection works."""
        assert isinstance(await self.call(PingRequest()), PingResponse)

    async def fetch(
        self, topic: str, partition: int, offset: int = 0, *, max_wait_ms: int = 0
    ) -> tuple[FetchResponse, bytes]:
        """Fetch one partition; return the response body and the data section."""
        request = FetchRequest(
            max_wait_ms=max_wait_ms, partitions=[FetchPartition(topic, partition, offset, ALL)]
        )
        event = await self.rpc(request)
        assert event.error is None, event.error
        assert isinstance(event.body, FetchResponse)
        return event.body, bytes(event.data)

    async def until_closed(self, timeout: float = PROMPT_S) -> list[ResponseReceived]:
        """Every response until the server closes the connection."""
        out: list[ResponseReceived] = []

        async def wait() -> None:
            while True:
                event = await self.next_event()
                if isinstance(event, ConnectionClosed):
                    return
                out.append(event)

        await asyncio.wait_for(wait(), timeout)
        return out


def batch(values: Sequence[bytes], *, timestamp_ms: int = T0) -> bytes:
    """One uncompressed batch of ``values``, all stamped ``timestamp_ms``."""
    builder = BatchBuilder()
    for v in values:
        builder.append(v, timestamp_ms=timestamp_ms)
    return builder.build()


def split_batches(data: bytes) -> list[bytes]:
    """The whole batches of a fetch's data, each CRC-checked; fails on a partial batch."""
    out: list[bytes] = []
    end = 0
    for pos, header in iter_batches(data):
        assert pos == end
        out.append(data[pos : pos + header.size])
        end = pos + header.size
    assert end == len(data), f"{len(data) - end} bytes of a partial batch at the end"
    return out


def records(data: bytes) -> list[Record]:
    """Every record of the whole batches of ``data``, in order."""
    return [r for b in split_batches(data) for r in iter_records(b)]


async def read_partition(client: Client, topic: str, partition: int) -> list[Record]:
    """Every record of one partition from offset 0 to its high watermark, fetch by fetch."""
    out: list[Record] = []
    offset = 0
    while True:
        body, data = await client.fetch(topic, partition, offset)
        (result,) = body.partitions
        assert result.error_code == 0, result.error_message
        got = [r for r in records(data) if r.offset >= offset]
        out.extend(got)
        if got:
            offset = got[-1].offset + 1
        if offset >= result.high_watermark:
            return out
        assert got, f"no progress at offset {offset} below {result.high_watermark}"


async def until(predicate: Callable[[], bool], timeout: float = PROMPT_S) -> None:
    """Yield to the event loop until ``predicate()`` holds (nothing is slept for).

    Raises:
        TimeoutError: it did not hold within ``timeout`` seconds.
    """

    async def wait() -> None:
        while not predicate():
            await asyncio.sleep(0)

    await asyncio.wait_for(wait(), timeout)


async def while_working(good: Client, work: Coroutine[Any, Any, T]) -> T:
    """Run ``work`` while ``good`` pings the server again and again (at least once): whatever
    ``work`` waits for, the server keeps answering other connections. Returns its result."""
    async with asyncio.TaskGroup() as tg:
        task = tg.create_task(work)
        await good.ping()
        while not task.done():
            await good.ping()
    return task.result()
