"""Spark batch write to tidewire: N rows of 1 KiB written by ``df.write.format("tidewire")``
with acks=durable, in rows per second, beside Spark's own writers of the same rows.

Usage::

    python benchmarks/spark_write_bench.py [--rows N] [--repeat R] [--master local[2]]
        [--fsync always|interval|never] [--partitions P] [--compression none|lz4|zstd|gzip]
        [--json]

It starts a broker (``python -m tidewire serve``) in a process of its own over a temporary
data directory, and a SparkSession. The rows (a 1,024-byte value each, in two Spark
partitions) are made and cached before anything is timed, and one small write of each kind
goes first, untimed, so the Python workers' start-up (seconds) is not in the figures. Each
repeat writes them to a new topic of P partitions; the same rows are also written by Spark to
local Parquet and to the ``noop`` sink (Spark's own cost of handing the rows to a sink), so
the figure is a ratio too.
It prints the median of the repeats; ``--json`` prints one JSON document instead.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from typing import Any

from producer_bench import broker

VALUE_BYTES = 1024
TARGET_ROWS_PER_S = 150_000


def timed(fn: Any) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--master", default="local[2]")
    ap.add_argument("--fsync", choices=["always", "interval", "never"], default="always")
    ap.add_argument("--partitions", type=int, default=4)
    ap.add_argument("--compression", choices=["none", "gzip", "lz4", "zstd"], default="none")
    ap.add_argument("--json", action="store_true", help="print one JSON document")
    args = ap.parse_args()

    os.environ["PYSPARK_PYTHON"] = sys.executable
    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F

    from tidewire.client import Client
    from tidewire.spark import register

    spark = (
        SparkSession.builder.master(args.master)
        .appName("tidewire spark write bench")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.driver.memory", "3g")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    register(spark)
    pad = "x" * (VALUE_BYTES - 12)
    df = (
        spark.range(0, args.rows, 1, 2)
        .select(F.concat(F.lpad(F.col("id").cast("string"), 12, "0"), F.lit(pad)).alias("v"))
        .select(F.col("v").cast("binary").alias("value"))
        .cache()
    )
    df.count()  # made and cached, untimed
    runs: dict[str, list[float]] = {"tidewire": [], "parquet": [], "noop": []}
    with broker(args.fsync, args.partitions) as addr, tempfile.TemporaryDirectory() as tmp:
        warm = df.limit(10_000)
        warm.write.format("tidewire").option("tidewire.servers", addr).option(
            "topic", "warm-up"
        ).mode("append").save()
        warm.write.mode("overwrite").parquet(f"{tmp}/warm-up")
        for r in range(args.repeat):
            topic = f"bench-{r}"
            with Client(addr) as c:
                c.create_topic(topic, args.partitions)
            runs["tidewire"].append(
                timed(
                    lambda topic=topic: (
                        df.write.format("tidewire")
                        .option("tidewire.servers", addr)
                        .option("topic", topic)
                        .option("tidewire.acks", "durable")
                        .option("tidewire.compression", args.compression)
                        .mode("append")
                        .save()
                    )
                )
            )
            with Client(addr) as c:
                stored = sum(p.high_watermark for p in c.describe_topic(topic).partitions)
            if stored != args.rows:
                raise SystemExit(f"{stored:,} rows stored in {topic}, not {args.rows:,}")
            runs["parquet"].append(
                timed(lambda: df.write.mode("overwrite").parquet(f"{tmp}/parquet"))
            )
            runs["noop"].append(timed(lambda: df.write.format("noop").mode("overwrite").save()))
            if not args.json:
                print(
                    f"run {r + 1}/{args.repeat}: tidewire {args.rows / runs['tidewire'][-1]:,.0f}"
                    f" rows/s, parquet {args.rows / runs['parquet'][-1]:,.0f}, noop "
                    f"{args.rows / runs['noop'][-1]:,.0f}",
                    file=sys.stderr,
                )
    spark.stop()
    rates = {k: args.rows / statistics.median(v) for k, v in runs.items()}
    doc = {
        "rows": args.rows,
        "value_bytes": VALUE_BYTES,
        "master": args.master,
        "fsync": args.fsync,
        "partitions": args.partitions,
        "compression": args.compression,
        "repeat": args.repeat,
        "rows_per_s": {k: round(v) for k, v in rates.items()},
        "mb_per_s": round(rates["tidewire"] * VALUE_BYTES / 1e6, 1),
        "ratio_to_parquet": round(rates["tidewire"] / rates["parquet"], 3),
        "ratio_to_noop": round(rates["tidewire"] / rates["noop"], 3),
        "target_rows_per_s": TARGET_ROWS_PER_S,
        "meets_target": rates["tidewire"] >= TARGET_ROWS_PER_S,
    }
    if args.json:
        print(json.dumps(doc))
        return
    print(
        f"spark batch write, {args.rows:,} rows of {VALUE_BYTES:,} B, {args.master}, "
        f"acks=durable, fsync={args.fsync}, {args.partitions} partitions "
        f"(median of {args.repeat}): tidewire {rates['tidewire']:,.0f} rows/s "
        f"({doc['mb_per_s']} MB/s); Spark to Parquet {rates['parquet']:,.0f} rows/s "
        f"(ratio {doc['ratio_to_parquet']}); noop sink {rates['noop']:,.0f} rows/s "
        f"(ratio {doc['ratio_to_noop']}); target {TARGET_ROWS_PER_S:,}: "
        + ("met" if doc["meets_target"] else "NOT met")
    )


if __name__ == "__main__":
    main()
