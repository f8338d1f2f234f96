"""In-process figures of the stream core (a script, not a test)::

    PYTHONPATH=src python benchmarks/streams_core.py [STREAMS]

- send: STREAMS new streams, each given one 64-byte persistent message, by ``send()`` calls
  of 10,000 items (as a client's ``send_many`` makes them): wall time and CPU microseconds
  per message (process CPU time: the log's writes included);
- index: bytes per stream by tracemalloc over a separate run of 100,000 streams (ids of 21
  characters counted), and the RSS growth per stream at STREAMS;
- restart: a broker started on the same data directory, until ``broker.streams`` is ready;
- latency: 10,000 receivers wait on a stream each; messages are sent to them 100 at a time;
  the time from the ``send()`` call to each receiver's answer (p50, p99, max).

A calibration figure (a loop of crc32 + a 12-slot object + a dict insert) is printed first:
on a quiet machine it is about 0.5 us; a larger number says how loaded this one is.
"""

from __future__ import annotations

import asyncio
import gc
import os
import sys
import tempfile
import time
import tracemalloc
import zlib

from tidewire.broker import Broker, BrokerConfig
from tidewire.broker.streams.model import SendItem

BATCH = 10_000
VALUE = b"x" * 64


class _Calib:
    __slots__ = ("a", "b", "c", "d", "e", "f", "g", "h", "i", "j", "k", "m")

    def __init__(self, a: str, b: int) -> None:
        self.a, self.b, self.c, self.d, self.e, self.f = a, b, 100, None, -1, None
        self.g, self.h, self.i, self.j, self.k, self.m = None, 0, 5, None, None, None


def calibrate() -> float:
    ids = [f"device-{i:08d}/inbox" for i in range(200_000)]
    d = {}
    t = time.process_time()
    for sid in ids:
        d[sid] = _Calib(sid, zlib.crc32(sid.encode()) % 4)
    return (time.process_time() - t) / len(ids) * 1e6


def rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def batches(n: int) -> list[list[SendItem]]:
    return [
        [SendItem(f"device-{i:08d}/inbox", VALUE, "", 0, True) for i in range(j, min(n, j + BATCH))]
        for j in range(0, n, BATCH)
    ]


async def send_and_restart(n: int, root: str) -> None:
    data = tempfile.mkdtemp(dir=root)
    async with Broker(BrokerConfig(data_dir=data)) as b:
        todo = batches(n)
        gc.collect()
        r0 = rss()
        t, c = time.perf_counter(), time.process_time()
        for items in todo:
            await b.streams.send(items)
        wall, cpu = time.perf_counter() - t, time.process_time() - c
        del todo
        gc.collect()
        print(
            f"send: {n:,} streams in {wall:.2f} s ({n / wall:,.0f} streams/s), "
            f"{cpu / n * 1e6:.2f} CPU-us per message"
        )
        print(f"RSS growth: {(rss() - r0) / n:.0f} bytes per stream")
    t = time.perf_counter()
    async with Broker(BrokerConfig(data_dir=data)) as b:
        ready = time.perf_counter() - t
        print(f"restart: {b.streams.stats().streams:,} streams ready in {ready:.2f} s")


async def index_bytes(root: str, n: int = 100_000) -> None:
    async with Broker(BrokerConfig(data_dir=tempfile.mkdtemp(dir=root))) as b:
        todo = batches(n)
        ids = sum(sys.getsizeof(it.stream) for items in todo for it in items)
        await b.streams.send([SendItem("warm", VALUE, "", 0, True)])
        gc.collect()
        tracemalloc.start()
        before = tracemalloc.get_traced_memory()[0]
        for items in todo:
            await b.streams.send(items)
        gc.collect()
        grown = tracemalloc.get_traced_memory()[0] - before
        tracemalloc.stop()
        print(f"index: {(grown + ids) / n:.0f} bytes per stream (tracemalloc, {n:,} streams)")


async def latency(root: str, receivers: int = 10_000, per_send: int = 100) -> None:
    async with Broker(BrokerConfig(data_dir=tempfile.mkdtemp(dir=root))) as b:
        st = b.streams
        await st.send([SendItem(f"warm-{p}", VALUE, "", 0, True) for p in range(64)])
        sent_at: dict[str, float] = {}
        lat: list[float] = []

        async def receiver(i: int) -> None:
            got = await st.receive([f"r{i}"], wait_ms=120_000)
            lat.append(time.perf_counter() - sent_at[got[0].stream])

        tasks = [asyncio.create_task(receiver(i)) for i in range(receivers)]
        while st.stats().receivers < receivers:
            await asyncio.sleep(0.01)
        for j in range(0, receivers, per_send):
            now = time.perf_counter()
            for i in range(j, j + per_send):
                sent_at[f"r{i}"] = now
            await st.send([SendItem(f"r{i}", VALUE, "", 0, True) for i in range(j, j + per_send)])
            await asyncio.sleep(0.02)
        await asyncio.gather(*tasks)
        lat.sort()
        print(
            f"latency: {receivers:,} receivers, persistent sends of {per_send}: "
            f"p50 {lat[len(lat) // 2] * 1e3:.2f} ms, p99 {lat[int(len(lat) * 0.99)] * 1e3:.2f} ms, "
            f"max {lat[-1] * 1e3:.2f} ms"
        )


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 1_000_000
    print(f"calibration: {calibrate():.2f} us per crc32 + object + dict insert")
    with tempfile.TemporaryDirectory() as root:
        asyncio.run(send_and_restart(n, root))
        asyncio.run(index_bytes(root))
        asyncio.run(latency(root))


if __name__ == "__main__":
    main()
