"""The queue history checker finds each kind of fault, and nothing in a clean history.

Each fault is planted into one clean history that exercises every legitimate path: a
redelivery after a kill, after a nack and after a close, an ack lost with its connection,
a publish retried and stored twice, and a poison message dead-lettered.
"""

from __future__ import annotations

import pytest

from tests.server._queue_history import (
    ConsumerClosed,
    DeadLettered,
    Delivered,
    Event,
    Killed,
    Published,
    Settled,
    check_queue_history,
)

CLEAN: list[Event] = [
    Published(b"a", True),
    Published(b"b", True),
    Published(b"c", False),  # confirm lost with the connection ...
    Published(b"c", True),  # ... so it was sent again: stored twice
    Published(b"p", True, poison=True),
    Published(b"u", False),  # never confirmed and never stored
    Delivered("c1", 1, 0, 1, b"a"),
    Settled("c1", 1, 0, "ack", "confirmed"),
    Delivered("c1", 2, 1, 1, b"b"),
    Delivered("c2", 3, 2, 1, b"c"),
    Delivered("c2", 4, 3, 1, b"c"),
    Settled("c2", 3, 2, "ack", "confirmed"),
    Delivered("c2", 5, 4, 1, b"p"),
    Settled("c2", 5, 4, "dead-letter", "connection-lost"),  # the reject died with the broker
    Killed(1),
    Settled("c1", 2, 1, "ack", "connection-lost"),  # sent, never answered
    # tags start again after a restart
    Delivered("c2", 1, 1, 2, b"b"),
    Settled("c2", 1, 1, "requeue", "confirmed"),
    Delivered("c1", 2, 1, 3, b"b"),  # after the nack
    Settled("c1", 2, 1, "ack", "confirmed"),
    Delivered("c1", 3, 3, 1, b"c"),
    ConsumerClosed("c1"),
    Delivered("c2", 4, 3, 2, b"c"),  # after c1 closed holding it
    Settled("c2", 4, 3, "ack", "confirmed"),
    Delivered("c2", 5, 4, 2, b"p"),
    Settled("c2", 5, 4, "dead-letter", "confirmed"),
    DeadLettered(b"p", "rejected"),
]


def _replace(old: Event, new: Event | list[Event]) -> list[Event]:
    i = CLEAN.index(old)
    return [*CLEAN[:i], *(new if isinstance(new, list) else [new]), *CLEAN[i + 1 :]]


def _without(*events: Event) -> list[Event]:
    return [e for e in CLEAN if e not in events]


def _insert_after(anchor: Event, *new: Event) -> list[Event]:
    i = CLEAN.index(anchor) + 1
    return [*CLEAN[:i], *new, *CLEAN[i:]]


def test_a_clean_history_has_no_problem() -> None:
    assert check_queue_history(CLEAN) == []
    assert check_queue_history([]) == []
    # An unconfirmed publish may have been stored after all: then it must be handled too,
    # and it is, here.
    stored = [*CLEAN, Delivered("c2", 9, 5, 1, b"u"), Settled("c2", 9, 5, "ack", "confirmed")]
    assert check_queue_history(stored) == []
    # An ack whose answer was lost with the broker may have been recorded: the message is
    # then not delivered again.
    unanswered = _replace(ACK_A, Settled("c1", 1, 0, "ack", "connection-lost"))
    assert check_queue_history(unanswered) == []
    # So may an ack whose consumer was stopped while it waited for the answer.
    abandoned = _replace(ACK_A, Settled("c1", 1, 0, "ack", "abandoned"))
    assert check_queue_history(abandoned) == []
    # Without any settlement, the copy had to come again.
    assert check_queue_history(_without(ACK_A))[0].startswith("lost: b'a' at offset 0")


ACK_A = Settled("c1", 1, 0, "ack", "confirmed")
KILL = Killed(1)
LOST_ACK_B = Settled("c1", 2, 1, "ack", "connection-lost")
NACK_B = Settled("c2", 1, 1, "requeue", "confirmed")
REDELIVER_B = Delivered("c1", 2, 1, 3, b"b")
CLOSE = ConsumerClosed("c1")
DEAD_P = DeadLettered(b"p", "rejected")
REJECT_P = Settled("c2", 5, 4, "dead-letter", "confirmed")


@pytest.mark.parametrize(
    ("history", "problem"),
    [
        # phantom: a delivery, or a dead letter, of a value nobody published
        (
            [*CLEAN, Delivered("c1", 7, 9, 1, b"zz"), Settled("c1", 7, 9, "ack", "confirmed")],
            "phantom: b'zz' delivered at offset 9 was never published",
        ),
        ([*CLEAN, DeadLettered(b"zz", "rejected")], "phantom: b'zz' dead-lettered"),
        # one offset, two values
        (
            _insert_after(ACK_A, Delivered("c2", 8, 0, 2, b"b")),
            "corrupt: offset 0 delivered as b'a' to c1 and as b'b' to c2",
        ),
        # published once, stored twice
        (
            [*CLEAN, Delivered("c1", 8, 7, 1, b"a"), Settled("c1", 8, 7, "ack", "confirmed")],
            "stored twice: b'a' published once, delivered at offsets [0, 7]",
        ),
        # lost: confirmed, never acked / never delivered
        # lost: the last delivery of a stored copy not settled for good, and no other after it
        (
            _without(ACK_A),
            "lost: b'a' at offset 0: its last delivery (to c1, tag 1) was not settled, and it "
            "was not delivered again",
        ),
        (
            _replace(ACK_A, Settled("c1", 1, 0, "requeue", "confirmed")),
            "lost: b'a' at offset 0: its last delivery (to c1, tag 1) was nacked",
        ),
        (
            _replace(ACK_A, Settled("c1", 1, 0, "ack", "refused")),
            "lost: b'a' at offset 0: its last delivery (to c1, tag 1) was ack refused",
        ),
        (
            [*_without(Settled("c2", 4, 3, "ack", "confirmed"))],
            "lost: b'c' at offset 3: its last delivery (to c2, tag 4) was not settled",
        ),
        (
            [Published(b"q", True), *CLEAN],
            "lost: b'q' confirmed, never delivered",
        ),
        (_without(DEAD_P), "lost: poison b'p' confirmed, never dead-lettered"),
        # an ack confirmed, then the offset delivered again
        (
            _insert_after(KILL, Delivered("c2", 6, 0, 2, b"a")),
            "redelivered after ack: offset 0 delivered to c2 (tag 6, count 2) after c1's ack "
            "of tag 1 was confirmed",
        ),
        # a reject confirmed, then delivered again
        (
            [*CLEAN, Delivered("c1", 9, 4, 3, b"p")],
            "redelivered after dead-lettering: offset 4 delivered to c1 (tag 9, count 3) after "
            "c2 (tag 5, count 2) rejected it, confirmed",
        ),
        # no kill between the first two deliveries of b, and its ack was not lost with a
        # connection but refused
        (
            [
                e if e != LOST_ACK_B else Settled("c1", 2, 1, "ack", "refused")
                for e in _without(KILL)
            ],
            "redelivered while held: offset 1 delivered to c2 (tag 1, count 2) after c1 (tag 2, "
            "count 1) held it",
        ),
        # no nack before the third delivery of b
        (
            _without(NACK_B),
            "redelivered while held: offset 1 delivered to c1 (tag 2, count 3) after c2",
        ),
        # no close before c2 got c from c1
        (_without(CLOSE), "redelivered while held: offset 3 delivered to c2 (tag 4, count 2)"),
        # a nack in the same run: the count must grow
        (
            _replace(REDELIVER_B, Delivered("c1", 2, 1, 2, b"b")),
            "delivery_count: offset 1 delivered to c1 (tag 2, count 2) after c2 (tag 1, count "
            "2) nacked it, and the count did not grow",
        ),
        (
            [*CLEAN, Delivered("c1", 9, 5, 0, b"u"), Settled("c1", 9, 5, "ack", "confirmed")],
            "delivery_count: offset 5 delivered to c1 (tag 9) with delivery_count 0",
        ),
        # one delivery acked by two consumers
        (
            _insert_after(
                ACK_A, Delivered("c2", 1, 0, 1, b"a"), Settled("c2", 1, 0, "ack", "confirmed")
            ),
            "tag acked twice: tag 1 (offset 0) acked with confirmation by c1, c2",
        ),
        (
            [*CLEAN, Settled("c3", 4, 3, "ack", "confirmed")],
            "unknown delivery: c3 settled tag 4 (offset 3) it was never handed",
        ),
        # the poison message: acked, dead-lettered twice, for another reason, or a good one
        # dead-lettered
        (
            _replace(REJECT_P, Settled("c2", 5, 4, "ack", "confirmed")),
            "acked poison: b'p' was acked, not dead-lettered",
        ),
        # (CLEAN's first reject of p went unanswered with a kill, so one more dead letter
        # is allowed: two more are not, nor one more after a reject that was answered)
        ([*CLEAN, DEAD_P, DEAD_P], "dead-lettered 3 times: b'p' (stored 1 time(s)"),
        (
            [
                *_replace(
                    Settled("c2", 5, 4, "dead-letter", "connection-lost"),
                    Settled("c2", 5, 4, "requeue", "confirmed"),
                ),
                DEAD_P,
            ],
            "dead-lettered 2 times: b'p' (stored 1 time(s), 0 reject(s) unanswered",
        ),
        ([*CLEAN, DEAD_P, DEAD_P], "dead-letter count: 1 poison message(s) planted"),
        (_replace(DEAD_P, DeadLettered(b"p", "expired")), "dead-letter reason: b'p'"),
        (
            [*CLEAN, DeadLettered(b"a", "rejected")],
            "dead-lettered non-poison: b'a' (rejected)",
        ),
    ],
)
def test_each_fault_is_found(history: list[Event], problem: str) -> None:
    problems = check_queue_history(history)
    assert any(problem in p for p in problems), problems


def test_a_reject_unanswered_before_a_kill_may_have_been_dead_lettered() -> None:
    # CLEAN's first reject of p died with the broker, and p came again and was rejected:
    # the dead letter of the first may have been stored before the kill, its settlement not.
    assert check_queue_history([*CLEAN, DEAD_P]) == []
    # Without a kill between the unanswered reject and the next delivery, no more.
    no_kill = [e for e in CLEAN if e != KILL]
    assert any("dead-lettered 2 times" in p for p in check_queue_history([*no_kill, DEAD_P]))


def test_the_dead_letter_count_is_per_stored_copy() -> None:
    # A poison message published twice (a retry) and stored twice is dead-lettered twice.
    twice: list[Event] = [
        Published(b"p", False, poison=True),
        Published(b"p", True, poison=True),
        Delivered("c1", 1, 0, 1, b"p"),
        Delivered("c1", 2, 1, 1, b"p"),
        Settled("c1", 1, 0, "dead-letter", "confirmed"),
        Settled("c1", 2, 1, "dead-letter", "confirmed"),
        DeadLettered(b"p", "rejected"),
    ]
    assert check_queue_history([*twice, DeadLettered(b"p", "rejected")]) == []
    assert check_queue_history(twice) == [
        "dead-letter count: 1 poison message(s) planted (2 stored cop(ies) seen), 1 dead-lettered"
    ]
    assert "dead-lettered 3 times" in " ".join(
        check_queue_history([*twice, *[DeadLettered(b"p", "rejected")] * 2])
    )


def test_a_visibility_timeout_allows_a_redelivery_once_it_has_passed() -> None:
    history: list[Event] = [
        Published(b"a", True),
        Delivered("c1", 1, 0, 1, b"a", at_ms=1_000),
        Delivered("c2", 2, 0, 2, b"a", at_ms=1_400),
        Settled("c2", 2, 0, "ack", "confirmed"),
    ]
    assert check_queue_history(history, visibility_timeout_ms=300) == []
    assert check_queue_history(history, visibility_timeout_ms=500) != []
    assert check_queue_history(history) != []
