"""Durable queues: end-to-end throughput, publish-to-delivery latency at a fixed rate, and
broker memory per message held in a queue.

Usage::

    python benchmarks/queues.py [--messages N] [--rate MSG_PER_S] [--latency-seconds S]
        [--held N] [--reps R] [--window W] [--prefetch P] [--ack-every A] [--json]

It starts a broker (``tidewire serve --fsync always``) in a process of its own on a free port
over a scratch data directory, so the broker and the clients do not share a CPU, and runs,
``--reps`` times each (the figures are medians over the reps):

- throughput: into a fresh durable queue, one :class:`~tidewire.client.AsyncClient`
  publishes N messages of 1 KiB through the default exchange with confirms (a publish
  returns once the broker has stored and fsynced it; ``--window`` publishes awaiting their
  confirm at once, which the client coalesces into shared requests), while one
  :class:`~tidewire.client.AsyncQueueConsumer` (prefetch ``--prefetch``) takes them and
  acks every ``--ack-every`` (``ack_many``, answered after the acks are fsynced too; up to
  4 such requests under way while it takes more). The
  clock runs from the first publish to the last ack's answer: messages per second through
  the whole cycle. Also the publish side alone (first publish to last confirm) and the
  broker's CPU time per message (user + system, from /proc).
- latency: publishes paced at ``--rate`` msg/s for ``--latency-seconds`` (below the
  broker's capacity), each message carrying its publish time; the consumer, the same
  process (one clock), records receive time minus publish time: p50 and p99, and of the
  confirm (publish call to its return).
- memory: N (``--held``) messages published into a fresh queue and left ready, then all
  taken by a consumer (prefetch N) and left unacked; the broker's anonymous resident
  memory (``RssAnon`` in /proc: the heap, not the page cache of its mapped log files) is
  read before and after each, once it has settled: bytes per message ready, and per
  message delivered and unacked. And the same with the broker core in this process
  (no listener), measured with tracemalloc: the Python objects the queue keeps per
  message, without the allocator's and the page cache's noise.

Progress goes to stderr; ``--json`` prints the figures as one JSON object.

Measured on the 2-core development machine, shared with other work (publisher and consumer
share this one client process, which is what limits the rates; at 5,000 msg/s it runs near
its capacity, so the latency swings from run to run: p50 5.5, 40 and 3,050 ms in the three
reps below)::

    python benchmarks/queues.py --json        # defaults: 50,000 messages, 3 reps

    end to end (publish confirmed + consume + ack): 5,501 msg/s median (4,740-8,977)
    publish alone: 7,861 msg/s; broker CPU 19.6 µs/msg
    publish-to-delivery at 5,000 msg/s: p50 39.5 ms, p99 839 ms (confirm p50 30 ms, p99 488 ms)
    broker memory, 50,000 held: ready 0 B/msg (RSS), 0.5 B/msg (core heap);
                                delivered unacked 174 B/msg (RSS), 197 B/msg (core heap)

Ready messages of a durable queue cost nearly nothing in memory (they are in the log; the
queue keeps offset ranges); a delivered, unacked one costs some 200 bytes. Side by side
with RabbitMQ: ``queues_peers.py``.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import statistics
import struct
import sys
import tempfile
import time
import tracemalloc
from collections import deque
from collections.abc import Callable
from contextlib import suppress
from dataclasses import asdict, dataclass, field

from producer_bench import ServedBroker, serve
from tidewire.broker import Broker, BrokerConfig
from tidewire.broker.queues.model import Delivery, QueueSpec
from tidewire.client import AsyncClient, AsyncQueueConsumer, QueueMessage
from tidewire.errors import UnknownQueueError
from tidewire.records import BatchBuilder

VALUE_BYTES = 1024
#: The first 8 bytes of a message: time.monotonic_ns() at its publish.
STAMP = struct.Struct("<Q")
QUEUE = "bench.queue"
#: Ack requests a consumer has under way at once (each answered after its fsync).
ACKS_IN_FLIGHT = 4


def progress(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def quantile(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(int(q * len(s)), len(s) - 1)] if s else 0.0


def _proc_status(pid: int, field_name: str) -> int:
    """A ``kB`` field of /proc/PID/status, in bytes."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field_name + ":"):
                return int(line.split()[1]) * 1024
    raise SystemExit(f"/proc/{pid}/status has no {field_name}")


def _cpu_s(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        parts = f.read().rsplit(")", 1)[1].split()
    return (int(parts[11]) + int(parts[12])) / os.sysconf("SC_CLK_TCK")


async def _fresh_queue(client: AsyncClient) -> None:
    with suppress(UnknownQueueError):
        await client.delete_queue(QUEUE)
    await client.declare_queue(QUEUE, durable=True)


def _payload() -> bytes:
    return bytes(STAMP.size) + b"x" * (VALUE_BYTES - STAMP.size)


async def consume(
    addr: str,
    n: int,
    args: argparse.Namespace,
    on_msg: Callable[[QueueMessage], None] | None = None,
) -> None:
    """Take ``n`` messages from the queue, acking every ``--ack-every`` (up to
    ``ACKS_IN_FLIGHT`` ack requests under way while it takes more); returns once the last
    ack is answered. Bounded by ``--timeout``."""
    acked = 0

    async def run() -> None:
        nonlocal acked
        pending: list[QueueMessage] = []
        taken = 0
        acks: deque[asyncio.Task[None]] = deque()
        async with AsyncQueueConsumer(addr, QUEUE, prefetch=args.prefetch) as consumer:
            async for msg in consumer:
                if on_msg is not None:
                    on_msg(msg)
                pending.append(msg)
                taken += 1
                if len(pending) >= args.ack_every or taken >= n:
                    acks.append(asyncio.create_task(consumer.ack_many(pending)))
                    pending = []
                    while len(acks) > ACKS_IN_FLIGHT or (taken >= n and acks):
                        await acks.popleft()
                        acked += args.ack_every
                    if taken >= n:
                        acked = n
                        return

    try:
        await asyncio.wait_for(run(), args.timeout)
    except TimeoutError:
        raise SystemExit(
            f"only {acked:,} of {n:,} messages acked in {args.timeout:.0f} s"
        ) from None


async def publish_window(client: AsyncClient, n: int, value: bytes, window: int) -> None:
    """Publish ``n`` messages, at most ``window`` awaiting their confirm at once."""
    slots = asyncio.Semaphore(window)
    tasks: set[asyncio.Task[object]] = set()

    def finished(t: asyncio.Task[object]) -> None:
        tasks.discard(t)
        slots.release()

    for _ in range(n):
        await slots.acquire()
        t = asyncio.create_task(client.publish("", QUEUE, value))
        tasks.add(t)
        t.add_done_callback(finished)
    while tasks:
        await asyncio.gather(*tasks)  # raises the first failed publish


@dataclass
class Throughput:
    msgs_per_s: float
    publish_msgs_per_s: float
    broker_cpu_us_per_msg: float


async def throughput(b: ServedBroker, args: argparse.Namespace) -> Throughput:
    n, value = args.messages, _payload()
    async with AsyncClient(b.addr) as client:
        await _fresh_queue(client)
        # The connections, the route, the consumer's path: untimed.
        await client.publish("", QUEUE, value)
        await consume(b.addr, 1, args)
        cpu0 = _cpu_s(b.pid)
        start = time.perf_counter()
        consumer = asyncio.create_task(consume(b.addr, n, args))
        await publish_window(client, n, value, args.window)
        published = time.perf_counter() - start
        await consumer
        elapsed = time.perf_counter() - start
        cpu = _cpu_s(b.pid) - cpu0
        await client.delete_queue(QUEUE)
    return Throughput(n / elapsed, n / published, cpu / n * 1e6)


@dataclass
class Latency:
    sent: int
    p50_ms: float
    p99_ms: float
    confirm_p50_ms: float
    confirm_p99_ms: float


async def latency(b: ServedBroker, args: argparse.Namespace) -> Latency:
    n = int(args.rate * args.latency_seconds)
    pad = b"x" * (VALUE_BYTES - STAMP.size)
    lat: list[float] = []
    confirms: list[float] = []
    async with AsyncClient(b.addr) as client:
        await _fresh_queue(client)
        await client.publish("", QUEUE, _payload())  # untimed: connections, route
        await consume(b.addr, 1, args)

        def on_msg(msg: QueueMessage) -> None:
            lat.append((time.monotonic_ns() - STAMP.unpack_from(msg.value)[0]) / 1e6)

        consumer = asyncio.create_task(consume(b.addr, n, args, on_msg))

        async def publish_one() -> None:
            t0 = time.monotonic_ns()
            await client.publish("", QUEUE, STAMP.pack(t0) + pad)
            confirms.append((time.monotonic_ns() - t0) / 1e6)

        # Paced: every millisecond, as many publishes as the schedule is behind.
        tasks: set[asyncio.Task[None]] = set()
        start = time.perf_counter()
        sent = 0
        while sent < n:
            due = min(int((time.perf_counter() - start) * args.rate) + 1, n)
            while sent < due:
                t = asyncio.create_task(publish_one())
                tasks.add(t)
                t.add_done_callback(tasks.discard)
                sent += 1
            await asyncio.sleep(0.001)
        while tasks:
            await asyncio.gather(*tasks)
        await consumer
        await client.delete_queue(QUEUE)
    return Latency(
        n,
        quantile(lat, 0.5),
        quantile(lat, 0.99),
        quantile(confirms, 0.5),
        quantile(confirms, 0.99),
    )


@dataclass
class Memory:
    held: int
    ready_bytes_per_msg: float
    unacked_bytes_per_msg: float


async def _settled_rss(pid: int) -> int:
    """RssAnon once it stops moving (the broker finishes its writes and frees buffers)."""
    last = _proc_status(pid, "RssAnon")
    for _ in range(20):
        await asyncio.sleep(0.25)
        now = _proc_status(pid, "RssAnon")
        if abs(now - last) < 64 * 1024:
            return now
        last = now
    return last


async def memory(b: ServedBroker, args: argparse.Namespace) -> Memory:
    n, value = args.held, _payload()
    async with AsyncClient(b.addr) as client:
        await _fresh_queue(client)
        await client.publish("", QUEUE, value)  # one message through every path first
        got = await client.get(QUEUE, max_messages=1, wait_ms=1000)
        await client.settle(QUEUE, [m.delivery_tag for m in got], "ack")
        base = await _settled_rss(b.pid)
        for i in range(0, n, 1000):
            await client.publish_batch("", QUEUE, [value] * min(1000, n - i))
        ready = await _settled_rss(b.pid)
        held: list[QueueMessage] = []
        async with AsyncQueueConsumer(b.addr, QUEUE, prefetch=n) as consumer:

            async def take() -> None:
                async for msg in consumer:
                    held.append(msg)
                    if len(held) >= n:
                        return

            try:
                await asyncio.wait_for(take(), args.timeout)
            except TimeoutError:
                raise SystemExit(f"only {len(held):,} of {n:,} messages delivered") from None
            unacked = await _settled_rss(b.pid)
        held.clear()
        await client.delete_queue(QUEUE)
    return Memory(n, (ready - base) / n, (unacked - base) / n)


def _batch(values: list[bytes]) -> bytes:
    b = BatchBuilder()
    now = int(time.time() * 1000)
    for v in values:
        b.append(v, timestamp_ms=now, key=QUEUE.encode())
    return b.build()


async def memory_in_process(n: int) -> Memory:
    """The broker core's own Python memory per message (tracemalloc: every allocation
    still alive, of this process), a broker in this process with no listener."""
    value = _payload()
    with tempfile.TemporaryDirectory(prefix="tidewire-bench-") as data:
        async with Broker(BrokerConfig(data_dir=data)) as broker:
            queues = broker.queues
            await queues.declare_queue(QueueSpec(QUEUE, durable=True))
            await queues.publish("", QUEUE, _batch([value]))  # every path once, untimed
            tags: list[int] = []
            delivered = 0

            def deliver(d: Delivery) -> None:  # a server writes d.data out and drops it
                nonlocal delivered
                delivered += len(d.entries)
                if len(tags) < 1:
                    tags.extend(e.tag for e in d.entries)

            first = queues.consume(QUEUE, owner="bench", prefetch=1, deliver=deliver)
            for _ in range(1000):
                if delivered:
                    break
                await asyncio.sleep(0.001)
            await queues.settle(QUEUE, tags, "ack", owner="bench")
            queues.cancel(QUEUE, first)
            delivered = 0
            gc.collect()
            tracemalloc.start()
            base = tracemalloc.get_traced_memory()[0]
            for i in range(0, n, 1000):
                await queues.publish("", QUEUE, _batch([value] * min(1000, n - i)))
            gc.collect()
            ready = tracemalloc.get_traced_memory()[0]
            queues.consume(QUEUE, owner="bench", prefetch=n, deliver=deliver)
            for _ in range(10_000):
                if delivered >= n:
                    break
                await asyncio.sleep(0.001)
            if delivered < n:
                raise SystemExit(f"only {delivered:,} of {n:,} messages delivered")
            gc.collect()
            unacked = tracemalloc.get_traced_memory()[0]
            tracemalloc.stop()
            queues.connection_closed("bench")
    return Memory(n, (ready - base) / n, (unacked - base) / n)


@dataclass
class Rep:
    throughput: Throughput
    latency: Latency


@dataclass
class Summary:
    reps: list[Rep] = field(default_factory=list)
    memory_rss: Memory | None = None
    memory_heap: Memory | None = None

    def median(self, get: Callable[[Rep], float]) -> float:
        return statistics.median(get(r) for r in self.reps)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--messages", type=int, default=50_000, help="throughput run (default 50000)")
    ap.add_argument("--rate", type=float, default=5000, help="latency run, msg/s (default 5000)")
    ap.add_argument("--latency-seconds", type=float, default=5.0)
    ap.add_argument(
        "--held", type=int, default=50_000, help="messages held for the memory figure (0: skip)"
    )
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--window", type=int, default=1000, help="publishes awaiting a confirm")
    ap.add_argument("--prefetch", type=int, default=1000)
    ap.add_argument("--ack-every", type=int, default=100)
    ap.add_argument("--timeout", type=float, default=300.0, help="bound of each run, seconds")
    ap.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = ap.parse_args()
    for name in ("messages", "reps", "window", "prefetch", "ack_every"):
        if getattr(args, name) < 1:
            ap.error(f"--{name.replace('_', '-')} must be at least 1, not {getattr(args, name)}")

    summary = Summary()
    with serve("--fsync", "always") as b:
        progress(f"broker on {b.addr}, pid {b.pid}, fsync=always")
        for rep in range(1, args.reps + 1):
            t = asyncio.run(throughput(b, args))
            progress(
                f"rep {rep}/{args.reps} throughput: {t.msgs_per_s:,.0f} msg/s end to end "
                f"(publish alone {t.publish_msgs_per_s:,.0f} msg/s), broker "
                f"{t.broker_cpu_us_per_msg:.1f} µs CPU/msg"
            )
            lat = asyncio.run(latency(b, args))
            progress(
                f"rep {rep}/{args.reps} latency at {args.rate:,.0f} msg/s: p50 {lat.p50_ms:.2f} "
                f"ms, p99 {lat.p99_ms:.2f} ms (confirm p50 {lat.confirm_p50_ms:.2f}, p99 "
                f"{lat.confirm_p99_ms:.2f} ms)"
            )
            summary.reps.append(Rep(t, lat))
        if args.held:
            mem = summary.memory_rss = asyncio.run(memory(b, args))
            progress(
                f"broker RSS: {mem.ready_bytes_per_msg:,.0f} B per ready message, "
                f"{mem.unacked_bytes_per_msg:,.0f} B per unacked one ({mem.held:,} held)"
            )
    if args.held:
        mem = summary.memory_heap = asyncio.run(memory_in_process(args.held))
        progress(
            f"broker core heap (tracemalloc): {mem.ready_bytes_per_msg:,.1f} B per ready "
            f"message, {mem.unacked_bytes_per_msg:,.1f} B per unacked one ({mem.held:,} held)"
        )
    report(summary, args)


def report(summary: Summary, args: argparse.Namespace) -> None:
    figures = {
        "messages": args.messages,
        "reps": args.reps,
        "value_bytes": VALUE_BYTES,
        "window": args.window,
        "prefetch": args.prefetch,
        "ack_every": args.ack_every,
        "end_to_end_msgs_per_s": summary.median(lambda r: r.throughput.msgs_per_s),
        "publish_msgs_per_s": summary.median(lambda r: r.throughput.publish_msgs_per_s),
        "broker_cpu_us_per_msg": summary.median(lambda r: r.throughput.broker_cpu_us_per_msg),
        "rate": args.rate,
        "latency_p50_ms": summary.median(lambda r: r.latency.p50_ms),
        "latency_p99_ms": summary.median(lambda r: r.latency.p99_ms),
        "confirm_p50_ms": summary.median(lambda r: r.latency.confirm_p50_ms),
        "confirm_p99_ms": summary.median(lambda r: r.latency.confirm_p99_ms),
        "memory_rss": asdict(summary.memory_rss) if summary.memory_rss else None,
        "memory_heap": asdict(summary.memory_heap) if summary.memory_heap else None,
        "runs": [asdict(r) for r in summary.reps],
    }
    if args.json:
        print(json.dumps(figures, indent=2))
        return
    print(
        f"durable queue, fsync=always, {VALUE_BYTES} B messages, medians of {args.reps}:\n"
        f"  publish (confirmed) + consume + ack: {figures['end_to_end_msgs_per_s']:,.0f} msg/s "
        f"(publish alone {figures['publish_msgs_per_s']:,.0f} msg/s; broker "
        f"{figures['broker_cpu_us_per_msg']:.1f} µs CPU/msg)\n"
        f"  publish-to-delivery at {args.rate:,.0f} msg/s: p50 "
        f"{figures['latency_p50_ms']:.2f} ms, p99 {figures['latency_p99_ms']:.2f} ms "
        f"(confirm p50 {figures['confirm_p50_ms']:.2f} ms, p99 {figures['confirm_p99_ms']:.2f} ms)"
    )
    for what, mem in (("RSS", summary.memory_rss), ("core heap", summary.memory_heap)):
        if mem:
            print(
                f"  broker memory ({what}): {mem.ready_bytes_per_msg:,.1f} B per ready message, "
                f"{mem.unacked_bytes_per_msg:,.1f} B per delivered unacked message "
                f"({mem.held:,} held)"
            )


if __name__ == "__main__":
    main()
