"""Hostile clients under load, against a real broker process.

A broker runs in a process of its own (``tests.server._serve_process``: short frame and idle
timeouts, a small ``max_connections``). Good producers (:class:`AsyncClient`, acks durable)
each send a fixed number of batches, paced over the whole attack, and record every
acknowledgement, while many hostile connections at once, hundreds in all
(``tests.server._hostile_clients``), send it

- random garbage;
- real produce requests with mutated bytes (header, body, batch data), impossible values in
  their length fields, bytes inserted, or sent twice with the same correlation id;
- frame headers with impossible lengths (negative, below the header, above the frame limit);
- frames cut part-way and left hanging, small ones and large ones;
- frames dripped byte by byte, each byte well within the frame timeout, the frame never;
- fetch requests by the thousand from a client that never reads a response;
- storms of connections opened and closed (or reset) at once, some mid-frame;
- more connections than ``max_connections`` at once.

Then: every hostile connection was closed by the broker within a bound after its last byte;
the good producers saw no error and every acknowledged message reads back exactly once, in
order, where it was acknowledged; the broker is alive, answers a ping, holds no more file
descriptors than before the traffic, logged no error and stops cleanly on SIGTERM; and its
resident memory, sampled all along, stayed within a bound far below what the hostile
traffic would cost if the broker buffered it.

Mutations come from a seeded ``random.Random``: the seed is printed and named in every
failure; ``TIDEWIRE_HOSTILE_SEED=N`` replays its mutations (not its timing). Run with ``-s``
to see the figures (close times, memory, connections, acknowledgements).
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import random
import signal
import sys
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.server._broker_proc import BrokerProcess, broker_process
from tests.server._history import Ack, check_history
from tests.server._hostile_clients import (
    HOSTILE_AT_ONCE,
    NEVER_READERS_AT_ONCE,
    HostileStats,
    Target,
    hostile_traffic,
)
from tidewire.client import AsyncClient, Message
from tidewire.errors import TidewireError

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="reads /proc and TCP_INFO (Linux)"
)

# --- the broker's settings -----------------------------------------------------------------

#: A frame begun must be whole within this (s): short, so that hanging frames end quickly.
FRAME_TIMEOUT_S = 1.0
#: A connection silent for this long is closed (s): well above any pause of a good producer.
IDLE_TIMEOUT_S = 2.0
#: Small enough that a burst of hostile connections goes past it.
MAX_CONNECTIONS = 64
#: The largest frame accepted (bytes): the good producers' frames are far smaller.
MAX_FRAME_BYTES = 256 * 1024
#: Requests in flight per connection before the broker stops reading it.
MAX_IN_FLIGHT = 16
SERVER_SETTINGS = {
    "frame_timeout_s": FRAME_TIMEOUT_S,
    "idle_timeout_s": IDLE_TIMEOUT_S,
    "max_connections": MAX_CONNECTIONS,
    "max_frame_bytes": MAX_FRAME_BYTES,
    "max_in_flight": MAX_IN_FLIGHT,
}

# --- bounds of the test ------------------------------------------------------------------------

#: The longest any hostile connection may stay open after its last byte (s). The slowest
#: legitimate path is an idle timeout, then the frame timeout again for a client that does not
#: read its error frame (the broker then resets it); the rest is room for a loaded 2-core CI
#: machine.
CLOSE_BOUND_S = IDLE_TIMEOUT_S + FRAME_TIMEOUT_S + 4.0
#: Startup and shutdown of the broker process (s).
STARTUP_S = 30.0
#: Each fetch of a client that never reads asks for this much.
FETCH_BYTES = 64 * 1024
#: The resident memory the hostile traffic may add to the broker, over its baseline (bytes).
#: What the broker may legitimately hold at once: for each connection, a frame being received
#: (at most MAX_FRAME_BYTES; the frames left hanging here are at most half of that), for at
#: most HOSTILE_AT_ONCE + MAX_CONNECTIONS connections (~100 x 128 KiB = 12.5 MiB); for each of
#: NEVER_READERS_AT_ONCE clients that do not read, about MAX_IN_FLIGHT answers of FETCH_BYTES
#: plus the 64 KiB write high-water mark (4 x 1.1 MiB = 4.4 MiB); then the Python objects of
#: ~150 connections and the allocator's slack. 64 MiB is several times that, and a small
#: fraction of what the traffic would cost if the broker buffered what it is sent or asked for
#: (gigabytes of fetch answers alone; checked below).
RSS_ALLOWANCE_BYTES = 64 * 1024 * 1024
#: The estimate above, which the allowance must leave well behind.
LEGITIMATE_BYTES = (HOSTILE_AT_ONCE + MAX_CONNECTIONS) * MAX_FRAME_BYTES // 2 + (
    NEVER_READERS_AT_ONCE * (MAX_IN_FLIGHT * FETCH_BYTES + 64 * 1024)
)
#: How often the broker's memory is sampled (s).
RSS_PERIOD_S = 0.02
#: The longest a good producer waits for the attack to progress before its next batch (s):
#: far below the idle timeout, so the broker never closes a good connection as idle.
PACE_MAX_S = IDLE_TIMEOUT_S / 4

GOOD_TOPIC = "orders"
GOOD_PARTITIONS = 3
#: The topic mutated produce requests aim at: no mutation of 4 bytes or fewer turns its name
#: into GOOD_TOPIC, so nothing a hostile client stores can land among the good messages.
HOSTILE_TOPIC = "hostile-target-topic"
#: A topic of a few large batches, fetched again and again by clients that never read.
BULK_TOPIC = "bulk"


@dataclass(frozen=True, slots=True)
class Scale:
    """How much traffic one run sends."""

    producers: int
    batches: int  # per producer
    hostile_jobs: int
    overflow_bursts: int  # bursts of connections past max_connections


DEFAULT = Scale(producers=4, batches=80, hostile_jobs=220, overflow_bursts=1)
HEAVY = Scale(producers=8, batches=200, hostile_jobs=1200, overflow_bursts=4)


@dataclass(slots=True)
class MemoryWatch:
    """The broker's resident memory, sampled every RSS_PERIOD_S."""

    baseline: int
    peak: int = 0
    samples: int = 0


async def _watch_memory(broker: BrokerProcess, watch: MemoryWatch, stop: asyncio.Event) -> None:
    while not stop.is_set():
        watch.peak = max(watch.peak, broker.rss_bytes())
        watch.samples += 1
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), RSS_PERIOD_S)


# --- good producers ------------------------------------------------------------------------------


@dataclass(slots=True)
class GoodResults:
    sent: list[bytes] = field(default_factory=list)
    acks: list[Ack] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    started: float = math.inf
    finished: float = 0.0


async def _paced(progress: asyncio.Condition, ready: Callable[[], bool]) -> None:
    """Wait until ``ready()``, or PACE_MAX_S at most."""
    async with progress:
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(PACE_MAX_S):
                await progress.wait_for(ready)


async def _good_producer(
    client: AsyncClient, n: int, scale: Scale, out: GoodResults, hostile: HostileStats
) -> None:
    """Produce ``scale.batches`` batches of 1 to 4 unique values, batch ``i`` once ``i /
    batches`` of the hostile jobs have started (so the batches span the attack)."""
    out.started = min(out.started, time.monotonic())
    for i in range(scale.batches):
        due = i * scale.hostile_jobs // scale.batches
        await _paced(hostile.progress, lambda due=due: hostile.jobs_started >= due)
        partition = (n + i) % GOOD_PARTITIONS
        values = tuple(f"p{n:02d}-b{i:04d}-r{j}".encode() for j in range(1 + (n + i) % 4))
        out.sent.extend(values)
        try:
            offset = await client.produce(GOOD_TOPIC, partition, [Message(v) for v in values])
        except TidewireError as exc:
            out.errors.append(f"producer {n}, batch {i}: {exc!r}")
            continue
        out.acks.append(Ack(partition, offset, values))
    out.finished = max(out.finished, time.monotonic())


async def _read_back(client: AsyncClient) -> dict[int, list[tuple[int, bytes | None]]]:
    """``(offset, value)`` of every record of every good partition, from offset 0 on."""
    read: dict[int, list[tuple[int, bytes | None]]] = {}
    for partition in range(GOOD_PARTITIONS):
        got: list[tuple[int, bytes | None]] = []
        offset = 0
        for _ in range(10_000):  # far more fetches than these partitions need
            fetched = await client.fetch(GOOD_TOPIC, partition, offset)
            got.extend((r.offset, r.value) for r in fetched.records)
            offset = fetched.next_offset
            if offset >= fetched.high_watermark:
                break
            assert fetched.records, f"no progress at {partition}/{offset}"
        read[partition] = got
    return read


# --- the test ----------------------------------------------------------------------------------


async def _setup(addr: str) -> None:
    async with AsyncClient(addr) as admin:
        await admin.create_topic(GOOD_TOPIC, GOOD_PARTITIONS)
        await admin.create_topic(HOSTILE_TOPIC, 1)
        await admin.create_topic(BULK_TOPIC, 1)
        for i in range(4):  # 4 x 16 KiB: every fetch is answered with FETCH_BYTES
            await admin.produce(BULK_TOPIC, 0, [Message(bytes([i]) * 16 * 1024)])


@dataclass(slots=True)
class Observed:
    memory: MemoryWatch
    fds_before: int = 0
    fds_after: int = 0
    attack_s: float = 0.0


async def _attack(
    broker: BrokerProcess, scale: Scale, good: GoodResults, stats: HostileStats
) -> Observed:
    """Set up, run the good producers and the hostile traffic together, read back."""
    await _setup(broker.addr)
    target = Target(
        port=broker.port,
        max_frame_bytes=MAX_FRAME_BYTES,
        max_connections=MAX_CONNECTIONS,
        frame_timeout_s=FRAME_TIMEOUT_S,
        close_bound_s=CLOSE_BOUND_S,
        hostile_topic=HOSTILE_TOPIC,
        bulk_topic=BULK_TOPIC,
        fetch_bytes=FETCH_BYTES,
    )
    async with contextlib.AsyncExitStack() as stack:
        clients = [
            await stack.enter_async_context(AsyncClient(broker.addr))
            for _ in range(scale.producers)
        ]
        for c in clients:
            await c.ping()  # connected before the first hostile byte
        seen = Observed(MemoryWatch(baseline=broker.rss_bytes()), fds_before=broker.open_fds())
        stop = asyncio.Event()
        start = time.monotonic()
        async with asyncio.TaskGroup() as tg:
            watcher = tg.create_task(_watch_memory(broker, seen.memory, stop))
            hostile = tg.create_task(
                hostile_traffic(target, scale.hostile_jobs, scale.overflow_bursts, stats)
            )
            producers = [
                tg.create_task(_good_producer(c, n, scale, good, stats))
                for n, c in enumerate(clients)
            ]
            await asyncio.wait([hostile, *producers])
            seen.attack_s = time.monotonic() - start
            stop.set()
            await watcher
        print(
            f"good producers ran from {good.started - start:.1f} s to "
            f"{good.finished - start:.1f} s of {seen.attack_s:.1f} s of hostile traffic"
        )
    # Every hostile connection is gone, and the producers' too: the broker should hold what it
    # held before, less the producers' sockets.
    expected = seen.fds_before - scale.producers
    for _ in range(int(STARTUP_S / RSS_PERIOD_S)):
        seen.fds_after = broker.open_fds()
        if seen.fds_after <= expected:
            break
        await asyncio.sleep(RSS_PERIOD_S)
    assert seen.fds_after <= expected, (
        f"seed {stats.seed}: the broker holds {seen.fds_after} file descriptors after the "
        f"traffic, {seen.fds_before} before it"
    )
    async with AsyncClient(broker.addr) as reader:
        await reader.ping()
        problems = check_history(good.sent, good.acks, await _read_back(reader))
    assert not problems, f"seed {stats.seed}: {problems[:20]}"
    return seen


def _run(tmp_path: Path, scale: Scale) -> None:
    seed = int(os.environ.get("TIDEWIRE_HOSTILE_SEED", random.randrange(2**32)))
    print(f"seed {seed} (TIDEWIRE_HOSTILE_SEED={seed} replays its mutations)")
    good = GoodResults()
    stats = HostileStats(seed)
    with broker_process(tmp_path / "data", tmp_path / "broker.log", SERVER_SETTINGS) as broker:
        seen = asyncio.run(_attack(broker, scale, good, stats))
        assert broker.proc.poll() is None, "the broker died"
        broker.proc.send_signal(signal.SIGTERM)
        assert broker.proc.wait(timeout=STARTUP_S) == 0, broker.log_path.read_text()[-5000:]
    log = broker.log_path.read_text()

    closed = stats.closed
    worst = max(closed, key=lambda c: c.close_s)
    mib = 1024 * 1024
    rss = seen.memory
    print(
        f"hostile: {stats.connections} connections ({dict(stats.kinds())} measured), "
        f"{stats.bytes_sent / mib:.1f} MiB sent, {sum(c.error_frame for c in closed)} saw "
        f"the error frame; closed after the last byte within {worst.close_s:.2f} s at most "
        f"({worst.kind}; bound {CLOSE_BOUND_S:.1f} s)\n"
        f"broker RSS: baseline {rss.baseline / mib:.1f} MiB, peak {rss.peak / mib:.1f} MiB "
        f"(+{(rss.peak - rss.baseline) / mib:.1f} MiB, allowance "
        f"{RSS_ALLOWANCE_BYTES / mib:.0f} MiB, {rss.samples} samples); buffering the hostile "
        f"traffic would take {stats.would_buffer / mib:,.0f} MiB; "
        f"open files {seen.fds_before} before, {seen.fds_after} after\n"
        f"good: {len(good.acks)} acks of {len(good.sent)} messages, {len(good.errors)} errors; "
        f"hostile jobs failed: {len(stats.failures)}"
    )

    assert not good.errors, f"seed {seed}: good producers saw errors: {good.errors[:10]}"
    assert len(good.acks) == scale.producers * scale.batches
    assert not stats.failures, f"seed {seed}: hostile jobs failed: {stats.failures[:10]}"
    late = [c for c in closed if c.close_s > CLOSE_BOUND_S]
    assert not late, (
        f"seed {seed}: {len(late)} hostile connections not closed within {CLOSE_BOUND_S} s of "
        f"their last byte: {Counter(c.kind for c in late)}"
    )
    assert RSS_ALLOWANCE_BYTES > 2 * LEGITIMATE_BYTES
    assert stats.would_buffer > 4 * RSS_ALLOWANCE_BYTES, "the traffic is too light to tell"
    assert rss.peak - rss.baseline < RSS_ALLOWANCE_BYTES, (
        f"seed {seed}: the broker's RSS grew by {(rss.peak - rss.baseline) / mib:.1f} MiB"
    )
    assert " ERROR " not in log, log[-5000:]
    assert "Traceback" not in log, log[-5000:]


def test_hostile_clients_under_load(tmp_path: Path) -> None:
    _run(tmp_path, DEFAULT)


@pytest.mark.slow
def test_hostile_clients_under_heavy_load(tmp_path: Path) -> None:
    _run(tmp_path, HEAVY)
