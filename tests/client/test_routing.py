"""Clients against a cluster: bootstrap lists, requests routed to each partition's leader,
metadata refreshed and requests retried when a leader moves or its node goes, an idempotent
retry stored once, and the single-node path unchanged (no METADATA it did not ask before).

The cluster is :class:`~tests.client._cluster_support.FakeCluster`: real brokers and real TCP
servers in the test's loop, each server a node whose leadership the test sets.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tests.client._cluster_support import FakeCluster
from tests.client._producer_support import stored
from tests.client._support import (
    PROMPT_S,
    addr,
    broker_at,
    in_thread,
    listening,
    refusing_port,
    run,
    serve,
)
from tidewire.broker import Broker
from tidewire.client import AsyncClient, AsyncConsumer, AsyncProducer, Client, Message, Producer
from tidewire.client._transport import parse_addrs
from tidewire.errors import ConnectionLostError, NotLeaderError
from tidewire.server import TcpServer

TOPIC = "t"


@contextlib.asynccontextmanager
async def two_brokers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[tuple[FakeCluster, Broker, Broker]]:
    """Nodes 1 and 2, a broker each, topic ``t`` of 2 partitions on both; node 1 leads
    partition 0, node 2 partition 1."""
    cluster = FakeCluster(monkeypatch)
    async with (
        broker_at(tmp_path / "1") as b1,
        broker_at(tmp_path / "2") as b2,
        listening(b1) as s1,
        listening(b2) as s2,
    ):
        for b in (b1, b2):
            b.create_topic(TOPIC, 2)
        cluster.add(1, s1)
        cluster.add(2, s2)
        cluster.leaders = {(TOPIC, 0): 1, (TOPIC, 1): 2}
        yield cluster, b1, b2


@contextlib.asynccontextmanager
async def one_broker_two_nodes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[tuple[FakeCluster, Broker, TcpServer, TcpServer]]:
    """Nodes 1 and 2 over one broker (a perfectly replicated log and producer state); node 1
    leads both partitions of ``t``."""
    cluster = FakeCluster(monkeypatch)
    async with broker_at(tmp_path) as b, listening(b) as s1, listening(b) as s2:
        b.create_topic(TOPIC, 2)
        cluster.add(1, s1)
        cluster.add(2, s2)
        cluster.leaders = {(TOPIC, 0): 1, (TOPIC, 1): 1}
        yield cluster, b, s1, s2


def values(records: list) -> list[bytes]:  # type: ignore[type-arg]
    return [r.value for r in records]


# --- bootstrap lists ------------------------------------------------------------------------------


def test_parse_addrs_takes_a_comma_list_or_a_sequence() -> None:
    assert parse_addrs("a:1, b:2,a:1") == [("a", 1), ("b", 2)]
    assert parse_addrs(["a:1", "[::1]:3"]) == [("a", 1), ("::1", 3)]
    with pytest.raises(ValueError, match="HOST:PORT"):
        parse_addrs("a:1,b")
    with pytest.raises(ValueError, match="no HOST:PORT"):
        parse_addrs([])


def test_a_bootstrap_list_skips_an_address_that_refuses(tmp_path: Path) -> None:
    async def main() -> None:
        async with serve(tmp_path) as (broker, server):
            with refusing_port() as port:
                dead = f"127.0.0.1:{port}"
                async with AsyncClient(f"{dead},{addr(server)}") as client:
                    await client.create_topic("x", 1)
                    assert await client.produce("x", 0, [Message(b"v")]) == 0
                async with AsyncProducer([dead, addr(server)], linger_ms=0) as producer:
                    fut = await producer.send("x", b"w", partition=0)
                    assert (await fut).offset == 1

    run(main())


def test_the_blocking_client_takes_a_bootstrap_list(tmp_path: Path) -> None:
    async def main() -> None:
        async with serve(tmp_path) as (broker, server):
            with refusing_port() as port:
                dead = f"127.0.0.1:{port}"

                def work() -> int:
                    with Client([dead, addr(server)]) as client:
                        client.create_topic("x", 1)
                        return client.produce("x", 0, [Message(b"v")])

                assert await in_thread(work) == 0

    run(main())


# --- routing --------------------------------------------------------------------------------------


def test_the_producer_sends_each_partition_to_its_leader(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def main() -> None:
        async with two_brokers(tmp_path, monkeypatch) as (cluster, b1, b2):
            # Bootstrapped through node 2 only: node 1 is learned from the metadata.
            async with AsyncProducer(cluster.addr(2), linger_ms=0) as producer:
                futs = [
                    await producer.send(TOPIC, b"p%d" % (i % 2), partition=i % 2) for i in range(10)
                ]
                await producer.flush(PROMPT_S)
                assert all(f.result().offset >= 0 for f in futs)
            assert values((await stored(b1, TOPIC, 0))[1]) == [b"p0"] * 5
            assert values((await stored(b2, TOPIC, 1))[1]) == [b"p1"] * 5
            assert (await stored(b1, TOPIC, 1))[1] == [] and (await stored(b2, TOPIC, 0))[1] == []
            assert cluster.refused == {}  # nothing went to the wrong node
            assert cluster.asked[1, "METADATA"] == 0  # the bootstrap node answered it

    run(main())


def test_the_consumer_fetches_each_partition_from_its_leader(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def main() -> None:
        async with two_brokers(tmp_path, monkeypatch) as (cluster, b1, b2):
            async with AsyncClient(cluster.addr(1)) as client:
                # The client learns the cluster from node 1's refusal of partition 1.
                await client.produce(TOPIC, 0, [Message(b"a0"), Message(b"b0")])
                await client.produce(TOPIC, 1, [Message(b"a1")])
                assert cluster.refused[1] == 1
                got = await client.fetch(TOPIC, 1, 0)
                assert values(got.records) == [b"a1"]
            async with AsyncConsumer(cluster.addr(2), max_wait_ms=50) as consumer:
                await consumer.assign([(TOPIC, 0, 0), (TOPIC, 1, "earliest")])
                seen: list[tuple[int, bytes]] = []
                for _ in range(20):
                    seen += [(r.partition, r.value) for r in await consumer.poll(PROMPT_S)]
                    if len(seen) == 3:
                        break
                assert sorted(seen) == [(0, b"a0"), (0, b"b0"), (1, b"a1")]
                assert consumer.position(TOPIC, 0) == 2 and consumer.position(TOPIC, 1) == 1

    run(main())


def test_a_moved_leader_is_found_by_a_refresh(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The leadership of partition 0 moves to node 2: node 1 refuses with NotLeaderError,
    the clients refresh and go on at node 2, the consumer from the same offset."""

    async def main() -> None:
        async with two_brokers(tmp_path, monkeypatch) as (cluster, b1, b2):
            async with (
                AsyncProducer(cluster.addr(1), linger_ms=0, idempotence=False) as producer,
                AsyncConsumer(cluster.addr(1), max_wait_ms=50) as consumer,
            ):
                await (await producer.send(TOPIC, b"before", partition=0))
                await consumer.assign([(TOPIC, 0, 0)])
                assert values(await consumer.poll(PROMPT_S)) == [b"before"]
                cluster.leaders[TOPIC, 0] = 2
                # Node 2's log of partition 0 continues where node 1's ended (a replica).
                async with AsyncClient(cluster.addr(2)) as other:
                    assert await other.produce(TOPIC, 0, [Message(b"before")]) == 0
                meta = await (await producer.send(TOPIC, b"after", partition=0))
                assert cluster.refused[1] >= 1
                assert values((await stored(b2, TOPIC, 0))[1])[-1] == b"after"
                assert meta.offset == len((await stored(b2, TOPIC, 0))[1]) - 1
                got: list[bytes] = []
                for _ in range(20):
                    got += values(await consumer.poll(PROMPT_S))
                    if got:
                        break
                assert got == [b"after"]  # read on from offset 1, now at node 2

    run(main())
