"""The queue core through a real broker over a temporary directory, with a fake clock:
routing, prefetch, settling, redelivery, dead letters, TTL, delay, visibility timeouts,
length limits, replay, restarts and the compaction of the state log. No test sleeps: time
moves by setting the clock and calling ``tick()``."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from tests.broker._support import config
from tidewire.broker import Broker
from tidewire.broker.queues import store
from tidewire.broker.queues.model import Binding, Delivery, ExchangeSpec, QueueSpec
from tidewire.errors import (
    PreconditionFailedError,
    QueueFullError,
    QueueLockedError,
    UnknownDeliveryTagError,
    UnknownQueueError,
    UnroutableError,
)
from tidewire.records import BatchBuilder, iter_batches, iter_records

T0 = 1_800_000_000_000


class Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> int:
        return self.now


def batch(*values: bytes, key: str = "", headers: list[tuple[str, bytes]] | None = None) -> bytes:
    b = BatchBuilder()
    for v in values:
        b.append(v, timestamp_ms=T0, key=key.encode() if key else None, headers=headers or [])
    return b.build()


def messages(d: Delivery) -> list[tuple[int, int, bytes, dict[str, bytes | None]]]:
    """``(offset, delivery_count, value, headers)`` of a delivery's entries."""
    wanted = {e.offset: e for e in d.entries}
    out = []
    for pos, h in iter_batches(d.data):
        for r in iter_records(d.data[pos : pos + h.size]):
            if r.offset in wanted:
                out.append(
                    (r.offset, wanted[r.offset].delivery_count, r.value or b"", dict(r.headers))
                )
    assert [m[0] for m in out] == sorted(wanted), "every entry's record is in the data"
    return out


def run(
    tmp_path: Path, body: Callable[[Broker, Clock], Awaitable[None]], clock: Clock | None = None
) -> None:
    clock = clock or Clock()

    async def main() -> None:
        broker = Broker(config(tmp_path))
        broker.queue_clock = clock
        async with broker:
            await body(broker, clock)

    asyncio.run(main())


class Sink:
    """A push consumer's deliveries."""

    def __init__(self) -> None:
        self.got: list[Delivery] = []

    def __call__(self, d: Delivery) -> None:
        self.got.append(d)

    def entries(self) -> list[Any]:
        return [e for d in self.got for e in d.entries]


def test_default_exchange_prefetch_and_ack(tmp_path: Path) -> None:
    async def body(broker: Broker, clock: Clock) -> None:
        qm = broker.queues
        await qm.declare_queue(QueueSpec("work"))
        r = await qm.publish("", "work", batch(*(b"m%d" % i for i in range(10))))
        assert r.queues == ("work",)
        sink = Sink()
        qm.consume("work", owner="c1", prefetch=3, deliver=sink)
        await broker.queues.wait_idle()
        assert [e.offset for e in sink.entries()] == [0, 1, 2]
        st = qm.describe_queue("work")
        assert (st.ready, st.unacked) == (7, 3)
        await qm.settle("work", [sink.entries()[0].tag], "ack", owner="c1")
        await broker.queues.wait_idle()
        assert [e.offset for e in sink.entries()] == [0, 1, 2, 3]
        # ack of many at once: every tag up to the newest
        await qm.settle("work", [], "ack", owner="c1", up_to=max(e.tag for e in sink.entries()))
        await broker.queues.wait_idle()
        st = qm.describe_queue("work")
        assert st.counters.acked == 4
        assert st.unacked == 3
        assert st.ready == 3
        # another connection cannot settle c1's deliveries
        with pytest.raises(UnknownDeliveryTagError, match="not held by this connection"):
            await qm.settle("work", [sink.entries()[-1].tag], "ack", owner="other")

    run(tmp_path, body)


def test_competing_consumers_share_and_a_lost_consumer_is_redelivered_first(tmp_path: Path) -> None:
    async def body(broker: Broker, clock: Clock) -> None:
        qm = broker.queues
        await qm.declare_queue(QueueSpec("work"))
        a, b = Sink(), Sink()
        qm.consume("work", owner="A", prefetch=2, deliver=a)
        qm.consume("work", owner="B", prefetch=2, deliver=b)
        await qm.publish("", "work", batch(*(b"%d" % i for i in range(6))))
        await broker.queues.wait_idle()
        assert len(a.entries()) == 2
        assert len(b.entries()) == 2
        held_by_a = sorted(e.offset for e in a.entries())
        qm.connection_closed("A")
        await broker.queues.wait_idle()
        # A's two come back before the two never delivered, to B as it frees room
        await qm.settle("work", [e.tag for e in b.entries()], "ack", owner="B")
        await broker.queues.wait_idle()
        nxt = b.entries()[2:]
        assert [e.offset for e in nxt] == held_by_a
        assert all(e.delivery_count == 2 for e in nxt)
        assert qm.describe_queue("work").counters.redelivered == 2

    run(tmp_path, body)


def test_nack_requeue_then_max_deliveries_dead_letters_with_x_death(tmp_path: Path) -> None:
    async def body(broker: Broker, clock: Clock) -> None:
        qm = broker.queues
        await qm.declare_exchange(ExchangeSpec("dlx", "fanout"))
        await qm.declare_queue(QueueSpec("dead"))
        await qm.bind(Binding("dlx", "dead"))
        await qm.declare_queue(QueueSpec("work", max_deliveries=2, dead_letter_exchange="dlx"))
        await qm.publish("", "work", batch(b"poison", key="work"))
        for n in (1, 2):
            d = await qm.get("work", owner="c")
            assert [e.delivery_count for e in d.entries] == [n]
            await qm.settle("work", [d.entries[0].tag], "requeue", owner="c")
        await broker.queues.wait_idle()
        assert qm.describe_queue("work").unacked == 0
        assert (await qm.get("work", owner="c")).entries == ()
        dl = qm.browse("dead")
        [(_, _, value, headers)] = messages(dl)
        assert value == b"poison"
        death = json.loads(headers["x-death"] or b"")
        assert death[0]["queue"] == "work"
        assert death[0]["reason"] == "delivery_limit"
        assert death[0]["count"] == 1
        assert death[0]["delivery_count"] == 2
        assert headers["x-first-death-reason"] == b"delivery_limit"
        st = qm.describe_queue("work")
        assert st.counters.dead_lettered == 1
        assert st.ready == 0

    run(tmp_path, body)


def test_reject_dead_letters_and_replay_moves_it_back(tmp_path: Path) -> None:
    async def body(broker: Broker, clock: Clock) -> None:
        qm = broker.queues
        await qm.declare_queue(QueueSpec("dead"))
        await qm.declare_queue(QueueSpec("work", dead_letter_exchange=""))
        await qm.declare_queue(
            QueueSpec("work2", dead_letter_exchange="", dead_letter_routing_key="dead")
        )
        # the default exchange as dead-letter exchange routes by the routing key: "dead"
        await qm.publish("", "work2", batch(b"a", b"b", key="work2"))
        d = await qm.get("work2", owner="c", max_messages=2)
        await qm.settle("work2", [e.tag for e in d.entries], "dead-letter", owner="c")
        await broker.queues.wait_idle()
        browsed = messages(qm.browse("dead"))
        assert [m[2] for m in browsed] == [b"a", b"b"]
        assert json.loads(browsed[0][3]["x-death"] or b"")[0]["reason"] == "rejected"
        moved = await qm.replay("dead", offsets=[browsed[0][0]])
        assert moved == 1
        assert [m[2] for m in messages(qm.browse("work2"))] == [b"a"]
        assert [m[2] for m in messages(qm.browse("dead"))] == [b"b"]
        assert await qm.replay("dead") == 1
        assert qm.describe_queue("dead").ready == 0
        assert await qm.purge_queue("work2") == 2

    run(tmp_path, body)


def test_queue_ttl_expires_and_dead_letters_never_delivering(tmp_path: Path) -> None:
    async def body(broker: Broker, clock: Clock) -> None:
        qm = broker.queues
        await qm.declare_queue(QueueSpec("dead"))
        await qm.declare_queue(
            QueueSpec(
                "work", message_ttl_ms=1000, dead_letter_exchange="", dead_letter_routing_key="dead"
            )
        )
        await qm.publish("", "work", batch(b"old"))  # timestamp T0
        clock.now = T0 + 999
        await qm.tick()
        assert qm.describe_queue("work").ready == 1
        clock.now = T0 + 1000
        d = await qm.get("work", owner="c")  # due now: expired at the head, not delivered
        assert d.entries == ()
        await broker.queues.wait_idle()
        st = qm.describe_queue("work")
        assert st.counters.expired == 1
        assert st.ready == 0
        assert (
            json.loads(messages(qm.browse("dead"))[0][3]["x-death"] or b"")[0]["reason"]
            == "expired"
        )

    run(tmp_path, body)


def test_per_message_ttl_and_delay_due_within_one_tick(tmp_path: Path) -> None:
    async def body(broker: Broker, clock: Clock) -> None:
        qm = broker.queues
        await qm.declare_queue(QueueSpec("work"))
        await qm.publish("", "work", batch(b"later"), deliver_at_ms=T0 + 5000)
        await qm.publish("", "work", batch(b"short"), ttl_ms=100)
        sink = Sink()
        qm.consume("work", owner="c", prefetch=10, deliver=sink)
        await broker.queues.wait_idle()
        assert [e.offset for e in sink.entries()] == [1]  # the delayed one waits
        await qm.settle("work", [sink.entries()[0].tag], "ack", owner="c")
        clock.now = T0 + 4999
        await qm.tick()
        await broker.queues.wait_idle()
        assert len(sink.entries()) == 1
        assert qm.describe_queue("work").delayed == 1
        clock.now = T0 + 5000
        await qm.tick()
        await broker.queues.wait_idle()
        assert [e.offset for e in sink.entries()] == [1, 0]
        # a message whose own TTL passed is never delivered
        qm.cancel("work", sink.got[0].consumer)
        await broker.queues.wait_idle()
        await qm.publish("", "work", batch(b"gone"), ttl_ms=10)
        clock.now += 10
        d = await qm.get("work", owner="x", max_messages=5)
        assert [e.offset for e in d.entries] == [0]  # the cancelled consumer's, not "gone"
        await broker.queues.wait_idle()
        assert qm.describe_queue("work").counters.expired == 1

    run(tmp_path, body)


def test_visibility_timeout_takes_a_get_back(tmp_path: Path) -> None:
    async def body(broker: Broker, clock: Clock) -> None:
        qm = broker.queues
        await qm.declare_queue(QueueSpec("work"))
        await qm.publish("", "work", batch(b"x"))
        d = await qm.get("work", owner="http", visibility_timeout_ms=30_000)
        clock.now += 29_999
        await qm.tick()
        assert qm.describe_queue("work").unacked == 1
        clock.now += 1
        await qm.tick()
        d2 = await qm.get("work", owner="other")
        assert [e.delivery_count for e in d2.entries] == [2]
        with pytest.raises(UnknownDeliveryTagError):
            await qm.settle("work", [d.entries[0].tag], "ack", owner="http")
        await qm.settle("work", [d2.entries[0].tag], "ack", owner="other")
        assert qm.describe_queue("work").counters.acked == 1

    run(tmp_path, body)


def test_long_poll_get_is_woken_by_a_publish(tmp_path: Path) -> None:
    async def body(broker: Broker, clock: Clock) -> None:
        qm = broker.queues
        await qm.declare_queue(QueueSpec("work"))
        waiting = asyncio.ensure_future(qm.get("work", owner="c", wait_ms=30_000))
        await broker.queues.wait_idle()
        assert not waiting.done()
        await qm.publish("", "work", batch(b"hello"))
        d = await asyncio.wait_for(waiting, 5)
        assert [m[2] for m in messages(d)] == [b"hello"]
        assert (await qm.get("work", owner="c", wait_ms=1)).entries == ()

    run(tmp_path, body)


def test_length_limits_reject_publish_and_drop_head(tmp_path: Path) -> None:
    async def body(broker: Broker, clock: Clock) -> None:
        qm = broker.queues
        await qm.declare_queue(QueueSpec("capped", max_length=2))
        await qm.publish("", "capped", batch(b"1", b"2"))
        with pytest.raises(QueueFullError, match="max_length=2"):
            await qm.publish("", "capped", batch(b"3"))
        assert qm.describe_queue("capped").ready == 2
        await qm.declare_queue(QueueSpec("dead"))
        await qm.declare_queue(
            QueueSpec(
                "rolling",
                max_length=2,
                overflow="drop-head",
                dead_letter_exchange="",
                dead_letter_routing_key="dead",
            )
        )
        await qm.publish("", "rolling", batch(b"1", b"2", b"3"))
        await broker.queues.wait_idle()
        assert [m[2] for m in messages(qm.browse("rolling"))] == [b"2", b"3"]
        assert [m[2] for m in messages(qm.browse("dead"))] == [b"1"]
        assert (
            json.loads(messages(qm.browse("dead"))[0][3]["x-death"] or b"")[0]["reason"] == "maxlen"
        )

    run(tmp_path, body)


def test_exchanges_route_to_queues_and_topics(tmp_path: Path) -> None:
    async def body(broker: Broker, clock: Clock) -> None:
        qm = broker.queues
        await qm.declare_exchange(ExchangeSpec("events", "topic"))
        await qm.declare_queue(QueueSpec("eu"))
        await qm.declare_queue(QueueSpec("all"))
        broker.create_topic("audit-trail", 1)
        await qm.bind(Binding("events", "eu", key="order.eu.*"))
        await qm.bind(Binding("events", "all", key="order.#"))
        await qm.bind(Binding("events", "audit-trail", destination_kind="topic", key="#"))
        r = await qm.publish("events", "order.eu.created", batch(b"o1", key="order.eu.created"))
        assert sorted(r.queues) == ["all", "eu"]
        assert r.topics[0][0] == "audit-trail"
        r = await qm.publish("events", "order.us.created", batch(b"o2"))
        assert r.queues == ("all",)
        assert broker.high_watermark("audit-trail", 0) == 2
        assert (await qm.publish("", "nowhere", batch(b"x"))).unroutable
        with pytest.raises(UnroutableError, match="mandatory"):
            await qm.publish("", "nowhere", batch(b"x"), mandatory=True)
        with pytest.raises(PreconditionFailedError, match="max_length"):
            await qm.declare_queue(QueueSpec("eu", max_length=5))
        with pytest.raises(UnknownQueueError):
            await qm.get("missing", owner="c")

    run(tmp_path, body)


def test_exclusive_queue_belongs_to_its_connection(tmp_path: Path) -> None:
    async def body(broker: Broker, clock: Clock) -> None:
        qm = broker.queues
        await qm.declare_queue(QueueSpec("mine", durable=False, exclusive=True), owner="c1")
        with pytest.raises(QueueLockedError):
            await qm.get("mine", owner="c2")
        qm.connection_closed("c1")
        await broker.queues.wait_idle()
        with pytest.raises(UnknownQueueError):
            qm.describe_queue("mine")
        await qm.declare_queue(QueueSpec("auto", durable=False, auto_delete=True))
        qm.consume("auto", owner="c3", prefetch=1, deliver=Sink(), consumer_tag="t")
        qm.cancel("auto", "t")
        await broker.queues.wait_idle()
        assert "auto" not in [s.spec.name for s in qm.queues()]

    run(tmp_path, body)


def test_restart_keeps_unsettled_durable_messages_and_forgets_transient_ones(
    tmp_path: Path,
) -> None:
    clock = Clock()

    async def first(broker: Broker, clock: Clock) -> None:
        qm = broker.queues
        await qm.declare_exchange(ExchangeSpec("fan", "fanout"))
        await qm.declare_queue(QueueSpec("durable"))
        await qm.declare_queue(QueueSpec("transient", durable=False))
        await qm.bind(Binding("fan", "durable"))
        await qm.bind(Binding("fan", "transient"))
        await qm.publish("fan", "", batch(*(b"%d" % i for i in range(5))))
        await qm.publish("fan", "", batch(b"later"), deliver_at_ms=T0 + 60_000)
        d = await qm.get("durable", owner="c", max_messages=3)
        await qm.settle("durable", [d.entries[0].tag, d.entries[2].tag], "ack", owner="c")
        d2 = await qm.get("durable", owner="c")  # unacked at the "crash"
        await qm.settle("durable", [d2.entries[0].tag], "requeue", owner="c")
        await qm.get("durable", owner="c")

    async def second(broker: Broker, clock: Clock) -> None:
        qm = broker.queues
        assert [s.spec.name for s in qm.queues()] == ["durable"]
        assert [b.destination for b in qm.bindings(exchange="fan")] == ["durable"]
        st = qm.describe_queue("durable")
        assert (st.ready, st.unacked, st.delayed) == (3, 0, 1)
        d = await qm.get("durable", owner="c", max_messages=10)
        got = {o: (c, v) for o, c, v, _ in messages(d)}
        # held at the clean stop: those deliveries count
        assert got == {1: (2, b"1"), 3: (3, b"3"), 4: (1, b"4")}
        clock.now = T0 + 60_000
        await qm.tick()
        assert [m[2] for m in messages(await qm.get("durable", owner="c"))] == [b"later"]

    run(tmp_path, first, clock)
    run(tmp_path, second, clock)


def test_settled_segments_go_and_the_state_log_is_compacted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(store, "MESSAGE_SEGMENT_BYTES", 4096)
    monkeypatch.setattr(store, "STATE_SEGMENT_BYTES", 1024)
    clock = Clock()

    async def first(broker: Broker, clock: Clock) -> None:
        qm = broker.queues
        await qm.declare_queue(QueueSpec("work"))
        for _i in range(200):
            await qm.publish("", "work", batch(b"x" * 100))
        for _ in range(190):
            d = await qm.get("work", owner="c")
            await qm.settle("work", [d.entries[0].tag], "ack", owner="c")
            await qm._queues["work"].upkeep()
        logs = broker.logs.logs
        msgs, state = logs[(store.queue_topic("work"), 0)], logs[(store.queue_topic("work"), 1)]
        assert msgs.log_start_offset > 100
        assert state.segment_count < store.COMPACT_SEGMENTS + 1

    async def second(broker: Broker, clock: Clock) -> None:
        st = broker.queues.describe_queue("work")
        assert st.ready == 10
        d = await broker.queues.get("work", owner="c", max_messages=20)
        assert [e.offset for e in d.entries] == list(range(190, 200))

    run(tmp_path, first, clock)
    run(tmp_path, second, clock)


def test_a_cancelled_long_poll_leaves_nothing_held(tmp_path: Path) -> None:
    async def body(broker: Broker, clock: Clock) -> None:
        qm = broker.queues
        await qm.declare_queue(QueueSpec("work"))
        waiting = asyncio.ensure_future(qm.get("work", owner="c", wait_ms=30_000))
        await qm.wait_idle()
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting
        await qm.publish("", "work", batch(b"x"))
        await qm.wait_idle()
        st = qm.describe_queue("work")
        assert (st.ready, st.unacked) == (1, 0)
        assert len((await qm.get("work", owner="d")).entries) == 1

    run(tmp_path, body)


def test_administrative_operations_are_audited(tmp_path: Path) -> None:
    async def body(broker: Broker, clock: Clock) -> None:
        qm = broker.queues
        audit = broker.audit
        assert audit is not None
        await qm.declare_exchange(ExchangeSpec("ex", "direct"))
        await qm.declare_queue(QueueSpec("q"))
        await qm.declare_queue(QueueSpec("q"), passive=True)
        await qm.bind(Binding("ex", "q", key="k"))
        with pytest.raises(UnknownQueueError):
            await qm.delete_queue("missing")
        await qm.purge_queue("q")
        await qm.declare_exchange(ExchangeSpec("gone", "fanout"))
        await qm.delete_exchange("gone")
        events = [(e.action, e.resource, e.outcome) for e in await audit.query()]
        assert ("EXCHANGE_DECLARE", "exchange:ex", "ok") in events
        assert ("QUEUE_DECLARE", "queue:q", "ok") in events
        assert ("QUEUE_BIND", "exchange:ex -> queue:q", "ok") in events
        assert ("QUEUE_DELETE", "queue:missing", "failed") in events
        assert ("QUEUE_PURGE", "queue:q", "ok") in events
        assert ("EXCHANGE_DELETE", "exchange:gone", "ok") in events
        assert [a for a, r, _ in events if r == "queue:q"].count("QUEUE_DECLARE") == 1

    run(tmp_path, body)


def test_ack_up_to_follows_the_order_of_delivery(tmp_path: Path) -> None:
    """As AMQP's ack ``multiple``: every delivery up to and including the tag's, in the order
    they were handed out, not by offset (a redelivery of an older message comes later)."""

    async def body(broker: Broker, clock: Clock) -> None:
        qm = broker.queues
        await qm.declare_queue(QueueSpec("work"))
        await qm.publish("", "work", batch(b"0", b"1", b"2"))
        first = await qm.get("work", owner="c", max_messages=3)
        await qm.settle("work", [first.entries[0].tag], "requeue", owner="c")
        again = await qm.get("work", owner="c")  # offset 0 again: delivered after 1 and 2
        assert [e.offset for e in again.entries] == [0]
        await qm.settle("work", [], "ack", owner="c", up_to=first.entries[2].tag)
        st = qm.describe_queue("work")
        assert (st.counters.acked, st.unacked) == (2, 1)
        with pytest.raises(UnknownDeliveryTagError):
            await qm.settle("work", [], "ack", owner="other", up_to=again.entries[0].tag)
        await qm.settle("work", [], "ack", owner="c", up_to=again.entries[0].tag)
        assert qm.describe_queue("work").counters.acked == 3

    run(tmp_path, body)
