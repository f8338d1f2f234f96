"""A checker of lightweight-stream histories: persistent sends and their outcome, work-queue
takes (and take requests whose answer was lost), fan-out reads by resume token, and where
the broker was killed. Its own tests are in test_stream_history.py.

The history is one ordered list of events, recorded in the order they happened (one event
loop records them all). A message is its value (unique per send); its sender retries it
with the same uuid until the broker answers (``stored`` or ``duplicate``: an earlier
attempt was stored) or gives up (``unknown``: it may or may not be stored). Each stream has
one sender that sends its values one after the other, so the values a stream stores are in
send order, and so are its positions.

A stored copy is identified by its stream and the token it was returned with (the
position after it): work-queue takes and fan-out reads of the same copy carry the same
token, so a value at two tokens was stored twice.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

from tidewire.broker.streams.model import decode_token
from tidewire.errors import InvalidStreamError

__all__ = [
    "Event",
    "Killed",
    "Read",
    "SendOutcome",
    "Sent",
    "TakeLost",
    "Taken",
    "check_stream_history",
]

#: How a send ended: the broker stored it (``stored``) or answered that its uuid had been
#: stored before (``duplicate``), or the sender gave up without an answer (``unknown``).
SendOutcome = Literal["stored", "duplicate", "unknown"]


@dataclass(frozen=True, slots=True)
class Sent:
    """The final outcome of one value sent (after its retries)."""

    stream: str
    value: bytes
    outcome: SendOutcome


@dataclass(frozen=True, slots=True)
class Taken:
    """A work-queue receive returned this message to ``receiver``."""

    receiver: str
    stream: str
    value: bytes
    token: str


@dataclass(frozen=True, slots=True)
class TakeLost:
    """A work-queue receive of ``streams`` (up to ``max_messages``) ended without an answer
    (its connection went with a kill, or it found no broker): the broker may have taken up
    to ``max_messages`` of their messages for it (a take is at most once). A receiver has
    one receive under way at a time."""

    receiver: str
    streams: tuple[str, ...]
    max_messages: int


@dataclass(frozen=True, slots=True)
class Read:
    """A fan-out read by ``reader`` returned this message (the reader's token for the
    stream moves to ``token``)."""

    reader: str
    stream: str
    value: bytes
    token: str


@dataclass(frozen=True, slots=True)
class Killed:
    """The broker is about to be killed (recorded before the signal)."""

    number: int


Event = Sent | Taken | TakeLost | Read | Killed


def _pos(stream: str, token: str) -> int:
    return decode_token(stream, token)


def check_stream_history(events: Iterable[Event], *, readers_complete: bool = True) -> list[str]:
    """The problems of one stream history (empty: none).

    Args:
        events: the history, in the order it happened (see the module docstring).
        readers_complete: each reader read its streams to the end (after the last restart):
            it must then have seen every acknowledged message of them.

    Returns:
        One line per problem:

        - ``phantom``: a value taken or read that nobody sent (or under another stream);
        - ``sent twice``: one value with two ``Sent`` events (the test's own bug);
        - ``taken twice``: a value returned by two work-queue receives;
        - ``stored twice``: a value at two positions (taken or read with two tokens);
        - ``take order``: one receiver's takes of a stream not in position order (the takes
          of several receivers may be answered in another order than the broker made them:
          each answer waits for its take record to be durable);
        - ``lost``: an acknowledged value never taken, beyond what the take requests lost
          with a kill can explain (each may have taken up to its ``max_messages``, of its
          own streams only; one per receiver between two kills: a receiver has one request
          under way at a time, and its retries until the broker is back reach no broker);
          or (``readers_complete``) one a reader of its stream never read;
        - ``read twice``: a reader got one value twice;
        - ``read order``: a reader's values of a stream not in send order, or its tokens not
          growing;
        - ``bad token``: a token that does not decode for its stream.
    """
    problems: list[str] = []
    sent: dict[bytes, Sent] = {}
    order: dict[str, list[bytes]] = defaultdict(list)  # stream -> values in send order
    takes: dict[bytes, list[Taken]] = defaultdict(list)
    takes_of: dict[tuple[str, str], list[Taken]] = defaultdict(list)  # (receiver, stream)
    lost_takes: list[TakeLost] = []
    reads: dict[tuple[str, str], list[Read]] = defaultdict(list)  # (reader, stream)
    tokens_of: dict[bytes, set[str]] = defaultdict(set)
    kills = 0
    cut: set[tuple[str, int]] = set()

    for e in events:
        match e:
            case Sent():
                if e.value in sent:
                    problems.append(f"sent twice: {e.value!r} has two Sent events")
                sent[e.value] = e
                order[e.stream].append(e.value)
            case Taken():
                takes[e.value].append(e)
                takes_of[(e.receiver, e.stream)].append(e)
                tokens_of[e.value].add(e.token)
            case TakeLost():
                # One request per receiver can be cut by a kill (each receiver has one under
                # way at a time); its retries before the next kill found no broker or were
                # answered.
                if (e.receiver, kills) not in cut:
                    cut.add((e.receiver, kills))
                    lost_takes.append(e)
            case Read():
                reads[(e.reader, e.stream)].append(e)
                tokens_of[e.value].add(e.token)
            case Killed():
                kills += 1

    def known(stream: str, value: bytes, what: str) -> bool:
        s = sent.get(value)
        if s is None:
            problems.append(f"phantom: {value!r} {what} from {stream!r} was never sent")
            return False
        if s.stream != stream:
            problems.append(f"phantom: {value!r} {what} from {stream!r}, sent to {s.stream!r}")
            return False
        return True

    positions: dict[tuple[str, str], int] = {}

    def pos(stream: str, token: str) -> int | None:
        if (stream, token) not in positions:
            try:
                positions[(stream, token)] = _pos(stream, token)
            except InvalidStreamError as exc:
                problems.append(f"bad token: {token!r} of {stream!r}: {exc}")
                positions[(stream, token)] = -1
        p = positions[(stream, token)]
        return None if p < 0 else p

    acked = {v for v, s in sent.items() if s.outcome != "unknown"}

    # Work-queue takes: each value once, in position order per stream.
    for value, ts in sorted(takes.items()):
        if not known(ts[0].stream, value, "taken"):
            continue
        if len(ts) > 1:
            who = ", ".join(f"{t.receiver} (token {t.token})" for t in ts)
            problems.append(f"taken twice: {value!r} of {ts[0].stream!r} by {who}")
    for value, toks in sorted(tokens_of.items()):
        if len(toks) > 1 and value in sent:
            problems.append(
                f"stored twice: {value!r} of {sent[value].stream!r} at tokens {sorted(toks)}"
            )
    for (receiver, stream), ts in sorted(takes_of.items()):
        last: tuple[int, bytes] | None = None
        for t in ts:
            p = pos(stream, t.token)
            if p is None:
                continue
            if last is not None and p <= last[0] and t.value != last[1]:
                problems.append(
                    f"take order: {receiver} took {t.value!r} of {stream!r} (position {p}) "
                    f"after {last[1]!r} (position {last[0]})"
                )
            last = (p, t.value)

    # Acknowledged values never taken: only as many as the lost take requests can explain.
    untaken: dict[str, list[bytes]] = defaultdict(list)
    for value in sorted(acked):
        if value not in takes:
            untaken[sent[value].stream].append(value)
    if untaken:
        budget = sum(t.max_messages for t in lost_takes)
        covered = {s for t in lost_takes for s in t.streams}
        count = sum(len(vs) for vs in untaken.values())
        for stream, values in sorted(untaken.items()):
            if stream not in covered:
                problems.append(
                    f"lost: {len(values)} acknowledged message(s) of {stream!r} never taken, "
                    f"and no take request of it was lost with a kill: {values[:5]}"
                )
        if count > budget:
            problems.append(
                f"lost: {count} acknowledged messages never taken, but the {len(lost_takes)} "
                f"take requests lost with kills could have taken at most {budget}: "
                f"{[v for vs in untaken.values() for v in vs][:10]}"
            )

    # Fan-out readers: each value of the stream once, in send order, growing tokens; all of
    # the acknowledged ones when the reader read to the end.
    for (reader, stream), rs in sorted(reads.items()):
        seen: set[bytes] = set()
        last_pos = -1
        last_index = -1
        index = {v: i for i, v in enumerate(order.get(stream, []))}
        for r in rs:
            if not known(stream, r.value, f"read by {reader}"):
                continue
            if r.value in seen:
                problems.append(f"read twice: {reader} read {r.value!r} of {stream!r} twice")
                continue
            seen.add(r.value)
            p = pos(stream, r.token)
            if p is not None:
                if p <= last_pos:
                    problems.append(
                        f"read order: {reader}'s token for {stream!r} went from position "
                        f"{last_pos} to {p} at {r.value!r}"
                    )
                last_pos = p
            i = index[r.value]
            if i < last_index:
                problems.append(
                    f"read order: {reader} read {r.value!r} of {stream!r} after a value sent later"
                )
            last_index = i
        if readers_complete:
            missed = [v for v in order.get(stream, []) if v in acked and v not in seen]
            if missed:
                problems.append(
                    f"lost: {reader} never read {len(missed)} acknowledged message(s) of "
                    f"{stream!r}: {missed[:5]}"
                )
    return problems
