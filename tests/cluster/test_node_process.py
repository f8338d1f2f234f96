"""A cluster of real ``tidewire serve --cluster`` processes over a real etcd: three nodes
register, a topic of replication factor 3 is placed with a log on every node, the leader's
process is killed (SIGKILL) and the controller moves the leadership to an in-sync follower
at the next epoch within the session timeout and a margin; acks=all produce through the new
leader is answered. About 7 s: the one test of real node processes, kept in the default
tier."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from pathlib import Path

import pytest

from tests.cli._support import run_cli, start_serve, stop
from tests.cluster._etcd import EtcdServer
from tidewire.client import AsyncClient
from tidewire.client._client import Message
from tidewire.client._transport import Transport
from tidewire.errors import TidewireError
from tidewire.protocol.messages import (
    ACKS_DURABLE,
    CreateTopicRequest,
    MetadataRequest,
    MetadataResponse,
)

SESSION_S = 2
#: Leadership moves within the session timeout and this margin (a loaded 2-core machine).
MARGIN_S = 15.0
WAIT_S = 30.0


async def metadata(addr: str) -> MetadataResponse:
    t = Transport(addr, request_timeout_s=5, connect_timeout_s=5)
    try:
        response = await t.request(MetadataRequest())
    finally:
        await t.close()
    assert response is not None
    assert isinstance(response.body, MetadataResponse)
    return response.body


async def until(what: str, probe, timeout_s: float):  # type: ignore[no-untyped-def]
    """``await probe()`` again until it returns something other than None (errors count as
    None), bounded by ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    last: object = None
    while time.monotonic() < deadline:
        try:
            got = await probe()
        except TidewireError as exc:
            got, last = None, exc
        if got is not None:
            return got
        await asyncio.sleep(0.1)
    pytest.fail(f"{what}: not within {timeout_s} s (last error: {last})")


def test_three_node_processes_fail_over(tmp_path: Path, etcd: EtcdServer) -> None:
    cluster = f"etcd://127.0.0.1:{etcd.client_port}"
    procs = {}
    try:
        for n in (1, 2, 3):
            procs[n] = start_serve(
                tmp_path / f"node{n}",
                *("--node-id", str(n), "--cluster", cluster),
                *("--session-timeout", str(SESSION_S), "--fsync", "always"),
            )
        addr = {n: f"127.0.0.1:{port}" for n, (_, port) in procs.items()}

        async def main() -> None:
            async def all_registered() -> MetadataResponse | None:
                meta = await metadata(addr[1])
                return meta if len(meta.nodes) == 3 else None

            meta = await until("3 nodes registered", all_registered, WAIT_S)
            assert [(x.node_id, x.port) for x in meta.nodes] == [
                (n, procs[n][1]) for n in (1, 2, 3)
            ]
            t = Transport(addr[2], request_timeout_s=WAIT_S)
            try:
                reply = await t.request(
                    CreateTopicRequest(name="orders", partitions=1, replication_factor=3)
                )
            finally:
                await t.close()
            assert reply is not None
            assert reply.body.error_code == 0, reply.body

            async def placed() -> MetadataResponse | None:
                m = await metadata(addr[3])
                return m if m.topics and m.topics[0].partitions else None

            (p,) = (await until("topic placed", placed, WAIT_S)).topics[0].partitions
            assert sorted(p.replicas) == [1, 2, 3]
            assert p.leader_epoch == 0
            for n in (1, 2, 3):  # every node's log exists
                d = tmp_path / f"node{n}"
                await until(
                    f"node {n}'s log",
                    lambda d=d: _ready(any(x.name.startswith("orders") for x in d.iterdir())),
                    WAIT_S,
                )
            old = p.leader
            # acks=all through the first leader.
            async with AsyncClient(addr[old], request_timeout_s=WAIT_S) as c:
                assert await c.produce("orders", 0, [Message(b"a")], acks=ACKS_DURABLE) == 0
            # Failover needs an in-sync follower: wait until both are (they may have left the
            # ISR while their logs were being made on a loaded machine, and rejoin caught up).

            async def in_sync() -> bool | None:
                (q,) = (await metadata(addr[old])).topics[0].partitions
                return True if len(q.isr) == 3 else None

            await until("every replica in sync", in_sync, WAIT_S)
            os.kill(procs[old][0].pid, signal.SIGKILL)
            killed = time.monotonic()
            survivor = next(n for n in (1, 2, 3) if n != old)

            async def moved() -> int | None:
                (q,) = (await metadata(addr[survivor])).topics[0].partitions
                return q.leader if q.leader not in (old, -1) and q.leader_epoch == 1 else None

            new = await until("leadership moved", moved, SESSION_S + MARGIN_S)
            assert time.monotonic() - killed < SESSION_S + MARGIN_S

            async def produced() -> int | None:
                async with AsyncClient(addr[new], request_timeout_s=WAIT_S) as c:
                    return await c.produce("orders", 0, [Message(b"b")], acks=ACKS_DURABLE)

            assert await until("acks=all on the new leader", produced, WAIT_S) == 1
            out = await asyncio.to_thread(
                run_cli, ["cluster", "status", "--json", "--addr", addr[new]]
            )
            assert out.exit_code == 0, out.output
            assert f'"leader":{new}' in out.stdout

        asyncio.run(main())
    finally:
        for proc, _ in procs.values():
            stop(proc)


async def _ready(ok: bool) -> bool | None:
    return True if ok else None
