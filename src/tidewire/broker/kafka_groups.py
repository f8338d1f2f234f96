"""Kafka's classic consumer-group protocol (client-side assignors), as Kafka's
``GroupCoordinator`` runs it.

A Kafka group's members agree on a protocol (``protocol_type``, e.g. ``consumer``, and one
of the protocol names every member offers, e.g. ``range``); the broker does not read the
members' metadata or compute assignments: the leader it picks gets every member's metadata in
its JoinGroup answer, computes the assignment and hands it back in its SyncGroup, and the
broker passes each member its part.

States (:data:`TRANSITIONS`, changed only by ``_set_state``)::

    Empty --a member joins--> PreparingRebalance --every known member rejoined, or the
    rebalance timeout passed--> CompletingRebalance --the leader's SyncGroup--> Stable
    Stable / CompletingRebalance --a member joins with other protocols, leaves or
    expires--> PreparingRebalance --no member left--> Empty;  Empty --DeleteGroups--> Dead

- **JoinGroup** (v4+): a member without a member id gets ``MEMBER_ID_REQUIRED`` and a new
  id first (it is *pending* until it joins with it). A join waits in PreparingRebalance
  until every member rejoined (the join of the last one completes the rebalance) or the
  longest rebalance timeout of the members passed (members that did not rejoin are
  removed). The first rebalance of an Empty group waits ``initial_rebalance_delay_ms`` first,
  and that much again each time another member arrived meanwhile (up to the rebalance
  timeout), so that consumers starting together make one generation, not one each.
- **SyncGroup**: followers wait for the leader's; the leader's assignments are given to
  every member and the group is Stable. Members that do not sync within the rebalance
  timeout are removed and the group rebalances.
- **Heartbeat**: ``REBALANCE_IN_PROGRESS`` while the group is PreparingRebalance (the member
  must join again), ``ILLEGAL_GENERATION`` for another generation, ``UNKNOWN_MEMBER_ID`` for a
  member the group does not know. A member that sends nothing for its session timeout is
  removed (not while its join or sync waits: those are bounded by the rebalance timeout).
- **LeaveGroup** removes members at once; the others rebalance.
- **Static members** (``group_instance_id``): a join without member id of an instance the
  group knows replaces that member (the old id is fenced with ``FENCED_INSTANCE_ID``).

Results carry Kafka's error codes (:class:`GroupError`, the same numbers as Kafka's
``Errors``), because the protocol's semantics are spelled in them. Group state lives in
memory only: Kafka persists group metadata, but members find out about a restart at their
next heartbeat (``UNKNOWN_MEMBER_ID``) and join again; committed offsets are durable, in
tidewire's offsets log (:mod:`tidewire.broker.offsets`).

Time comes from the injected ``clock`` (monotonic ms). A timer task sleeps until the
earliest deadline (a session, a rebalance or sync timeout, the initial delay) and calls
:meth:`KafkaGroupCoordinator.tick`; tests without the task call ``tick`` with a fake clock.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import math
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

__all__ = [
    "TRANSITIONS",
    "GroupError",
    "JoinMember",
    "JoinResult",
    "KafkaGroupConfig",
    "KafkaGroupCoordinator",
    "KafkaGroupDescription",
    "KafkaGroupState",
    "KafkaMemberDescription",
    "SyncResult",
]

log = logging.getLogger("tidewire.broker.kafka_groups")

#: The longest group id, member id, instance id and protocol name (characters).
MAX_ID_CHARS = 255
#: The most protocols one member may offer in a join.
MAX_PROTOCOLS = 100


class GroupError(enum.IntEnum):
    """The Kafka error codes the group protocol answers with (Kafka's numbers)."""

    NONE = 0
    UNKNOWN_TOPIC_OR_PARTITION = 3
    OFFSET_METADATA_TOO_LARGE = 12
    COORDINATOR_NOT_AVAILABLE = 15
    ILLEGAL_GENERATION = 22
    INCONSISTENT_GROUP_PROTOCOL = 23
    INVALID_GROUP_ID = 24
    UNKNOWN_MEMBER_ID = 25
    INVALID_SESSION_TIMEOUT = 26
    REBALANCE_IN_PROGRESS = 27
    GROUP_ID_NOT_FOUND = 69
    NON_EMPTY_GROUP = 68
    GROUP_MAX_SIZE_REACHED = 81
    MEMBER_ID_REQUIRED = 79
    FENCED_INSTANCE_ID = 82


class KafkaGroupState(enum.StrEnum):
    """Kafka's names, as DescribeGroups and ListGroups answer them."""

    EMPTY = "Empty"
    PREPARING_REBALANCE = "PreparingRebalance"
    COMPLETING_REBALANCE = "CompletingRebalance"
    STABLE = "Stable"
    DEAD = "Dead"


_S = KafkaGroupState
#: Every state change a group may make (Kafka's ``validPreviousStates``, turned around).
TRANSITIONS: Mapping[KafkaGroupState, frozenset[KafkaGroupState]] = {
    _S.EMPTY: frozenset({_S.PREPARING_REBALANCE, _S.DEAD}),
    _S.PREPARING_REBALANCE: frozenset({_S.COMPLETING_REBALANCE, _S.EMPTY, _S.DEAD}),
    _S.COMPLETING_REBALANCE: frozenset({_S.STABLE, _S.PREPARING_REBALANCE, _S.DEAD}),
    _S.STABLE: frozenset({_S.PREPARING_REBALANCE, _S.DEAD}),
    _S.DEAD: frozenset(),
}


@dataclass(frozen=True, slots=True)
class KafkaGroupConfig:
    """Bounds and delays of the Kafka group coordinator.

    Attributes:
        min_session_timeout_ms, max_session_timeout_ms: the session timeouts members may ask
            for (Kafka's ``group.min/max.session.timeout.ms``; the minimum is lower than
            Kafka's 6,000 so that tests and fast failover can use short sessions).
        initial_rebalance_delay_ms: how long the first rebalance of an empty group waits
            for more members (Kafka's ``group.initial.rebalance.delay.ms``, 3,000 there too).
        max_members: members of one group, pending ones included (each holds a waiting join
            during a rebalance).
        max_groups: groups at once (each a few hundred bytes plus its members' metadata).
    """

    min_session_timeout_ms: int = 100
    max_session_timeout_ms: int = 1_800_000
    initial_rebalance_delay_ms: int = 3_000
    max_members: int = 1_000
    max_groups: int = 10_000


@dataclass(frozen=True, slots=True)
class JoinMember:
    """A member as the leader's JoinGroup answer lists it."""

    member_id: str
    group_instance_id: str | None
    metadata: bytes


@dataclass(frozen=True, slots=True)
class JoinResult:
    error: GroupError
    member_id: str = ""
    generation: int = -1
    protocol_type: str | None = None
    protocol_name: str | None = None
    leader: str = ""
    members: list[JoinMember] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class SyncResult:
    error: GroupError
    protocol_type: str | None = None
    protocol_name: str | None = None
    assignment: bytes = b""


@dataclass(frozen=True, slots=True)
class KafkaMemberDescription:
    member_id: str
    group_instance_id: str | None
    client_id: str
    client_host: str
    metadata: bytes  # for the group's protocol; empty unless the group is Stable (as Kafka)
    assignment: bytes
    subscription: bytes  # the metadata of the group's protocol, whatever the state


@dataclass(frozen=True, slots=True)
class KafkaGroupDescription:
    group_id: str
    state: KafkaGroupState
    generation: int
    protocol_type: str
    protocol_name: str
    leader: str
    members: list[KafkaMemberDescription]


@dataclass(slots=True)
class _Member:
    member_id: str
    instance_id: str | None
    client_id: str
    client_host: str
    session_timeout_ms: int
    rebalance_timeout_ms: int
    protocol_type: str
    protocols: list[tuple[str, bytes]]
    heartbeat_deadline: float
    join: asyncio.Future[JoinResult] | None = None
    sync: asyncio.Future[SyncResult] | None = None
    assignment: bytes = b""

    def awaiting_join(self) -> bool:
        return self.join is not None and not self.join.done()

    def awaiting_sync(self) -> bool:
        return self.sync is not None and not self.sync.done()

    def metadata(self, protocol: str | None) -> bytes:
        for name, meta in self.protocols:
            if name == protocol:
                return meta
        return b""


@dataclass(slots=True)
class _Group:
    group_id: str
    state: KafkaGroupState = KafkaGroupState.EMPTY
    generation: int = 0
    protocol_type: str | None = None
    protocol_name: str | None = None
    leader: str | None = None
    members: dict[str, _Member] = field(default_factory=dict)
    #: Member ids handed out with MEMBER_ID_REQUIRED -> when they lapse (session timeout).
    pending: dict[str, float] = field(default_factory=dict)
    instances: dict[str, str] = field(default_factory=dict)  # instance id -> member id
    #: PreparingRebalance: when the join completes at the latest (or the initial delay ends).
    join_deadline: float = math.inf
    initial_delay: bool = False  # the join deadline is the initial delay's
    new_member_added: bool = False
    remaining_ms: float = 0.0  # of the rebalance timeout, after the initial delays
    #: CompletingRebalance / Stable: members of this generation that have not synced yet,
    #: and when they are removed for it.
    unsynced: set[str] = field(default_factory=set)
    sync_deadline: float = math.inf


def _member_of(
    group: _Group, member_id: str, instance_id: str | None, generation: int
) -> tuple[_Member | None, GroupError]:
    """The member a SyncGroup, Heartbeat or OffsetCommit names, or None with the error to
    answer: an unknown member, a fenced static instance, a stale generation."""
    member = group.members.get(member_id)
    if member is None:
        return None, GroupError.UNKNOWN_MEMBER_ID
    if instance_id and member.instance_id != instance_id:
        return None, GroupError.FENCED_INSTANCE_ID
    if generation != group.generation:
        return None, GroupError.ILLEGAL_GENERATION
    return member, GroupError.NONE


def _monotonic_ms() -> float:
    return time.monotonic() * 1000


class KafkaGroupCoordinator:
    """Every Kafka consumer group of the broker (see the module docstring).

    Args:
        config: bounds and the initial rebalance delay.
        clock: monotonic milliseconds.
        foreign: whether a group id is in use by tidewire's own group protocol (a Kafka
            member may not join it: ``INCONSISTENT_GROUP_PROTOCOL``).
        timer: run the timer task (tests with a fake clock call :meth:`tick` instead).
    """

    def __init__(
        self,
        config: KafkaGroupConfig | None = None,
        *,
        clock: Callable[[], float] = _monotonic_ms,
        foreign: Callable[[str], bool] = lambda _: False,
        timer: bool = True,
    ) -> None:
        self.config = config or KafkaGroupConfig()
        self._clock = clock
        self.foreign = foreign
        self._groups: dict[str, _Group] = {}
        self._timer = timer
        self._task: asyncio.Task[None] | None = None
        self._wake: asyncio.Event | None = None
        self._scheduled = math.inf  # the deadline the timer task sleeps until
        self._closed = False
        #: Rebalances completed (generations begun), for tests and metrics.
        self.rebalances = 0

    # --- JoinGroup ------------------------------------------------------------------------

    async def join(
        self,
        group_id: str,
        *,
        member_id: str = "",
        group_instance_id: str | None = None,
        client_id: str = "",
        client_host: str = "",
        session_timeout_ms: int,
        rebalance_timeout_ms: int,
        protocol_type: str,
        protocols: Sequence[tuple[str, bytes]],
        require_known_member_id: bool = True,
    ) -> JoinResult:
        """A JoinGroup: returns once the rebalance it takes part in completes, or at once
        with an error (``MEMBER_ID_REQUIRED`` with the new ``member_id`` for a new member
        when ``require_known_member_id``, as JoinGroup v4+ asks)."""
        E = GroupError
        if not group_id or len(group_id) > MAX_ID_CHARS:
            return JoinResult(E.INVALID_GROUP_ID, member_id)
        cfg = self.config
        if not cfg.min_session_timeout_ms <= session_timeout_ms <= cfg.max_session_timeout_ms:
            return JoinResult(E.INVALID_SESSION_TIMEOUT, member_id)
        if rebalance_timeout_ms < 0:  # v0 sends none: the session timeout stands in
            rebalance_timeout_ms = session_timeout_ms
        if self._closed:
            return JoinResult(E.COORDINATOR_NOT_AVAILABLE, member_id)
        if (
            not protocol_type
            or not protocols
            or len(protocols) > MAX_PROTOCOLS
            or self.foreign(group_id)
        ):
            return JoinResult(E.INCONSISTENT_GROUP_PROTOCOL, member_id)
        now = self._clock()
        group = self._groups.get(group_id)
        if group is None:
            if member_id:
                return JoinResult(E.UNKNOWN_MEMBER_ID, member_id)
            if len(self._groups) >= cfg.max_groups:
                self._forget_empty()
            if len(self._groups) >= cfg.max_groups:
                return JoinResult(E.GROUP_MAX_SIZE_REACHED, member_id)
            group = self._groups[group_id] = _Group(group_id)
        if group.state is KafkaGroupState.DEAD:
            return JoinResult(E.COORDINATOR_NOT_AVAILABLE, member_id)
        if not self._supports(group, protocol_type, protocols):
            return JoinResult(E.INCONSISTENT_GROUP_PROTOCOL, member_id)
        member = group.members.get(member_id) if member_id else None
        if member is not None:
            if group_instance_id and member.instance_id != group_instance_id:
                return JoinResult(E.FENCED_INSTANCE_ID, member_id)
            member.rebalance_timeout_ms = rebalance_timeout_ms
            member.session_timeout_ms = session_timeout_ms
            member.client_id = client_id
            return await self._join_known(group, member, now, protocols)
        if member_id and member_id not in group.pending:
            return JoinResult(E.UNKNOWN_MEMBER_ID, member_id)
        if len(group.members) + len(group.pending) - (member_id in group.pending) >= (
            cfg.max_members
        ):
            return JoinResult(E.GROUP_MAX_SIZE_REACHED, member_id)
        if not member_id:
            member_id = f"{client_id or 'member'}-{uuid.uuid4()}"
            if group_instance_id:
                old = group.instances.get(group_instance_id)
                if old is not None and old in group.members:
                    self._remove(group, group.members[old], E.FENCED_INSTANCE_ID)
            elif require_known_member_id:
                group.pending[member_id] = now + session_timeout_ms
                self._schedule(now + session_timeout_ms)
                return JoinResult(E.MEMBER_ID_REQUIRED, member_id)
        group.pending.pop(member_id, None)
        member = _Member(
            member_id,
            group_instance_id or None,
            client_id,
            client_host,
            session_timeout_ms,
            rebalance_timeout_ms,
            protocol_type,
            list(protocols),
            now + session_timeout_ms,
        )
        self._schedule(member.heartbeat_deadline)
        if not group.members:
            group.protocol_type = protocol_type
        group.members[member_id] = member
        if group_instance_id:
            group.instances[group_instance_id] = member_id
        if group.leader is None:
            group.leader = member_id
        fut: asyncio.Future[JoinResult] = asyncio.get_running_loop().create_future()
        member.join = fut
        if group.state is KafkaGroupState.PREPARING_REBALANCE and group.initial_delay:
            group.new_member_added = True
        self._prepare_rebalance_if_allowed(group, now, f"member {member_id} joined")
        self._try_complete_join(group, now)
        return await fut

    async def _join_known(
        self,
        group: _Group,
        member: _Member,
        now: float,
        protocols: Sequence[tuple[str, bytes]],
    ) -> JoinResult:
        same = list(protocols) == member.protocols
        state = group.state
        if state is KafkaGroupState.EMPTY:
            return JoinResult(GroupError.UNKNOWN_MEMBER_ID, member.member_id)
        if (state is KafkaGroupState.COMPLETING_REBALANCE and same) or (
            state is KafkaGroupState.STABLE and same and member.member_id != group.leader
        ):
            # Kafka answers such a join with the current generation, without a rebalance
            # (a member that lost the answer to its join and asks again).
            self._touch(member, now)
            return self._join_result(group, member)
        member.protocols = list(protocols)
        if member.join is not None and not member.join.done():
            member.join.set_result(JoinResult(GroupError.REBALANCE_IN_PROGRESS, member.member_id))
        fut: asyncio.Future[JoinResult] = asyncio.get_running_loop().create_future()
        member.join = fut
        self._prepare_rebalance_if_allowed(group, now, f"member {member.member_id} rejoined")
        self._try_complete_join(group, now)
        return await fut

    # --- SyncGroup --------------------------------------------------------------------------

    async def sync(
        self,
        group_id: str,
        *,
        member_id: str,
        generation: int,
        group_instance_id: str | None = None,
        protocol_type: str | None = None,
        protocol_name: str | None = None,
        assignments: Mapping[str, bytes] | None = None,
    ) -> SyncResult:
        """A SyncGroup: the leader's ``assignments`` (member id -> bytes) complete the
        rebalance; a follower's waits for them. Returns the member's assignment."""
        E = GroupError
        group = self._groups.get(group_id)
        if group is None:
            return SyncResult(E.UNKNOWN_MEMBER_ID)
        if group.state is KafkaGroupState.DEAD:
            return SyncResult(E.COORDINATOR_NOT_AVAILABLE)
        member, error = _member_of(group, member_id, group_instance_id, generation)
        if member is None:
            return SyncResult(error)
        if (protocol_type and protocol_type != group.protocol_type) or (
            protocol_name and protocol_name != group.protocol_name
        ):
            return SyncResult(E.INCONSISTENT_GROUP_PROTOCOL)
        now = self._clock()
        state = group.state
        if state is KafkaGroupState.EMPTY:
            return SyncResult(E.UNKNOWN_MEMBER_ID)
        if state is KafkaGroupState.PREPARING_REBALANCE:
            return SyncResult(E.REBALANCE_IN_PROGRESS)
        group.unsynced.discard(member_id)
        self._touch(member, now)
        if state is KafkaGroupState.STABLE:
            return self._sync_result(group, member)
        # CompletingRebalance
        if member.sync is not None and not member.sync.done():
            member.sync.set_result(SyncResult(E.REBALANCE_IN_PROGRESS))
        fut: asyncio.Future[SyncResult] = asyncio.get_running_loop().create_future()
        member.sync = fut
        if member_id == group.leader:
            given = assignments or {}
            for m in group.members.values():
                m.assignment = bytes(given.get(m.member_id, b""))
            self._set_state(group, KafkaGroupState.STABLE)
            log.info("group %s: generation %d is stable", group_id, group.generation)
            for m in group.members.values():
                if m.awaiting_sync():
                    assert m.sync is not None
                    m.sync.set_result(self._sync_result(group, m))
        return await fut

    # --- Heartbeat, LeaveGroup, commits ----------------------------------------------------

    def heartbeat(
        self,
        group_id: str,
        *,
        member_id: str,
        generation: int,
        group_instance_id: str | None = None,
    ) -> GroupError:
        """A Heartbeat: keeps the member's session alive; says whether to rejoin."""
        E = GroupError
        group = self._groups.get(group_id)
        if group is None:
            return E.UNKNOWN_MEMBER_ID
        if group.state is KafkaGroupState.DEAD:
            return E.COORDINATOR_NOT_AVAILABLE
        member, error = _member_of(group, member_id, group_instance_id, generation)
        if member is None:
            return error
        if group.state is KafkaGroupState.EMPTY:
            return E.UNKNOWN_MEMBER_ID
        self._touch(member, self._clock())
        if group.state is KafkaGroupState.PREPARING_REBALANCE:
            return E.REBALANCE_IN_PROGRESS
        return E.NONE

    def leave(self, group_id: str, members: Sequence[tuple[str, str | None]]) -> list[GroupError]:
        """A LeaveGroup of ``members`` ((member id, instance id); a member id may be empty
        when the instance id is given): one error per member, in order."""
        E = GroupError
        group = self._groups.get(group_id)
        if group is None:
            return [E.UNKNOWN_MEMBER_ID for _ in members]
        if group.state is KafkaGroupState.DEAD:
            return [E.COORDINATOR_NOT_AVAILABLE for _ in members]
        now = self._clock()
        out: list[GroupError] = []
        changed = False
        for given_id, instance_id in members:
            member_id = given_id
            if instance_id:
                known = group.instances.get(instance_id)
                if known is None:
                    out.append(E.UNKNOWN_MEMBER_ID)
                    continue
                if member_id and member_id != known:
                    out.append(E.FENCED_INSTANCE_ID)
                    continue
                member_id = known
            if member_id in group.pending:
                del group.pending[member_id]
                changed = True
                out.append(E.NONE)
                continue
            member = group.members.get(member_id)
            if member is None:
                out.append(E.UNKNOWN_MEMBER_ID)
                continue
            self._remove(group, member, E.UNKNOWN_MEMBER_ID)
            log.info("group %s: member %s left", group_id, member_id)
            changed = True
            out.append(E.NONE)
        if changed:
            self._after_removal(group, now, "members left")
        return out

    def check_commit(
        self,
        group_id: str,
        *,
        member_id: str,
        generation: int,
        group_instance_id: str | None = None,
    ) -> GroupError:
        """Whether an OffsetCommit may write now. Generation -1 (no member id needed): a
        commit from outside the group (a consumer with manual assignment, an admin),
        allowed while the group has no members; else the member and generation must be
        current, and not while the group waits for the leader's assignment."""
        E = GroupError
        if self.foreign(group_id):
            return E.INCONSISTENT_GROUP_PROTOCOL
        group = self._groups.get(group_id)
        if group is None:
            return E.NONE if generation < 0 else E.ILLEGAL_GENERATION
        if group.state is KafkaGroupState.DEAD:
            return E.COORDINATOR_NOT_AVAILABLE
        if generation < 0 and group.state is KafkaGroupState.EMPTY:
            return E.NONE
        member, error = _member_of(group, member_id, group_instance_id, generation)
        if member is None:
            return error
        if group.state is KafkaGroupState.COMPLETING_REBALANCE:
            return E.REBALANCE_IN_PROGRESS
        self._touch(member, self._clock())
        return E.NONE

    def delete(self, group_id: str) -> GroupError:
        """Forget a group without members (``NON_EMPTY_GROUP`` otherwise); ``NONE`` also
        when the coordinator has no such group (its offsets may still exist)."""
        group = self._groups.get(group_id)
        if group is None:
            return GroupError.NONE
        if group.members or group.pending:
            return GroupError.NON_EMPTY_GROUP
        self._set_state(group, KafkaGroupState.DEAD)
        del self._groups[group_id]
        return GroupError.NONE

    # --- queries ---------------------------------------------------------------------------

    def has_members(self, group_id: str) -> bool:
        group = self._groups.get(group_id)
        return group is not None and bool(group.members)

    def exists(self, group_id: str) -> bool:
        return group_id in self._groups

    def group_ids(self) -> list[str]:
        return sorted(self._groups)

    def describe(self, group_id: str) -> KafkaGroupDescription | None:
        """The group as DescribeGroups shows it (None: the coordinator does not know it)."""
        group = self._groups.get(group_id)
        if group is None:
            return None
        stable = group.state is KafkaGroupState.STABLE
        members = [
            KafkaMemberDescription(
                m.member_id,
                m.instance_id,
                m.client_id,
                m.client_host,
                m.metadata(group.protocol_name) if stable else b"",
                m.assignment if stable else b"",
                m.metadata(group.protocol_name),
            )
            for m in group.members.values()
        ]
        return KafkaGroupDescription(
            group_id,
            group.state,
            group.generation,
            group.protocol_type or "",
            group.protocol_name or "",
            group.leader or "",
            members,
        )

    # --- time -------------------------------------------------------------------------------

    def tick(self) -> None:
        """Act on every deadline that passed: expire sessions and pending member ids, end
        initial delays, rebalance timeouts and sync timeouts."""
        now = self._clock()
        E = GroupError
        for group in list(self._groups.values()):
            lapsed = [mid for mid, deadline in group.pending.items() if deadline <= now]
            for mid in lapsed:
                del group.pending[mid]
            expired = [
                m
                for m in group.members.values()
                if m.heartbeat_deadline <= now and not m.awaiting_join() and not m.awaiting_sync()
            ]
            for m in expired:
                log.info(
                    "group %s: member %s removed: no heartbeat for %d ms",
                    group.group_id,
                    m.member_id,
                    m.session_timeout_ms,
                )
                self._remove(group, m, E.UNKNOWN_MEMBER_ID)
            if expired:
                self._after_removal(group, now, "members' sessions expired")
            elif lapsed:
                self._try_complete_join(group, now)
            if group.state is KafkaGroupState.PREPARING_REBALANCE and group.join_deadline <= now:
                if group.initial_delay and group.new_member_added and group.remaining_ms > 0:
                    delay = min(self.config.initial_rebalance_delay_ms, group.remaining_ms)
                    group.remaining_ms -= delay
                    group.new_member_added = False
                    group.join_deadline = now + delay
                else:
                    self._complete_join(group, now)
            if (
                group.state in (KafkaGroupState.COMPLETING_REBALANCE, KafkaGroupState.STABLE)
                and group.unsynced
                and group.sync_deadline <= now
            ):
                for mid in sorted(group.unsynced):
                    if mid in group.members:
                        log.info(
                            "group %s: member %s removed: did not sync in time", group.group_id, mid
                        )
                        self._remove(group, group.members[mid], E.UNKNOWN_MEMBER_ID)
                group.unsynced.clear()
                self._after_removal(group, now, "members did not sync")
        self._forget_empty()

    def _forget_empty(self) -> None:
        """Drop the groups without members or pending ids: they keep nothing the offsets
        log does not (a join creates them again)."""
        for group in list(self._groups.values()):
            if group.state is KafkaGroupState.EMPTY and not group.pending and not group.members:
                del self._groups[group.group_id]

    def next_deadline(self) -> float:
        """The earliest deadline of any group (``inf``: none)."""
        best = math.inf
        for group in self._groups.values():
            if group.state is KafkaGroupState.PREPARING_REBALANCE:
                best = min(best, group.join_deadline)
            if group.unsynced:
                best = min(best, group.sync_deadline)
            for deadline in group.pending.values():
                best = min(best, deadline)
            for m in group.members.values():
                best = min(best, m.heartbeat_deadline)
        return best

    async def _run(self) -> None:
        assert self._wake is not None
        while True:
            self._scheduled = self.next_deadline()
            self._wake.clear()
            delay = self._scheduled - self._clock()
            if delay > 0:
                try:
                    async with asyncio.timeout(None if math.isinf(delay) else delay / 1000):
                        await self._wake.wait()
                except TimeoutError:
                    pass
            self.tick()

    def _touch(self, member: _Member, now: float) -> None:
        """The member was heard from: its session runs from ``now``."""
        member.heartbeat_deadline = now + member.session_timeout_ms
        self._schedule(member.heartbeat_deadline)

    def _schedule(self, deadline: float) -> None:
        """A new deadline: make sure the timer task wakes up for it."""
        if not self._timer or self._closed:
            return
        if self._task is None:
            self._wake = asyncio.Event()
            self._task = asyncio.get_running_loop().create_task(
                self._run(), name="kafka group timers"
            )
            self._task.add_done_callback(_log_failure)
        elif deadline < self._scheduled and self._wake is not None:
            self._wake.set()

    def release_waiters(self) -> None:
        """Answer every waiting join and sync with ``COORDINATOR_NOT_AVAILABLE`` (the broker
        drains or stops: the clients find the coordinator again) and refuse new joins."""
        self._closed = True
        for group in self._groups.values():
            for m in group.members.values():
                if m.awaiting_join():
                    assert m.join is not None
                    m.join.set_result(JoinResult(GroupError.COORDINATOR_NOT_AVAILABLE))
                if m.awaiting_sync():
                    assert m.sync is not None
                    m.sync.set_result(SyncResult(GroupError.COORDINATOR_NOT_AVAILABLE))

    async def close(self) -> None:
        """Release the waiters and stop the timer task."""
        self.release_waiters()
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    # --- internals --------------------------------------------------------------------------

    def _supports(
        self, group: _Group, protocol_type: str, protocols: Sequence[tuple[str, bytes]]
    ) -> bool:
        if not group.members:
            return True
        if protocol_type != group.protocol_type:
            return False
        names = {n for n, _ in protocols}
        common = set.intersection(*({n for n, _ in m.protocols} for m in group.members.values()))
        return bool(names & common)

    def _select_protocol(self, group: _Group) -> str:
        """Kafka's vote: each member votes for the first protocol it offers that every
        member supports; the most votes win (ties: the one offered first)."""
        members = list(group.members.values())
        common = set.intersection(*({n for n, _ in m.protocols} for m in members))
        votes: dict[str, int] = {}
        for m in members:
            choice = next(n for n, _ in m.protocols if n in common)
            votes[choice] = votes.get(choice, 0) + 1
        return max(votes, key=lambda n: votes[n])

    def _set_state(self, group: _Group, state: KafkaGroupState) -> None:
        if state is group.state:
            return
        if state not in TRANSITIONS[group.state]:
            raise AssertionError(f"group {group.group_id}: {group.state} -> {state} is not allowed")
        group.state = state

    def _prepare_rebalance_if_allowed(self, group: _Group, now: float, why: str) -> None:
        if group.state is KafkaGroupState.PREPARING_REBALANCE:
            return
        if group.state is KafkaGroupState.COMPLETING_REBALANCE:
            for m in group.members.values():
                if m.awaiting_sync():
                    assert m.sync is not None
                    m.sync.set_result(SyncResult(GroupError.REBALANCE_IN_PROGRESS))
        timeout = max((m.rebalance_timeout_ms for m in group.members.values()), default=0)
        delay = self.config.initial_rebalance_delay_ms
        if group.state is KafkaGroupState.EMPTY and delay > 0:
            group.initial_delay = True
            group.new_member_added = False
            group.remaining_ms = max(timeout - delay, 0)
            group.join_deadline = now + min(delay, timeout)
        else:
            group.initial_delay = False
            group.join_deadline = now + timeout
        group.unsynced.clear()
        group.sync_deadline = math.inf
        self._set_state(group, KafkaGroupState.PREPARING_REBALANCE)
        log.info("group %s: preparing a rebalance (%s)", group.group_id, why)
        self._schedule(group.join_deadline)

    def _try_complete_join(self, group: _Group, now: float) -> None:
        if group.state is not KafkaGroupState.PREPARING_REBALANCE or group.initial_delay:
            return
        if group.pending or not all(m.awaiting_join() for m in group.members.values()):
            return
        self._complete_join(group, now)

    def _complete_join(self, group: _Group, now: float) -> None:
        for m in [m for m in group.members.values() if not m.awaiting_join()]:
            log.info(
                "group %s: member %s removed: did not rejoin in time", group.group_id, m.member_id
            )
            self._remove(group, m, GroupError.UNKNOWN_MEMBER_ID)
        group.initial_delay = False
        group.generation += 1
        self.rebalances += 1
        if not group.members:
            group.protocol_name = None
            group.leader = None
            self._set_state(group, KafkaGroupState.EMPTY)
            log.info("group %s: generation %d is empty", group.group_id, group.generation)
            return
        if group.leader not in group.members:
            group.leader = next(iter(group.members))
        group.protocol_name = self._select_protocol(group)
        self._set_state(group, KafkaGroupState.COMPLETING_REBALANCE)
        log.info(
            "group %s: generation %d with %d member(s), protocol %s",
            group.group_id,
            group.generation,
            len(group.members),
            group.protocol_name,
        )
        timeout = max(m.rebalance_timeout_ms for m in group.members.values())
        group.unsynced = set(group.members)
        group.sync_deadline = now + timeout
        self._schedule(group.sync_deadline)
        for m in group.members.values():
            m.assignment = b""
            self._touch(m, now)
            assert m.join is not None
            m.join.set_result(self._join_result(group, m))

    def _join_result(self, group: _Group, member: _Member) -> JoinResult:
        members = []
        if member.member_id == group.leader:
            members = [
                JoinMember(m.member_id, m.instance_id, m.metadata(group.protocol_name))
                for m in group.members.values()
            ]
        return JoinResult(
            GroupError.NONE,
            member.member_id,
            group.generation,
            group.protocol_type,
            group.protocol_name,
            group.leader or "",
            members,
        )

    def _sync_result(self, group: _Group, member: _Member) -> SyncResult:
        return SyncResult(
            GroupError.NONE, group.protocol_type, group.protocol_name, member.assignment
        )

    def _remove(self, group: _Group, member: _Member, error: GroupError) -> None:
        del group.members[member.member_id]
        group.unsynced.discard(member.member_id)
        if member.instance_id and group.instances.get(member.instance_id) == member.member_id:
            del group.instances[member.instance_id]
        if member.awaiting_join():
            assert member.join is not None
            member.join.set_result(JoinResult(error, member.member_id))
        if member.awaiting_sync():
            assert member.sync is not None
            member.sync.set_result(SyncResult(error))
        if group.leader == member.member_id:
            # as Kafka: preferably a member already waiting in a join
            waiting = [m for m in group.members.values() if m.awaiting_join()]
            candidates = waiting or list(group.members.values())
            group.leader = candidates[0].member_id if candidates else None

    def _after_removal(self, group: _Group, now: float, why: str) -> None:
        if group.state is KafkaGroupState.PREPARING_REBALANCE:
            self._try_complete_join(group, now)
        elif group.state in (KafkaGroupState.STABLE, KafkaGroupState.COMPLETING_REBALANCE):
            self._prepare_rebalance_if_allowed(group, now, why)
            self._try_complete_join(group, now)


def _log_failure(task: asyncio.Task[None]) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.error("the Kafka group timer task failed", exc_info=task.exception())
