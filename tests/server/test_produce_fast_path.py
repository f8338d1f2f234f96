"""The listener's produce fast path: a produce request of one partition on a single node is
handled in the read callback, without a task, and answered from the step that settles its
append. It must answer what the task path answers, keep a connection's batches in the order
their requests arrived (also behind a request that took the task path), answer an
idempotent batch sent again with its first copy's offsets, and count as in flight while a
drain waits for it.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from tests.server._support import Client, batch, read_partition, serve
from tests.storage.test_append_soon import HeldExecutor
from tidewire.protocol.messages import (
    ACKS_LEADER,
    CreateTopicRequest,
    InitProducerIdRequest,
    ProducePartition,
    ProduceRequest,
    ProduceResponse,
    TopicConfig,
)
from tidewire.records import BatchBuilder
from tidewire.storage.flusher import set_flush_executor

#: Every test's topic: acknowledged after its group commit.
ALWAYS = TopicConfig(fsync="always")


def _idempotent(pid: int, seq: int, value: bytes) -> bytes:
    b = BatchBuilder(producer_id=pid, producer_epoch=0, base_sequence=seq)
    b.append(value, timestamp_ms=1_700_000_000_000)
    return b.build()


def _produce(topic: str, partition: int, data: bytes, **kw: Any) -> ProduceRequest:
    return ProduceRequest(partitions=[ProducePartition(topic, partition, len(data))], **kw)


def test_pipelined_produces_take_no_task_and_are_stored_in_order(
    tmp_path: Path, tasks_of: list[int]
) -> None:
    async def main() -> None:
        async with serve(tmp_path) as (_, server), Client.connect(server) as c:
            await c.call(CreateTopicRequest(name="t", config=ALWAYS))
            pid = (await c.call(InitProducerIdRequest())).producer_id
            tasks_of.clear()
            values = [f"v{i}".encode() for i in range(40)]
            sent = []
            seq = 0
            for i, v in enumerate(values):
                data = batch([v])
                if i % 2:
                    data, seq = _idempotent(pid, seq, v), seq + 1
                acks = {"acks": ACKS_LEADER} if i % 3 == 0 else {}
                sent.append(c.send(_produce("t", 0, data, **acks), [data]))
            await c.writer.drain()
            for i, corr in enumerate(sent):
                body = (await c.response(corr)).body
                assert isinstance(body, ProduceResponse)
                (r,) = body.results
                assert (r.topic, r.partition, r.error_code, r.base_offset) == ("t", 0, 0, i)
            assert tasks_of == []  # every one of them without a task
            stored = [(r.offset, r.value) for r in await read_partition(c, "t", 0)]
            assert stored == list(enumerate(values))
            assert server.in_flight() == 0

    asyncio.run(main())


def test_a_produce_behind_one_given_a_task_is_not_appended_first(
    tmp_path: Path, tasks_of: list[int]
) -> None:
    async def main() -> None:
        async with serve(tmp_path) as (_, server), Client.connect(server) as c:
            await c.call(CreateTopicRequest(name="t", partitions=2, config=ALWAYS))
            tasks_of.clear()
            first, second = batch([b"first"]), batch([b"second"])
            # Two partitions: the task path (t/0 is its first entry, appended when its task
            # runs); then one partition, which the fast path would append at once.
            two = ProduceRequest(
                partitions=[ProducePartition("t", 0, len(first)), ProducePartition("t", 1, 1)]
            )
            a = c.send(two, [first, b"x"])  # t/1's entry is malformed: refused alone
            b = c.send(_produce("t", 0, second), [second])
            await c.writer.drain()
            ra = (await c.response(a)).body.results
            rb = (await c.response(b)).body.results
            assert (ra[0].error_code, ra[0].base_offset) == (0, 0)
            assert ra[1].error_code != 0
            assert (rb[0].error_code, rb[0].base_offset) == (0, 1)
            assert len(tasks_of) == 2  # the second waited its turn behind the first's task
            stored = [(r.offset, r.value) for r in await read_partition(c, "t", 0)]
            assert stored == [(0, b"first"), (1, b"second")]

    asyncio.run(main())


def test_an_idempotent_batch_sent_again_gets_its_first_offsets(tmp_path: Path) -> None:
    async def main() -> None:
        async with serve(tmp_path) as (_, server), Client.connect(server) as c:
            await c.call(CreateTopicRequest(name="t", config=ALWAYS))
            pid = (await c.call(InitProducerIdRequest())).producer_id
            b0, b1 = _idempotent(pid, 0, b"a"), _idempotent(pid, 1, b"b")
            corrs = [c.send(_produce("t", 0, d), [d]) for d in (b0, b0, b1)]
            await c.writer.drain()
            offsets = [(await c.response(x)).body.results[0].base_offset for x in corrs]
            assert offsets == [0, 0, 1]
            stored = [(r.offset, r.value) for r in await read_partition(c, "t", 0)]
            assert stored == [(0, b"a"), (1, b"b")]

    asyncio.run(main())


def test_errors_are_answered_as_the_task_path_answers_them(
    tmp_path: Path, tasks_of: list[int]
) -> None:
    async def main() -> None:
        async with serve(tmp_path) as (_, server), Client.connect(server) as c:
            await c.call(CreateTopicRequest(name="t", config=ALWAYS))
            tasks_of.clear()
            bad = bytearray(batch([b"v"]))
            bad[-1] ^= 0xFF  # the CRC no longer matches
            body = await c.call(_produce("t", 0, bytes(bad)), [bytes(bad)])
            assert tasks_of == []
            (r,) = body.results
            assert r.error_code != 0
            assert r.base_offset == -1
            assert "CRC" in r.error_message.upper()
            # The same request through the task path (two entries) gives the same result.
            good = batch([b"w"])
            two = ProduceRequest(
                partitions=[
                    ProducePartition("t", 0, len(bad)),
                    ProducePartition("t", 0, len(good)),
                ]
            )
            body2 = await c.call(two, [bytes(bad), good])
            assert tasks_of == [int(two.api_key)]
            assert (body2.results[0].error_code, body2.results[0].error_message) == (
                r.error_code,
                r.error_message,
            )

    asyncio.run(main())


def test_a_drain_waits_for_a_produce_without_a_task(tmp_path: Path) -> None:
    async def main() -> None:
        async with serve(tmp_path) as (_, server), Client.connect(server) as c:
            await c.call(CreateTopicRequest(name="t", config=ALWAYS))
            held = HeldExecutor()
            loop = asyncio.get_running_loop()
            set_flush_executor(loop, held)  # the group commit waits for the test
            try:
                data = batch([b"v"])
                corr = c.send(_produce("t", 0, data), [data])
                await c.writer.drain()
                for _ in range(200):  # bounded: the request is read and its commit asked for
                    if held.jobs:
                        break
                    await asyncio.sleep(0.01)
                assert held.jobs
                assert server.in_flight() == 1
                server.begin_drain()
                waiting = asyncio.ensure_future(server.wait_in_flight(loop.time() + 30))
                await asyncio.sleep(0.05)
                assert not waiting.done()  # the drain waits for the answer
                held.run_all()
                assert await asyncio.wait_for(waiting, 10) == 0
                (r,) = (await c.response(corr)).body.results
                assert (r.error_code, r.base_offset) == (0, 0)
            finally:
                set_flush_executor(loop, None)
                held.run_all()

    asyncio.run(main())
