"""A partition's leader-epoch history: which epoch wrote which offsets (Kafka's KIP-101 and
KIP-279), so a replica that rejoins truncates exactly its divergent tail, never what the
leader of a later epoch also holds.

Every record batch carries the epoch of the leader that appended it
(``partition_leader_epoch``); the history is the first offset of each epoch, rebuilt from the
batches (:meth:`EpochHistory.from_batches`), so it is as durable as the log itself and needs no
store of its own.

A follower asks the leader for the end of its own latest epoch; the leader answers with
:meth:`EpochHistory.end_offset` (the largest epoch it has at or below the one asked and the
first offset after it); the follower truncates to the smaller of that end and its own log end,
then fetches from there. That is the rule that keeps an acknowledged record from being
overwritten by a replica that had it only in an epoch the leader never saw, and a former leader
from keeping records no later leader has.
"""

from __future__ import annotations

from tidewire.storage.epochs import UNDEFINED, EpochHistory

__all__ = ["UNDEFINED", "EpochHistory", "truncation_point"]


def truncation_point(
    follower: EpochHistory, follower_end: int, leader_answer: tuple[int, int]
) -> int:
    """Where a follower cuts its log, given the leader's :meth:`EpochHistory.end_offset` for
    the follower's latest epoch: at the leader's end of that epoch when the follower has more
    of it, or at the follower's own end of the epoch the leader answered with when that is an
    older one (the leader never had the follower's latest epoch)."""
    epoch, end = leader_answer
    if (epoch, end) == UNDEFINED:
        return 0 if len(follower) else follower_end
    # The follower's own end of the epoch the leader answered with (for the follower's latest
    # epoch: its log end), cut at the leader's end of it.
    own_epoch, own_end = follower.end_offset(epoch, follower_end)
    return min(own_end, end) if own_epoch >= 0 else 0
