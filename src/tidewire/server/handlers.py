"""Request handlers: one coroutine per API, from a decoded request to a response body and the
raw data that follows it. They call the broker and nothing else; the TCP server (and later the
HTTP gateway) frames what they return.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

import msgspec

from tidewire import __version__
from tidewire.broker import Broker, FetchResult, ProduceResult
from tidewire.broker.consumer_groups import GroupDescription, ResetTo
from tidewire.cluster import cluster_node
from tidewire.errors import (
    BackpressureError,
    InvalidRequestError,
    PartitionCorruptError,
    TidewireError,
)
from tidewire.protocol.messages import (
    ACKS_DURABLE,
    ACKS_LEADER,
    ACKS_NONE,
    AlterTopicRequest,
    AlterTopicResponse,
    ApiKey,
    ApiVersionsRequest,
    ApiVersionsResponse,
    AuditEventBody,
    Body,
    CommittedOffset,
    CreateTopicRequest,
    CreateTopicResponse,
    DamageInfo,
    DeleteGroupRequest,
    DeleteGroupResponse,
    DeleteTopicRequest,
    DeleteTopicResponse,
    DescribeAuditRequest,
    DescribeAuditResponse,
    DescribeGroupRequest,
    DescribeGroupResponse,
    DescribeTopicRequest,
    DescribeTopicResponse,
    FetchPartitionResult,
    FetchRequest,
    FetchResponse,
    GroupMember,
    GroupPartition,
    GroupPartitionLag,
    GroupSummary,
    HeartbeatRequest,
    HeartbeatResponse,
    HttpPublishRequest,
    InitProducerIdRequest,
    InitProducerIdResponse,
    JoinGroupRequest,
    JoinGroupResponse,
    LeaveGroupRequest,
    LeaveGroupResponse,
    ListGroupsRequest,
    ListGroupsResponse,
    ListOffsetsRequest,
    ListOffsetsResponse,
    ListOffsetsResult,
    ListTopicsRequest,
    ListTopicsResponse,
    MetadataRequest,
    MetadataResponse,
    OffsetCommitRequest,
    OffsetCommitResponse,
    OffsetFetchRequest,
    OffsetFetchResponse,
    PartitionInfo,
    PartitionResult,
    PingRequest,
    PingResponse,
    ProducePartition,
    ProducePartitionResult,
    ProduceRequest,
    ProduceResponse,
    ProducerPartitionState,
    ProducerStateRequest,
    ProducerStateResponse,
    ReleaseWritersRequest,
    ReleaseWritersResponse,
    RepairResult,
    RepairTopicRequest,
    RepairTopicResponse,
    ResetOffsetResult,
    ResetOffsetsRequest,
    ResetOffsetsResponse,
    StorageProblem,
    TakeRequest,
    TopicConfig,
    TopicDescription,
    supported_versions,
)
from tidewire.security.audit import AuditQuery
from tidewire.security.model import ResourceType
from tidewire.server.cluster_admin import CLUSTER_ADMIN_HANDLERS, cluster_alter_topic
from tidewire.server.cluster_admin import create_topic as create_topic_where_it_belongs
from tidewire.server.cluster_metrics import CLUSTER_METRICS_HANDLERS
from tidewire.server.gate import SESSION_APIS, gate_for, names_allowed
from tidewire.server.push import PUSH_APIS
from tidewire.server.queue_handlers import QUEUE_APIS
from tidewire.server.replica_handlers import REPLICA_HANDLERS
from tidewire.server.security_admin import SECURITY_HANDLERS
from tidewire.server.stream_handlers import STREAM_HANDLERS
from tidewire.storage import LogConfig

__all__ = ["HANDLERS", "Handler", "Reply", "ServerInfo"]

log = logging.getLogger("tidewire.server")

#: A handler's answer: the response body (``None``: no response, as for acks=none) and the
#: data section's buffers.
Reply = tuple[Body | None, list[bytes]]


class ServerInfo:
    """What handlers need to know about the server that runs them."""

    def __init__(self, host: str, port: int, broker_id: int = 0) -> None:
        self.host = host
        self.port = port
        self.broker_id = broker_id


Handler = Callable[[Broker, ServerInfo, Any, memoryview], Awaitable[Reply]]


def _visible(b: Broker, resource: ResourceType, names: list[str]) -> list[str]:
    """The ``names`` the request's principal may describe (every one, authentication off;
    never the broker's private topics)."""
    return names_allowed(gate_for(b), resource, names)


def _err(exc: TidewireError) -> dict[str, Any]:
    return {"error_code": exc.code, "error_message": exc.message}


def _audit(
    b: Broker,
    action: str,
    resource: str,
    error: TidewireError | None = None,
    detail: dict[str, str] | None = None,
) -> None:
    """Audit an administrative operation: ``ok``, or ``failed`` with ``error``'s message;
    who and from where are the request's (``current_actor``, set by the gate)."""
    if b.audit is not None:
        outcome, reason = ("failed", error.message) if error is not None else ("ok", "")
        b.audit.event(action, outcome, resource=resource, reason=reason, detail=detail)


def _fetch_err(exc: TidewireError) -> dict[str, Any]:
    out = _err(exc)
    if isinstance(exc, PartitionCorruptError):
        out.update(damage_start=exc.damage_start, damage_end=exc.damage_end)
    return out


#: Storage problems a ping answer lists (the total is given too): a bound on its size.
MAX_PROBLEMS = 100


def _to_log_config(base: LogConfig, cfg: TopicConfig) -> LogConfig:
    """``base`` with the settings ``cfg`` gives (None: keep). Raises InvalidConfigError."""
    values = base.to_dict()
    for name, key in (
        ("retention_ms", "retention_ms"),
        ("retention_bytes", "retention_bytes"),
        ("segment_bytes", "segment_bytes"),
        ("segment_ms", "segment_ms"),
        ("fsync", "fsync"),
        ("flush_interval_ms", "flush_interval_ms"),
        ("max_message_bytes", "max_batch_bytes"),
    ):
        value = getattr(cfg, name)
        if value is not None:
            values[key] = value
    return LogConfig.from_dict(values)


def _topic_config(cfg: LogConfig) -> TopicConfig:
    return TopicConfig(
        retention_ms=cfg.retention_ms,
        retention_bytes=cfg.retention_bytes,
        segment_bytes=cfg.segment_bytes,
        segment_ms=cfg.segment_ms,
        fsync=str(cfg.fsync),
        flush_interval_ms=cfg.flush_interval_ms,
        max_message_bytes=cfg.max_batch_bytes,
    )


def _describe(broker: Broker, name: str) -> TopicDescription:
    parts = [
        PartitionInfo(
            partition=s.partition,
            log_start_offset=s.log_start_offset,
            log_end_offset=s.log_end_offset,
            high_watermark=s.high_watermark,
            size_bytes=s.size_bytes,
            damage=[DamageInfo.of(d) for d in s.damage],
            offline=s.offline or "",
        )
        for s in broker.describe(name)
    ]
    return TopicDescription(
        name=name, partitions=parts, config=_topic_config(broker.topic_config(name))
    )


async def api_versions(b: Broker, s: ServerInfo, req: ApiVersionsRequest, _: memoryview) -> Reply:
    # Only what this server answers: an API the protocol defines but no handler serves yet
    # is left out, so a client can tell before it asks.
    # The push APIs are served by the connection itself (server/push.py); ENVELOPE by the
    # listener (server/envelope.py).
    served = (
        HANDLERS.keys()
        | PUSH_APIS
        | SESSION_APIS
        | QUEUE_APIS
        | {ApiKey.QUEUE_DELIVER, ApiKey.ENVELOPE}
    )
    apis = [a for a in supported_versions() if a.api_key in served]
    return ApiVersionsResponse(server_version=__version__, apis=apis), []


async def ping(b: Broker, s: ServerInfo, req: PingRequest, _: memoryview) -> Reply:
    if not req.storage:
        return PingResponse(), []
    problems = b.storage_problems()
    return PingResponse(
        problems=[
            StorageProblem(
                topic=x.topic,
                partition=x.partition,
                kind=x.kind,
                start=x.start,
                end=x.end,
                size_bytes=x.size_bytes,
                file=x.file,
                reason=x.reason,
            )
            for x in problems[:MAX_PROBLEMS]
        ],
        problems_total=len(problems),
    ), []


async def repair_topic(b: Broker, s: ServerInfo, req: RepairTopicRequest, _: memoryview) -> Reply:
    where = {"action": req.action} | (
        {} if req.partition is None else {"partition": str(req.partition)}
    )
    try:
        outcomes = b.repair(req.name, req.partition, req.action)
    except TidewireError as exc:
        _audit(b, "REPAIR_TOPIC", f"topic:{req.name}", exc, where)
        return RepairTopicResponse(**_err(exc)), []
    _audit(b, "REPAIR_TOPIC", f"topic:{req.name}", None, where)
    return RepairTopicResponse(
        results=[
            RepairResult(
                partition=o.partition,
                start=o.damage.start,
                end=o.damage.end,
                size_bytes=o.damage.size,
                action=o.action,
                file=o.damage.quarantined or o.damage.path,
                reason=o.damage.reason,
                removed_offsets=o.removed_offsets,
                removed_bytes=o.removed_bytes,
                log_end_offset=o.log_end_offset,
            )
            for o in outcomes
        ]
    ), []


async def metadata(b: Broker, s: ServerInfo, req: MetadataRequest, _: memoryview) -> Reply:
    node = cluster_node(b)
    if node is not None:  # a cluster: from the node's copy of the metadata
        meta = node.metadata(
            req.topics,
            lambda names: _visible(b, ResourceType.TOPIC, names),
            auto_create=req.auto_create,
        )
        return meta, []
    names = (
        _visible(b, ResourceType.TOPIC, sorted(b.topics())) if req.topics is None else req.topics
    )
    topics: list[TopicDescription] = []
    for name in names:
        try:
            if req.auto_create and req.topics is not None:
                b.ensure_topic(name)
            topics.append(_describe(b, name))
        except TidewireError as exc:
            topics.append(
                TopicDescription(name=name, partitions=[], config=TopicConfig(), **_err(exc))
            )
    return MetadataResponse(broker_id=s.broker_id, host=s.host, port=s.port, topics=topics), []


async def create_topic(b: Broker, s: ServerInfo, req: CreateTopicRequest, _: memoryview) -> Reply:
    try:
        await create_topic_where_it_belongs(
            b,
            req.name,
            req.partitions,
            _to_log_config(b.config.log, req.config),
            req.replication_factor,
            min_insync_replicas=req.min_insync_replicas,
            unclean_leader_election=req.unclean_leader_election,
        )
    except TidewireError as exc:
        _audit(b, "CREATE_TOPIC", f"topic:{req.name}", exc)
        return CreateTopicResponse(**_err(exc)), []
    _audit(b, "CREATE_TOPIC", f"topic:{req.name}")
    return CreateTopicResponse(), []


async def delete_topic(b: Broker, s: ServerInfo, req: DeleteTopicRequest, _: memoryview) -> Reply:
    node = cluster_node(b)
    try:
        if node is not None:  # a cluster: through etcd
            await node.delete_topic(req.name)
        else:
            await b.delete_topic_async(req.name)
    except TidewireError as exc:
        _audit(b, "DELETE_TOPIC", f"topic:{req.name}", exc)
        return DeleteTopicResponse(**_err(exc)), []
    _audit(b, "DELETE_TOPIC", f"topic:{req.name}")
    return DeleteTopicResponse(), []


async def list_topics(b: Broker, s: ServerInfo, req: ListTopicsRequest, _: memoryview) -> Reply:
    node = cluster_node(b)
    if node is not None:  # a cluster: every topic, not only those replicated here
        return ListTopicsResponse(
            topics=_visible(b, ResourceType.TOPIC, sorted(node.cache.topics))
        ), []
    return ListTopicsResponse(topics=_visible(b, ResourceType.TOPIC, sorted(b.topics()))), []


async def describe_topic(
    b: Broker, s: ServerInfo, req: DescribeTopicRequest, _: memoryview
) -> Reply:
    node = cluster_node(b)
    if node is not None:  # a cluster: from the node's copy of the metadata
        (topic,) = node.metadata([req.name], lambda names: names).topics
        if topic.error_code:
            return DescribeTopicResponse(
                error_code=topic.error_code, error_message=topic.error_message
            ), []
        return DescribeTopicResponse(topic=topic), []
    try:
        return DescribeTopicResponse(topic=_describe(b, req.name)), []
    except TidewireError as exc:
        return DescribeTopicResponse(**_err(exc)), []


async def alter_topic(b: Broker, s: ServerInfo, req: AlterTopicRequest, _: memoryview) -> Reply:
    try:
        node = cluster_node(b)
        if node is not None:  # through etcd: every replica follows
            await cluster_alter_topic(node, req.name, req.partitions, req.config, _to_log_config)
            _audit(b, "ALTER_TOPIC", f"topic:{req.name}")
            return AlterTopicResponse(), []
        current = b.topic_config(req.name)
        changed = req.config != TopicConfig()
        await b.alter_topic_async(
            req.name,
            partitions=req.partitions,
            config=_to_log_config(current, req.config) if changed else None,
        )
    except TidewireError as exc:
        _audit(b, "ALTER_TOPIC", f"topic:{req.name}", exc)
        return AlterTopicResponse(**_err(exc)), []
    _audit(b, "ALTER_TOPIC", f"topic:{req.name}")
    return AlterTopicResponse(), []


async def _produce_entry(
    b: Broker, part: ProducePartition, chunk: memoryview, durable: bool | None
) -> ProducePartitionResult:
    """One entry of a produce request: its result, or the error that refused it."""
    try:
        r = await b.produce(part.topic, part.partition, chunk, durable=durable)
    except TidewireError as exc:
        return ProducePartitionResult(topic=part.topic, partition=part.partition, **_err(exc))
    return ProducePartitionResult(
        topic=part.topic,
        partition=part.partition,
        base_offset=r.base_offset,
        log_start_offset=r.log_start_offset,
    )


async def produce(b: Broker, s: ServerInfo, req: ProduceRequest, data: memoryview) -> Reply:
    if req.acks not in (ACKS_NONE, ACKS_LEADER, ACKS_DURABLE):
        raise InvalidRequestError(f"acks={req.acks} must be 0 (none), 1 (leader) or -1 (durable)")
    total = sum(p.size for p in req.partitions)
    if total != len(data) or any(p.size <= 0 for p in req.partitions):
        if req.acks == ACKS_NONE:
            # acks=0 promises no response, not even this one (as in Kafka): it is logged.
            log.warning("dropped an acks=0 produce whose sizes do not match its data")
            return None, []
        raise InvalidRequestError(
            f"the partitions' sizes add up to {total:,} bytes but the data section has "
            f"{len(data):,}; each size must be > 0"
        )
    # acks=durable: as durable as the topic's fsync policy promises; leader (and none): once
    # written to the log, without waiting for an fsync.
    durable = None if req.acks == ACKS_DURABLE else False
    entries: list[tuple[ProducePartition, memoryview]] = []
    pos = 0
    for part in req.partitions:
        entries.append((part, data[pos : pos + part.size]))
        pos += part.size
    results: list[ProducePartitionResult] = []
    if len(entries) == 1:
        results.append(await _produce_entry(b, *entries[0], durable))
    elif entries:
        # The first entry is appended now, in the order the requests arrived (a client that
        # pipelines one partition's batches sends each as the first entry of its request);
        # the others start as soon as the loop turns, without waiting for the first one's
        # fsync: under fsync=always a request for N partitions waits for about one group
        # commit instead of N in a row.
        async with asyncio.TaskGroup() as tg:
            rest = [tg.create_task(_produce_entry(b, p, c, durable)) for p, c in entries[1:]]
            results.append(await _produce_entry(b, *entries[0], durable))
        results += [t.result() for t in rest]
    if req.acks == ACKS_NONE:
        return None, []
    return ProduceResponse(results=results), []


#: What :func:`produce_soon` answers through: the response (None: acks=0, no answer), or the
#: error of a bug (not a ``TidewireError``: those are answered in the response).
ProduceAnswer = Callable[[ProduceResponse | None, BaseException | None], None]


def produce_soon(b: Broker, req: ProduceRequest, data: memoryview, answer: ProduceAnswer) -> bool:
    """:func:`produce` without awaiting, for the common request (one partition that exists
    here, a single node, a batch not sent before): the batch is checked and queued now, and
    ``answer`` is called with the same response :func:`produce` gives, in the step that
    settles the append (``Broker.produce_soon``), maybe before this returns.

    Returns:
        False, having done nothing, for any other request: :func:`produce` answers it.
    """
    if len(req.partitions) != 1 or req.acks not in (ACKS_NONE, ACKS_LEADER, ACKS_DURABLE):
        return False
    part = req.partitions[0]
    if part.size != len(data) or part.size <= 0:
        return False  # produce says what is wrong
    durable = None if req.acks == ACKS_DURABLE else False
    respond = req.acks != ACKS_NONE

    def settled(r: ProduceResult | None, exc: BaseException | None) -> None:
        if r is not None:
            result = ProducePartitionResult(
                topic=part.topic,
                partition=part.partition,
                base_offset=r.base_offset,
                log_start_offset=r.log_start_offset,
            )
        elif isinstance(exc, TidewireError):
            result = ProducePartitionResult(topic=part.topic, partition=part.partition, **_err(exc))
        else:
            answer(None, exc)
            return
        answer(ProduceResponse(results=[result]) if respond else None, None)

    try:
        return b.produce_soon(part.topic, part.partition, data, durable=durable, callback=settled)
    except TidewireError as exc:
        settled(None, exc)
        return True


async def fetch(b: Broker, s: ServerInfo, req: FetchRequest, _: memoryview) -> Reply:
    wants = [(p.topic, p.partition, p.offset, p.max_bytes) for p in req.partitions]
    outcome: list[FetchResult | TidewireError] = []
    try:
        outcome.extend(
            await b.fetch(
                wants,
                max_wait_ms=req.max_wait_ms,
                min_bytes=req.min_bytes,
                max_bytes=req.max_bytes,
            )
        )
    except BackpressureError:
        raise  # the whole request is refused: too many fetches are waiting
    except TidewireError:
        # One partition failed: read them one by one so the others still get their data.
        for want in wants:
            try:
                outcome.extend(await b.fetch([want], max_bytes=req.max_bytes))
            except TidewireError as exc:
                outcome.append(exc)
    return _fetch_reply(wants, outcome)


def fetch_now(b: Broker, req: FetchRequest) -> Reply | None:
    """:func:`fetch` without awaiting, when the broker answers it at once
    (:meth:`Broker.fetch_now`); None, having delivered nothing, when it would wait or a
    partition failed: :func:`fetch` answers it then (each partition's error on its own)."""
    wants = [(p.topic, p.partition, p.offset, p.max_bytes) for p in req.partitions]
    try:
        results = b.fetch_now(
            wants, max_wait_ms=req.max_wait_ms, min_bytes=req.min_bytes, max_bytes=req.max_bytes
        )
    except TidewireError:
        return None
    if results is None:
        return None
    return fetch_answer(wants, results)


def fetch_answer(wants: list[tuple[str, int, int, int]], results: list[FetchResult]) -> Reply:
    """The answer of a fetch of ``wants`` that read ``results`` (one per partition)."""
    return _fetch_reply(wants, list(results))


def _fetch_reply(
    wants: list[tuple[str, int, int, int]], outcome: list[FetchResult | TidewireError]
) -> Reply:
    results: list[FetchPartitionResult] = []
    buffers: list[bytes] = []
    for want, r in zip(wants, outcome, strict=True):
        if isinstance(r, TidewireError):
            results.append(FetchPartitionResult(topic=want[0], partition=want[1], **_fetch_err(r)))
            continue
        results.append(
            FetchPartitionResult(
                topic=r.topic,
                partition=r.partition,
                size=len(r.data),
                high_watermark=r.high_watermark,
                log_start_offset=r.log_start_offset,
            )
        )
        buffers.append(r.data)
    return FetchResponse(partitions=results), buffers


async def list_offsets(b: Broker, s: ServerInfo, req: ListOffsetsRequest, _: memoryview) -> Reply:
    results: list[ListOffsetsResult] = []
    for p in req.partitions:
        try:
            off = b.list_offset(p.topic, p.partition, p.timestamp)
        except TidewireError as exc:
            results.append(ListOffsetsResult(topic=p.topic, partition=p.partition, **_err(exc)))
            continue
        results.append(ListOffsetsResult(topic=p.topic, partition=p.partition, offset=off))
    return ListOffsetsResponse(results=results), []


async def init_producer_id(
    b: Broker, s: ServerInfo, req: InitProducerIdRequest, _: memoryview
) -> Reply:
    try:
        pid, epoch = await b.init_producer_id(
            req.producer_id, req.producer_epoch, writer_id=req.writer_id
        )
    except TidewireError as exc:
        return InitProducerIdResponse(**_err(exc)), []
    return InitProducerIdResponse(producer_id=pid, producer_epoch=epoch), []


async def producer_state(
    b: Broker, s: ServerInfo, req: ProducerStateRequest, _: memoryview
) -> Reply:
    try:
        got = await b.producer_state(
            req.producer_id, req.producer_epoch, [(p.topic, p.partition) for p in req.partitions]
        )
    except TidewireError as exc:
        return ProducerStateResponse(**_err(exc)), []
    results: list[ProducerPartitionState] = []
    for p, r in zip(req.partitions, got, strict=True):
        if isinstance(r, TidewireError):
            results.append(ProducerPartitionState(topic=p.topic, partition=p.partition, **_err(r)))
        else:
            results.append(
                ProducerPartitionState(
                    topic=p.topic, partition=p.partition, producer_epoch=r[0], last_sequence=r[1]
                )
            )
    return ProducerStateResponse(results=results), []


async def release_writers(
    b: Broker, s: ServerInfo, req: ReleaseWritersRequest, _: memoryview
) -> Reply:
    try:
        released = await b.release_writers(req.writer_ids)
    except TidewireError as exc:
        return ReleaseWritersResponse(**_err(exc)), []
    return ReleaseWritersResponse(released=released), []


# --- consumer groups (handlers in this section only call ``b.groups``) ----------------------
# In a cluster only a group's coordinator answers for it: elsewhere the request is refused as
# a whole with NotCoordinatorError (``b.groups.check_coordinator``, nothing to do on a single
# node), and the client asks the metadata where the coordinator is.


async def join_group(b: Broker, s: ServerInfo, req: JoinGroupRequest, _: memoryview) -> Reply:
    b.groups.check_coordinator(req.group_id)
    try:
        r = await b.groups.coordinator.join(
            req.group_id,
            member_id=req.member_id,
            instance_id=req.group_instance_id,
            client_id=req.client_id,
            topics=req.topics,
            pattern=req.pattern,
            strategy=req.strategy,
            session_timeout_ms=req.session_timeout_ms,
            rebalance_timeout_ms=req.rebalance_timeout_ms,
        )
    except TidewireError as exc:
        return JoinGroupResponse(**_err(exc)), []
    return JoinGroupResponse(
        member_id=r.member_id,
        generation=r.generation,
        strategy=str(r.strategy),
        members=r.members,
        assignment=[GroupPartition(t, p) for t, p in r.assignment],
    ), []


async def heartbeat(b: Broker, s: ServerInfo, req: HeartbeatRequest, _: memoryview) -> Reply:
    b.groups.check_coordinator(req.group_id)
    try:
        b.groups.coordinator.heartbeat(req.group_id, req.member_id, req.generation)
    except TidewireError as exc:
        return HeartbeatResponse(**_err(exc)), []
    return HeartbeatResponse(), []


async def leave_group(b: Broker, s: ServerInfo, req: LeaveGroupRequest, _: memoryview) -> Reply:
    b.groups.check_coordinator(req.group_id)
    try:
        b.groups.coordinator.leave(req.group_id, req.member_id)
    except TidewireError as exc:
        return LeaveGroupResponse(**_err(exc)), []
    return LeaveGroupResponse(), []


async def offset_commit(b: Broker, s: ServerInfo, req: OffsetCommitRequest, _: memoryview) -> Reply:
    b.groups.check_coordinator(req.group_id)
    offsets: dict[tuple[str, int], tuple[int, str]] = {}
    for p in req.partitions:
        if (p.topic, p.partition) in offsets:
            raise InvalidRequestError(f"{p.topic!r} partition {p.partition} is named twice")
        offsets[(p.topic, p.partition)] = (p.offset, p.metadata)
    error: dict[str, Any] = {}
    try:
        await b.groups.commit(
            req.group_id, offsets, member_id=req.member_id, generation=req.generation
        )
    except TidewireError as exc:
        error = _err(exc)
    results = [PartitionResult(topic=t, partition=p, **error) for t, p in offsets]
    return OffsetCommitResponse(results=results), []


async def offset_fetch(b: Broker, s: ServerInfo, req: OffsetFetchRequest, _: memoryview) -> Reply:
    b.groups.check_coordinator(req.group_id)
    wanted = None if req.partitions is None else [(p.topic, p.partition) for p in req.partitions]
    got = b.groups.committed(req.group_id, wanted)
    out: list[CommittedOffset] = []
    for t, p in sorted(got) if wanted is None else wanted:
        c = got.get((t, p))
        if c is None:
            out.append(CommittedOffset(topic=t, partition=p))
        else:
            out.append(CommittedOffset(topic=t, partition=p, offset=c.offset, metadata=c.metadata))
    return OffsetFetchResponse(offsets=out), []


async def list_groups(b: Broker, s: ServerInfo, req: ListGroupsRequest, _: memoryview) -> Reply:
    listed = b.groups.list_groups()
    visible = set(_visible(b, ResourceType.GROUP, [g.group_id for g in listed]))
    groups = [
        GroupSummary(group_id=g.group_id, state=str(g.state), members=g.members)
        for g in listed
        if g.group_id in visible
    ]
    return ListGroupsResponse(groups=groups), []


def describe_response(d: GroupDescription) -> DescribeGroupResponse:
    """The DESCRIBE_GROUP answer of a group this node coordinates (the HTTP API's group
    description is made from it too)."""
    members = [
        GroupMember(
            member_id=m.member_id,
            group_instance_id=m.instance_id,
            client_id=m.client_id,
            topics=list(m.topics),
            pattern=m.pattern,
            assignment=[GroupPartition(t, p) for t, p in m.assignment],
        )
        for m in d.members
    ]
    offsets = [
        GroupPartitionLag(
            topic=x.topic,
            partition=x.partition,
            committed=x.committed,
            end_offset=x.end_offset,
            lag=x.lag,
            metadata=x.metadata,
        )
        for x in d.offsets
    ]
    return DescribeGroupResponse(
        group_id=d.group_id,
        state=str(d.state),
        generation=d.generation,
        strategy=d.strategy,
        members=members,
        offsets=offsets,
    )


async def describe_group(
    b: Broker, s: ServerInfo, req: DescribeGroupRequest, _: memoryview
) -> Reply:
    b.groups.check_coordinator(req.group_id)
    try:
        d = b.groups.describe(req.group_id)
    except TidewireError as exc:
        return DescribeGroupResponse(group_id=req.group_id, **_err(exc)), []
    return describe_response(d), []


async def delete_group(b: Broker, s: ServerInfo, req: DeleteGroupRequest, _: memoryview) -> Reply:
    b.groups.check_coordinator(req.group_id)
    try:
        await b.groups.delete(req.group_id)
    except TidewireError as exc:
        _audit(b, "DELETE_GROUP", f"group:{req.group_id}", exc)
        return DeleteGroupResponse(**_err(exc)), []
    _audit(b, "DELETE_GROUP", f"group:{req.group_id}")
    return DeleteGroupResponse(), []


async def reset_offsets(b: Broker, s: ServerInfo, req: ResetOffsetsRequest, _: memoryview) -> Reply:
    b.groups.check_coordinator(req.group_id)
    what = {"topic": req.topic, "to": req.to, "dry_run": str(req.dry_run).lower()}
    try:
        to = ResetTo(req.to)
    except ValueError:
        choices = ", ".join(t.value for t in ResetTo)
        bad = InvalidRequestError(f"reset to {req.to!r}: must be one of {choices}")
        _audit(b, "RESET_OFFSETS", f"group:{req.group_id}", bad, what)
        raise bad from None
    try:
        got = await b.groups.reset(
            req.group_id,
            req.topic,
            to,
            partitions=req.partitions,
            value=req.value,
            dry_run=req.dry_run,
        )
    except TidewireError as exc:
        _audit(b, "RESET_OFFSETS", f"group:{req.group_id}", exc, what)
        return ResetOffsetsResponse(**_err(exc)), []
    _audit(b, "RESET_OFFSETS", f"group:{req.group_id}", None, what)
    results = [
        ResetOffsetResult(
            topic=r.topic, partition=r.partition, previous=r.previous, offset=r.offset
        )
        for r in got
    ]
    return ResetOffsetsResponse(results=results), []


async def describe_audit(
    b: Broker, s: ServerInfo, req: DescribeAuditRequest, _: memoryview
) -> Reply:
    try:
        if b.audit is None:
            raise InvalidRequestError("the broker is not running")
        missing: tuple[int, ...] = ()
        if req.nodes is not None:  # another node of the cluster, asking for our replicas
            events = await b.audit.query_nodes(
                AuditQuery(req.since_ms, req.until_ms, req.principal, req.action, req.outcome),
                req.limit,
                req.nodes,
            )
        else:
            events, missing = await b.audit.answer(
                since_ms=req.since_ms,
                until_ms=req.until_ms,
                principal=req.principal,
                action=req.action,
                outcome=req.outcome,
                limit=req.limit,
            )
    except TidewireError as exc:
        return DescribeAuditResponse(**_err(exc)), []
    return DescribeAuditResponse(
        events=[AuditEventBody(**msgspec.structs.asdict(e)) for e in events],
        missing_nodes=list(missing),
    ), []


async def take(b: Broker, s: ServerInfo, req: TakeRequest, _: memoryview) -> Reply:
    """The msgbus mode's pop, taken on the leader (server/http/compat/take.py)."""
    from tidewire.server.http.compat.take import take as take_once  # noqa: PLC0415 (msgbus's)

    return await take_once(b, req), []


async def http_publish(b: Broker, s: ServerInfo, req: HttpPublishRequest, _: memoryview) -> Reply:
    """An HTTP API publish forwarded by another node, stored as this node's HTTP API
    would (server/http/publisher.py)."""
    from tidewire.server.http.publisher import serve_forwarded  # noqa: PLC0415 (the HTTP API's)

    return await serve_forwarded(b, req), []


HANDLERS: dict[int, Handler] = {
    ApiKey.API_VERSIONS: api_versions,
    ApiKey.PING: ping,
    ApiKey.METADATA: metadata,
    ApiKey.CREATE_TOPIC: create_topic,
    ApiKey.DELETE_TOPIC: delete_topic,
    ApiKey.LIST_TOPICS: list_topics,
    ApiKey.DESCRIBE_TOPIC: describe_topic,
    ApiKey.ALTER_TOPIC: alter_topic,
    ApiKey.PRODUCE: produce,
    ApiKey.FETCH: fetch,
    ApiKey.LIST_OFFSETS: list_offsets,
    ApiKey.INIT_PRODUCER_ID: init_producer_id,
    ApiKey.PRODUCER_STATE: producer_state,
    ApiKey.RELEASE_WRITERS: release_writers,
    ApiKey.JOIN_GROUP: join_group,
    ApiKey.HEARTBEAT: heartbeat,
    ApiKey.LEAVE_GROUP: leave_group,
    ApiKey.OFFSET_COMMIT: offset_commit,
    ApiKey.OFFSET_FETCH: offset_fetch,
    ApiKey.LIST_GROUPS: list_groups,
    ApiKey.DESCRIBE_GROUP: describe_group,
    ApiKey.DELETE_GROUP: delete_group,
    ApiKey.RESET_OFFSETS: reset_offsets,
    ApiKey.REPAIR_TOPIC: repair_topic,
    **SECURITY_HANDLERS,
    ApiKey.DESCRIBE_AUDIT: describe_audit,
    **STREAM_HANDLERS,
    **REPLICA_HANDLERS,
    **CLUSTER_ADMIN_HANDLERS,
    **CLUSTER_METRICS_HANDLERS,
    ApiKey.TAKE: take,
    ApiKey.HTTP_PUBLISH: http_publish,
}
