"""A lone message's path through :class:`AsyncProducer` with ``linger_ms=0``, against a real
broker on port 0: its batch is sent from the ``send`` that opened it (not one loop turn later
by the sender task), an answer does not run an idle sender, and order, retries and errors are
what the sender's own path gives.

No test measures time: what is checked is whether ``send`` returned without giving the loop
control, which task sent a batch, what the futures say and what the broker stored.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
from pathlib import Path
from typing import Any

import pytest

from tests.client._producer_support import CuttingProxy, stored
from tests.client._support import PROMPT_S, addr, run, serve
from tidewire.client import AsyncClient, AsyncProducer, Producer, RecordFuture
from tidewire.errors import ProducerFencedError
from tidewire.protocol.messages import InitProducerIdRequest


def send_in_one_step(p: AsyncProducer, topic: str, value: bytes) -> RecordFuture:
    """Run ``p.send`` as one step of the caller: its future if it returned without yielding to
    the loop (the test fails if it yielded)."""
    coro = p.send(topic, value)
    try:
        coro.send(None)
    except StopIteration as stop:
        return stop.value  # type: ignore[no-any-return]
    coro.close()
    raise AssertionError("send() gave the loop control before it returned")


def sender_drains(p: AsyncProducer) -> list[int]:
    """Count the drains the sender task makes from now on (one item per drain)."""
    calls: list[int] = []
    drain = p._drain

    def counted(*args: Any) -> float | None:
        if asyncio.current_task() is p._sender:
            calls.append(1)
        return drain(*args)

    p._drain = counted  # type: ignore[method-assign]
    return calls


@pytest.mark.parametrize("idempotence", [False, True])
def test_a_lone_send_is_written_from_its_own_step(tmp_path: Path, idempotence: bool) -> None:
    """With linger 0 the batch a send opens is in flight when that send returns, and the
    send did not yield (no loop turn for the sender task); the sender is not run for the
    answers either."""

    async def main() -> None:
        async with serve(tmp_path) as (broker, server):
            broker.create_topic("t", 1)
            async with AsyncProducer(addr(server), linger_ms=0, idempotence=idempotence) as p:
                await (await p.send("t", b"first"))  # connects, gets the producer id
                drains = sender_drains(p)
                offsets = []
                for i in range(20):
                    fut = send_in_one_step(p, "t", b"m%d" % i)
                    assert p._acc is not None
                    assert p._acc.in_flight == 1  # written already
                    offsets.append((await asyncio.wait_for(fut, PROMPT_S)).offset)
                assert offsets == list(range(1, 21))
                assert drains == []  # neither to send nor after an answer
            _, records = await stored(broker, "t", 0)
            assert [r.value for r in records] == [b"first"] + [b"m%d" % i for i in range(20)]

    run(main())


def test_a_lingering_producer_still_leaves_sending_to_the_sender(tmp_path: Path) -> None:
    """With a linger, a send never ships its batch itself: the sender does, once the linger
    is over (the immediate path is for linger 0 only)."""

    async def main() -> None:
        async with serve(tmp_path) as (broker, server):
            broker.create_topic("t", 1)
            async with AsyncProducer(addr(server), linger_ms=5) as p:
                await (await p.send("t", b"first"))
                drains = sender_drains(p)
                fut = await p.send("t", b"second")
                assert p._acc is not None
                assert p._acc.in_flight == 0  # lingering
                assert (await asyncio.wait_for(fut, PROMPT_S)).offset == 1
                assert drains  # the sender sent it

    run(main())


@pytest.mark.parametrize("pipeline", [True, False])
def test_order_across_the_immediate_and_the_task_path(tmp_path: Path, pipeline: bool) -> None:
    """A request that has to go by a task (request_soon refused it: no connection, a full
    write buffer...) is not overtaken by a later lone send: while one is on its way, later
    batches take the task path too, and the partition's order is kept. Pipelined, each
    message is a batch of its own; by default the later ones wait in one held batch."""

    async def main() -> None:
        async with serve(tmp_path) as (broker, server):
            broker.create_topic("t", 1)
            async with AsyncProducer(
                addr(server), linger_ms=0, pipeline_partial_batches=pipeline
            ) as p:
                await (await p.send("t", b"first"))
                soon = p._transport.request_soon
                refuse = [1]

                def refusing(*args: Any) -> int | None:
                    if refuse[0]:
                        refuse[0] -= 1
                        return None
                    return soon(*args)

                p._transport.request_soon = refusing  # type: ignore[method-assign]
                futs = [await p.send("t", b"m%d" % i) for i in range(4)]
                # The first by a task; the rest behind it (pipelined), or held.
                assert p._slow == (4 if pipeline else 1)
                md = await asyncio.wait_for(asyncio.gather(*futs), PROMPT_S)
                assert [m.offset for m in md] == [1, 2, 3, 4]
                assert p._slow == 0
                fut = send_in_one_step(p, "t", b"after")  # immediate again
                assert (await asyncio.wait_for(fut, PROMPT_S)).offset == 5
            headers, records = await stored(broker, "t", 0)
            assert [r.value for r in records] == [b"first", b"m0", b"m1", b"m2", b"m3", b"after"]
            counts = [h.records_count for h in headers]
            assert counts == ([1] * 6 if pipeline else [1, 1, 3, 1])

    run(main())


def test_batches_waiting_for_a_slot_go_once_an_answer_frees_one(tmp_path: Path) -> None:
    """With one batch in flight per partition, a send that finds the slot taken leaves its
    batch queued: the answer that frees the slot wakes the sender, which sends it."""

    async def main() -> None:
        async with serve(tmp_path) as (broker, server):
            broker.create_topic("t", 1)
            async with AsyncProducer(addr(server), linger_ms=0, max_in_flight_per_partition=1) as p:
                await (await p.send("t", b"first"))
                drains = sender_drains(p)
                futs = [await p.send("t", b"m%d" % i) for i in range(30)]
                md = await asyncio.wait_for(asyncio.gather(*futs), PROMPT_S)
                assert [m.offset for m in md] == list(range(1, 31))
                assert drains  # the queued batches went by the sender
            headers, records = await stored(broker, "t", 0)
            assert [r.value for r in records] == [b"first"] + [b"m%d" % i for i in range(30)]
            assert len(headers) < 31  # the queued messages went together

    run(main())


@pytest.mark.parametrize("idempotence", [False, True])
def test_a_lone_send_whose_answer_is_lost_is_retried(tmp_path: Path, idempotence: bool) -> None:
    """The connection breaks after the broker stored a batch sent from ``send``'s own step and
    before its answer: it is sent again on a new connection (by the sender, after the
    backoff), once with idempotence, and the producer goes on sending lone messages."""

    async def main() -> None:
        async with serve(tmp_path) as (broker, server):
            broker.create_topic("t", 1)
            async with (
                CuttingProxy(server.port) as proxy,
                AsyncProducer(
                    proxy.addr, linger_ms=0, idempotence=idempotence, retry_backoff_ms=1
                ) as p,
            ):
                await (await p.send("t", b"first"))
                proxy.cut_responses = 1
                fut = send_in_one_step(p, "t", b"lost")
                md = await asyncio.wait_for(fut, PROMPT_S)
                assert proxy.cuts == 1
                assert proxy.connections == 2
                after = await asyncio.wait_for(await p.send("t", b"after"), PROMPT_S)
                fut = send_in_one_step(p, "t", b"last")  # connected again: immediate
                last = await asyncio.wait_for(fut, PROMPT_S)
            _, records = await stored(broker, "t", 0)
            values = [r.value for r in records]
            if idempotence:
                assert values == [b"first", b"lost", b"after", b"last"]
                assert (md.offset, after.offset, last.offset) == (1, 2, 3)
            else:
                assert values == [b"first", b"lost", b"lost", b"after", b"last"]
                assert (md.offset, after.offset, last.offset) == (2, 3, 4)

    run(main())


def test_a_fenced_lone_send_fails_the_producer(tmp_path: Path) -> None:
    """A batch sent from ``send``'s own step that the broker refuses for good (a newer epoch
    of the producer id fenced it) fails its future and the producer, as on the sender's path."""

    async def main() -> None:
        async with serve(tmp_path) as (broker, server):
            broker.create_topic("t", 1)
            async with AsyncProducer(addr(server), linger_ms=0) as p:
                await (await p.send("t", b"first"))
                async with AsyncClient(addr(server)) as admin:
                    req = InitProducerIdRequest(
                        producer_id=p.producer_id, producer_epoch=p.producer_epoch
                    )
                    assert (await admin._call(req)).body.error_code == 0
                fenced = send_in_one_step(p, "t", b"second")
                with pytest.raises(ProducerFencedError):
                    await asyncio.wait_for(fenced, PROMPT_S)
                with pytest.raises(ProducerFencedError, match="failed earlier"):
                    await p.send("t", b"third")
            _, records = await stored(broker, "t", 0)
            assert [r.value for r in records] == [b"first"]

    run(main())


def test_close_waits_for_a_lone_send_in_flight(tmp_path: Path) -> None:
    """A message sent from ``send``'s own step and not answered yet is waited for by
    ``close`` (flush), like any other."""

    async def main() -> None:
        async with serve(tmp_path) as (broker, server):
            broker.create_topic("t", 1)
            p = AsyncProducer(addr(server), linger_ms=0)
            await (await p.send("t", b"first"))
            fut = send_in_one_step(p, "t", b"second")
            await asyncio.wait_for(p.close(), PROMPT_S)
            assert fut.result().offset == 1
            _, records = await stored(broker, "t", 0)
            assert [r.value for r in records] == [b"first", b"second"]

    run(main())


def test_messages_sent_while_one_is_unanswered_go_together_once_it_is(tmp_path: Path) -> None:
    """By default a batch still filling waits while its partition has one unanswered (the
    answer's wake-up sends it, with everything that came meanwhile): two requests for 31
    messages sent in one go, and the sends that joined the held batch did not run the
    sender. With ``pipeline_partial_batches`` each goes at once, as its own request."""

    async def main(pipeline: bool, n: int) -> list[int]:
        async with serve(tmp_path / str(pipeline)) as (broker, server):
            broker.create_topic("t", 1)
            async with AsyncProducer(
                addr(server), linger_ms=0, pipeline_partial_batches=pipeline
            ) as p:
                await (await p.send("t", b"warm"))
                drains = sender_drains(p)
                futs = [send_in_one_step(p, "t", b"m%d" % i) for i in range(n)]
                assert p._acc is not None
                in_flight = p._acc.in_flight
                md = await asyncio.wait_for(asyncio.gather(*futs), PROMPT_S)
                assert [m.offset for m in md] == list(range(1, n + 1))
                if pipeline:
                    assert in_flight == n  # one message each, pipelined
                else:
                    assert in_flight == 1  # the first; the others held in one batch
                    assert len(drains) == 1  # the answer's wake-up, which sent them
            headers, records = await stored(broker, "t", 0)
            assert [r.value for r in records] == [b"warm"] + [b"m%d" % i for i in range(n)]
            return [h.records_count for h in headers]

    assert run(main(False, 31)) == [1, 1, 30]
    assert run(main(True, 5)) == [1, 1, 1, 1, 1, 1]


def test_full_batches_are_pipelined_while_the_filling_one_waits(tmp_path: Path) -> None:
    """The hold is for a batch still filling: batches that filled go while one is
    unanswered (more than one in flight at once, which held partial batches never are)."""

    async def main() -> None:
        async with serve(tmp_path) as (broker, server):
            broker.create_topic("t", 1)
            async with AsyncProducer(addr(server), linger_ms=0, batch_bytes=2048) as p:
                await (await p.send("t", b"warm"))
                assert p._acc is not None
                most = 0
                futs = []
                for _ in range(40):
                    futs.append(await p.send("t", b"x" * 900))  # two a batch
                    most = max(most, p._acc.in_flight)
                md = await asyncio.wait_for(asyncio.gather(*futs), PROMPT_S)
                assert [m.offset for m in md] == list(range(1, 41))
                assert most >= 2
            _, records = await stored(broker, "t", 0)
            assert len(records) == 41

    run(main())


@pytest.mark.parametrize("idempotence", [False, True])
def test_a_held_batch_goes_after_the_retry_of_the_one_it_waited_for(
    tmp_path: Path, idempotence: bool
) -> None:
    """The connection breaks after the broker stored the unanswered batch and before its
    answer, while the next messages wait in a held batch: the lost one is sent again first,
    the held one after it, on the new connection. With idempotence each message is stored
    once, in order; without, the lost one twice (it was stored before the cut), the held
    ones once, after it."""

    async def main() -> None:
        async with serve(tmp_path) as (broker, server):
            broker.create_topic("t", 1)
            async with (
                CuttingProxy(server.port) as proxy,
                AsyncProducer(
                    proxy.addr, linger_ms=0, idempotence=idempotence, retry_backoff_ms=1
                ) as p,
            ):
                await (await p.send("t", b"warm"))
                proxy.cut_responses = 1
                futs = [send_in_one_step(p, "t", b"m%d" % i) for i in range(10)]
                assert p._acc is not None
                assert p._acc.in_flight == 1  # m0; m1..m9 held in one batch
                md = await asyncio.wait_for(asyncio.gather(*futs), PROMPT_S)
                assert proxy.cuts == 1
                assert proxy.connections == 2
                after = await asyncio.wait_for(await p.send("t", b"after"), PROMPT_S)
            headers, records = await stored(broker, "t", 0)
            values = [r.value for r in records]
            sent = [b"m%d" % i for i in range(10)]
            if idempotence:
                assert values == [b"warm", *sent, b"after"]
                assert [m.offset for m in md] == list(range(1, 11))
                assert [h.records_count for h in headers] == [1, 1, 9, 1]
            else:
                assert values == [b"warm", b"m0", *sent, b"after"]
                assert [m.offset for m in md] == list(range(2, 12))
            assert after.offset == len(values) - 1

    run(main())


def test_the_blocking_producer_sends_from_threads_once_each_in_order(tmp_path: Path) -> None:
    """The blocking twin runs the same accumulator, filled from other threads: with linger
    0, four threads sending at once while batches are unanswered have every message stored
    once, each thread's in its order, in fewer requests than messages."""

    async def main() -> None:
        async with serve(tmp_path) as (broker, server):
            broker.create_topic("t", 1)
            loop = asyncio.get_running_loop()

            def produce() -> None:
                with Producer(addr(server), linger_ms=0) as p:
                    p.send("t", b"warm").result(PROMPT_S)

                    def thread(k: int) -> list[Any]:
                        return [p.send("t", b"%d-%d" % (k, i)) for i in range(50)]

                    with concurrent.futures.ThreadPoolExecutor(4) as pool:
                        futs = [f for fs in pool.map(thread, range(4)) for f in fs]
                    for f in futs:
                        f.result(PROMPT_S)

            await loop.run_in_executor(None, produce)
            headers, records = await stored(broker, "t", 0)
            values = [r.value for r in records]
            assert len(values) == 201
            for k in range(4):
                mine = [v for v in values if v is not None and v.startswith(b"%d-" % k)]
                assert mine == [b"%d-%d" % (k, i) for i in range(50)]
            assert len(headers) < 201  # some requests carried several messages

    run(main())
