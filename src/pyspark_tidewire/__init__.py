"""Spark's discovery hook for the tidewire data source.

PySpark registers, in every session, the ``DefaultSource`` of each installed top-level
module whose name starts with ``pyspark_``; this module is that hook, so
``spark.read.format("tidewire")`` works without calling :func:`tidewire.spark.register`.
"""

from __future__ import annotations

from tidewire.spark import TidewireDataSource as DefaultSource

__all__ = ["DefaultSource"]
