"""Producer throughput sanity check: one producer, N messages of 1 KiB, messages per second.

Usage::

    python benchmarks/producer_bench.py [--messages N] [--fsync always|interval|never]
        [--partitions P] [--acks durable|leader|none] [--no-idempotence] [--sync]
        [--compression none|gzip|lz4|zstd] [--addr HOST:PORT]

Without ``--addr`` it starts a broker (``python -m tidewire serve``) in a process of its own
on a free port over a temporary data directory, so the broker and the producer do not share a
CPU, and stops it at the end. The clock runs from the first ``send`` to the end of
``flush()``: every message acknowledged as ``--acks`` asks. One untimed message first creates
the topic and opens the connection. It prints one line: messages/s and MB/s.
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
from collections.abc import Iterator

from tidewire.client import AsyncProducer, Producer

VALUE_BYTES = 1024


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def broker(fsync: str, partitions: int) -> Iterator[str]:
    """A broker process on a free port, stopped (SIGTERM, then SIGKILL) on the way out."""
    with tempfile.TemporaryDirectory(prefix="tidewire-bench-") as data:
        port = _free_port()
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tidewire",
                "serve",
                "--data-dir",
                data,
                "--port",
                str(port),
                "--fsync",
                fsync,
                "--partitions",
                str(partitions),
            ],
            stdout=subprocess.DEVNULL,
        )
        try:
            deadline = time.monotonic() + 30
            while True:
                with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port)):
                    break
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise SystemExit(f"the broker did not start (exit code {proc.poll()})")
                time.sleep(0.05)
            yield f"127.0.0.1:{port}"
        finally:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def options(args: argparse.Namespace) -> dict[str, object]:
    return {
        "acks": args.acks,
        "idempotence": args.idempotence,
        "compression": args.compression,
        "linger_ms": args.linger_ms,
        "batch_bytes": args.batch_bytes,
    }


async def run_async(addr: str, args: argparse.Namespace) -> float:
    value = os.urandom(VALUE_BYTES // 2).hex().encode()
    async with AsyncProducer(addr, **options(args)) as producer:  # type: ignore[arg-type]
        await (await producer.send(args.topic, value))
        start = time.perf_counter()
        for _ in range(args.messages):
            fut = await producer.send(args.topic, value)
        await producer.flush()
        elapsed = time.perf_counter() - start
        await fut  # the last one: raises if it failed
    return elapsed


def run_sync(addr: str, args: argparse.Namespace) -> float:
    value = os.urandom(VALUE_BYTES // 2).hex().encode()
    with Producer(addr, **options(args)) as producer:  # type: ignore[arg-type]
        producer.send(args.topic, value).result(30)
        start = time.perf_counter()
        for _ in range(args.messages):
            fut = producer.send(args.topic, value)
        producer.flush()
        elapsed = time.perf_counter() - start
        fut.result(0)
    return elapsed


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--messages", type=int, default=500_000)
    ap.add_argument("--fsync", choices=["always", "interval", "never"], default="interval")
    ap.add_argument("--partitions", type=int, default=4)
    ap.add_argument("--acks", choices=["durable", "leader", "none"], default="durable")
    ap.add_argument("--no-idempotence", dest="idempotence", action="store_false")
    ap.add_argument("--compression", choices=["none", "gzip", "lz4", "zstd"], default="none")
    ap.add_argument("--linger-ms", type=int, default=5)
    ap.add_argument("--batch-bytes", type=int, default=64 * 1024)
    ap.add_argument("--sync", action="store_true", help="the blocking Producer")
    ap.add_argument("--topic", default="bench")
    ap.add_argument("--addr", help="an already running broker (else one is started)")
    args = ap.parse_args()

    def measure(addr: str) -> float:
        return run_sync(addr, args) if args.sync else asyncio.run(run_async(addr, args))

    if args.addr:
        elapsed = measure(args.addr)
    else:
        with broker(args.fsync, args.partitions) as addr:
            elapsed = measure(addr)
    rate = args.messages / elapsed
    print(
        f"{'Producer' if args.sync else 'AsyncProducer'} fsync={args.fsync} acks={args.acks} "
        f"idempotence={args.idempotence} compression={args.compression} "
        f"partitions={args.partitions}: {args.messages:,} x {VALUE_BYTES} B in {elapsed:.2f} s "
        f"= {rate:,.0f} msg/s, {rate * VALUE_BYTES / 1e6:,.1f} MB/s"
    )


if __name__ == "__main__":
    main()
