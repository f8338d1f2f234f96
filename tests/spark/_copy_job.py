"""The streaming job the exactly-once test kills: an input topic copied to another topic (the
tidewire sink) or to Parquet (Spark's file sink), bounded by maxOffsetsPerTrigger and run with
availableNow from its checkpoint. One query per process: two streaming queries in one local
SparkContext occasionally fail a task with java.io.OptionalDataException while Spark
deserializes it, whatever the source and sink.

Usage: python -m tests.spark._copy_job topic|parquet ADDR IN_TOPIC OUT_TOPIC PARQUET_DIR
    CHECKPOINT_DIR PER_TRIGGER
"""

from __future__ import annotations

import sys

from tidewire.spark import register
from tidewire.spark._export import new_session


def main(argv: list[str]) -> None:
    # PER_TRIGGER: records per micro-batch (the test makes it a fifth of the input, so that
    # a kill lands in the middle of one).
    what, addr, in_topic, out_topic, parquet, checkpoints, per_trigger = argv
    spark = new_session("local[2]", f"tidewire copy job to {what}")
    register(spark)
    src = (
        spark.readStream.format("tidewire")
        .option("tidewire.servers", addr)
        .option("subscribe", in_topic)
        .option("startingOffsets", "earliest")
        .option("maxOffsetsPerTrigger", per_trigger)
        .load()
    )
    if what == "topic":
        writer = (
            src.select("key", "value")
            .writeStream.format("tidewire")
            .option("tidewire.servers", addr)
            .option("topic", out_topic)
        )
    else:
        writer = (
            src.select("partition", "offset", "value")
            .writeStream.format("parquet")
            .option("path", parquet)
        )
    query = (
        writer.option("checkpointLocation", f"{checkpoints}/{what}")
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    print("done", flush=True)
    spark.stop()


if __name__ == "__main__":
    main(sys.argv[1:8])
