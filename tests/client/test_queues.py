"""Queues and exchanges through the binary protocol, end to end: a real broker and server on
port 0 per test, the asyncio client and consumer (the blocking twins in their own tests)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from tests.client._support import PROMPT_S, addr, run, serve
from tidewire.client import AsyncClient, AsyncQueueConsumer, PublishResult, QueueMessage
from tidewire.errors import (
    InvalidQueueError,
    PreconditionFailedError,
    QueueFullError,
    UnknownDeliveryTagError,
    UnknownExchangeError,
    UnknownQueueError,
    UnroutableError,
)


async def _take(consumer: AsyncQueueConsumer, n: int) -> list[QueueMessage]:
    out = []
    for _ in range(n):
        msg = await consumer.get(PROMPT_S)
        assert msg is not None, f"only {len(out)} of {n} messages came"
        out.append(msg)
    return out


def test_declare_bind_publish_consume_ack(tmp_path: Path) -> None:
    async def main() -> None:
        async with serve(tmp_path) as (broker, server), AsyncClient(addr(server)) as c:
            info = await c.declare_queue("orders", max_deliveries=3)
            assert (info.name, info.durable, info.max_deliveries, info.ready) == (
                "orders",
                True,
                3,
                0,
            )
            assert (await c.declare_queue("orders", max_deliveries=3)).name == "orders"
            await c.declare_exchange("events", "topic")
            await c.bind("events", "orders", "order.*")
            r = await c.publish(
                "events", "order.eu", b"one", headers={"kind": "order"}, mandatory=True
            )
            assert r == PublishResult(queues=("orders",))
            assert (await c.publish("events", "audit.x", "lost")).unroutable

            exchanges, bindings = await c.list_exchanges()
            assert {"", "events"} <= {x.name for x in exchanges}
            assert [(b.exchange, b.destination, b.key) for b in bindings if b.exchange] == [
                ("events", "orders", "order.*")
            ]
            (q,) = [q for q in await c.list_queues() if q.name == "orders"]
            assert q.ready == 1

            async with AsyncQueueConsumer(addr(server), "orders", prefetch=10) as consumer:
                (msg,) = await _take(consumer, 1)
                assert (msg.routing_key, msg.value, msg.delivery_count) == ("order.eu", b"one", 1)
                assert msg.header("kind") == b"order"
                assert not msg.redelivered
                await msg.ack()
                assert consumer.consumer_tag
                assert await consumer.get(0.05) is None
            status = broker.queues.describe_queue("orders")
            assert (status.ready, status.unacked, status.counters.acked) == (0, 0, 1)

    run(main())


def test_concurrent_publishes_coalesce_into_one_request(tmp_path: Path) -> None:
    async def main() -> None:
        async with serve(tmp_path) as (broker, server), AsyncClient(addr(server)) as c:
            await c.declare_queue("q")
            results = await asyncio.gather(*(c.publish("", "q", f"m{i}") for i in range(50)))
            assert all(r.queues == ("q",) for r in results)
            assert c._publisher().requests == 1
            await c.publish_batch("", "q", [b"a", b"b"], headers={"x": "1"})
            assert c._publisher().requests == 2
            assert broker.queues.describe_queue("q").ready == 52
            got = await c.get("q", max_messages=100)
            assert [m.value for m in got[:3]] == [b"m0", b"m1", b"m2"]
            assert [m.offset for m in got] == sorted(m.offset for m in got)
            assert got[-1].headers == [("x", b"1")]

    run(main())


def test_prefetch_bounds_what_is_in_flight_and_acks_coalesce(tmp_path: Path) -> None:
    async def main() -> None:
        async with serve(tmp_path) as (broker, server), AsyncClient(addr(server)) as c:
            await c.declare_queue("work")
            await c.publish_batch("", "work", [f"job{i}" for i in range(20)])
            async with AsyncQueueConsumer(addr(server), "work", prefetch=5) as consumer:
                first = await _take(consumer, 5)
                assert await consumer.get(0.2) is None  # no more than prefetch unsettled
                status = broker.queues.describe_queue("work")
                assert (status.unacked, status.ready) == (5, 15)
                before = consumer.settle_requests
                await asyncio.gather(*(m.ack() for m in first))
                assert consumer.settle_requests == before + 1  # one loop turn, one request
                rest = await _take(consumer, 5)
                await consumer.ack_many(rest)
                assert [m.value for m in first + rest] == [f"job{i}".encode() for i in range(10)]
                with pytest.raises(UnknownDeliveryTagError, match="settled already"):
                    await first[0].ack()
            assert broker.queues.describe_queue("work").counters.acked == 10

    run(main())


def test_nack_requeues_and_reject_dead_letters(tmp_path: Path) -> None:
    async def main() -> None:
        async with serve(tmp_path) as (_, server), AsyncClient(addr(server)) as c:
            await c.declare_exchange("dlx", "fanout")
            await c.declare_queue("dead")
            await c.bind("dlx", "dead")
            await c.declare_queue("main", dead_letter_exchange="dlx")
            await c.publish_batch("", "main", [b"a", b"b"])
            async with AsyncQueueConsumer(addr(server), "main", prefetch=1) as consumer:
                (a,) = await _take(consumer, 1)
                await a.nack()  # requeue: delivered again, first
                (again,) = await _take(consumer, 1)
                assert (again.offset, again.delivery_count, again.redelivered) == (
                    a.offset,
                    2,
                    True,
                )
                await again.reject()
                (b,) = await _take(consumer, 1)
                assert b.value == b"b"
                await b.ack()
            (dead,) = await c.browse("dead")
            assert dead.value == b"a"
            assert dead.header("x-death") is not None
            with pytest.raises(UnknownDeliveryTagError, match="browsed"):
                await dead.ack()
            assert await c.replay("dead") == 1
            (back,) = await c.get("main", wait_ms=2_000)
            assert back.value == b"a"
            await back.ack()

    run(main())


def test_get_settle_and_visibility(tmp_path: Path) -> None:
    async def main() -> None:
        async with serve(tmp_path) as (_, server), AsyncClient(addr(server)) as c:
            await c.declare_queue("q")
            assert await c.get("q") == []
            await c.publish_batch("", "q", [b"1", b"2", b"3"])
            got = await c.get("q", max_messages=2)
            assert [m.value for m in got] == [b"1", b"2"]
            await c.settle("q", [got[0].delivery_tag], "ack")
            await got[1].nack()
            again = await c.get("q", max_messages=5)
            assert sorted(m.value for m in again) == [b"2", b"3"]
            with pytest.raises(UnknownDeliveryTagError, match="999"):
                await c.settle("q", [999], "ack")
            with pytest.raises(ValueError, match="outcome"):
                await c.settle("q", [1], "maybe")
            assert await c.purge_queue("q") == 0  # all held: none ready
            assert await c.delete_queue("q") >= 0

    run(main())


def test_a_long_poll_get_is_answered_by_a_publish(tmp_path: Path) -> None:
    async def main() -> None:
        async with serve(tmp_path) as (_, server), AsyncClient(addr(server)) as c:
            await c.declare_queue("q", durable=False)
            waiting = asyncio.create_task(c.get("q", wait_ms=20_000))
            async with AsyncClient(addr(server)) as other:
                await other.publish("", "q", b"late")
            (msg,) = await asyncio.wait_for(waiting, PROMPT_S)
            assert msg.value == b"late"

    run(main())


def test_redelivery_after_the_consumers_connection_drops(tmp_path: Path) -> None:
    async def main() -> None:
        async with serve(tmp_path) as (broker, server), AsyncClient(addr(server)) as c:
            await c.declare_queue("q")
            await c.publish_batch("", "q", [b"x", b"y"])
            async with AsyncQueueConsumer(addr(server), "q", prefetch=10) as consumer:
                taken = await _take(consumer, 2)
                await taken[0].ack()
                # The broker drops the consumer's connection (as a network failure would).
                for conn in list(server.connections):
                    if conn.queues.consumers:
                        conn.reset(quiet=True)
                (again,) = await _take(consumer, 1)
                assert (again.value, again.delivery_count, again.redelivered) == (b"y", 2, True)
                assert consumer.reconsumes == 1
                with pytest.raises(UnknownDeliveryTagError, match="lost"):
                    await taken[1].ack()  # taken over the lost connection
                await again.ack()
            status = broker.queues.describe_queue("q")
            assert (status.ready, status.unacked, status.counters.acked) == (0, 0, 2)

    run(main())


def test_a_get_held_by_a_closed_client_comes_back(tmp_path: Path) -> None:
    async def main() -> None:
        async with serve(tmp_path) as (broker, server):
            async with AsyncClient(addr(server)) as c:
                await c.declare_queue("q")
                await c.publish("", "q", b"held")
                (m,) = await c.get("q")
                assert m.value == b"held"
                assert broker.queues.describe_queue("q").unacked == 1
            async with AsyncClient(addr(server)) as c2:
                (m2,) = await c2.get("q", wait_ms=5_000)
                assert (m2.value, m2.delivery_count) == (b"held", 2)
                await m2.ack()

    run(main())


def test_errors(tmp_path: Path) -> None:
    async def main() -> None:
        async with serve(tmp_path) as (_, server), AsyncClient(addr(server)) as c:
            with pytest.raises(UnknownQueueError):
                await c.get("nope")
            with pytest.raises(UnknownQueueError):
                await c.declare_queue("nope", passive=True)
            with pytest.raises(UnknownExchangeError):
                await c.publish("nope", "k", b"v")
            await c.declare_exchange("x", "direct")
            with pytest.raises(UnroutableError):
                await c.publish("x", "nobody", b"v", mandatory=True)
            with pytest.raises(PreconditionFailedError):
                await c.declare_exchange("x", "fanout")
            await c.declare_queue("small", max_length=2)
            with pytest.raises(PreconditionFailedError):
                await c.declare_queue("small", max_length=3)
            await c.publish_batch("", "small", [b"1", b"2"])
            with pytest.raises(QueueFullError) as info:
                await c.publish("", "small", b"3")
            assert info.value.retriable
            with pytest.raises(InvalidQueueError):
                await c.declare_queue("amq.mine")
            with pytest.raises(UnknownQueueError):
                async with AsyncQueueConsumer(addr(server), "nope") as consumer:
                    await consumer.get(1)
            with pytest.raises(ValueError, match="prefetch=0"):
                AsyncQueueConsumer(addr(server), "small", prefetch=0)

    run(main())


def test_delayed_publish(tmp_path: Path) -> None:
    async def main() -> None:
        async with serve(tmp_path) as (broker, server), AsyncClient(addr(server)) as c:
            await c.declare_queue("later")
            await c.publish("", "later", b"soon", delay_ms=60_000)
            status = broker.queues.describe_queue("later")
            assert (status.ready, status.delayed) == (0, 1)
            assert await c.get("later") == []

    run(main())


def test_changes_to_queues_and_exchanges_are_audited(tmp_path: Path) -> None:
    # The queue manager records them; through the binary protocol, once each.
    async def main() -> None:
        async with serve(tmp_path) as (_, server), AsyncClient(addr(server)) as c:
            await c.declare_exchange("x", "fanout")
            await c.declare_queue("q")
            await c.declare_queue("q", passive=True)  # only looks: not recorded
            await c.bind("x", "q")
            with pytest.raises(UnknownQueueError):
                await c.purge_queue("nope")
            await c.unbind("x", "q")
            await c.delete_queue("q")
            await c.delete_exchange("x")
            got = [e for e in await c.describe_audit() if e.action != "authenticate"]
            assert [(e.action, e.outcome) for e in got] == [
                ("EXCHANGE_DECLARE", "ok"),
                ("QUEUE_DECLARE", "ok"),
                ("QUEUE_BIND", "ok"),
                ("QUEUE_PURGE", "failed"),
                ("QUEUE_UNBIND", "ok"),
                ("QUEUE_DELETE", "ok"),
                ("EXCHANGE_DELETE", "ok"),
            ]
            assert [e.resource for e in got[:6]] == [
                "exchange:x",
                "queue:q",
                "exchange:x -> queue:q",
                "queue:nope",
                "exchange:x -> queue:q",
                "queue:q",
            ]
            assert "nope" in got[3].reason

    run(main())
