"""Helpers of the writing tests: read a topic back with the client (not with the source under
test), and name topics uniquely per test."""

from __future__ import annotations

import itertools
from typing import Any

from tidewire.client import Client
from tidewire.records import Record

_names = itertools.count()


def topic_name(prefix: str) -> str:
    """A topic name no other test uses in this session."""
    return f"{prefix}-{next(_names)}"


def read_topic(addr: str, topic: str) -> dict[int, list[Any]]:
    """Every record of ``topic`` per partition, in offset order (fetched with the client)."""
    with Client(addr) as c:
        n = len(c.describe_topic(topic).partitions)
        out: dict[int, list[Any]] = {}
        for p in range(n):
            records: list[Record] = []
            offset = 0
            while True:
                got = c.fetch(topic, p, offset, max_wait_ms=0)
                if not got.records:
                    break
                records.extend(got.records)
                offset = got.next_offset
            out[p] = records
        return out


def values(addr: str, topic: str) -> list[bytes]:
    """Every value of ``topic``, partition by partition."""
    return [r.value for rs in read_topic(addr, topic).values() for r in rs]


def create_topic(addr: str, topic: str, partitions: int) -> None:
    with Client(addr) as c:
        c.create_topic(topic, partitions)


def writer_epochs(addr: str, topic: str) -> dict[int, set[int]]:
    """Producer id -> the epochs its batches in ``topic`` carry (every partition)."""
    from tidewire.records import iter_batches

    out: dict[int, set[int]] = {}
    with Client(addr) as c:
        n = len(c.describe_topic(topic).partitions)
        for p in range(n):
            offset = 0
            while True:
                got = c.fetch_batches(topic, p, offset)
                if not got.data:
                    break
                for _, h in iter_batches(got.data):
                    out.setdefault(h.producer_id, set()).add(h.producer_epoch)
                    offset = h.last_offset + 1
        return out


def writer_states(broker: Any, topic: str) -> int:
    """How many writers' states the broker holds in ``topic``'s partitions."""
    from tidewire.broker.producers import is_writer

    core = broker.eb.broker

    def count() -> int:
        return sum(
            1
            for (t, _), state in core._producers.items()
            if t == topic
            for pid in state.entries
            if is_writer(pid)
        )

    return int(broker.call(count))
