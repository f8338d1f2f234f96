"""A partition's leader-epoch history: which epoch wrote which offsets (Kafka's KIP-101 and
KIP-279).

Every record batch carries the epoch of the leader that appended it
(``partition_leader_epoch``); the history is the first offset of each epoch, rebuilt from the
batches' headers (:meth:`EpochHistory.from_batches`,
:meth:`tidewire.storage.log.PartitionLog.epoch_history`), so it is as durable as the log
itself and needs no store of its own. It lives in ``storage/`` because the log keeps it
current on append and truncation; ``tidewire.cluster.epochs`` re-exports it together with the
follower's truncation rule. Pure: no I/O.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Iterator

__all__ = ["UNDEFINED", "EpochHistory"]

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
