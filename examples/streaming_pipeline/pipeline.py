"""A streaming pipeline on tidewire: JSON events from a topic, parsed, counted per event type in
event-time windows with a watermark, the results written to another topic (exactly once), and
the parsed events archived to Parquet (exactly once).

Run it against a broker (``tidewire serve``)::

    python examples/streaming_pipeline/pipeline.py --servers 127.0.0.1:7400 \\
        --events events --results event-counts --archive /tmp/events-archive \\
        --checkpoint /tmp/events-checkpoint [--once]

An event is a JSON object such as ``{"user": "u1", "type": "click", "amount": 250,
"ts": "2026-05-01T12:00:03Z"}`` (``ts`` optional: the record's timestamp is used without it;
``amount`` in cents). A result is ``{"window_start": ..., "window_end": ..., "type": "click",
"events": 12, "amount": 3000}``, keyed by the type, written when the watermark passes the
window's end (append mode).
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from tidewire.spark import register

EVENT_SCHEMA = "user string, type string, amount long, ts timestamp"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--servers", default="127.0.0.1:7400", help="the broker, HOST:PORT")
    ap.add_argument("--events", default="events", help="the topic of JSON events")
    ap.add_argument("--results", default="event-counts", help="the topic of window counts")
    ap.add_argument("--archive", required=True, help="the Parquet directory of parsed events")
    ap.add_argument("--checkpoint", required=True, help="the checkpoints' directory")
    ap.add_argument("--window", default="1 minute", help="the window length")
    ap.add_argument("--watermark", default="2 minutes", help="how late an event may arrive")
    ap.add_argument("--once", action="store_true", help="process what is there, then stop")
    ap.add_argument("--master", default="local[2]")
    return ap.parse_args(argv)


def run(spark: SparkSession, args: argparse.Namespace) -> list[Any]:
    """Start the pipeline's two queries on ``spark``; return them."""
    register(spark)
    raw = (
        spark.readStream.format("tidewire")
        .option("tidewire.servers", args.servers)
        .option("subscribe", args.events)
        .option("startingOffsets", "earliest")
        .load()
    )
    events = (
        raw.select(
            F.from_json(F.col("value").cast("string"), EVENT_SCHEMA).alias("e"),
            F.col("timestamp").alias("record_time"),
        )
        .where(F.col("e.type").isNotNull())  # not JSON, or no type: dropped
        .select(
            "e.user",
            "e.type",
            F.coalesce(F.col("e.amount"), F.lit(0)).alias("amount"),
            F.coalesce(F.col("e.ts"), F.col("record_time")).alias("event_time"),
        )
    )
    counts = (
        events.withWatermark("event_time", args.watermark)
        .groupBy(F.window("event_time", args.window).alias("w"), "type")
        .agg(F.count("*").alias("events"), F.sum("amount").alias("amount"))
        .select(
            F.col("type").alias("key"),
            F.to_json(
                F.struct(
                    F.col("w.start").alias("window_start"),
                    F.col("w.end").alias("window_end"),
                    "type",
                    "events",
                    "amount",
                )
            ).alias("value"),
        )
    )

    def trigger(writer: Any) -> Any:
        return (
            writer.trigger(availableNow=True)
            if args.once
            else writer.trigger(processingTime="10 seconds")
        )

    to_topic = trigger(
        counts.writeStream.format("tidewire")
        .outputMode("append")
        .option("tidewire.servers", args.servers)
        .option("topic", args.results)
        .option("checkpointLocation", os.path.join(args.checkpoint, "counts"))
        .queryName("event counts")
    ).start()
    to_archive = trigger(
        events.withColumn("date", F.to_date("event_time"))
        .writeStream.format("parquet")
        .option("path", args.archive)
        .option("checkpointLocation", os.path.join(args.checkpoint, "archive"))
        .partitionBy("date")
        .queryName("event archive")
    ).start()
    return [to_topic, to_archive]


def new_session(master: str) -> SparkSession:
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)  # workers import tidewire too
    return (
        SparkSession.builder.master(master)
        .appName("tidewire streaming pipeline")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.sql.shuffle.partitions", "2")
        # RocksDB keeps the aggregation's state in key order, so a micro-batch run again after
        # a failure emits its windows in the same order: what the exactly-once sink needs.
        .config(
            "spark.sql.streaming.stateStore.providerClass",
            "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider",
        )
        .getOrCreate()
    )


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    spark = new_session(args.master)
    try:
        for q in run(spark, args):
            q.awaitTermination()
    finally:
        spark.stop()


if __name__ == "__main__":
    main()
