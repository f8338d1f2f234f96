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
from typing import Any

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
from tidewire.client import (
    AsyncClient,
    AsyncConsumer,
    AsyncGroupConsumer,
    AsyncProducer,
    AsyncSubscriber,
    Client,
    Message,
    Producer,
    RoutingStats,
    Subscriber,
)
from tidewire.client._transport import parse_addrs
from tidewire.errors import ConnectionLostError, NotLeaderError, ShuttingDownError
from tidewire.protocol.messages import MetadataRequest
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
async def clients_at_node_1(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[tuple[FakeCluster, Broker, AsyncProducer, AsyncConsumer]]:
    """:func:`two_brokers` with a producer and a consumer bootstrapped at node 1: the
    cluster, node 2's broker and the two clients."""
    async with (
        two_brokers(tmp_path, monkeypatch) as (cluster, _b1, b2),
        AsyncProducer(cluster.addr(1), linger_ms=0, idempotence=False) as producer,
        AsyncConsumer(cluster.addr(1), max_wait_ms=50) as consumer,
    ):
        yield cluster, b2, producer, consumer


async def lead_moved_to_node_2(cluster: FakeCluster) -> None:
    """Partition 0's lead moves to node 2, whose log of it continues where node 1's ended
    with the one record ``before`` (a replica's)."""
    cluster.leaders[TOPIC, 0] = 2
    async with AsyncClient(cluster.addr(2)) as other:
        assert await other.produce(TOPIC, 0, [Message(b"before")]) == 0


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


async def poll_into(reader: Any, got: list[bytes], n: int, tries: int = 20) -> None:
    """Poll ``reader`` (a consumer or a subscriber) into ``got``, its records' values, until
    it holds ``n`` of them, ``tries`` polls at most."""
    for _ in range(tries):
        got += values(await reader.poll(PROMPT_S))
        if len(got) >= n:
            break


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
        async with serve(tmp_path) as (_broker, server):
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
        async with serve(tmp_path) as (_broker, server):
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
            assert (await stored(b1, TOPIC, 1))[1] == []
            assert (await stored(b2, TOPIC, 0))[1] == []
            assert cluster.refused == {}  # nothing went to the wrong node
            assert cluster.asked[1, "METADATA"] == 0  # the bootstrap node answered it

    run(main())


def test_the_consumer_fetches_each_partition_from_its_leader(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def main() -> None:
        async with two_brokers(tmp_path, monkeypatch) as (cluster, _b1, _b2):
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
                assert consumer.position(TOPIC, 0) == 2
                assert consumer.position(TOPIC, 1) == 1

    run(main())


def test_a_moved_leader_is_found_by_a_refresh(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The leadership of partition 0 moves to node 2: node 1 refuses with NotLeaderError,
    the clients refresh and go on at node 2, the consumer from the same offset."""

    async def main() -> None:
        async with clients_at_node_1(tmp_path, monkeypatch) as (cluster, b2, producer, consumer):
            await (await producer.send(TOPIC, b"before", partition=0))
            await consumer.assign([(TOPIC, 0, 0)])
            assert values(await consumer.poll(PROMPT_S)) == [b"before"]
            await lead_moved_to_node_2(cluster)
            meta = await (await producer.send(TOPIC, b"after", partition=0))
            assert cluster.refused[1] >= 1
            assert values((await stored(b2, TOPIC, 0))[1])[-1] == b"after"
            assert meta.offset == len((await stored(b2, TOPIC, 0))[1]) - 1
            got: list[bytes] = []
            await poll_into(consumer, got, 1)
            assert got == [b"after"]  # read on from offset 1, now at node 2

    run(main())


def test_a_group_member_fetches_from_the_leaders(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The group's own requests stay on the bootstrap node (1); the fetches go to each
    partition's leader, and "earliest" is looked up there too."""

    async def main() -> None:
        async with two_brokers(tmp_path, monkeypatch) as (cluster, b1, b2):
            async with AsyncClient(cluster.addr(2)) as client:
                await client.describe_topic(TOPIC, auto_create=True)  # learns the cluster
                await client.produce(TOPIC, 0, [Message(b"x0")])
                await client.produce(TOPIC, 1, [Message(b"x1"), Message(b"y1")])
            assert len((await stored(b1, TOPIC, 0))[1]) == 1
            assert len((await stored(b2, TOPIC, 1))[1]) == 2
            async with AsyncGroupConsumer(
                cluster.addr(1), "g", topics=[TOPIC], auto_offset_reset="earliest", max_wait_ms=50
            ) as member:
                got: list[tuple[int, bytes]] = []
                for _ in range(40):
                    got += [(r.partition, r.value) for r in await member.poll(PROMPT_S)]
                    if len(got) == 3:
                        break
                assert sorted(got) == [(0, b"x0"), (1, b"x1"), (1, b"y1")]
                # Node 1 refused partition 1's first fetch (it learned the leaders from
                # that); nothing moved.
                stats = member.routing_stats
                assert stats.metadata_refreshes >= 1
                assert stats.not_leader_retries >= 1
                assert stats.leader_moves == 0
            assert cluster.asked[2, "FETCH"] >= 1

    run(main())


def test_routing_stats_count_the_refreshes_retries_and_moves_a_client_went_through(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Partition 0's lead moves from node 1 to node 2: the producer and the consumer each
    count a NotLeader retry (at least), exactly one leader move, and the refreshes they
    asked; partition 1's leader (node 2 all along) is no move. The copies handed out do not
    change afterwards. (The fake cluster does not refuse a push subscription on a
    non-leader: the subscriber's counts are tested in tests/cluster/test_push_routing.py.)"""

    async def main() -> None:
        async with clients_at_node_1(tmp_path, monkeypatch) as (cluster, b2, producer, consumer):
            await (await producer.send(TOPIC, b"before", partition=0))
            await (await producer.send(TOPIC, b"one", partition=1))
            await consumer.assign([(TOPIC, 0, 0), (TOPIC, 1, 0)])
            got: list[bytes] = []
            await poll_into(consumer, got, 2)
            start = {c: c.routing_stats for c in (producer, consumer)}
            # The producer asks where the leaders are first; the consumer learns that node 1
            # does not lead partition 1 from its NotLeaderError (a retry, not a move).
            assert start[producer] == RoutingStats(start[producer].metadata_refreshes, 0, 0)
            assert start[consumer].not_leader_retries >= 1
            for stats in start.values():
                assert stats.leader_moves == 0
                assert stats.metadata_refreshes >= 1
            await lead_moved_to_node_2(cluster)
            await (await producer.send(TOPIC, b"after", partition=0))
            assert values((await stored(b2, TOPIC, 0))[1])[-1] == b"after"
            await poll_into(consumer, got, 3, tries=40)
            assert sorted(got) == [b"after", b"before", b"one"]
            for client, before in start.items():
                now = client.routing_stats
                assert now.not_leader_retries > before.not_leader_retries, (client, now)
                assert now.leader_moves == 1, (client, now)
                assert now.metadata_refreshes > before.metadata_refreshes, (client, now)
            assert start[producer].leader_moves == 0  # a copy: not changed since

    run(main())


def test_routing_stats_add_up_and_the_blocking_twins_hand_them_out(tmp_path: Path) -> None:
    """``+`` sums two counts (a group member's coordinator and partitions); the blocking
    producer and subscriber of a single node hand out their twins' counts: refreshes only
    (the producer's one for its topic), no retries, no moves."""
    assert RoutingStats(1, 2, 3) + RoutingStats(10, 20, 30) == RoutingStats(11, 22, 33)

    async def main() -> None:
        async with serve(tmp_path) as (broker, server):
            broker.create_topic(TOPIC, 1)

            def work() -> tuple[RoutingStats, RoutingStats, list[bytes]]:
                with Producer(addr(server), linger_ms=0) as producer:
                    producer.send(TOPIC, b"x", partition=0).result(PROMPT_S)
                    sent = producer.routing_stats
                with Subscriber(addr(server)) as sub:
                    sub.subscribe([(TOPIC, 0, "earliest")])
                    got: list[bytes] = []
                    for _ in range(20):
                        got += values(sub.poll(PROMPT_S))
                        if got:
                            break
                    return sent, sub.routing_stats, got

            sent, pushed, got = await in_thread(work)
            assert got == [b"x"]
            assert sent == RoutingStats(1, 0, 0)
            assert pushed == RoutingStats()

    run(main())


# --- failover -------------------------------------------------------------------------------------


def test_clients_fail_over_when_the_leaders_node_stops(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Node 1 leads; its server stops and node 2 takes over: the idempotent producer's sends
    are all stored once and in order, the consumer reads on from its position."""

    async def main() -> None:
        async with one_broker_two_nodes(tmp_path, monkeypatch) as (cluster, b, s1, _s2):
            boot = [cluster.addr(1), cluster.addr(2)]
            async with (
                AsyncProducer(boot, linger_ms=0, request_timeout_ms=2000) as producer,
                AsyncConsumer(boot, max_wait_ms=50, request_timeout_ms=2000) as consumer,
            ):
                first = [await producer.send(TOPIC, b"a%d" % i, partition=0) for i in range(5)]
                await producer.flush(PROMPT_S)
                await consumer.assign([(TOPIC, 0, 0)])
                got: list[bytes] = []
                await poll_into(consumer, got, 5)
                cluster.leaders = {(TOPIC, 0): 2, (TOPIC, 1): 2}
                cluster.down.add(1)
                await s1.close(grace_s=0)
                later = [await producer.send(TOPIC, b"b%d" % i, partition=0) for i in range(5)]
                await producer.flush(PROMPT_S * 2)
                assert [f.result().offset for f in first + later] == list(range(10))
                await poll_into(consumer, got, 10, tries=40)
                want = [b"a%d" % i for i in range(5)] + [b"b%d" % i for i in range(5)]
                assert got == want
                assert values((await stored(b, TOPIC, 0))[1]) == want
                assert cluster.asked[2, "PRODUCE"] >= 1
                assert cluster.asked[2, "FETCH"] >= 1

    run(main())


@contextlib.asynccontextmanager
async def storing_then_cut(
    cluster: FakeCluster, monkeypatch: pytest.MonkeyPatch, node: int
) -> AsyncIterator[asyncio.Event]:
    """Node ``node`` stores the first produce it gets and never answers it; set the event
    yielded (after stopping the node's server) to let the handler return."""
    from tidewire.protocol.messages import ApiKey
    from tidewire.server.handlers import HANDLERS

    release = asyncio.Event()
    inner = HANDLERS[ApiKey.PRODUCE]
    cut = False

    async def produce(b, s, req, data):  # type: ignore[no-untyped-def]
        nonlocal cut
        reply = await inner(b, s, req, data)
        if cluster.servers[node].port == s.port and not cut:
            cut = True
            await release.wait()  # stored; the answer is lost with the connection
        return reply

    monkeypatch.setitem(HANDLERS, ApiKey.PRODUCE, produce)
    try:
        yield release
    finally:
        release.set()


async def _stored_count(b: Broker, n: int) -> None:
    async with asyncio.timeout(PROMPT_S):
        while len((await stored(b, TOPIC, 0))[1]) < n:
            await asyncio.sleep(0.01)


def test_an_idempotent_retry_after_a_lost_answer_is_stored_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def main() -> None:
        async with (
            one_broker_two_nodes(tmp_path, monkeypatch) as (cluster, b, s1, _s2),
            storing_then_cut(cluster, monkeypatch, 1) as release,
            AsyncProducer(cluster.addr(1), linger_ms=0, request_timeout_ms=5000) as producer,
        ):
            fut = await producer.send(TOPIC, b"once", partition=0)
            await _stored_count(b, 1)  # stored by node 1, not answered
            cluster.leaders = {(TOPIC, 0): 2, (TOPIC, 1): 2}
            cluster.down.add(1)
            await s1.close(grace_s=0)
            release.set()
            async with asyncio.timeout(PROMPT_S * 2):
                await fut  # resent to node 2 with the same sequence: a duplicate
            await (await producer.send(TOPIC, b"next", partition=0))
            assert values((await stored(b, TOPIC, 0))[1]) == [b"once", b"next"]
            assert cluster.asked[2, "PRODUCE"] >= 2

    run(main())


def test_a_plain_produce_is_not_resent_after_a_lost_connection(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """AsyncClient.produce is not idempotent: a connection lost after the batch was sent
    raises (the batch may be stored, as here) instead of storing it twice."""

    async def main() -> None:
        async with (
            one_broker_two_nodes(tmp_path, monkeypatch) as (cluster, b, s1, _s2),
            storing_then_cut(cluster, monkeypatch, 1) as release,
            AsyncClient([cluster.addr(1), cluster.addr(2)]) as client,
        ):
            await client.describe_topic(TOPIC, auto_create=True)  # learns the cluster
            task = asyncio.create_task(client.produce(TOPIC, 0, [Message(b"v")]))
            await _stored_count(b, 1)
            cluster.down.add(1)
            await s1.close(grace_s=0)
            release.set()
            # The connection's end: lost, or the node's goodbye (it is shutting down).
            with pytest.raises((ConnectionLostError, ShuttingDownError)):
                await asyncio.wait_for(task, PROMPT_S)
            assert values((await stored(b, TOPIC, 0))[1]) == [b"v"]
            # The next request finds the new leader.
            cluster.leaders[TOPIC, 0] = 2
            assert await client.produce(TOPIC, 0, [Message(b"w")]) == 1

    run(main())


def test_not_leader_is_raised_once_the_request_timeout_is_spent(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A partition whose leader never shows up: the retries stop at request_timeout_s."""

    async def main() -> None:
        async with two_brokers(tmp_path, monkeypatch) as (cluster, b1, _b2):
            cluster.leaders[TOPIC, 0] = 3  # a node nobody can reach: never leads here
            async with AsyncClient(cluster.addr(1), request_timeout_s=0.3) as client:
                with pytest.raises(NotLeaderError):
                    await client.produce(TOPIC, 0, [Message(b"v")])
            assert cluster.refused[1] >= 2  # retried after a refresh
            assert (await stored(b1, TOPIC, 0))[1] == []

    run(main())


# --- blocking facades -----------------------------------------------------------------------------


def test_the_blocking_producer_routes_too(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    async def main() -> None:
        async with two_brokers(tmp_path, monkeypatch) as (cluster, b1, b2):

            def work() -> None:
                with Producer(cluster.addr(1), linger_ms=0) as producer:
                    for i in range(4):
                        producer.send(TOPIC, b"%d" % i, partition=i % 2)
                    producer.flush(PROMPT_S)

            await in_thread(work)
            assert values((await stored(b1, TOPIC, 0))[1]) == [b"0", b"2"]
            assert values((await stored(b2, TOPIC, 1))[1]) == [b"1", b"3"]
            assert cluster.refused == {}

    run(main())


# --- a single node --------------------------------------------------------------------------------


def test_a_single_node_gets_no_request_it_did_not_get_before(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No leaders in a single node's metadata: one connection, no METADATA from the plain
    client, the consumer and the subscriber, one per topic from the producer (as before)."""

    async def main() -> None:
        cluster = FakeCluster(monkeypatch)  # no nodes: it only counts requests
        async with serve(tmp_path) as (broker, server):
            broker.create_topic(TOPIC, 2)
            async with AsyncClient(addr(server)) as client:
                await client.produce(TOPIC, 1, [Message(b"c")])
                await client.fetch(TOPIC, 1, 0)
                await client.list_offset(TOPIC, 1, -1)
                assert not client._router.clustered
            async with AsyncProducer(addr(server), linger_ms=0) as producer:
                await (await producer.send(TOPIC, b"p", partition=0))
                await (await producer.send(TOPIC, b"q", partition=1))
                assert not producer._router.clustered
                assert not producer._router._links
            async with AsyncConsumer(addr(server), max_wait_ms=0) as consumer:
                await consumer.assign([(TOPIC, 0, "earliest"), (TOPIC, 1, 0)])
                got: list[bytes] = []
                await poll_into(consumer, got, 3)
                assert sorted(got) == [b"c", b"p", b"q"]
                assert not consumer._router.clustered
            async with AsyncSubscriber(addr(server)) as sub:
                await sub.subscribe([(TOPIC, 0, "earliest"), (TOPIC, 1, 0)])
                got = []
                await poll_into(sub, got, 3)
                assert sorted(got) == [b"c", b"p", b"q"]
                assert not sub._router.clustered
                assert not sub._router._links
                assert len(sub._links) == 1  # one subscription, on the one connection
        assert cluster.asked[-1, "METADATA"] == 1  # the producer's, for its one topic

    run(main())


def test_a_plain_produce_lost_with_its_leaders_node_sends_the_next_one_to_the_new_leader(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A plain produce whose leader's node goes is not sent again (it may be stored), but the
    leader is forgotten: the caller's next produce goes to the new leader, not to the dead
    node again (each attempt there would only fail, after a longer reconnect backoff)."""

    async def main() -> None:
        async with (
            one_broker_two_nodes(tmp_path, monkeypatch) as (cluster, _b, s1, _s2),
            AsyncClient([cluster.addr(2), cluster.addr(1)], request_timeout_s=2) as client,
        ):
            await client.describe_topic(TOPIC, auto_create=True)  # learns the cluster
            assert await client.produce(TOPIC, 0, [Message(b"v")]) == 0  # over node 1's link
            cluster.down.add(1)
            await s1.close(grace_s=0)
            cluster.leaders[TOPIC, 0] = 2
            with pytest.raises((ConnectionLostError, ShuttingDownError)):
                await client.produce(TOPIC, 0, [Message(b"w")])
            offset = -1
            for _ in range(5):  # a few attempts, as a caller retrying would make
                try:
                    offset = await client.produce(TOPIC, 0, [Message(b"w")])
                    break
                except (ConnectionLostError, ShuttingDownError):
                    await asyncio.sleep(0.1)
            assert offset >= 1
            assert cluster.asked[2, "PRODUCE"] >= 1

    run(main())


def test_a_lost_leaders_node_is_tried_again_at_the_callers_pace(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """While the metadata still names a dead node as leader, each failed connect doubles its
    transport's reconnect backoff (towards seconds); forgetting the leader resets it, so the
    first retry after a failover is held only by the client's own pacing (at most 250 ms)."""
    from tidewire.client._routing import RETRY_BACKOFF_MAX_S, Router
    from tidewire.client._transport import Transport

    async def main() -> None:
        with refusing_port() as dead:
            async with (
                broker_at(tmp_path) as b,
                listening(b) as s,
            ):
                boot = Transport(addr(s), connect_timeout_s=1, request_timeout_s=1)
                router = Router(boot, lambda a: Transport(a, connect_timeout_s=1))
                router.clustered = True
                router._nodes = {1: ("127.0.0.1", dead)}
                router._leaders[TOPIC, 0] = 1
                link = router.transport_for(TOPIC, 0)
                assert link is not boot
                for _ in range(4):  # backoffs 0, 0.05, 0.1, 0.2 s before them
                    with pytest.raises(ConnectionLostError):
                        await link.request(MetadataRequest())
                assert link._backoff > RETRY_BACKOFF_MAX_S
                router.forget(TOPIC, 0)
                assert link._backoff == 0
                await router.close()
                await boot.close()

    run(main())
