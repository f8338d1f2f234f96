"""Many producers at once: 20 connections each produce 50 batches to a 3-partition topic, half
of them pipelining every batch, half waiting for each acknowledgement, under acks=durable and
acks=leader. Every acknowledged message must be read back where it was acknowledged, each
partition's offsets contiguous, nothing duplicated and nothing that was not sent.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from tests.server._history import Ack, check_history
from tests.server._support import Client, batch, read_partition, serve
from tidewire.protocol.messages import (
    ACKS_DURABLE,
    ACKS_LEADER,
    CreateTopicRequest,
    ProducePartition,
    ProduceRequest,
    ProduceResponse,
)
from tidewire.server import TcpServer

CONNECTIONS = 20
BATCHES = 50
PARTITIONS = 3


def _values(conn: int, i: int) -> tuple[bytes, ...]:
    """The values of connection ``conn``'s ``i``-th batch: 1 to 3 records, unique overall."""
    return tuple(f"c{conn:02d}-b{i:02d}-r{j}".encode() for j in range(1 + (conn + i) % 3))


async def _producer(server: TcpServer, conn: int, sent: list[bytes]) -> list[Ack]:
    acks = ACKS_DURABLE if conn % 4 < 2 else ACKS_LEADER
    pipelined = conn % 2 == 0
    out: list[Ack] = []
    async with Client.connect(server) as c:
        pending: list[tuple[int, int, tuple[bytes, ...]]] = []
        for i in range(BATCHES):
            partition = (conn + i) % PARTITIONS
            values = _values(conn, i)
            data = batch(values)
            sent.extend(values)
            request = ProduceRequest(
                acks=acks, partitions=[ProducePartition("t", partition, len(data))]
            )
            corr = c.send(request, [data])
            await c.writer.drain()
            if pipelined:
                pending.append((corr, partition, values))
            else:  # each acknowledgement before the next batch
                await _ack(c, corr, partition, values, out)
        for p in pending:
            await _ack(c, *p, out)
    return out


async def _ack(
    c: Client, corr: int, partition: int, values: tuple[bytes, ...], out: list[Ack]
) -> None:
    resp = await c.response(corr)
    assert resp.error is None, resp.error
    assert isinstance(resp.body, ProduceResponse)
    (result,) = resp.body.results
    assert (result.partition, result.error_code) == (partition, 0), result
    out.append(Ack(partition, result.base_offset, values))


def test_concurrent_producers_lose_and_duplicate_nothing(tmp_path: Path) -> None:
    async def main() -> None:
        async with serve(tmp_path) as (broker, server):
            async with Client.connect(server) as admin:
                await admin.call(CreateTopicRequest(name="t", partitions=PARTITIONS))
            sent: list[bytes] = []
            async with asyncio.TaskGroup() as tg:
                producers = [
                    tg.create_task(_producer(server, conn, sent)) for conn in range(CONNECTIONS)
                ]
            acks = [a for p in producers for a in p.result()]
            assert len(acks) == CONNECTIONS * BATCHES

            async with Client.connect(server) as reader:
                read = {
                    p: [(r.offset, r.value) for r in await read_partition(reader, "t", p)]
                    for p in range(PARTITIONS)
                }
            assert check_history(sent, acks, read) == []
            assert sum(len(r) for r in read.values()) == len(sent)
            assert [s.log_end_offset for s in broker.describe("t")] == [
                len(read[p]) for p in range(PARTITIONS)
            ]

    asyncio.run(main())
