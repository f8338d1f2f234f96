"""The record codec's hot loops, compiled beside pure Python: messages per second building
batches (``BatchBuilder.append`` + ``build``) and reading them (``read_records`` into a
NamedTuple per record, as consumers do, and ``read_columns``), 1 KB records by default.

Usage::

    python benchmarks/records_bench.py [--records N] [--value-bytes B] [--key-bytes B]
        [--batch-records R] [--codec none|gzip|snappy|lz4|zstd] [--reps 3] [--json]

No broker, no I/O: the codec alone, in this process. Each repetition runs every
implementation one after the other (side by side, so both see the same machine load); the
figures are medians over ``--reps``. Progress goes to stderr; the table (or, with ``--json``,
one JSON object) to stdout. Without the compiled module built (``pip install -e .`` or
``python setup.py build_ext --inplace``) only the pure-Python column is measured.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from types import ModuleType
from typing import Any, NamedTuple

from tidewire.records import IMPLEMENTATION, Codec, builder, check_batch, iter_batches, reader


class Rec(NamedTuple):
    """A consumer record's shape: what read_records builds per record."""

    topic: str
    partition: int
    offset: int
    timestamp: int
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes | None], ...]


def implementations() -> dict[str, Any]:
    impls: dict[str, Any] = {"python": (builder, reader)}
    try:
        from tidewire.records import _speedups  # type: ignore[attr-defined]
    except ImportError:
        print("records_bench: the compiled module is not built; pure Python only", file=sys.stderr)
    else:
        impls["compiled"] = (_speedups, _speedups)
    return impls


def build_all(
    build_mod: ModuleType, args: argparse.Namespace, value: bytes, key: bytes | None
) -> list[bytes]:
    out = []
    ts = 1_700_000_000_000
    codec = Codec[args.codec.upper()]
    left = args.records
    while left:
        b = build_mod.BatchBuilder(codec=codec)
        append = b.append
        for i in range(min(left, args.batch_records)):
            append(value, timestamp_ms=ts + i, key=key)
        left -= len(b)
        out.append(b.build())
    return out


def read_all(read_mod: ModuleType, data: bytes, positions: list[tuple[int, Any]]) -> int:
    read_records = read_mod.read_records
    n = 0
    for pos, h in positions:
        n += len(read_records(data, pos, h, Rec, "bench", 0))
    return n


def columns_all(read_mod: ModuleType, data: bytes, positions: list[tuple[int, Any]]) -> int:
    read_columns = read_mod.read_columns
    n = 0
    for pos, h in positions:
        n += len(read_columns(data, pos, h)[0])
    return n


def timed(fn: Callable[[], object]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--records", type=int, default=200_000)
    p.add_argument("--value-bytes", type=int, default=1024)
    p.add_argument("--key-bytes", type=int, default=0, help="0: records without a key")
    p.add_argument("--batch-records", type=int, default=256)
    p.add_argument("--codec", default="none", choices=["none", "gzip", "snappy", "lz4", "zstd"])
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    if args.records < 1 or args.batch_records < 1 or args.reps < 1:
        p.error("--records, --batch-records and --reps must be at least 1")

    value = os.urandom(args.value_bytes // 2).hex().encode().ljust(args.value_bytes, b"x")
    key = os.urandom(args.key_bytes) if args.key_bytes else None
    impls = implementations()
    # One stored buffer (built by the pure builder) that every reader reads.
    data = b"".join(build_all(builder, args, value, key))
    positions = list(iter_batches(data))
    for pos, _ in positions:
        check_batch(data, pos)

    ops: dict[str, Callable[[ModuleType, ModuleType], object]] = {
        "build": lambda b, r: build_all(b, args, value, key),
        "read_records": lambda b, r: read_all(r, data, positions),
        "read_columns": lambda b, r: columns_all(r, data, positions),
    }
    times: dict[str, dict[str, list[float]]] = {op: {name: [] for name in impls} for op in ops}
    for rep in range(args.reps):
        for op, fn in ops.items():
            for name, (b, r) in impls.items():
                t = timed(lambda fn=fn, b=b, r=r: fn(b, r))
                times[op][name].append(t)
                print(
                    f"records_bench: rep {rep + 1}/{args.reps} {op:<12} {name:<8} "
                    f"{args.records / t:>12,.0f} msg/s",
                    file=sys.stderr,
                )

    result: dict[str, Any] = {
        "records": args.records,
        "value_bytes": args.value_bytes,
        "key_bytes": args.key_bytes,
        "batch_records": args.batch_records,
        "codec": args.codec,
        "reps": args.reps,
        "default_implementation": IMPLEMENTATION,
        "msg_per_s": {
            op: {name: round(args.records / statistics.median(ts)) for name, ts in by.items()}
            for op, by in times.items()
        },
    }
    for figures in result["msg_per_s"].values():
        if "compiled" in figures:
            figures["speedup"] = round(figures["compiled"] / figures["python"], 2)
    if args.json:
        print(json.dumps(result))
        return
    print(
        f"{args.records:,} records of {args.value_bytes:,} B "
        f"(key {args.key_bytes} B, {args.batch_records} a batch, codec {args.codec}), "
        f"median of {args.reps}, msg/s:"
    )
    names = list(impls)
    print(
        f"{'':<14}" + "".join(f"{n:>14}" for n in names) + ("   speedup" if len(names) > 1 else "")
    )
    for op, figures in result["msg_per_s"].items():
        line = f"{op:<14}" + "".join(f"{figures[n]:>14,}" for n in names)
        if "speedup" in figures:
            line += f"   {figures['speedup']:>6.2f}x"
        print(line)


if __name__ == "__main__":
    main()
