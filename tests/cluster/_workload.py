"""A fault-test workload over three real ``tidewire serve --cluster`` processes and a real
etcd: a :class:`Cluster` of node processes on fixed loopback ports (a restarted node comes back
at the same address, so clients' bootstrap lists stay valid), and a :class:`Workload` of
idempotent acks=all producers and polling consumers that records the history
``check_cluster_history`` judges. Every loop is bounded in count and time; nothing is timed.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import subprocess
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

import pytest

from tests.cli._support import STARTUP_S, subprocess_env, tidewire_cmd
from tests.cluster._etcd import EtcdServer
from tests.cluster._history import Ack, LeaderSeen, Poll
from tests.cluster._proxy import Proxy, ProxyHost
from tidewire.client import AsyncClient, AsyncProducer
from tidewire.client._accumulator import RecordFuture
from tidewire.client._transport import Transport
from tidewire.errors import (
    OutOfOrderSequenceError,
    ProducerFencedError,
    RecordBatchError,
    TidewireError,
)
from tidewire.protocol.messages import (
    CreateTopicRequest,
    MetadataRequest,
    MetadataResponse,
    PartitionInfo,
)
from tidewire.records.reader import iter_batches, iter_records

T = TypeVar("T")

TOPIC = "orders"
SESSION_S = 2
#: Bound of every wait for the cluster to settle (a loaded 2-core machine, etcd fsyncs).
WAIT_S = 60.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def until(what: str, probe: Callable[[], Awaitable[T | None]], timeout_s: float) -> T:
    """``await probe()`` again until it returns something other than None (client errors
    count as None), bounded by ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    last: object = None
    while time.monotonic() < deadline:
        try:
            got = await probe()
        except (TidewireError, OSError) as exc:
            got, last = None, exc
        if got is not None:
            return got
        await asyncio.sleep(0.1)
    pytest.fail(f"{what}: not within {timeout_s} s (last error: {last!r})")


async def metadata(addr: str, timeout_s: float = 5) -> MetadataResponse:
    t = Transport(addr, request_timeout_s=timeout_s, connect_timeout_s=timeout_s)
    try:
        response = await t.request(MetadataRequest())
    finally:
        await t.close()
    assert response is not None
    assert isinstance(response.body, MetadataResponse)
    return response.body


async def partition_info(addr: str, partition: int = 0) -> PartitionInfo | None:
    """What the node at ``addr`` says of ``TOPIC``'s ``partition`` (None: not known there)."""
    meta = await metadata(addr)
    for t in meta.topics:
        if t.name == TOPIC:
            for p in t.partitions:
                if p.partition == partition:
                    return p
    return None


@dataclass
class Cluster:
    """Three node processes over ``etcd``, each with its data directory under ``root`` and a
    fixed port; its stderr (the log) appended to ``root/nodeN.log``.

    ``proxied``: each node advertises the address of a proxy in front of it (``inbound[n]``:
    its peers' fetches and the clients' requests come through it) and reaches etcd through a
    proxy of its own (``to_etcd[n]``), both on :attr:`host`'s thread; :meth:`isolate` cuts a
    node off from its peers and from etcd (its clients still reach it)."""

    root: Path
    etcd: EtcdServer
    extra: tuple[str, ...] = ()
    nodes: tuple[int, ...] = (1, 2, 3)
    ports: dict[int, int] = field(default_factory=dict)
    procs: dict[int, subprocess.Popen[str]] = field(default_factory=dict)
    proxied: bool = False
    session_s: int = SESSION_S
    host: ProxyHost | None = None
    inbound: dict[int, Proxy] = field(default_factory=dict)
    to_etcd: dict[int, Proxy] = field(default_factory=dict)
    #: The node whose address comes first in :attr:`bootstrap` (None: node order).
    bootstrap_first: int | None = None
    #: Values a test sent past the workload (never acknowledged, so they may be lost).
    probes: list[bytes] = field(default_factory=list)

    def addr(self, n: int) -> str:
        """Node ``n``'s own listener (not through its proxy)."""
        return f"127.0.0.1:{self.ports[n]}"

    def advertised(self, n: int) -> str:
        """Where peers and clients reach node ``n``: its proxy when proxied."""
        return self.inbound[n].address if self.proxied else self.addr(n)

    @property
    def bootstrap(self) -> str:
        """Every node's address, ``bootstrap_first``'s first: a client's bootstrap
        connection (its metadata, its requests to leaders not known) goes there."""
        order = sorted(self.nodes, key=lambda n: n != self.bootstrap_first)
        return ",".join(self.advertised(n) for n in order)

    def _proxies(self, n: int) -> None:
        if self.host is None:
            self.host = ProxyHost()
        if n not in self.inbound:
            self.inbound[n] = self.host.add("127.0.0.1", self.ports[n])
            self.to_etcd[n] = self.host.add("127.0.0.1", self.etcd.client_port)

    def isolate(self, n: int) -> None:
        """Cut node ``n`` off from its peers (nothing they send it arrives, nor its answers)
        and from etcd; the test's own clients still reach it."""
        assert self.host is not None
        self.host.do(self.inbound[n].isolate)
        self.host.do(self.to_etcd[n].blackhole)

    def cut_off(self, n: int) -> None:
        """Cut node ``n`` off from everything: its peers, etcd and the clients, whose
        connections go through its inbound proxy too (the test still reaches the node's own
        listener, :meth:`addr`, directly). :meth:`rejoin` heals it."""
        assert self.host is not None
        self.host.do(self.inbound[n].blackhole)
        self.host.do(self.to_etcd[n].blackhole)

    def rejoin(self, n: int) -> None:
        """Heal :meth:`isolate` or :meth:`cut_off` (the connections that lost bytes are reset)."""
        assert self.host is not None
        self.host.do(self.inbound[n].rejoin)
        self.host.do(self.to_etcd[n].rejoin)

    def data_dir(self, n: int) -> Path:
        return self.root / f"node{n}"

    def start(self, n: int) -> None:
        """Start node ``n`` (again) on its port; wait for its listening line."""
        port = self.ports.setdefault(n, free_port())
        log = open(self.root / f"node{n}.log", "a")  # noqa: SIM115 (the child's)
        cluster = f"etcd://127.0.0.1:{self.etcd.client_port}"
        routes: tuple[str, ...] = ()
        if self.proxied:
            self._proxies(n)
            cluster = f"etcd://{self.to_etcd[n].address}"
            routes = ("--advertise", self.inbound[n].address)
        proc = subprocess.Popen(
            tidewire_cmd(
                "serve",
                *("--data-dir", str(self.data_dir(n)), "--port", str(port)),
                *("--node-id", str(n), "--cluster", cluster),
                *("--session-timeout", str(self.session_s), "--fsync", "always"),
                *("--min-insync-replicas", "2", "--http-port", "-1"),
                *routes,
                *self.extra,
            ),
            stdout=subprocess.PIPE,
            stderr=log,
            stdin=subprocess.DEVNULL,
            text=True,
            env=subprocess_env(),
        )
        log.close()
        self.procs[n] = proc
        assert proc.stdout is not None
        line = proc.stdout.readline()
        if f":{port}" not in line:
            self.kill(n)
            pytest.fail(f"node {n} did not start: {line!r}; log: {self.log_tail(n)}")
        # Its stdout stays open (closing it would fail the node's next write with EPIPE);
        # the node writes nothing more there, and it is closed once the node is reaped.

    def log_tail(self, n: int) -> str:
        return (self.root / f"node{n}.log").read_text(errors="replace")[-3000:]

    def signal(self, n: int, sig: int) -> None:
        proc = self.procs[n]
        if proc.poll() is None:
            os.kill(proc.pid, sig)

    def kill(self, n: int) -> None:
        """SIGKILL node ``n`` (resumed first if stopped) and reap it."""
        proc = self.procs.get(n)
        if proc is None:
            return
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=STARTUP_S)
        if proc.stdout is not None:
            proc.stdout.close()

    def terminate(self, n: int) -> None:
        """SIGTERM node ``n`` (a clean stop: logs flushed) and reap it; SIGKILL if it hangs."""
        proc = self.procs.get(n)
        if proc is None or proc.poll() is not None:
            return
        os.kill(proc.pid, signal.SIGCONT)
        os.kill(proc.pid, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=STARTUP_S)
        self.kill(n)

    def stop_all(self) -> None:
        for n in self.nodes:
            self.kill(n)
        if self.host is not None:
            self.host.close()
            self.host = None

    async def create_topic(self, partitions: int = 1) -> None:
        async def registered() -> MetadataResponse | None:
            meta = await metadata(self.addr(1))
            return meta if len(meta.nodes) == len(self.nodes) else None

        await until("every node registered", registered, WAIT_S)
        t = Transport(self.addr(1), request_timeout_s=WAIT_S)
        try:
            reply = await t.request(
                CreateTopicRequest(name=TOPIC, partitions=partitions, replication_factor=3)
            )
        finally:
            await t.close()
        assert reply is not None
        assert reply.body.error_code == 0, reply.body

    async def settled(self, partition: int = 0, timeout_s: float = WAIT_S) -> PartitionInfo:
        """Wait until the partition has a leader, every replica is in its ISR and every node's
        log ends where the leader's does; return the leader's view."""

        seen: dict[int, PartitionInfo | None] = {}

        async def probe() -> PartitionInfo | None:
            infos = {n: await partition_info(self.addr(n), partition) for n in self.nodes}
            seen.update(infos)
            lead = {i.leader for i in infos.values() if i is not None}
            if len(lead) != 1 or -1 in lead:
                return None
            (leader,) = lead
            p = infos[leader]
            if p is None or sorted(p.isr) != sorted(self.nodes):
                return None
            ends = {i.log_end_offset for i in infos.values() if i is not None}
            if len(ends) != 1 or p.high_watermark != p.log_end_offset:
                return None
            return p

        try:
            return await until(f"partition {partition} settled", probe, timeout_s)
        except pytest.fail.Exception as exc:
            views = "; ".join(
                f"node {n}: leader {i.leader} epoch {i.leader_epoch} isr {i.isr} "
                f"end {i.log_end_offset} hw {i.high_watermark} damage {len(i.damage)}"
                for n, i in seen.items()
                if i is not None
            )
            pytest.fail(f"{exc}; last views: {views}")

    async def leader(self, partition: int = 0, timeout_s: float = WAIT_S) -> PartitionInfo:
        """The partition's leader as a live node sees it, once there is one."""

        async def probe() -> PartitionInfo | None:
            for n in self.nodes:
                if self.procs[n].poll() is not None:
                    continue
                with contextlib.suppress(TidewireError, OSError):
                    p = await partition_info(self.addr(n), partition)
                    if p is not None and p.leader in self.nodes:
                        return p
            return None

        return await until("a leader", probe, timeout_s)

    async def new_leader(self, old: int, epoch: int, partition: int = 0) -> PartitionInfo:
        """Wait until a live node other than ``old`` reports a leader above ``epoch``."""

        async def probe() -> PartitionInfo | None:
            for n in self.nodes:
                if n == old or self.procs[n].poll() is not None:
                    continue
                with contextlib.suppress(TidewireError, OSError):
                    p = await partition_info(self.addr(n), partition)
                    if p is not None and p.leader not in (old, -1) and p.leader_epoch > epoch:
                        return p
            return None

        return await until(f"leadership moved from node {old}", probe, WAIT_S)


def read_log(directory: Path) -> list[tuple[int, bytes]]:
    """Every ``(offset, value)`` of the segment files of one partition's directory, read from
    the files as they are (no recovery): a batch whose CRC does not check out is left out (its
    offsets are missing), a torn or zeroed tail ends its segment."""
    out: list[tuple[int, bytes]] = []
    for seg in sorted(directory.glob("*.log")):
        data = seg.read_bytes()
        with contextlib.suppress(RecordBatchError):  # a torn or zeroed tail ends the segment
            for pos, h in iter_batches(data, verify=False):
                with contextlib.suppress(RecordBatchError):
                    for rec in iter_records(memoryview(data)[pos : pos + h.size]):
                        out.append((rec.offset, rec.value or b""))
    return out


def replicas_on_disk(cluster: Cluster, partitions: int = 1) -> dict[int, dict[int, list]]:  # type: ignore[type-arg]
    """node -> partition -> its log's records, read from the data directories (the nodes
    stopped)."""
    return {
        n: {p: read_log(cluster.data_dir(n) / f"{TOPIC}-{p}") for p in range(partitions)}
        for n in cluster.nodes
    }


@dataclass
class Workload:
    """``producers`` idempotent acks=all producers sending unique values to ``TOPIC``'s
    partition 0 through the cluster's bootstrap list, and one consumer polling it from the
    leader; ``run()`` until ``stop`` is set. The history: ``sent``, ``acks``, ``events``,
    ``orders``."""

    cluster: Cluster
    producers: int = 2
    #: The pause between two sends of one producer (bounds the load on a 2-core machine).
    pause_s: float = 0.01
    sent: list[bytes] = field(default_factory=list)
    acks: list[Ack] = field(default_factory=list)
    events: list[Poll | LeaderSeen] = field(default_factory=list)
    orders: list[list[bytes]] = field(default_factory=list)
    failed: int = 0
    #: Producers that failed for good (out-of-order sequence, fenced), with their error.
    fatal: list[str] = field(default_factory=list)
    stop: asyncio.Event = field(default_factory=asyncio.Event)
    #: Set while the producers send; cleared by :meth:`settled` while the replicas settle.
    sending: asyncio.Event = field(default_factory=asyncio.Event)

    def __post_init__(self) -> None:
        self.sending.set()

    async def settled(self) -> PartitionInfo:
        """The cluster settled (:meth:`Cluster.settled`), new sends held back meanwhile.

        Under the producers' pipelined load (up to 50 sends in flight each, a send every
        10 ms) the leader's log grows between the probes of the three nodes, so "every log
        ends where the leader's does and the high watermark is there" is rarely seen at one
        instant, and on a loaded machine not within the wait: held back, the sends in flight
        are answered and the replicas meet. The load resumes before the caller's fault."""
        self.sending.clear()
        try:
            return await self.cluster.settled()
        finally:
            self.sending.set()

    async def _produce(self, i: int) -> None:
        """Producer ``i``: a new producer instance (a new order, a new producer id) each time
        the previous one failed for good (``fatal`` counts them)."""
        instance = 0
        while not self.stop.is_set():
            await self._produce_once(f"p{i}.{instance}")
            instance += 1

    async def _produce_once(self, name: str) -> None:
        order: list[bytes] = []
        self.orders.append(order)
        pending: set[asyncio.Task[None]] = set()
        async with AsyncProducer(
            self.cluster.bootstrap,
            acks="durable",
            idempotence=True,
            linger_ms=2,
            request_timeout_ms=10_000,
            delivery_timeout_ms=60_000,
            connect_timeout_ms=2_000,
        ) as producer:
            n = 0
            while not self.stop.is_set() and producer.failure is None:
                if not self.sending.is_set():
                    with contextlib.suppress(TimeoutError):  # rechecks ``stop`` each second
                        async with asyncio.timeout(1):
                            await self.sending.wait()
                    continue
                value = f"{name}-{n}".encode()
                n += 1
                try:
                    fut = await producer.send(TOPIC, value, partition=0)
                except (ProducerFencedError, OutOfOrderSequenceError):
                    break
                self.sent.append(value)
                order.append(value)

                async def wait(value: bytes = value, fut: RecordFuture = fut) -> None:
                    try:
                        md = await fut
                    except TidewireError:
                        self.failed += 1
                        return
                    self.acks.append(Ack(0, md.offset, (value,)))

                task = asyncio.create_task(wait())
                pending.add(task)
                task.add_done_callback(pending.discard)
                for _ in range(1000):  # bounded in flight
                    if len(pending) <= 50 or self.stop.is_set():
                        break
                    await asyncio.sleep(0.01)
                await asyncio.sleep(self.pause_s)
            if producer.failure is not None:
                self.fatal.append(f"{name}: {producer.failure}")
            with contextlib.suppress(TidewireError, TimeoutError):
                await producer.flush(timeout_s=90)
        if pending:
            await asyncio.wait(pending, timeout=90)

    async def _consume(self) -> None:
        offset = 0
        async with AsyncClient(
            self.cluster.bootstrap, request_timeout_s=5, connect_timeout_s=2
        ) as client:
            while not self.stop.is_set():
                try:
                    got = await client.fetch(TOPIC, 0, offset, max_wait_ms=100)
                except (TidewireError, OSError, TimeoutError):
                    await asyncio.sleep(0.1)
                    continue
                if got.records:
                    self.events.append(
                        Poll("c1", 0, tuple((r.offset, r.value or b"") for r in got.records))
                    )
                offset = got.next_offset

    async def run(self) -> None:
        async with asyncio.TaskGroup() as tg:
            for i in range(self.producers):
                tg.create_task(self._produce(i))
            tg.create_task(self._consume())

    async def acked_at_least(self, count: int, timeout_s: float = WAIT_S) -> None:
        """Wait until ``count`` more sends are acknowledged than now."""
        goal = len(self.acks) + count

        async def probe() -> bool | None:
            return True if len(self.acks) >= goal else None

        await until(f"{count} more acknowledgements", probe, timeout_s)
