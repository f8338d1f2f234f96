"""Kafka clients against tidewire: librdkafka (confluent-kafka) producing and consuming through
the Kafka listener, and tidewire's own client doing the same through its binary protocol, side
by side.

Usage::

    python benchmarks/kafka.py [--messages N] [--partitions P] [--rounds R]
        [--fsync interval,always] [--json]

For each fsync policy it starts a broker (``tidewire serve --fsync F --kafka-port PORT``) in a
process of its own (see ``producer_bench.serve``), then, ``--rounds`` times (3), on a fresh
topic each time:

- **kafka produce**: a confluent-kafka ``Producer``, ``acks=all``, N messages of 1 KB
  (``linger.ms=5``, 1 MB batches, no compression, delivery reports for failures only), timed
  from the first ``produce`` to the end of ``flush()``;
- **kafka catch-up**: a confluent-kafka ``Consumer`` assigned every partition from the
  beginning (no group) reads the N messages back, ``consume()`` asking for at most 10,000 at
  a time;
- **tidewire produce**: tidewire's ``AsyncProducer``, ``acks="durable"`` (the broker's
  answer waits for the fsync policy, as ``acks=all`` does), the same N messages;
- **tidewire catch-up**: tidewire's ``AsyncConsumer`` reads them back.

Each figure is the median of the rounds: messages/s, MB/s (10^6 bytes of values), and the
broker's CPU per message (its utime + stime from ``/proc/PID/stat`` over the timed part,
in microseconds of CPU per message: 10 us/msg is one core busy at 100,000 msg/s), and the
benchmark process's own CPU per message (the client: ``time.process_time``, every thread,
librdkafka's included). Progress
goes to stderr; the table (or with ``--json`` a JSON document) to stdout.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import socket
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from functools import partial
from typing import Any

from confluent_kafka import Consumer, Producer, TopicPartition

from producer_bench import VALUE_BYTES, _free_port, serve
from tidewire.client import AsyncConsumer, AsyncProducer

#: Clock ticks per second of /proc/PID/stat's utime and stime.
TICKS = os.sysconf("SC_CLK_TCK")
#: Bound on one timed phase (s): a stalled run fails instead of hanging.
PHASE_TIMEOUT_S = 600.0


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def cpu_seconds(pid: int) -> float:
    """utime + stime of process ``pid`` (s)."""
    with open(f"/proc/{pid}/stat") as f:
        # the command name (field 2) may hold spaces; the fields after its ')' are fixed
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS  # fields 14 and 15 of stat(5)


def measure(pid: int, n: int, fn: Callable[[], float]) -> dict[str, float]:
    """Run ``fn`` (which returns its own timed seconds) and the broker's CPU meanwhile."""
    cpu0, own0 = cpu_seconds(pid), time.process_time()
    elapsed = fn()
    cpu, own = cpu_seconds(pid) - cpu0, time.process_time() - own0
    return {
        "msg_per_s": n / elapsed,
        "mb_per_s": n * VALUE_BYTES / elapsed / 1e6,
        "broker_cpu_us_per_msg": cpu / n * 1e6,
        "client_cpu_us_per_msg": own / n * 1e6,
        "seconds": elapsed,
    }


def kafka_produce(bootstrap: str, topic: str, n: int, value: bytes) -> float:
    failed: list[Any] = []

    def report(err: Any, _msg: Any) -> None:
        if err is not None:
            failed.append(err)

    # One delivery callback for the producer, called for failures only: a callback per
    # message (``produce(..., on_delivery=...)`` and a report for each success) costs
    # confluent-kafka about 3.3 us of Python per message against 1.7 us without, which alone
    # would cap this loop near 300,000 msg/s.
    p = Producer(
        {
            "bootstrap.servers": bootstrap,
            "acks": "all",
            "linger.ms": 5,
            "batch.size": 1_000_000,
            "queue.buffering.max.messages": 1_000_000,
            "queue.buffering.max.kbytes": 1_048_576,
            "on_delivery": report,
            "delivery.report.only.error": True,
        }
    )
    p.produce(topic, value)  # untimed: metadata and the connection
    p.flush(30)
    start = time.perf_counter()
    for _ in range(n):
        while True:
            try:
                p.produce(topic, value)
                break
            except BufferError:
                p.poll(0.001)  # the local queue is full: serve delivery reports
    remaining = p.flush(PHASE_TIMEOUT_S)
    elapsed = time.perf_counter() - start
    if remaining or failed:
        raise SystemExit(
            f"kafka produce: {remaining} undelivered, {len(failed)} failed: {failed[:3]}"
        )
    return elapsed


def kafka_catch_up(bootstrap: str, topic: str, partitions: int, n: int) -> float:
    c = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": "bench-unused",  # required by the client; no group is joined (assign)
            "enable.auto.commit": False,
            "fetch.max.bytes": 64 * 1024 * 1024,
            "max.partition.fetch.bytes": 8 * 1024 * 1024,
            "queued.min.messages": 200_000,
        }
    )
    try:
        c.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
        seen = 0
        start = time.perf_counter()
        deadline = start + PHASE_TIMEOUT_S
        while seen < n and time.perf_counter() < deadline:
            # No more than are still due: consume() waits for the whole count (or its
            # timeout), so asking 10,000 when 1 is left would time the 1 s timeout too.
            for msg in c.consume(min(10_000, n - seen), 1.0):
                if msg.error() is None:
                    seen += 1
        elapsed = time.perf_counter() - start
    finally:
        c.close()
    if seen < n:
        raise SystemExit(f"kafka catch-up: {seen} of {n} messages")
    return elapsed


def tidewire_produce(addr: str, topic: str, n: int, value: bytes) -> float:
    async def main() -> float:
        async with AsyncProducer(addr, acks="durable", linger_ms=5, batch_bytes=1_000_000) as p:
            await (await p.send(topic, value))
            start = time.perf_counter()
            for _ in range(n):
                fut = await p.send(topic, value)
            await p.flush()
            elapsed = time.perf_counter() - start
            await fut
        return elapsed

    return asyncio.run(asyncio.wait_for(main(), PHASE_TIMEOUT_S))


def tidewire_catch_up(addr: str, topic: str, partitions: int, n: int) -> float:
    async def main() -> float:
        async with AsyncConsumer(
            addr, max_bytes=16 * 1024 * 1024, max_partition_bytes=1024 * 1024
        ) as c:
            await c.assign([(topic, p, "earliest") for p in range(partitions)])
            seen = 0
            start = time.perf_counter()
            async for _ in c:
                seen += 1
                if seen >= n:
                    break
            return time.perf_counter() - start

    return asyncio.run(asyncio.wait_for(main(), PHASE_TIMEOUT_S))


@contextlib.contextmanager
def broker(fsync: str, partitions: int) -> Iterator[tuple[str, str, int]]:
    """A broker process with its Kafka listener: (tidewire addr, kafka bootstrap, pid)."""
    kafka_port = _free_port()
    flags = ("--fsync", fsync, "--partitions", str(partitions), "--kafka-port", str(kafka_port))
    with serve(*flags) as b:
        deadline = time.monotonic() + 30
        while True:
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", kafka_port)):
                break
            if time.monotonic() > deadline:
                raise SystemExit("the broker's Kafka listener did not start")
            time.sleep(0.05)
        yield b.addr, f"127.0.0.1:{kafka_port}", b.pid


def run_policy(fsync: str, args: argparse.Namespace) -> dict[str, dict[str, float]]:
    value = os.urandom(VALUE_BYTES // 2).hex().encode()
    rounds: dict[str, list[dict[str, float]]] = {}
    with broker(fsync, args.partitions) as (addr, bootstrap, pid):
        for r in range(args.rounds):
            k, t = f"kafka-{r}", f"tidewire-{r}"
            n = args.messages
            # each catch-up reads the untimed first message too
            phases: list[tuple[str, Callable[[], float]]] = [
                ("kafka produce", partial(kafka_produce, bootstrap, k, n, value)),
                ("kafka catch-up", partial(kafka_catch_up, bootstrap, k, args.partitions, n + 1)),
                ("tidewire produce", partial(tidewire_produce, addr, t, n, value)),
                ("tidewire catch-up", partial(tidewire_catch_up, addr, t, args.partitions, n + 1)),
            ]
            for name, fn in phases:
                m = measure(pid, n, fn)
                rounds.setdefault(name, []).append(m)
                log(
                    f"fsync={fsync} round {r + 1}/{args.rounds} {name}: "
                    f"{m['msg_per_s']:,.0f} msg/s, {m['mb_per_s']:.1f} MB/s, "
                    f"{m['broker_cpu_us_per_msg']:.1f} us broker CPU/msg, "
                    f"{m['client_cpu_us_per_msg']:.1f} us client CPU/msg"
                )
    return {
        name: {key: statistics.median(m[key] for m in ms) for key in ms[0]}
        for name, ms in rounds.items()
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--messages", type=int, default=200_000)
    ap.add_argument("--partitions", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--fsync", default="interval,always", help="comma-separated policies")
    ap.add_argument("--json", action="store_true", help="print the results as JSON")
    args = ap.parse_args()
    results = {f: run_policy(f, args) for f in args.fsync.split(",")}
    doc = {
        "messages": args.messages,
        "value_bytes": VALUE_BYTES,
        "partitions": args.partitions,
        "rounds": args.rounds,
        "cpus": os.cpu_count(),
        "loadavg": os.getloadavg()[0],
        "results": results,
    }
    if args.json:
        print(json.dumps(doc, indent=2))
        return
    print(
        f"{args.messages:,} messages of {VALUE_BYTES} B, {args.partitions} partitions, "
        f"medians of {args.rounds}"
    )
    print(
        f"{'fsync':<9} {'phase':<18} {'msg/s':>10} {'MB/s':>7} {'broker CPU us/msg':>18} "
        f"{'client CPU us/msg':>18}"
    )
    for fsync, phases in results.items():
        for name, m in phases.items():
            print(
                f"{fsync:<9} {name:<18} {m['msg_per_s']:>10,.0f} {m['mb_per_s']:>7.1f} "
                f"{m['broker_cpu_us_per_msg']:>18.1f} {m['client_cpu_us_per_msg']:>18.1f}"
            )


if __name__ == "__main__":
    main()
