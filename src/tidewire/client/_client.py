"""The clients: :class:`AsyncClient` and its blocking twin :class:`Client`, with the same
methods (the twin runs the async client on an event loop in a thread of its own).

They cover administration (topics, consumer groups and their lag), producing record batches
to a partition, fetching records from a partition and offset (with long-poll), and offsets by
time.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from tidewire.client._blocking import BlockingTwin
from tidewire.errors import fetch_error, for_code
from tidewire.protocol.messages import (
    ACKS_DURABLE,
    ACKS_NONE,
    AlterReplicationRequest,
    AlterTopicRequest,
    ApiVersionsRequest,
    AuditEventBody,
    CommitPartition,
    CreateTopicRequest,
    DeleteGroupRequest,
    DeleteTopicRequest,
    DescribeAuditRequest,
    DescribeGroupRequest,
    DescribeGroupResponse,
    DescribeTopicRequest,
    FetchPartition,
    FetchRequest,
    GroupPartition,
    GroupPartitionLag,
    GroupSummary,
    ListGroupsRequest,
    ListOffsetsPartition,
    ListOffsetsRequest,
    ListTopicsRequest,
    MetadataRequest,
    OffsetCommitRequest,
    OffsetFetchRequest,
    PartitionReplicas,
    PartitionReplication,
    PingRequest,
    ProducePartition,
    ProduceRequest,
    ProducerStateRequest,
    ReleaseWritersRequest,
    RepairResult,
    RepairTopicRequest,
    ResetOffsetResult,
    ResetOffsetsRequest,
    StorageProblem,
    TopicConfig,
    TopicDescription,
    WhoAmIRequest,
    WhoAmIResponse,
)
from tidewire.records import BatchBuilder, Codec, Record, iter_batches, iter_records
from tidewire.security.credentials import Credentials
from tidewire.security.tls import TlsOptions

from ._queues import AsyncQueueAdmin, QueueAdmin
from ._routing import (
    OFFSETS_TOPIC,
    Router,
    RoutingStats,
    call_routed,
    call_the_leader_of,
    coordinator_partition,
)
from ._security import AsyncSecurityAdmin, SecurityAdmin
from ._streams import AsyncStreams, Streams
from ._transport import Addresses, Transport, parse_addrs

__all__ = ["AsyncClient", "AuditEvents", "Client", "FetchedBatches", "FetchedRecords", "Message"]

T = TypeVar("T")


class AuditEvents(list[AuditEventBody]):
    """The audit events a query found, oldest first (a list), and in a cluster the nodes
    whose audit logs no node answered for in time (:attr:`missing_nodes`): their events are
    missing, the answer is partial. Empty on a single node and when every node answered."""

    missing_nodes: tuple[int, ...]

    def __init__(self, events: Iterable[AuditEventBody], missing_nodes: Iterable[int] = ()) -> None:
        super().__init__(events)
        self.missing_nodes = tuple(missing_nodes)


@dataclass(frozen=True, slots=True)
class Message:
    """One message to produce."""

    value: bytes | None
    key: bytes | None = None
    headers: Sequence[tuple[str, bytes | None]] = ()
    timestamp_ms: int | None = None


@dataclass(frozen=True, slots=True)
class FetchedBatches:
    """One partition's part of a fetch as the broker sent it: whole record batches, CRC not
    yet checked (see :func:`tidewire.records.iter_batches`); the first may start before the
    offset asked for."""

    data: bytes
    high_watermark: int
    log_start_offset: int


@dataclass(frozen=True, slots=True)
class FetchedRecords:
    """Records read from one partition, and where to read next."""

    records: list[Record]
    next_offset: int
    high_watermark: int


def _raise(code: int, message: str) -> None:
    if code:
        raise for_code(code)(message)


class AsyncClient(AsyncSecurityAdmin, AsyncQueueAdmin):
    """An asyncio client for one broker.

    Args:
        addr: ``"HOST:PORT"`` of the broker, or of several nodes of a cluster
            (``"H1:P1,H2:P2"`` or a list): the first that answers is used.
        request_timeout_s: default timeout of each request.
        connect_timeout_s: how long opening the connection may take.
        max_in_flight: requests sent and not yet answered on the connection.
        credentials: the API key to authenticate with (:class:`~tidewire.client.Credentials`).
        tls: TLS to the broker: :class:`~tidewire.client.TlsOptions`, True (the system's
            CAs), or None (plaintext).

    Use as ``async with AsyncClient("127.0.0.1:7400") as client``.
    """

    def __init__(
        self,
        addr: Addresses = "127.0.0.1:7400",
        *,
        request_timeout_s: float = 30.0,
        connect_timeout_s: float = 10.0,
        max_in_flight: int = 64,
        credentials: Credentials | None = None,
        tls: TlsOptions | bool | None = None,
    ) -> None:
        def connect(address: Addresses) -> Transport:
            return Transport(
                address,
                request_timeout_s=request_timeout_s,
                connect_timeout_s=connect_timeout_s,
                max_in_flight=max_in_flight,
                credentials=credentials,
                tls=tls,
            )

        self._t = connect(addr)
        #: Where produce, fetch and offset lookups go: each partition's leader in a cluster.
        self._router = Router(self._t, connect)
        #: Lightweight streams: send, receive, read, subscribe (:class:`AsyncStreams`).
        self.streams = AsyncStreams(self._t, self._router)

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        """Close the connections."""
        await self._router.close()
        await self._t.close()

    @property
    def throttle_time_ms_total(self) -> int:
        """How long the broker held this client's produce and fetch answers back in all
        (ms), because its principal was over a quota (0: never throttled)."""
        return self._router.throttle_time_ms_total

    @property
    def routing_stats(self) -> RoutingStats:
        """What this client's routing did: metadata refreshes, NotLeader retries and leader
        moves followed (a copy; see :class:`~tidewire.client.RoutingStats`)."""
        return self._router.stats_copy()

    async def _call(self, body: Any, data: Sequence[bytes] = ()) -> Any:
        response = await self._t.request(body, data)
        assert response is not None
        return response

    async def _call_group(self, group_id: str, body: Any) -> Any:
        """A request about ``group_id``: to the group's coordinator in a cluster (the leader
        of its partition of ``__consumer_offsets``), found again on NotCoordinatorError for
        up to the request timeout; on a single node, :meth:`_call`. A lost connection is not
        retried (a delete or reset may have been done)."""

        async def send(transport: Transport) -> Any:
            response = await transport.request(body)
            assert response is not None
            return response

        return await call_routed(
            self._router,
            OFFSETS_TOPIC,
            coordinator_partition(group_id),
            send,
            timeout_s=self._t.request_timeout_s,
            resend_on_loss=False,
        )

    async def _call_security(self, body: Any) -> Any:
        """A security change, answered by the node that can make it: in a cluster the leader
        of ``__security`` (the others refuse it with NotLeaderError, changing nothing; its
        location is private, so the nodes are asked in turn, for up to the request
        timeout); on a single node, the one node. A lost connection is not retried (the
        change may have been made). Returns the answer's body."""
        return await call_the_leader_of(self._t, self._router, body)

    # --- admin ----------------------------------------------------------------------------------

    async def whoami(self) -> WhoAmIResponse:
        """Who the broker takes this client for: principal, roles, mechanism, TLS."""
        body: WhoAmIResponse = (await self._call(WhoAmIRequest())).body
        return body

    async def ping(self) -> None:
        """Round trip to the broker. Raises ConnectionLostError if it is unreachable."""
        await self._call(PingRequest())

    async def storage_problems(self) -> tuple[list[StorageProblem], int]:
        """What the broker's storage does not serve: damaged ranges, quarantined ranges and
        offline partitions (at most the first 100), and how many there are in all; an empty
        list when every partition serves everything it holds."""
        body = (await self._call(PingRequest(storage=True))).body
        return list(body.problems), int(body.problems_total)

    async def repair_topic(
        self, name: str, partition: int | None = None, action: str = "report"
    ) -> list[RepairResult]:
        """Report (``action="report"``), quarantine (``"quarantine"``) or truncate
        (``"truncate"``) the damaged ranges of a topic's partitions (one, or all when
        ``partition`` is None). See docs/storage.md.

        Raises:
            UnknownTopicError, UnknownPartitionError, PartitionOfflineError,
            InvalidRequestError (an unknown action), StorageError.
        """
        req = RepairTopicRequest(name=name, partition=partition, action=action)
        body = (await self._call(req)).body
        _raise(body.error_code, body.error_message)
        return list(body.results)

    async def server_version(self) -> str:
        return str(
            (await self._call(ApiVersionsRequest(client_name="tidewire-py"))).body.server_version
        )

    async def create_topic(
        self,
        name: str,
        partitions: int | None = None,
        config: TopicConfig | None = None,
        *,
        replication_factor: int | None = None,
        min_insync_replicas: int | None = None,
        unclean_leader_election: bool | None = None,
    ) -> None:
        """Create a topic (``partitions=None``: the broker's default). The keyword settings
        are a cluster's (docs/cluster.md): copies of each partition, in-sync replicas an
        acks=all produce needs, and whether a replica outside the ISR may be elected.

        Raises:
            TopicExistsError, InvalidTopicError, InvalidConfigError.
        """
        body = (
            await self._call(
                CreateTopicRequest(
                    name=name,
                    partitions=partitions,
                    config=config or TopicConfig(),
                    replication_factor=replication_factor,
                    min_insync_replicas=min_insync_replicas,
                    unclean_leader_election=unclean_leader_election,
                )
            )
        ).body
        _raise(body.error_code, body.error_message)

    async def delete_topic(self, name: str) -> None:
        """Raises UnknownTopicError."""
        body = (await self._call(DeleteTopicRequest(name=name))).body
        _raise(body.error_code, body.error_message)

    async def list_topics(self) -> list[str]:
        return list((await self._call(ListTopicsRequest())).body.topics)

    async def describe_topic(self, name: str, *, auto_create: bool = False) -> TopicDescription:
        """Partitions with their offsets, and the settings.

        Args:
            auto_create: create the topic first if it does not exist, as a first publish
                would (where the broker creates topics on first publish).

        Raises:
            UnknownTopicError: no such topic (and none was created).
        """
        if auto_create:
            meta = (await self._call(MetadataRequest(topics=[name], auto_create=True))).body
            await self._router.learn(meta, self._t)
            (desc,) = meta.topics
            _raise(desc.error_code, desc.error_message)
            return desc  # type: ignore[no-any-return]
        body = (await self._call(DescribeTopicRequest(name=name))).body
        _raise(body.error_code, body.error_message)
        assert body.topic is not None
        return body.topic  # type: ignore[no-any-return]

    async def alter_topic(
        self, name: str, *, partitions: int | None = None, config: TopicConfig | None = None
    ) -> None:
        """Add partitions and/or change settings. Raises UnknownTopicError, InvalidTopicError."""
        req = AlterTopicRequest(name=name, partitions=partitions, config=config or TopicConfig())
        body = (await self._call(req)).body
        _raise(body.error_code, body.error_message)

    async def alter_replication(
        self,
        topic: str,
        *,
        replicas: Mapping[int, Sequence[int]] | None = None,
        replication_factor: int | None = None,
        min_insync_replicas: int | None = None,
        unclean_leader_election: bool | None = None,
        cancel: bool = False,
        partitions: Sequence[int] = (),
    ) -> list[PartitionReplication]:
        """Change the replication of a cluster's topic (docs/cluster.md, "Reassigning
        partitions"): move partitions to the replica sets ``replicas`` (partition -> node
        ids, the first its preferred leader) or to ``replication_factor`` replicas each,
        and/or set its ``min_insync_replicas`` or ``unclean_leader_election``; or
        ``cancel`` the moves under way of ``partitions`` (empty: all; each goes back to the
        replicas it had before). Returns each partition, with the target of a move under
        way; with nothing to change, only that.

        Raises:
            UnknownTopicError, InvalidRequestError (a single node, unknown nodes, a move under
            way), InvalidConfigError, RequestTimedOutError.
        """
        req = AlterReplicationRequest(
            topic=topic,
            assignments=[
                PartitionReplicas(partition=p, replicas=list(r))
                for p, r in sorted((replicas or {}).items())
            ],
            replication_factor=replication_factor,
            min_insync_replicas=min_insync_replicas,
            unclean_leader_election=unclean_leader_election,
            cancel=cancel,
            partitions=list(partitions),
        )
        body = (await self._call(req)).body
        _raise(body.error_code, body.error_message)
        return list(body.partitions)

    # --- produce and fetch ----------------------------------------------------------------------

    async def produce(
        self,
        topic: str,
        partition: int,
        messages: Iterable[Message],
        *,
        acks: int = ACKS_DURABLE,
        codec: Codec = Codec.NONE,
    ) -> int:
        """Send ``messages`` as one batch to ``topic``/``partition``; return the base offset
        (-1 with ``acks=0``, which gets no answer).

        Raises:
            UnknownTopicError, UnknownPartitionError, BatchTooLargeError, StorageError, ...:
            the broker's per-partition error.
        """
        builder = BatchBuilder(codec=codec)
        now = time.time_ns() // 1_000_000
        for m in messages:
            builder.append(
                m.value,
                key=m.key,
                headers=m.headers,
                timestamp_ms=now if m.timestamp_ms is None else m.timestamp_ms,
            )
        if not len(builder):
            raise ValueError("produce() needs at least one message")
        return await self.produce_batch(topic, partition, builder.build(), acks=acks)

    async def produce_batch(
        self, topic: str, partition: int, batch: bytes, *, acks: int = ACKS_DURABLE
    ) -> int:
        """Send a built record batch (or several, concatenated); return the base offset.

        In a cluster it goes to the partition's leader; refused with NotLeaderError or
        NotEnoughReplicasError (nothing stored), it is sent again after a metadata refresh,
        for up to ``request_timeout_s``. A lost connection is not retried (the batch may
        have been stored): it raises ConnectionLostError.
        """
        req = ProduceRequest(acks=acks, partitions=[ProducePartition(topic, partition, len(batch))])

        async def send(t: Transport) -> int:
            response = await t.request(req, [batch], expect_response=acks != ACKS_NONE)
            if response is None:
                return -1
            (result,) = response.body.results
            _raise(result.error_code, result.error_message)
            return int(result.base_offset)

        return await call_routed(
            self._router,
            topic,
            partition,
            send,
            timeout_s=self._t.request_timeout_s,
            resend_on_loss=False,
        )

    async def fetch(
        self,
        topic: str,
        partition: int,
        offset: int,
        *,
        max_bytes: int = 1024 * 1024,
        max_wait_ms: int = 0,
    ) -> FetchedRecords:
        """Read records from ``offset`` on (long-poll up to ``max_wait_ms`` when there are
        none yet). Records below ``offset`` in the first batch are skipped.

        Raises:
            UnknownTopicError, UnknownPartitionError, OffsetOutOfRangeError, ...
        """
        got = await self.fetch_batches(
            topic, partition, offset, max_bytes=max_bytes, max_wait_ms=max_wait_ms
        )
        data = got.data
        records: list[Record] = []
        nxt = offset
        for pos, h in iter_batches(data):
            for rec in iter_records(memoryview(data)[pos : pos + h.size]):
                if rec.offset >= offset:
                    records.append(rec)
            nxt = h.next_offset
        return FetchedRecords(records, max(nxt, offset), got.high_watermark)

    async def fetch_batches(
        self,
        topic: str,
        partition: int,
        offset: int,
        *,
        max_bytes: int = 1024 * 1024,
        max_wait_ms: int = 0,
    ) -> FetchedBatches:
        """Read the record batches from ``offset`` on as bytes, for readers that decode them
        their own way (long-poll up to ``max_wait_ms`` when there are none yet).

        Raises:
            UnknownTopicError, UnknownPartitionError, OffsetOutOfRangeError, ...
        """
        req = FetchRequest(
            max_wait_ms=max_wait_ms,
            max_bytes=max_bytes,
            partitions=[FetchPartition(topic, partition, offset, max_bytes)],
        )
        timeout = self._t.request_timeout_s + max_wait_ms / 1000

        async def send(t: Transport) -> FetchedBatches:
            response = await t.request(req, timeout_s=timeout)
            assert response is not None
            (result,) = response.body.partitions
            if result.error_code:
                raise fetch_error(
                    result.error_code, result.error_message, result.damage_start, result.damage_end
                )
            return FetchedBatches(
                bytes(response.data[: result.size]),
                int(result.high_watermark),
                int(result.log_start_offset),
            )

        return await call_routed(
            self._router, topic, partition, send, timeout_s=timeout, resend_on_loss=True
        )

    async def list_offset(self, topic: str, partition: int, timestamp: int) -> int:
        """-2: earliest, -1: latest (high watermark), else the first offset at or after the
        timestamp (ms)."""
        req = ListOffsetsRequest(partitions=[ListOffsetsPartition(topic, partition, timestamp)])

        async def send(t: Transport) -> int:
            response = await t.request(req)
            assert response is not None
            (result,) = response.body.results
            _raise(result.error_code, result.error_message)
            return int(result.offset)

        return await call_routed(
            self._router,
            topic,
            partition,
            send,
            timeout_s=self._t.request_timeout_s,
            resend_on_loss=True,
        )

    # --- writers ----------------------------------------------------------------------------------

    async def producer_state(
        self, producer_id: int, partitions: Sequence[tuple[str, int]], *, producer_epoch: int = -1
    ) -> dict[tuple[str, int], tuple[int, int]]:
        """What ``producer_id`` stored last in each partition: ``(epoch, last_sequence)``,
        ``(-1, -1)`` where it stored nothing (see docs/protocol.md, PRODUCER_STATE).

        Raises:
            ProducerFencedError: ``producer_epoch`` is not the producer's newest.
            UnknownTopicError, UnknownPartitionError, OutOfOrderSequenceError: for the first
                partition that failed.
        """
        req = ProducerStateRequest(
            producer_id=producer_id,
            producer_epoch=producer_epoch,
            partitions=[GroupPartition(t, p) for t, p in partitions],
        )
        body = (await self._call(req)).body
        _raise(body.error_code, body.error_message)
        out: dict[tuple[str, int], tuple[int, int]] = {}
        for r in body.results:
            _raise(r.error_code, r.error_message)
            out[r.topic, r.partition] = (int(r.producer_epoch), int(r.last_sequence))
        return out

    async def release_writers(self, writer_ids: Sequence[str]) -> int:
        """Tell the broker that these writers' job committed: it forgets their state and
        refuses them from now on. Returns how many partitions held state of them.

        Raises:
            InvalidRequestError: a bad writer id, or more than 10,000 at once.
        """
        body = (await self._call(ReleaseWritersRequest(writer_ids=list(writer_ids)))).body
        _raise(body.error_code, body.error_message)
        return int(body.released)

    # --- consumer groups ------------------------------------------------------------------------

    async def list_groups(self) -> list[GroupSummary]:
        """Every group with members or committed offsets: id, state, member count. In a
        cluster, of every node (each lists the groups it coordinates)."""
        listed: dict[str, GroupSummary] = {}
        for body in await self._router.ask_every_node(ListGroupsRequest()):
            for g in body.groups:
                # A coordinator that moved a moment ago may be listed by both nodes: the
                # one with members is the one serving the group.
                if g.group_id not in listed or g.members > listed[g.group_id].members:
                    listed[g.group_id] = g
        return [listed[g] for g in sorted(listed)]

    async def describe_group(self, group_id: str) -> DescribeGroupResponse:
        """State, generation, members with their assignment, and every partition's
        committed offset, end offset and lag. Raises UnknownGroupError."""
        body = (await self._call_group(group_id, DescribeGroupRequest(group_id=group_id))).body
        _raise(body.error_code, body.error_message)
        return body  # type: ignore[no-any-return]

    async def group_lag(self, group_id: str) -> list[GroupPartitionLag]:
        """Per partition: committed offset (-1: none), end offset, lag (-1: nothing
        committed). Raises UnknownGroupError."""
        return list((await self.describe_group(group_id)).offsets)

    async def committed_offsets(
        self, group_id: str, partitions: Sequence[tuple[str, int]] | None = None
    ) -> dict[tuple[str, int], int]:
        """The group's committed offsets (of ``partitions``; default every committed one);
        -1 for a partition with nothing committed."""
        req = OffsetFetchRequest(
            group_id=group_id,
            partitions=None
            if partitions is None
            else [GroupPartition(t, p) for t, p in partitions],
        )
        body = (await self._call_group(group_id, req)).body
        return {(o.topic, o.partition): int(o.offset) for o in body.offsets}

    async def commit_offsets(self, group_id: str, offsets: Mapping[tuple[str, int], int]) -> None:
        """Commit ``offsets`` (partition -> the next offset to read) for a group without
        members, from outside it, as a job that tracks its own positions does; return once
        the broker has stored them. ``tidewire group describe`` then shows the group's lag.

        Raises:
            GroupNotEmptyError: the group has members (they own its offsets).
            UnknownTopicError, UnknownPartitionError, InvalidRequestError.
        """
        if not offsets:
            return
        req = OffsetCommitRequest(
            group_id=group_id,
            partitions=[CommitPartition(t, p, o) for (t, p), o in sorted(offsets.items())],
        )
        for r in (await self._call_group(group_id, req)).body.results:
            _raise(r.error_code, r.error_message)

    async def delete_group(self, group_id: str) -> None:
        """Delete a group without members and its committed offsets.

        Raises:
            GroupNotEmptyError, UnknownGroupError.
        """
        body = (await self._call_group(group_id, DeleteGroupRequest(group_id=group_id))).body
        _raise(body.error_code, body.error_message)

    async def reset_group_offsets(
        self,
        group_id: str,
        topic: str,
        to: str,
        *,
        value: int = 0,
        partitions: Sequence[int] | None = None,
        dry_run: bool = False,
    ) -> list[ResetOffsetResult]:
        """Move the committed offsets of a group without members for ``topic`` (its
        ``partitions``, default all): ``to`` is ``"earliest"``, ``"latest"``, ``"offset"``
        (``value``, clamped to the log) or ``"timestamp"`` (the first offset at or after
        ``value`` ms). Returns each partition's previous and new offset; ``dry_run``
        commits nothing.

        Raises:
            GroupNotEmptyError, UnknownTopicError, UnknownPartitionError, InvalidRequestError.
        """
        req = ResetOffsetsRequest(
            group_id=group_id,
            topic=topic,
            to=to,
            value=value,
            partitions=None if partitions is None else list(partitions),
            dry_run=dry_run,
        )
        body = (await self._call_group(group_id, req)).body
        _raise(body.error_code, body.error_message)
        return list(body.results)

    async def describe_audit(
        self,
        *,
        since_ms: int | None = None,
        until_ms: int | None = None,
        principal: str | None = None,
        action: str | None = None,
        outcome: str | None = None,
        limit: int = 1000,
    ) -> AuditEvents:
        """The newest ``limit`` (1..10,000) audit events that match every filter given,
        oldest first: at or after ``since_ms`` and before ``until_ms`` (ms since the epoch),
        of ``principal`` (``""``: anonymous), with ``action`` and ``outcome``. In a cluster,
        the nodes whose audit logs no node answered for in time are named in the answer's
        ``missing_nodes`` (a partial answer).

        Raises:
            InvalidRequestError: ``limit`` out of range, ``until_ms`` before ``since_ms``.
        """
        req = DescribeAuditRequest(
            since_ms=since_ms,
            until_ms=until_ms,
            principal=principal,
            action=action,
            outcome=outcome,
            limit=limit,
        )
        body = (await self._call(req)).body
        _raise(body.error_code, body.error_message)
        return AuditEvents(body.events, body.missing_nodes)


class Client(BlockingTwin[AsyncClient], SecurityAdmin, QueueAdmin):
    """The blocking twin of :class:`AsyncClient`: the same methods, called without await.

    It runs an event loop in a thread of its own; use as ``with Client(addr) as client``.
    """

    def __init__(
        self,
        addr: Addresses = "127.0.0.1:7400",
        *,
        request_timeout_s: float = 30.0,
        connect_timeout_s: float = 10.0,
        max_in_flight: int = 64,
        credentials: Credentials | None = None,
        tls: TlsOptions | bool | None = None,
    ) -> None:
        parse_addrs(addr)  # a bad address fails here, before a thread is started
        TlsOptions.of(tls)  # and a wrong tls type
        self._start_loop("tidewire-client")
        try:
            self._async = self._run(
                self._make(
                    addr,
                    request_timeout_s=request_timeout_s,
                    connect_timeout_s=connect_timeout_s,
                    max_in_flight=max_in_flight,
                    credentials=credentials,
                    tls=tls,
                )
            )
        except BaseException:
            self._stop_loop()
            raise
        #: Lightweight streams, blocking (:class:`Streams`).
        self.streams = Streams(self._async.streams, self._run)

    @staticmethod
    async def _make(
        addr: Addresses,
        *,
        request_timeout_s: float,
        connect_timeout_s: float,
        max_in_flight: int,
        credentials: Credentials | None,
        tls: TlsOptions | bool | None,
    ) -> AsyncClient:
        return AsyncClient(
            addr,
            request_timeout_s=request_timeout_s,
            connect_timeout_s=connect_timeout_s,
            max_in_flight=max_in_flight,
            credentials=credentials,
            tls=tls,
        )

    @property
    def throttle_time_ms_total(self) -> int:
        """See :attr:`AsyncClient.throttle_time_ms_total`."""
        return self._async.throttle_time_ms_total

    @property
    def routing_stats(self) -> RoutingStats:
        """See :attr:`AsyncClient.routing_stats`."""
        return self._async.routing_stats

    def whoami(self) -> WhoAmIResponse:
        return self._run(self._async.whoami())

    def ping(self) -> None:
        self._run(self._async.ping())

    def storage_problems(self) -> tuple[list[StorageProblem], int]:
        return self._run(self._async.storage_problems())

    def repair_topic(
        self, name: str, partition: int | None = None, action: str = "report"
    ) -> list[RepairResult]:
        return self._run(self._async.repair_topic(name, partition, action))

    def server_version(self) -> str:
        return self._run(self._async.server_version())

    def create_topic(
        self,
        name: str,
        partitions: int | None = None,
        config: TopicConfig | None = None,
        *,
        replication_factor: int | None = None,
        min_insync_replicas: int | None = None,
        unclean_leader_election: bool | None = None,
    ) -> None:
        self._run(
            self._async.create_topic(
                name,
                partitions,
                config,
                replication_factor=replication_factor,
                min_insync_replicas=min_insync_replicas,
                unclean_leader_election=unclean_leader_election,
            )
        )

    def delete_topic(self, name: str) -> None:
        self._run(self._async.delete_topic(name))

    def list_topics(self) -> list[str]:
        return self._run(self._async.list_topics())

    def describe_topic(self, name: str, *, auto_create: bool = False) -> TopicDescription:
        return self._run(self._async.describe_topic(name, auto_create=auto_create))

    def alter_topic(
        self, name: str, *, partitions: int | None = None, config: TopicConfig | None = None
    ) -> None:
        self._run(self._async.alter_topic(name, partitions=partitions, config=config))

    def alter_replication(
        self,
        topic: str,
        *,
        replicas: Mapping[int, Sequence[int]] | None = None,
        replication_factor: int | None = None,
        min_insync_replicas: int | None = None,
        unclean_leader_election: bool | None = None,
        cancel: bool = False,
        partitions: Sequence[int] = (),
    ) -> list[PartitionReplication]:
        return self._run(
            self._async.alter_replication(
                topic,
                replicas=replicas,
                replication_factor=replication_factor,
                min_insync_replicas=min_insync_replicas,
                unclean_leader_election=unclean_leader_election,
                cancel=cancel,
                partitions=partitions,
            )
        )

    def produce(
        self,
        topic: str,
        partition: int,
        messages: Iterable[Message],
        *,
        acks: int = ACKS_DURABLE,
        codec: Codec = Codec.NONE,
    ) -> int:
        return self._run(
            self._async.produce(topic, partition, list(messages), acks=acks, codec=codec)
        )

    def produce_batch(
        self, topic: str, partition: int, batch: bytes, *, acks: int = ACKS_DURABLE
    ) -> int:
        return self._run(self._async.produce_batch(topic, partition, batch, acks=acks))

    def fetch(
        self,
        topic: str,
        partition: int,
        offset: int,
        *,
        max_bytes: int = 1024 * 1024,
        max_wait_ms: int = 0,
    ) -> FetchedRecords:
        return self._run(
            self._async.fetch(
                topic, partition, offset, max_bytes=max_bytes, max_wait_ms=max_wait_ms
            )
        )

    def fetch_batches(
        self,
        topic: str,
        partition: int,
        offset: int,
        *,
        max_bytes: int = 1024 * 1024,
        max_wait_ms: int = 0,
    ) -> FetchedBatches:
        return self._run(
            self._async.fetch_batches(
                topic, partition, offset, max_bytes=max_bytes, max_wait_ms=max_wait_ms
            )
        )

    def list_offset(self, topic: str, partition: int, timestamp: int) -> int:
        return self._run(self._async.list_offset(topic, partition, timestamp))

    def producer_state(
        self, producer_id: int, partitions: Sequence[tuple[str, int]], *, producer_epoch: int = -1
    ) -> dict[tuple[str, int], tuple[int, int]]:
        return self._run(
            self._async.producer_state(producer_id, partitions, producer_epoch=producer_epoch)
        )

    def release_writers(self, writer_ids: Sequence[str]) -> int:
        return self._run(self._async.release_writers(writer_ids))

    def list_groups(self) -> list[GroupSummary]:
        return self._run(self._async.list_groups())

    def describe_group(self, group_id: str) -> DescribeGroupResponse:
        return self._run(self._async.describe_group(group_id))

    def group_lag(self, group_id: str) -> list[GroupPartitionLag]:
        return self._run(self._async.group_lag(group_id))

    def committed_offsets(
        self, group_id: str, partitions: Sequence[tuple[str, int]] | None = None
    ) -> dict[tuple[str, int], int]:
        return self._run(self._async.committed_offsets(group_id, partitions))

    def commit_offsets(self, group_id: str, offsets: Mapping[tuple[str, int], int]) -> None:
        self._run(self._async.commit_offsets(group_id, offsets))

    def delete_group(self, group_id: str) -> None:
        self._run(self._async.delete_group(group_id))

    def reset_group_offsets(
        self,
        group_id: str,
        topic: str,
        to: str,
        *,
        value: int = 0,
        partitions: Sequence[int] | None = None,
        dry_run: bool = False,
    ) -> list[ResetOffsetResult]:
        return self._run(
            self._async.reset_group_offsets(
                group_id, topic, to, value=value, partitions=partitions, dry_run=dry_run
            )
        )

    def describe_audit(
        self,
        *,
        since_ms: int | None = None,
        until_ms: int | None = None,
        principal: str | None = None,
        action: str | None = None,
        outcome: str | None = None,
        limit: int = 1000,
    ) -> AuditEvents:
        return self._run(
            self._async.describe_audit(
                since_ms=since_ms,
                until_ms=until_ms,
                principal=principal,
                action=action,
                outcome=outcome,
                limit=limit,
            )
        )
