"""Batch writes (``df.write.format("tidewire")``): values alone, keys, explicit partitions,
headers and a topic per row land as written; the options and columns are checked with clear
errors; and a write task that fails once and is retried stores each row exactly once."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest
from pyspark.sql import functions as F

from tests.spark._write_support import (
    create_topic,
    read_topic,
    topic_name,
    values,
    writer_epochs,
    writer_states,
)


def write(df: Any, broker: Any, **options: str) -> None:
    w = df.write.format("tidewire").option("tidewire.servers", broker.addr)
    for k, v in options.items():
        w = w.option(k.replace("_", "."), v)
    w.mode("append").save()


def test_values_keys_partitions_and_headers(spark: Any, broker: Any) -> None:
    topic = topic_name("w-kph")
    create_topic(broker.addr, topic, 3)
    rows = [
        (f"k{i % 5}".encode(), f"v{i}".encode(), i % 3 if i % 2 else None, [("h", b"%d" % i)])
        for i in range(300)
    ]
    df = spark.createDataFrame(
        rows,
        "key binary, value binary, partition int, headers array<struct<key:string,value:binary>>",
    ).repartition(2)
    write(df, broker, topic=topic)
    got = read_topic(broker.addr, topic)
    every = [r for rs in got.values() for r in rs]
    assert sorted(r.value for r in every) == sorted(v for _, v, _, _ in rows)
    by_value = {v: (k, p, h) for k, v, p, h in rows}
    keyed_partition: dict[bytes, int] = {}
    for p, records in got.items():
        for r in records:
            key, want_p, headers = by_value[r.value]
            assert r.key == key
            assert r.headers == tuple(headers)
            if want_p is not None:
                assert p == want_p
            else:  # routed by the key's hash: one partition per key
                assert keyed_partition.setdefault(key, p) == p


def test_a_topic_column_and_string_columns(spark: Any, broker: Any) -> None:
    a, b = topic_name("w-col-a"), topic_name("w-col-b")
    df = spark.range(100).select(
        F.when(F.col("id") % 2 == 0, F.lit(a)).otherwise(F.lit(b)).alias("topic"),
        F.col("id").cast("string").alias("value"),
        F.concat(F.lit("key-"), F.col("id")).alias("key"),
    )
    write(df, broker)
    assert sorted(int(v) for v in values(broker.addr, a)) == list(range(0, 100, 2))
    assert sorted(int(v) for v in values(broker.addr, b)) == list(range(1, 100, 2))
    # the option wins over the column, as in Spark's Kafka sink
    c = topic_name("w-col-c")
    write(df, broker, topic=c)
    assert len(values(broker.addr, c)) == 100


@pytest.mark.parametrize(
    ("schema", "options", "message"),
    [
        ("key binary", {"topic": "t"}, "needs a value column"),
        ("value int", {"topic": "t"}, "column value must be binary or string, not int"),
        ("value binary, key int", {"topic": "t"}, "column key must be binary or string"),
        ("value binary", {}, "no topic to write to"),
        ("value binary, topic int", {}, "column topic must be string"),
        ("value binary, partition string", {"topic": "t"}, "column partition must be int"),
        ("value binary, headers array<string>", {"topic": "t"}, "column headers must be"),
        ("value binary", {"topic": "t", "tidewire.acks": "none"}, "tidewire.acks must be"),
        ("value binary", {"topic": "t", "tidewire.compression": "brotli"}, "compression must"),
    ],
)
def test_clear_errors(
    spark: Any, broker: Any, schema: str, options: dict[str, str], message: str
) -> None:
    df = spark.createDataFrame([], schema)
    w = df.write.format("tidewire").option("tidewire.servers", broker.addr)
    for k, v in options.items():
        w = w.option(k, v)
    with pytest.raises(Exception, match=message):
        w.mode("append").save()


def test_overwrite_is_refused(spark: Any, broker: Any) -> None:
    df = spark.createDataFrame([(b"x",)], "value binary")
    with pytest.raises(Exception, match="append-only"):
        df.write.format("tidewire").option("tidewire.servers", broker.addr).option(
            "topic", "t"
        ).mode("overwrite").save()


def test_a_task_that_fails_once_is_retried_and_stores_each_row_once(
    spark: Any, broker: Any
) -> None:
    topic = topic_name("w-retry")
    create_topic(broker.addr, topic, 2)

    addr = broker.addr

    def value(i: int) -> bytes:
        # The first attempt of Spark partition 1 dies part-way (8,000 rows in), once its writer
        # has stored some of the rows before (batches are sent as they fill up): it waits for
        # one of them to be readable, so the retry has rows to skip however slow the machine.
        import time

        from pyspark import TaskContext

        from tidewire.client import Client

        ctx = TaskContext.get()
        first_attempt = ctx is not None and ctx.partitionId() == 1 and ctx.attemptNumber() == 0
        if first_attempt and i == 18_000:
            deadline = time.monotonic() + 60
            with Client(addr) as c:
                while time.monotonic() < deadline:
                    for p in (0, 1):
                        offset = 0
                        while got := c.fetch(topic, p, offset, max_wait_ms=0).records:
                            if any((r.value or b"") >= b"row-010000" for r in got):
                                raise RuntimeError("the first attempt dies here")
                            offset = got[-1].offset + 1
                    time.sleep(0.05)
            raise AssertionError("the first attempt's writer stored none of its rows in 60 s")
        return b"row-%06d" % i

    n = 20_000
    udf = F.udf(value, "binary", useArrow=False)
    df = spark.range(0, n, 1, 2).select(udf("id").alias("value"))
    spark.conf.set("spark.sql.execution.arrow.maxRecordsPerBatch", "1000")
    try:
        write(df, broker, topic=topic, tidewire_batch_bytes="4096")
    finally:
        spark.conf.unset("spark.sql.execution.arrow.maxRecordsPerBatch")
    got = values(broker.addr, topic)
    counts = Counter(got)
    assert [v for v, c in counts.items() if c > 1] == []
    assert sorted(got) == [b"row-%06d" % i for i in range(n)]
    # One writer per Spark partition. Partition 1's batches carry epoch 0 (the attempt that
    # died) and a later epoch (the retry, which resumed after them). A loaded machine may fail
    # an attempt more (a timeout, say), and every attempt takes the writer's next epoch; the
    # first attempt of each partition wrote, so each writer's epochs start at 0.
    epochs = sorted((sorted(e) for e in writer_epochs(broker.addr, topic).values()), key=len)
    assert len(epochs) == 2
    assert all(e[0] == 0 for e in epochs), epochs
    assert len(epochs[-1]) >= 2, epochs
    assert writer_states(broker, topic) == 0  # the job's writers were released at commit
