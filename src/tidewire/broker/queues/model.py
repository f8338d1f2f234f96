"""What queues, exchanges and bindings are, as values: their settings, what a publish
returns, what a delivery carries, a queue's counters (pure: no I/O, no clock).

Names: a queue or exchange name is 1..200 characters of ``A-Z a-z 0-9 . _ - : /``; names
beginning with ``amq.`` or ``__`` are the broker's. The default exchange is ``""``: every
queue is bound to it by its own name, and nothing else can be bound to it.

A message published to an exchange is a record of a record batch (the format of topics);
its record key is its routing key, its headers are its headers. Dead-lettering adds a
``x-death`` header (JSON, see :data:`DEATH_HEADER`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Literal

from tidewire.errors import InvalidQueueError

__all__ = [
    "DEATH_HEADER",
    "DEFAULT_EXCHANGE",
    "EXCHANGE_TYPES",
    "OVERFLOW_POLICIES",
    "Binding",
    "Delivery",
    "DeliveryEntry",
    "ExchangeSpec",
    "PublishResult",
    "QueueCounters",
    "QueueSpec",
    "QueueStatus",
    "SettleOutcome",
    "check_name",
]

#: The exchange every queue is bound to by its name.
DEFAULT_EXCHANGE = ""
EXCHANGE_TYPES = ("direct", "fanout", "topic", "headers")
OVERFLOW_POLICIES = ("reject-publish", "drop-head")
#: Header added by dead-lettering: JSON list, newest first, of
#: ``{"queue", "reason", "count", "exchange", "routing_key", "time_ms"}``; ``reason`` is
#: ``rejected``, ``expired``, ``maxlen`` or ``delivery_limit`` (RabbitMQ's ``x-death``).
DEATH_HEADER = "x-death"
#: Longest name (characters): room for the ``__queue.`` prefix within a topic name.
MAX_NAME = 200

_NAME = re.compile(r"[A-Za-z0-9._\-:/]{1,200}")

SettleOutcome = Literal["ack", "requeue", "dead-letter"]
DestinationKind = Literal["queue", "topic"]


def check_name(kind: str, name: str, *, reserved_ok: bool = False) -> None:
    """Refuse a queue or exchange name that is not allowed.

    Raises:
        InvalidQueueError: naming the rule broken.
    """
    if not _NAME.fullmatch(name):
        raise InvalidQueueError(
            f"{kind} name {name!r}: 1 to {MAX_NAME} characters of A-Z a-z 0-9 . _ - : /"
        )
    if not reserved_ok and name.startswith(("amq.", "__")):
        raise InvalidQueueError(f"{kind} name {name!r}: names beginning amq. or __ are reserved")


@dataclass(frozen=True, slots=True)
class ExchangeSpec:
    """An exchange: how it routes, whether it survives a restart, where unroutable messages
    go (an alternate exchange's name, or "" for none)."""

    name: str
    type: str = "direct"  # one of EXCHANGE_TYPES
    durable: bool = True
    alternate_exchange: str = ""


@dataclass(frozen=True, slots=True)
class QueueSpec:
    """A queue's settings. 0 means "no limit" / "none" for every number.

    Attributes:
        durable: messages in a log, definitions and state surviving restarts and crashes;
            else memory only.
        exclusive: (transient only) used only from the connection that declared it, and
            deleted when it closes.
        auto_delete: deleted when its last consumer leaves (after having had one).
        max_deliveries: deliveries after which a message is dead-lettered instead of
            redelivered (``delivery_limit``).
        message_ttl_ms: messages older than this are never delivered (``expired``).
        max_length, max_length_bytes: ready messages (and their bytes) at most.
        overflow: ``reject-publish`` (refuse the publish: QueueFullError) or ``drop-head``
            (dead-letter the oldest, ``maxlen``).
        dead_letter_exchange: where dead letters go ("" with no
            ``dead_letter_exchange_set``: dropped, counted).
        dead_letter_routing_key: their routing key ("": the message's own).
        visibility_timeout_ms: a delivery not settled in this time is taken back and
            redelivered (0: held until its consumer or connection goes).
    """

    name: str
    durable: bool = True
    exclusive: bool = False
    auto_delete: bool = False
    max_deliveries: int = 0
    message_ttl_ms: int = 0
    max_length: int = 0
    max_length_bytes: int = 0
    overflow: str = "reject-publish"
    dead_letter_exchange: str | None = None  # None: no dead-lettering; "" the default one
    dead_letter_routing_key: str = ""
    visibility_timeout_ms: int = 0


@dataclass(frozen=True, slots=True)
class Binding:
    """A binding from an exchange to a queue or a topic.

    ``key`` is the binding key (direct: equal to the routing key; topic: a pattern with
    ``*`` and ``#``; fanout: ignored). ``arguments`` (headers exchange): ``x-match`` ``all``
    (the default) or ``any``, and header name -> value pairs to match.
    """

    exchange: str
    destination: str
    destination_kind: DestinationKind = "queue"
    key: str = ""
    arguments: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True, slots=True)
class PublishResult:
    """Where a publish went. ``queues`` and ``topics`` it was stored in (a topic as
    ``(name, partition, base_offset)``); ``unroutable``: it went nowhere (and was dropped:
    not mandatory)."""

    queues: tuple[str, ...] = ()
    topics: tuple[tuple[str, int, int], ...] = ()
    unroutable: bool = False


@dataclass(frozen=True, slots=True)
class DeliveryEntry:
    """One message handed to a consumer: its tag (unique in its queue while the broker
    runs), its offset in the queue's log (the record's offset in ``Delivery.data``), and
    how many times it has been delivered, this one included (1: first delivery)."""

    tag: int
    offset: int
    delivery_count: int


@dataclass(frozen=True, slots=True)
class Delivery:
    """Messages handed to one consumer (or one get) at once.

    ``data`` is whole record batches (as stored) holding every entry's offset; records in
    it without an entry are not part of this delivery and must be skipped.
    """

    queue: str
    consumer: str  # the consumer's tag; "" for a get
    entries: tuple[DeliveryEntry, ...]
    data: bytes


@dataclass(slots=True)
class QueueCounters:
    """Since the broker started (or the queue was made): messages per fate."""

    published: int = 0
    delivered: int = 0
    acked: int = 0
    redelivered: int = 0
    dead_lettered: int = 0
    expired: int = 0
    dropped: int = 0  # overflow drop-head, or dead letters without a dead-letter exchange
    rejected_publishes: int = 0  # publishes refused by reject-publish


@dataclass(frozen=True, slots=True)
class QueueStatus:
    """A queue as described: its spec, its messages now, its consumers and counters."""

    spec: QueueSpec
    ready: int  # deliverable now
    unacked: int  # delivered, not settled
    delayed: int  # not yet due
    bytes: int  # stored bytes of ready + unacked + delayed (batches divided over records)
    consumers: int
    counters: QueueCounters = field(default_factory=QueueCounters)
