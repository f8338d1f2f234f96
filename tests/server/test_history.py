"""The history checker finds each kind of fault, and nothing in a clean history."""

from __future__ import annotations

import pytest

from tests.server._history import Ack, check_history

SENT = [b"a", b"b", b"c", b"d", b"e"]
ACKS = [Ack(0, 0, (b"a", b"b")), Ack(1, 0, (b"c",)), Ack(0, 2, (b"d",))]
CLEAN = {0: [(0, b"a"), (1, b"b"), (2, b"d")], 1: [(0, b"c")]}


def test_a_clean_history_has_no_problem() -> None:
    assert check_history(SENT, ACKS, CLEAN) == []
    # An unacknowledged value may or may not have been stored.
    assert check_history(SENT, ACKS, {**CLEAN, 1: [(0, b"c"), (1, b"e")]}) == []
    assert check_history([], [], {}) == []


@pytest.mark.parametrize(
    ("read", "problem"),
    [
        ({0: [(0, b"a"), (1, b"b")], 1: [(0, b"c")]}, "lost: b'd'"),
        ({**CLEAN, 1: [(0, b"c"), (1, b"a")]}, "duplicate: b'a'"),
        ({**CLEAN, 1: [(0, b"c"), (1, b"zz")]}, "phantom: b'zz'"),
        ({0: [(0, b"a"), (1, b"b"), (3, b"d")], 1: [(0, b"c")]}, "offset 3 where 2 was next"),
        ({0: [(1, b"a"), (2, b"b"), (3, b"d")], 1: [(0, b"c")]}, "offset 1 where 0 was next"),
        ({0: [(0, b"b"), (1, b"a"), (2, b"d")], 1: [(0, b"c")]}, "misplaced: b'a'"),
        ({0: [(0, b"a"), (1, b"b")], 1: [(0, b"c"), (1, b"d")]}, "misplaced: b'd'"),
    ],
)
def test_each_fault_is_found(read: dict[int, list[tuple[int, bytes]]], problem: str) -> None:
    problems = check_history(SENT, ACKS, read)
    assert any(problem in p for p in problems), problems


def test_a_producer_order_broken_is_found() -> None:
    orders = [[b"a", b"b", b"d"]]
    assert check_history(SENT, ACKS, CLEAN, orders) == []
    swapped = {0: [(0, b"a"), (1, b"d"), (2, b"b")], 1: [(0, b"c")]}
    problems = check_history(SENT, [], swapped, orders)
    assert problems == ["reordered: b'd' read at 0/1, after a value sent before it read at 0/2"], (
        problems
    )
    # A value never stored (and not acknowledged) does not break the order of the rest.
    assert check_history(SENT, [], {0: [(0, b"a"), (1, b"d")]}, orders) == []
