"""The request and response documents of ``/v1/streams`` (pydantic v2 models: they validate
the requests, and the OpenAPI spec is generated from them).

A message's value travels as one of ``value`` (UTF-8 text), ``value_base64`` (any bytes,
base64) or ``json`` (any JSON value, stored as its compact JSON text). Answers give the value
as UTF-8 text with ``encoding: "utf-8"`` when it is valid UTF-8 (and base64 was not asked for),
else base64 with ``encoding: "base64"``.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from tidewire.broker.streams.model import MAX_STREAM_ID_CHARS

__all__ = [
    "MAX_RECEIVE_MESSAGES",
    "MAX_SEND_ITEMS",
    "MAX_STREAMS_PER_REQUEST",
    "ReadRequest",
    "ReadResult",
    "ReceiveRequest",
    "ReceiveResult",
    "StreamDescription",
    "StreamList",
    "StreamMessageDoc",
    "StreamSendBatchRequest",
    "StreamSendBatchResult",
    "StreamSendItem",
    "StreamSendRequest",
    "StreamSendResult",
    "StreamStatsDoc",
    "StreamTokenResult",
]

#: Messages in one send request at most: as the binary protocol's clients send them (one
#: request per 10,000), so one request's answer stays small.
MAX_SEND_ITEMS = 10_000
#: Streams one receive or read names at most: bounds the work of one request (each stream
#: named is a lookup and a waiter registration).
MAX_STREAMS_PER_REQUEST = 1_000
#: Messages one receive or read answers at most.
MAX_RECEIVE_MESSAGES = 1_000
#: The largest ``ring_size`` a request may fix for a new stream (waiting messages kept).
MAX_RING_SIZE = 1_000_000
#: The longest a blocking send waits for room (ms): as a long-poll's bound.
MAX_BLOCK_MS = 300_000
_I64 = 2**63 - 1

StreamId = Annotated[
    str,
    Field(
        min_length=1,
        max_length=MAX_STREAM_ID_CHARS,
        description=f"A stream id: 1..{MAX_STREAM_ID_CHARS:,} characters, no NUL.",
    ),
]
RingSize = Annotated[
    int | None,
    Field(
        default=None,
        ge=0,
        le=MAX_RING_SIZE,
        description="Messages kept waiting for a receiver (iPubSub's inMemoryStreamSize), "
        "fixed by the request that creates the stream (null: the broker's stream_ring_size).",
    ),
]
BlockMs = Annotated[
    int,
    Field(
        ge=0,
        le=MAX_BLOCK_MS,
        description="0: a send to a full stream pushes its oldest waiting message out; "
        "> 0: it waits up to this long for room, then fails with StreamFullError (429).",
    ),
]
WaitMs = Annotated[
    int,
    Field(ge=0, le=_I64, description="Long-poll: ms to wait for a first message (0: none)."),
]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class _Value(_Strict):
    value: str | None = Field(default=None, description="The value as UTF-8 text.")
    value_base64: str | None = Field(default=None, description="The value, base64 (any bytes).")
    json_: Any = Field(
        default=None,
        alias="json",
        description="The value as any JSON document (stored as its compact JSON text).",
    )
    uuid: str = Field(
        default="",
        max_length=1024,
        description="Deduplicates: a send whose uuid is among the stream's recent ones "
        "(stream_dedup_window) stores nothing and answers status duplicate.",
    )
    ttl_ms: int = Field(
        default=0,
        ge=0,
        le=_I64,
        description="The message expires this long after it is stored (0: the broker's "
        "stream_default_ttl_ms; at most stream_max_ttl_ms).",
    )
    persistent: bool = Field(
        default=False,
        description="Written durably and readable by token (replay), instead of in memory only.",
    )

    model_config = ConfigDict(extra="forbid", strict=True, populate_by_name=True)

    @model_validator(mode="after")
    def _one_value(self) -> _Value:
        given = [n for n in ("value", "value_base64", "json_") if n in self.model_fields_set]
        if len(given) != 1:
            names = ", ".join(n.rstrip("_") for n in given) or "none"
            raise ValueError(f"give exactly one of value, value_base64 and json (got {names})")
        return self


class StreamSendItem(_Value):
    """One message of a batch send."""

    stream: StreamId


class StreamSendRequest(_Value):
    """One message to the stream of the path."""

    ring_size: RingSize = None
    block_ms: BlockMs = 0


class StreamSendBatchRequest(_Strict):
    items: list[StreamSendItem] = Field(min_length=1, max_length=MAX_SEND_ITEMS)
    ring_size: RingSize = None
    block_ms: BlockMs = 0


class StreamError(BaseModel):
    code: int = Field(description="tidewire's error code (e.g. 120 InvalidStreamError).")
    name: str
    message: str


class StreamSendResult(BaseModel):
    """The outcome of one message."""

    status: Literal["stored", "duplicate", "error"]
    token: str = Field(
        default="",
        description="A stored persistent message's resume token: reading from it returns "
        "this message first.",
    )
    error: StreamError | None = Field(default=None, description="With status error.")


class StreamSendBatchResult(BaseModel):
    """One result per message, in the order of the request."""

    results: list[StreamSendResult]


class StreamMessageDoc(BaseModel):
    stream: str
    value: str
    encoding: Literal["utf-8", "base64"]
    uuid: str
    timestamp_ms: int = Field(description="When the broker stored it, ms since the epoch.")
    expires_at_ms: int
    token: str = Field(
        description="A persistent message's resume token of the position after it (read "
        "from it to go on after this message); empty for an in-memory message."
    )


class ReceiveRequest(_Strict):
    streams: list[StreamId] = Field(min_length=1, max_length=MAX_STREAMS_PER_REQUEST)
    wait_ms: WaitMs = 0
    max: int = Field(default=1, ge=1, le=MAX_RECEIVE_MESSAGES, description="Messages at most.")
    ring_size: RingSize = None
    encoding: Literal["auto", "base64"] = "auto"


class ReceiveResult(BaseModel):
    """The messages taken (none: an empty list, after ``wait_ms``)."""

    messages: list[StreamMessageDoc]


class ReadRequest(_Strict):
    positions: dict[str, str] = Field(
        min_length=1,
        max_length=MAX_STREAMS_PER_REQUEST,
        description='Stream id -> token to read it from: "" its oldest retained persistent '
        'message, "$" only what is sent after the read began, or a token of an earlier answer.',
    )
    wait_ms: WaitMs = 0
    max: int = Field(default=100, ge=1, le=MAX_RECEIVE_MESSAGES, description="Messages at most.")
    encoding: Literal["auto", "base64"] = "auto"


class ReadResult(BaseModel):
    messages: list[StreamMessageDoc]
    tokens: dict[str, str] = Field(description="For every stream read: the token to read on from.")


class StreamTokenResult(BaseModel):
    messages: list[StreamMessageDoc]
    token: str = Field(description="The token to read on from (the same one if nothing came).")


class StreamDescription(BaseModel):
    stream: str
    partition: int
    waiting: int = Field(description="Messages a receive would take now.")
    persistent: int = Field(description="Persistent messages held for reading by token.")
    in_memory: int
    receivers: int
    ring_size: int
    first_token: str
    end_token: str
    oldest_ms: int
    newest_ms: int


class StreamList(BaseModel):
    streams: list[StreamDescription]
    next_after: str | None = Field(
        description="Pass as ``after`` for the next page; null: this was the last."
    )


class StreamStatsDoc(BaseModel):
    """Counts over every stream of the broker."""

    streams: int
    partitions: int
    in_memory_messages: int
    in_memory_bytes: int
    persistent_messages: int
    receivers: int
    sent_in_memory: int
    sent_persistent: int
    duplicates: int
    received: int
    read: int
    expired: int
    dropped: int
    created: int
    evicted: int
    blocked_sends_timed_out: int
    log_bytes: int
