"""Offsets retention deleted, batch and streaming: with failOnDataLoss=true (the default) the
query fails and says what is gone; with false it reads what is left."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from pyspark.errors import StreamingQueryException

from tests.spark._support import expected, produce_range, rows_of, unique_topic
from tidewire.client import Client
from tidewire.protocol.messages import TopicConfig

#: Small segments and a small size bound: retention deletes the oldest records at once.
SMALL_LOG = TopicConfig(segment_bytes=1024, retention_bytes=2048)


def retained_topic(broker: Any, n: int) -> tuple[str, int]:
    """A topic of one partition with ``n`` records of which retention deleted the oldest;
    returns it and where its log starts now."""
    topic = unique_topic("retained")
    with Client(broker.addr) as client:
        client.create_topic(topic, 1, SMALL_LOG)
    for lo in range(0, n, 5):
        produce_range(broker.addr, topic, 0, range(lo, min(lo + 5, n)))
    return topic, apply_retention(broker, topic)


def apply_retention(broker: Any, topic: str) -> int:
    """Apply retention now (the broker does it every minute) and return the log start."""
    broker.call(broker.eb.broker.logs.apply_retention)
    with Client(broker.addr) as client:
        return client.describe_topic(topic).partitions[0].log_start_offset


def test_batch(spark: Any, broker: Any) -> None:
    topic, log_start = retained_topic(broker, 100)
    assert 0 < log_start < 100

    def read(**options: str) -> Any:
        r = spark.read.format("tidewire").option("tidewire.servers", broker.addr)
        r = r.option("subscribe", topic).option("startingOffsets", json.dumps({topic: {"0": 0}}))
        for k, v in options.items():
            r = r.option(k, v)
        return r.load()

    with pytest.raises(Exception, match=rf"offsets 0\.\.{log_start - 1} of {topic}/0 are gone"):
        read().collect()
    assert rows_of(read(failOnDataLoss="false")) == expected(topic, 0, range(log_start, 100))
    # earliest asks for what is there: no loss.
    rows = spark.read.format("tidewire").option("tidewire.servers", broker.addr)
    rows = rows.option("subscribe", topic).option("startingOffsets", "earliest").load()
    assert rows.count() == 100 - log_start


def test_streaming(spark: Any, broker: Any, tmp_path: Path) -> None:
    topic = unique_topic("retained")
    with Client(broker.addr) as client:
        client.create_topic(topic, 1, SMALL_LOG)
    produce_range(broker.addr, topic, 0, range(10))
    got: list[Any] = []

    def run(fail_on_data_loss: str) -> Any:
        query = (
            spark.readStream.format("tidewire")
            .option("tidewire.servers", broker.addr)
            .option("subscribe", topic)
            .option("startingOffsets", "earliest")
            .option("failOnDataLoss", fail_on_data_loss)
            .load()
            .writeStream.foreachBatch(lambda df, _: got.extend(rows_of(df)))
            .option("checkpointLocation", str(tmp_path / "checkpoint"))
            .trigger(availableNow=True)
            .start()
        )
        assert query.awaitTermination(120)  # raises what failed the query
        return query

    run("true")
    assert got == expected(topic, 0, range(10))
    # While the query is stopped, records come and retention deletes some it has not read.
    for lo in range(10, 100, 5):
        produce_range(broker.addr, topic, 0, range(lo, lo + 5))
    log_start = apply_retention(broker, topic)
    assert 10 < log_start < 100
    del got[:]
    with pytest.raises(StreamingQueryException, match=rf"offsets 10\.\.{log_start - 1} of "):
        run("true")
    assert got == []
    run("false")
    assert got == expected(topic, 0, range(log_start, 100))
