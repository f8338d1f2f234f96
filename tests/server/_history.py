"""A checker of produce/consume histories: what was sent, what was acknowledged where, and
what a full read of every partition returned. It reports lost, duplicated, misplaced and
phantom messages and holes in the offsets; its own tests are in test_history.py.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

__all__ = ["Ack", "check_history"]


@dataclass(frozen=True, slots=True)
class Ack:
    """A produce the broker acknowledged: ``values`` stored from ``base_offset`` on, in order."""

    partition: int
    base_offset: int
    values: tuple[bytes, ...]


def check_history(
    sent: Iterable[bytes],
    acks: Iterable[Ack],
    read: Mapping[int, Sequence[tuple[int, bytes | None]]],
    orders: Iterable[Sequence[bytes]] = (),
) -> list[str]:
    """The problems of one history (empty: none).

    Args:
        sent: every value any producer sent, acknowledged or not (values are unique).
        acks: every acknowledged produce.
        read: partition -> ``(offset, value)`` of every record read from it, from offset 0
            to its end, in the order read.
        orders: sequences of values that must be read in that order, in one partition (what
            one producer sent to one partition).

    Returns:
        One line per problem: offsets that are not contiguous from 0, a value read twice, a
        value read that nobody sent, an acknowledged value missing (lost) or read at another
        offset than the one acknowledged (misplaced, reordered), a producer's values read
        out of the order it sent them (reordered).
    """
    problems: list[str] = []
    sent_values = set(sent)
    where: dict[bytes | None, tuple[int, int]] = {}
    for partition, records in sorted(read.items()):
        expected = 0
        for offset, value in records:
            if offset != expected:
                problems.append(f"partition {partition}: offset {offset} where {expected} was next")
            expected = offset + 1
            if value in where:
                problems.append(
                    f"duplicate: {value!r} at {partition}/{offset}, "
                    f"also at {where[value][0]}/{where[value][1]}"
                )
                continue
            where[value] = (partition, offset)
            if value not in sent_values:
                problems.append(f"phantom: {value!r} at {partition}/{offset} was never sent")
    for ack in acks:
        for i, value in enumerate(ack.values):
            want = (ack.partition, ack.base_offset + i)
            got = where.get(value)
            if got is None:
                problems.append(f"lost: {value!r}, acknowledged at {want[0]}/{want[1]}")
            elif got != want:
                problems.append(
                    f"misplaced: {value!r} acknowledged at {want[0]}/{want[1]}, "
                    f"read at {got[0]}/{got[1]}"
                )
    for order in orders:
        last: tuple[int, int] | None = None
        for value in order:
            got = where.get(value)
            if got is None:
                continue  # never stored (if it was acknowledged, it is reported as lost)
            if last is not None and (got[0] != last[0] or got[1] <= last[1]):
                problems.append(
                    f"reordered: {value!r} read at {got[0]}/{got[1]}, after a value sent "
                    f"before it read at {last[0]}/{last[1]}"
                )
            last = got
    return problems
