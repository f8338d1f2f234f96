"""Zeros written ahead (``preallocate_bytes``): one durable append at a time, with and without.

Usage::

    python benchmarks/preallocate_bench.py [--dir DIR] [--count N] [--reps R] [--json]

Four configurations, interleaved ``--reps`` times (the machine drifts; each gets the same
share of it), each ``--count`` appends of one 1 KB record, every one awaited before the next:

* ``raw grow``: ``os.pwrite`` at the end of a file, then ``os.fdatasync``: each sync also
  writes the file's new size.
* ``raw zeros``: the same over 16 MiB of zeros written and synced first: each sync writes
  data only.
* ``log off``: a :class:`~tidewire.storage.PartitionLog` under ``fsync=always`` with
  ``preallocate_bytes=0``, ``await log.append_async(batch)`` one at a time (the group commit
  in the storage's flusher thread, as in the broker).
* ``log on``: the same with the default ``preallocate_bytes`` (256 KiB).

Reported per configuration: the median over reps of the p50, p99 and p99.9 latency of one
durable append (µs), and of appends a second; then the ratios on/off and zeros/grow. Progress
goes to stderr; ``--json`` prints one JSON object instead of the table.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from typing import Any

from tidewire.records.builder import BatchBuilder
from tidewire.storage import FsyncPolicy, LogConfig, OsFileSystem, PartitionLog
from tidewire.storage.log import DEFAULT_PREALLOCATE_BYTES

RECORD = 1024
CONFIGS = ("raw grow", "raw zeros", "log off", "log on")


def _quantiles(lat: list[float]) -> dict[str, float]:
    lat = sorted(lat)

    def q(f: float) -> float:
        return lat[min(len(lat) - 1, int(len(lat) * f))] * 1e6

    return {"p50_us": q(0.5), "p99_us": q(0.99), "p999_us": q(0.999)}


def raw(path: str, count: int, *, zeros: bool) -> dict[str, float]:
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        if zeros:
            os.pwrite(fd, bytes(16 << 20), 0)
            os.fdatasync(fd)
        data = os.urandom(RECORD + 90)
        lat: list[float] = []
        started = time.perf_counter()
        for i in range(count):
            t = time.perf_counter()
            os.pwrite(fd, data, i * len(data))
            os.fdatasync(fd)
            lat.append(time.perf_counter() - t)
        elapsed = time.perf_counter() - started
    finally:
        os.close(fd)
        os.remove(path)
    return {**_quantiles(lat), "per_s": count / elapsed}


def one_batch() -> bytes:
    b = BatchBuilder()
    b.append(os.urandom(RECORD), timestamp_ms=int(time.time() * 1000))
    return bytes(b.build())


async def _log_async(directory: str, count: int, preallocate: int) -> dict[str, float]:
    log = PartitionLog.open(OsFileSystem(), directory, LogConfig(fsync=FsyncPolicy.ALWAYS))
    log.preallocate_bytes = preallocate
    batch = one_batch()
    lat: list[float] = []
    try:
        started = time.perf_counter()
        for _ in range(count):
            t = time.perf_counter()
            await log.append_async(batch)
            lat.append(time.perf_counter() - t)
        elapsed = time.perf_counter() - started
    finally:
        log.close()
    return {**_quantiles(lat), "per_s": count / elapsed}


def log_run(directory: str, count: int, preallocate: int) -> dict[str, float]:
    try:
        return asyncio.run(_log_async(directory, count, preallocate))
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def run(root: str, count: int, reps: int, progress: Callable[[str], None]) -> dict[str, Any]:
    runs: dict[str, list[dict[str, float]]] = {c: [] for c in CONFIGS}
    default = DEFAULT_PREALLOCATE_BYTES
    for rep in range(reps):
        for name in CONFIGS:
            progress(f"rep {rep + 1}/{reps}: {name}")
            if name.startswith("raw"):
                r = raw(f"{root}/raw", count, zeros=name == "raw zeros")
            else:
                r = log_run(f"{root}/log", count, default if name == "log on" else 0)
            runs[name].append(r)
    med = {
        name: {k: statistics.median(r[k] for r in rs) for k in rs[0]} for name, rs in runs.items()
    }
    ratios = {
        "log on / off p50": med["log on"]["p50_us"] / med["log off"]["p50_us"],
        "log on / off p99": med["log on"]["p99_us"] / med["log off"]["p99_us"],
        "log on / off per_s": med["log on"]["per_s"] / med["log off"]["per_s"],
        "raw zeros / grow p50": med["raw zeros"]["p50_us"] / med["raw grow"]["p50_us"],
    }
    return {
        "count": count,
        "reps": reps,
        "preallocate_bytes": default,
        "median": med,
        "runs": runs,
        "ratios": ratios,
    }


def render(result: dict[str, Any]) -> str:
    lines = [f"{'configuration':<12} {'p50 µs':>8} {'p99 µs':>8} {'p99.9 µs':>9} {'per s':>8}"]
    for name, m in result["median"].items():
        lines.append(
            f"{name:<12} {m['p50_us']:>8.0f} {m['p99_us']:>8.0f} {m['p999_us']:>9.0f} "
            f"{m['per_s']:>8.0f}"
        )
    lines.append("")
    lines += [f"{k}: {v:.2f}x" for k, v in result["ratios"].items()]
    return "\n".join(lines)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dir", help="parent of the scratch directory (default /var/tmp)")
    p.add_argument("--count", type=int, default=3000, help="appends per run")
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--json", action="store_true", help="print one JSON object, no table")
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    root = tempfile.mkdtemp(prefix="tidewire-prealloc-", dir=args.dir or "/var/tmp")
    try:
        result = run(root, args.count, args.reps, lambda m: print(m, file=sys.stderr))
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print(json.dumps(result) if args.json else render(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
