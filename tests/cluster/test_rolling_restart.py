"""A rolling restart of a three-node cluster under load: each node in turn is stopped with
SIGTERM (it leaves the cluster at once, so the others take over its leaderships without
waiting out its session), started again on its data, and waited for until every partition is
back in sync before the next. An idempotent producer (acks=all, min_insync_replicas=2) sends
all along: every send is acknowledged, and every acknowledged message is read back once, in
order. About 20 s."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests.cli._support import popen_serve, stop
from tests.cluster._etcd import EtcdServer
from tests.cluster._nodes import node_metadata, until
from tidewire.client import AsyncConsumer, AsyncProducer
from tidewire.client._transport import Transport
from tidewire.protocol.messages import CreateTopicRequest

NODES = (1, 2, 3)
WAIT_S = 60.0
TOPIC = "rolling"
PARTITIONS = 3


def _start(data: Path, port: int, cluster: str, n: int) -> tuple[subprocess.Popen[str], int]:
    with (data.parent / f"node{n}.log").open("a") as log:
        proc = popen_serve(
            *("--data-dir", str(data), "--port", str(port), "--node-id", str(n)),
            *("--cluster", cluster, "--session-timeout", "3", "--fsync", "always"),
            *("--min-insync-replicas", "2"),
            stderr=log.fileno(),
        )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    m = re.search(r"listening on 127\.0\.0\.1:(\d+)", line)
    if m is None:
        stop(proc)
        pytest.fail(f"node {n} did not start: {line!r}")
    return proc, int(m.group(1))


def test_a_rolling_restart_loses_and_refuses_nothing(tmp_path: Path, etcd: EtcdServer) -> None:
    cluster = f"etcd://127.0.0.1:{etcd.client_port}"
    procs: dict[int, subprocess.Popen[str]] = {}
    ports: dict[int, int] = {}
    try:
        for n in NODES:
            procs[n], ports[n] = _start(tmp_path / f"node{n}", 0, cluster, n)
        addrs = [f"127.0.0.1:{ports[n]}" for n in NODES]

        async def main() -> None:
            async def registered(n: int = 3) -> bool:
                return len((await node_metadata(addrs[0])).nodes) == n

            await until("3 nodes registered", registered, WAIT_S)
            t = Transport(addrs[0], request_timeout_s=WAIT_S)
            try:
                reply = await t.request(
                    CreateTopicRequest(name=TOPIC, partitions=PARTITIONS, replication_factor=3)
                )
            finally:
                await t.close()
            assert reply is not None
            assert reply.body.error_code == 0, reply.body

            async def in_sync() -> bool:
                for a in addrs:
                    try:
                        meta = await node_metadata(a)
                    except Exception:
                        continue
                    (topic,) = [x for x in meta.topics if x.name == TOPIC] or [None]
                    return topic is not None and all(
                        len(p.isr) == 3 and p.leader > 0 for p in topic.partitions
                    )
                return False

            await until("every replica in sync", in_sync, WAIT_S)
            sent: list[tuple[bytes, asyncio.Future]] = []  # type: ignore[type-arg]
            stop_sending = asyncio.Event()
            async with AsyncProducer(
                addrs, acks="durable", linger_ms=2, delivery_timeout_ms=int(WAIT_S * 1000)
            ) as producer:

                async def load() -> None:
                    i = 0
                    while not stop_sending.is_set() and i < 20_000:
                        v = b"m%06d" % i
                        sent.append((v, await producer.send(TOPIC, v, partition=i % PARTITIONS)))
                        i += 1
                        if i % 20 == 0:
                            await asyncio.sleep(0.02)

                loader = asyncio.create_task(load())
                for n in NODES:
                    await asyncio.sleep(0.5)
                    os.kill(procs[n].pid, signal.SIGTERM)
                    procs[n].wait(WAIT_S)
                    stop(procs[n])
                    procs[n], _ = _start(tmp_path / f"node{n}", ports[n], cluster, n)
                    await until(f"node {n} back in sync", in_sync, WAIT_S)
                await asyncio.sleep(0.5)
                stop_sending.set()
                await loader
                await producer.flush(WAIT_S)
                results = [(v, f.result()) for v, f in sent]  # raises if a send failed
            assert len(results) > 100
            want: dict[int, list[bytes]] = {p: [] for p in range(PARTITIONS)}
            for v, md in results:
                want[md.partition].append((md.offset, v))  # type: ignore[arg-type]
            async with AsyncConsumer(addrs, request_timeout_ms=int(WAIT_S * 1000)) as consumer:
                await consumer.assign([(TOPIC, p, 0) for p in range(PARTITIONS)])
                got: dict[int, list[tuple[int, bytes]]] = {p: [] for p in range(PARTITIONS)}
                total = len(results)
                deadline = time.monotonic() + WAIT_S
                while sum(map(len, got.values())) < total and time.monotonic() < deadline:
                    for r in await consumer.poll(1.0):
                        got[r.partition].append((r.offset, r.value))
            for p in range(PARTITIONS):
                # Every acknowledged message once, at the offset it was acknowledged with.
                assert got[p] == sorted(want[p]), f"partition {p}"  # type: ignore[arg-type]

        asyncio.run(main())
    finally:
        for proc in procs.values():
            stop(proc)
