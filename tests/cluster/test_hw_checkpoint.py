"""The high-watermark checkpoint (cluster/hw_checkpoint.py): a node serves a partition that
has no role yet only below the high watermark it knew last, never up to its log end; a leader
elected before any follower fetched starts from it; a single node keeps and reads none.

The in-process test restarts a follower whose log has records above its high watermark and
holds its start in registration (its node id kept by another lease), where it has no role:
there it must not serve them. Every wait is bounded; nothing asserts on time."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path

import pytest

from tests.cli._support import popen_serve, stop
from tests.cluster._etcd import EtcdServer
from tests.cluster._inprocess import WAIT_S, InProcessNode, in_process_cluster, until
from tests.cluster._workload import free_port
from tidewire.broker import Broker, BrokerConfig
from tidewire.client._transport import Transport
from tidewire.cluster import replication
from tidewire.cluster.etcd import EtcdClient
from tidewire.cluster.hw_checkpoint import (
    HW_CHECKPOINT_FILE,
    read_hw_checkpoint,
    write_hw_checkpoint,
)
from tidewire.cluster.metadata import MetadataStore, NodeInfo
from tidewire.cluster.replication import ReplicaManager
from tidewire.errors import NotLeaderError, TidewireError
from tidewire.protocol.messages import (
    ACKS_LEADER,
    FetchPartition,
    FetchRequest,
    FetchResponse,
    ListOffsetsPartition,
    ListOffsetsRequest,
    ListOffsetsResponse,
    ProducePartition,
    ProduceRequest,
    ProduceResponse,
)
from tidewire.records import BatchBuilder
from tidewire.storage.fs import OsFileSystem

T = "hw"


def batch(value: bytes) -> bytes:
    b = BatchBuilder()
    b.append(value, timestamp_ms=1_700_000_000_000)
    return b.build()


def checkpoint_of(data_dir: str) -> dict[tuple[str, int], int]:
    return read_hw_checkpoint(OsFileSystem(), data_dir)


def test_checkpoint_file_round_trip_and_unreadable_ones_are_ignored(tmp_path: Path) -> None:
    fs = OsFileSystem()
    marks = {("a-b", 0): 5, ("orders", 12): 0, ("x.y", 3): 1_000_000}
    write_hw_checkpoint(fs, str(tmp_path), marks)
    assert read_hw_checkpoint(fs, str(tmp_path)) == marks
    doc = json.loads((tmp_path / HW_CHECKPOINT_FILE).read_text())
    assert doc == {"version": 1, "high_watermarks": {"a-b-0": 5, "orders-12": 0, "x.y-3": 1000000}}
    for bad in ("{", '{"version": 2, "high_watermarks": {}}', '{"version": 1}', "[]"):
        (tmp_path / HW_CHECKPOINT_FILE).write_text(bad)
        assert read_hw_checkpoint(fs, str(tmp_path)) == {}
    (tmp_path / HW_CHECKPOINT_FILE).write_text('{"version": 1, "high_watermarks": {"t-0": -1}}')
    assert read_hw_checkpoint(fs, str(tmp_path)) == {}
    assert read_hw_checkpoint(fs, str(tmp_path / "none")) == {}


@asynccontextmanager
async def single_broker(data: str) -> AsyncIterator[Broker]:
    """A started broker on ``data`` (no topics made on use), closed on the way out."""
    broker = Broker(BrokerConfig(data_dir=data, auto_create_topics=False))
    await broker.start()
    try:
        yield broker
    finally:
        await broker.close()


@asynccontextmanager
async def checkpointing(broker: Broker) -> AsyncIterator[ReplicaManager]:
    """``broker`` replicated as node 1 by a manager that keeps the checkpoint; the manager
    closed (which writes it) and taken off the broker on the way out."""
    manager = ReplicaManager(broker, 1)
    broker.replication = manager
    manager.start_checkpoints()
    try:
        yield manager
    finally:
        await manager.close()
        broker.replication = None


def test_a_manager_serves_below_the_checkpoint_until_its_role_and_a_leader_starts_from_it(
    tmp_path: Path,
) -> None:
    data = str(tmp_path / "node")

    async def main() -> None:
        async with single_broker(data) as broker:
            broker.create_topic(T, partitions=2)
            broker.create_topic("other", partitions=1)
            for i in range(6):
                await broker.produce(T, 0, batch(b"%d" % i))
                await broker.produce(T, 1, batch(b"%d" % i))
                await broker.produce("other", 0, batch(b"%d" % i))
            # A single node reads up to its end, checkpoint or none.
            write_hw_checkpoint(broker.logs.fs, data, {(T, 0): 2, (T, 1): 4, ("gone", 0): 9})
            assert broker.high_watermark(T, 0) == 6

            async with checkpointing(broker) as manager:
                # No role yet: below the marks; a partition the checkpoint does not name is
                # not replicated here (the node's own internal topics): up to its end, as
                # before.
                assert broker.high_watermark(T, 0) == 2
                assert broker.high_watermark(T, 1) == 4
                assert broker.high_watermark("other", 0) == 6
                (r,) = await broker.fetch([(T, 0, 0, 1 << 20)])
                assert (r.next_offset, r.high_watermark) == (2, 2)
                assert broker.list_offset(T, 1, -1) == 4

                # Elected before any follower fetched: the leader starts from the mark (not
                # from its log start), and the mark moves on only as the ISR gets the records.
                await manager.become_leader(T, 0, epoch=1, replicas=(1, 2), isr=(1, 2))
                assert manager.led_states()[T, 0].high_watermark == 2
                assert broker.high_watermark(T, 0) == 2
                await manager.become_leader(T, 1, epoch=1, replicas=(1, 2), isr=(1, 2))
                state = manager.led_states()[T, 1]
                assert state.high_watermark == 4
                state.fetched(2, 5)  # the follower holds one record more: the mark moves on
                assert broker.high_watermark(T, 1) == 5

            # Written at close: the marks as they stand, the partition gone from here left out.
            assert checkpoint_of(data) == {(T, 0): 2, (T, 1): 5}

    asyncio.run(main())


def test_the_checkpoint_is_written_periodically_while_marks_move(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(replication, "CHECKPOINT_INTERVAL_S", 0.05)
    data = str(tmp_path / "node")

    async def main() -> None:
        async with single_broker(data) as broker:
            broker.create_topic(T, partitions=1)
            async with checkpointing(broker) as manager:
                await manager.become_leader(T, 0, epoch=1, replicas=(1,), isr=(1,))
                for i in range(3):
                    await broker.produce(T, 0, batch(b"%d" % i))  # acks=all, alone in its ISR
                await until(lambda: checkpoint_of(data).get((T, 0)) == 3, "the mark written")

    asyncio.run(main())


def test_a_partition_given_a_role_is_named_in_the_checkpoint_at_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Not at the next interval: a crash right after a new replica's first appends must not
    leave it unbounded at the next start."""
    monkeypatch.setattr(replication, "CHECKPOINT_INTERVAL_S", 3600.0)
    data = str(tmp_path / "node")

    async def main() -> None:
        async with single_broker(data) as broker:
            broker.create_topic(T, partitions=2)
            async with checkpointing(broker) as manager:
                await manager.become_leader(T, 0, epoch=1, replicas=(1, 2), isr=(1, 2))
                await manager.become_follower(
                    T, 1, epoch=1, leader=2, leader_address=("127.0.0.1", 1)
                )
                await until(lambda: checkpoint_of(data) == {(T, 0): 0, (T, 1): 0}, "both named")

    asyncio.run(main())


def test_a_mark_of_an_earlier_log_of_the_partition_is_not_used(tmp_path: Path) -> None:
    """A log deleted and made again (another incarnation of the topic) is not bounded by the
    mark the checkpoint had for the earlier one."""
    data = str(tmp_path / "node")

    async def main() -> None:
        async with single_broker(data) as broker:
            broker.create_topic(T, partitions=1)
            for i in range(4):
                await broker.produce(T, 0, batch(b"%d" % i))
            write_hw_checkpoint(broker.logs.fs, data, {(T, 0): 1})
            async with checkpointing(broker) as manager:
                assert broker.high_watermark(T, 0) == 1
                await broker.delete_topic_async(T)
                broker.replication = None
                broker.create_topic(T, partitions=1)
                for i in range(3):
                    await broker.produce(T, 0, batch(b"%d" % i))
                broker.replication = manager
                assert broker.high_watermark(T, 0) == 3
                await manager.become_leader(T, 0, epoch=1, replicas=(1, 2), isr=(1, 2))
                assert manager.led_states()[T, 0].high_watermark == 0  # the new log's start

    asyncio.run(main())


class Node(InProcessNode):
    def __init__(self, tmp: Path, etcd: EtcdServer, node_id: int, session_s: int = 3) -> None:
        super().__init__(tmp, etcd, node_id, cluster_id="hwcp", session_s=session_s)


def test_a_restarted_replica_does_not_serve_records_above_its_checkpoint_before_its_role(
    tmp_path: Path, etcd: EtcdServer
) -> None:
    async def main() -> None:
        async with (
            in_process_cluster(lambda i: Node(tmp_path, etcd, i)) as nodes,
            AsyncExitStack() as stack,
        ):
            first = nodes[0].cluster
            await first.create_topic(T, 1, nodes[0].broker.config.log, replication_factor=3)
            await until(
                lambda: (
                    sum(n.broker.replication.leads(T, 0) for n in nodes) == 1  # type: ignore[union-attr]
                    and all(n.broker.replication.leader_epoch(T, 0) >= 0 for n in nodes)
                ),  # type: ignore[union-attr]
                "a leader and two followers",
            )
            leader = next(n for n in nodes if n.broker.replication.leads(T, 0))  # type: ignore[union-attr]
            follower = next(n for n in nodes if n is not leader)
            for i in range(10):
                await leader.broker.produce(T, 0, batch(b"committed %d" % i))  # acks=all
            await until(lambda: follower.broker.high_watermark(T, 0) == 10, "the follower's hw")

            # Stopped cleanly: the checkpoint holds what it knew last.
            await follower.stop()
            assert checkpoint_of(follower.data)[T, 0] == 10
            # Records above the high watermark (as a leader cut off from its peers appends
            # them): here by a single-node broker on its data directory, which reads up to
            # its log end and keeps no checkpoint.
            async with single_broker(follower.data) as alone:
                for i in range(5):
                    await alone.produce(T, 0, batch(b"never committed %d" % i))
                assert alone.high_watermark(T, 0) == 15
            assert checkpoint_of(follower.data)[T, 0] == 10

            # Its node id held by another lease: the restart waits in its registration, with
            # no role for the partition, its listener open.
            async with EtcdClient([etcd.endpoint]) as c:
                hold = await c.grant(60)
                await MetadataStore(c, "hwcp").register(NodeInfo(follower.id, "127.0.0.1", 1), hold)
                again = Node(tmp_path, etcd, follower.id, session_s=20)
                stack.push_async_callback(again.stop)
                start = asyncio.create_task(again.start())
                try:
                    await until(
                        lambda: again.node is not None and again.broker.replication is not None,
                        "the restarted node's replica manager",
                    )
                    assert not start.done()  # still waiting to register: no role
                    rep = again.broker.replication
                    assert rep is not None
                    assert rep.leader_epoch(T, 0) == -1
                    plog = again.broker.log(T, 0)
                    assert plog.log_end_offset == 15
                    assert again.broker.high_watermark(T, 0) == 10
                    assert again.broker.list_offset(T, 0, -1) == 10
                    assert again.broker.describe(T)[0].high_watermark == 10
                    (r,) = await again.broker.fetch([(T, 0, 0, 1 << 20)])
                    assert (r.next_offset, r.high_watermark) == (10, 10)
                    (r,) = await again.broker.fetch([(T, 0, 10, 1 << 20)])
                    assert r.data == b""
                finally:
                    await c.revoke(hold)
                await asyncio.wait_for(start, WAIT_S)

            # Registered, it follows: the records above the mark are cut (they diverge from
            # the leader's log) and it copies the leader's.
            await until(
                lambda: (
                    again.broker.replication.following((T, 0)) is not None  # type: ignore[union-attr]
                    and again.broker.log(T, 0).log_end_offset
                    == leader.broker.log(T, 0).log_end_offset
                    and again.broker.high_watermark(T, 0) == 10
                ),
                "the restarted follower caught up",
            )
            (r,) = await again.broker.fetch([(T, 0, 0, 1 << 20)])
            assert b"never committed" not in r.data

    asyncio.run(main())


def test_a_restarted_node_process_serves_below_its_checkpoint_until_it_has_joined(
    tmp_path: Path, etcd: EtcdServer
) -> None:
    """``tidewire serve --cluster``: from the moment its listener opens, before it has
    registered, a partition is served only below the node's checkpointed high watermark (and
    a produce is refused: no role yet)."""

    async def prepare() -> str:
        # One node of its own cluster (one replica): 10 records committed, then 5 more
        # appended by a single-node broker on its data directory.
        async with in_process_cluster(
            lambda i: InProcessNode(tmp_path, etcd, i, cluster_id="hwproc"), n=1
        ) as (node,):
            await node.cluster.create_topic(T, 1, node.broker.config.log, replication_factor=1)
            await until(lambda: node.broker.replication.leads(T, 0), "the leader")  # type: ignore[union-attr]
            for i in range(10):
                await node.broker.produce(T, 0, batch(b"committed %d" % i))
            await until(lambda: node.broker.high_watermark(T, 0) == 10, "committed")
        assert checkpoint_of(node.data)[T, 0] == 10
        async with single_broker(node.data) as alone:
            for i in range(5):
                await alone.produce(T, 0, batch(b"never committed %d" % i))
        return node.data

    data = asyncio.run(prepare())

    async def hold() -> int:
        async with EtcdClient([etcd.endpoint]) as c:
            lease = await c.grant(60)
            await MetadataStore(c, "hwproc").register(NodeInfo(1, "127.0.0.1", 1), lease)
            return lease

    async def release(lease: int) -> None:
        async with EtcdClient([etcd.endpoint]) as c:
            await c.revoke(lease)

    async def probe(addr: str) -> tuple[int, int, int]:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + WAIT_S
        while True:
            t = Transport(addr, connect_timeout_s=1, request_timeout_s=5)
            try:
                fetched = await t.request(
                    FetchRequest(max_wait_ms=0, partitions=[FetchPartition(T, 0, 0, 1 << 20)])
                )
                listed = await t.request(
                    ListOffsetsRequest(partitions=[ListOffsetsPartition(T, 0, -1)])
                )
                data = batch(b"refused")
                produced = await t.request(
                    ProduceRequest(
                        acks=ACKS_LEADER, partitions=[ProducePartition(T, 0, len(data))]
                    ),
                    [data],
                )
            except (OSError, TidewireError):
                if loop.time() > deadline:
                    raise
                await asyncio.sleep(0.05)
                continue
            finally:
                await t.close()
            assert fetched is not None
            assert listed is not None
            assert produced is not None
            f = fetched.body
            assert isinstance(f, FetchResponse)
            assert isinstance(listed.body, ListOffsetsResponse)
            assert isinstance(produced.body, ProduceResponse)
            return (
                f.partitions[0].high_watermark,
                listed.body.results[0].offset,
                produced.body.results[0].error_code,
            )

    lease = asyncio.run(hold())
    port = free_port()
    proc = popen_serve(
        *("--data-dir", data, "--port", str(port), "--http-port", "-1", "--node-id", "1"),
        *("--cluster", f"etcd://127.0.0.1:{etcd.client_port}", "--cluster-id", "hwproc"),
        *("--session-timeout", "20"),
    )
    try:
        hw, latest, produce_error = asyncio.run(probe(f"127.0.0.1:{port}"))
        assert proc.poll() is None
        assert (hw, latest) == (10, 10)
        assert produce_error == NotLeaderError.code
        asyncio.run(release(lease))
        assert proc.stdout is not None
        assert f":{port}" in proc.stdout.readline()  # joined
    finally:
        asyncio.run(release(lease))
        stop(proc)
