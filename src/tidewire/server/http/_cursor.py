"""Reading a topic from its log for the streaming endpoints: positions per partition, records
decoded from whole batches, each record encoded once as the JSON message the clients get.

A :class:`LogCursor` keeps, per partition, the *position* (the next offset to deliver) and the
records of the last read that are not delivered yet (at most one read of
:data:`READ_BYTES`): a record is delivered by :meth:`LogCursor.advance`, which moves the
position past it. Nothing is read ahead of what is about to be delivered but that one read,
so what the gateway holds per stream is bounded whatever the consumer's speed.

The JSON message (:class:`Message`)::

    {"type": "message", "topic": "orders", "partition": 0, "offset": 41,
     "timestamp": 1700000000000, "key": "customer-42", "value": "{\\"id\\": 1}",
     "headers": {"trace": "abc"}, "encoding": "utf-8"}

``encoding`` is ``"utf-8"`` when the key, the value and every header value are valid UTF-8
(they are then given as text), else ``"base64"`` (all of them are then standard base64); a
client may ask for base64 always. A null key, value or header value is ``null``. The fields
are those of the REST API's message document, with ``type`` and ``topic`` added; as there,
headers are an object (a name repeated in a record keeps its last value).
"""

from __future__ import annotations

import base64
import binascii
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

import msgspec

from tidewire.broker import Broker
from tidewire.errors import InvalidRequestError, OffsetOutOfRangeError
from tidewire.records import iter_batches, read_records

__all__ = [
    "READ_BYTES",
    "LogCursor",
    "Message",
    "Record",
    "StartAt",
    "decode_token",
    "encode_message",
    "encode_token",
    "parse_from",
]

#: Bytes read from a partition's log at a time: what a cursor may hold per partition (decoded
#: and encoded, about three times that in memory). Large enough that one read feeds many
#: frames at full speed, small enough for thousands of open streams.
READ_BYTES = 256 * 1024
#: The longest resume token accepted (characters): 10,000 partitions fit in it.
MAX_TOKEN_CHARS = 512 * 1024


class Record(NamedTuple):
    """One record as read from a batch (the factory of :func:`read_records`)."""

    topic: str
    partition: int
    offset: int
    timestamp: int
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes | None], ...]


class Message(msgspec.Struct, tag_field="type", tag="message"):
    """A record as the streaming endpoints send it (see the module docstring)."""

    topic: str
    partition: int
    offset: int
    timestamp: int
    key: str | None
    value: str | None
    headers: dict[str, str | None]
    encoding: str


_encoder = msgspec.json.Encoder()


def _b64(data: bytes | None) -> str | None:
    return None if data is None else base64.b64encode(data).decode("ascii")


def to_message(rec: Record, *, force_base64: bool = False) -> Message:
    """The JSON message of a record: text when it all is UTF-8 (unless ``force_base64``),
    else base64."""
    if not force_base64:
        try:
            return Message(
                rec.topic,
                rec.partition,
                rec.offset,
                rec.timestamp,
                None if rec.key is None else rec.key.decode(),
                None if rec.value is None else rec.value.decode(),
                {n: None if v is None else v.decode() for n, v in rec.headers}
                if rec.headers
                else {},
                "utf-8",
            )
        except UnicodeDecodeError:
            pass
    return Message(
        rec.topic,
        rec.partition,
        rec.offset,
        rec.timestamp,
        _b64(rec.key),
        _b64(rec.value),
        {n: _b64(v) for n, v in rec.headers},
        "base64",
    )


def encode_message(rec: Record, *, force_base64: bool = False) -> bytes:
    """The JSON bytes of :func:`to_message`."""
    return _encoder.encode(to_message(rec, force_base64=force_base64))


def decode_records(topic: str, partition: int, data: bytes, min_offset: int) -> list[Record]:
    """Every record at or after ``min_offset`` in ``data`` (whole batches as the log returns
    them, CRC-checked by the read).

    Raises:
        RecordBatchError: a malformed batch.
    """
    out: list[Record] = []
    for pos, h in iter_batches(data, verify=False):
        if h.last_offset < min_offset:
            continue
        out += read_records(data, pos, h, Record, topic, partition, min_offset)
    return out


# --- where a stream starts ------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class StartAt:
    """Where a stream starts in each partition: ``earliest``, ``latest``, ``offset`` (the same
    offset in every partition, clamped to what the log holds) or ``timestamp`` (the first
    record at or after ``value`` ms since the epoch)."""

    kind: str
    value: int = 0

    def resolve(self, broker: Broker, topic: str, partition: int) -> int:
        """The offset this start means in one partition, now."""
        if self.kind == "earliest":
            return broker.list_offset(topic, partition, -2)
        if self.kind == "latest":
            return broker.list_offset(topic, partition, -1)
        if self.kind == "timestamp":
            return broker.list_offset(topic, partition, self.value)
        start = broker.list_offset(topic, partition, -2)
        end = broker.list_offset(topic, partition, -1)
        return min(max(self.value, start), end)


def parse_from(text: str | None, default: str = "latest") -> StartAt:
    """Parse a ``from`` parameter: ``earliest``, ``latest``, ``offset:N`` (or just ``N``) or
    ``timestamp:MS``.

    Raises:
        InvalidRequestError: anything else.
    """
    text = default if text is None or text == "" else text.strip()
    if text in ("earliest", "latest"):
        return StartAt(text)
    kind, sep, number = text.partition(":")
    if not sep:
        kind, number = "offset", text
    if kind in ("offset", "timestamp") and number.isascii() and number.isdigit():
        return StartAt(kind, int(number))
    raise InvalidRequestError(
        f"from={text!r}: expected earliest, latest, offset:N (or N) or timestamp:MS, "
        "with N and MS non-negative integers"
    )


# --- resume tokens ------------------------------------------------------------------------------


class _Token(msgspec.Struct, array_like=True):
    version: int
    topic: str
    positions: list[tuple[int, int]]


_token_decoder = msgspec.json.Decoder(_Token)


def encode_token(topic: str, positions: Iterable[tuple[int, int]]) -> str:
    """A resume token: the topic and every partition's next offset, as URL-safe base64 of a
    JSON array (no padding)."""
    raw = _encoder.encode(_Token(1, topic, list(positions)))
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode("ascii")


def decode_token(token: str, topic: str) -> dict[int, int]:
    """Partition -> next offset from a resume token of ``topic``.

    Raises:
        InvalidRequestError: not a token of this gateway, or of another topic.
    """
    if len(token) > MAX_TOKEN_CHARS:
        raise InvalidRequestError(
            f"resume token of {len(token):,} characters exceeds {MAX_TOKEN_CHARS:,}"
        )
    try:
        raw = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4))
        tok = _token_decoder.decode(raw)
    except (binascii.Error, ValueError, msgspec.DecodeError):
        raise InvalidRequestError(f"{token[:40]!r} is not a resume token of this gateway") from None
    if tok.version != 1:
        raise InvalidRequestError(f"resume token version {tok.version} is not known (1 is)")
    if tok.topic != topic:
        raise InvalidRequestError(
            f"the resume token is one of topic {tok.topic!r}, not of {topic!r}"
        )
    out: dict[int, int] = {}
    for p, off in tok.positions:
        if p < 0 or off < 0 or p in out:
            raise InvalidRequestError(f"resume token names partition {p} at offset {off}")
        out[p] = off
    return out


# --- the cursor ---------------------------------------------------------------------------------


@dataclass(slots=True)
class Part:
    """One partition of a cursor: the next offset to deliver, and the records read from the
    log and not delivered yet, each with its encoded JSON."""

    partition: int
    position: int
    pending: deque[tuple[int, bytes]] = field(default_factory=deque)
    read_end: int = 0  # the offset after the last read: the position once pending is used up


class LogCursor:
    """Positions in the partitions of one topic, read from the log on demand.

    Args:
        broker: where the log is.
        topic: the topic.
        positions: partition -> the next offset to deliver.
        force_base64: encode every message's key, value and headers as base64.
    """

    def __init__(
        self,
        broker: Broker,
        topic: str,
        positions: dict[int, int],
        *,
        force_base64: bool = False,
    ) -> None:
        self.broker = broker
        self.topic = topic
        self.force_base64 = force_base64
        self.parts: dict[int, Part] = {p: Part(p, off) for p, off in sorted(positions.items())}

    def positions(self) -> list[tuple[int, int]]:
        """(partition, next offset to deliver) of every partition, in partition order."""
        return [(p.partition, p.position) for p in self.parts.values()]

    def assign(self, positions: dict[int, int]) -> None:
        """Keep the partitions of ``positions`` that the cursor has (with their positions and
        what they read), add the others at the given offsets, drop the rest."""
        kept = {p: self.parts[p] for p in positions if p in self.parts}
        for p, off in positions.items():
            kept.setdefault(p, Part(p, off))
        self.parts = dict(sorted(kept.items()))

    def peek(self, part: Part) -> tuple[int, bytes] | None:
        """The next record of ``part`` (offset, JSON) without delivering it; ``None`` when the
        partition has nothing more now.

        Raises:
            OffsetOutOfRangeError: the position is no longer (or not yet) in the log.
            UnknownTopicError, UnknownPartitionError, PartitionCorruptError: the read failed.
        """
        if part.pending:
            return part.pending[0]
        part.position = max(part.position, part.read_end)
        r = self.broker.read_partition(self.topic, part.partition, part.position, READ_BYTES)
        if not r.data:
            if part.position < r.log_start_offset:
                raise OffsetOutOfRangeError(
                    f"offset {part.position} of {self.topic!r} partition {part.partition} "
                    f"was removed by retention; the log starts at {r.log_start_offset}"
                )
            return None
        force = self.force_base64
        before = len(part.pending)
        for rec in decode_records(self.topic, part.partition, r.data, part.position):
            part.pending.append((rec.offset, encode_message(rec, force_base64=force)))
        part.read_end = r.next_offset
        if len(part.pending) > before:  # the metrics' messages and bytes out, once per read
            self.broker.count_delivered(
                self.topic, part.partition, len(part.pending) - before, len(r.data)
            )
        if not part.pending:
            part.position = r.next_offset
            return None
        return part.pending[0]

    @staticmethod
    def advance(part: Part) -> None:
        """Deliver the record :meth:`peek` returned: the position moves past it."""
        offset, _ = part.pending.popleft()
        part.position = offset + 1

    def waiting_keys(self) -> Sequence[tuple[str, int]]:
        """(topic, partition) of every partition, to wait for appends on."""
        return [(self.topic, p) for p in self.parts]
