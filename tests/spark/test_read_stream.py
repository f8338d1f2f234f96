"""Streaming reads (``spark.readStream.format("tidewire")``) against a real broker:
Trigger.AvailableNow bounded by maxOffsetsPerTrigger, the group that shows the query's
progress, a restart from the checkpoint, and a processing-time query that picks up new data
and new partitions, stopped and restarted with nothing lost or repeated."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.spark._support import expected, fill, produce_range, rows_of, unique_topic
from tidewire.client import Client

#: The longest a streaming query may take to show what a test waits for (s): generous,
#: a query's first batch pays seconds of start-up on a loaded machine.
WAIT_S = 120.0


def stream(spark: Any, broker: Any, **options: str) -> Any:
    r = spark.readStream.format("tidewire").option("tidewire.servers", broker.addr)
    for k, v in options.items():
        r = r.option(k, v)
    return r.load()


def wait_for(what: str, check: Callable[[], bool], query: Any) -> None:
    """Poll ``check`` until it holds; fail if the query died or WAIT_S passed."""
    deadline = time.monotonic() + WAIT_S
    while not check():
        if query.exception() is not None:
            raise AssertionError(f"the query failed while waiting for {what}: {query.exception()}")
        if time.monotonic() > deadline:
            raise AssertionError(f"no {what} after {WAIT_S} s; last progress {query.lastProgress}")
        time.sleep(0.2)


def rows_in(query: Any) -> int:
    """Rows of the query's finished micro-batches (its recent progress: no Spark job)."""
    return sum(p["numInputRows"] for p in query.recentProgress)


def test_available_now_bounded_restarted_and_shown_as_a_group(
    spark: Any, broker: Any, tmp_path: Path
) -> None:
    topic, group = unique_topic(), unique_topic("group")
    fill(broker.addr, topic, 2, 50, batch=10)
    batches: list[list[tuple[Any, ...]]] = []
    lock = threading.Lock()

    def collect(df: Any, batch_id: int) -> None:
        rows = rows_of(df)
        with lock:
            batches.append(rows)

    def run() -> Any:
        query = (
            stream(
                spark,
                broker,
                subscribe=topic,
                startingOffsets="earliest",
                maxOffsetsPerTrigger="30",
                **{"tidewire.group.id": group},
            )
            .writeStream.foreachBatch(collect)
            .option("checkpointLocation", str(tmp_path / "checkpoint"))
            .trigger(availableNow=True)
            .start()
        )
        assert query.awaitTermination(WAIT_S)
        assert query.exception() is None
        return query

    query = run()
    sizes = [len(b) for b in batches]
    assert sum(sizes) == 100
    assert max(sizes) <= 30  # maxOffsetsPerTrigger bounds each micro-batch
    assert len(sizes) >= 4
    assert all(p["numInputRows"] <= 30 for p in query.recentProgress)
    assert sorted(r for b in batches for r in b) == expected(topic, 0, range(50)) + expected(
        topic, 1, range(50)
    )
    # The group shows the query's progress: everything read, no lag.
    with Client(broker.addr) as client:
        lag = {(x.topic, x.partition): (x.committed, x.lag) for x in client.group_lag(group)}
    assert lag == {(topic, 0): (50, 0), (topic, 1): (50, 0)}

    # More data; the restarted query resumes where the checkpoint says: only the new rows.
    fill(broker.addr, topic, 2, 20, batch=20, start=50)
    del batches[:]
    run()
    assert sorted(r for b in batches for r in b) == expected(topic, 0, range(50, 70)) + expected(
        topic, 1, range(50, 70)
    )
    with Client(broker.addr) as client:
        assert {x.partition: x.lag for x in client.group_lag(group)} == {0: 0, 1: 0}
    # The checkpoint's offsets are Kafka-shaped JSON, partitions in order.
    offsets_dir = tmp_path / "checkpoint" / "offsets"
    last = max(offsets_dir.iterdir(), key=lambda p: int(p.name) if p.name.isdigit() else -1)
    assert json.loads(last.read_text().splitlines()[-1]) == {topic: {"0": 70, "1": 70}}


def test_processing_time_picks_up_new_data_and_restarts_exactly(
    spark: Any, broker: Any, tmp_path: Path
) -> None:
    topic = unique_topic()
    fill(broker.addr, topic, 1, 10)
    out, checkpoint = tmp_path / "out", tmp_path / "checkpoint"

    def start() -> Any:
        return (
            stream(spark, broker, subscribe=topic, startingOffsets="earliest")
            .selectExpr("topic", "partition", "offset", "value")
            .writeStream.format("parquet")  # exactly-once through its own log
            .option("path", str(out))
            .option("checkpointLocation", str(checkpoint))
            .trigger(processingTime="200 milliseconds")
            .start()
        )

    def stored() -> list[tuple[Any, ...]]:
        if not (out / "_spark_metadata").exists():
            return []
        df = spark.read.schema("topic string, partition int, offset long, value binary")
        df = df.parquet(str(out))  # through the sink's log: what it committed, once
        return sorted((r[0], r[1], r[2], bytes(r[3])) for r in df.collect())

    def want(counts: dict[int, int]) -> list[tuple[Any, ...]]:
        return [
            (topic, p, r[2], r[4]) for p, n in counts.items() for r in expected(topic, p, range(n))
        ]

    query = start()
    try:
        wait_for("first rows", lambda: rows_in(query) == 10, query)
        fill(broker.addr, topic, 1, 15, start=10)  # new data in a running query
        with Client(broker.addr) as client:  # and a new partition, read from its start
            client.alter_topic(topic, partitions=2)
        produce_range(broker.addr, topic, 1, range(5))
        wait_for("new rows", lambda: rows_in(query) == 30, query)
        assert stored() == sorted(want({0: 25, 1: 5}))
    finally:
        query.stop()
    # Stopped; data arrives meanwhile; the restarted query reads exactly what is new.
    fill(broker.addr, topic, 1, 5, start=25)
    produce_range(broker.addr, topic, 1, range(5, 8))
    query = start()
    try:
        wait_for("rows after the restart", lambda: rows_in(query) >= 8, query)
    finally:
        query.stop()
    assert stored() == sorted(want({0: 30, 1: 8}))


def test_a_pattern_picks_up_new_topics_from_their_start(
    spark: Any, broker: Any, tmp_path: Path
) -> None:
    prefix = unique_topic("grow")
    fill(broker.addr, f"{prefix}-a", 1, 5)
    got: list[tuple[Any, ...]] = []

    def run() -> None:
        query = (
            stream(spark, broker, subscribePattern=f"{prefix}-.*", startingOffsets="latest")
            .writeStream.foreachBatch(lambda df, _: got.extend(rows_of(df)))
            .option("checkpointLocation", str(tmp_path / "checkpoint"))
            .trigger(availableNow=True)
            .start()
        )
        assert query.awaitTermination(WAIT_S)

    run()  # starts at the latest offsets: nothing read, the positions checkpointed
    assert got == []
    produce_range(broker.addr, f"{prefix}-a", 0, range(5, 8))
    fill(broker.addr, f"{prefix}-b", 2, 4)  # a new matching topic: read from offset 0
    run()
    assert sorted(got) == (
        expected(f"{prefix}-a", 0, range(5, 8))
        + expected(f"{prefix}-b", 0, range(4))
        + expected(f"{prefix}-b", 1, range(4))
    )
