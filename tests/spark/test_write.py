"""Batch writes (``df.write.format("tidewire")``): values alone, keys, explicit partitions,
headers and a topic per row land as written; the options and columns are checked with clear
errors; and a write task that fails once and is retried stores each row exactly once."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
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
from tidewire.spark._source import TidewireDataSource
from tidewire.spark._writer import TidewireBatchWriter


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

    def dies_once_stored(batches: Iterator[Any]) -> Iterator[Any]:
        """The rows of a first attempt that dies 8,000 rows in, once the writer has stored
        some of them (it sends batches as they fill up): it waits until one is readable, so
        the retry always has rows to skip, however slow the machine."""
        import time

        from tidewire.client import Client

        given = 0
        for b in batches:
            yield b
            given += b.num_rows
            if given >= 8_000:
                break
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

    class DiesOnceWriter(TidewireBatchWriter):
        def write(self, iterator: Iterator[Any]) -> Any:
            from pyspark import TaskContext

            ctx = TaskContext.get()
            if ctx is not None and ctx.partitionId() == 1 and ctx.attemptNumber() == 0:
                iterator = dies_once_stored(iterator)
            return super().write(iterator)

    class DiesOnceSource(TidewireDataSource):
        @classmethod
        def name(cls) -> str:
            return "tidewire_dies_once"

        def writer(self, schema: Any, overwrite: bool) -> Any:
            return DiesOnceWriter(dict(self.options), schema, overwrite)

    spark.dataSource.register(DiesOnceSource)
    n = 20_000
    df = spark.range(0, n, 1, 2).select(F.format_string("row-%06d", "id").alias("value"))
    spark.conf.set("spark.sql.execution.arrow.maxRecordsPerBatch", "1000")
    try:
        df.write.format("tidewire_dies_once").option("tidewire.servers", addr).option(
            "topic", topic
        ).option("tidewire.batch.bytes", "4096").mode("append").save()
    finally:
        spark.conf.unset("spark.sql.execution.arrow.maxRecordsPerBatch")
    got = values(broker.addr, topic)
    counts = Counter(got)
    assert [v for v, c in counts.items() if c > 1] == []
    assert sorted(got) == [b"row-%06d" % i for i in range(n)]
    # One writer per Spark partition. Partition 1's batches carry epoch 0 (the attempt that
    # died, after storing some rows) and a later epoch (the retry, which resumed after them).
    # A loaded machine may fail an attempt more (a timeout, say), and every attempt takes the
    # writer's next epoch; the first attempt of each partition wrote, so epochs start at 0.
    epochs = sorted((sorted(e) for e in writer_epochs(broker.addr, topic).values()), key=len)
    assert len(epochs) == 2
    assert all(e[0] == 0 for e in epochs), epochs
    assert len(epochs[-1]) >= 2, epochs
    assert writer_states(broker, topic) == 0  # the job's writers were released at commit
