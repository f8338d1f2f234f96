"""What each binary API needs, declared as data: the gate reads this table before a handler
runs, and a test fails for an API without an entry.

An entry is one of:

- :data:`PUBLIC`: no authentication (API_VERSIONS and the SASL exchange itself);
- :data:`AUTHENTICATED`: any authenticated principal; the handler shows only what the
  principal may describe (LIST_TOPICS, LIST_GROUPS, LIST_QUEUES, LIST_EXCHANGES,
  STREAM_LIST) or acts on
  the connection's own state (CREDIT, UNSUBSCRIBE, WHOAMI);
- a function from the decoded request to the permissions it needs, every one required:
  ``[Need(ResourceType.TOPIC, Operation.WRITE, "orders"), ...]``.

A need with ``if_missing`` applies only when that topic does not exist yet (the creation a
first publish or a metadata request with auto_create makes).

A need with ``unless_principal`` does not apply when the request comes from that principal:
a principal lists, creates and revokes its own API keys with authentication alone, while
doing so for another needs alter (describe, to list) on the cluster.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Final

from tidewire.protocol.messages import ApiKey
from tidewire.security.model import CLUSTER_NAME, Operation, ResourceType

__all__ = [
    "API_NEEDS",
    "AUTHENTICATED",
    "DEFAULT_EXCHANGE_ACL_NAME",
    "PUBLIC",
    "Need",
    "Requirement",
]


@dataclass(frozen=True, slots=True)
class Need:
    """One permission: ``operation`` on the ``resource`` named ``name``."""

    resource: ResourceType
    operation: Operation
    name: str = CLUSTER_NAME
    #: Needed only when the topic ``name`` does not exist (auto-creation).
    if_missing: bool = False
    #: Not needed when the requesting principal is this one ("": always needed).
    unless_principal: str = ""

    def applies_to(self, principal: str | None) -> bool:
        """Whether this need applies to a request of ``principal`` (None: anonymous)."""
        return not (self.unless_principal and principal == self.unless_principal)

    def __str__(self) -> str:
        return f"{self.operation} on {self.resource}:{self.name}"


class _Marker:
    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return self.name


PUBLIC: Final = _Marker("PUBLIC")
AUTHENTICATED: Final = _Marker("AUTHENTICATED")
Requirement = _Marker | Callable[[Any], list[Need]]

_T, _G, _C = ResourceType.TOPIC, ResourceType.GROUP, ResourceType.CLUSTER
_Q, _X, _S = ResourceType.QUEUE, ResourceType.EXCHANGE, ResourceType.STREAM
_O = Operation
#: The name ACLs give the default exchange ``""`` (an ACL pattern cannot be empty); the HTTP
#: paths and the CLI spell it so too.
DEFAULT_EXCHANGE_ACL_NAME = "amq.default"


def _topics(op: Operation, names: Iterable[str]) -> list[Need]:
    return [Need(_T, op, t) for t in dict.fromkeys(names)]


def _produce(req: Any) -> list[Need]:
    parts = req.partitions
    if len(parts) == 1:  # the common request: its needs made once per topic
        return list(_produce_one(parts[0].topic))
    names = [p.topic for p in parts]
    return _topics(_O.WRITE, names) + [
        Need(_T, _O.CREATE, t, if_missing=True) for t in dict.fromkeys(names)
    ]


@functools.lru_cache(maxsize=4096)
def _produce_one(topic: str) -> tuple[Need, ...]:
    """What a produce request to one topic needs (Needs are frozen: shared by requests)."""
    return (Need(_T, _O.WRITE, topic), Need(_T, _O.CREATE, topic, if_missing=True))


#: Whose leaders stream clients route by in a cluster (a stream's owner leads its partition):
#: its METADATA is open to every client; its records stay private (see server/gate.py).
_STREAMS_TOPIC: Final = "__streams"

#: Whose leaders group clients route by in a cluster (a group's coordinator leads its
#: partition, as Kafka's FindCoordinator names it): its METADATA is open to every client, since
#: every group request is checked against the group itself; reading it still needs read on it.
_OFFSETS_TOPIC: Final = "__consumer_offsets"

#: A durable queue's topic (the broker's ``QUEUE_TOPIC_PREFIX``): its leader is the queue's
#: owner in a cluster, which a client may look up with the right to describe the queue.
_QUEUE_TOPIC = "__queue."


def _metadata(req: Any) -> list[Need]:
    if not req.topics:
        return []  # every topic: the handler lists those the principal may describe
    queues = [t for t in req.topics if t.startswith(_QUEUE_TOPIC)]
    needs = _topics(
        _O.DESCRIBE,
        [
            t
            for t in req.topics
            if t not in (_STREAMS_TOPIC, _OFFSETS_TOPIC) and not t.startswith(_QUEUE_TOPIC)
        ],
    )
    needs += [Need(_Q, _O.DESCRIBE, t[len(_QUEUE_TOPIC) :]) for t in dict.fromkeys(queues)]
    if req.auto_create:
        needs += [Need(_T, _O.CREATE, t, if_missing=True) for t in dict.fromkeys(req.topics)]
    return needs


def _group(op: Operation) -> Callable[[Any], list[Need]]:
    return lambda req: [Need(_G, op, req.group_id)]


def _join(req: Any) -> list[Need]:
    return [Need(_G, _O.READ, req.group_id), *_topics(_O.DESCRIBE, req.topics)]


def _commit(req: Any) -> list[Need]:
    return [Need(_G, _O.READ, req.group_id), *_topics(_O.READ, (p.topic for p in req.partitions))]


def _offset_fetch(req: Any) -> list[Need]:
    parts = req.partitions or []
    return [Need(_G, _O.DESCRIBE, req.group_id), *_topics(_O.DESCRIBE, (p.topic for p in parts))]


def _reset(req: Any) -> list[Need]:
    return [Need(_G, _O.ALTER, req.group_id), Need(_T, _O.DESCRIBE, req.topic)]


def _producer_state(req: Any) -> list[Need]:
    return _topics(_O.WRITE, (p.topic for p in req.partitions))


def _cluster(op: Operation) -> Callable[[Any], list[Need]]:
    return lambda req: [Need(_C, op)]


def _describe_principals(req: Any) -> list[Need]:
    # Describing oneself alone (one's keys: ``tidewire key list ME``) needs no permission.
    own = req.names[0] if req.names is not None and len(req.names) == 1 else ""
    return [Need(_C, _O.DESCRIBE, unless_principal=own)]


def _exchange(name: str) -> str:
    return name or DEFAULT_EXCHANGE_ACL_NAME


def _declare(resource: ResourceType) -> Callable[[Any], list[Need]]:
    # A passive declare only asks whether it exists: describe is enough.
    return lambda req: [Need(resource, _O.DESCRIBE if req.passive else _O.CREATE, req.name)]


def _queue(op: Operation) -> Callable[[Any], list[Need]]:
    return lambda req: [Need(_Q, op, req.queue)]


def _queue_delete(req: Any) -> list[Need]:
    # A queue's owner asking the definitions' leader to drop its unused auto_delete queue
    # is the cluster's own request (as a replica's fetch): the node principal needs no
    # delete on queues, and what it may delete so is checked by the receiving node.
    if req.auto_delete_by >= 0:
        return [Need(_C, _O.CLUSTER_ACTION)]
    return [Need(_Q, _O.DELETE, req.name)]


def _bind(req: Any) -> list[Need]:
    # Messages of the exchange go to the destination: write on the exchange, and read on a
    # queue (the binding makes it take them) or write on a topic (they are appended to it).
    if req.destination_kind == "topic":
        dest = Need(_T, _O.WRITE, req.destination)
    else:
        dest = Need(_Q, _O.READ, req.destination)
    return [Need(_X, _O.WRITE, _exchange(req.exchange)), dest]


def _replay(req: Any) -> list[Need]:
    # The targets are named by the messages (their x-death header), not by the request:
    # writing to every queue is asked for.
    return [Need(_Q, _O.READ, req.queue), Need(_Q, _O.WRITE, "*")]


def _streams(op: Operation, names: Iterable[str]) -> list[Need]:
    return [Need(_S, op, s) for s in dict.fromkeys(names)]


class StreamNeeds:
    """The requirement of a stream API: ``op`` on each distinct stream ``names(req)``
    gives. It names no topic, so with authentication off there is nothing to check and the
    gate does not build it (a send of 10,000 streams would make 10,000 needs for nothing)."""

    def __init__(self, op: Operation, names: Callable[[Any], Iterable[str]]) -> None:
        self.op = op
        self.names = names

    def __call__(self, req: Any) -> list[Need]:
        return _streams(self.op, self.names(req))


def _stream_describe(req: Any) -> list[Need]:
    # No stream named: the counts over every stream, which are the cluster's.
    return [Need(_S, _O.DESCRIBE, req.stream)] if req.stream else [Need(_C, _O.DESCRIBE)]


#: Every binary API's requirement (see the module docstring).
API_NEEDS: dict[ApiKey, Requirement] = {
    ApiKey.API_VERSIONS: PUBLIC,
    ApiKey.SASL_HANDSHAKE: PUBLIC,
    ApiKey.SASL_AUTHENTICATE: PUBLIC,
    ApiKey.WHOAMI: AUTHENTICATED,
    ApiKey.PING: lambda req: [Need(_C, _O.DESCRIBE)],
    ApiKey.METADATA: _metadata,
    ApiKey.CREATE_TOPIC: lambda req: [Need(_T, _O.CREATE, req.name)],
    ApiKey.DELETE_TOPIC: lambda req: [Need(_T, _O.DELETE, req.name)],
    ApiKey.LIST_TOPICS: AUTHENTICATED,
    ApiKey.DESCRIBE_TOPIC: lambda req: [Need(_T, _O.DESCRIBE, req.name)],
    ApiKey.ALTER_TOPIC: lambda req: [Need(_T, _O.ALTER, req.name)],
    ApiKey.REPAIR_TOPIC: lambda req: [Need(_T, _O.ALTER, req.name), Need(_C, _O.ADMIN)],
    ApiKey.PRODUCE: _produce,
    ApiKey.FETCH: lambda req: _topics(_O.READ, (p.topic for p in req.partitions)),
    ApiKey.LIST_OFFSETS: lambda req: _topics(_O.DESCRIBE, (p.topic for p in req.partitions)),
    # Producer ids are the cluster's to hand out (Kafka: IdempotentWrite on the cluster).
    ApiKey.INIT_PRODUCER_ID: lambda req: [Need(_C, _O.WRITE)],
    ApiKey.PRODUCER_STATE: _producer_state,
    ApiKey.RELEASE_WRITERS: lambda req: [Need(_C, _O.WRITE)],
    ApiKey.JOIN_GROUP: _join,
    ApiKey.HEARTBEAT: _group(_O.READ),
    ApiKey.LEAVE_GROUP: _group(_O.READ),
    ApiKey.OFFSET_COMMIT: _commit,
    ApiKey.OFFSET_FETCH: _offset_fetch,
    ApiKey.LIST_GROUPS: AUTHENTICATED,
    ApiKey.DESCRIBE_GROUP: _group(_O.DESCRIBE),
    ApiKey.DELETE_GROUP: _group(_O.DELETE),
    ApiKey.RESET_OFFSETS: _reset,
    ApiKey.SUBSCRIBE: lambda req: _topics(_O.READ, (p.topic for p in req.partitions)),
    ApiKey.CREDIT: AUTHENTICATED,
    ApiKey.UNSUBSCRIBE: AUTHENTICATED,
    # Security administration: changes need alter on the cluster, reading needs describe;
    # a principal's own keys need authentication alone (the handler of REVOKE_API_KEY checks
    # that the key is the named principal's).
    ApiKey.CREATE_PRINCIPAL: _cluster(_O.ALTER),
    ApiKey.DELETE_PRINCIPAL: _cluster(_O.ALTER),
    ApiKey.DESCRIBE_PRINCIPALS: _describe_principals,
    ApiKey.ALTER_PRINCIPAL: _cluster(_O.ALTER),
    ApiKey.CREATE_API_KEY: lambda req: [Need(_C, _O.ALTER, unless_principal=req.principal)],
    ApiKey.REVOKE_API_KEY: lambda req: [Need(_C, _O.ALTER, unless_principal=req.principal)],
    ApiKey.ALTER_ACLS: _cluster(_O.ALTER),
    ApiKey.DESCRIBE_ACLS: _cluster(_O.DESCRIBE),
    ApiKey.ALTER_QUOTAS: _cluster(_O.ALTER),
    ApiKey.DESCRIBE_QUOTAS: _cluster(_O.DESCRIBE),
    # Who did what: for administrators (admin on the cluster), not every viewer.
    # A node reading other nodes' audit logs from this one's replicas: the nodes' identity.
    ApiKey.DESCRIBE_AUDIT: lambda req: [
        Need(_C, _O.CLUSTER_ACTION if req.nodes is not None else _O.ADMIN)
    ],
    # Queues and exchanges. The listings show what the principal may describe.
    ApiKey.EXCHANGE_DECLARE: _declare(_X),
    ApiKey.EXCHANGE_DELETE: lambda req: [Need(_X, _O.DELETE, _exchange(req.name))],
    ApiKey.QUEUE_DECLARE: _declare(_Q),
    ApiKey.QUEUE_DELETE: _queue_delete,
    ApiKey.QUEUE_PURGE: lambda req: [Need(_Q, _O.DELETE, req.name)],
    ApiKey.QUEUE_BIND: _bind,
    ApiKey.QUEUE_UNBIND: _bind,
    ApiKey.LIST_QUEUES: AUTHENTICATED,
    ApiKey.LIST_EXCHANGES: AUTHENTICATED,
    ApiKey.QUEUE_PUBLISH: lambda req: [Need(_X, _O.WRITE, _exchange(req.exchange))],
    ApiKey.QUEUE_CONSUME: _queue(_O.READ),
    ApiKey.QUEUE_CANCEL: _queue(_O.READ),
    ApiKey.QUEUE_GET: _queue(_O.READ),
    ApiKey.QUEUE_SETTLE: _queue(_O.READ),
    ApiKey.QUEUE_BROWSE: _queue(_O.READ),
    ApiKey.QUEUE_REPLAY: _replay,
    # Lightweight streams, by stream id: one stream denied denies the whole request.
    ApiKey.STREAM_SEND: StreamNeeds(_O.WRITE, lambda req: (i.stream for i in req.items)),
    ApiKey.STREAM_RECEIVE: StreamNeeds(_O.READ, lambda req: req.streams),
    ApiKey.STREAM_READ: StreamNeeds(_O.READ, lambda req: req.positions),
    ApiKey.STREAM_LIST: AUTHENTICATED,
    ApiKey.STREAM_DESCRIBE: _stream_describe,
    # A follower node copying a leader's log: the nodes' own identity only.
    ApiKey.REPLICA_FETCH: _cluster(_O.CLUSTER_ACTION),
    # The msgbus mode's pop (a read and a commit of the group's offset, as FETCH then
    # OFFSET_COMMIT would need).
    ApiKey.TAKE: lambda req: [Need(_T, _O.READ, req.topic), Need(_G, _O.READ, req.group)],
    # An HTTP API publish forwarded to the leader (as PRODUCE; a cluster never makes a topic
    # on first publish, so no create).
    ApiKey.HTTP_PUBLISH: lambda req: [Need(_T, _O.WRITE, req.topic)],
    # A cluster's figures: describe on the cluster; a node asking another for its own
    # figures (``local``): the nodes' identity.
    ApiKey.CLUSTER_METRICS: lambda req: [Need(_C, _O.CLUSTER_ACTION if req.local else _O.DESCRIBE)],
    # A request forwarded by a node on behalf of its caller: the nodes' identity only (the
    # inner request is then checked as the caller it carries, see server/envelope.py).
    ApiKey.ENVELOPE: _cluster(_O.CLUSTER_ACTION),
    # A cluster topic's replicas and settings (Kafka: ALTER on the cluster to reassign);
    # only the status asked: describe on the topic.
    ApiKey.ALTER_REPLICATION: lambda req: (
        [Need(_T, _O.ALTER, req.topic), Need(_C, _O.ALTER)]
        if req.assignments
        or req.cancel
        or req.replication_factor is not None
        or req.min_insync_replicas is not None
        or req.unclean_leader_election is not None
        else [Need(_T, _O.DESCRIBE, req.topic)]
    ),
}
