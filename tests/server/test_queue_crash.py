"""The queue crash test: a real ``tidewire serve`` (``fsync=always``) is killed with SIGKILL
again and again at random points, and started again on the same port and data directory,
while 4 publishers publish with confirms into a durable queue and 8 competing consumers
(:class:`~tidewire.client.AsyncQueueConsumer`, prefetch 20) take messages from it and ack
each one once processed. Some messages are poison: the consumers reject them, and the
queue's dead-letter exchange routes them into a dead-letter queue.

A publisher sends again whatever was not confirmed (so a message whose confirm died with
the broker may be stored twice: both copies must then be handled). At the end the queue
is drained, the broker is stopped cleanly and started again (nothing acked may come back),
the dead-letter queue is read, and the queue history checker (``_queue_history.py``) holds
the whole history to: every confirmed message acked (poison: dead-lettered), none lost,
none delivered that nobody published, a redelivery only of a delivery that was not acked
(with confirmation) and whose connection went with a kill or that was nacked, no delivery
acked by two consumers, and one dead letter per stored poison message (one more only for
a reject whose answer was lost with a kill: dead-lettering is at-least-once across a crash).

The default run kills the broker 3 times; the ``slow`` one 20 times.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import signal
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.server._broker_process import BrokerProcess, broker_process
from tests.server._queue_history import (
    ConsumerClosed,
    DeadLettered,
    Delivered,
    Event,
    Killed,
    Published,
    Settled,
    SettleResult,
    check_queue_history,
)
from tidewire.broker.queues.model import DEATH_HEADER, SettleOutcome
from tidewire.client import AsyncClient, AsyncQueueConsumer, QueueMessage
from tidewire.errors import TidewireError, UnknownDeliveryTagError

pytestmark = pytest.mark.crash

EXCHANGE = "crash.in"
KEY = "work"
QUEUE = "crash.work"
DLX = "crash.dlx"
DLQ = "crash.dead"
PUBLISHERS = 4
#: Publishes one publisher has waiting for their confirm at once.
LANES = 4
CONSUMERS = 8
PREFETCH = 20
POISON = b"poison-"
#: How long the consumers may take to finish after the last kill: a consumer whose request
#: was cut by a kill may wait out its request timeout (30 s) and its reconnection backoff
#: (up to 5 s, twice) before it takes messages again; the backlog itself takes seconds.
DRAIN_S = 120.0


@dataclass(frozen=True)
class Plan:
    kills: int
    #: Messages stored before the consumers and the kills start (1 in ``poison_every``
    #: poison), so the consumers work through a backlog while the broker is killed.
    backlog: int
    #: Messages each publisher publishes at most while the broker is being killed.
    per_publisher: int
    #: The whole test's bound: load, kills, restarts and the draining.
    deadline_s: float
    poison_every: int = 50


SMALL = Plan(kills=3, backlog=1_000, per_publisher=400, deadline_s=150.0)
FULL = Plan(kills=20, backlog=1_500, per_publisher=1_000, deadline_s=600.0)


@dataclass
class _Run:
    """The history, and what the test needs to know of it while it runs."""

    events: list[Event] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    confirmed: set[bytes] = field(default_factory=set)
    #: Acked or rejected: confirmed, or the answer lost with the connection (the broker may
    #: have recorded it; if not, the message comes again, and the queue is not empty).
    handled: set[bytes] = field(default_factory=set)
    progress: asyncio.Event = field(default_factory=asyncio.Event)

    def publish(self, value: bytes, confirmed: bool) -> None:
        self.events.append(Published(value, confirmed, poison=value.startswith(POISON)))
        if confirmed:
            self.confirmed.add(value)

    def all_handled(self) -> bool:
        return self.confirmed <= self.handled


def _stale(msg: QueueMessage) -> bool:
    """Whether ``msg`` was taken over a connection that has been lost since: the client then
    refuses to settle it (UnknownDeliveryTagError) without asking the broker. The
    connection count is the client's private state; the checker must tell this refusal
    (the connection went: a redelivery is due) from the broker's (it does not hold the tag:
    a redelivery is not)."""
    settler = msg._settler
    return settler is not None and msg._epoch != settler.epoch


def _result(exc: BaseException | None, msg: QueueMessage, run: _Run, what: str) -> SettleResult:
    if exc is None:
        return "confirmed"
    if isinstance(exc, UnknownDeliveryTagError):
        return "connection-lost" if _stale(msg) else "refused"
    if isinstance(exc, TidewireError) and exc.retriable:
        return "connection-lost"
    run.errors.append(f"{what}: {exc!r}")
    return "refused"


async def _settle(run: _Run, name: str, msg: QueueMessage) -> None:
    """Ack a message (reject a poison one); record the delivery and the settlement."""
    run.events.append(Delivered(name, msg.delivery_tag, msg.offset, msg.delivery_count, msg.value))
    poison = msg.value.startswith(POISON)
    outcome: SettleOutcome = "dead-letter" if poison else "ack"
    error: BaseException | None = None
    try:
        if poison:
            await msg.reject(wait=True)
        else:
            await msg.ack(wait=True)
    except TidewireError as exc:
        error = exc
    except asyncio.CancelledError:
        # The consumers are stopped once the broker counts nothing unsettled, which it can
        # do before a consumer has read the answer to its last ack: that ack was recorded,
        # and its copy is rightly not delivered again after the restart.
        run.events.append(Settled(name, msg.delivery_tag, msg.offset, outcome, "abandoned"))
        raise
    result = _result(error, msg, run, f"{name} settling offset {msg.offset}")
    run.events.append(Settled(name, msg.delivery_tag, msg.offset, outcome, result))
    if result != "refused":
        run.handled.add(msg.value)
        run.progress.set()


async def _consume(run: _Run, name: str, addr: str) -> None:
    """Take messages until cancelled."""
    async with AsyncQueueConsumer(addr, QUEUE, prefetch=PREFETCH) as consumer:
        async for msg in consumer:
            await _settle(run, name, msg)


async def _publish(
    run: _Run, client: AsyncClient, values: Iterable[bytes], stop: asyncio.Event, deadline: float
) -> None:
    """Publish each value until its publish is confirmed (a lost confirm: publish again)."""
    for value in values:
        if stop.is_set():
            return
        while True:
            try:
                await client.publish(EXCHANGE, KEY, value)
            except TidewireError as exc:
                run.publish(value, confirmed=False)
                if not exc.retriable or time.monotonic() > deadline:
                    run.errors.append(f"publishing {value!r}: {exc!r}")
                    return
                await asyncio.sleep(0.05)
                continue
            run.publish(value, confirmed=True)
            break


def _values(prefix: str, n: int, poison_every: int) -> list[bytes]:
    return [
        (POISON if i % poison_every == poison_every - 1 else b"") + f"{prefix}-{i}".encode()
        for i in range(n)
    ]


async def _declare(addr: str) -> None:
    async with AsyncClient(addr) as client:
        await client.declare_exchange(DLX, "fanout")
        await client.declare_queue(DLQ)
        await client.bind(DLX, DLQ)
        await client.declare_exchange(EXCHANGE, "direct")
        await client.declare_queue(QUEUE, dead_letter_exchange=DLX)
        await client.bind(EXCHANGE, QUEUE, KEY)


async def _queue_counts(client: AsyncClient) -> tuple[int, int]:
    for q in await client.list_queues():
        if q.name == QUEUE:
            return q.ready, q.unacked
    raise AssertionError(f"queue {QUEUE} is gone")


async def _load_and_kill(run: _Run, server: BrokerProcess, plan: Plan, seed: int) -> None:
    rng = random.Random(seed)
    deadline = time.monotonic() + plan.deadline_s
    addr = server.addr
    await _declare(addr)
    stop = asyncio.Event()

    # The backlog, before any kill: every publish is confirmed at its first attempt.
    backlog = _values("b", plan.backlog, plan.poison_every)
    async with AsyncClient(addr) as client:
        await asyncio.gather(
            *(_publish(run, client, backlog[i::LANES], stop, deadline) for i in range(LANES))
        )
    assert len(run.events) == plan.backlog, "a backlog publish failed before any kill"

    consumers = [
        asyncio.create_task(_consume(run, f"c{i}", addr), name=f"consumer c{i}")
        for i in range(CONSUMERS)
    ]
    clients = [AsyncClient(addr, request_timeout_s=10) for _ in range(PUBLISHERS)]
    publishers = [
        asyncio.create_task(
            _publish(
                run,
                client,
                _values(f"p{i}.{lane}", plan.per_publisher // LANES, plan.poison_every),
                stop,
                deadline,
            )
        )
        for i, client in enumerate(clients)
        for lane in range(LANES)
    ]
    try:
        for k in range(1, plan.kills + 1):
            await asyncio.sleep(rng.uniform(0.2, 0.8))
            run.events.append(Killed(k))
            code = await asyncio.to_thread(server.stop, signal.SIGKILL)
            assert code == -signal.SIGKILL
            await asyncio.to_thread(server.start)
            assert time.monotonic() < deadline, f"only {k} kills before the deadline"
        stop.set()
        await asyncio.gather(*publishers)
        for client in clients:
            await client.close()
        # Drain: every confirmed message handled, then nothing ready or unacked left.
        drained = min(deadline, time.monotonic() + DRAIN_S)
        while not run.all_handled() and not run.errors:
            run.progress.clear()
            left = drained - time.monotonic()
            if left <= 0:
                async with AsyncClient(addr) as client:
                    counts = await _queue_counts(client)
                run.errors.append(
                    f"{len(run.confirmed - run.handled)} confirmed messages not handled "
                    f"{DRAIN_S:.0f} s after the last kill ({QUEUE}: {counts[0]} ready, "
                    f"{counts[1]} unacked): {sorted(run.confirmed - run.handled)[:10]}"
                )
                return
            for task in consumers:
                if task.done():
                    task.result()  # a consumer that failed: its error
                    raise AssertionError(f"{task.get_name()} stopped")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(run.progress.wait(), min(left, 1.0))
        async with AsyncClient(addr) as client:
            while (counts := await _queue_counts(client)) != (0, 0):
                if time.monotonic() > drained:
                    run.errors.append(f"left in {QUEUE}: {counts[0]} ready, {counts[1]} unacked")
                    return
                await asyncio.sleep(0.1)
    finally:
        for task in consumers:
            task.cancel()
        for task, i in zip(consumers, range(CONSUMERS), strict=True):
            with contextlib.suppress(asyncio.CancelledError):
                await task
            run.events.append(ConsumerClosed(f"c{i}"))


async def _drain_after_restart(run: _Run, addr: str) -> None:
    """After a clean restart: whatever is still in the queue (nothing, if every confirmed
    ack was kept), then every dead letter."""
    async with AsyncClient(addr) as client:
        for _ in range(10_000):
            got = await client.get(QUEUE, max_messages=100, wait_ms=200)
            if not got:
                break
            for msg in got:
                await _settle(run, "drain", msg)
        for _ in range(10_000):
            got = await client.get(DLQ, max_messages=100, wait_ms=200)
            if not got:
                break
            for msg in got:
                deaths = [json.loads(v) for k, v in msg.headers if k == DEATH_HEADER]
                reason = deaths[0][0]["reason"] if deaths else "(no x-death header)"
                run.events.append(DeadLettered(msg.value, reason))
            await client.settle(DLQ, [m.delivery_tag for m in got], "ack")


@pytest.mark.parametrize(
    "plan",
    [pytest.param(SMALL, id="3-kills"), pytest.param(FULL, marks=pytest.mark.slow, id="20-kills")],
)
def test_sigkill_under_queue_load_loses_nothing_and_dead_letters_each_poison_once(
    tmp_path: Path, plan: Plan
) -> None:
    seed = int(os.environ.get("TIDEWIRE_CRASH_SEED", "11"))
    run = _Run()
    with broker_process(tmp_path) as server:
        server.start()
        asyncio.run(_load_and_kill(run, server, plan, seed))
        if run.errors:
            (tmp_path / "history.txt").write_text("\n".join(map(repr, run.events)))
            pytest.fail(
                f"{run.errors[:20]}\nchecker: {check_queue_history(run.events)[:20]}\n"
                f"history: {tmp_path / 'history.txt'}"
            )
        run.events.append(Killed(plan.kills + 1))  # a clean stop, a clean start
        assert server.stop(signal.SIGTERM) == 0, server.log_tail()
        server.start()
        asyncio.run(_drain_after_restart(run, server.addr))
    assert run.errors == [], run.errors[:20]

    problems = check_queue_history(run.events)
    if problems:
        (tmp_path / "history.txt").write_text("\n".join(map(repr, run.events)))
    assert problems == [], [*problems[:20], f"history: {tmp_path / 'history.txt'}"]

    events = run.events
    poison = {e.value for e in events if isinstance(e, Published) and e.poison and e.confirmed}
    copies: dict[bytes, set[int]] = {}
    for e in events:
        if isinstance(e, Delivered):
            copies.setdefault(e.value, set()).add(e.offset)
    dead = [e for e in events if isinstance(e, DeadLettered)]
    extra = sum(len(copies[v]) - 1 for v in poison)
    # A reject answered by no one (its connection went with a kill) may have been
    # dead-lettered before the kill; the checker allows one more dead letter for each.
    unanswered_rejects = sum(
        1
        for e in events
        if isinstance(e, Settled)
        and e.outcome == "dead-letter"
        and e.result in ("connection-lost", "abandoned")
    )
    assert len(poison) + extra <= len(dead) <= len(poison) + extra + unanswered_rejects, (
        len(dead),
        len(poison),
        extra,
        unanswered_rejects,
    )
    assert server.starts == plan.kills + 2
    delivered = [e for e in events if isinstance(e, Delivered)]
    redelivered = len(delivered) - len({e.offset for e in delivered})
    lost_settles = sum(
        1 for e in events if isinstance(e, Settled) and e.result == "connection-lost"
    )
    last: dict[int, Delivered] = {e.offset: e for e in delivered}
    unanswered = sum(
        1
        for e in events
        if isinstance(e, Settled)
        and e.result == "connection-lost"
        and (d := last[e.offset]).consumer == e.consumer
        and d.tag == e.tag
    )
    resent = sum(1 for e in events if isinstance(e, Published) and not e.confirmed)
    # The kills hit work in flight: answers were lost with the broker.
    assert lost_settles + resent > 0
    print(
        f"{plan.kills} SIGKILLs: {len(run.confirmed):,} messages confirmed "
        f"({len(poison)} poison), {len(delivered):,} deliveries ({redelivered:,} redelivered), "
        f"{lost_settles:,} settlements lost with their connection ({unanswered} of them "
        f"recorded by the broker all the same), {resent:,} publishes "
        f"sent again, {len(dead)} dead letters"
    )
