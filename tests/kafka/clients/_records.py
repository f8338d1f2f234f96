"""The messages the suites produce and the comparison of what comes back: keys, values,
headers, timestamps and offsets, nothing left out."""

from __future__ import annotations

from typing import NamedTuple

#: A fixed create time (ms) the messages carry, one ms apart, so timestamps are checked exactly.
BASE_TS = 1_767_000_000_000


class Sent(NamedTuple):
    """One message as produced."""

    key: bytes
    value: bytes
    headers: tuple[tuple[str, bytes], ...]
    timestamp: int


class Got(NamedTuple):
    """One message as consumed, or as the producer's delivery report placed it."""

    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes], ...]
    timestamp: int


def messages(n: int, tag: str = "m") -> list[Sent]:
    """``n`` keyed messages with two headers each; values compressible and not tiny."""
    return [
        Sent(
            key=b"key-%d" % (i % 5),
            value=(f"{tag}-{i}:".encode() + b"payload " * (i % 9 + 1)),
            headers=(("seq", str(i).encode()), ("origin", tag.encode())),
            timestamp=BASE_TS + i,
        )
        for i in range(n)
    ]


def check_log(sent: list[Sent], placed: list[Got], consumed: list[Got]) -> None:
    """What was consumed is exactly what was produced, where the producer was told it went:
    each partition's offsets 0, 1, 2, ... with nothing missing or repeated."""
    assert sorted(consumed) == sorted(placed)
    by_partition: dict[int, list[int]] = {}
    for g in consumed:
        by_partition.setdefault(g.partition, []).append(g.offset)
    for partition, offsets in by_partition.items():
        assert sorted(offsets) == list(range(len(offsets))), f"partition {partition}"
    assert sorted((g.key, g.value, g.headers, g.timestamp) for g in consumed) == sorted(
        (s.key, s.value, s.headers, s.timestamp) for s in sent
    )
