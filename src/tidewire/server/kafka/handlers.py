"""The Kafka data APIs over the broker core: ApiVersions, Metadata, Produce, Fetch,
ListOffsets, InitProducerId and DescribeCluster; the admin APIs are in :mod:`.admin`, the SASL
exchange in :mod:`.sasl`. :data:`DATA_HANDLERS` maps each of them to its handler.

Each handler takes the decoded request body and returns the response body (dicts, see
:mod:`tidewire.protocol.kafka`); the codec drops the fields the request's version lacks, so
handlers fill the newest ones. Authorization was decided before (``ctx.denied``): a denied
topic is answered TOPIC_AUTHORIZATION_FAILED and the rest is served.

Differences from Kafka, by design (docs/kafka.md):

- one node: every partition's leader, replica and in-sync replica is this broker, whose id
  is also the controller's; leader epochs are unknown (-1), so clients skip the leader epoch
  validation they would do with OffsetForLeaderEpoch;
- no fetch sessions (KIP-227): a Fetch is answered with session id 0, which tells a client
  that no session was created, so it sends full fetches (librdkafka, kafka-python, aiokafka
  and the Java client all do);
- no transactions: ``read_committed`` reads what ``read_uncommitted`` reads (nothing is ever
  aborted), the last stable offset is the high watermark; an InitProducerId with a
  transactional id is answered UNSUPPORTED_VERSION, which every client reports as "the
  broker does not support transactions" and does not retry.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from typing import TYPE_CHECKING, Any

from tidewire.broker import ProduceResult
from tidewire.broker.offsets import is_internal_topic
from tidewire.cluster import cluster_node
from tidewire.errors import (
    BackpressureError,
    InvalidRequestError,
    OffsetOutOfRangeError,
    TidewireError,
    TopicExistsError,
    UnknownTopicError,
)
from tidewire.protocol.kafka import SUPPORTED, ApiKey, ErrorCode
from tidewire.records import iter_batches, iter_records
from tidewire.security.model import Operation, ResourceType
from tidewire.server.kafka.admin import ADMIN_HANDLERS
from tidewire.server.kafka.context import KafkaContext, KafkaHandler
from tidewire.server.kafka.errors import error_code
from tidewire.server.kafka.sasl import sasl_authenticate, sasl_handshake
from tidewire.server.needs import Need

if TYPE_CHECKING:
    from tidewire.cluster.node import ClusterNode

#: Set on the session when an acks=0 Produce failed somewhere: the listener then closes the
#: connection, as Kafka does (the producer reads no answer that could tell it).
ACKS0_FAILED = "kafka_acks0_failed"

__all__ = ["DATA_HANDLERS", "topic_id"]

log = logging.getLogger("tidewire.kafka")

#: Kafka's "authorized operations not asked for" (INT32_MIN).
_NO_OPERATIONS = -(2**31)
#: Kafka's "no timestamp" and "no offset".
_NONE = -1
#: Kafka's fetch isolation levels; tidewire has no transactions, so both read the same.
_ISOLATION_LEVELS = (0, 1)
#: The acks a Produce may ask for: none, the leader, all in-sync replicas.
_ACKS = (0, 1, -1)
_TOPIC_NAMESPACE = uuid.UUID("5b1c8a3e-6d1f-4e0b-9a55-7469646577ff")


def topic_id(name: str) -> uuid.UUID:
    """The topic id Kafka clients are given for ``name``: tidewire keeps no topic ids, so a
    stable one is derived from the name (a topic deleted and made again gets the same)."""
    return uuid.uuid5(_TOPIC_NAMESPACE, name)


def _topic_allowed(ctx: KafkaContext, op: Operation, name: str) -> bool:
    return ctx.allowed(Need(ResourceType.TOPIC, op, name))


def _partition_error(index: int, code: ErrorCode, message: str = "") -> dict[str, Any]:
    # base_offset -1 (Kafka's INVALID_OFFSET), not the schema's 0: a client that completes a
    # failed batch with the answer's offset must not report offset 0.
    return {
        "index": index,
        "partition_index": index,
        "error_code": code,
        "error_message": message,
        "base_offset": -1,
    }


# --- ApiVersions, DescribeCluster ---------------------------------------------------------


def served_versions() -> list[dict[str, int]]:
    """The ranges ApiVersions advertises: the codec's, for the APIs a handler serves."""
    from tidewire.server.kafka.dispatch import registry  # noqa: PLC0415 (it imports this)

    handlers, _ = registry()
    return [
        {"api_key": key, "min_version": lo, "max_version": hi}
        for key, (lo, hi) in sorted(SUPPORTED.items())
        if key in handlers
    ]


async def api_versions(ctx: KafkaContext, version: int, body: dict[str, Any]) -> dict[str, Any]:
    return {"error_code": ErrorCode.NONE, "api_keys": served_versions(), "throttle_time_ms": 0}


def _brokers(ctx: KafkaContext) -> list[dict[str, Any]]:
    """This node, or in a cluster every live node with a Kafka listener (its advertised
    Kafka address, registered in the cluster metadata)."""
    node = cluster_node(ctx.broker)
    if node is None:
        return [
            {"node_id": ctx.node_id, "broker_id": ctx.node_id, "host": ctx.host, "port": ctx.port}
        ]
    out = []
    for n in node.live_nodes():
        if n.node_id == node.node_id:
            host, port = ctx.host, ctx.port
        elif n.kafka_port >= 0:
            host, port = n.kafka_host or n.host, n.kafka_port
        else:
            continue  # no Kafka listener there: clients cannot be sent to it
        out.append({"node_id": n.node_id, "broker_id": n.node_id, "host": host, "port": port})
    return out


def _controller_id(ctx: KafkaContext) -> int:
    node = cluster_node(ctx.broker)
    return ctx.node_id if node is None else node.cache.controller


def topic_exists(ctx: KafkaContext, name: str) -> bool:
    """Whether topic ``name`` exists (in a cluster: anywhere in the cluster)."""
    node = cluster_node(ctx.broker)
    if node is None:
        return name in ctx.broker.topics()
    return name in node.cache.topics and not is_internal_topic(name)


def topic_names(ctx: KafkaContext) -> set[str]:
    """The topics that exist: this broker's, or in a cluster every topic of the cluster (not
    only those with a replica on this node)."""
    node = cluster_node(ctx.broker)
    if node is None:
        return set(ctx.broker.topics())
    return {n for n in node.cache.topics if not is_internal_topic(n)}


async def describe_cluster(ctx: KafkaContext, version: int, body: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {
        "throttle_time_ms": 0,
        "error_code": ErrorCode.NONE,
        "error_message": None,
        "endpoint_type": body.get("endpoint_type", 1),
        "cluster_id": ctx.cluster_id,
        "controller_id": _controller_id(ctx),
        "brokers": _brokers(ctx),
        "cluster_authorized_operations": _NO_OPERATIONS,
    }
    if not ctx.allowed(Need(ResourceType.CLUSTER, Operation.DESCRIBE)):
        out.update(
            error_code=ErrorCode.CLUSTER_AUTHORIZATION_FAILED,
            error_message="describe on the cluster is not allowed",
            brokers=[],
        )
    return out


# --- Metadata -------------------------------------------------------------------------------


def _topic_metadata(ctx: KafkaContext, name: str) -> dict[str, Any]:
    node = cluster_node(ctx.broker)
    if node is not None:
        return _cluster_topic_metadata(ctx, node, name)
    partitions = []
    for s in ctx.broker.describe(name):
        offline = s.offline is not None
        partitions.append(
            {
                "error_code": ErrorCode.LEADER_NOT_AVAILABLE if offline else ErrorCode.NONE,
                "partition_index": s.partition,
                "leader_id": -1 if offline else ctx.node_id,
                "leader_epoch": -1,
                "replica_nodes": [ctx.node_id],
                "isr_nodes": [] if offline else [ctx.node_id],
                "offline_replicas": [ctx.node_id] if offline else [],
            }
        )
    return _topic_doc(name, partitions)


def _cluster_topic_metadata(ctx: KafkaContext, node: ClusterNode, name: str) -> dict[str, Any]:
    """A topic of a cluster as its metadata in etcd has it: each partition's leader, replicas
    and in-sync replicas. Leader epochs are not given (-1), as on a single node: clients then
    skip their epoch validation (OffsetForLeaderEpoch is not served)."""
    info = node.cache.topics.get(name)
    if info is None:
        raise UnknownTopicError(f"topic {name!r} does not exist")
    partitions = []
    for p in range(info.partitions):
        got = node.cache.partition(name, p)
        replicas = list(got[0].replicas) if got is not None else []
        leader = got[0].leader if got is not None else -1
        isr = list(got[0].isr) if got is not None else []
        partitions.append(
            {
                "error_code": ErrorCode.LEADER_NOT_AVAILABLE if leader < 0 else ErrorCode.NONE,
                "partition_index": p,
                "leader_id": leader if leader >= 0 else -1,
                "leader_epoch": -1,
                "replica_nodes": replicas,
                "isr_nodes": isr,
                "offline_replicas": [],
            }
        )
    return _topic_doc(name, partitions)


def _topic_doc(
    name: str, partitions: list[dict[str, Any]], code: ErrorCode = ErrorCode.NONE
) -> dict[str, Any]:
    return {
        "error_code": code,
        "name": name,
        "is_internal": False,
        "partitions": partitions,
        "topic_authorized_operations": _NO_OPERATIONS,
        "topic_id": topic_id(name),
    }


def _topic_error(name: str, code: ErrorCode) -> dict[str, Any]:
    return _topic_doc(name, [], code)


async def _auto_create(ctx: KafkaContext, name: str) -> ErrorCode:
    """Create ``name`` for a Metadata request that allows it; NONE when it exists now."""
    b = ctx.broker
    if not b.config.auto_create_topics:
        return ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
    if not ctx.allowed(Need(ResourceType.TOPIC, Operation.CREATE, name, if_missing=True)):
        return ErrorCode.TOPIC_AUTHORIZATION_FAILED
    try:
        node = cluster_node(b)
        if node is None:
            await b.create_topic_async(name)
        else:  # through the cluster's metadata, with the cluster's defaults
            await node.create_topic(name, None, b.config.log)
    except TopicExistsError:
        pass  # made meanwhile by another request
    except TidewireError as exc:
        return error_code(exc)
    return ErrorCode.NONE


async def metadata(ctx: KafkaContext, version: int, body: dict[str, Any]) -> dict[str, Any]:
    requested = body["topics"]
    existing = topic_names(ctx)
    topics: list[dict[str, Any]] = []
    if requested is None or (version == 0 and not requested):  # v0: empty means every topic
        for name in sorted(existing):
            if ctx.gate.can(ctx.session, ResourceType.TOPIC, name, Operation.DESCRIBE):
                topics.append(_topic_metadata(ctx, name))
    else:
        for name in dict.fromkeys(t["name"] for t in requested):
            if not _topic_allowed(ctx, Operation.DESCRIBE, name):
                topics.append(_topic_error(name, ErrorCode.TOPIC_AUTHORIZATION_FAILED))
                continue
            if name not in existing:
                code = (
                    await _auto_create(ctx, name)
                    if body["allow_auto_topic_creation"]
                    else ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
                )
                if code != ErrorCode.NONE:
                    topics.append(_topic_error(name, code))
                    continue
            try:
                topics.append(_topic_metadata(ctx, name))
            except TidewireError as exc:
                topics.append(_topic_error(name, error_code(exc)))
    return {
        "throttle_time_ms": 0,
        "brokers": _brokers(ctx),
        "cluster_id": ctx.cluster_id,
        "controller_id": _controller_id(ctx),
        "topics": topics,
        "cluster_authorized_operations": _NO_OPERATIONS,
    }


# --- Produce --------------------------------------------------------------------------------


async def produce(ctx: KafkaContext, version: int, body: dict[str, Any]) -> dict[str, Any] | None:
    """Append each partition's records (RecordBatch v2, stored as they came).

    acks=-1 is tidewire's acks=durable (as durable as the topic's fsync policy promises:
    fsynced under ``always``); acks=1 and acks=0 return once the batches are in the log,
    without waiting for an fsync; acks=0 gets no response at all. Idempotent batches
    (a producer id in their header) go through the broker's producer state: a batch sent
    again is answered with its first offsets, a gap in the sequence with
    OUT_OF_ORDER_SEQUENCE_NUMBER, an old epoch with INVALID_PRODUCER_EPOCH.
    """
    b = ctx.broker
    acks = body["acks"]
    durable = None if acks == -1 else False
    refuse: tuple[ErrorCode, str] | None = None
    if acks not in _ACKS:
        refuse = (ErrorCode.INVALID_REQUIRED_ACKS, f"acks={acks} must be 0, 1 or -1")
    elif body["transactional_id"] is not None:
        refuse = (
            ErrorCode.INVALID_REQUEST,
            "transactions are not supported by this broker (docs/kafka.md)",
        )
    # Every partition's append is started here, before this handler first waits: each task's
    # first step claims its offsets, and tasks run in the order they are made, so the
    # appends of a connection's requests keep the requests' order even though a request's
    # handler runs while an earlier one waits for its fsync (Kafka handles one request of a
    # connection at a time, and clients rely on that order: an idempotent producer with 5
    # requests in flight would otherwise see its sequences out of order). The appends are
    # shielded: once claimed a batch is written, and cancelling its producer's wait (a
    # connection reset, a drain) must not make the broker forget that it was stored, or the
    # producer's retry would be stored twice.
    loop = asyncio.get_running_loop()
    responses: list[dict[str, Any]] = []
    waits: list[tuple[list[dict[str, Any]], int, int, asyncio.Task[ProduceResult]]] = []
    for topic in body["topic_data"]:
        name = topic["name"]
        allowed = _topic_allowed(ctx, Operation.WRITE, name) and (
            topic_exists(ctx, name)
            or ctx.allowed(Need(ResourceType.TOPIC, Operation.CREATE, name, if_missing=True))
        )
        parts: list[dict[str, Any]] = []
        for part in topic["partition_data"]:
            index, records = part["index"], part["records"]
            if refuse is not None:
                parts.append(_partition_error(index, *refuse))
                continue
            if not allowed:
                parts.append(_partition_error(index, ErrorCode.TOPIC_AUTHORIZATION_FAILED))
                continue
            if not records:
                parts.append(
                    _partition_error(index, ErrorCode.CORRUPT_MESSAGE, "no records to append")
                )
                continue
            task = loop.create_task(b.produce(name, index, records, durable=durable))
            waits.append((parts, len(parts), index, task))
            parts.append({})  # filled below, in the request's order
        responses.append({"name": name, "partition_responses": parts})
    if waits:
        await asyncio.shield(asyncio.wait([t for *_, t in waits]))
    for parts, at, index, task in waits:
        exc = task.exception()
        if isinstance(exc, TidewireError):
            parts[at] = _partition_error(index, error_code(exc), exc.message)
        elif exc is not None:
            raise exc
        else:
            r = task.result()
            parts[at] = {
                "index": index,
                "error_code": ErrorCode.NONE,
                "base_offset": r.base_offset,
                "log_append_time_ms": _NONE,
                "log_start_offset": r.log_start_offset,
                "error_message": None,
            }
    if acks == 0:
        if any(p["error_code"] for t in responses for p in t["partition_responses"]):
            # Kafka closes the connection of an acks=0 producer whose request failed: it
            # has no answer to read, and the reconnect makes it refresh its metadata.
            ctx.session.extra[ACKS0_FAILED] = True
        return None
    return {"responses": responses, "throttle_time_ms": 0}


# --- Fetch ----------------------------------------------------------------------------------


def _fetch_partition(
    index: int, code: ErrorCode, hw: int = -1, log_start: int = -1, records: bytes | None = None
) -> dict[str, Any]:
    return {
        "partition_index": index,
        "error_code": code,
        "high_watermark": hw,
        "last_stable_offset": hw,
        "log_start_offset": log_start,
        "aborted_transactions": [],
        "preferred_read_replica": -1,
        "records": records,
    }


def _check_offset(ctx: KafkaContext, topic: str, partition: int, offset: int) -> None:
    """Raise what a fetch of ``offset`` would: no such partition, or out of range."""
    plog = ctx.broker.log(topic, partition)
    if not plog.log_start_offset <= offset <= plog.log_end_offset:
        raise OffsetOutOfRangeError(
            f"offset {offset} of {topic!r} partition {partition} is outside "
            f"{plog.log_start_offset}..{plog.log_end_offset}"
        )


async def fetch(ctx: KafkaContext, version: int, body: dict[str, Any]) -> dict[str, Any]:
    """Read each partition from its fetch offset; long-poll up to ``max_wait_ms`` for
    ``min_bytes`` (the broker's ``max_wait_ms`` caps it), at most ``max_bytes`` in all and
    ``partition_max_bytes`` a partition, at least one whole batch (as Kafka)."""
    b = ctx.broker
    if body["session_id"] != 0:  # never handed out: no session exists
        return {
            "throttle_time_ms": 0,
            "error_code": ErrorCode.FETCH_SESSION_ID_NOT_FOUND,
            "session_id": 0,
            "responses": [],
        }
    answers: dict[tuple[str, int], dict[str, Any]] = {}
    order: list[tuple[str, int]] = []
    wants: list[tuple[str, int, int, int]] = []
    for t in body["topics"]:
        name = t["topic"]
        readable = _topic_allowed(ctx, Operation.READ, name)
        for p in t["partitions"]:
            key = (name, p["partition"])
            if key in answers or key in order:
                continue
            order.append(key)
            if not readable:
                answers[key] = _fetch_partition(key[1], ErrorCode.TOPIC_AUTHORIZATION_FAILED)
                continue
            try:
                _check_offset(ctx, name, key[1], p["fetch_offset"])
            except TidewireError as exc:
                answers[key] = _fetch_partition(key[1], error_code(exc))
                continue
            wants.append((name, key[1], p["fetch_offset"], max(p["partition_max_bytes"], 1)))
    max_bytes = body["max_bytes"] if body["max_bytes"] > 0 else b.config.fetch_max_bytes
    if wants:
        try:
            results = await b.fetch(
                wants,
                max_wait_ms=max(body["max_wait_ms"], 0),
                min_bytes=body["min_bytes"],
                max_bytes=max_bytes,
            )
            for r in results:
                answers[(r.topic, r.partition)] = _fetch_partition(
                    r.partition, ErrorCode.NONE, r.high_watermark, r.log_start_offset, r.data
                )
        except BackpressureError as exc:
            for t, p, _, _ in wants:
                answers[(t, p)] = _fetch_partition(p, error_code(exc))
        except TidewireError:
            # One partition changed meanwhile (deleted, damaged): each alone, without waiting.
            for want in wants:
                try:
                    (r,) = await b.fetch([want], max_bytes=max_bytes)
                except TidewireError as exc:
                    answers[want[:2]] = _fetch_partition(want[1], error_code(exc))
                else:
                    answers[want[:2]] = _fetch_partition(
                        r.partition, ErrorCode.NONE, r.high_watermark, r.log_start_offset, r.data
                    )
    responses: list[dict[str, Any]] = []
    for name, partition in order:
        if not responses or responses[-1]["topic"] != name:
            responses.append({"topic": name, "topic_id": topic_id(name), "partitions": []})
        responses[-1]["partitions"].append(answers[(name, partition)])
    return {
        "throttle_time_ms": 0,
        "error_code": ErrorCode.NONE,
        "session_id": 0,
        "responses": responses,
    }


# --- ListOffsets ----------------------------------------------------------------------------


def _timestamp_of(ctx: KafkaContext, topic: str, partition: int, offset: int) -> int:
    """The timestamp of the record at ``offset`` (-1 if it cannot be read)."""
    try:
        r = ctx.broker.read_partition(topic, partition, offset, 1)
        for pos, h in iter_batches(r.data):
            if h.last_offset < offset:
                continue
            for rec in iter_records(r.data[pos : pos + h.size]):
                if rec.offset >= offset:
                    return rec.timestamp
    except (TidewireError, ValueError):
        pass
    return _NONE


async def list_offsets(ctx: KafkaContext, version: int, body: dict[str, Any]) -> dict[str, Any]:
    """-2: the log start offset; -1: the high watermark; a timestamp (ms): the first offset
    whose record is at least that recent, with its timestamp, or -1 and -1 when none is
    (Kafka's answer). Answered at once, never waiting."""
    b = ctx.broker
    topics = []
    for t in body["topics"]:
        name = t["name"]
        describable = _topic_allowed(ctx, Operation.DESCRIBE, name)
        parts = []
        for p in t["partitions"]:
            index, ts = p["partition_index"], p["timestamp"]
            out: dict[str, Any] = {
                "partition_index": index,
                "error_code": ErrorCode.NONE,
                "timestamp": _NONE,
                "offset": _NONE,
                "leader_epoch": -1,
                "old_style_offsets": [],
            }
            if not describable:
                out["error_code"] = ErrorCode.TOPIC_AUTHORIZATION_FAILED
            elif ts < -2:
                out["error_code"] = ErrorCode.INVALID_REQUEST
            else:
                try:
                    off = b.list_offset(name, index, ts)
                    if ts >= 0:
                        if off >= b.high_watermark(name, index):  # no record that recent
                            off = _NONE
                        else:
                            out["timestamp"] = _timestamp_of(ctx, name, index, off)
                    out["offset"] = off
                    out["old_style_offsets"] = [] if off == _NONE else [off]
                except TidewireError as exc:
                    out["error_code"] = error_code(exc)
            parts.append(out)
        topics.append({"name": name, "partitions": parts})
    return {"throttle_time_ms": 0, "topics": topics}


# --- InitProducerId -------------------------------------------------------------------------


async def init_producer_id(ctx: KafkaContext, version: int, body: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {"throttle_time_ms": 0, "error_code": ErrorCode.NONE}
    if body["transactional_id"] is not None:
        log.info(
            "refused InitProducerId with transactional_id=%r: transactions are not supported",
            body["transactional_id"],
        )
        return out | {"error_code": ErrorCode.UNSUPPORTED_VERSION, "producer_id": -1}
    try:
        pid, epoch = await ctx.broker.init_producer_id(body["producer_id"], body["producer_epoch"])
    except TidewireError as exc:
        code = error_code(exc)
        if isinstance(exc, InvalidRequestError):  # an id this broker never handed out
            code = ErrorCode.INVALID_PRODUCER_ID_MAPPING
        return out | {"error_code": code, "producer_id": -1, "producer_epoch": -1}
    return out | {"producer_id": pid, "producer_epoch": epoch}


#: The handler of each data, admin and SASL API.
DATA_HANDLERS: dict[int, KafkaHandler] = {
    ApiKey.API_VERSIONS: api_versions,
    ApiKey.METADATA: metadata,
    ApiKey.PRODUCE: produce,
    ApiKey.FETCH: fetch,
    ApiKey.LIST_OFFSETS: list_offsets,
    ApiKey.INIT_PRODUCER_ID: init_producer_id,
    ApiKey.DESCRIBE_CLUSTER: describe_cluster,
    ApiKey.SASL_HANDSHAKE: sasl_handshake,
    ApiKey.SASL_AUTHENTICATE: sasl_authenticate,
    **ADMIN_HANDLERS,
}
