"""The clients' throughput and CPU cost per message: catch-up reading, producing, and a
producer with a consumer group live.

Usage::

    python benchmarks/client_speed.py [--tests catchup,produce,live] [--messages N]
        [--produce-messages N] [--live-messages N] [--partitions P] [--batch-bytes B]
        [--max-partition-bytes B] [--live-credit-bytes B] [--reps R]
        [--loop uvloop|asyncio] [--json]

Each test starts its own broker (``python -m tidewire serve`` in a process of its own, on a
free port over a scratch data directory: see ``producer_bench.serve``) and stops it after.
Every figure is the median of ``--reps`` runs (3 by default); the CPU cost per message is
CPU time (user + system) divided by the messages: of this process for the client side, and
of the broker's process (``/proc/<pid>/stat``) for the broker side.

- ``catchup``: ``--messages`` stored values of 1 KiB (filled untimed with ``send_values``,
  then written back to disk with ``os.sync()``), then read from ``"earliest"`` of every
  partition, ``--reps`` times each: record by record through ``async for record in
  AsyncConsumer`` (``record.value`` touched), and a batch at a time through
  ``AsyncConsumer.poll_batch`` (when the client has it); ``--max-partition-bytes``: the
  consumer's fetch size per partition, else its default.
- ``produce``: ``--produce-messages`` sends of 1 KiB, one ``await producer.send(...)`` each,
  acks="durable" (``--batch-bytes``: the producer's batch size, else its default), timed from
  the first send to the end of ``flush()``; against a broker with ``fsync=always`` and with
  ``fsync=interval``; also the client's minor page faults per message (first touches of
  fresh memory: the batches' buffers).
- ``live``: a producer (this process; linger_ms=1, ``--batch-bytes`` or its default) and a
  group of 2 members (a process each, push delivery: ``tidewire bench e2e``'s members) at
  once, unpaced, ``--live-messages``: messages/s delivered to the group; each member's push
  credit window is ``--live-credit-bytes`` (1 MiB by default, as the client's default: with
  the producer's default 1 MiB batches, one pushed batch at a time in flight a member).

Progress goes to stderr; the result is a table on stdout, or one JSON object with ``--json``.
Set ``TIDEWIRE_PURE_PYTHON=1`` to measure the pure-Python record codec.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import statistics
import sys
import time
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

from producer_bench import VALUE_BYTES, serve
from tidewire.client import AsyncClient, AsyncConsumer, AsyncProducer

T = TypeVar("T")
_TICKS = os.sysconf("SC_CLK_TCK")
#: The brokers log warnings only: progress on stderr stays readable.
_quiet = ("--log-level", "WARNING")


def _note(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def _cpu_of(pid: int) -> float:
    """CPU seconds (user + system) a process has used so far."""
    with open(f"/proc/{pid}/stat", encoding="ascii") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _TICKS


def _runner(loop: str) -> Callable[[Coroutine[Any, Any, T]], T]:
    def run(coro: Coroutine[Any, Any, T]) -> T:
        if loop == "uvloop":
            import uvloop

            with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
                return runner.run(coro)
        return asyncio.run(coro)

    return run


def _implementation() -> str:
    from tidewire import records

    return str(getattr(records, "IMPLEMENTATION", "python"))


def _median(runs: list[dict[str, float]]) -> dict[str, float]:
    """Per key, the median over the runs (msg/s and CPU are each a median of their own)."""
    return {k: round(statistics.median(r[k] for r in runs), 2) for k in runs[0]}


def _value() -> bytes:
    return os.urandom(VALUE_BYTES // 2).hex().encode()


# --- catch-up ----------------------------------------------------------------------------------


async def _fill(addr: str, topic: str, n: int) -> None:
    value = _value()
    async with AsyncProducer(addr, acks="leader", batch_bytes=256 * 1024, linger_ms=20) as p:
        chunk = [value] * 10_000
        done = 0
        while done < n:
            k = min(len(chunk), n - done)
            await p.send_values(topic, chunk[:k])
            done += k
        await p.flush()
        if p.failure is not None:
            raise p.failure


async def _read_records(
    addr: str, topic: str, partitions: int, n: int, options: dict[str, int]
) -> tuple[float, float]:
    async with AsyncConsumer(addr, **options) as consumer:
        await consumer.assign([(topic, p, "earliest") for p in range(partitions)])
        got = size = 0
        cpu0, t0 = time.process_time(), time.perf_counter()
        async for record in consumer:
            got += 1
            size += len(record.value or b"")
            if got >= n:
                break
        return time.perf_counter() - t0, time.process_time() - cpu0


async def _read_batches(
    addr: str, topic: str, partitions: int, n: int, options: dict[str, int]
) -> tuple[float, float]:
    async with AsyncConsumer(addr, **options) as consumer:
        await consumer.assign([(topic, p, "earliest") for p in range(partitions)])
        got = 0
        cpu0, t0 = time.process_time(), time.perf_counter()
        while got < n:
            batch = await consumer.poll_batch(10.0, max_records=100_000)  # type: ignore[attr-defined]
            got += len(batch)
        return time.perf_counter() - t0, time.process_time() - cpu0


def catchup(args: argparse.Namespace) -> dict[str, Any]:
    run = _runner(args.loop)
    n, parts = args.messages, args.partitions
    options: dict[str, int] = {}
    if args.max_partition_bytes is not None:
        options["max_partition_bytes"] = args.max_partition_bytes
    out: dict[str, Any] = {}
    with serve(*_quiet, "--fsync", "interval", "--partitions", str(parts)) as b:
        _note(f"catchup: storing {n:,} messages of {VALUE_BYTES} B")
        run(_fill(b.addr, "catchup", n))
        # The fill's GiB of dirty pages is written back now, untimed: otherwise the kernel's
        # writeback threads take CPU from the catch-up runs that follow (the first ones most).
        os.sync()
        readers: list[tuple[str, Any]] = [("consumer_records", _read_records)]
        if hasattr(AsyncConsumer, "poll_batch"):
            readers.append(("consumer_poll_batch", _read_batches))
        for name, reader in readers:
            runs = []
            for rep in range(args.reps):
                cpu_b = _cpu_of(b.pid)
                elapsed, cpu = run(reader(b.addr, "catchup", parts, n, options))
                broker_cpu = _cpu_of(b.pid) - cpu_b
                runs.append(
                    {
                        "msg_per_s": n / elapsed,
                        "client_cpu_us_per_msg": cpu / n * 1e6,
                        "broker_cpu_us_per_msg": broker_cpu / n * 1e6,
                    }
                )
                _note(f"  {name} run {rep + 1}: {n / elapsed:,.0f} msg/s")
            out[name] = _median(runs) | {"runs_msg_per_s": [round(r["msg_per_s"]) for r in runs]}
    return out


# --- produce -----------------------------------------------------------------------------------


async def _produce(
    addr: str, topic: str, n: int, batch_bytes: int | None
) -> tuple[float, float, int]:
    value = _value()
    options = {} if batch_bytes is None else {"batch_bytes": batch_bytes}
    async with AsyncProducer(addr, acks="durable", **options) as producer:
        await (await producer.send(topic, value))  # connect, metadata, producer id
        faults0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        cpu0, t0 = time.process_time(), time.perf_counter()
        fut = None
        for _ in range(n):
            fut = await producer.send(topic, value)
        await producer.flush()
        elapsed, cpu = time.perf_counter() - t0, time.process_time() - cpu0
        faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults0
        assert fut is not None
        await fut  # raises if the last batch failed
    return elapsed, cpu, faults


def produce(args: argparse.Namespace) -> dict[str, Any]:
    run = _runner(args.loop)
    n = args.produce_messages
    out: dict[str, Any] = {}
    for fsync in ("always", "interval"):
        runs = []
        with serve(*_quiet, "--fsync", fsync, "--partitions", str(args.partitions)) as b:
            for rep in range(args.reps):
                cpu_b = _cpu_of(b.pid)
                elapsed, cpu, faults = run(_produce(b.addr, f"produce-{rep}", n, args.batch_bytes))
                broker_cpu = _cpu_of(b.pid) - cpu_b
                runs.append(
                    {
                        "msg_per_s": n / elapsed,
                        "client_cpu_us_per_msg": cpu / n * 1e6,
                        "broker_cpu_us_per_msg": broker_cpu / n * 1e6,
                        # First touches of fresh memory (batch buffers): each costs a fault.
                        "client_minflt_per_msg": faults / n,
                    }
                )
                _note(f"produce fsync={fsync} run {rep + 1}: {n / elapsed:,.0f} msg/s")
        out[f"produce_fsync_{fsync}"] = _median(runs) | {
            "runs_msg_per_s": [round(r["msg_per_s"]) for r in runs]
        }
    return out


# --- live --------------------------------------------------------------------------------------


def live(args: argparse.Namespace) -> dict[str, Any]:
    from tidewire.cli._bench_e2e import run_e2e

    run = _runner(args.loop)
    n = args.live_messages
    runs = []
    with serve(*_quiet, "--fsync", "interval", "--partitions", str(args.partitions)) as b:

        async def once(topic: str) -> Any:
            async with AsyncClient(b.addr) as client:
                await client.create_topic(topic, partitions=args.partitions)
            return await run_e2e(
                b.addr,
                topic,
                n,
                VALUE_BYTES,
                2,
                "push",
                args.live_credit_bytes,
                # The producer's own batch_bytes unless --batch-bytes says otherwise.
                {"acks": "durable", "linger_ms": 1}
                | ({} if args.batch_bytes is None else {"batch_bytes": args.batch_bytes}),
                0,
                10.0,
                {},
                lambda published, delivered: None,
            )

        for rep in range(args.reps):
            cpu_b = _cpu_of(b.pid)
            r = run(once(f"live-{rep}"))
            broker_cpu = _cpu_of(b.pid) - cpu_b
            runs.append(
                {
                    "msg_per_s": r.msg_per_s,
                    "producer_cpu_us_per_msg": r.cpu_s_producer / n * 1e6,
                    "consumer_cpu_us_per_msg": sum(r.cpu_s_consumers) / max(r.delivered, 1) * 1e6,
                    "broker_cpu_us_per_msg": broker_cpu / n * 1e6,
                    "latency_ms_p50": r.latency_ms_p50,
                }
            )
            _note(f"live run {rep + 1}: {r.msg_per_s:,.0f} msg/s delivered")
    return {
        "live_group_of_2": _median(runs) | {"runs_msg_per_s": [round(r["msg_per_s"]) for r in runs]}
    }


TESTS = {"catchup": catchup, "produce": produce, "live": live}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--tests", default="catchup,produce,live", help="comma-separated: " + ", ".join(TESTS)
    )
    ap.add_argument("--messages", type=int, default=1_000_000, help="stored for catchup")
    ap.add_argument("--produce-messages", type=int, default=500_000)
    ap.add_argument("--live-messages", type=int, default=500_000)
    ap.add_argument(
        "--live-credit-bytes",
        type=int,
        default=1024 * 1024,
        help="each live member's push credit window (default 1 MiB, the client's default)",
    )
    ap.add_argument("--partitions", type=int, default=4)
    ap.add_argument(
        "--batch-bytes",
        type=int,
        help="the producer's batch_bytes in produce and live (default: its own)",
    )
    ap.add_argument(
        "--max-partition-bytes",
        type=int,
        help="the consumer's max_partition_bytes in catchup (default: its own)",
    )
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--loop", choices=["uvloop", "asyncio"], default="uvloop")
    ap.add_argument("--json", action="store_true", help="one JSON object on stdout")
    args = ap.parse_args()
    tests = [t.strip() for t in args.tests.split(",") if t.strip()]
    for t in tests:
        if t not in TESTS:
            ap.error(f"unknown test {t!r}: choose from {', '.join(TESTS)}")
    result: dict[str, Any] = {
        "implementation": _implementation(),
        "loop": args.loop,
        "value_bytes": VALUE_BYTES,
        "partitions": args.partitions,
        "produce_batch_bytes": args.batch_bytes or "default",
        "reps": args.reps,
    }
    for t in tests:
        result |= TESTS[t](args)
    if args.json:
        print(json.dumps(result, indent=2))
        return
    impl = result["implementation"]
    print(f"records implementation: {impl}, loop: {args.loop}, medians of {args.reps}")
    for name, figures in result.items():
        if isinstance(figures, dict):
            cells = ", ".join(
                f"{k}={v:,}" if not isinstance(v, list) else f"{k}={v}" for k, v in figures.items()
            )
            print(f"{name}: {cells}")


if __name__ == "__main__":
    main()
