"""The Spark data source's throughput: N stored messages of 1 KiB read by Spark into the
``noop`` sink, batch and streaming, next to Spark's own Parquet reader of the same rows.

Usage::

    python benchmarks/spark_bench.py [--messages N] [--partitions P] [--master local[2]]
        [--repeat R] [--fetch-max-bytes B] [--addr HOST:PORT] [--json]

Without ``--addr`` it starts a broker (``python -m tidewire serve``, fsync=interval) in a
process of its own (see ``producer_bench.py``) and fills a topic of P partitions with an
:class:`AsyncProducer` in large batches (untimed). Then, in one local SparkSession:

- ``fetch only`` and ``decode only``: a task's two parts without Spark, in this process:
  fetching every batch of partition 0 from the broker, and turning them into Arrow;
- ``batch read``: ``spark.read.format("tidewire")`` of every message into ``noop``;
- ``streaming read``: ``readStream`` with ``Trigger.AvailableNow`` into ``noop`` (the rate
  over the micro-batches' own time; the wall time with the query's start-up is printed too);
- ``parquet read``: the same rows written once to a local Parquet file (untimed), read by
  Spark's Parquet reader into ``noop``: the yardstick the ratios are against.

Each timed figure is the median of ``--repeat`` runs, after one untimed warm-up of the Python
workers. Messages per second and the ratio to Parquet go to stdout, one line each (``--json``:
one JSON object).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from producer_bench import VALUE_BYTES, broker, run
from tidewire.client import AsyncClient, AsyncProducer, Client
from tidewire.records import iter_batches
from tidewire.spark._decode import decode_fetch

TOPIC = "spark-bench"


@dataclass
class Figure:
    """One measured figure."""

    name: str
    rows: int
    seconds: float  # the median run
    runs: list[float]
    note: str = ""

    @property
    def rate(self) -> float:
        return self.rows / self.seconds


def progress(text: str) -> None:
    print(f"... {text}", file=sys.stderr, flush=True)


async def fill(addr: str, messages: int, partitions: int) -> None:
    async with AsyncClient(addr) as client:
        await client.create_topic(TOPIC, partitions)
    value = os.urandom(VALUE_BYTES // 2).hex().encode()
    async with AsyncProducer(
        addr, acks="leader", batch_bytes=1024 * 1024, linger_ms=50, max_request_bytes=8 << 20
    ) as producer:
        step = max(1, messages // 10)
        for i in range(messages):
            await producer.send(TOPIC, value)
            if (i + 1) % step == 0:
                progress(f"stored {i + 1:,} of {messages:,} messages")
        await producer.flush()


def timed(repeat: int, fn: Callable[[], object]) -> tuple[float, list[float]]:
    runs = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        runs.append(time.perf_counter() - start)
    return statistics.median(runs), runs


def bench_decode(addr: str, args: argparse.Namespace) -> list[Figure]:
    """What one task does, without Spark, on partition 0, in this process: fetch its
    batches (the broker's and the client's part), and decode fetched batches into Arrow."""
    with Client(addr) as client:
        end = client.describe_topic(TOPIC).partitions[0].high_watermark
        fetched: list[tuple[int, bytes]] = []

        def fetch() -> None:
            fetched.clear()
            pos = 0
            while pos < end:
                got = client.fetch_batches(TOPIC, 0, pos, max_bytes=args.fetch_max_bytes)
                fetched.append((pos, got.data))
                *_, (_, last) = iter_batches(got.data, verify=False)
                pos = last.next_offset

        def decode() -> None:
            for pos, data in fetched:
                decode_fetch(data, TOPIC, 0, pos, end, include_headers=False)

        fetch()
        fetch_median, fetch_runs = timed(args.repeat, fetch)
        decode_median, decode_runs = timed(args.repeat, decode)
    return [
        Figure("fetch only (partition 0, 1 connection, no Spark)", end, fetch_median, fetch_runs),
        Figure("decode only (fetched batches to Arrow, 1 core)", end, decode_median, decode_runs),
    ]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--messages", type=int, default=1_000_000)
    ap.add_argument("--partitions", type=int, default=4)
    ap.add_argument("--master", default="local[2]")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--fetch-max-bytes", type=int, default=8 * 1024 * 1024)
    ap.add_argument("--addr", help="a running broker whose topic spark-bench is filled already")
    ap.add_argument("--json", action="store_true", help="one JSON object instead of lines")
    args = ap.parse_args()

    if args.addr:
        figures = measure(args.addr, args)
    else:
        with broker("interval", args.partitions) as addr:
            progress(f"filling {TOPIC}: {args.messages:,} x {VALUE_BYTES} B")
            run(fill(addr, args.messages, args.partitions))
            figures = measure(addr, args)
    parquet = next(f for f in figures if f.name.startswith("parquet"))
    if args.json:
        print(
            json.dumps(
                {
                    "messages": args.messages,
                    "value_bytes": VALUE_BYTES,
                    "partitions": args.partitions,
                    "master": args.master,
                    "figures": [
                        {
                            **asdict(f),
                            "rows_per_s": round(f.rate),
                            "vs_parquet": f.rate / parquet.rate,
                        }
                        for f in figures
                    ],
                }
            )
        )
        return
    for f in figures:
        print(
            f"{f.name}: {f.rows:,} rows in {f.seconds:.2f} s = {f.rate:,.0f} rows/s "
            f"({f.rate / parquet.rate:.2f}x parquet){f' - {f.note}' if f.note else ''}"
        )


def measure(addr: str, args: argparse.Namespace) -> list[Figure]:
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from pyspark.sql import SparkSession

    figures = bench_decode(addr, args)
    progress("starting Spark")
    spark = (
        SparkSession.builder.master(args.master)
        .appName("tidewire-spark-bench")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    try:
        with tempfile.TemporaryDirectory(prefix="tidewire-spark-bench-") as tmp:
            figures += bench_spark(spark, addr, args, tmp)
    finally:
        spark.stop()
    return figures


def bench_spark(spark: Any, addr: str, args: argparse.Namespace, tmp: str) -> list[Figure]:
    def source() -> Any:
        return (
            spark.read.format("tidewire")
            .option("tidewire.servers", addr)
            .option("subscribe", TOPIC)
            .option("tidewire.fetch.max.bytes", str(args.fetch_max_bytes))
            .load()
        )

    rows = source().count()
    progress(f"{rows:,} rows in the topic; batch read")

    def batch_read() -> None:
        source().write.format("noop").mode("overwrite").save()

    median, runs = timed(args.repeat, batch_read)
    figures = [Figure("batch read into noop", rows, median, runs)]

    progress("streaming read (Trigger.AvailableNow)")
    stream_runs: list[float] = []
    walls: list[float] = []
    for i in range(args.repeat):
        start = time.perf_counter()
        query = (
            spark.readStream.format("tidewire")
            .option("tidewire.servers", addr)
            .option("subscribe", TOPIC)
            .option("startingOffsets", "earliest")
            .option("tidewire.fetch.max.bytes", str(args.fetch_max_bytes))
            .load()
            .writeStream.format("noop")
            .option("checkpointLocation", os.path.join(tmp, f"checkpoint-{i}"))
            .trigger(availableNow=True)
            .start()
        )
        query.awaitTermination()
        walls.append(time.perf_counter() - start)
        progress_rows = sum(p["numInputRows"] for p in query.recentProgress)
        if progress_rows != rows:
            raise SystemExit(f"the streaming read saw {progress_rows:,} rows, not {rows:,}")
        busy_ms = sum(
            p["durationMs"].get("triggerExecution", 0)
            for p in query.recentProgress
            if p["numInputRows"]
        )
        stream_runs.append(busy_ms / 1000)
    figures.append(
        Figure(
            "streaming read (availableNow) into noop",
            rows,
            statistics.median(stream_runs),
            stream_runs,
            note=f"wall time with the query's start-up: median {statistics.median(walls):.2f} s",
        )
    )

    progress("parquet: writing the same rows once, then reading them")
    path = os.path.join(tmp, "rows.parquet")
    source().write.parquet(path)

    def parquet_read() -> None:
        spark.read.parquet(path).write.format("noop").mode("overwrite").save()

    parquet_read()  # warm-up
    median, runs = timed(args.repeat, parquet_read)
    figures.append(Figure("parquet read into noop", rows, median, runs))
    return figures


if __name__ == "__main__":
    main()
