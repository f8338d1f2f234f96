"""Producer throughput sanity check: one producer, N messages of 1 KiB, messages per second.

Usage::

    python benchmarks/producer_bench.py [--messages N] [--fsync always|interval|never]
        [--partitions P] [--acks durable|leader|none] [--no-idempotence] [--sync]
        [--compression none|gzip|lz4|zstd] [--batch-bytes B] [--linger-ms MS]
        [--keys K] [--rate R] [--addr HOST:PORT]

Without ``--addr`` it starts a broker (``python -m tidewire serve``) in a process of its own
on a free port over a temporary data directory, so the broker and the producer do not share a
CPU, and stops it at the end. The clock runs from the first ``send`` to the end of
``flush()``: every message acknowledged as ``--acks`` asks. One untimed message first creates
the topic and opens the connection. It prints one line: messages/s and MB/s.

With ``--rate R`` the sends are paced at R messages per second (a burst every millisecond, as
many as the schedule is behind) and it also prints the publish latency of every message,
from just before its ``send`` to its future being resolved: p50, p95, p99 and max.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Coroutine, Iterator
from dataclasses import dataclass
from typing import Any, TypeVar

from tidewire.client import AsyncProducer, Producer, RecordFuture

VALUE_BYTES = 1024
T = TypeVar("T")


def run(coro: Coroutine[Any, Any, T]) -> T:
    """Run ``coro`` on a new event loop."""
    return asyncio.run(coro)


def event_loop_note() -> str:
    """What the result line says about the event loop."""
    return ""


def percentiles(latencies: list[float]) -> str:
    """``p50/p95/p99/max`` of latencies given in seconds, in ms."""
    xs = sorted(latencies)

    def at(q: float) -> float:
        return xs[min(int(q * len(xs)), len(xs) - 1)] * 1000

    return f"p50={at(0.50):.2f} p95={at(0.95):.2f} p99={at(0.99):.2f} max={xs[-1] * 1000:.2f} ms"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass(frozen=True)
class ServedBroker:
    """A broker process :func:`serve` started."""

    addr: str  # host:port of the tidewire protocol
    http: str | None  # host:port of the HTTP API, when it was asked for
    pid: int
    data_dir: str = ""  # its data directory (the first superuser's key file is there)


@contextlib.contextmanager
def serve(*flags: str, http: bool = False) -> Iterator[ServedBroker]:
    """``tidewire serve`` with ``flags`` in a process of its own, on free ports (the HTTP API
    too with ``http``) and a scratch data directory; ready once its ports accept
    connections, stopped (SIGTERM, then SIGKILL) on the way out. Shared by the benchmarks.

    ``BENCH_BROKER_SRC``, when set, is the broker's PYTHONPATH (another tree's
    ``src``): the same client measured against two brokers side by side."""
    env = dict(os.environ)
    if broker_src := env.pop("BENCH_BROKER_SRC", None):
        env["PYTHONPATH"] = broker_src
    with tempfile.TemporaryDirectory(prefix="tidewire-bench-") as data:
        port = _free_port()
        http_port = _free_port() if http else None
        extra = [] if http_port is None else ["--http-port", str(http_port)]
        proc = subprocess.Popen(
            [
                sys.executable,
                *("-m", "tidewire", "serve", "--data-dir", data, "--port", str(port)),
                *extra,
                *flags,
            ],
            stdout=subprocess.DEVNULL,
            env=env,
        )
        try:
            deadline = time.monotonic() + 30
            for p in (port, http_port):
                while p is not None:
                    with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", p)):
                        break
                    if proc.poll() is not None or time.monotonic() > deadline:
                        raise SystemExit(f"the broker did not start (exit code {proc.poll()})")
                    time.sleep(0.05)
            yield ServedBroker(
                f"127.0.0.1:{port}",
                None if http_port is None else f"127.0.0.1:{http_port}",
                proc.pid,
                data,
            )
        finally:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


@contextlib.contextmanager
def broker(fsync: str, partitions: int) -> Iterator[str]:
    """A broker process (see :func:`serve`); its address."""
    with serve("--fsync", fsync, "--partitions", str(partitions)) as b:
        yield b.addr


def options(args: argparse.Namespace) -> dict[str, object]:
    out: dict[str, object] = {
        "acks": args.acks,
        "idempotence": args.idempotence,
        "compression": args.compression,
        "linger_ms": args.linger_ms,
    }
    if args.batch_bytes is not None:  # else the producer's default
        out["batch_bytes"] = args.batch_bytes
    return out


def _keys(args: argparse.Namespace) -> list[bytes | None]:
    """The keys the sends cycle through: ``--keys`` distinct ones, or one None (unkeyed)."""
    return [f"key-{i}".encode() for i in range(args.keys)] if args.keys else [None]


async def run_async(addr: str, args: argparse.Namespace) -> tuple[float, list[float]]:
    value = os.urandom(VALUE_BYTES // 2).hex().encode()
    latencies: list[float] = []
    async with AsyncProducer(addr, **options(args)) as producer:  # type: ignore[arg-type]
        await (await producer.send(args.topic, value))
        start = time.perf_counter()
        if args.rate:
            fut = await _paced_async(producer, value, args, latencies)
        else:
            keys = _keys(args)
            n_keys = len(keys)
            for i in range(args.messages):
                fut = await producer.send(args.topic, value, key=keys[i % n_keys])
        await producer.flush()
        elapsed = time.perf_counter() - start
        await fut  # the last one: raises if it failed
    return elapsed, latencies


async def _paced_async(
    producer: AsyncProducer, value: bytes, args: argparse.Namespace, latencies: list[float]
) -> RecordFuture:
    clock = time.perf_counter
    start = clock()
    sent = 0
    while True:
        due = min(int((clock() - start) * args.rate) + 1, args.messages)
        while sent < due:
            t0 = clock()
            fut = await producer.send(args.topic, value)
            fut.add_done_callback(lambda _, t0=t0: latencies.append(clock() - t0))
            sent += 1
        if sent >= args.messages:
            return fut
        await asyncio.sleep(0.001)


def run_sync(addr: str, args: argparse.Namespace) -> tuple[float, list[float]]:
    value = os.urandom(VALUE_BYTES // 2).hex().encode()
    latencies: list[float] = []
    clock = time.perf_counter
    with Producer(addr, **options(args)) as producer:  # type: ignore[arg-type]
        producer.send(args.topic, value).result(30)
        keys = _keys(args)
        n_keys = len(keys)
        start = clock()
        sent = 0
        while sent < args.messages:
            due = min(int((clock() - start) * args.rate) + 1, args.messages)
            if not args.rate:
                due = args.messages
            while sent < due:
                t0 = clock()
                fut = producer.send(args.topic, value, key=keys[sent % n_keys])
                if args.rate:
                    fut.add_done_callback(lambda _, t0=t0: latencies.append(clock() - t0))
                sent += 1
            if sent < args.messages:
                time.sleep(0.001)
        producer.flush()
        elapsed = clock() - start
        fut.result(0)
    return elapsed, latencies


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--messages", type=int, default=500_000)
    ap.add_argument("--fsync", choices=["always", "interval", "never"], default="interval")
    ap.add_argument("--partitions", type=int, default=4)
    ap.add_argument("--acks", choices=["durable", "leader", "none"], default="durable")
    ap.add_argument("--no-idempotence", dest="idempotence", action="store_false")
    ap.add_argument("--compression", choices=["none", "gzip", "lz4", "zstd"], default="none")
    ap.add_argument("--linger-ms", type=int, default=5)
    ap.add_argument("--batch-bytes", type=int, help="the producer's batch_bytes (default: its own)")
    ap.add_argument(
        "--keys",
        type=int,
        default=0,
        help="key the sends with this many distinct keys in turn (0: unkeyed, sticky "
        "partition); not with --rate on AsyncProducer",
    )
    ap.add_argument("--sync", action="store_true", help="the blocking Producer")
    ap.add_argument(
        "--rate", type=float, default=0, help="pace sends at this many msg/s; print latencies"
    )
    ap.add_argument("--topic", default="bench")
    ap.add_argument("--addr", help="an already running broker (else one is started)")
    args = ap.parse_args()

    def measure(addr: str) -> tuple[float, list[float]]:
        return run_sync(addr, args) if args.sync else run(run_async(addr, args))

    if args.addr:
        elapsed, latencies = measure(args.addr)
    else:
        with broker(args.fsync, args.partitions) as addr:
            elapsed, latencies = measure(addr)
    rate = args.messages / elapsed
    print(
        f"{'Producer' if args.sync else 'AsyncProducer'} fsync={args.fsync} acks={args.acks} "
        f"idempotence={args.idempotence} compression={args.compression} "
        f"partitions={args.partitions} batch_bytes={args.batch_bytes or 'default'} "
        f"keys={args.keys} "
        f"linger_ms={args.linger_ms}{event_loop_note()}: {args.messages:,} x {VALUE_BYTES} B "
        f"in {elapsed:.2f} s = {rate:,.0f} msg/s, {rate * VALUE_BYTES / 1e6:,.1f} MB/s"
        + (f"; paced at {args.rate:,.0f} msg/s: {percentiles(latencies)}" if args.rate else "")
    )


if __name__ == "__main__":
    main()
