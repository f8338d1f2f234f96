"""Damage benchmark: what finding and reading around a damaged range costs.

Usage::

    python benchmarks/damage_bench.py [--dir DIR] [--size-mib N] [--damage-mib M] [--reps R]

A log of one segment of ``--size-mib`` MiB (64) is written (batches of 16 records of 900
random bytes, about 14.6 KiB each) and closed; ``--damage-mib`` MiB (8) of random bytes then
overwrite its middle, and the indexes are deleted, so the next open must scan the segment (as
after a crash). Measured, ``--reps`` times (3), the median reported with the min-max range:

* ``scan open``: ``PartitionLog.open`` with the recovery point at the log's end: the scan
  checks every batch, meets the damage below the recovery point, and searches byte by byte for
  the next valid batch (:meth:`Segment.find_valid_batch`).
* ``read around``: reading the whole log in 1 MiB reads from offset 0, going on at
  ``damage_end`` on :class:`PartitionCorruptError`, as a consumer with ``skip_damaged`` does.

The damaged range found (offsets and bytes) is printed too.
"""

from __future__ import annotations

import argparse
import logging
import os
import shutil
import statistics
import tempfile
import time

from tidewire.errors import PartitionCorruptError
from tidewire.records import BatchBuilder
from tidewire.storage import LogConfig, OsFileSystem, PartitionLog

CONFIG = LogConfig(segment_bytes=1 << 30)


def build(directory: str, size: int) -> int:
    """Write the log; return its end offset."""
    log = PartitionLog.open(OsFileSystem(), directory, CONFIG)
    value = os.urandom(900)
    while log.size_bytes < size:
        b = BatchBuilder()
        for _ in range(16):
            b.append(value, timestamp_ms=1)
        log.append(b.build())
    end = log.log_end_offset
    log.close()
    return end


def damage(directory: str, size: int, damage_bytes: int) -> None:
    with open(f"{directory}/{0:020d}.log", "r+b") as f:
        f.seek((size - damage_bytes) // 2)
        f.write(os.urandom(damage_bytes))
    for suffix in (".index", ".timeindex"):
        os.remove(f"{directory}/{0:020d}{suffix}")


def read_around(log: PartitionLog, end: int) -> int:
    offset = served = 0
    while offset < end:
        try:
            r = log.read(offset, 1 << 20)
        except PartitionCorruptError as exc:
            offset = exc.damage_end
            continue
        offset = r.next_offset
        served += len(r.data)
    return served


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dir", default=None, help="where to write (default: a temporary dir)")
    ap.add_argument("--size-mib", type=int, default=64)
    ap.add_argument("--damage-mib", type=int, default=8)
    ap.add_argument("--reps", type=int, default=3)
    args = ap.parse_args()
    logging.disable(logging.CRITICAL)  # each open logs the damage at ERROR
    size, damaged = args.size_mib << 20, args.damage_mib << 20
    opens: list[float] = []
    reads: list[float] = []
    for _ in range(args.reps):
        root = tempfile.mkdtemp(dir=args.dir)
        try:
            directory = f"{root}/t-0"
            end = build(directory, size)
            damage(directory, size, damaged)
            t = time.perf_counter()
            log = PartitionLog.open(OsFileSystem(), directory, CONFIG, recovery_point=end)
            opens.append(time.perf_counter() - t)
            t = time.perf_counter()
            served = read_around(log, end)
            reads.append(time.perf_counter() - t)
            ranges = [(d.start, d.end, d.size) for d in log.damage]
            log.close()
        finally:
            shutil.rmtree(root)
    for name, xs in (("scan open", opens), ("read around", reads)):
        print(f"{name:12} {statistics.median(xs):6.3f} s  (min {min(xs):.3f}, max {max(xs):.3f})")
    print(f"damaged ranges (start, end, bytes): {ranges}; {served / 2**20:.1f} MiB served")


if __name__ == "__main__":
    main()
