"""The server reads a large request frame (a produce request's batches) straight into a buffer
of the frame's own size, and small ones through its connection's small head buffer, whatever
pieces they arrive in: the records stored are the ones sent, requests pipelined behind a large
one are answered, and the data the broker is handed lies in that buffer (no join of pieces)."""

from __future__ import annotations

import asyncio
import itertools
from pathlib import Path
from typing import Any

from tests.server._support import Client, batch, read_partition, serve
from tidewire.broker import Broker
from tidewire.protocol.messages import (
    ACKS_DURABLE,
    CreateTopicRequest,
    PingRequest,
    PingResponse,
    ProducePartition,
    ProduceRequest,
    ProduceResponse,
)
from tidewire.server.tcp import READ_HEAD_BYTES


def _values(prefix: str, n: int, size: int) -> list[bytes]:
    return [f"{prefix}-{i}-".encode().ljust(size, b"x") for i in range(n)]


def _spy_on_produce(b: Broker) -> list[Any]:
    """Record the object each produced chunk's bytes lie in (the frame's buffer), on both
    ways a produce request reaches the broker (a task, or the path without one)."""
    seen: list[Any] = []
    produce, produce_soon = b.produce, b.produce_soon

    async def spy(topic: str, partition: int, data: Any, **kwargs: Any) -> Any:
        seen.append(memoryview(data).obj)
        return await produce(topic, partition, data, **kwargs)

    def spy_soon(topic: str, partition: int, data: Any, **kwargs: Any) -> bool:
        taken = produce_soon(topic, partition, data, **kwargs)
        if taken:
            seen.append(memoryview(data).obj)
        return taken

    b.produce = spy  # type: ignore[method-assign]
    b.produce_soon = spy_soon  # type: ignore[method-assign]
    return seen


def test_large_and_small_requests_in_any_pieces(tmp_path: Path) -> None:
    async def main() -> None:
        async with serve(tmp_path) as (b, server), Client.connect(server) as c:
            await c.call(CreateTopicRequest(name="t", partitions=1))
            seen = _spy_on_produce(b)
            big = [_values(f"big{k}", 300, 1000) for k in range(2)]  # ~300 KB a batch
            small = _values("small", 5, 10)
            batches = [batch(big[0]), batch(small), batch(big[1])]
            assert len(batches[0]) > READ_HEAD_BYTES > len(batches[1])
            # One stream of pings and produce requests, written in uneven pieces (some within
            # a frame's header), each piece drained before the next is written.
            stream = bytearray()
            corrs: list[tuple[int, bool]] = []
            for data in batches:
                for body, extra in (
                    (PingRequest(), []),
                    (
                        ProduceRequest(
                            acks=ACKS_DURABLE, partitions=[ProducePartition("t", 0, len(data))]
                        ),
                        [data],
                    ),
                ):
                    corr, buffers = c.conn.send_request(body, extra)
                    stream += b"".join(buffers)
                    corrs.append((corr, isinstance(body, ProduceRequest)))
            sizes = itertools.cycle([3, 70_000, 15, 16_381, 200_000, 1, 40_000])
            at = 0
            while at < len(stream):
                n = next(sizes)
                c.writer.write(stream[at : at + n])
                await c.writer.drain()
                at += n
            offsets = []
            for corr, is_produce in corrs:
                body = (await c.response(corr)).body
                if is_produce:
                    assert isinstance(body, ProduceResponse)
                    assert body.results[0].error_code == 0
                    offsets.append(body.results[0].base_offset)
                else:
                    assert isinstance(body, PingResponse)
            assert offsets == [0, 300, 305]
            got = await read_partition(c, "t", 0)
            assert [r.value for r in got] == big[0] + small + big[1]
            # The large requests' data lie in a buffer of their frame's size, the small
            # one's in bytes copied out of the head buffer.
            assert [type(o) for o in seen] == [bytearray, bytes, bytearray]
            for o, data in ((seen[0], batches[0]), (seen[2], batches[2])):
                assert len(data) < len(o) < len(data) + 1024

    asyncio.run(main())
