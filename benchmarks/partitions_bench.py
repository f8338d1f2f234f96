"""Many partitions: what a topic of 10,000 partitions costs the broker, and whether the other
clients notice.

Usage::

    python benchmarks/partitions_bench.py [--partitions N] [--topics T] [--idle-s S]
        [--nofile L] [--json]

It starts ``tidewire serve`` (``--fsync interval``, the default) in a process of its own on a
free port over a temporary data directory, with the descriptor limit ``--nofile`` if given
(soft and hard, as ``ulimit -n`` sets them), and measures, while a second client pings the
broker every 5 ms on a connection of its own (the "ping" figures: p50/p99/max of those pings
during that step):

* ``create``: creating one topic of N partitions (partitions/s);
* ``produce``: one small message to every partition, 200 requests in flight (messages/s);
* ``metadata``: one metadata request for every topic (ms), after T topics of one partition more
  were created (``--topics``, default 1,000: with the big one, N + T partitions);
* ``idle``: after one message more to each of the T topics, the broker's CPU over
  ``--idle-s`` seconds (default 10) with no client doing anything (user + system time from
  /proc; % of one core);
* ``rss``, ``fds``: the broker's resident memory (VmRSS) and open descriptors then;
* ``restart``: SIGTERM, then a start over the same data directory until the port accepts
  connections and a metadata request is answered (s);
* ``delete``: deleting the big topic (s).

Progress goes to stderr; ``--json`` prints one JSON object instead of the table.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from tidewire.client import AsyncClient, Message
from tidewire.protocol.messages import MetadataRequest

T = TypeVar("T")
#: Pings of the watching client: one every this many seconds.
PING_EVERY_S = 0.005
#: Produce requests in flight at once.
IN_FLIGHT = 200


def say(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Broker:
    proc: subprocess.Popen[bytes]
    addr: str

    def rss_mib(self) -> float:
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
        return float("nan")

    def fds(self) -> int:
        return len(os.listdir(f"/proc/{self.proc.pid}/fd"))

    def cpu_s(self) -> float:
        """CPU seconds the broker has used (user + system)."""
        fields = Path(f"/proc/{self.proc.pid}/stat").read_text().rpartition(")")[2].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@contextlib.contextmanager
def serve(data: str, port: int, nofile: int | None) -> Iterator[Broker]:
    """``tidewire serve`` over ``data`` on ``port``, stopped (SIGTERM) on the way out."""

    command = [sys.executable, "-m", "tidewire", "serve", "--data-dir", data, "--port", str(port)]
    if nofile is not None:  # as a shell's ulimit -n sets it, soft and hard
        command = ["sh", "-c", f'ulimit -n {int(nofile)} && exec "$0" "$@"', *command]
    proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 300
        while True:
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port)):
                break
            if proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"the broker did not start (exit code {proc.poll()})")
            time.sleep(0.01)
        yield Broker(proc, f"127.0.0.1:{port}")
    finally:
        stop(proc)


def stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(120)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@dataclass
class Pinger:
    """Pings the broker on a connection of its own; keeps every round trip."""

    addr: str
    rtts: list[float] = field(default_factory=list)

    async def run(self, stop: asyncio.Event) -> None:
        async with AsyncClient(self.addr) as client:
            while not stop.is_set():
                started = time.perf_counter()
                await client.ping()
                self.rtts.append(time.perf_counter() - started)
                await asyncio.sleep(PING_EVERY_S)


def ping_stats(rtts: list[float]) -> dict[str, float]:
    if not rtts:
        return {}
    xs = sorted(rtts)

    def at(q: float) -> float:
        return round(xs[min(int(q * len(xs)), len(xs) - 1)] * 1000, 2)

    return {"p50_ms": at(0.5), "p99_ms": at(0.99), "max_ms": round(xs[-1] * 1000, 2)}


async def watched(addr: str, work: Callable[[], Awaitable[T]]) -> tuple[T, float, dict[str, float]]:
    """Run ``work`` while a pinger watches; its result, seconds taken, ping figures."""
    stop_ = asyncio.Event()
    pinger = Pinger(addr)
    task = asyncio.create_task(pinger.run(stop_))
    await asyncio.sleep(0.2)
    pinger.rtts.clear()
    started = time.perf_counter()
    result = await work()
    took = time.perf_counter() - started
    stop_.set()
    await task
    return result, took, ping_stats(pinger.rtts)


async def metadata(client: AsyncClient) -> int:
    """One metadata request for every topic; the partitions it describes."""
    body = await client._call(MetadataRequest())  # no public wrapper
    return sum(len(t.partitions) for t in body.body.topics)


async def measure_running(broker: Broker, n: int, topics: int, idle_s: float) -> dict[str, Any]:
    out: dict[str, Any] = {}
    async with AsyncClient(broker.addr) as client:
        say(f"creating a topic of {n:,} partitions ...")
        _, took, pings = await watched(broker.addr, lambda: client.create_topic("wide", n))
        out["create"] = {"s": round(took, 3), "partitions_per_s": round(n / took), "ping": pings}
        say(f"  {took:.2f} s: {n / took:,.0f} partitions/s; pings {pings}")

        async def produce_all() -> None:
            for start in range(0, n, IN_FLIGHT):
                await asyncio.gather(
                    *(
                        client.produce("wide", p, [Message(b"x" * 100)])
                        for p in range(start, min(start + IN_FLIGHT, n))
                    )
                )

        say(f"one message to each of {n:,} partitions ...")
        _, took, pings = await watched(broker.addr, produce_all)
        out["produce"] = {"s": round(took, 3), "messages_per_s": round(n / took), "ping": pings}
        say(f"  {took:.2f} s: {n / took:,.0f} messages/s; pings {pings}")

        say(f"creating {topics:,} topics of one partition ...")

        async def create_small() -> None:
            for start in range(0, topics, 50):
                await asyncio.gather(
                    *(
                        client.create_topic(f"small-{i}", 1)
                        for i in range(start, min(start + 50, topics))
                    )
                )

        _, took, pings = await watched(broker.addr, create_small)
        out["create_small"] = {
            "topics": topics,
            "s": round(took, 3),
            "topics_per_s": round(topics / took) if topics else 0,
            "ping": pings,
        }
        say(f"  {took:.2f} s; pings {pings}")

        async def one_each() -> None:
            for start in range(0, topics, IN_FLIGHT):
                await asyncio.gather(
                    *(
                        client.produce(f"small-{i}", 0, [Message(b"x" * 100)])
                        for i in range(start, min(start + IN_FLIGHT, topics))
                    )
                )

        await one_each()
        say(f"idle for {idle_s:g} s with one message in each of {n + topics:,} partitions ...")
        await asyncio.sleep(1)  # the last interval flushes and a checkpoint
        cpu, started = broker.cpu_s(), time.perf_counter()
        await asyncio.sleep(idle_s)
        used = broker.cpu_s() - cpu
        out["idle"] = {
            "s": round(time.perf_counter() - started, 2),
            "cpu_s": round(used, 3),
            "cpu_percent": round(100 * used / (time.perf_counter() - started), 2),
        }
        say(f"  {used:.2f} CPU seconds: {out['idle']['cpu_percent']}% of a core")

        say("metadata for every topic ...")
        parts, took, pings = await watched(broker.addr, lambda: metadata(client))
        out["metadata"] = {"partitions": parts, "ms": round(took * 1000, 1), "ping": pings}
        say(f"  {parts:,} partitions described in {took * 1000:.1f} ms; pings {pings}")
        await asyncio.sleep(1)  # a checkpoint and a flush round: steady state
        out["rss_mib"] = round(broker.rss_mib(), 1)
        out["fds"] = broker.fds()
        say(f"broker: {out['rss_mib']} MiB resident, {out['fds']} descriptors open")
    return out


async def measure_restarted(broker: Broker, n: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    async with AsyncClient(broker.addr) as client:
        await metadata(client)
        out["rss_mib_after_restart"] = round(broker.rss_mib(), 1)
        out["fds_after_restart"] = broker.fds()
        say(f"deleting the topic of {n:,} partitions ...")
        _, took, pings = await watched(broker.addr, lambda: client.delete_topic("wide"))
        out["delete"] = {"s": round(took, 3), "ping": pings}
        say(f"  {took:.2f} s; pings {pings}")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--partitions", type=int, default=10_000)
    ap.add_argument("--topics", type=int, default=1_000)
    ap.add_argument("--idle-s", type=float, default=10.0, help="seconds of the idle step")
    ap.add_argument("--nofile", type=int, default=None, help="descriptor limit of the broker")
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    args = ap.parse_args()
    n = args.partitions
    result: dict[str, Any] = {"partitions": n, "topics": args.topics, "nofile": args.nofile}
    with tempfile.TemporaryDirectory(prefix="tidewire-partitions-") as data:
        port = _free_port()
        with serve(data, port, args.nofile) as broker:
            result.update(asyncio.run(measure_running(broker, n, args.topics, args.idle_s)))
            say("stopping ...")
            started = time.perf_counter()
            stop(broker.proc)
            result["stop_s"] = round(time.perf_counter() - started, 2)
        say("restarting ...")
        started = time.perf_counter()
        with serve(data, port, args.nofile) as broker:

            async def first_answer() -> None:
                async with AsyncClient(broker.addr) as client:
                    await metadata(client)

            asyncio.run(first_answer())
            result["restart_s"] = round(time.perf_counter() - started, 2)
            say(f"  answering after {result['restart_s']} s")
            result.update(asyncio.run(measure_restarted(broker, n)))
    if args.json:
        print(json.dumps(result, indent=2))
        return
    print(f"partitions_bench: {n:,} partitions + {args.topics:,} topics of one")
    for key, value in result.items():
        print(f"  {key}: {value}")


if __name__ == "__main__":
    main()
