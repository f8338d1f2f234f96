"""The batching producer against a real broker on port 0: every test that takes ``kind`` runs
against :class:`AsyncProducer` and its blocking twin :class:`Producer`.

What is checked is what a user can observe: each message's future (partition, offset,
timestamp), what the broker stored (records, how many batches, their headers), and the
errors raised -- never timing thresholds. Whatever should happen promptly is bounded by
``PROMPT_S``; no test sleeps.
"""

from __future__ import annotations

import asyncio
import inspect
from pathlib import Path
from typing import Any

import pytest

from tests.client._producer_support import CuttingProxy, producing, stored
from tests.client._support import PROMPT_S, addr, in_thread, run, serve
from tidewire.client import (
    AsyncClient,
    AsyncProducer,
    BlockingRecordFuture,
    Producer,
    RecordFuture,
    RecordMetadata,
    fnv1a_32,
)
from tidewire.errors import (
    BatchTooLargeError,
    BufferFullError,
    InvalidConfigError,
    ProducerClosedError,
    ProducerFencedError,
    UnknownPartitionError,
    UnknownTopicError,
)
from tidewire.protocol.messages import InitProducerIdRequest
from tidewire.records import Codec
from tidewire.storage import LogConfig

#: Options of a producer that never sends on its own: only a flush, a full batch or a close.
NO_LINGER_SEND = {"linger_ms": 60_000}


# --- the partitioner ------------------------------------------------------------------------------


def test_fnv1a_32_known_vectors() -> None:
    assert fnv1a_32(b"") == 0x811C9DC5
    assert fnv1a_32(b"a") == 0xE40C292C
    assert fnv1a_32(b"foobar") == 0xBF9CF968


# --- futures, partitions, offsets -----------------------------------------------------------------


@pytest.mark.parametrize("idempotence", [False, True])
def test_futures_carry_partition_offset_and_timestamp(
    kind: str, tmp_path: Path, idempotence: bool
) -> None:
    async def main() -> None:
        async with serve(tmp_path) as (broker, server):
            broker.create_topic("t", 3)
            async with producing(kind, addr(server), idempotence=idempotence) as p:
                futs = await p.send_many(
                    "t",
                    [
                        {"value": b"p1-a", "partition": 1, "timestamp": 1_000},
                        {"value": b"p1-b", "partition": 1, "timestamp": 2_000},
                        {"value": b"p2", "partition": 2, "headers": [("h", b"v"), ("n", None)]},
                        {"value": None, "partition": 0, "key": b"k"},
                    ],
                )
                md = await p.results(futs)
                assert [(m.topic, m.partition, m.offset) for m in md] == [
                    ("t", 1, 0),
                    ("t", 1, 1),
                    ("t", 2, 0),
                    ("t", 0, 0),
                ]
                assert (md[0].timestamp, md[1].timestamp) == (1_000, 2_000)
                assert all(isinstance(m, RecordMetadata) for m in md)
                assert all(f.done() for f in futs)

    run(main())


def test_stored_records_match_what_was_sent(kind: str, tmp_path: Path) -> None:
    async def main() -> None:
        async with serve(tmp_path) as (broker, server):
            broker.create_topic("t", 1)
            async with producing(kind, addr(server), idempotence=False) as p:
                futs = await p.send_many(
                    "t",
                    [
                        {"value": b"v1", "key": b"k1", "timestamp": 5},
                        {"value": bytearray(b"v2"), "headers": [("a", b"1")], "timestamp": 6},
                        {"value": None, "key": memoryview(b"k3"), "timestamp": 7},
                    ],
                )
                await p.results(futs)
            _, records = await stored(broker, "t", 0)
            assert [(r.offset, r.timestamp, r.key, r.value, r.headers) for r in records] == [
                (0, 5, b"k1", b"v1", ()),
                (1, 6, None, b"v2", (("a", b"1"),)),
                (2, 7, b"k3", None, ()),
            ]

    run(main())


def test_keyed_messages_keep_order_on_their_fnv_partition(kind: str, tmp_path: Path) -> None:
    keys = [b"user-%d" % i for i in range(12)]
    messages = [{"value": b"%d" % i, "key": keys[i % len(keys)]} for i in range(600)]

    async def main() -> None:
        async with serve(tmp_path) as (broker, server):
            broker.create_topic("t", 4)
            async with producing(kind, addr(server), batch_bytes=512) as p:
                md = await p.results(await p.send_many("t", messages))
            for m, msg in zip(md, messages, strict=True):
                assert m.partition == fnv1a_32(msg["key"]) % 4
            for partition in range(4):
                _, records = await stored(broker, "t", partition)
                for key in keys:
                    mine = [int(r.value or b"") for r in records if r.key == key]
                    assert mine == sorted(mine)  # the order they were sent in
                    if fnv1a_32(key) % 4 == partition:
                        assert len(mine) == 50

    run(main())


def test_unkeyed_messages_fill_one_batch_per_partition_in_turn(kind: str, tmp_path: Path) -> None:
    async def main() -> None:
        async with serve(tmp_path) as (broker, server):
            broker.create_topic("t", 3)
            # 100-byte values, batches of at most ~1 KiB: 300 messages make ~30 batches.
            async with producing(kind, addr(server), batch_bytes=1024) as p:
                md = await p.results(await p.send_many("t", [{"value": b"x" * 100}] * 300))
            counts = [sum(1 for m in md if m.partition == i) for i in range(3)]
            assert all(c > 0 for c in counts), counts
            assert sum(counts) == 300
            for partition in range(3):
                headers, records = await stored(broker, "t", partition)
                assert len(records) == counts[partition]
                # Round robin per batch: consecutive messages share a batch.
                assert all(h.records_count > 1 for h in headers)

    run(main())


# --- what makes a batch go ------------------------------------------------------------------------


def test_a_full_batch_is_sent_without_waiting_for_its_linger(kind: str, tmp_path: Path) -> None:
    async def main() -> None:
        async with serve(tmp_path) as (broker, server):
            broker.create_topic("t", 1)
            async with producing(kind, addr(server), batch_bytes=1024, **NO_LINGER_SEND) as p:
                futs = await p.send_many("t", [{"value": b"x" * 100}] * 25)
                # The first batches filled up and went; the linger (60 s) would not send them.
                full = await p.results(futs[:24])  # 8 messages a batch: 3 batches are full
                assert [m.offset for m in full] == list(range(24))
                headers, _ = await stored(broker, "t", 0)
                assert [h.records_count for h in headers] == [8, 8, 8]
                assert all(h.size <= 1024 for h in headers)
                assert not futs[-1].done()  # the last batch is open, waiting for more
                await p.flush()
                headers, records = await stored(broker, "t", 0)
                assert len(records) == 25

    run(main())


def test_linger_sends_a_batch_that_never_fills(kind: str, tmp_path: Path) -> None:
    async def main() -> None:
        async with serve(tmp_path) as (broker, server):
            broker.create_topic("t", 1)
            async with producing(kind, addr(server), linger_ms=20) as p:
                futs = await p.send_many("t", [{"value": b"m%d" % i} for i in range(5)])
                md = await p.results(futs)  # no flush: the linger sends them
                assert [m.offset for m in md] == [0, 1, 2, 3, 4]
                headers, _ = await stored(broker, "t", 0)
                assert len(headers) == 1  # the five shared one batch
                assert headers[0].records_count == 5

    run(main())


def test_flush_sends_everything_and_waits(kind: str, tmp_path: Path) -> None:
    async def main() -> None:
        async with serve(tmp_path) as (broker, server):
            broker.create_topic("t", 2)
            async with producing(kind, addr(server), **NO_LINGER_SEND) as p:
                futs = await p.send_many(
                    "t", [{"value": b"v", "partition": i % 2} for i in range(10)]
                )
                assert not any(f.done() for f in futs)
                await p.flush()
                assert all(f.done() for f in futs)
                for partition in (0, 1):
                    _, records = await stored(broker, "t", partition)
                    assert len(records) == 5

    run(main())


# --- memory ---------------------------------------------------------------------------------------


def test_a_full_buffer_blocks_then_raises_buffer_full(kind: str, tmp_path: Path) -> None:
    async def main() -> None:
        async with serve(tmp_path) as (broker, server):
            broker.create_topic("t", 1)
            opts = {"buffer_bytes": 4096, "batch_bytes": 4096, "max_block_ms": 50}
            async with producing(kind, addr(server), **opts, **NO_LINGER_SEND) as p:
                futs = []
                error: BufferFullError | None = None
                for _ in range(100):  # ~40 fit
                    try:
                        futs.append(await p.send("t", b"x" * 80))
                    except BufferFullError as exc:
                        error = exc
                        break
                assert "buffer_bytes=4,096 stayed full for max_block_ms=50" in str(error)
                assert 10 < len(futs) < 100
                await p.flush()  # the buffer empties once the broker has answered
                fut = await p.send("t", b"after")
                await p.flush()
                assert (await p.result(fut)).offset == len(futs)

    run(main())


def test_max_block_ms_0_never_waits_but_sends(kind: str, tmp_path: Path) -> None:
    """0: the first send to a topic (not created yet: its metadata must be looked up, and
    the broker creates it) succeeds; only a full buffer fails, at once."""

    async def main() -> None:
        async with serve(tmp_path) as (_, server):
            opts = {"buffer_bytes": 4096, "batch_bytes": 4096, "max_block_ms": 0}
            async with producing(kind, addr(server), **opts, **NO_LINGER_SEND) as p:
                first = await p.send("new-topic", b"first", key=b"k")
                futs = [first]
                error: BufferFullError | None = None
                for _ in range(100):  # ~40 fit
                    try:
                        futs.append(await p.send("new-topic", b"x" * 80, key=b"k"))
                    except BufferFullError as exc:
                        error = exc
                        break
                assert "buffer_bytes=4,096 stayed full for max_block_ms=0" in str(error)
                assert 10 < len(futs) < 100
                await p.flush()
                metas = await p.results(futs)
                assert [m.offset for m in metas] == list(range(len(futs)))
                assert metas[0].topic == "new-topic"

    run(main())


def test_a_waiting_send_goes_on_once_room_is_made(tmp_path: Path) -> None:
    async def main() -> None:
        async with serve(tmp_path) as (broker, server):
            broker.create_topic("t", 1)
            opts = {"buffer_bytes": 4096, "batch_bytes": 4096, "max_block_ms": 30_000}
            async with AsyncProducer(
                addr(server), idempotence=False, **opts, **NO_LINGER_SEND
            ) as p:
                sent = 0
                while p._acc is None or p._acc.used + 120 < 4096:
                    await p.send("t", b"x" * 80)
                    sent += 1
                blocked = asyncio.ensure_future(p.send("t", b"y" * 80))
                await asyncio.sleep(0)
                assert not blocked.done()
                await p.flush()  # frees the memory: the waiting send goes in
                fut = await asyncio.wait_for(blocked, PROMPT_S)
                await p.flush()
                assert (await fut).offset == sent

    run(main())


# --- errors for one message -----------------------------------------------------------------------


def test_an_oversized_message_fails_alone(kind: str, tmp_path: Path) -> None:
    async def main() -> None:
        async with serve(tmp_path) as (broker, server):
            broker.create_topic("t", 1, LogConfig(max_batch_bytes=2048))
            async with producing(kind, addr(server)) as p:
                ok = await p.send("t", b"small")
                with pytest.raises(BatchTooLargeError, match="max_message_bytes=2,048"):
                    await p.send("t", b"x" * 4000)
                ok2 = await p.send("t", b"small again")
                await p.flush()
                assert [(await p.result(f)).offset for f in (ok, ok2)] == [0, 1]

    run(main())


def test_bad_arguments_raise_type_errors(kind: str, tmp_path: Path) -> None:
    async def main() -> None:
        async with serve(tmp_path) as (broker, server):
            broker.create_topic("t", 2)
            async with producing(kind, addr(server)) as p:
                with pytest.raises(TypeError, match="value must be bytes"):
                    await p.send("t", "text")  # type: ignore[arg-type]
                with pytest.raises(TypeError, match="key must be bytes"):
                    await p.send("t", b"v", key=3)
                with pytest.raises(TypeError, match="header"):
                    await p.send("t", b"v", headers=[("k", "text")])
                with pytest.raises(TypeError, match="partition must be an int"):
                    await p.send("t", b"v", partition="0")
                with pytest.raises(TypeError, match="timestamp"):
                    await p.send("t", b"v", timestamp=1.5)
                with pytest.raises(TypeError, match="topic must be str"):
                    await p.send(b"t", b"v")  # type: ignore[arg-type]
                with pytest.raises(UnknownPartitionError, match=r"partitions 0\.\.1, not 2"):
                    await p.send("t", b"v", partition=2)

    run(main())


def test_bad_options_are_refused_before_anything_starts() -> None:
    for cls in (AsyncProducer, Producer):
        with pytest.raises(InvalidConfigError, match="max_in_flight_per_partition=6"):
            cls("127.0.0.1:1", max_in_flight_per_partition=6)
        with pytest.raises(InvalidConfigError, match="compression='brotli'"):
            cls("127.0.0.1:1", compression="brotli")
        with pytest.raises(InvalidConfigError, match="acks"):
            cls("127.0.0.1:1", acks="all")
        with pytest.raises(InvalidConfigError, match="idempotence needs"):
            cls("127.0.0.1:1", acks="none")
        with pytest.raises(InvalidConfigError, match="buffer_bytes"):
            cls("127.0.0.1:1", batch_bytes=1 << 20, buffer_bytes=1 << 19)
        with pytest.raises(InvalidConfigError, match="pipeline_partial_batches must be True"):
            cls("127.0.0.1:1", pipeline_partial_batches="yes")  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="HOST:PORT"):
            cls("nonsense")
    # Without idempotence, more in flight is allowed.
    AsyncProducer("127.0.0.1:1", idempotence=False, max_in_flight_per_partition=50)


# --- topics ---------------------------------------------------------------------------------------


def test_a_topic_is_created_on_first_publish_with_the_brokers_partitions(
    kind: str, tmp_path: Path
) -> None:
    async def main() -> None:
        async with serve(tmp_path, default_partitions=3) as (broker, server):
            async with producing(kind, addr(server)) as p:
                md = await p.results(await p.send_many("new", [{"value": b"v", "key": b"abc"}]))
            assert broker.topics() == {"new": 3}
            assert md[0].partition == fnv1a_32(b"abc") % 3
            for partition in range(3):  # the creation stored nothing of its own
                _, records = await stored(broker, "new", partition)
                assert len(records) == (1 if partition == md[0].partition else 0)

    run(main())


def test_unknown_topic_without_auto_creation(kind: str, tmp_path: Path) -> None:
    async def main() -> None:
        async with serve(tmp_path, auto_create_topics=False) as (broker, server):
            async with producing(kind, addr(server)) as p:
                with pytest.raises(UnknownTopicError, match="does not create topics"):
                    await p.send("missing", b"v")
            assert broker.topics() == {}

    run(main())


# --- codecs ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("codec", ["none", "gzip", "lz4", "zstd"])
def test_compression_round_trips_through_the_broker(kind: str, tmp_path: Path, codec: str) -> None:
    messages = [
        {"value": b"compressible " * 50, "key": b"k%d" % i, "headers": [("i", b"%d" % i)]}
        for i in range(40)
    ]

    async def main() -> None:
        async with serve(tmp_path) as (broker, server):
            broker.create_topic("t", 1)
            async with producing(kind, addr(server), compression=codec) as p:
                await p.results(await p.send_many("t", messages))
            headers, records = await stored(broker, "t", 0)
            assert {h.codec for h in headers} == {Codec[codec.upper()]}
            assert [(r.key, r.value, r.headers) for r in records] == [
                (m["key"], m["value"], tuple(m["headers"])) for m in messages
            ]

    run(main())


# --- close ----------------------------------------------------------------------------------------


def test_close_flushes_by_default(kind: str, tmp_path: Path) -> None:
    async def main() -> None:
        async with serve(tmp_path) as (broker, server):
            broker.create_topic("t", 1)
            async with producing(kind, addr(server), **NO_LINGER_SEND) as p:
                futs = await p.send_many("t", [{"value": b"%d" % i} for i in range(20)])
                await p.close()
                assert [m.offset for m in await p.results(futs)] == list(range(20))
                with pytest.raises(ProducerClosedError):
                    await p.send("t", b"late")
                await p.close()  # again: nothing happens
            _, records = await stored(broker, "t", 0)
            assert len(records) == 20

    run(main())


def test_close_without_flush_fails_the_unsent(kind: str, tmp_path: Path) -> None:
    async def main() -> None:
        async with serve(tmp_path) as (broker, server):
            broker.create_topic("t", 1)
            async with producing(kind, addr(server), **NO_LINGER_SEND) as p:
                sent = await p.send("t", b"sent")
                await p.flush()
                futs = await p.send_many("t", [{"value": b"%d" % i} for i in range(5)])
                await p.close(flush=False)
                assert (await p.result(sent)).offset == 0
                for f in futs:
                    with pytest.raises(ProducerClosedError):
                        await p.result(f)
            _, records = await stored(broker, "t", 0)
            assert len(records) == 1

    run(main())


# --- retries and idempotence ----------------------------------------------------------------------


@pytest.mark.parametrize("idempotence", [False, True])
def test_a_lost_answer_is_retried_on_a_new_connection(
    kind: str, tmp_path: Path, idempotence: bool
) -> None:
    """The broker stores a batch, then the connection breaks before its answer arrives: the
    producer resends. With idempotence the resend is recognised and the batch is stored
    once, at the offsets of the first copy; without, it is stored twice (at least once)."""

    async def main() -> None:
        async with serve(tmp_path) as (broker, server):
            broker.create_topic("t", 1)
            async with (
                CuttingProxy(server.port, cut_responses=1) as proxy,
                producing(kind, proxy.addr, idempotence=idempotence, retry_backoff_ms=1) as p,
            ):
                futs = await p.send_many("t", [{"value": b"m%d" % i} for i in range(5)])
                await p.flush()
                md = await p.results(futs)
                assert proxy.cuts == 1
                assert proxy.connections >= 2
                more = await p.send("t", b"after")
                await p.flush()
                after = await p.result(more)
            _, records = await stored(broker, "t", 0)
            values = [r.value for r in records]
            if idempotence:
                assert values == [b"m0", b"m1", b"m2", b"m3", b"m4", b"after"]
                assert [m.offset for m in md] == [0, 1, 2, 3, 4]
                assert after.offset == 5
            else:
                assert values == [b"m0", b"m1", b"m2", b"m3", b"m4"] * 2 + [b"after"]
                assert [m.offset for m in md] == [5, 6, 7, 8, 9]

    run(main())


def test_idempotent_batches_carry_the_producer_id_and_sequences(kind: str, tmp_path: Path) -> None:
    async def main() -> None:
        async with serve(tmp_path) as (broker, server):
            broker.create_topic("t", 1)
            async with producing(kind, addr(server), batch_bytes=256) as p:
                await p.results(await p.send_many("t", [{"value": b"x" * 50}] * 20))
                pid, epoch = p.p.producer_id, p.p.producer_epoch
            headers, _ = await stored(broker, "t", 0)
            assert len(headers) > 2
            assert {(h.producer_id, h.producer_epoch) for h in headers} == {(pid, epoch)}
            assert pid >= 0
            seq = 0
            for h in headers:  # each batch starts where the one before ended
                assert h.base_sequence == seq
                seq += h.records_count

    run(main())


def test_a_fenced_producer_fails_and_refuses_later_sends(kind: str, tmp_path: Path) -> None:
    async def main() -> None:
        async with serve(tmp_path) as (broker, server):
            broker.create_topic("t", 1)
            async with producing(kind, addr(server)) as p:
                await p.result(await p.send("t", b"first"))
                # A newer instance of the same producer id bumps the epoch.
                async with AsyncClient(addr(server)) as admin:
                    req = InitProducerIdRequest(
                        producer_id=p.p.producer_id, producer_epoch=p.p.producer_epoch
                    )
                    body = (await admin._call(req)).body
                    assert body.error_code == 0
                    assert body.producer_epoch == p.p.producer_epoch + 1
                fenced = await p.send("t", b"second")
                with pytest.raises(ProducerFencedError):
                    await p.result(fenced)
                with pytest.raises(ProducerFencedError, match="failed earlier"):
                    await p.send("t", b"third")
            _, records = await stored(broker, "t", 0)
            assert [r.value for r in records] == [b"first"]

    run(main())


# --- the twins ------------------------------------------------------------------------------------


def test_producer_is_the_blocking_twin() -> None:
    def public(cls: type) -> dict[str, inspect.Signature]:
        return {
            n: inspect.signature(m)
            for n, m in inspect.getmembers(cls, inspect.isfunction)
            if not n.startswith("_")
        }

    a, s = public(AsyncProducer), public(Producer)
    assert sorted(a) == sorted(s) == ["close", "flush", "send", "send_values"]
    for name in a:
        assert list(a[name].parameters.values()) == list(s[name].parameters.values()), name
    assert list(inspect.signature(AsyncProducer.__init__).parameters.values()) == list(
        inspect.signature(Producer.__init__).parameters.values()
    )
    assert inspect.iscoroutinefunction(AsyncProducer.send)
    assert not inspect.iscoroutinefunction(Producer.send)
    assert inspect.signature(AsyncProducer.send).return_annotation == "RecordFuture"
    assert inspect.signature(Producer.send).return_annotation == "BlockingRecordFuture"
    assert RecordFuture is not BlockingRecordFuture


def test_blocking_producer_from_many_threads(tmp_path: Path) -> None:
    async def main() -> None:
        async with serve(tmp_path) as (broker, server):
            broker.create_topic("t", 1)
            p = Producer(addr(server))
            try:

                def work(n: int) -> list[int]:
                    futs = [p.send("t", b"%d-%d" % (n, i), key=b"%d" % n) for i in range(200)]
                    return [f.result(PROMPT_S).offset for f in futs]

                offsets = await asyncio.gather(*(in_thread(work, n) for n in range(4)))
            finally:
                await in_thread(p.close)
            assert sorted(o for per in offsets for o in per) == list(range(800))
            for per in offsets:
                assert per == sorted(per)

    run(main())


# --- the latency path ---------------------------------------------------------------------------


@pytest.mark.parametrize("idempotence", [False, True])
def test_a_connected_producer_sends_and_settles_without_a_task_per_request(
    tmp_path: Path, idempotence: bool
) -> None:
    """Once connected, each produce request is written by the sender's own step and its
    batches settled from the read callback (Transport.request_soon): no task per request,
    which cost a lone message two loop turns. Offsets and order are as before."""

    async def main() -> None:
        async with serve(tmp_path) as (broker, server):
            broker.create_topic("t", 1)
            async with AsyncProducer(addr(server), linger_ms=0, idempotence=idempotence) as p:
                await (await p.send("t", b"first"))  # opens the connection (a task)
                tasked = 0
                produce = p._produce

                async def counted(*args: Any) -> None:
                    nonlocal tasked
                    tasked += 1
                    await produce(*args)

                p._produce = counted  # type: ignore[method-assign]
                offsets = [(await (await p.send("t", b"m%d" % i))).offset for i in range(20)]
                assert offsets == list(range(1, 21))
                assert tasked == 0
                futs = [await p.send("t", b"n%d" % i) for i in range(50)]  # several in flight
                assert [(await f).offset for f in futs] == list(range(21, 71))
                assert tasked == 0
            _, records = await stored(broker, "t", 0)
            expected = (
                [b"first"] + [b"m%d" % i for i in range(20)] + [b"n%d" % i for i in range(50)]
            )
            assert [r.value for r in records] == expected

    run(main())
