"""What the leader of a partition knows about its followers, and the decisions it makes from
it: the high watermark, the in-sync replica set, and whether an ``acks=all`` produce may be
answered (Kafka's rules). No I/O: the broker feeds it fetches and appends and carries out
the ISR changes it proposes through etcd (:mod:`tidewire.cluster.metadata`).

- A follower's **log end** is the offset it fetches from (it holds everything below it); under
  ``fsync=always`` the offset it reports **durable** counts instead, so that "in every replica"
  means "on every replica's disk".
- The **high watermark** is the smallest log end over the *committed* ISR (the leader's own
  included); it never goes back while this leader leads. Consumers read below it, and an
  ``acks=all`` produce is answered once it passes the produce's last offset.
- A follower whose log end has not reached the leader's for ``replica_lag_max_ms`` is proposed
  out of the ISR, and so at once is one whose log end went back below the high watermark (it
  lost offsets every in-sync replica is counted to hold: its log was cut at a damaged range);
  one that reaches the high watermark (and this epoch's start) is proposed back in. A change
  counts only once etcd took it (:meth:`PartitionLeader.isr_committed`): until then a shrink
  does not advance the high watermark past the laggard, and an expansion does not count the
  newcomer (Kafka's AlterPartition rule: the ISR used for the high
  watermark is always one etcd holds).
- While the ISR is smaller than ``min_insync_replicas``, ``acks=all`` produces are refused
  (NOT_ENOUGH_REPLICAS) rather than acknowledged with fewer copies.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

__all__ = ["FollowerInfo", "PartitionLeader"]


@dataclass
class FollowerInfo:
    log_end: int = 0
    #: the last time its log end reached the leader's log end (monotonic seconds)
    caught_up_at: float = 0.0
    #: the last time it fetched (monotonic seconds)
    fetched_at: float = 0.0
    #: its log end went back below the high watermark (its log was cut at a damaged range,
    #: or it lost a tail): it lacks offsets counted as in every in-sync replica, so it is not
    #: in sync until it holds the high watermark again
    lost: bool = False


class PartitionLeader:
    """The leader's view of one partition in one leader epoch.

    Args:
        node_id: this node, the leader.
        replicas: every replica (this node included).
        isr: the in-sync replicas etcd holds now (this node included).
        epoch_start: the first offset of this leader epoch (the log end when it began).
        high_watermark: where it stood when this leader took over (its own log's).
        clock: monotonic seconds.
        lag_max_s: ``replica_lag_max_ms`` in seconds.
        min_insync: ``min_insync_replicas``.
    """

    def __init__(
        self,
        node_id: int,
        replicas: Iterable[int],
        isr: Iterable[int],
        *,
        log_end: int,
        epoch_start: int,
        high_watermark: int,
        clock: Callable[[], float],
        lag_max_s: float,
        min_insync: int,
    ) -> None:
        self.node_id = node_id
        self.replicas = tuple(replicas)
        self.isr = frozenset(isr)
        if node_id not in self.isr:
            raise ValueError(f"leader {node_id} is not in its own ISR {sorted(self.isr)}")
        self.log_end = log_end
        self.epoch_start = epoch_start
        self.high_watermark = min(high_watermark, log_end)
        self.clock = clock
        self.lag_max_s = lag_max_s
        self.min_insync = min_insync
        now = clock()
        # In-sync followers start as caught up now: each gets lag_max_s to show up. One out of
        # the ISR has fetched never, as far as this leader knows: it comes in only after a
        # fetch (else, at offset 0 of an empty log, it would be taken in before it did).
        self.followers = {
            r: FollowerInfo(0, now, now if r in self.isr else float("-inf"))
            for r in self.replicas
            if r != node_id
        }
        #: an ISR change proposed to etcd and not yet answered
        self.pending_isr: frozenset[int] | None = None

    # --- inputs ------------------------------------------------------------------------------

    def appended(self, log_end: int) -> None:
        """This node's log (durably, under ``fsync=always``) now ends at ``log_end``."""
        self.log_end = log_end
        self._advance()

    def fetched(self, follower: int, log_end: int) -> None:
        """``follower`` fetched from ``log_end`` (it holds, durably where it matters,
        everything below it).

        Raises:
            ValueError: not a replica of this partition.
        """
        f = self.followers.get(follower)
        if f is None:
            raise ValueError(f"node {follower} is not a follower of this partition")
        end = min(log_end, self.log_end)
        if end < f.log_end and end < self.high_watermark:
            f.lost = True
        elif end >= self.high_watermark:
            f.lost = False
        f.log_end = end
        f.fetched_at = self.clock()
        if f.log_end >= self.log_end:
            f.caught_up_at = self.clock()
        self._advance()

    def isr_committed(self, isr: Iterable[int]) -> None:
        """etcd took an ISR change (this leader's, or the controller's). A follower it
        removes comes back only after a fetch made since: the controller removes a node that
        left the cluster, whose last fetches may still look recent here, and taking it back
        on those would undo the removal at once, again and again until it returns."""
        new = frozenset(isr)
        for r in self.isr - new:
            f = self.followers.get(r)
            if f is not None:
                f.fetched_at = float("-inf")
        self.isr = new
        self.pending_isr = None
        self._advance()

    def isr_refused(self) -> None:
        """etcd refused the proposed change (the partition changed meanwhile)."""
        self.pending_isr = None

    # --- decisions ---------------------------------------------------------------------------

    def proposed_isr(self) -> frozenset[int] | None:
        """The ISR this leader wants etcd to hold now (laggards out, caught-up followers in),
        or None when it is right or a change is already pending."""
        if self.pending_isr is not None:
            return None
        now = self.clock()
        want = {self.node_id}
        for r, f in self.followers.items():
            if r in self.isr:
                if now - f.caught_up_at <= self.lag_max_s and not f.lost:
                    want.add(r)
            elif (
                f.log_end >= max(self.high_watermark, self.epoch_start)
                and now - f.fetched_at <= self.lag_max_s
            ):
                # Fetching still: a follower that stopped at the end (gone, or its fetcher
                # paused) would otherwise be taken in again at once and out again, forever.
                want.add(r)
        if want == self.isr:
            return None
        self.pending_isr = frozenset(want)
        return self.pending_isr

    def can_append_acks_all(self) -> bool:
        """Whether an ``acks=all`` produce may be taken: the ISR is at least
        ``min_insync_replicas``."""
        return len(self.isr) >= self.min_insync

    def replicated(self, end_offset: int) -> bool:
        """Whether everything below ``end_offset`` is in every in-sync replica."""
        return self.high_watermark >= end_offset

    # --- the high watermark ------------------------------------------------------------------

    def _advance(self) -> None:
        ends = [self.log_end]
        for r in self.isr:
            if r != self.node_id:
                ends.append(self.followers[r].log_end if r in self.followers else 0)
        hw = min(ends)
        self.high_watermark = max(self.high_watermark, hw)
