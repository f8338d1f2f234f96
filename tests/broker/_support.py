"""Shared helpers of the broker tests: a broker over a temporary data directory, batches with
known values and timestamps, the decoding of fetched bytes, and a consumer loop.

Every test drives the broker on its own event loop (``asyncio.run``) and never sleeps: a
long-poll is observed by yielding to the loop with ``await asyncio.sleep(0)``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tidewire.broker import Broker, BrokerConfig, FetchResult
from tidewire.records import BatchBuilder, Codec, Record, iter_batches, iter_records

#: Record timestamps sit around this (ms since the epoch).
T0 = 1_700_000_000_000
#: The bound on anything that should happen at once (s): generous for a loaded CI machine,
#: and far below the 30 s a long-poll in these tests would otherwise wait.
PROMPT_S = 5.0
#: A long-poll's max wait (ms) that no test should ever sit out.
LONG_POLL_MS = 30_000
#: A per-partition fetch budget that never limits anything in these tests.
ALL = 1 << 24


def config(tmp_path: Path, **kwargs: Any) -> BrokerConfig:
    """A broker configuration over ``tmp_path/data``."""
    return BrokerConfig(data_dir=str(tmp_path / "data"), **kwargs)


def batch(
    values: Sequence[bytes],
    *,
    timestamps: Sequence[int] | None = None,
    codec: Codec = Codec.NONE,
) -> bytes:
    """One batch of ``values`` (timestamps ``T0`` unless given, one per value)."""
    b = BatchBuilder(codec=codec)
    for i, v in enumerate(values):
        b.append(v, timestamp_ms=T0 if timestamps is None else timestamps[i])
    return b.build()


def split_batches(data: bytes) -> list[bytes]:
    """The whole batches ``data`` holds, each CRC-checked; fails on a partial batch."""
    out: list[bytes] = []
    end = 0
    for pos, h in iter_batches(data):
        assert pos == end
        out.append(data[pos : pos + h.size])
        end = pos + h.size
    assert end == len(data), f"{len(data) - end} bytes of a partial batch at the end"
    return out


def records(data: bytes) -> list[Record]:
    """Every record of the whole batches in ``data``, in order."""
    return [r for b in split_batches(data) for r in iter_records(b)]


def values(data: bytes, since: int = 0) -> list[tuple[int, bytes | None]]:
    """``(offset, value)`` of every record of ``data`` at or above offset ``since``."""
    return [(r.offset, r.value) for r in records(data) if r.offset >= since]


async def settle(turns: int = 5) -> None:
    """Yield to the event loop a few times: what is runnable runs, nothing is waited for."""
    for _ in range(turns):
        await asyncio.sleep(0)


async def read_all(
    broker: Broker, topic: str, partition: int, offset: int = 0, *, max_bytes: int = ALL
) -> list[Record]:
    """Fetch one partition from ``offset`` to its high watermark, one fetch after another."""
    out: list[Record] = []
    while True:
        [r] = await broker.fetch([(topic, partition, offset, max_bytes)])
        if not r.data:
            assert r.next_offset == offset
            return out
        out.extend(rec for rec in records(r.data) if rec.offset >= offset)
        assert r.next_offset > offset
        offset = r.next_offset


async def snapshot(broker: Broker) -> dict[object, Any]:
    """Everything a client can observe of the broker's data, for before/after comparisons:
    the topics, every partition's status, its whole content read in small and large steps,
    and the time and end offsets."""
    out: dict[object, Any] = {"topics": broker.topics()}
    for topic, n in sorted(broker.topics().items()):
        out[topic] = broker.describe(topic)
        for p in range(n):
            for step in (1, 300, ALL):
                out[topic, p, step] = await _fetch_chain(broker, topic, p, step)
            out[topic, p, "offsets"] = [
                broker.list_offset(topic, p, ts) for ts in (-2, -1, 0, T0, T0 + 500, T0 + 10**6)
            ]
    return out


async def _fetch_chain(broker: Broker, topic: str, p: int, step: int) -> list[FetchResult]:
    offset = broker.list_offset(topic, p, -2)
    chain: list[FetchResult] = []
    while True:
        [r] = await broker.fetch([(topic, p, offset, step)])
        chain.append(r)
        if not r.data:
            return chain
        offset = r.next_offset
