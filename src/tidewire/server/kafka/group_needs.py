"""What each Kafka group API needs, declared as data (:data:`GROUP_NEEDS`), in the
vocabulary of :mod:`tidewire.server.needs`; the listener asks the gate about each need and
the handlers (:mod:`.groups`) answer the denied resources with their authorization error.

As Kafka's: JoinGroup, SyncGroup, Heartbeat, LeaveGroup -> READ on the group; OffsetCommit
and OffsetFetch -> READ on the group and on each topic named; FindCoordinator and
DescribeGroups -> DESCRIBE on the group; DeleteGroups -> DELETE on the group; ListGroups ->
authenticated, showing only the groups the principal may describe.

The request bodies hold every field of the newest schema (fields a version lacks have their
defaults), so a function reads both the old and the new shape of a request (OffsetFetch's
``group_id`` before v8, its ``groups`` from v8; FindCoordinator's ``key`` or
``coordinator_keys``).
"""

from __future__ import annotations

from typing import Any

from tidewire.protocol.kafka import ApiKey
from tidewire.security.model import Operation, ResourceType
from tidewire.server.needs import AUTHENTICATED, Need, Requirement

__all__ = ["GROUP_NEEDS"]

_G, _T = ResourceType.GROUP, ResourceType.TOPIC
_O = Operation
Body = dict[str, Any]


def _group(op: Operation) -> Requirement:
    return lambda body: [Need(_G, op, body["group_id"])]


def _find_coordinator(body: Body) -> list[Need]:
    if body["key_type"] != 0:  # a transaction coordinator: answered with an error
        return []
    keys = [body["key"], *body["coordinator_keys"]]
    return [Need(_G, _O.DESCRIBE, k) for k in dict.fromkeys(keys) if k]


def _offset_commit(body: Body) -> list[Need]:
    topics = dict.fromkeys(t["name"] for t in body["topics"])
    return [Need(_G, _O.READ, body["group_id"])] + [Need(_T, _O.READ, t) for t in topics]


def _offset_fetch(body: Body) -> list[Need]:
    groups = [(body["group_id"], body["topics"])] if body["group_id"] else []
    groups += [(g["group_id"], g["topics"]) for g in body["groups"]]
    needs = [Need(_G, _O.READ, g) for g, _ in groups]
    for _, topics in groups:
        needs += [Need(_T, _O.READ, t["name"]) for t in topics or []]
    return list(dict.fromkeys(needs))


def _groups(op: Operation, field: str) -> Requirement:
    return lambda body: [Need(_G, op, g) for g in dict.fromkeys(body[field])]


GROUP_NEEDS: dict[int, Requirement] = {
    ApiKey.FIND_COORDINATOR: _find_coordinator,
    ApiKey.JOIN_GROUP: _group(_O.READ),
    ApiKey.SYNC_GROUP: _group(_O.READ),
    ApiKey.HEARTBEAT: _group(_O.READ),
    ApiKey.LEAVE_GROUP: _group(_O.READ),
    ApiKey.OFFSET_COMMIT: _offset_commit,
    ApiKey.OFFSET_FETCH: _offset_fetch,
    ApiKey.LIST_GROUPS: AUTHENTICATED,
    ApiKey.DESCRIBE_GROUPS: _groups(_O.DESCRIBE, "groups"),
    ApiKey.DELETE_GROUPS: _groups(_O.DELETE, "groups_names"),
}
