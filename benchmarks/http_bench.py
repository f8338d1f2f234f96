"""HTTP publish throughput: ``POST /v1/topics/{topic}/messages`` over keep-alive connections.

Usage::

    python benchmarks/http_bench.py [--messages N] [--connections C] [--repeat R]
        [--value-bytes B] [--partitions P] [--fsync always|interval|never]
        [--httpx-messages M] [--seconds S] [--no-wrk] [--url http://HOST:PORT] [--json]

Without ``--url`` it starts a broker (``python -m tidewire serve --http-port 0``) in a process
of its own over a temporary data directory, and stops it at the end. Every load generator
runs in a process of its own too, so it does not share the broker's interpreter:

- ``httpx``: C ``httpx.AsyncClient`` s, one keep-alive connection each, M publishes in all;
- ``raw``: the same requests written on C keep-alive asyncio connections by hand (a Python
  client without a client library's own cost: closer to what the broker can take);
- ``wrk``: when ``wrk`` is installed (``apt-get install wrk``), C connections for S seconds
  with a Lua script that POSTs the same JSON body.

Each runs R times; the figures are medians, with the ratio to the target of 10,000
publishes/s. Every answer must be 201: a run with another status fails the benchmark.

With a broker of its own it also reports the broker's CPU time per publish (user + system,
all its threads, from /proc) and 1e6 divided by it: what one core given to the broker alone
would serve. It depends less on what else the machine runs than the rate does (though a
busy machine still inflates it), and it grows when the load generator is slow (fewer
requests per turn of the broker's event loop).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from typing import Any

from producer_bench import serve

TARGET = 10_000  # publishes/s
TOPIC = "bench"


@contextlib.contextmanager
def broker(fsync: str, partitions: int) -> Iterator[tuple[str, int]]:
    """A broker process with the HTTP API (see :func:`serve`); its base URL and PID."""
    with serve("--fsync", fsync, "--partitions", str(partitions), http=True) as b:
        yield f"http://{b.http}", b.pid


def body(value_bytes: int) -> bytes:
    return json.dumps({"value": "x" * value_bytes}).encode()


# --- the Python load generators (each run in a process of its own) ------------------------------


async def load_httpx(url: str, n: int, connections: int, payload: bytes) -> dict[str, Any]:
    import httpx

    # One client per connection: one shared pool serving many tasks costs httpx more than
    # the requests themselves.
    limits = httpx.Limits(max_connections=1, max_keepalive_connections=1)
    left = n
    bad: list[int] = []

    async def worker(client: httpx.AsyncClient) -> None:
        nonlocal left
        headers = {"content-type": "application/json"}
        while left > 0:
            left -= 1
            r = await client.post(f"/v1/topics/{TOPIC}/messages", content=payload, headers=headers)
            if r.status_code != 201:
                bad.append(r.status_code)

    async with contextlib.AsyncExitStack() as stack:
        clients = [
            await stack.enter_async_context(
                httpx.AsyncClient(base_url=url, limits=limits, timeout=60)
            )
            for _ in range(connections)
        ]
        for client in clients:
            await client.get("/healthz/ready")  # connected before the clock starts
        start = time.perf_counter()
        await asyncio.gather(*(worker(client) for client in clients))
        took = time.perf_counter() - start
    return {"requests": n, "seconds": took, "errors": len(bad)}


async def load_raw(url: str, n: int, connections: int, payload: bytes) -> dict[str, Any]:
    host, port = url.removeprefix("http://").rsplit(":", 1)
    request = (
        f"POST /v1/topics/{TOPIC}/messages HTTP/1.1\r\nHost: {host}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(payload)}\r\n\r\n"
    ).encode() + payload
    left = n
    errors = 0

    async def worker() -> None:
        nonlocal left, errors
        reader, writer = await asyncio.open_connection(host, int(port))
        try:
            while left > 0:
                left -= 1
                writer.write(request)
                head = await reader.readuntil(b"\r\n\r\n")
                if not head.startswith(b"HTTP/1.1 201"):
                    errors += 1
                m = re.search(rb"(?i)content-length: *(\d+)", head)
                await reader.readexactly(int(m.group(1)) if m else 0)
        finally:
            writer.close()

    start = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(connections)))
    return {"requests": n, "seconds": time.perf_counter() - start, "errors": errors}


def run_loader(kind: str, url: str, args: argparse.Namespace) -> dict[str, Any]:
    """Run one load generator in a child process; its result."""
    out = subprocess.run(
        [
            sys.executable,
            __file__,
            *("--_load", kind, "--url", url),
            *("--messages", str(args.httpx_messages if kind == "httpx" else args.messages)),
            *("--connections", str(args.connections), "--value-bytes", str(args.value_bytes)),
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    return dict(json.loads(out.stdout))


# --- wrk ------------------------------------------------------------------------------------------


def run_wrk(url: str, args: argparse.Namespace) -> dict[str, Any]:
    payload = body(args.value_bytes).decode()
    with tempfile.NamedTemporaryFile("w", suffix=".lua", delete=False) as f:
        f.write(
            'wrk.method = "POST"\n'
            f"wrk.body = {json.dumps(payload)}\n"
            'wrk.headers["Content-Type"] = "application/json"\n'
        )
        script = f.name
    try:
        out = subprocess.run(
            [
                "wrk",
                # One thread: one core for wrk, the other for the broker.
                *("-t", "1", "-c", str(args.connections), "-d", f"{args.seconds}s"),
                *("-s", script, "--latency", f"{url}/v1/topics/{TOPIC}/messages"),
            ],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    finally:
        os.unlink(script)
    rate = float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))  # type: ignore[union-attr]
    requests = int(re.search(r"(\d+) requests in", out).group(1))  # type: ignore[union-attr]
    m = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    p50 = re.search(r"50%\s+([\d.]+\w+)", out)
    p99 = re.search(r"99%\s+([\d.]+\w+)", out)
    return {
        "requests": requests,
        "seconds": requests / rate if rate else 0.0,
        "errors": int(m.group(1)) if m else 0,
        "p50": p50.group(1) if p50 else "",
        "p99": p99.group(1) if p99 else "",
    }


# --- main -----------------------------------------------------------------------------------------


def cpu_seconds(pid: int | None) -> float:
    """CPU time (user + system, every thread) process ``pid`` has used; 0 if unknown."""
    if pid is None:
        return 0.0
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def measure(url: str, args: argparse.Namespace, pid: int | None) -> dict[str, Any]:
    import httpx

    with httpx.Client(base_url=url, timeout=30) as c:
        c.delete(f"/v1/topics/{TOPIC}")
        r = c.post("/v1/topics", json={"name": TOPIC, "partitions": args.partitions})
        r.raise_for_status()
    kinds = ["raw", "httpx"]
    if not args.no_wrk and shutil.which("wrk"):
        kinds.append("wrk")
    results: dict[str, Any] = {}
    for kind in kinds:
        rates: list[float] = []
        cpu_us: list[float] = []
        extra: dict[str, Any] = {}
        for i in range(args.repeat):
            cpu0 = cpu_seconds(pid)
            got = run_wrk(url, args) if kind == "wrk" else run_loader(kind, url, args)
            if pid is not None:
                cpu_us.append((cpu_seconds(pid) - cpu0) / got["requests"] * 1e6)
            if got["errors"]:
                raise SystemExit(f"{kind}: {got['errors']} answers were not 201")
            rate = got["requests"] / got["seconds"]
            rates.append(rate)
            extra = {k: v for k, v in got.items() if k in ("p50", "p99")}
            if not args.json:
                print(f"  {kind} run {i + 1}/{args.repeat}: {rate:,.0f} publishes/s", flush=True)
        median = statistics.median(rates)
        results[kind] = {
            "median_per_s": round(median),
            "runs_per_s": [round(r) for r in rates],
            "ratio_to_target": round(median / TARGET, 2),
            **extra,
        }
        if cpu_us:
            # One core spent on the broker alone would serve 1e6 / its CPU us per publish.
            per = statistics.median(cpu_us)
            results[kind]["broker_cpu_us_per_publish"] = round(per, 1)
            results[kind]["one_core_ceiling_per_s"] = round(1e6 / per) if per else None
    with httpx.Client(base_url=url, timeout=30) as c:
        stored = sum(p["end_offset"] for p in c.get(f"/v1/topics/{TOPIC}").json()["partitions"])
    results["stored"] = stored
    return results


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--messages", type=int, default=20_000, help="publishes per Python run")
    ap.add_argument(
        "--httpx-messages", type=int, default=5_000, help="publishes per httpx run (slower)"
    )
    ap.add_argument("--connections", type=int, default=32, help="keep-alive connections")
    ap.add_argument("--repeat", type=int, default=3, help="runs per load generator")
    ap.add_argument("--value-bytes", type=int, default=100, help="bytes of each value")
    ap.add_argument("--partitions", type=int, default=4)
    ap.add_argument("--fsync", choices=["always", "interval", "never"], default="interval")
    ap.add_argument("--seconds", type=int, default=5, help="length of each wrk run")
    ap.add_argument("--no-wrk", action="store_true", help="skip wrk even when installed")
    ap.add_argument("--url", help="an HTTP API already running (else one is started)")
    ap.add_argument("--json", action="store_true", help="print one JSON document")
    ap.add_argument("--_load", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if not 1 <= args.messages <= 10_000_000 or not 1 <= args.connections <= 1024:
        ap.error("--messages must be within 1..10,000,000 and --connections within 1..1,024")
    if args._load:  # a child: one load generator run
        load = load_raw if args._load == "raw" else load_httpx
        got = asyncio.run(load(args.url, args.messages, args.connections, body(args.value_bytes)))
        print(json.dumps(got))
        return
    setup = {
        "connections": args.connections,
        "value_bytes": args.value_bytes,
        "partitions": args.partitions,
        "fsync": args.fsync,
        "cpus": os.cpu_count(),
        "load_average": os.getloadavg()[0],
    }
    if not args.json:
        print(f"HTTP publish benchmark: {setup}", flush=True)
    with contextlib.ExitStack() as stack:
        pid: int | None = None
        if args.url:
            url = args.url
        else:
            url, pid = stack.enter_context(broker(args.fsync, args.partitions))
        results = measure(url, args, pid)
    if args.json:
        print(json.dumps({"setup": setup, "target_per_s": TARGET, "results": results}))
        return
    for kind, r in results.items():
        if kind == "stored":
            continue
        lat = f" (wrk latency p50 {r['p50']}, p99 {r['p99']})" if "p50" in r else ""
        print(
            f"{kind:>5}: median {r['median_per_s']:,} publishes/s over {args.connections} "
            f"keep-alive connections = {r['ratio_to_target']:.2f}x the {TARGET:,}/s target{lat}"
        )
        if r.get("one_core_ceiling_per_s"):
            print(
                f"       broker CPU {r['broker_cpu_us_per_publish']} us/publish: one core of "
                f"its own would serve {r['one_core_ceiling_per_s']:,}/s "
                f"= {r['one_core_ceiling_per_s'] / TARGET:.2f}x the target"
            )
    print(f"stored: {results['stored']:,} messages")


if __name__ == "__main__":
    main()
