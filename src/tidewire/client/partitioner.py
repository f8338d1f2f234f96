"""Choosing a partition for a key: FNV-1a, 32 bits.

A keyed message goes to partition ``fnv1a_32(key) % partitions``, so every client that uses
this function (the producer, the CLI) sends a key to the same partition as long as the
topic's partition count does not change.
"""

from __future__ import annotations

__all__ = ["fnv1a_32"]

_FNV32_OFFSET_BASIS = 0x811C9DC5
_FNV32_PRIME = 0x01000193
_MASK32 = 0xFFFFFFFF


def fnv1a_32(data: bytes) -> int:
    """Return the 32-bit FNV-1a hash of ``data`` (an unsigned int below 2**32).

    Known values: ``fnv1a_32(b"") == 0x811C9DC5``, ``fnv1a_32(b"a") == 0xE40C292C``,
    ``fnv1a_32(b"foobar") == 0xBF9CF968``.
    """
    h = _FNV32_OFFSET_BASIS
    for byte in data:
        h = ((h ^ byte) * _FNV32_PRIME) & _MASK32
    return h
