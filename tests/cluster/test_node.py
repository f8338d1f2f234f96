"""Nodes of a cluster, in one process against a real etcd: brokers with their own data
directories and TCP listeners, each a :class:`ClusterNode`. The replica manager here is a
recorder of the roles the node gives (the replication itself has its own tests): what is
checked is the node's part — registration, topics created and deleted through etcd with
their logs on every replica, roles that follow the metadata, ISR proposals fenced by version,
METADATA from the node's copy, and a node that loses its lease stops leading."""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path

import pytest

from tests.cli._support import run_cli
from tests.cluster._etcd import EtcdServer
from tidewire.broker import Broker, BrokerConfig
from tidewire.client._transport import Transport
from tidewire.cluster import cluster_node
from tidewire.cluster.etcd import EtcdClient, EtcdError
from tidewire.cluster.metadata import MetadataStore, NodeInfo, PartitionState
from tidewire.cluster.node import ClusterNode, parse_cluster_url
from tidewire.errors import (
    InvalidConfigError,
    InvalidTopicError,
    TopicExistsError,
    UnknownTopicError,
)
from tidewire.protocol.messages import (
    AlterTopicRequest,
    CreateTopicRequest,
    DeleteTopicRequest,
    ListTopicsRequest,
    MetadataRequest,
    MetadataResponse,
)
from tidewire.server import TcpServer
from tidewire.server.tcp import ServerConfig

WAIT_S = 20.0


class Recorder:
    """A replica manager that records the roles it is given."""

    def __init__(self) -> None:
        self.roles: dict[tuple[str, int], tuple[object, ...]] = {}
        self.calls: list[tuple[object, ...]] = []
        self.min_insync: dict[tuple[str, int], int | None] = {}
        self.closed = False

    async def become_leader(
        self,
        topic: str,
        partition: int,
        *,
        epoch: int,
        replicas: tuple[int, ...],
        isr: tuple[int, ...],
        min_insync: int | None = None,
    ) -> None:
        self.roles[topic, partition] = ("leader", epoch)
        self.calls.append(("leader", topic, partition, epoch))
        self.min_insync[topic, partition] = min_insync

    async def become_follower(
        self,
        topic: str,
        partition: int,
        *,
        epoch: int,
        leader: int,
        leader_address: tuple[str, int],
    ) -> None:
        self.roles[topic, partition] = ("follower", epoch, leader, leader_address)
        self.calls.append(("follower", topic, partition, epoch, leader))

    async def stop_replica(
        self, topic: str, partition: int, *, keep_high_watermark: bool = False
    ) -> None:
        self.roles.pop((topic, partition), None)
        self.calls.append(("stop", topic, partition))

    def following(self, key: tuple[str, int]) -> None:
        return None  # never paused: nothing fetches here

    async def close(self) -> None:
        self.closed = True


class Member:
    def __init__(self, tmp: Path, etcd: EtcdServer, node_id: int) -> None:
        self.id = node_id
        self.broker = Broker(
            BrokerConfig(data_dir=str(tmp / f"node{node_id}"), auto_create_topics=False)
        )
        self.server = TcpServer(self.broker, ServerConfig(host="127.0.0.1", port=0))
        self.etcd = etcd
        self.replicas = Recorder()
        self.node: ClusterNode | None = None

    async def start(self, stack: AsyncExitStack) -> None:
        await self.broker.start()
        stack.push_async_callback(self.broker.close)
        await self.server.start()
        stack.push_async_callback(self.server.close)
        self.node = ClusterNode(
            self.broker,
            self.id,
            [self.etcd.endpoint],
            advertise=("127.0.0.1", self.server.port),
            cluster_id="t",
            session_timeout_s=2,
            default_replication_factor=3,
            replication=self.replicas,
        )
        await self.node.start()
        stack.push_async_callback(self.close)

    async def close(self) -> None:
        if self.node is not None:
            await self.node.close()
            self.node = None

    @property
    def addr(self) -> str:
        return f"127.0.0.1:{self.server.port}"


@asynccontextmanager
async def cluster(tmp: Path, etcd: EtcdServer, n: int) -> AsyncIterator[list[Member]]:
    async with AsyncExitStack() as stack:
        members = [Member(tmp, etcd, i) for i in range(1, n + 1)]
        for m in members:
            await m.start(stack)
        for m in members:
            assert m.node is not None
            await m.node.cache.wait_for(lambda c=m.node.cache: len(c.nodes) == n, WAIT_S)
        yield members


def user_logs(m: Member) -> list[tuple[str, int]]:
    """The partition logs of ``m``, its internal topics (``__audit``...) left out."""
    return [k for k in m.broker.logs.logs if not k[0].startswith("__")]


async def call(addr: str, body: object) -> object:
    t = Transport(addr, request_timeout_s=WAIT_S)
    try:
        response = await t.request(body)  # type: ignore[arg-type]
        assert response is not None
        return response.body
    finally:
        await t.close()


def test_parse_cluster_url() -> None:
    assert parse_cluster_url("etcd://a:1,b:2") == ["http://a:1", "http://b:2"]
    for bad in ("http://a:1", "etcd://", "etcd://a", "etcd://a:0", "etcd://a:1,:2"):
        with pytest.raises(InvalidConfigError):
            parse_cluster_url(bad)


def test_topics_are_created_through_etcd_and_every_replica_gets_its_log(
    tmp_path: Path, etcd: EtcdServer
) -> None:
    async def main() -> None:
        async with cluster(tmp_path, etcd, 3) as members:
            a, b, c = members
            # Created on node 2: placed over all three, the logs on every node.
            reply = await call(b.addr, CreateTopicRequest(name="orders", partitions=3))
            assert reply.error_code == 0, reply  # type: ignore[attr-defined]
            again = await call(c.addr, CreateTopicRequest(name="orders", partitions=1))
            assert again.error_code == TopicExistsError.code  # type: ignore[attr-defined]
            for m in members:
                assert m.node is not None
                await m.node.wait_reconciled(  # (and the nodes' audit logs: __audit.N)
                    lambda m=m: len([k for k in m.replicas.roles if k[0] == "orders"]) == 3,
                    WAIT_S,
                )
                assert sorted(user_logs(m)) == [("orders", p) for p in range(3)]
            # Each partition: one leader (the first replica), followers pointed at it.
            meta = await call(a.addr, MetadataRequest())
            assert isinstance(meta, MetadataResponse)
            assert meta.broker_id == 1
            assert meta.port == a.server.port
            assert [(n.node_id, n.port) for n in meta.nodes] == [
                (m.id, m.server.port) for m in members
            ]
            assert meta.controller in (1, 2, 3)
            (topic,) = meta.topics
            for p in topic.partitions:
                assert sorted(p.replicas) == [1, 2, 3]
                assert p.isr == p.replicas
                assert p.leader == p.replicas[0]
                assert p.leader_epoch == 0
                leader = members[p.leader - 1]
                assert leader.replicas.roles["orders", p.partition] == ("leader", 0)
                for m in members:
                    if m is not leader:
                        assert m.replicas.roles["orders", p.partition] == (
                            "follower",
                            0,
                            leader.id,
                            ("127.0.0.1", leader.server.port),
                        )
            assert {p.leader for p in topic.partitions} == {1, 2, 3}  # spread
            # The CLI's view, through any node (the first address does not answer).
            dead = "127.0.0.1:1"
            out = await asyncio.to_thread(
                run_cli, ["cluster", "status", "--json", "--addr", f"{dead},{c.addr}"]
            )
            assert out.exit_code == 0, out.output
            doc = json.loads(out.stdout)
            assert doc["controller"] == meta.controller
            assert [n["node_id"] for n in doc["nodes"]] == [1, 2, 3]
            assert len(doc["partitions"]) == 3
            assert doc["under_replicated"] == 0
            assert doc["offline"] == 0
            out = await asyncio.to_thread(run_cli, ["cluster", "nodes", "--addr", a.addr])
            assert out.exit_code == 0, out.output
            assert out.stdout.splitlines()[meta.controller - 1].endswith("controller")
            out = await asyncio.to_thread(run_cli, ["cluster", "status", "--addr", b.addr])
            assert out.stdout.startswith("nodes: 3, controller: ")
            # Summary, nodes, the cluster's totals, the table's header and its rows.
            assert len(out.stdout.splitlines()) == 1 + 3 + 1 + 1 + 3
            assert out.stdout.splitlines()[4].startswith("totals over 3 nodes: ")
            # Altered through etcd (test_reassign.py): never to fewer partitions.
            altered = await call(b.addr, AlterTopicRequest(name="orders", partitions=2))
            assert altered.error_code == InvalidTopicError.code  # type: ignore[attr-defined]
            listed = await call(c.addr, ListTopicsRequest())
            assert listed.topics == ["orders"]  # type: ignore[attr-defined]
            # A name no node created: an error, not a topic made on the spot.
            meta = await call(a.addr, MetadataRequest(topics=["nope"], auto_create=True))
            assert isinstance(meta, MetadataResponse)
            assert meta.topics[0].error_code == UnknownTopicError.code
            assert "create it first" in meta.topics[0].error_message
            # Deleted on node 3: gone from every node, roles stopped.
            reply = await call(c.addr, DeleteTopicRequest(name="orders"))
            assert reply.error_code == 0, reply  # type: ignore[attr-defined]
            for m in members:
                assert m.node is not None
                await m.node.wait_reconciled(
                    lambda m=m: not m.broker.logs.partition_count("orders"), WAIT_S
                )
                assert not [k for k in m.replicas.roles if k[0] == "orders"]
            gone = await call(a.addr, DeleteTopicRequest(name="orders"))
            assert gone.error_code == UnknownTopicError.code  # type: ignore[attr-defined]

    asyncio.run(main())


def test_replication_factor_below_the_node_count_places_logs_only_on_replicas(
    tmp_path: Path, etcd: EtcdServer
) -> None:
    async def main() -> None:
        async with cluster(tmp_path, etcd, 3) as members:
            a = members[0]
            assert a.node is not None
            n = await a.node.create_topic("t", 3, a.broker.config.log, replication_factor=2)
            assert n == 3
            with pytest.raises(InvalidTopicError, match="replication factor 4 needs"):
                await a.node.create_topic("u", 1, a.broker.config.log, replication_factor=4)
            for m in members:
                assert m.node is not None
                cache = m.node.cache  # each copy sees the topic through its watch
                await cache.wait_for(lambda c=cache: len(c.partitions()) == 3, WAIT_S)
                mine = {
                    ("t", p)
                    for (t, p), (s, _) in m.node.cache.partitions().items()
                    if m.id in s.replicas
                }
                await m.node.wait_reconciled(
                    lambda m=m, mine=mine: m.replicas.roles.keys() == mine, WAIT_S
                )
                assert len(mine) == 2
                assert set(user_logs(m)) == mine

    asyncio.run(main())


def test_a_topics_own_min_insync_and_unclean_election_reach_its_leaders(
    tmp_path: Path, etcd: EtcdServer
) -> None:
    """The topic's settings live in etcd with it: each partition's leader gets the topic's
    min_insync_replicas (else the node's default, at most the replication factor), METADATA
    and the controller see them; a value above the replication factor is refused."""

    async def main() -> None:
        async with cluster(tmp_path, etcd, 3) as members:
            a = members[0]
            assert a.node is not None
            log_cfg = a.broker.config.log
            await a.node.create_topic(
                "strict", 2, log_cfg, 3, min_insync_replicas=3, unclean_leader_election=True
            )
            await a.node.create_topic("plain", 1, log_cfg, 2)
            with pytest.raises(
                InvalidConfigError, match=r"min_insync_replicas=3 must be within 1\.\.2"
            ):
                await a.node.create_topic("bad", 1, log_cfg, 2, min_insync_replicas=3)
            for m in members:
                assert m.node is not None
                await m.node.cache.wait_for(
                    lambda c=m.node.cache: "plain" in c.topics and "strict" in c.topics, WAIT_S
                )
            led = {}
            for m in members:
                assert m.node is not None
                node = m.node
                await node.wait_reconciled(
                    lambda m=m, node=node: all(
                        m.replicas.roles.get(k, ("?",))[0] in ("leader", "follower")
                        for k, (s, _) in node.cache.partitions().items()
                        if m.id in s.replicas
                    ),
                    WAIT_S,
                )
                for k, v in m.replicas.min_insync.items():
                    if m.replicas.roles.get(k, ("?",))[0] == "leader":
                        led[k] = v
            assert led == {("strict", 0): 3, ("strict", 1): 3, ("plain", 0): 1}
            assert a.node._controller().unclean("strict")  # type: ignore[attr-defined]
            meta = await call(a.addr, MetadataRequest(topics=["strict", "plain"]))
            assert isinstance(meta, MetadataResponse)
            got = {
                t.name: (t.replication_factor, t.min_insync_replicas, t.unclean_leader_election)
                for t in meta.topics
            }
            assert got == {"strict": (3, 3, True), "plain": (2, 1, False)}

    asyncio.run(main())


def test_a_replica_of_an_earlier_topic_of_the_same_name_is_deleted_and_made_again(
    tmp_path: Path, etcd: EtcdServer
) -> None:
    """Each replica's directory holds the id of the topic incarnation it belongs to (etcd's).
    A log whose id differs (the topic was deleted and created again while its node was away)
    is deleted and made anew, empty, to be copied from the leader, never mixed with the new
    topic; a log without an id file is taken as the current one."""
    from tidewire.cluster.node import TOPIC_ID_FILE
    from tidewire.records import BatchBuilder

    async def main() -> None:
        async with cluster(tmp_path, etcd, 2) as (a, b):
            assert a.node is not None
            assert b.node is not None
            await a.node.create_topic("t", 1, a.broker.config.log, replication_factor=2)
            node_b = b.node
            await node_b.wait_reconciled(lambda: ("t", 0) in node_b._applied, WAIT_S)
            topic_id = node_b.cache.topics["t"].topic_id
            assert len(topic_id) == 32
            plog = b.broker.logs.logs["t", 0]
            id_file = Path(plog.directory) / TOPIC_ID_FILE
            assert id_file.read_text() == topic_id
            builder = BatchBuilder()
            builder.append(b"old incarnation", timestamp_ms=1)
            plog.append(builder.build())
            assert plog.log_end_offset == 1

            # No id file (a log made before ids): adopted, kept.
            id_file.unlink()
            node_b._verified.clear()
            node_b._dirty.set()
            await node_b.wait_reconciled(id_file.exists, WAIT_S)
            assert b.broker.logs.logs["t", 0] is plog
            assert id_file.read_text() == topic_id

            # Another incarnation's id: deleted, made again empty, with the right id.
            id_file.write_text("0" * 32)
            node_b._verified.clear()
            node_b._dirty.set()

            def remade() -> bool:
                new = b.broker.logs.logs.get(("t", 0))
                return new is not None and new is not plog and ("t", 0) in node_b._applied

            await node_b.wait_reconciled(remade, WAIT_S)
            new = b.broker.logs.logs["t", 0]
            assert new.log_end_offset == 0
            assert (Path(new.directory) / TOPIC_ID_FILE).read_text() == topic_id

    asyncio.run(main())


def test_leadership_moves_when_a_node_goes_and_isr_changes_are_fenced(
    tmp_path: Path, etcd: EtcdServer
) -> None:
    async def main() -> None:
        async with cluster(tmp_path, etcd, 3) as members:
            a, b, c = members
            assert a.node is not None
            assert b.node is not None
            assert c.node is not None
            await a.node.create_topic("t", 1, a.broker.config.log)
            state, _ = a.node.cache.partition("t", 0)  # type: ignore[misc]
            leader = members[state.leader - 1]
            others = [m for m in members if m is not leader]
            assert leader.node is not None
            # The leader shrinks its ISR; a stale epoch and a non-leader are refused.
            follower = others[0].id
            assert not await others[0].node.propose_isr("t", 0, 0, (follower,))  # type: ignore[union-attr]
            assert not await leader.node.propose_isr("t", 0, 1, (leader.id,))
            assert await leader.node.propose_isr("t", 0, 0, (leader.id, follower))
            cache = others[0].node.cache  # type: ignore[union-attr]

            def now() -> PartitionState:
                got = cache.partition("t", 0)
                assert got is not None
                return got[0]

            await cache.wait_for(lambda: len(now().isr) == 2, WAIT_S)
            # The leader's node goes: the in-sync follower leads at epoch 1 and is told so;
            # the third follows it.
            await leader.close()
            await cache.wait_for(lambda: now().leader == follower, WAIT_S)
            assert now().leader_epoch == 1
            assert now().isr == (follower,)
            new = members[follower - 1]
            assert new.node is not None
            await new.node.wait_reconciled(
                lambda: new.replicas.roles.get(("t", 0)) == ("leader", 1), WAIT_S
            )
            third = others[1]
            assert third.node is not None
            await third.node.wait_reconciled(
                lambda: (third.replicas.roles.get(("t", 0)) or ("", -1))[1] == 1, WAIT_S
            )
            assert third.replicas.roles["t", 0] == (
                "follower",
                1,
                follower,
                ("127.0.0.1", new.server.port),
            )

    asyncio.run(main())


def test_a_node_id_is_taken_by_one_live_node(tmp_path: Path, etcd: EtcdServer) -> None:
    async def main() -> None:
        async with cluster(tmp_path, etcd, 1) as (a,):
            twin = Member(tmp_path / "twin", etcd, 1)
            async with AsyncExitStack() as stack:
                with pytest.raises(EtcdError, match="node id 1 is registered already"):
                    await twin.start(stack)
            assert cluster_node(twin.broker) is None
            assert a.node is not None
            assert cluster_node(a.broker) is a.node

    asyncio.run(main())


def test_a_node_that_loses_its_lease_stops_leading_and_registers_again(
    tmp_path: Path, etcd: EtcdServer
) -> None:
    async def main() -> None:
        async with cluster(tmp_path, etcd, 1) as (a,):
            node = a.node
            assert node is not None
            await node.create_topic("t", 1, a.broker.config.log)
            assert a.replicas.roles["t", 0] == ("leader", 0)
            old = node.lease.id
            await node.etcd.revoke(old)  # as etcd does when the lease runs out
            await node.wait_reconciled(lambda: node.lease.id != old, WAIT_S)
            assert ("stop", "t", 0) in a.replicas.calls
            await node.cache.wait_for(lambda: 1 in node.cache.nodes, WAIT_S)
            # Registered again, and (alone, so in sync) leading again.
            await node.wait_reconciled(lambda: a.replicas.roles.get(("t", 0)) is not None, WAIT_S)
            assert a.replicas.roles["t", 0][0] == "leader"

    asyncio.run(main())


def test_cluster_status_of_a_single_node_says_so(tmp_path: Path) -> None:
    async def main() -> None:
        broker = Broker(BrokerConfig(data_dir=str(tmp_path / "d")))
        async with broker, TcpServer(broker, ServerConfig(host="127.0.0.1", port=0)) as s:
            addr = f"127.0.0.1:{s.port}"
            out = await asyncio.to_thread(run_cli, ["cluster", "status", "--addr", addr])
            assert out.exit_code == 1
            assert "is a single node (started without --cluster)" in out.output

    asyncio.run(main())


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--node-id", "1"], "--node-id and --advertise go with --cluster"),
        (["--cluster", "etcd://127.0.0.1:2379"], "--cluster needs --node-id"),
        (["--cluster", "http://127.0.0.1:2379", "--node-id", "1"], "expected etcd://HOST:PORT"),
        (
            ["--cluster", "etcd://127.0.0.1:2379", "--node-id", "1", "--advertise", "nope"],
            "--advertise 'nope': expected HOST:PORT",
        ),
    ],
)
def test_serve_refuses_bad_cluster_flags(tmp_path: Path, args: list[str], message: str) -> None:
    out = run_cli(["serve", "--data-dir", str(tmp_path), "--port", "0", *args])
    assert out.exit_code == 2, out.output
    assert message in out.output


def test_serve_without_etcd_says_so(tmp_path: Path) -> None:
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = run_cli(
        [
            *("serve", "--data-dir", str(tmp_path), "--port", "0"),
            *("--cluster", f"etcd://127.0.0.1:{port}", "--node-id", "1"),
        ]
    )
    assert out.exit_code == 1, out.output
    assert "no etcd endpoint answered" in out.output


def test_a_node_restarted_after_a_crash_waits_for_its_old_lease(
    tmp_path: Path, etcd: EtcdServer
) -> None:
    async def main() -> None:
        # The crashed process's registration: on a lease nobody renews any more.
        async with EtcdClient([etcd.endpoint]) as c:
            lease = await c.grant(2)
            await MetadataStore(c, "t").register(NodeInfo(1, "127.0.0.1", 1), lease)
        async with cluster(tmp_path, etcd, 1) as (a,):
            assert a.node is not None
            assert a.node.cache.nodes[1].port == a.server.port

    asyncio.run(main())
