"""The rows a tidewire source produces: the Spark schema and its exact Arrow twin.

The columns are those of Spark's Kafka source, so a job moves between the two by changing
the format name::

    key            binary       the record's key (null when it has none)
    value          binary       the record's value (null for a tombstone)
    topic          string
    partition      int
    offset         long
    timestamp      timestamp    the record's timestamp (ms precision) as UTC
    timestampType  int          0: set by the producer (create time), 1: by the broker
    headers        array<struct<key: string, value: binary>>   only with includeHeaders=true

Spark accepts Arrow record batches from a Python source only when their schema equals the
one it derives from the Spark schema: ``timestamp[us, tz=UTC]``, ``binary`` (not
``large_binary``), ``string``, every field nullable, and the list's item field named
``element``. :func:`arrow_schema` is exactly that.
"""

from __future__ import annotations

import pyarrow as pa
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from tidewire.client import _arrow

__all__ = ["HEADER_ARROW_TYPE", "arrow_schema", "spark_schema"]

#: The Arrow type of the ``headers`` column (the item field is named as Spark names it).
HEADER_ARROW_TYPE = _arrow.arrow_schema(True).field("headers").type


def spark_schema(include_headers: bool = False) -> StructType:
    """The Spark schema of the rows read (``headers`` last, when ``include_headers``)."""
    fields = [
        StructField("key", BinaryType()),
        StructField("value", BinaryType()),
        StructField("topic", StringType()),
        StructField("partition", IntegerType()),
        StructField("offset", LongType()),
        StructField("timestamp", TimestampType()),
        StructField("timestampType", IntegerType()),
    ]
    if include_headers:
        header = StructType([StructField("key", StringType()), StructField("value", BinaryType())])
        fields.append(StructField("headers", ArrayType(header)))
    return StructType(fields)


def arrow_schema(include_headers: bool = False) -> pa.Schema:
    """The Arrow schema of the record batches ``read()`` yields: equal to the one Spark
    derives from :func:`spark_schema` (tests/spark/test_source.py holds it so). It is the
    clients' (``ConsumedBatch.to_arrow``), defined once in :mod:`tidewire.client._arrow`."""
    return _arrow.arrow_schema(include_headers)
