"""The source as Spark sees it: found by name without a register call, its schema, its Arrow
twin, and clear errors for bad options."""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pytest
from pyspark.sql.pandas.types import to_arrow_schema

from tidewire.spark import SOURCE_NAME, TidewireDataSource, arrow_schema, register, spark_schema

KAFKA_COLUMNS = ["key", "value", "topic", "partition", "offset", "timestamp", "timestampType"]


@pytest.mark.parametrize("headers", [False, True])
def test_arrow_schema_is_what_spark_derives(headers: bool) -> None:
    # Spark refuses record batches whose schema differs from this derivation in any way.
    derived = to_arrow_schema(spark_schema(headers), timezone="UTC")
    assert arrow_schema(headers).equals(derived, check_metadata=True)
    assert arrow_schema(headers).field("timestamp").type == pa.timestamp("us", tz="UTC")


def test_name_and_schema() -> None:
    assert TidewireDataSource.name() == SOURCE_NAME == "tidewire"
    plain = TidewireDataSource({}).schema()
    assert plain.fieldNames() == KAFKA_COLUMNS
    with_headers = TidewireDataSource({"includeheaders": "TRUE"}).schema()
    assert with_headers.fieldNames() == [*KAFKA_COLUMNS, "headers"]
    assert with_headers["headers"].dataType.simpleString() == (
        "array<struct<key:string,value:binary>>"
    )
    with pytest.raises(ValueError, match="includeHeaders must be true or false"):
        TidewireDataSource({"includeheaders": "yes"}).schema()


def test_found_by_name_and_registered(spark: Any, broker: Any) -> None:
    # pyspark_tidewire.DefaultSource makes the format known without a call ...
    df = (
        spark.read.format("tidewire")
        .option("tidewire.servers", broker.addr)
        .option("subscribe", "no-such-topic-yet")
        .option("includeHeaders", "true")
        .load()
    )
    assert df.schema.fieldNames() == [*KAFKA_COLUMNS, "headers"]
    # ... and register() is one harmless call.
    register(spark)
    register(spark)
    schema = spark.read.format("tidewire").load().schema
    assert schema.simpleString() == (
        "struct<key:binary,value:binary,topic:string,partition:int,offset:bigint,"
        "timestamp:timestamp,timestampType:int>"
    )


def test_public_names() -> None:
    import pyspark_tidewire
    import tidewire.spark

    assert tidewire.spark.__all__ == [
        "SOURCE_NAME",
        "DataLossError",
        "TidewireDataSource",
        "arrow_schema",
        "register",
        "spark_schema",
    ]
    assert pyspark_tidewire.DefaultSource is TidewireDataSource
