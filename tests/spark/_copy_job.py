"""The streaming job the exactly-once test kills: one input topic copied by two queries, to
another topic (the tidewire sink) and to Parquet (Spark's file sink), both bounded by
maxOffsetsPerTrigger and run with availableNow from their checkpoints.

Usage: python -m tests.spark._copy_job ADDR IN_TOPIC OUT_TOPIC PARQUET_DIR CHECKPOINT_DIR
"""

from __future__ import annotations

import sys

from tidewire.spark import register
from tidewire.spark._export import new_session

#: Records per micro-batch: five batches per query, so a kill lands in the middle of one.
PER_TRIGGER = 20_000


def main(addr: str, in_topic: str, out_topic: str, parquet: str, checkpoints: str) -> None:
    spark = new_session("local[2]", "tidewire copy job")
    register(spark)
    src = (
        spark.readStream.format("tidewire")
        .option("tidewire.servers", addr)
        .option("subscribe", in_topic)
        .option("startingOffsets", "earliest")
        .option("maxOffsetsPerTrigger", str(PER_TRIGGER))
        .load()
    )
    to_topic = (
        src.select("key", "value")
        .writeStream.format("tidewire")
        .option("tidewire.servers", addr)
        .option("topic", out_topic)
        .option("checkpointLocation", f"{checkpoints}/topic")
        .trigger(availableNow=True)
        .start()
    )
    to_parquet = (
        src.select("partition", "offset", "value")
        .writeStream.format("parquet")
        .option("path", parquet)
        .option("checkpointLocation", f"{checkpoints}/parquet")
        .trigger(availableNow=True)
        .start()
    )
    to_topic.awaitTermination()
    to_parquet.awaitTermination()
    print("done", flush=True)
    spark.stop()


if __name__ == "__main__":
    main(*sys.argv[1:6])
