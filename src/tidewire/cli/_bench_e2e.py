"""``tidewire bench e2e``: a producer and a consumer group at once, with the latency of every
message from publish to delivery.

The command starts ``--consumers`` group members, each in a process of its own (a Python
process is one core at most, and a group's members are separate programs in real use), waits
until the group is stable with every partition assigned and every member positioned at the
end of the topic, then publishes ``--messages`` messages from this process (at ``--rate``, or
unpaced). Each value starts with the wall-clock time of its ``send`` call in nanoseconds, so a
member computes, for every record it is handed, delivery time - send time: the end-to-end
latency a consuming application sees, including the producer's batching (``--linger-ms``), the
broker's write and fsync policy, and the push (or long-poll) delivery. The clock is the
machine's, shared by the processes, so the figures are for producer and consumers on one host.

Members keep their latencies in a histogram of 1% buckets and send it back when the run ends;
the run ends when the members together were handed ``--messages`` records, or when none came
for ``--timeout`` seconds after the last publish (then it exits with 1).

A member is ``python -m tidewire.cli._bench_e2e`` with its settings as JSON in its first
argument; it writes JSON lines on stdout (``assigned``, ``progress``, ``result``) and stops
when its stdin is closed.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import math
import os
import secrets
import struct
import sys
import threading
import time
from collections import Counter
from collections.abc import Coroutine
from dataclasses import dataclass, field
from typing import Any, TypeVar

from tidewire._tasks import cancel_and_wait
from tidewire.client import (
    AsyncClient,
    AsyncGroupConsumer,
    AsyncProducer,
    Credentials,
    RecordFuture,
    TlsOptions,
)
from tidewire.errors import TidewireError
from tidewire.server.tcp import loop_factory

__all__ = ["E2EResult", "Histogram", "run_e2e", "run_fast"]

T = TypeVar("T")

#: How often a member reports its count.
_PROGRESS_S = 0.1
#: Bytes of the send timestamp at the start of every value.
STAMP = 8


def bucket(latency_ns: int) -> int:
    """The histogram bucket of a latency: its 8 leading bits and their shift (buckets less
    than 1/128 wide relative to their value, so a quantile is within 0.8%)."""
    shift = max(latency_ns.bit_length() - 8, 0)
    return (shift << 8) | (latency_ns >> shift)


class Histogram:
    """Latencies in nanoseconds, counted in buckets under 1% wide (mergeable across
    processes)."""

    def __init__(self, counts: dict[int, int] | None = None) -> None:
        self.counts: Counter[int] = Counter(counts or {})

    def add(self, latency_ns: int, n: int = 1) -> None:
        self.counts[bucket(max(latency_ns, 0))] += n

    def merge(self, other: Histogram) -> None:
        self.counts.update(other.counts)

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    def quantile_ms(self, q: float) -> float:
        """The latency below which a fraction ``q`` of the samples lie (ms; 0 when empty)."""
        total = self.total
        if not total:
            return 0.0
        rank = max(1, math.ceil(q * total))
        seen = 0
        for b in sorted(self.counts):
            seen += self.counts[b]
            if seen >= rank:
                # The bucket's upper edge: never below the true quantile, under 1% above.
                shift, top = b >> 8, b & 0xFF
                return round(((top + 1) << shift) / 1e6, 3)
        raise AssertionError("unreachable")

    def to_json(self) -> dict[str, int]:
        return {str(k): v for k, v in self.counts.items()}

    @classmethod
    def from_json(cls, doc: dict[str, int]) -> Histogram:
        return cls({int(k): v for k, v in doc.items()})


@dataclass
class E2EResult:
    """The figures of one end-to-end run (the ``--json`` object)."""

    test: str
    topic: str
    group: str
    messages: int
    size: int
    seconds: float
    publish_msg_per_s: float
    msg_per_s: float  # delivered
    mb_per_s: float  # delivered
    delivered: int
    duplicates: int
    latency_ms_p50: float
    latency_ms_p95: float
    latency_ms_p99: float
    latency_ms_p999: float
    latency_ms_max: float
    latency_samples: int
    per_consumer: list[int]
    cpu_s_producer: float  # CPU seconds of this process (the producer) during the run
    cpu_s_consumers: list[float]  # of each member process, from "go" to the end
    settings: dict[str, object] = field(default_factory=dict)


# --- a member ----------------------------------------------------------------------------------


def _emit(doc: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(doc, separators=(",", ":")) + "\n")
    sys.stdout.flush()


async def _member(cfg: dict[str, Any]) -> None:
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    go = asyncio.Event()

    def watch_stdin() -> None:  # "go": start reading; stdin closed (or the parent died): stop
        with contextlib.suppress(OSError, ValueError):
            for line in sys.stdin:
                if line.strip() == "go":
                    loop.call_soon_threadsafe(go.set)
        loop.call_soon_threadsafe(stop.set)

    threading.Thread(target=watch_stdin, daemon=True).start()
    hist = Histogram()
    count = 0
    first_ns = last_ns = 0

    async def assigned(partitions: list[tuple[str, int]]) -> None:
        # Positioned, but held until every member is: the clock starts with all of them.
        if not go.is_set():
            await consumer.pause(partitions)
        _emit(
            {
                "event": "assigned",
                "generation": consumer.generation,
                "partitions": sorted([t, p] for t, p in partitions),
            }
        )

    consumer = AsyncGroupConsumer(
        cfg["addr"],
        cfg["group"],
        topics=[cfg["topic"]],
        delivery=cfg["delivery"],
        push_credit_bytes=cfg["credit_bytes"],
        auto_offset_reset="latest",
        session_timeout_ms=6_000,
        heartbeat_interval_ms=300,
        max_wait_ms=100,
        tls=None if cfg.get("tls") is None else TlsOptions(**cfg["tls"]),
        credentials=_member_credentials(cfg),
        on_assign=assigned,
    )
    stamp = struct.Struct("<q").unpack_from
    buckets = hist.counts
    # What was handed out, per partition, as [start, end) offset ranges: a partition's records
    # come in order, so this stays a few ranges long, and the parent can count duplicates
    # across members (a record handed to two members around a rebalance) exactly.
    ranges: dict[int, list[list[int]]] = {}
    async with consumer:
        next_report = loop.time() + _PROGRESS_S
        reported = -1
        resumed = False
        while not stop.is_set():
            if go.is_set() and not resumed:
                cpu0 = time.process_time()
                await consumer.resume(consumer.paused())
                resumed = True
                _emit({"event": "started"})
            records = await consumer.poll(_PROGRESS_S, max_records=50_000)
            if records:
                now = time.time_ns()
                if not first_ns:
                    first_ns = now
                last_ns = now
                count += len(records)
                span: list[int] = [-1, -1]
                part = -1
                for _, p, offset, _, _, value, _ in records:
                    if value and len(value) >= STAMP:
                        lat = now - stamp(value)[0]
                        shift = lat.bit_length() - 8
                        if shift <= 0:
                            buckets[max(lat, 0)] += 1
                        else:
                            buckets[(shift << 8) | (lat >> shift)] += 1
                    if p == part and offset == span[1]:
                        span[1] += 1
                        continue
                    spans = ranges.setdefault(p, [])
                    if spans and spans[-1][1] == offset:
                        span = spans[-1]
                        span[1] += 1
                    else:
                        span = [offset, offset + 1]
                        spans.append(span)
                    part = p
            if loop.time() >= next_report and count != reported:
                _emit({"event": "progress", "count": count})
                reported = count
                next_report = loop.time() + _PROGRESS_S
    _emit(
        {
            "event": "result",
            "count": count,
            "first_ns": first_ns,
            "last_ns": last_ns,
            "histogram": hist.to_json(),
            "ranges": {str(p): spans for p, spans in ranges.items()},
            "cpu_s": time.process_time() - cpu0 if resumed else 0.0,
        }
    )


# --- the run -----------------------------------------------------------------------------------


class _Member:
    """One member process, as the parent sees it."""

    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self.proc = proc
        self.generation = -1
        self.partitions: list[tuple[str, int]] = []
        self.count = 0
        self.started = False
        self.result: dict[str, Any] | None = None
        self.changed = asyncio.Event()
        self.reader = asyncio.get_running_loop().create_task(self._read())

    async def _read(self) -> None:
        assert self.proc.stdout is not None
        async for line in self.proc.stdout:
            try:
                doc = json.loads(line)
            except ValueError:
                continue
            event = doc.get("event")
            if event == "assigned":
                self.generation = doc["generation"]
                self.partitions = [(t, p) for t, p in doc["partitions"]]
            elif event == "started":
                self.started = True
            elif event == "progress":
                self.count = doc["count"]
            elif event == "result":
                self.count = doc["count"]
                self.result = doc
            self.changed.set()

    def go(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(b"go\n")

    async def stop(self, timeout_s: float) -> None:
        assert self.proc.stdin is not None
        with contextlib.suppress(OSError):
            self.proc.stdin.close()
        try:
            await asyncio.wait_for(self.proc.wait(), timeout_s)
        except TimeoutError:
            self.proc.kill()
            await self.proc.wait()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await asyncio.wait_for(self.reader, 1.0)

    async def error(self) -> str:
        if self.proc.stderr is None:
            return ""
        with contextlib.suppress(TimeoutError):
            data = await asyncio.wait_for(self.proc.stderr.read(), 1.0)
            lines = data.decode(errors="replace").strip().splitlines()
            return lines[-1] if lines else ""
        return ""


#: How a member process is given the API key: in its environment, which (unlike its
#: arguments) other users cannot read.
_KEY_ENV = "TIDEWIRE_API_KEY"


def _member_credentials(cfg: dict[str, Any]) -> Credentials | None:
    key = os.environ.get(_KEY_ENV) if cfg.get("sasl_mechanism") else None
    return None if not key else Credentials(key, cfg["sasl_mechanism"])


async def _start_member(cfg: dict[str, Any], creds: Credentials | None = None) -> _Member:
    env = dict(os.environ)
    env.pop(_KEY_ENV, None)
    if creds is not None:
        env[_KEY_ENV] = creds.api_key
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "tidewire.cli._bench_e2e",
        json.dumps(cfg),
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=env,
    )
    return _Member(proc)


async def _until_ready(
    members: list[_Member], partitions: set[tuple[str, int]], timeout_s: float
) -> None:
    """Until every member reported the same generation and together they own every
    partition (each member reports after it is positioned)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while True:
        gens = {m.generation for m in members}
        owned = [tp for m in members for tp in m.partitions]
        if len(gens) == 1 and -1 not in gens and set(owned) == partitions:
            if len(owned) != len(partitions):
                raise TidewireError(f"a partition is assigned twice: {sorted(owned)}")
            return
        for m in members:
            if m.proc.returncode is not None:
                raise TidewireError(f"a consumer exited before it was ready: {await m.error()}")
        if loop.time() >= deadline:
            raise TidewireError(
                f"the group did not settle within {timeout_s:g} s "
                f"(generations {sorted(gens)}, {len(set(owned))} of {len(partitions)} "
                "partitions assigned)"
            )
        for m in members:
            m.changed.clear()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(
                asyncio.wait([asyncio.ensure_future(m.changed.wait()) for m in members]), 0.2
            )


async def _until_started(members: list[_Member], timeout_s: float) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while not all(m.started for m in members):
        for m in members:
            if m.proc.returncode is not None:
                raise TidewireError(f"a consumer exited before it started: {await m.error()}")
        if loop.time() >= deadline:
            raise TidewireError(f"the consumers did not start reading within {timeout_s:g} s")
        await asyncio.sleep(0.005)


async def run_e2e(
    addr: str,
    topic: str,
    messages: int,
    size: int,
    consumers: int,
    delivery: str,
    credit_bytes: int,
    producer_options: dict[str, object],
    rate: int,
    timeout_s: float,
    settings: dict[str, object],
    progress: Any,
    backlog: bool = False,
    tls: TlsOptions | None = None,
    credentials: Credentials | None = None,
) -> E2EResult:
    """Run one end-to-end measurement (the topic must exist); ``progress(published,
    delivered)`` is called a few times a second. With ``backlog`` every message is published
    before the group starts, and the figures are those of the group catching up. ``tls``
    and ``credentials``: of every connection, the consumers' included (their processes get
    the key in their environment, not on their command line)."""
    async with AsyncClient(addr, tls=tls, credentials=credentials) as client:
        ends = [p.log_end_offset for p in (await client.describe_topic(topic)).partitions]
    partitions = {(topic, p) for p in range(len(ends))}
    group = f"bench-e2e-{secrets.token_hex(4)}"
    cfg = {
        "addr": addr,
        "topic": topic,
        "group": group,
        "delivery": delivery,
        "credit_bytes": credit_bytes,
        "tls": None if tls is None else dataclasses.asdict(tls),
        "sasl_mechanism": None if credentials is None else credentials.mechanism,
    }
    members: list[_Member] = []
    filler = os.urandom(max(size - STAMP, 0) // 2 + 1).hex().encode()[: max(size - STAMP, 0)]
    loop = asyncio.get_running_loop()
    published = [0]
    expected = messages + 1  # and the untimed first message
    publish_s = cpu_producer = 0.0

    async def publish(producer: AsyncProducer) -> None:
        fut: RecordFuture | None = None
        start = loop.time()
        for i in range(messages):
            if rate:
                due = start + i / rate
                if (ahead := due - loop.time()) > 0:
                    await asyncio.sleep(ahead)
            fut = await producer.send(topic, time.time_ns().to_bytes(STAMP, "little") + filler)
            published[0] = i + 1
        await producer.flush()
        if fut is not None:
            await fut  # raises if the last batch failed

    async def start_group() -> None:
        nonlocal members
        members = [await _start_member(cfg, credentials) for _ in range(consumers)]
        await _until_ready(members, partitions, timeout_s=30.0 + 2 * consumers)

    publishing: asyncio.Task[None] | None = None
    try:
        async with AsyncProducer(
            addr,
            tls=tls,
            credentials=credentials,
            **producer_options,  # type: ignore[arg-type]
        ) as producer:
            if backlog:
                # Publish everything first; the new group starts where the topic ended
                # before, and the clock starts when its members are told to go.
                async with AsyncClient(addr, tls=tls, credentials=credentials) as client:
                    for p, end in enumerate(ends):
                        await client.reset_group_offsets(
                            group, topic, "offset", value=end, partitions=[p]
                        )
            else:
                await start_group()
            # Connect, learn the topic and get a producer id before the clock starts; the
            # members are handed this message too, so it is not counted as a duplicate.
            await (await producer.send(topic, time.time_ns().to_bytes(STAMP, "little")))
            t0 = time.perf_counter()
            cpu0 = time.process_time()
            if backlog:
                await publish(producer)
                publish_s = time.perf_counter() - t0
                cpu_producer = time.process_time() - cpu0
                await start_group()
            t0_ns = time.time_ns()
            for m in members:
                m.go()
            if not backlog:
                # Publish once every member reads again (its partitions resumed), so no
                # message waits for a member to start.
                await _until_started(members, timeout_s)
                t0_ns = time.time_ns()
                t0 = time.perf_counter()
                cpu0 = time.process_time()
                publishing = loop.create_task(publish(producer))
            idle_since = loop.time()
            last_total = -1
            while True:
                total = sum(m.count for m in members)
                progress(published[0], min(total, expected))
                if publishing is not None and publishing.done() and not publish_s:
                    publish_s = time.perf_counter() - t0
                    cpu_producer = time.process_time() - cpu0
                    publishing.result()  # a failed publish fails the run
                if publish_s:
                    if total >= expected:
                        break
                    if total != last_total:
                        idle_since = loop.time()
                    elif loop.time() - idle_since > timeout_s:
                        break
                last_total = total
                for m in members:
                    if m.proc.returncode is not None:
                        raise TidewireError(f"a consumer exited: {await m.error()}")
                await asyncio.sleep(0.05)
    finally:
        await asyncio.gather(*(m.stop(10.0) for m in members))
        if publishing is not None and not publishing.done():
            await cancel_and_wait(publishing)
    hist = Histogram()
    last_delivery = 0
    per_consumer = []
    spans: dict[int, list[tuple[int, int]]] = {}
    for m in members:
        if m.result is None:
            raise TidewireError(f"a consumer ended without its figures: {await m.error()}")
        per_consumer.append(m.result["count"])
        hist.merge(Histogram.from_json(m.result["histogram"]))
        last_delivery = max(last_delivery, m.result["last_ns"])
        for p, got in m.result["ranges"].items():
            spans.setdefault(int(p), []).extend((a, b) for a, b in got)
    handed_out = sum(per_consumer)
    unique = sum(_covered(s) for s in spans.values())
    delivered = max(unique - 1, 0)  # not the untimed first message
    seconds = max(last_delivery - t0_ns, 1) / 1e9
    rate_out = delivered / seconds
    return E2EResult(
        test="e2e",
        topic=topic,
        group=group,
        messages=messages,
        size=size,
        seconds=round(seconds, 4),
        publish_msg_per_s=round(messages / publish_s, 1) if publish_s else 0.0,
        msg_per_s=round(rate_out, 1),
        mb_per_s=round(rate_out * size / 1e6, 2),
        delivered=delivered,
        duplicates=handed_out - unique,
        latency_ms_p50=hist.quantile_ms(0.50),
        latency_ms_p95=hist.quantile_ms(0.95),
        latency_ms_p99=hist.quantile_ms(0.99),
        latency_ms_p999=hist.quantile_ms(0.999),
        latency_ms_max=hist.quantile_ms(1.0),
        latency_samples=hist.total,
        per_consumer=per_consumer,
        cpu_s_producer=round(cpu_producer, 3),
        cpu_s_consumers=[round(m.result["cpu_s"], 3) for m in members if m.result],
        settings=settings,
    )


def _covered(spans: list[tuple[int, int]]) -> int:
    """How many offsets the [start, end) ranges cover together (overlaps counted once)."""
    n = 0
    end = -1
    for a, b in sorted(spans):
        if b > end:
            n += b - max(a, end)
            end = b
    return n


def run_fast(coro: Coroutine[Any, Any, T]) -> T:
    """Run ``coro`` on uvloop when it is installed (a load generator should cost as little
    CPU as it can), else on asyncio's loop."""
    with asyncio.Runner(loop_factory=loop_factory("auto")[1]) as runner:
        return runner.run(coro)


if __name__ == "__main__":
    run_fast(_member(json.loads(sys.argv[1])))
