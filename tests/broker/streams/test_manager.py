"""The stream manager: send and receive in both modes, reads by token, dedup, rings and
blocking sends, restarts, TTL expiry and reclaim on a fake clock, idle eviction, limits."""

from __future__ import annotations

import asyncio
import random
import zlib
from pathlib import Path

import pytest

from tests.broker._support import PROMPT_S, T0
from tests.broker.streams._support import FakeClock, streams_broker
from tidewire.broker.streams import manager
from tidewire.broker.streams.manager import STREAMS_TOPIC
from tidewire.broker.streams.model import (
    FROM_END,
    FROM_START,
    SendItem,
    StreamMessage,
    decode_token,
    encode_token,
    encode_tokens,
    partition_of,
    split_position,
)
from tidewire.errors import (
    BackpressureError,
    BatchTooLargeError,
    InvalidStreamError,
    PartitionCorruptError,
    ShuttingDownError,
    StorageError,
    StreamFullError,
    TooManyStreamsError,
)
from tidewire.storage import FsyncPolicy, LogConfig

DAY = 86_400_000


def values(msgs: list[StreamMessage]) -> list[bytes]:
    return [m.value for m in msgs]


async def until(cond: object, what: str) -> None:
    """Yield to the loop until ``cond()`` holds (bounded)."""
    assert callable(cond)
    for _ in range(10_000):
        if cond():
            return
        await asyncio.sleep(0)
    raise AssertionError(f"never happened: {what}")


def test_send_and_receive_both_modes_in_send_order(tmp_path: Path) -> None:
    async def main() -> None:
        async with streams_broker(tmp_path) as (_, st):
            res = await st.send(
                [
                    SendItem("s", b"p1", persistent=True),
                    SendItem("s", b"m1"),
                    SendItem("s", b"p2", persistent=True),
                    SendItem("s", b"m2"),
                    SendItem("s", b"m3"),
                    SendItem("s", b"p3", persistent=True),
                ]
            )
            assert [r.code for r in res] == [0] * 6
            assert res[0].token
            assert not res[1].token
            assert decode_token("s", res[0].token) < decode_token("s", res[2].token)
            info = st.describe("s")
            assert info is not None
            assert (info.waiting, info.persistent, info.in_memory) == (6, 3, 3)
            got = await st.receive(["s"], max_messages=4)
            assert values(got) == [b"p1", b"m1", b"p2", b"m2"]
            assert got[0].token == encode_token("s", decode_token("s", res[0].token) + 1)
            assert got[1].token == ""
            got = await st.receive(["s"], max_messages=10)
            assert values(got) == [b"m3", b"p3"]
            assert await st.receive(["s"]) == []
            info = st.describe("s")
            assert info is not None
            assert (info.waiting, info.persistent, info.in_memory) == (0, 3, 0)
            stats = st.stats()
            assert (stats.sent_persistent, stats.sent_in_memory, stats.received) == (3, 3, 6)

    asyncio.run(main())


def test_each_message_is_taken_once_by_concurrent_receivers(tmp_path: Path) -> None:
    async def main() -> None:
        async with streams_broker(tmp_path) as (_, st):
            got: list[bytes] = []

            async def receiver() -> None:
                while True:
                    msgs = await st.receive(["q"], max_messages=3, wait_ms=2_000)
                    if not msgs:
                        return
                    got.extend(values(msgs))

            tasks = [asyncio.create_task(receiver()) for _ in range(8)]
            sent = []
            for i in range(60):
                v = f"v{i}".encode()
                sent.append(v)
                await st.send([SendItem("q", v, persistent=i % 2 == 0)])
                if i % 7 == 0:
                    await asyncio.sleep(0)
            await until(lambda: len(got) >= len(sent), "every message received")
            st.release_waiters()
            await asyncio.wait_for(asyncio.gather(*tasks), PROMPT_S)
            assert sorted(got) == sorted(sent)  # each exactly once

    asyncio.run(main())


def test_a_receive_on_many_streams_returns_when_any_has_a_message(tmp_path: Path) -> None:
    async def main() -> None:
        async with streams_broker(tmp_path) as (_, st):
            ids = [f"many-{i}" for i in range(500)]
            t = asyncio.create_task(st.receive(ids, max_messages=10, wait_ms=30_000))
            await until(lambda: st.stats().receivers == 1, "the receive waits")
            await st.send([SendItem("many-321", b"x", persistent=True)])
            got = await asyncio.wait_for(t, PROMPT_S)
            assert [(m.stream, m.value) for m in got] == [("many-321", b"x")]
            await st.send([SendItem(f"many-{i}", b"%d" % i) for i in range(0, 500, 50)])
            got = await st.receive(ids, max_messages=100)
            assert sorted(m.stream for m in got) == sorted(f"many-{i}" for i in range(0, 500, 50))
            with pytest.raises(InvalidStreamError, match="'many-1' is named twice"):
                await st.receive(["many-1", "many-2", "many-1"])

    asyncio.run(main())


def test_a_receive_cancelled_before_it_took_anything_takes_nothing(tmp_path: Path) -> None:
    async def main() -> None:
        async with streams_broker(tmp_path) as (_, st):
            first = asyncio.create_task(st.receive(["c"], wait_ms=30_000))
            second = asyncio.create_task(st.receive(["c"], wait_ms=30_000))
            await until(lambda: st.stats().receivers == 2, "both wait")
            await st.send([SendItem("c", b"one", persistent=True)])
            first.cancel()  # woken for the message, gone before it took it
            with pytest.raises(asyncio.CancelledError):
                await first
            got = await asyncio.wait_for(second, PROMPT_S)
            assert values(got) == [b"one"]
            # cancelled once its take record is queued: the persistent message is taken
            # (the record says so, also after a restart), the in-memory one goes back
            await st.send([SendItem("c", b"two", persistent=True), SendItem("c", b"three")])
            third = asyncio.create_task(st.receive(["c"], max_messages=5))
            await asyncio.sleep(0)
            third.cancel()
            with pytest.raises(asyncio.CancelledError):
                await third
            assert values(await st.receive(["c"], max_messages=5)) == [b"three"]

    asyncio.run(main())


def test_read_by_token_from_start_from_end_and_resumed(tmp_path: Path) -> None:
    async def main() -> None:
        async with streams_broker(tmp_path) as (_, st):
            await st.send([SendItem("r", b"a", persistent=True), SendItem("r", b"mem")])
            await st.send([SendItem("r", b"b", persistent=True)])
            assert values(await st.receive(["r"])) == [b"a"]  # taken: still readable
            msgs, tokens = await st.read({"r": FROM_START})
            assert values(msgs) == [b"a", b"b"]  # in-memory ones are not readable
            assert tokens["r"] == msgs[-1].token
            msgs2, _tokens2 = await st.read({"r": msgs[0].token})
            assert values(msgs2) == [b"b"]
            # nothing new: the same token back, after the wait
            empty, same = await st.read({"r": tokens["r"]}, wait_ms=1)
            assert empty == []
            assert same == tokens
            # FROM_END: only what is sent after the read began
            end_read = asyncio.create_task(st.read({"r": FROM_END}, wait_ms=30_000))
            await until(lambda: st.stats().receivers == 1, "the read waits")
            await st.send([SendItem("r", b"c", persistent=True)])
            msgs3, tokens3 = await asyncio.wait_for(end_read, PROMPT_S)
            assert values(msgs3) == [b"c"]
            assert values((await st.read({"r": tokens["r"]}))[0]) == [b"c"]
            # FROM_END with nothing new gives a token that then reads the next message
            none, at_end = await st.read({"r": FROM_END, "other": FROM_END})
            assert none == []
            assert set(at_end) == {"r", "other"}
            await st.send([SendItem("r", b"d", persistent=True)])
            assert values((await st.read(at_end))[0]) == [b"d"]
            assert tokens3["r"] != tokens["r"]

    asyncio.run(main())


def test_bad_tokens_are_refused_clearly(tmp_path: Path) -> None:
    async def main() -> None:
        async with streams_broker(tmp_path) as (_, st):
            res = await st.send([SendItem("mine", b"x", persistent=True)])
            with pytest.raises(InvalidStreamError, match="belongs to another stream"):
                await st.read({"yours": res[0].token})
            with pytest.raises(InvalidStreamError, match="is not a resume token"):
                await st.read({"mine": "garbage!"})
            with pytest.raises(InvalidStreamError, match="wait_ms=400,000 must be within"):
                await st.read({"mine": FROM_START}, wait_ms=400_000)

    asyncio.run(main())


def test_a_uuid_is_stored_once_within_the_window(tmp_path: Path) -> None:
    async def main() -> None:
        async with streams_broker(tmp_path, stream_dedup_window=3) as (_, st):
            res = await st.send(
                [
                    SendItem("d", b"1", uuid="u1", persistent=True),
                    SendItem("d", b"1 again", uuid="u1", persistent=True),
                    SendItem("d", b"2", uuid="u2"),
                    SendItem("e", b"other stream", uuid="u1"),
                ]
            )
            assert [r.code for r in res] == [0, -1, 0, 0]
            assert res[1].message == "duplicate"
            again = await st.send([SendItem("d", b"2 again", uuid="u2")])
            assert again[0].code == -1
            # beyond the window of 3 uuids the oldest is forgotten
            await st.send([SendItem("d", b"%d" % i, uuid=f"w{i}") for i in range(3)])
            assert (await st.send([SendItem("d", b"1 late", uuid="u1")]))[0].code == 0
            assert st.stats().duplicates == 2
            got = await st.receive(["d"], max_messages=100)
            assert values(got) == [b"1", b"2", b"0", b"1", b"2", b"1 late"]
            assert got[0].uuid == "u1"

    asyncio.run(main())


def test_a_full_ring_drops_the_oldest(tmp_path: Path) -> None:
    async def main() -> None:
        async with streams_broker(tmp_path) as (_, st):
            res = await st.send(
                [SendItem("ring", b"%d" % i, persistent=i == 0) for i in range(5)], ring_size=3
            )
            assert all(r.code == 0 for r in res)
            assert st.stats().dropped == 2
            assert values(await st.receive(["ring"], max_messages=10)) == [b"2", b"3", b"4"]
            # the dropped persistent message is still readable by token
            assert values((await st.read({"ring": FROM_START}))[0]) == [b"0"]
            info = st.describe("ring")
            assert info is not None
            assert info.ring_size == 3

    asyncio.run(main())


def test_a_blocking_send_waits_for_room_then_gives_up(tmp_path: Path) -> None:
    async def main() -> None:
        async with streams_broker(tmp_path) as (_, st):
            await st.send([SendItem("b", b"1"), SendItem("b", b"2")], ring_size=2)
            blocked = asyncio.create_task(st.send([SendItem("b", b"3")], block_ms=30_000))
            await asyncio.sleep(0.01)
            assert not blocked.done()
            assert values(await st.receive(["b"])) == [b"1"]  # makes room
            res = await asyncio.wait_for(blocked, PROMPT_S)
            assert res[0].code == 0
            full = await st.send([SendItem("b", b"4")], block_ms=20)
            assert full[0].code == StreamFullError.code
            assert "ring_size=2" in full[0].message
            assert "block_ms=20" in full[0].message
            assert values(await st.receive(["b"], max_messages=9)) == [b"2", b"3"]
            assert st.stats().blocked_sends_timed_out == 1

    asyncio.run(main())


def test_ring_size_zero_hands_over_to_a_waiting_receiver(tmp_path: Path) -> None:
    async def main() -> None:
        async with streams_broker(tmp_path) as (_, st):
            nobody = await st.send([SendItem("h", b"lost")], ring_size=0, block_ms=20)
            assert nobody[0].code == StreamFullError.code  # nobody took it: not stored
            send = asyncio.create_task(st.send([SendItem("h", b"hand")], block_ms=30_000))
            await asyncio.sleep(0.01)
            assert not send.done()  # waits for a receiver
            got = await asyncio.wait_for(st.receive(["h"], wait_ms=30_000), PROMPT_S)
            assert values(got) == [b"hand"]
            assert (await asyncio.wait_for(send, PROMPT_S))[0].code == 0
            # without block_ms the message cannot wait: dropped (a persistent one stays
            # readable by token)
            res = await st.send([SendItem("h", b"p", persistent=True), SendItem("h", b"m")])
            assert [r.code for r in res] == [0, 0]
            assert await st.receive(["h"]) == []
            assert values((await st.read({"h": FROM_START}))[0]) == [b"p"]

    asyncio.run(main())


def test_a_restart_keeps_persistent_messages_takes_and_tokens(tmp_path: Path) -> None:
    async def main() -> None:
        async with streams_broker(tmp_path) as (_, st):
            await st.send(
                [SendItem("k", b"%d" % i, uuid=f"u{i}", persistent=True) for i in range(5)]
                + [SendItem("k", b"memory only")]
            )
            assert values(await st.receive(["k"], max_messages=2)) == [b"0", b"1"]
            msgs, tokens = await st.read({"k": FROM_START}, max_messages=3)
            assert values(msgs) == [b"0", b"1", b"2"]
        async with streams_broker(tmp_path) as (_, st):
            # the takes held: never received twice; in-memory messages are gone
            assert values(await st.receive(["k"], max_messages=10)) == [b"2", b"3", b"4"]
            # the token from before the restart misses and repeats nothing
            assert values((await st.read(tokens))[0]) == [b"3", b"4"]
            # the dedup window came back from the log
            assert (await st.send([SendItem("k", b"x", uuid="u3", persistent=True)]))[0].code == -1
            await st.send([SendItem("k", b"5", persistent=True)])
        async with streams_broker(tmp_path) as (_, st):
            assert values(await st.receive(["k"], max_messages=10)) == [b"5"]
            assert len((await st.read({"k": FROM_START}))[0]) == 6

    asyncio.run(main())


def test_mixed_ttls_expire_exactly_and_are_never_delivered(tmp_path: Path) -> None:
    async def main() -> None:
        clock = FakeClock()
        async with streams_broker(tmp_path, clock) as (_, st):
            await st.send(
                [
                    SendItem("t", b"short-p", ttl_ms=1_000, persistent=True),
                    SendItem("t", b"long-p", ttl_ms=10_000, persistent=True),
                    SendItem("t", b"short-m", ttl_ms=1_500),
                    SendItem("t", b"default-p", persistent=True),
                    SendItem("t", b"mid-m", ttl_ms=5_000),
                ]
            )
            clock.advance(1_000)  # short-p expires exactly now; no tick has run yet
            assert values((await st.read({"t": FROM_START}))[0]) == [b"long-p", b"default-p"]
            got = await st.receive(["t"])
            assert values(got) == [b"long-p"]
            assert got[0].expires_at_ms == T0 + 10_000
            clock.advance(500)  # short-m now
            assert values(await st.receive(["t"], max_messages=10)) == [b"default-p", b"mid-m"]
            st.tick()
            stats = st.stats()
            assert stats.expired == 2
            clock.advance(10_000)
            st.tick()
            assert values((await st.read({"t": FROM_START}))[0]) == [b"default-p"]
            info = st.describe("t")
            assert info is not None
            assert info.persistent == 1
            clock.advance(DAY)
            st.tick()
            assert (await st.read({"t": FROM_START}))[0] == []
            assert st.stats().expired == 4  # 3 persistent (taken or not) and short-m

    asyncio.run(main())


def test_expired_segments_are_reclaimed_whole(tmp_path: Path) -> None:
    async def main() -> None:
        clock = FakeClock()
        async with streams_broker(
            tmp_path, clock, stream_partitions=1, stream_segment_bytes=4096
        ) as (broker, st):
            value = b"v" * 200
            for i in range(60):
                await st.send([SendItem(f"x{i}", value, ttl_ms=60_000, persistent=True)])
            keep = await st.send([SendItem("keeper", b"k", ttl_ms=DAY, persistent=True)])
            plog = broker.logs.logs[(STREAMS_TOPIC, 0)]
            before = (plog.log_start_offset, plog.size_bytes, plog.segment_count)
            assert before[2] > 3
            clock.advance(59_999)
            st.tick()
            assert plog.log_start_offset == 0  # nothing expired yet
            clock.advance(1)
            st.tick()
            after = (plog.log_start_offset, plog.size_bytes, plog.segment_count)
            assert after[0] > before[0]
            assert after[1] < before[1]
            assert after[2] < before[2]
            assert st.stats().log_bytes == plog.size_bytes
            assert st.describe("x3") is None  # expired and idle: forgotten
            msgs, _ = await st.read({"keeper": FROM_START})
            assert values(msgs) == [b"k"]
            assert msgs[0].token != keep[0].token

    asyncio.run(main())


def test_idle_empty_streams_are_evicted_but_not_while_waited_on(tmp_path: Path) -> None:
    async def main() -> None:
        clock = FakeClock()
        async with streams_broker(tmp_path, clock, stream_idle_ms=10_000) as (_, st):
            await st.send([SendItem(f"e{i}", b"x") for i in range(100)])
            await st.receive([f"e{i}" for i in range(100)], max_messages=100)
            waiting = asyncio.create_task(st.receive(["watched"], wait_ms=30_000))
            await until(lambda: st.stats().receivers == 1, "the receive waits")
            clock.advance(9_000)
            st.tick()
            assert st.stats().streams == 101
            clock.advance(2_000)
            st.tick()
            assert st.stats().streams == 1  # only the one waited on
            assert st.stats().evicted == 100
            assert st.describe("e1") is None
            clock.advance(60_000)
            st.tick()
            assert st.describe("watched") is not None
            st.release_waiters()
            assert await asyncio.wait_for(waiting, PROMPT_S) == []
            clock.advance(11_000)
            st.tick()
            assert st.stats().streams == 0

    asyncio.run(main())


def test_limits_are_refused_with_clear_errors(tmp_path: Path) -> None:
    async def main() -> None:
        async with streams_broker(
            tmp_path,
            stream_max_count=2,
            stream_max_receivers=1,
            stream_max_message_bytes=100,
            stream_max_ttl_ms=60_000,
            stream_default_ttl_ms=1_000,
        ) as (_, st):
            res = await st.send(
                [
                    SendItem("a", b"ok"),
                    SendItem("b", b"x" * 101),
                    SendItem("c", b"x", ttl_ms=60_001),
                    SendItem("", b"x"),
                    SendItem("d", b"x"),
                    SendItem("e", b"x"),
                ]
            )
            assert res[0].code == 0
            assert res[1].code == BatchTooLargeError.code
            assert "101 bytes exceeds stream_max_message_bytes=100" in res[1].message
            assert res[2].code == InvalidStreamError.code
            assert "ttl_ms=60,001" in res[2].message
            assert res[3].code == InvalidStreamError.code
            assert [r.code for r in res[4:]] == [0, TooManyStreamsError.code]
            assert "stream_max_count=2" in res[5].message
            with pytest.raises(TooManyStreamsError):
                await st.receive(["f"])
            assert values(await st.receive(["a", "d"], max_messages=5)) == [b"ok", b"x"]
            waiting = asyncio.create_task(st.receive(["a", "d"], wait_ms=30_000))
            await until(lambda: st.stats().receivers == 1, "the receive waits")
            with pytest.raises(BackpressureError, match="stream_max_receivers=1"):
                await st.receive(["d"], wait_ms=10_000)
            assert await st.receive(["d"]) == []  # one that does not wait is fine
            st.release_waiters()
            assert await asyncio.wait_for(waiting, PROMPT_S) == []
            with pytest.raises(InvalidStreamError, match="max_messages=0"):
                await st.receive(["a"], max_messages=0)
            with pytest.raises(InvalidStreamError, match="ring_size=-1"):
                await st.send([SendItem("a", b"x")], ring_size=-1)

    asyncio.run(main())


def test_close_wakes_every_waiter(tmp_path: Path) -> None:
    async def main() -> None:
        async with streams_broker(tmp_path) as (broker, st):
            r = asyncio.create_task(st.receive(["z"], wait_ms=30_000))
            rd = asyncio.create_task(st.read({"z": FROM_END}, wait_ms=30_000))
            blocked = asyncio.create_task(
                st.send([SendItem("y", b"1")], ring_size=0, block_ms=30_000)
            )
            await until(lambda: st.stats().receivers == 2, "both wait")
            await asyncio.sleep(0.01)
            assert not blocked.done()
            broker.begin_drain()
            assert await asyncio.wait_for(r, PROMPT_S) == []
            assert (await asyncio.wait_for(rd, PROMPT_S))[0] == []
            res = await asyncio.wait_for(blocked, PROMPT_S)
            assert res[0].code == ShuttingDownError.code  # retriable, not a full stream
            assert await st.receive(["z"], wait_ms=30_000) == []  # draining: no wait

    asyncio.run(main())


def test_under_fsync_always_reads_and_takes_wait_for_durability(tmp_path: Path) -> None:
    async def main() -> None:
        async with streams_broker(tmp_path, log=LogConfig(fsync=FsyncPolicy.ALWAYS)) as (b, st):
            reader = asyncio.create_task(st.read({"f": FROM_END}, wait_ms=30_000))
            taker = asyncio.create_task(st.receive(["f"], wait_ms=30_000))
            await until(lambda: st.stats().receivers == 2, "both wait")
            res = await st.send([SendItem("f", b"durable", persistent=True)])
            plog = b.logs.logs[(STREAMS_TOPIC, partition_of("f", st.partitions))]
            record = split_position(decode_token("f", res[0].token))[0]
            assert plog.flushed_offset > record  # answered once fsynced
            msgs, _ = await asyncio.wait_for(reader, PROMPT_S)
            assert values(msgs) == [b"durable"]
            got = await asyncio.wait_for(taker, PROMPT_S)
            assert values(got) == [b"durable"]
            assert plog.flushed_offset == plog.log_end_offset  # the take record too
        async with streams_broker(tmp_path, log=LogConfig(fsync=FsyncPolicy.ALWAYS)) as (_, st):
            assert await st.receive(["f"]) == []

    asyncio.run(main())


def test_a_send_splits_its_records_at_the_entry_bound(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(manager, "MAX_ENTRIES_PER_RECORD", 3)

    async def main() -> None:
        async with streams_broker(tmp_path, stream_partitions=1) as (broker, st):
            res = await st.send(
                [SendItem(f"s{i % 2}", b"%d" % i, persistent=True) for i in range(8)]
            )
            records = [
                split_position(decode_token(f"s{i % 2}", r.token)) for i, r in enumerate(res)
            ]
            assert records == [(0, 0), (0, 1), (0, 2), (1, 0), (1, 1), (1, 2), (2, 0), (2, 1)]
            assert broker.logs.logs[(STREAMS_TOPIC, 0)].log_end_offset == 3
            got = await st.receive(["s0", "s1"], max_messages=8)
            assert sorted(values(got)) == [b"%d" % i for i in range(8)]
        async with streams_broker(tmp_path, stream_partitions=1) as (_, st):
            msgs, _ = await st.read({"s1": FROM_START})
            assert values(msgs) == [b"1", b"3", b"5", b"7"]
            assert await st.receive(["s0", "s1"]) == []

    asyncio.run(main())


def test_the_partition_count_is_fixed_when_the_log_is_created(tmp_path: Path) -> None:
    async def main() -> None:
        async with streams_broker(tmp_path, stream_partitions=2) as (broker, st):
            await st.send([SendItem("m", b"in memory only")])
            assert values(await st.receive(["m"])) == [b"in memory only"]
            # in-memory messages never touch the disk: no log before a persistent message
            assert STREAMS_TOPIC not in broker.logs.topics()
            await st.send([SendItem("a", b"1", persistent=True)])
            assert broker.topics() == {}  # internal: not listed
            assert sorted(broker.logs.topics()[STREAMS_TOPIC]) == [0, 1]
        async with streams_broker(tmp_path, stream_partitions=8) as (_, st):
            assert st.partitions == 2
            assert values(await st.receive(["a"])) == [b"1"]

    asyncio.run(main())


def test_a_failed_write_indexes_nothing_of_it(tmp_path: Path) -> None:
    async def main() -> None:
        async with streams_broker(tmp_path, stream_partitions=1) as (broker, st):
            await st.send([SendItem("w", b"before", persistent=True)])
            plog = broker.logs.logs[(STREAMS_TOPIC, 0)]
            real = plog.append

            def failing(batch: object) -> object:
                raise StorageError("disk full (simulated)")

            plog.append = failing  # type: ignore[method-assign,assignment]
            with pytest.raises(StorageError, match="disk full"):
                await st.send(
                    [
                        SendItem("w", b"lost", persistent=True),
                        SendItem("new", b"x", persistent=True),
                    ]
                )
            plog.append = real  # type: ignore[method-assign]
            assert values(await st.receive(["w", "new"], max_messages=5)) == [b"before"]
            assert values((await st.read({"w": FROM_START, "new": FROM_START}))[0]) == [b"before"]
            assert st.stats().persistent_messages == 1

    asyncio.run(main())


def test_a_restart_skips_expired_messages_and_keeps_ring_drops(tmp_path: Path) -> None:
    async def main() -> None:
        clock = FakeClock()
        async with streams_broker(tmp_path, clock) as (_, st):
            await st.send(
                [
                    SendItem("short", b"s", ttl_ms=1_000, persistent=True),
                    SendItem("long", b"l", ttl_ms=60_000, persistent=True),
                ]
            )
            await st.send(
                [SendItem("ring", b"%d" % i, persistent=True) for i in range(3)], ring_size=1
            )
        clock.advance(1_000)
        async with streams_broker(tmp_path, clock) as (_, st):
            assert st.describe("short") is None  # expired while the broker was down
            assert values(await st.receive(["short", "long"], max_messages=5)) == [b"l"]
            # the ring pushed out 0 and 1: still out of the work queue, still readable
            assert values(await st.receive(["ring"], max_messages=5)) == [b"2"]
            assert values((await st.read({"ring": FROM_START}))[0]) == [b"0", b"1", b"2"]

    asyncio.run(main())


def test_a_read_of_many_streams_starves_none(tmp_path: Path) -> None:
    async def main() -> None:
        async with streams_broker(tmp_path) as (_, st):
            await st.send([SendItem("busy", b"%d" % i, persistent=True) for i in range(50)])
            await st.send([SendItem("quiet", b"q", persistent=True)])
            positions = {"busy": FROM_START, "quiet": FROM_START}
            seen: list[str] = []
            for _ in range(2):
                msgs, positions = await st.read(positions, max_messages=5)
                seen += [m.stream for m in msgs]
            assert "quiet" in seen

    asyncio.run(main())


def test_a_receive_that_fails_takes_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def main() -> None:
        async with streams_broker(tmp_path) as (_, st):
            await st.send(
                [
                    SendItem("f", b"m1"),
                    SendItem("f", b"p1", persistent=True),
                    SendItem("g", b"m2"),
                ]
            )

            def unreadable(p: int, offset: int) -> object:
                raise PartitionCorruptError("unreadable (simulated)")

            with monkeypatch.context() as m:
                m.setattr(st, "_record", unreadable)
                with pytest.raises(PartitionCorruptError, match="simulated"):
                    await st.receive(["f", "g"], max_messages=10)
            got = await st.receive(["f", "g"], max_messages=10)
            assert sorted(values(got)) == [b"m1", b"m2", b"p1"]

    asyncio.run(main())


def test_tokens_made_together_are_those_made_one_by_one() -> None:
    rng = random.Random(13)
    ids = ["s", "device-00000001/inbox", "é\U0001f600", "\udc80 lone surrogate", "x" * 1024]
    ids += [f"stream-{rng.randrange(10**9)}" for _ in range(200)]
    positions = [0, 1, (1 << 16) - 1, 1 << 16, (1 << 63) - 1]
    positions += [rng.randrange(1 << 62) for _ in range(len(ids) - len(positions))]
    crcs = [zlib.crc32(sid.encode("utf-8", "surrogatepass")) for sid in ids]
    assert encode_tokens(crcs, positions) == [
        encode_token(sid, pos) for sid, pos in zip(ids, positions, strict=True)
    ]
    for sid, pos, token in zip(ids, positions, encode_tokens(crcs, positions), strict=True):
        assert decode_token(sid, token) == pos
    assert encode_tokens([], []) == []
    with pytest.raises(ValueError, match="2 crcs for 1 positions"):
        encode_tokens([1, 2], [3])


def test_new_streams_and_every_other_kind_of_item_interleave_in_one_send(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # New streams holding one persistent message are stored by a path of their own; the
    # items around them (existing streams, uuids, in-memory, other TTLs, refused ones, a
    # full record) by the general one: positions, tokens, results, timers and the index
    # must not tell them apart.
    monkeypatch.setattr(manager, "MAX_ENTRIES_PER_RECORD", 3)
    clock = FakeClock()

    async def main() -> None:
        async with streams_broker(
            tmp_path, clock, stream_partitions=1, stream_max_message_bytes=100
        ) as (broker, st):
            await st.send([SendItem("old", b"o0", persistent=True)])  # offset 0
            items = [
                SendItem("n0", b"0", persistent=True),
                SendItem("n1", b"1", persistent=True),
                SendItem("n2", b"2", persistent=True),
                SendItem("n3", b"3", persistent=True, ttl_ms=5_000),  # a new record
                SendItem("n6", b"6", persistent=True, ttl_ms=5_000),
                SendItem("old", b"o1", persistent=True),
                SendItem("u", b"u", uuid="id-1", persistent=True),
                SendItem("mem", b"m"),
                SendItem("n4", b"4", persistent=True),
                SendItem("big", b"x" * 101, persistent=True),
                SendItem("n0", b"0b", persistent=True),  # made by this send already
                SendItem("n5", b"5", persistent=True),
                SendItem("u", b"u", uuid="id-1", persistent=True),
                SendItem("n8", b"8", persistent=True),
            ]
            res = await st.send(items)
            codes = [r.code for r in res]
            assert codes == [0] * 9 + [BatchTooLargeError.code, 0, 0, -1, 0]
            stored = [(i, it) for i, it in enumerate(items) if it.persistent and res[i].code == 0]
            # records at offsets 1..4 of three entries (the last: two), in the items' order
            got = [split_position(decode_token(it.stream, res[i].token)) for i, it in stored]
            assert got == [(o, j) for o in (1, 2, 3, 4) for j in range(3)][:11]
            assert res[7].token == ""  # in memory
            assert broker.logs.logs[(STREAMS_TOPIC, 0)].log_end_offset == 5
            assert st.stats().streams == 11  # "big" was refused before it was made
            assert st.stats().created == 11
            assert st.stats().persistent_messages == 12
            bare = await st.send([SendItem("n7", b"7", persistent=True)], tokens=False)
            assert bare[0].code == 0
            assert bare[0].token == ""
            clock.advance(5_000)  # the two of 5 s expire, nothing else
            st.tick()
            assert st.stats().expired == 2  # by the timers: each stream was scheduled
            assert st.stats().persistent_messages == 11
            waiting = {
                sid: values((await st.read({sid: FROM_START}))[0])
                for sid in ("n0", "n3", "n6", "n7", "old")
            }
            assert waiting == {
                "n0": [b"0", b"0b"],
                "n3": [],
                "n6": [],
                "n7": [b"7"],
                "old": [b"o0", b"o1"],
            }
            names = ["n1", "n2", "n4", "n5", "n8", "u", "mem"]
            taken = await st.receive(names, max_messages=10)
            assert sorted(values(taken)) == [b"1", b"2", b"4", b"5", b"8", b"m", b"u"]
        async with streams_broker(tmp_path, clock, stream_partitions=1) as (_, st):
            msgs, _ = await st.read({"n0": FROM_START, "n5": res[11].token})
            assert sorted(values(msgs)) == [b"0", b"0b", b"5"]
            assert await st.receive(names) == []

    asyncio.run(main())


def test_new_persistent_streams_stop_at_the_stream_limit(tmp_path: Path) -> None:
    async def main() -> None:
        async with streams_broker(tmp_path, stream_max_count=4) as (_, st):
            await st.send([SendItem("a", b"a", persistent=True)])
            res = await st.send([SendItem(f"s{i}", b"x", persistent=True) for i in range(5)])
            assert [r.code for r in res] == [0, 0, 0] + [TooManyStreamsError.code] * 2
            assert "4 streams exist (stream_max_count=4); 's3' is not created" in res[3].message
            assert [r.token != "" for r in res] == [True, True, True, False, False]
            assert st.stats().streams == st.stats().created == 4
            assert (await st.send([SendItem("a", b"b", persistent=True)]))[0].code == 0

    asyncio.run(main())
