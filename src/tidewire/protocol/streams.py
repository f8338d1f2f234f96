"""The value types of lightweight streams, as they travel in the STREAM_* bodies (pure).

They are shared by the broker core (``tidewire.broker.streams.model`` names the same
classes), the server and the clients. Items and messages are ``array_like`` structs: a
message costs a msgpack array of its fields on the wire and one small object in memory.
"""

from __future__ import annotations

import msgspec

__all__ = ["SendItem", "SendResult", "StreamInfo", "StreamMessage", "StreamStats"]


class SendItem(msgspec.Struct, array_like=True, gc=False):
    """One message to send: ``[stream, value, uuid, ttl_ms, persistent]``.

    ``uuid``: deduplicates (a send whose uuid is among the stream's recent ones stores
    nothing); empty: none. ``ttl_ms``: the message expires that long after the broker stored
    it (0: the broker's ``stream_default_ttl_ms``). ``persistent``: written durably and
    replayable by token, instead of in memory only.
    """

    stream: str
    value: bytes
    uuid: str = ""
    ttl_ms: int = 0
    persistent: bool = False


class SendResult(msgspec.Struct, array_like=True, gc=False):
    """The outcome of one :class:`SendItem`: ``[code, message, token]``.

    ``code`` 0: stored; ``-1``: a duplicate (its uuid was sent before; nothing stored);
    otherwise a tidewire error code with its ``message`` (nothing stored for this item).
    ``token``: for a stored persistent message, the resume token of its position (reading
    from it returns this message first)."""

    code: int = 0
    message: str = ""
    token: str = ""


class StreamMessage(msgspec.Struct, array_like=True, gc=False):
    """A received message: ``[stream, value, uuid, timestamp_ms, expires_at_ms, token]``.

    ``timestamp_ms``: when the broker stored it. ``token``: for a persistent message, the
    resume token of the position after it (read from it to continue after this message);
    empty for a message kept in memory only."""

    stream: str
    value: bytes
    uuid: str
    timestamp_ms: int
    expires_at_ms: int
    token: str = ""


class StreamInfo(msgspec.Struct, kw_only=True, gc=False):
    """What :meth:`StreamManager.describe` tells of one stream."""

    stream: str
    partition: int
    #: Messages a receive (work-queue mode) would take now: in memory and persistent.
    waiting: int
    #: Persistent messages held for reading by token (taken or not, until they expire).
    persistent: int
    #: Messages kept in memory only.
    in_memory: int
    #: Receivers waiting on the stream now (work-queue and token reads).
    receivers: int
    #: The bound of waiting messages (``inMemoryStreamSize``), fixed by its first request.
    ring_size: int
    #: Token of the oldest persistent message held ("" when none).
    first_token: str
    #: Token of the position after the newest (reading from it waits for the next one).
    end_token: str
    #: Broker time of the oldest and newest message held (0: none).
    oldest_ms: int
    newest_ms: int


class StreamStats(msgspec.Struct, kw_only=True, gc=False):
    """Counts over every stream (for metrics and ``describe``)."""

    streams: int = 0
    in_memory_messages: int = 0
    in_memory_bytes: int = 0
    persistent_messages: int = 0
    receivers: int = 0
    sent_in_memory: int = 0
    sent_persistent: int = 0
    duplicates: int = 0
    received: int = 0  # taken by work-queue receives
    read: int = 0  # returned by token reads
    expired: int = 0
    dropped: int = 0  # pushed out of a full ring by a newer send
    created: int = 0
    evicted: int = 0
    blocked_sends_timed_out: int = 0
    #: Bytes of the shared partition logs on disk.
    log_bytes: int = 0
