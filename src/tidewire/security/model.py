"""What security state is made of: principals, their API keys, ACLs, roles and quotas.

An ACL says: a principal (``alice``), a role (``role:producer``) or anyone (``*``) may
(``allow``) or may not (``deny``) do an operation on the resources of one type whose names
match a pattern (literal, or a prefix). Deny wins; without an allow, a request is refused.
"""

from __future__ import annotations

import enum
import re

import msgspec

from tidewire.errors import InvalidRequestError

__all__ = [
    "BUILTIN_ROLES",
    "IMPLIES_DESCRIBE",
    "Acl",
    "Effect",
    "KeyRecord",
    "Operation",
    "PatternType",
    "Principal",
    "QuotaRecord",
    "ResourceType",
    "check_principal_name",
]


class ResourceType(enum.StrEnum):
    TOPIC = "topic"
    GROUP = "group"
    CLUSTER = "cluster"
    QUEUE = "queue"
    EXCHANGE = "exchange"
    STREAM = "stream"


class Operation(enum.StrEnum):
    READ = "read"
    WRITE = "write"
    CREATE = "create"
    DELETE = "delete"
    DESCRIBE = "describe"
    ALTER = "alter"
    ADMIN = "admin"
    #: What nodes of a cluster do to each other (copying a leader's log: REPLICA_FETCH); on
    #: the cluster resource, granted to the nodes' own identity (Kafka's ClusterAction).
    CLUSTER_ACTION = "cluster_action"
    #: Every operation (in an ACL only).
    ALL = "all"


class PatternType(enum.StrEnum):
    LITERAL = "literal"
    PREFIX = "prefix"


class Effect(enum.StrEnum):
    ALLOW = "allow"
    DENY = "deny"


#: As in Kafka: being allowed to read, write, create, delete or alter a resource lets a
#: principal describe it too.
IMPLIES_DESCRIBE = frozenset(
    {Operation.READ, Operation.WRITE, Operation.CREATE, Operation.DELETE, Operation.ALTER}
)

#: The name of the one cluster resource.
CLUSTER_NAME = "cluster"

_NAME_RE = re.compile(r"[A-Za-z0-9._@:=+-]{1,128}")


def check_principal_name(name: str) -> str:
    """``name`` if it may name a principal.

    Raises:
        InvalidRequestError: it may not (the message says what is allowed).
    """
    if not _NAME_RE.fullmatch(name) or name.startswith("role:") or name == "*":
        raise InvalidRequestError(
            f"principal name {name!r} is not allowed: 1..128 of A-Z a-z 0-9 . _ @ : = + -, "
            "not '*' and not beginning with 'role:'"
        )
    return name


class Acl(msgspec.Struct, frozen=True, kw_only=True):
    """One ACL entry."""

    principal: str
    resource_type: ResourceType
    pattern: str
    pattern_type: PatternType = PatternType.LITERAL
    operation: Operation
    effect: Effect = Effect.ALLOW

    def check(self) -> Acl:
        """This entry if it is well formed.

        Raises:
            InvalidRequestError: a malformed principal or pattern.
        """
        p = self.principal
        if p != "*":
            check_principal_name(p.removeprefix("role:"))
        if not self.pattern or len(self.pattern) > 255:
            raise InvalidRequestError(
                f"ACL pattern {self.pattern!r} must be 1..255 characters ('*': every name)"
            )
        if self.resource_type is ResourceType.CLUSTER and self.pattern not in ("*", CLUSTER_NAME):
            raise InvalidRequestError(
                f"a cluster ACL's pattern is 'cluster' or '*', not {self.pattern!r}"
            )
        return self

    def matches(self, resource_type: ResourceType, name: str) -> bool:
        """Whether this entry's resource pattern covers ``resource_type`` ``name``."""
        if resource_type is not self.resource_type:
            return False
        if self.pattern == "*" and self.pattern_type is PatternType.LITERAL:
            return True
        if self.pattern_type is PatternType.PREFIX:
            return name.startswith(self.pattern)
        return name == self.pattern

    def covers(self, op: Operation) -> bool:
        """Whether this entry's operation covers ``op``."""
        if self.operation is Operation.ALL or self.operation is op:
            return True
        # An allow of read/write/... implies describe; a deny of them does not deny it.
        return (
            op is Operation.DESCRIBE
            and self.effect is Effect.ALLOW
            and self.operation in IMPLIES_DESCRIBE
        )

    def describe(self) -> str:
        kind = "prefix " if self.pattern_type is PatternType.PREFIX else ""
        return (
            f"{self.effect} {self.principal} {self.operation} on "
            f"{self.resource_type}:{kind}{self.pattern}"
        )


def _every(rtype: ResourceType, *ops: Operation) -> tuple[tuple[ResourceType, Operation], ...]:
    return tuple((rtype, op) for op in ops)


_R, _O = ResourceType, Operation
#: Built-in roles: what each may do, on every resource of a type.
BUILTIN_ROLES: dict[str, tuple[tuple[ResourceType, Operation], ...]] = {
    "admin": tuple((rt, _O.ALL) for rt in _R),
    "producer": (
        *_every(_R.TOPIC, _O.WRITE, _O.DESCRIBE, _O.CREATE),
        *_every(_R.EXCHANGE, _O.WRITE, _O.DESCRIBE),
        *_every(_R.QUEUE, _O.WRITE, _O.DESCRIBE),
        *_every(_R.STREAM, _O.WRITE, _O.DESCRIBE),
        # Producer ids (idempotent producers, the default) are the cluster's to hand out.
        (_R.CLUSTER, _O.WRITE),
        (_R.CLUSTER, _O.DESCRIBE),
    ),
    "consumer": (
        *_every(_R.TOPIC, _O.READ, _O.DESCRIBE),
        *_every(_R.GROUP, _O.READ, _O.DESCRIBE),
        *_every(_R.QUEUE, _O.READ, _O.DESCRIBE),
        *_every(_R.STREAM, _O.READ, _O.DESCRIBE),
        (_R.CLUSTER, _O.DESCRIBE),
    ),
    "viewer": tuple((rt, _O.DESCRIBE) for rt in _R),
    # The nodes' own identity in a cluster (docs/cluster.md, "Security"): copying leaders'
    # logs, and what a node asks of the others on behalf of a caller its own gate let
    # through (reads and streams of partitions led elsewhere, msgbus pops taken by the
    # leader, group members whose coordinator is elsewhere, publishes forwarded to a leader
    # or a queue's owner, a queue's WebSocket consumer at its owner, stream requests
    # forwarded to their owner), and what it asks for queues it serves or lists: their
    # owners' counts (LIST_QUEUES shows the queues it may describe) and, for an
    # ``auto_delete`` queue whose last consumer left it, the delete at the leader of the
    # definitions: a cluster's own request (``cluster_action``; the leader checks that the
    # queue is such a queue, unused, of the asking owner), so no ``delete`` on queues.
    # Nothing else that changes definitions or security.
    # ``alter`` on groups is for an HTTP group reset forwarded to the coordinator (its
    # caller's ``alter`` checked where it arrived): no real power beyond ``read``, with
    # which the node may already commit any offsets of any group.
    "node": (
        (_R.CLUSTER, _O.CLUSTER_ACTION),
        *_every(_R.TOPIC, _O.READ, _O.WRITE, _O.DESCRIBE),
        *_every(_R.GROUP, _O.READ, _O.DESCRIBE, _O.ALTER),
        *_every(_R.STREAM, _O.READ, _O.WRITE, _O.DESCRIBE),
        (_R.EXCHANGE, _O.WRITE),
        *_every(_R.QUEUE, _O.READ, _O.DESCRIBE),
    ),
}


class Principal(msgspec.Struct, frozen=True, kw_only=True):
    """A user or a service account."""

    name: str
    kind: str = "user"  # "user" or "service"
    roles: tuple[str, ...] = ()
    created_ms: int = 0
    description: str = ""


class KeyRecord(msgspec.Struct, frozen=True, kw_only=True):
    """One API key: never the secret, only its scrypt hash and SCRAM credentials."""

    id: str
    principal: str
    created_ms: int
    expires_ms: int = 0  # 0: never
    revoked_ms: int = 0  # 0: not revoked
    description: str = ""
    secret_hash: str = ""
    #: mechanism -> [salt, iterations, stored_key, server_key] (bytes as base64)
    scram: dict[str, tuple[str, int, str, str]] = {}

    def usable(self, now_ms: int) -> bool:
        return not self.revoked_ms and (not self.expires_ms or now_ms < self.expires_ms)

    def state(self, now_ms: int) -> str:
        if self.revoked_ms:
            return "revoked"
        if self.expires_ms and now_ms >= self.expires_ms:
            return "expired"
        return "active"


class QuotaRecord(msgspec.Struct, frozen=True, kw_only=True):
    """A principal's own quotas (0: none; -1: the broker's default)."""

    principal: str
    produce_bytes_per_s: int = -1
    fetch_bytes_per_s: int = -1
    requests_per_s: int = -1
