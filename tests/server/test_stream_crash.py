"""The stream crash test: a real ``tidewire serve`` (``fsync=always``) is killed with SIGKILL
again and again at random points, and started again on the same port and data directory,
while one sender per stream sends persistent messages (each with its value as its uuid,
retried with the same uuid until the broker answers), competing work-queue receivers take
them (``receive_many`` over every stream), and a fan-out reader reads every stream by resume
token, keeping its tokens across the kills.

At the end the broker is stopped cleanly and started again, the receivers take whatever is
left and the reader reads to the end, and the stream history checker
(``_stream_history.py``) holds the whole history to: no acknowledged message lost (taken,
or its take lost with a kill, at most as many as those takes asked for), none taken twice
or stored twice, takes in position order, and the reader saw every acknowledged message of
every stream exactly once, in send order, its tokens growing.

The default run kills the broker 3 times; the ``slow`` one 20 times.
"""

from __future__ import annotations

import asyncio
import os
import random
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.server._broker_process import BrokerProcess, broker_process
from tests.server._stream_history import (
    Event,
    Killed,
    Read,
    SendOutcome,
    Sent,
    TakeLost,
    Taken,
    check_stream_history,
)
from tidewire.broker.streams.model import FROM_START, SendItem
from tidewire.client import AsyncClient
from tidewire.errors import TidewireError

pytestmark = pytest.mark.crash

RECEIVERS = 3
#: Messages one work-queue receive may take (small: a take lost with a kill may have taken
#: this many, which the checker must then allow for).
TAKE_MAX = 2
WAIT_MS = 300
#: Far above what a stream holds in this test: no send pushes an older message out of the
#: work queue (the ring's bound applies to waiting messages, persistent ones too). Given on
#: every request (the one that creates a stream fixes it) and as the broker's default (a
#: stream rebuilt at a restart has the default).
RING_SIZE = 100_000
#: The client's bound of one request: a request cut by a kill fails with its connection at
#: once; one sent to a broker that is starting waits for it.
REQUEST_TIMEOUT_S = 10.0
#: How long the receivers and the reader may take to finish after the clean restart.
DRAIN_S = 60.0
#: How long a broker's life may take to acknowledge its first message per stream.
PROGRESS_S = 60.0


@dataclass(frozen=True)
class Plan:
    kills: int
    streams: int
    #: Messages each stream's sender sends at most.
    per_stream: int
    #: The whole test's bound.
    deadline_s: float


SMALL = Plan(kills=3, streams=12, per_stream=400, deadline_s=120.0)
FULL = Plan(kills=20, streams=24, per_stream=2_000, deadline_s=600.0)


@dataclass
class _Run:
    events: list[Event] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    acked: set[bytes] = field(default_factory=set)
    read: set[bytes] = field(default_factory=set)
    retried_sends: int = 0
    lost_requests: int = 0
    #: Set once the receivers and the reader should stop (between two requests).
    finish: asyncio.Event = field(default_factory=asyncio.Event)


def _streams(plan: Plan) -> list[str]:
    return [f"crash/{i}" for i in range(plan.streams)]


async def _send(
    run: _Run, client: AsyncClient, stream: str, plan: Plan, *, stop: asyncio.Event, deadline: float
) -> None:
    """Send the stream's values one after the other, each until it is answered."""
    for i in range(plan.per_stream):
        if stop.is_set():
            return
        value = f"{stream}:{i}".encode()
        item = SendItem(stream, value, uuid=value.decode(), persistent=True)
        outcome: SendOutcome = "unknown"
        while time.monotonic() < deadline:
            try:
                (result,) = await client.streams.send_many([item], ring_size=RING_SIZE)
            except TidewireError as exc:
                if not exc.retriable:
                    run.errors.append(f"sending {value!r}: {exc!r}")
                    break
                run.retried_sends += 1
                await asyncio.sleep(0.05)
                continue
            if result.code == 0:
                outcome = "stored"
            elif result.code == -1:
                outcome = "duplicate"
            else:
                run.errors.append(f"sending {value!r}: {result}")
            break
        run.events.append(Sent(stream, value, outcome))
        if outcome != "unknown":
            run.acked.add(value)
        else:
            return


async def _progress(run: _Run, acked: int, k: int, deadline: float) -> None:
    """Until ``acked`` messages are acknowledged in all (bounded by PROGRESS_S and the
    test's deadline)."""
    bound = min(deadline, time.monotonic() + PROGRESS_S)
    while len(run.acked) < acked:
        if time.monotonic() > bound:
            raise AssertionError(
                f"{len(run.acked)} of {acked} messages acknowledged {PROGRESS_S:.0f} s before "
                f"kill {k}: the senders made no progress; errors: {run.errors[:5]}"
            )
        await asyncio.sleep(0.02)


async def _receive(run: _Run, name: str, addr: str, streams: list[str]) -> None:
    """Take messages (work-queue mode) until told to finish."""
    order = list(streams)
    random.Random(name).shuffle(order)  # each receiver names the streams in its own order
    async with AsyncClient(addr, request_timeout_s=REQUEST_TIMEOUT_S) as client:
        while not run.finish.is_set():
            try:
                got = await client.streams.receive_many(
                    order, max_messages=TAKE_MAX, wait_ms=WAIT_MS, ring_size=RING_SIZE
                )
            except TidewireError as exc:
                if not exc.retriable:
                    run.errors.append(f"{name} receiving: {exc!r}")
                    return
                run.lost_requests += 1
                run.events.append(TakeLost(name, tuple(order), TAKE_MAX))
                await asyncio.sleep(0.05)
                continue
            for m in got:
                run.events.append(Taken(name, m.stream, m.value, m.token))


async def _read(run: _Run, addr: str, streams: list[str]) -> None:
    """Read every stream by token (fan-out), keeping the tokens across kills."""
    tokens = dict.fromkeys(streams, FROM_START)
    async with AsyncClient(addr, request_timeout_s=REQUEST_TIMEOUT_S) as client:
        while not run.finish.is_set():
            try:
                messages, nexts = await client.streams.read(
                    tokens, max_messages=100, wait_ms=WAIT_MS
                )
            except TidewireError as exc:
                if not exc.retriable:
                    run.errors.append(f"reading: {exc!r}")
                    return
                await asyncio.sleep(0.05)
                continue
            for m in messages:
                run.events.append(Read("reader", m.stream, m.value, m.token))
                run.read.add(m.value)
            if set(nexts) != set(streams):
                run.errors.append(f"a read answered tokens of {sorted(nexts)}, not {streams}")
                return
            tokens = dict(nexts)


async def _waiting(addr: str, streams: list[str]) -> int:
    async with AsyncClient(addr, request_timeout_s=REQUEST_TIMEOUT_S) as client:
        total = 0
        for s in streams:
            info = await client.streams.describe(s)
            total += 0 if info is None else info.waiting
        return total


async def _load_and_kill(run: _Run, server: BrokerProcess, plan: Plan, seed: int) -> None:
    rng = random.Random(seed)
    deadline = time.monotonic() + plan.deadline_s
    streams = _streams(plan)
    stop = asyncio.Event()
    sender = AsyncClient(server.addr, request_timeout_s=REQUEST_TIMEOUT_S)
    senders = [
        asyncio.create_task(
            _send(run, sender, s, plan, stop=stop, deadline=deadline), name=f"sender {s}"
        )
        for s in streams
    ]
    workers = [
        asyncio.create_task(_receive(run, f"r{i}", server.addr, streams), name=f"receiver r{i}")
        for i in range(RECEIVERS)
    ]
    workers.append(asyncio.create_task(_read(run, server.addr, streams), name="reader"))
    try:
        for k in range(1, plan.kills + 1):
            # Each broker life first acknowledges a message per stream (on a loaded machine a
            # fixed pause could end before the clients were back: 20 kills, 24 messages),
            # then runs a random while longer, so that the kill hits work in flight.
            await _progress(run, len(run.acked) + plan.streams, k, deadline)
            await asyncio.sleep(rng.uniform(0.2, 0.6))
            run.events.append(Killed(k))
            code = await asyncio.to_thread(server.stop, signal.SIGKILL)
            assert code == -signal.SIGKILL, server.log_tail()
            await asyncio.to_thread(server.start)
            assert time.monotonic() < deadline, f"only {k} kills before the deadline"
        await asyncio.sleep(0.5)
        stop.set()
        await asyncio.gather(*senders)
        await sender.close()

        # A clean stop and start: what was taken stays taken, the tokens still hold.
        run.events.append(Killed(plan.kills + 1))
        assert await asyncio.to_thread(server.stop, signal.SIGTERM) == 0, server.log_tail()
        await asyncio.to_thread(server.start)

        drained = min(deadline, time.monotonic() + DRAIN_S)
        while not (run.acked <= run.read and await _waiting(server.addr, streams) == 0):
            for task in workers:
                if task.done():
                    task.result()
                    raise AssertionError(f"{task.get_name()} stopped: {run.errors[:5]}")
            if time.monotonic() > drained:
                run.errors.append(
                    f"{len(run.acked - run.read)} acknowledged messages not read and "
                    f"{await _waiting(server.addr, streams)} waiting {DRAIN_S:.0f} s after "
                    f"the clean restart"
                )
                return
            await asyncio.sleep(0.2)
    finally:
        stop.set()
        run.finish.set()
        for t in senders:
            t.cancel()
        await asyncio.gather(*senders, return_exceptions=True)
        # The receivers and the reader end after their request under way (<= WAIT_MS).
        done, pending = await asyncio.wait(workers, timeout=REQUEST_TIMEOUT_S + 5)
        for t in pending:
            t.cancel()
        for t in done:
            if t.exception() is not None:
                run.errors.append(f"{t.get_name()}: {t.exception()!r}")


@pytest.mark.parametrize(
    "plan",
    [pytest.param(SMALL, id="3-kills"), pytest.param(FULL, marks=pytest.mark.slow, id="20-kills")],
)
def test_sigkill_under_stream_load_loses_and_repeats_nothing(
    tmp_path: Path, plan: Plan, monkeypatch: pytest.MonkeyPatch
) -> None:
    seed = int(os.environ.get("TIDEWIRE_CRASH_SEED", "13"))
    monkeypatch.setenv("TIDEWIRE_STREAM_RING_SIZE", str(RING_SIZE))
    run = _Run()
    with broker_process(tmp_path) as server:
        server.start()
        asyncio.run(_load_and_kill(run, server, plan, seed))
    problems = check_stream_history(run.events)
    if run.errors or problems:
        (tmp_path / "history.txt").write_text("\n".join(map(repr, run.events)))
    assert run.errors == [], [*run.errors[:20], f"history: {tmp_path / 'history.txt'}"]
    assert problems == [], [*problems[:20], f"history: {tmp_path / 'history.txt'}"]

    events = run.events
    sent = [e for e in events if isinstance(e, Sent)]
    taken = [e for e in events if isinstance(e, Taken)]
    reads = [e for e in events if isinstance(e, Read)]
    lost = [e for e in events if isinstance(e, TakeLost)]
    assert server.starts == plan.kills + 2
    assert len(run.acked) >= plan.streams * 10, f"only {len(run.acked)} messages acknowledged"
    # The kills hit work in flight: answers were lost with the broker.
    assert run.retried_sends + run.lost_requests > 0
    untaken = len(run.acked - {e.value for e in taken})
    print(
        f"{plan.kills} SIGKILLs: {len(run.acked):,} persistent messages acknowledged of "
        f"{len(sent):,} sent ({sum(e.outcome == 'duplicate' for e in sent)} answered "
        f"'duplicate' on a retry, {run.retried_sends} retries), {len(taken):,} taken, "
        f"{untaken} taken by requests lost with a kill ({len(lost)} such requests), "
        f"{len(reads):,} read by token"
    )
