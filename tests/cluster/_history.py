"""The checker of a replicated workload's history: tests/server/_history.py's checks (nothing
acknowledged lost, nothing duplicated, no phantom, no hole, each producer's order) over what
the partition's leader holds at the end, plus Jepsen's Kafka workload checks and two of the
cluster's own:

- **one value per offset**: every poll and every replica that has an offset has the same value
  there (Jepsen's ``inconsistent-offsets``);
- **replicas agree below the high watermark**: each replica in the final in-sync set holds every
  offset below the high watermark, with the leader's value (after healing, the same offset holds
  the same record on every replica);
- **no acknowledged send left unread** at or below the highest offset any consumer polled
  (Jepsen's ``unseen`` / ``lost-write``): a consumer that read past it should have seen it;
- **monotonic polls**: each consumer's offsets in a partition only go up, unless it was told to
  seek (``Seek``) or restarted (a new consumer name);
- **one leader per epoch**: no two nodes led a partition in the same leader epoch;
- **no committed offset above the high watermark**.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from tests.server._history import Ack, check_history

__all__ = [
    "Ack",
    "Committed",
    "LeaderSeen",
    "Poll",
    "Seek",
    "check_cluster_history",
]


@dataclass(frozen=True, slots=True)
class Poll:
    """What one poll of ``consumer`` returned from ``partition``, in order."""

    consumer: str
    partition: int
    records: tuple[tuple[int, bytes], ...]


@dataclass(frozen=True, slots=True)
class Seek:
    """``consumer`` moved its position in ``partition`` (its next poll may go back)."""

    consumer: str
    partition: int


@dataclass(frozen=True, slots=True)
class LeaderSeen:
    """``node`` acted as the leader of ``partition`` in ``epoch`` (it answered a produce or a
    fetch as leader, or the metadata said so)."""

    partition: int
    epoch: int
    node: int


@dataclass(frozen=True, slots=True)
class Committed:
    """A group's committed offset of ``partition``, as the broker answered it."""

    group: str
    partition: int
    offset: int


def check_cluster_history(
    *,
    sent: Iterable[bytes],
    acks: Iterable[Ack],
    events: Sequence[Poll | Seek | LeaderSeen | Committed],
    replicas: Mapping[int, Mapping[int, Sequence[tuple[int, bytes]]]],
    leaders: Mapping[int, int],
    isr: Mapping[int, Sequence[int]],
    high_watermarks: Mapping[int, int],
    orders: Iterable[Sequence[bytes]] = (),
) -> list[str]:
    """The problems of one history (empty: none).

    Args:
        sent, acks, orders: as :func:`tests.server._history.check_history`.
        events: polls, seeks, leaders seen and commits, in the order they happened.
        replicas: node -> partition -> every ``(offset, value)`` of its log from offset 0, read
            at the end (after healing, everything caught up).
        leaders: partition -> its leader's node at the end.
        isr: partition -> the in-sync replicas at the end.
        high_watermarks: partition -> its high watermark at the end.
    """
    acks = list(acks)
    problems = check_history(
        sent,
        acks,
        {p: list(replicas[node].get(p, ())) for p, node in leaders.items()},
        orders,
    )
    # One value per offset, over every poll and every replica.
    value_at: dict[tuple[int, int], tuple[bytes, str]] = {}

    def saw(p: int, offset: int, value: bytes, where: str) -> None:
        first = value_at.setdefault((p, offset), (value, where))
        if first[0] != value:
            problems.append(
                f"inconsistent offset {p}/{offset}: {first[0]!r} ({first[1]}) and {value!r} "
                f"({where})"
            )

    for node, parts in sorted(replicas.items()):
        for p, records in sorted(parts.items()):
            for offset, value in records:
                saw(p, offset, value, f"replica on node {node}")
    for e in events:
        if isinstance(e, Poll):
            for offset, value in e.records:
                saw(e.partition, offset, value, f"polled by {e.consumer}")
    # Replicas of the final ISR hold everything below the high watermark.
    for p, hw in sorted(high_watermarks.items()):
        for node in isr.get(p, ()):
            have = {o for o, _ in replicas.get(node, {}).get(p, ())}
            missing = [o for o in range(hw) if o not in have]
            if missing:
                problems.append(
                    f"node {node}, in sync for partition {p}, lacks {len(missing)} offsets below "
                    f"the high watermark {hw} (first {missing[0]})"
                )
    # Nothing acknowledged left unread at or below the highest offset polled.
    polled: dict[int, set[int]] = defaultdict(set)
    for e in events:
        if isinstance(e, Poll):
            polled[e.partition].update(o for o, _ in e.records)
    for a in acks:
        top = max(polled.get(a.partition, ()), default=-1)
        for i, value in enumerate(a.values):
            offset = a.base_offset + i
            if offset <= top and offset not in polled[a.partition]:
                problems.append(
                    f"unseen: {value!r}, acknowledged at {a.partition}/{offset}, never polled "
                    f"although polls reached offset {top}"
                )
    # Each consumer's polls go forward.
    position: dict[tuple[str, int], int] = {}
    for e in events:
        if isinstance(e, Seek):
            position.pop((e.consumer, e.partition), None)
        elif isinstance(e, Poll):
            key = (e.consumer, e.partition)
            for offset, _ in e.records:
                last = position.get(key)
                if last is not None and offset <= last:
                    problems.append(
                        f"non-monotonic poll: {e.consumer} read {e.partition}/{offset} after "
                        f"{e.partition}/{last}"
                    )
                position[key] = offset
    # One leader per epoch.
    led: dict[tuple[int, int], int] = {}
    for e in events:
        if isinstance(e, LeaderSeen):
            other = led.setdefault((e.partition, e.epoch), e.node)
            if other != e.node:
                problems.append(
                    f"two leaders of partition {e.partition} in epoch {e.epoch}: nodes "
                    f"{other} and {e.node}"
                )
    # No committed offset above the high watermark.
    for e in events:
        if isinstance(e, Committed):
            top = high_watermarks.get(e.partition)
            if top is not None and e.offset > top:
                problems.append(
                    f"group {e.group} committed {e.partition}/{e.offset}, above the high "
                    f"watermark {top}"
                )
    return problems
