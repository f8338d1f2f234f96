"""A three-node cluster on this machine: acks=all throughput with 3 replicas against 1, and
failover time from the leader's SIGKILL to the first produce the new leader acknowledges.

Usage::

    python benchmarks/cluster.py [--messages 50000] [--reps 3] [--fsync always]
        [--session-timeout 3] [--json]

It starts etcd (Debian's ``etcd-server``: the ``etcd`` on PATH) and three ``tidewire serve
--cluster`` processes on free loopback ports over a temporary directory, then for each rep
(the outer loop, so slow drifts of the machine hit every case alike):

* ``throughput``: for replication factor 1 and 3 in turn, a new topic of 3 partitions (the
  controller places their leaders on the three nodes in turn); one
  :class:`~tidewire.client.AsyncProducer` given every node's address publishes ``--messages``
  1 KB messages with ``acks="durable"`` (acks=all in a cluster: answered once every in-sync
  replica has each batch, fsynced under ``--fsync always``), all awaited: messages/s. The ratio
  is RF=3 over RF=1 of the same rep.
* ``failover``: a new topic of one partition with 3 replicas; a client sends one message at a
  time to its leader, each awaited; after 1 s the leader's process is SIGKILLed. The figure is
  the time from the kill to the first acknowledgement of a send made after it (the client
  retries every 20 ms and refreshes the metadata on each error). The node is then started
  again on its data and the rep waits until it is back in sync.

Progress goes to stderr; ``--json`` prints one JSON object (every rep and the medians) instead
of the table. The nodes run the ``tidewire`` this Python imports (``PYTHONPATH`` is passed on).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tidewire.client import AsyncClient, AsyncProducer
from tidewire.client._transport import Transport
from tidewire.errors import TidewireError
from tidewire.protocol.messages import CreateTopicRequest, MetadataRequest, MetadataResponse

SIZE = 1024
NODES = 3
START_S = 60.0


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


def wait_port(port: int, proc: subprocess.Popen[bytes], what: str) -> None:
    deadline = time.monotonic() + START_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"{what} exited with status {proc.returncode}")
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.2):
            return
        time.sleep(0.05)
    raise SystemExit(f"{what} did not listen on {port} within {START_S} s")


@dataclass
class Cluster:
    root: Path
    fsync: str
    session_s: int
    etcd: subprocess.Popen[bytes] | None = None
    etcd_port: int = 0
    ports: dict[int, int] = field(default_factory=dict)
    procs: dict[int, subprocess.Popen[bytes]] = field(default_factory=dict)

    @property
    def addrs(self) -> str:
        return ",".join(f"127.0.0.1:{p}" for p in self.ports.values())

    def start(self) -> None:
        etcd = shutil.which("etcd")
        if etcd is None:
            raise SystemExit("etcd is missing: apt-get install etcd-server")
        client, peer, *nodes = free_ports(2 + NODES)
        self.etcd_port = client
        self.etcd = subprocess.Popen(
            [
                etcd,
                *("--name", "bench", "--data-dir", str(self.root / "etcd")),
                *("--listen-client-urls", f"http://127.0.0.1:{client}"),
                *("--advertise-client-urls", f"http://127.0.0.1:{client}"),
                *("--listen-peer-urls", f"http://127.0.0.1:{peer}"),
                *("--initial-advertise-peer-urls", f"http://127.0.0.1:{peer}"),
                *("--initial-cluster", f"bench=http://127.0.0.1:{peer}"),
            ],
            stdout=subprocess.DEVNULL,
            stderr=open(self.root / "etcd.log", "wb"),  # noqa: SIM115
        )
        wait_port(client, self.etcd, "etcd")
        for n, port in enumerate(nodes, start=1):
            self.ports[n] = port
            self.start_node(n)

    def start_node(self, n: int) -> None:
        port = self.ports[n]
        self.procs[n] = subprocess.Popen(
            [
                sys.executable,
                *("-m", "tidewire", "serve", "--data-dir", str(self.root / f"node{n}")),
                *("--host", "127.0.0.1", "--port", str(port), "--node-id", str(n)),
                *("--cluster", f"etcd://127.0.0.1:{self.etcd_port}"),
                *("--advertise", f"127.0.0.1:{port}", "--fsync", self.fsync),
                *("--session-timeout", str(self.session_s)),
            ],
            stdout=subprocess.DEVNULL,
            stderr=open(self.root / f"node{n}.log", "ab"),  # noqa: SIM115
            env=os.environ.copy(),
        )
        wait_port(port, self.procs[n], f"node {n}")

    def kill(self, n: int) -> None:
        proc = self.procs.pop(n)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()

    def stop(self) -> None:
        for proc in self.procs.values():
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, signal.SIGTERM)
        for proc in self.procs.values():
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                os.kill(proc.pid, signal.SIGKILL)
                proc.wait()
        if self.etcd is not None:
            self.etcd.terminate()
            self.etcd.wait(20)


async def metadata(cluster: Cluster) -> MetadataResponse:
    last: Exception | None = None
    for port in cluster.ports.values():
        t = Transport(f"127.0.0.1:{port}", request_timeout_s=5, connect_timeout_s=2)
        try:
            r = await t.request(MetadataRequest())
            assert r is not None
            assert isinstance(r.body, MetadataResponse)
            return r.body
        except (TidewireError, OSError) as exc:
            last = exc
        finally:
            await t.close()
    raise SystemExit(f"no node answers METADATA: {last}")


async def until(what: str, probe: Any, timeout_s: float = 60.0) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        got = await probe()
        if got:
            return got
        await asyncio.sleep(0.1)
    raise SystemExit(f"{what}: not within {timeout_s} s")


async def create(cluster: Cluster, name: str, partitions: int, rf: int) -> None:
    async with AsyncClient(cluster.addrs) as c:
        r = await c._call(
            CreateTopicRequest(name=name, partitions=partitions, replication_factor=rf)
        )
        if getattr(r.body, "error_code", 0):
            raise SystemExit(f"create {name}: {r.body.error_message}")

    async def in_sync() -> bool:
        meta = await metadata(cluster)
        for t in meta.topics:
            if t.name == name:
                return all(
                    p.leader >= 0 and len(p.isr) == rf and len(p.replicas) == rf
                    for p in t.partitions
                )
        return False

    await until(f"topic {name} placed and in sync", in_sync)


async def throughput(cluster: Cluster, topic: str, n: int) -> float:
    value = b"x" * SIZE
    async with AsyncProducer(cluster.addrs, acks="durable") as p:
        await p.send(topic, value)  # connections and metadata before the clock starts
        await p.flush()
        t0 = time.perf_counter()
        futs = [await p.send(topic, value) for _ in range(n)]
        await p.flush()
        for f in futs:
            await f
        return n / (time.perf_counter() - t0)


async def failover(cluster: Cluster, topic: str) -> float:
    meta = await metadata(cluster)
    (leader,) = [t.partitions[0].leader for t in meta.topics if t.name == topic]
    stop = asyncio.Event()
    killed_at = 0.0
    first_ack = 0.0
    sent = 0

    async def sender() -> None:
        nonlocal first_ack, sent
        async with AsyncProducer(
            cluster.addrs, acks="durable", linger_ms=0, request_timeout_ms=2_000
        ) as p:
            while not stop.is_set():
                started = time.monotonic()
                try:
                    await (await p.send(topic, b"y" * SIZE, partition=0))
                except TidewireError:
                    await asyncio.sleep(0.02)
                    continue
                sent += 1
                if killed_at and started > killed_at and not first_ack:
                    first_ack = time.monotonic()
                    stop.set()

    task = asyncio.create_task(sender())
    await asyncio.sleep(1.0)
    killed_at = time.monotonic()
    cluster.kill(leader)
    try:
        await asyncio.wait_for(stop.wait(), 60)
    finally:
        stop.set()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(task, 30)
    took = first_ack - killed_at
    cluster.start_node(leader)

    async def back_in_sync() -> bool:
        meta = await metadata(cluster)
        return all(
            len(p.isr) == NODES for t in meta.topics for p in t.partitions if t.name == topic
        )

    await until(f"node {leader} back in sync", back_in_sync, 120)
    return took


async def run(args: argparse.Namespace) -> dict[str, Any]:
    root = Path(tempfile.mkdtemp(prefix="tidewire-cluster-bench-"))
    cluster = Cluster(root, args.fsync, args.session_timeout)
    reps: list[dict[str, float]] = []
    try:
        cluster.start()
        await until("3 nodes registered", lambda: _nodes(cluster))
        for rep in range(1, args.reps + 1):
            row: dict[str, float] = {}
            for rf in (1, 3):
                topic = f"tp-rf{rf}-{rep}"
                await create(cluster, topic, 3, rf)
                row[f"rf{rf}_msg_s"] = await throughput(cluster, topic, args.messages)
                log(f"rep {rep}: RF={rf} acks=all {row[f'rf{rf}_msg_s']:,.0f} msg/s")
            row["ratio"] = row["rf3_msg_s"] / row["rf1_msg_s"]
            topic = f"fo-{rep}"
            await create(cluster, topic, 1, 3)
            row["failover_s"] = await failover(cluster, topic)
            log(f"rep {rep}: failover {row['failover_s']:.2f} s")
            reps.append(row)
    finally:
        cluster.stop()
        shutil.rmtree(root, ignore_errors=True)
    medians = {k: statistics.median(r[k] for r in reps) for k in reps[0]}
    return {
        "messages": args.messages,
        "size": SIZE,
        "fsync": args.fsync,
        "session_timeout_s": args.session_timeout,
        "reps": reps,
        "median": medians,
    }


async def _nodes(cluster: Cluster) -> bool:
    return len((await metadata(cluster)).nodes) == NODES


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--messages", type=int, default=50_000)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--fsync", default="always", choices=["always", "interval", "never"])
    ap.add_argument("--session-timeout", type=int, default=3)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    out = asyncio.run(run(args))
    if args.json:
        print(json.dumps(out, indent=2))
        return
    m = out["median"]
    print(f"3 nodes, 1 KB messages, fsync={args.fsync}, medians of {args.reps}:")
    print(f"  acks=all RF=1: {m['rf1_msg_s']:>10,.0f} msg/s")
    print(f"  acks=all RF=3: {m['rf3_msg_s']:>10,.0f} msg/s  (ratio {m['ratio']:.2f})")
    print(
        f"  failover, leader SIGKILL -> first ack: {m['failover_s']:.2f} s "
        f"(session timeout {args.session_timeout} s)"
    )


if __name__ == "__main__":
    main()
