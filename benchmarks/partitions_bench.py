"""Many partitions: what 10,000 partitions cost the broker, as one topic of 10,000 and as
10,000 topics of one, and whether the other clients notice.

Usage::

    python benchmarks/partitions_bench.py [--partitions N] [--shape wide|topics|both]
        [--messages M] [--idle-s S] [--nofile L] [--create-in-flight K] [--create-only]
        [--json]

For each shape (``--shape``, default both: "wide", one topic of N partitions; "topics", N
topics of one partition), it starts ``tidewire serve`` (``--fsync interval``, the default) in a
process of its own on a free port over a new temporary data directory, with the descriptor
limit ``--nofile`` if given (soft and hard, as ``ulimit -n`` sets them), and measures, while a
second client pings the broker every 5 ms on a connection of its own (the "ping" figures:
p50/p99/max of those pings during that step):

* ``create``: creating the N partitions (partitions/s; the topics ``--create-in-flight``
  requests at a time, default 50: 1 is a user creating topics one after the other);
* ``produce``: one 100-byte message to every partition, 200 requests in flight, each
  acknowledged after its fsync (``acks=durable``, the client's default: messages/s);
* ``publish``: M more messages (``--messages``, default 200,000) of 1 KB, 10 to a request,
  round robin over every partition, 200 requests in flight, ``acks=leader`` (written, not
  yet synced) and then as many ``acks=durable`` (messages/s and MB/s each);
* ``idle``: the broker's CPU over ``--idle-s`` seconds (default 10) with no client doing
  anything, one second after the last publish (user + system time from /proc; % of a core);
* ``metadata``: one metadata request for every topic (ms);
* ``rss``, ``fds``: the broker's resident memory (VmRSS) and open descriptors then;
* ``restart``: SIGKILL, then a start over the same data directory until the port accepts
  connections and a metadata request is answered (s), then every partition's end offset
  checked against the messages acknowledged to it (``lost`` counts the ones missing);
* ``delete`` (wide only): deleting the topic (s);
* ``stop``: SIGTERM to the restarted broker until it has exited (s): its clean shutdown,
  every partition's last flush, producer state and indexes written.

``--create-only`` measures the create step alone (then stops the broker and removes its data
directory). On ext4 without a journal, as on the reference machine, removing a directory of
thousands of partitions slows the inode allocations of the next minutes (the file system
skips recently freed inodes), so creation figures of runs close together are comparable only
side by side, alternating.

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
from tidewire.protocol.messages import ACKS_DURABLE, ACKS_LEADER, MetadataRequest

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


async def create_all(client: AsyncClient, shape: str, n: int, in_flight: int = 50) -> None:
    if shape == "wide":
        await client.create_topic("wide", n)
        return
    for start in range(0, n, in_flight):
        await asyncio.gather(
            *(client.create_topic(f"t-{i}", 1) for i in range(start, min(start + in_flight, n)))
        )


def partitions_of(shape: str, n: int) -> list[tuple[str, int]]:
    return [("wide", p) for p in range(n)] if shape == "wide" else [(f"t-{i}", 0) for i in range(n)]


async def publish(
    client: AsyncClient, parts: list[tuple[str, int]], messages: int, acks: int
) -> dict[tuple[str, int], int]:
    """``messages`` of 1 KB, 10 to a request, round robin; the messages each partition got."""
    batch = [Message(b"x" * 1024) for _ in range(10)]
    sent: dict[tuple[str, int], int] = {}
    requests = messages // len(batch)
    for start in range(0, requests, IN_FLIGHT):
        targets = [parts[i % len(parts)] for i in range(start, min(start + IN_FLIGHT, requests))]
        await asyncio.gather(*(client.produce(t, p, batch, acks=acks) for t, p in targets))
        for key in targets:
            sent[key] = sent.get(key, 0) + len(batch)
    return sent


async def measure_create(
    broker: Broker, client: AsyncClient, shape: str, n: int, *, in_flight: int
) -> dict[str, Any]:
    what = f"a topic of {n:,} partitions" if shape == "wide" else f"{n:,} topics of one"
    say(f"[{shape}] creating {what} ...")
    cpu = broker.cpu_s()
    _, took, pings = await watched(broker.addr, lambda: create_all(client, shape, n, in_flight))
    say(f"  {took:.2f} s: {n / took:,.0f} partitions/s; pings {pings}")
    return {
        "s": round(took, 3),
        "partitions_per_s": round(n / took),
        "in_flight": 1 if shape == "wide" else in_flight,
        "broker_cpu_us_per_partition": round((broker.cpu_s() - cpu) / n * 1e6),
        "ping": pings,
    }


async def create_only(broker: Broker, shape: str, n: int, *, in_flight: int) -> dict[str, Any]:
    async with AsyncClient(broker.addr) as client:
        return {"create": await measure_create(broker, client, shape, n, in_flight=in_flight)}


async def measure_running(
    broker: Broker, shape: str, n: int, messages: int, idle_s: float, *, in_flight: int
) -> tuple[dict[str, Any], dict[tuple[str, int], int]]:
    out: dict[str, Any] = {}
    parts = partitions_of(shape, n)
    expected = dict.fromkeys(parts, 0)
    async with AsyncClient(broker.addr) as client:
        out["create"] = await measure_create(broker, client, shape, n, in_flight=in_flight)

        async def produce_all() -> None:
            for start in range(0, n, IN_FLIGHT):
                await asyncio.gather(
                    *(
                        client.produce(t, p, [Message(b"x" * 100)])
                        for t, p in parts[start : start + IN_FLIGHT]
                    )
                )

        say(f"[{shape}] one message to each of {n:,} partitions, acks=durable ...")
        _, took, pings = await watched(broker.addr, produce_all)
        for key in parts:
            expected[key] += 1
        out["produce"] = {"s": round(took, 3), "messages_per_s": round(n / took), "ping": pings}
        say(f"  {took:.2f} s: {n / took:,.0f} messages/s; pings {pings}")

        for name, acks in (("leader", ACKS_LEADER), ("durable", ACKS_DURABLE)):
            say(f"[{shape}] publishing {messages:,} messages of 1 KB over them, acks={name} ...")
            cpu = broker.cpu_s()
            sent, took, pings = await watched(
                broker.addr, lambda acks=acks: publish(client, parts, messages, acks)
            )
            used = broker.cpu_s() - cpu
            total = sum(sent.values())
            for key, k in sent.items():
                expected[key] += k
            out[f"publish_{name}"] = {
                "messages": total,
                "s": round(took, 3),
                "messages_per_s": round(total / took),
                "mb_per_s": round(total * 1024 / took / 1e6, 1),
                "broker_cpu_us_per_message": round(used / total * 1e6, 1),
                "ping": pings,
            }
            say(f"  {took:.2f} s: {total / took:,.0f} messages/s; pings {pings}")

        await asyncio.sleep(1)  # the last interval flushes and a checkpoint
        say(f"[{shape}] idle for {idle_s:g} s with data in each of {n:,} partitions ...")
        cpu, started = broker.cpu_s(), time.perf_counter()
        await asyncio.sleep(idle_s)
        used = broker.cpu_s() - cpu
        out["idle"] = {
            "s": round(time.perf_counter() - started, 2),
            "cpu_s": round(used, 3),
            "cpu_percent": round(100 * used / (time.perf_counter() - started), 2),
        }
        say(f"  {used:.2f} CPU seconds: {out['idle']['cpu_percent']}% of a core")

        say(f"[{shape}] metadata for every topic ...")
        described, took, pings = await watched(broker.addr, lambda: metadata(client))
        out["metadata"] = {"partitions": described, "ms": round(took * 1000, 1), "ping": pings}
        say(f"  {described:,} partitions described in {took * 1000:.1f} ms; pings {pings}")
        await asyncio.sleep(1.5)  # a checkpoint and a flush round: steady state
        out["rss_mib"] = round(broker.rss_mib(), 1)
        out["fds"] = broker.fds()
        say(f"broker: {out['rss_mib']} MiB resident, {out['fds']} descriptors open")
    return out, expected


async def check_data(broker: Broker, expected: dict[tuple[str, int], int]) -> dict[str, Any]:
    """Every partition's end offset against the messages acknowledged to it."""
    lost = 0
    async with AsyncClient(broker.addr) as client:
        items = list(expected.items())
        for start in range(0, len(items), IN_FLIGHT):
            chunk = items[start : start + IN_FLIGHT]
            ends = await asyncio.gather(*(client.list_offset(t, p, -1) for (t, p), _ in chunk))
            lost += sum(max(0, want - end) for (_, want), end in zip(chunk, ends, strict=True))
    return {"partitions_checked": len(expected), "lost": lost}


async def measure_restarted(broker: Broker, shape: str, n: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    async with AsyncClient(broker.addr) as client:
        await metadata(client)
        out["rss_mib_after_restart"] = round(broker.rss_mib(), 1)
        out["fds_after_restart"] = broker.fds()
        if shape == "wide":
            say(f"[{shape}] deleting the topic of {n:,} partitions ...")
            _, took, pings = await watched(broker.addr, lambda: client.delete_topic("wide"))
            out["delete"] = {"s": round(took, 3), "ping": pings}
            say(f"  {took:.2f} s; pings {pings}")
    return out


def run_shape(shape: str, args: argparse.Namespace) -> dict[str, Any]:
    n = args.partitions
    result: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="tidewire-partitions-") as data:
        port = _free_port()
        if args.create_only:
            with serve(data, port, args.nofile) as broker:
                return asyncio.run(create_only(broker, shape, n, in_flight=args.create_in_flight))
        with serve(data, port, args.nofile) as broker:
            running, expected = asyncio.run(
                measure_running(
                    broker, shape, n, args.messages, args.idle_s, in_flight=args.create_in_flight
                )
            )
            result.update(running)
            say(f"[{shape}] SIGKILL ...")
            broker.proc.kill()
            broker.proc.wait()
        say(f"[{shape}] restarting ...")
        started = time.perf_counter()
        with serve(data, port, args.nofile) as broker:

            async def first_answer() -> None:
                async with AsyncClient(broker.addr) as client:
                    await metadata(client)

            asyncio.run(first_answer())
            result["restart_after_kill_s"] = round(time.perf_counter() - started, 2)
            say(f"  answering after {result['restart_after_kill_s']} s")
            result["restart_load"] = round(os.getloadavg()[0], 2)
            result["data_after_restart"] = asyncio.run(check_data(broker, expected))
            say(f"  {result['data_after_restart']}")
            result.update(asyncio.run(measure_restarted(broker, shape, n)))
            say(f"[{shape}] SIGTERM ...")
            stopping = time.perf_counter()
            stop(broker.proc)
            result["stop_s"] = round(time.perf_counter() - stopping, 2)
            result["stop_exit_code"] = broker.proc.returncode
            say(f"  stopped after {result['stop_s']} s (exit code {result['stop_exit_code']})")
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--partitions", type=int, default=10_000)
    ap.add_argument("--shape", choices=("wide", "topics", "both"), default="both")
    ap.add_argument(
        "--messages", type=int, default=200_000, help="1 KB messages of each publish step"
    )
    ap.add_argument("--idle-s", type=float, default=10.0, help="seconds of the idle step")
    ap.add_argument("--nofile", type=int, default=None, help="descriptor limit of the broker")
    ap.add_argument(
        "--create-in-flight", type=int, default=50, help="topic creations in flight at once"
    )
    ap.add_argument(
        "--create-only",
        action="store_true",
        help="only the create step of each shape (the broker is stopped after it)",
    )
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    args = ap.parse_args()
    if args.partitions < 1 or args.messages < 10 or args.create_in_flight < 1:
        ap.error(
            f"--partitions={args.partitions} and --create-in-flight={args.create_in_flight} "
            f"must be >= 1 and --messages={args.messages} >= 10"
        )
    shapes = ("wide", "topics") if args.shape == "both" else (args.shape,)
    result: dict[str, Any] = {
        "partitions": args.partitions,
        "nofile": args.nofile,
        "load_at_start": round(os.getloadavg()[0], 2),
    }
    for shape in shapes:
        result[shape] = run_shape(shape, args)
    if args.json:
        print(json.dumps(result, indent=2))
        return
    print(f"partitions_bench: {args.partitions:,} partitions")
    for shape in shapes:
        print(f"  {shape}:")
        for key, value in result[shape].items():
            print(f"    {key}: {value}")


if __name__ == "__main__":
    main()
