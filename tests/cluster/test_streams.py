"""Lightweight streams in a cluster: ``__streams`` replicated through etcd, each stream served
by its owner (the leader of its partition), clients routed to it, the iPubSub mode answering
from any node, and streams that carry on at a new owner when the old one's node goes.

Three in-process nodes (broker, TCP server, :class:`ClusterNode` with its real replica
manager) in one event loop, against the real etcd of the ``etcd`` fixture. Every wait is
bounded; nothing asserts on how long something took.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from contextlib import AbstractAsyncContextManager
from pathlib import Path

import httpx
import msgspec

from tests.cluster._etcd import EtcdServer
from tests.cluster._inprocess import InProcessNode, in_process_cluster, until
from tidewire.broker.offsets import STREAMS_TOPIC
from tidewire.broker.streams.model import partition_of
from tidewire.client import AsyncClient
from tidewire.client._streams import STREAMS_TOPIC as CLIENT_STREAMS_TOPIC
from tidewire.client._streams import stream_partition
from tidewire.client._transport import Transport
from tidewire.errors import NotLeaderError
from tidewire.protocol.messages import SendItem, StreamReceiveRequest, StreamSendRequest
from tidewire.server.http.compat.ipubsub import create_ipubsub_app

#: The most one test may take, bounded (it takes seconds).
TEST_S = 120.0
#: Streams enough that every node owns some (4 partitions over 3 nodes).
STREAMS = [f"sensor-{i}" for i in range(16)]


class Node(InProcessNode):
    """One node of the cluster (see :class:`InProcessNode`)."""

    def __init__(self, tmp: Path, etcd: EtcdServer, node_id: int) -> None:
        super().__init__(tmp, etcd, node_id, cluster_id="streams")


def cluster(tmp: Path, etcd: EtcdServer, n: int = 3) -> AbstractAsyncContextManager[list[Node]]:
    return in_process_cluster(lambda i: Node(tmp, etcd, i), n)


def owner_id(nodes: list[Node], stream: str) -> int:
    """The node that leads ``stream``'s partition of ``__streams`` (-1: none now), as a live
    node's copy of etcd says."""
    live = [n for n in nodes if not n.stopped]
    cache = live[0].cluster.cache
    info = cache.topics.get(STREAMS_TOPIC)
    if info is None:
        return -1
    got = cache.partition(STREAMS_TOPIC, partition_of(stream, info.partitions))
    return -1 if got is None else got[0].leader


def serving(nodes: list[Node], stream: str) -> bool:
    """Whether the owner etcd names is live and serves ``stream``'s partition."""
    leader = owner_id(nodes, stream)
    node = next((n for n in nodes if n.id == leader and not n.stopped), None)
    if node is None:
        return False
    info = node.cluster.cache.topics[STREAMS_TOPIC]
    return partition_of(stream, info.partitions) in node.broker.streams.led_partitions


def run(main: Awaitable[None]) -> None:
    async def bounded() -> None:
        await asyncio.wait_for(main, TEST_S)

    asyncio.run(bounded())


def test_the_client_and_broker_agree_on_the_streams_topic() -> None:
    assert CLIENT_STREAMS_TOPIC == STREAMS_TOPIC
    for s in ("a", "sensor-7", "ü/x", "\udcff"):
        for n in (1, 4, 7):
            assert stream_partition(s, n) == partition_of(s, n)


def test_streams_are_served_by_their_owners_and_carry_on_at_a_new_one(
    tmp_path: Path, etcd: EtcdServer
) -> None:
    run(_served_by_owners(tmp_path, etcd))


async def _served_by_owners(tmp_path: Path, etcd: EtcdServer) -> None:
    async with (
        cluster(tmp_path, etcd) as nodes,
        AsyncClient(nodes[0].addr) as c1,
        AsyncClient(nodes[1].addr) as c2,
    ):
        # Sent through node 1 (routed to each owner); two persistent messages a stream.
        items = [(s, f"{s}/{i}", "", 0, True) for i in range(2) for s in STREAMS]
        results = await c1.streams.send_many(items)
        assert [r.code for r in results] == [0] * len(items), results
        await until(lambda: all(serving(nodes, s) for s in STREAMS), "owners serve")
        owners = {owner_id(nodes, s) for s in STREAMS}
        assert len(owners) >= 2, owners  # the streams are spread over several nodes

        # Each node refuses a stream it does not own, naming the owner; nothing stored.
        foreign = next(s for s in STREAMS if owner_id(nodes, s) != nodes[2].id)
        raw = Transport(nodes[2].addr)
        try:
            sent = await raw.request(
                StreamSendRequest(items=[SendItem(foreign, b"x", "", 0, True)])
            )
            assert sent is not None
            (refusal,) = sent.body.results
            assert refusal.code == NotLeaderError.code
            assert f"node {owner_id(nodes, foreign)}" in refusal.message
            taken = await raw.request(StreamReceiveRequest(streams=[foreign]))
            assert taken is not None
            assert taken.body.error_code == NotLeaderError.code
        finally:
            await raw.close()

        # Received through node 2 (routed): the first message of every stream, once.
        for s in STREAMS:
            got = await c2.streams.receive(s, wait_ms=5_000)
            assert got is not None, s
            assert got.value == f"{s}/0".encode(), (s, got)
        # One receive naming streams of several owners takes from them in turn.
        many = await c2.streams.receive_many(STREAMS[:6], max_messages=6, wait_ms=5_000)
        assert many
        assert all(m.value == f"{m.stream}/1".encode() for m in many)
        taken_twice = {m.stream for m in many}

        # The owner of STREAMS[0] leaves: its partitions move to in-sync replicas.
        victim = next(n for n in nodes if n.id == owner_id(nodes, STREAMS[0]))
        moved = [s for s in STREAMS if owner_id(nodes, s) == victim.id]
        await victim.stop()
        await until(lambda: all(serving(nodes, s) for s in STREAMS), "new owners serve")
        live = ",".join(n.addr for n in nodes if not n.stopped)
        async with AsyncClient(live) as c3:
            for s in moved:
                got = await c3.streams.receive(s, wait_ms=100)
                if s in taken_twice:  # both taken before the failover: none again
                    assert got is None, (s, got)
                else:  # the second, and only it: the first's take was replicated
                    assert got is not None, s
                    assert got.value == f"{s}/1".encode(), (s, got)
                    assert await c3.streams.receive(s, wait_ms=0) is None
            # Nothing acknowledged is lost: both messages of every stream are read back.
            for s in STREAMS:
                read, _ = await c3.streams.read({s: ""}, max_messages=10)
                assert [m.value for m in read] == [f"{s}/{i}".encode() for i in range(2)]


def test_the_ipubsub_mode_answers_from_any_node(tmp_path: Path, etcd: EtcdServer) -> None:
    run(_ipubsub_from_any_node(tmp_path, etcd))


async def _ipubsub_from_any_node(tmp_path: Path, etcd: EtcdServer) -> None:
    async with cluster(tmp_path, etcd) as nodes:
        async with AsyncClient(nodes[0].addr) as c1:
            await c1.streams.send_many([(s, f'"{s}"', f"u-{s}", 0, True) for s in STREAMS])
        await until(lambda: all(serving(nodes, s) for s in STREAMS), "owners serve")
        foreign = [s for s in STREAMS if owner_id(nodes, s) != nodes[2].id]
        assert foreign
        app = create_ipubsub_app(nodes[2].broker, max_body_bytes=1 << 20)
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://node3") as http:
            for s in foreign:
                # a message sent before, taken through node 3 (forwarded to the owner)
                got = await http.get(
                    "/api/v1/streams/receive", params={"streamId": s, "timeoutSeconds": 5}
                )
                assert got.status_code == 200, got.text
                assert got.json()["message"] == s
                # sent through node 3, deduplicated by its uuid at the owner
                for _ in range(2):
                    sent = await http.post(
                        "/api/v1/streams/send",
                        content=msgspec.json.encode(
                            {"streamId": s, "messageUuid": "again", "message": {"n": 1}}
                        ),
                    )
                    assert sent.status_code == 200, sent.text
                got = await http.get(
                    "/api/v1/streams/receive", params={"streamId": s, "timeoutSeconds": 5}
                )
                assert got.status_code == 200
                assert got.json()["message"] == {"n": 1}
                got = await http.get(
                    "/api/v1/streams/receive", params={"streamId": s, "timeoutSeconds": 0}
                )
                assert got.status_code == 424, got.text
                # replayed from the stream's persistent messages (read, not taken)
                got = await http.get(
                    "/api/v1/streams/receive",
                    params={"streamId": s, "readFromDB": "true", "timeoutSeconds": 1},
                )
                assert got.status_code == 200
                assert got.json()["message"] == s
