"""The bytes of Kafka's ``consumer`` group protocol that tidewire's views read: a member's
subscription (ConsumerProtocolSubscription) and its assignment (ConsumerProtocolAssignment),
any version (they all begin with a version, then the topics / the partitions). The broker
passes these bytes between Kafka clients untouched; only ``tidewire group describe`` and its
siblings decode them, to show each member's topics and partitions.

Layout (big-endian): version int16; subscription: topics [int32 count, (int16 length,
UTF-8)...], then fields this module does not read; assignment: [int32 count, (topic string,
[int32 count, int32 partition...])...], then fields it does not read.
"""

from __future__ import annotations

import struct

__all__ = ["decode_assignment", "decode_subscription"]


_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")


class _Reader:
    def __init__(self, data: bytes) -> None:
        self.data, self.pos = data, 0

    def take(self, s: struct.Struct) -> int:
        (v,) = s.unpack_from(self.data, self.pos)
        self.pos += s.size
        return int(v)

    def string(self) -> str:
        n = self.take(_I16)
        if n < 0 or self.pos + n > len(self.data):
            raise ValueError("bad string")
        v = self.data[self.pos : self.pos + n].decode()
        self.pos += n
        return v

    def count(self) -> int:
        n = self.take(_I32)
        if n < 0 or n > len(self.data):
            raise ValueError("bad array length")
        return n


def decode_subscription(metadata: bytes) -> tuple[str, ...]:
    """The topics of a ``consumer`` protocol member's subscription (Kafka's
    ConsumerProtocolSubscription, any version: they all begin version, topics); () when it
    is not one."""
    try:
        r = _Reader(metadata)
        r.take(_I16)
        return tuple(sorted(r.string() for _ in range(r.count())))
    except (ValueError, struct.error, UnicodeDecodeError):
        return ()


def decode_assignment(assignment: bytes) -> list[tuple[str, int]]:
    """The partitions of a ``consumer`` protocol assignment (Kafka's
    ConsumerProtocolAssignment, any version); [] when it is not one."""
    try:
        r = _Reader(assignment)
        r.take(_I16)
        out: list[tuple[str, int]] = []
        for _ in range(r.count()):
            topic = r.string()
            out.extend((topic, r.take(_I32)) for _ in range(r.count()))
        return sorted(out)
    except (ValueError, struct.error, UnicodeDecodeError):
        return []
