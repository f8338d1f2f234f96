"""Partition reassignment and topic changes in a cluster (:mod:`tidewire.cluster.reassign`).

The rules (:func:`step`, :func:`plan_replication`) alone, then three in-process nodes
(broker, TCP server, :class:`ClusterNode` with its real replica manager, as in
test_groups.py) against the real etcd of the ``etcd`` fixture: replication factor 1 -> 3 and
3 -> 2 and a move away from the leader under an idempotent acks=all producer lose nothing and
remove the old replica's log; ``topic alter`` adds partitions that clients then use and
changes settings on every replica. Every wait is bounded; nothing asserts on durations.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from contextlib import AbstractAsyncContextManager
from pathlib import Path

import pytest

from tests.cli._support import Result, run_cli
from tests.cluster._etcd import EtcdServer
from tests.cluster._inprocess import WAIT_S, InProcessNode, in_process_cluster, until
from tests.cluster.test_node import call
from tests.cluster.test_node import cluster as recorded_cluster
from tidewire.broker import Broker, BrokerConfig
from tidewire.broker.offsets import OFFSETS_TOPIC, partition_for
from tidewire.client import AsyncClient, AsyncConsumer, AsyncGroupConsumer, AsyncProducer, Message
from tidewire.cluster.metadata import NO_LEADER, PartitionState
from tidewire.cluster.reassign import internal_refusal, plan_replication, revert, step
from tidewire.errors import InvalidConfigError, InvalidRequestError, TidewireError
from tidewire.protocol.messages import (
    AlterReplicationRequest,
    AlterReplicationResponse,
    CreateTopicRequest,
    PartitionReplicas,
    TopicConfig,
)
from tidewire.server import TcpServer
from tidewire.server.tcp import ServerConfig

TOPIC = "moves"
#: Longer than test_groups' nodes: on a loaded 2-core box a 3 s lease has expired under a
#: test, which the controller (rightly) treats as the node gone — not what is tested here.
SESSION_S = 10


class Node(InProcessNode):
    """An in-process node with a longer session."""

    def __init__(self, tmp: Path, etcd: EtcdServer, node_id: int) -> None:
        super().__init__(tmp, etcd, node_id, cluster_id="moves", session_s=SESSION_S)


def cluster(tmp: Path, etcd: EtcdServer, n: int = 3) -> AbstractAsyncContextManager[list[Node]]:
    return in_process_cluster(lambda i: Node(tmp, etcd, i), n)


# --- the rules -----------------------------------------------------------------------------


def test_a_move_adds_the_new_replicas_first_then_switches_once_they_are_in_sync() -> None:
    s = PartitionState((1,), 1, 4, (1,))
    grown = step(s, (2, 3))
    assert grown == (PartitionState((2, 3, 1), 1, 4, (1,)), False)
    # Not in sync yet: nothing to do.
    assert step(grown[0], (2, 3)) is None
    assert step(PartitionState((2, 3, 1), 1, 4, (1, 2)), (2, 3)) is None
    # In sync: the target replicas, led by the first of them in the next epoch.
    done = step(PartitionState((2, 3, 1), 1, 4, (1, 3, 2)), (2, 3))
    assert done == (PartitionState((2, 3), 2, 5, (2, 3)), True)
    # The leader stays when it is in the target: same epoch.
    kept = step(PartitionState((1, 2, 3), 1, 4, (1, 2, 3)), (1, 2))
    assert kept == (PartitionState((1, 2), 1, 4, (1, 2)), True)
    # No leader: the move waits.
    assert step(PartitionState((1, 2), NO_LEADER, 4, (1, 2)), (1,)) is None


def test_a_replication_factor_is_planned_on_the_least_loaded_nodes() -> None:
    states = {
        0: PartitionState((1,), 1, 0, (1,)),
        1: PartitionState((2,), 2, 0, (2,)),
        2: PartitionState((1, 2, 3), 3, 0, (3, 1)),
    }
    plan = plan_replication(states, 2, [1, 2, 3])
    # Node 3 holds the fewest replicas: it is added first, then (tied) the lower id; 3 -> 2
    # keeps the leader, then the ISR.
    assert plan == {0: (1, 3), 1: (2, 1), 2: (3, 1)}
    assert plan_replication(states, 1, [1, 2, 3]) == {2: (3,)}
    with pytest.raises(InvalidRequestError):
        plan_replication(states, 4, [1, 2, 3])


# --- with nodes ----------------------------------------------------------------------------


def _settled(nodes: list[Node], rf: int) -> bool:
    """Every node's copy: no move under way, each partition on ``rf`` replicas all in sync,
    and each node holding (and serving in its role) exactly the partitions it replicates."""
    for n in nodes:
        cache = n.cluster.cache
        info = cache.topics.get(TOPIC)
        if info is None or info.replication_factor != rf or cache.reassignments:
            return False
        for p in range(info.partitions):
            got = cache.partition(TOPIC, p)
            if got is None or len(got[0].replicas) != rf or set(got[0].isr) != set(got[0].replicas):
                return False
            # Each node has taken its role: a replica's log is there, no one else's.
            if (n.id in got[0].replicas) != ((TOPIC, p) in n.cluster._applied):
                return False
            if (n.id in got[0].replicas) != ((TOPIC, p) in n.broker.logs.logs):
                return False
    return True


def test_replication_factor_1_to_3_to_2_and_a_leader_moved_away_under_load(
    tmp_path: Path, etcd: EtcdServer
) -> None:
    async def main() -> None:
        async with cluster(tmp_path, etcd) as nodes:
            addrs = [n.addr for n in nodes]
            by_id = {n.id: n for n in nodes}
            async with AsyncClient(addrs) as client:
                await client.create_topic(TOPIC, 2, replication_factor=1)
            await until(lambda: _settled(nodes, 1), "the topic on 1 replica")
            sent: list[tuple[bytes, asyncio.Future]] = []  # type: ignore[type-arg]
            stop_sending = asyncio.Event()
            async with (
                AsyncProducer(
                    addrs,
                    acks="durable",
                    idempotence=True,
                    linger_ms=2,
                    delivery_timeout_ms=int(WAIT_S * 2000),
                ) as producer,
                AsyncClient(addrs) as client,
            ):

                async def load() -> None:
                    i = 0
                    while not stop_sending.is_set() and i < 20_000:
                        v = b"m%06d" % i
                        sent.append((v, await producer.send(TOPIC, v, partition=i % 2)))
                        i += 1
                        if i % 10 == 0:
                            await asyncio.sleep(0.01)

                loader = asyncio.create_task(load())
                await until(lambda: len(sent) > 50, "some messages sent")
                # 1 -> 3: new replicas copy the log, join the ISR; then the topic says 3.
                moves = await client.alter_replication(TOPIC, replication_factor=3)
                assert {len(m.target) for m in moves} == {3}
                await until(lambda: _settled(nodes, 3), "3 replicas in sync")
                # Partition 0 away from its leader: the others take it, the leader moves.
                state = nodes[0].cluster.cache.partition(TOPIC, 0)
                assert state is not None
                old = state[0].leader
                others = [i for i in state[0].replicas if i != old]
                await client.alter_replication(TOPIC, replicas={0: others})
                await until(
                    lambda: all(
                        (got := n.cluster.cache.partition(TOPIC, 0)) is not None
                        and got[0].replicas == tuple(others)
                        and (TOPIC, 0) not in n.cluster.cache.reassignments
                        for n in nodes
                    ),
                    "partition 0 moved",
                )
                # The old replica stops and its log goes.
                gone = by_id[old]
                await until(
                    lambda: (
                        (TOPIC, 0) not in gone.broker.logs.logs
                        and not Path(gone.broker.config.data_dir, f"{TOPIC}-0").exists()
                    ),
                    "the old replica's log deleted",
                )
                # 3 -> 2 for the rest (partition 1).
                await client.alter_replication(TOPIC, replication_factor=2)
                await until(lambda: _settled(nodes, 2), "2 replicas in sync")
                status = await client.alter_replication(TOPIC)
                assert all(len(m.replicas) == 2 and not m.target for m in status)
                await asyncio.sleep(0.3)
                stop_sending.set()
                await loader
                await producer.flush(WAIT_S)
                results = [(v, f.result()) for v, f in sent]  # raises if a send failed
            assert len(results) > 50
            # Exactly the replicas hold logs of the topic.
            for p in range(2):
                got = nodes[0].cluster.cache.partition(TOPIC, p)
                assert got is not None
                holders = {n.id for n in nodes if (TOPIC, p) in n.broker.logs.logs}
                assert holders == set(got[0].replicas), p
            want: dict[int, list[tuple[int, bytes]]] = {0: [], 1: []}
            for v, md in results:
                want[md.partition].append((md.offset, v))
            async with AsyncConsumer(addrs, request_timeout_ms=int(WAIT_S * 1000)) as consumer:
                await consumer.assign([(TOPIC, p, 0) for p in range(2)])
                got_records: dict[int, list[tuple[int, bytes]]] = {0: [], 1: []}
                deadline = time.monotonic() + WAIT_S
                while (
                    sum(map(len, got_records.values())) < len(results)
                    and time.monotonic() < deadline
                ):
                    for r in await consumer.poll(1.0):
                        assert r.value is not None
                        got_records[r.partition].append((r.offset, r.value))
            for p in range(2):
                # Every acknowledged message once, at the offset it was acknowledged with.
                assert got_records[p] == sorted(want[p]), f"partition {p}"

    asyncio.run(main())


def test_alter_adds_partitions_that_clients_use_and_changes_settings_everywhere(
    tmp_path: Path, etcd: EtcdServer
) -> None:
    async def main() -> None:
        async with cluster(tmp_path, etcd) as nodes:
            addrs = [n.addr for n in nodes]
            async with AsyncClient(addrs) as client:
                await client.create_topic(TOPIC, 1, replication_factor=2)
                await until(lambda: _settled(nodes, 2), "the topic on 2 replicas")
                await client.alter_topic(
                    TOPIC, partitions=3, config=TopicConfig(retention_ms=123_456)
                )
                desc = await client.describe_topic(TOPIC)
                assert len(desc.partitions) == 3
                await until(lambda: _settled(nodes, 2), "the new partitions in sync")
                # Every replica of every partition has the new setting.
                for n in nodes:
                    for (t, _), plog in n.broker.logs.logs.items():
                        if t == TOPIC:
                            assert plog.config.retention_ms == 123_456
                # Fewer partitions: refused.
                with pytest.raises(Exception, match="gain partitions"):
                    await client.alter_topic(TOPIC, partitions=2)
                # The cluster settings.
                await client.alter_replication(
                    TOPIC, min_insync_replicas=2, unclean_leader_election=True
                )
                desc = await client.describe_topic(TOPIC)
                assert desc.min_insync_replicas == 2
                assert desc.unclean_leader_election
                with pytest.raises(InvalidConfigError):
                    await client.alter_replication(TOPIC, min_insync_replicas=3)
                # The leaders apply the new min_insync_replicas.
                rep = nodes[0].broker.replication

                def applied() -> bool:
                    for n in nodes:
                        led = getattr(n.broker.replication, "_led", {})
                        for (t, _), entry in led.items():
                            if t == TOPIC and entry.state.min_insync != 2:
                                return False
                    return True

                assert rep is not None
                await until(applied, "min_insync_replicas=2 at every leader")
            # Clients use the new partitions.
            async with AsyncProducer(addrs, acks="durable", linger_ms=0) as producer:
                md = await (await producer.send(TOPIC, b"new", partition=2))
                assert md.partition == 2
            async with AsyncConsumer(addrs, request_timeout_ms=int(WAIT_S * 1000)) as consumer:
                await consumer.assign([(TOPIC, 2, 0)])
                seen: list[bytes | None] = []
                deadline = time.monotonic() + WAIT_S
                while not seen and time.monotonic() < deadline:
                    seen += [r.value for r in await consumer.poll(1.0)]
            assert seen == [b"new"]

    asyncio.run(main())


def test_a_move_waits_for_its_new_replicas_to_be_in_sync_and_one_at_a_time(
    tmp_path: Path, etcd: EtcdServer
) -> None:
    """With replica managers that only record their roles, no follower ever joins the ISR:
    the move stays in its first step (replica set grown, new replicas following)."""

    async def main() -> None:
        async with recorded_cluster(tmp_path, etcd, 3) as members:
            a = members[0]
            reply = await call(
                a.addr, CreateTopicRequest(name=TOPIC, partitions=1, replication_factor=1)
            )
            assert reply.error_code == 0, reply  # type: ignore[attr-defined]
            assert a.node is not None
            got = a.node.cache.partition(TOPIC, 0)
            assert got is not None
            (old,) = got[0].replicas
            new = [m.id for m in members if m.id != old]
            body = await call(
                a.addr,
                AlterReplicationRequest(
                    topic=TOPIC, assignments=[PartitionReplicas(partition=0, replicas=new)]
                ),
            )
            assert isinstance(body, AlterReplicationResponse), body
            assert body.error_code == 0, body
            assert body.partitions[0].target == new
            for m in members:
                assert m.node is not None
                await m.node.wait_reconciled(
                    lambda m=m: all(
                        m.replicas.roles.get((TOPIC, 0), ("",))[0] == "follower"
                        for m in members
                        if m.id in new
                    ),
                    WAIT_S,
                )
            state = a.node.cache.partition(TOPIC, 0)
            assert state is not None
            assert state[0].replicas == (*new, old)
            assert state[0].isr == (old,)
            assert state[0].leader == old
            # One move at a time.
            again = await call(
                a.addr,
                AlterReplicationRequest(
                    topic=TOPIC, assignments=[PartitionReplicas(partition=0, replicas=[old])]
                ),
            )
            assert again.error_code == InvalidRequestError.code, again  # type: ignore[attr-defined]
            assert "being moved" in again.error_message  # type: ignore[attr-defined]
            # Bad targets: unknown nodes, repeats, an unknown partition.
            for p, bad, why in (
                (0, [99], "not live nodes"),
                (0, [new[0], new[0]], "repeat"),
                (5, [new[0]], "no partition 5"),
            ):
                r = await call(
                    a.addr,
                    AlterReplicationRequest(
                        topic=TOPIC, assignments=[PartitionReplicas(partition=p, replicas=bad)]
                    ),
                )
                assert r.error_code == InvalidRequestError.code, r  # type: ignore[attr-defined]
                assert why in r.error_message  # type: ignore[attr-defined]
            status = await call(a.addr, AlterReplicationRequest(topic=TOPIC))
            assert status.partitions[0].target == new  # type: ignore[attr-defined]

    asyncio.run(main())


def test_a_single_node_refuses_to_alter_replication(tmp_path: Path) -> None:
    async def main() -> None:
        broker = Broker(BrokerConfig(data_dir=str(tmp_path)))
        server = TcpServer(broker, ServerConfig(host="127.0.0.1", port=0))
        async with broker:
            await server.start()
            try:
                async with AsyncClient(f"127.0.0.1:{server.port}") as client:
                    await client.create_topic(TOPIC, 1)
                    with pytest.raises(InvalidRequestError, match="not a cluster node"):
                        await client.alter_replication(TOPIC, replication_factor=2)
            finally:
                await server.close()

    asyncio.run(main())


def test_the_cli_reassigns_shows_the_status_and_alters(tmp_path: Path, etcd: EtcdServer) -> None:
    async def main() -> None:
        async with cluster(tmp_path, etcd) as nodes:
            addr = ",".join(n.addr for n in nodes)
            async with AsyncClient(addr) as client:
                await client.create_topic(TOPIC, 1, replication_factor=1)
            await until(lambda: _settled(nodes, 1), "the topic on 1 replica")
            got = nodes[0].cluster.cache.partition(TOPIC, 0)
            assert got is not None
            old = got[0].leader
            new = next(n.id for n in nodes if n.id != old)

            def cli(*args: str) -> Result:
                return run_cli(["topic", *args, "--addr", addr])

            r = await asyncio.to_thread(
                cli, "reassign", TOPIC, "--partition", "0", "--replicas", str(new), "--wait"
            )
            assert r.exit_code == 0, r.output
            r = await asyncio.to_thread(cli, "reassign", TOPIC, "--status", "--json")
            assert r.exit_code == 0, r.output
            doc = json.loads(r.stdout)
            assert doc["in_progress"] == 0
            assert doc["partitions"][0]["replicas"] == [new]
            assert doc["partitions"][0]["leader"] == new
            r = await asyncio.to_thread(
                cli, "reassign", TOPIC, "--replication-factor", "2", "--wait", "--json"
            )
            assert r.exit_code == 0, r.output
            assert len(json.loads(r.stdout)["partitions"][0]["replicas"]) == 2
            # Usage errors: exit 2, nothing changed.
            for bad in (
                ["--partition", "0"],
                ["--partition", "0", "--replicas", "1", "--replication-factor", "2"],
                [],
            ):
                r = await asyncio.to_thread(cli, "reassign", TOPIC, *bad)
                assert r.exit_code == 2, (bad, r.output)
            r = await asyncio.to_thread(
                cli, "alter", TOPIC, "--min-insync-replicas", "2", "--unclean-leader-election"
            )
            assert r.exit_code == 0, r.output
            async with AsyncClient(addr) as client:
                desc = await client.describe_topic(TOPIC)
            assert desc.min_insync_replicas == 2
            assert desc.unclean_leader_election
            assert desc.replication_factor == 2

    asyncio.run(main())


def test_a_move_under_way_is_cancelled_back_to_its_original_replicas(
    tmp_path: Path, etcd: EtcdServer
) -> None:
    """KIP-455's cancel: with replica managers that only record their roles, a move stays in
    its first step (replica set grown); cancelling it (the protocol, then the CLI) puts the
    partition back on its original replicas, the ones being added stop, and no move is
    left. A partition that is not being moved is refused."""

    async def main() -> None:
        async with recorded_cluster(tmp_path, etcd, 3) as members:
            a = members[0]
            assert a.node is not None
            addr = ",".join(m.addr for m in members)
            reply = await call(
                a.addr, CreateTopicRequest(name=TOPIC, partitions=2, replication_factor=1)
            )
            assert reply.error_code == 0, reply  # type: ignore[attr-defined]
            olds = {}
            for p in range(2):
                got = a.node.cache.partition(TOPIC, p)
                assert got is not None
                olds[p] = got[0].replicas
            for p in range(2):
                new = [m.id for m in members if m.id not in olds[p]]
                body = await call(
                    a.addr,
                    AlterReplicationRequest(
                        topic=TOPIC, assignments=[PartitionReplicas(partition=p, replicas=new)]
                    ),
                )
                assert body.error_code == 0, body  # type: ignore[attr-defined]

            def grown(p: int) -> bool:
                assert a.node is not None
                got = a.node.cache.partition(TOPIC, p)
                return got is not None and len(got[0].replicas) == 3

            await until(lambda: grown(0) and grown(1), "both moves in their first step")
            status = await call(a.addr, AlterReplicationRequest(topic=TOPIC))
            assert [list(p.original) for p in status.partitions] == [  # type: ignore[attr-defined]
                list(olds[0]),
                list(olds[1]),
            ]
            # Cancel partition 0 through the protocol: back to its one replica.
            body = await call(
                a.addr, AlterReplicationRequest(topic=TOPIC, cancel=True, partitions=[0])
            )
            assert isinstance(body, AlterReplicationResponse), body
            assert body.error_code == 0, body
            p0, p1 = body.partitions
            assert (tuple(p0.replicas), p0.target, tuple(p0.isr)) == (olds[0], [], olds[0])
            assert p0.leader == olds[0][0]
            assert p1.target  # still moving
            # Again: nothing to cancel there.
            again = await call(
                a.addr, AlterReplicationRequest(topic=TOPIC, cancel=True, partitions=[0])
            )
            assert again.error_code == InvalidRequestError.code, again  # type: ignore[attr-defined]
            assert "not being moved" in again.error_message  # type: ignore[attr-defined]
            # A cancel with a move at once is refused.
            both = await call(
                a.addr,
                AlterReplicationRequest(
                    topic=TOPIC,
                    cancel=True,
                    assignments=[PartitionReplicas(partition=0, replicas=[1])],
                ),
            )
            assert both.error_code == InvalidRequestError.code, both  # type: ignore[attr-defined]
            # The CLI cancels the rest.
            r = await asyncio.to_thread(
                run_cli, ["topic", "reassign", TOPIC, "--cancel", "--json", "--addr", addr]
            )
            assert r.exit_code == 0, r.output
            doc = json.loads(r.stdout)
            assert doc["in_progress"] == 0
            assert [tuple(p["replicas"]) for p in doc["partitions"]] == [olds[0], olds[1]]
            # Every node sees it; the replicas that were being added stopped.
            for m in members:
                assert m.node is not None
                await m.node.wait_reconciled(
                    lambda m=m: (
                        all(((TOPIC, p) in m.replicas.roles) == (m.id in olds[p]) for p in range(2))
                        and not any(k[0] == TOPIC for k in m.node.cache.reassignments)
                    ),  # type: ignore[union-attr]
                    WAIT_S,
                )

    asyncio.run(main())


def test_revert_goes_back_to_the_original_replicas_keeping_what_is_in_sync() -> None:
    moving = PartitionState((3, 1, 2), 1, 4, (1, 3))  # 1,2 -> 3,1 grown: 3 in sync already
    assert revert(moving, (1, 2)) == PartitionState((1, 2), 1, 4, (1,))
    # The leader was one of the new replicas (a failover during the move): the first
    # in-sync original replica leads, at the next epoch.
    led_by_new = PartitionState((3, 1, 2), 3, 5, (3, 2))
    assert revert(led_by_new, (1, 2)) == PartitionState((1, 2), 2, 6, (2,))
    # None of the originals in sync: going back would lose records.
    assert revert(PartitionState((3, 1), 3, 5, (3,)), (1,)) is None
    # Not known (an entry written before cancels): the replicas as they are.
    assert revert(moving, ()) == PartitionState((3, 1, 2), 1, 4, (3, 1))
    # Offline: stays offline, on the original replicas.
    assert revert(PartitionState((3, 1), NO_LEADER, 2, (1,)), (1,)) == PartitionState(
        (1,), NO_LEADER, 2, (1,)
    )


GROUP = "moving-coordinator"


def test_a_group_s_offsets_partition_moved_away_from_its_coordinator_keeps_its_commits(
    tmp_path: Path, etcd: EtcdServer
) -> None:
    """``__consumer_offsets`` may be moved on request: its partition of a group moved off the
    coordinator's node, the coordinator moves with the lead, the commit made before the
    move is there on the new coordinator, the member carries on (rejoining at most) and
    commits again there; the old node's replica is deleted."""

    async def main() -> None:
        async with cluster(tmp_path, etcd) as nodes:
            addrs = [n.addr for n in nodes]
            by_id = {n.id: n for n in nodes}
            p = partition_for(GROUP)
            async with AsyncClient(addrs) as client:
                await client.create_topic(TOPIC, 1, replication_factor=3)
                await client.produce(TOPIC, 0, [Message(value=b"m%d" % i) for i in range(20)])
                consumer = AsyncGroupConsumer(
                    addrs,
                    GROUP,
                    topics=[TOPIC],
                    enable_auto_commit=False,
                    auto_offset_reset="earliest",
                    session_timeout_ms=10_000,
                    heartbeat_interval_ms=300,
                )
                got: list[bytes] = []

                async def read_until(n: int) -> None:
                    for _ in range(300):  # bounded: each poll waits at most 0.1 s
                        if len(got) >= n:
                            return
                        try:
                            got.extend(r.value or b"" for r in await consumer.poll(0.1))
                        except TidewireError:  # the coordinator moved: found again
                            await asyncio.sleep(0.2)
                    raise AssertionError(f"read {len(got)} of {n}")

                async def commit() -> None:
                    for _ in range(60):  # a member fenced by the move rejoins and commits
                        try:
                            await consumer.commit()
                            return
                        except TidewireError:
                            with contextlib.suppress(TidewireError):
                                await consumer.poll(0.2)
                            await asyncio.sleep(0.3)
                    raise AssertionError("the member could not commit")

                async with consumer:
                    await read_until(20)
                    await commit()
                    assert await client.committed_offsets(GROUP) == {(TOPIC, 0): 20}
                    state = nodes[0].cluster.cache.partition(OFFSETS_TOPIC, p)
                    assert state is not None
                    old = state[0].leader
                    assert by_id[old].broker.groups.offsets.serves(GROUP)
                    others = [i for i in state[0].replicas if i != old]
                    await client.alter_replication(OFFSETS_TOPIC, replicas={p: others})
                    await until(
                        lambda: all(
                            (s := n.cluster.cache.partition(OFFSETS_TOPIC, p)) is not None
                            and s[0].replicas == tuple(others)
                            and (OFFSETS_TOPIC, p) not in n.cluster.cache.reassignments
                            for n in nodes
                        ),
                        "the group's offsets partition moved",
                    )
                    await until(
                        lambda: any(by_id[i].broker.groups.offsets.serves(GROUP) for i in others),
                        "a node of the new replicas coordinates the group",
                    )
                    gone = by_id[old]
                    assert not gone.broker.groups.offsets.serves(GROUP)
                    await until(
                        lambda: (OFFSETS_TOPIC, p) not in gone.broker.logs.logs,
                        "the old replica's log deleted",
                    )
                    # The commit made before the move is the new coordinator's.
                    assert await client.committed_offsets(GROUP) == {(TOPIC, 0): 20}
                    await client.produce(
                        TOPIC, 0, [Message(value=b"m%d" % i) for i in range(20, 40)]
                    )
                    await read_until(40)
                    await commit()
                    assert await client.committed_offsets(GROUP) == {(TOPIC, 0): 40}
                assert set(got) == {b"m%d" % i for i in range(40)}

    async def bounded() -> None:
        async with asyncio.timeout(120):  # a failure rather than a hang
            await main()

    asyncio.run(bounded())


def test_internal_topics_other_than_the_offsets_are_refused_with_their_reason() -> None:
    assert internal_refusal(TOPIC) is None
    assert internal_refusal(OFFSETS_TOPIC) is None
    for name, why in (
        ("__security", "its leader keeps it on every live node"),
        ("__queue_definitions", "its leader keeps it on every live node"),
        ("__audit.2", "audit log is placed by its leader"),
        ("__queue.orders", "two partitions must stay on the same replicas"),
        ("__streams", "in-memory messages"),
    ):
        refused = internal_refusal(name)
        assert refused is not None, name
        assert why in refused, name
