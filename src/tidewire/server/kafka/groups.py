"""The handlers of Kafka's group APIs (:data:`GROUP_HANDLERS`): FindCoordinator, JoinGroup,
SyncGroup, Heartbeat, LeaveGroup, OffsetCommit, OffsetFetch, ListGroups, DescribeGroups and
DeleteGroups, over :attr:`Broker.kafka_groups <tidewire.broker.Broker.kafka_groups>` (the
classic group protocol) and the broker's offsets log (:attr:`Broker.groups`).

This broker is the coordinator of every group: FindCoordinator answers the listener's
advertised address. Authorization is per resource (:mod:`.group_needs`): a denied group is
answered with GROUP_AUTHORIZATION_FAILED, a denied topic's partitions with
TOPIC_AUTHORIZATION_FAILED, and the rest of the request is served.
"""

from __future__ import annotations

from typing import Any

from tidewire.broker.consumer_groups import MAX_METADATA_CHARS
from tidewire.broker.kafka_groups import GroupError, KafkaGroupState
from tidewire.broker.offsets import OFFSETS_TOPIC, partition_for
from tidewire.cluster import cluster_node
from tidewire.errors import (
    BackpressureError,
    GroupNotEmptyError,
    TidewireError,
    UnknownGroupError,
)
from tidewire.protocol.kafka import ApiKey, ErrorCode
from tidewire.security.model import Operation, ResourceType
from tidewire.server.kafka.context import KafkaContext, KafkaHandler
from tidewire.server.needs import Need

__all__ = ["GROUP_HANDLERS"]

Body = dict[str, Any]
_G, _T = ResourceType.GROUP, ResourceType.TOPIC
#: FindCoordinator's key types.
KEY_GROUP, KEY_TRANSACTION = 0, 1
#: DescribeGroups' "authorized operations not asked for".
_NO_OPERATIONS = -(2**31)


def _code(e: GroupError) -> int:
    return int(ErrorCode(int(e)))


def _group_allowed(ctx: KafkaContext, op: Operation, group: str) -> bool:
    return ctx.allowed(Need(_G, op, group))


def _client_host(ctx: KafkaContext) -> str:
    """Kafka's form of the client's address: ``/`` and the host."""
    host = ctx.session.source.rsplit(":", 1)[0]
    return f"/{host.strip('[]')}"


# --- FindCoordinator ----------------------------------------------------------------------------


async def _coordinator(ctx: KafkaContext, group: str) -> tuple[int, str, int] | None:
    """The node that coordinates ``group`` and its Kafka address: this node on a single node;
    in a cluster the leader of the group's partition of the offsets topic (made on first use),
    None while it has no leader (or no Kafka listener)."""
    node = cluster_node(ctx.broker)
    if node is None:
        return ctx.node_id, ctx.host, ctx.port
    if OFFSETS_TOPIC not in node.cache.topics:
        await node.ensure_offsets_topic()
    got = node.cache.partition(OFFSETS_TOPIC, partition_for(group))
    leader = got[0].leader if got is not None else -1
    if leader == node.node_id:
        return ctx.node_id, ctx.host, ctx.port
    info = node.cache.nodes.get(leader)
    if info is None or info.kafka_port < 0:
        return None
    return leader, info.kafka_host or info.host, info.kafka_port


def _not_here(ctx: KafkaContext, group: str) -> bool:
    """In a cluster: whether another node coordinates ``group`` (NOT_COORDINATOR, which every
    Kafka client answers by finding the coordinator again)."""
    return not ctx.broker.groups.offsets.serves(group)


async def find_coordinator(ctx: KafkaContext, version: int, body: Body) -> Body:
    key_type = body["key_type"]
    keys = list(body["coordinator_keys"]) if version >= 4 else [body["key"]]
    coordinators = []
    for key in keys:
        entry: Body = {
            "key": key,
            "node_id": ctx.node_id,
            "host": ctx.host,
            "port": ctx.port,
            "error_code": 0,
            "error_message": None,
        }
        error, message = ErrorCode.NONE, ""
        if key_type == KEY_TRANSACTION:
            error = ErrorCode.INVALID_REQUEST
            message = "transactions are not supported by this broker (key_type 1)"
        elif key_type != KEY_GROUP:
            error, message = ErrorCode.INVALID_REQUEST, f"unknown key_type {key_type}"
        elif not _group_allowed(ctx, Operation.DESCRIBE, key):
            error = ErrorCode.GROUP_AUTHORIZATION_FAILED
            message = f"not authorized to describe group {key!r}"
        else:
            try:
                where = await _coordinator(ctx, key)
            except TidewireError as exc:
                where, message = None, exc.message
            if where is None:
                error = ErrorCode.COORDINATOR_NOT_AVAILABLE
                message = message or f"group {key!r} has no coordinator now; ask again"
            else:
                entry.update(node_id=where[0], host=where[1], port=where[2])
        if error is not ErrorCode.NONE:
            entry.update(node_id=-1, host="", port=-1, error_code=int(error), error_message=message)
        coordinators.append(entry)
    first = coordinators[0] if coordinators else {}
    return {
        "throttle_time_ms": 0,
        "error_code": first.get("error_code", 0),
        "error_message": first.get("error_message"),
        "node_id": first.get("node_id", -1),
        "host": first.get("host", ""),
        "port": first.get("port", -1),
        "coordinators": coordinators,
    }


# --- membership ---------------------------------------------------------------------------------


async def join_group(ctx: KafkaContext, version: int, body: Body) -> Body:
    group = body["group_id"]
    if not _group_allowed(ctx, Operation.READ, group):
        r_error, r = ErrorCode.GROUP_AUTHORIZATION_FAILED, None
    elif _not_here(ctx, group):
        r_error, r = ErrorCode.NOT_COORDINATOR, None
    else:
        r = await ctx.broker.kafka_groups.join(
            group,
            member_id=body["member_id"],
            group_instance_id=body["group_instance_id"],
            client_id=ctx.header.client_id or "",
            client_host=_client_host(ctx),
            session_timeout_ms=body["session_timeout_ms"],
            rebalance_timeout_ms=body["rebalance_timeout_ms"] if version >= 1 else -1,
            protocol_type=body["protocol_type"],
            protocols=[(p["name"], bytes(p["metadata"])) for p in body["protocols"]],
            require_known_member_id=version >= 4 and not body["group_instance_id"],
        )
        r_error = ErrorCode(int(r.error))
    if r is None or r.error is not GroupError.NONE:
        return {
            "throttle_time_ms": 0,
            "error_code": int(r_error),
            "generation_id": -1,
            "protocol_type": None,
            "protocol_name": None if version >= 7 else "",
            "leader": "",
            "skip_assignment": False,
            "member_id": body["member_id"] if r is None else r.member_id,
            "members": [],
        }
    return {
        "throttle_time_ms": 0,
        "error_code": 0,
        "generation_id": r.generation,
        "protocol_type": r.protocol_type,
        "protocol_name": r.protocol_name if version >= 7 else (r.protocol_name or ""),
        "leader": r.leader,
        "skip_assignment": False,
        "member_id": r.member_id,
        "members": [
            {
                "member_id": m.member_id,
                "group_instance_id": m.group_instance_id,
                "metadata": m.metadata,
            }
            for m in r.members
        ],
    }


async def sync_group(ctx: KafkaContext, version: int, body: Body) -> Body:
    group = body["group_id"]
    if not _group_allowed(ctx, Operation.READ, group):
        return {
            "throttle_time_ms": 0,
            "error_code": int(ErrorCode.GROUP_AUTHORIZATION_FAILED),
            "assignment": b"",
        }
    if _not_here(ctx, group):
        return {
            "throttle_time_ms": 0,
            "error_code": int(ErrorCode.NOT_COORDINATOR),
            "assignment": b"",
        }
    r = await ctx.broker.kafka_groups.sync(
        group,
        member_id=body["member_id"],
        generation=body["generation_id"],
        group_instance_id=body["group_instance_id"],
        protocol_type=body["protocol_type"],
        protocol_name=body["protocol_name"],
        assignments={a["member_id"]: bytes(a["assignment"]) for a in body["assignments"]},
    )
    return {
        "throttle_time_ms": 0,
        "error_code": _code(r.error),
        "protocol_type": r.protocol_type,
        "protocol_name": r.protocol_name,
        "assignment": r.assignment,
    }


async def heartbeat(ctx: KafkaContext, version: int, body: Body) -> Body:
    group = body["group_id"]
    if not _group_allowed(ctx, Operation.READ, group):
        return {"throttle_time_ms": 0, "error_code": int(ErrorCode.GROUP_AUTHORIZATION_FAILED)}
    if _not_here(ctx, group):
        return {"throttle_time_ms": 0, "error_code": int(ErrorCode.NOT_COORDINATOR)}
    error = ctx.broker.kafka_groups.heartbeat(
        group,
        member_id=body["member_id"],
        generation=body["generation_id"],
        group_instance_id=body["group_instance_id"],
    )
    return {"throttle_time_ms": 0, "error_code": _code(error)}


async def leave_group(ctx: KafkaContext, version: int, body: Body) -> Body:
    group = body["group_id"]
    if version >= 3:
        leaving = [(m["member_id"], m["group_instance_id"]) for m in body["members"]]
    else:
        leaving = [(body["member_id"], None)]
    if not _group_allowed(ctx, Operation.READ, group):
        return {
            "throttle_time_ms": 0,
            "error_code": int(ErrorCode.GROUP_AUTHORIZATION_FAILED),
            "members": [],
        }
    if _not_here(ctx, group):
        return {"throttle_time_ms": 0, "error_code": int(ErrorCode.NOT_COORDINATOR), "members": []}
    errors = ctx.broker.kafka_groups.leave(group, leaving)
    members = [
        {"member_id": m, "group_instance_id": i, "error_code": _code(e)}
        for (m, i), e in zip(leaving, errors, strict=True)
    ]
    top = ErrorCode.NONE if version >= 3 else ErrorCode(int(errors[0]))
    return {"throttle_time_ms": 0, "error_code": int(top), "members": members}


# --- offsets ------------------------------------------------------------------------------------


def _storage_error(exc: TidewireError) -> ErrorCode:
    """What a commit the offsets log refused is answered with: retriable when the log is
    only busy."""
    if isinstance(exc, BackpressureError):
        return ErrorCode.COORDINATOR_LOAD_IN_PROGRESS
    return ErrorCode.UNKNOWN_SERVER_ERROR


async def offset_commit(ctx: KafkaContext, version: int, body: Body) -> Body:
    group = body["group_id"]
    node = cluster_node(ctx.broker)
    topics = (
        ctx.broker.topics()
        if node is None
        else {name: info.partitions for name, info in node.cache.topics.items()}
    )
    errors: dict[tuple[str, int], int] = {}
    order: list[tuple[str, int]] = []
    wanted: dict[tuple[str, int], tuple[int, str]] = {}
    for t in body["topics"]:
        name = t["name"]
        for p in t["partitions"]:
            tp = (name, p["partition_index"])
            order.append(tp)
            metadata = p["committed_metadata"] or ""
            if not ctx.allowed(Need(_T, Operation.READ, name)):
                errors[tp] = int(ErrorCode.TOPIC_AUTHORIZATION_FAILED)
            elif not 0 <= tp[1] < topics.get(name, 0):
                errors[tp] = int(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION)
            elif len(metadata) > MAX_METADATA_CHARS:
                errors[tp] = int(ErrorCode.OFFSET_METADATA_TOO_LARGE)
            else:
                wanted[tp] = (p["committed_offset"], metadata)
    group_error: int = 0
    if not _group_allowed(ctx, Operation.READ, group):
        group_error = int(ErrorCode.GROUP_AUTHORIZATION_FAILED)
    elif _not_here(ctx, group):
        group_error = int(ErrorCode.NOT_COORDINATOR)
    else:
        fenced = ctx.broker.kafka_groups.check_commit(
            group,
            member_id=body["member_id"],
            generation=body["generation_id_or_member_epoch"] if version >= 1 else -1,
            group_instance_id=body["group_instance_id"],
        )
        group_error = _code(fenced)
    if group_error:
        errors = dict.fromkeys(order, group_error)
    elif wanted:
        try:
            await ctx.broker.groups.commit_checked(group, wanted)
        except TidewireError as exc:
            errors.update(dict.fromkeys(wanted, int(_storage_error(exc))))
    out: dict[str, list[Body]] = {}
    for tp in dict.fromkeys(order):
        out.setdefault(tp[0], []).append(
            {"partition_index": tp[1], "error_code": errors.get(tp, 0)}
        )
    return {
        "throttle_time_ms": 0,
        "topics": [{"name": n, "partitions": ps} for n, ps in out.items()],
    }


def _fetch_group(ctx: KafkaContext, group: str, topics: list[Body] | None) -> Body:
    """One group's part of an OffsetFetch answer: its committed offsets of ``topics``
    (None: every partition it committed, of the topics the principal may describe)."""
    if not _group_allowed(ctx, Operation.READ, group):
        return {
            "group_id": group,
            "topics": [],
            "error_code": int(ErrorCode.GROUP_AUTHORIZATION_FAILED),
        }
    if _not_here(ctx, group):
        return {"group_id": group, "topics": [], "error_code": int(ErrorCode.NOT_COORDINATOR)}
    committed = ctx.broker.groups.committed(group)
    wanted: list[tuple[str, int]]
    if topics is None:
        wanted = sorted(
            tp for tp in committed if ctx.gate.can(ctx.session, _T, tp[0], Operation.DESCRIBE)
        )
    else:
        wanted = [(t["name"], p) for t in topics for p in t["partition_indexes"]]
    out: dict[str, list[Body]] = {}
    for name, partition in wanted:
        c = committed.get((name, partition))
        entry: Body = {
            "partition_index": partition,
            "committed_offset": -1,
            "committed_leader_epoch": -1,
            "metadata": "",
            "error_code": 0,
        }
        if topics is not None and not ctx.allowed(Need(_T, Operation.READ, name)):
            entry["error_code"] = int(ErrorCode.TOPIC_AUTHORIZATION_FAILED)
        elif c is not None:
            entry.update(committed_offset=c.offset, metadata=c.metadata)
        out.setdefault(name, []).append(entry)
    return {
        "group_id": group,
        "topics": [{"name": n, "partitions": ps} for n, ps in out.items()],
        "error_code": 0,
    }


async def offset_fetch(ctx: KafkaContext, version: int, body: Body) -> Body:
    # require_stable (v7+) needs nothing more: no commit is ever pending (no transactions)
    if version >= 8:
        groups = [_fetch_group(ctx, g["group_id"], g["topics"]) for g in body["groups"]]
        return {"throttle_time_ms": 0, "groups": groups}
    one = _fetch_group(ctx, body["group_id"], body["topics"])
    if one["error_code"] and version < 2:
        # no top-level error before v2: the requested partitions carry it
        one["topics"] = [
            {
                "name": t["name"],
                "partitions": [
                    {
                        "partition_index": p,
                        "committed_offset": -1,
                        "metadata": "",
                        "error_code": one["error_code"],
                    }
                    for p in t["partition_indexes"]
                ],
            }
            for t in body["topics"] or []
        ]
    return {"throttle_time_ms": 0, "topics": one["topics"], "error_code": one["error_code"]}


# --- administration -----------------------------------------------------------------------------

#: The Kafka state names tidewire's own groups are shown with.
_TIDEWIRE_STATES = {
    "empty": KafkaGroupState.EMPTY,
    "rebalancing": KafkaGroupState.PREPARING_REBALANCE,
    "stable": KafkaGroupState.STABLE,
}


def _listing(ctx: KafkaContext) -> list[tuple[str, str, str]]:
    """(group id, protocol type, state) of every group: Kafka clients' groups, tidewire's
    (protocol type ``tidewire``) and groups with only committed offsets (Empty)."""
    b = ctx.broker
    out: dict[str, tuple[str, str, str]] = {}
    for g in b.groups.offsets.groups():
        out[g] = (g, "", str(KafkaGroupState.EMPTY))
    for g in b.groups.coordinator.group_ids():
        state, _, _ = b.groups.coordinator.state(g)
        out[g] = (g, "tidewire", str(_TIDEWIRE_STATES[str(state)]))
    for g in b.kafka_groups.group_ids():
        d = b.kafka_groups.describe(g)
        if d is not None:
            out[g] = (g, d.protocol_type, str(d.state))
    return [out[g] for g in sorted(out)]


async def list_groups(ctx: KafkaContext, version: int, body: Body) -> Body:
    states = {s.lower() for s in body["states_filter"]}
    types = {t.lower() for t in body["types_filter"]}
    groups = [
        {"group_id": g, "protocol_type": ptype, "group_state": state, "group_type": "classic"}
        for g, ptype, state in _listing(ctx)
        if (not states or state.lower() in states)
        and (not types or "classic" in types)
        and ctx.gate.can(ctx.session, _G, g, Operation.DESCRIBE)
    ]
    return {"throttle_time_ms": 0, "error_code": 0, "groups": groups}


def _describe_one(ctx: KafkaContext, group: str) -> Body:
    out: Body = {
        "error_code": 0,
        "group_id": group,
        "group_state": str(KafkaGroupState.DEAD),
        "protocol_type": "",
        "protocol_data": "",
        "members": [],
        "authorized_operations": _NO_OPERATIONS,
    }
    if not _group_allowed(ctx, Operation.DESCRIBE, group):
        out["error_code"] = int(ErrorCode.GROUP_AUTHORIZATION_FAILED)
        return out
    b = ctx.broker
    d = b.kafka_groups.describe(group)
    if d is not None:
        out.update(
            group_state=str(d.state),
            protocol_type=d.protocol_type,
            protocol_data=d.protocol_name,
            members=[
                {
                    "member_id": m.member_id,
                    "group_instance_id": m.group_instance_id,
                    "client_id": m.client_id,
                    "client_host": m.client_host,
                    "member_metadata": m.metadata,
                    "member_assignment": m.assignment,
                }
                for m in d.members
            ],
        )
    elif b.groups.coordinator.has_members(group):
        state, _, strategy = b.groups.coordinator.state(group)
        out.update(
            group_state=str(_TIDEWIRE_STATES[str(state)]),
            protocol_type="tidewire",
            protocol_data="" if strategy is None else str(strategy),
            members=[
                {
                    "member_id": m.member_id,
                    "group_instance_id": m.instance_id or None,
                    "client_id": m.client_id,
                    "client_host": "",
                    "member_metadata": b"",
                    "member_assignment": b"",
                }
                for m in b.groups.coordinator.members(group)
            ],
        )
    elif group in b.groups.offsets.groups():
        out["group_state"] = str(KafkaGroupState.EMPTY)
    return out


async def describe_groups(ctx: KafkaContext, version: int, body: Body) -> Body:
    return {"throttle_time_ms": 0, "groups": [_describe_one(ctx, g) for g in body["groups"]]}


async def delete_groups(ctx: KafkaContext, version: int, body: Body) -> Body:
    results = []
    for group in dict.fromkeys(body["groups_names"]):
        error = ErrorCode.NONE
        if not _group_allowed(ctx, Operation.DELETE, group):
            error = ErrorCode.GROUP_AUTHORIZATION_FAILED
        else:
            try:
                await ctx.broker.groups.delete(group)
            except GroupNotEmptyError:
                error = ErrorCode.NON_EMPTY_GROUP
            except UnknownGroupError:
                error = ErrorCode.GROUP_ID_NOT_FOUND
            except TidewireError as exc:
                error = _storage_error(exc)
        results.append({"group_id": group, "error_code": int(error)})
    return {"throttle_time_ms": 0, "results": results}


#: The group APIs' handlers, by API key (the listener dispatches through these and
#: kafka-core's ``DATA_HANDLERS``).
GROUP_HANDLERS: dict[int, KafkaHandler] = {
    ApiKey.FIND_COORDINATOR: find_coordinator,
    ApiKey.JOIN_GROUP: join_group,
    ApiKey.SYNC_GROUP: sync_group,
    ApiKey.HEARTBEAT: heartbeat,
    ApiKey.LEAVE_GROUP: leave_group,
    ApiKey.OFFSET_COMMIT: offset_commit,
    ApiKey.OFFSET_FETCH: offset_fetch,
    ApiKey.LIST_GROUPS: list_groups,
    ApiKey.DESCRIBE_GROUPS: describe_groups,
    ApiKey.DELETE_GROUPS: delete_groups,
}
