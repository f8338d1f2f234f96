"""Partition assignment strategies of consumer groups: range, round-robin and sticky (pure
functions, no I/O).

Each strategy takes the members (id -> the topics each subscribes to), the partition count
of every topic and, for sticky, the previous assignment, and returns member id -> the sorted
list of ``(topic, partition)`` it owns. Every partition of a subscribed topic goes to exactly
one member subscribed to that topic; a member may get none. Members are taken in sorted id
order, so the same input always gives the same output.

- **range**: per topic, the members subscribed to it split its partitions into contiguous
  ranges; the first ``n % m`` members (by id) get one more.
- **round-robin**: every subscribed partition, sorted by topic and number, dealt to the
  members in turn (skipping a member not subscribed to that topic).
- **sticky** (the default): each member keeps the partitions it owned in the previous
  generation that it may still own; the partitions left over go to the least loaded member
  that subscribes to their topic; then, while one member owns at least two more partitions
  than another that could take one of them, one moves over. When every member subscribes to
  the same topics this moves the fewest partitions that any balanced assignment (owned counts
  differing by at most one) must move.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence

__all__ = ["Assignment", "Strategy", "TopicPartition", "assign"]

TopicPartition = tuple[str, int]
#: member id -> the partitions it owns, sorted.
Assignment = dict[str, list[TopicPartition]]


class Strategy(enum.StrEnum):
    """The assignment strategies the coordinator computes."""

    RANGE = "range"
    ROUND_ROBIN = "roundrobin"
    STICKY = "sticky"


def assign(
    strategy: Strategy,
    subscriptions: Mapping[str, Sequence[str]],
    partitions: Mapping[str, int],
    previous: Mapping[str, Sequence[TopicPartition]] | None = None,
) -> Assignment:
    """Assign the partitions of the subscribed topics to the members.

    Args:
        strategy: which algorithm.
        subscriptions: member id -> the topics it subscribes to (topics missing from
            ``partitions`` are ignored: they do not exist).
        partitions: topic -> its partition count.
        previous: member id -> what it owned in the previous generation (sticky only).

    Returns:
        member id -> its partitions, sorted; every member of ``subscriptions`` is a key.
    """
    subs = {
        m: sorted({t for t in topics if partitions.get(t, 0) > 0})
        for m, topics in subscriptions.items()
    }
    if strategy is Strategy.RANGE:
        out = _range(subs, partitions)
    elif strategy is Strategy.ROUND_ROBIN:
        out = _round_robin(subs, partitions)
    else:
        out = _sticky(subs, partitions, previous or {})
    return {m: sorted(out.get(m, [])) for m in sorted(subs)}


def _range(subs: Mapping[str, list[str]], partitions: Mapping[str, int]) -> Assignment:
    out: Assignment = {m: [] for m in subs}
    for topic in sorted({t for ts in subs.values() for t in ts}):
        members = sorted(m for m, ts in subs.items() if topic in ts)
        n, k = partitions[topic], len(members)
        base, extra = divmod(n, k)
        start = 0
        for i, m in enumerate(members):
            count = base + (1 if i < extra else 0)
            out[m].extend((topic, p) for p in range(start, start + count))
            start += count
    return out


def _round_robin(subs: Mapping[str, list[str]], partitions: Mapping[str, int]) -> Assignment:
    out: Assignment = {m: [] for m in subs}
    members = sorted(subs)
    if not members:
        return out
    turn = 0
    for topic in sorted({t for ts in subs.values() for t in ts}):
        for p in range(partitions[topic]):
            # The next member in turn that subscribes to this topic (one always does).
            while topic not in subs[members[turn % len(members)]]:
                turn += 1
            out[members[turn % len(members)]].append((topic, p))
            turn += 1
    return out


def _sticky(
    subs: Mapping[str, list[str]],
    partitions: Mapping[str, int],
    previous: Mapping[str, Sequence[TopicPartition]],
) -> Assignment:
    members = sorted(subs)
    if members and len({frozenset(ts) for ts in subs.values()}) == 1:
        return _sticky_same(members, sorted(set(subs[members[0]])), partitions, previous)
    out: dict[str, set[TopicPartition]] = {m: set() for m in members}
    owned: set[TopicPartition] = set()
    # 1. Keep what each member owned and may still own (a partition claimed twice in the
    # previous input goes to the first member by id).
    for m in members:
        for tp in sorted(previous.get(m, ())):
            topic, p = tp
            if topic in subs[m] and 0 <= p < partitions.get(topic, 0) and tp not in owned:
                out[m].add(tp)
                owned.add(tp)
    # 2. The rest, one at a time, to the least loaded member that may take it.
    eligible = {
        t: [m for m in members if t in subs[m]] for t in {t for ts in subs.values() for t in ts}
    }
    for topic in sorted(eligible):
        for p in range(partitions[topic]):
            if (topic, p) in owned:
                continue
            m = min(eligible[topic], key=lambda x: (len(out[x]), x))
            out[m].add((topic, p))
            owned.add((topic, p))
    # 3. Balance: move one partition at a time from the most loaded member to the least loaded
    # one that may take it, while they differ by two or more. Each move lowers the sum of
    # squared loads, so this ends.
    while True:
        move = _one_move(members, subs, out)
        if move is None:
            break
        src, dst, tp = move
        out[src].discard(tp)
        out[dst].add(tp)
    return {m: sorted(tps) for m, tps in out.items()}


def _one_move(
    members: list[str], subs: Mapping[str, list[str]], out: Mapping[str, set[TopicPartition]]
) -> tuple[str, str, TopicPartition] | None:
    """A partition that the most loaded member able to give one can hand to the least loaded
    member able to take it, when their loads differ by two or more; None when balanced."""
    by_load = sorted(members, key=lambda x: (len(out[x]), x))
    for src in reversed(by_load):
        for dst in by_load:
            if len(out[dst]) + 1 >= len(out[src]):
                break  # nobody less loaded can take one from src
            topics = subs[dst]
            for tp in sorted(out[src]):
                if tp[0] in topics:
                    return src, dst, tp
    return None


def _sticky_same(
    members: list[str],
    topics: list[str],
    partitions: Mapping[str, int],
    previous: Mapping[str, Sequence[TopicPartition]],
) -> Assignment:
    """Sticky when every member has the same subscription (the common case), in O(P log P):
    each member's share is P // N or one more, the larger shares going to the members that
    owned the most; each keeps as much of what it owned as its share allows (so no fewer
    partitions move than must), and the rest fill the members below their share."""
    every = [(t, p) for t in topics for p in range(partitions.get(t, 0))]
    valid = set(every)
    kept: dict[str, list[TopicPartition]] = {m: [] for m in members}
    owned: set[TopicPartition] = set()
    for m in members:
        for tp in sorted(previous.get(m, ())):
            if tp in valid and tp not in owned:
                kept[m].append(tp)
                owned.add(tp)
    low, extra = divmod(len(every), len(members))
    order = sorted(members, key=lambda m: (-len(kept[m]), m))
    share = {m: low + (i < extra) for i, m in enumerate(order)}
    out = {m: kept[m][: share[m]] for m in members}
    taken = {tp for tps in out.values() for tp in tps}
    free = iter(tp for tp in every if tp not in taken)
    for m in members:
        out[m].extend(next(free) for _ in range(share[m] - len(out[m])))
    return {m: sorted(tps) for m, tps in out.items()}
