"""Hostile and broken clients: garbage, impossible lengths, oversized frames, frames left
half-sent or dripped byte by byte, idle connections, a reused correlation id, too many
connections, a client that vanishes mid-request. Each bad connection gets the error frame that
ends a connection (correlation id -1, an ErrorBody with the right code) or is closed outright,
and a good client on another connection keeps working throughout.
"""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path

import msgspec
import pytest

from tests.server._support import (
    ALL,
    LONG_POLL_MS,
    PROMPT_S,
    TINY_TIMEOUT_S,
    Client,
    batch,
    closing_error,
    raw_connection,
    read_until_closed,
    records,
    reset,
    serve,
    until,
    while_working,
)
from tidewire.errors import FrameTooLargeError, ProtocolError
from tidewire.protocol import ResponseReceived
from tidewire.protocol.frames import FRAME_HEADER, FrameType, encode_frame
from tidewire.protocol.messages import (
    ApiKey,
    CreateTopicRequest,
    FetchPartition,
    FetchRequest,
    PingRequest,
    ProducePartition,
    ProduceRequest,
)
from tidewire.server import TcpServer

PING_BODY = b"\x80"  # msgpack {}: PingRequest has no fields


def _header(  # noqa: PLR0917 - the header's fields, in their wire order
    length: int,
    frame_type: int = FrameType.REQUEST,
    flags: int = 0,
    api_key: int = ApiKey.PING,
    corr: int = 1,
    body_length: int = 1,
) -> bytes:
    return FRAME_HEADER.pack(length, frame_type, flags, api_key, 0, corr, body_length)


def _ping_frame(corr: int = 1) -> bytes:
    return _header(15, corr=corr) + PING_BODY


def _frame(body: bytes, *, api_key: int = ApiKey.PING, corr: int = 1) -> bytes:
    return b"".join(bytes(b) for b in encode_frame(FrameType.REQUEST, api_key, 0, corr, body))


def _response(api_key: int, corr: int, body: bytes) -> bytes:
    return b"".join(bytes(b) for b in encode_frame(FrameType.RESPONSE, api_key, 0, corr, body))


async def _works(good: Client) -> None:
    """The good client can still do real work: a produce is acknowledged and its record read
    back."""
    data = batch([b"still here"])
    resp = await good.call(
        ProduceRequest(partitions=[ProducePartition("good", 0, len(data))]), [data]
    )
    (result,) = resp.results
    assert result.error_code == 0
    _, raw = await good.fetch("good", 0, result.base_offset)
    assert records(raw)[0].value == b"still here"


async def _one_good_connection(server: TcpServer) -> None:
    await until(lambda: len(server.connections) == 1)


GARBAGE = {
    "http request": (b"GET / HTTP/1.1\r\nHost: tidewire\r\n\r\n", FrameTooLargeError),
    "negative length": (b"\xde\xad\xbe\xef" * 8, ProtocolError),
    "length 0": (b"\x00" * 32, ProtocolError),
    "length 5": (b"\x00\x00\x00\x05garbage", ProtocolError),
    "length 13": ((13).to_bytes(4, "big") + b"x" * 13, ProtocolError),
    "unknown frame type": (_header(15, frame_type=7) + PING_BODY, ProtocolError),
    "unknown flag": (_header(15, flags=0x80) + PING_BODY, ProtocolError),
    "error flag on a request": (_header(15, flags=0x01) + PING_BODY, ProtocolError),
    "body longer than the frame": (_header(15, body_length=100) + PING_BODY, ProtocolError),
    "negative body length": (_header(15, body_length=-1) + PING_BODY, ProtocolError),
    "response frame": (_header(15, frame_type=FrameType.RESPONSE) + PING_BODY, ProtocolError),
    "push frame": (_header(15, frame_type=FrameType.PUSH) + PING_BODY, ProtocolError),
    "negative correlation id": (_header(15, corr=-1) + PING_BODY, ProtocolError),
    "garbage after a good frame": (_ping_frame() + b"\xff" * 20, ProtocolError),
}


@pytest.mark.parametrize("name", list(GARBAGE))
def test_garbage_gets_an_error_frame_and_is_closed(tmp_path: Path, name: str) -> None:
    garbage, error = GARBAGE[name]

    async def main() -> None:
        async with serve(tmp_path) as (_, server), Client.connect(server) as good:
            await _works(good)
            async with raw_connection(server) as (reader, writer):
                writer.write(garbage)
                await writer.drain()
                sent = await read_until_closed(reader)
            # The good frame before the garbage may be answered, or dropped with the
            # connection: either way the error frame comes last.
            answer = _response(ApiKey.PING, 1, PING_BODY)
            if name == "garbage after a good frame" and sent.startswith(answer):
                sent = sent[len(answer) :]
            err = closing_error(sent)
            assert err.error_code == error.code, err
            assert err.error_message
            await _one_good_connection(server)
            await _works(good)

    asyncio.run(main())


def test_frame_larger_than_max_frame_bytes(tmp_path: Path) -> None:
    limit = 4096

    def padded_ping(total: int) -> bytes:
        """A ping of exactly ``total`` bytes: unknown body fields are ignored."""
        overhead = len(_frame(msgspec.msgpack.encode({"pad": "x" * 1000}))) - 1000
        frame = _frame(msgspec.msgpack.encode({"pad": "x" * (total - overhead)}))
        assert len(frame) == total
        return frame

    async def main() -> None:
        async with (
            serve(tmp_path, max_frame_bytes=limit) as (_, server),
            Client.connect(server) as good,
        ):
            await _works(good)
            # Exactly the limit is accepted.
            async with raw_connection(server) as (reader, writer):
                writer.write(padded_ping(limit))
                response = await asyncio.wait_for(reader.readexactly(19), PROMPT_S)
                assert response == _response(ApiKey.PING, 1, PING_BODY)
            # One byte more is refused as soon as its header arrives.
            async with raw_connection(server) as (reader, writer):
                writer.write(padded_ping(limit + 1)[:18])
                err = closing_error(await read_until_closed(reader))
            assert err.error_code == FrameTooLargeError.code
            assert "4,097" in err.error_message
            assert "4,096" in err.error_message
            # A frame announcing far more, with nothing after its length.
            async with raw_connection(server) as (reader, writer):
                writer.write((1 << 30).to_bytes(4, "big"))
                err = closing_error(await read_until_closed(reader))
            assert err.error_code == FrameTooLargeError.code
            await _one_good_connection(server)
            await _works(good)

    asyncio.run(main())


def test_half_sent_frame_times_out(tmp_path: Path) -> None:
    async def main() -> None:
        async with (
            serve(tmp_path, frame_timeout_s=TINY_TIMEOUT_S) as (_, server),
            Client.connect(server) as good,
            raw_connection(server) as (reader, writer),
        ):
            loop = asyncio.get_running_loop()
            start = loop.time()
            writer.write(_ping_frame()[:10])
            sent = await while_working(good, read_until_closed(reader))
            assert loop.time() - start >= TINY_TIMEOUT_S * 0.9
            err = closing_error(sent)
            assert err.error_code == ProtocolError.code
            assert "half-sent" in err.error_message
            await _one_good_connection(server)
            await _works(good)

    asyncio.run(main())


def test_frame_dripped_byte_by_byte_still_times_out(tmp_path: Path) -> None:
    """``frame_timeout_s`` bounds how long a frame may take from its first byte to its last,
    not the gap between two chunks of it."""
    drip_s = TINY_TIMEOUT_S / 10  # far inside the timeout, even on a loaded machine
    bound_s = TINY_TIMEOUT_S * 5

    async def drip(writer: asyncio.StreamWriter) -> None:
        writer.write((1000).to_bytes(4, "big"))  # a frame of 1,004 bytes, never finished
        while not writer.is_closing():
            await asyncio.sleep(drip_s)  # the timeout is what is under test
            writer.write(b"\x00")

    async def main() -> None:
        async with (
            serve(tmp_path, frame_timeout_s=TINY_TIMEOUT_S) as (_, server),
            Client.connect(server) as good,
            raw_connection(server) as (reader, writer),
            asyncio.TaskGroup() as tg,
        ):
            dripping = tg.create_task(drip(writer))
            try:
                sent = await read_until_closed(reader, timeout=bound_s)
            finally:
                dripping.cancel()
            err = closing_error(sent)
            assert err.error_code == ProtocolError.code
            await _works(good)

    asyncio.run(main())


def test_idle_connection_is_closed(tmp_path: Path) -> None:
    async def main() -> None:
        async with (
            serve(tmp_path, idle_timeout_s=TINY_TIMEOUT_S) as (_, server),
            Client.connect(server) as good,
            raw_connection(server) as (reader, _),
        ):
            loop = asyncio.get_running_loop()
            start = loop.time()
            # The good client is never idle for long: it pings all along.
            sent = await while_working(good, read_until_closed(reader))
            assert loop.time() - start >= TINY_TIMEOUT_S * 0.9
            err = closing_error(sent)
            assert err.error_code == ProtocolError.code
            assert "idle" in err.error_message
            await _one_good_connection(server)
            await _works(good)

    asyncio.run(main())


def test_a_busy_connection_keeps_one_timer(tmp_path: Path) -> None:
    """Reads that move the idle deadline later do not make a new timer each (it is set again
    only when it fires early: test_idle_connection_is_closed shows it still closes an idle
    connection, beside a busy one)."""

    async def main() -> None:
        async with (
            serve(tmp_path, idle_timeout_s=60.0) as (_, server),
            Client.connect(server) as c,
        ):
            await c.call(PingRequest())
            (proto,) = server.connections
            timer = proto._timer
            assert timer is not None
            for _ in range(50):
                await c.call(PingRequest())
            assert proto._timer is timer  # the same timer, not one a read

    asyncio.run(main())


def test_waiting_on_a_long_poll_is_not_idleness(tmp_path: Path) -> None:
    async def main() -> None:
        async with (
            serve(tmp_path, idle_timeout_s=TINY_TIMEOUT_S) as (_, server),
            Client.connect(server) as c,
        ):
            await c.call(CreateTopicRequest(name="t"))
            wait_ms = int(TINY_TIMEOUT_S * 1000 * 3)
            fetch = c.send(
                FetchRequest(max_wait_ms=wait_ms, partitions=[FetchPartition("t", 0, 0, ALL)])
            )
            event = await c.response(fetch)  # answered after three idle timeouts
            assert event.error is None
            assert event.body.partitions[0].size == 0
            # Then, idle for real, the connection is closed with the error frame.
            (closing,) = await c.until_closed()
            assert closing.correlation_id == -1
            assert isinstance(closing.error, ProtocolError)
            assert closing.error.code == ProtocolError.code

    asyncio.run(main())


def test_reused_correlation_id_closes_the_connection(tmp_path: Path) -> None:
    async def main() -> None:
        async with serve(tmp_path) as (_, server), Client.connect(server) as good:
            await _works(good)
            body = msgspec.msgpack.encode(
                FetchRequest(
                    max_wait_ms=LONG_POLL_MS, partitions=[FetchPartition("good", 0, 1, ALL)]
                )
            )
            async with raw_connection(server) as (reader, writer):
                # corr 5 waits in a long-poll; a ping with the same id breaks the protocol.
                writer.write(_frame(body, api_key=ApiKey.FETCH, corr=5) + _ping_frame(corr=5))
                err = closing_error(await read_until_closed(reader))
            assert err.error_code == ProtocolError.code
            assert "5" in err.error_message
            await _one_good_connection(server)
            await _works(good)  # wakes nothing that could write to the closed connection

    asyncio.run(main())


def test_client_vanishing_mid_request(tmp_path: Path) -> None:
    async def main() -> None:
        async with serve(tmp_path) as (_, server), Client.connect(server) as good:
            await _works(good)
            async with Client.connect(server) as gone:
                gone.send(
                    FetchRequest(
                        max_wait_ms=LONG_POLL_MS, partitions=[FetchPartition("good", 0, 1, ALL)]
                    )
                )
                await gone.ping()  # the fetch is waiting
            # Gone with a long-poll waiting. An end of stream may be a half-close, so the
            # server answers what is in flight first: the produce wakes the fetch, its answer
            # goes nowhere, and that connection is closed.
            await _works(good)
            await _one_good_connection(server)
            await good.ping()

    asyncio.run(main())


def test_a_client_that_never_reads_fills_only_its_own_buffers(tmp_path: Path) -> None:
    """The server stops taking requests from a connection whose responses it cannot send, so
    what it holds for that connection stays within about ``max_in_flight`` responses.

    A server that does this goes quiet, and quiet cannot be awaited: the test watches the
    server's buffers for a short while instead."""
    max_in_flight = 4
    response_bytes = 256 * 1024
    bound = 4 * 1024 * 1024  # 64 KiB high-water mark + 4 responses, with room to spare
    requests = 200  # 50 MiB of responses in all
    watch_s = 1.0  # long enough for a server without the bound to pass it many times over

    def buffered(server: TcpServer) -> int:
        """Bytes the server holds for its connections, waiting to be sent."""
        return sum(
            c.transport.get_write_buffer_size()
            for c in server.connections
            if c.transport is not None
        )

    async def main() -> None:
        async with (
            serve(tmp_path, max_in_flight=max_in_flight) as (_, server),
            Client.connect(server) as good,
        ):
            data = batch([b"x" * 1024] * (response_bytes // 1024))
            await good.call(
                ProduceRequest(partitions=[ProducePartition("big", 0, len(data))]), [data]
            )
            async with Client.connect(server) as greedy:
                request = FetchRequest(partitions=[FetchPartition("big", 0, 0, ALL)])
                for _ in range(requests):
                    greedy.send(request)
                await greedy.writer.drain()
                try:
                    with pytest.raises(TimeoutError):
                        await until(lambda: buffered(server) > bound, timeout=watch_s)
                finally:
                    reset(greedy.writer)
            await good.ping()

    asyncio.run(main())


def test_max_connections(tmp_path: Path) -> None:
    async def main() -> None:
        async with (
            serve(tmp_path, max_connections=3) as (_, server),
            contextlib.AsyncExitStack() as stack,
        ):
            clients = [await stack.enter_async_context(Client.connect(server)) for _ in range(3)]
            for c in clients:
                await c.ping()
            assert len(server.connections) == 3

            # The fourth is closed at once, without a word.
            async with raw_connection(server) as (reader, writer):
                writer.write(_ping_frame())
                with contextlib.suppress(ConnectionError):
                    await writer.drain()
                assert await read_until_closed(reader) == b""
            for c in clients:
                await c.ping()

            # A slot freed is a slot taken again.
            clients.pop().writer.close()
            await until(lambda: len(server.connections) == 2)
            async with Client.connect(server) as extra:
                await extra.ping()
                for c in clients:
                    await c.ping()

    asyncio.run(main())


def test_error_frame_seen_through_a_client_connection(tmp_path: Path) -> None:
    """What a client's Connection makes of the error frame: a ResponseReceived with
    correlation id -1 and the error, then the end of the connection."""

    async def main() -> None:
        async with (
            serve(tmp_path, max_frame_bytes=4096) as (_, server),
            Client.connect(server) as c,
        ):
            _, ping = c.conn.send_request(PingRequest())  # never answered
            # One write, so that the server reads the ping too before it closes (unread
            # bytes would make the close a reset, which may discard the error frame).
            c.writer.write(b"".join([(5000).to_bytes(4, "big"), b"\x00" * 14, *ping]))
            (event,) = await c.until_closed()
            assert isinstance(event, ResponseReceived)
            assert (event.correlation_id, event.api_key) == (-1, -1)
            assert isinstance(event.error, FrameTooLargeError)

    asyncio.run(main())


def test_a_client_that_never_reads_is_reset_once_closed(tmp_path: Path) -> None:
    """A connection closed on a client that reads nothing (here: by the frame timeout, with
    its answers and the error frame unsent) is reset ``frame_timeout_s`` later, not kept open
    for as long as that client stays connected."""

    async def read_until_reset(reader: asyncio.StreamReader) -> None:
        for _ in range(1000):  # each read takes some of what was sent before the reset
            if not await asyncio.wait_for(reader.read(1 << 20), PROMPT_S):
                return

    def buffered(server: TcpServer) -> int:
        return sum(
            c.transport.get_write_buffer_size()
            for c in server.connections
            if c.transport is not None
        )

    async def main() -> None:
        async with (
            serve(
                tmp_path,
                max_in_flight=4,
                frame_timeout_s=TINY_TIMEOUT_S,
                idle_timeout_s=TINY_TIMEOUT_S,
            ) as (_, server),
            Client.connect(server) as good,
        ):
            data = batch([b"x" * 1024] * 256)
            await good.call(
                ProduceRequest(partitions=[ProducePartition("big", 0, len(data))]), [data]
            )
            async with Client.connect(server) as greedy:
                request = FetchRequest(partitions=[FetchPartition("big", 0, 0, ALL)])
                for _ in range(200):
                    greedy.send(request)
                await greedy.writer.drain()
                # Answers pile up unread: the server stops reading it and closes it (a timeout
                # ends it: nothing more comes)...
                await until(lambda: buffered(server) > 0)
                (stuck,) = [
                    c
                    for c in server.connections
                    if c.transport is not None and c.transport.get_write_buffer_size()
                ]
                # ...then, the error frame still unsent, resets it.
                await until(lambda: stuck not in server.connections)
                with pytest.raises(ConnectionResetError):
                    await read_until_reset(greedy.reader)
            # The good connection idles out with these timeouts: a new one.
            async with Client.connect(server) as after:
                await _works(after)

    asyncio.run(main())


def test_a_frame_half_sent_behind_a_long_poll_does_not_spin_the_timer(tmp_path: Path) -> None:
    """While a long-poll is in flight a half-sent frame is given more time, from now: its
    deadline is past, and a timer set for it again fired every loop turn (100% CPU)."""

    async def main() -> None:
        async with (
            serve(tmp_path, frame_timeout_s=TINY_TIMEOUT_S) as (_, server),
            Client.connect(server) as c,
        ):
            await c.call(CreateTopicRequest(name="t"))
            (proto,) = server.connections
            fired = 0
            timed_out = proto._timed_out

            def counting(midframe: bool) -> None:
                nonlocal fired
                fired += 1
                timed_out(midframe)

            proto._timed_out = counting  # type: ignore[method-assign]
            wait_ms = int(TINY_TIMEOUT_S * 1000 * 4)
            c.send(FetchRequest(max_wait_ms=wait_ms, partitions=[FetchPartition("t", 0, 0, ALL)]))
            await asyncio.sleep(0.05)
            c.writer.write(b"\x00\x00\x10\x00" + b"\0" * 10)  # 4 KiB announced, 10 sent
            await asyncio.sleep(TINY_TIMEOUT_S * 3)
            # Once a frame_timeout_s at most while the long poll runs, not every turn.
            assert fired <= 5, fired
            # The long poll over, the half-sent frame times the connection out.
            async with asyncio.timeout(TINY_TIMEOUT_S * 20):
                while server.connections:
                    await asyncio.sleep(0.01)

    asyncio.run(main())
