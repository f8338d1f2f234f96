"""Push delivery against a real server on port 0: order and completeness from an offset, the
credit bound (bytes received before a grant), the oversized-batch rule, a slow subscriber
beside a fast producer (memory held within credit plus one batch, the producer not slowed,
lag draining to 0), best-effort drops counted exactly, resuming after a lost connection, and
the per-connection bounds."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from tests.client._support import PROMPT_S, addr, broker_at, in_thread, listening, run, serve
from tidewire.broker import Broker
from tidewire.client import (
    AsyncClient,
    AsyncGroupConsumer,
    AsyncSubscriber,
    ConsumerRecord,
    Message,
    Subscriber,
)
from tidewire.client._transport import Transport
from tidewire.errors import BackpressureError, InvalidRequestError
from tidewire.observability import logs
from tidewire.protocol import PushReceived
from tidewire.protocol.messages import (
    ApiKey,
    CreditRequest,
    PushBody,
    SubscribePartition,
    SubscribeRequest,
    SubscribeResponse,
    UnsubscribeRequest,
    decode_body,
)
from tidewire.records import iter_batches
from tidewire.server import TcpServer, push
from tidewire.server.push import Subscription

TOPIC = "events"


async def produce(c: AsyncClient, batches: int, per_batch: int = 10, size: int = 100) -> None:
    for b in range(batches):
        await c.produce(
            TOPIC,
            0,
            [Message(f"{b}:{i}:".encode().ljust(size, b"x")) for i in range(per_batch)],
        )


def only_subscription(server: TcpServer) -> Subscription:
    subs = [s for c in server.connections for s in c.subscriptions.subs.values()]
    assert len(subs) == 1, subs
    return subs[0]


async def until(cond: object, what: str) -> None:
    async def wait() -> None:
        while not cond():  # type: ignore[operator]
            await asyncio.sleep(0.001)

    try:
        await asyncio.wait_for(wait(), PROMPT_S)
    except TimeoutError:
        raise AssertionError(f"not within {PROMPT_S} s: {what}") from None


def batch_sizes(broker: Broker) -> list[int]:
    data = broker.read_partition(TOPIC, 0, 0, 1 << 30).data
    return [h.size for _, h in iter_batches(data, verify=False)]


async def take(sub: AsyncSubscriber, n: int) -> list[ConsumerRecord]:
    out: list[ConsumerRecord] = []
    while len(out) < n:
        out += await asyncio.wait_for(sub.poll(None, max_records=n - len(out)), PROMPT_S)
    return out


def test_delivers_in_order_from_an_offset_then_as_appended(tmp_path: Path) -> None:
    async def main() -> None:
        async with serve(tmp_path) as (_, server), AsyncClient(addr(server)) as c:
            await c.create_topic(TOPIC, 1)
            await produce(c, 30)  # 300 records
            async with AsyncSubscriber(addr(server), credit_bytes=4096) as sub:
                await sub.subscribe([(TOPIC, 0, 137)])
                first = await take(sub, 300 - 137)
                assert [r.offset for r in first] == list(range(137, 300))
                await produce(c, 5)  # caught up: these come through the append wake-ups
                more = await take(sub, 50)
                assert [r.offset for r in more] == list(range(300, 350))
                assert more[0].value is not None
                assert more[0].value.startswith(b"0:0:")
                assert sub.position(TOPIC, 0) == 350

    run(main())


def test_never_sends_more_than_the_credit_before_a_grant(tmp_path: Path) -> None:
    async def main() -> None:
        async with serve(tmp_path) as (broker, server), AsyncClient(addr(server)) as c:
            await c.create_topic(TOPIC, 1)
            await produce(c, 20)
            sizes = batch_sizes(broker)
            credit = int(sizes[0] * 3.5)
            fits, total = 0, 0
            while total + sizes[fits] <= credit:
                total += sizes[fits]
                fits += 1
            async with AsyncSubscriber(addr(server), credit_bytes=credit) as sub:
                await sub.subscribe([(TOPIC, 0, 0)])
                # Take nothing: no grant goes out, so this is all the broker may send.
                await until(lambda: sub.stats.received == total, f"{total} bytes received")
                s = only_subscription(server)
                await until(lambda: s.stats.sent == total, "the broker's count")
                for _ in range(20):
                    await asyncio.sleep(0)
                assert sub.stats.received == s.stats.sent == total <= credit
                assert sub.stats.granted == 0
                assert s.credit < sizes[fits]  # blocked: the next batch does not fit
                got = await take(sub, 200)  # taking grants credit back: the rest comes
                assert [r.offset for r in got] == list(range(200))
                assert s.stats.peak_in_flight <= credit
                assert sub.stats.peak_buffered <= credit

    run(main())


def test_a_batch_larger_than_the_whole_credit_goes_alone(tmp_path: Path) -> None:
    async def main() -> None:
        async with serve(tmp_path) as (broker, server), AsyncClient(addr(server)) as c:
            await c.create_topic(TOPIC, 1)
            await produce(c, 5)
            largest = max(batch_sizes(broker))
            async with AsyncSubscriber(addr(server), credit_bytes=100) as sub:
                await sub.subscribe([(TOPIC, 0, 0)])
                await until(lambda: sub.stats.frames == 1, "one frame")
                s = only_subscription(server)
                for _ in range(20):
                    await asyncio.sleep(0)
                assert s.stats.frames == 1  # one batch, then nothing
                assert s.credit < 0
                got = await take(sub, 50)
                assert [r.offset for r in got] == list(range(50))
                assert s.stats.peak_in_flight <= 100 + largest
                assert s.stats.largest_frame == largest

    run(main())


def test_credit_for_small_pushes_goes_back_in_quarters_of_the_window(tmp_path: Path) -> None:
    """Pushes taken one at a time are not each given back: the grant waits for a quarter of
    the window (one request for many pushes), then carries all that was taken."""

    async def main() -> None:
        async with serve(tmp_path) as (_, server), AsyncClient(addr(server)) as c:
            await c.create_topic(TOPIC, 1)
            async with AsyncSubscriber(addr(server), credit_bytes=16 * 1024) as sub:
                await sub.subscribe([(TOPIC, 0, 0)])
                s = only_subscription(server)
                quarter = 4 * 1024
                taken = 0
                while sub.stats.received < quarter:  # one batch of 1 KB at a time
                    assert sub.stats.granted == 0
                    await produce(c, 1, per_batch=1, size=1000)
                    got = await take(sub, 1)
                    taken += len(got)
                assert taken >= 4
                await until(lambda: s.stats.granted > 16 * 1024, "a grant")
                assert sub.stats.granted == sub.stats.received  # all that was taken at once
                assert s.stats.asks == 0

    run(main())


def test_a_batch_waiting_for_credit_asks_for_what_was_taken(tmp_path: Path) -> None:
    """Small grants held back (under a quarter) would keep a batch larger than the credit left
    waiting for ever: the broker asks once, and the subscriber gives back what it took (at
    once when it holds nothing, else when the last record held is taken)."""

    async def main() -> None:
        async with serve(tmp_path) as (_, server), AsyncClient(addr(server)) as c:
            await c.create_topic(TOPIC, 1)
            async with AsyncSubscriber(addr(server), credit_bytes=64 * 1024) as sub:
                await sub.subscribe([(TOPIC, 0, 0)])
                s = only_subscription(server)
                await produce(c, 1, per_batch=1, size=1000)
                assert len(await take(sub, 1)) == 1  # taken, not given back (under a quarter)
                await produce(c, 1, per_batch=1, size=1000)
                await until(lambda: sub.stats.received > 1000, "a second push")  # held
                await produce(c, 1, per_batch=1, size=63 * 1024)  # over the credit left
                await until(lambda: s.stats.asks == 1, "the broker asks")
                for _ in range(20):
                    await asyncio.sleep(0)
                assert s.stats.asks == 1  # once a wait
                assert sub.stats.granted == 0  # one record is still held
                got = await take(sub, 2)  # the held one, then the big batch, sent alone
                assert [r.offset for r in got] == [1, 2]
                assert got[1].value is not None
                assert len(got[1].value) == 63 * 1024
                # Again, holding nothing: the ask is answered from the push's read.
                await produce(c, 1, per_batch=1, size=1000)
                assert [r.offset for r in await take(sub, 1)] == [3]
                await produce(c, 1, per_batch=1, size=63 * 1024)
                got = await take(sub, 1)
                assert [r.offset for r in got] == [4]
                assert s.stats.asks == 2

    run(main())


def test_an_earlier_server_that_never_asks_gets_credit_back_at_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A server that does not say it asks for credit (an earlier version) gets every byte
    back as soon as the subscriber holds nothing: a batch larger than the credit left never
    waits."""

    async def main() -> None:
        real = push.Subscriptions._subscribe

        def earlier(self: push.Subscriptions, req: SubscribeRequest) -> SubscribeResponse:
            response = real(self, req)
            response.asks_for_credit = False
            return response

        monkeypatch.setattr(push.Subscriptions, "_subscribe", earlier)
        async with serve(tmp_path) as (_, server), AsyncClient(addr(server)) as c:
            await c.create_topic(TOPIC, 1)
            async with AsyncSubscriber(addr(server), credit_bytes=64 * 1024) as sub:
                await sub.subscribe([(TOPIC, 0, 0)])
                for i in range(3):
                    await produce(c, 1, per_batch=1, size=1000)
                    assert [r.offset for r in await take(sub, 1)] == [i]
                    await until(lambda: sub.stats.granted == sub.stats.received, "a grant")

    run(main())


async def _produce_timed(c: AsyncClient, batches: int) -> float:
    t0 = time.perf_counter()
    await produce(c, batches, per_batch=10, size=1000)
    return time.perf_counter() - t0


def test_slow_subscriber_beside_a_fast_producer(tmp_path: Path) -> None:
    """100 msg/s against a producer at full speed: what the broker holds for the subscriber
    stays within the credit plus one batch, the producer runs as fast as without it, and the
    lag drains to 0 once the subscriber speeds up."""

    async def main() -> None:
        credit = 64 * 1024
        async with serve(tmp_path) as (broker, server), AsyncClient(addr(server)) as c:
            await c.create_topic(TOPIC, 1)
            alone = await _produce_timed(c, 200)
            async with AsyncSubscriber(addr(server), credit_bytes=credit) as sub:
                await sub.subscribe([(TOPIC, 0, "latest")])
                start = sub.position(TOPIC, 0)
                s = only_subscription(server)
                conn = next(iter(server.connections.copy()))
                held: list[int] = []
                got: list[ConsumerRecord] = []

                async def slow_reader() -> None:
                    while not producing.done():
                        got.extend(await sub.poll(1.0, max_records=1))
                        held.append(s.in_flight)
                        transport = conn.transport
                        assert transport is not None
                        held.append(transport.get_write_buffer_size())
                        await asyncio.sleep(0.01)  # 100 msg/s

                producing = asyncio.ensure_future(_produce_timed(c, 200))
                reader = asyncio.ensure_future(slow_reader())
                with_sub = await producing
                await reader
                largest = max(batch_sizes(broker))
                assert max(held) <= credit + largest
                assert s.stats.peak_in_flight <= credit + largest
                assert sub.stats.peak_buffered <= credit + largest
                end = broker.high_watermark(TOPIC, 0)
                assert end - sub.position(TOPIC, 0) > 1000  # it lagged
                again = await _produce_timed(c, 200)
                end = broker.high_watermark(TOPIC, 0)
                # Side by side, no absolute figure: the producer is not slowed by it.
                assert with_sub < 3 * max(alone, again) + 0.5
                while sub.position(TOPIC, 0) < end:  # the subscriber speeds up
                    got += await asyncio.wait_for(sub.poll(None), PROMPT_S)
                assert end - sub.position(TOPIC, 0) == 0
                assert [r.offset for r in got] == list(range(start, end))

    run(main())


def test_best_effort_drops_are_counted_exactly(tmp_path: Path) -> None:
    async def main() -> None:
        async with serve(tmp_path) as (broker, server), AsyncClient(addr(server)) as c:
            await c.create_topic(TOPIC, 1)
            await produce(c, 50)  # 500 records, ~60 KB: far behind for a 8 KB lag bound
            async with AsyncSubscriber(
                addr(server), credit_bytes=4096, best_effort=True, max_lag_bytes=8192
            ) as sub:
                await sub.subscribe([(TOPIC, 0, 0)])
                got: list[ConsumerRecord] = []
                for burst in range(5):
                    await produce(c, 30 if burst % 2 else 3)  # big bursts overtake it
                    got += await sub.poll(0.05)
                end = broker.high_watermark(TOPIC, 0)
                while sub.position(TOPIC, 0) < end:
                    got += await asyncio.wait_for(sub.poll(None), PROMPT_S)
                offsets = [r.offset for r in got]
                assert offsets == sorted(set(offsets))  # in order, no duplicates
                sent = end
                assert sub.dropped() > 0
                assert sent - len(got) == sub.dropped() == sub.dropped(TOPIC, 0)
                assert only_subscription(server).stats.dropped == sub.dropped()

    run(main())


def test_resumes_after_a_lost_connection_from_the_last_offset(tmp_path: Path) -> None:
    async def main() -> None:
        async with serve(tmp_path) as (broker, server), AsyncClient(addr(server)) as c:
            await c.create_topic(TOPIC, 1)
            await produce(c, 10)
            async with AsyncSubscriber(addr(server), credit_bytes=2048) as sub:
                await sub.subscribe([(TOPIC, 0, "earliest")])
                got = await take(sub, 35)
                for conn in list(server.connections):
                    if conn.subscriptions.subs:
                        assert conn.transport is not None
                        conn.transport.abort()  # the subscriber's connection breaks
                await produce(c, 10)
                got += await take(sub, 200 - 35)
                assert [r.offset for r in got] == list(range(200))
                assert sub.stats.resubscribes >= 1
                await until(lambda: broker._n_waiters <= 1, "the old subscription is gone")

    run(main())


def test_subscriptions_are_bounded_and_torn_down_with_the_connection(tmp_path: Path) -> None:
    async def main() -> None:
        async with broker_at(tmp_path) as broker, listening(broker, max_subscriptions=2) as server:
            broker.create_topic(TOPIC, 1)
            t = Transport(addr(server))
            try:
                await t.request(sub_req(1))
                with pytest.raises(InvalidRequestError):
                    await t.request(sub_req(1))  # the id is taken
                await t.request(sub_req(2))
                with pytest.raises(BackpressureError):
                    await t.request(sub_req(3))
                with pytest.raises(InvalidRequestError):
                    await t.request(CreditRequest(subscription_id=9, credit_bytes=1))
                await until(lambda: broker._n_waiters == 2, "both wait for appends")
            finally:
                await t.close()
            await until(lambda: broker._n_waiters == 0, "torn down with the connection")
            await until(lambda: not server.connections, "connection gone")

    run(main())


def sub_req(sid: int) -> SubscribeRequest:
    return SubscribeRequest(
        subscription_id=sid, partitions=[SubscribePartition(TOPIC, 0, 0)], credit_bytes=1024
    )


def test_the_blocking_subscriber(tmp_path: Path) -> None:
    async def main() -> None:
        async with serve(tmp_path) as (_, server), AsyncClient(addr(server)) as c:
            await c.create_topic(TOPIC, 1)
            await produce(c, 3)

            def read() -> list[int]:
                with Subscriber(addr(server), credit_bytes=1024) as sub:
                    sub.subscribe([(TOPIC, 0, 5)])
                    return [next(sub).offset for _ in range(25)]

            assert await in_thread(read) == list(range(5, 30))

    run(main())


def test_a_group_member_reads_its_assignment_by_push(tmp_path: Path) -> None:
    """``delivery="push"``: the member's partitions come by push from the group's committed
    offsets; pausing and committing work as with pull; a second member takes its share."""

    async def main() -> None:
        fast = {"session_timeout_ms": 1_000, "heartbeat_interval_ms": 100}
        async with (
            serve(tmp_path, default_partitions=4) as (_, server),
            AsyncClient(addr(server)) as c,
        ):
            await c.create_topic("g-topic", 4)
            for p in range(4):
                await c.produce("g-topic", p, [Message(f"{p}-{i}".encode()) for i in range(25)])
            async with AsyncGroupConsumer(
                addr(server),
                "pushers",
                topics=["g-topic"],
                auto_offset_reset="earliest",
                delivery="push",
                push_credit_bytes=512,
                **fast,
            ) as member:
                got: list[ConsumerRecord] = []
                while len(got) < 100:
                    got += await asyncio.wait_for(member.poll(1.0), PROMPT_S)
                assert sorted(r.value or b"" for r in got) == sorted(
                    f"{p}-{i}".encode() for p in range(4) for i in range(25)
                )
                for p in range(4):
                    offs = [r.offset for r in got if r.partition == p]
                    assert offs == list(range(25))
                await member.commit()
                await member.pause([("g-topic", 0)])
                await c.produce("g-topic", 0, [Message(b"later-0")])
                await c.produce("g-topic", 1, [Message(b"later-1")])
                (r,) = await asyncio.wait_for(member.poll(None), PROMPT_S)
                assert r.value == b"later-1"
                await member.resume([("g-topic", 0)])
                (r,) = await asyncio.wait_for(member.poll(None), PROMPT_S)
                assert r.value == b"later-0"
            lag = {(x.topic, x.partition): x.lag for x in await c.group_lag("pushers")}
            assert set(lag.values()) == {0}

    run(main())


def test_a_push_members_positions_follow_what_each_poll_handed_out(tmp_path: Path) -> None:
    """A push member's position of each partition is the offset after the last record a poll
    handed out, also when ``max_records`` cuts a pushed frame short; a commit stores them."""

    async def main() -> None:
        fast = {"session_timeout_ms": 1_000, "heartbeat_interval_ms": 100}
        async with (
            serve(tmp_path, default_partitions=3) as (_, server),
            AsyncClient(addr(server)) as c,
        ):
            await c.create_topic("pos", 3)
            for p in range(3):
                for b in range(3):  # several stored batches a partition
                    await c.produce("pos", p, [Message(f"{p}-{b}-{i}".encode()) for i in range(8)])
            async with AsyncGroupConsumer(
                addr(server),
                "positions",
                topics=["pos"],
                auto_offset_reset="earliest",
                enable_auto_commit=False,
                delivery="push",
                **fast,
            ) as member:
                got: list[ConsumerRecord] = []
                for _ in range(200):
                    if len(got) >= 72:
                        break
                    out = await asyncio.wait_for(member.poll(1.0, max_records=5), PROMPT_S)
                    assert len(out) <= 5
                    got += out
                    for p in {r.partition for r in out}:
                        last = max(r.offset for r in out if r.partition == p)
                        assert member.position("pos", p) == last + 1
                    for p in range(3):  # a partition's position is where its records stop
                        mine = [r.offset for r in got if r.partition == p]
                        assert mine == list(range(len(mine)))
                        assert member.position("pos", p) == len(mine)
                assert len(got) == 72
                await member.commit()
            assert await c.committed_offsets("positions") == {("pos", p): 24 for p in range(3)}

    run(main())


def test_push_frames_carry_whole_stored_batches_and_say_where_they_are(tmp_path: Path) -> None:
    async def main() -> None:
        async with serve(tmp_path) as (broker, server), AsyncClient(addr(server)) as c:
            await c.create_topic(TOPIC, 1)
            await produce(c, 3)
            stored = broker.read_partition(TOPIC, 0, 0, 1 << 20).data
            pushes: list[PushReceived] = []
            t = Transport(addr(server))
            t.on_push = pushes.append
            try:
                r = await t.request(
                    SubscribeRequest(
                        partitions=[SubscribePartition(TOPIC, 0, 12)], credit_bytes=1 << 20
                    )
                )
                assert r is not None
                sid = r.body.subscription_id
                assert sid >= 0
                await until(lambda: pushes, "a push")
                (p,) = pushes
                assert p.subscription_id == sid
                assert p.api_key == ApiKey.SUBSCRIBE
                body = decode_body(PushBody, p.body)
                assert (body.topic, body.partition) == (TOPIC, 0)
                assert (body.offset, body.next_offset, body.high_watermark) == (12, 30, 30)
                assert (body.dropped, body.error_code) == (0, 0)
                # The batch holding offset 12 starts at 10: it is sent whole, as stored.
                first = next(iter_batches(stored, verify=False))[1].size
                assert bytes(p.data) == stored[first:]
                await t.request(UnsubscribeRequest(subscription_id=sid))
                await produce(c, 1)
                for _ in range(20):
                    await asyncio.sleep(0)
                assert len(pushes) == 1
            finally:
                await t.close()

    run(main())


def test_bytes_behind_is_estimated_from_the_offset_index(tmp_path: Path) -> None:
    async def main() -> None:
        async with serve(tmp_path) as (broker, server), AsyncClient(addr(server)) as c:
            await c.create_topic(TOPIC, 1)
            await produce(c, 40)
            sizes = batch_sizes(broker)
            interval = broker.log(TOPIC, 0).config.index_interval_bytes
            assert broker.bytes_behind(TOPIC, 0, 0) == sum(sizes)
            assert broker.bytes_behind(TOPIC, 0, 400) == 0
            for k in (1, 17, 39):
                exact = sum(sizes[k:])
                assert exact <= broker.bytes_behind(TOPIC, 0, k * 10 + 3) <= exact + interval

    run(main())


def test_a_caught_up_subscription_reads_once_a_push(tmp_path: Path) -> None:
    """A push that takes its partition up to the high watermark it was read at goes back to
    waiting for data at once: one read of the log a push, not a second one to find nothing
    (and a loop turn to make it)."""

    async def main() -> None:
        async with serve(tmp_path) as (broker, server), AsyncClient(addr(server)) as c:
            await c.create_topic(TOPIC, 1)
            reads: list[int] = []
            read_partition = broker.read_partition

            def counted(topic: str, partition: int, offset: int, max_bytes: int) -> object:
                reads.append(offset)
                return read_partition(topic, partition, offset, max_bytes)

            broker.read_partition = counted  # type: ignore[assignment,method-assign]
            async with AsyncSubscriber(addr(server), credit_bytes=1 << 20) as sub:
                await sub.subscribe([(TOPIC, 0, 0)])
                await until(lambda: reads, "the first (empty) read")
                start = len(reads)
                for b in range(20):  # one batch at a time, each pushed before the next
                    await produce(c, 1)
                    got = await take(sub, 10)
                    assert [r.offset for r in got] == list(range(b * 10, b * 10 + 10))
                # A wake-up with nothing new (the periodic recheck) reads once more: allow a
                # few of those, but not a second read after every push.
                assert len(reads) - start <= 20 + 3, reads[start:]

    run(main())


def test_a_subscription_keeps_one_timer_over_many_waits(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A caught-up subscription waits for data again after every push, on the partitions'
    wake-ups; the timer that bounds a missed wake-up is armed once and kept, not made again
    for every wait."""
    monkeypatch.setattr(push, "RECHECK_S", 60.0)

    async def main() -> None:
        async with serve(tmp_path) as (broker, server), AsyncClient(addr(server)) as c:
            await c.create_topic(TOPIC, 1)
            async with AsyncSubscriber(addr(server), credit_bytes=1 << 20) as sub:
                await sub.subscribe([(TOPIC, 0, 0)])
                s = only_subscription(server)
                await until(lambda: s.parked is not None, "waiting for data")
                timer = s.timer
                assert timer is not None
                for b in range(20):
                    await produce(c, 1)
                    got = await take(sub, 10)
                    assert [r.offset for r in got] == list(range(b * 10, b * 10 + 10))
                await until(lambda: s.parked is not None, "waiting for data again")
                assert s.timer is timer
                assert broker._n_waiters == 1
            await until(lambda: broker._n_waiters == 0, "the waiter gone with the connection")
            assert timer.cancelled()

    run(main())


def test_past_the_brokers_waiter_bound_a_subscription_polls(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With ``max_fetch_waiters`` taken by another subscription, a caught-up subscription
    cannot wait on the wake-ups: it reads again every RECHECK_S instead, and gets what is
    appended."""
    monkeypatch.setattr(push, "RECHECK_S", 0.05)

    async def main() -> None:
        async with (
            serve(tmp_path, max_fetch_waiters=1) as (broker, server),
            AsyncClient(addr(server)) as c,
        ):
            await c.create_topic(TOPIC, 1)
            async with (
                AsyncSubscriber(addr(server), credit_bytes=1 << 20) as first,
                AsyncSubscriber(addr(server), credit_bytes=1 << 20) as second,
            ):
                await first.subscribe([(TOPIC, 0, 0)])
                await until(lambda: broker._n_waiters == 1, "the first one waits")
                await second.subscribe([(TOPIC, 0, 0)])
                subs = [s for x in server.connections for s in x.subscriptions.subs.values()]
                await until(
                    lambda: len(subs) == 2 and all(s.timer is not None for s in subs),
                    "both wait for data",
                )
                assert broker._n_waiters == 1  # the second one is not among the waiters
                await produce(c, 3)
                for sub in (first, second):
                    got = await take(sub, 30)
                    assert [r.offset for r in got] == list(range(30))

    run(main())


def test_a_step_runs_as_its_subscribe_request_whoever_woke_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A subscription woken by another connection's produce still logs as its own SUBSCRIBE
    request (the request binding of the step's context), as its task did."""
    seen: list[object] = []
    deliver = push.Subscriptions._deliver

    def spy(self: push.Subscriptions, sub: Subscription) -> None:
        seen.append(logs._REQUEST.get())
        deliver(self, sub)

    monkeypatch.setattr(push.Subscriptions, "_deliver", spy)

    async def main() -> None:
        async with serve(tmp_path) as (_, server), AsyncClient(addr(server)) as c:
            await c.create_topic(TOPIC, 1)
            async with AsyncSubscriber(addr(server), credit_bytes=1 << 20) as sub:
                await sub.subscribe([(TOPIC, 0, 0)])
                s = only_subscription(server)
                await until(lambda: s.parked is not None, "waiting for data")
                await produce(c, 1)
                assert [r.offset for r in await take(sub, 10)] == list(range(10))
        apis = [bound[2] if isinstance(bound, tuple) else None for bound in seen]
        assert len(apis) >= 2, seen  # the first step, and the one the produce woke
        assert set(apis) == {"SUBSCRIBE"}, seen

    run(main())
