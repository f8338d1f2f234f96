"""Batch reads (``spark.read.format("tidewire")``) against a real broker: every row and
field, offset and timestamp ranges, the three ways to subscribe, tasks per range, and
clear errors for bad options."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.spark._support import T0, expected, fill, rows_of, unique_topic
from tidewire.client import Client


def reader(spark: Any, broker: Any, **options: str) -> Any:
    r = spark.read.format("tidewire").option("tidewire.servers", broker.addr)
    for k, v in options.items():
        r = r.option(k, v)
    return r


def test_reads_every_row_and_field(spark: Any, broker: Any) -> None:
    topic = unique_topic()
    fill(broker.addr, topic, 3, 40, batch=15)
    df = reader(spark, broker, subscribe=topic, includeHeaders="true").load()
    want = [row for p in range(3) for row in expected(topic, p, range(40), headers=True)]
    assert rows_of(df) == want
    assert df.rdd.getNumPartitions() == 3  # a task per partition
    # Without headers: the Kafka columns only; and a filter and count run as usual.
    df = reader(spark, broker, subscribe=topic).load()
    assert "headers" not in df.columns
    assert df.filter("partition = 1 and key is null").count() == 14


def test_offset_ranges(spark: Any, broker: Any) -> None:
    a, b = unique_topic(), unique_topic()
    fill(broker.addr, a, 2, 30)
    fill(broker.addr, b, 1, 10)
    starting = {a: {"0": 5, "1": -2}, b: {"0": 7}}
    ending = {a: {"0": 12, "1": -1}, b: {"0": 9}}
    df = reader(
        spark,
        broker,
        subscribe=f"{a}, {b}",
        startingOffsets=json.dumps(starting),
        endingOffsets=json.dumps(ending),
    ).load()
    assert rows_of(df) == (
        expected(a, 0, range(5, 12)) + expected(a, 1, range(30)) + expected(b, 0, range(7, 9))
    )
    # Partitions left out of the JSON read from the earliest, to the latest.
    df = reader(
        spark,
        broker,
        subscribe=a,
        startingOffsets=json.dumps({a: {"1": 28}}),
        endingOffsets=json.dumps({a: {"0": 2}}),
    ).load()
    assert rows_of(df) == expected(a, 0, range(2)) + expected(a, 1, range(28, 30))


def test_timestamp_ranges(spark: Any, broker: Any) -> None:
    topic = unique_topic()
    fill(broker.addr, topic, 2, 50)  # the record at offset o has timestamp T0 + 10 * o
    df = reader(
        spark,
        broker,
        subscribe=topic,
        startingTimestamp=str(T0 + 10 * 20 - 5),  # the first record at or after: 20
        endingTimestamp=str(T0 + 10 * 30),  # ends before the record stamped so: 30
    ).load()
    assert rows_of(df) == expected(topic, 0, range(20, 30)) + expected(topic, 1, range(20, 30))
    by_partition = json.dumps({topic: {"0": T0 + 10 * 45, "1": T0 + 10 * 49 + 1}})
    df = reader(spark, broker, subscribe=topic, startingOffsetsByTimestamp=by_partition).load()
    assert rows_of(df) == expected(topic, 0, range(45, 50))  # nothing after 49 in partition 1


def test_assign_and_pattern(spark: Any, broker: Any) -> None:
    prefix = unique_topic("pat")
    fill(broker.addr, f"{prefix}-x", 2, 5)
    fill(broker.addr, f"{prefix}-y", 1, 3)
    fill(broker.addr, f"other-{prefix}", 1, 3)
    df = reader(spark, broker, subscribePattern=f"{prefix}-.*").load()
    assert rows_of(df) == (
        expected(f"{prefix}-x", 0, range(5))
        + expected(f"{prefix}-x", 1, range(5))
        + expected(f"{prefix}-y", 0, range(3))
    )
    df = reader(spark, broker, assign=json.dumps({f"{prefix}-x": [1], f"{prefix}-y": [0]})).load()
    assert rows_of(df) == expected(f"{prefix}-x", 1, range(5)) + expected(
        f"{prefix}-y", 0, range(3)
    )


def test_min_partitions_splits_ranges(spark: Any, broker: Any) -> None:
    topic = unique_topic()
    fill(broker.addr, topic, 2, 300, batch=50)
    with Client(broker.addr) as client:  # and an empty third partition: no task for it
        client.alter_topic(topic, partitions=3)
    df = reader(
        spark,
        broker,
        subscribe=topic,
        minPartitions="7",
        startingOffsets=json.dumps({topic: {"0": 10}}),
    ).load()
    # Each range gets tasks in proportion to its size, rounded up: 4 + 4 here.
    assert df.rdd.getNumPartitions() == 8
    assert rows_of(df) == expected(topic, 0, range(10, 300)) + expected(topic, 1, range(300))
    # Fetches cut inside batches still give every row once.
    df = reader(spark, broker, subscribe=topic, minPartitions="40").load()
    assert df.rdd.getNumPartitions() >= 40
    assert rows_of(df) == expected(topic, 0, range(300)) + expected(topic, 1, range(300))


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({}, "exactly one of the options subscribe, subscribePattern and assign"),
        ({"subscribe": "a", "assign": '{"a": [0]}'}, "got subscribe, assign"),
        ({"subscribe": "a", "startingOffsets": "latest"}, "startingOffsets=latest reads nothing"),
        ({"subscribe": "a", "startingOffsets": "{nope"}, "startingOffsets is not valid JSON"),
        ({"subscribe": "a", "minPartitions": "0"}, "minPartitions must be at least 1"),
        ({"subscribe": "a", "maxOffsetsPerTrigger": "5"}, "is for streaming queries"),
        ({"assign": '{"no-such-topic": [0]}'}, "names topic 'no-such-topic', which does not"),
    ],
)
def test_bad_options_are_named(
    spark: Any, broker: Any, options: dict[str, str], message: str
) -> None:
    with pytest.raises(Exception, match=message):
        reader(spark, broker, **options).load().collect()


def test_offsets_past_the_end_are_refused(spark: Any, broker: Any) -> None:
    topic = unique_topic()
    fill(broker.addr, topic, 1, 5)
    ending = json.dumps({topic: {"0": 6}})
    with pytest.raises(Exception, match=r"ending offset 6 of .*/0 is past its end \(5\)"):
        reader(spark, broker, subscribe=topic, endingOffsets=ending).load().collect()
    assert reader(spark, broker, subscribe="no-such-topic").load().count() == 0
    with pytest.raises(Exception, match=r"tidewire\.servers is required"):
        spark.read.format("tidewire").option("subscribe", topic).load().collect()
