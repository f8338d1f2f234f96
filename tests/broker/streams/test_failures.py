"""Stream manager behaviour on failures, cancellations and edge settings: failed writes,
cancelled receives and sends, wake-ups of receivers waiting on many streams, the timer
wheel's references, a failing reclaim."""

from __future__ import annotations

import asyncio
import gc
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.broker._support import PROMPT_S
from tests.broker.streams._support import FakeClock, streams_broker
from tidewire.broker.streams.manager import STREAMS_TOPIC
from tidewire.broker.streams.model import FROM_END, SendItem, StreamMessage, partition_of
from tidewire.errors import ShuttingDownError, StorageError
from tidewire.storage import FsyncPolicy, LogConfig, PartitionLog


def values(msgs: list[StreamMessage]) -> list[bytes]:
    return [m.value for m in msgs]


def fail_next_append(plog: PartitionLog) -> None:
    """Make the next append of ``plog`` fail as a full disk would (later ones work)."""
    real: Callable[..., Any] = plog.append
    state = {"failed": False}

    def append(batch: bytes) -> Any:
        if not state["failed"]:
            state["failed"] = True
            raise StorageError("disk full (simulated)")
        return real(batch)

    plog.append = append  # type: ignore[method-assign]


def test_a_receive_cancelled_after_its_take_is_recorded_has_taken_it(tmp_path: Path) -> None:
    async def main() -> None:
        async with streams_broker(tmp_path, stream_partitions=1) as (_, st):
            await st.send([SendItem("w", b"a", persistent=True), SendItem("w", b"b")])
            await st.send([SendItem("w", b"c", persistent=True)])
            t = asyncio.create_task(st.receive(["w"], max_messages=2))
            await asyncio.sleep(0)  # it took a and b, its take record is queued
            t.cancel()
            with pytest.raises(asyncio.CancelledError):
                await t
            # the in-memory message goes back; the persistent one is taken
            assert st.describe("w").waiting == 2  # type: ignore[union-attr]
            assert values(await st.receive(["w"])) == [b"b"]
            # two receivers in one turn, the first cancelled: the second keeps its own
            await st.send(
                [SendItem("v", b"d", persistent=True), SendItem("v", b"e", persistent=True)]
            )
            t1 = asyncio.create_task(st.receive(["v"]))
            t2 = asyncio.create_task(st.receive(["v"]))
            await asyncio.sleep(0)
            t1.cancel()
            with pytest.raises(asyncio.CancelledError):
                await t1
            assert values(await t2) == [b"e"]
            assert values(await st.receive(["v"])) == []
        async with streams_broker(tmp_path, stream_partitions=1) as (_, st):
            # memory and log agree: nothing persistent waits after the restart either
            assert values(await st.receive(["w", "v"], max_messages=10)) == [b"c"]

    asyncio.run(main())


def test_a_failed_take_record_of_any_partition_fails_the_receive(tmp_path: Path) -> None:
    async def main() -> None:
        a = next(f"a{i}" for i in range(100) if partition_of(f"a{i}", 2) == 0)
        b = next(f"b{i}" for i in range(100) if partition_of(f"b{i}", 2) == 1)
        for failing in (a, b):
            d = tmp_path / failing
            async with streams_broker(d, stream_partitions=2) as (broker, st):
                await st.send(
                    [SendItem(a, b"A", persistent=True), SendItem(b, b"B", persistent=True)]
                )
                p = partition_of(failing, 2)
                fail_next_append(broker.logs.logs[(STREAMS_TOPIC, p)])
                with pytest.raises(StorageError):
                    await st.receive([a, b], max_messages=2)
                # the message whose take was not recorded waits again; the other is taken
                again = values(await st.receive([a, b], max_messages=2))
            async with streams_broker(d, stream_partitions=2) as (_, st):
                after = values(await st.receive([a, b], max_messages=2))
            assert again == [b"A" if failing == a else b"B"]
            assert after == []  # never received twice

    asyncio.run(main())


def test_a_failed_append_remembers_no_uuid_and_answers_its_items(tmp_path: Path) -> None:
    async def main() -> None:
        p0 = next(f"x{i}" for i in range(100) if partition_of(f"x{i}", 2) == 0)
        p1 = next(f"y{i}" for i in range(100) if partition_of(f"y{i}", 2) == 1)
        async with streams_broker(tmp_path, stream_partitions=2) as (broker, st):
            await st.send(
                [SendItem(p0, b"0", persistent=True), SendItem(p1, b"1", persistent=True)]
            )
            before = st.stats()
            # nothing stored at all: the request fails; a retry with the uuid is stored
            fail_next_append(broker.logs.logs[(STREAMS_TOPIC, 0)])
            with pytest.raises(StorageError):
                await st.send([SendItem(p0, b"m", uuid="u1", persistent=True)])
            res = await st.send([SendItem(p0, b"m", uuid="u1", persistent=True)])
            assert res[0].code == 0
            # one partition fails, the other and the in-memory item are stored: one result
            # each, the failed one with its error, its uuid free for the retry
            fail_next_append(broker.logs.logs[(STREAMS_TOPIC, 0)])
            res = await st.send(
                [
                    SendItem(p0, b"lost", uuid="u2", persistent=True),
                    SendItem(p1, b"kept", uuid="u3", persistent=True),
                    SendItem(p0, b"mem", uuid="u4"),
                ]
            )
            assert [r.code for r in res] == [StorageError.code, 0, 0]
            assert "disk full" in res[0].message
            retry = await st.send(
                [SendItem(p0, b"again", uuid="u2", persistent=True), SendItem(p1, b"k", uuid="u3")]
            )
            assert [r.code for r in retry] == [0, -1]
            stats = st.stats()
            assert stats.sent_persistent - before.sent_persistent == 3
            assert stats.persistent_messages == 5
            got = values(await st.receive([p0, p1], max_messages=10))
            assert sorted(got) == sorted([b"0", b"1", b"m", b"kept", b"mem", b"again"])

    asyncio.run(main())


def test_a_failed_send_pushes_no_waiting_message_out(tmp_path: Path) -> None:
    async def main() -> None:
        async with streams_broker(tmp_path, stream_partitions=1) as (broker, st):
            await st.send([SendItem("q", b"m1", persistent=True)], ring_size=1)
            await st.send([SendItem("z0", b"o", persistent=True)], ring_size=0)
            fail_next_append(broker.logs.logs[(STREAMS_TOPIC, 0)])
            with pytest.raises(StorageError):
                await st.send([SendItem("q", b"m2", persistent=True)])
            fail_next_append(broker.logs.logs[(STREAMS_TOPIC, 0)])
            with pytest.raises(StorageError):  # ring 0, nobody waits: its take not recorded
                await st.send([SendItem("z", b"lost", persistent=True)], ring_size=0)
            assert st.stats().dropped == 1  # z0's only
            assert values(await st.receive(["q"], max_messages=10)) == [b"m1"]
            r = asyncio.create_task(st.receive(["z"], wait_ms=30_000))
            await asyncio.sleep(0)
            await st.send([SendItem("z", b"next", persistent=True)])
            assert values(await asyncio.wait_for(r, PROMPT_S)) == [b"next"]

    asyncio.run(main())


def test_a_receiver_of_many_streams_passes_on_a_wake_it_does_not_use(tmp_path: Path) -> None:
    async def main() -> None:
        async with streams_broker(tmp_path) as (_, st):
            for attempt in range(4):  # the first stream taken from rotates
                a, b = f"A{attempt}", f"B{attempt}"
                w1 = asyncio.create_task(st.receive([a, b], wait_ms=30_000))
                await asyncio.sleep(0)
                w2 = asyncio.create_task(st.receive([b], wait_ms=30_000))
                await asyncio.sleep(0)
                await st.send([SendItem(b, b"b"), SendItem(a, b"a")])
                r1, r2 = await asyncio.wait_for(asyncio.gather(w1, w2), PROMPT_S)
                assert sorted(values(r1) + values(r2)) == [b"a", b"b"]

    asyncio.run(main())


def test_under_fsync_always_readers_wake_when_the_sender_is_cancelled(tmp_path: Path) -> None:
    async def main() -> None:
        cfg = LogConfig(fsync=FsyncPolicy.ALWAYS)
        async with streams_broker(tmp_path, log=cfg) as (_, st):
            await st.send([SendItem("r", b"0", persistent=True)])
            reader = asyncio.create_task(st.read({"r": FROM_END}, wait_ms=30_000))
            await asyncio.sleep(0)
            sender = asyncio.create_task(st.send([SendItem("r", b"1", persistent=True)]))
            await asyncio.sleep(0)  # stored, now waiting for its fsync
            sender.cancel()
            msgs, _ = await asyncio.wait_for(reader, PROMPT_S)
            assert values(msgs) == [b"1"]

    asyncio.run(main())


def test_evicted_streams_are_referenced_by_nothing(tmp_path: Path) -> None:
    async def main() -> None:
        clock = FakeClock()
        async with streams_broker(tmp_path, clock) as (_, st):
            n = 2_000
            await st.send([SendItem(f"s{i}", b"x") for i in range(n)])
            objs = [st._streams[f"s{i}"] for i in range(0, n, 10)]
            for i in range(n):  # taken: empty, rescheduled from expiry to idle end
                await st.receive([f"s{i}"])
            clock.advance(120_000)
            st.tick()
            gc.collect()
            assert st.stats().streams == 0
            # (msgspec structs take no weak reference: count the references instead)
            held = [i for i in range(len(objs)) if sys.getrefcount(objs[i]) > 2]  # list + arg
            assert held == []
            assert st._wheel == {}

    asyncio.run(main())


def test_idle_zero_evicts_at_the_next_tick(tmp_path: Path) -> None:
    async def main() -> None:
        clock = FakeClock()
        async with streams_broker(tmp_path, clock, stream_idle_ms=0) as (_, st):
            st.tick()
            await st.receive(["x"])  # created after this second's tick
            clock.advance(1_000)
            st.tick()
            assert st.stats().streams == 0

    asyncio.run(main())


def test_dedup_window_zero_stores_every_message(tmp_path: Path) -> None:
    async def main() -> None:
        async with streams_broker(tmp_path, stream_dedup_window=0) as (_, st):
            r = await st.send([SendItem("d", b"1", uuid="u"), SendItem("d", b"2", uuid="u")])
            assert [x.code for x in r] == [0, 0]
            r = await st.send([SendItem("d", b"3", uuid="u", persistent=True)])
            assert r[0].code == 0
        async with streams_broker(tmp_path, stream_dedup_window=0) as (_, st):
            r = await st.send([SendItem("d", b"4", uuid="u", persistent=True)])
            assert r[0].code == 0

    asyncio.run(main())


def test_a_failing_reclaim_keeps_the_timers_running(tmp_path: Path) -> None:
    async def main() -> None:
        async with streams_broker(tmp_path, stream_partitions=1, stream_segment_bytes=1024) as (
            broker,
            st,
        ):
            for _ in range(6):
                await st.send([SendItem("e", b"x" * 600, ttl_ms=200, persistent=True)])
            plog = broker.logs.logs[(STREAMS_TOPIC, 0)]
            calls = 0

            def failing(offset: int) -> list[int]:
                nonlocal calls
                calls += 1
                raise StorageError("could not delete (simulated EIO)")

            plog.delete_before = failing  # type: ignore[method-assign]
            await st.send([SendItem("idle", b"v", ttl_ms=200)])
            for _ in range(200):  # the real clock: the timer task ticks every 0.25 s
                if calls >= 2 and st.stats().in_memory_messages == 0:
                    break
                await asyncio.sleep(0.05)
            assert calls >= 2  # tried again at a later tick
            assert st.stats().in_memory_messages == 0  # expiry goes on
            task = broker._stream_task
            assert task is not None
            assert not task.done()
        # close() went through (the context manager left without an error)

    asyncio.run(main())


def test_close_goes_on_after_a_background_task_died(tmp_path: Path) -> None:
    async def main() -> None:
        async with streams_broker(tmp_path) as (broker, st):
            await st.send([SendItem("c", b"v", persistent=True)])

            async def dying() -> None:
                raise RuntimeError("dead (simulated)")

            task = broker._stream_task
            assert task is not None
            task.cancel()
            broker._stream_task = asyncio.get_running_loop().create_task(dying())
            await asyncio.sleep(0)
            assert broker._stream_task.done()
            plog = broker.logs.logs[(STREAMS_TOPIC, partition_of("c", st.partitions))]
        assert plog.closed  # the rest of the shutdown ran

    asyncio.run(main())


def test_a_ring_size_survives_a_restart(tmp_path: Path) -> None:
    async def main() -> None:
        clock = FakeClock()
        async with streams_broker(tmp_path, clock) as (_, st):
            await st.send([SendItem("r", b"1", persistent=True)], ring_size=2)
            await st.send([SendItem("r", b"2", persistent=True)])  # fixed already: still 2
            await st.send([SendItem("z", b"z", persistent=True)], ring_size=0)
            # a stream forgotten (expired, evicted) and created again has its new ring
            await st.send([SendItem("e", b"old", ttl_ms=1_000, persistent=True)], ring_size=5)
            clock.advance(120_000)
            st.tick()
            assert st.describe("e") is None
            await st.send([SendItem("e", b"new", persistent=True)])
        async with streams_broker(tmp_path, clock) as (_, st):
            rings = {sid: st.describe(sid).ring_size for sid in "rze"}  # type: ignore[union-attr]
            assert rings == {"r": 2, "z": 0, "e": st.default_ring}

    asyncio.run(main())


def test_a_receiver_of_many_streams_gives_room_for_one_message(tmp_path: Path) -> None:
    async def main() -> None:
        async with streams_broker(tmp_path) as (_, st):
            ids = ["m0", "m1", "m2"]
            w = asyncio.create_task(st.receive(ids, wait_ms=30_000, ring_size=0))
            await asyncio.sleep(0)
            # ring 0: one receiver, one waiting message; the others are out at once
            await st.send([SendItem(sid, sid.encode()) for sid in ids], ring_size=0)
            assert st.stats().dropped == 2
            assert values(await asyncio.wait_for(w, PROMPT_S)) == [b"m0"]
            assert [st.describe(sid).waiting for sid in ids] == [0, 0, 0]  # type: ignore[union-attr]
            # a receiver of one stream still hands over, the newest message kept
            w2 = asyncio.create_task(st.receive(["m0"], wait_ms=30_000))
            await asyncio.sleep(0)
            await st.send([SendItem("m0", b"a"), SendItem("m0", b"b")])
            assert values(await asyncio.wait_for(w2, PROMPT_S)) == [b"b"]

    asyncio.run(main())


def test_a_drain_ends_a_blocked_send_with_a_retriable_error(tmp_path: Path) -> None:
    async def main() -> None:
        async with streams_broker(tmp_path) as (_, st):
            await st.send([SendItem("full", b"1")], ring_size=1)
            blocked = asyncio.create_task(
                st.send([SendItem("free", b"ok"), SendItem("full", b"2")], block_ms=30_000)
            )
            await asyncio.sleep(0)
            assert not blocked.done()
            st.release_waiters()
            res = await asyncio.wait_for(blocked, PROMPT_S)
            assert res[0].code == 0
            assert res[1].code == ShuttingDownError.code
            assert "shutting down" in res[1].message
            assert "block_ms=30,000" in res[1].message
            assert st.stats().blocked_sends_timed_out == 0
            assert st.describe("full").waiting == 1  # type: ignore[union-attr]

    asyncio.run(main())


def test_new_streams_moved_to_an_earlier_second_are_evicted_and_let_go(tmp_path: Path) -> None:
    # Streams created with one persistent message wait in their send's list of the wheel;
    # one given a message that expires sooner moves out to that earlier second, runs there,
    # and is forgotten when empty and idle: the list it still sits in must not run it again
    # nor keep it.
    async def main() -> None:
        clock = FakeClock()
        async with streams_broker(tmp_path, clock, stream_idle_ms=1_000) as (_, st):
            n = 500
            res = await st.send(
                [SendItem(f"s{i}", b"x", ttl_ms=60_000, persistent=True) for i in range(n)]
            )
            assert all(r.code == 0 for r in res)
            objs = [st._streams[f"s{i}"] for i in range(n)]
            in_lists = sum(len(g) for gs in st._cohorts.values() for g in gs)
            assert in_lists >= n - st.partitions  # all but each partition's first
            await st.send(
                [SendItem(f"s{i}", b"y", ttl_ms=2_000, persistent=True) for i in range(n)]
            )
            clock.advance(2_000)
            st.tick()
            assert st.stats().expired == n
            assert st.stats().streams == n
            clock.advance(58_000)
            st.tick()
            assert st.stats().expired == 2 * n
            clock.advance(2_000)
            st.tick()
            gc.collect()
            assert st.stats().streams == 0
            assert st.stats().evicted == n
            held = [i for i in range(n) if sys.getrefcount(objs[i]) > 2]  # list + arg
            assert held == []
            assert st._wheel == {}
            assert st._cohorts == {}

    asyncio.run(main())
