"""The broker's cost of a lone produce request: CPU and round trip, with no client in the way.

Usage::

    python benchmarks/request_cost.py [--requests 20000] [--reps 5] [--fsync interval]
        [--src other/src ...] [--json]

A producer (:class:`~tidewire.client.AsyncProducer`, ``acks="durable"``, ``linger_ms=0``)
sends ``--requests`` 1 KB messages one at a time to a broker, each awaited, and every byte
it writes is recorded: its producer-id request, its metadata request and one produce request
a message. That stream is then replayed, byte for byte, to a fresh ``tidewire serve`` over a
new data directory, one request at a time, each waiting for its answer, from a plain
blocking socket (a client that costs a few µs a request, so what is measured is the
broker). The first 200 requests warm the broker up; over the rest:

* ``broker_cpu_us``: the broker's user + system CPU (``/proc/<pid>/stat``) a request;
* ``rtt_us``: the wall time a request, sending it to reading its whole answer.

With ``--src`` (repeatable) the broker runs the ``tidewire`` of each given source tree
(``PYTHONPATH``), the trees taking turns within each rep, so that a slow minute of the
machine hits them alike; the stream is recorded once, by this Python's client. Medians over
the reps. Progress goes to stderr; ``--json`` prints one JSON object instead of the table.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import signal
import socket
import statistics
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from tidewire.client import AsyncClient, AsyncProducer
from tidewire.client import _transport as transport_module
from tidewire.protocol.messages import TopicConfig

#: Bytes of every message.
SIZE = 1024
#: Requests replayed before the measured ones (connection set-up, caches, the first segment).
WARM_UP = 200
TOPIC = "cost"


def say(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


@contextmanager
def serve(data: str, src: str | None) -> Iterator[tuple[int, str]]:
    """``tidewire serve`` over ``data`` on a free port (the tidewire of ``src`` if given);
    its pid and address. Stopped with SIGTERM on the way out."""
    env = dict(os.environ)
    if src is not None:
        env["PYTHONPATH"] = src
    log = Path(data) / "broker.log"
    command = [sys.executable, "-m", "tidewire", "serve", "--data-dir", f"{data}/d", "--port", "0"]
    with open(log, "wb") as out:
        proc = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=env)
    try:
        deadline = time.monotonic() + 60
        while not (m := re.search(rb"listening on [^\s:]+:(\d+)\s", log.read_bytes())):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"the broker did not start (exit code {proc.poll()}); see {log}")
            time.sleep(0.02)
        yield proc.pid, f"127.0.0.1:{int(m.group(1))}"
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


async def make_topic(addr: str, fsync: str) -> None:
    async with AsyncClient(addr) as admin:
        await admin.create_topic(TOPIC, partitions=1, config=TopicConfig(fsync=fsync))


async def produce(addr: str, n: int) -> None:
    async with AsyncProducer(addr, acks="durable", linger_ms=0) as p:
        for i in range(n):
            await (await p.send(TOPIC, i.to_bytes(8, "little") + b"x" * (SIZE - 8)))


def record(n: int, fsync: str) -> list[bytes]:
    """What a producer writes to send ``n`` messages one at a time: one item a request."""
    writes: list[bytes] = []
    write = transport_module._Link.write

    def recording(link: Any, buffers: list[Any]) -> None:
        writes.append(b"".join(bytes(b) for b in buffers))
        write(link, buffers)

    transport_module._Link.write = recording  # type: ignore[method-assign,assignment]
    try:
        with tempfile.TemporaryDirectory(prefix="tidewire-cost-") as tmp, serve(tmp, None) as b:
            addr = b[1]
            asyncio.run(make_topic(addr, fsync))
            writes.clear()  # the admin client's requests are not the producer's
            asyncio.run(produce(addr, n))
    finally:
        transport_module._Link.write = write  # type: ignore[method-assign]
    return writes


def cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def read_answer(sock: socket.socket, buf: bytes) -> bytes:
    """Read until one whole frame is there; what follows it."""
    while True:
        if len(buf) >= 4:
            end = struct.unpack_from(">i", buf)[0] + 4
            if len(buf) >= end:
                return buf[end:]
        got = sock.recv(65536)
        if not got:
            raise SystemExit("the broker closed the connection during the replay")
        buf += got


def replay(writes: list[bytes], fsync: str, src: str | None) -> dict[str, float]:
    with tempfile.TemporaryDirectory(prefix="tidewire-cost-") as tmp, serve(tmp, src) as b:
        pid, addr = b
        asyncio.run(make_topic(addr, fsync))
        host, port = addr.rsplit(":", 1)
        with socket.create_connection((host, int(port))) as sock:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            buf = b""
            for w in writes[:WARM_UP]:
                sock.sendall(w)
                buf = read_answer(sock, buf)
            cpu0, t0 = cpu_s(pid), time.perf_counter()
            for w in writes[WARM_UP:]:
                sock.sendall(w)
                buf = read_answer(sock, buf)
            elapsed, cpu1 = time.perf_counter() - t0, cpu_s(pid)
    n = len(writes) - WARM_UP
    return {"requests": n, "broker_cpu_us": (cpu1 - cpu0) / n * 1e6, "rtt_us": elapsed / n * 1e6}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--requests", type=int, default=20000, help="produce requests replayed")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--fsync", default="interval", choices=("always", "interval"))
    ap.add_argument(
        "--src", action="append", help="a source tree whose broker to measure (repeatable)"
    )
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    if args.requests < 1 or args.reps < 1:
        ap.error(f"--requests={args.requests} and --reps={args.reps} must be positive")
    trees: list[str | None] = list(args.src) if args.src else [None]
    for tree in trees:
        if tree is not None and not (Path(tree) / "tidewire").is_dir():
            ap.error(f"--src {tree}: no tidewire package there")
    say(f"recording a producer's {args.requests:,} requests, one at a time")
    writes = record(args.requests + 1, args.fsync)  # and the producer's first, its set-up
    if len(writes) < WARM_UP + 2:
        raise SystemExit(f"the producer wrote {len(writes)} requests: too few to replay")
    runs: dict[str, list[dict[str, float]]] = {str(t or "this"): [] for t in trees}
    for rep in range(args.reps):
        for tree in trees:
            name = str(tree or "this")
            r = replay(writes, args.fsync, tree)
            runs[name].append(r)
            say(
                f"rep {rep + 1}/{args.reps} {name}: broker {r['broker_cpu_us']:.1f} CPU-µs "
                f"a request, round trip {r['rtt_us']:.1f} µs"
            )
    medians = {
        name: {k: statistics.median(r[k] for r in rs) for k in ("broker_cpu_us", "rtt_us")}
        for name, rs in runs.items()
    }
    if args.json:
        print(json.dumps({"fsync": args.fsync, "runs": runs, "median": medians}))
        return
    print(f"medians of {args.reps} ({len(writes) - WARM_UP:,} lone produce requests, 1 KB)")
    for name, m in medians.items():
        print(
            f"{name:40} broker {m['broker_cpu_us']:7.1f} CPU-µs a request   "
            f"round trip {m['rtt_us']:7.1f} µs"
        )


if __name__ == "__main__":
    main()
