"""The Kafka admin APIs over the broker core: CreateTopics, DeleteTopics, CreatePartitions
and DescribeConfigs (:data:`ADMIN_HANDLERS`), and how Kafka's topic configs map onto
tidewire's topic settings (:data:`TOPIC_CONFIGS`).

Kafka name            tidewire topic setting      notes
--------------------  --------------------------  -----------------------------------------
retention.ms          retention_ms                -1: keep
retention.bytes       retention_bytes             -1: keep
segment.bytes         segment_bytes
segment.ms            segment_ms
max.message.bytes     max_message_bytes           (LogConfig.max_batch_bytes)
flush.ms              fsync, flush_interval_ms    0: always; 9223372036854775807: never;
                                                  else interval, every that many ms
cleanup.policy        (delete only)               tidewire does not compact topics
min.insync.replicas   (1 only)                    one node
compression.type      (producer only)             batches are stored as they come
message.timestamp.type (CreateTime only)

Any other name (or a value tidewire cannot honour) is INVALID_CONFIG, naming it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from tidewire.cluster import cluster_node
from tidewire.errors import InvalidConfigError, TidewireError
from tidewire.protocol.kafka import ApiKey, ErrorCode
from tidewire.security.model import Operation, ResourceType
from tidewire.server.kafka.context import KafkaContext, KafkaHandler
from tidewire.server.kafka.errors import error_code
from tidewire.server.kafka.needs import CONFIG_BROKER, CONFIG_TOPIC
from tidewire.server.needs import Need
from tidewire.storage import FsyncPolicy, LogConfig
from tidewire.storage.manager import MAX_PARTITION, validate_topic_name

__all__ = ["ADMIN_HANDLERS", "TOPIC_CONFIGS", "kafka_configs", "to_log_config"]

#: Kafka's "flush never" (Long.MAX_VALUE).
_NEVER = 2**63 - 1
#: DescribeConfigs' config sources: a topic's own, the broker's static file, a default.
_SOURCE_TOPIC, _SOURCE_STATIC, _SOURCE_DEFAULT = 1, 4, 5
#: DescribeConfigs' config types (v3+): boolean, string, int, long, list.
_BOOLEAN, _STRING, _INT, _LONG = 1, 2, 3, 5


def _flush_ms(cfg: LogConfig) -> int:
    if cfg.fsync is FsyncPolicy.ALWAYS:
        return 0
    if cfg.fsync is FsyncPolicy.NEVER:
        return _NEVER
    return cfg.flush_interval_ms


def _set_flush(values: dict[str, Any], ms: int) -> None:
    if ms == 0:
        values["fsync"] = "always"
    elif ms == _NEVER:
        values["fsync"] = "never"
    else:
        values["fsync"] = "interval"
        values["flush_interval_ms"] = ms


def _fixed(name: str, only: str) -> Callable[[dict[str, Any], str], None]:
    def check(values: dict[str, Any], value: str) -> None:
        if value.strip().lower() != only.lower():
            raise InvalidConfigError(f"{name}={value!r}: tidewire supports {only} only")

    return check


def _int_setting(key: str) -> Callable[[dict[str, Any], str], None]:
    def put(values: dict[str, Any], value: str) -> None:
        values[key] = int(value)

    return put


#: Kafka topic config -> how it sets tidewire's LogConfig values (see the module docstring).
TOPIC_CONFIGS: dict[str, Callable[[dict[str, Any], str], None]] = {
    "retention.ms": _int_setting("retention_ms"),
    "retention.bytes": _int_setting("retention_bytes"),
    "segment.bytes": _int_setting("segment_bytes"),
    "segment.ms": _int_setting("segment_ms"),
    "max.message.bytes": _int_setting("max_batch_bytes"),
    "flush.ms": lambda values, value: _set_flush(values, int(value)),
    "cleanup.policy": _fixed("cleanup.policy", "delete"),
    "min.insync.replicas": _fixed("min.insync.replicas", "1"),
    "compression.type": _fixed("compression.type", "producer"),
    "message.timestamp.type": _fixed("message.timestamp.type", "CreateTime"),
}


def _cluster_configs(
    configs: list[dict[str, Any]],
) -> tuple[list[dict[str, Any]], int | None, bool | None]:
    """A cluster's CreateTopics configs: the others, ``min.insync.replicas`` and
    ``unclean.leader.election.enable`` (None where not given).

    Raises:
        InvalidConfigError: a value of either that is not a number or a boolean.
    """
    rest, min_insync, unclean = [], None, None
    for c in configs:
        name, value = c["name"], c["value"]
        if name == "min.insync.replicas" and value is not None:
            try:
                min_insync = int(value)
            except ValueError:
                raise InvalidConfigError(f"min.insync.replicas={value!r} is not a number") from None
        elif name == "unclean.leader.election.enable" and value is not None:
            if value.lower() not in ("true", "false"):
                raise InvalidConfigError(
                    f"unclean.leader.election.enable={value!r} must be true or false"
                )
            unclean = value.lower() == "true"
        elif name not in ("min.insync.replicas", "unclean.leader.election.enable"):
            rest.append(c)
    return rest, min_insync, unclean


def to_log_config(base: LogConfig, configs: list[dict[str, Any]]) -> LogConfig:
    """``base`` with Kafka topic configs (``[{"name", "value"}]``) applied.

    Raises:
        InvalidConfigError: an unknown name, a value that is not a number where one is
            needed, or one out of tidewire's range (the message names it).
    """
    values = base.to_dict()
    for c in configs:
        name, value = c["name"], c["value"]
        apply = TOPIC_CONFIGS.get(name)
        if apply is None:
            known = ", ".join(sorted(TOPIC_CONFIGS))
            raise InvalidConfigError(f"unknown topic config {name!r}; tidewire knows {known}")
        if value is None:
            continue  # null: the default
        try:
            apply(values, value)
        except ValueError:
            raise InvalidConfigError(f"{name}={value!r} is not a number") from None
    return LogConfig.from_dict(values)


def kafka_configs(cfg: LogConfig, default: LogConfig) -> list[tuple[str, str, bool, int]]:
    """A topic's settings under Kafka's names: ``(name, value, is_default, config type)``."""
    rows = [
        ("retention.ms", cfg.retention_ms, default.retention_ms, _LONG),
        ("retention.bytes", cfg.retention_bytes, default.retention_bytes, _LONG),
        ("segment.bytes", cfg.segment_bytes, default.segment_bytes, _INT),
        ("segment.ms", cfg.segment_ms, default.segment_ms, _LONG),
        ("max.message.bytes", cfg.max_batch_bytes, default.max_batch_bytes, _INT),
        ("flush.ms", _flush_ms(cfg), _flush_ms(default), _LONG),
    ]
    out = [(n, str(v), v == d, t) for n, v, d, t in rows]
    out += [
        ("cleanup.policy", "delete", True, 7),  # 7: list
        ("min.insync.replicas", "1", True, _INT),
        ("compression.type", "producer", True, _STRING),
        ("message.timestamp.type", "CreateTime", True, _STRING),
    ]
    return out


def _audit(ctx: KafkaContext, action: str, name: str, exc: TidewireError | None = None) -> None:
    audit = ctx.broker.audit
    if audit is not None:
        outcome, reason = ("failed", exc.message) if exc is not None else ("ok", "")
        audit.event(action, outcome, resource=f"topic:{name}", reason=reason)


def _topic_allowed(ctx: KafkaContext, op: Operation, name: str) -> bool:
    return ctx.allowed(Need(ResourceType.TOPIC, op, name))


# --- CreateTopics ---------------------------------------------------------------------------


def _partitions_of(ctx: KafkaContext, t: dict[str, Any]) -> int:
    """The partition count a CreateTopics entry asks for, checked (InvalidConfigError-like
    problems are raised as a (code, message) through ``_Refused``)."""
    n, rf, assignments = t["num_partitions"], t["replication_factor"], t["assignments"]
    if cluster_node(ctx.broker) is not None:
        if assignments:
            raise _Refused(
                ErrorCode.INVALID_REPLICA_ASSIGNMENT,
                "a cluster places replicas itself: give num_partitions and replication_factor",
            )
        if rf == 0 or rf < -1:
            raise _Refused(
                ErrorCode.INVALID_REPLICATION_FACTOR,
                f"replication factor {rf} must be at least 1 (or -1 for the default)",
            )
        rf = -1  # the cluster checks it against its live nodes
    if assignments:
        if n != -1 or rf != -1:
            raise _Refused(
                ErrorCode.INVALID_REQUEST,
                "give either assignments or num_partitions and replication_factor, not both",
            )
        for a in assignments:
            if list(a["broker_ids"]) != [ctx.node_id]:
                raise _Refused(
                    ErrorCode.INVALID_REPLICA_ASSIGNMENT,
                    f"partition {a['partition_index']} assigned to brokers "
                    f"{list(a['broker_ids'])}; this cluster has broker {ctx.node_id} alone",
                )
        indexes = sorted(a["partition_index"] for a in assignments)
        if indexes != list(range(len(indexes))):
            raise _Refused(
                ErrorCode.INVALID_REPLICA_ASSIGNMENT,
                f"partitions assigned {indexes} must be 0..{len(indexes) - 1}",
            )
        n = len(indexes)
    if rf not in (-1, 1):
        raise _Refused(
            ErrorCode.INVALID_REPLICATION_FACTOR,
            f"replication factor {rf}: this cluster has 1 broker, so 1 (or -1 for the "
            "default) is the only one possible",
        )
    if n == -1:
        n = ctx.broker.config.default_partitions
    if not 1 <= n <= MAX_PARTITION:
        raise _Refused(
            ErrorCode.INVALID_PARTITIONS,
            f"num_partitions={n} must be within 1..{MAX_PARTITION:,} (or -1 for the default)",
        )
    return int(n)


class _Refused(Exception):
    def __init__(self, code: ErrorCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


async def create_topics(ctx: KafkaContext, version: int, body: dict[str, Any]) -> dict[str, Any]:
    from tidewire.server.kafka.handlers import topic_exists  # noqa: PLC0415 (it imports this)

    b = ctx.broker
    results = []
    names = [t["name"] for t in body["topics"]]
    for t in body["topics"]:
        name = t["name"]
        out: dict[str, Any] = {
            "name": name,
            "error_code": ErrorCode.NONE,
            "error_message": None,
            "num_partitions": -1,
            "replication_factor": -1,
            "configs": None,
        }
        results.append(out)
        try:
            if names.count(name) > 1:
                raise _Refused(ErrorCode.INVALID_REQUEST, f"topic {name!r} is named twice")
            if not _topic_allowed(ctx, Operation.CREATE, name):
                raise _Refused(
                    ErrorCode.TOPIC_AUTHORIZATION_FAILED, f"creating {name!r} is not allowed"
                )
            n = _partitions_of(ctx, t)
            node = cluster_node(b)
            configs, min_insync, unclean = t["configs"], None, None
            if node is not None:  # a cluster's own settings, kept with the topic in etcd
                configs, min_insync, unclean = _cluster_configs(configs)
            config = to_log_config(b.config.log, configs)
            # One node: 1. A cluster: as asked (-1: the cluster's default, whatever it is).
            rf = 1 if node is None else t["replication_factor"]
            if body["validate_only"]:
                validate_topic_name(name)
                if topic_exists(ctx, name):
                    raise _Refused(ErrorCode.TOPIC_ALREADY_EXISTS, f"topic {name!r} exists")
            elif node is not None:  # through the cluster's metadata
                await node.create_topic(
                    name,
                    n,
                    config,
                    None if rf == -1 else rf,
                    min_insync_replicas=min_insync,
                    unclean_leader_election=unclean,
                )
                _audit(ctx, "CREATE_TOPIC", name)
                info = node.cache.topics.get(name)
                rf = info.replication_factor if info is not None else rf
            else:
                await b.create_topic_async(name, n, config)
                _audit(ctx, "CREATE_TOPIC", name)
            out.update(num_partitions=n, replication_factor=rf)
        except _Refused as exc:
            out.update(error_code=exc.code, error_message=exc.message)
        except TidewireError as exc:
            if not body["validate_only"]:
                _audit(ctx, "CREATE_TOPIC", name, exc)
            out.update(error_code=error_code(exc), error_message=exc.message)
    return {"throttle_time_ms": 0, "topics": results}


# --- DeleteTopics ---------------------------------------------------------------------------


async def delete_topics(ctx: KafkaContext, version: int, body: dict[str, Any]) -> dict[str, Any]:
    from tidewire.server.kafka.handlers import (  # noqa: PLC0415 (it imports this)
        topic_id,
        topic_names,
    )

    b = ctx.broker
    by_id = {topic_id(n): n for n in topic_names(ctx)}
    asked: list[tuple[str | None, Any]] = [(n, None) for n in body["topic_names"]]
    asked += [(t["name"], t["topic_id"]) for t in body["topics"]]
    responses = []
    for asked_name, tid in asked:
        out: dict[str, Any] = {
            "name": asked_name,
            "error_code": ErrorCode.NONE,
            "error_message": None,
        }
        responses.append(out)
        name = asked_name or by_id.get(tid)
        if name is None:
            out.update(error_code=ErrorCode.UNKNOWN_TOPIC_ID, error_message=f"no topic id {tid}")
            continue
        out["name"] = name
        out["topic_id"] = topic_id(name)
        if not _topic_allowed(ctx, Operation.DELETE, name):
            out["error_code"] = ErrorCode.TOPIC_AUTHORIZATION_FAILED
            continue
        try:
            node = cluster_node(b)
            if node is None:
                await b.delete_topic_async(name)
            else:  # through the cluster's metadata
                await node.delete_topic(name)
        except TidewireError as exc:
            _audit(ctx, "DELETE_TOPIC", name, exc)
            out.update(error_code=error_code(exc), error_message=exc.message)
        else:
            _audit(ctx, "DELETE_TOPIC", name)
    return {"throttle_time_ms": 0, "responses": responses}


# --- CreatePartitions -----------------------------------------------------------------------


async def create_partitions(
    ctx: KafkaContext, version: int, body: dict[str, Any]
) -> dict[str, Any]:
    """A result for every topic asked about, never fewer."""
    b = ctx.broker
    names = [t["name"] for t in body["topics"]]
    results = []
    for t in body["topics"]:
        name, count = t["name"], t["count"]
        out: dict[str, Any] = {"name": name, "error_code": ErrorCode.NONE, "error_message": None}
        results.append(out)
        try:
            if names.count(name) > 1:
                raise _Refused(ErrorCode.INVALID_REQUEST, f"topic {name!r} is named twice")
            if not _topic_allowed(ctx, Operation.ALTER, name):
                raise _Refused(ErrorCode.TOPIC_AUTHORIZATION_FAILED, "")
            if cluster_node(b) is not None:
                raise _Refused(
                    ErrorCode.INVALID_REQUEST,
                    f"topic {name!r} cannot gain partitions in a cluster yet (docs/cluster.md)",
                )
            current = b.partition_count(name)
            if count <= current:
                raise _Refused(
                    ErrorCode.INVALID_PARTITIONS,
                    f"topic {name!r} has {current} partition(s): asked for {count}, but a "
                    "topic can only gain partitions",
                )
            for a in t["assignments"] or []:
                if list(a["broker_ids"]) != [ctx.node_id]:
                    raise _Refused(
                        ErrorCode.INVALID_REPLICA_ASSIGNMENT,
                        f"brokers {list(a['broker_ids'])}: this cluster has broker "
                        f"{ctx.node_id} alone",
                    )
            if count > MAX_PARTITION:
                raise _Refused(
                    ErrorCode.INVALID_PARTITIONS,
                    f"count={count} must be at most {MAX_PARTITION:,}",
                )
            if not body["validate_only"]:
                await b.alter_topic_async(name, partitions=count)
                _audit(ctx, "ALTER_TOPIC", name)
        except _Refused as exc:
            out.update(error_code=exc.code, error_message=exc.message or None)
        except TidewireError as exc:
            out.update(error_code=error_code(exc), error_message=exc.message)
    return {"throttle_time_ms": 0, "results": results}


# --- DescribeConfigs ------------------------------------------------------------------------


def _broker_configs(ctx: KafkaContext) -> list[tuple[str, str, bool, int]]:
    cfg = ctx.broker.config
    log = cfg.log
    return [
        ("broker.id", str(ctx.node_id), False, _INT),
        ("num.partitions", str(cfg.default_partitions), False, _INT),
        ("auto.create.topics.enable", str(cfg.auto_create_topics).lower(), False, _BOOLEAN),
        ("default.replication.factor", "1", True, _INT),
        ("min.insync.replicas", "1", True, _INT),
        ("log.retention.ms", str(log.retention_ms), False, _LONG),
        ("log.retention.bytes", str(log.retention_bytes), False, _LONG),
        ("log.segment.bytes", str(log.segment_bytes), False, _INT),
        ("log.roll.ms", str(log.segment_ms), False, _LONG),
        ("log.flush.interval.ms", str(_flush_ms(log)), False, _LONG),
        ("message.max.bytes", str(log.max_batch_bytes), False, _INT),
        ("fetch.max.bytes", str(cfg.fetch_max_bytes), False, _INT),
        ("compression.type", "producer", True, _STRING),
        ("log.cleanup.policy", "delete", True, 7),
        ("delete.topic.enable", "true", True, _BOOLEAN),
    ]


def _config_entries(
    rows: list[tuple[str, str, bool, int]], keys: list[str] | None, source: int
) -> list[dict[str, Any]]:
    wanted = None if keys is None else set(keys)
    return [
        {
            "name": name,
            "value": value,
            "read_only": source == _SOURCE_STATIC,
            "is_default": is_default,
            "config_source": _SOURCE_DEFAULT if is_default else source,
            "is_sensitive": False,
            "synonyms": [],
            "config_type": kind,
            "documentation": None,
        }
        for name, value, is_default, kind in rows
        if wanted is None or name in wanted
    ]


async def describe_configs(ctx: KafkaContext, version: int, body: dict[str, Any]) -> dict[str, Any]:
    """A topic's settings under Kafka's names (:func:`kafka_configs`), and the broker's
    (``num.partitions``, ``log.retention.ms``, ``message.max.bytes``, ...)."""
    b = ctx.broker
    results = []
    for r in body["resources"]:
        kind, name, keys = r["resource_type"], r["resource_name"], r["configuration_keys"]
        out: dict[str, Any] = {
            "error_code": ErrorCode.NONE,
            "error_message": None,
            "resource_type": kind,
            "resource_name": name,
            "configs": [],
        }
        results.append(out)
        if kind == CONFIG_TOPIC:
            if not _topic_allowed(ctx, Operation.DESCRIBE, name):
                out["error_code"] = ErrorCode.TOPIC_AUTHORIZATION_FAILED
                continue
            try:
                rows = kafka_configs(b.topic_config(name), b.config.log)
            except TidewireError as exc:
                out.update(error_code=error_code(exc), error_message=exc.message)
                continue
            out["configs"] = _config_entries(rows, keys, _SOURCE_TOPIC)
        elif kind == CONFIG_BROKER:
            if name not in ("", str(ctx.node_id)):
                out.update(
                    error_code=ErrorCode.INVALID_REQUEST,
                    error_message=f"broker {name!r}: this cluster has broker {ctx.node_id}",
                )
            elif not ctx.allowed(Need(ResourceType.CLUSTER, Operation.DESCRIBE)):
                out["error_code"] = ErrorCode.CLUSTER_AUTHORIZATION_FAILED
            else:
                out["configs"] = _config_entries(_broker_configs(ctx), keys, _SOURCE_STATIC)
        else:
            out.update(
                error_code=ErrorCode.INVALID_REQUEST,
                error_message=f"resource type {kind}: only topics (2) and brokers (4) have "
                "configs here",
            )
    return {"throttle_time_ms": 0, "results": results}


#: The handler of each admin API.
ADMIN_HANDLERS: dict[int, KafkaHandler] = {
    ApiKey.CREATE_TOPICS: create_topics,
    ApiKey.DELETE_TOPICS: delete_topics,
    ApiKey.CREATE_PARTITIONS: create_partitions,
    ApiKey.DESCRIBE_CONFIGS: describe_configs,
}
