"""The entries of one produce request: the first appended at once, in the order the requests
arrive; the others without waiting for the first one to be answered (under fsync=always, its
fsync), each answered in the request's order with its own result or error.

The handler runs against a stand-in for the broker whose ``produce`` waits on an event per
partition, so "partition 1 was stored while partition 0 still waited" is observed, not timed.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import cast

from tests.server._support import Client, batch, serve
from tidewire.broker import Broker
from tidewire.broker.core import ProduceResult
from tidewire.errors import UnknownPartitionError
from tidewire.protocol.messages import (
    ACKS_DURABLE,
    CreateTopicRequest,
    ProducePartition,
    ProduceRequest,
    ProduceResponse,
    TopicConfig,
)
from tidewire.server import handlers
from tidewire.server.handlers import ServerInfo


class _HeldBroker:
    """``Broker.produce`` as the handler sees it: each partition answers once its event is
    set; the calls, and the partitions that were answered, in their order."""

    def __init__(self, partitions: int) -> None:
        self.release = [asyncio.Event() for _ in range(partitions)]
        self.calls: list[tuple[int, bytes, bool | None]] = []
        self.answered: list[int] = []
        self.changed = asyncio.Condition()  # notified at every call and answer

    async def _note(self) -> None:
        async with self.changed:
            self.changed.notify_all()

    async def until(self, done: Callable[[], bool]) -> None:
        """Wait (10 s at most: a failure, not a hang) until ``done()`` holds."""
        async with asyncio.timeout(10), self.changed:
            await self.changed.wait_for(done)

    async def produce(
        self, topic: str, partition: int, data: memoryview, *, durable: bool | None = None
    ) -> ProduceResult:
        self.calls.append((partition, bytes(data), durable))
        await self._note()
        await self.release[partition].wait()
        self.answered.append(partition)
        await self._note()
        if partition == 2:
            raise UnknownPartitionError(f"{topic!r} has no partition {partition}")
        return ProduceResult(partition * 100, partition * 100 + 9, 0)


def _request(sizes: list[int]) -> ProduceRequest:
    return ProduceRequest(
        acks=ACKS_DURABLE,
        partitions=[ProducePartition("t", p, n) for p, n in enumerate(sizes)],
    )


def test_later_entries_do_not_wait_for_the_first() -> None:
    async def main() -> None:
        held = _HeldBroker(3)
        data = memoryview(b"aaaa" + b"bb" + b"c")
        task = asyncio.create_task(
            handlers.produce(cast(Broker, held), cast(ServerInfo, None), _request([4, 2, 1]), data)
        )
        # Partition 1 is answered while partition 0, the first entry, still waits.
        held.release[1].set()
        held.release[2].set()
        await held.until(lambda: len(held.answered) == 2)
        assert sorted(held.answered) == [1, 2]
        assert not task.done()
        # Each entry got its own bytes of the data section, in list order, the first first.
        assert held.calls == [(0, b"aaaa", None), (1, b"bb", None), (2, b"c", None)]
        held.release[0].set()
        response, extra = await task
        assert extra == []
        assert isinstance(response, ProduceResponse)
        got = [(r.partition, r.base_offset, r.error_code) for r in response.results]
        assert got == [(0, 0, 0), (1, 100, 0), (2, -1, UnknownPartitionError.code)]
        assert "no partition 2" in response.results[2].error_message

    asyncio.run(main())


def test_first_entries_are_placed_in_the_order_the_requests_arrive() -> None:
    async def main() -> None:
        held = _HeldBroker(2)
        info = cast(ServerInfo, None)
        # Two requests of one connection, handled in parallel as the server does: A for
        # partitions 0 and 1, then B for partition 0 alone (a client pipelining partition 0).
        a = asyncio.create_task(
            handlers.produce(cast(Broker, held), info, _request([1, 1]), memoryview(b"AB"))
        )
        b = asyncio.create_task(
            handlers.produce(cast(Broker, held), info, _request([1]), memoryview(b"C"))
        )
        await held.until(lambda: len(held.calls) == 3)
        first_of_partition_0 = [d for p, d, _ in held.calls if p == 0]
        assert first_of_partition_0 == [b"A", b"C"]
        held.release[0].set()
        held.release[1].set()
        ra, rb = await a, await b
        assert isinstance(ra[0], ProduceResponse)
        assert isinstance(rb[0], ProduceResponse)
        assert [r.partition for r in ra[0].results] == [0, 1]

    asyncio.run(main())


def test_a_request_for_several_partitions_is_stored_in_each(tmp_path: Path) -> None:
    async def main() -> None:
        always = TopicConfig(fsync="always")
        async with serve(tmp_path) as (b, server), Client.connect(server) as c:
            await c.call(CreateTopicRequest(name="t", partitions=4, config=always))
            parts = [batch([f"{p}-{i}".encode() for i in range(p + 1)]) for p in range(4)]
            request = ProduceRequest(
                acks=ACKS_DURABLE,
                partitions=[ProducePartition("t", p, len(d)) for p, d in enumerate(parts)],
            )
            for round_ in range(3):
                resp = await c.call(request, parts)
                assert isinstance(resp, ProduceResponse)
                assert [(r.partition, r.base_offset, r.error_code) for r in resp.results] == [
                    (p, round_ * (p + 1), 0) for p in range(4)
                ]
            for p in range(4):
                plog = b.log("t", p)
                assert plog.log_end_offset == 3 * (p + 1)
                assert plog.flushed_offset == plog.log_end_offset  # acknowledged after fsync

    asyncio.run(main())
