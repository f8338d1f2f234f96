"""Planning a read: which partitions, from which offset to which, split into Spark tasks.

Runs where Spark plans (the driver's Python workers), with one request per topic: the
partitions of the subscription and their log start and high watermark, and an offset by
time where a timestamp was given. The ranges it returns are what the tasks read.

Data loss, as Spark's Kafka source defines it: offsets a query should read that the broker no
longer has (retention deleted them, or the topic was deleted or recreated). With
``failOnDataLoss=true`` (the default) the query fails with :class:`DataLossError`, which says
what is gone; with ``false`` it logs a warning and reads what is left.
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from pyspark.sql.datasource import InputPartition

from tidewire.client import Client
from tidewire.errors import UnknownTopicError
from tidewire.spark._options import (
    EARLIEST,
    LATEST,
    Assign,
    OffsetSpec,
    PartitionOffsets,
    PartitionTimestamps,
    ReadOptions,
    Subscribe,
    TimestampSpec,
    TopicPartition,
)

__all__ = [
    "DataLossError",
    "OffsetRange",
    "PartitionState",
    "current_partitions",
    "report_data_loss",
    "resolve_offsets",
    "split_ranges",
]

log = logging.getLogger("tidewire.spark")

#: Kafka's sentinels inside an offsets JSON.
_EARLIEST = -2
_LATEST = -1


class DataLossError(RuntimeError):
    """Offsets a query must read are gone from the broker (``failOnDataLoss=true``)."""


@dataclass(frozen=True, slots=True)
class PartitionState:
    """Where a partition's log starts and ends now."""

    log_start_offset: int
    high_watermark: int


@dataclass(frozen=True)
class OffsetRange(InputPartition):
    """What one Spark task reads: ``topic``/``partition`` from ``start`` (inclusive) to
    ``end`` (exclusive)."""

    topic: str
    partition: int
    start: int
    end: int

    @property
    def size(self) -> int:
        return self.end - self.start


def report_data_loss(options: ReadOptions, message: str) -> None:
    """Fail with :class:`DataLossError`, or log ``message`` as a warning, as
    ``failOnDataLoss`` says.

    Raises:
        DataLossError: ``failOnDataLoss`` is true.
    """
    if options.fail_on_data_loss:
        raise DataLossError(
            f"{message}. Some data may have been lost (retention deleted it, or the topic "
            "was deleted). Set failOnDataLoss=false to read what is left instead of failing."
        )
    log.warning("%s; reading what is left (failOnDataLoss=false)", message)


def skip_deleted(options: ReadOptions, r: OffsetRange, log_start: int) -> OffsetRange:
    """``r`` as it can be read now that its partition's log starts at ``log_start``: as it
    is, or, where retention deleted offsets of it, starting past them (at most at its end)
    once :func:`report_data_loss` let the read go on.

    Raises:
        DataLossError: offsets of the range are gone and ``failOnDataLoss`` is true.
    """
    if r.start >= log_start:
        return r
    report_data_loss(
        options,
        f"offsets {r.start:,}..{min(r.end, log_start) - 1:,} of {r.topic}/{r.partition} are "
        f"gone (the log starts at {log_start:,})",
    )
    return dataclasses.replace(r, start=min(log_start, r.end))


def current_partitions(
    client: Client, options: ReadOptions
) -> dict[TopicPartition, PartitionState]:
    """The partitions of the subscription as the broker has them now, sorted.

    Topics named by ``subscribe`` that do not exist have no partitions (yet).

    Raises:
        ValueError: ``assign`` names a partition or topic that does not exist.
        TidewireError: the broker refused (the error as raised by the client).
    """
    sub = options.subscription
    if isinstance(sub, Subscribe):
        topics: Iterable[str] = sub.topics
    elif isinstance(sub, Assign):
        topics = sorted({t for t, _ in sub.partitions})
    else:
        pattern = re.compile(sub.pattern)
        topics = [t for t in client.list_topics() if pattern.fullmatch(t)]
    out: dict[TopicPartition, PartitionState] = {}
    for topic in sorted(set(topics)):
        try:
            desc = client.describe_topic(topic)
        except UnknownTopicError:
            if isinstance(sub, Assign):
                raise ValueError(
                    f"option assign names topic {topic!r}, which does not exist"
                ) from None
            continue
        for p in desc.partitions:
            out[(topic, p.partition)] = PartitionState(p.log_start_offset, p.high_watermark)
    if isinstance(sub, Assign):
        missing = [tp for tp in sub.partitions if tp not in out]
        if missing:
            names = ", ".join(f"{t}/{p}" for t, p in missing)
            raise ValueError(f"option assign names partitions that do not exist: {names}")
        return {tp: out[tp] for tp in sub.partitions}
    return dict(sorted(out.items()))


def resolve_offsets(
    client: Client,
    spec: OffsetSpec,
    partitions: Mapping[TopicPartition, PartitionState],
) -> dict[TopicPartition, int]:
    """The offset ``spec`` means for each partition (a timestamp: the first record at or
    after it, the partition's end when there is none)."""
    out: dict[TopicPartition, int] = {}
    for tp, state in partitions.items():
        if spec == EARLIEST:
            out[tp] = state.log_start_offset
        elif spec == LATEST:
            out[tp] = state.high_watermark
        elif isinstance(spec, TimestampSpec):
            out[tp] = client.list_offset(tp[0], tp[1], spec.timestamp_ms)
        elif isinstance(spec, PartitionTimestamps):
            ts = spec.timestamps.get(tp)
            if ts is None:
                out[tp] = (
                    state.log_start_offset if spec.default == EARLIEST else state.high_watermark
                )
            else:
                out[tp] = client.list_offset(tp[0], tp[1], ts)
        else:
            assert isinstance(spec, PartitionOffsets)
            given = spec.offsets.get(tp)
            if given is None:
                given = _EARLIEST if spec.default == EARLIEST else _LATEST
            if given == _EARLIEST:
                out[tp] = state.log_start_offset
            elif given == _LATEST:
                out[tp] = state.high_watermark
            else:
                out[tp] = given
    return out


def split_ranges(ranges: list[OffsetRange], min_partitions: int | None) -> list[OffsetRange]:
    """``ranges`` without the empty ones, split so that there are about ``min_partitions``
    of them (as Spark's Kafka source does): each range gets a share of the tasks in
    proportion to its size, at least one, and is cut into that many equal pieces."""
    ranges = [r for r in ranges if r.size > 0]
    if min_partitions is None or len(ranges) >= min_partitions:
        return ranges
    total = sum(r.size for r in ranges)
    out: list[OffsetRange] = []
    for r in ranges:
        parts = min(r.size, max(1, math.ceil(r.size / total * min_partitions)))
        bounds = [r.start + r.size * i // parts for i in range(parts + 1)]
        out += [OffsetRange(r.topic, r.partition, lo, hi) for lo, hi in itertools.pairwise(bounds)]
    return out
