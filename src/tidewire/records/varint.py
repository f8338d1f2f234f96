"""Zigzag varints as used inside RecordBatch v2 records (pure, no I/O).

A signed integer is zigzag-mapped (``(n << 1) ^ (n >> 63)``) so small magnitudes of either
sign take few bytes, then written 7 bits per byte, least significant group first, with the
high bit set on every byte but the last. An ``int32`` takes at most 5 bytes and an ``int64``
at most 10; a longer encoding is rejected with :class:`~tidewire.errors.VarintError`.
"""

from __future__ import annotations

from tidewire.errors import BatchLengthError, VarintError

__all__ = ["MAX_VARINT32_BYTES", "MAX_VARINT64_BYTES", "decode", "encode", "size"]

#: The longest encoding of a 32-bit value: ceil(32 / 7).
MAX_VARINT32_BYTES = 5
#: The longest encoding of a 64-bit value: ceil(64 / 7).
MAX_VARINT64_BYTES = 10

_INT32_MIN, _INT32_MAX = -(2**31), 2**31 - 1
_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1

# One-byte encodings are by far the most common (lengths of small keys, header counts, deltas),
# so they come from a table.
_SMALL = {n: bytes([((n << 1) ^ (n >> 63)) & 0xFFFFFFFFFFFFFFFF]) for n in range(-64, 64)}


def encode(value: int) -> bytes:
    """Return the zigzag varint encoding of a signed 64-bit ``value``.

    Raises:
        ValueError: ``value`` does not fit in 64 bits (a programming error, not bad input).
    """
    small = _SMALL.get(value)
    if small is not None:
        return small
    if not _INT64_MIN <= value <= _INT64_MAX:
        raise ValueError(f"{value} does not fit in a signed 64-bit varint")
    n = ((value << 1) ^ (value >> 63)) & 0xFFFFFFFFFFFFFFFF
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def size(value: int) -> int:
    """Return how many bytes :func:`encode` writes for ``value``."""
    n = ((value << 1) ^ (value >> 63)) & 0xFFFFFFFFFFFFFFFF
    length = 1
    while n >= 0x80:
        n >>= 7
        length += 1
    return length


def decode(buf: bytes | bytearray | memoryview, pos: int, *, wide: bool = False) -> tuple[int, int]:
    """Decode one zigzag varint from ``buf`` at ``pos``.

    Args:
        buf: the bytes to read from.
        pos: index of the varint's first byte.
        wide: ``True`` for a 64-bit varint (10 bytes at most), else 32-bit (5 bytes at most).

    Returns:
        ``(value, next_pos)``.

    Raises:
        BatchLengthError: ``buf`` ends inside the varint.
        VarintError: the encoding is longer than the type allows or overflows it.
    """
    limit = MAX_VARINT64_BYTES if wide else MAX_VARINT32_BYTES
    end = len(buf)
    if pos < end:
        b = buf[pos]
        if b < 0x80:  # the one-byte fast path
            return (b >> 1) ^ -(b & 1), pos + 1
    result = 0
    shift = 0
    start = pos
    while True:
        if pos >= end:
            raise BatchLengthError(f"input ends inside a varint starting at byte {start}")
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if b < 0x80:
            break
        shift += 7
        if pos - start >= limit:
            bits = 64 if wide else 32
            raise VarintError(f"varint at byte {start} is longer than {limit} bytes ({bits}-bit)")
    value = (result >> 1) ^ -(result & 1)
    if wide:
        if not _INT64_MIN <= value <= _INT64_MAX:
            raise VarintError(f"varint at byte {start} overflows 64 bits")
    elif not _INT32_MIN <= value <= _INT32_MAX:
        raise VarintError(f"varint at byte {start} overflows 32 bits")
    return value, pos
