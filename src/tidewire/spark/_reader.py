"""The batch reader (``spark.read.format("tidewire")``) and what every task runs: reading one
offset range of one partition into Arrow record batches.

Planning resolves the starting and ending offsets once, on the driver, so every task reads a
fixed range and a retried task reads the same rows again. A task fetches its range through
its worker's connection (:mod:`tidewire.spark._connections`), one fetch after another, and
yields the Arrow record batches of each fetch response, fetching the next response while
it decodes one.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor

import pyarrow as pa
from pyspark.sql.datasource import DataSourceReader, InputPartition
from pyspark.sql.types import StructType

from tidewire.client import Client, FetchedBatches
from tidewire.errors import OffsetOutOfRangeError, TidewireError
from tidewire.records import iter_batches
from tidewire.spark._connections import client_for
from tidewire.spark._decode import decode_fetch
from tidewire.spark._options import ReadOptions, read_options
from tidewire.spark._plan import (
    OffsetRange,
    current_partitions,
    report_data_loss,
    resolve_offsets,
    skip_deleted,
    split_ranges,
)

__all__ = ["TidewireBatchReader", "read_planned", "read_range"]

log = logging.getLogger("tidewire.spark")

#: Fetches the next response of a task while the task decodes the one it has: one at a time
#: (a worker runs one task at a time), so a task holds at most two responses.
_prefetch = ThreadPoolExecutor(max_workers=1, thread_name_prefix="tidewire-prefetch")

#: Attempts of one fetch that fails with a retriable error (a lost connection, a timeout, a
#: broker under backpressure) before the task fails; the client backs off between them, and
#: Spark retries the failed task on top of this.
FETCH_ATTEMPTS = 5


class TidewireBatchReader(DataSourceReader):
    """Plans a batch read and reads each planned range.

    Args:
        options: the query's options (lower-cased keys).
        schema: the schema Spark settled on (from :meth:`TidewireDataSource.schema`).

    Raises:
        ValueError: a missing, conflicting or malformed option.
    """

    def __init__(self, options: dict[str, str], schema: StructType) -> None:
        self.options = read_options(options, streaming=False)

    def partitions(self) -> list[InputPartition]:
        """Resolve the offsets now and cut the ranges into tasks.

        Raises:
            DataLossError: a starting offset retention has already deleted
                (``failOnDataLoss=true``).
            ValueError: an offset past a partition's end, or a start after its end.
        """
        opts = self.options
        client = client_for(opts.servers, opts.request_timeout_ms, opts.tls, opts.credentials)
        parts = current_partitions(client, opts)
        starts = resolve_offsets(client, opts.starting, parts)
        ends = resolve_offsets(client, opts.ending, parts)
        ranges: list[OffsetRange] = []
        for (topic, p), state in parts.items():
            start, end = starts[(topic, p)], ends[(topic, p)]
            if end > state.high_watermark:
                raise ValueError(
                    f"the ending offset {end:,} of {topic}/{p} is past its end "
                    f"({state.high_watermark:,})"
                )
            if start > end:
                raise ValueError(
                    f"the starting offset {start:,} of {topic}/{p} is after its ending "
                    f"offset {end:,}"
                )
            ranges.append(
                skip_deleted(opts, OffsetRange(topic, p, start, end), state.log_start_offset)
            )
        return list(split_ranges(ranges, opts.min_partitions))

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        """The rows of one planned range (runs in an executor's Python worker)."""
        return read_planned(self.options, partition)


def read_planned(opts: ReadOptions, partition: InputPartition) -> Iterator[pa.RecordBatch]:
    """The rows of a planned partition: an :class:`OffsetRange`, or Spark's stand-in when
    none were planned (no rows)."""
    if not isinstance(partition, OffsetRange):
        return iter(())
    return read_range(opts, partition)


def read_range(opts: ReadOptions, r: OffsetRange) -> Iterator[pa.RecordBatch]:
    """Fetch ``r`` and yield its rows as Arrow record batches, one per fetch.

    Offsets retention deleted before they were read are data loss: :class:`DataLossError`,
    or (``failOnDataLoss=false``) a warning and the rest of the range.

    Raises:
        DataLossError: part of the range is gone (``failOnDataLoss=true``).
        TidewireError: the broker refused, or stayed unreachable for every attempt.
        RecordBatchError: a stored batch is malformed.
    """
    client = client_for(opts.servers, opts.request_timeout_ms, opts.tls, opts.credentials)
    pos = r.start
    ahead: tuple[int, Future[FetchedBatches]] | None = None
    while pos < r.end:
        try:
            if ahead is not None and ahead[0] == pos:
                got = ahead[1].result()
            else:
                got = _fetch(client, opts, r, pos)
            # While this response is decoded, the broker serves the next one.
            nxt = _after(got.data, pos)
            ahead = None
            if pos < nxt < r.end:
                ahead = (nxt, _prefetch.submit(_fetch, client, opts, r, nxt))
        except OffsetOutOfRangeError:
            earliest = client.list_offset(r.topic, r.partition, -2)
            if pos >= earliest:
                latest = client.list_offset(r.topic, r.partition, -1)
                if pos <= latest:
                    raise
                report_data_loss(
                    opts,
                    f"offsets {pos:,}..{r.end - 1:,} of {r.topic}/{r.partition} are gone "
                    f"(the partition now ends at {latest:,})",
                )
                return
            pos = skip_deleted(opts, dataclasses.replace(r, start=pos), earliest).start
            continue
        decoded = decode_fetch(
            got.data, r.topic, r.partition, pos, r.end, include_headers=opts.include_headers
        )
        yield from decoded.batches
        if decoded.next_offset > pos:
            pos = decoded.next_offset
            continue
        # Nothing whole came back from pos.
        if got.high_watermark <= pos:
            report_data_loss(
                opts,
                f"offsets {pos:,}..{r.end - 1:,} of {r.topic}/{r.partition} are gone "
                f"(the partition now ends at {got.high_watermark:,})",
            )
            return
        raise TidewireError(
            f"a fetch of {r.topic}/{r.partition} at offset {pos:,} returned "
            f"{len(got.data):,} bytes and no whole batch; raise tidewire.fetch.max.bytes "
            f"({opts.fetch_max_bytes:,})"
        )


def _after(data: bytes, pos: int) -> int:
    """The offset after the last whole batch in ``data`` (``pos`` if there is none)."""
    nxt = pos
    for _, h in iter_batches(data, verify=False):
        nxt = h.next_offset
    return nxt


def _fetch(client: Client, opts: ReadOptions, r: OffsetRange, pos: int) -> FetchedBatches:
    for attempt in range(1, FETCH_ATTEMPTS + 1):
        try:
            return client.fetch_batches(r.topic, r.partition, pos, max_bytes=opts.fetch_max_bytes)
        except TidewireError as exc:
            if not exc.retriable or attempt == FETCH_ATTEMPTS:
                raise
            log.warning(
                "fetch of %s/%d at %d failed (%s); attempt %d of %d",
                r.topic,
                r.partition,
                pos,
                exc,
                attempt + 1,
                FETCH_ATTEMPTS,
            )
    raise AssertionError("unreachable")  # pragma: no cover
