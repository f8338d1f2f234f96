"""Latency of a lone message: publish-to-delivery at a moderate rate, and one message at a time.

Usage::

    python benchmarks/latency.py [--rate 5000] [--seconds 5] [--reps 3]
        [--fsync always,interval] [--consumers pull,push] [--one-s 5]
        [--max-in-flight N] [--json]

It starts ``tidewire serve`` in a process of its own on a free port over a temporary data
directory, and for each rep (the outer loop, so slow drifts of the machine hit every case
alike) measures:

* ``e2e`` (for every ``--fsync`` policy and ``--consumers`` kind): a consumer in a process of
  its own (``pull``: :class:`~tidewire.client.AsyncConsumer`, long-poll fetches; ``push``:
  :class:`~tidewire.client.AsyncSubscriber`) positioned at the end of a new one-partition
  topic with that fsync policy; this process publishes 1 KB messages paced at ``--rate`` for
  ``--seconds`` (``acks="durable"``, ``linger_ms=0``, up to 1,000 futures outstanding, like
  the peer harness). Each value starts with ``CLOCK_MONOTONIC`` in nanoseconds at ``send``;
  the consumer records receive time - that stamp for every message: p50, p99, p99.9, max.
  Broker CPU per message is its user + system time (``/proc/<pid>/stat``) over the paced
  publishing divided by the messages; the producer's and the consumer's are their process
  CPU time over their loops divided by the messages.
* ``one`` (fsync=always): one message at a time, each ``send`` awaited until its durable ack,
  for ``--one-s`` seconds: messages/s, the round trip's p50/p99, broker and producer CPU per
  message.

Progress goes to stderr; ``--json`` prints one JSON object (every rep, and the medians)
instead of the table. The broker and the consumer run the ``tidewire`` that this Python
imports (``PYTHONPATH`` is passed on), so ``PYTHONPATH=other/src`` measures another checkout.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tidewire.client import AsyncClient, AsyncConsumer, AsyncProducer, AsyncSubscriber
from tidewire.protocol.messages import TopicConfig
from tidewire.server.tcp import loop_factory

#: Bytes of every message (the peer harness's size).
SIZE = 1024
#: Futures outstanding at most while publishing paced (the peer harness's window).
WINDOW = 1000
#: The longest the consumer waits for the last messages after the producer's last ack.
DRAIN_S = 10.0


def say(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def quantile(sorted_values: list[int], q: float) -> float:
    if not sorted_values:
        return float("nan")
    i = min(int(q * len(sorted_values)), len(sorted_values) - 1)
    return float(sorted_values[i])


@dataclass
class Broker:
    proc: subprocess.Popen[bytes]
    addr: str

    def cpu_s(self) -> float:
        """CPU seconds the broker has used (user + system)."""
        fields = Path(f"/proc/{self.proc.pid}/stat").read_text().rpartition(")")[2].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@contextlib.contextmanager
def serve(data: str) -> Iterator[Broker]:
    """``tidewire serve`` over ``data`` on a free port, stopped (SIGTERM) on the way out."""
    log = Path(data) / "broker.log"
    Path(data).mkdir(parents=True, exist_ok=True)
    command = [sys.executable, "-m", "tidewire", "serve", "--data-dir", f"{data}/d", "--port", "0"]
    with open(log, "wb") as out:
        proc = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 60
        while True:
            m = re.search(rb"listening on [^\s:]+:(\d+)\s", log.read_bytes())
            if m:
                break
            if proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"the broker did not start (exit code {proc.poll()}); see {log}")
            time.sleep(0.02)
        yield Broker(proc, f"127.0.0.1:{int(m.group(1))}")
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


# --- the consumer process -------------------------------------------------------------------


async def consume(addr: str, topic: str, kind: str, expect: int, limit_s: float) -> None:
    """Read ``expect`` messages from the end of ``topic`` (or until ``limit_s`` passes),
    print ``ready`` once positioned, then one JSON line with every latency (ns)."""
    reader: AsyncConsumer | AsyncSubscriber
    if kind == "push":
        reader = AsyncSubscriber(addr)
        await reader.subscribe([(topic, 0, "latest")])
    else:
        reader = AsyncConsumer(addr)
        await reader.assign([(topic, 0, "latest")])
        await reader.poll(timeout_s=0.05)  # the first fetch, so the long-poll is in place
    print("ready", flush=True)
    latencies: list[int] = []
    clock = time.monotonic_ns
    deadline = time.monotonic() + limit_s
    cpu0 = time.process_time()
    try:
        while len(latencies) < expect and time.monotonic() < deadline:
            records = await reader.poll(timeout_s=0.5, max_records=1000)
            now = clock()
            for r in records:
                assert r.value is not None
                latencies.append(now - int.from_bytes(r.value[:8], "little"))
    finally:
        cpu_s = time.process_time() - cpu0
        await reader.close()
    print(json.dumps({"latencies": latencies, "cpu_s": cpu_s}), flush=True)


# --- the producer side ----------------------------------------------------------------------


def payload_of(stamp: int) -> bytes:
    return stamp.to_bytes(8, "little") + b"x" * (SIZE - 8)


async def make_topic(addr: str, topic: str, fsync: str) -> None:
    async with AsyncClient(addr) as admin:
        await admin.create_topic(topic, partitions=1, config=TopicConfig(fsync=fsync))


#: The producer's ``max_in_flight_per_partition`` (``--max-in-flight``; None: its default).
MAX_IN_FLIGHT: int | None = None


async def open_producer(addr: str, topic: str) -> AsyncProducer:
    options: dict[str, Any] = {}
    if MAX_IN_FLIGHT is not None:
        options["max_in_flight_per_partition"] = MAX_IN_FLIGHT
    p = AsyncProducer(addr, acks="durable", linger_ms=0, **options)
    await p.__aenter__()
    # A first message opens the connection and gets the producer id before the clock starts.
    await (await p.send(topic, payload_of(time.monotonic_ns())))
    return p


async def publish_paced(addr: str, topic: str, rate: int, seconds: float) -> dict[str, Any]:
    """Publish ``rate * seconds`` messages paced; the count, and the acknowledgements'
    latencies (``send`` to the future done, ns) and the batches they went in, to tell the
    produce path's share of publish-to-delivery from the consumer's."""
    p = await open_producer(addr, topic)
    out: deque[Any] = deque()
    n = int(rate * seconds)
    acks: list[int] = []
    batches, last = 0, None
    clock = time.monotonic_ns
    cpu0 = time.process_time()
    try:
        start = time.perf_counter()
        for i in range(n):
            due = start + i / rate
            wait = due - time.perf_counter()
            if wait > 0:
                await asyncio.sleep(wait)
            stamp = clock()
            fut = await p.send(topic, payload_of(stamp))
            fut.add_done_callback(lambda _f, s=stamp: acks.append(clock() - s))
            if fut[0] is not last:  # one partition: a message's batch is new or the last one
                batches, last = batches + 1, fut[0]
            out.append(fut)
            while len(out) >= WINDOW:
                await out.popleft()
        while out:
            await out.popleft()
    finally:
        await p.close()
    acks.sort()
    cpu_us = (time.process_time() - cpu0) / n * 1e6
    return {"sent": n, "acks": acks, "batches": batches, "producer_cpu_us_per_msg": cpu_us}


async def publish_one_at_a_time(addr: str, topic: str, seconds: float) -> dict[str, float]:
    p = await open_producer(addr, topic)
    rtts: list[int] = []
    cpu0 = time.process_time()
    try:
        end = time.perf_counter() + seconds
        clock = time.perf_counter_ns
        while time.perf_counter() < end:
            t = clock()
            await (await p.send(topic, payload_of(time.monotonic_ns())))
            rtts.append(clock() - t)
    finally:
        cpu_s = time.process_time() - cpu0
        await p.close()
    rtts.sort()
    return {
        "messages": len(rtts),
        "rtt_p50_us": quantile(rtts, 0.5) / 1000,
        "rtt_p99_us": quantile(rtts, 0.99) / 1000,
        "producer_cpu_us_per_msg": cpu_s / max(len(rtts), 1) * 1e6,
    }


def run_async(coro: Any) -> Any:
    _, factory = loop_factory("auto")
    with asyncio.Runner(loop_factory=factory) as runner:
        return runner.run(coro)


def e2e(  # noqa: PLR0917 (a benchmark's case: every setting is positional)
    broker: Broker, topic: str, fsync: str, kind: str, rate: int, seconds: float
) -> dict[str, Any]:
    run_async(make_topic(broker.addr, topic, fsync))
    expect = int(rate * seconds) + 1  # and the producer's first message, sent unpaced
    consumer = subprocess.Popen(
        [
            sys.executable,
            __file__,
            "--role",
            "consumer",
            "--addr",
            broker.addr,
            "--topic",
            topic,
            "--consumers",
            kind,
            "--expect",
            str(expect),
            "--limit-s",
            str(seconds + DRAIN_S + 5),
        ],
        stdout=subprocess.PIPE,
    )
    try:
        assert consumer.stdout is not None
        if consumer.stdout.readline().strip() != b"ready":
            raise SystemExit("the consumer did not start")
        cpu0, t0 = broker.cpu_s(), time.perf_counter()
        published = run_async(publish_paced(broker.addr, topic, rate, seconds))
        cpu1, elapsed = broker.cpu_s(), time.perf_counter() - t0
        sent, acks = published["sent"], published["acks"]
        out, _ = consumer.communicate(timeout=seconds + DRAIN_S + 30)
    finally:
        if consumer.poll() is None:
            consumer.kill()
            consumer.wait()
    got = json.loads(out.decode().strip().splitlines()[-1])
    latencies = sorted(got["latencies"])
    return {
        "sent": sent,
        "received": len(latencies),
        "rate": sent / elapsed,
        "p50_ms": quantile(latencies, 0.5) / 1e6,
        "p99_ms": quantile(latencies, 0.99) / 1e6,
        "p999_ms": quantile(latencies, 0.999) / 1e6,
        "max_ms": latencies[-1] / 1e6 if latencies else float("nan"),
        "broker_cpu_us_per_msg": (cpu1 - cpu0) / sent * 1e6,
        "ack_p50_ms": quantile(acks, 0.5) / 1e6,
        "ack_p99_ms": quantile(acks, 0.99) / 1e6,
        "msgs_per_batch": sent / max(published["batches"], 1),
        "producer_cpu_us_per_msg": published["producer_cpu_us_per_msg"],
        "consumer_cpu_us_per_msg": got["cpu_s"] / max(len(latencies), 1) * 1e6,
    }


def one(broker: Broker, topic: str, seconds: float) -> dict[str, Any]:
    run_async(make_topic(broker.addr, topic, "always"))
    cpu0, t0 = broker.cpu_s(), time.perf_counter()
    r = run_async(publish_one_at_a_time(broker.addr, topic, seconds))
    cpu1, elapsed = broker.cpu_s(), time.perf_counter() - t0
    r["msg_per_s"] = r["messages"] / elapsed
    r["broker_cpu_us_per_msg"] = (cpu1 - cpu0) / r["messages"] * 1e6
    return r


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rate", type=int, default=5000, help="messages/s of the paced runs")
    ap.add_argument("--seconds", type=float, default=5.0, help="length of each paced run")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--fsync", default="always,interval", help="policies of the paced runs")
    ap.add_argument("--consumers", default="pull,push", help="pull, push or both")
    ap.add_argument(
        "--one-s", type=float, default=5.0, help="length of the one-at-a-time run (0: none)"
    )
    ap.add_argument(
        "--max-in-flight",
        type=int,
        help="the producer's max_in_flight_per_partition (default: the producer's default)",
    )
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--role", default="bench", help=argparse.SUPPRESS)
    ap.add_argument("--addr", help=argparse.SUPPRESS)
    ap.add_argument("--topic", help=argparse.SUPPRESS)
    ap.add_argument("--expect", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--limit-s", type=float, help=argparse.SUPPRESS)
    args = ap.parse_args()
    global MAX_IN_FLIGHT  # noqa: PLW0603 (a setting of this benchmark's run)
    MAX_IN_FLIGHT = args.max_in_flight
    if args.role == "consumer":
        run_async(consume(args.addr, args.topic, args.consumers, args.expect, args.limit_s))
        return
    if args.rate < 1 or args.seconds <= 0 or args.reps < 1:
        ap.error(
            f"--rate={args.rate}, --seconds={args.seconds}, --reps={args.reps} must be positive"
        )
    policies = [p for p in args.fsync.split(",") if p]
    kinds = [k for k in args.consumers.split(",") if k]
    for k in kinds:
        if k not in ("pull", "push"):
            ap.error(f"--consumers: {k!r} is neither pull nor push")
    reps: list[dict[str, dict[str, Any]]] = []
    with tempfile.TemporaryDirectory(prefix="tidewire-latency-") as tmp, serve(tmp) as broker:
        for rep in range(args.reps):
            results: dict[str, dict[str, Any]] = {}
            for fsync in policies:
                for kind in kinds:
                    name = f"e2e {fsync} {kind}"
                    say(f"rep {rep + 1}/{args.reps}: {name}, {args.rate:,} msg/s, {args.seconds} s")
                    results[name] = e2e(
                        broker, f"lat-{fsync}-{kind}-{rep}", fsync, kind, args.rate, args.seconds
                    )
                    say(f"  {results[name]}")
            if args.one_s > 0:
                say(f"rep {rep + 1}/{args.reps}: one at a time, fsync=always, {args.one_s} s")
                results["one always"] = one(broker, f"lat-one-{rep}", args.one_s)
                say(f"  {results['one always']}")
            reps.append(results)
    medians = {
        name: {key: statistics.median(r[name][key] for r in reps) for key in reps[0][name]}
        for name in reps[0]
    }
    if args.json:
        print(
            json.dumps(
                {"rate": args.rate, "seconds": args.seconds, "reps": reps, "median": medians}
            )
        )
        return
    print(f"medians of {args.reps} (1 KB messages, e2e at {args.rate:,} msg/s)")
    for name, m in medians.items():
        if name.startswith("e2e"):
            print(
                f"{name:22} p50 {m['p50_ms']:.3f} ms  p99 {m['p99_ms']:.3f} ms  "
                f"p99.9 {m['p999_ms']:.3f} ms  max {m['max_ms']:.3f} ms  "
                f"broker {m['broker_cpu_us_per_msg']:.0f} CPU-us/msg  "
                f"ack p50 {m['ack_p50_ms']:.3f} ms  p99 {m['ack_p99_ms']:.3f} ms  "
                f"{m['msgs_per_batch']:.2f} msg/batch  "
                f"producer {m['producer_cpu_us_per_msg']:.0f} / consumer "
                f"{m['consumer_cpu_us_per_msg']:.0f} CPU-us/msg  "
                f"({m['received']:.0f}/{m['sent']:.0f} received)"
            )
        else:
            print(
                f"{name:22} {m['msg_per_s']:,.0f} msg/s  round trip p50 {m['rtt_p50_us']:.0f} us  "
                f"p99 {m['rtt_p99_us']:.0f} us  "
                f"broker {m['broker_cpu_us_per_msg']:.0f} CPU-us/msg  "
                f"producer {m['producer_cpu_us_per_msg']:.0f} CPU-us/msg"
            )


if __name__ == "__main__":
    main()
