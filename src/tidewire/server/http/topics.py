"""``/v1/topics``: create, list, describe and delete topics."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from fastapi import APIRouter, Query, Request
from starlette.responses import Response

from tidewire.broker import Broker, PartitionStatus
from tidewire.broker.offsets import is_internal_topic
from tidewire.cluster import cluster_node
from tidewire.errors import (
    InvalidConfigError,
    InvalidRequestError,
    TidewireError,
    UnknownTopicError,
    for_code,
)
from tidewire.security.model import ResourceType
from tidewire.server.cluster_admin import create_topic as create_topic_where_it_belongs
from tidewire.server.gate import gate_for, names_allowed
from tidewire.server.http._common import json_response, parse_body, request_body, responses
from tidewire.server.http._listing import (
    DEFAULT_PAGE,
    LimitParam,
    OffsetParam,
    QueryParam,
    matching,
    paged,
)
from tidewire.server.http.context import GatewayContext
from tidewire.server.http.models import (
    AlterTopicRequest,
    CreateTopicRequest,
    TopicConfig,
    TopicDescription,
    TopicList,
)
from tidewire.storage import LogConfig

__all__ = ["describe_topic", "topics_router"]

#: TopicConfig field -> LogConfig field.
_LOG_FIELDS = {
    "retention_ms": "retention_ms",
    "retention_bytes": "retention_bytes",
    "segment_bytes": "segment_bytes",
    "segment_ms": "segment_ms",
    "fsync": "fsync",
    "flush_interval_ms": "flush_interval_ms",
    "max_message_bytes": "max_batch_bytes",
}


def _log_config(base: LogConfig, cfg: TopicConfig | None) -> LogConfig:
    """``base`` with what ``cfg`` sets. Raises InvalidConfigError (400)."""
    if cfg is None:
        return base
    values = base.to_dict()
    for name, key in _LOG_FIELDS.items():
        value = getattr(cfg, name)
        if value is not None:
            values[key] = value
    return LogConfig.from_dict(values)


def _config_doc(cfg: LogConfig) -> dict[str, Any]:
    return {name: getattr(cfg, key) for name, key in _LOG_FIELDS.items()} | {
        "fsync": str(cfg.fsync)
    }


def _problems(s: PartitionStatus) -> dict[str, Any]:
    """A partition's damaged ranges and why it is offline, when it has any."""
    out: dict[str, Any] = {}
    if s.damage:
        out["damage"] = [
            {
                "start": d.start,
                "end": d.end,
                "size_bytes": d.size,
                "file": d.path,
                "position": d.position,
                "reason": d.reason,
                "quarantined": d.quarantined,
            }
            for d in s.damage
        ]
    if s.offline is not None:
        out["offline"] = s.offline
    return out


def describe_topic(broker: Broker, name: str) -> dict[str, Any]:
    """The TopicDescription document of ``name``: in a cluster, of every partition (from the
    node's copy of the metadata, with the offsets of the replicas held here).

    Raises:
        UnknownTopicError: no such topic.
    """
    node = cluster_node(broker)
    if node is not None:
        from tidewire.cluster.node import config_of  # noqa: PLC0415 (a cluster's only)

        (topic,) = node.metadata([name], lambda names: names).topics
        if topic.error_code:
            raise for_code(topic.error_code)(topic.error_message)
        cluster_parts = []
        for p in topic.partitions:
            doc: dict[str, Any] = {
                "partition": p.partition,
                "start_offset": p.log_start_offset,
                "end_offset": p.log_end_offset,
                "high_watermark": p.high_watermark,
                "size_bytes": p.size_bytes,
                "leader": p.leader,
                "leader_epoch": p.leader_epoch,
                "replicas": list(p.replicas),
                "isr": list(p.isr),
            }
            if p.damage:
                doc["damage"] = [
                    {
                        "start": d.start,
                        "end": d.end,
                        "size_bytes": d.size_bytes,
                        "file": d.file,
                        "position": d.position,
                        "reason": d.reason,
                        "quarantined": d.quarantined or None,
                    }
                    for d in p.damage
                ]
            if p.offline:
                doc["offline"] = p.offline
            cluster_parts.append(doc)
        return {
            "name": name,
            "partitions": cluster_parts,
            "config": _config_doc(config_of(node.cache.topics[name], broker.config.log)),
            "replication_factor": topic.replication_factor,
            "min_insync_replicas": topic.min_insync_replicas,
            "unclean_leader_election": topic.unclean_leader_election,
        }
    parts = [
        {
            "partition": s.partition,
            "start_offset": s.log_start_offset,
            "end_offset": s.log_end_offset,
            "high_watermark": s.high_watermark,
            "size_bytes": s.size_bytes,
        }
        | _problems(s)
        for s in broker.describe(name)
    ]
    return {
        "name": name,
        "partitions": parts,
        "config": _config_doc(broker.topic_config(name)),
    }


TopicSort = Literal[
    "name", "-name", "partitions", "-partitions", "size", "-size", "messages", "-messages"
]


def topic_figures(broker: Broker, name: str) -> tuple[int, int]:
    """A topic's size (bytes) and messages (end minus start offsets; an estimate where
    compaction or transactions left gaps) over its online partitions."""
    size = messages = 0
    logs = broker.logs.logs
    for p in range(broker.partition_count(name)):
        plog = logs.get((name, p))
        if plog is not None:
            size += plog.size_bytes
            messages += max(0, plog.log_end_offset - plog.log_start_offset)
    return size, messages


def _audit(broker: Broker, topic: str, error: TidewireError | None) -> None:
    """Audit an alteration (who and from where: the request's, set by the gate)."""
    if broker.audit is not None:
        outcome, reason = ("failed", error.message) if error is not None else ("ok", "")
        broker.audit.event("ALTER_TOPIC", outcome, resource=f"topic:{topic}", reason=reason)


def _known(broker: Broker, name: str) -> None:
    """Raise UnknownTopicError unless ``name`` is a topic users may see (in a cluster: one
    etcd knows, wherever its replicas are)."""
    node = cluster_node(broker)
    if node is not None:
        if name not in node.cache.topics:
            raise UnknownTopicError(f"topic {name!r} does not exist")
        return
    if name not in broker.topics():
        raise UnknownTopicError(f"topic {name!r} does not exist")


def topics_router(ctx: GatewayContext) -> APIRouter:
    """Topic administration."""
    router = APIRouter(prefix="/v1/topics", tags=["topics"])
    broker = ctx.broker

    @router.post(
        "",
        status_code=201,
        response_model=TopicDescription,
        responses=responses(409, 413, 422),
        openapi_extra={"requestBody": request_body(CreateTopicRequest)},
    )
    async def create_topic(request: Request) -> Response:
        """Create a topic with ``partitions`` partitions (the broker's default when absent)
        and ``config`` settings (the broker's defaults for those absent)."""
        req = parse_body(CreateTopicRequest, await request.body())
        await create_topic_where_it_belongs(
            broker,
            req.name,
            req.partitions,
            _log_config(broker.config.log, req.config),
            req.replication_factor,
            min_insync_replicas=req.min_insync_replicas,
            unclean_leader_election=req.unclean_leader_election,
        )
        return json_response(describe_topic(broker, req.name), 201)

    @router.get("", response_model=TopicList, responses=responses())
    async def list_topics(
        *,
        limit: LimitParam = DEFAULT_PAGE,
        offset: OffsetParam = 0,
        q: QueryParam = "",
        sort: Annotated[
            TopicSort,
            Query(description="Sort key, '-' in front for descending; ties by name."),
        ] = "name",
    ) -> Response:
        """The topics whose names contain ``q``, sorted by ``sort``, ``limit`` from
        ``offset``: each with its partition count, size and messages; ``total`` counts
        those that match, ``next`` is the offset of the next page (null on the last). In a
        cluster: every topic of the cluster, size and messages of the replicas held here."""
        # Only what the caller may describe, as the binary protocol's LIST_TOPICS.
        node = cluster_node(broker)
        every = (
            broker.topics()
            if node is None  # a cluster: every topic etcd knows, wherever its replicas are
            else {n: t.partitions for n, t in node.cache.topics.items() if not is_internal_topic(n)}
        )
        topics = {n: every[n] for n in names_allowed(gate_for(broker), ResourceType.TOPIC, every)}
        figures: dict[str, tuple[int, int]] = {}

        def figure(name: str) -> tuple[int, int]:
            got = figures.get(name)
            if got is None:
                got = figures[name] = topic_figures(broker, name)
            return got

        page, total, after = paged(
            matching(topics, q),
            sort=sort,
            keys={
                "name": lambda n: n,
                "partitions": lambda n: topics[n],
                "size": lambda n: figure(n)[0],
                "messages": lambda n: figure(n)[1],
            },
            offset=offset,
            limit=limit,
        )
        items = []
        for n in page:
            size, messages = figure(n)
            items.append(
                {"name": n, "partitions": topics[n], "size_bytes": size, "messages": messages}
            )
        return json_response({"topics": items, "total": total, "next": after})

    @router.get("/{topic}", response_model=TopicDescription, responses=responses(404))
    async def get_topic(topic: str) -> Response:
        """A topic's partitions (start, end and high-watermark offsets, size) and settings."""
        _known(broker, topic)
        return json_response(describe_topic(broker, topic))

    @router.patch(
        "/{topic}",
        response_model=TopicDescription,
        responses=responses(404, 422),
        openapi_extra={"requestBody": request_body(AlterTopicRequest)},
    )
    async def alter_topic(request: Request, topic: str) -> Response:
        """Change a topic's settings (those in ``config``; the others keep their values) on
        every partition, and/or add partitions (``partitions``: more than now). Answers the
        topic's description. A value out of range: 400 naming the field; fewer partitions
        than now, or an internal topic: 422. The same operation as ``tidewire topic
        alter``."""
        req = parse_body(AlterTopicRequest, await request.body())
        cluster_settings = req.min_insync_replicas, req.unclean_leader_election
        if (
            req.partitions is None
            and (req.config is None or not req.config.model_fields_set)
            and cluster_settings == (None, None)
        ):
            raise InvalidRequestError(
                "nothing to change: give partitions or at least one setting in config"
            )
        _known(broker, topic)
        node = cluster_node(broker)
        if node is not None:  # through etcd: every replica follows
            from tidewire.cluster.node import config_of  # noqa: PLC0415 (a cluster's only)
            from tidewire.cluster.reassign import alter_topic  # noqa: PLC0415

            try:
                config = (
                    _log_config(config_of(node.cache.topics[topic], broker.config.log), req.config)
                    if req.config is not None and req.config.model_fields_set
                    else None
                )
                await alter_topic(
                    node,
                    topic,
                    partitions=req.partitions,
                    config=config,
                    min_insync_replicas=req.min_insync_replicas,
                    unclean_leader_election=req.unclean_leader_election,
                )
            except TidewireError as exc:
                _audit(broker, topic, exc)
                raise
            _audit(broker, topic, None)
            return json_response(describe_topic(broker, topic))
        if cluster_settings != (None, None):
            raise InvalidConfigError(
                "min_insync_replicas and unclean_leader_election are settings of a cluster's "
                "topics (docs/cluster.md); a single node holds one copy"
            )
        try:
            config = (
                _log_config(broker.topic_config(topic), req.config)
                if req.config is not None and req.config.model_fields_set
                else None
            )
            await broker.alter_topic_async(topic, partitions=req.partitions, config=config)
        except TidewireError as exc:
            _audit(broker, topic, exc)
            raise
        _audit(broker, topic, None)
        return json_response(describe_topic(broker, topic))

    @router.delete(
        "/{topic}",
        status_code=204,
        response_class=Response,
        responses=responses(404, 422),
    )
    async def delete_topic(topic: str) -> Response:
        """Delete a topic and all its messages (never an internal topic of the broker's)."""
        # UnknownTopicError: 404; InternalTopicError: 422
        node = cluster_node(broker)
        if node is not None:  # a cluster: through etcd, every replica goes
            await node.delete_topic(topic)
        else:
            await broker.delete_topic_async(topic)
        for forget in ctx.on_topic_deleted:
            forget(topic)
        return Response(status_code=204)

    return router
