"""Lightweight streams at scale: creation rate and memory per stream, eviction of idle
streams, restart time, long-poll receive latency with many waiting receivers, and the disk
space per-message TTL gives back.

Usage::

    python benchmarks/streams.py [--streams N] [--reps R] [--only create,evict,restart,
        longpoll,ttl] [--value-bytes B] [--batch B] [--in-flight F] [--fsync POLICY]
        [--idle-ms MS] [--http-receivers H] [--binary-receivers K] [--streams-per-receive S]
        [--binary-connections C] [--sends M] [--send-rate R] [--ttl-segments G]
        [--segment-bytes B] [--timeout S] [--json]

    python benchmarks/streams.py --streams 20000 --http-receivers 500 \\
        --binary-receivers 5000 --sends 200 --reps 1        # a quick run, ~1 minute

Every part starts ``tidewire serve`` in a process of its own on free loopback ports over a
scratch data directory (so the broker and this client do not share an interpreter) and
stops it by its PID at the end (SIGTERM, then SIGKILL). Stream ids are 16 characters
(``s-`` and 14 digits). Progress goes to stderr; ``--json`` prints the figures as one
JSON object.

- **create**: N streams, each created by one persistent message of ``--value-bytes``
  through :meth:`client.streams.send_many` (requests of ``--batch`` items, ``--in-flight``
  of them under way at once), at the broker's default fsync policy unless ``--fsync``:
  streams per second from the first send to the last answer. The broker's resident
  memory (``RssAnon``: its heap, not the page cache of the log files) once settled,
  before and after: bytes per stream. A persistent message's value is in the log on disk,
  not in the index, so that figure is all index; the in-memory bytes the broker accounts
  for itself (``StreamStats.in_memory_bytes``) are subtracted anyway. Medians of ``--reps``
  fresh brokers.
- **evict**: one broker with ``stream_idle_ms`` = ``--idle-ms``; per rep, N in-memory
  messages to N distinct streams, all taken with ``receive_many`` (1,000 streams per
  request), then the time until the broker's idle eviction has forgotten them all
  (``stats().streams`` 0) and its RSS then, against its baseline before the first rep
  (CPython keeps freed memory for reuse: the later reps show whether it is reused).
- **restart**: the last create rep's broker (N persistent streams) stopped with SIGTERM
  and started again ``--reps`` times: seconds from the process's start to its first
  successful request (``describe`` of the last stream created, which must answer with its
  one persistent message: the index is rebuilt by then) and to ``stats()`` answering N
  streams; its RSS after the rebuild.
- **longpoll**: H streams each with one HTTP long-poll receiver
  (``GET /v1/streams/{id}/messages?wait_ms=..``, one keep-alive connection each, the
  requests written and the answers read by hand, or with ``--http-client httpx`` through
  httpx, whose own cost per request then dominates this process's CPU) and K
  streams each with one binary-protocol receiver (``receive_many`` of
  ``--streams-per-receive`` streams per request, 1 by default: K requests waiting at once,
  over ``--binary-connections`` connections), all waiting at once (the broker's
  ``stats().receivers``, which counts waiting requests, says so before the clock starts);
  then ``--sends`` in-memory sends at ``--send-rate`` per second, each to a random stream
  that is not holding an undelivered one, half to HTTP streams and half to binary ones:
  latency from just before the send to the receiver having the message (one process, one
  clock); p50/p99/max per kind. The receivers re-issue their request at once after each
  answer. Medians of ``--reps`` rounds over the same receivers. Beside each round (and once
  with nothing sent) runs a probe of the machine itself, a process that only sleeps 1 ms at
  a time: its late wake-ups are stalls of the machine, and each answer over 10 ms is
  checked against them (with the CPU time the hypervisor stole, from ``/proc/stat``).
- **ttl**: a broker with ``stream_segment_bytes`` = ``--segment-bytes``; persistent
  messages of 1 KiB with a TTL of 3 s fill ``--ttl-segments`` segments of ``__streams``;
  the bytes of the ``__streams`` partition directories on disk then, and once the messages
  have expired and the broker has deleted the whole segments they held.

Measured on the 2-core development machine with nothing else running (load average 0.7 to
1.2; details, earlier runs, what still falls short and the commands:
``benchmarks/results/streams.md``), medians of 3::

    create 1,000,000 persistent streams: 214,287 streams/s (213,306-252,381); the broker's
        CPU 3.9-4.6 µs per stream; 468 B/stream; broker RSS 490 MiB
    restart with 1,000,000: first answer 3.9 s after the process started (index 2.3-2.8 s)
    eviction: 1,000,000 emptied streams forgotten 1.3 s after stream_idle_ms; RSS 1,222 MiB
        full -> 89-101 MiB after eviction (baseline 43 MiB)
    long-poll, 10,000 HTTP + 100,000 binary receivers waiting: HTTP p50 1.1 ms, p99 2.9 ms;
        binary p50 0.8 ms, p99 2.4 ms; 4 of 3,000 answers over 10 ms (max 17.3 ms), none
        while the machine probe saw a stall
    TTL reclaim: __streams 8,668,488 B -> 415,776 B on disk 3.5 s after the last send
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import json
import os
import random
import re
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from tidewire.broker.streams.model import SendItem, StreamStats
from tidewire.client import AsyncClient

#: Requests of send_many/receive_many carry at most this many items (the client's own split).
MAX_BATCH = 10_000
#: Long-poll wait of the receivers, ms (they re-issue it when it ends with nothing): the
#: broker's longest (stream_max_wait_ms), so that no wait started at the setup ends during
#: the rounds (with 60 s, the 110,000 receives started together all ended and came again
#: mid-round, and the broker spent seconds on them).
LONG_POLL_MS = 300_000
#: Bytes of each message of the ttl part.
TTL_VALUE_BYTES = 1024
TTL_MS = 3000
#: An answer slower than this (ms) is the issue's bound for a long-poll receiver.
SLOW_MS = 10.0
#: A stall of the machine itself, as the probe sees it: a 1 ms sleep that ends this many ms
#: late. The probe reports every wake-up over 2 ms late; 5 ms is what attributes a slow answer.
MACHINE_STALL_MS = 5.0

#: The probe of the machine's own stalls, run in a process of its own beside the broker and
#: this client: it sleeps 1 ms at a time and does nothing else, so a wake-up that comes late
#: is time the machine (the hypervisor's scheduling of this VM's vCPUs, or the kernel) took
#: from every process, not work of tidewire's. One line per wake-up over 2 ms late:
#: "<perf_counter before the sleep> <perf_counter after it>" (CLOCK_MONOTONIC: the same clock
#: in every process of the machine).
PROBE = """
import sys, time
out = sys.stdout
while True:
    t0 = time.perf_counter()
    time.sleep(0.001)
    t1 = time.perf_counter()
    if t1 - t0 > 0.003:
        out.write(f"{t0:.6f} {t1:.6f}\\n")
        out.flush()
"""


def progress(msg: str) -> None:
    """``msg`` on stderr, after the machine's load average (1 and 5 minutes) at the time:
    on a shared machine, a figure means little without it."""
    one, five, _ = os.getloadavg()
    print(f"[load {one:.2f} {five:.2f}] {msg}", file=sys.stderr, flush=True)


def load1() -> float:
    """The machine's load average over the last minute."""
    return round(os.getloadavg()[0], 2)


def quantile(xs: Sequence[float], q: float) -> float:
    s = sorted(xs)
    return s[min(int(q * len(s)), len(s) - 1)] if s else 0.0


def stream_id(prefix: str, i: int) -> str:
    """A 16-character stream id."""
    return f"{prefix}-{i:014d}"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _proc_status(pid: int, name: str) -> int:
    """A ``kB`` field of /proc/PID/status, in bytes."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(name + ":"):
                return int(line.split()[1]) * 1024
    raise SystemExit(f"/proc/{pid}/status has no {name}")


def cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process (all its threads), from /proc."""
    with open(f"/proc/{pid}/stat") as f:
        parts = f.read().rsplit(")", 1)[1].split()
    return (int(parts[11]) + int(parts[12])) / os.sysconf("SC_CLK_TCK")


def steal_ticks() -> tuple[int, int]:
    """The machine's stolen and total CPU time so far (``/proc/stat``, clock ticks): time
    the hypervisor ran something else while this VM's vCPUs had work."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    return fields[7], sum(fields[:8])


class MachineProbe:
    """:data:`PROBE` in a process of its own while a round runs: the machine's stalls over
    it (intervals on the perf_counter clock) and the share of CPU time stolen from the VM."""

    def __init__(self) -> None:
        self.stalls: list[tuple[float, float]] = []
        self.steal_pct = 0.0
        self._proc: subprocess.Popen[str] | None = None
        self._steal0 = (0, 0)

    def __enter__(self) -> MachineProbe:
        self._steal0 = steal_ticks()
        self._proc = subprocess.Popen(
            [sys.executable, "-c", PROBE], stdout=subprocess.PIPE, text=True
        )
        return self

    def __exit__(self, *exc: object) -> None:
        steal, total = steal_ticks()
        ds, dt = steal - self._steal0[0], total - self._steal0[1]
        self.steal_pct = 100 * ds / dt if dt else 0.0
        assert self._proc is not None
        self._proc.terminate()
        out, _ = self._proc.communicate(timeout=30)
        self.stalls = [(float(a), float(b)) for a, b in (line.split() for line in out.splitlines())]

    def longest_ms(self) -> float:
        """The longest stall: how late the latest wake-up came beyond its 1 ms."""
        return max(((b - a) * 1000 - 1 for a, b in self.stalls), default=0.0)

    def count(self, over_ms: float) -> int:
        return sum((b - a) * 1000 - 1 > over_ms for a, b in self.stalls)

    def stalled_during(self, t0: float, t1: float, over_ms: float) -> bool:
        """Whether a stall longer than ``over_ms`` overlaps ``[t0, t1]``."""
        return any(b > t0 and a < t1 and (b - a) * 1000 - 1 > over_ms for a, b in self.stalls)


def dir_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


class Broker:
    """``tidewire serve`` over ``data_dir``, started (and started again) on free ports;
    stopped by its PID."""

    def __init__(self, data_dir: Path, env: dict[str, str], flags: Sequence[str], http: bool):
        self.data_dir = data_dir
        self.env = env
        self.flags = list(flags)
        self.http = http
        self.proc: subprocess.Popen[bytes] | None = None
        self.port = 0
        self.http_port = 0
        self.started_at = 0.0
        self.starts = 0

    @property
    def addr(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.http_port}"

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def start(self) -> None:
        """Start it; returns once its ports accept connections."""
        self.port = _free_port()
        extra = []
        if self.http:
            self.http_port = _free_port()
            extra = ["--http-port", str(self.http_port)]
        self.started_at = time.perf_counter()
        self.starts += 1
        log = open(self.data_dir.parent / f"server-{self.starts}.log", "wb")  # noqa: SIM115
        self.proc = subprocess.Popen(
            [
                sys.executable,
                *("-m", "tidewire", "serve", "--data-dir", str(self.data_dir)),
                *("--port", str(self.port), *extra, *self.flags),
            ],
            stdout=subprocess.DEVNULL,
            stderr=log,
            env={**os.environ, **self.env},
        )
        log.close()
        deadline = time.monotonic() + 120
        for p in (self.port, self.http_port if self.http else None):
            while p is not None:
                with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", p)):
                    break
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    raise SystemExit(
                        f"the broker did not start (exit code {self.proc.poll()}):\n"
                        + self.log_tail()
                    )
                time.sleep(0.01)

    def log_tail(self, chars: int = 3000) -> str:
        """The end of the latest start's stderr."""
        return (self.data_dir.parent / f"server-{self.starts}.log").read_text()[-chars:]

    def stop(self) -> None:
        proc, self.proc = self.proc, None
        if proc is None:
            return
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()

    def rss_anon(self) -> int:
        return _proc_status(self.pid, "RssAnon")

    def vm_rss(self) -> int:
        return _proc_status(self.pid, "VmRSS")

    async def settled_rss(self) -> int:
        """RssAnon once it stops moving."""
        last = self.rss_anon()
        for _ in range(40):
            await asyncio.sleep(0.25)
            now = self.rss_anon()
            if abs(now - last) < 256 * 1024:
                return now
            last = now
        return last


@contextlib.contextmanager
def broker(env: dict[str, str] | None = None, *flags: str, http: bool = False) -> Iterator[Broker]:
    with tempfile.TemporaryDirectory(prefix="tidewire-streams-bench-") as data:
        b = Broker(Path(data) / "data", env or {}, flags, http)
        b.start()
        try:
            yield b
        finally:
            b.stop()


def stream_env(**settings: int) -> dict[str, str]:
    """``TIDEWIRE_STREAM_*`` environment variables of ``serve`` settings."""
    return {f"TIDEWIRE_{k.upper()}": str(v) for k, v in settings.items()}


def fsync_flags(args: argparse.Namespace) -> list[str]:
    return ["--fsync", args.fsync] if args.fsync else []


async def send_all(
    client: AsyncClient, items: Sequence[SendItem], batch: int, in_flight: int
) -> None:
    """``items`` through ``send_many`` in requests of ``batch``, ``in_flight`` at once;
    every result must be "stored"."""
    slots = asyncio.Semaphore(in_flight)
    failures: list[str] = []

    async def one(chunk: Sequence[SendItem]) -> None:
        try:
            results = await client.streams.send_many(chunk)
        finally:
            slots.release()
        bad = [(it.stream, r.code, r.message) for it, r in zip(chunk, results, strict=True)]
        bad = [b for b in bad if b[1] != 0]
        if bad:
            failures.append(f"{len(bad):,} of {len(chunk):,} sends failed, first: {bad[0]}")

    tasks = []
    for i in range(0, len(items), batch):
        await slots.acquire()
        if failures:
            break
        tasks.append(asyncio.create_task(one(items[i : i + batch])))
    await asyncio.gather(*tasks)
    if failures:
        raise SystemExit(failures[0])


# -- create --------------------------------------------------------------------------------


@dataclass
class Create:
    streams: int
    seconds: float
    streams_per_s: float
    rss_before: int
    rss_after: int
    vm_rss_after: int
    in_memory_bytes: int
    bytes_per_stream: float
    log_bytes: int
    broker_cpu_us_per_stream: float
    client_cpu_us_per_stream: float
    #: The machine's 1-minute load average when the figure was taken.
    load: float = field(default_factory=load1)


async def create(b: Broker, args: argparse.Namespace, prefix: str = "s") -> Create:
    n = args.streams
    value = b"v" * args.value_bytes
    async with AsyncClient(b.addr, request_timeout_s=args.timeout) as client:
        # Untimed: the connection, the __streams topic, every path once.
        await client.streams.send("warm-up", value, persistent=True)
        rss0 = await b.settled_rss()
        items = [SendItem(stream_id(prefix, i), value, persistent=True) for i in range(n)]
        cpu0, client0 = cpu_s(b.pid), time.process_time()
        start = time.perf_counter()
        await send_all(client, items, args.batch, args.in_flight)
        elapsed = time.perf_counter() - start
        cpu, client_cpu = cpu_s(b.pid) - cpu0, time.process_time() - client0
        del items
        rss1 = await b.settled_rss()
        stats: StreamStats = await client.streams.stats()
        if stats.streams < n or stats.persistent_messages < n:
            raise SystemExit(
                f"after {n:,} sends the broker holds {stats.streams:,} streams and "
                f"{stats.persistent_messages:,} persistent messages"
            )
        info = await client.streams.describe(stream_id(prefix, n - 1))
        if info is None or info.persistent != 1:
            raise SystemExit(f"describe of the last stream created: {info}")
    return Create(
        n,
        elapsed,
        n / elapsed,
        rss0,
        rss1,
        b.vm_rss(),
        stats.in_memory_bytes,
        (rss1 - rss0 - stats.in_memory_bytes) / n,
        stats.log_bytes,
        cpu / n * 1e6,
        client_cpu / n * 1e6,
    )


# -- evict ---------------------------------------------------------------------------------


@dataclass
class Evict:
    streams: int
    rss_baseline: int
    rss_full: int
    rss_taken: int
    rss_evicted: int
    in_memory_bytes_full: int
    evict_s: float
    streams_after: int
    evicted: int
    bytes_per_stream_full: float
    #: The machine's 1-minute load average when the figure was taken.
    load: float = field(default_factory=load1)


async def evict_round(
    b: Broker, args: argparse.Namespace, client: AsyncClient, base: int, rep: int
) -> Evict:
    n = args.streams
    ids = [stream_id(f"e{rep}", i) for i in range(n)]
    value = b"v" * args.value_bytes
    await send_all(client, [SendItem(s, value) for s in ids], args.batch, args.in_flight)
    full = await b.settled_rss()
    stats = await client.streams.stats()
    in_mem = stats.in_memory_bytes
    if stats.streams < n:
        raise SystemExit(f"{n:,} in-memory sends, {stats.streams:,} streams")
    taken = 0
    slots = asyncio.Semaphore(args.in_flight)

    async def take(chunk: list[str]) -> None:
        nonlocal taken
        async with slots:
            got = await client.streams.receive_many(chunk, max_messages=len(chunk))
        taken += len(got)

    await asyncio.gather(*(take(ids[i : i + 1000]) for i in range(0, n, 1000)))
    if taken != n:
        raise SystemExit(f"{n:,} in-memory messages sent, {taken:,} taken")
    taken_rss = await b.settled_rss()
    start = time.perf_counter()
    deadline = start + args.idle_ms / 1000 + args.timeout
    evicted_before = stats.evicted
    while (stats := await client.streams.stats()).streams > 0:
        if time.perf_counter() > deadline:
            raise SystemExit(
                f"{stats.streams:,} streams left {time.perf_counter() - start:.0f} s after "
                f"they were emptied (stream_idle_ms={args.idle_ms:,})"
            )
        await asyncio.sleep(0.1)
    evict_s = time.perf_counter() - start
    evicted = await b.settled_rss()
    return Evict(
        n,
        base,
        full,
        taken_rss,
        evicted,
        in_mem,
        evict_s,
        stats.streams,
        stats.evicted - evicted_before,
        (full - base - in_mem) / n,
    )


async def evict(b: Broker, args: argparse.Namespace) -> list[Evict]:
    out = []
    async with AsyncClient(b.addr, request_timeout_s=args.timeout) as client:
        # Untimed: every path once, then its own eviction.
        await client.streams.send("warm-up", b"x")
        await client.streams.receive("warm-up")
        await asyncio.sleep(args.idle_ms / 1000 + 2)
        base = await b.settled_rss()
        for rep in range(1, args.reps + 1):
            e = await evict_round(b, args, client, base, rep)
            progress(
                f"evict rep {rep}/{args.reps}: {e.streams:,} in-memory streams: RSS "
                f"{mib(e.rss_baseline)} -> {mib(e.rss_full)} full ({e.bytes_per_stream_full:,.0f} "
                f"B/stream beyond {e.in_memory_bytes_full / e.streams:,.0f} B of values) -> "
                f"{mib(e.rss_taken)} taken -> {mib(e.rss_evicted)} evicted "
                f"{e.evict_s:.1f} s after the last take ({e.evicted:,} evicted, "
                f"{e.streams_after} left)"
            )
            out.append(e)
    return out


# -- restart -------------------------------------------------------------------------------


@dataclass
class Restart:
    streams: int
    ready_s: float
    stats_s: float
    listening_s: float
    rss: int
    #: What the broker's log says the rebuild of the index took (-1: no such line).
    load_s: float = -1.0
    #: The machine's 1-minute load average when the figure was taken.
    load: float = field(default_factory=load1)


async def _first_answer(b: Broker, last: str, n: int) -> Restart:
    async with AsyncClient(b.addr, request_timeout_s=120) as client:
        listening = time.perf_counter() - b.started_at
        info = await client.streams.describe(last)
        ready = time.perf_counter() - b.started_at
        if info is None or info.persistent != 1:
            raise SystemExit(f"after a restart, describe({last!r}) = {info}")
        stats = await client.streams.stats()
        stats_s = time.perf_counter() - b.started_at
        if stats.streams < n:
            raise SystemExit(f"after a restart, {stats.streams:,} streams of {n:,}")
    return Restart(n, ready, stats_s, listening, await b.settled_rss())


def restart(b: Broker, args: argparse.Namespace) -> list[Restart]:
    out = []
    for rep in range(1, args.reps + 1):
        b.stop()
        b.start()
        r = asyncio.run(_first_answer(b, stream_id("s", args.streams - 1), args.streams))
        if m := re.search(r"loaded from __streams in ([\d.]+) s", b.log_tail(100_000)):
            r.load_s = float(m.group(1))
        progress(
            f"restart {rep}/{args.reps} with {r.streams:,} persistent streams: ports open "
            f"{r.listening_s:.2f} s, first answer {r.ready_s:.2f} s, stats {r.stats_s:.2f} s "
            f"after the process started (the broker's log: index rebuilt in {r.load_s:.2f} s);"
            f" RSS {mib(r.rss)}"
        )
        out.append(r)
    return out


# -- longpoll ------------------------------------------------------------------------------


@dataclass
class Latency:
    kind: str
    receivers: int
    sends: int
    p50_ms: float
    p99_ms: float
    max_ms: float
    #: Answers slower than SLOW_MS.
    slow: int = 0
    #: Of those, the ones during which the machine probe saw a stall over MACHINE_STALL_MS.
    slow_in_machine_stall: int = 0
    #: The round's machine probe: stalls over MACHINE_STALL_MS, the longest, CPU stolen.
    machine_stalls: int = 0
    machine_longest_ms: float = 0.0
    steal_pct: float = 0.0
    #: The machine's 1-minute load average when the figure was taken.
    load: float = field(default_factory=load1)


@dataclass
class _Waiting:
    """Sends whose message has not been received yet: stream -> send time (perf_counter)."""

    sent_at: dict[str, float] = field(default_factory=dict)
    http_lat: list[float] = field(default_factory=list)
    bin_lat: list[float] = field(default_factory=list)
    delivered: asyncio.Event = field(default_factory=asyncio.Event)
    errors: list[str] = field(default_factory=list)
    #: Answers slower than SLOW_MS: (the list they were counted in, send time, receipt time).
    slow: list[tuple[list[float], float, float]] = field(default_factory=list)

    def got(self, stream: str, into: list[float]) -> None:
        now = time.perf_counter()
        t0 = self.sent_at.pop(stream, None)
        if t0 is None:
            self.errors.append(f"{stream}: a message nobody sent (or received twice)")
            return
        into.append((now - t0) * 1000)
        if into[-1] > SLOW_MS:
            self.slow.append((into, t0, now))
        if not self.sent_at:
            self.delivered.set()


def _http_count(body: Any) -> int:
    """Messages in a long-poll answer (a list, or an object holding ``messages``)."""
    if isinstance(body, dict):
        body = body.get("messages", [])
    if not isinstance(body, list):
        raise SystemExit(f"a long-poll answer that is not a list of messages: {body!r:.200}")
    return len(body)


async def _http_receiver(http: Any, stream: str, w: _Waiting) -> None:
    from urllib.parse import quote

    path = f"/v1/streams/{quote(stream, safe='')}/messages"
    params = {"wait_ms": str(LONG_POLL_MS), "max": "1"}
    while True:
        r = await http.get(path, params=params)
        if r.status_code != 200:
            w.errors.append(f"GET {path}: {r.status_code} {r.text[:200]}")
            return
        for _ in range(_http_count(r.json())):
            w.got(stream, w.http_lat)


async def _raw_http_receiver(host: str, port: int, stream: str, w: _Waiting) -> None:
    """The same long-poll as :func:`_http_receiver`, written and read by hand on one
    keep-alive connection (HTTP/1.1, answers with a Content-Length): what the broker
    answers, without an HTTP client library's own cost per request."""
    from urllib.parse import quote

    path = f"/v1/streams/{quote(stream, safe='')}/messages?wait_ms={LONG_POLL_MS}&max=1"
    request = f"GET {path} HTTP/1.1\r\nHost: {host}:{port}\r\n\r\n".encode()
    reader, writer = await asyncio.open_connection(host, port)
    try:
        while True:
            writer.write(request)
            head = await reader.readuntil(b"\r\n\r\n")
            status = head.split(b" ", 2)[1]
            length = 0
            for line in head.split(b"\r\n")[1:]:
                name, _, v = line.partition(b":")
                if name.strip().lower() == b"content-length":
                    length = int(v)
            body = await reader.readexactly(length)
            if status != b"200":
                w.errors.append(f"GET {path}: {status!r} {body[:200]!r}")
                return
            for _ in range(_http_count(json.loads(body))):
                w.got(stream, w.http_lat)
    finally:
        writer.close()


async def _binary_receiver(client: AsyncClient, streams: list[str], w: _Waiting) -> None:
    while True:
        got = await client.streams.receive_many(
            streams, max_messages=len(streams), wait_ms=LONG_POLL_MS
        )
        for m in got:
            w.got(m.stream, w.bin_lat)


async def longpoll(b: Broker, args: argparse.Namespace) -> list[tuple[Latency, ...]]:
    import httpx

    h, k, per = args.http_receivers, args.binary_receivers, args.streams_per_receive
    http_ids = [stream_id("h", i) for i in range(h)]
    bin_ids = [stream_id("b", i) for i in range(k)]
    w = _Waiting()
    timeout_s = LONG_POLL_MS / 1000 + 60
    # One httpx client per 100 receivers: a pool's cost grows with its connections.
    https = [
        httpx.AsyncClient(
            base_url=b.url,
            timeout=timeout_s,
            limits=httpx.Limits(max_connections=100, max_keepalive_connections=100),
        )
        for _ in range(0, h if args.http_client == "httpx" else 0, 100)
    ]
    requests = -(-k // per)
    conns = [
        AsyncClient(
            b.addr,
            request_timeout_s=timeout_s,
            max_in_flight=-(-requests // args.binary_connections) + 1,
        )
        for _ in range(args.binary_connections)
    ]
    sender = AsyncClient(b.addr, request_timeout_s=args.timeout)
    tasks: list[asyncio.Task[None]] = []
    rounds: list[tuple[Latency, ...]] = []
    pauses = _GcPauses()
    try:
        # The binary connections first, then the HTTP receivers 500 at a time, each batch
        # waiting before the next: 10,000 connections opened in one burst kept the broker's
        # loop busy past the clients' connect timeout on a loaded machine.
        for c in [sender, *conns]:
            await c.ping()
        for i, s in enumerate(http_ids):
            if args.http_client == "httpx":
                receiver = _http_receiver(https[i // 100], s, w)
            else:
                receiver = _raw_http_receiver("127.0.0.1", b.http_port, s, w)
            tasks.append(asyncio.create_task(receiver))
            if i % 500 == 499 or i == h - 1:
                await _wait_receivers(sender, i + 1, tasks, w, args.timeout)
        for j, i in enumerate(range(0, k, per)):
            conn = conns[j % len(conns)]
            tasks.append(asyncio.create_task(_binary_receiver(conn, bin_ids[i : i + per], w)))
        # The broker counts waiting requests (a receive of many streams is one).
        await _wait_receivers(sender, h + requests, tasks, w, args.timeout)
        stats = await sender.streams.stats()
        progress(
            f"longpoll: {stats.receivers:,} receives waiting ({h:,} HTTP, {k:,} streams over "
            f"{requests:,} binary requests on {len(conns)} connections), broker RSS "
            f"{mib(b.rss_anon())}"
        )
        # This process is the measuring instrument: its collector, walking the receivers'
        # objects, paused it for up to 40 ms at a time (seen through gc.callbacks), which
        # showed as the broker's latency. Off during the rounds (they make little garbage).
        gc.collect()
        gc.freeze()
        gc.disable()
        pauses = _GcPauses()
        gc.callbacks.append(pauses.callback)
        # The machine alone, everything waiting and nothing sent: its own stalls.
        with MachineProbe() as idle:
            await asyncio.sleep(args.sends / args.send_rate)
        progress(
            f"longpoll: the machine with nothing sent, {args.sends / args.send_rate:.0f} s: "
            f"{idle.count(MACHINE_STALL_MS)} stalls over {MACHINE_STALL_MS:.0f} ms of an idle "
            f"1 ms sleeper, the longest {idle.longest_ms():.1f} ms; {idle.steal_pct:.1f}% of "
            "the CPU time stolen by the hypervisor"
        )
        for rep in range(1, args.reps + 1):
            w.http_lat, w.bin_lat, w.slow = [], [], []
            pauses.longest_ms = 0.0
            cpu0, client0, start = cpu_s(b.pid), time.process_time(), time.perf_counter()
            with MachineProbe() as probe:
                await _paced_sends(sender, http_ids, bin_ids, w, args)
            elapsed = time.perf_counter() - start
            progress(
                f"longpoll rep {rep}/{args.reps}: {args.sends:,} sends in {elapsed:.1f} s; CPU "
                f"busy: broker {(cpu_s(b.pid) - cpu0) / elapsed:.0%}, this client "
                f"{(time.process_time() - client0) / elapsed:.0%} (its longest GC pause "
                f"{pauses.longest_ms:.1f} ms); the machine: {probe.count(MACHINE_STALL_MS)} "
                f"stalls over {MACHINE_STALL_MS:.0f} ms, the longest {probe.longest_ms():.1f} ms, "
                f"{probe.steal_pct:.1f}% stolen"
            )
            if w.errors:
                raise SystemExit(w.errors[0])
            lat = tuple(
                Latency(
                    kind,
                    n,
                    len(xs),
                    *_pcts(xs),
                    slow=sum(into is xs for into, _, _ in w.slow),
                    slow_in_machine_stall=sum(
                        into is xs and probe.stalled_during(t0, t1, MACHINE_STALL_MS)
                        for into, t0, t1 in w.slow
                    ),
                    machine_stalls=probe.count(MACHINE_STALL_MS),
                    machine_longest_ms=probe.longest_ms(),
                    steal_pct=probe.steal_pct,
                )
                for kind, n, xs in (("http", h, w.http_lat), ("binary", k, w.bin_lat))
            )
            for x in lat:
                progress(
                    f"longpoll rep {rep}/{args.reps} {x.kind} ({x.receivers:,} receivers, "
                    f"{x.sends:,} sends): p50 {x.p50_ms:.2f} ms, p99 {x.p99_ms:.2f} ms, max "
                    f"{x.max_ms:.2f} ms; {x.slow} over {SLOW_MS:.0f} ms, "
                    f"{x.slow_in_machine_stall} of them while the machine stalled"
                )
            rounds.append(lat)
    finally:
        with contextlib.suppress(ValueError):
            gc.callbacks.remove(pauses.callback)
        gc.enable()
        gc.unfreeze()
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for c in [*conns, sender]:
            await c.close()
        for hc in https:
            await hc.aclose()
    return rounds


class _GcPauses:
    """The longest garbage collection of this process (gc.callbacks)."""

    def __init__(self) -> None:
        self.longest_ms = 0.0
        self._start = 0.0

    def callback(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._start = time.perf_counter()
        else:
            self.longest_ms = max(self.longest_ms, (time.perf_counter() - self._start) * 1000)


async def _wait_receivers(
    client: AsyncClient, n: int, tasks: list[asyncio.Task[None]], w: _Waiting, timeout: float
) -> None:
    """Until the broker counts ``n`` waiting receives (a failed receiver: its error)."""
    deadline = time.perf_counter() + timeout
    while (stats := await client.streams.stats()).receivers < n:
        for t in tasks:
            if t.done():
                t.result()
        if w.errors:
            raise SystemExit(w.errors[0])
        if time.perf_counter() > deadline:
            raise SystemExit(
                f"only {stats.receivers:,} of {n:,} receives waiting after {timeout:.0f} s"
            )
        await asyncio.sleep(0.05)


def _pcts(xs: list[float]) -> tuple[float, float, float]:
    return quantile(xs, 0.5), quantile(xs, 0.99), max(xs, default=0.0)


async def _paced_sends(
    sender: AsyncClient,
    http_ids: list[str],
    bin_ids: list[str],
    w: _Waiting,
    args: argparse.Namespace,
) -> None:
    """``--sends`` in-memory sends at ``--send-rate``/s, alternately to a random HTTP and a
    random binary stream that holds no undelivered message; returns once all are received."""
    rng = random.Random(1)
    tasks: set[asyncio.Task[None]] = set()
    w.delivered.clear()

    async def send(stream: str) -> None:
        await sender.streams.send(stream, b"x" * 64)

    start = time.perf_counter()
    for i in range(args.sends):
        ids = http_ids if (i % 2 == 0 and http_ids) or not bin_ids else bin_ids
        while (s := rng.choice(ids)) in w.sent_at:
            pass
        w.sent_at[s] = time.perf_counter()
        t = asyncio.create_task(send(s))
        tasks.add(t)
        t.add_done_callback(tasks.discard)
        delay = start + (i + 1) / args.send_rate - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
    while tasks:
        await asyncio.gather(*tasks)
    # The event may have been set while the sends went on (all delivered so far): again.
    w.delivered.clear()
    if w.sent_at:
        try:
            await asyncio.wait_for(w.delivered.wait(), args.timeout)
        except TimeoutError:
            raise SystemExit(
                f"{len(w.sent_at):,} sends not received {args.timeout:.0f} s later"
            ) from None


# -- ttl -----------------------------------------------------------------------------------


@dataclass
class Ttl:
    messages: int
    segment_bytes: int
    disk_before: int
    disk_after: int
    log_bytes_before: int
    log_bytes_after: int
    reclaim_s: float
    #: Seconds from the last send to the index counting no persistent message.
    expired_s: float
    #: The machine's 1-minute load average when the figure was taken.
    load: float = field(default_factory=load1)


def streams_dirs(data_dir: Path) -> list[Path]:
    return [p for p in data_dir.iterdir() if p.is_dir() and p.name.startswith("__streams-")]


async def ttl(b: Broker, args: argparse.Namespace) -> Ttl:
    n = args.ttl_segments * args.segment_bytes // TTL_VALUE_BYTES
    value = b"t" * TTL_VALUE_BYTES
    async with AsyncClient(b.addr, request_timeout_s=args.timeout) as client:
        items = [
            SendItem(stream_id("t", i % 1000), value, ttl_ms=TTL_MS, persistent=True)
            for i in range(n)
        ]
        await send_all(client, items, 100, args.in_flight)
        before = sum(dir_bytes(p) for p in streams_dirs(b.data_dir))
        log_before = (await client.streams.stats()).log_bytes
        progress(
            f"ttl: {n:,} persistent messages of {TTL_VALUE_BYTES} B, TTL {TTL_MS} ms: "
            f"__streams {before:,} B on disk ({log_before:,} B by the broker's count)"
        )
        start = time.perf_counter()
        deadline = start + TTL_MS / 1000 + args.timeout
        while True:
            await asyncio.sleep(0.5)
            now = sum(dir_bytes(p) for p in streams_dirs(b.data_dir))
            if now < before // 4 or time.perf_counter() > deadline:
                break
        reclaim = time.perf_counter() - start
        # The index counts its expired entries out on the timer wheel's tick, which may come
        # after the segments were deleted (about a second later): wait for it, bounded.
        while (stats := await client.streams.stats()).persistent_messages:
            if time.perf_counter() > deadline:
                raise SystemExit(
                    f"{stats.persistent_messages:,} persistent messages "
                    f"{time.perf_counter() - start:.1f} s after the last send (TTL {TTL_MS} ms)"
                )
            await asyncio.sleep(0.1)
        expired = time.perf_counter() - start
        return Ttl(
            n, args.segment_bytes, before, now, log_before, stats.log_bytes, reclaim, expired
        )


# -- main ----------------------------------------------------------------------------------


def mib(n: float) -> str:
    return f"{n / 2**20:,.1f} MiB"


PARTS = ("create", "evict", "restart", "longpoll", "ttl")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--streams", type=int, default=1_000_000, help="streams (default 1000000)")
    ap.add_argument("--reps", type=int, default=3, help="repetitions; figures are medians")
    ap.add_argument("--only", default=",".join(PARTS), help="parts to run, comma-separated")
    ap.add_argument("--value-bytes", type=int, default=64)
    ap.add_argument("--batch", type=int, default=MAX_BATCH, help="items per send request")
    ap.add_argument("--in-flight", type=int, default=4, help="send requests under way")
    ap.add_argument("--fsync", default="", help="the broker's fsync policy (default: its own)")
    ap.add_argument("--idle-ms", type=int, default=2000, help="evict: stream_idle_ms")
    ap.add_argument("--http-receivers", type=int, default=10_000)
    ap.add_argument(
        "--http-client",
        choices=("raw", "httpx"),
        default="raw",
        help="longpoll: HTTP written by hand on keep-alive connections, or httpx",
    )
    ap.add_argument("--binary-receivers", type=int, default=100_000)
    ap.add_argument(
        "--streams-per-receive", type=int, default=1, help="streams of one binary receive"
    )
    ap.add_argument("--binary-connections", type=int, default=20)
    ap.add_argument("--sends", type=int, default=1000, help="longpoll: sends per rep")
    ap.add_argument("--send-rate", type=float, default=200, help="longpoll: sends per second")
    ap.add_argument("--ttl-segments", type=int, default=8)
    ap.add_argument("--segment-bytes", type=int, default=1 << 20, help="ttl: segment size")
    ap.add_argument("--timeout", type=float, default=300.0, help="bound of each wait, seconds")
    ap.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = ap.parse_args()
    parts = [p.strip() for p in args.only.split(",") if p.strip()]
    for p in parts:
        if p not in PARTS:
            ap.error(f"--only: unknown part {p!r} (parts: {', '.join(PARTS)})")
    for name in ("streams", "reps", "batch", "in_flight", "streams_per_receive"):
        if getattr(args, name) < 1:
            ap.error(f"--{name.replace('_', '-')} must be at least 1, not {getattr(args, name)}")
    if args.batch > MAX_BATCH:
        ap.error(f"--batch {args.batch:,} exceeds the {MAX_BATCH:,} items of one request")
    figures: dict[str, Any] = {"streams": args.streams, "reps": args.reps, "fsync": args.fsync}

    creates: list[Create] = []
    if "create" in parts or "restart" in parts:
        for rep in range(1, args.reps + 1):
            last = rep == args.reps
            cm = broker(None, *fsync_flags(args))
            b = cm.__enter__()
            try:
                c = asyncio.run(create(b, args))
                creates.append(c)
                progress(
                    f"create rep {rep}/{args.reps}: {c.streams:,} persistent streams in "
                    f"{c.seconds:.2f} s = {c.streams_per_s:,.0f} streams/s; RSS "
                    f"{mib(c.rss_before)} -> {mib(c.rss_after)} (VmRSS {mib(c.vm_rss_after)}): "
                    f"{c.bytes_per_stream:,.0f} B/stream; log {c.log_bytes:,} B; CPU per stream: "
                    f"broker {c.broker_cpu_us_per_stream:.1f} µs, client "
                    f"{c.client_cpu_us_per_stream:.1f} µs"
                )
                if last and "restart" in parts:
                    rs = restart(b, args)
                    figures["restart"] = {
                        "ready_s": statistics.median(r.ready_s for r in rs),
                        "stats_s": statistics.median(r.stats_s for r in rs),
                        "load_s": statistics.median(r.load_s for r in rs),
                        "rss": statistics.median(r.rss for r in rs),
                        "runs": [asdict(r) for r in rs],
                    }
            finally:
                cm.__exit__(None, None, None)
        figures["create"] = {
            "streams_per_s": statistics.median(c.streams_per_s for c in creates),
            "bytes_per_stream": statistics.median(c.bytes_per_stream for c in creates),
            "rss_after": statistics.median(c.rss_after for c in creates),
            "runs": [asdict(c) for c in creates],
        }
    if "evict" in parts:
        with broker(stream_env(stream_idle_ms=args.idle_ms)) as b:
            es = asyncio.run(evict(b, args))
        figures["evict"] = {
            "bytes_per_stream_full": statistics.median(e.bytes_per_stream_full for e in es),
            "evict_s": statistics.median(e.evict_s for e in es),
            "rss_baseline": es[0].rss_baseline,
            "rss_evicted": statistics.median(e.rss_evicted for e in es),
            "runs": [asdict(e) for e in es],
        }
    if "longpoll" in parts:
        requests = -(-args.binary_receivers // args.streams_per_receive)
        flags = [
            *("--max-in-flight", str(-(-requests // args.binary_connections) + 16)),
            *("--http-max-connections", str(args.http_receivers + 100)),
            *("--http-max-connections-per-source", str(args.http_receivers + 100)),
        ]
        with broker(None, *flags, http=True) as b:
            rounds = asyncio.run(longpoll(b, args))
        figures["longpoll"] = {
            kind: {
                "receivers": rounds[0][i].receivers,
                "p50_ms": statistics.median(r[i].p50_ms for r in rounds),
                "p99_ms": statistics.median(r[i].p99_ms for r in rounds),
                "max_ms": statistics.median(r[i].max_ms for r in rounds),
                "slow": sum(r[i].slow for r in rounds),
                "slow_in_machine_stall": sum(r[i].slow_in_machine_stall for r in rounds),
                "sends": sum(r[i].sends for r in rounds),
            }
            for i, kind in enumerate(("http", "binary"))
        }
        figures["longpoll"]["runs"] = [[asdict(x) for x in r] for r in rounds]
    if "ttl" in parts:
        env = stream_env(stream_segment_bytes=args.segment_bytes)
        with broker(env) as b:
            t = asyncio.run(ttl(b, args))
        progress(
            f"ttl: __streams on disk {t.disk_before:,} B -> {t.disk_after:,} B "
            f"{t.reclaim_s:.1f} s after the last send (broker's count {t.log_bytes_before:,} -> "
            f"{t.log_bytes_after:,} B); no persistent message counted {t.expired_s:.1f} s after it"
        )
        figures["ttl"] = asdict(t)
    report(figures, args)


def report(f: dict[str, Any], args: argparse.Namespace) -> None:
    if args.json:
        print(json.dumps(f, indent=2))
        return
    lines = [f"lightweight streams, {args.streams:,} streams, medians of {args.reps}:"]
    if "create" in f:
        c = f["create"]
        lines.append(
            f"  create (1 persistent message each): {c['streams_per_s']:,.0f} streams/s "
            f"(target >= 100,000); {c['bytes_per_stream']:,.0f} B/stream (target <= 600); "
            f"RSS {mib(c['rss_after'])} (target <= 1 GiB)"
        )
    if "restart" in f:
        r = f["restart"]
        lines.append(
            f"  restart: first answer {r['ready_s']:.2f} s after the process started "
            f"(target <= 10 s); RSS {mib(r['rss'])}"
        )
    if "evict" in f:
        e = f["evict"]
        lines.append(
            f"  evict: {e['bytes_per_stream_full']:,.0f} B/stream while full; all evicted "
            f"{e['evict_s']:.1f} s after emptied (stream_idle_ms={args.idle_ms:,}); RSS "
            f"{mib(e['rss_baseline'])} baseline -> {mib(e['rss_evicted'])} after eviction"
        )
    if "longpoll" in f:
        for kind in ("http", "binary"):
            x = f["longpoll"][kind]
            lines.append(
                f"  long-poll {kind}, {x['receivers']:,} receivers: p50 {x['p50_ms']:.2f} ms, "
                f"p99 {x['p99_ms']:.2f} ms, max {x['max_ms']:.2f} ms (target <= 10 ms); "
                f"{x['slow']} of {x['sends']:,} answers over {SLOW_MS:.0f} ms, "
                f"{x['slow_in_machine_stall']} of them while the machine itself stalled"
            )
    if "ttl" in f:
        t = f["ttl"]
        lines.append(
            f"  TTL reclaim: __streams {t['disk_before']:,} B -> {t['disk_after']:,} B on disk "
            f"{t['reclaim_s']:.1f} s after the sends (TTL {TTL_MS} ms)"
        )
    print("\n".join(lines))


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        main()
