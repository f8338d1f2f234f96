"""Consumer CPU per message of two source trees side by side, against one broker: the fair
before/after comparison on a shared, noisy machine.

Usage::

    python benchmarks/client_ab.py --tree BEFORE/src --tree AFTER/src [--messages N]
        [--readers records,poll,batch,values,arrow] [--rounds R] [--json]

It starts one broker (see ``producer_bench.serve``), stores ``--messages`` values of 1 KiB in 4
partitions, then for ``--rounds`` rounds runs, for every tree in turn, one fresh process per
reader (``PYTHONPATH`` set to the tree, on uvloop) that reads every record from ``"earliest"``:
``records`` (``async for`` over :class:`AsyncConsumer`), ``poll`` (``poll()`` in a loop),
``batch`` (``poll_batch()``, skipped for a tree without it; it counts the records),
``values`` (``poll_batch()`` reading every value, as a reader that uses them does), ``arrow``
(``poll_batch().to_arrow()``, needs pyarrow). Each prints its CPU time per message (user +
system of the reading process / messages), msg/s and page faults per 1,000 messages, and the
broker's CPU time per message while it read; the result is the median per tree and reader.
Progress on stderr.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import statistics
import subprocess
import sys
import time

from client_speed import _fill, _runner
from producer_bench import serve

TOPIC = "ab"
PARTITIONS = 4


async def _read(addr: str, n: int, reader: str) -> tuple[float, float]:
    from tidewire.client import AsyncConsumer  # the tree under test's

    async with AsyncConsumer(addr) as consumer:
        await consumer.assign([(TOPIC, p, "earliest") for p in range(PARTITIONS)])
        got = 0
        cpu0, t0 = time.process_time(), time.perf_counter()
        if reader == "records":
            async for record in consumer:
                got += 1
                len(record.value or b"")
                if got >= n:
                    break
        elif reader == "poll":
            while got < n:
                for record in await consumer.poll(10.0):
                    got += 1
                    len(record.value or b"")
        elif reader == "arrow":
            while got < n:
                batch = await consumer.poll_batch(10.0)  # type: ignore[attr-defined]
                got += batch.to_arrow().num_rows
        elif reader == "values":
            while got < n:
                batch = await consumer.poll_batch(10.0)  # type: ignore[attr-defined]
                got += len(batch)
                for value in batch.values:
                    len(value or b"")
        else:
            while got < n:
                got += len(await consumer.poll_batch(10.0))  # type: ignore[attr-defined]
        return time.process_time() - cpu0, time.perf_counter() - t0


def _cpu_s(pid: int) -> tuple[float, int]:
    """User + system CPU seconds of process ``pid`` so far, and its minor page faults
    (Linux /proc)."""
    with open(f"/proc/{pid}/stat", encoding="ascii") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK"), int(fields[7])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tree", action="append", default=[], help="a src directory (twice or more)")
    ap.add_argument("--messages", type=int, default=300_000)
    ap.add_argument("--readers", default="records,poll,batch")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--reader", help=argparse.SUPPRESS)  # the child: read and print
    ap.add_argument("--addr", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.reader:
        flt0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        cpu, elapsed = _runner("uvloop")(_read(args.addr, args.messages, args.reader))
        faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - flt0
        print(
            json.dumps(
                {
                    "cpu_us_per_msg": cpu / args.messages * 1e6,
                    "msg_per_s": args.messages / elapsed,
                    # Page faults (fresh memory: the kernel zeroes a page for each).
                    "faults_per_1k_msg": faults / args.messages * 1000,
                }
            )
        )
        return
    if not args.tree:
        ap.error("name the source trees to compare: --tree DIR --tree DIR")
    runs: dict[str, list[dict[str, float]]] = {}
    with serve(
        "--log-level", "WARNING", "--fsync", "interval", "--partitions", str(PARTITIONS)
    ) as b:
        print(f"storing {args.messages:,} messages", file=sys.stderr, flush=True)
        asyncio.run(_fill(b.addr, TOPIC, args.messages))
        os.sync()  # the fill written back now, not by the kernel during the timed reads
        for rnd in range(args.rounds):
            for tree in args.tree:
                has_batch = (
                    "poll_batch"
                    in open(  # noqa: SIM115
                        os.path.join(tree, "tidewire", "client", "_consumer.py"), encoding="utf-8"
                    ).read()
                )
                for reader in args.readers.split(","):
                    if reader in {"batch", "values", "arrow"} and not has_batch:
                        continue
                    broker0 = _cpu_s(b.pid)
                    out = subprocess.run(
                        [
                            sys.executable,
                            __file__,
                            "--reader",
                            reader,
                            "--addr",
                            b.addr,
                            "--messages",
                            str(args.messages),
                        ],
                        env=dict(os.environ, PYTHONPATH=tree),
                        capture_output=True,
                        text=True,
                        check=True,
                    ).stdout
                    got = json.loads(out.strip().splitlines()[-1])
                    # Ticks of 10 ms: ~1% of a million-message read.
                    broker1 = _cpu_s(b.pid)
                    got["broker_cpu_us_per_msg"] = (broker1[0] - broker0[0]) / args.messages * 1e6
                    got["broker_faults_per_1k_msg"] = (
                        (broker1[1] - broker0[1]) / args.messages * 1e3
                    )
                    runs.setdefault(f"{tree} {reader}", []).append(got)
                    print(
                        f"round {rnd + 1} {tree} {reader}: {got['cpu_us_per_msg']:.2f} CPU-us/msg, "
                        f"{got['msg_per_s']:,.0f} msg/s, "
                        f"{got['faults_per_1k_msg']:.0f} faults/1k msg, broker "
                        f"{got['broker_cpu_us_per_msg']:.2f} CPU-us/msg, "
                        f"{got['broker_faults_per_1k_msg']:.0f} faults/1k msg",
                        file=sys.stderr,
                        flush=True,
                    )
    result = {
        name: {
            "cpu_us_per_msg": round(statistics.median(r["cpu_us_per_msg"] for r in rs), 2),
            "msg_per_s": round(statistics.median(r["msg_per_s"] for r in rs)),
            "runs_cpu_us_per_msg": [round(r["cpu_us_per_msg"], 2) for r in rs],
            "runs_msg_per_s": [round(r["msg_per_s"]) for r in rs],
            "broker_cpu_us_per_msg": round(
                statistics.median(r["broker_cpu_us_per_msg"] for r in rs), 2
            ),
            "faults_per_1k_msg": round(statistics.median(r["faults_per_1k_msg"] for r in rs)),
            "broker_faults_per_1k_msg": round(
                statistics.median(r["broker_faults_per_1k_msg"] for r in rs)
            ),
        }
        for name, rs in runs.items()
    }
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        for name, r in result.items():
            runs_text = r["runs_cpu_us_per_msg"]
            print(
                f"{name}: {r['cpu_us_per_msg']} CPU-us/msg (runs {runs_text}), "
                f"{r['msg_per_s']:,} msg/s, broker {r['broker_cpu_us_per_msg']} CPU-us/msg"
            )


if __name__ == "__main__":
    main()
