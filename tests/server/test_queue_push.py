"""QUEUE_DELIVER on the wire: never before the QUEUE_CONSUME answer, cut into frames of at
most MAX_PUSH_BYTES on batch boundaries, held back (not piled into the socket's buffer)
while the client does not read, and never lost: what a connection held when it went comes
back. A request for the push-only key 55 is refused and the connection goes on."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from tests.server._support import PROMPT_S, serve, until
from tidewire.errors import UnknownApiError
from tidewire.protocol import (
    NEED_DATA,
    Connection,
    ConnectionClosed,
    PushReceived,
    ResponseReceived,
    Role,
)
from tidewire.protocol.frames import FLAG_ERROR, Frame, FrameDecoder, FrameType, encode_frame
from tidewire.protocol.messages import (
    ApiKey,
    DeliveryEntryInfo,
    ErrorBody,
    PingRequest,
    QueueConsumeRequest,
    QueueDeclareRequest,
    QueueDeliverBody,
    QueuePublishRequest,
    QueueSettleRequest,
    decode_body,
)
from tidewire.records import BatchBuilder, iter_batches, iter_records
from tidewire.server.queue_handlers import MAX_PUSH_BYTES, split_delivery


def _batch(values: list[bytes], base: int = 0) -> bytes:
    b = BatchBuilder(base_offset=base)
    for v in values:
        b.append(v, key=b"k", timestamp_ms=0)
    return b.build()


class Peer:
    """A client connection that keeps every event, responses and pushes, in order."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer
        self.conn = Connection(Role.CLIENT)
        self.events: list[Any] = []

    def send(self, body: Any, data: list[bytes] | None = None) -> int:
        corr, buffers = self.conn.send_request(body, data or [])
        self.writer.writelines(buffers)
        return corr

    async def read_some(self) -> None:
        while True:
            ev = self.conn.next_event()
            if ev is NEED_DATA:
                chunk = await self.reader.read(1 << 20)
                self.conn.receive_data(chunk)
                if not chunk:
                    return
                continue
            assert not isinstance(ev, ConnectionClosed)
            self.events.append(ev)
            return

    async def response(self, corr: int) -> ResponseReceived:
        async def wait() -> ResponseReceived:
            while True:
                for ev in self.events:
                    if isinstance(ev, ResponseReceived) and ev.correlation_id == corr:
                        return ev
                await self.read_some()

        return await asyncio.wait_for(wait(), PROMPT_S)

    async def call(self, body: Any, data: list[bytes] | None = None) -> Any:
        r = await self.response(self.send(body, data))
        assert r.error is None, r.error
        assert not getattr(r.body, "error_code", 0), r.body
        return r.body

    def pushes(self) -> list[tuple[QueueDeliverBody, bytes]]:
        return [
            (decode_body(QueueDeliverBody, ev.body), bytes(ev.data))
            for ev in self.events
            if isinstance(ev, PushReceived) and ev.api_key == ApiKey.QUEUE_DELIVER
        ]

    async def until_messages(self, n: int) -> list[tuple[int, bytes]]:
        """(offset, value) of the first ``n`` messages delivered, reading as needed."""

        def got() -> list[tuple[int, bytes]]:
            out = []
            for body, data in self.pushes():
                wanted = {e.offset for e in body.entries}
                for pos, h in iter_batches(data):
                    for r in iter_records(data[pos : pos + h.size]):
                        if r.offset in wanted:
                            out.append((r.offset, r.value or b""))
            return out

        async def wait() -> list[tuple[int, bytes]]:
            while len(got()) < n:
                await self.read_some()
            return got()

        return await asyncio.wait_for(wait(), PROMPT_S)


async def _peer(port: int) -> Peer:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    return Peer(reader, writer)


def test_split_delivery_on_batch_boundaries() -> None:
    data = b"".join(_batch([bytes(100)] * 10, base=i * 10) for i in range(10))
    entries = [DeliveryEntryInfo(o + 1, o, 1) for o in (3, 15, 16, 99)]
    whole = split_delivery(entries, data)
    assert [(e, bytes(d)) for e, d in whole] == [(entries, data)]
    size = len(_batch([bytes(100)] * 10))
    pieces = split_delivery(entries, data, max_bytes=2 * size)
    # 5 pieces of two batches; the one of offsets 40..79 holds no entry and is left out
    assert [[e.offset for e in ents] for ents, _ in pieces] == [[3, 15, 16], [99]]
    assert [len(d) for _, d in pieces] == [2 * size, 2 * size]
    assert bytes(pieces[1][1]) == data[8 * size :]


def test_deliveries_come_after_the_consume_answer_and_in_small_frames(tmp_path: Path) -> None:
    async def main() -> None:
        async with serve(tmp_path) as (_, server):
            p = await _peer(server.port)
            await p.call(QueueDeclareRequest(name="q"))
            values = [bytes([i]) * 300_000 for i in range(8)]  # 2.4 MB, a batch each
            for v in values:
                await p.call(QueuePublishRequest(exchange="", routing_key="q"), [_batch([v])])
            corr = p.send(QueueConsumeRequest(queue="q", prefetch=100))
            got = await p.until_messages(8)
            first = next(
                i
                for i, ev in enumerate(p.events)
                if isinstance(ev, ResponseReceived) and ev.correlation_id == corr
            )
            assert not any(isinstance(ev, PushReceived) for ev in p.events[:first])
            assert [v for _, v in got] == values
            assert all(len(data) <= MAX_PUSH_BYTES for _, data in p.pushes())
            assert len(p.pushes()) >= 3
            p.writer.close()

    asyncio.run(main())


def test_a_client_that_does_not_read_gets_its_deliveries_held_back(tmp_path: Path) -> None:
    async def main() -> None:
        async with serve(tmp_path) as (broker, server):
            admin = await _peer(server.port)
            await admin.call(QueueDeclareRequest(name="q", durable=False))
            slow = await _peer(server.port)
            await slow.call(QueueConsumeRequest(queue="q", prefetch=1000))
            (conn,) = [c for c in server.connections if c.queues.consumers]
            # 24 MB in 240 batches: far more than the socket buffers take.
            for _ in range(24):
                batches = b"".join(_batch([bytes(100_000)], base=j) for j in range(10))
                await admin.call(QueuePublishRequest(exchange="", routing_key="q"), [batches])
            await until(lambda: conn.queues.peak_waiting > 0)
            assert conn.transport is not None
            # What waits in the broker's socket buffer stays near the high-water mark: the
            # rest waits as deliveries, not as bytes written.
            assert conn.transport.get_write_buffer_size() <= 4 * MAX_PUSH_BYTES
            assert broker.queues.describe_queue("q").unacked == 240
            got = await slow.until_messages(240)
            assert len(got) == 240
            assert len({o for o, _ in got}) == 240
            tags = [e.tag for body, _ in slow.pushes() for e in body.entries]
            await slow.call(QueueSettleRequest(queue="q", tags=tags))
            assert broker.queues.describe_queue("q").counters.acked == 240
            slow.writer.close()
            admin.writer.close()

    asyncio.run(main())


def test_what_a_lost_connection_held_is_delivered_again(tmp_path: Path) -> None:
    async def main() -> None:
        async with serve(tmp_path) as (broker, server):
            a = await _peer(server.port)
            await a.call(QueueDeclareRequest(name="q"))
            await a.call(QueuePublishRequest(exchange="", routing_key="q"), [_batch([b"x"])])
            await a.call(QueueConsumeRequest(queue="q", prefetch=5))
            assert await a.until_messages(1) == [(0, b"x")]
            a.writer.transport.abort()
            await until(lambda: broker.queues.describe_queue("q").unacked == 0)
            b = await _peer(server.port)
            await b.call(QueueConsumeRequest(queue="q", prefetch=5))
            assert await b.until_messages(1) == [(0, b"x")]
            ((body, _),) = b.pushes()
            assert body.entries[0].delivery_count == 2
            b.writer.close()

    asyncio.run(main())


def test_a_request_for_the_push_only_key_is_refused(tmp_path: Path) -> None:
    async def main() -> None:
        async with serve(tmp_path) as (_, server):
            p = await _peer(server.port)
            p.writer.writelines(
                encode_frame(FrameType.REQUEST, ApiKey.QUEUE_DELIVER, 0, 7, b"\x80")
            )
            decoder = FrameDecoder()  # read raw: the peer's Connection did not send it

            async def answer() -> Frame:
                while (f := decoder.next_frame()) is None:
                    chunk = await p.reader.read(65536)
                    assert chunk, "the server closed the connection"
                    decoder.receive_data(chunk)
                return f

            f = await asyncio.wait_for(answer(), PROMPT_S)
            assert (f.api_key, f.correlation_id, f.flags) == (ApiKey.QUEUE_DELIVER, 7, FLAG_ERROR)
            err = decode_body(ErrorBody, f.body)
            assert err.error_code == UnknownApiError.code
            assert "QUEUE_DELIVER (55) is pushed by the server" in err.error_message
            await p.call(PingRequest())  # the connection goes on
            p.writer.close()

    asyncio.run(main())
