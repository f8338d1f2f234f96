"""Consumer catch-up throughput: N stored messages of 1 KiB read by one consumer, messages per
second.

Usage::

    python benchmarks/consumer_bench.py [--messages N] [--partitions P] [--fsync POLICY]
        [--max-bytes B] [--max-partition-bytes B] [--sync] [--addr HOST:PORT]

Without ``--addr`` it starts a broker (``python -m tidewire serve``) in a process of its own
on a free port over a temporary data directory (see ``producer_bench.py``). The topic is
filled first with an :class:`AsyncProducer` (untimed); then the clock runs while one
consumer, assigned every partition from ``"earliest"``, iterates record by record until it
has seen all N. It prints one line: messages/s and MB/s.
"""

from __future__ import annotations

import argparse
import os
import time

from producer_bench import VALUE_BYTES, broker, event_loop_note, run
from tidewire.client import AsyncConsumer, AsyncProducer, Consumer


async def fill(addr: str, args: argparse.Namespace) -> None:
    value = os.urandom(VALUE_BYTES // 2).hex().encode()
    async with AsyncProducer(addr, acks="leader", batch_bytes=256 * 1024, linger_ms=20) as producer:
        for _ in range(args.messages):
            await producer.send(args.topic, value)
        await producer.flush()


def _options(args: argparse.Namespace) -> dict[str, int]:
    return {"max_bytes": args.max_bytes, "max_partition_bytes": args.max_partition_bytes}


async def consume_async(addr: str, args: argparse.Namespace) -> tuple[float, int]:
    positions = [(args.topic, p, "earliest") for p in range(args.partitions)]
    async with AsyncConsumer(addr, **_options(args)) as consumer:
        await consumer.assign(positions)
        n = size = 0
        start = time.perf_counter()
        async for record in consumer:
            n += 1
            size += len(record.value or b"")
            if n >= args.messages:
                break
        elapsed = time.perf_counter() - start
    return elapsed, size


def consume_sync(addr: str, args: argparse.Namespace) -> tuple[float, int]:
    positions = [(args.topic, p, "earliest") for p in range(args.partitions)]
    with Consumer(addr, **_options(args)) as consumer:
        consumer.assign(positions)
        size = 0
        start = time.perf_counter()
        for n, record in enumerate(consumer, 1):
            size += len(record.value or b"")
            if n >= args.messages:
                break
        elapsed = time.perf_counter() - start
    return elapsed, size


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--messages", type=int, default=1_000_000)
    ap.add_argument("--fsync", choices=["always", "interval", "never"], default="interval")
    ap.add_argument("--partitions", type=int, default=4)
    ap.add_argument("--max-bytes", type=int, default=16 * 1024 * 1024)
    ap.add_argument("--max-partition-bytes", type=int, default=1024 * 1024)
    ap.add_argument("--sync", action="store_true", help="the blocking Consumer")
    ap.add_argument("--topic", default="bench")
    ap.add_argument("--addr", help="an already running broker (else one is started)")
    args = ap.parse_args()

    def measure(addr: str) -> tuple[float, int]:
        run(fill(addr, args))
        return consume_sync(addr, args) if args.sync else run(consume_async(addr, args))

    if args.addr:
        elapsed, size = measure(args.addr)
    else:
        with broker(args.fsync, args.partitions) as addr:
            elapsed, size = measure(addr)
    rate = args.messages / elapsed
    print(
        f"{'Consumer' if args.sync else 'AsyncConsumer'} partitions={args.partitions} "
        f"max_bytes={args.max_bytes:,} max_partition_bytes={args.max_partition_bytes:,}"
        f"{event_loop_note()}: {args.messages:,} x {VALUE_BYTES} B in {elapsed:.2f} s "
        f"= {rate:,.0f} msg/s, {size / elapsed / 1e6:,.1f} MB/s"
    )


if __name__ == "__main__":
    main()
