"""Replication: which partitions this node leads or follows, and the answers the broker asks
of it — am I the leader of this partition, and up to where is it replicated (its high
watermark).

The node layer (:mod:`tidewire.cluster.node`) decides the roles from etcd and calls
:meth:`ReplicaManager.become_leader`, :meth:`~ReplicaManager.become_follower` and
:meth:`~ReplicaManager.stop_replica`; the broker (``broker.replication``, None on a single
node) asks :meth:`~ReplicaManager.check_leader` before a produce,
:meth:`~ReplicaManager.wait_replicated` before answering an ``acks=all`` one, and
:meth:`~ReplicaManager.high_watermark` for what readers may see.

- **Leader side.** Followers copy the log with REPLICA_FETCH (:meth:`ReplicaManager.replica_fetch`):
  each fetch names the follower's log end (and, under ``fsync=always``, its fsynced end), which
  is what :class:`~tidewire.cluster.replica_state.PartitionLeader` counts for the high
  watermark and the ISR. A fetch whose last batch's epoch diverges from the leader's history is
  answered with the leader's end of that epoch (KIP-101) and no data. ISR changes are
  proposed through ``propose_isr`` (etcd: the node layer's compare-and-swap) and count only
  once it took them; a 1 s timer also proposes laggards out, so a follower that stops
  fetching is dropped after ``lag_max_ms``.
- **Follower side.** One :class:`~tidewire.cluster.fetcher.LeaderFetcher` per leader node
  copies every partition this node follows from it (:mod:`tidewire.cluster.fetcher`).

Partitions the manager does not know (the broker's internal topics, which every node keeps
for itself) are read with the local high watermark, as on a single node.

**High-watermark checkpoint.** A cluster node calls :meth:`ReplicaManager.start_checkpoints`
before anything is served: the high watermarks recorded at its last run
(:mod:`tidewire.cluster.hw_checkpoint`) bound what it serves of each partition that has no
role yet, a leader elected before its followers fetched starts from it, and the manager writes
the checkpoint every few seconds and when it closes.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from tidewire.cluster.fetcher import Connect, FollowedPartition, LeaderFetcher, default_connect
from tidewire.cluster.hw_checkpoint import (
    CHECKPOINT_INTERVAL_S,
    read_hw_checkpoint,
    write_hw_checkpoint,
)
from tidewire.cluster.replica_state import PartitionLeader
from tidewire.errors import (
    FencedLeaderEpochError,
    InvalidRequestError,
    NotEnoughReplicasAfterAppendError,
    NotLeaderError,
    PartitionCorruptError,
    RequestTimedOutError,
    TidewireError,
    UnknownLeaderEpochError,
    UnknownPartitionError,
    UnknownTopicError,
)
from tidewire.protocol.messages import ReplicaFetchRequest, ReplicaFetchResult
from tidewire.storage import FsyncPolicy, PartitionLog

if TYPE_CHECKING:
    from tidewire.broker import Broker
    from tidewire.cluster.lost_tail import LostTails

__all__ = ["ProposeIsr", "ReplicaManager", "hold_back"]

log = logging.getLogger(__name__)

#: ``propose_isr(topic, partition, leader_epoch, isr)``: ask etcd to hold ``isr``; True when it
#: took it and no later change is known (False: the leader keeps the ISR it holds, and the
#: node layer gives it a later one through :meth:`ReplicaManager.become_leader`).
ProposeIsr = Callable[[str, int, int, tuple[int, ...]], Awaitable[bool]]

#: ``resign(topic, partition, leader_epoch)``: hand a led partition to another in-sync
#: replica and leave its ISR (this node's log has a damaged range); True when etcd took it.
Resign = Callable[[str, int, int], Awaitable[bool]]

Key = tuple[str, int]

#: How often the leader checks its followers' lag (seconds, at most).
LAG_CHECK_S = 1.0

#: Bytes of its own log a follower CRC-checks at most per read while checking it (see
#: :meth:`ReplicaManager.check_replica`).
CHECK_READ_BYTES = 1024 * 1024


def local_end(plog: PartitionLog) -> int:
    """This node's own end of a partition as replication counts it: the fsynced end under
    ``fsync=always`` (an acknowledged record is on every in-sync replica's disk), else the
    log end."""
    if plog.config.fsync is FsyncPolicy.ALWAYS:
        return plog.flushed_offset
    return plog.log_end_offset


class _Led:
    """A partition this node leads: its epoch and the leader's bookkeeping."""

    __slots__ = ("epoch", "seen_hw", "state", "waiters")

    def __init__(self, epoch: int, state: PartitionLeader) -> None:
        self.epoch = epoch
        self.state = state
        #: produces waiting for their records to be replicated: (end offset, future)
        self.waiters: list[tuple[int, asyncio.Future[None]]] = []
        #: the high watermark consumers were last woken for
        self.seen_hw = state.high_watermark


class ReplicaManager:
    """This node's replicas: the partitions it leads and those it follows.

    Args:
        broker: the broker whose logs are replicated (``broker.replication`` is set to this).
        node_id: this node's id.
        lag_max_ms: a follower that has not caught up with the leader's log end for this long
            is proposed out of the ISR.
        min_insync: ``min_insync_replicas`` (``become_leader`` may give a topic's own).
        clock: monotonic seconds (tests give a fake one).
        propose_isr: asks etcd to hold an ISR (see :data:`ProposeIsr`); None: ISR changes take
            effect at once, locally (no cluster metadata to keep in step: tests).
        connect: opens a protocol connection to a leader (see
            :data:`~tidewire.cluster.fetcher.Connect`); default: a plaintext client transport.
        advertise: this node's address, named in the answers of partitions it leads.
        ack_timeout_s: how long an ``acks=all`` produce waits for its replicas.
        fetch_max_wait_ms: a follower's long poll.
        lost_tails: this node's lost-tail marks (:mod:`tidewire.cluster.lost_tail`): a mark
            is deleted once its replica caught up with a leader, or leads.
    """

    def __init__(
        self,
        broker: Broker,
        node_id: int,
        *,
        lag_max_ms: int = 10_000,
        min_insync: int = 1,
        clock: Callable[[], float] = time.monotonic,
        propose_isr: ProposeIsr | None = None,
        resign: Resign | None = None,
        connect: Connect | None = None,
        advertise: tuple[str, int] = ("", -1),
        ack_timeout_s: float = 30.0,
        fetch_max_wait_ms: int = 500,
        lost_tails: LostTails | None = None,
    ) -> None:
        if lag_max_ms <= 0:
            raise ValueError(f"lag_max_ms must be positive, not {lag_max_ms}")
        if min_insync < 1:
            raise ValueError(f"min_insync must be at least 1, not {min_insync}")
        self.broker = broker
        self.node_id = node_id
        self.lag_max_s = lag_max_ms / 1000
        self.min_insync = min_insync
        self.clock = clock
        self.propose_isr = propose_isr
        self.resign = resign
        #: (partition, epoch) already handed over, not asked again in that epoch.
        self._resigned: set[tuple[Key, int]] = set()
        self.connect: Connect = connect if connect is not None else default_connect
        self.advertise = advertise
        self.ack_timeout_s = ack_timeout_s
        self.fetch_max_wait_ms = fetch_max_wait_ms
        self.lost_tails = lost_tails
        self._led: dict[Key, _Led] = {}
        #: partitions followed here -> their fetch state
        self._followed: dict[Key, FollowedPartition] = {}
        #: the leader of each partition as last told: (node id, host, port)
        self._leaders: dict[Key, tuple[int, str, int]] = {}
        #: the high watermark each followed partition last learned from its leader
        self._learned_hw: dict[Key, int] = {}
        #: followed partitions whose own log is still to be CRC-checked, from the first offset
        #: up to the second (the log end when this process began following it)
        self._unchecked: dict[Key, tuple[int, int]] = {}
        #: partitions whose own log was checked since this process started
        self._checked: set[Key] = set()
        self._fetchers: dict[int, LeaderFetcher] = {}
        #: high watermarks read from the checkpoint, for partitions given no role since:
        #: (the log they were read for, offset). Valid only while that very log is the
        #: partition's (a log deleted and made again is another incarnation).
        self._checkpointed: dict[Key, tuple[PartitionLog, int]] = {}
        #: what the checkpoint file holds now (None: this manager keeps no checkpoint)
        self._written: dict[Key, int] | None = None
        self._checkpoint_task: asyncio.Task[None] | None = None
        #: set when a partition not named in the checkpoint got a role: written at once
        self._new_marks = asyncio.Event()
        #: the checkpoint write under way (in a thread), if any
        self._writing: asyncio.Future[None] | None = None
        self._background: set[asyncio.Task[Any]] = set()
        self._lag_task: asyncio.Task[None] | None = None
        self._closed = False

    # --- roles (called by the node layer) ------------------------------------------------------

    async def become_leader(
        self,
        topic: str,
        partition: int,
        *,
        epoch: int,
        replicas: tuple[int, ...] | list[int],
        isr: tuple[int, ...] | list[int],
        min_insync: int | None = None,
    ) -> None:
        """Lead ``topic``/``partition`` in leader ``epoch``: batches appended from now on carry
        it, followers copy from here. The same epoch again updates the replicas and the ISR
        (etcd's) without starting over.

        Raises:
            ValueError: ``epoch`` below the log's, or this node not in ``isr``.
            UnknownTopicError, UnknownPartitionError: no local log (create it first).
        """
        key = (topic, partition)
        plog = self.broker.log(topic, partition)
        self._check_open()
        led = self._led.get(key)
        if led is not None and led.epoch == epoch and tuple(replicas) == led.state.replicas:
            led.state.isr_committed(isr)
            if min_insync is not None:
                led.state.min_insync = min_insync
            self._progress(key, led)
            return
        if led is not None and led.epoch == epoch:
            self._replicas_changed(key, led, replicas, isr, min_insync)
            return
        if epoch > plog.leader_epoch:
            plog.set_leader_epoch(epoch)
        elif epoch < plog.leader_epoch:
            raise ValueError(
                f"{topic}/{partition}: leader epoch {epoch} is below the log's {plog.leader_epoch}"
            )
        self._unfollow(key)
        if led is not None:
            hw = led.state.high_watermark
            self._fail_waiters(led)
        else:
            checkpointed = self._take_checkpointed(key, plog)
            fallback = plog.log_start_offset if checkpointed is None else checkpointed
            hw = self._learned_hw.pop(key, fallback)
        end = local_end(plog)
        state = PartitionLeader(
            self.node_id,
            replicas,
            isr,
            log_end=end,
            epoch_start=plog.log_end_offset,
            high_watermark=max(hw, plog.log_start_offset),
            clock=self.clock,
            lag_max_s=self.lag_max_s,
            min_insync=min_insync if min_insync is not None else self.min_insync,
        )
        self._led[key] = _Led(epoch, state)
        self._leaders[key] = (self.node_id, *self.advertise)
        self._named_soon(key)
        if self.lost_tails is not None:
            # Elected knowing the mark (only unclean election does): its log is the truth now.
            self.lost_tails.clear_soon(key)
        self._ensure_lag_task()
        self.broker._wake(topic, partition)

    def _replicas_changed(
        self,
        key: Key,
        led: _Led,
        replicas: tuple[int, ...] | list[int],
        isr: tuple[int, ...] | list[int],
        min_insync: int | None,
    ) -> None:
        """The replica set of a partition this node goes on leading in the same epoch changed
        (a move adds or drops replicas): the leader's view keeps what it knew of the replicas
        that stay (their log ends, when they last caught up and fetched), and the produces
        waiting for their replicas go on waiting, judged by the new ISR, as Kafka keeps its
        delayed produces across a reassignment. Failing them would make every producer
        resend what is stored already, and forgetting the followers' ends would hold the
        high watermark until each fetched again.

        Raises:
            ValueError: this node not in ``isr``.
        """
        old = led.state
        state = PartitionLeader(
            self.node_id,
            replicas,
            isr,
            log_end=old.log_end,
            epoch_start=old.epoch_start,
            high_watermark=old.high_watermark,
            clock=self.clock,
            lag_max_s=self.lag_max_s,
            min_insync=min_insync if min_insync is not None else old.min_insync,
        )
        for r, info in old.followers.items():
            if r in state.followers:
                state.followers[r] = info
                if r in old.isr and r not in state.isr:
                    # Taken out (a node gone): back in only after a fetch made since, as
                    # PartitionLeader.isr_committed has it.
                    info.fetched_at = float("-inf")
        state.appended(old.log_end)  # the high watermark over the new ISR
        again = _Led(led.epoch, state)
        # The same list: each waiting produce removes its own entry from the list it joined.
        again.waiters = led.waiters
        again.seen_hw = led.seen_hw
        self._led[key] = again
        self._progress(key, again)

    async def become_follower(
        self,
        topic: str,
        partition: int,
        *,
        epoch: int,
        leader: int,
        leader_address: tuple[str, int],
    ) -> None:
        """Follow ``leader`` (at ``leader_address``) in leader ``epoch``: its fetcher first
        truncates this log where it diverges from the leader's (KIP-101), then copies it.
        A partition this node led stops being led: produces waiting for their replicas get
        NotLeaderError.

        Raises:
            ValueError: ``leader`` is this node.
            UnknownTopicError, UnknownPartitionError: no local log (create it first).
        """
        if leader == self.node_id:
            raise ValueError(f"node {leader} cannot follow itself; call become_leader")
        key = (topic, partition)
        plog = self.broker.log(topic, partition)
        self._check_open()
        if epoch > plog.leader_epoch:
            plog.set_leader_epoch(epoch)
        if key not in self._checked and key not in self._unchecked:
            # What the log holds now is CRC-checked by the fetcher, a little each round
            # (check_replica): sealed segments found intact at the open were trusted unread.
            self._unchecked[key] = (plog.log_start_offset, plog.log_end_offset)
        self._cut_at_damage(topic, partition, plog, leader)
        checkpointed = self._take_checkpointed(key, plog)
        if checkpointed is not None and key not in self._learned_hw:
            # Until its leader answers, a follower serves below the checkpoint's mark.
            self._learned_hw[key] = checkpointed
        led = self._led.pop(key, None)
        host, port = leader_address
        self._leaders[key] = (leader, host, port)
        if led is not None:
            self._learned_hw[key] = led.state.high_watermark
            self._fail_waiters(led)
        old = self._followed.get(key)
        if old is not None and (old.epoch, old.leader, old.address) == (
            epoch,
            leader,
            (host, port),
        ):
            if old.paused:  # told again: the fetcher tries it again
                old.paused = False
                fetcher = self._fetchers.get(leader)
                if fetcher is not None:
                    fetcher.add(old)
            return
        self._unfollow(key)
        state = FollowedPartition(
            topic, partition, epoch=epoch, leader=leader, address=(host, port)
        )
        self._followed[key] = state
        self._named_soon(key)
        fetcher = self._fetchers.get(leader)
        if fetcher is not None and fetcher.address != (host, port):
            await fetcher.close()
            fetcher = None
            del self._fetchers[leader]
        if fetcher is None:
            fetcher = LeaderFetcher(self, leader, (host, port))
            self._fetchers[leader] = fetcher
            for k, f in self._followed.items():
                if f.leader == leader and k != key:
                    fetcher.add(f)
        fetcher.add(state)
        self.broker._wake(topic, partition)

    async def stop_replica(
        self, topic: str, partition: int, *, keep_high_watermark: bool = False
    ) -> None:
        """This node is no longer a replica of ``topic``/``partition``: stop leading or
        following it (the log itself stays; deleting it is the node layer's).

        ``keep_high_watermark``: the log stays without a role for a while (the lease is lost,
        or the partition is offline): readers still see it only below the high watermark
        known last. Read up to its end, it would serve records never committed, which the
        next leader's history replaces (a leader cut off from its peers appended them)."""
        key = (topic, partition)
        led = self._led.pop(key, None)
        self._leaders.pop(key, None)
        hw = self._learned_hw.pop(key, None)
        if led is not None:
            hw = led.state.high_watermark
        if keep_high_watermark:
            plog = self.broker.log(topic, partition)
            if hw is None:
                hw = self._take_checkpointed(key, plog)
            self._learned_hw[key] = plog.log_start_offset if hw is None else hw
        else:
            self._checkpointed.pop(key, None)
        self._unchecked.pop(key, None)
        self._checked.discard(key)
        if led is not None:
            self._fail_waiters(led)
        self._unfollow(key)

    def check_replica(self, topic: str, partition: int, plog: PartitionLog, budget: int) -> int:
        """Before a fetch of a followed partition: CRC-check up to ``budget`` more bytes of
        what its log held when this node began following it, then cut the log at its first
        damaged range, if it has one, so the fetch copies everything from there again.

        Why here: a damaged range is never served and the fetcher copies only past the log
        end, so a range left in place is a hole in a replica that reports its whole log end
        and counts as in sync. Damage can be found at any time: by the open's scan, by a read
        (sealed segments found intact at the open are trusted without being read, and
        nothing else reads a follower's log), or by this check. Each fetch round repairs what
        is known by then, whoever found it. Appended copies are CRC-checked as they are
        stored, so only what the log held before following needs the check, once per
        process.

        Returns:
            The bytes read (to share one budget among the partitions of a round).

        Raises:
            TidewireError: the read or the cut failed (StorageError): not fetched this round.
        """
        key = (topic, partition)
        read = 0
        todo = self._unchecked.get(key)
        if todo is not None:
            at, until = max(todo[0], plog.log_start_offset), min(todo[1], plog.log_end_offset)
            while at < until and read < budget:
                try:
                    r = plog.read(at, min(budget - read, CHECK_READ_BYTES), max_offset=until)
                except PartitionCorruptError as exc:
                    # Recorded in plog.damage by the read: cut below; what lies past the
                    # range is cut with it, so the check ends there.
                    until = min(until, max(exc.damage_start, at))
                    break
                if not r.data or r.next_offset <= at:
                    at = until  # nothing more to read below ``until``
                    break
                read += len(r.data)
                at = r.next_offset
            if at >= until:
                del self._unchecked[key]
                self._checked.add(key)
            else:
                self._unchecked[key] = (at, until)
        leader = self._leaders.get(key, (-1, "", -1))[0]
        self._cut_at_damage(topic, partition, plog, leader)
        return read

    def _cut_at_damage(self, topic: str, partition: int, plog: PartitionLog, leader: int) -> None:
        """Cut a followed partition's log where its first damaged range starts (none: do
        nothing), and rebuild its producer state from what is left."""
        starts = [d.start for d in plog.damage if d.start >= plog.log_start_offset]
        if not starts:
            return
        end, removed, _ = plog.truncate_at_damage(min(starts))
        self.broker.replica_truncated(topic, partition, end)
        log.warning(
            "partition %s/%d: damaged from offset %d: %d offsets cut, copied again from leader %d",
            topic,
            partition,
            end,
            removed,
            leader,
        )

    def _unfollow(self, key: Key) -> None:
        state = self._followed.pop(key, None)
        if state is None:
            return
        fetcher = self._fetchers.get(state.leader)
        if fetcher is not None:
            fetcher.remove(key)
            if not fetcher.partitions:
                del self._fetchers[state.leader]
                self._spawn(fetcher.close())

    # --- what the broker asks ------------------------------------------------------------------

    def leader_of(self, topic: str, partition: int) -> tuple[int, str, int] | None:
        """The leader of a partition as this node was last told: ``(node id, host, port)``
        (this node's own advertised address when it leads), None when unknown."""
        return self._leaders.get((topic, partition))

    def leads(self, topic: str, partition: int) -> bool:
        """Whether this node leads the partition now."""
        return (topic, partition) in self._led

    def leader_epoch(self, topic: str, partition: int) -> int:
        """The leader epoch this node knows for the partition (-1: not a replica here)."""
        key = (topic, partition)
        led = self._led.get(key)
        if led is not None:
            return led.epoch
        f = self._followed.get(key)
        return f.epoch if f is not None else -1

    def check_leader(self, topic: str, partition: int) -> PartitionLeader:
        """This node's bookkeeping of a partition it leads.

        Raises:
            NotLeaderError: it does not lead it (naming the leader when known), or has no
                role for it yet (another node's metadata may name it before its own does).
        """
        led = self._led.get((topic, partition))
        if led is not None:
            return led.state
        if (topic, partition) not in self._leaders:
            try:
                self.broker.log(topic, partition)
            except (UnknownTopicError, UnknownPartitionError):
                # Not here: a client sent it where another node's metadata names this one the
                # leader, before this node saw the topic (or its role) in its own copy. A
                # retriable answer: the client asks the metadata again (where a topic that
                # does not exist is said so) and sends it again.
                raise NotLeaderError(
                    f"node {self.node_id} holds no partition {partition} of topic {topic!r}: "
                    "it has not seen it in the cluster's metadata yet, or the topic does not "
                    "exist (see METADATA)"
                ) from None
        raise self._not_leader((topic, partition))

    def _not_leader(self, key: Key) -> NotLeaderError:
        topic, partition = key
        known = self._leaders.get(key)
        if known is None or known[0] == self.node_id:
            return NotLeaderError(
                f"node {self.node_id} does not lead partition {partition} of topic {topic!r} "
                "and does not know its leader"
            )
        leader, host, port = known
        return NotLeaderError(
            f"node {self.node_id} does not lead partition {partition} of topic {topic!r}: "
            f"node {leader} at {host}:{port} does",
            leader_id=leader,
            leader_host=host,
            leader_port=port,
        )

    def high_watermark(self, topic: str, partition: int) -> int:
        """The offset below which readers see the partition: the replicated high watermark
        where this node leads, what the leader last said where it follows (at most its own
        end), the local one for a partition that is not replicated (internal topics).

        Raises:
            UnknownTopicError, UnknownPartitionError, PartitionOfflineError: no such log here.
        """
        key = (topic, partition)
        plog = self.broker.log(topic, partition)
        led = self._led.get(key)
        if led is not None:
            end = local_end(plog)
            if end != led.state.log_end:
                led.state.appended(end)
            return led.state.high_watermark
        if key in self._followed or key in self._learned_hw:
            return min(self._learned_hw.get(key, plog.log_start_offset), local_end(plog))
        if self._checkpointed:
            # No role since this node started: below the high watermark it knew last.
            seen = self._checkpointed.get(key)
            if seen is not None and seen[0] is plog:
                return min(max(seen[1], plog.log_start_offset), local_end(plog))
        return local_end(plog)

    async def wait_replicated(
        self, topic: str, partition: int, end_offset: int, timeout_s: float
    ) -> None:
        """Wait until every in-sync replica holds the partition below ``end_offset`` (the
        high watermark passed it). The ISR is the one etcd holds: a follower dropped from it
        meanwhile (lag) no longer counts. ``min_insync_replicas`` is checked before the
        append (:meth:`PartitionLeader.can_append_acks_all`, "nothing stored") and again
        when the high watermark passes the batch (Kafka's rule): an ISR that shrank below
        it meanwhile means fewer copies than the producer asked for.

        Raises:
            NotLeaderError: this node stopped leading it meanwhile (or never did).
            NotEnoughReplicasAfterAppendError: replicated to every in-sync replica, but the
                ISR (etcd's) was below ``min_insync_replicas`` then (the records are stored).
            RequestTimedOutError: not replicated within ``timeout_s`` (the records are stored
                on this leader and may still be replicated).
        """
        key = (topic, partition)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while True:
            led = self._led.get(key)
            if led is None:
                raise self._not_leader(key)
            plog = self.broker.log(topic, partition)
            led.state.appended(local_end(plog))
            if led.state.replicated(end_offset):
                if not led.state.can_append_acks_all():
                    raise NotEnoughReplicasAfterAppendError(
                        f"{topic}/{partition}: the records below {end_offset} are stored and "
                        f"held by the in-sync replicas {sorted(led.state.isr)}, fewer than "
                        f"min_insync_replicas {led.state.min_insync}"
                    )
                return
            remaining = deadline - loop.time()
            if remaining <= 0:
                raise RequestTimedOutError(
                    f"{topic}/{partition}: the records below {end_offset} were not replicated "
                    f"within {timeout_s:g} s (high watermark {led.state.high_watermark}, "
                    f"ISR {sorted(led.state.isr)})"
                )
            fut: asyncio.Future[None] = loop.create_future()
            led.waiters.append((end_offset, fut))
            timer = loop.call_later(remaining, _resolve, fut, None)
            try:
                await fut
            finally:
                timer.cancel()
                with contextlib.suppress(ValueError):
                    led.waiters.remove((end_offset, fut))

    # --- the leader side of REPLICA_FETCH ------------------------------------------------------

    async def replica_fetch(
        self, request: ReplicaFetchRequest
    ) -> tuple[list[ReplicaFetchResult], list[bytes]]:
        """Answer a follower's REPLICA_FETCH: per partition the leader's batches from the
        follower's offset to the log end (not limited by the high watermark), the high
        watermark, or an error (NotLeader, FencedLeaderEpoch, UnknownLeaderEpoch) or the
        divergence the follower must truncate at. Waits up to ``max_wait_ms`` when there is
        nothing to copy. Counts each follower's offset for the high watermark and the ISR.
        """
        keys = [(p.topic, p.partition) for p in request.partitions]
        loop = asyncio.get_running_loop()
        deadline = loop.time() + max(request.max_wait_ms, 0) / 1000
        max_bytes = max(min(request.max_bytes, self.broker.config.fetch_max_bytes), 1)
        first = True
        while True:
            results, data = self._replica_read(request, max_bytes, count=first)
            first = False
            got = sum(len(d) for d in data)
            if (
                got >= request.min_bytes
                or any(r.error_code or r.diverging_end_offset >= 0 for r in results)
                or self._closed
                or self.broker._closing
            ):
                return results, data
            remaining = deadline - loop.time()
            if remaining <= 0:
                return results, data
            await self.broker.wait_for_data(keys, remaining)

    def _replica_read(
        self, request: ReplicaFetchRequest, max_bytes: int, *, count: bool
    ) -> tuple[list[ReplicaFetchResult], list[bytes]]:
        results: list[ReplicaFetchResult] = []
        buffers: list[bytes] = []
        budget = max_bytes
        for p in request.partitions:
            key = (p.topic, p.partition)
            try:
                led = self._led.get(key)
                if led is None:
                    known = self.leader_epoch(p.topic, p.partition)
                    if p.leader_epoch > known:
                        # Elected here in an epoch this node has not been told of yet: the
                        # follower retries (NotLeader would park it until its next role change).
                        raise UnknownLeaderEpochError(
                            f"{p.topic}/{p.partition}: leader epoch {p.leader_epoch} is newer "
                            f"than {known}, the one this node knows"
                        )
                    raise self._not_leader(key)
                if p.leader_epoch < led.epoch:
                    raise FencedLeaderEpochError(
                        f"{p.topic}/{p.partition}: leader epoch {p.leader_epoch} is older than "
                        f"the current {led.epoch}"
                    )
                if p.leader_epoch > led.epoch:
                    raise UnknownLeaderEpochError(
                        f"{p.topic}/{p.partition}: leader epoch {p.leader_epoch} is newer than "
                        f"{led.epoch}, the one this node leads in"
                    )
                plog = self.broker.log(p.topic, p.partition)
                if p.offset < plog.log_start_offset:
                    # Retention here deleted what the follower would copy next: it starts
                    # its log over at this one's start (answered without data or error).
                    results.append(
                        ReplicaFetchResult(
                            topic=p.topic,
                            partition=p.partition,
                            high_watermark=led.state.high_watermark,
                            log_start_offset=plog.log_start_offset,
                            leader_epoch=led.epoch,
                        )
                    )
                    continue
                if p.last_fetched_epoch >= 0 and p.offset > 0:
                    epoch, end = plog.end_offset_for_epoch(p.last_fetched_epoch)
                    if epoch != p.last_fetched_epoch or end < p.offset:
                        results.append(
                            ReplicaFetchResult(
                                topic=p.topic,
                                partition=p.partition,
                                high_watermark=led.state.high_watermark,
                                log_start_offset=plog.log_start_offset,
                                leader_epoch=led.epoch,
                                diverging_epoch=epoch,
                                # UNDEFINED (the follower's epoch predates all of this log's):
                                # it keeps nothing of it.
                                diverging_end_offset=max(end, 0),
                            )
                        )
                        continue
                if count:
                    fsync_always = plog.config.fsync is FsyncPolicy.ALWAYS
                    held = p.durable_offset if fsync_always and p.durable_offset >= 0 else p.offset
                    try:
                        led.state.appended(local_end(plog))
                        led.state.fetched(request.node_id, held)
                    except ValueError as exc:
                        raise InvalidRequestError(f"{p.topic}/{p.partition}: {exc}") from None
                    self._progress(key, led)
                chunk = b""
                if p.offset < plog.log_end_offset:
                    # To the log end, and no bound given: a bound at the durable offset (the
                    # log end once every commit is done) would read as a caught-up consumer's,
                    # which leaves the log's lone commits on the loop (PartitionLog._count_read);
                    # this node's next copy to the follower would wait behind each one.
                    r = plog.read(p.offset, max(budget, 1))
                    if budget < max_bytes and len(r.data) > budget:  # only the first may exceed
                        chunk = b""
                    else:
                        chunk = bytes(r.data)
                    budget = max(budget - len(chunk), 0)
            except TidewireError as exc:
                results.append(
                    ReplicaFetchResult(
                        topic=p.topic,
                        partition=p.partition,
                        error_code=exc.code,
                        error_message=exc.message,
                        leader_epoch=self.leader_epoch(p.topic, p.partition),
                    )
                )
                continue
            results.append(
                ReplicaFetchResult(
                    topic=p.topic,
                    partition=p.partition,
                    high_watermark=led.state.high_watermark,
                    log_start_offset=plog.log_start_offset,
                    leader_epoch=led.epoch,
                    data_bytes=len(chunk),
                )
            )
            if chunk:
                buffers.append(chunk)
        return results, buffers

    # --- the high watermark and the ISR --------------------------------------------------------

    def _progress(self, key: Key, led: _Led) -> None:
        """After the follower offsets or the ISR changed: wake what the high watermark
        releases, and propose an ISR change if one is due."""
        self._wake_replicated(key, led)
        want = led.state.proposed_isr()
        if want is not None:
            self._spawn(self._propose(key, led, want))

    def _wake_replicated(self, key: Key, led: _Led) -> None:
        hw = led.state.high_watermark
        if led.seen_hw != hw:
            led.seen_hw = hw
            self.broker._wake(*key)  # consumers' long polls: more is visible
        for end, fut in list(led.waiters):
            if hw >= end and not fut.done():
                fut.set_result(None)

    async def _propose(self, key: Key, led: _Led, isr: frozenset[int]) -> None:
        topic, partition = key
        ordered = tuple(sorted(isr))
        if self.propose_isr is None:
            took = True
        else:
            try:
                took = await self.propose_isr(topic, partition, led.epoch, ordered)
            except Exception:  # etcd unreachable and the like: try again later
                log.warning(
                    "proposing ISR %s of %s/%s failed", ordered, topic, partition, exc_info=True
                )
                took = False
        if self._led.get(key) is not led:
            return  # no longer led (in this epoch) meanwhile
        if took:
            log.info("%s/%s: ISR now %s", topic, partition, list(ordered))
            led.state.isr_committed(isr)
        else:
            led.state.isr_refused()
        self._wake_replicated(key, led)

    def _fail_waiters(self, led: _Led) -> None:
        """Wake the produces waiting on ``led`` (they re-check and raise NotLeaderError)."""
        for _, fut in led.waiters:
            if not fut.done():
                fut.set_result(None)
        led.waiters.clear()

    def _ensure_lag_task(self) -> None:
        if self._lag_task is None or self._lag_task.done():
            self._lag_task = asyncio.get_running_loop().create_task(
                self._check_lag(), name="replication-lag"
            )

    async def _check_lag(self) -> None:
        """Every second (or half ``lag_max_ms``): propose laggards out of each led ISR, so a
        follower that stopped fetching is dropped even though no fetch reports it."""
        period = min(LAG_CHECK_S, self.lag_max_s / 2)
        while not self._closed and self._led:
            await asyncio.sleep(period)
            for key, led in list(self._led.items()):
                try:
                    plog = self.broker.log(*key)
                    led.state.appended(local_end(plog))
                except TidewireError:
                    continue
                self._progress(key, led)
                self._resign_if_damaged(key, led, plog)

    def damage_found(self, topic: str, partition: int) -> None:
        """A damaged range of a partition's log was just found outside the read path (the
        scrub, cluster/scrub.py): a leader hands the partition over now rather than at its
        next lag check; a follower cuts its log there before its next fetch anyway."""
        key = (topic, partition)
        led = self._led.get(key)
        if led is None:
            return
        try:
            plog = self.broker.log(topic, partition)
        except TidewireError:
            return
        self._resign_if_damaged(key, led, plog)

    def _resign_if_damaged(self, key: Key, led: _Led, plog: PartitionLog) -> None:
        """A led log with a damaged range (found by a read or the open's scan) does not serve
        it: records every in-sync follower holds intact. Leadership goes to one of them and
        this node leaves the ISR; following, it cuts its log at the damage and copies the
        rest again (:meth:`_cut_at_damage`), then rejoins the ISR. Alone in the ISR, it
        stays leader (no replica holds more), the range unserved."""
        if self.resign is None or (key, led.epoch) in self._resigned:
            return
        if not any(d.start >= plog.log_start_offset for d in plog.damage):
            return
        if not led.state.isr - {self.node_id}:
            return
        self._resigned.add((key, led.epoch))
        topic, partition = key
        log.warning(
            "partition %s/%d: this leader's log has a damaged range; handing the partition "
            "to an in-sync replica to copy it again from there",
            topic,
            partition,
        )

        async def resign() -> None:
            assert self.resign is not None
            try:
                took = await self.resign(topic, partition, led.epoch)
            except Exception:  # etcd unreachable and the like: asked again next round
                log.warning("resigning %s/%s failed", topic, partition, exc_info=True)
                took = False
            if not took:
                self._resigned.discard((key, led.epoch))

        self._spawn(resign())

    # --- the follower side (called by the fetchers) --------------------------------------------

    def learned(self, key: Key, high_watermark: int) -> None:
        """A followed partition's leader answered with ``high_watermark``."""
        if key in self._followed and self._learned_hw.get(key, -1) < high_watermark:
            self._learned_hw[key] = high_watermark
            self.broker._wake(*key)
        tails = self.lost_tails
        followed = self._followed.get(key)
        if tails is not None and key in tails.marks and followed is not None:
            # Caught up: the leader counts this replica as holding everything below the start
            # of its epoch (all that earlier leaders had acknowledged), and so it does.
            plog = self.broker.log(*key)
            start = next((s for e, s in plog.epoch_history() if e == followed.epoch), None)
            if start is not None and start <= high_watermark <= plog.log_end_offset:
                tails.clear_soon(key)

    def following(self, key: Key) -> FollowedPartition | None:
        return self._followed.get(key)

    # --- read by the metrics and the status routes (cluster/metrics.py) ----------------------

    def led_states(self) -> dict[Key, PartitionLeader]:
        """The partitions this node leads now, and the leader's view of each."""
        return {key: led.state for key, led in self._led.items()}

    def followed_high_watermarks(self) -> dict[Key, int]:
        """The partitions this node follows now, and the high watermark each one's leader
        last gave (-1: none yet)."""
        return {key: self._learned_hw.get(key, -1) for key in self._followed}

    # --- the high-watermark checkpoint (cluster/hw_checkpoint.py) -----------------------------

    def start_checkpoints(self) -> None:
        """Keep this node's high-watermark checkpoint: read the one its last run left (each
        partition without a role is then served, and reported, only below its mark; a leader
        elected before any fetch starts from it), and write it every
        :data:`~tidewire.cluster.hw_checkpoint.CHECKPOINT_INTERVAL_S` when a mark moved, and
        at :meth:`close`. Called by the cluster node before it serves anything; a manager
        never told so keeps no checkpoint (a single node has none).

        Blocking: reads one small file. Calling it twice is harmless.
        """
        self._check_open()
        if self._written is not None:
            return
        logs = self.broker.logs
        marks = read_hw_checkpoint(logs.fs, logs.data_dir)
        for key, hw in marks.items():
            plog = logs.logs.get(key)
            if plog is not None and key not in self._led and key not in self._learned_hw:
                self._checkpointed[key] = (plog, hw)
        self._written = dict(marks)
        self._checkpoint_task = asyncio.get_running_loop().create_task(
            self._checkpoint_loop(), name="replication-hw-checkpoint"
        )

    def _take_checkpointed(self, key: Key, plog: PartitionLog) -> int | None:
        """The checkpoint's mark of a partition given a role now (then forgotten: the role's
        own high watermark takes over), if it was read for this very log."""
        seen = self._checkpointed.pop(key, None)
        if seen is None or seen[0] is not plog:
            return None
        return max(min(seen[1], plog.log_end_offset), plog.log_start_offset)

    def checkpoint_marks(self) -> dict[Key, int]:
        """The high watermark this node knows now of each partition it holds in the
        cluster (what the checkpoint records): led ones' own, followed (and role-less) ones'
        as last learned, and those not given a role since the start as the checkpoint had
        them. Partitions whose log is gone are left out."""
        logs = self.broker.logs.logs
        marks: dict[Key, int] = {}
        for key, (plog, hw) in self._checkpointed.items():
            if logs.get(key) is plog:
                marks[key] = hw
        for key, hw in self._learned_hw.items():
            if hw >= 0 and key in logs:
                marks[key] = hw
        for key in self._followed:
            followed_log = logs.get(key)
            if key not in marks and followed_log is not None:
                marks[key] = followed_log.log_start_offset  # no answer from its leader yet
        for key, led in self._led.items():
            if key in logs:
                marks[key] = led.state.high_watermark
        return marks

    async def write_checkpoint(self) -> None:
        """Write the checkpoint now if a mark changed since the last write (in a thread).

        Raises:
            OSError: it could not be written (the previous one stays).
        """
        if self._written is None:
            return
        prev = self._writing
        if prev is not None:
            # One write at a time (its thread outlives a cancelled waiter): the file's
            # temporary copy is never written by two threads. Its outcome does not matter
            # here: this one writes what holds now.
            await asyncio.wait([prev])
            if not prev.cancelled():
                prev.exception()
        marks = self.checkpoint_marks()
        if marks == self._written:
            return
        logs = self.broker.logs
        self._writing = asyncio.ensure_future(
            asyncio.to_thread(write_hw_checkpoint, logs.fs, logs.data_dir, marks)
        )
        await asyncio.shield(self._writing)
        self._written = marks

    def _named_soon(self, key: Key) -> None:
        """A partition just given a role: written into the checkpoint at once if it is not
        named there (so a crash in the next few seconds does not leave it unbounded)."""
        if self._written is not None and key not in self._written:
            self._new_marks.set()

    async def _checkpoint_loop(self) -> None:
        while not self._closed:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._new_marks.wait(), CHECKPOINT_INTERVAL_S)
            self._new_marks.clear()
            try:
                await self.write_checkpoint()
            except OSError as exc:  # the disk refused: tried again next round
                log.warning("cannot write the high-watermark checkpoint: %s", exc)

    # --- lifecycle -----------------------------------------------------------------------------

    def _spawn(self, coro: Awaitable[Any]) -> None:
        async def run() -> None:
            await coro

        task = asyncio.get_running_loop().create_task(run())
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError("the replica manager is closed")

    async def close(self) -> None:
        """Stop every fetcher and timer; produces waiting for replicas get NotLeaderError;
        write the high-watermark checkpoint a last time (if kept). Closing twice is
        harmless."""
        if self._closed:
            return
        self._closed = True
        if self._checkpoint_task is not None:
            self._checkpoint_task.cancel()
            await asyncio.gather(self._checkpoint_task, return_exceptions=True)
            try:  # the marks as they stand at the end: a clean restart starts from them
                await self.write_checkpoint()
            except OSError as exc:
                log.warning("cannot write the high-watermark checkpoint: %s", exc)
        for led in self._led.values():
            self._fail_waiters(led)
        self._led.clear()
        fetchers = list(self._fetchers.values())
        self._fetchers.clear()
        self._followed.clear()
        for f in fetchers:
            await f.close()
        tasks = [t for t in (self._lag_task, *self._background) if t is not None]
        for t in tasks:
            t.cancel()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)


def hold_back(broker: Broker, node_id: int) -> ReplicaManager:
    """Before a cluster node's listeners open: give ``broker`` a replica manager with no
    role and its high-watermark checkpoint, so that until the node has joined (its
    :class:`~tidewire.cluster.node.ClusterNode` replaces it at start) each partition is
    served only below the high watermark the node knew last, and produces are refused
    (NotLeaderError, retriable) instead of appended without replication.

    Must run in the event loop (the checkpoint's timer). Blocking: reads one small file.
    """
    manager = ReplicaManager(broker, node_id)
    broker.replication = manager
    manager.start_checkpoints()
    return manager


def _resolve(fut: asyncio.Future[None], value: None) -> None:
    if not fut.done():
        fut.set_result(value)
