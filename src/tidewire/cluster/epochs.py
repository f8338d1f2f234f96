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

import bisect
from collections.abc import Iterable, Iterator

__all__ = ["UNDEFINED", "EpochHistory", "truncation_point"]

#: Kafka's answer when the asked epoch is older than any the history holds.
UNDEFINED = (-1, -1)


class EpochHistory:
    """``(epoch, start offset)`` pairs, epochs and offsets both increasing."""

    def __init__(self, entries: Iterable[tuple[int, int]] = ()) -> None:
        self._epochs: list[int] = []
        self._starts: list[int] = []
        for epoch, start in entries:
            self.assign(epoch, start)

    @classmethod
    def from_batches(cls, batches: Iterable[tuple[int, int]]) -> EpochHistory:
        """From the log's ``(base offset, partition leader epoch)`` of each batch, in offset
        order; batches with no epoch (-1, written by a single node) are skipped."""
        h = cls()
        for base, epoch in batches:
            if epoch >= 0:
                h.assign(epoch, base)
        return h

    def __iter__(self) -> Iterator[tuple[int, int]]:
        return iter(zip(self._epochs, self._starts, strict=True))

    def __len__(self) -> int:
        return len(self._epochs)

    def __repr__(self) -> str:
        return f"EpochHistory({list(self)})"

    @property
    def latest(self) -> int:
        """The latest epoch, -1 when none."""
        return self._epochs[-1] if self._epochs else -1

    def assign(self, epoch: int, start: int) -> None:
        """Epoch ``epoch`` wrote from offset ``start`` on (a batch of a new epoch was appended).
        The same epoch again changes nothing.

        Raises:
            ValueError: an epoch below the latest, or a start offset below the latest's.
        """
        if self._epochs and epoch == self._epochs[-1]:
            return
        if self._epochs and epoch < self._epochs[-1]:
            raise ValueError(f"epoch {epoch} after epoch {self._epochs[-1]}: epochs only go up")
        if self._starts and start < self._starts[-1]:
            raise ValueError(
                f"epoch {epoch} starting at {start}, before epoch {self._epochs[-1]}'s start "
                f"{self._starts[-1]}"
            )
        self._epochs.append(epoch)
        self._starts.append(start)

    def end_offset(self, epoch: int, log_end: int) -> tuple[int, int]:
        """The largest epoch at or below ``epoch`` and the first offset after its records
        (``log_end`` for the latest epoch); :data:`UNDEFINED` when ``epoch`` is older than
        every epoch held."""
        if not self._epochs or epoch < self._epochs[0]:
            return UNDEFINED
        i = bisect.bisect_right(self._epochs, epoch) - 1
        if i == len(self._epochs) - 1:
            return self._epochs[i], log_end
        return self._epochs[i], self._starts[i + 1]

    def truncate_to(self, offset: int) -> None:
        """The log was cut to end at ``offset``: epochs that started at or after it go."""
        i = bisect.bisect_left(self._starts, offset)
        del self._epochs[i:]
        del self._starts[i:]

    def truncate_before(self, offset: int) -> None:
        """The log now starts at ``offset`` (retention): the epoch holding it starts there."""
        i = bisect.bisect_right(self._starts, offset) - 1
        if i > 0:
            del self._epochs[:i]
            del self._starts[:i]
        if self._starts and self._starts[0] < offset:
            self._starts[0] = offset


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
