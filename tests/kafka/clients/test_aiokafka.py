"""aiokafka against the Kafka listener, with no client setting beyond short timeouts: admin,
every compression codec, a group of three, commit and resume with metadata, offsets for
times, an idempotent producer whose connections are cut, SASL/SCRAM and ACLs. Each test runs
its clients on an event loop of its own (the broker has another, in its thread)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Coroutine
from typing import Any

import aiokafka
import aiokafka.errors
import pytest
from aiokafka.admin import AIOKafkaAdminClient, NewPartitions, NewTopic
from aiokafka.structs import OffsetAndMetadata, TopicPartition

from tests.kafka.clients._records import Got, Sent, check_log, messages
from tests.kafka.clients.conftest import CODECS, WITHIN_S, Proxy, Running
from tidewire.security.model import Operation

FAST = {"request_timeout_ms": 20_000, "metadata_max_age_ms": 1_000, "retry_backoff_ms": 20}


def run(coro: Coroutine[Any, Any, None]) -> None:
    asyncio.run(asyncio.wait_for(coro, 2 * WITHIN_S))


def consumer(bootstrap: str, group: str | None, *topics: str, **kw: Any) -> Any:
    return aiokafka.AIOKafkaConsumer(
        *topics,
        bootstrap_servers=bootstrap,
        group_id=group,
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        session_timeout_ms=3_000,
        heartbeat_interval_ms=100,
        **FAST,
        **kw,
    )


async def produce(bootstrap: str, topic: str, sent: list[Sent], **kw: Any) -> list[Got]:
    p = aiokafka.AIOKafkaProducer(
        bootstrap_servers=bootstrap, acks="all", linger_ms=5, **FAST, **kw
    )
    await p.start()
    try:
        futures = [
            await p.send(
                topic,
                key=s.key,
                value=s.value,
                headers=list(s.headers),
                timestamp_ms=s.timestamp,
            )
            for s in sent
        ]
        placed = []
        for s, f in zip(sent, futures, strict=True):
            md = await f
            placed.append(Got(md.partition, md.offset, *s))
        return placed
    finally:
        await p.stop()


def got(rec: Any) -> Got:
    assert rec.timestamp_type == 0  # create time
    return Got(rec.partition, rec.offset, rec.key, rec.value, tuple(rec.headers), rec.timestamp)


async def consume(c: Any, n: int) -> list[Got]:
    out: list[Got] = []
    deadline = time.monotonic() + WITHIN_S
    while len(out) < n and time.monotonic() < deadline:
        batches = await c.getmany(timeout_ms=200, max_records=n - len(out))
        for recs in batches.values():
            out.extend(got(rec) for rec in recs)
    assert len(out) == n, f"{len(out)} of {n} messages within {WITHIN_S} s"
    return out


def test_create_topic_and_partitions_through_the_admin_client(running: Running) -> None:
    async def main() -> None:
        a = AIOKafkaAdminClient(bootstrap_servers=running.bootstrap, **FAST)
        await a.start()
        try:
            await a.create_topics([NewTopic("made", num_partitions=2, replication_factor=1)])
            assert running.on_loop(lambda: running.broker.topics()["made"]) == 2
            resp = await a.create_partitions({"made": NewPartitions(total_count=4)})
            # a result per topic, never an empty list
            assert [(t[0], t[1]) for t in resp.topic_errors] == [("made", 0)]
            assert running.on_loop(lambda: running.broker.topics()["made"]) == 4
        finally:
            await a.close()

    run(main())


@pytest.mark.parametrize("codec", CODECS)
def test_produce_and_consume_from_the_beginning(running: Running, codec: str) -> None:
    running.create_topic("t", 3)
    sent = messages(30, codec)

    async def main() -> None:
        placed = await produce(
            running.bootstrap, "t", sent, compression_type=None if codec == "none" else codec
        )
        c = consumer(running.bootstrap, f"g-{codec}", "t")
        await c.start()
        try:
            check_log(sent, placed, await consume(c, len(sent)))
        finally:
            await c.stop()

    run(main())


class Counting(aiokafka.ConsumerRebalanceListener):  # type: ignore[misc]
    def __init__(self) -> None:
        self.assigns = 0
        self.assigned: set[int] = set()

    async def on_partitions_revoked(self, revoked: Any) -> None:
        self.assigned = set()

    async def on_partitions_assigned(self, assigned: Any) -> None:
        self.assigns += 1
        self.assigned = {tp.partition for tp in assigned}


async def until(what: str, ok: Any) -> None:
    deadline = time.monotonic() + WITHIN_S
    while not ok():
        assert time.monotonic() < deadline, f"not within {WITHIN_S} s: {what}"
        await asyncio.sleep(0.05)


def test_group_of_three_rebalances_once_when_one_leaves(running: Running) -> None:
    running.create_topic("orders", 3)

    async def main() -> None:
        listeners = [Counting() for _ in range(3)]
        members = [consumer(running.bootstrap, "workers") for _ in range(3)]
        for m, listener in zip(members, listeners, strict=True):
            m.subscribe(["orders"], listener=listener)
            await m.start()
        # aiokafka joins the group from a background task; getmany keeps it moving
        polls = [asyncio.ensure_future(_poll_forever(m)) for m in members]
        try:
            await until(
                "3 members own one partition each",
                lambda: (
                    sorted(p for x in listeners for p in x.assigned) == [0, 1, 2]
                    and all(len(x.assigned) == 1 for x in listeners)
                ),
            )
            d = running.on_loop(lambda: running.broker.kafka_groups.describe("workers"))
            assert d is not None
            generation = d.generation
            before = [x.assigns for x in listeners]
            polls[2].cancel()
            await members[2].stop()  # a LeaveGroup
            await until(
                "the 2 members left own all 3 partitions",
                lambda: sorted(p for x in listeners[:2] for p in x.assigned) == [0, 1, 2],
            )
            await asyncio.sleep(0.5)  # an extra rebalance would show within this
            d = running.on_loop(lambda: running.broker.kafka_groups.describe("workers"))
            assert d is not None
            assert d.generation == generation + 1
            assert [listeners[i].assigns - before[i] for i in range(2)] == [1, 1]
        finally:
            for t in polls:
                t.cancel()
            for m in members:
                await m.stop()

    run(main())


async def _poll_forever(c: Any) -> None:
    while True:
        await c.getmany(timeout_ms=100)


def test_commit_metadata_and_resume(running: Running) -> None:
    running.create_topic("log", 1)
    sent = messages(20)
    tp = TopicPartition("log", 0)

    async def main() -> None:
        await produce(running.bootstrap, "log", sent)
        c = consumer(running.bootstrap, "resume", "log")
        await c.start()
        try:
            first = await consume(c, 8)
            await c.commit({tp: OffsetAndMetadata(8, "checkpoint-8")})
            assert await c.committed(tp) == 8
            offsets = await c._coordinator.fetch_committed_offsets([tp])
            assert (offsets[tp].offset, offsets[tp].metadata) == (8, "checkpoint-8")
        finally:
            await c.stop()
        c2 = consumer(running.bootstrap, "resume", "log")
        await c2.start()
        try:
            rest = await consume(c2, 12)
        finally:
            await c2.stop()
        assert [g.offset for g in first + rest] == list(range(20))
        assert [g.value for g in first + rest] == [s.value for s in sent]

    run(main())


def test_offsets_for_times_and_seek(running: Running) -> None:
    running.create_topic("ts", 1)
    running.create_topic("empty", 1)
    sent = messages(10)
    tp, empty = TopicPartition("ts", 0), TopicPartition("empty", 0)

    async def main() -> None:
        await produce(running.bootstrap, "ts", sent)
        c = consumer(running.bootstrap, None)
        await c.start()
        try:
            found = await c.offsets_for_times({tp: sent[6].timestamp})
            assert (found[tp].offset, found[tp].timestamp) == (6, sent[6].timestamp)
            assert await c.offsets_for_times({tp: sent[-1].timestamp + 1}) == {tp: None}
            c.assign([tp])
            c.seek(tp, found[tp].offset)
            assert [g.offset for g in await consume(c, 4)] == [6, 7, 8, 9]
            started = time.monotonic()
            assert await c.beginning_offsets([tp, empty]) == {tp: 0, empty: 0}
            assert await c.end_offsets([tp, empty]) == {tp: 10, empty: 0}
            assert time.monotonic() - started < 10
        finally:
            await c.stop()

    run(main())


def test_idempotent_producer_survives_cut_connections(proxied: tuple[Running, Proxy]) -> None:
    r, proxy = proxied
    r.create_topic("exact", 2)
    bootstrap = f"127.0.0.1:{proxy.port}"
    sent = messages(1_000, "exact")

    async def main() -> None:
        p = aiokafka.AIOKafkaProducer(
            bootstrap_servers=bootstrap,
            enable_idempotence=True,
            linger_ms=2,
            max_batch_size=2_000,
            **FAST,
        )
        await p.start()
        try:
            futures = []
            for i, s in enumerate(sent):
                futures.append(await p.send("exact", key=s.key, value=s.value))
                if i % 200 == 100:
                    await asyncio.sleep(0.005)  # let batches go out, then cut them off
                    proxy.cut()
            placed = [(md.partition, md.offset) for md in await asyncio.gather(*futures)]
        finally:
            await p.stop()
        assert proxy.connections > 1
        assert sum(r.end_offsets("exact", 2)) == len(sent)  # 0 duplicates
        c = consumer(bootstrap, None)
        await c.start()
        try:
            c.assign([TopicPartition("exact", 0), TopicPartition("exact", 1)])
            stored = await consume(c, len(sent))
        finally:
            await c.stop()
        assert sorted((g.partition, g.offset) for g in stored) == sorted(placed)
        assert sorted(g.value for g in stored) == sorted(s.value for s in sent)  # no gaps
        for key in {s.key for s in sent}:
            assert [g.value for g in stored if g.key == key] == [
                s.value for s in sent if s.key == key
            ]

    run(main())


def test_sasl_scram_and_acls(secured: Running) -> None:
    r = secured
    user, password = r.new_user("alice")
    r.allow("alice", "app.", Operation.ALL)
    r.create_topic("app.orders", 1)
    r.create_topic("secret", 1)
    auth = {
        "security_protocol": "SASL_PLAINTEXT",
        "sasl_mechanism": "SCRAM-SHA-256",
        "sasl_plain_username": user,
    }

    async def main() -> None:
        p = aiokafka.AIOKafkaProducer(
            bootstrap_servers=r.bootstrap, sasl_plain_password=password, **auth, **FAST
        )
        await p.start()
        try:
            for s in messages(5):
                await p.send_and_wait("app.orders", key=s.key, value=s.value)
            with pytest.raises(aiokafka.errors.TopicAuthorizationFailedError):
                await p.send_and_wait("secret", value=b"no")
        finally:
            await p.stop()
        bad = aiokafka.AIOKafkaProducer(
            bootstrap_servers=r.bootstrap, sasl_plain_password=password + "x", **auth, **FAST
        )
        with pytest.raises(
            (aiokafka.errors.KafkaConnectionError, aiokafka.errors.AuthenticationFailedError)
        ):
            await bad.start()
        await bad.stop()

    run(main())
    assert r.end_offsets("app.orders", 1) == [5]
    assert r.end_offsets("secret", 1) == [0]
