"""A queue (in memory) against a model, under random sequences of publishes, gets, acks,
requeues, rejects, consumer losses, delays and clock moves (hypothesis): after every step
the queue's counts match the model's, no message is held twice, a settled message is never
handed out again, and every message is accounted for exactly once."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from tidewire.broker.queues.model import QueueSpec
from tidewire.broker.queues.queue import Queue
from tidewire.broker.queues.store import MemoryMessages
from tidewire.records import BatchBuilder, iter_batches

T0 = 1_800_000_000_000


async def done(coro: Coroutine[Any, Any, Any]) -> Any:
    """Run one operation of a transient queue (its I/O is memory) to its end."""
    return await asyncio.wait_for(coro, 5)


def batch(n: int) -> list[tuple[memoryview, Any]]:
    b = BatchBuilder()
    for i in range(n):
        b.append(b"v%d" % i, timestamp_ms=T0)
    data = memoryview(b.build())
    return [(data, h) for _, h in iter_batches(data)]


ops = st.lists(
    st.one_of(
        st.tuples(st.just("publish"), st.integers(1, 5), st.sampled_from([0, 0, 50])),
        st.tuples(st.just("get"), st.sampled_from(["a", "b"]), st.integers(1, 4)),
        st.tuples(
            st.just("settle"), st.sampled_from(["ack", "requeue", "dead-letter"]), st.integers(0, 3)
        ),
        st.tuples(st.just("lose"), st.sampled_from(["a", "b"]), st.just(0)),
        st.tuples(st.just("time"), st.integers(1, 40), st.just(0)),
        st.tuples(st.just("purge"), st.just(0), st.just(0)),
    ),
    max_size=60,
)


@settings(max_examples=150, deadline=None)
@given(ops=ops, max_deliveries=st.sampled_from([0, 2]))
def test_queue_matches_its_model(ops: list[tuple[Any, ...]], max_deliveries: int) -> None:
    asyncio.run(_run_model(ops, max_deliveries))


async def _run_model(ops: list[tuple[Any, ...]], max_deliveries: int) -> None:
    now = [T0]
    dead: list[int] = []

    leaving: list[asyncio.Future[None]] = []

    def dead_letter(q: Queue, pairs: list[tuple[int, int]], reason: str) -> asyncio.Future[None]:
        dead.extend(o for o, _ in pairs)
        fut = asyncio.ensure_future(q.settle_dead([o for o, _ in pairs], dead_lettered=False))  # noqa: RUF006 (kept in leaving)
        leaving.append(fut)
        return fut

    q = Queue(
        QueueSpec("q", durable=False, max_deliveries=max_deliveries, visibility_timeout_ms=100),
        MemoryMessages(),
        None,
        clock=lambda: now[0],
        dead_letter=dead_letter,
        wake=lambda q: None,
    )
    published = 0
    held: dict[str, list[Any]] = {"a": [], "b": []}  # owner -> its held entries
    settled: set[int] = set()
    delivered_times: dict[int, int] = {}
    for op, x, y in ops:
        if op == "publish":
            due = now[0] + y if y else 0
            await done(q.publish(batch(x), deliver_at_ms=due))
            published += x
        elif op == "get":
            d = q.get_now(x, y, q.spec.visibility_timeout_ms)
            for e in d.entries:
                assert e.offset not in settled, "a settled message was handed out again"
                assert all(e.offset != h.offset for hs in held.values() for h in hs)
                delivered_times[e.offset] = delivered_times.get(e.offset, 0) + 1
                assert e.delivery_count == delivered_times[e.offset]
            held[x].extend(d.entries)
        elif op == "settle":
            owner = "a" if held["a"] else "b"
            if not held[owner]:
                continue
            e = held[owner].pop(min(y, len(held[owner]) - 1))
            found, unknown = q.find_held([e.tag], owner, 0)
            if not found:  # taken back by its visibility timeout meanwhile
                assert unknown == [e.tag]
                continue
            if x == "ack":
                await done(q.ack(found))
                settled.add(e.offset)
            elif x == "requeue":
                await done(q.requeue(found))
            else:
                await q.reject(found)
        elif op == "lose":
            await done(q.requeue(q.release_owner_gets(x)))
            held[x].clear()
        elif op == "time":
            now[0] += x
            await done(q.tick())
            for owner, entries in held.items():  # what timed out is not held by its owner
                held[owner] = [
                    e
                    for e in entries
                    if q.held.get(e.offset) is not None and q.held[e.offset].tag == e.tag
                ]
        elif op == "purge":
            await done(q.purge())
        # invariants (once the dead letters of this step have left)
        while leaving:
            await leaving.pop()
        for o in dead:
            settled.add(o)
        assert not q.dying
        holders = [h.offset for h in q.held.values()]
        assert len(holders) == len(set(holders))
        assert not (set(holders) & settled)
        s = q.status()
        assert s.ready >= 0
        assert s.unacked == len(q.held)
        assert s.ready + s.unacked + s.delayed == q.unsettled()
        assert q.end == published
    # everything not held comes out of a final drain, once
    for owner in held:
        await done(q.requeue(q.release_owner_gets(owner)))
    now[0] += 10_000
    await done(q.tick())
    rest = q.get_now("z", 10_000, 0)
    drained = [e.offset for e in rest.entries]
    assert len(drained) == len(set(drained))
    assert not (set(drained) & settled)
    assert q.status().ready == 0
    assert q.unsettled() == len(drained)
