"""A three-node cluster on this machine: acks=all throughput with 3 replicas against 1,
failover time from the leader's SIGKILL to the first produce the new leader acknowledges, and
two nodes against one under a C client.

Usage::

    python benchmarks/cluster.py [--messages 50000] [--reps 3] [--fsync always]
        [--session-timeout 3] [--scale-messages 300000] [--json]

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

* ``scale`` (skipped with ``--scale-messages 0``): two more clusters on the same etcd, of one
  node and of two, each node with a Kafka listener; a new topic of 4 partitions with one
  replica (so each of two nodes leads half of them); ``kcat`` (librdkafka, a C client, so that
  the client's CPU stays small beside the brokers') publishes ``--scale-messages`` 1 KB lines
  with acks=all; messages/s over kcat's run, after checking that every message was stored.
  The ratio is two nodes over one: the aggregate capacity two broker processes get out of the
  machine's two cores.

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
from tidewire.errors import TidewireError, for_code
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
class Etcd:
    """One etcd member on free loopback ports; several clusters can share it (each under its
    own ``--cluster-id``)."""

    root: Path
    proc: subprocess.Popen[bytes] | None = None
    port: int = 0

    def start(self) -> None:
        etcd = shutil.which("etcd")
        if etcd is None:
            raise SystemExit("etcd is missing: apt-get install etcd-server")
        client, peer = free_ports(2)
        self.port = client
        self.proc = subprocess.Popen(
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
        wait_port(client, self.proc, "etcd")

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.terminate()
            self.proc.wait(20)


@dataclass
class Cluster:
    """``nodes`` ``tidewire serve --cluster`` processes (each with a Kafka listener when
    ``kafka``) under cluster id ``name`` in ``etcd``."""

    root: Path
    fsync: str
    session_s: int
    etcd: Etcd
    name: str = "bench"
    nodes: int = NODES
    kafka: bool = False
    ports: dict[int, int] = field(default_factory=dict)
    kafka_ports: dict[int, int] = field(default_factory=dict)
    procs: dict[int, subprocess.Popen[bytes]] = field(default_factory=dict)

    @property
    def addrs(self) -> str:
        return ",".join(f"127.0.0.1:{p}" for p in self.ports.values())

    @property
    def kafka_addrs(self) -> str:
        return ",".join(f"127.0.0.1:{p}" for p in self.kafka_ports.values())

    def start(self) -> None:
        for n in range(1, self.nodes + 1):
            self.ports[n], self.kafka_ports[n] = free_ports(2)
            self.start_node(n)

    def start_node(self, n: int) -> None:
        port = self.ports[n]
        kafka = ("--kafka-port", str(self.kafka_ports[n])) if self.kafka else ()
        self.procs[n] = subprocess.Popen(
            [
                sys.executable,
                *("-m", "tidewire", "serve"),
                *("--data-dir", str(self.root / f"{self.name}-node{n}")),
                *("--host", "127.0.0.1", "--port", str(port), "--node-id", str(n)),
                *("--cluster", f"etcd://127.0.0.1:{self.etcd.port}", "--cluster-id", self.name),
                *("--advertise", f"127.0.0.1:{port}", "--fsync", self.fsync),
                *("--session-timeout", str(self.session_s)),
                *("--default-replication-factor", str(min(self.nodes, 3))),
                *kafka,
            ],
            stdout=subprocess.DEVNULL,
            stderr=open(self.root / f"{self.name}-node{n}.log", "ab"),  # noqa: SIM115
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
    deadline = time.monotonic() + START_S
    async with AsyncClient(cluster.addrs) as c:
        while True:  # a node just restarted answers "joining its cluster" for a moment
            r = await c._call(
                CreateTopicRequest(name=name, partitions=partitions, replication_factor=rf)
            )
            code = getattr(r.body, "error_code", 0)
            if not code:
                break
            if not for_code(code).retriable or time.monotonic() > deadline:
                raise SystemExit(f"create {name}: {r.body.error_message}")
            await asyncio.sleep(0.2)

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
            len(p.isr) == cluster.nodes
            for t in meta.topics
            for p in t.partitions
            if t.name == topic
        )

    await until(f"node {leader} back in sync", back_in_sync, 120)
    return took


async def stored(cluster: Cluster, topic: str) -> int:
    """Messages stored in ``topic``: each partition's end offset on its leader."""
    ends: dict[int, int] = {}
    for port in cluster.ports.values():
        t = Transport(f"127.0.0.1:{port}", request_timeout_s=5, connect_timeout_s=2)
        try:
            r = await t.request(MetadataRequest(topics=[topic]))
        finally:
            await t.close()
        assert r is not None
        for desc in r.body.topics:
            for p in desc.partitions:
                ends[p.partition] = max(ends.get(p.partition, 0), p.log_end_offset)
    return sum(ends.values())


def write_lines(path: Path, n: int) -> None:
    """``n`` lines of ``SIZE - 1`` characters and a newline: kcat's input, one message each."""
    line = b"x" * (SIZE - 1) + b"\n"
    with path.open("wb") as f:
        for _ in range(n // 1000):
            f.write(line * 1000)
        f.write(line * (n % 1000))


async def kcat_throughput(cluster: Cluster, topic: str, lines: Path, n: int) -> float:
    """kcat (librdkafka, a C client) publishes the ``n`` lines of ``lines`` to ``topic``
    through the nodes' Kafka listeners, acks=all: messages/s over kcat's whole run (its start
    and metadata included), after checking that every one was stored."""
    kcat = shutil.which("kcat")
    if kcat is None:
        raise SystemExit("kcat is missing: apt-get install kcat")
    before = await stored(cluster, topic)
    t0 = time.perf_counter()
    with lines.open("rb") as f:
        proc = await asyncio.create_subprocess_exec(
            kcat,
            *("-P", "-b", cluster.kafka_addrs, "-t", topic),
            *("-X", "acks=all", "-X", "linger.ms=5", "-X", "enable.idempotence=false"),
            *("-X", "queue.buffering.max.messages=500000"),
            stdin=f,
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.PIPE,
        )
        _, err = await proc.communicate()
    took = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"kcat failed ({proc.returncode}): {err.decode()[-500:]}")
    got = await stored(cluster, topic) - before
    if got != n:
        raise SystemExit(f"kcat: {got} of {n} messages stored: {err.decode()[-500:]}")
    return n / took


async def run(args: argparse.Namespace) -> dict[str, Any]:
    root = Path(tempfile.mkdtemp(prefix="tidewire-cluster-bench-"))
    etcd = Etcd(root)
    cluster = Cluster(root, args.fsync, args.session_timeout, etcd)
    scale = [
        Cluster(root, args.fsync, args.session_timeout, etcd, name=f"n{k}", nodes=k, kafka=True)
        for k in ((1, 2) if args.scale_messages else ())
    ]
    lines = root / "lines"
    reps: list[dict[str, float]] = []
    try:
        etcd.start()
        for c in (cluster, *scale):
            c.start()
        for c in (cluster, *scale):
            await until(f"{c.nodes} node(s) of {c.name} registered", lambda c=c: _nodes(c))
        if scale:
            write_lines(lines, args.scale_messages)
        for rep in range(1, args.reps + 1):
            row: dict[str, float] = {}
            for rf in (1, 3):
                topic = f"tp-rf{rf}-{rep}"
                await create(cluster, topic, 3, rf)
                row[f"rf{rf}_msg_s"] = await throughput(cluster, topic, args.messages)
                log(f"rep {rep}: RF={rf} acks=all {row[f'rf{rf}_msg_s']:,.0f} msg/s")
            row["ratio"] = row["rf3_msg_s"] / row["rf1_msg_s"]
            for c in scale:
                topic = f"scale-{rep}"
                await create(c, topic, 4, 1)
                key = f"kcat_{c.nodes}_nodes_msg_s"
                row[key] = await kcat_throughput(c, topic, lines, args.scale_messages)
                log(f"rep {rep}: kcat into {c.nodes} node(s) {row[key]:,.0f} msg/s")
            if scale:
                row["scale"] = row["kcat_2_nodes_msg_s"] / row["kcat_1_nodes_msg_s"]
            topic = f"fo-{rep}"
            await create(cluster, topic, 1, 3)
            row["failover_s"] = await failover(cluster, topic)
            log(f"rep {rep}: failover {row['failover_s']:.2f} s")
            reps.append(row)
    finally:
        for c in (cluster, *scale):
            c.stop()
        etcd.stop()
        shutil.rmtree(root, ignore_errors=True)
    medians = {k: statistics.median(r[k] for r in reps) for k in reps[0]}
    return {
        "messages": args.messages,
        "scale_messages": args.scale_messages,
        "size": SIZE,
        "fsync": args.fsync,
        "session_timeout_s": args.session_timeout,
        "reps": reps,
        "median": medians,
    }


async def _nodes(cluster: Cluster) -> bool:
    return len((await metadata(cluster)).nodes) == cluster.nodes


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--messages", type=int, default=50_000)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--fsync", default="always", choices=["always", "interval", "never"])
    ap.add_argument("--session-timeout", type=int, default=3)
    ap.add_argument(
        "--scale-messages",
        type=int,
        default=300_000,
        help="messages kcat publishes into one node and into two (0: skip that comparison)",
    )
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
    if "scale" in m:
        print(f"  kcat, acks=all, 4 partitions RF=1, {args.scale_messages:,} messages:")
        print(f"    into 1 node:  {m['kcat_1_nodes_msg_s']:>10,.0f} msg/s")
        print(f"    into 2 nodes: {m['kcat_2_nodes_msg_s']:>10,.0f} msg/s  (x{m['scale']:.2f})")
    print(
        f"  failover, leader SIGKILL -> first ack: {m['failover_s']:.2f} s "
        f"(session timeout {args.session_timeout} s)"
    )


if __name__ == "__main__":
    main()
