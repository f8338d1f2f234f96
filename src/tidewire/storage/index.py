"""Sparse offset and time indexes of a segment, in memory and in their checksummed files.

In memory, each index is a pair of ``array('q')`` columns searched with ``bisect``. On disk
they are written whole, atomically, when a segment is sealed (rolled, or at a clean close),
and are trusted only if their header and CRC-32C check out and they describe a ``.log`` of the
size found on disk; otherwise the segment is scanned and the indexes rebuilt.

``.index`` file (big-endian)::

    offset  size  field
         0     4  magic "TWIX"
         4     2  version (1)
         6     2  reserved (0)
         8     8  base_offset        of the segment
        16     8  log_size           bytes of the .log file the index describes
        24     8  next_offset        the offset after the segment's last batch
        32     8  max_timestamp      largest batch max_timestamp in the segment (-1: none)
        40     4  entry_count
        44     4  crc                CRC-32C of bytes 0..44 and of every entry
        48   8*n  entries            (relative_offset u32, position u32)

``.timeindex`` file: the same 48-byte header with magic "TWTI", then 12-byte entries
(timestamp i64, relative_offset u32). An entry ``(t, o)`` means every record at an offset
<= ``o`` has a timestamp <= ``t``.
"""

from __future__ import annotations

import struct
from array import array
from bisect import bisect_left, bisect_right
from typing import NamedTuple

from tidewire.records import crc32c

__all__ = ["IndexFile", "OffsetIndex", "TimeIndex", "decode_index_file", "encode_index_file"]

INDEX_HEADER = struct.Struct(
    ">"
    "4s"  # magic
    "H"  # version
    "H"  # reserved
    "q"  # base_offset
    "q"  # log_size
    "q"  # next_offset
    "q"  # max_timestamp
    "I"  # entry_count
    "I"  # crc
)
_CRC_AT = INDEX_HEADER.size - 4
OFFSET_ENTRY = struct.Struct(">II")  # relative offset, position
TIME_ENTRY = struct.Struct(">qI")  # timestamp, relative offset
OFFSET_MAGIC = b"TWIX"
TIME_MAGIC = b"TWTI"
VERSION = 1


class OffsetIndex:
    """Sparse map from offsets to byte positions of the batches that start there."""

    __slots__ = ("base_offset", "offsets", "positions")

    def __init__(self, base_offset: int) -> None:
        self.base_offset = base_offset
        self.offsets = array("q")
        self.positions = array("q")

    def __len__(self) -> int:
        return len(self.offsets)

    def append(self, offset: int, position: int) -> None:
        """Add an entry; ``offset`` and ``position`` must grow."""
        self.offsets.append(offset)
        self.positions.append(position)

    def lookup(self, offset: int) -> tuple[int, int]:
        """Return ``(offset, position)`` of the last entry at or below ``offset``, or the
        segment's start ``(base_offset, 0)``."""
        i = bisect_right(self.offsets, offset) - 1
        if i < 0:
            return self.base_offset, 0
        return self.offsets[i], self.positions[i]

    def truncate_to_position(self, position: int) -> None:
        """Drop entries at or after ``position``."""
        i = bisect_left(self.positions, position)
        del self.offsets[i:]
        del self.positions[i:]

    def entries_bytes(self) -> bytes:
        base = self.base_offset
        return b"".join(
            OFFSET_ENTRY.pack(o - base, p)
            for o, p in zip(self.offsets, self.positions, strict=True)
        )


class TimeIndex:
    """Sparse map from timestamps to offsets: entries have growing timestamps and offsets."""

    __slots__ = ("base_offset", "offsets", "timestamps")

    def __init__(self, base_offset: int) -> None:
        self.base_offset = base_offset
        self.timestamps = array("q")
        self.offsets = array("q")

    def __len__(self) -> int:
        return len(self.offsets)

    @property
    def last_timestamp(self) -> int:
        return self.timestamps[-1] if self.timestamps else -1

    def maybe_append(self, timestamp: int, offset: int) -> None:
        """Add ``(timestamp, offset)`` if ``timestamp`` is above the last entry's."""
        if not self.timestamps or timestamp > self.timestamps[-1]:
            self.timestamps.append(timestamp)
            self.offsets.append(offset)

    def start_offset_for(self, timestamp: int) -> int:
        """Return an offset to start scanning from to find the first record with a timestamp
        >= ``timestamp``: every record before it is older."""
        i = bisect_left(self.timestamps, timestamp) - 1
        if i < 0:
            return self.base_offset
        return self.offsets[i] + 1

    def truncate_to_offset(self, offset: int) -> None:
        """Drop entries at or after ``offset``."""
        i = bisect_left(self.offsets, offset)
        del self.timestamps[i:]
        del self.offsets[i:]

    def entries_bytes(self) -> bytes:
        base = self.base_offset
        return b"".join(
            TIME_ENTRY.pack(t, o - base) for t, o in zip(self.timestamps, self.offsets, strict=True)
        )


class IndexFile(NamedTuple):
    """What an index file's header says, with its decoded index."""

    log_size: int
    next_offset: int
    max_timestamp: int
    entries: OffsetIndex | TimeIndex


def encode_index_file(
    index: OffsetIndex | TimeIndex, *, log_size: int, next_offset: int, max_timestamp: int
) -> bytes:
    """Serialize ``index`` with its header and CRC."""
    magic = OFFSET_MAGIC if isinstance(index, OffsetIndex) else TIME_MAGIC
    entries = index.entries_bytes()
    head = INDEX_HEADER.pack(
        magic, VERSION, 0, index.base_offset, log_size, next_offset, max_timestamp, len(index), 0
    )
    crc = crc32c(head[:_CRC_AT] + entries)
    return head[:_CRC_AT] + crc.to_bytes(4, "big") + entries


def decode_index_file(data: bytes, *, time: bool, base_offset: int) -> IndexFile | None:
    """Decode an index file; return ``None`` if it is damaged in any way (wrong magic,
    version, base offset, size, CRC, or entries that do not grow)."""
    if len(data) < INDEX_HEADER.size:
        return None
    magic, version, _, base, log_size, next_offset, max_ts, count, crc = INDEX_HEADER.unpack_from(
        data
    )
    entry = TIME_ENTRY if time else OFFSET_ENTRY
    if (
        magic != (TIME_MAGIC if time else OFFSET_MAGIC)
        or version != VERSION
        or base != base_offset
        or len(data) != INDEX_HEADER.size + count * entry.size
        or crc32c(data[:_CRC_AT] + data[INDEX_HEADER.size :]) != crc
        or next_offset < base_offset
        or log_size < 0
    ):
        return None
    idx: OffsetIndex | TimeIndex
    if time:
        tidx = TimeIndex(base_offset)
        for t, rel in TIME_ENTRY.iter_unpack(data[INDEX_HEADER.size :]):
            o = base_offset + rel
            if (tidx.timestamps and t <= tidx.timestamps[-1]) or o >= next_offset:
                return None
            if tidx.offsets and o <= tidx.offsets[-1]:
                return None
            tidx.timestamps.append(t)
            tidx.offsets.append(o)
        idx = tidx
    else:
        oidx = OffsetIndex(base_offset)
        for rel, pos in OFFSET_ENTRY.iter_unpack(data[INDEX_HEADER.size :]):
            o = base_offset + rel
            if oidx.offsets and (o <= oidx.offsets[-1] or pos <= oidx.positions[-1]):
                return None
            if pos >= log_size or o >= next_offset:
                return None
            oidx.offsets.append(o)
            oidx.positions.append(pos)
        idx = oidx
    return IndexFile(log_size, next_offset, max_ts, idx)
