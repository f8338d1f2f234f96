"""tidewire topics in Apache Spark: a PySpark data source named ``tidewire``.

One call registers it with a session::

    from tidewire.spark import register

    register(spark)
    df = (
        spark.read.format("tidewire")
        .option("tidewire.servers", "127.0.0.1:7400")
        .option("subscribe", "events")
        .load()
    )

With tidewire installed in the Python that Spark runs, ``format("tidewire")`` also works
without the call: Spark finds the source through the top-level module ``pyspark_tidewire``.
The options, the columns and the guarantees are in docs/spark.md. It needs pyspark and
pyarrow (``pip install 'tidewire[spark]'``); without them importing it raises
:class:`ImportError` saying so.

Public names::

    register              register the source with a SparkSession
    TidewireDataSource    the data source class (for spark.dataSource.register)
    SOURCE_NAME           "tidewire"
    DataLossError         offsets a query must read are gone (failOnDataLoss=true)
    spark_schema          the schema of the rows read
    arrow_schema          its exact Arrow twin (what the readers yield)
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tidewire._extras import require_spark

# pyspark and pyarrow come with the extra tidewire[spark]: without them, one message saying
# so rather than an ImportError from a module below.
require_spark()

from tidewire.spark._plan import DataLossError  # noqa: E402
from tidewire.spark._schema import arrow_schema, spark_schema  # noqa: E402
from tidewire.spark._source import SOURCE_NAME, TidewireDataSource  # noqa: E402

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = [
    "SOURCE_NAME",
    "DataLossError",
    "TidewireDataSource",
    "arrow_schema",
    "register",
    "spark_schema",
]


def register(spark: SparkSession) -> None:
    """Register the ``tidewire`` format with ``spark`` (``spark.read.format("tidewire")``,
    ``readStream``, ``write``, ``writeStream``). Calling it again is harmless."""
    spark.dataSource.register(TidewireDataSource)
