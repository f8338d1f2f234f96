"""The controller: one node at a time (an etcd election on the node's lease) that moves a
partition's leadership when its leader's node goes, and takes lost nodes out of in-sync sets.

Rules (Kafka's, without unclean election unless a topic enables it):

- a partition whose leader's node is gone is led by the first of its in-sync replicas that is
  alive, in replica order; its leader epoch goes up by one, and the gone node leaves the ISR;
- with no in-sync replica alive, the partition has no leader (``NO_LEADER``, epoch bumped) and
  its ISR keeps who had everything, so the first of them to come back leads again; with
  ``unclean_leader_election`` on for the topic, the first live replica leads instead (what it
  lacks is lost: the operator chose availability);
- a replica that may have lost its unflushed tail (its node restarted after an unclean
  shutdown under ``fsync=interval``/``never`` and has not caught up since: a *lost-tail mark*
  in etcd, :mod:`tidewire.cluster.lost_tail`) is never elected while an unmarked in-sync
  replica is alive; with none the partition stays offline, unless unclean election is on
  (then an unmarked live replica leads, else the marked one holding the most); a leader
  marked after it was named is replaced;
- a follower's node that is gone leaves the ISR (the leader would drop it after
  ``replica_lag_max_ms`` anyway; the controller does not wait);
- every write compares the partition's version and the controller's fence, so a controller that
  lost its election (a pause past its lease) changes nothing.

Replica placement for new topics is :func:`assign`: round robin over the live nodes from a
rotating start, as Kafka places replicas without racks.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Mapping, Sequence

from tidewire.cluster.etcd import EtcdError, Lease
from tidewire.cluster.lost_tail import LostTail, marks_of, read_lost_tails
from tidewire.cluster.metadata import (
    NO_LEADER,
    Fence,
    MetadataCache,
    MetadataStore,
    PartitionState,
)
from tidewire.cluster.queues import follow_owner
from tidewire.cluster.reassign import reconcile_reassignments

__all__ = ["Controller", "assign", "elect"]

log = logging.getLogger("tidewire.cluster.controller")


def assign(
    partitions: int, replication_factor: int, nodes: Sequence[int], start: int = 0
) -> list[list[int]]:
    """Replica sets of ``partitions`` partitions over ``nodes``: partition p's replicas are the
    ``replication_factor`` nodes from position ``start + p``, so leaders (the first replica)
    spread evenly.

    Raises:
        ValueError: fewer live nodes than the replication factor.
    """
    ids = sorted(nodes)
    if replication_factor < 1:
        raise ValueError(f"replication factor {replication_factor}: at least 1")
    if len(ids) < replication_factor:
        raise ValueError(
            f"replication factor {replication_factor} needs as many live nodes; "
            f"{len(ids)} are registered ({', '.join(map(str, ids)) or 'none'})"
        )
    n = len(ids)
    return [
        [ids[(start + p + r) % n] for r in range(replication_factor)] for p in range(partitions)
    ]


def elect(
    state: PartitionState,
    live: set[int],
    *,
    unclean: bool,
    lost: Mapping[int, LostTail] | None = None,
    version: int = 0,
) -> PartitionState | None:
    """The partition's next state given the live nodes, or None when nothing changes.

    Args:
        lost: the replicas that may have lost their unflushed tail (restarted after an
            unclean shutdown, not caught up since): node -> its mark
            (:mod:`tidewire.cluster.lost_tail`). Never elected while an unmarked in-sync
            replica is alive; only by unclean election when none is.
        version: the partition's version (etcd's mod revision): a leader marked after it
            was named (it restarted within its session) no longer leads.
    """
    lost = lost or {}
    isr = tuple(r for r in state.isr if r in live)
    voided = state.leader in lost and lost[state.leader].revision > version
    if state.leader != NO_LEADER and state.leader in live and not voided:
        if isr == state.isr or not isr:
            return None
        return PartitionState(state.replicas, state.leader, state.leader_epoch, isr)
    in_sync = [r for r in state.replicas if r in isr and r not in lost]
    if in_sync:
        leader = in_sync[0]
        return PartitionState(state.replicas, leader, state.leader_epoch + 1, isr)
    if unclean:
        alive = [r for r in state.replicas if r in live]
        sound = [r for r in alive if r not in lost]
        if sound:
            leader = sound[0]
        elif alive:  # the marked one holding the most
            leader = max(alive, key=lambda r: (lost[r].end, -alive.index(r)))
        else:
            leader = NO_LEADER
        if leader != NO_LEADER:
            return PartitionState(state.replicas, leader, state.leader_epoch + 1, (leader,))
    if state.leader == NO_LEADER:
        return None  # offline already: the ISR keeps who had everything
    return PartitionState(state.replicas, NO_LEADER, state.leader_epoch + 1, state.isr)


class Controller:
    """Campaigns for the controller's election on ``lease`` and, while it leads, keeps every
    partition led by a live in-sync replica.

    Args:
        store: the cluster's metadata.
        cache: this node's copy of it (loaded and followed).
        node_id: this node.
        lease: this node's lease (its registration); losing it ends the leadership.
        unclean: whether a topic allows unclean leader election.
    """

    def __init__(
        self,
        store: MetadataStore,
        cache: MetadataCache,
        node_id: int,
        lease: Lease,
        *,
        unclean: Callable[[str], bool] | None = None,
        campaign_timeout_s: float = 3600.0,
    ) -> None:
        self.store = store
        self.cache = cache
        self.node_id = node_id
        self.lease = lease
        self.unclean = unclean or (lambda topic: False)
        self.campaign_timeout_s = campaign_timeout_s
        self.fence: Fence | None = None
        self.leading = asyncio.Event()
        #: Called with (before, after) for each partition state etcd took from this
        #: controller (the node's metrics count elections there).
        self.on_written: Callable[[PartitionState, PartitionState], None] | None = None
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name=f"controller {self.node_id}")

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def _run(self) -> None:
        etcd = self.store.etcd
        while not self.lease.lost.is_set():
            try:
                won = await etcd.campaign(
                    self.store.controller_election,
                    self.lease.id,
                    str(self.node_id).encode(),
                    timeout_s=self.campaign_timeout_s,
                )
            except EtcdError as exc:
                log.warning("node %d: controller campaign failed (%s); again", self.node_id, exc)
                await asyncio.sleep(0.5)
                continue
            self.fence = Fence.of(won)
            self.leading.set()
            log.info("node %d is the controller (fence revision %d)", self.node_id, won.rev)
            try:
                await self._lead()
            finally:
                self.leading.clear()
                self.fence = None

    async def _lead(self) -> None:
        while not self.lease.lost.is_set():
            seen = self.cache.revision
            if not await self.reconcile():
                log.warning("node %d: no longer the controller", self.node_id)
                return
            # The next pass comes with the first change after the revision this one read (at
            # once for one that came while it awaited etcd). Waited for on the revision, not
            # on the copy's event: that is shared, and its other waiters clear it once they
            # have looked. A change applied between this turn and the waiter's first one,
            # with such a clear in between, was slept through: the partitions of a node that
            # had just left kept it as their leader until some later change (none may come).
            lost = asyncio.ensure_future(self.lease.lost.wait())

            def past(seen: int = seen) -> bool:
                return self.cache.revision > seen

            changed = asyncio.ensure_future(self.cache.wait_for(past, None))
            try:
                await asyncio.wait({lost, changed}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                lost.cancel()
                changed.cancel()

    async def reconcile(self) -> bool:
        """One pass over every partition; False when a write found the fence gone."""
        fence = self.fence
        if fence is None:
            return False
        live = set(self.cache.nodes)
        try:
            marks = await read_lost_tails(self.store)
        except EtcdError as exc:
            log.warning("lost-tail marks not read (%s); next pass", exc)
            return True
        partitions = self.cache.partitions()
        decided: dict[tuple[str, int], PartitionState] = {}
        for (topic, p), (state, version) in sorted(partitions.items()):
            info = self.cache.topics.get(topic)
            lost = marks_of(marks, (topic, p), info.topic_id if info is not None else "")
            new = elect(state, live, unclean=self.unclean(topic), lost=lost, version=version)
            # A queue's state partition is led by the queue's owner (cluster/queues.py).
            if p == 1 and (owner := decided.get((topic, 0))) is not None:
                new = follow_owner(topic, p, new or state, owner, set(live) - set(lost)) or new
            decided[(topic, p)] = new or state
            if new is None:
                continue
            try:
                ok = await self.store.set_partition(topic, p, new, version, fence)
            except EtcdError as exc:
                log.warning("partition %s/%d not updated (%s); next pass", topic, p, exc)
                continue
            if ok:
                if self.on_written is not None:
                    self.on_written(state, new)
                log.info(
                    "partition %s/%d: leader %d epoch %d isr %s (was leader %d, isr %s)",
                    topic,
                    p,
                    new.leader,
                    new.leader_epoch,
                    list(new.isr),
                    state.leader,
                    list(state.isr),
                )
                continue
            # The partition changed meanwhile (the next pass sees it) or we were deposed.
            held = await self.store.etcd.get(fence.key)
            if held is None or held.create_revision != fence.rev:
                return False
        return await reconcile_reassignments(self.store, self.cache, fence)
