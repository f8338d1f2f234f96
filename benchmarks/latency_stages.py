"""Where a lone message's time goes inside the broker: the stages of one produce, one at a time.

Usage::

    python benchmarks/latency_stages.py [--seconds 5] [--fsync always] [--rate 0] [--json]

It starts ``tidewire serve`` with timestamps (``time.perf_counter_ns``) taken by thin wrappers
around the steps a produce request crosses (the bytes received, the request's task, the
broker's ``produce``, the log's queueing, the end of the loop turn that writes the batch and
starts the group commit, its fsync starting (in a flusher thread, or on the loop for a
partition written one message at a time), the fsync's end, the loop taking it back, the
answer written), publishes one message at a time for ``--seconds`` from this
process (each ``send`` awaited, ``acks="durable"``, ``linger_ms=0``), stops the broker (which
writes its timestamps to a file at exit), and prints the p50 and p90 of every stage.
``--rate N`` publishes paced at N msg/s instead (``latency.py``'s paced producer, up to 1,000
futures outstanding): then the stages also show the waits of a batch that arrives while its
log's previous group commit is still running, and the acknowledgements' p50/p99 are printed.

The wrappers reach into private methods of the broker (``tidewire.server.tcp``,
``tidewire.storage.log``): the benchmark follows the code, it is not an API. The broker runs
the ``tidewire`` this Python imports (``PYTHONPATH`` is passed on). Progress goes to stderr;
``--json`` prints one JSON object instead of the table.
"""

from __future__ import annotations

import argparse
import atexit
import bisect
import json
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

#: The stages, in order: (name, start mark, end mark).
STAGES = (
    ("request received -> its task (or fast path) runs", "recv", "task"),
    ("task -> Broker.produce (gate, handler)", "task", "produce"),
    ("produce -> log queues the batch", "produce", "queue"),
    ("queued -> end of turn: write, flush started", "queue", "write"),
    ("flush submitted -> its fsync starts", "write", "thread"),
    ("fsync and index work", "thread", "synced"),
    ("fsync done -> loop settles the waiters", "synced", "settled"),
    ("settled -> answer written", "settled", "answer"),
    ("broker total", "recv", "answer"),
)


def say(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def run_broker(argv: list[str], out: str) -> None:
    """``tidewire serve`` with the stage wrappers installed; timestamps to ``out`` at exit."""
    from tidewire.broker import core
    from tidewire.cli import main
    from tidewire.server import tcp
    from tidewire.storage import log as log_module

    ns = time.perf_counter_ns
    marks: dict[str, list[int]] = {name: [] for _, a, b in STAGES for name in (a, b)}
    conn = tcp.BinaryConnection if hasattr(tcp, "BinaryConnection") else None
    if conn is None:
        conn = next(
            c
            for c in vars(tcp).values()
            if isinstance(c, type)
            and (hasattr(c, "data_received") or hasattr(c, "buffer_updated"))
            and hasattr(c, "_handle")
        )
    plog = log_module.PartitionLog

    def timed(cls: Any, name: str, mark: str, *, after: bool = False) -> None:
        inner = getattr(cls, name)
        if hasattr(inner, "__code__") and inner.__code__.co_flags & 0x80:  # a coroutine

            async def wrapper_async(*a: Any, **k: Any) -> Any:
                marks[mark].append(ns())
                return await inner(*a, **k)

            setattr(cls, name, wrapper_async)
            return

        def wrapper(*a: Any, **k: Any) -> Any:
            if not after:
                marks[mark].append(ns())
            try:
                return inner(*a, **k)
            finally:
                if after:
                    marks[mark].append(ns())

        setattr(cls, name, wrapper)

    # The bytes received: a plain protocol's data_received, a buffered one's buffer_updated.
    timed(conn, "buffer_updated" if hasattr(conn, "buffer_updated") else "data_received", "recv")
    timed(conn, "_handle", "task")
    timed(conn, "_write", "answer")
    # Answers one group commit settles leave together, one loop callback later.
    if hasattr(conn, "send_held"):
        timed(conn, "send_held", "answer")
    timed(core.Broker, "produce", "produce")
    # A produce handled without a task (the listener's fast path): its handling starts where a
    # task would have run, and the broker's part starts in produce_soon.
    if hasattr(conn, "_produce_in_context"):
        timed(conn, "_produce_in_context", "task")
    if hasattr(core.Broker, "produce_soon"):
        timed(core.Broker, "produce_soon", "produce")
    timed(plog, "_queue", "queue")
    timed(plog, "_end_of_turn", "write")
    timed(plog, "_timed_flush_io", "thread")
    timed(plog, "_flush_io", "synced", after=True)
    timed(plog, "_flush_finished", "settled")
    atexit.register(lambda: Path(out).write_text(json.dumps(marks)))
    sys.argv = ["tidewire", *argv]
    main()


def stages(marks: dict[str, list[int]]) -> dict[str, dict[str, float]]:
    """Follow each batch write to the marks around it; p50/p90 of every stage, µs."""
    rows: list[dict[str, int]] = []
    for w in marks["write"][5:]:  # the first ones: the topic's creation, the warm-up
        row = {"write": w}

        def before(mark: str, t: int) -> int | None:
            xs = marks[mark]
            i = bisect.bisect_right(xs, t) - 1
            return xs[i] if i >= 0 else None

        def after(mark: str, t: int) -> int | None:
            xs = marks[mark]
            i = bisect.bisect_left(xs, t)
            return xs[i] if i < len(xs) else None

        got = [
            ("queue", before("queue", w)),
            ("produce", before("produce", w)),
            ("task", before("task", w)),
            ("recv", before("recv", w)),
        ]
        t = w
        for mark in ("thread", "synced", "settled", "answer"):
            found = after(mark, t)
            if found is None:
                break
            got.append((mark, found))
            t = found
        if any(v is None for _, v in got) or len(got) < 8:
            continue
        row.update({k: v for k, v in got if v is not None})
        rows.append(row)
    out: dict[str, dict[str, float]] = {}
    for name, a, b in STAGES:
        xs = sorted(r[b] - r[a] for r in rows)
        if xs:
            out[name] = {
                "p50_us": xs[len(xs) // 2] / 1000,
                "p90_us": xs[int(len(xs) * 0.9)] / 1000,
                "n": len(xs),
            }
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=5.0, help="length of the run")
    ap.add_argument("--fsync", default="always", help="the topic's fsync policy")
    ap.add_argument(
        "--rate", type=int, default=0, help="publish paced at this rate (0: one at a time)"
    )
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--role", default="bench", help=argparse.SUPPRESS)
    ap.add_argument("--marks", help=argparse.SUPPRESS)
    args, rest = ap.parse_known_args()
    if args.role == "broker":
        run_broker(rest, args.marks)
        return
    if args.seconds <= 0:
        ap.error(f"--seconds={args.seconds} must be positive")
    sys.path.insert(0, str(Path(__file__).parent))
    import latency  # the sibling benchmark: its broker handle and publishing loops

    with tempfile.TemporaryDirectory(prefix="tidewire-stages-") as tmp:
        log = Path(tmp) / "broker.log"
        marks_file = f"{tmp}/marks.json"
        command = [sys.executable, __file__, "--role", "broker", "--marks", marks_file]
        command += ["serve", "--data-dir", f"{tmp}/d", "--port", "0"]
        with open(log, "wb") as out:
            proc = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT)
        try:
            deadline = time.monotonic() + 60
            while not (m := re.search(rb"listening on [^\s:]+:(\d+)\s", log.read_bytes())):
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise SystemExit(f"the broker did not start; see {log}")
                time.sleep(0.02)
            broker = latency.Broker(proc, f"127.0.0.1:{int(m.group(1))}")
            latency.run_async(latency.make_topic(broker.addr, "stages", args.fsync))
            if args.rate > 0:
                say(f"{args.rate:,} msg/s paced for {args.seconds} s, fsync={args.fsync}")
                paced = latency.run_async(
                    latency.publish_paced(broker.addr, "stages", args.rate, args.seconds)
                )
                acks = paced["acks"]
                r = {
                    "messages": paced["sent"],
                    "ack_p50_us": latency.quantile(acks, 0.5) / 1000,
                    "ack_p99_us": latency.quantile(acks, 0.99) / 1000,
                    "msgs_per_batch": paced["sent"] / max(paced["batches"], 1),
                }
            else:
                say(f"one message at a time for {args.seconds} s, fsync={args.fsync}")
                r = latency.run_async(
                    latency.publish_one_at_a_time(broker.addr, "stages", args.seconds)
                )
        finally:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                proc.wait(60)
        result = {"one_at_a_time": r, "stages": stages(json.loads(Path(marks_file).read_text()))}
    if args.json:
        print(json.dumps(result))
        return
    if args.rate > 0:
        print(
            f"{r['messages']:,} messages at {args.rate:,} msg/s, "
            f"{r['msgs_per_batch']:.2f} a batch, "
            f"ack p50 {r['ack_p50_us']:.0f} us p99 {r['ack_p99_us']:.0f} us (broker stages, us)"
        )
    else:
        print(
            f"{r['messages']:,} messages one at a time, round trip p50 {r['rtt_p50_us']:.0f} us "
            f"(broker stages, us)"
        )
    for name, v in result["stages"].items():
        print(f"{name:46} p50 {v['p50_us']:8.1f}  p90 {v['p90_us']:8.1f}")


if __name__ == "__main__":
    main()
