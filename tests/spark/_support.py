"""Shared helpers of the Spark tests: test data whose every field follows from where it is
stored, filling topics with it, and reading a DataFrame back as comparable tuples."""

from __future__ import annotations

import itertools
from typing import Any

from tidewire.client import Client, Message

#: Record timestamps of the test data sit around this (ms since the epoch).
T0 = 1_700_000_000_000
_topics = itertools.count()


def unique_topic(prefix: str = "t") -> str:
    """A topic name no other test of the session uses."""
    return f"{prefix}-{next(_topics)}"


def message(topic: str, partition: int, offset: int) -> Message:
    """The message the test data has at ``offset`` of ``topic``/``partition``: every field
    derived from where it is, so a read can be checked row by row. Every third has no key,
    every other has headers, the timestamp is ``T0 + 10 * offset``."""
    key = None if offset % 3 == 0 else b"k-%d-%d" % (partition, offset)
    headers = [("n", b"%d" % offset), ("empty", None)] if offset % 2 else []
    value = b"%s/%d/%d" % (topic.encode(), partition, offset)
    return Message(value, key=key, headers=headers, timestamp_ms=T0 + 10 * offset)


def fill(
    addr: str, topic: str, partitions: int, per_partition: int, *, batch: int = 100, start: int = 0
) -> None:
    """Create ``topic`` (unless ``start`` > 0) and store ``per_partition`` messages of the
    test data in each partition, from offset ``start``, ``batch`` per produce request."""
    with Client(addr) as client:
        if start == 0:
            client.create_topic(topic, partitions)
        for p in range(partitions):
            for lo in range(start, start + per_partition, batch):
                hi = min(lo + batch, start + per_partition)
                client.produce(topic, p, [message(topic, p, o) for o in range(lo, hi)])


def produce_range(addr: str, topic: str, partition: int, offsets: range) -> None:
    """Store the test data at ``offsets`` (the next ones) in ``topic``/``partition``."""
    with Client(addr) as client:
        client.produce(topic, partition, [message(topic, partition, o) for o in offsets])


def rows_of(df: Any) -> list[tuple[Any, ...]]:
    """The rows of ``df`` as plain tuples, sorted by (topic, partition, offset): binary as
    bytes, timestamps as ms, headers as (key, value) tuples."""
    out = []
    for r in df.collect():
        d = r.asDict(recursive=True)
        row = (
            d["topic"],
            d["partition"],
            d["offset"],
            None if d["key"] is None else bytes(d["key"]),
            None if d["value"] is None else bytes(d["value"]),
            round(d["timestamp"].timestamp() * 1000),
            d["timestampType"],
        )
        if "headers" in d:
            row += (
                [
                    (h["key"], None if h["value"] is None else bytes(h["value"]))
                    for h in d["headers"]
                ],
            )
        out.append(row)
    return sorted(out, key=lambda x: (x[0], x[1], x[2]))


def expected(
    topic: str, partition: int, offsets: range, *, headers: bool = False
) -> list[tuple[Any, ...]]:
    """What :func:`rows_of` gives for the test data at ``offsets``."""
    out = []
    for o in offsets:
        m = message(topic, partition, o)
        row: tuple[Any, ...] = (topic, partition, o, m.key, m.value, m.timestamp_ms, 0)
        if headers:
            row += (list(m.headers),)
        out.append(row)
    return out
