"""A checker of queue histories: what publishers sent and had confirmed, what each consumer
was handed (tag, offset, delivery count), how each delivery was settled and whether the
broker confirmed it, where the broker was killed, and what ended up in the dead-letter queue.
Its own tests are in test_queue_history.py.

The history is one ordered list of events, recorded in the order they happened (one event
loop records them all). Kill markers are recorded *before* the signal is sent, so every
delivery a restart causes comes after its marker. Settlements are recorded once their
answer (or failure) is in, before the consumer takes its next message: a settlement is of
the latest delivery before it with its consumer, tag and offset (tags start again after a
restart, so one consumer may hold the same tag and offset twice, in two runs).

Identity: a message is its value (unique per publish; a publish retried after a lost
confirm may be stored twice, at two offsets: both copies must then be handled). A stored
copy is its offset in the queue. A delivery is ``(consumer, tag, offset)``.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from itertools import pairwise
from typing import Literal

from tidewire.broker.queues.model import SettleOutcome

__all__ = [
    "ConsumerClosed",
    "DeadLettered",
    "Delivered",
    "Event",
    "Killed",
    "Published",
    "SettleResult",
    "Settled",
    "check_queue_history",
]

#: How a settlement ended: the broker answered it (``confirmed``: recorded durably), the
#: connection went before an answer (``connection-lost``: it may or may not have been
#: recorded), the consumer was stopped while it waited for the answer (``abandoned``: sent,
#: so likewise either), or the broker answered with an error (``refused``, e.g. an unknown
#: tag).
SettleResult = Literal["confirmed", "connection-lost", "abandoned", "refused"]


@dataclass(frozen=True, slots=True)
class Published:
    """One publish attempt of ``value``: ``confirmed`` when the broker confirmed it (stored,
    fsynced). A retried publish is one event per attempt. ``poison``: consumers reject it,
    so it must end in the dead-letter queue and nowhere else."""

    value: bytes
    confirmed: bool
    poison: bool = False


@dataclass(frozen=True, slots=True)
class Delivered:
    """A consumer was handed a message. ``at_ms``: when (monotonic ms; only used with a
    visibility timeout)."""

    consumer: str
    tag: int
    offset: int
    delivery_count: int
    value: bytes
    at_ms: float = 0.0


@dataclass(frozen=True, slots=True)
class Settled:
    """A consumer settled one of its deliveries (``ack``, ``requeue`` = nack, or
    ``dead-letter`` = reject), with the result of that request."""

    consumer: str
    tag: int
    offset: int
    outcome: SettleOutcome
    result: SettleResult


@dataclass(frozen=True, slots=True)
class Killed:
    """The broker is about to be killed (recorded before the signal)."""

    number: int


@dataclass(frozen=True, slots=True)
class ConsumerClosed:
    """A consumer was closed or cancelled: whatever it held goes back to the queue."""

    consumer: str


@dataclass(frozen=True, slots=True)
class DeadLettered:
    """A message found in the dead-letter queue, with its ``x-death`` reason."""

    value: bytes
    reason: str


Event = Published | Delivered | Settled | Killed | ConsumerClosed | DeadLettered

_Key = tuple[str, int, int]  # consumer, tag, offset


def _key(e: Delivered | Settled) -> _Key:
    return (e.consumer, e.tag, e.offset)


def check_queue_history(
    events: Iterable[Event],
    *,
    dead_letter_reason: str = "rejected",
    visibility_timeout_ms: float = 0,
) -> list[str]:
    """The problems of one queue history (empty: none).

    Args:
        events: the history, in the order it happened (see the module docstring).
        dead_letter_reason: the ``x-death`` reason every dead letter must carry.
        visibility_timeout_ms: the queue's visibility timeout (0: none); with one, a
            delivery not settled within it may be redelivered.

    Returns:
        One line per problem:

        - ``phantom``: a delivered or dead-lettered value nobody published;
        - ``corrupt``: one offset delivered with two different values;
        - ``stored twice``: a value published once and delivered at two offsets;
        - ``lost``: a confirmed value never delivered (poison: never dead-lettered), or a
          stored copy whose last delivery was not acked (poison: rejected) for good: not
          settled, refused, or nacked, and not delivered again. An ack whose answer was lost
          with its connection counts as an ack if the copy is not delivered again (the
          broker may have recorded it before it went);
        - ``acked poison``, ``dead-lettered non-poison``, ``dead-lettered N times``,
          ``dead-letter reason``, ``dead-letter count``: the dead-letter queue holds other
          than exactly one copy of each stored poison message, for the expected reason
          (plus at most one more for each reject whose answer was lost with a kill and
          whose copy came again: it may have been dead-lettered before the kill);
        - ``redelivered after ack``: an offset delivered again after a delivery of it had
          its ack confirmed;
        - ``redelivered after dead-lettering``: likewise after a confirmed reject;
        - ``redelivered while held``: delivered again while an earlier delivery was
          neither settled back (nack), nor lost with its connection (kill, close), nor
          timed out;
        - ``delivery_count``: a count below 1, or not higher after a nack in one run;
        - ``tag acked twice``: one delivery (tag, offset) acked with confirmation by two
          consumers;
        - ``unknown delivery``: a settlement of a delivery its consumer was never handed.
    """
    problems: list[str] = []
    attempts: dict[bytes, int] = defaultdict(int)
    confirmed: set[bytes] = set()
    poison: set[bytes] = set()
    # offset -> [(position, delivery)], in order
    deliveries: dict[int, list[tuple[int, Delivered]]] = defaultdict(list)
    unknown: list[Settled] = []
    # delivery (by position) -> its settlements
    settles: dict[int, list[Settled]] = defaultdict(list)
    latest: dict[_Key, int] = {}
    kills: list[int] = []
    closes: dict[str, list[int]] = defaultdict(list)
    dead: list[DeadLettered] = []

    for pos, e in enumerate(events):
        match e:
            case Published():
                attempts[e.value] += 1
                if e.confirmed:
                    confirmed.add(e.value)
                if e.poison:
                    poison.add(e.value)
            case Delivered():
                deliveries[e.offset].append((pos, e))
                latest[_key(e)] = pos
            case Settled():
                if _key(e) in latest:
                    settles[latest[_key(e)]].append(e)
                else:
                    unknown.append(e)
            case Killed():
                kills.append(pos)
            case ConsumerClosed():
                closes[e.consumer].append(pos)
            case DeadLettered():
                dead.append(e)

    def between(marks: list[int], a: int, b: int) -> bool:
        return any(a < m < b for m in marks)

    def confirmed_outcome(pos: int) -> SettleOutcome | None:
        for s in settles.get(pos, ()):
            if s.result == "confirmed":
                return s.outcome
        return None

    # What each value was delivered as, and which offsets hold it.
    offsets_of: dict[bytes, set[int]] = defaultdict(set)
    acked_values: set[bytes] = set()
    for offset, ds in sorted(deliveries.items()):
        first = ds[0][1]
        for _, d in ds:
            if d.value != first.value:
                problems.append(
                    f"corrupt: offset {offset} delivered as {first.value!r} to {first.consumer} "
                    f"and as {d.value!r} to {d.consumer}"
                )
            if d.delivery_count < 1:
                problems.append(
                    f"delivery_count: offset {offset} delivered to {d.consumer} (tag {d.tag}) "
                    f"with delivery_count {d.delivery_count}"
                )
        if first.value not in attempts:
            problems.append(
                f"phantom: {first.value!r} delivered at offset {offset} was never published"
            )
        offsets_of[first.value].add(offset)
        for pos, _ in ds:
            if confirmed_outcome(pos) == "ack":
                acked_values.add(first.value)

    for value, offsets in sorted(offsets_of.items()):
        if attempts.get(value) == 1 and len(offsets) > 1:
            problems.append(
                f"stored twice: {value!r} published once, delivered at offsets {sorted(offsets)}"
            )

    # Redeliveries: each delivery after the first of an offset needs a reason.
    for offset, ds in sorted(deliveries.items()):
        acked_at: tuple[int, Delivered] | None = None
        for i, (pos, d) in enumerate(ds):
            if acked_at is not None:
                a = acked_at[1]
                problems.append(
                    f"redelivered after ack: offset {offset} delivered to {d.consumer} "
                    f"(tag {d.tag}, count {d.delivery_count}) after {a.consumer}'s ack of "
                    f"tag {a.tag} was confirmed"
                )
            elif i > 0:
                ppos, prev = ds[i - 1]
                _check_redelivery(
                    problems,
                    prev,
                    d,
                    outcome=confirmed_outcome(ppos),
                    lost=any(
                        s.result in ("connection-lost", "abandoned") for s in settles.get(ppos, ())
                    ),
                    killed=between(kills, ppos, pos),
                    closed=between(closes.get(prev.consumer, []), ppos, pos),
                    visibility_timeout_ms=visibility_timeout_ms,
                )
            if acked_at is None and confirmed_outcome(pos) == "ack":
                acked_at = (pos, d)

    # Settlements: of deliveries that were made, one delivery acked by one consumer.
    for s in unknown:
        problems.append(
            f"unknown delivery: {s.consumer} settled tag {s.tag} (offset {s.offset}) it was "
            "never handed"
        )
    ackers: dict[tuple[int, int], set[str]] = defaultdict(set)
    for ss in settles.values():
        for s in ss:
            if s.outcome == "ack" and s.result == "confirmed":
                ackers[(s.tag, s.offset)].add(s.consumer)
    for (tag, offset), who in sorted(ackers.items()):
        if len(who) > 1:
            problems.append(
                f"tag acked twice: tag {tag} (offset {offset}) acked with confirmation by "
                f"{', '.join(sorted(who))}"
            )

    # Every confirmed message handled: acked, or (poison) dead-lettered.
    dead_count: dict[bytes, int] = defaultdict(int)
    for dl in dead:
        dead_count[dl.value] += 1
        if dl.value not in attempts:
            problems.append(f"phantom: {dl.value!r} dead-lettered was never published")
        elif dl.value not in poison:
            problems.append(f"dead-lettered non-poison: {dl.value!r} ({dl.reason})")
        if dl.reason != dead_letter_reason:
            problems.append(
                f"dead-letter reason: {dl.value!r} dead-lettered for {dl.reason!r}, "
                f"expected {dead_letter_reason!r}"
            )
    for value in sorted(confirmed):
        if value in poison:
            if value in acked_values:
                problems.append(f"acked poison: {value!r} was acked, not dead-lettered")
            if dead_count.get(value, 0) == 0:
                problems.append(f"lost: poison {value!r} confirmed, never dead-lettered")
        elif value not in offsets_of:
            problems.append(f"lost: {value!r} confirmed, never delivered")
    # Every stored copy's last delivery settled it for good: acked (poison: rejected), with
    # the broker's answer or with the answer lost with its connection (then the broker may
    # have recorded it before it went: that copy is not delivered again, and cannot be
    # told from one lost after its ack was sent; this is what at-least-once allows).
    for offset, ds in sorted(deliveries.items()):
        pos, last = ds[-1]
        final: SettleOutcome = "dead-letter" if last.value in poison else "ack"
        ss = settles.get(pos, [])
        if any(s.outcome == final and s.result != "refused" for s in ss):
            continue
        how = (
            "nacked"
            if any(s.outcome == "requeue" and s.result == "confirmed" for s in ss)
            else f"{ss[-1].outcome} {ss[-1].result}"
            if ss
            else "not settled"
        )
        problems.append(
            f"lost: {last.value!r} at offset {offset}: its last delivery (to {last.consumer}, tag "
            f"{last.tag}) was {how}, and it was not delivered again"
        )
    # A reject whose answer was lost with a kill, and whose copy came again after it, may
    # have been dead-lettered before the kill: the dead letter is stored before the
    # settlement is recorded, so a kill between the two leaves both the dead letter and an
    # unsettled copy (dead-lettering is at-least-once across a crash). Each such reject
    # allows one more dead letter of its value, and nothing else does.
    unanswered_rejects: dict[bytes, int] = defaultdict(int)
    for ds in deliveries.values():
        for (pos, d), (later, _) in pairwise(ds):
            if between(kills, pos, later) and any(
                s.outcome == "dead-letter" and s.result in ("connection-lost", "abandoned")
                for s in settles.get(pos, ())
            ):
                unanswered_rejects[d.value] += 1
    expected_dead = 0
    unanswered_dead = 0
    for value in sorted(poison):
        copies = len(offsets_of.get(value, ())) or (1 if value in confirmed else 0)
        expected_dead += copies
        got = dead_count.get(value, 0)
        extra = min(max(got - copies, 0), unanswered_rejects.get(value, 0))
        unanswered_dead += extra
        if got > max(copies, 1) + unanswered_rejects.get(value, 0):
            problems.append(
                f"dead-lettered {got} times: {value!r} (stored {max(copies, 1)} time(s), "
                f"{unanswered_rejects.get(value, 0)} reject(s) unanswered before a kill)"
            )
    if len(dead) - unanswered_dead != expected_dead:
        problems.append(
            f"dead-letter count: {len(poison)} poison message(s) planted "
            f"({expected_dead} stored cop(ies) seen), {len(dead)} dead-lettered"
        )
    return problems


def _check_redelivery(
    problems: list[str],
    prev: Delivered,
    d: Delivered,
    *,
    outcome: SettleOutcome | None,
    lost: bool,
    killed: bool,
    closed: bool,
    visibility_timeout_ms: float,
) -> None:
    """Whether ``d`` may follow ``prev`` (the offset's delivery before it, not acked)."""
    where = (
        f"offset {d.offset} delivered to {d.consumer} (tag {d.tag}, count {d.delivery_count}) "
        f"after {prev.consumer} (tag {prev.tag}, count {prev.delivery_count})"
    )
    if outcome == "dead-letter":
        problems.append(f"redelivered after dead-lettering: {where} rejected it, confirmed")
    elif outcome == "requeue":
        if not killed and d.delivery_count <= prev.delivery_count:
            problems.append(f"delivery_count: {where} nacked it, and the count did not grow")
    elif not (
        killed
        or closed
        or lost
        or (visibility_timeout_ms > 0 and d.at_ms - prev.at_ms >= visibility_timeout_ms)
    ):
        problems.append(
            f"redelivered while held: {where} held it (no kill, close, nack or timeout between)"
        )
