"""The consumer-group operations the protocol serves: membership (through the
:class:`~tidewire.broker.groups.GroupCoordinator`), committed offsets (through the
:class:`~tidewire.broker.offsets.OffsetStore`), and the views and changes an operator makes:
list, describe with lag, delete, reset.

Kafka clients' groups (:mod:`tidewire.broker.kafka_groups`, :attr:`ConsumerGroups.kafka`)
live beside tidewire's: a group id is used by one protocol or the other while it has
members, both commit into the same offsets log, and the views here show both.

In a cluster the membership of tidewire's groups is replicated too: each generation change
is written to the group's partition of the offsets topic in the background (one writer task
per partition, the latest snapshot of each group only, in order), and a node that takes a
partition over carries its groups on from there (see :mod:`tidewire.broker.groups`). Members
are answered without waiting for that write: a coordinator lost before it landed leaves the
previous generation, whose members are fenced and join again, as before.

``Broker.groups`` is the one instance; it exists while the broker runs.
"""

from __future__ import annotations

import asyncio
import enum
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from tidewire.broker.assignors import TopicPartition
from tidewire.broker.groups import GroupCoordinator, GroupState, MemberInfo
from tidewire.broker.kafka_consumer_protocol import decode_assignment, decode_subscription
from tidewire.broker.kafka_groups import KafkaGroupConfig, KafkaGroupCoordinator, KafkaGroupState
from tidewire.broker.offsets import Committed, OffsetStore, partition_for
from tidewire.errors import (
    GroupNotEmptyError,
    InvalidRequestError,
    TidewireError,
    UnknownGroupError,
    UnknownPartitionError,
    UnknownTopicError,
)

__all__ = [
    "ConsumerGroups",
    "GroupDescription",
    "GroupListing",
    "PartitionLag",
    "ResetResult",
    "ResetTo",
]

log = logging.getLogger("tidewire.broker.groups")

#: Partitions one commit may name: a commit is one record batch of the offsets topic.
MAX_COMMIT_PARTITIONS = 10_000
#: The longest metadata string stored with an offset (characters).
MAX_METADATA_CHARS = 4_096


class ResetTo(enum.StrEnum):
    """Where ``reset`` moves a group's offsets."""

    EARLIEST = "earliest"
    LATEST = "latest"
    OFFSET = "offset"
    TIMESTAMP = "timestamp"


@dataclass(frozen=True, slots=True)
class GroupListing:
    group_id: str
    state: GroupState
    members: int


@dataclass(frozen=True, slots=True)
class PartitionLag:
    """A partition's committed offset (-1: none), end offset (the high watermark) and lag
    (end - committed; -1 when nothing is committed)."""

    topic: str
    partition: int
    committed: int
    end_offset: int
    lag: int
    metadata: str = ""


@dataclass(frozen=True, slots=True)
class GroupDescription:
    group_id: str
    state: GroupState
    generation: int
    strategy: str
    members: list[MemberInfo]
    offsets: list[PartitionLag]


@dataclass(frozen=True, slots=True)
class ResetResult:
    topic: str
    partition: int
    previous: int  # -1: nothing was committed
    offset: int


class ConsumerGroups:
    """Consumer groups of one broker. Membership requests go to :attr:`coordinator`.

    Args:
        coordinator: the membership.
        offsets: the committed offsets (loaded).
        topics: topic -> partition count, internal topics left out.
        list_offset: ``(topic, partition, timestamp)`` -> offset, as ``Broker.list_offset``
            (-2 earliest, -1 the high watermark, else the first offset at or after a time).
        kafka: the coordinator of Kafka clients' groups (one with ``kafka_config`` is made
            when not given).
    """

    def __init__(
        self,
        coordinator: GroupCoordinator,
        offsets: OffsetStore,
        topics: Callable[[], Mapping[str, int]],
        list_offset: Callable[[str, int, int], int],
        *,
        kafka: KafkaGroupCoordinator | None = None,
        kafka_config: KafkaGroupConfig | None = None,
    ) -> None:
        self.coordinator = coordinator
        self.offsets = offsets
        self._topics = topics
        self._list_offset = list_offset
        self.kafka = kafka or KafkaGroupCoordinator(kafka_config)
        # a group id belongs to one protocol while it has members
        self.kafka.foreign = coordinator.has_members
        coordinator.foreign = self.kafka.has_members
        coordinator.persist = self._membership_changed
        # Replicated membership, per partition of the offsets topic: the snapshots waiting to
        # be written (group -> snapshot; at most one per group with members, so bounded by
        # max_groups) and the task writing them.
        self._unwritten: dict[int, dict[str, bytes | None]] = {}
        self._writers: dict[int, asyncio.Task[None]] = {}
        self._cancelled: set[asyncio.Task[None]] = set()  # writers stopped, until they end

    # --- the cluster ------------------------------------------------------------------------------

    def check_coordinator(self, group_id: str) -> None:
        """Raise :class:`~tidewire.errors.NotCoordinatorError` unless this node coordinates
        ``group_id`` (always so on a single node): in a cluster, the leader of the group's
        partition of the offsets topic does, once it has read that partition."""
        self.offsets.check_coordinator(group_id)

    def take_over(self, partition: int) -> None:
        """This node now leads ``partition`` of the offsets topic: load it, serve its groups,
        carrying on each one's membership from its last stored generation (its members go on
        heartbeating here with their member ids and generation)."""
        self.offsets.take_over(partition)
        for group_id, data in sorted(self.offsets.memberships(partition).items()):
            self.coordinator.restore(group_id, data)

    def give_up(self, partition: int) -> None:
        """This node no longer leads ``partition`` of the offsets topic: forget its groups'
        offsets and members (whose next request learns to find the coordinator again), and
        the membership snapshots not written yet (the new coordinator writes its own)."""
        self._unwritten.pop(partition, None)
        task = self._writers.pop(partition, None)
        if task is not None:  # its write is refused anyway: this node no longer leads it
            task.cancel()
            self._cancelled.add(task)
            task.add_done_callback(self._cancelled.discard)
        self.offsets.give_up(partition)
        self.coordinator.forget(self.offsets.serves)

    def _membership_changed(self, group_id: str, snapshot: bytes | None) -> None:
        """A group's generation changed (or its last member went): in a cluster, write its
        snapshot to the offsets topic in the background, after those waiting before it."""
        if not self.offsets.clustered or not self.offsets.serves(group_id):
            return
        p = partition_for(group_id)
        self._unwritten.setdefault(p, {})[group_id] = snapshot
        task = self._writers.get(p)
        if task is None or task.done():
            self._writers[p] = asyncio.get_running_loop().create_task(
                self._write_memberships(p), name=f"group membership writer {p}"
            )

    async def _write_memberships(self, p: int) -> None:
        """Write partition ``p``'s waiting snapshots one by one until none waits. A failed
        write is logged and dropped: the group's members are answered already, and should
        the coordinator move before a later write lands they join again there."""
        while pending := self._unwritten.get(p):
            group_id = next(iter(pending))
            snapshot = pending.pop(group_id)
            try:
                await self.offsets.write_membership(group_id, snapshot)
            except TidewireError as exc:
                log.warning("group %s: membership not replicated: %s", group_id, exc)
        self._unwritten.pop(p, None)
        if self._writers.get(p) is asyncio.current_task():
            del self._writers[p]

    async def close(self) -> None:
        """Stop writing membership snapshots, and close the Kafka clients' groups (the
        broker is stopping)."""
        writers = [*self._writers.values(), *self._cancelled]
        self._writers.clear()
        self._unwritten.clear()
        for task in writers:
            task.cancel()
        if writers:
            await asyncio.gather(*writers, return_exceptions=True)
        await self.kafka.close()

    def has_members(self, group_id: str) -> bool:
        """Whether tidewire or Kafka clients are members of ``group_id``."""
        return self.coordinator.has_members(group_id) or self.kafka.has_members(group_id)

    def _end_offset(self, topic: str, partition: int) -> int:
        """A partition's high watermark, or -1 (lag unknown) when this node holds no replica
        of it (in a cluster a coordinator need not hold the partitions its groups read)."""
        try:
            return self._list_offset(topic, partition, -1)
        except (UnknownTopicError, UnknownPartitionError):
            return -1

    def _members_of(self, group_id: str) -> list[MemberInfo]:
        return self.coordinator.members(group_id) or self._kafka_members(group_id)

    def _kafka_members(self, group_id: str) -> list[MemberInfo]:
        """Kafka members as tidewire shows members: a ``consumer`` protocol member's
        subscribed topics and assigned partitions are read from its metadata."""
        d = self.kafka.describe(group_id)
        if d is None:
            return []
        consumer = d.protocol_type == "consumer"
        return [
            MemberInfo(
                m.member_id,
                m.group_instance_id or "",
                m.client_id,
                decode_subscription(m.subscription) if consumer else (),
                "",
                decode_assignment(m.assignment) if consumer else [],
            )
            for m in sorted(d.members, key=lambda m: m.member_id)
        ]

    def _state(self, group_id: str) -> tuple[GroupState, int, str]:
        """(state, generation, strategy or Kafka protocol name) of either protocol."""
        if not self.coordinator.has_members(group_id):
            d = self.kafka.describe(group_id)
            if d is not None:
                return _KAFKA_STATES[d.state], d.generation, d.protocol_name
        state, generation, strategy = self.coordinator.state(group_id)
        return state, generation, "" if strategy is None else str(strategy)

    # --- offsets ----------------------------------------------------------------------------------

    async def commit(
        self,
        group_id: str,
        offsets: Mapping[TopicPartition, tuple[int, str]],
        *,
        member_id: str = "",
        generation: int = -1,
    ) -> None:
        """Commit ``offsets`` (partition -> (next offset to read, metadata)) for a member of
        ``group_id`` in ``generation`` (or, with ``member_id`` empty and ``generation`` -1,
        from outside a group that has no members). Returns once they are fsynced.

        Raises:
            InvalidRequestError: no partitions, too many, a negative offset, metadata too long.
            UnknownTopicError, UnknownPartitionError: no such partition.
            UnknownMemberError, IllegalGenerationError, PartitionNotAssignedError,
            GroupNotEmptyError: the commit is fenced (nothing is written).
            StorageError, LogFailedError, BackpressureError: the offsets log refused.
        """
        if not group_id:
            raise InvalidRequestError("a commit needs a group id")
        if not offsets or len(offsets) > MAX_COMMIT_PARTITIONS:
            raise InvalidRequestError(
                f"a commit names 1..{MAX_COMMIT_PARTITIONS:,} partitions, not {len(offsets):,}"
            )
        topics = self._topics()
        for (topic, partition), (offset, metadata) in offsets.items():
            _check_partition(topics, topic, partition)
            if offset < 0:
                raise InvalidRequestError(f"offset {offset} of {topic!r}/{partition} is negative")
            if len(metadata) > MAX_METADATA_CHARS:
                raise InvalidRequestError(
                    f"metadata of {len(metadata):,} characters exceeds {MAX_METADATA_CHARS:,}"
                )
        self.coordinator.check_commit(group_id, member_id, generation, list(offsets))
        await self.offsets.commit(group_id, offsets)

    async def commit_checked(
        self, group_id: str, offsets: Mapping[TopicPartition, tuple[int, str]]
    ) -> None:
        """Store ``offsets`` whose committer the caller has checked already (Kafka's
        OffsetCommit, fenced by :meth:`KafkaGroupCoordinator.check_commit`, partitions and
        metadata checked per partition); returns once they are fsynced.

        Raises:
            StorageError, LogFailedError, BackpressureError: the offsets log refused.
        """
        if offsets:
            await self.offsets.commit(group_id, offsets)

    def committed(
        self, group_id: str, partitions: Sequence[TopicPartition] | None = None
    ) -> dict[TopicPartition, Committed]:
        """The committed offsets of ``group_id`` (of ``partitions`` only, when given; a
        partition with nothing committed is left out)."""
        got = self.offsets.get(group_id)
        if partitions is None:
            return got
        return {tp: got[tp] for tp in partitions if tp in got}

    # --- administration ---------------------------------------------------------------------------

    def list_groups(self) -> list[GroupListing]:
        """Every group with members or committed offsets."""
        out = []
        names = set(self.coordinator.group_ids()) | set(self.kafka.group_ids())
        for g in sorted(names | self.offsets.groups()):
            state, _, _ = self._state(g)
            out.append(GroupListing(g, state, len(self._members_of(g))))
        return out

    def describe(self, group_id: str) -> GroupDescription:
        """State, members with their assignment, and every partition's committed offset,
        end offset and lag: the partitions of the topics the group commits to or whose
        partitions its members own.

        Raises:
            UnknownGroupError: no members and no committed offsets.
        """
        members = self._members_of(group_id)
        committed = self.offsets.get(group_id)
        if not members and not committed and not self.kafka.exists(group_id):
            raise UnknownGroupError(f"group {group_id!r} does not exist")
        state, generation, strategy = self._state(group_id)
        topics = self._topics()
        names = {t for t, _ in committed} | {t for m in members for t, _ in m.assignment}
        lags: list[PartitionLag] = []
        for topic in sorted(names):
            n = topics.get(topic, 0)
            parts = sorted({p for t, p in committed if t == topic} | set(range(n)))
            for p in parts:
                c = committed.get((topic, p))
                end = self._end_offset(topic, p) if p < n else -1
                off = -1 if c is None else c.offset
                lag = -1 if c is None or end < 0 else max(end - off, 0)
                lags.append(PartitionLag(topic, p, off, end, lag, "" if c is None else c.metadata))
        return GroupDescription(group_id, state, generation, strategy, members, lags)

    async def delete(self, group_id: str) -> None:
        """Forget a group at rest and its committed offsets (durably).

        Raises:
            GroupNotEmptyError: it has members.
            UnknownGroupError: it does not exist.
        """
        if self.has_members(group_id):
            raise GroupNotEmptyError(
                f"group {group_id!r} has {len(self._members_of(group_id))} member(s)"
            )
        known = self.kafka.exists(group_id)
        self.kafka.delete(group_id)
        if group_id not in self.offsets.groups():
            if known:
                return
            raise UnknownGroupError(f"group {group_id!r} does not exist")
        await self.offsets.delete(group_id)

    async def reset(
        self,
        group_id: str,
        topic: str,
        to: ResetTo,
        *,
        partitions: Sequence[int] | None = None,
        value: int = 0,
        dry_run: bool = False,
    ) -> list[ResetResult]:
        """Move the committed offsets of a group at rest for ``topic`` (its ``partitions``,
        or all): to the log start, to the end (high watermark), to ``value`` (clamped to
        the log's range), or to the first offset whose timestamp is at or after ``value``
        ms (the end when there is none). ``dry_run``: only say what would change.

        Raises:
            GroupNotEmptyError: the group has members.
            UnknownTopicError, UnknownPartitionError: no such place.
            InvalidRequestError: a negative offset or timestamp.
        """
        if not group_id:
            raise InvalidRequestError("a reset needs a group id")
        if self.has_members(group_id):
            raise GroupNotEmptyError(
                f"group {group_id!r} has {len(self._members_of(group_id))} member(s): "
                "stop its consumers before resetting its offsets"
            )
        if to in (ResetTo.OFFSET, ResetTo.TIMESTAMP) and value < 0:
            raise InvalidRequestError(f"reset to {to} {value}: must be >= 0")
        topics = self._topics()
        n = topics.get(topic)
        parts = list(range(n or 0)) if partitions is None else sorted(set(partitions))
        for p in parts or [0]:
            _check_partition(topics, topic, p)
        committed = self.offsets.get(group_id)
        out: list[ResetResult] = []
        for p in parts:
            start = self._list_offset(topic, p, -2)
            end = self._list_offset(topic, p, -1)
            if to is ResetTo.EARLIEST:
                new = start
            elif to is ResetTo.LATEST:
                new = end
            elif to is ResetTo.OFFSET:
                new = min(max(value, start), end)
            else:
                new = self._list_offset(topic, p, value)
            c = committed.get((topic, p))
            out.append(ResetResult(topic, p, -1 if c is None else c.offset, new))
        if not dry_run and out:
            await self.offsets.commit(
                group_id, {(r.topic, r.partition): (r.offset, "") for r in out}
            )
        return out


#: How tidewire's views show the states of Kafka groups.
_KAFKA_STATES = {
    KafkaGroupState.EMPTY: GroupState.EMPTY,
    KafkaGroupState.DEAD: GroupState.EMPTY,
    KafkaGroupState.PREPARING_REBALANCE: GroupState.REBALANCING,
    KafkaGroupState.COMPLETING_REBALANCE: GroupState.REBALANCING,
    KafkaGroupState.STABLE: GroupState.STABLE,
}


def _check_partition(topics: Mapping[str, int], topic: str, partition: int) -> None:
    n = topics.get(topic)
    if n is None:
        raise UnknownTopicError(f"topic {topic!r} does not exist")
    if not 0 <= partition < n:
        raise UnknownPartitionError(f"topic {topic!r} has partitions 0..{n - 1}, not {partition}")
