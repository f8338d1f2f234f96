"""The stream history checker finds each kind of fault, and nothing in a clean history.

Each fault is planted into one clean history that exercises every legitimate path: a send
whose first answer died with the broker and whose retry was answered "duplicate", a send
given up on, a take lost with a kill (its message never received), and a reader that reads
every stored message of its stream once, across a kill.
"""

from __future__ import annotations

import pytest

from tests.server._stream_history import (
    Event,
    Killed,
    Read,
    Sent,
    TakeLost,
    Taken,
    check_stream_history,
)
from tidewire.broker.streams.model import encode_token


def tok(stream: str, pos: int) -> str:
    return encode_token(stream, pos)


A, B = "a", "b"
A1 = Sent(A, b"a1", "stored")
A2 = Sent(A, b"a2", "duplicate")  # its first answer was lost; the retry found it stored
A3 = Sent(A, b"a3", "stored")
B1 = Sent(B, b"b1", "stored")
B2 = Sent(B, b"b2", "unknown")  # given up: not stored, here
T_A1 = Taken("r1", A, b"a1", tok(A, 1))
T_A2 = Taken("r2", A, b"a2", tok(A, 2))
LOST = TakeLost("r1", (A,), 1)  # took a3 as the broker died
T_B1 = Taken("r1", B, b"b1", tok(B, 1))
R_A1 = Read("f", A, b"a1", tok(A, 1))
R_A2 = Read("f", A, b"a2", tok(A, 2))
R_A3 = Read("f", A, b"a3", tok(A, 3))
CLEAN: list[Event] = [
    A1,
    B1,
    T_A1,
    R_A1,
    A2,
    T_B1,
    A3,
    R_A2,
    Killed(1),
    LOST,
    T_A2,
    B2,
    R_A3,
]


def _replace(old: Event, *new: Event) -> list[Event]:
    i = CLEAN.index(old)
    return [*CLEAN[:i], *new, *CLEAN[i + 1 :]]


def _without(*events: Event) -> list[Event]:
    return [e for e in CLEAN if e not in events]


def test_a_clean_history_has_no_problem() -> None:
    assert check_stream_history(CLEAN) == []
    # Two receivers' takes may be answered out of position order.
    i, j = CLEAN.index(T_A1), CLEAN.index(T_A2)
    swapped = [*CLEAN]
    swapped[i], swapped[j] = T_A2, T_A1
    assert check_stream_history(swapped) == []
    # The retries of a cut take before the broker is back reach no broker: no more budget.
    assert check_stream_history(_replace(LOST, LOST, LOST)) == []
    assert check_stream_history([]) == []
    # An unknown send that was stored after all is taken and read like any other.
    stored = [*CLEAN, Taken("r2", B, b"b2", tok(B, 2))]
    assert check_stream_history(stored) == []


@pytest.mark.parametrize(
    ("history", "problem"),
    [
        pytest.param(_without(T_B1), "lost: 1 acknowledged message(s) of 'b'", id="untaken"),
        pytest.param(
            _replace(LOST, TakeLost("r1", (B,), 1)),
            "lost: 1 acknowledged message(s) of 'a'",
            id="lost-take-of-another-stream",
        ),
        pytest.param(
            _without(T_A2),
            "lost: 2 acknowledged messages never taken, but the 1 take",
            id="more-untaken-than-lost-takes",
        ),
        pytest.param(
            _replace(T_A2, TakeLost("r1", (A,), 1)),
            "lost: 2 acknowledged messages never taken, but the 1 take",
            id="retries-of-a-cut-take",
        ),
        pytest.param(
            [*CLEAN, Taken("r2", A, b"a1", tok(A, 1))], "taken twice: b'a1'", id="taken-twice"
        ),
        pytest.param(
            _replace(R_A1, Read("f", A, b"a1", tok(A, 7))), "stored twice: b'a1'", id="two-copies"
        ),
        pytest.param(
            _replace(T_A2, Taken("r1", A, b"a2", tok(A, 0))), "take order", id="take-order"
        ),
        pytest.param(_without(R_A2), "lost: f never read 1", id="reader-missed"),
        pytest.param([*CLEAN, R_A3], "read twice: f read b'a3'", id="read-twice"),
        pytest.param(
            [*_without(R_A2), Read("f", A, b"a2", tok(A, 2))], "read order", id="read-order"
        ),
        pytest.param([*CLEAN, Taken("r1", A, b"zz", tok(A, 9))], "phantom: b'zz'", id="phantom"),
        pytest.param(
            [*CLEAN, Read("f", B, b"a1", tok(B, 1))], "phantom: b'a1' read", id="wrong-stream"
        ),
        pytest.param(
            _replace(T_A2, Taken("r2", A, b"a2", tok(B, 2))), "bad token", id="token-of-b"
        ),
        pytest.param([*CLEAN, Sent(A, b"a1", "stored")], "sent twice", id="sent-twice"),
    ],
)
def test_each_fault_is_found(history: list[Event], problem: str) -> None:
    problems = check_stream_history(history)
    assert any(problem in p for p in problems), problems


def test_a_reader_that_did_not_finish_is_not_held_to_completeness() -> None:
    partial = _without(R_A3)
    assert check_stream_history(partial, readers_complete=False) == []
    assert check_stream_history(partial) != []
