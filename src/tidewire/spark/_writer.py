"""The writers of the ``tidewire`` sink: ``df.write`` and ``df.writeStream``, exactly once.

Each Spark task writes its partition's rows through a :class:`~tidewire.client.Producer`
that is a *writer* (docs/protocol.md, "Deterministic writers") named after what the task
writes, the same for every attempt of it::

    batch      b/<job>/<partition>            <job>: a random id made on the driver per write,
                                              or the option tidewire.writerId
    streaming  s/<query id>/<batch id>/<partition>

A retried task (or a micro-batch run again after the driver died) gets the same producer id
with a higher epoch -- the older attempt is fenced -- and the broker tells it how many of the
rows it routes to each topic partition are stored already; it skips those and writes the
rest. So every row is stored once, provided a task sees the same rows in the same order each
time it runs (true of a tidewire or file source read without a shuffle; after a shuffle, sort
within partitions first). Rows are visible to readers as soon as they are written, not when
the job commits; a job that fails keeps what its tasks wrote, and its re-run (streaming, or
batch with tidewire.writerId) completes it without repeating any of it.

On the driver, ``commit`` releases writers no attempt will need again: a batch job's at once,
a streaming query's of batch N-1 when batch N commits (batch N itself may still run again if
the driver dies before Spark records the commit).

Rows arrive as Arrow record batches (:class:`DataSourceArrowWriter`): several times faster
than Spark's row-by-row path into Python.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pyspark import TaskContext
from pyspark.sql.datasource import (
    DataSourceArrowWriter,
    DataSourceStreamArrowWriter,
    WriterCommitMessage,
)
from pyspark.sql.types import StructType

from tidewire.client import Client, Producer
from tidewire.errors import TidewireError
from tidewire.spark._write_options import WriteColumns, WriteOptions, write_columns, write_options

if TYPE_CHECKING:
    import pyarrow as pa

__all__ = ["TidewireBatchWriter", "TidewireCommitMessage", "TidewireStreamWriter"]

log = logging.getLogger("tidewire.spark")

#: The task's local properties a streaming micro-batch sets.
QUERY_ID_PROPERTY = "sql.streaming.queryId"
BATCH_ID_PROPERTY = "streaming.sql.batchId"
#: Writer ids released per request (the broker takes up to 10,000).
RELEASE_CHUNK = 5_000


@dataclass(frozen=True, slots=True)
class TidewireCommitMessage(WriterCommitMessage):
    """What one task reports to the driver.

    Attributes:
        writer_id: the task's writer.
        partition: the Spark partition.
        rows: rows the task was given.
        skipped: of those, rows an earlier attempt had stored already.
        query_id: the streaming query's id ("" for a batch write).
    """

    writer_id: str
    partition: int
    rows: int
    skipped: int
    query_id: str = ""


def _refuse_overwrite(overwrite: bool) -> None:
    if overwrite:
        raise ValueError(
            'a tidewire topic is an append-only log: write with .mode("append"), not overwrite'
        )


def _task() -> TaskContext:
    ctx = TaskContext.get()
    if ctx is None:
        raise RuntimeError("the tidewire writer runs only inside a Spark task")
    return ctx


def write_partition(
    opts: WriteOptions,
    cols: WriteColumns,
    batches: Iterator[pa.RecordBatch],
    writer_id: str,
) -> tuple[int, int]:
    """Write every row of ``batches`` as the writer ``writer_id``; return the rows given and
    those skipped (stored before by an earlier attempt).

    Raises:
        TidewireError: a row could not be stored (the task fails; its retry resumes).
        ValueError: a row with a null topic, or a topic column and no topic at all.
    """
    rows = 0
    producer: Producer | None = None  # made at the first row: an empty task asks nothing
    try:
        last: dict[tuple[str, int | None], Any] = {}
        for batch in batches:
            if not batch.num_rows:
                continue
            if producer is None:
                producer = Producer(
                    opts.server,
                    writer_id=writer_id,
                    tls=opts.tls,
                    credentials=opts.credentials,
                    **opts.producer_settings(),  # type: ignore[arg-type]
                )
            rows += _send_batch(producer, opts, cols, batch, last)
        if producer is None:
            return 0, 0
        producer.flush()
        for fut in last.values():
            fut.result()  # raises the error that failed the writer, if one did
        if producer.failure is not None:
            raise producer.failure
        skipped = producer.skipped
    finally:
        if producer is not None:
            producer.close()
    return rows, skipped


def _send_batch(
    producer: Producer,
    opts: WriteOptions,
    cols: WriteColumns,
    batch: pa.RecordBatch,
    last: dict[tuple[str, int | None], Any],
) -> int:
    n = int(batch.num_rows)
    if n == 0:
        return 0
    values = batch.column(cols.value).to_pylist()
    if cols.value_is_str:
        values = [None if v is None else v.encode() for v in values]
    keys: list[Any] | None = None
    if cols.key is not None:
        keys = batch.column(cols.key).to_pylist()
        if cols.key_is_str:
            keys = [None if k is None else k.encode() for k in keys]
    topics: list[Any] | None = None
    if cols.topic is not None:
        topics = batch.column(cols.topic).to_pylist()
    partitions = None if cols.partition is None else batch.column(cols.partition).to_pylist()
    headers: list[Any] | None = None
    if cols.headers is not None:
        headers = [
            None
            if hs is None
            else [
                (h["key"], h["value"].encode() if isinstance(h["value"], str) else h["value"])
                for h in hs
            ]
            for hs in batch.column(cols.headers).to_pylist()
        ]
    send = producer.send
    topic = opts.topic
    if keys is None and topics is None and partitions is None and headers is None:
        assert topic is not None
        producer.send_values(topic, values)  # the whole batch at once: no per-row call
        return n
    for i in range(n):
        t = topic if topics is None else topics[i]
        if t is None:
            raise ValueError(
                "a row has a null topic and the option topic is not set: every row needs one"
            )
        p = None if partitions is None else partitions[i]
        last[t, p] = send(
            t,
            values[i],
            key=None if keys is None else keys[i],
            partition=p,
            headers=None if headers is None else headers[i],
        )
    return n


def _release(opts: WriteOptions, writer_ids: Sequence[str]) -> None:
    """Tell the broker these writers are done (best effort: the broker forgets them after
    its producer expiration anyway)."""
    if not writer_ids:
        return
    try:
        with Client(opts.server, tls=opts.tls, credentials=opts.credentials) as client:
            for i in range(0, len(writer_ids), RELEASE_CHUNK):
                client.release_writers(writer_ids[i : i + RELEASE_CHUNK])
    except (TidewireError, OSError) as exc:  # committing must not fail over a cleanup
        log.warning("releasing %d tidewire writers failed: %s", len(writer_ids), exc)


class TidewireBatchWriter(DataSourceArrowWriter):
    """``df.write.format("tidewire")``: one writer per task, named after a job id made here
    on the driver (or the option ``tidewire.writerId``), released when the job commits.

    Args:
        options: the write's options (see docs/spark.md).
        schema: the DataFrame's schema.
        overwrite: refused: a topic is appended to.

    Raises:
        ValueError: a bad option or column, or ``overwrite``.
    """

    def __init__(self, options: dict[str, str], schema: StructType, overwrite: bool) -> None:
        _refuse_overwrite(overwrite)
        self.opts = write_options(options, streaming=False)
        self.cols = write_columns(schema, topic_option=self.opts.topic)
        self.job = self.opts.writer_id or uuid.uuid4().hex
        #: A named job may run again (and then skips what it stored): its writers are kept.
        self.release = self.opts.writer_id is None

    def writer_id(self, partition: int) -> str:
        return f"b/{self.job}/{partition}"

    def write(self, iterator: Iterator[pa.RecordBatch]) -> TidewireCommitMessage:
        partition = _task().partitionId()
        writer_id = self.writer_id(partition)
        rows, skipped = write_partition(self.opts, self.cols, iterator, writer_id)
        return TidewireCommitMessage(writer_id, partition, rows, skipped)

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        if self.release:
            _release(self.opts, [self.writer_id(p) for p in range(len(messages))])

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        # What the tasks stored stays (a topic has no rollback). An unnamed job never runs
        # again, so its writers can go; a named one keeps them for its re-run.
        if self.release:
            _release(self.opts, [self.writer_id(p) for p in range(len(messages))])


class TidewireStreamWriter(DataSourceStreamArrowWriter):
    """``df.writeStream.format("tidewire")``: one writer per task and micro-batch, named
    after the query id and the batch id, so a batch run again after a failure or a restart
    from the checkpoint stores nothing twice.

    Args and Raises: as :class:`TidewireBatchWriter`.
    """

    def __init__(self, options: dict[str, str], schema: StructType, overwrite: bool) -> None:
        _refuse_overwrite(overwrite)
        self.opts = write_options(options, streaming=True)
        self.cols = write_columns(schema, topic_option=self.opts.topic)

    def write(self, iterator: Iterator[pa.RecordBatch]) -> TidewireCommitMessage:
        ctx = _task()
        query = ctx.getLocalProperty(QUERY_ID_PROPERTY)
        batch = ctx.getLocalProperty(BATCH_ID_PROPERTY)
        if not query or batch is None:
            raise RuntimeError(
                f"the task has no {QUERY_ID_PROPERTY} / {BATCH_ID_PROPERTY}: the tidewire "
                "stream writer runs only in a micro-batch streaming query"
            )
        partition = ctx.partitionId()
        writer_id = f"s/{query}/{batch}/{partition}"
        rows, skipped = write_partition(self.opts, self.cols, iterator, writer_id)
        return TidewireCommitMessage(writer_id, partition, rows, skipped, query)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        # Batch batchId - 1 is in Spark's commit log (this one ran after it): none of its
        # tasks runs again. This batch's writers stay until the next one commits.
        query = next((m.query_id for m in messages if isinstance(m, TidewireCommitMessage)), "")
        if query and batchId > 0:
            _release(
                self.opts,
                [f"s/{query}/{batchId - 1}/{p}" for p in range(len(messages))],
            )

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        # Nothing to undo: what the tasks stored stays, and the batch's next run (same query
        # id and batch id, so the same writers) resumes after it.
        log.warning("micro-batch %d was aborted; its next run resumes its writers", batchId)
