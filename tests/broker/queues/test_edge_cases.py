"""Edge cases of the queue core, each once a way to lose, strand or duplicate a message:
TTL sweeps, replays that move nothing, delayed publishes under way, a publisher that goes
away, a failing queue among others, concurrent declares, a read that fails."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from pathlib import Path

from tests.broker.queues.test_manager import T0, Clock, Sink, batch, run
from tidewire.broker import Broker
from tidewire.broker.queues.model import QueueSpec
from tidewire.errors import PreconditionFailedError

#: The bound on anything that should happen at once (s), generous for a loaded machine.
PROMPT_S = 10.0


async def eventually(check: Callable[[], bool]) -> None:
    """Return once ``check()`` holds, yielding to the loop (fails after PROMPT_S)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + PROMPT_S
    while not check():
        assert loop.time() < deadline, "not within the time allowed"
        await asyncio.sleep(0.005)


def test_the_ttl_sweep_leaves_a_live_message_ready(tmp_path: Path) -> None:
    """Per-message TTL on the head, a live message behind it: the TTL sweep expires the head
    and leaves the live one ready."""

    async def body(broker: Broker, clock: Clock) -> None:
        qm = broker.queues
        await qm.declare_queue(QueueSpec("w"))
        await qm.publish("", "w", batch(b"short"), ttl_ms=100)
        await qm.publish("", "w", batch(b"live"))
        clock.now += 200
        await qm.tick()  # what the timer loop does every TTL_SWEEP_S
        await qm.wait_idle()
        sink = Sink()
        qm.consume("w", owner="c", prefetch=10, deliver=sink)
        await qm.wait_idle()
        assert (await qm.get("w", owner="g")).entries == ()  # nothing else is ready
        assert [e.offset for e in sink.entries()] == [1], "the live message is never delivered"

    run(tmp_path, body)


def test_the_queue_ttl_sweep_leaves_the_next_message_ready(tmp_path: Path) -> None:
    """Queue TTL: A published at t0, B at t0+500; the sweep at t0+1000 expires A, not B."""

    async def body(broker: Broker, clock: Clock) -> None:
        qm = broker.queues
        await qm.declare_queue(QueueSpec("w", message_ttl_ms=1000))
        await qm.publish("", "w", batch(b"A"))
        batch(b"B")
        from tidewire.records import BatchBuilder

        bb = BatchBuilder()
        bb.append(b"B", timestamp_ms=T0 + 500)
        await qm.publish("", "w", bb.build())
        clock.now = T0 + 1000
        await qm.tick()
        await qm.wait_idle()
        sink = Sink()
        qm.consume("w", owner="c", prefetch=10, deliver=sink)
        await qm.wait_idle()
        assert [e.offset for e in sink.entries()] == [1]

    run(tmp_path, body)


def test_a_replay_that_moves_nothing_delivers_each_message_once(tmp_path: Path) -> None:
    """A replay of messages that stay (no x-death) leaves them where they were: a consumer
    then gets each once."""

    async def body(broker: Broker, clock: Clock) -> None:
        qm = broker.queues
        await qm.declare_queue(QueueSpec("dlq"))
        await qm.publish("", "dlq", batch(b"a", b"b", b"c"))
        moved = await qm.replay("dlq")  # no x-death: all stay
        assert moved == 0
        sink = Sink()
        qm.consume("dlq", owner="c", prefetch=10, deliver=sink)
        await qm.wait_idle()
        offs = [e.offset for e in sink.entries()]
        assert sorted(offs) == [0, 1, 2], "each message delivered once"

    run(tmp_path, body)


def test_a_delayed_publish_is_not_delivered_while_its_append_awaits_fsync(tmp_path: Path) -> None:
    """Durable queue: a delayed publish whose append is reserved while another publish's
    fsync runs is not taken by the dispatch that publish's completion triggers."""

    async def body(broker: Broker, clock: Clock) -> None:
        qm = broker.queues
        await qm.declare_queue(QueueSpec("w", durable=True))
        sink = Sink()
        qm.consume("w", owner="c", prefetch=100, deliver=sink)
        p1 = asyncio.ensure_future(qm.publish("", "w", batch(b"now")))
        # let p1's write be drained and its fsync start, then publish the delayed one
        for _ in range(3):
            await asyncio.sleep(0)
        p2 = asyncio.ensure_future(
            qm.publish("", "w", batch(b"later"), deliver_at_ms=clock.now + 60_000)
        )
        await asyncio.gather(p1, p2)
        await qm.wait_idle()
        offs = [e.offset for e in sink.entries()]
        assert offs == [0], "the delayed message is not delivered before its time"

    run(tmp_path, body)


def test_a_consumer_arriving_during_a_delayed_publish_waits_for_the_delay(tmp_path: Path) -> None:
    """Durable queue: a consumer attaches while a delayed publish awaits its fsync (the
    offsets are already reserved: messages.end moved): it is not delivered before its time."""

    async def body(broker: Broker, clock: Clock) -> None:
        qm = broker.queues
        await qm.declare_queue(QueueSpec("w", durable=True))
        p = asyncio.ensure_future(
            qm.publish("", "w", batch(b"later"), deliver_at_ms=clock.now + 60_000)
        )
        await asyncio.sleep(0)  # the publish reserved its offset and awaits the fsync
        sink = Sink()
        qm.consume("w", owner="c", prefetch=100, deliver=sink)  # any wake of the queue will do
        await p
        await qm.wait_idle()
        offs = [e.offset for e in sink.entries()]
        await qm.settle("w", [e.tag for e in sink.entries()], "ack", owner="c")
        assert offs == [], "the delayed message is not delivered before its time"

    run(tmp_path, body)


def test_a_replay_that_moves_nothing_leaks_no_prefetch(tmp_path: Path) -> None:
    """After such a replay, the consumer's window counts exactly what it holds."""

    async def body(broker: Broker, clock: Clock) -> None:
        qm = broker.queues
        await qm.declare_queue(QueueSpec("dlq"))
        await qm.publish("", "dlq", batch(b"a", b"b", b"c"))
        await qm.replay("dlq")  # no x-death: all stay (unmove)
        sink = Sink()
        qm.consume("dlq", owner="c", prefetch=6, deliver=sink)
        await qm.wait_idle()
        q = qm._queues["dlq"]
        assert [e.offset for e in sink.entries()] == [0, 1, 2]
        tags = [e.tag for e in sink.entries()]
        await qm.settle("dlq", tags, "ack", owner="c")
        await qm.publish("", "dlq", batch(b"d", b"e", b"f", b"g"))
        await qm.wait_idle()
        assert q.consumers[0].held == len(q.held) == 4

    run(tmp_path, body)


def test_a_cancelled_publish_keeps_its_delay(tmp_path: Path) -> None:
    """A publish cancelled while its append awaits the fsync (the producer's connection
    closed: the server cancels its request tasks) still records its delay: the message is
    not delivered before its time."""

    async def body(broker: Broker, clock: Clock) -> None:
        qm = broker.queues
        await qm.declare_queue(QueueSpec("w", durable=True))
        sink = Sink()
        qm.consume("w", owner="c", prefetch=10, deliver=sink)
        p = asyncio.ensure_future(
            qm.publish("", "w", batch(b"in an hour"), deliver_at_ms=clock.now + 3_600_000)
        )
        for _ in range(3):
            await asyncio.sleep(0)
        p.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await p
        await eventually(lambda: qm.describe_queue("w").counters.published == 1)
        await qm.wait_idle()
        assert not sink.entries(), "a message delayed by an hour is not delivered now"

    run(tmp_path, body)


def test_one_failing_queue_stops_no_other_timer(tmp_path: Path) -> None:
    """An exception out of one queue's tick (here: its state log refusing the COUNTS write of a
    visibility-timeout requeue) is logged; the timers of the other queues go on."""
    from tidewire.errors import StorageError

    async def body(broker: Broker, clock: Clock) -> None:
        qm = broker.queues
        await qm.declare_queue(QueueSpec("a", durable=True))
        await qm.declare_queue(QueueSpec("b"))
        await qm.publish("", "a", batch(b"x"))
        d = await qm.get("a", owner="g", visibility_timeout_ms=10)
        assert d.entries
        qa = qm._queues["a"]

        async def failing_write(*a, **k):
            raise StorageError("disk full")

        qa.state.write = failing_write
        await qm.publish("", "b", batch(b"later"), deliver_at_ms=clock.now + 50)
        clock.now += 100
        qm._timer_added.set()
        await eventually(lambda: qm.describe_queue("b").delayed == 0)
        assert not broker._queue_task.done()

    run(tmp_path, body)


def test_concurrent_declares_store_the_winning_settings(tmp_path: Path) -> None:
    from tests.broker._support import config

    async def main() -> None:
        clock = Clock()
        broker = Broker(config(tmp_path))
        broker.queue_clock = clock
        async with broker:
            qm = broker.queues
            a = QueueSpec("w", durable=True, max_deliveries=3)
            b = QueueSpec("w", durable=True, max_deliveries=0, message_ttl_ms=5)
            r = await asyncio.gather(
                qm.declare_queue(a), qm.declare_queue(b), return_exceptions=True
            )
            assert isinstance(r[1], PreconditionFailedError)
            assert qm.describe_queue("w").spec == a
        broker = Broker(config(tmp_path))
        broker.queue_clock = clock
        async with broker:
            spec = broker.queues.describe_queue("w").spec
            assert spec == a, "the queue comes back as it was declared"

    asyncio.run(main())


def test_a_failed_read_leaves_the_messages_ready(tmp_path: Path) -> None:
    """A delivery whose read fails holds nothing: its messages stay ready and the healthy ones
    are delivered once the read succeeds."""
    from tidewire.errors import PartitionCorruptError

    async def body(broker: Broker, clock: Clock) -> None:
        qm = broker.queues
        await qm.declare_queue(QueueSpec("w", durable=True))
        await qm.publish("", "w", batch(b"bad"))
        await qm.publish("", "w", batch(b"good1", b"good2"))
        q = qm._queues["w"]
        real = q.messages.read

        def read(offset, max_bytes):
            if offset == 0:
                raise PartitionCorruptError("crc mismatch", damage_start=0, damage_end=1)
            return real(offset, max_bytes)

        q.messages.read = read
        sink = Sink()
        qm.consume("w", owner="c", prefetch=10, deliver=sink)
        await qm.wait_idle()
        q.messages.read = real  # even once the disk reads fine again
        await qm.publish("", "w", batch(b"later"))
        await qm.wait_idle()
        assert {e.offset for e in sink.entries()} >= {1, 2}, "healthy messages are delivered"

    run(tmp_path, body)
