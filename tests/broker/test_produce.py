"""Produce: all-or-nothing appends, batch limits, auto-creation and the offsets returned.

A request's batches are all checked before any is stored: a malformed or oversized batch
anywhere in it stores none of them. Offsets returned match a model over many requests and
partitions, and concurrent requests to one partition each land at consecutive offsets.
"""

from __future__ import annotations

import asyncio
import random
from pathlib import Path

import pytest

from tests.broker._support import ALL, batch, config, read_all, settle
from tests.records._batches import patch_header, reseal
from tidewire.broker import Broker, ProduceResult
from tidewire.errors import (
    BatchLengthError,
    BatchTooLargeError,
    CorruptBatchError,
    InvalidMagicError,
    RecordBatchError,
    RecordCountError,
    TidewireError,
    UnknownTopicError,
)
from tidewire.records import Codec
from tidewire.storage import FsyncPolicy, LogConfig

GOOD = batch([b"first", b"second"])


def _flip_value_byte(b: bytes) -> bytes:
    buf = bytearray(b)
    buf[-3] ^= 0x40
    return bytes(buf)


#: Malformed batches: id, bytes, the error when it is the request's last batch, and whether
#: only the log's append (not the broker's up-front check) refuses it.
MALFORMED: list[tuple[str, bytes, type[RecordBatchError]]] = [
    ("crc", _flip_value_byte(batch([b"payload"])), CorruptBatchError),
    ("truncated", batch([b"payload"])[:-4], BatchLengthError),
    ("magic", patch_header(batch([b"payload"]), magic=1), InvalidMagicError),
    ("short-garbage", b"\x00" * 20, BatchLengthError),
    (
        "negative-count",
        reseal(patch_header(batch([b"x"]), records_count=-1)),
        RecordCountError,
    ),
    ("no-records", batch([]), RecordCountError),
    (
        "last-offset-delta",
        reseal(patch_header(batch([b"a", b"b", b"c"]), last_offset_delta=1)),
        RecordCountError,
    ),
]
#: Where the malformed batch sits in the request.
PLACES = ("alone", "after-one", "between-two")


def _malformed_cases() -> list[object]:
    cases: list[object] = []
    for name, bad, error in MALFORMED:
        for where in PLACES:
            data = {"alone": bad, "after-one": GOOD + bad, "between-two": GOOD + bad + GOOD}[where]
            # Followed by more bytes, a cut batch reads them as its own: the class may differ.
            expected = RecordBatchError if where == "between-two" else error
            cases.append(pytest.param(data, expected, id=f"{name}-{where}"))
    return cases


@pytest.mark.parametrize(("data", "error"), _malformed_cases())
def test_a_malformed_batch_stores_nothing_of_the_request(
    tmp_path: Path, data: bytes, error: type[RecordBatchError]
) -> None:
    async def main() -> None:
        async with Broker(config(tmp_path)) as broker:
            broker.create_topic("t")
            with pytest.raises(error) as info:
                await broker.produce("t", 0, data)
            assert isinstance(info.value, RecordBatchError)
            assert not info.value.retriable
            await settle()  # a write queued for the end of the loop turn would land now
            [status] = broker.describe("t")
            assert (status.log_end_offset, status.size_bytes) == (0, 0)
            assert await read_all(broker, "t", 0) == []
            # The partition is unharmed: the good batches alone are accepted at offset 0.
            assert await broker.produce("t", 0, GOOD + GOOD) == ProduceResult(0, 3, 0)
        async with Broker(config(tmp_path)) as broker:
            assert [r.value for r in await read_all(broker, "t", 0)] == [
                b"first",
                b"second",
            ] * 2

    asyncio.run(main())


def test_an_oversized_batch_stores_nothing_of_the_request(tmp_path: Path) -> None:
    small = batch([b"s"])
    exact = batch([b"y" * 200])
    big = batch([b"x" * 201])
    limit = LogConfig(max_batch_bytes=len(exact))

    async def main() -> None:
        async with Broker(config(tmp_path, log=limit)) as broker:
            broker.create_topic("t")
            broker.create_topic("roomy", 1, LogConfig())
            for data in (big, small + big, small + big + small):
                with pytest.raises(
                    BatchTooLargeError, match=f"{len(big)} bytes .*max_message_bytes={len(exact)}"
                ):
                    await broker.produce("t", 0, data)
            await settle()
            assert broker.describe("t")[0].log_end_offset == 0
            # A batch of exactly the limit is accepted; the limit is per topic.
            assert await broker.produce("t", 0, exact) == ProduceResult(0, 0, 0)
            assert await broker.produce("roomy", 0, big + small) == ProduceResult(0, 1, 0)

    asyncio.run(main())


def test_an_empty_request_is_refused(tmp_path: Path) -> None:
    async def main() -> None:
        async with Broker(config(tmp_path)) as broker:
            broker.create_topic("t")
            with pytest.raises(TidewireError):
                await broker.produce("t", 0, b"")
            assert broker.describe("t")[0].log_end_offset == 0

    asyncio.run(main())


def test_auto_creation_is_on_by_default(tmp_path: Path) -> None:
    async def main() -> None:
        async with Broker(config(tmp_path, default_partitions=3)) as broker:
            assert broker.config.auto_create_topics
            assert await broker.produce("fresh", 2, batch([b"a"])) == ProduceResult(0, 0, 0)
            assert broker.topics() == {"fresh": 3}
            assert [s.log_end_offset for s in broker.describe("fresh")] == [0, 0, 1]
            assert broker.log("fresh", 0).config == broker.config.log
            # The second produce finds the topic: nothing is created twice.
            assert await broker.produce("fresh", 0, batch([b"b"])) == ProduceResult(0, 0, 0)
            assert broker.topics() == {"fresh": 3}
        async with Broker(config(tmp_path, default_partitions=1)) as broker:
            assert broker.topics() == {"fresh": 3}

    asyncio.run(main())


def test_auto_creation_off(tmp_path: Path) -> None:
    async def main() -> None:
        async with Broker(config(tmp_path, auto_create_topics=False)) as broker:
            with pytest.raises(UnknownTopicError):
                await broker.produce("fresh", 0, batch([b"a"]))
            assert broker.topics() == {}
            broker.create_topic("fresh")
            assert await broker.produce("fresh", 0, batch([b"a"])) == ProduceResult(0, 0, 0)

    asyncio.run(main())


def _request(rng: random.Random, tag: str) -> tuple[bytes, list[bytes]]:
    """A produce request of 1..3 batches of 1..5 records; returns it and its values."""
    data = b""
    vals: list[bytes] = []
    for i in range(rng.randint(1, 3)):
        vs = [f"{tag}/{i}/{j}".encode() * rng.randint(1, 20) for j in range(rng.randint(1, 5))]
        data += batch(vs, codec=rng.choice([Codec.NONE, Codec.NONE, Codec.LZ4, Codec.ZSTD]))
        vals += vs
    return data, vals


@pytest.mark.parametrize("seed", range(3))
def test_offsets_across_many_produces_and_partitions(tmp_path: Path, seed: int) -> None:
    rng = random.Random(seed)
    small_segments = LogConfig(segment_bytes=4096, index_interval_bytes=256)

    async def main() -> None:
        async with Broker(config(tmp_path, default_partitions=4, log=small_segments)) as broker:
            model: dict[int, list[bytes]] = {p: [] for p in range(4)}
            for n in range(150):
                p = rng.randrange(4)
                data, vals = _request(rng, f"{p}:{n}")
                result = await broker.produce("t", p, data)
                end = len(model[p])
                assert result == ProduceResult(end, end + len(vals) - 1, 0)
                model[p] += vals
            for p in range(4):
                got = await read_all(broker, "t", p, max_bytes=rng.choice([1, 500, ALL]))
                assert [(r.offset, r.value) for r in got] == list(enumerate(model[p]))
                status = broker.describe("t")[p]
                assert status.log_end_offset == status.high_watermark == len(model[p])
            assert broker.log("t", 0).segment_count > 1

    asyncio.run(main())


@pytest.mark.parametrize("durable", [None, True])
def test_concurrent_requests_each_land_at_consecutive_offsets(
    tmp_path: Path, durable: bool | None
) -> None:
    rng = random.Random(7)

    async def main() -> None:
        async with Broker(config(tmp_path)) as broker:
            broker.create_topic("t", 2)
            requests = [(rng.randrange(2), *_request(rng, f"r{n}")) for n in range(60)]
            results = await asyncio.gather(
                *(broker.produce("t", p, data, durable=durable) for p, data, _ in requests)
            )
            stored = {p: [r.value for r in await read_all(broker, "t", p)] for p in (0, 1)}
            claimed: dict[int, set[int]] = {0: set(), 1: set()}
            for (p, _, vals), res in zip(requests, results, strict=True):
                assert res.last_offset - res.base_offset + 1 == len(vals)
                assert stored[p][res.base_offset : res.last_offset + 1] == vals
                span = set(range(res.base_offset, res.last_offset + 1))
                assert not span & claimed[p]
                claimed[p] |= span
            assert claimed == {p: set(range(len(stored[p]))) for p in (0, 1)}

    asyncio.run(main())


@pytest.mark.parametrize(
    ("policy", "durable", "fsynced"),
    [
        (FsyncPolicy.ALWAYS, None, True),  # acks=durable under always: after the fsync
        (FsyncPolicy.INTERVAL, None, False),  # acks=durable under interval: written only
        (FsyncPolicy.INTERVAL, True, True),  # asked for an fsync: one happens
        (FsyncPolicy.ALWAYS, False, False),  # acks=leader: written only, fsynced later
    ],
)
def test_what_a_produce_waits_for(
    tmp_path: Path, policy: FsyncPolicy, durable: bool | None, fsynced: bool
) -> None:
    async def main() -> None:
        cfg = config(tmp_path, log=LogConfig(fsync=policy, flush_interval_ms=3_600_000))
        async with Broker(cfg) as broker:
            await broker.produce("t", 0, batch([b"a"]), durable=durable)
            plog = broker.log("t", 0)
            assert plog.log_end_offset == 1
            assert (plog.flushed_offset == 1) is fsynced

    asyncio.run(main())
