"""The archiving pipeline behind ``tidewire export``: a Spark structured-streaming query that
copies a topic into partitioned Parquet (or JSON, ORC, CSV) files, exactly once.

Exactly once comes from Spark's file sink and the checkpoint: the source's offsets of every
micro-batch are in the checkpoint before the batch runs, and the files a batch wrote become
part of the table only when the sink records them in ``DIR/_spark_metadata`` -- a batch run
again after a crash writes new files and records only those. Readers that go through Spark
(``spark.read.parquet(DIR)``) see exactly the recorded files.

The rows are the source's columns (``key``, ``value``, ``topic``, ``partition``, ``offset``,
``timestamp``, ``timestampType``, ``headers``) plus ``date`` (the record's UTC date), and the
directory is partitioned by ``partition`` (default), ``date``, or ``date`` then
``partition``.
"""

from __future__ import annotations

import json
import os
import sys
import threading
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from pyspark.errors import StreamingQueryException
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from tidewire.spark import register

__all__ = [
    "FORMATS",
    "PARTITION_BY",
    "BatchProgress",
    "ExportSpec",
    "new_session",
    "progress_of",
    "run_export",
]

#: The file formats of Spark's file sink that an export may write.
FORMATS = ("parquet", "json", "orc", "csv")
#: ``--partition-by`` choices and the directory levels each makes.
PARTITION_BY: Mapping[str, tuple[str, ...]] = {
    "partition": ("partition",),
    "date": ("date",),
    "date,partition": ("date", "partition"),
    "none": (),
}
#: How often the driver looks for a finished micro-batch to report (s).
POLL_S = 0.2


@dataclass(frozen=True, slots=True)
class ExportSpec:
    """What one export does.

    Attributes:
        servers: the broker, ``HOST:PORT``.
        topic: the topic copied.
        to: the output directory (a path or a Hadoop URL).
        checkpoint: the query's checkpoint directory.
        fmt: one of :data:`FORMATS`.
        partition_by: one of :data:`PARTITION_BY`.
        once: copy what is there now and stop (``Trigger.AvailableNow``); else run until
            stopped, a micro-batch every ``interval``.
        interval: the trigger interval of a continuous export, as Spark reads it
            (``"10 seconds"``).
        starting_offsets: ``earliest`` or ``latest``, for a query without a checkpoint.
        max_offsets_per_trigger: the most records per micro-batch (None: no bound).
    """

    servers: str
    topic: str
    to: str
    checkpoint: str
    fmt: str = "parquet"
    partition_by: str = "partition"
    once: bool = False
    interval: str = "10 seconds"
    starting_offsets: str = "earliest"
    max_offsets_per_trigger: int | None = None
    #: More options of the source (TLS, the API key): not in the repr, which may be logged.
    extra_options: Mapping[str, str] = field(default_factory=dict, repr=False)


@dataclass(frozen=True, slots=True)
class BatchProgress:
    """One finished micro-batch, as reported on the progress line."""

    batch: int
    rows: int
    #: ``"topic-partition"`` -> [start offset, end offset) of the batch.
    offsets: dict[str, list[int]]
    rows_per_s: float
    duration_ms: int

    def line(self) -> str:
        parts = " ".join(f"{tp} {a}..{b}" for tp, (a, b) in sorted(self.offsets.items()) if b > a)
        return (
            f"batch {self.batch}: {self.rows:,} rows"
            + (f" [{parts}]" if parts else "")
            + f", {self.rows_per_s:,.0f} rows/s, {self.duration_ms:,} ms"
        )

    def to_json(self) -> dict[str, object]:
        return {
            "batch": self.batch,
            "rows": self.rows,
            "offsets": self.offsets,
            "rows_per_s": round(self.rows_per_s, 1),
            "duration_ms": self.duration_ms,
        }


def _flat_offsets(raw: object) -> dict[str, int]:
    """``{"topic": {"0": 42}}`` (JSON text or parsed) as ``{"topic-0": 42}``."""
    doc = json.loads(raw) if isinstance(raw, str) else raw
    out: dict[str, int] = {}
    if isinstance(doc, dict):
        for topic, parts in doc.items():
            if isinstance(parts, dict):
                for p, off in parts.items():
                    out[f"{topic}-{p}"] = int(off)
    return out


def progress_of(p: Mapping[str, Any]) -> BatchProgress:
    """The :class:`BatchProgress` of a query progress document (``query.recentProgress``)."""
    start: dict[str, int] = {}
    end: dict[str, int] = {}
    for src in p.get("sources", []):
        start.update(_flat_offsets(src.get("startOffset") or {}))
        end.update(_flat_offsets(src.get("endOffset") or {}))
    offsets = {tp: [start.get(tp, e), e] for tp, e in end.items()}
    duration = p.get("durationMs", {}).get("triggerExecution", 0)
    return BatchProgress(
        batch=int(p["batchId"]),
        rows=int(p.get("numInputRows", 0)),
        offsets=offsets,
        rows_per_s=float(p.get("processedRowsPerSecond", 0.0) or 0.0),
        duration_ms=int(duration),
    )


def new_session(master: str, app_name: str) -> Any:
    """A SparkSession for an export: this interpreter as the Python of the workers (the one
    tidewire is installed in), no UI, quiet logs."""
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    session = (
        SparkSession.builder.master(master)
        .appName(app_name)
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.session.timeZone", "UTC")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    return session


def start_query(spark: Any, spec: ExportSpec) -> Any:
    """Start the export's streaming query on ``spark``; return it."""
    if spec.fmt not in FORMATS:
        raise ValueError(f"format {spec.fmt!r}: must be one of {', '.join(FORMATS)}")
    if spec.partition_by not in PARTITION_BY:
        raise ValueError(
            f"partition-by {spec.partition_by!r}: must be one of {', '.join(PARTITION_BY)}"
        )
    register(spark)
    reader = (
        spark.readStream.format("tidewire")
        .option("tidewire.servers", spec.servers)
        .option("subscribe", spec.topic)
        .option("startingOffsets", spec.starting_offsets)
        .option("includeHeaders", "true")
    )
    if spec.max_offsets_per_trigger is not None:
        reader = reader.option("maxOffsetsPerTrigger", str(spec.max_offsets_per_trigger))
    for k, v in spec.extra_options.items():
        reader = reader.option(k, v)
    df = reader.load().withColumn("date", F.to_date(F.col("timestamp")))
    if spec.fmt == "csv":  # CSV has no binary, array or struct columns
        df = df.select(
            F.base64("key").alias("key"),
            F.base64("value").alias("value"),
            "topic",
            "partition",
            "offset",
            "timestamp",
            "timestampType",
            "date",
        )
    writer = (
        df.writeStream.format(spec.fmt)
        .option("path", spec.to)
        .option("checkpointLocation", spec.checkpoint)
        .queryName(f"tidewire export {spec.topic}")
    )
    levels = PARTITION_BY[spec.partition_by]
    if levels:
        writer = writer.partitionBy(*levels)
    if spec.once:
        writer = writer.trigger(availableNow=True)
    else:
        writer = writer.trigger(processingTime=spec.interval)
    return writer.start()


def _new_progress(query: Any, seen: set[int]) -> Iterator[BatchProgress]:
    for p in query.recentProgress:
        doc = p if isinstance(p, Mapping) else json.loads(p.json)
        if doc.get("batchId") is None or doc["batchId"] in seen:
            continue
        if int(doc.get("numInputRows", 0)) == 0 and not doc.get("sources"):
            continue
        seen.add(doc["batchId"])
        yield progress_of(doc)


def run_export(
    spark: Any,
    spec: ExportSpec,
    on_batch: Callable[[BatchProgress], None],
    stop: threading.Event | None = None,
) -> None:
    """Run the export until it is done (``once``), ``stop`` is set, or it fails; call
    ``on_batch`` for each finished micro-batch that read something.

    Raises:
        ValueError: a bad format or partitioning.
        pyspark.errors.StreamingQueryException: the query failed (its message says why).
    """
    query = start_query(spark, spec)
    seen: set[int] = set()
    try:
        while query.isActive and not (stop is not None and stop.is_set()):
            try:
                query.awaitTermination(POLL_S)
            except StreamingQueryException:
                break  # raised below, after the batches that finished are reported
            for b in _new_progress(query, seen):
                if b.rows:
                    on_batch(b)
    finally:
        if query.isActive:
            query.stop()
    for b in _new_progress(query, seen):
        if b.rows:
            on_batch(b)
    exc = query.exception()
    if exc is not None:
        raise exc
