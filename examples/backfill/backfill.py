"""A batch backfill on tidewire: rows from files (Parquet by default: an export, an archive)
written into a topic by one Spark job, exactly once even when the job is run again.

    python examples/backfill/backfill.py --from /data/orders-2025 --topic orders \\
        --servers 127.0.0.1:7400 [--name orders-2025] [--format parquet]

The files need a ``value`` column (binary or string); ``key``, ``partition`` and ``headers``
are used when present (the columns of the tidewire source and of ``tidewire export``). The job
writes as the writer ``--name`` (default: the topic and the input path): if it fails half-way,
running it again with the same name and the same files stores only the rows the first run
did not, so the topic holds every row once.
"""

from __future__ import annotations

import argparse
import os
import sys

from pyspark.sql import DataFrame, SparkSession

from tidewire.spark import register

#: The columns the sink takes, in the files' order of preference.
SINK_COLUMNS = ("key", "value", "partition", "headers")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--from", dest="source", required=True, help="the files to load")
    ap.add_argument("--format", default="parquet", help="parquet, json, orc, ...")
    ap.add_argument("--topic", required=True, help="the topic written to")
    ap.add_argument("--servers", default="127.0.0.1:7400", help="the broker, HOST:PORT")
    ap.add_argument("--name", help="the job's writer name (default: topic and input path)")
    ap.add_argument(
        "--keep-partitions",
        action="store_true",
        help="write each row to the partition the files name (else: by key)",
    )
    ap.add_argument("--master", default="local[2]")
    return ap.parse_args(argv)


def rows(spark: SparkSession, args: argparse.Namespace) -> DataFrame:
    """The rows to write, in a stable order (the exactly-once writer needs each task to see
    the same rows in the same order on every run)."""
    df = spark.read.format(args.format).load(args.source)
    keep = [c for c in SINK_COLUMNS if c in df.columns]
    if not args.keep_partitions and "partition" in keep:
        keep.remove("partition")
    if "value" not in keep:
        raise SystemExit(f"{args.source}: no value column (it has {', '.join(df.columns)})")
    order = [c for c in ("partition", "offset") if c in df.columns] or ["value"]
    return df.orderBy(*order).select(*keep)


def run(spark: SparkSession, args: argparse.Namespace) -> None:
    register(spark)
    name = args.name or f"backfill {args.topic} {os.path.abspath(args.source)}"[:200]
    (
        rows(spark, args)
        .write.format("tidewire")
        .option("tidewire.servers", args.servers)
        .option("topic", args.topic)
        .option("tidewire.writerId", name)
        .mode("append")
        .save()
    )


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)  # workers import tidewire too
    spark = SparkSession.builder.master(args.master).appName("tidewire backfill").getOrCreate()
    try:
        run(spark, args)
    finally:
        spark.stop()


if __name__ == "__main__":
    main()
