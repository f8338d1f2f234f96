"""Topics: create, describe, delete and alter.

Names and partition counts are validated (``InvalidTopicError``), duplicates refused
(``TopicExistsError``), unknown topics and partitions reported as such by every operation
(``UnknownTopicError``, ``UnknownPartitionError``); a topic gains partitions but never loses
them, and its settings, changed by ``alter_topic``, survive a restart.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.broker._support import (
    ALL,
    LONG_POLL_MS,
    PROMPT_S,
    batch,
    config,
    read_all,
    settle,
    values,
)
from tidewire.broker import Broker, PartitionStatus
from tidewire.errors import (
    BatchTooLargeError,
    InvalidTopicError,
    TopicExistsError,
    UnknownPartitionError,
    UnknownTopicError,
)
from tidewire.storage import FsyncPolicy, LogConfig
from tidewire.storage.manager import MAX_PARTITION, MAX_TOPIC_NAME

BAD_NAMES = [
    "",
    ".",
    "..",
    "a/b",
    "../escape",
    "sp ace",
    "tab\t",
    "nul\x00",
    "naïve",
    "x" * (MAX_TOPIC_NAME + 1),
]
GOOD_NAMES = ["a", "A-b_c.d", "...", "-", "0", "x" * MAX_TOPIC_NAME, "t-1", "t-delete"]


def _partition_dirs(tmp_path: Path) -> list[str]:
    d = tmp_path / "data"
    return sorted(p.name for p in d.iterdir() if p.is_dir()) if d.exists() else []


def test_create_and_describe(tmp_path: Path) -> None:
    async def main() -> None:
        async with Broker(config(tmp_path, default_partitions=2)) as broker:
            assert broker.topics() == {}
            assert broker.create_topic("orders", 3) == 3
            assert broker.create_topic("events") == 2  # the broker's default_partitions
            assert broker.topics() == {"events": 2, "orders": 3}
            assert broker.partition_count("orders") == 3
            assert broker.describe("orders") == [PartitionStatus(p, 0, 0, 0, 0) for p in range(3)]
            data = batch([b"a", b"b"]) + batch([b"c"])
            await broker.produce("orders", 1, data)
            assert broker.describe("orders") == [
                PartitionStatus(0, 0, 0, 0, 0),
                PartitionStatus(1, 0, 3, 3, len(data)),
                PartitionStatus(2, 0, 0, 0, 0),
            ]

    asyncio.run(main())


@pytest.mark.parametrize("name", GOOD_NAMES)
def test_valid_names_are_accepted_and_survive_a_restart(tmp_path: Path, name: str) -> None:
    async def main() -> None:
        async with Broker(config(tmp_path)) as broker:
            broker.create_topic(name, 2)
            await broker.produce(name, 1, batch([b"v"]))
        async with Broker(config(tmp_path)) as broker:
            assert broker.topics() == {name: 2}
            assert values((await broker.fetch([(name, 1, 0, ALL)]))[0].data) == [(0, b"v")]

    asyncio.run(main())


@pytest.mark.parametrize("name", BAD_NAMES)
def test_invalid_names_are_refused(tmp_path: Path, name: str) -> None:
    async def main() -> None:
        async with Broker(config(tmp_path)) as broker:
            with pytest.raises(InvalidTopicError):
                broker.create_topic(name)
            with pytest.raises(InvalidTopicError):  # auto-creation validates the same way
                await broker.produce(name, 0, batch([b"v"]))
            assert broker.topics() == {}
        assert _partition_dirs(tmp_path) == []

    asyncio.run(main())


@pytest.mark.parametrize("partitions", [0, -1, MAX_PARTITION + 1, True, 1.5, "2"])
def test_invalid_partition_counts_are_refused(tmp_path: Path, partitions: object) -> None:
    async def main() -> None:
        async with Broker(config(tmp_path)) as broker:
            with pytest.raises(InvalidTopicError):
                broker.create_topic("t", partitions)  # type: ignore[arg-type]
            assert broker.topics() == {}
        assert _partition_dirs(tmp_path) == []

    asyncio.run(main())


def test_duplicate_is_refused_and_leaves_the_topic_as_it_was(tmp_path: Path) -> None:
    async def main() -> None:
        async with Broker(config(tmp_path)) as broker:
            broker.create_topic("t", 2)
            await broker.produce("t", 0, batch([b"kept"]))
            for partitions in (None, 1, 2, 5):
                with pytest.raises(TopicExistsError):
                    broker.create_topic("t", partitions)
            assert broker.topics() == {"t": 2}
            assert [(r.offset, r.value) for r in await read_all(broker, "t", 0)] == [(0, b"kept")]

    asyncio.run(main())


def test_create_with_its_own_settings(tmp_path: Path) -> None:
    own = LogConfig(segment_bytes=4096, fsync=FsyncPolicy.NEVER, max_batch_bytes=1000)

    async def main() -> None:
        async with Broker(config(tmp_path)) as broker:
            broker.create_topic("own", 2, own)
            broker.create_topic("plain", 1)
            assert [broker.log("own", p).config for p in (0, 1)] == [own, own]
            assert broker.log("plain", 0).config == broker.config.log
        async with Broker(config(tmp_path)) as broker:
            assert [broker.log("own", p).config for p in (0, 1)] == [own, own]
            assert broker.log("plain", 0).config == broker.config.log

    asyncio.run(main())


def _unknown_topic_calls(broker: Broker) -> list[Callable[[], object]]:
    return [
        lambda: broker.describe("nope"),
        lambda: broker.delete_topic("nope"),
        lambda: broker.alter_topic("nope", partitions=2),
        lambda: broker.alter_topic("nope", config=LogConfig()),
        lambda: broker.partition_count("nope"),
        lambda: broker.log("nope", 0),
        lambda: broker.list_offset("nope", 0, -1),
    ]


def test_unknown_topic(tmp_path: Path) -> None:
    async def main() -> None:
        async with Broker(config(tmp_path, auto_create_topics=False)) as broker:
            broker.create_topic("other")
            for call in _unknown_topic_calls(broker):
                with pytest.raises(UnknownTopicError):
                    call()
            with pytest.raises(UnknownTopicError):
                await broker.fetch([("nope", 0, 0, ALL)])
            with pytest.raises(UnknownTopicError):  # even after a partition that exists
                await broker.fetch([("other", 0, 0, ALL), ("nope", 0, 0, ALL)])
            with pytest.raises(UnknownTopicError):
                await broker.produce("nope", 0, batch([b"v"]))
            assert broker.topics() == {"other": 1}

    asyncio.run(main())


@pytest.mark.parametrize("partition", [2, 3, 1000, -1])
def test_unknown_partition(tmp_path: Path, partition: int) -> None:
    async def main() -> None:
        async with Broker(config(tmp_path)) as broker:
            broker.create_topic("t", 2)
            with pytest.raises(UnknownPartitionError):
                broker.log("t", partition)
            with pytest.raises(UnknownPartitionError):
                broker.list_offset("t", partition, -1)
            with pytest.raises(UnknownPartitionError):
                await broker.fetch([("t", 0, 0, ALL), ("t", partition, 0, ALL)])
            with pytest.raises(UnknownPartitionError):  # auto-creation does not add partitions
                await broker.produce("t", partition, batch([b"v"]))
            assert broker.topics() == {"t": 2}
            assert [s.log_end_offset for s in broker.describe("t")] == [0, 0]

    asyncio.run(main())


def test_delete_removes_the_data_and_the_name_can_be_reused(tmp_path: Path) -> None:
    async def main() -> None:
        async with Broker(config(tmp_path)) as broker:
            broker.create_topic("t", 2)
            broker.create_topic("keep", 1)
            for p in (0, 1):
                await broker.produce("t", p, batch([b"old"] * 3))
            await broker.produce("keep", 0, batch([b"k"]))
            broker.delete_topic("t")
            assert broker.topics() == {"keep": 1}
            assert _partition_dirs(tmp_path) == ["keep-0"]
            with pytest.raises(UnknownTopicError):
                broker.delete_topic("t")
            with pytest.raises(UnknownTopicError):
                await broker.fetch([("t", 0, 0, ALL)])
            assert broker.create_topic("t", 3) == 3
            assert [s.log_end_offset for s in broker.describe("t")] == [0, 0, 0]
            assert (await broker.produce("t", 1, batch([b"new"]))).base_offset == 0
            assert [r.value for r in await read_all(broker, "keep", 0)] == [b"k"]
        async with Broker(config(tmp_path)) as broker:
            assert broker.topics() == {"keep": 1, "t": 3}
            assert [r.value for r in await read_all(broker, "t", 1)] == [b"new"]

    asyncio.run(main())


def test_delete_wakes_a_fetch_waiting_on_the_topic(tmp_path: Path) -> None:
    async def main() -> None:
        async with Broker(config(tmp_path)) as broker:
            broker.create_topic("t", 2)
            fetch = asyncio.create_task(broker.fetch([("t", 1, 0, ALL)], max_wait_ms=LONG_POLL_MS))
            await settle()
            assert not fetch.done()
            broker.delete_topic("t")
            with pytest.raises(UnknownTopicError):
                await asyncio.wait_for(fetch, PROMPT_S)

    asyncio.run(main())


def test_alter_adds_partitions_and_keeps_the_data(tmp_path: Path) -> None:
    async def main() -> None:
        async with Broker(config(tmp_path)) as broker:
            broker.create_topic("t", 2)
            await broker.produce("t", 1, batch([b"a", b"b"]))
            broker.alter_topic("t", partitions=2)  # the same count: nothing to do
            assert broker.topics() == {"t": 2}
            broker.alter_topic("t", partitions=5)
            assert broker.topics() == {"t": 5}
            assert [s.log_end_offset for s in broker.describe("t")] == [0, 2, 0, 0, 0]
            assert (await broker.produce("t", 4, batch([b"x"]))).base_offset == 0
            assert broker.log("t", 4).config == broker.log("t", 0).config
        async with Broker(config(tmp_path)) as broker:
            assert broker.topics() == {"t": 5}
            assert [s.log_end_offset for s in broker.describe("t")] == [0, 2, 0, 0, 1]

    asyncio.run(main())


@pytest.mark.parametrize("partitions", [2, 1, 0, -1, MAX_PARTITION + 1])
def test_alter_refuses_fewer_partitions_or_too_many(tmp_path: Path, partitions: int) -> None:
    async def main() -> None:
        async with Broker(config(tmp_path)) as broker:
            broker.create_topic("t", 3)
            await broker.produce("t", 2, batch([b"kept"]))
            with pytest.raises(InvalidTopicError):
                broker.alter_topic("t", partitions=partitions)
            assert broker.topics() == {"t": 3}
            assert [s.log_end_offset for s in broker.describe("t")] == [0, 0, 1]
        assert _partition_dirs(tmp_path) == ["t-0", "t-1", "t-2"]

    asyncio.run(main())


def test_alter_config_applies_to_every_partition_and_persists(tmp_path: Path) -> None:
    changed = LogConfig(
        segment_bytes=2048,
        retention_ms=3_600_000,
        fsync=FsyncPolicy.ALWAYS,
        max_batch_bytes=4096,
    )

    async def main() -> None:
        async with Broker(config(tmp_path)) as broker:
            broker.create_topic("t", 2)
            broker.create_topic("other", 1)
            broker.alter_topic("t", config=changed, partitions=3)  # the new one gets it too
            assert [broker.log("t", p).config for p in range(3)] == [changed] * 3
            assert broker.log("other", 0).config == broker.config.log
        async with Broker(config(tmp_path)) as broker:
            assert broker.topics() == {"other": 1, "t": 3}
            assert [broker.log("t", p).config for p in range(3)] == [changed] * 3
            assert broker.log("other", 0).config == broker.config.log
            # In effect: the new limit refuses what the default accepted.
            big = batch([os.urandom(5000)])
            await broker.produce("other", 0, big)
            with pytest.raises(BatchTooLargeError, match="max_message_bytes=4,096"):
                await broker.produce("t", 0, big)
            broker.alter_topic("t", partitions=4)  # later partitions take the current settings
            assert broker.log("t", 3).config == changed
        async with Broker(config(tmp_path)) as broker:
            assert broker.log("t", 3).config == changed

    asyncio.run(main())


def test_the_partition_cap_refuses_creations_and_additions_beyond_it(tmp_path: Path) -> None:
    async def main() -> None:
        async with Broker(config(tmp_path, max_partitions=10)) as broker:
            await broker.create_topic_async("a", 6)
            with pytest.raises(InvalidTopicError, match="5 more partitions would make 11, above"):
                await broker.create_topic_async("b", 5)
            with pytest.raises(InvalidTopicError, match="max_partitions=10"):
                broker.alter_topic("a", partitions=11)
            with pytest.raises(InvalidTopicError, match="5 more partitions would make 11"):
                await broker.alter_topic_async("a", partitions=11)
            await broker.alter_topic_async("a", partitions=10)
            assert broker.topics() == {"a": 10}

    asyncio.run(main())


def test_large_creations_and_deletions_run_off_the_event_loop(tmp_path: Path) -> None:
    """While a topic of 300 partitions is created and deleted, the loop keeps turning."""

    async def main() -> None:
        async with Broker(config(tmp_path)) as broker:
            turns = 0
            stop = asyncio.Event()

            async def tick() -> None:
                nonlocal turns
                while not stop.is_set():
                    turns += 1
                    await asyncio.sleep(0)

            ticker = asyncio.create_task(tick())
            assert await broker.create_topic_async("wide", 300) == 300
            created_turns = turns
            assert broker.topics() == {"wide": 300}
            assert broker.describe("wide")[299].partition == 299
            await broker.delete_topic_async("wide")
            assert broker.topics() == {}
            with pytest.raises(TopicExistsError, match="being created or deleted"):
                await broker.create_topic_async("wide", 2)  # its files are being removed
            await broker.logs.wait_removals()
            stop.set()
            await ticker
            assert created_turns > 10  # the loop ran while the files were made
            assert turns > created_turns + 10  # ... and while they were removed
            assert not [n for n in os.listdir(tmp_path / "data") if n.startswith("wide")]
            assert await broker.create_topic_async("wide", 2) == 2

    asyncio.run(main())


def test_the_descriptor_limit_and_use_are_logged_at_start(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    async def main() -> None:
        async with Broker(config(tmp_path)) as broker:
            assert broker.max_open_files >= 32

    with caplog.at_level("INFO", logger="tidewire.broker"):
        asyncio.run(main())
    assert "descriptors: limit" in caplog.text
    assert "log files keep at most" in caplog.text
