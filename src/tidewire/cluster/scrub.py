"""Background scrub: a cluster node CRC-checks the sealed segments of the partitions it
leads or follows at a bounded rate, so that damage in a range nobody reads is found.

Why: every batch is checked when it is read, and a follower checks once per process what its
log held when it began following (:meth:`~tidewire.cluster.replication.ReplicaManager.
check_replica`). But sealed segments found intact at a start are trusted unread, so a bit
flipped later in a segment no consumer reads stays unnoticed on a leader, and on a follower
after its first check, until the day a reader needs it and no intact copy is left. The scrub
reads them all again, pass after pass, as a storage system's scrub or a Kafka operator's
periodic ``kafka-dump-log --deep-iteration`` would.

What a found range leads to is what the read path does already: the read records the range
(``damage.json``, never served); a leader with another in-sync replica hands the partition
over and copies the range again as a follower (:meth:`ReplicaManager.damage_found`); alone in
its ISR it keeps leading with the range unserved; a follower cuts its log there before its
next fetch and copies the rest again from its leader.

Cost and bounds: one :meth:`~tidewire.storage.log.PartitionLog.read` of at most
:data:`SCRUB_CHUNK_BYTES` at a time on the event loop (which owns the logs; the same read a
consumer's fetch makes), then a sleep that keeps the average at ``bytes_per_s`` (the
``--scrub-bytes-per-s`` setting; 0: no scrub), and never less than :data:`MIN_STEP_S`
between reads. The active segment is left out (it is being written, and read by consumers
that follow the tail). After a pass over every partition the scrub rests ``pause_s`` before
the next one, so a node with little data does not read it again and again.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from typing import TYPE_CHECKING

from tidewire.errors import OffsetOutOfRangeError, PartitionCorruptError, TidewireError

if TYPE_CHECKING:
    from tidewire.cluster.metrics import ClusterStats
    from tidewire.cluster.replication import ReplicaManager
    from tidewire.storage import PartitionLog

__all__ = [
    "DEFAULT_SCRUB_BYTES_PER_S",
    "MAX_SKIPS",
    "MIN_STEP_S",
    "PASS_PAUSE_S",
    "SCRUB_CHUNK_BYTES",
    "Scrubber",
]

log = logging.getLogger(__name__)

#: The default rate (bytes/s): 1 MiB/s reads 86 GiB a day, a small share of a disk's
#: bandwidth and of one core's CRC-32C (several GB/s), so the scrub stays out of the way.
DEFAULT_SCRUB_BYTES_PER_S = 1024 * 1024
#: The most one read asks for: bounds the event loop's time in one read (a cold 128 KiB read
#: is a few milliseconds on a disk, well under one on an SSD).
SCRUB_CHUNK_BYTES = 128 * 1024
#: The least time between two reads, whatever they brought: small segments do not turn the
#: scrub into a busy loop.
MIN_STEP_S = 0.02
#: The rest between two passes over every partition held (seconds).
PASS_PAUSE_S = 60.0
#: Partitions with nothing (more) to check passed over in one step at most: a node with
#: thousands of partitions of small logs goes through them without a sleep each, and without
#: holding the event loop long.
MAX_SKIPS = 1000

Key = tuple[str, int]


class Scrubber:
    """Reads the sealed segments of the partitions ``replicas`` leads or follows, CRC-checking
    every batch, at ``bytes_per_s`` on average.

    Args:
        replicas: the node's replica manager (the partitions held, and where to report damage).
        bytes_per_s: the average rate; 0 or less: :meth:`start` does nothing.
        stats: the node's cluster figures: ``scrub_bytes`` and ``scrub_damage`` are counted
            there (``tidewire_cluster_scrub_bytes``, ``tidewire_cluster_scrub_damage_found``).
        pause_s: the rest between passes (None: :data:`PASS_PAUSE_S`).

    Attributes:
        passes: complete passes over every partition held.
        bytes_scrubbed: bytes CRC-checked.
        damage_found: damaged ranges the scrub found (new ones: not known before its read).
    """

    def __init__(
        self,
        replicas: ReplicaManager,
        bytes_per_s: int,
        *,
        stats: ClusterStats | None = None,
        pause_s: float | None = None,
    ) -> None:
        self.replicas = replicas
        self.bytes_per_s = bytes_per_s
        self.stats = stats
        self.pause_s = PASS_PAUSE_S if pause_s is None else pause_s
        self.passes = 0
        self.bytes_scrubbed = 0
        self.damage_found = 0
        #: where each partition's scrub stands in this pass: (the log it is for, next offset)
        self._at: dict[Key, tuple[PartitionLog, int]] = {}
        #: the partitions of this pass still to finish, in order (None: no pass begun)
        self._queue: deque[Key] | None = None
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        """Start scrubbing in the background (nothing when the rate is 0)."""
        if self.bytes_per_s <= 0 or self._task is not None:
            return
        self._task = asyncio.get_running_loop().create_task(self._run(), name="replica-scrub")
        self._task.add_done_callback(_log_failure)

    async def close(self) -> None:
        """Stop scrubbing. Closing twice is harmless."""
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            started = loop.time()
            read = self.step()
            if read < 0:  # a pass is complete (or there is nothing to scrub)
                self.passes += 1
                self._at.clear()
                await asyncio.sleep(self.pause_s)
                continue
            # The rate counts from the read's start: its own time is part of the budget.
            wait = read / self.bytes_per_s - (loop.time() - started)
            await asyncio.sleep(max(wait, MIN_STEP_S))

    def held(self) -> list[Key]:
        """The partitions scrubbed: those this node leads or follows now, in order."""
        keys = set(self.replicas.led_states()) | set(self.replicas.followed_high_watermarks())
        return sorted(keys)

    def step(self) -> int:
        """Check the next chunk of the pass: of the first partition not finished in it
        (partitions with nothing sealed left are passed over, :data:`MAX_SKIPS` at most).

        Returns:
            The bytes read, or -1 when the pass is complete: every partition held when it
            began is finished (or no longer held).
        """
        if self._queue is None:
            self._queue = deque(self.held())
        queue = self._queue
        for _ in range(MAX_SKIPS):
            if not queue:
                self._queue = None
                return -1
            key = queue[0]
            read, finished = self._check(key)
            if finished:
                queue.popleft()
                self._at.pop(key, None)
            if read or not finished:
                return read
        return 0

    def _check(self, key: Key) -> tuple[int, bool]:
        """Read the next chunk of ``key``'s sealed segments: ``(bytes read, whether the
        partition is finished in this pass)``."""
        rep = self.replicas
        if not rep.leads(*key) and rep.following(key) is None:
            return 0, True  # no longer held here
        try:
            plog = rep.broker.log(*key)
        except TidewireError:
            return 0, True
        at_of = self._at.get(key)
        at = plog.log_start_offset if at_of is None or at_of[0] is not plog else at_of[1]
        at = max(at, plog.log_start_offset)
        sealed_end = plog.active_segment_base
        if at >= sealed_end:
            return 0, True
        found_before = plog.damage_found
        read = 0
        try:
            r = plog.read(at, SCRUB_CHUNK_BYTES, max_offset=sealed_end)
        except PartitionCorruptError as exc:
            # The read recorded the range (if it was not known): never served from now on.
            nxt = exc.damage_end if exc.damage_end > at else sealed_end
        except OffsetOutOfRangeError:  # retention or a truncation moved the log meanwhile
            nxt = plog.log_start_offset
        except TidewireError as exc:  # the read failed (StorageError): next pass
            log.warning("scrub of %s/%d stopped at offset %d: %s", *key, at, exc)
            nxt = sealed_end
        else:
            read = len(r.data)
            nxt = r.next_offset if r.data and r.next_offset > at else sealed_end
        self.bytes_scrubbed += read
        new = max(plog.damage_found - found_before, 0)
        if self.stats is not None:
            self.stats.scrub_bytes += read
            self.stats.scrub_damage += new
        if new:
            self.damage_found += new
            log.warning(
                "scrub: partition %s/%d has a damaged range at or after offset %d that no "
                "read had found; it is not served, and is copied again from an in-sync replica",
                *key,
                at,
            )
            rep.damage_found(*key)
        self._at[key] = (plog, nxt)
        return read, False


def _log_failure(task: asyncio.Task[None]) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.error("the replica scrub failed", exc_info=task.exception())
