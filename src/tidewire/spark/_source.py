"""The data source Spark instantiates for ``format("tidewire")``: the schema, and the readers
and writers for batch and streaming queries.

Spark builds a :class:`TidewireDataSource` from the options of ``spark.read`` /
``spark.readStream`` / ``df.write`` / ``df.writeStream`` (keys lower-cased, values strings),
asks it for the schema, then for a reader or writer. Everything here runs on the driver
(or in the Python worker that plans the query) and opens no connection: the readers connect
when asked for offsets, the tasks in the executors' workers.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from types import ModuleType
from typing import cast

from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    DataSourceStreamWriter,
    DataSourceWriter,
)
from pyspark.sql.types import StructType

from tidewire.spark._options import parse_bool
from tidewire.spark._reader import TidewireBatchReader
from tidewire.spark._schema import spark_schema
from tidewire.spark._stream import TidewireStreamReader

__all__ = ["SOURCE_NAME", "TidewireDataSource"]

#: The short name of the format: ``spark.read.format("tidewire")``.
SOURCE_NAME = "tidewire"

_WRITER_MODULE = "tidewire.spark._writer"


class TidewireDataSource(DataSource):
    """tidewire topics as a Spark data source (batch and streaming; read and write).

    Args:
        options: the query's options; see docs/spark.md for every key.
    """

    @classmethod
    def name(cls) -> str:
        return SOURCE_NAME

    def schema(self) -> StructType:
        """Spark's Kafka columns; ``headers`` too when the option ``includeHeaders`` is true.

        Raises:
            ValueError: ``includeHeaders`` is not ``true`` or ``false``.
        """
        return spark_schema(_include_headers(self.options))

    def reader(self, schema: StructType) -> DataSourceReader:
        """The batch reader (``spark.read``); the options are checked here.

        Raises:
            ValueError: a missing, conflicting or malformed option.
        """
        return TidewireBatchReader(dict(self.options), schema)

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        """The streaming reader (``spark.readStream``); the options are checked here.

        Raises:
            ValueError: a missing, conflicting or malformed option.
        """
        return TidewireStreamReader(dict(self.options), schema)

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        """The batch writer (``df.write``)."""
        writer_class = _writer_module().TidewireBatchWriter
        return cast(DataSourceWriter, writer_class(dict(self.options), schema, overwrite))

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        """The streaming writer (``df.writeStream``)."""
        writer_class = _writer_module().TidewireStreamWriter
        return cast(DataSourceStreamWriter, writer_class(dict(self.options), schema, overwrite))


def _include_headers(options: Mapping[str, str]) -> bool:
    return parse_bool(options, "includeHeaders", default=False)


def _writer_module() -> ModuleType:
    """The writers' module, imported when a query writes (reading never needs it)."""
    try:
        return importlib.import_module(_WRITER_MODULE)
    except ModuleNotFoundError as exc:
        if exc.name != _WRITER_MODULE:
            raise
        raise RuntimeError(
            "this tidewire installation cannot write to topics from Spark: "
            f"the module {_WRITER_MODULE} is missing"
        ) from None
