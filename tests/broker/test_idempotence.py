"""Idempotent producers in the broker: a batch sent again is stored once and answered with its
original offsets; sequences that skip are refused; an older epoch is fenced; the state survives
a clean restart (snapshot), an unclean one (rebuilt from the log), and a snapshot that is past
the log's end; producer ids are never handed out twice.
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Sequence
from pathlib import Path

import pytest

from tests.broker._support import T0, config, read_all
from tidewire.broker import Broker
from tidewire.broker.producers import (
    ID_BLOCK,
    KEEP_BATCHES,
    PRODUCER_IDS_FILE,
    SEQ_MOD,
    SNAPSHOT_FILE,
    PartitionProducers,
    decode_snapshot,
    encode_snapshot,
)
from tidewire.errors import (
    BackpressureError,
    DuplicateSequenceError,
    InvalidRequestError,
    OutOfOrderSequenceError,
    ProducerFencedError,
)
from tidewire.records import BatchBuilder, BatchHeader, parse_header
from tidewire.storage import FsyncPolicy, LogConfig


def pbatch(pid: int, epoch: int, seq: int, values: Sequence[bytes]) -> bytes:
    """A batch of producer ``pid``/``epoch`` with sequences ``seq`` .. ``seq+len-1``."""
    b = BatchBuilder(producer_id=pid, producer_epoch=epoch, base_sequence=seq)
    for v in values:
        b.append(v, timestamp_ms=T0)
    return b.build()


async def stored(broker: Broker, topic: str = "t", partition: int = 0) -> list[bytes | None]:
    return [r.value for r in await read_all(broker, topic, partition)]


def test_a_batch_sent_again_is_stored_once_with_its_offsets(tmp_path: Path) -> None:
    async def main() -> None:
        async with Broker(config(tmp_path)) as b:
            pid, epoch = await b.init_producer_id()
            first = await b.produce("t", 0, pbatch(pid, epoch, 0, [b"a", b"b"]))
            second = await b.produce("t", 0, pbatch(pid, epoch, 2, [b"c"]))
            again = await b.produce("t", 0, pbatch(pid, epoch, 0, [b"a", b"b"]))
            assert (again.base_offset, again.last_offset) == (first.base_offset, 1)
            again2 = await b.produce("t", 0, pbatch(pid, epoch, 2, [b"c"]))
            assert again2.base_offset == second.base_offset == 2
            # Not idempotent: stored every time.
            await b.produce("t", 0, pbatch(-1, -1, -1, [b"x"]))
            await b.produce("t", 0, pbatch(-1, -1, -1, [b"x"]))
            assert await stored(b) == [b"a", b"b", b"c", b"x", b"x"]

    asyncio.run(main())


def test_sequences_that_skip_or_are_too_old(tmp_path: Path) -> None:
    async def main() -> None:
        async with Broker(config(tmp_path)) as b:
            pid, epoch = await b.init_producer_id()
            for i in range(KEEP_BATCHES + 2):
                await b.produce("t", 0, pbatch(pid, epoch, i, [b"v%d" % i]))
            with pytest.raises(OutOfOrderSequenceError, match="sequence 9 where 7 was next"):
                await b.produce("t", 0, pbatch(pid, epoch, 9, [b"gap"]))
            # Sequence 0 is older than the last five batches: stored, offsets forgotten.
            with pytest.raises(DuplicateSequenceError, match="stored before"):
                await b.produce("t", 0, pbatch(pid, epoch, 0, [b"v0"]))
            # A remembered batch with other bounds is not the same batch.
            with pytest.raises(OutOfOrderSequenceError):
                await b.produce("t", 0, pbatch(pid, epoch, 5, [b"v5", b"v6", b"zz"]))
            # A new epoch must start at 0.
            with pytest.raises(OutOfOrderSequenceError, match="not 0"):
                await b.produce("t", 0, pbatch(pid, epoch + 1, 3, [b"e1"]))
            assert len(await stored(b)) == KEEP_BATCHES + 2

    asyncio.run(main())


def test_a_request_is_all_or_nothing(tmp_path: Path) -> None:
    async def main() -> None:
        async with Broker(config(tmp_path)) as b:
            pid, epoch = await b.init_producer_id()
            ok = pbatch(pid, epoch, 0, [b"a"])
            bad = pbatch(pid, epoch, 5, [b"b"])
            with pytest.raises(OutOfOrderSequenceError):
                await b.produce("t", 0, ok + bad)
            assert await stored(b) == []
            # Two batches in one request that follow each other: both stored.
            r = await b.produce("t", 0, ok + pbatch(pid, epoch, 1, [b"b", b"c"]))
            assert (r.base_offset, r.last_offset) == (0, 2)
            # The same request again: both are duplicates.
            r2 = await b.produce("t", 0, ok + pbatch(pid, epoch, 1, [b"b", b"c"]))
            assert (r2.base_offset, r2.last_offset) == (0, 2)
            assert await stored(b) == [b"a", b"b", b"c"]

    asyncio.run(main())


def test_an_older_epoch_is_fenced(tmp_path: Path) -> None:
    async def main() -> None:
        async with Broker(config(tmp_path)) as b:
            pid, epoch = await b.init_producer_id()
            await b.produce("t", 0, pbatch(pid, epoch, 0, [b"old"]))
            pid2, epoch2 = await b.init_producer_id(pid, epoch)
            assert (pid2, epoch2) == (pid, epoch + 1)
            # The old instance can write nowhere any more, not even where the new one has not.
            with pytest.raises(ProducerFencedError):
                await b.produce("t", 0, pbatch(pid, epoch, 1, [b"zombie"]))
            with pytest.raises(ProducerFencedError):
                await b.produce("other", 0, pbatch(pid, epoch, 0, [b"zombie"]))
            with pytest.raises(ProducerFencedError):
                await b.init_producer_id(pid, epoch)
            await b.produce("t", 0, pbatch(pid, epoch2, 0, [b"new"]))
            assert await stored(b) == [b"old", b"new"]
            with pytest.raises(InvalidRequestError, match="never handed out"):
                await b.init_producer_id(pid + 10 * ID_BLOCK, 0)
            with pytest.raises(InvalidRequestError, match="needs a producer_id"):
                await b.init_producer_id(-1, 3)

    asyncio.run(main())


def test_sequences_wrap_around(tmp_path: Path) -> None:
    async def main() -> None:
        async with Broker(config(tmp_path)) as b:
            pid, epoch = await b.init_producer_id()
            # A producer this partition holds nothing of may start anywhere.
            await b.produce("t", 0, pbatch(pid, epoch, SEQ_MOD - 2, [b"a", b"b"]))
            await b.produce("t", 0, pbatch(pid, epoch, 0, [b"c"]))
            r = await b.produce("t", 0, pbatch(pid, epoch, SEQ_MOD - 2, [b"a", b"b"]))
            assert r.base_offset == 0
            with pytest.raises(OutOfOrderSequenceError):
                await b.produce("t", 0, pbatch(pid, epoch, 2, [b"d"]))
            assert await stored(b) == [b"a", b"b", b"c"]

    asyncio.run(main())


def test_a_duplicate_of_a_batch_in_flight_waits_for_it(tmp_path: Path) -> None:
    async def main() -> None:
        cfg = config(tmp_path, log=LogConfig(fsync=FsyncPolicy.ALWAYS))
        async with Broker(cfg) as b:
            pid, epoch = await b.init_producer_id()
            data = pbatch(pid, epoch, 0, [b"a"])
            r1, r2 = await asyncio.gather(b.produce("t", 0, data), b.produce("t", 0, data))
            assert r1 == r2
            assert b.log("t", 0).flushed_offset == 1
            assert await stored(b) == [b"a"]

    asyncio.run(main())


@pytest.mark.parametrize("stop", ["clean", "crash"])
def test_state_survives_a_restart(tmp_path: Path, stop: str) -> None:
    cfg = config(tmp_path, log=LogConfig(fsync=FsyncPolicy.ALWAYS))
    ids: list[tuple[int, int]] = []

    async def before() -> None:
        b = Broker(cfg)
        await b.start()
        ids.append(await b.init_producer_id())
        ids.append(await b.init_producer_id())
        (p1, e1), (p2, e2) = ids
        for i in range(3):
            await b.produce("t", 0, pbatch(p1, e1, i, [b"p1-%d" % i]))
            await b.produce("t", 0, pbatch(p2, e2, i * 2, [b"p2-%d" % i, b"p2-%dx" % i]))
        if stop == "clean":
            await b.close()
        else:  # as after a SIGKILL: everything acknowledged is fsynced; no snapshot, no marker
            b.logs.abandon()

    async def after() -> None:
        (p1, e1), (p2, e2) = ids
        async with Broker(cfg) as b:
            assert b.logs.was_clean is (stop == "clean")
            r = await b.produce("t", 0, pbatch(p1, e1, 2, [b"p1-2"]))
            assert r.base_offset == 6  # answered from the state, not stored again
            with pytest.raises(OutOfOrderSequenceError):
                await b.produce("t", 0, pbatch(p2, e2, 7, [b"gap"]))
            await b.produce("t", 0, pbatch(p2, e2, 6, [b"p2-3"]))
            # Ids handed out before are not handed out again.
            p3, _ = await b.init_producer_id()
            assert p3 not in (p1, p2)
            assert len(await stored(b)) == 10

    asyncio.run(before())
    assert (tmp_path / "data" / "t-0" / SNAPSHOT_FILE).exists() is (stop == "clean")
    asyncio.run(after())


def test_a_snapshot_past_the_log_end_is_not_used(tmp_path: Path) -> None:
    cfg = config(tmp_path)

    async def write() -> int:
        async with Broker(cfg) as b:
            pid, epoch = await b.init_producer_id()
            for i in range(4):
                await b.produce("t", 0, pbatch(pid, epoch, i, [b"%d" % i]))
            return pid

    pid = asyncio.run(write())
    snap = tmp_path / "data" / "t-0" / SNAPSHOT_FILE
    offset, state = decode_snapshot(snap.read_bytes())
    assert offset == 4
    assert state.entries[pid].last_seq == 3
    # A snapshot that claims more than the log holds (the tail it saw was lost).
    snap.write_bytes(encode_snapshot(state, 400))

    async def check() -> None:
        async with Broker(cfg) as b:
            # Rebuilt from the log: sequence 4 is next, sequence 3 is a duplicate.
            r = await b.produce("t", 0, pbatch(pid, 0, 3, [b"3"]))
            assert r.base_offset == 3
            await b.produce("t", 0, pbatch(pid, 0, 4, [b"4"]))

    asyncio.run(check())
    # An unreadable snapshot is not used either.
    snap.write_bytes(b"\xc1garbage")

    async def check2() -> None:
        async with Broker(cfg) as b:
            with pytest.raises(OutOfOrderSequenceError):
                await b.produce("t", 0, pbatch(pid, 0, 9, [b"9"]))

    asyncio.run(check2())


def test_producer_ids_are_reserved_in_blocks(tmp_path: Path) -> None:
    cfg = config(tmp_path)
    seen: set[int] = set()

    async def run(n: int) -> None:
        b = Broker(cfg)
        await b.start()
        for _ in range(n):
            pid, _ = await b.init_producer_id()
            assert pid not in seen
            seen.add(pid)
        b.logs.abandon()  # crash: nothing is written at close

    asyncio.run(run(3))
    ids_file = tmp_path / "data" / PRODUCER_IDS_FILE
    assert json.loads(ids_file.read_text()) == {"next_block": ID_BLOCK, "epochs": {}}
    asyncio.run(run(ID_BLOCK + 1))  # starts at the next block and reserves two more
    assert min(seen - {0, 1, 2}) == ID_BLOCK
    asyncio.run(run(2))
    assert len(seen) == ID_BLOCK + 6


def test_expired_producers_are_forgotten() -> None:
    state = PartitionProducers()
    b = BatchBuilder(producer_id=7, producer_epoch=0, base_sequence=0)
    b.append(b"x", timestamp_ms=T0)
    h = parse_header(b.build())
    state.record(h, 0, now_ms=1_000)
    assert state.expire(older_than_ms=500) == 0
    assert state.expire(older_than_ms=1_001) == 1
    assert state.entries == {}
    # Forgotten: the producer's next batch may start anywhere.
    assert state.plan([h._replace(base_sequence=40)], {}) == [None]


@pytest.mark.parametrize("first", [True, False], ids=["new-producer", "known-producer"])
def test_a_refused_append_rolls_the_state_back(tmp_path: Path, first: bool) -> None:
    """A batch the log refused (backpressure) is not stored: the partition expects it
    again, so the producer's next batch cannot pass over it, and its retry is stored (not
    answered as a duplicate of data that was never stored)."""

    async def main() -> None:
        async with Broker(config(tmp_path)) as b:
            pid, epoch = await b.init_producer_id()
            seq = 0
            if not first:
                await b.produce("t", 0, pbatch(pid, epoch, 0, [b"a"]))
                seq = 1
            if first:
                b.create_topic("t")
            plog = b.log("t", 0)
            real = plog.append_many_async

            async def refusing(*args: object, **kwargs: object) -> object:
                raise BackpressureError("injected: too many appends wait")

            plog.append_many_async = refusing  # type: ignore[method-assign,assignment]
            with pytest.raises(BackpressureError, match="injected"):
                await b.produce("t", 0, pbatch(pid, epoch, seq, [b"b1", b"b2"]))
            plog.append_many_async = real  # type: ignore[method-assign]
            # The next pipelined batch may not pass over the refused one...
            with pytest.raises(OutOfOrderSequenceError):
                await b.produce("t", 0, pbatch(pid, epoch, seq + 2, [b"c"]))
            # ...and the refused one, sent again, is stored.
            r = await b.produce("t", 0, pbatch(pid, epoch, seq, [b"b1", b"b2"]))
            assert r.base_offset == seq
            await b.produce("t", 0, pbatch(pid, epoch, seq + 2, [b"c"]))
            assert await stored(b) == [b"a"] * (not first) + [b"b1", b"b2", b"c"]

    asyncio.run(main())


def test_failed_writes_roll_back_to_before_the_earliest() -> None:
    """Two requests fail together (a failed write undoes the writes queued after it); in
    whichever order their failures are handled, the state goes back to before the first."""
    state = PartitionProducers()

    def header(seq: int) -> BatchHeader:
        bb = BatchBuilder(producer_id=3, producer_epoch=0, base_sequence=seq)
        bb.append(b"x", timestamp_ms=T0)
        return parse_header(bb.build())

    state.record(header(0), 0, now_ms=1)
    a = state.record(header(1), 1, now_ms=1)
    b = state.record(header(2), 2, now_ms=1)
    state.forget(3, [a])  # handled first: b is still recorded after it
    assert state.entries[3].last_seq == 2
    state.forget(3, [b])
    assert state.entries[3].last_seq == 0
    assert [x.first_seq for x in state.entries[3].batches] == [0]
    assert state.plan([header(1)], {}) == [None]
    with pytest.raises(OutOfOrderSequenceError):
        state.plan([header(2)], {})


def test_a_snapshot_taken_during_an_append_replays_it(tmp_path: Path) -> None:
    """A snapshot taken while a batch awaits its fsync is stamped before that batch, so a
    start after a crash reads it from the log: sent again, it is a duplicate."""
    cfg = config(tmp_path, log=LogConfig(fsync=FsyncPolicy.ALWAYS))
    ids: list[int] = []

    async def before() -> None:
        b = Broker(cfg)
        await b.start()
        pid, epoch = await b.init_producer_id()
        ids.append(pid)
        await b.produce("t", 0, pbatch(pid, epoch, 0, [b"a"] * 5))
        task = asyncio.create_task(b.produce("t", 0, pbatch(pid, epoch, 5, [b"b"] * 5)))
        for _ in range(3):
            await asyncio.sleep(0)
        assert not task.done()  # waiting for its fsync
        b._write_snapshots(b._take_snapshots(only_changed=False))
        await task
        b.logs.abandon()  # crash: no snapshot at close, no marker

    asyncio.run(before())
    offset, _ = decode_snapshot((tmp_path / "data" / "t-0" / SNAPSHOT_FILE).read_bytes())
    assert offset == 5

    async def after() -> None:
        async with Broker(cfg) as b:
            r = await b.produce("t", 0, pbatch(ids[0], 0, 5, [b"b"] * 5))
            assert r.base_offset == 5  # the original, not stored again
            assert len(await stored(b)) == 10

    asyncio.run(after())


def test_a_deleted_topic_forgets_its_producers(tmp_path: Path) -> None:
    async def main() -> None:
        async with Broker(config(tmp_path, default_partitions=2)) as b:
            pid, epoch = await b.init_producer_id()
            await b.produce("t", 1, pbatch(pid, epoch, 0, [b"a"]))
            b.delete_topic("t")
            # A topic created again knows nothing of the old producers.
            await b.produce("t", 1, pbatch(pid, epoch, 5, [b"b"]))

    asyncio.run(main())
    assert SNAPSHOT_FILE in os.listdir(tmp_path / "data" / "t-1")


def test_an_epoch_bump_fences_the_old_instance_across_a_restart(tmp_path: Path) -> None:
    """The new instance has not written yet when the broker stops uncleanly: the bump is on
    disk all the same, and the old instance stays fenced."""
    cfg = config(tmp_path)
    got: list[tuple[int, int]] = []

    async def before() -> None:
        b = Broker(cfg)
        await b.start()
        pid, epoch = await b.init_producer_id()
        await b.produce("t", 0, pbatch(pid, epoch, 0, [b"old"]))
        got.append((pid, epoch))
        got.append(await b.init_producer_id(pid, epoch))  # the new instance: epoch + 1
        b.logs.abandon()  # crash before the new instance writes

    async def after() -> None:
        (pid, old), (_, new) = got
        async with Broker(cfg) as b:
            with pytest.raises(ProducerFencedError):
                await b.produce("t", 0, pbatch(pid, old, 1, [b"zombie"]))
            with pytest.raises(ProducerFencedError):
                await b.init_producer_id(pid, old)
            await b.produce("t", 0, pbatch(pid, new, 0, [b"new"]))
            assert await stored(b) == [b"old", b"new"]

    asyncio.run(before())
    asyncio.run(after())


def test_a_cancelled_wait_keeps_the_batch_remembered(tmp_path: Path) -> None:
    """A produce whose caller is cancelled while it waits for its fsync (a connection reset)
    was claimed and is written all the same; the producer's retry of that batch is answered
    with its offsets, not stored a second time."""

    async def main() -> None:
        async with Broker(config(tmp_path, log=LogConfig(fsync=FsyncPolicy.ALWAYS))) as b:
            b.create_topic("t")
            pid, epoch = await b.init_producer_id(-1, -1)
            x = pbatch(pid, epoch, 0, [b"x"])
            task = asyncio.create_task(b.produce("t", 0, x))
            await asyncio.sleep(0)
            await asyncio.sleep(0)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            retry = await b.produce("t", 0, x)
            assert (retry.base_offset, retry.last_offset) == (0, 0)
            assert [r.value for r in await read_all(b, "t", 0)] == [b"x"]

    asyncio.run(main())


def test_a_close_writes_only_the_snapshots_that_changed(tmp_path: Path) -> None:
    """A snapshot reaching the log's end is not written again at the next close: 10,000
    partitions stop without 10,000 files rewritten when nothing changed."""
    cfg = config(tmp_path)

    async def write(partitions: list[int]) -> None:
        async with Broker(cfg) as b:
            if not b.logs.logs:
                b.create_topic("t", 2)
            pid, epoch = await b.init_producer_id()
            for p in partitions:
                await b.produce("t", p, pbatch(pid, epoch, 0, [b"x"]))

    asyncio.run(write([0, 1]))
    snaps = [tmp_path / "data" / f"t-{p}" / SNAPSHOT_FILE for p in (0, 1)]
    first = [s.stat().st_ino for s in snaps]
    asyncio.run(write([]))  # open and close, nothing written: both snapshots kept as they are
    assert [s.stat().st_ino for s in snaps] == first
    asyncio.run(write([1]))  # t-1 changed: written again (a new file renamed over it)
    after = [s.stat().st_ino for s in snaps]
    assert after[0] == first[0]
    assert after[1] != first[1]
    offset, state = decode_snapshot(snaps[1].read_bytes())
    assert offset == 2
    assert len(state.entries) == 2
    # An unreadable snapshot is written again at the next close, though nothing changed.
    snaps[0].write_bytes(b"\xc1garbage")
    asyncio.run(write([]))
    offset, state = decode_snapshot(snaps[0].read_bytes())
    assert offset == 1
    assert len(state.entries) == 1


def test_a_snapshot_that_could_not_be_written_is_written_at_the_close(tmp_path: Path) -> None:
    cfg = config(tmp_path)
    snap = tmp_path / "data" / "t-0" / SNAPSHOT_FILE

    async def run() -> None:
        async with Broker(cfg) as b:
            b.create_topic("t", 1)
            pid, epoch = await b.init_producer_id()
            await b.produce("t", 0, pbatch(pid, epoch, 0, [b"x"]))
            taken = b._take_snapshots(only_changed=True)
            assert [p for p, _ in taken] == [str(snap)]
            b._snapshots_failed([p for p, _ in taken])  # as after a failed periodic write
            assert not snap.exists()

    asyncio.run(run())
    offset, state = decode_snapshot(snap.read_bytes())
    assert offset == 1
    assert len(state.entries) == 1
