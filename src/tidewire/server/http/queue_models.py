"""The request and response documents of the queue and exchange routes (``/v1/exchanges``,
``/v1/queues``, ``/v1/bindings``): pydantic v2 models, as in models.py.

The default exchange is named ``""``; a path spells it ``amq.default`` (a path segment cannot
be empty), and so may a body's exchange fields. Payloads travel as in models.py: UTF-8 text,
or base64 with ``encoding: "base64"``.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from tidewire.broker.queues.model import MAX_NAME

__all__ = [
    "DEFAULT_HTTP_VISIBILITY_MS",
    "MAX_GET_MESSAGES",
    "MAX_GET_WAIT_MS",
    "BindingInfo",
    "BindingList",
    "BindingRequest",
    "BrowseResult",
    "BrowsedMessage",
    "ExchangeDeclareRequest",
    "ExchangeDescription",
    "ExchangeInfo",
    "ExchangeList",
    "GetRequest",
    "GetResult",
    "MessageCount",
    "QueueCountersDoc",
    "QueueDeclareRequest",
    "QueueInfo",
    "QueueList",
    "QueueMessage",
    "QueuePublishMessage",
    "QueuePublishRequest",
    "QueuePublishResult",
    "ReplayRequest",
    "SettleRequest",
    "SettleResult",
    "TopicPlacement",
]

#: The most messages one get asks for: what one answer of about a megabyte holds for 1 KB
#: messages, and a bound on what one request holds under its visibility timeout.
MAX_GET_MESSAGES = 1_000
#: The longest a get waits for a first message: the broker's longest long-poll.
MAX_GET_WAIT_MS = 3_600_000
#: A get's visibility timeout when the request names none: an HTTP client that never
#: settles (it crashed, or forgot) gets its messages redelivered after this long.
DEFAULT_HTTP_VISIBILITY_MS = 30_000
#: The most messages one publish carries (as a topic's batch publish).
MAX_PUBLISH_MESSAGES = 100_000
#: The most tags one ack, nack or reject names.
MAX_SETTLE_TAGS = 100_000
#: The most offsets one replay names.
MAX_REPLAY_OFFSETS = 100_000

_I64 = 2**63 - 1
_I31 = 2**31 - 1

Encoding = Literal["utf-8", "base64"]
Name = Annotated[str, Field(max_length=MAX_NAME + 20)]
ExchangeType = Literal["direct", "fanout", "topic", "headers"]
Count = Annotated[int, Field(ge=0, le=_I64)]
Ms = Annotated[int, Field(ge=0, le=_I64)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


# --- exchanges and bindings ----------------------------------------------------------------------


class ExchangeDeclareRequest(_Strict):
    """An exchange's settings (its name is the path's). Declaring an exchange that exists
    with the same settings changes nothing; with other settings it is refused (409)."""

    type: ExchangeType = Field(
        default="direct",
        description="direct (routing key = binding key), fanout (every binding), topic "
        "(dot-separated words; * one word, # zero or more) or headers (x-match all/any).",
    )
    durable: bool = Field(default=True, description="Kept across restarts.")
    alternate_exchange: Name = Field(
        default="",
        description="Where messages no binding routes go (empty: none).",
    )


class ExchangeInfo(BaseModel):
    name: str = Field(description='"" is the default exchange (amq.default in paths).')
    type: str
    durable: bool
    alternate_exchange: str


class ExchangeList(BaseModel):
    exchanges: list[ExchangeInfo]


class BindingInfo(BaseModel):
    exchange: str
    destination: str
    destination_kind: Literal["queue", "topic"]
    key: str = Field(description="The binding key (a pattern for topic exchanges).")
    arguments: dict[str, str] = Field(
        description="Headers exchanges: x-match (all or any) and header name -> value."
    )


class ExchangeDescription(ExchangeInfo):
    bindings: list[BindingInfo] = Field(description="The bindings from this exchange.")


class BindingList(BaseModel):
    bindings: list[BindingInfo]


class BindingRequest(_Strict):
    """A binding from an exchange to a queue or a topic (creating one that exists, or
    removing one that does not, changes nothing)."""

    exchange: Name
    destination: Name = Field(description="The queue's (or topic's) name.")
    destination_kind: Literal["queue", "topic"] = "queue"
    key: Annotated[str, Field(max_length=65_536)] = ""
    arguments: dict[str, str] = Field(
        default_factory=dict,
        max_length=1_000,
        description="Headers exchanges: x-match (all, the default, or any) and header "
        "name -> value pairs to match.",
    )


# --- queues --------------------------------------------------------------------------------------


class QueueDeclareRequest(_Strict):
    """A queue's settings (its name is the path's); 0 means none / no limit. Declaring a
    queue that exists with the same settings changes nothing; with other settings it is
    refused (409). Exclusive queues belong to one connection and cannot be declared over
    HTTP (use the binary protocol)."""

    durable: bool = Field(default=True, description="Messages survive restarts and crashes.")
    exclusive: bool = Field(default=False, description="Refused over HTTP (400).")
    auto_delete: bool = Field(default=False, description="Deleted when its last consumer leaves.")
    max_deliveries: Count = Field(
        default=0, description="Deliveries after which a message is dead-lettered."
    )
    message_ttl_ms: Ms = Field(default=0, description="Messages older are never delivered.")
    max_length: Count = Field(default=0, description="Ready messages at most.")
    max_length_bytes: Count = Field(default=0, description="Bytes of ready messages at most.")
    overflow: Literal["reject-publish", "drop-head"] = Field(
        default="reject-publish",
        description="At a limit: refuse the publish (429), or dead-letter the oldest.",
    )
    dead_letter_exchange: Name | None = Field(
        default=None,
        description='Where dead letters go (null: dropped and counted; "" or amq.default: '
        "the default exchange).",
    )
    dead_letter_routing_key: Annotated[str, Field(max_length=65_536)] = Field(
        default="", description="Their routing key (empty: the message's own)."
    )
    visibility_timeout_ms: Ms = Field(
        default=0,
        description="A delivery not settled in this time is redelivered (0: held until its "
        "consumer or connection goes).",
    )


class QueueCountersDoc(BaseModel):
    """Since the broker started (or the queue was made)."""

    published: int
    delivered: int
    acked: int
    redelivered: int
    dead_lettered: int
    expired: int
    dropped: int = Field(description="Dropped by drop-head, or dead letters with nowhere to go.")
    rejected_publishes: int = Field(description="Publishes refused by reject-publish.")


class QueueInfo(BaseModel):
    name: str
    durable: bool
    exclusive: bool
    auto_delete: bool
    max_deliveries: int
    message_ttl_ms: int
    max_length: int
    max_length_bytes: int
    overflow: str
    dead_letter_exchange: str | None
    dead_letter_routing_key: str
    visibility_timeout_ms: int
    ready: int = Field(description="Messages deliverable now.")
    unacked: int = Field(description="Delivered, not settled.")
    delayed: int = Field(description="Not yet due.")
    bytes: int = Field(description="Stored bytes of ready, unacked and delayed messages.")
    consumers: int
    counters: QueueCountersDoc


class QueueList(BaseModel):
    queues: list[QueueInfo]
    total: int = Field(description="Queues that match the filter, over every page.")
    next: int | None = Field(description="The offset of the next page; null: this is the last.")


class MessageCount(BaseModel):
    queue: str
    messages: int = Field(description="Messages removed (or moved, for a replay).")


# --- publishing ----------------------------------------------------------------------------------


class QueuePublishMessage(_Strict):
    value: Annotated[str, Field(max_length=2**30)] | None = Field(
        default=None, description="The body (null: none)."
    )
    headers: dict[str, str | None] | None = Field(
        default=None, description="Header name -> value (encoded as the request's encoding)."
    )
    timestamp: Annotated[int, Field(ge=0, le=_I64)] | None = Field(
        default=None, description="Create time, ms since the epoch (now if absent)."
    )


class QueuePublishRequest(_Strict):
    """Messages published to an exchange, all with one routing key (stored as each
    record's key) and these routing ``headers`` (what a headers exchange matches; also
    stored on every message, after its own headers)."""

    routing_key: Annotated[str, Field(max_length=65_536)] = ""
    messages: list[QueuePublishMessage] = Field(min_length=1, max_length=MAX_PUBLISH_MESSAGES)
    headers: dict[str, str] = Field(default_factory=dict, max_length=1_000)
    mandatory: bool = Field(
        default=False,
        description="Refuse the publish (422) when no binding routes it; else it is dropped "
        "and the answer says unroutable.",
    )
    ttl_ms: Ms = Field(default=0, description="These messages expire after this long (0: no).")
    delay_ms: Ms = Field(default=0, description="Deliver no sooner than this long from now.")
    deliver_at_ms: Ms = Field(
        default=0, description="Deliver no sooner than this time (ms since the epoch)."
    )
    encoding: Encoding = "utf-8"

    @model_validator(mode="after")
    def _one_delay(self) -> QueuePublishRequest:
        if self.delay_ms and self.deliver_at_ms:
            raise ValueError("give delay_ms or deliver_at_ms, not both")
        return self


class TopicPlacement(BaseModel):
    topic: str
    partition: int
    base_offset: int


class QueuePublishResult(BaseModel):
    """Where the messages went: stored (fsynced for durable queues) in these queues and
    topics before the answer."""

    messages: int
    queues: list[str]
    topics: list[TopicPlacement]
    unroutable: bool = Field(description="Nothing routed them: dropped (not mandatory).")


# --- delivery ------------------------------------------------------------------------------------


class GetRequest(_Strict):
    """Take up to ``max_messages`` ready messages. They are held for this request until
    settled (ack, nack, reject with their tags) or until ``visibility_timeout_ms`` passes,
    when they are redelivered."""

    max_messages: Annotated[int, Field(ge=1, le=MAX_GET_MESSAGES)] = 1
    wait_ms: Annotated[int, Field(ge=0, le=MAX_GET_WAIT_MS)] = Field(
        default=0,
        description="Long-poll: wait up to this long for a first message (capped by the "
        "broker's max_wait_ms).",
    )
    visibility_timeout_ms: Annotated[int, Field(ge=1, le=_I31)] = DEFAULT_HTTP_VISIBILITY_MS
    encoding: Literal["auto", "base64"] = Field(
        default="auto", description="auto: UTF-8 text where valid, else base64."
    )


class QueueMessage(BaseModel):
    tag: int = Field(description="The delivery tag: settle the message with it.")
    offset: int = Field(description="The message's id: its offset in the queue's log.")
    delivery_count: int = Field(description="1: first delivery.")
    redelivered: bool
    routing_key: str | None
    value: str | None
    headers: dict[str, str | None]
    timestamp: int
    encoding: Encoding


class GetResult(BaseModel):
    queue: str
    messages: list[QueueMessage]


class SettleRequest(_Strict):
    tags: list[Annotated[int, Field(ge=1, le=_I64)]] = Field(
        default_factory=list, max_length=MAX_SETTLE_TAGS
    )
    up_to: Annotated[int, Field(ge=0, le=_I64)] = Field(
        default=0,
        description="Also every tag up to this one held by HTTP requests in this queue.",
    )
    requeue: bool | None = Field(
        default=None,
        description="nack: requeue (the default) or dead-letter; reject: dead-letter (the "
        "default) or requeue. Not for ack.",
    )

    @model_validator(mode="after")
    def _some(self) -> SettleRequest:
        if not self.tags and not self.up_to:
            raise ValueError("give tags, up_to, or both")
        return self


class SettleResult(BaseModel):
    queue: str
    outcome: Literal["ack", "requeue", "dead-letter"]
    tags: list[int]
    up_to: int


class BrowsedMessage(BaseModel):
    offset: int
    routing_key: str | None
    value: str | None
    headers: dict[str, str | None] = Field(
        description="Dead letters carry x-death (JSON: newest first, queue, reason, count, "
        "exchange, routing_key, time_ms)."
    )
    timestamp: int
    encoding: Encoding


class BrowseResult(BaseModel):
    queue: str
    messages: list[BrowsedMessage]
    next_offset: int = Field(description="from_offset of the next page.")


class ReplayRequest(_Strict):
    """Which dead letters go back to the queue they died in: ``offsets``, a range
    ``[from_offset, to_offset)`` (no to_offset: to the end), or ``all``."""

    offsets: list[Annotated[int, Field(ge=0, le=_I64)]] | None = Field(
        default=None, max_length=MAX_REPLAY_OFFSETS
    )
    from_offset: Annotated[int, Field(ge=0, le=_I64)] | None = None
    to_offset: Annotated[int, Field(ge=0, le=_I64)] | None = None
    all: bool = False

    @model_validator(mode="after")
    def _one_way(self) -> ReplayRequest:
        ways = [
            self.offsets is not None,
            self.from_offset is not None or self.to_offset is not None,
            self.all,
        ]
        if sum(ways) != 1:
            raise ValueError("give exactly one of offsets, from_offset/to_offset, or all")
        if (
            self.from_offset is not None
            and self.to_offset is not None
            and self.to_offset < self.from_offset
        ):
            raise ValueError(
                f"to_offset={self.to_offset:,} is below from_offset={self.from_offset:,}"
            )
        return self
