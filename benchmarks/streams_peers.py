"""Lightweight streams side by side with Redis, in one run: memory per stream and receive
latency with 1,000,000 streams held.

Usage (from the project's root; Redis is started and stopped by the peer harness in
``../shared/bench/peers``, whose venv holds redis-py and hiredis)::

    (cd ../shared/bench && bash peers/setup.sh)     # once: redis-server and the venv
    PYTHONPATH=src /tmp/peers/venv/bin/python benchmarks/streams_peers.py \\
        [--streams N] [--receivers R] [--sends M] [--send-rate S] [--reps K] [--json]

``PEERS_DIR`` names the harness's directory if it is not ``../shared/bench``. CI does not
run benchmarks; ``redis-server`` is a Debian package (``apt-get install redis-server``).

What it measures, for each of: a Redis stream per key (``XADD``) at Redis's defaults, the
same with ``stream-node-max-bytes 512``, a Redis list per key (``RPUSH``), tidewire streams
with one persistent message each, and tidewire streams with one in-memory message each:

- **memory per stream**: N keys/streams created, each holding one 64-byte message (Redis
  through pipelines of 1,000 commands; tidewire through ``send_many`` of 10,000): the
  server's resident memory before and after, per stream (Redis: also its own
  ``used_memory`` accounting; tidewire: ``RssAnon``, its heap, not the page cache of its
  log files). A persistent tidewire message's value is in the log on disk, not in memory;
  a Redis entry's and an in-memory tidewire message's are in memory.
- **receive latency**: with the N streams still held, R receivers each wait on a stream of
  its own (Redis: ``BLPOP`` on a list, or ``XREAD BLOCK`` on a stream, one connection per
  receiver as both block their connection; tidewire: ``client.streams.receive`` long-polls
  spread over 8 connections); then M sends at S per second, each to a random waiting
  receiver's stream: latency from just before the send to the receiver having it (one
  process, one clock), p50/p99/max, medians of K rounds.

The ratios are Redis / tidewire (above 1: tidewire uses less memory, or answers sooner);
the memory ratio takes Redis's own ``used_memory`` count (its RSS does not fall after the
``FLUSHALL`` between variants) against tidewire's ``RssAnon``. One untimed round of sends
comes before the timed ones. The Redis receivers' clients have no socket timeout (redis-py's
default of 5 s cut every blocking wait and sent the command again on a new connection).
Measured on the 2-core development machine, 1,000,000 keys/streams, 1,000 receivers,
medians of the 6 rounds of 2 runs, load 1.1-1.9 (details in
``benchmarks/results/streams.md``)::

    one 64 B message each             bytes/stream    p50 ms   p99 ms   max ms
    Redis 7.0.15 stream key, defaults  4,344 (8.8x)    0.78     6.29     18.4
    Redis stream, node-max-bytes 512     760 (1.5x)    0.52     2.10      7.3
    Redis list per key                   264 (0.53x)   0.48     3.17      8.6
    tidewire, one persistent message     495           0.80     3.28      9.7
    tidewire, one in-memory message    1,238           0.81     5.28     12.3

Latency Redis / tidewire persistent: list p50 0.60x, p99 0.97x; stream 0.98x, 1.92x;
stream (node 512) 0.66x, 0.64x.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

_HERE = Path(__file__).resolve().parent
PEERS_DIR = Path(os.environ.get("PEERS_DIR", _HERE.parent.parent / "shared" / "bench"))
if str(PEERS_DIR) not in sys.path:
    sys.path.insert(0, str(PEERS_DIR))
if str(_HERE) not in sys.path:
    sys.path.insert(0, str(_HERE))

from streams import (  # noqa: E402
    Broker,
    broker,
    load1,
    progress,
    quantile,
    send_all,
    stream_id,
)
from tidewire.broker.streams.model import SendItem  # noqa: E402
from tidewire.client import AsyncClient  # noqa: E402

VALUE = b"v" * 64
PIPELINE = 1000
TIDEWIRE_CONNECTIONS = 8
#: Long-poll wait of every receiver, seconds (tidewire's longest): none ends mid-round.
WAIT_S = 300


@dataclass
class Memory:
    system: str
    streams: int
    rss_bytes_per_stream: float
    accounted_bytes_per_stream: float  # Redis used_memory; tidewire: the same as RSS
    sample_key_bytes: int  # Redis MEMORY USAGE of one key (0: tidewire)
    #: The machine's 1-minute load average when the figure was taken.
    load: float = field(default_factory=load1)


@dataclass
class Latency:
    system: str
    receivers: int
    sends: int
    p50_ms: float
    p99_ms: float
    max_ms: float
    #: The machine's 1-minute load average when the figure was taken.
    load: float = field(default_factory=load1)


def _rss(pid: int, name: str = "VmRSS") -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(name + ":"):
                return int(line.split()[1]) * 1024
    raise SystemExit(f"/proc/{pid}/status has no {name}")


async def _paced(
    send: Callable[[str], Awaitable[Any]],
    keys: list[str],
    sent_at: dict[str, float],
    done: asyncio.Event,
    args: argparse.Namespace,
) -> None:
    """``--sends`` sends at ``--send-rate``/s to random keys holding no undelivered one;
    returns once every one is received."""
    rng = random.Random(2)
    tasks: set[asyncio.Task[Any]] = set()
    failed: list[BaseException] = []

    def finished(t: asyncio.Task[Any]) -> None:
        tasks.discard(t)
        if not t.cancelled() and t.exception() is not None:
            failed.append(t.exception())  # type: ignore[arg-type]

    done.clear()
    start = time.perf_counter()
    for i in range(args.sends):
        while (k := rng.choice(keys)) in sent_at:
            pass
        sent_at[k] = time.perf_counter()
        t = asyncio.create_task(send(k))
        tasks.add(t)
        t.add_done_callback(finished)
        if failed:
            raise SystemExit(f"a send failed: {failed[0]!r}")
        delay = start + (i + 1) / args.send_rate - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
    while tasks:
        await asyncio.gather(*tasks, return_exceptions=True)
    if failed:
        raise SystemExit(f"{len(failed):,} sends failed, the first: {failed[0]!r}")
    done.clear()  # set while the sends went on, if all were delivered by then
    if sent_at:
        try:
            await asyncio.wait_for(done.wait(), args.timeout)
        except TimeoutError:
            raise SystemExit(f"{len(sent_at):,} sends not received") from None


class _Clock:
    """Send times of undelivered messages, and the latencies of delivered ones."""

    def __init__(self) -> None:
        self.sent_at: dict[str, float] = {}
        self.lat: list[float] = []
        self.done = asyncio.Event()

    def got(self, key: str) -> None:
        t0 = self.sent_at.pop(key, None)
        if t0 is None:
            raise SystemExit(f"{key}: received, never sent")
        self.lat.append((time.perf_counter() - t0) * 1000)
        if not self.sent_at:
            self.done.set()


async def _rounds(
    system: str,
    n_receivers: int,
    send: Callable[[str], Awaitable[Any]],
    keys: list[str],
    clock: _Clock,
    *,
    args: argparse.Namespace,
) -> list[Latency]:
    out = []
    # One round untimed first: Redis's sender opens its pool's connections in it (the first
    # timed round's p99 was 45-250 ms against 2-6 ms in the later ones), and every system
    # gets the same.
    await _paced(send, keys, clock.sent_at, clock.done, args)
    for rep in range(1, args.reps + 1):
        clock.lat = []
        await _paced(send, keys, clock.sent_at, clock.done, args)
        lat = Latency(
            system,
            n_receivers,
            len(clock.lat),
            quantile(clock.lat, 0.5),
            quantile(clock.lat, 0.99),
            max(clock.lat),
        )
        progress(
            f"{system} latency rep {rep}/{args.reps} ({n_receivers:,} receivers, "
            f"{args.streams:,} streams held): p50 {lat.p50_ms:.2f} ms, p99 {lat.p99_ms:.2f} ms,"
            f" max {lat.max_ms:.2f} ms"
        )
        out.append(lat)
    return out


# -- Redis ---------------------------------------------------------------------------------


async def _redis_fill(r: Any, kind: str, n: int) -> None:
    for i in range(0, n, PIPELINE):
        pipe = r.pipeline(transaction=False)
        for j in range(i, min(i + PIPELINE, n)):
            key = stream_id("s", j)
            if kind == "list":
                pipe.rpush(key, VALUE)
            else:
                pipe.xadd(key, {"v": VALUE})
        await pipe.execute()


async def redis_variant(
    pid: int, kind: str, node_bytes: int | None, args: argparse.Namespace
) -> tuple[Memory, list[Latency]]:
    import redis.asyncio as aioredis

    name = f"redis {kind}" + (f" (stream-node-max-bytes {node_bytes})" if node_bytes else "")
    # redis-py (5.x and later) closes a connection whose answer takes longer than its
    # socket_timeout, 5 s by default, and its default Retry then opens a new one and sends
    # the command again: a FLUSHALL of 1,000,000 keys takes longer than that.
    # Its pool opens a connection per send under way, up to max_connections (100 by
    # default, then MaxConnectionsError): as many as the sends of a round.
    r = aioredis.Redis(
        host="127.0.0.1", port=6379, socket_timeout=args.timeout, max_connections=args.sends
    )
    await r.flushall()
    await r.config_set("stream-node-max-bytes", str(node_bytes or 4096))
    await asyncio.sleep(0.5)
    used0 = (await r.info("memory"))["used_memory"]
    rss0 = _rss(pid)
    start = time.perf_counter()
    await _redis_fill(r, kind, args.streams)
    fill_s = time.perf_counter() - start
    await asyncio.sleep(0.5)
    used1 = (await r.info("memory"))["used_memory"]
    rss1 = _rss(pid)
    sample = await r.memory_usage(stream_id("s", args.streams // 2)) or 0
    mem = Memory(
        name,
        args.streams,
        (rss1 - rss0) / args.streams,
        (used1 - used0) / args.streams,
        int(sample),
    )
    progress(
        f"{name}: {args.streams:,} keys in {fill_s:.1f} s; RSS {mem.rss_bytes_per_stream:,.0f} "
        f"B/key, used_memory {mem.accounted_bytes_per_stream:,.0f} B/key, MEMORY USAGE "
        f"{mem.sample_key_bytes:,} B"
    )

    if not args.latency:
        await r.aclose()
        return mem, []
    # Latency: a receiver per key of its own, one connection each (BLPOP/XREAD block it).
    keys = [stream_id("w", i) for i in range(args.receivers)]
    clock = _Clock()
    # A client of one connection per receiver (a blocking command holds its connection),
    # without a socket timeout: the server ends each wait itself after WAIT_S. With the
    # default one (5 s), every BLPOP/XREAD was cut after 5 s, its connection closed and a
    # new one opened to send it again (Redis counted a new connection per receiver every
    # ~5 s, and never all of them blocked at once).
    rcs = [
        aioredis.Redis(
            host="127.0.0.1", port=6379, single_connection_client=True, socket_timeout=None
        )
        for _ in keys
    ]

    async def blpop(rc: Any, key: str) -> None:
        while True:
            got = await rc.blpop([key], timeout=WAIT_S)
            if got is not None:
                clock.got(key)

    async def xread(rc: Any, key: str) -> None:
        last = "$"
        while True:
            got = await rc.xread({key: last}, block=WAIT_S * 1000)
            for _, entries in got or ():
                for entry_id, _ in entries:
                    last = entry_id
                    clock.got(key)

    recv = blpop if kind == "list" else xread
    tasks = [asyncio.create_task(recv(rc, k)) for rc, k in zip(rcs, keys, strict=True)]
    blocked = 0
    for _ in range(600):
        await asyncio.sleep(0.1)
        blocked = (await r.info("clients"))["blocked_clients"]
        if blocked >= args.receivers:
            break
    else:
        raise SystemExit(f"only {blocked} of {args.receivers} Redis receivers blocked")

    async def send(key: str) -> None:
        if kind == "list":
            await r.rpush(key, VALUE)
        else:
            await r.xadd(key, {"v": VALUE})

    opened0 = (await r.info("stats"))["total_connections_received"]
    try:
        lats = await _rounds(name, args.receivers, send, keys, clock, args=args)
        opened = (await r.info("stats"))["total_connections_received"] - opened0
        blocked = (await r.info("clients"))["blocked_clients"]
        delayed = (await r.info("persistence"))["aof_delayed_fsync"]
        progress(
            f"{name}: {opened:,} connections opened during the rounds (the sender's pool), "
            f"{blocked:,} receivers blocked after them; AOF fsyncs that held writes back "
            f"so far (aof_delayed_fsync): {delayed:,}"
        )
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for rc in rcs:
            await rc.aclose()
        await r.aclose()
    return mem, lats


def redis_all(args: argparse.Namespace) -> tuple[list[Memory], list[list[Latency]], str]:
    from peers.servers import SERVERS

    server = SERVERS["redis"]
    server.start()
    try:
        pid = server.pid()
        assert pid is not None
        version = server.version()
        progress(f"{version}, pid {pid}")
        mems, lats = [], []
        for kind, node in (("stream", None), ("stream", 512), ("list", None)):
            m, lat = asyncio.run(redis_variant(pid, kind, node, args))
            mems.append(m)
            lats.append(lat)
        return mems, lats, version
    finally:
        server.stop()


# -- tidewire ------------------------------------------------------------------------------


async def tidewire_variant(
    b: Broker, persistent: bool, args: argparse.Namespace
) -> tuple[Memory, list[Latency]]:
    name = "tidewire " + ("persistent" if persistent else "in-memory")
    n = args.streams
    async with AsyncClient(b.addr, request_timeout_s=args.timeout) as client:
        await client.streams.send("warm-up", VALUE, persistent=True)
        await client.streams.receive("warm-up")
        rss0 = await b.settled_rss()
        start = time.perf_counter()
        items = [SendItem(stream_id("s", i), VALUE, persistent=persistent) for i in range(n)]
        await send_all(client, items, 10_000, 4)
        del items
        fill_s = time.perf_counter() - start
        rss1 = await b.settled_rss()
        stats = await client.streams.stats()
        if stats.streams < n:
            raise SystemExit(f"{name}: {stats.streams:,} streams after {n:,} sends")
        mem = Memory(name, n, (rss1 - rss0) / n, (rss1 - rss0) / n, 0)
        progress(
            f"{name}: {n:,} streams in {fill_s:.1f} s; RssAnon {mem.rss_bytes_per_stream:,.0f} "
            f"B/stream"
        )

        if not args.latency:
            return mem, []
        keys = [stream_id("w", i) for i in range(args.receivers)]
        clock = _Clock()
        per_conn = -(-args.receivers // TIDEWIRE_CONNECTIONS) + 1
        conns = [
            AsyncClient(b.addr, request_timeout_s=WAIT_S + 60, max_in_flight=per_conn)
            for _ in range(TIDEWIRE_CONNECTIONS)
        ]

        async def recv(conn: AsyncClient, key: str) -> None:
            while True:
                if await conn.streams.receive(key, wait_ms=WAIT_S * 1000) is not None:
                    clock.got(key)

        tasks = [asyncio.create_task(recv(conns[i % len(conns)], k)) for i, k in enumerate(keys)]
        try:
            for _ in range(600):
                await asyncio.sleep(0.1)
                if (await client.streams.stats()).receivers >= args.receivers:
                    break
            else:
                raise SystemExit(f"{name}: the receivers are not all waiting after 60 s")

            async def send(key: str) -> None:
                await client.streams.send(key, VALUE)

            lats = await _rounds(name, args.receivers, send, keys, clock, args=args)
        finally:
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            for c in conns:
                await c.close()
    return mem, lats


def tidewire_all(args: argparse.Namespace) -> tuple[list[Memory], list[list[Latency]]]:
    mems, lats = [], []
    for persistent in (True, False):
        with broker() as b:
            progress(f"tidewire pid {b.pid}")
            m, lat = asyncio.run(tidewire_variant(b, persistent, args))
        mems.append(m)
        lats.append(lat)
    return mems, lats


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--streams", type=int, default=1_000_000)
    ap.add_argument("--receivers", type=int, default=1000, help="waiting receivers")
    ap.add_argument("--sends", type=int, default=2000, help="sends per latency round")
    ap.add_argument("--send-rate", type=float, default=500, help="sends per second")
    ap.add_argument("--reps", type=int, default=3, help="latency rounds (figures: medians)")
    ap.add_argument("--timeout", type=float, default=300.0)
    ap.add_argument(
        "--no-latency", dest="latency", action="store_false", help="memory figures only"
    )
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    for name in ("streams", "receivers", "sends", "reps"):
        if getattr(args, name) < 1:
            ap.error(f"--{name} must be at least 1, not {getattr(args, name)}")

    rmem, rlat, version = redis_all(args)
    tmem, tlat = tidewire_all(args)
    lat = {
        m.system: {
            "p50_ms": statistics.median(x.p50_ms for x in ls) if ls else float("nan"),
            "p99_ms": statistics.median(x.p99_ms for x in ls) if ls else float("nan"),
            "max_ms": statistics.median(x.max_ms for x in ls) if ls else float("nan"),
        }
        for m, ls in zip([*rmem, *tmem], [*rlat, *tlat], strict=True)
    }
    tp = tmem[0].system
    # Redis's own count: its RSS does not fall after the FLUSHALL between the variants
    # (jemalloc keeps the pages), so only the first variant's RSS figure means anything.
    mem_ratio = {
        m.system: m.accounted_bytes_per_stream / tmem[0].rss_bytes_per_stream for m in rmem
    }
    p50_ratio = {m.system: lat[m.system]["p50_ms"] / lat[tp]["p50_ms"] for m in rmem}
    figures = {
        "redis": version,
        "streams": args.streams,
        "receivers": args.receivers,
        "memory": [asdict(m) for m in [*rmem, *tmem]],
        "latency": lat,
        "memory_ratio_to_tidewire_persistent": mem_ratio,
        "latency_p50_ratio_to_tidewire": p50_ratio,
        "latency_p99_ratio_to_tidewire": {
            m.system: lat[m.system]["p99_ms"] / lat[tp]["p99_ms"] for m in rmem
        },
        # Redis / tidewire for each Redis variant, each tidewire one and each figure (above
        # 1: tidewire answers sooner).
        "latency_ratios": {
            m.system: {
                t.system: {q: lat[m.system][q] / lat[t.system][q] for q in lat[t.system]}
                for t in tmem
            }
            for m in rmem
        },
        "runs": [[asdict(x) for x in ls] for ls in [*rlat, *tlat]],
    }
    if args.json:
        print(json.dumps(figures, indent=2))
        return
    print(
        f"{args.streams:,} streams of one 64-byte message; {args.receivers:,} receivers "
        f"waiting; {version}"
    )
    print(
        f"{'':44} {'RSS B/stream':>13} {'own count':>10} {'p50 ms':>8} {'p99 ms':>8} {'max ms':>8}"
    )
    for m in [*rmem, *tmem]:
        x = lat[m.system]
        print(
            f"{m.system:44} {m.rss_bytes_per_stream:13,.0f} "
            f"{m.accounted_bytes_per_stream:10,.0f} {x['p50_ms']:8.2f} "
            f"{x['p99_ms']:8.2f} {x['max_ms']:8.2f}"
        )
    for m in rmem:
        print(f"{m.system} / {tp}: memory {mem_ratio[m.system]:.1f}x")
        for t in tmem:
            r = figures["latency_ratios"][m.system][t.system]  # type: ignore[index]
            print(
                f"{m.system} / {t.system}: latency p50 {r['p50_ms']:.2f}x, "
                f"p99 {r['p99_ms']:.2f}x, max {r['max_ms']:.2f}x"
            )


if __name__ == "__main__":
    main()
