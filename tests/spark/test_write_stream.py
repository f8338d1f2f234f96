"""Streaming writes (``df.writeStream.format("tidewire")``): rows with a topic per row, keys and
headers land once per micro-batch across restarts from the checkpoint; a micro-batch whose job
failed (part of its rows already stored) and that runs again when the query restarts stores
nothing twice; the commit on the driver releases the writers of the batch before."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import functions as F

from tests.spark._write_support import (
    create_topic,
    read_topic,
    topic_name,
    values,
    writer_states,
)

SCHEMA = "id long, kind string"


def add_file(src: Path, name: str, ids: range) -> None:
    """A JSON-lines file of events for the file source (written whole, then renamed in)."""
    tmp = src.parent / f".{name}.tmp"
    tmp.write_text("".join(json.dumps({"id": i, "kind": "ab"[i % 2]}) + "\n" for i in ids))
    tmp.rename(src / name)


def run_once(spark: Any, broker: Any, src: Path, checkpoint: Path, prefix: str) -> None:
    events = spark.readStream.schema(SCHEMA).option("maxFilesPerTrigger", 1).json(str(src))
    out = events.select(
        F.concat(F.lit(prefix + "-"), F.col("kind")).alias("topic"),
        F.col("id").cast("string").alias("value"),
        F.concat(F.lit("k"), F.col("id") % 7).alias("key"),
        F.array(
            F.struct(F.lit("id").alias("key"), F.col("id").cast("string").alias("value"))
        ).alias("headers"),
    )
    q = (
        out.writeStream.format("tidewire")
        .option("tidewire.servers", broker.addr)
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )
    q.awaitTermination(300)
    assert q.exception() is None


def test_stream_with_topics_keys_headers_across_restarts(
    spark: Any, broker: Any, tmp_path: Path
) -> None:
    prefix = topic_name("ws")
    for kind in "ab":
        create_topic(broker.addr, f"{prefix}-{kind}", 2)
    src = tmp_path / "src"
    src.mkdir()
    add_file(src, "0.json", range(500))
    add_file(src, "1.json", range(500, 1000))
    run_once(spark, broker, src, tmp_path / "ckpt", prefix)
    add_file(src, "2.json", range(1000, 1500))
    run_once(spark, broker, src, tmp_path / "ckpt", prefix)  # only the new file
    for kind, parity in (("a", 0), ("b", 1)):
        got = read_topic(broker.addr, f"{prefix}-{kind}")
        every = [r for rs in got.values() for r in rs]
        assert sorted(int(r.value) for r in every) == list(range(parity, 1500, 2))
        for r in every:
            assert r.key == b"k%d" % (int(r.value) % 7)
            assert r.headers == (("id", r.value),)


def test_a_failed_micro_batch_runs_again_and_stores_nothing_twice(
    spark: Any, broker: Any, tmp_path: Path
) -> None:
    topic = topic_name("ws-rerun")
    create_topic(broker.addr, topic, 2)
    src = tmp_path / "src"
    src.mkdir()
    n = 20_000
    add_file(src, "0.json", range(n // 2))
    add_file(src, "1.json", range(n // 2, n))
    broken = tmp_path / "broken"
    broken.write_text("x")

    addr = broker.addr

    def value(i: int) -> bytes:
        # While the flag file exists, every attempt of the task reading file 1 dies at id
        # 16,000: the micro-batch's job fails and the query stops. It dies only once the task
        # reading file 0 (on the other core) has stored all of its rows, which it waits to see:
        # the failed job would cancel that task, and how far it got would depend on the
        # machine's speed.
        if i == 16_000 and broken.exists():
            import time

            from tidewire.client import Client

            deadline = time.monotonic() + 60
            with Client(addr) as c:
                while time.monotonic() < deadline:
                    seen = 0
                    for p in (0, 1):
                        offset = 0
                        while got := c.fetch(topic, p, offset, max_wait_ms=0).records:
                            seen += sum((r.value or b"") < b"%06d" % (n // 2) for r in got)
                            offset = got[-1].offset + 1
                    if seen >= n // 2:
                        break
                    time.sleep(0.05)
            raise RuntimeError("this micro-batch fails")
        return b"%06d" % i

    udf = F.udf(value, "binary", useArrow=False)

    def start() -> Any:
        events = spark.readStream.schema(SCHEMA).json(str(src))  # a partition per file
        return (
            events.select(udf("id").alias("value"))
            .writeStream.format("tidewire")
            .option("tidewire.servers", broker.addr)
            .option("topic", topic)
            .option("tidewire.batch.bytes", "4096")
            .option("checkpointLocation", str(tmp_path / "ckpt"))
            .trigger(availableNow=True)
            .start()
        )

    spark.conf.set("spark.sql.execution.arrow.maxRecordsPerBatch", "500")
    try:
        q = start()
        with pytest.raises(Exception, match="this micro-batch fails"):
            q.awaitTermination(300)
        stored_before = values(broker.addr, topic)
        assert set(stored_before) >= {b"%06d" % i for i in range(n // 2)}
        assert len(stored_before) < n
        broken.unlink()
        q = start()  # from the checkpoint: batch 0 runs again
        q.awaitTermination(300)
        assert q.exception() is None
    finally:
        spark.conf.unset("spark.sql.execution.arrow.maxRecordsPerBatch")
    got = values(broker.addr, topic)
    assert [v for v, c in Counter(got).items() if c > 1] == []
    assert sorted(got) == [b"%06d" % i for i in range(n)]  # file 0's rows were not written again
    # one micro-batch, not followed by another: its writers are kept (it might run again)
    assert writer_states(broker, topic) > 0
