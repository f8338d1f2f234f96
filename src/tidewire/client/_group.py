"""Consumer group members: :class:`AsyncGroupConsumer` and its blocking twin
:class:`GroupConsumer`.

A group consumer subscribes to topics (or a name pattern) as a member of a group; the broker
assigns it partitions, and it reads them with the long-poll fetches of
:class:`~tidewire.client.AsyncConsumer` (which it drives), starting from the group's
committed offsets. A background task sends heartbeats every ``heartbeat_interval_ms``. When a
heartbeat learns of a rebalance, the next ``poll`` (or iteration step) takes part in it:

1. with auto-commit on, it commits the positions of every assigned partition;
2. it calls ``on_revoke(partitions)`` with every partition it owned;
3. it joins again and waits for the new assignment (up to ``rebalance_timeout_ms``);
4. partitions it keeps go on from where it was; new ones from the group's committed
   offset (or ``auto_offset_reset`` when none is committed); then ``on_assign(partitions)``
   is called with the whole new assignment.

With ``delivery="push"`` the member reads its partitions through an
:class:`~tidewire.client.AsyncSubscriber` instead: the broker pushes batches as they are
appended, within ``push_credit_bytes`` of credit; the assignment, positions, commits, seek
and pause work the same (each change of them subscribes again from the positions).

So a rebalance happens only inside ``poll``/iteration: process each batch of records within
``rebalance_timeout_ms``, or the group removes this member.

**What is committed.** The *position* of a partition is the offset after the last record
this consumer handed to the application (by ``poll`` or iteration), or the offset reading
starts from when none was handed out yet. ``commit()`` commits the positions of every
assigned partition (or the offsets given), and returns once the broker has fsynced them.

**When auto-commit commits** (``enable_auto_commit=True``, the default): at the start of a
``poll`` or iteration step once ``auto_commit_interval_ms`` has passed since the last
auto-commit (the positions as they are then, sent in the background: the poll does not wait
for the broker's fsync, so delivery goes on meanwhile), before a rebalance (step 1 above), and
on ``close()`` (those two wait for it, as ``commit()`` does, after the one in flight). Since
it runs when the application asks for more, every record handed out before it was processed
by a loop that takes records one after another: delivery is at least once, and after a crash
the records handed out since the last commit are read again (the uncommitted window). ``close()``
commits the position too, so records handed out but not processed when the application
stops by an exception count as processed: commit explicitly for a stricter rule.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
from collections import deque
from collections.abc import Awaitable, Callable, Iterable, Mapping
from datetime import datetime
from typing import Any, TypeVar

from tidewire._tasks import cancel_and_wait
from tidewire.errors import (
    ConnectionLostError,
    IllegalGenerationError,
    NotCoordinatorError,
    NotLeaderError,
    PartitionNotAssignedError,
    RebalanceInProgressError,
    TidewireError,
    UnknownMemberError,
    for_code,
)
from tidewire.protocol.messages import (
    EARLIEST,
    LATEST,
    Body,
    CommitPartition,
    GroupPartition,
    HeartbeatRequest,
    JoinGroupRequest,
    LeaveGroupRequest,
    ListOffsetsPartition,
    ListOffsetsRequest,
    OffsetCommitRequest,
    OffsetFetchRequest,
)
from tidewire.security.credentials import Credentials
from tidewire.security.tls import TlsOptions

from ._consumer import (
    DEFAULT_MAX_PARTITION_BYTES,
    DEFAULT_MAX_RECORDS,
    AsyncConsumer,
    BlockingReader,
    ConsumerRecord,
    Gap,
    Offset,
)
from ._routing import OFFSETS_TOPIC, Router, RoutingStats, call_routed, coordinator_partition
from ._settings import check_ints
from ._subscriber import DEFAULT_CREDIT_BYTES, AsyncSubscriber
from ._transport import (
    BACKOFF_MAX_S,
    BACKOFF_MIN_S,
    Addresses,
    Transport,
    consumer_connect,
    parse_addrs,
)

__all__ = ["AsyncGroupConsumer", "GroupConsumer", "PartitionsCallback"]

log = logging.getLogger("tidewire.client")

T = TypeVar("T")
TP = tuple[str, int]
#: ``on_assign`` / ``on_revoke``: called with the partitions (a coroutine function is awaited).
PartitionsCallback = Callable[[list[TP]], Awaitable[None] | None]

#: How often a waiting poll looks up from its fetch to check for a rebalance (s): a bound on
#: how late a member notices one while no records arrive.
_CHECK_S = 0.1
#: Records handed out by one ``poll`` at most, by default.
_FENCED = (IllegalGenerationError.code, UnknownMemberError.code, PartitionNotAssignedError.code)


class AsyncGroupConsumer:
    """A member of a consumer group (see the module docstring for rebalances and commits).

    Use as ``async with AsyncGroupConsumer(addr, "billing", topics=["orders"]) as c``, then
    ``async for record in c`` or ``await c.poll(timeout_s)``.

    Args:
        addr: ``"HOST:PORT"`` of the broker, or of several nodes of a cluster
            (``"H1:P1,H2:P2"`` or a list): the first that answers is used.
        group_id: the group.
        topics: topics to consume.
        pattern: a regular expression; topics whose whole name matches are consumed too,
            including ones created later.
        group_instance_id: a static member's stable id: restarting within
            ``session_timeout_ms`` gets the same partitions back without a rebalance. A
            static member does not leave the group on close (its session runs out instead).
        client_id: shown by describe; the prefix of the member id.
        strategy: ``"sticky"`` (default), ``"range"`` or ``"roundrobin"``.
        session_timeout_ms: the broker removes this member after this long without a
            heartbeat.
        rebalance_timeout_ms: how long a rebalance waits for members to rejoin.
        heartbeat_interval_ms: between heartbeats (default: a third of the session timeout).
        enable_auto_commit, auto_commit_interval_ms: see the module docstring.
        auto_offset_reset: where a partition without a committed offset starts:
            ``"latest"`` (default) or ``"earliest"``.
        on_assign, on_revoke: called with the partitions assigned / taken away.
        max_wait_ms, min_bytes, max_bytes, max_partition_bytes: of each fetch
            (as :class:`~tidewire.client.AsyncConsumer`).
        delivery: ``"pull"`` (default: long-poll fetches) or ``"push"`` (the broker sends
            batches as they are appended; see :class:`~tidewire.client.AsyncSubscriber`).
        push_credit_bytes: with push, the credit window in bytes.
        request_timeout_ms, connect_timeout_ms: of each request.
        skip_damaged, on_gap: with pull, read past damaged ranges of the broker's logs,
            reporting each gap (as :class:`~tidewire.client.AsyncConsumer`; see :attr:`gaps`).
        tls: TLS to the broker: :class:`~tidewire.client.TlsOptions`, True (the system's
            CAs), or None (plaintext); the same for each of the member's connections.
        credentials: the API key to authenticate every connection with
            (:class:`~tidewire.client.Credentials`), or None. A key the broker refuses raises
            :class:`~tidewire.errors.AuthenticationFailedError` (not retried).
    """

    def __init__(
        self,
        addr: Addresses,
        group_id: str,
        *,
        topics: Iterable[str] = (),
        pattern: str = "",
        group_instance_id: str = "",
        client_id: str = "",
        strategy: str = "sticky",
        session_timeout_ms: int = 10_000,
        rebalance_timeout_ms: int = 30_000,
        heartbeat_interval_ms: int | None = None,
        enable_auto_commit: bool = True,
        auto_commit_interval_ms: int = 5_000,
        auto_offset_reset: str = "latest",
        on_assign: PartitionsCallback | None = None,
        on_revoke: PartitionsCallback | None = None,
        max_wait_ms: int = 500,
        min_bytes: int = 1,
        max_bytes: int = 16 * 1024 * 1024,
        max_partition_bytes: int = DEFAULT_MAX_PARTITION_BYTES,
        request_timeout_ms: int = 30_000,
        connect_timeout_ms: int = 10_000,
        delivery: str = "pull",
        push_credit_bytes: int = DEFAULT_CREDIT_BYTES,
        skip_damaged: bool = False,
        on_gap: Callable[[Gap], None] | None = None,
        tls: TlsOptions | bool | None = None,
        credentials: Credentials | None = None,
    ) -> None:
        self.topics = sorted(set(topics))
        if delivery not in ("pull", "push"):
            raise ValueError(f"delivery={delivery!r}: 'pull' or 'push'")
        if skip_damaged and delivery != "pull":
            raise ValueError("skip_damaged works with delivery='pull'")
        if not group_id:
            raise ValueError("group_id must not be empty")
        if not self.topics and not pattern:
            raise ValueError("subscribe to topics or a pattern")
        if auto_offset_reset not in ("earliest", "latest"):
            raise ValueError(f"auto_offset_reset={auto_offset_reset!r}: 'earliest' or 'latest'")
        check_ints(
            ("session_timeout_ms", session_timeout_ms, 1),
            ("rebalance_timeout_ms", rebalance_timeout_ms, 1),
            ("auto_commit_interval_ms", auto_commit_interval_ms, 1),
        )
        self.group_id = group_id
        self.pattern = pattern
        self.group_instance_id = group_instance_id
        self.client_id = client_id
        self.strategy = strategy
        self.session_timeout_ms = session_timeout_ms
        self.rebalance_timeout_ms = rebalance_timeout_ms
        self.heartbeat_interval_ms = heartbeat_interval_ms or max(session_timeout_ms // 3, 1)
        self.enable_auto_commit = enable_auto_commit
        self.auto_commit_interval_ms = auto_commit_interval_ms
        self.auto_offset_reset = auto_offset_reset
        self.on_assign = on_assign
        self.on_revoke = on_revoke

        connect = consumer_connect(request_timeout_ms, connect_timeout_ms, tls, credentials)

        self._coord = connect(addr)
        #: In a cluster, the group's requests go to its coordinator: the leader of the
        #: group's partition of ``__consumer_offsets`` (a single node: to ``_coord``).
        self._coord_router = Router(self._coord, connect)
        self._coord_partition = coordinator_partition(group_id)
        self.delivery = delivery
        self._inner: AsyncConsumer | AsyncSubscriber
        if delivery == "push":
            self._inner = AsyncSubscriber(
                addr,
                credit_bytes=push_credit_bytes,
                request_timeout_ms=request_timeout_ms,
                connect_timeout_ms=connect_timeout_ms,
                tls=tls,
                credentials=credentials,
            )
        else:
            self._inner = AsyncConsumer(
                addr,
                max_wait_ms=max_wait_ms,
                min_bytes=min_bytes,
                max_bytes=max_bytes,
                max_partition_bytes=max_partition_bytes,
                request_timeout_ms=request_timeout_ms,
                connect_timeout_ms=connect_timeout_ms,
                skip_damaged=skip_damaged,
                on_gap=on_gap,
                tls=tls,
                credentials=credentials,
            )
        self._inner.group_name = group_id
        self._member_id = ""
        self._generation = -1
        self._assigned: list[TP] = []
        self._positions: dict[TP, int] = {}  # after the last record handed out
        self._paused: set[TP] = set()
        self._local: deque[ConsumerRecord] = deque()  # fetched, not yet handed out
        self._rejoin = True  # join at the first poll
        self._fenced = False  # lost membership: positions come from the commits again
        self._joined = False
        self._joining = False
        self._heartbeats: asyncio.Task[None] | None = None
        self._next_auto_commit = 0.0
        self._commit_task: asyncio.Task[None] | None = None
        self._closed = False

    @property
    def gaps(self) -> list[Gap]:
        """The damaged ranges read past (``skip_damaged``), oldest first; empty with push."""
        return list(self._inner.gaps) if isinstance(self._inner, AsyncConsumer) else []

    async def __aenter__(self) -> AsyncGroupConsumer:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # --- state ------------------------------------------------------------------------------

    @property
    def throttle_time_ms_total(self) -> int:
        """How long the broker held this member's fetch answers back in all (ms), because
        its principal was over a quota (0: never throttled)."""
        return self._coord_router.throttle_time_ms_total + self._inner.throttle_time_ms_total

    @property
    def routing_stats(self) -> RoutingStats:
        """What this member's routing did, to its coordinator and to its partitions'
        leaders together (see :class:`~tidewire.client.RoutingStats`; a copy)."""
        return self._coord_router.stats_copy() + self._inner.routing_stats

    @property
    def member_id(self) -> str:
        """This member's id in the group (``""`` before it joined)."""
        return self._member_id

    @property
    def generation(self) -> int:
        """The generation of the current assignment (-1 before the first)."""
        return self._generation

    def assignment(self) -> list[TP]:
        """The partitions this member owns, sorted."""
        return list(self._assigned)

    def position(self, topic: str, partition: int) -> int:
        """The offset after the last record handed out for an assigned partition.

        Raises:
            ValueError: not assigned.
        """
        try:
            return self._positions[(topic, partition)]
        except KeyError:
            raise ValueError(f"{topic!r} partition {partition} is not assigned") from None

    def paused(self) -> list[TP]:
        return sorted(self._paused)

    # --- reading ----------------------------------------------------------------------------

    async def poll(
        self, timeout_s: float | None = None, *, max_records: int = DEFAULT_MAX_RECORDS
    ) -> list[ConsumerRecord]:
        """The records available (at most ``max_records``), waiting up to ``timeout_s``
        (None: until some arrive); an empty list when none came in time. Takes part in a
        rebalance and auto-commits first when due.

        Raises:
            InvalidGroupError, InconsistentGroupProtocolError, GroupFullError: joining failed.
            OffsetOutOfRangeError, ...: a partition's fetch failed.
        """
        loop = asyncio.get_running_loop()
        deadline = None if timeout_s is None else loop.time() + timeout_s
        while True:
            await self._maintain()
            if self._local:
                return self._hand_out_many(max_records)
            remaining = None if deadline is None else deadline - loop.time()
            if remaining is not None and remaining <= 0:
                return []
            wait = _CHECK_S if remaining is None else min(remaining, _CHECK_S)
            inner = self._inner
            if not inner.assignment():
                await asyncio.sleep(wait)
            elif isinstance(inner, AsyncSubscriber):
                ends: dict[TP, int] = {}
                got = await inner._poll(wait, max_records, ends)
                if got and not self._local and not self._due():
                    # What the next turn would do (hand out all of it), without a pass over
                    # the records: the subscriber said where each partition's records end.
                    self._positions.update(ends)
                    return got
                self._local.extend(got)
            else:
                self._local.extend(await inner.poll(wait, max_records=max_records))

    def __aiter__(self) -> AsyncGroupConsumer:
        return self

    async def __anext__(self) -> ConsumerRecord:
        if not self._local or self._rejoin:
            while not await self._fill():
                pass
        return self._hand_out()

    async def _fill(self) -> bool:
        await self._maintain()
        if self._local:
            return True
        if self._inner.assignment():
            self._local.extend(await self._inner.poll(_CHECK_S))
        else:
            await asyncio.sleep(_CHECK_S)
        return bool(self._local)

    def _hand_out_many(self, max_records: int) -> list[ConsumerRecord]:
        local = self._local
        if len(local) <= max_records:
            out = list(local)
            local.clear()
        else:
            out = [local.popleft() for _ in range(max_records)]
        # The last record of each partition sets its position (a partition's are in order).
        self._positions.update({(r.topic, r.partition): r.offset + 1 for r in out})
        return out

    def _hand_out(self) -> ConsumerRecord:
        r = self._local.popleft()
        self._positions[(r.topic, r.partition)] = r.offset + 1
        return r

    def _due(self) -> bool:
        """Whether :meth:`_maintain` would do anything now (raise as closed, rebalance,
        auto-commit, start the heartbeats)."""
        return (
            self._closed
            or self._rejoin
            or self._heartbeats is None
            or (
                self.enable_auto_commit
                and asyncio.get_running_loop().time() >= self._next_auto_commit
            )
        )

    async def _maintain(self) -> None:
        """Rejoin when a rebalance is on; auto-commit when due."""
        if self._closed:
            raise ConnectionLostError("the group consumer is closed")
        if self._heartbeats is None:
            self._heartbeats = asyncio.get_running_loop().create_task(
                self._heartbeat_loop(), name=f"tidewire heartbeats {self.group_id}"
            )
        if self._rejoin:
            await self._rebalance()
        elif (
            self.enable_auto_commit and asyncio.get_running_loop().time() >= self._next_auto_commit
        ):
            self._auto_commit_in_background()

    # --- membership -------------------------------------------------------------------------

    async def _rebalance(self) -> None:
        if self._assigned:
            await self._commit_settled()
            if self.enable_auto_commit and not self._fenced:
                await self._auto_commit()
            await _call(self.on_revoke, list(self._assigned))
        self._local.clear()
        old = set(self._assigned)
        self._joining = True
        try:
            new = await self._join()
        finally:
            self._joining = False
        keep = set() if self._fenced else old & set(new)
        positions = {tp: self._positions[tp] for tp in keep}
        gained = [tp for tp in new if tp not in keep]
        if gained:
            positions.update(await self._starting_offsets(gained))
        self._assigned, self._positions = new, positions
        self._paused &= set(new)
        self._fenced = False
        await self._reassign_inner()
        self._next_auto_commit = (
            asyncio.get_running_loop().time() + self.auto_commit_interval_ms / 1000
        )
        await _call(self.on_assign, list(new))

    async def _join(self) -> list[TP]:
        backoff = 0.0
        while True:
            self._rejoin = False
            req = JoinGroupRequest(
                group_id=self.group_id,
                member_id=self._member_id,
                group_instance_id=self.group_instance_id,
                client_id=self.client_id,
                topics=self.topics,
                pattern=self.pattern,
                strategy=self.strategy,
                session_timeout_ms=self.session_timeout_ms,
                rebalance_timeout_ms=self.rebalance_timeout_ms,
            )
            timeout = (self.rebalance_timeout_ms / 1000) + self._coord.request_timeout_s
            try:
                body = await self._group_request(req, timeout_s=timeout)
            except TidewireError as exc:
                if not exc.retriable:
                    raise
                backoff = min(max(backoff * 2, BACKOFF_MIN_S), BACKOFF_MAX_S)
                await asyncio.sleep(backoff)
                continue
            if body.error_code == UnknownMemberError.code:
                self._member_id = ""
                self._fenced = True
                continue
            if body.error_code == RebalanceInProgressError.code:
                continue  # a newer join of ours replaced it, or the broker is stopping
            if body.error_code:
                self._rejoin = True
                raise for_code(body.error_code)(body.error_message)
            self._member_id, self._generation = body.member_id, body.generation
            self._joined = True
            if self._rejoin:  # a heartbeat of the old generation said so meanwhile: stale
                self._rejoin = False
            return sorted((p.topic, p.partition) for p in body.assignment)

    async def _starting_offsets(self, partitions: list[TP]) -> dict[TP, int]:
        req = OffsetFetchRequest(
            group_id=self.group_id, partitions=[GroupPartition(t, p) for t, p in partitions]
        )
        body = await self._group_request(req)
        committed = {(o.topic, o.partition): int(o.offset) for o in body.offsets}
        resolve: list[tuple[str, int, Offset]] = []
        out: dict[TP, int] = {}
        for tp in partitions:
            off = committed.get(tp, -1)
            if off >= 0:
                out[tp] = off
            else:
                resolve.append((tp[0], tp[1], self.auto_offset_reset))
        if resolve:
            out.update(await self._resolve(resolve))
        return out

    async def _resolve(self, wanted: list[tuple[str, int, Offset]]) -> dict[TP, int]:
        """Positions as offsets: ints as they are, the rest looked up with LIST_OFFSETS."""
        out: dict[TP, int] = {}
        lookups: list[ListOffsetsPartition] = []
        looked_up: list[tuple[str, int, Offset]] = []  # the positions of ``lookups``
        for topic, partition, offset in wanted:
            if isinstance(offset, bool):
                raise TypeError("offset must be an int, 'earliest', 'latest' or a datetime")
            if isinstance(offset, int):
                if offset < 0:
                    raise ValueError(f"offset {offset} is negative: use 'earliest' or 'latest'")
                out[(topic, partition)] = offset
            elif offset in ("earliest", "latest"):
                ts = EARLIEST if offset == "earliest" else LATEST
                lookups.append(ListOffsetsPartition(topic, partition, ts))
                looked_up.append((topic, partition, offset))
            elif isinstance(offset, datetime):
                ts = max(int(offset.timestamp() * 1000), 0)
                lookups.append(ListOffsetsPartition(topic, partition, ts))
                looked_up.append((topic, partition, offset))
            else:
                raise ValueError(f"offset {offset!r}: an int, 'earliest', 'latest' or a datetime")
        if not lookups:
            return out
        inner = self._inner
        if isinstance(inner, AsyncConsumer) and inner._router.clustered:
            # A cluster: each lookup at its partition's leader, as the consumer's fetches.
            out.update(await inner._resolve(looked_up))
            return out
        response = await self._coord.request(ListOffsetsRequest(partitions=lookups))
        assert response is not None
        for result in response.body.results:
            if result.error_code:
                exc = for_code(result.error_code)(result.error_message)
                if isinstance(exc, NotLeaderError) and isinstance(inner, AsyncConsumer):
                    # A cluster this member did not know of yet: its consumer finds the
                    # leaders (and learns the cluster) for the lookups.
                    out.update(await inner._resolve(looked_up))
                    return out
                raise exc
            out[(result.topic, result.partition)] = int(result.offset)
        return out

    async def _reassign_inner(self) -> None:
        active = [tp for tp in self._assigned if tp not in self._paused]
        self._local = deque(r for r in self._local if (r.topic, r.partition) in set(active))
        positions: list[tuple[str, int, Offset]] = [
            (t, p, self._positions[(t, p)]) for t, p in active
        ]
        if isinstance(self._inner, AsyncSubscriber):
            await self._inner.subscribe(positions)
        else:
            await self._inner.assign(positions)

    async def _heartbeat_loop(self) -> None:
        period = self.heartbeat_interval_ms / 1000
        while True:
            await asyncio.sleep(period)
            if self._rejoin or self._joining or not self._joined:
                continue
            generation = self._generation
            req = HeartbeatRequest(
                group_id=self.group_id, member_id=self._member_id, generation=generation
            )
            try:
                body = await self._group_request(req)
            except TidewireError as exc:
                log.debug("heartbeat of group %s failed: %s", self.group_id, exc)
                continue
            code = body.error_code
            if code and generation == self._generation:
                log.info("group %s: %s", self.group_id, body.error_message)
                self._rejoin = True
                if code == UnknownMemberError.code:
                    self._member_id = ""
                if code in _FENCED:
                    self._fenced = True

    async def _group_request(self, req: Body, *, timeout_s: float | None = None) -> Any:
        """Send a group request to the group's coordinator and return the response's body.

        On a single node this is one request on ``_coord``. In a cluster the request goes to
        the leader of the group's partition of ``__consumer_offsets``; a node that is not
        (any more) the coordinator (:class:`NotCoordinatorError`, as a whole or in a join's
        answer) or a lost connection sends it again to the coordinator found in the metadata,
        after the routing's backoff, for up to the request timeout (see
        :func:`~tidewire.client._routing.call_routed`).
        """

        async def send(transport: Transport) -> Any:
            response = await transport.request(req, timeout_s=timeout_s)
            assert response is not None
            body = response.body
            if getattr(body, "error_code", 0) == NotCoordinatorError.code:
                raise NotCoordinatorError(body.error_message)
            return body

        return await call_routed(
            self._coord_router,
            OFFSETS_TOPIC,
            self._coord_partition,
            send,
            timeout_s=self._coord.request_timeout_s,
            resend_on_loss=True,
        )

    # --- commits ----------------------------------------------------------------------------

    async def commit(self, offsets: Mapping[TP, int] | None = None) -> None:
        """Commit ``offsets`` (partition -> the next offset to read), or the position of
        every assigned partition; return once the broker has fsynced them.

        Raises:
            IllegalGenerationError, UnknownMemberError, PartitionNotAssignedError: this
                member is fenced (a rebalance happened without it); it rejoins at the next
                poll.
            ConnectionLostError, RequestTimedOutError: the commit may not have been stored.
        """
        await self._commit_settled()
        await self._commit_now(dict(self._positions) if offsets is None else dict(offsets))

    async def _commit_now(self, todo: dict[TP, int]) -> None:
        if not todo:
            return
        req = OffsetCommitRequest(
            group_id=self.group_id,
            member_id=self._member_id,
            generation=self._generation,
            partitions=[CommitPartition(t, p, o) for (t, p), o in sorted(todo.items())],
        )
        body = await self._group_request(req)
        for r in body.results:
            if r.error_code:
                if r.error_code in _FENCED:
                    self._rejoin = self._fenced = True
                raise for_code(r.error_code)(r.error_message)

    async def _auto_commit(self, positions: dict[TP, int] | None = None) -> None:
        self._next_auto_commit = (
            asyncio.get_running_loop().time() + self.auto_commit_interval_ms / 1000
        )
        try:
            await self._commit_now(dict(self._positions) if positions is None else positions)
        except TidewireError as exc:
            log.warning("auto-commit of group %s failed: %s", self.group_id, exc)

    def _auto_commit_in_background(self) -> None:
        """The periodic auto-commit: the positions as they are now, sent without waiting for
        the broker's fsync, so delivery goes on meanwhile (one commit in flight at a time;
        every commit that follows waits for it, so commits land in order)."""
        loop = asyncio.get_running_loop()
        self._next_auto_commit = loop.time() + self.auto_commit_interval_ms / 1000
        if self._commit_task is not None and not self._commit_task.done():
            return
        self._commit_task = loop.create_task(
            self._auto_commit(dict(self._positions)), name=f"tidewire commit {self.group_id}"
        )

    async def _commit_settled(self) -> None:
        """Wait for the background auto-commit in flight, if any (it logs its own failure)."""
        task, self._commit_task = self._commit_task, None
        if task is not None:
            await task

    # --- positions --------------------------------------------------------------------------

    async def seek(self, topic: str, partition: int, offset: Offset) -> None:
        """Move an assigned partition's position to an offset, ``"earliest"``, ``"latest"``
        or a ``datetime`` (the first record at or after it).

        Raises:
            ValueError: not assigned.
        """
        await self._seek([(topic, partition)], offset)

    async def seek_to_beginning(self, partitions: Iterable[TP] | None = None) -> None:
        """Move the given (default: all assigned) partitions to their log start."""
        await self._seek(partitions, "earliest")

    async def seek_to_end(self, partitions: Iterable[TP] | None = None) -> None:
        """Move the given (default: all assigned) partitions to their end."""
        await self._seek(partitions, "latest")

    async def seek_to_time(
        self, when: datetime | int, partitions: Iterable[TP] | None = None
    ) -> None:
        """Move the given (default: all assigned) partitions to the first record whose
        timestamp is at or after ``when`` (a datetime, or ms since the epoch), or the end."""
        at = (
            when if isinstance(when, datetime) else datetime.fromtimestamp(when / 1000).astimezone()
        )
        await self._seek(partitions, at)

    async def _seek(self, partitions: Iterable[TP] | None, offset: Offset) -> None:
        tps = list(self._assigned) if partitions is None else [(t, p) for t, p in partitions]
        for tp in tps:
            if tp not in self._positions:
                raise ValueError(f"{tp[0]!r} partition {tp[1]} is not assigned")
        if not tps:
            return
        resolved = await self._resolve([(t, p, offset) for t, p in tps])
        self._positions.update(resolved)
        self._local = deque(r for r in self._local if (r.topic, r.partition) not in resolved)
        await self._reassign_inner()

    async def pause(self, partitions: Iterable[TP]) -> None:
        """Stop fetching these assigned partitions (their positions stay) until resumed."""
        tps = {(t, p) for t, p in partitions}
        for tp in tps:
            if tp not in self._positions:
                raise ValueError(f"{tp[0]!r} partition {tp[1]} is not assigned")
        self._paused |= tps
        await self._reassign_inner()

    async def resume(self, partitions: Iterable[TP]) -> None:
        """Fetch these paused partitions again, from their positions."""
        self._paused -= {(t, p) for t, p in partitions}
        await self._reassign_inner()

    async def _rewind(self, positions: Mapping[TP, int]) -> None:
        """Set positions back (the blocking twin's records not yet handed out)."""
        self._positions.update({tp: o for tp, o in positions.items() if tp in self._positions})
        await self._reassign_inner()

    # --- closing ----------------------------------------------------------------------------

    async def close(self) -> None:
        """Commit (with auto-commit), call ``on_revoke``, leave the group (unless static),
        and close the connections."""
        if self._closed:
            return
        self._closed = True
        task, self._heartbeats = self._heartbeats, None
        if task is not None:
            await cancel_and_wait(task)
        try:
            if self._joined and self._member_id:
                await self._commit_settled()
                if self.enable_auto_commit and not self._rejoin:
                    await self._auto_commit()
                if self._assigned:
                    await _call(self.on_revoke, list(self._assigned))
                if not self.group_instance_id:
                    with contextlib.suppress(TidewireError):
                        await self._group_request(
                            LeaveGroupRequest(group_id=self.group_id, member_id=self._member_id)
                        )
        finally:
            await self._inner.close()
            await self._coord_router.close()
            await self._coord.close()


async def _call(callback: PartitionsCallback | None, partitions: list[TP]) -> None:
    if callback is None:
        return
    result = callback(partitions)
    if inspect.isawaitable(result):
        await result


class GroupConsumer(BlockingReader[AsyncGroupConsumer]):
    """The blocking twin of :class:`AsyncGroupConsumer`: the same arguments and methods
    without ``await``, and ``for record in consumer``. It runs the async consumer on an
    event loop in a thread of its own; ``on_assign`` / ``on_revoke`` run on that thread and
    must not call this consumer's methods. Records fetched but not yet handed to the
    application are never counted in a commit."""

    _closed_error = ConnectionLostError
    _closed_message = "the group consumer is closed"

    def __init__(self, addr: Addresses, group_id: str, **options: Any) -> None:
        parse_addrs(addr)
        self._local: deque[ConsumerRecord] = deque()
        self._start_loop("tidewire-group-consumer")
        try:
            self._async = self._run(self._make(addr, group_id, options))
        except BaseException:
            self._stop_loop()
            raise

    @staticmethod
    async def _make(addr: Addresses, group_id: str, options: dict[str, Any]) -> AsyncGroupConsumer:
        return AsyncGroupConsumer(addr, group_id, **options)

    def _unhanded(self, tps: set[TP] | None = None) -> dict[TP, int]:
        """The first offset of each partition's records not handed out yet (dropping them
        from the local buffer when ``tps`` names their partitions)."""
        first: dict[TP, int] = {}
        for r in self._local:
            first.setdefault((r.topic, r.partition), r.offset)
        if tps is not None:
            self._local = deque(r for r in self._local if (r.topic, r.partition) not in tps)
        return first if tps is None else {tp: o for tp, o in first.items() if tp in tps}

    @property
    def member_id(self) -> str:
        return self._async.member_id

    @property
    def generation(self) -> int:
        return self._async.generation

    def position(self, topic: str, partition: int) -> int:
        first = self._unhanded().get((topic, partition))
        return self._async.position(topic, partition) if first is None else first

    def paused(self) -> list[TP]:
        return self._async.paused()

    def commit(self, offsets: Mapping[TP, int] | None = None) -> None:
        if offsets is None:
            positions = {tp: self._async.position(*tp) for tp in self._async.assignment()}
            positions.update(self._unhanded())
            offsets = positions
        self._run(self._async.commit(offsets))

    def seek(self, topic: str, partition: int, offset: Offset) -> None:
        self._unhanded({(topic, partition)})
        self._run(self._async.seek(topic, partition, offset))

    def seek_to_beginning(self, partitions: Iterable[TP] | None = None) -> None:
        tps = None if partitions is None else list(partitions)
        self._unhanded(set(tps or self._async.assignment()))
        self._run(self._async.seek_to_beginning(tps))

    def seek_to_end(self, partitions: Iterable[TP] | None = None) -> None:
        tps = None if partitions is None else list(partitions)
        self._unhanded(set(tps or self._async.assignment()))
        self._run(self._async.seek_to_end(tps))

    def seek_to_time(self, when: datetime | int, partitions: Iterable[TP] | None = None) -> None:
        tps = None if partitions is None else list(partitions)
        self._unhanded(set(tps or self._async.assignment()))
        self._run(self._async.seek_to_time(when, tps))

    def pause(self, partitions: Iterable[TP]) -> None:
        tps = {(t, p) for t, p in partitions}
        self._run(self._async._rewind(self._unhanded(tps)))
        self._run(self._async.pause(tps))

    def resume(self, partitions: Iterable[TP]) -> None:
        self._run(self._async.resume(list(partitions)))

    def close(self) -> None:
        """Commit what was handed out (with auto-commit), leave, stop the thread."""
        if self._loop.is_closed():
            return
        try:
            if self._local:
                self._run(self._async._rewind(self._unhanded(set(self._async.assignment()))))
            self._run(self._async.close())
        finally:
            self._stop_loop()
