"""Which partition a message goes to: by the FNV-1a hash of its key, so every message with
the same key lands on the same partition (while the partition count stays the same).

FNV-1a, 32 bits (Fowler, Noll, Vo): start from the offset basis; for each byte, XOR it in,
then multiply by the FNV prime modulo 2**32. Small, fast, well spread on short keys, and
easy to reproduce in any language, which is what a producer written elsewhere needs to route
the same key to the same partition.
"""

from __future__ import annotations

from collections.abc import Callable

from tidewire.records._impl import fnv1a_32 as _compiled_fnv1a_32

__all__ = ["FNV1A_32_OFFSET_BASIS", "FNV1A_32_PRIME", "fnv1a_32", "partition_for_key"]

#: The 32-bit FNV offset basis (the hash of the empty input).
FNV1A_32_OFFSET_BASIS = 0x811C9DC5
#: The 32-bit FNV prime: 2**24 + 2**8 + 0x93.
FNV1A_32_PRIME = 0x01000193


def _fnv1a_32(data: bytes) -> int:
    """The 32-bit FNV-1a hash of ``data``, an int in 0..2**32-1."""
    h = FNV1A_32_OFFSET_BASIS
    for byte in data:
        h = ((h ^ byte) * FNV1A_32_PRIME) & 0xFFFFFFFF
    return h


#: The 32-bit FNV-1a hash of ``data`` (bytes), an int in 0..2**32-1: compiled with the record
#: codec (``records._speedups.fnv1a_32``: a keyed ``send`` hashes its key), else the loop above.
fnv1a_32: Callable[[bytes], int] = _compiled_fnv1a_32 or _fnv1a_32


def partition_for_key(key: bytes, partitions: int) -> int:
    """The partition of a keyed message: ``fnv1a_32(key) % partitions``.

    Raises:
        ValueError: ``partitions`` is below 1.
    """
    if partitions < 1:
        raise ValueError(f"partitions={partitions} must be >= 1")
    return fnv1a_32(key) % partitions
