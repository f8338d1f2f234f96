"""The streaming reader (``spark.readStream.format("tidewire")``).

Spark keeps the source's offsets in the query's checkpoint: for each micro-batch the end
offset of every partition, as JSON in Kafka's shape ``{"topic": {"0": 42, "1": 17}}``
(topics and partitions in sorted order: Spark compares offsets as JSON text, so the same
offsets must always be the same text). A restarted query runs again from the last batch
the checkpoint holds, with the same offsets, so nothing is read twice or skipped.

- New partitions (a topic that grew, or a new topic matching ``subscribePattern``) are read
  from offset 0; a new partition whose log no longer starts at 0 is data loss, as in Spark's
  Kafka source.
- ``maxOffsetsPerTrigger`` is Spark's ``ReadMaxRows`` limit: a micro-batch takes at most that
  many records, shared among the partitions in proportion to what each has waiting.
- ``Trigger.AvailableNow``: the high watermarks when the query starts are its target; it
  runs batches (bounded by ``maxOffsetsPerTrigger``) until it reaches them, then stops.
- ``tidewire.group.id``: the offsets the query has processed are committed as that consumer
  group's offsets, so ``tidewire group describe`` shows the query's lag. They are committed
  when Spark plans the next batch (everything before its start is done) and when Spark
  commits a batch; the group is only a view of the progress: the checkpoint, not the group,
  is where a restarted query resumes.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping

import pyarrow as pa
from pyspark.sql.datasource import DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import StructType

from tidewire.client import Client
from tidewire.errors import TidewireError
from tidewire.spark._connections import client_for
from tidewire.spark._options import TopicPartition, read_options
from tidewire.spark._plan import (
    OffsetRange,
    current_partitions,
    report_data_loss,
    resolve_offsets,
    skip_deleted,
    split_ranges,
)
from tidewire.spark._reader import read_planned

__all__ = ["TidewireStreamReader", "from_json_offsets", "limit_rows", "to_json_offsets"]

log = logging.getLogger("tidewire.spark")

#: Partitions per OFFSET_COMMIT request (the broker's bound on one commit).
COMMIT_CHUNK = 10_000

Offsets = dict[TopicPartition, int]


def to_json_offsets(offsets: Mapping[TopicPartition, int]) -> dict[str, dict[str, int]]:
    """``{("t", 1): 5}`` as ``{"t": {"1": 5}}``, topics and partitions sorted."""
    out: dict[str, dict[str, int]] = {}
    for (topic, partition), offset in sorted(offsets.items()):
        out.setdefault(topic, {})[str(partition)] = offset
    return out


def from_json_offsets(offsets: Mapping[str, object]) -> Offsets:
    """The inverse of :func:`to_json_offsets`.

    Raises:
        ValueError: not offsets of this source (a checkpoint of another query?).
    """
    out: Offsets = {}
    for topic, partitions in offsets.items():
        if not isinstance(partitions, Mapping):
            raise ValueError(f"not offsets of the tidewire source: {dict(offsets)!r}")
        for p, offset in partitions.items():
            if not (isinstance(p, str) and p.isdigit() and isinstance(offset, int)):
                raise ValueError(f"not offsets of the tidewire source: {dict(offsets)!r}")
            out[(topic, int(p))] = offset
    return out


def limit_rows(begin: Mapping[TopicPartition, int], end: Offsets, max_rows: int) -> Offsets:
    """``end`` moved back so that at most ``max_rows`` records lie between ``begin`` and it,
    shared in proportion to what each partition has waiting (largest remainders first, so
    a partition with little waiting still gets its turn)."""
    sizes = {tp: max(0, e - begin.get(tp, 0)) for tp, e in end.items()}
    total = sum(sizes.values())
    if total <= max_rows:
        return dict(end)
    shares = {tp: size * max_rows // total for tp, size in sizes.items()}
    left = max_rows - sum(shares.values())
    for tp in sorted(sizes, key=lambda tp: (-(sizes[tp] * max_rows % total), tp)):
        if left <= 0:
            break
        if shares[tp] < sizes[tp]:
            shares[tp] += 1
            left -= 1
    return {tp: begin.get(tp, 0) + shares[tp] if sizes[tp] else e for tp, e in end.items()}


class TidewireStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Offsets, planning and reading of a streaming query.

    Args:
        options: the query's options (lower-cased keys).
        schema: the schema Spark settled on.

    Raises:
        ValueError: a missing, conflicting or malformed option.
    """

    def __init__(self, options: dict[str, str], schema: StructType) -> None:
        self.options = read_options(options, streaming=True)
        self._target: Offsets | None = None  # Trigger.AvailableNow: where to stop
        self._latest: Offsets | None = None  # the high watermarks last seen
        self._committed: Offsets = {}  # what the group has from this query

    def initialOffset(self) -> dict[str, dict[str, int]]:
        """Where a new query starts: ``startingOffsets`` (default ``latest``) or a
        timestamp, for the partitions there are now."""
        client = self._client()
        parts = current_partitions(client, self.options)
        return to_json_offsets(resolve_offsets(client, self.options.starting, parts))

    def getDefaultReadLimit(self) -> ReadLimit:
        """``maxOffsetsPerTrigger`` as ``ReadMaxRows``; else no limit."""
        n = self.options.max_offsets_per_trigger
        return ReadAllAvailable() if n is None else ReadMaxRows(n)

    def prepareForTriggerAvailableNow(self) -> None:
        """Record the target of ``Trigger.AvailableNow``: every partition's end now."""
        parts = current_partitions(self._client(), self.options)
        self._target = {tp: s.high_watermark for tp, s in parts.items()}

    def latestOffset(self, start: dict[str, object], limit: ReadLimit) -> dict[str, dict[str, int]]:
        """The end of the next micro-batch: every partition's high watermark (capped by the
        ``Trigger.AvailableNow`` target), moved back to respect ``limit``."""
        begin = from_json_offsets(start)
        self._commit_progress(begin)  # Spark plans the next batch: all before begin is done
        parts = current_partitions(self._client(), self.options)
        latest = {tp: s.high_watermark for tp, s in parts.items()}
        self._latest = latest
        end = dict(latest)
        if self._target is not None:  # nothing past the target, no partition born since
            capped: Offsets = {}
            for tp, hw in end.items():
                if tp in self._target:
                    capped[tp] = min(hw, max(self._target[tp], begin.get(tp, 0)))
                elif tp in begin:
                    capped[tp] = begin[tp]
            end = capped
        if isinstance(limit, ReadMaxRows):
            end = limit_rows(begin, end, limit.max_rows)
        return to_json_offsets(end)

    def reportLatestOffset(self) -> dict[str, dict[str, int]] | None:
        """The high watermarks last seen (shown in the query's progress)."""
        return None if self._latest is None else to_json_offsets(self._latest)

    def partitions(self, start: dict[str, object], end: dict[str, object]) -> list[InputPartition]:
        """The ranges between two checkpointed offsets, as tasks.

        Raises:
            DataLossError: offsets of the range are gone, or a partition disappeared
                (``failOnDataLoss=true``).
        """
        opts = self.options
        begin, stop = from_json_offsets(start), from_json_offsets(end)
        gone = [tp for tp in begin if tp not in stop]
        if gone:
            names = ", ".join(f"{t}/{p}" for t, p in gone)
            report_data_loss(opts, f"partitions {names} are gone (topic deleted?)")
        states = current_partitions(self._client(), opts) if stop else {}
        ranges: list[OffsetRange] = []
        for (topic, p), e in stop.items():
            b = begin.get((topic, p), 0)
            if e < b:
                report_data_loss(
                    opts, f"{topic}/{p} went back from offset {b:,} to {e:,} (topic recreated?)"
                )
                continue
            r = OffsetRange(topic, p, b, e)
            state = states.get((topic, p))
            if state is not None and b < e:
                r = skip_deleted(opts, r, state.log_start_offset)
            ranges.append(r)
        return list(split_ranges(ranges, opts.min_partitions))

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        """The rows of one planned range (runs in an executor's Python worker)."""
        return read_planned(self.options, partition)

    def commit(self, end: dict[str, object]) -> None:
        """Spark finished the batches up to ``end``: record it in the group, if any."""
        self._commit_progress(from_json_offsets(end))

    def stop(self) -> None:
        """Nothing to release: connections belong to the process (they are reused)."""

    def _client(self) -> Client:
        o = self.options
        return client_for(o.servers, o.request_timeout_ms, o.tls, o.credentials)

    def _commit_progress(self, offsets: Offsets) -> None:
        """Commit ``offsets`` that are ahead of what the group has from this query (commits
        reach Spark's reader late and out of order: never move the group back)."""
        group = self.options.group_id
        if group is None:
            return
        todo = {tp: o for tp, o in offsets.items() if o > self._committed.get(tp, -1) and o >= 0}
        if not todo:
            return
        items = sorted(todo.items())
        try:
            client = self._client()
            for i in range(0, len(items), COMMIT_CHUNK):
                client.commit_offsets(group, dict(items[i : i + COMMIT_CHUNK]))
        except TidewireError as exc:
            # The group only shows progress; the query goes on (the next commit catches up).
            log.warning("committing the progress of group %s failed: %s", group, exc)
            return
        self._committed.update(todo)
