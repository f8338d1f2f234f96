"""Fetch: whole batches from several partitions within the byte budgets, long-poll, the bound
on waiting fetches, and what a consumer may read under each fsync policy.

Long-polls are observed without sleeping: a fetch is started as a task, the loop is given a
few turns to get it waiting, then a produce (or close, or a delete) must end it well before
its 30 s max wait. Only the timeout path waits, and only for 50 ms.
"""

from __future__ import annotations

import asyncio
import itertools
import random
import threading
from pathlib import Path

import pytest

from tests.broker._support import (
    ALL,
    LONG_POLL_MS,
    PROMPT_S,
    batch,
    config,
    read_all,
    records,
    settle,
    split_batches,
    values,
)
from tidewire.broker import Broker, FetchResult
from tidewire.errors import (
    BackpressureError,
    InvalidConfigError,
    LogClosedError,
    OffsetOutOfRangeError,
)
from tidewire.records import iter_batches
from tidewire.storage import FsyncPolicy, LogConfig
from tidewire.storage.log import PartitionLog


def _check_result(r: FetchResult, offset: int, part_max: int) -> None:
    """One partition's part of a fetch: whole, consecutive batches, the first holding
    ``offset``, within ``part_max`` unless a single batch; ``next_offset`` after the last."""
    chunks = split_batches(r.data)
    if not chunks:
        assert r.next_offset == offset
        return
    heads = [h for _, h in iter_batches(r.data)]
    assert heads[0].base_offset <= offset <= heads[0].last_offset
    for a, b in itertools.pairwise(heads):
        assert b.base_offset == a.next_offset
    assert r.next_offset == heads[-1].next_offset
    assert r.next_offset <= r.high_watermark
    assert len(r.data) <= part_max or len(chunks) == 1


@pytest.mark.parametrize("seed", range(4))
def test_whole_batches_from_several_partitions_within_the_budgets(
    tmp_path: Path, seed: int
) -> None:
    rng = random.Random(seed)
    log_config = LogConfig(segment_bytes=8192, index_interval_bytes=512)

    async def main() -> None:
        async with Broker(config(tmp_path, log=log_config)) as broker:
            broker.create_topic("t", 3)
            model: dict[int, list[tuple[int, bytes | None]]] = {0: [], 1: [], 2: []}
            biggest = 0
            for _ in range(120):
                p = rng.randrange(3)
                vals = [rng.randbytes(rng.randint(0, 600)) for _ in range(rng.randint(1, 4))]
                data = batch(vals)
                biggest = max(biggest, len(data))
                res = await broker.produce("t", p, data)
                model[p] += [(res.base_offset + i, v) for i, v in enumerate(vals)]
            # A budget of at least the largest batch: every fetch makes progress.
            max_bytes = rng.choice([biggest, 2 * biggest, 5000, ALL])
            max_bytes = max(max_bytes, biggest)
            part_max = [rng.choice([1, 300, 2000, ALL]) for _ in range(3)]
            offsets = [0, 0, 0]
            got: dict[int, list[tuple[int, bytes | None]]] = {0: [], 1: [], 2: []}
            for _ in range(1000):
                order = rng.sample(range(3), 3)
                wants = [("t", p, offsets[p], part_max[p]) for p in order]
                results = await broker.fetch(wants, max_bytes=max_bytes)
                assert [(r.topic, r.partition) for r in results] == [("t", p) for p in order]
                total = sum(len(r.data) for r in results)
                assert total <= max_bytes or sum(bool(r.data) for r in results) == 1
                pending = any(offsets[p] < len(model[p]) for p in range(3))
                assert (total > 0) == pending  # at least one batch whenever there is data
                if not pending:
                    break
                for r in results:
                    p = r.partition
                    _check_result(r, offsets[p], part_max[p])
                    assert r.high_watermark == len(model[p])
                    got[p] += values(r.data, since=offsets[p])
                    offsets[p] = r.next_offset
            assert got == model

    asyncio.run(main())


def test_per_partition_budget_and_next_offset(tmp_path: Path) -> None:
    async def main() -> None:
        async with Broker(config(tmp_path)) as broker:
            broker.create_topic("t", 2)
            sizes = []
            for i in range(10):
                data = batch([b"%d" % i, b"x" * 100])
                sizes.append(len(data))
                await broker.produce("t", 0, data)
                await broker.produce("t", 1, data)
            one, two = sizes[0], sizes[0] + sizes[1]
            # Budget of one batch, of two, of a bit less than two; an offset inside a batch.
            results = await broker.fetch([("t", 0, 0, one), ("t", 1, 3, two - 1)], max_bytes=ALL)
            assert [len(r.data) for r in results] == [one, one]
            assert [r.next_offset for r in results] == [2, 4]
            assert values(results[1].data)[0] == (2, b"1")  # the batch holding offset 3
            [r] = await broker.fetch([("t", 0, 2, two)])
            assert (len(r.data), r.next_offset) == (two, 6)
            # A budget below one batch still returns that one batch.
            [r] = await broker.fetch([("t", 0, 19, 1)])
            assert (len(r.data), r.next_offset) == (sizes[9], 20)
            # The response budget runs out: later partitions get nothing and keep their offset.
            results = await broker.fetch([("t", 0, 0, ALL), ("t", 1, 0, ALL)], max_bytes=two)
            assert [len(r.data) for r in results] == [two, 0]
            assert [r.next_offset for r in results] == [4, 0]

    asyncio.run(main())


def test_at_the_end_an_empty_result_at_once(tmp_path: Path) -> None:
    async def main() -> None:
        async with Broker(config(tmp_path)) as broker:
            broker.create_topic("t", 2)
            await broker.produce("t", 0, batch([b"a", b"b"]))
            wants = [("t", 0, 2, ALL), ("t", 1, 0, ALL)]
            results = await asyncio.wait_for(broker.fetch(wants, max_wait_ms=0), PROMPT_S)
            assert [(r.data, r.next_offset, r.high_watermark) for r in results] == [
                (b"", 2, 2),
                (b"", 0, 0),
            ]
            # Past the end, or below the start, is out of range.
            with pytest.raises(OffsetOutOfRangeError):
                await broker.fetch([("t", 0, 3, ALL)])
            with pytest.raises(OffsetOutOfRangeError):
                await broker.fetch([("t", 0, -1, ALL)])

    asyncio.run(main())


def test_long_poll_wakes_on_a_produce_to_one_of_its_partitions(tmp_path: Path) -> None:
    async def main() -> None:
        async with Broker(config(tmp_path)) as broker:
            broker.create_topic("t", 3)
            wants = [("t", 0, 0, ALL), ("t", 1, 0, ALL)]
            loop = asyncio.get_running_loop()
            start = loop.time()
            fetch = asyncio.create_task(broker.fetch(wants, max_wait_ms=LONG_POLL_MS))
            await settle()
            assert not fetch.done()
            await broker.produce("t", 2, batch([b"elsewhere"]))  # not one of its partitions
            await settle()
            assert not fetch.done()
            await broker.produce("t", 1, batch([b"hello"]))
            results = await asyncio.wait_for(fetch, PROMPT_S)
            assert loop.time() - start < PROMPT_S
            assert [values(r.data) for r in results] == [[], [(0, b"hello")]]
            assert [r.next_offset for r in results] == [0, 1]

    asyncio.run(main())


@pytest.mark.parametrize("policy", [FsyncPolicy.ALWAYS, FsyncPolicy.INTERVAL])
def test_a_long_poll_is_answered_with_the_producer_not_after_it(
    tmp_path: Path, policy: FsyncPolicy
) -> None:
    """The log wakes a waiting fetch in the step that makes the batch visible (under
    ``always``: the one that takes the fsync back), in the same turn as the producer's own
    answer, not in turns after the producer resumed."""

    async def main() -> None:
        async with Broker(config(tmp_path, log=LogConfig(fsync=policy))) as broker:
            broker.create_topic("t")
            fetch = asyncio.create_task(broker.fetch([("t", 0, 0, ALL)], max_wait_ms=LONG_POLL_MS))
            await settle()
            assert not fetch.done()
            await broker.produce("t", 0, batch([b"now"]))
            await asyncio.sleep(0)  # one turn: the fetch was woken with the producer
            assert fetch.done()
            assert [values(r.data) for r in fetch.result()] == [[(0, b"now")]]

    asyncio.run(main())


def test_long_poll_waits_for_min_bytes(tmp_path: Path) -> None:
    async def main() -> None:
        async with Broker(config(tmp_path)) as broker:
            broker.create_topic("t")
            first = batch([b"x" * 50])
            fetch = asyncio.create_task(
                broker.fetch([("t", 0, 0, ALL)], max_wait_ms=LONG_POLL_MS, min_bytes=150)
            )
            await settle()
            await broker.produce("t", 0, first)
            await settle()
            assert not fetch.done()  # woken, but 120-odd bytes are not enough
            await broker.produce("t", 0, first)
            [r] = await asyncio.wait_for(fetch, PROMPT_S)
            assert len(r.data) == 2 * len(first)

    asyncio.run(main())


def test_long_poll_times_out_with_an_empty_result(tmp_path: Path) -> None:
    async def main() -> None:
        async with Broker(config(tmp_path)) as broker:
            broker.create_topic("t")
            await broker.produce("t", 0, batch([b"a"]))
            loop = asyncio.get_running_loop()
            start = loop.time()
            [r] = await asyncio.wait_for(broker.fetch([("t", 0, 1, ALL)], max_wait_ms=50), PROMPT_S)
            assert loop.time() - start >= 0.045
            assert (r.data, r.next_offset, r.high_watermark) == (b"", 1, 1)

    asyncio.run(main())


def test_the_broker_caps_the_wait(tmp_path: Path) -> None:
    async def main() -> None:
        async with Broker(config(tmp_path, max_wait_ms=50)) as broker:
            broker.create_topic("t")
            fetch = broker.fetch([("t", 0, 0, ALL)], max_wait_ms=LONG_POLL_MS)
            [r] = await asyncio.wait_for(fetch, PROMPT_S)
            assert r.data == b""

    asyncio.run(main())


def test_waiting_fetches_are_bounded(tmp_path: Path) -> None:
    async def main() -> None:
        async with Broker(config(tmp_path, max_fetch_waiters=2)) as broker:
            broker.create_topic("t", 2)
            await broker.produce("t", 1, batch([b"there"]))
            waiting = [
                asyncio.create_task(broker.fetch([("t", 0, 0, ALL)], max_wait_ms=LONG_POLL_MS))
                for _ in range(2)
            ]
            await settle()
            with pytest.raises(BackpressureError) as info:
                await broker.fetch([("t", 0, 0, ALL)], max_wait_ms=LONG_POLL_MS)
            assert info.value.retriable
            assert "max_fetch_waiters=2" in info.value.message
            # A fetch that need not wait is served; one that need not wait at all too.
            [r] = await broker.fetch([("t", 1, 0, ALL)], max_wait_ms=LONG_POLL_MS)
            assert values(r.data) == [(0, b"there")]
            [r] = await broker.fetch([("t", 0, 0, ALL)], max_wait_ms=0)
            assert r.data == b""
            await broker.produce("t", 0, batch([b"wake"]))
            for task in waiting:
                [r] = await asyncio.wait_for(task, PROMPT_S)
                assert values(r.data) == [(0, b"wake")]
            # The places are free again.
            again = [
                asyncio.create_task(broker.fetch([("t", 0, 1, ALL)], max_wait_ms=LONG_POLL_MS))
                for _ in range(2)
            ]
            await settle()
            assert not any(t.done() for t in again)
            await broker.produce("t", 0, batch([b"more"]))
            for task in again:
                [r] = await asyncio.wait_for(task, PROMPT_S)
                assert values(r.data) == [(1, b"more")]

    asyncio.run(main())


def test_close_wakes_waiting_fetches(tmp_path: Path) -> None:
    async def main() -> None:
        broker = Broker(config(tmp_path))
        await broker.start()
        broker.create_topic("t", 2)
        fetches = [
            asyncio.create_task(broker.fetch([("t", p, 0, ALL)], max_wait_ms=LONG_POLL_MS))
            for p in (0, 1, 1)
        ]
        await settle()
        assert not any(f.done() for f in fetches)
        await broker.close()
        for f in fetches:
            # Woken at once; the logs being closed, the fetch reports it (an empty answer
            # would do as well: what matters is that nobody waits out the 30 s).
            try:
                [r] = await asyncio.wait_for(f, PROMPT_S)
            except LogClosedError:
                continue
            assert r.data == b""

    asyncio.run(main())


def test_close_wakes_a_fetch_even_while_a_flush_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    gate = threading.Event()
    original = PartitionLog._flush_io

    def gated_flush_io(self: PartitionLog, plan: object) -> None:
        gate.wait(PROMPT_S)  # a slow fsync, released by the test
        original(self, plan)  # type: ignore[arg-type]

    async def main() -> None:
        broker = Broker(config(tmp_path, log=LogConfig(fsync=FsyncPolicy.ALWAYS)))
        await broker.start()
        broker.create_topic("t", 2)
        fetch = asyncio.create_task(broker.fetch([("t", 1, 0, ALL)], max_wait_ms=LONG_POLL_MS))
        await settle()
        monkeypatch.setattr(PartitionLog, "_flush_io", gated_flush_io)
        produce = asyncio.create_task(broker.produce("t", 0, batch([b"x"])))
        try:
            await settle()
            closing = asyncio.create_task(broker.close())
            await settle(20)  # close woke the fetch and waits for the flush of t-0
        finally:
            gate.set()
        await closing
        await produce
        try:
            [r] = await asyncio.wait_for(fetch, 2.0)
        except LogClosedError:
            return
        assert r.data == b""

    asyncio.run(main())


def test_fsync_always_readers_see_only_flushed_data(tmp_path: Path) -> None:
    async def main() -> None:
        async with Broker(config(tmp_path, log=LogConfig(fsync=FsyncPolicy.ALWAYS))) as broker:
            broker.create_topic("t")
            plog = broker.log("t", 0)
            produce = asyncio.create_task(broker.produce("t", 0, batch([b"a", b"b"])))
            while plog.log_end_offset == 0:
                await asyncio.sleep(0)
            # In the log, not yet fsynced: invisible to readers.
            assert plog.flushed_offset == 0
            [r] = await broker.fetch([("t", 0, 0, ALL)])
            assert (r.data, r.next_offset, r.high_watermark) == (b"", 0, 0)
            assert broker.list_offset("t", 0, -1) == 0
            [status] = broker.describe("t")
            assert (status.log_end_offset, status.high_watermark) == (2, 0)
            res = await asyncio.wait_for(produce, PROMPT_S)
            assert plog.flushed_offset >= res.last_offset + 1 == 2
            [r] = await broker.fetch([("t", 0, 0, ALL)])
            assert values(r.data) == [(0, b"a"), (1, b"b")]
            assert r.high_watermark == plog.flushed_offset == broker.list_offset("t", 0, -1)

    asyncio.run(main())


def test_fsync_always_fetches_never_pass_the_flushed_offset(tmp_path: Path) -> None:
    rng = random.Random(3)

    async def main() -> None:
        async with Broker(config(tmp_path, log=LogConfig(fsync=FsyncPolicy.ALWAYS))) as broker:
            broker.create_topic("t", 2)
            plogs = [broker.log("t", p) for p in (0, 1)]
            done = False
            seen = 0

            async def consumer() -> list[list[bytes | None]]:
                nonlocal seen
                offsets = [0, 0]
                got: list[list[bytes | None]] = [[], []]
                while True:
                    finished = done
                    wants = [("t", p, offsets[p], rng.choice([1, 500, ALL])) for p in (0, 1)]
                    for r in await broker.fetch(wants):
                        plog = plogs[r.partition]
                        assert r.high_watermark == plog.flushed_offset
                        assert r.next_offset <= plog.flushed_offset
                        if r.data:
                            seen += 1
                        got[r.partition] += [v for _, v in values(r.data, offsets[r.partition])]
                        offsets[r.partition] = r.next_offset
                    if finished and offsets == [p.log_end_offset for p in plogs]:
                        return got
                    await asyncio.sleep(0)

            async def producer(n: int) -> None:
                for i in range(10):
                    await broker.produce("t", (n + i) % 2, batch([b"%d-%d" % (n, i)]))

            task = asyncio.create_task(consumer())
            await asyncio.gather(*(producer(n) for n in range(8)))
            done = True
            got = await asyncio.wait_for(task, PROMPT_S)
            for p in (0, 1):
                assert got[p] == [r.value for r in await read_all(broker, "t", p)]
            assert sorted(v for part in got for v in part if v) == sorted(
                b"%d-%d" % (n, i) for n in range(8) for i in range(10)
            )
            assert seen > 1  # the consumer saw the data arrive, not all at the end

    asyncio.run(main())


def test_durable_produce_under_interval_returns_after_an_fsync(tmp_path: Path) -> None:
    # An hour between interval flushes: only a durable produce makes anything durable here.
    hourly = LogConfig(fsync=FsyncPolicy.INTERVAL, flush_interval_ms=3_600_000)

    async def main() -> None:
        async with Broker(config(tmp_path, log=hourly)) as broker:
            broker.create_topic("t", 2)
            plog = broker.log("t", 0)
            res = await broker.produce("t", 0, batch([b"a", b"b"]))
            await settle()
            assert plog.flushed_offset == 0
            # Under interval readers see what is written.
            assert [v for _, v in values((await broker.fetch([("t", 0, 0, ALL)]))[0].data)] == [
                b"a",
                b"b",
            ]
            res = await broker.produce("t", 0, batch([b"c"]) + batch([b"d"]), durable=True)
            assert plog.flushed_offset >= res.last_offset + 1 == 4

            async def durable_one(p: int, i: int) -> None:
                res = await broker.produce("t", p, batch([b"%d" % i] * (i % 3 + 1)), durable=True)
                assert broker.log("t", p).flushed_offset >= res.last_offset + 1

            await asyncio.gather(*(durable_one(i % 2, i) for i in range(30)))

    asyncio.run(main())


def test_fsync_always_a_non_durable_produce_becomes_visible(tmp_path: Path) -> None:
    async def main() -> None:
        async with Broker(config(tmp_path, log=LogConfig(fsync=FsyncPolicy.ALWAYS))) as broker:
            broker.create_topic("t")
            await broker.produce("t", 0, batch([b"acked"]), durable=False)
            [r] = await asyncio.wait_for(
                broker.fetch([("t", 0, 0, ALL)], max_wait_ms=1000), PROMPT_S
            )
            assert values(r.data) == [(0, b"acked")]

    asyncio.run(main())


def test_at_least_one_batch_when_earlier_partitions_are_empty(tmp_path: Path) -> None:
    async def main() -> None:
        async with Broker(config(tmp_path)) as broker:
            broker.create_topic("t", 2)
            big = batch([b"x" * 500])
            await broker.produce("t", 1, big)
            results = await broker.fetch([("t", 0, 0, ALL), ("t", 1, 0, ALL)], max_bytes=100)
            assert [len(r.data) for r in results] == [0, len(big)]
            assert [r.next_offset for r in results] == [0, 1]

    asyncio.run(main())


def test_records_round_trip(tmp_path: Path) -> None:
    async def main() -> None:
        async with Broker(config(tmp_path)) as broker:
            data = batch([b"k1", b"", b"v" * 1000], timestamps=[5, 3, 9])
            await broker.produce("t", 0, data)
            [r] = await broker.fetch([("t", 0, 0, ALL)])
            got = records(r.data)
            assert [(x.offset, x.timestamp, x.value) for x in got] == [
                (0, 5, b"k1"),
                (1, 3, b""),
                (2, 9, b"v" * 1000),
            ]

    asyncio.run(main())


def test_the_broker_caps_what_one_fetch_carries(tmp_path: Path) -> None:
    """fetch_max_bytes bounds an answer whatever the fetch asks for; one batch larger than
    the cap still goes, alone."""

    async def main() -> None:
        cfg = config(tmp_path, fetch_max_bytes=64 * 1024)
        async with Broker(cfg) as broker:
            broker.create_topic("t", 1)
            for i in range(10):
                await broker.produce("t", 0, batch([bytes([i]) * 16 * 1024]))
            big = batch([b"b" * 100 * 1024])
            await broker.produce("t", 0, big)
            [r] = await broker.fetch([("t", 0, 0, 1 << 30)], max_bytes=1 << 30)
            assert 0 < len(r.data) <= 64 * 1024
            assert r.next_offset == 3
            [r] = await broker.fetch([("t", 0, 10, 1 << 30)], max_bytes=1 << 30)
            assert len(r.data) == len(big)

    asyncio.run(main())


@pytest.mark.parametrize("value", [0, 1023, 2**30 + 1])
def test_fetch_max_bytes_out_of_range_is_refused(tmp_path: Path, value: int) -> None:
    with pytest.raises(InvalidConfigError, match=f"fetch_max_bytes={value:,} must be within"):
        config(tmp_path, fetch_max_bytes=value)
