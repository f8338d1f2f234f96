"""WebSocket delivery rate: messages per second over one WebSocket of the HTTP gateway.

Usage::

    python benchmarks/ws_bench.py [--messages N] [--size BYTES] [--batch B ...]
        [--repeat R] [--json]

It starts a broker (``python -m tidewire serve --http-port ...``, ``--fsync never``) in a
process of its own over a temporary data directory, so that the broker and this client do
not share a CPU, and stops it at the end. Two scenarios, each with every ``--batch`` value
(messages per WebSocket frame; 1 is one message object per frame, more is a JSON array):

- **pre-filled**: ``--messages`` messages of ``--size`` bytes are published first
  (``tidewire bench produce``); the clock runs from opening the socket (``from=earliest``)
  to the last message received;
- **live**: the socket is open (``from=latest``) before ``tidewire bench produce`` publishes
  the messages; the clock runs from the first message received to the last.

The client parses every frame as JSON and grants credit back as it goes (a window of
``--credit`` messages, refilled at half), the way a real consumer does. Each figure is the
median of ``--repeat`` runs; the ratio is against the target of 50,000 msg/s.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

from websockets.asyncio.client import connect

from producer_bench import serve

TARGET = 50_000


@contextlib.contextmanager
def broker() -> Iterator[tuple[str, str]]:
    """A broker process with the HTTP API (see :func:`serve`): yields (TCP address, ws://
    base)."""
    with serve("--fsync", "never", http=True) as b:
        yield b.addr, f"ws://{b.http}"


def produce(addr: str, topic: str, messages: int, size: int) -> subprocess.Popen[bytes]:
    """``tidewire bench produce`` in a process of its own."""
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tidewire",
            "bench",
            "produce",
            "--addr",
            addr,
            "--topic",
            topic,
            "--messages",
            str(messages),
            "--size",
            str(size),
            "--acks",
            "leader",
            "--json",
        ],
        stdout=subprocess.DEVNULL,
    )


async def consume(
    url: str, messages: int, credit: int, *, started: asyncio.Event | None = None
) -> tuple[float, int]:
    """Receive ``messages`` messages; return (seconds, frames). The clock starts at the
    connection (``started`` is None) or at the first message."""
    got = frames = granted_back = 0
    t0 = time.perf_counter()
    async with connect(url, max_size=None, compression=None) as ws:
        hello = json.loads(await ws.recv())
        assert hello["type"] == "subscribed", hello
        if started is not None:
            started.set()
        first = True
        while got < messages:
            frame = await asyncio.wait_for(ws.recv(), 60)
            if first and started is not None:
                t0 = time.perf_counter()
                first = False
            data = json.loads(frame)
            n = len(data) if isinstance(data, list) else 1
            got += n
            frames += 1
            granted_back += n
            if granted_back >= credit // 2:
                await ws.send(json.dumps({"type": "credit", "messages": granted_back}))
                granted_back = 0
    return time.perf_counter() - t0, frames


async def live(addr: str, url: str, topic: str, args: argparse.Namespace) -> tuple[float, int]:
    started = asyncio.Event()
    task = asyncio.create_task(consume(url, args.messages, args.credit, started=started))
    await started.wait()
    proc = produce(addr, topic, args.messages, args.size)
    try:
        return await task
    finally:
        await asyncio.to_thread(proc.wait)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=200_000)
    parser.add_argument("--size", type=int, default=100, help="bytes of each value")
    parser.add_argument("--batch", type=int, nargs="+", default=[1, 100])
    parser.add_argument("--credit", type=int, default=20_000, help="message window")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args()
    results: list[dict[str, Any]] = []
    with broker() as (addr, base):
        print(f"publishing {args.messages:,} messages of {args.size} B", file=sys.stderr)
        if produce(addr, "prefilled", args.messages, args.size).wait() != 0:
            raise SystemExit("publishing the pre-filled topic failed")
        for batch in args.batch:
            query = f"credit={args.credit}&credit_bytes={1 << 40}&batch={batch}"
            for scenario in ("pre-filled", "live"):
                rates: list[float] = []
                frames = 0
                for r in range(args.repeat):
                    if scenario == "pre-filled":
                        url = f"{base}/v1/topics/prefilled/stream?from=earliest&{query}"
                        secs, frames = asyncio.run(consume(url, args.messages, args.credit))
                    else:
                        topic = f"live-{batch}-{r}"
                        subprocess.run(
                            [
                                sys.executable,
                                "-m",
                                "tidewire",
                                "topic",
                                "create",
                                topic,
                                "--addr",
                                addr,
                            ],
                            check=True,
                            stdout=subprocess.DEVNULL,
                        )
                        url = f"{base}/v1/topics/{topic}/stream?from=latest&{query}"
                        secs, frames = asyncio.run(live(addr, url, topic, args))
                    rates.append(args.messages / secs)
                    print(  # progress, on stderr (stdout is the result)
                        f"  {scenario:10} batch={batch:<4} run {r + 1}: "
                        f"{args.messages / secs:,.0f} msg/s",
                        file=sys.stderr,
                    )
                median = statistics.median(rates)
                results.append(
                    {
                        "scenario": scenario,
                        "batch": batch,
                        "messages": args.messages,
                        "size": args.size,
                        "runs_msg_per_s": [round(x) for x in rates],
                        "median_msg_per_s": round(median),
                        "frames": frames,
                        "ratio_to_target": round(median / TARGET, 2),
                    }
                )
    if args.json:
        print(json.dumps({"target_msg_per_s": TARGET, "results": results}, indent=2))
        return
    print(f"WebSocket delivery, {args.messages:,} messages of {args.size} B, one socket:")
    for res in results:
        print(
            f"  {res['scenario']:10} batch={res['batch']:<4} "
            f"{res['median_msg_per_s']:>9,} msg/s (median of {len(res['runs_msg_per_s'])}), "
            f"{res['ratio_to_target']:.2f}x the {TARGET:,} msg/s target"
        )


if __name__ == "__main__":
    main()
