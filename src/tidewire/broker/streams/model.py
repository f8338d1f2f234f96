"""The value types of lightweight streams, shared by the broker core, the server and clients.

A **stream** is named by any string of 1..:data:`MAX_STREAM_ID_CHARS` characters (no NUL) and
exists while it holds messages or receivers. A message is either kept in memory only (in the
stream's bounded ring) or **persistent**: written to one of the shared internal partition logs
(``__streams``, the stream id hashed onto a partition) before the send is answered.

A persistent message has a **position**: ``(offset << 16) | index``, where ``offset`` is the
record of its partition log that holds it and ``index`` its place among that record's
messages. Positions grow with every send to a stream, survive restarts, and are what a
**resume token** encodes (:func:`encode_token`): reading from a token returns the stream's
persistent messages at or after its position.
"""

from __future__ import annotations

import base64
import binascii
import struct
import zlib
from collections.abc import Sequence

from tidewire.errors import InvalidStreamError

# The value types travel in protocol bodies too, and the protocol imports nothing of the
# broker: they are defined there, and are the very same classes here.
from tidewire.protocol.streams import (
    SendItem,
    SendResult,
    StreamInfo,
    StreamMessage,
    StreamStats,
)

__all__ = [
    "FROM_END",
    "FROM_START",
    "MAX_STREAM_ID_CHARS",
    "POSITION_BITS",
    "TOKEN_CHARS",
    "TOKEN_WIDTH",
    "SendItem",
    "SendResult",
    "StreamInfo",
    "StreamMessage",
    "StreamStats",
    "check_stream_id",
    "decode_token",
    "encode_token",
    "encode_tokens",
    "partition_of",
    "position",
    "split_position",
    "token_block",
]

#: The longest stream id, in characters.
MAX_STREAM_ID_CHARS = 1024
#: Bits of a position that hold the index of a message within its record.
POSITION_BITS = 16
#: The token that reads a stream from its oldest retained persistent message.
FROM_START = ""
#: The token that reads only what is sent after the read began.
FROM_END = "$"

_TOKEN = struct.Struct(">BIq")  # version, crc32 of the stream id, position
_TOKEN_VERSION = 1
#: A token's bytes padded to 15, a multiple of 3: base64 turns each into 20 characters of
#: its own, the first 18 of which are its token (the last of them holds 2 bits of the token
#: and 4 zero bits, as base64's own padding would).
_TOKEN_STRIDE = 15
#: Characters of a resume token.
TOKEN_CHARS = 18
#: Characters from one token to the next in a :func:`token_block`.
TOKEN_WIDTH = _TOKEN_STRIDE // 3 * 4
_URLSAFE = bytes.maketrans(b"+/", b"-_")


def check_stream_id(stream: str) -> str:
    """``stream`` if it is a valid stream id.

    Raises:
        InvalidStreamError: empty, longer than :data:`MAX_STREAM_ID_CHARS`, not a string, or
            holding a NUL character.
    """
    if not isinstance(stream, str) or not stream:
        raise InvalidStreamError("a stream id must be a non-empty string")
    if len(stream) > MAX_STREAM_ID_CHARS:
        raise InvalidStreamError(
            f"a stream id may have at most {MAX_STREAM_ID_CHARS:,} characters, not {len(stream):,}"
        )
    if "\x00" in stream:
        raise InvalidStreamError("a stream id may not contain NUL characters")
    return stream


def partition_of(stream: str, partitions: int) -> int:
    """The partition of ``__streams`` that holds ``stream``'s persistent messages."""
    return zlib.crc32(stream.encode("utf-8", "surrogatepass")) % partitions


def position(offset: int, index: int) -> int:
    """The position of the ``index``-th message of the record at ``offset``."""
    return (offset << POSITION_BITS) | index


def split_position(pos: int) -> tuple[int, int]:
    """``(offset, index)`` of a position."""
    return pos >> POSITION_BITS, pos & ((1 << POSITION_BITS) - 1)


def encode_token(stream: str, pos: int) -> str:
    """The opaque resume token of position ``pos`` in ``stream`` (URL-safe, no padding)."""
    crc = zlib.crc32(stream.encode("utf-8", "surrogatepass"))
    raw = _TOKEN.pack(_TOKEN_VERSION, crc, pos)
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode("ascii")


def token_block(crcs: Sequence[int], positions: Sequence[int]) -> str:
    """The tokens of many positions at once, in one string: the ``i``-th token
    (``encode_token`` of a stream whose ``zlib.crc32`` of its UTF-8 id, ``surrogatepass``,
    is ``crcs[i]`` and of ``positions[i]``) is its :data:`TOKEN_CHARS` characters at
    ``i * TOKEN_WIDTH``.

    A send answers a token per persistent message; made one by one they cost a struct, a
    base64 and two string copies each. Here the bytes of every token are laid out in one
    buffer by strided slice assignments and encoded by one base64 call; what is left per
    token is the slice of its characters.

    Raises:
        ValueError: not as many crcs as positions.
    """
    n = len(crcs)
    if n != len(positions):
        raise ValueError(f"{n:,} crcs for {len(positions):,} positions")
    stride = _TOKEN_STRIDE
    buf = bytearray(stride * n)
    buf[0::stride] = bytes((_TOKEN_VERSION,)) * n
    raw = struct.pack(f">{n}I", *crcs)
    for j in range(4):
        buf[1 + j :: stride] = raw[j::4]
    raw = struct.pack(f">{n}q", *positions)
    for j in range(8):
        buf[5 + j :: stride] = raw[j::8]
    return binascii.b2a_base64(buf, newline=False).translate(_URLSAFE).decode("ascii")


def encode_tokens(crcs: Sequence[int], positions: Sequence[int]) -> list[str]:
    """``[encode_token(stream, pos) ...]`` given each stream's crc (see :func:`token_block`).

    Raises:
        ValueError: not as many crcs as positions.
    """
    text = token_block(crcs, positions)
    w, c = TOKEN_WIDTH, TOKEN_CHARS
    return [text[i : i + c] for i in range(0, len(text), w)]


def decode_token(stream: str, token: str) -> int:
    """The position a token of ``stream`` encodes.

    :data:`FROM_START` and :data:`FROM_END` are not positions: callers handle them first.

    Raises:
        InvalidStreamError: not a token, or a token of another stream.
    """
    try:
        raw = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4))
        version, crc, pos = _TOKEN.unpack(raw)
    except (binascii.Error, ValueError, struct.error):
        raise InvalidStreamError(f"{token[:64]!r} is not a resume token") from None
    if version != _TOKEN_VERSION or pos < 0:
        raise InvalidStreamError(f"{token[:64]!r} is not a resume token of this broker")
    if crc != zlib.crc32(stream.encode("utf-8", "surrogatepass")):
        raise InvalidStreamError(f"the resume token {token[:64]!r} belongs to another stream")
    return int(pos)
