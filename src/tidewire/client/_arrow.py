"""Records as Arrow: the one conversion from record columns to a ``pyarrow.RecordBatch``,
shared by :meth:`ConsumedBatch.to_arrow <tidewire.client.ConsumedBatch.to_arrow>` and the
Spark source's decoder (:mod:`tidewire.spark._decode`).

The columns are those of Spark's Kafka source (``key``, ``value``, ``topic``,
``partition``, ``offset``, ``timestamp``, ``timestampType``, and ``headers`` when asked
for), with exactly the Arrow types Spark derives from its schema: ``binary``, ``string``,
``int32``, ``int64``, ``timestamp[us, tz=UTC]``, and ``list<element: struct<key: string,
value: binary>>``: the schema of the Spark source too (:mod:`tidewire.spark._schema`
returns this one; tests/spark/test_source.py holds it equal to the one Spark derives).
pyarrow is optional (``pip install 'tidewire[spark]'``): it is imported on first use, and its
absence is a clear :class:`ImportError`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pyarrow as pa

__all__ = ["arrays_to_arrow", "arrow_schema", "columns_to_arrow", "pyarrow_module"]

Header = tuple[str, bytes | None]
_US_PER_MS = 1000
_cache: dict[str, Any] = {}


def pyarrow_module() -> Any:
    """``pyarrow`` (imported once).

    Raises:
        ImportError: pyarrow is not installed (the message says how to install it).
    """
    pa = _cache.get("pa")
    if pa is None:
        try:
            import pyarrow  # noqa: PLC0415 (optional: imported on first use)
            import pyarrow.compute  # noqa: PLC0415
        except ImportError as exc:
            raise ImportError(
                "Arrow conversion needs pyarrow, which is not installed: "
                "pip install 'tidewire[spark]' (or pip install pyarrow)"
            ) from exc
        _cache["pa"] = pa = pyarrow
    return pa


def arrow_schema(include_headers: bool = False) -> pa.Schema:
    """The Arrow schema of :func:`columns_to_arrow`'s batches (``headers`` last, when
    ``include_headers``)."""
    key = f"schema-{include_headers}"
    schema = _cache.get(key)
    if schema is None:
        pa = pyarrow_module()
        header = pa.struct([pa.field("key", pa.string()), pa.field("value", pa.binary())])
        fields = [
            pa.field("key", pa.binary()),
            pa.field("value", pa.binary()),
            pa.field("topic", pa.string()),
            pa.field("partition", pa.int32()),
            pa.field("offset", pa.int64()),
            pa.field("timestamp", pa.timestamp("us", tz="UTC")),
            pa.field("timestampType", pa.int32()),
        ]
        if include_headers:
            fields.append(pa.field("headers", pa.list_(pa.field("element", header))))
        _cache[key] = schema = pa.schema(fields)
    return schema


def columns_to_arrow(  # noqa: PLR0917 (one argument per column)
    topic: str,
    partition: int,
    timestamp_type: int,
    offsets: Sequence[int],
    timestamps: Sequence[int],
    keys: Sequence[bytes | None],
    values: Sequence[bytes | None],
    headers: Sequence[tuple[Header, ...]] | None = None,
) -> pa.RecordBatch:
    """One partition's records (equal-length columns; ``timestamps`` in ms since the epoch)
    as a record batch of :func:`arrow_schema` (with ``headers`` when they are given). Each
    column is converted in C: no Python object per record.

    Raises:
        ImportError: pyarrow is not installed.
    """
    pa = pyarrow_module()
    return arrays_to_arrow(
        topic,
        partition,
        timestamp_type,
        pa.array(offsets, pa.int64()),
        pa.array(timestamps, pa.int64()),
        pa.array(keys, pa.binary()),
        pa.array(values, pa.binary()),
        headers,
    )


def arrays_to_arrow(  # noqa: PLR0917 (one argument per column)
    topic: str,
    partition: int,
    timestamp_type: int,
    offsets: pa.Array,
    timestamps: pa.Array,
    keys: pa.Array,
    values: pa.Array,
    headers: Sequence[tuple[Header, ...]] | None = None,
) -> pa.RecordBatch:
    """:func:`columns_to_arrow` of columns already in Arrow (``offsets`` and ``timestamps``
    int64, the latter in ms since the epoch; ``keys`` and ``values`` binary).

    Raises:
        ImportError: pyarrow is not installed.
    """
    pa = pyarrow_module()
    n = len(offsets)
    arrays = [
        keys,
        values,
        pa.repeat(pa.scalar(topic, pa.string()), n),
        pa.repeat(pa.scalar(partition, pa.int32()), n),
        offsets,
        pa.compute.multiply(timestamps, _US_PER_MS).cast(pa.timestamp("us", tz="UTC")),
        pa.repeat(pa.scalar(timestamp_type, pa.int32()), n),
    ]
    schema = arrow_schema(headers is not None)
    if headers is not None:
        arrays.append(pa.array(headers, schema.field("headers").type))
    return pa.RecordBatch.from_arrays(arrays, schema=schema)
