"""Consumer group membership: who is in each group, in which generation, owning what.

One :class:`GroupCoordinator` runs on the broker's event loop. A group goes through these
states (:data:`TRANSITIONS`, changed only by ``_set_state``)::

    EMPTY --a member joins--> REBALANCING --every member rejoined, or the rebalance
    timeout passed--> STABLE --a member joins, leaves, expires, or the subscribed
    topics change--> REBALANCING;  REBALANCING or STABLE --the last member goes--> EMPTY

A rebalance: every member must send JOIN again (members learn of the rebalance from their
heartbeat's :class:`~tidewire.errors.RebalanceInProgressError`). A join is answered only when
every known member has rejoined, or when the longest ``rebalance_timeout_ms`` of the members
has passed since the rebalance began (members that did not rejoin by then are removed). Then
the generation goes up by one, the broker computes the assignment
(:mod:`tidewire.broker.assignors`) and every waiting join is answered with the new generation
and the member's own partitions.

Fencing: a heartbeat or commit from a member id the group does not know fails with
:class:`~tidewire.errors.UnknownMemberError`, one naming another generation with
:class:`~tidewire.errors.IllegalGenerationError`; a commit for a partition the member does
not own in the current generation with :class:`~tidewire.errors.PartitionNotAssignedError`.
A member whose last heartbeat (or join answer) is older than its ``session_timeout_ms`` is
removed by :meth:`GroupCoordinator.tick`, which the broker calls every
``check_interval_ms``; leaving removes a member at once.

Static membership: a member that joins with a ``group_instance_id`` already in the group,
without a member id (a restart), replaces the old member: it gets a new member id (the old
one is fenced) and, while the group is stable and the subscription is the same, the old
member's partitions and the current generation, without a rebalance.

Replicated membership (a cluster): at each generation change, and when a group's last
member goes, the coordinator hands the group's :meth:`~GroupCoordinator.snapshot` (generation,
strategy, members with their subscriptions, timeouts and assignment) to
:attr:`GroupCoordinator.persist`, which stores it in the group's partition of the offsets
topic. A node that becomes the group's coordinator :meth:`~GroupCoordinator.restore` restores it:
the group is STABLE in that generation, every member's session starts afresh, so members go
on heartbeating and committing with their member id and generation (Kafka's group metadata
records). A change after the last snapshot is not there: its members are fenced
(UnknownMemberError / IllegalGenerationError) and join again. On a single node
``persist`` is None and nothing is written.

Time comes from the injected ``clock`` (ms); tests drive :meth:`GroupCoordinator.tick`
with a fake one.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import re
import secrets
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import msgspec

from tidewire.broker.assignors import Strategy, TopicPartition, assign
from tidewire.errors import (
    GroupFullError,
    GroupNotEmptyError,
    IllegalGenerationError,
    InconsistentGroupProtocolError,
    InvalidGroupError,
    NotCoordinatorError,
    PartitionNotAssignedError,
    RebalanceInProgressError,
    UnknownMemberError,
)

__all__ = [
    "TRANSITIONS",
    "GroupConfig",
    "GroupCoordinator",
    "GroupState",
    "JoinResult",
    "MemberInfo",
]

log = logging.getLogger("tidewire.broker.groups")

#: The longest group id, instance id, client id and subscription pattern (characters).
MAX_ID_CHARS = 255
#: The most topics one member may name in its subscription.
MAX_SUBSCRIBED_TOPICS = 10_000


class GroupState(enum.StrEnum):
    EMPTY = "empty"
    REBALANCING = "rebalancing"
    STABLE = "stable"


#: Every state change a group may make.
TRANSITIONS: Mapping[GroupState, frozenset[GroupState]] = {
    GroupState.EMPTY: frozenset({GroupState.REBALANCING}),
    GroupState.REBALANCING: frozenset({GroupState.STABLE, GroupState.EMPTY}),
    GroupState.STABLE: frozenset({GroupState.REBALANCING, GroupState.EMPTY}),
}


@dataclass(frozen=True, slots=True)
class GroupConfig:
    """Bounds of the coordinator.

    Attributes:
        min_session_timeout_ms, max_session_timeout_ms: the session timeouts members may
            ask for (shorter ones would expire on a busy loop; longer ones keep dead
            members' partitions idle).
        max_rebalance_timeout_ms: the longest a rebalance may wait for members to rejoin.
        max_members: members of one group (each holds a waiting join during a rebalance).
        max_groups: groups with members at once.
        check_interval_ms: how often sessions and rebalance deadlines are checked: the
            granularity of both timeouts.
    """

    min_session_timeout_ms: int = 100
    max_session_timeout_ms: int = 300_000
    max_rebalance_timeout_ms: int = 300_000
    max_members: int = 1_000
    max_groups: int = 10_000
    check_interval_ms: int = 100


@dataclass(frozen=True, slots=True)
class JoinResult:
    """The answer to a join: the member's id, the generation, and its partitions."""

    member_id: str
    generation: int
    assignment: list[TopicPartition]
    strategy: Strategy
    members: int


@dataclass(frozen=True, slots=True)
class MemberInfo:
    member_id: str
    instance_id: str
    client_id: str
    topics: tuple[str, ...]
    pattern: str
    assignment: list[TopicPartition]


@dataclass(slots=True)
class _Member:
    member_id: str
    instance_id: str
    client_id: str
    topics: tuple[str, ...]
    pattern: str
    session_timeout_ms: int
    rebalance_timeout_ms: int
    last_seen: float
    joining: asyncio.Future[JoinResult] | None = None

    def waiting(self) -> bool:
        """Whether a join of this member waits for the rebalance to end."""
        return self.joining is not None and not self.joining.done()


@dataclass(slots=True)
class _Group:
    group_id: str
    state: GroupState = GroupState.EMPTY
    generation: int = 0
    strategy: Strategy = Strategy.STICKY
    members: dict[str, _Member] = field(default_factory=dict)
    instances: dict[str, str] = field(default_factory=dict)  # instance id -> member id
    assignment: dict[str, list[TopicPartition]] = field(default_factory=dict)
    rebalance_deadline: float = 0.0
    #: What the last assignment was computed from: member -> topics, topic -> partitions.
    subscribed: dict[str, list[str]] = field(default_factory=dict)
    partitions: dict[str, int] = field(default_factory=dict)


def _monotonic_ms() -> float:
    return time.monotonic() * 1000


class _MemberRecord(msgspec.Struct, array_like=True, frozen=True):
    """A member as a snapshot holds it."""

    member_id: str
    instance_id: str
    client_id: str
    topics: tuple[str, ...]
    pattern: str
    session_timeout_ms: int
    rebalance_timeout_ms: int
    assignment: list[tuple[str, int]]
    subscribed: list[str]  # the topics its last assignment was computed from


class _GroupRecord(msgspec.Struct, array_like=True, frozen=True):
    """A group's membership as stored (msgpack, as an array: version first)."""

    version: int
    generation: int
    strategy: str
    members: list[_MemberRecord]
    partitions: dict[str, int]  # topic -> partition count of the last assignment


#: The version of :class:`_GroupRecord` this code writes (and the only one it reads).
SNAPSHOT_VERSION = 0
_snapshot_encoder = msgspec.msgpack.Encoder()
_snapshot_decoder = msgspec.msgpack.Decoder(_GroupRecord)


class GroupCoordinator:
    """The membership of every consumer group (see the module docstring).

    Args:
        topics: the broker's topics and their partition counts, now (internal topics left
            out): what subscriptions resolve against.
        config: the bounds.
        clock: monotonic milliseconds.
    """

    def __init__(
        self,
        topics: Callable[[], Mapping[str, int]],
        config: GroupConfig | None = None,
        clock: Callable[[], float] = _monotonic_ms,
    ) -> None:
        self.config = config or GroupConfig()
        self._topics = topics
        self._clock = clock
        self._groups: dict[str, _Group] = {}
        #: Whether a group id is in use by Kafka clients (their protocol's coordinator has
        #: members in it): a tidewire member may not join it.
        self.foreign: Callable[[str], bool] = lambda _: False
        #: Called with a group id and its :meth:`snapshot` (None: no members any more) after
        #: each generation change, in a cluster, to replicate the membership (see the module
        #: docstring); None on a single node. It must not block.
        self.persist: Callable[[str, bytes | None], None] | None = None

    # --- membership ---------------------------------------------------------------------------

    async def join(
        self,
        group_id: str,
        *,
        member_id: str = "",
        instance_id: str = "",
        client_id: str = "",
        topics: Sequence[str] = (),
        pattern: str = "",
        strategy: str = Strategy.STICKY,
        session_timeout_ms: int = 10_000,
        rebalance_timeout_ms: int = 30_000,
    ) -> JoinResult:
        """Join ``group_id`` (``member_id`` empty: as a new member) for ``topics`` and the
        topics whose whole name matches the regular expression ``pattern``; return once the
        rebalance this starts is over (or at once for a static member coming back).

        Raises:
            InvalidGroupError: a bad id, strategy, pattern or timeout.
            InconsistentGroupProtocolError: the group's members use another strategy, or
                Kafka clients use the group.
            UnknownMemberError: ``member_id`` is not in the group (or was replaced or
                removed while this join waited).
            GroupFullError: ``max_members`` or ``max_groups`` reached.
            RebalanceInProgressError: a newer join of the same member replaced this one.
        """
        strat = self._validate(
            group_id,
            instance_id=instance_id,
            client_id=client_id,
            topics=topics,
            pattern=pattern,
            strategy=strategy,
            session_timeout_ms=session_timeout_ms,
            rebalance_timeout_ms=rebalance_timeout_ms,
        )
        now = self._clock()
        group = self._groups.get(group_id)
        if group is None and self.foreign(group_id):
            raise InconsistentGroupProtocolError(
                f"group {group_id!r} is in use by Kafka clients (Kafka's group protocol); "
                "tidewire members cannot join it"
            )
        if group is None:
            if len(self._groups) >= self.config.max_groups:
                raise GroupFullError(
                    f"{len(self._groups):,} groups have members (max_groups="
                    f"{self.config.max_groups:,})"
                )
            group = self._groups[group_id] = _Group(group_id, strategy=strat)
        if group.members and strat is not group.strategy:
            raise InconsistentGroupProtocolError(
                f"group {group_id!r} uses strategy {group.strategy!s}, not {strat!s}"
            )
        subscription = (tuple(sorted(set(topics))), pattern)
        member: _Member | None = None
        if member_id:
            member = group.members.get(member_id)
            if member is None:
                if not group.members:  # created for this join only: leave nothing behind
                    del self._groups[group_id]
                raise UnknownMemberError(f"member {member_id!r} is not in group {group_id!r}")
        elif instance_id and instance_id in group.instances:
            member = self._replace_static(group, group.instances[instance_id], client_id)
            if group.state is GroupState.STABLE and (member.topics, member.pattern) == subscription:
                member.session_timeout_ms = session_timeout_ms
                member.rebalance_timeout_ms = rebalance_timeout_ms
                member.last_seen = now
                log.info("group %s: static member %s is back", group_id, instance_id)
                self._persist(group)
                return self._result(group, member)
        if member is None:
            if len(group.members) >= self.config.max_members:
                raise GroupFullError(
                    f"group {group_id!r} has {len(group.members):,} members (max_members="
                    f"{self.config.max_members:,})"
                )
            member = _Member(
                _new_member_id(instance_id or client_id), instance_id, client_id, (), "", 0, 0, now
            )
            group.members[member.member_id] = member
            if instance_id:
                group.instances[instance_id] = member.member_id
        member.topics, member.pattern = subscription
        member.client_id = client_id
        member.session_timeout_ms = session_timeout_ms
        member.rebalance_timeout_ms = rebalance_timeout_ms
        member.last_seen = now
        group.strategy = strat
        if member.joining is not None and not member.joining.done():
            member.joining.set_exception(
                RebalanceInProgressError("a newer join of this member replaced this one")
            )
        fut: asyncio.Future[JoinResult] = asyncio.get_running_loop().create_future()
        member.joining = fut
        if group.state is not GroupState.REBALANCING:
            self._start_rebalance(group, now, f"member {member.member_id} joined")
        self._complete_if_all_joined(group, now)
        return await fut

    def heartbeat(self, group_id: str, member_id: str, generation: int) -> None:
        """Keep the member's session alive.

        Raises:
            UnknownMemberError: not a member (any more).
            RebalanceInProgressError: a rebalance began: join again.
            IllegalGenerationError: ``generation`` is not the current one.
        """
        member, group = self._member(group_id, member_id)
        member.last_seen = self._clock()
        if member.waiting():
            return  # it is rejoining already: a heartbeat sent meanwhile changes nothing
        if group.state is GroupState.REBALANCING:
            raise RebalanceInProgressError(
                f"group {group_id!r} is rebalancing from generation {group.generation}: join again"
            )
        if generation != group.generation:
            raise IllegalGenerationError(
                f"generation {generation} of group {group_id!r} is over; it is "
                f"{group.generation} now"
            )

    def leave(self, group_id: str, member_id: str) -> None:
        """Remove a member at once; the others rebalance.

        Raises:
            UnknownMemberError: not a member.
        """
        member, group = self._member(group_id, member_id)
        self._remove(group, member, "left the group", UnknownMemberError("the member left"))
        self._after_removal(group, self._clock())

    def check_commit(
        self, group_id: str, member_id: str, generation: int, partitions: Sequence[TopicPartition]
    ) -> None:
        """Whether this member may commit offsets for ``partitions`` now. A commit with
        ``generation`` -1 and no member id is one from outside the group (an admin, a
        consumer without group membership): allowed only while the group has no members.

        Raises:
            GroupNotEmptyError: an outside commit to a group with members.
            UnknownMemberError, IllegalGenerationError: a stale member.
            PartitionNotAssignedError: a partition it does not own in this generation.
        """
        group = self._groups.get(group_id)
        if not member_id and generation < 0:
            if self.foreign(group_id):
                raise GroupNotEmptyError(
                    f"group {group_id!r} has Kafka members: only they may commit, with "
                    "their member id and generation"
                )
            if group is not None and group.members:
                raise GroupNotEmptyError(
                    f"group {group_id!r} has {len(group.members)} member(s): only they may "
                    "commit, with their member id and generation"
                )
            return
        member, group = self._member(group_id, member_id)
        if generation != group.generation:
            raise IllegalGenerationError(
                f"generation {generation} of group {group_id!r} is over; it is "
                f"{group.generation} now"
            )
        owned = set(group.assignment.get(member.member_id, ()))
        for tp in partitions:
            if tp not in owned:
                raise PartitionNotAssignedError(
                    f"{tp[0]!r} partition {tp[1]} is not assigned to member {member_id!r} in "
                    f"generation {generation} of group {group_id!r}"
                )

    # --- time and topics ----------------------------------------------------------------------

    def tick(self) -> None:
        """Remove members whose session expired, and end rebalances whose time is up."""
        now = self._clock()
        for group in list(self._groups.values()):
            expired = [
                m
                for m in group.members.values()
                if not m.waiting() and now - m.last_seen > m.session_timeout_ms
            ]
            for m in expired:
                self._remove(
                    group,
                    m,
                    f"session of {m.session_timeout_ms} ms expired",
                    UnknownMemberError("the member's session expired"),
                )
            if group.state is GroupState.REBALANCING and now >= group.rebalance_deadline:
                for m in [m for m in group.members.values() if not m.waiting()]:
                    self._remove(
                        group,
                        m,
                        "did not rejoin within the rebalance timeout",
                        UnknownMemberError("the member did not rejoin in time"),
                    )
            if expired or group.state is GroupState.REBALANCING:
                self._after_removal(group, now)

    def topics_changed(self) -> None:
        """Rebalance every stable group whose subscriptions now resolve to other topics or
        partition counts (a topic was created, deleted or given more partitions)."""
        stable = [g for g in self._groups.values() if g.state is GroupState.STABLE]
        if not stable:  # every topic creation lands here: no walk over the topics for nothing
            return
        now = self._clock()
        topics = self._topics()
        for group in stable:
            subs = self._resolve(group, topics)
            counts = {t: topics[t] for ts in subs.values() for t in ts}
            if subs != group.subscribed or counts != group.partitions:
                self._start_rebalance(group, now, "the subscribed topics changed")

    def close(self) -> None:
        """Fail every waiting join (the broker is stopping)."""
        for group in self._groups.values():
            for m in group.members.values():
                if m.waiting():
                    assert m.joining is not None
                    m.joining.set_exception(
                        RebalanceInProgressError("the broker is shutting down; join again")
                    )

    def forget(self, keep: Callable[[str], bool]) -> list[str]:
        """Drop every group for which ``keep(group_id)`` is false, with its members (this node
        stopped coordinating them, in a cluster): their waiting joins fail with
        :class:`NotCoordinatorError`, and their next request is answered so too, which sends
        them to the new coordinator.

        Returns:
            The group ids dropped.
        """
        dropped = [g for g in self._groups if not keep(g)]
        for group_id in dropped:
            group = self._groups.pop(group_id)
            for m in group.members.values():
                if m.waiting():
                    assert m.joining is not None
                    m.joining.set_exception(
                        NotCoordinatorError(
                            f"group {group_id!r}: this node stopped coordinating it; "
                            "find its coordinator again"
                        )
                    )
        return dropped

    # --- queries ------------------------------------------------------------------------------

    def group_ids(self) -> list[str]:
        """Groups with members."""
        return sorted(self._groups)

    def state(self, group_id: str) -> tuple[GroupState, int, Strategy | None]:
        """(state, generation, strategy); a group without members is EMPTY."""
        group = self._groups.get(group_id)
        if group is None:
            return GroupState.EMPTY, 0, None
        return group.state, group.generation, group.strategy

    def members(self, group_id: str) -> list[MemberInfo]:
        """The members with what they own in the current generation."""
        group = self._groups.get(group_id)
        if group is None:
            return []
        return [
            MemberInfo(
                m.member_id,
                m.instance_id,
                m.client_id,
                m.topics,
                m.pattern,
                list(group.assignment.get(m.member_id, [])),
            )
            for m in sorted(group.members.values(), key=lambda m: m.member_id)
        ]

    def has_members(self, group_id: str) -> bool:
        group = self._groups.get(group_id)
        return group is not None and bool(group.members)

    # --- replicated membership -------------------------------------------------------------------

    def snapshot(self, group_id: str) -> bytes | None:
        """``group_id``'s generation and members as stored (see the module docstring); None
        when it has no members or no generation yet."""
        group = self._groups.get(group_id)
        if group is None or not group.members or not group.generation:
            return None
        record = _GroupRecord(
            SNAPSHOT_VERSION,
            group.generation,
            str(group.strategy),
            [
                _MemberRecord(
                    m.member_id,
                    m.instance_id,
                    m.client_id,
                    m.topics,
                    m.pattern,
                    m.session_timeout_ms,
                    m.rebalance_timeout_ms,
                    list(group.assignment.get(m.member_id, [])),
                    list(group.subscribed.get(m.member_id, [])),
                )
                for m in group.members.values()
            ],
            dict(group.partitions),
        )
        return _snapshot_encoder.encode(record)

    def restore(self, group_id: str, data: bytes) -> bool:
        """Carry on ``group_id`` from a :meth:`snapshot` (this node became its coordinator):
        STABLE in the snapshot's generation, each member's session starting now. A group this
        coordinator holds already, or a snapshot it cannot read (logged), is left alone.

        Returns:
            Whether the group was restored.
        """
        if group_id in self._groups:
            return False
        try:
            record = _snapshot_decoder.decode(data)
            if record.version != SNAPSHOT_VERSION:
                raise ValueError(f"snapshot version {record.version}")
            strategy = Strategy(record.strategy)
        except (msgspec.DecodeError, ValueError) as exc:
            log.warning("group %s: its stored membership is not read: %s", group_id, exc)
            return False
        if not record.members:
            return False
        now = self._clock()
        group = _Group(group_id, GroupState.STABLE, record.generation, strategy)
        for r in record.members:
            group.members[r.member_id] = _Member(
                r.member_id,
                r.instance_id,
                r.client_id,
                tuple(r.topics),
                r.pattern,
                r.session_timeout_ms,
                r.rebalance_timeout_ms,
                now,
            )
            if r.instance_id:
                group.instances[r.instance_id] = r.member_id
            group.assignment[r.member_id] = [(t, p) for t, p in r.assignment]
            group.subscribed[r.member_id] = list(r.subscribed)
        group.partitions = dict(record.partitions)
        self._groups[group_id] = group
        log.info(
            "group %s: carried on at generation %d with %d member(s)",
            group_id,
            group.generation,
            len(group.members),
        )
        return True

    def _persist(self, group: _Group) -> None:
        if self.persist is not None:
            self.persist(group.group_id, self.snapshot(group.group_id))

    # --- internals ------------------------------------------------------------------------------

    def _validate(
        self,
        group_id: str,
        *,
        instance_id: str,
        client_id: str,
        topics: Sequence[str],
        pattern: str,
        strategy: str,
        session_timeout_ms: int,
        rebalance_timeout_ms: int,
    ) -> Strategy:
        cfg = self.config
        if not group_id or len(group_id) > MAX_ID_CHARS:
            raise InvalidGroupError(f"group id must have 1..{MAX_ID_CHARS} characters")
        for name, value in (("group_instance_id", instance_id), ("client_id", client_id)):
            if len(value) > MAX_ID_CHARS:
                raise InvalidGroupError(
                    f"{name} of {len(value):,} characters exceeds {MAX_ID_CHARS}"
                )
        if len(topics) > MAX_SUBSCRIBED_TOPICS:
            raise InvalidGroupError(
                f"{len(topics):,} topics exceed the {MAX_SUBSCRIBED_TOPICS:,} one member may name"
            )
        if not topics and not pattern:
            raise InvalidGroupError("a member must subscribe to topics or a pattern")
        if len(pattern) > MAX_ID_CHARS:
            raise InvalidGroupError(
                f"pattern of {len(pattern):,} characters exceeds {MAX_ID_CHARS}"
            )
        if pattern:
            try:
                re.compile(pattern)
            except re.error as exc:
                raise InvalidGroupError(
                    f"pattern {pattern!r} is not a regular expression: {exc}"
                ) from None
        try:
            strat = Strategy(strategy)
        except ValueError:
            raise InvalidGroupError(
                f"strategy {strategy!r} is not one of {', '.join(s.value for s in Strategy)}"
            ) from None
        if not cfg.min_session_timeout_ms <= session_timeout_ms <= cfg.max_session_timeout_ms:
            raise InvalidGroupError(
                f"session_timeout_ms={session_timeout_ms:,} must be within "
                f"{cfg.min_session_timeout_ms:,}..{cfg.max_session_timeout_ms:,}"
            )
        if not 1 <= rebalance_timeout_ms <= cfg.max_rebalance_timeout_ms:
            raise InvalidGroupError(
                f"rebalance_timeout_ms={rebalance_timeout_ms:,} must be within "
                f"1..{cfg.max_rebalance_timeout_ms:,}"
            )
        return strat

    def _member(self, group_id: str, member_id: str) -> tuple[_Member, _Group]:
        group = self._groups.get(group_id)
        member = None if group is None else group.members.get(member_id)
        if member is None or group is None:
            raise UnknownMemberError(f"member {member_id!r} is not in group {group_id!r}")
        return member, group

    def _set_state(self, group: _Group, state: GroupState) -> None:
        if state is group.state:
            return
        if state not in TRANSITIONS[group.state]:
            raise AssertionError(f"group {group.group_id}: {group.state} -> {state} is not allowed")
        group.state = state

    def _start_rebalance(self, group: _Group, now: float, why: str) -> None:
        self._set_state(group, GroupState.REBALANCING)
        group.rebalance_deadline = now + max(
            (m.rebalance_timeout_ms for m in group.members.values()), default=0
        )
        log.info("group %s: rebalancing (%s)", group.group_id, why)

    def _replace_static(self, group: _Group, old_id: str, client_id: str) -> _Member:
        """A static member restarted: the same member under a new id; the old id is fenced."""
        old = group.members.pop(old_id)
        if old.waiting():
            assert old.joining is not None
            old.joining.set_exception(UnknownMemberError("a new instance replaced this member"))
        new_id = _new_member_id(old.instance_id)
        old.member_id, old.client_id, old.joining = new_id, client_id, None
        group.members[new_id] = old
        group.instances[old.instance_id] = new_id
        if old_id in group.assignment:
            group.assignment[new_id] = group.assignment.pop(old_id)
        if old_id in group.subscribed:
            group.subscribed[new_id] = group.subscribed.pop(old_id)
        return old

    def _remove(self, group: _Group, member: _Member, why: str, error: Exception) -> None:
        del group.members[member.member_id]
        if member.instance_id and group.instances.get(member.instance_id) == member.member_id:
            del group.instances[member.instance_id]
        if member.waiting():
            assert member.joining is not None
            member.joining.set_exception(error)
        log.info("group %s: member %s removed: %s", group.group_id, member.member_id, why)

    def _after_removal(self, group: _Group, now: float) -> None:
        if not group.members:
            self._set_state(group, GroupState.EMPTY)
            del self._groups[group.group_id]
            if group.generation:  # it had a generation, so maybe a snapshot: drop it
                self._persist(group)
            return
        if group.state is GroupState.STABLE and set(group.members) != set(group.assignment):
            self._start_rebalance(group, now, "a member went")
        if group.state is GroupState.REBALANCING:
            self._complete_if_all_joined(group, now)

    def _complete_if_all_joined(self, group: _Group, now: float) -> None:
        if group.state is not GroupState.REBALANCING:
            return
        if not all(m.waiting() for m in group.members.values()):
            return
        topics = self._topics()
        subs = self._resolve(group, topics)
        counts = {t: topics[t] for ts in subs.values() for t in ts}
        previous = {m: tps for m, tps in group.assignment.items() if m in group.members}
        group.assignment = assign(group.strategy, subs, counts, previous)
        group.subscribed, group.partitions = subs, counts
        group.generation += 1
        self._set_state(group, GroupState.STABLE)
        log.info(
            "group %s: generation %d with %d member(s)",
            group.group_id,
            group.generation,
            len(group.members),
        )
        self._persist(group)
        for m in group.members.values():
            m.last_seen = now
            assert m.joining is not None
            m.joining.set_result(self._result(group, m))
            m.joining = None

    def _resolve(self, group: _Group, topics: Mapping[str, int]) -> dict[str, list[str]]:
        """member id -> the existing topics it subscribes to, by name or pattern."""
        out: dict[str, list[str]] = {}
        for m in group.members.values():
            names = {t for t in m.topics if t in topics}
            if m.pattern:
                rx = re.compile(m.pattern)
                names.update(t for t in topics if rx.fullmatch(t))
            out[m.member_id] = sorted(names)
        return out

    def _result(self, group: _Group, member: _Member) -> JoinResult:
        return JoinResult(
            member.member_id,
            group.generation,
            list(group.assignment.get(member.member_id, [])),
            group.strategy,
            len(group.members),
        )


def _new_member_id(prefix: str) -> str:
    return f"{prefix or 'member'}-{secrets.token_hex(8)}"
