"""The durable definitions' log: what is put is loaded again after a reopen, tombstones
delete (a queue's or exchange's bindings with it, in one batch), compaction keeps exactly
the live set, and a torn tail or a damaged range loses only what it covers."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

from tidewire.broker.offsets import INTERNAL_TOPICS, is_internal_topic
from tidewire.broker.queues.definitions import (
    DEFINITIONS_TOPIC,
    Definitions,
    DefinitionStore,
    definitions_config,
)
from tidewire.broker.queues.model import Binding, ExchangeSpec, QueueSpec
from tidewire.records import iter_batches
from tidewire.storage import FsyncPolicy, LogConfig, LogManager

EX = ExchangeSpec("orders", "topic", alternate_exchange="unrouted")
Q1 = QueueSpec(
    "work",
    max_deliveries=5,
    message_ttl_ms=60_000,
    max_length=100,
    max_length_bytes=1 << 20,
    overflow="drop-head",
    dead_letter_exchange="",
    dead_letter_routing_key="dead",
    visibility_timeout_ms=30_000,
)
Q2 = QueueSpec("dead")
B1 = Binding("orders", "work", "queue", "eu.#", ())
B2 = Binding("orders", "audit", "topic", "#")
B3 = Binding("amq.headers", "work", "queue", "", (("x-match", "any"), ("a", "1")))


def reopen(data: Path) -> tuple[LogManager, Definitions]:
    logs = LogManager(str(data)).open()
    return logs, DefinitionStore(logs).load()


def test_round_trip_and_reopen(tmp_path: Path) -> None:
    async def main() -> None:
        async with LogManager(str(tmp_path)).open() as logs:
            store = DefinitionStore(logs)
            assert store.load() == Definitions()
            assert (DEFINITIONS_TOPIC, 0) not in logs.logs  # made by the first write
            await store.put_exchange(EX)
            await store.put_queue(Q1)
            await store.put_queue(Q2)
            for b in (B1, B2, B3):
                await store.put_binding(b)
            await store.put_binding(B1)  # again: still one
            assert logs.get_log(DEFINITIONS_TOPIC, 0).config == definitions_config()
            # Acknowledged means fsynced.
            plog = logs.get_log(DEFINITIONS_TOPIC, 0)
            assert plog.flushed_offset == plog.log_end_offset == 7
            assert store.definitions() == Definitions([EX], [Q2, Q1], [B3, B1, B2])
        logs, d = reopen(tmp_path)
        logs.close()
        assert d == Definitions([EX], [Q2, Q1], [B3, B1, B2])

    asyncio.run(main())


def test_replace_and_tombstones(tmp_path: Path) -> None:
    async def main() -> None:
        async with LogManager(str(tmp_path)).open() as logs:
            store = DefinitionStore(logs)
            store.load()
            await store.put_exchange(EX)
            await store.put_exchange(ExchangeSpec("orders", "fanout"))  # the last one wins
            await store.put_exchange(ExchangeSpec("gone", "direct"))
            await store.put_queue(Q1)
            await store.put_queue(Q2)
            for b in (B1, B2, B3, Binding("gone", "dead", "queue", "k")):
                await store.put_binding(b)
            await store.delete_binding(B2)
            await store.delete_binding(B2)  # unknown: a harmless tombstone
            # The exchange's bindings go in the same batch as it.
            await store.delete_exchange("gone")
            # And the bindings to a queue with it.
            await store.delete_queue("work")
            want = Definitions([ExchangeSpec("orders", "fanout")], [Q2], [])
            assert store.definitions() == want
            plog = logs.get_log(DEFINITIONS_TOPIC, 0)
            end = plog.log_end_offset
        logs, d = reopen(tmp_path)
        assert d == want
        # The deletions were one batch each: exchange + 1 binding, queue + 2 bindings.
        counts = [
            h.last_offset - h.base_offset + 1
            for _, h in iter_batches(logs.get_log(DEFINITIONS_TOPIC, 0).read(0, 1 << 20).data)
        ]
        logs.close()
        assert counts[-2:] == [2, 3]
        assert sum(counts) == end

    asyncio.run(main())


def test_compaction_keeps_the_live_set(tmp_path: Path) -> None:
    async def main() -> None:
        segment = 4096
        async with LogManager(str(tmp_path)).open() as logs:
            store = DefinitionStore(logs, segment_bytes=segment)
            store.load()
            live: dict[str, QueueSpec] = {}
            for i in range(600):
                spec = QueueSpec(f"q{i % 40}", max_length=i)
                await store.put_queue(spec)
                live[spec.name] = spec
                if i % 7 == 0:
                    await store.delete_queue(spec.name)
                    del live[spec.name]
            await store.put_exchange(EX)
            await store.put_binding(B1)
            plog = logs.get_log(DEFINITIONS_TOPIC, 0)
            assert store.compactions > 0
            # The log stays near its live size, far below the ~600 records written.
            assert plog.segment_count <= 8
            assert plog.log_start_offset > 0
            want = Definitions([EX], sorted(live.values(), key=lambda q: q.name), [B1])
            assert store.definitions() == want
            # Compacting by hand, too: nothing is lost.
            await store.compact()
            assert store.definitions() == want
        logs = LogManager(str(tmp_path)).open()
        try:
            assert DefinitionStore(logs, segment_bytes=segment).load() == want
        finally:
            logs.close()

    asyncio.run(main())


def test_compaction_of_nothing_live(tmp_path: Path) -> None:
    async def main() -> None:
        async with LogManager(str(tmp_path)).open() as logs:
            store = DefinitionStore(logs, segment_bytes=1024)
            for i in range(200):
                await store.put_queue(QueueSpec(f"q{i}"))
                await store.delete_queue(f"q{i}")
            assert store.compactions > 0
            assert store.definitions() == Definitions()
        logs, d = reopen(tmp_path)
        logs.close()
        assert d == Definitions()

    asyncio.run(main())


def test_writes_during_compaction_wait_and_land(tmp_path: Path) -> None:
    async def main() -> None:
        async with LogManager(str(tmp_path)).open() as logs:
            store = DefinitionStore(logs, segment_bytes=2048)
            await asyncio.gather(
                *(store.put_queue(QueueSpec(f"q{i % 30}", max_length=i)) for i in range(300))
            )
            assert store.compactions > 0
            # Concurrent writes of one key: the last appended wins, in memory and on disk.
            got = store.definitions()
        logs, d = reopen(tmp_path)
        logs.close()
        assert d == got
        assert len(d.queues) == 30

    asyncio.run(main())


def _segment_files(tmp_path: Path) -> list[Path]:
    return sorted(tmp_path.glob(f"{DEFINITIONS_TOPIC}-0/*.log"))


def test_a_torn_tail_loses_only_the_last_write(tmp_path: Path) -> None:
    async def main() -> None:
        async with LogManager(str(tmp_path)).open() as logs:
            store = DefinitionStore(logs)
            await store.put_queue(Q1)
            await store.put_queue(Q2)
            await store.put_exchange(EX)

    asyncio.run(main())
    (seg,) = _segment_files(tmp_path)
    size = seg.stat().st_size
    with open(seg, "r+b") as f:  # the last batch half written, as a power cut leaves it
        f.truncate(size - 20)
    logs, d = reopen(tmp_path)
    try:
        assert d == Definitions([], [Q2, Q1], [])
        # The log is usable again after the cut.
        store = DefinitionStore(logs)
        store.load()

        async def write() -> None:
            await store.put_exchange(EX)

        asyncio.run(write())
    finally:
        logs.close()
    logs, d = reopen(tmp_path)
    logs.close()
    assert d == Definitions([EX], [Q2, Q1], [])


def test_a_damaged_range_is_skipped(tmp_path: Path) -> None:
    """A flipped byte inside an old batch: that batch is lost, the writes after it (the queue
    replaced, a binding) still apply."""

    async def main() -> int:
        async with LogManager(str(tmp_path)).open() as logs:
            store = DefinitionStore(logs)
            await store.put_queue(Q2)
            pos = logs.get_log(DEFINITIONS_TOPIC, 0).size_bytes
            await store.put_exchange(EX)
            await store.put_queue(Q1)
            await store.put_binding(B1)
            return pos

    second = asyncio.run(main())
    (seg,) = _segment_files(tmp_path)
    with open(seg, "r+b") as f:
        f.seek(second + 70)  # inside the records of the second batch (its CRC no longer holds)
        b = f.read(1)
        f.seek(second + 70)
        f.write(bytes([b[0] ^ 0xFF]))
        f.flush()
        os.fsync(f.fileno())
    logs = LogManager(str(tmp_path)).open()
    try:
        store = DefinitionStore(logs)
        d = store.load()
        assert store.damage_skipped == [(1, 2)]
    finally:
        logs.close()
    assert d == Definitions([], [Q2, Q1], [B1])


def test_weak_settings_are_replaced(tmp_path: Path) -> None:
    logs = LogManager(str(tmp_path)).open()
    logs.create_log(DEFINITIONS_TOPIC, 0, LogConfig(fsync=FsyncPolicy.NEVER, retention_ms=1000))
    DefinitionStore(logs).load()
    assert logs.get_log(DEFINITIONS_TOPIC, 0).config == definitions_config()
    logs.close()


def test_internal_topic_names() -> None:
    assert DEFINITIONS_TOPIC in INTERNAL_TOPICS
    assert is_internal_topic(DEFINITIONS_TOPIC)
    assert is_internal_topic("__queue.work")
    assert is_internal_topic("__consumer_offsets")
    assert not is_internal_topic("__queue")
    assert not is_internal_topic("queue.work")
    assert not is_internal_topic("orders")
