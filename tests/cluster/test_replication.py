"""Replication between real brokers: three in-process nodes, each with its own data directory
and TCP server in one event loop, roles set by the test (``become_leader`` /
``become_follower``), no etcd (ISR proposals are recorded and taken at once).

Every wait is bounded (``until``): a test fails instead of hanging, and none asserts on
how long something took.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import cast

import pytest

from tests.cluster._etcd import EtcdServer
from tests.cluster._inprocess import InProcessNode, in_process_cluster
from tidewire.broker import Broker, BrokerConfig
from tidewire.broker.core import ProduceResult
from tidewire.client import AsyncClient, AsyncProducer, Message
from tidewire.cluster.fetcher import FollowedPartition, LeaderFetcher
from tidewire.cluster.metadata import PartitionState
from tidewire.cluster.replication import ReplicaManager
from tidewire.errors import (
    InvalidRequestError,
    NotEnoughReplicasAfterAppendError,
    NotEnoughReplicasError,
    NotLeaderError,
    PartitionCorruptError,
    ProducerFencedError,
    RequestTimedOutError,
)
from tidewire.protocol.messages import (
    ACKS_LEADER,
    ReplicaFetchPartition,
    ReplicaFetchRequest,
    ReplicaFetchResponse,
)
from tidewire.records import BatchBuilder, iter_batches
from tidewire.records.batch import BATCH_OVERHEAD
from tidewire.server import ServerConfig, TcpServer
from tidewire.storage import FsyncPolicy, LogConfig
from tidewire.storage import log as log_module

T = "orders"
LAG_MS = 10_000


class FakeClock:
    """Monotonic seconds the test moves by hand (the followers' lag)."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Node:
    """One cluster node: a broker, its TCP server and its ReplicaManager."""

    def __init__(self, node_id: int, root: Path, clock: FakeClock, proposals: list[object]) -> None:
        self.node_id = node_id
        self.dir = root / f"node{node_id}"
        self.clock = clock
        self.proposals = proposals
        self.min_insync = 1
        self.log_config: LogConfig | None = None

    async def start(self) -> None:
        self.broker = Broker(BrokerConfig(data_dir=str(self.dir), auto_create_topics=False))
        await self.broker.start()
        self.server = TcpServer(self.broker, ServerConfig(host="127.0.0.1", port=0))
        await self.server.start()

        async def propose(topic: str, partition: int, epoch: int, isr: tuple[int, ...]) -> bool:
            self.proposals.append((self.node_id, topic, partition, epoch, isr))
            return True

        self.rep = ReplicaManager(
            self.broker,
            self.node_id,
            lag_max_ms=LAG_MS,
            min_insync=self.min_insync,
            clock=self.clock,
            propose_isr=propose,
            advertise=("127.0.0.1", self.server.port),
            fetch_max_wait_ms=200,
        )
        self.broker.replication = self.rep
        if T not in self.broker.topics():
            self.broker.create_topic(T, partitions=1, config=self.log_config)

    async def stop(self) -> None:
        await self.server.close()
        await self.broker.close()

    @property
    def address(self) -> tuple[str, int]:
        return ("127.0.0.1", self.server.port)

    @property
    def addr(self) -> str:
        return f"127.0.0.1:{self.server.port}"

    def end(self) -> int:
        return self.broker.log(T, 0).log_end_offset

    def all_bytes(self) -> bytes:
        plog = self.broker.log(T, 0)
        return bytes(plog.read(0, 64 * 1024 * 1024, max_offset=plog.log_end_offset).data)


@contextlib.asynccontextmanager
async def cluster(
    tmp_path: Path, n: int = 3, log_config: LogConfig | None = None
) -> AsyncIterator[tuple[list[Node], list[object]]]:
    clock = FakeClock()
    proposals: list[object] = []
    nodes = [Node(i + 1, tmp_path, clock, proposals) for i in range(n)]
    for node in nodes:
        node.log_config = log_config
    try:
        for node in nodes:
            await node.start()
        yield nodes, proposals
    finally:
        for node in nodes:
            with contextlib.suppress(Exception):
                await node.stop()


async def lead(
    nodes: list[Node], leader: Node, epoch: int, isr: tuple[int, ...] | None = None
) -> None:
    """``leader`` leads the partition in ``epoch``, every other node follows it."""
    replicas = tuple(n.node_id for n in nodes)
    await leader.rep.become_leader(
        T, 0, epoch=epoch, replicas=replicas, isr=isr if isr is not None else replicas
    )
    for node in nodes:
        if node is not leader:
            await node.rep.become_follower(
                T, 0, epoch=epoch, leader=leader.node_id, leader_address=leader.address
            )


async def until(check: Callable[[], bool], what: str, timeout_s: float = 20.0) -> None:
    """Poll ``check`` until it holds (bounded in time)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while not check():
        if loop.time() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.01)


async def bounded(aw: Awaitable[object], timeout_s: float = 20.0) -> object:
    return await asyncio.wait_for(aw, timeout_s)


def msgs(*values: bytes) -> list[Message]:
    return [Message(v) for v in values]


def test_acks_all_is_answered_once_every_follower_has_the_records(tmp_path: Path) -> None:
    async def main() -> None:
        async with cluster(tmp_path) as (nodes, _):
            n1, n2, n3 = nodes
            await lead(nodes, n1, 0)
            async with AsyncClient(n1.addr) as c:
                for i in range(5):
                    base = await bounded(c.produce(T, 0, msgs(b"a%d" % i, b"b%d" % i)))
                    assert base == 2 * i
                    # Answered: both followers hold it (copied before the leader answered).
                    assert n2.end() >= 2 * i + 2
                    assert n3.end() >= 2 * i + 2
                got = await c.fetch(T, 0, 0)
                assert [r.value for r in got.records][:2] == [b"a0", b"b0"]
                assert got.high_watermark == 10
            await until(lambda: n2.end() == n3.end() == 10, "followers at 10")
            assert n1.all_bytes() == n2.all_bytes() == n3.all_bytes()

    asyncio.run(main())


def test_under_fsync_always_acks_all_waits_for_the_followers_fsync(tmp_path: Path) -> None:
    async def main() -> None:
        config = LogConfig(fsync=FsyncPolicy.ALWAYS)
        async with cluster(tmp_path, log_config=config) as (nodes, _):
            n1, n2, n3 = nodes
            await lead(nodes, n1, 0)
            async with AsyncClient(n1.addr) as c:
                for i in range(3):
                    assert await bounded(c.produce(T, 0, msgs(b"d%d" % i))) == i
                    # Answered: on both followers' disks (their durable offsets counted).
                    assert n2.broker.log(T, 0).flushed_offset >= i + 1
                    assert n3.broker.log(T, 0).flushed_offset >= i + 1
                got = await c.fetch(T, 0, 0)
                assert got.high_watermark == 3

    asyncio.run(main())


def test_a_stopped_follower_holds_acks_all_until_it_is_dropped_from_the_isr(
    tmp_path: Path,
) -> None:
    async def main() -> None:
        async with cluster(tmp_path) as (nodes, proposals):
            n1, n2, n3 = nodes
            await lead(nodes, n1, 0)
            async with AsyncClient(n1.addr) as c:
                await bounded(c.produce(T, 0, msgs(b"first")))
                await n3.rep.stop_replica(T, 0)  # node 3 stops fetching
                pending = asyncio.ensure_future(c.produce(T, 0, msgs(b"second")))
                await until(lambda: n2.end() == 2, "node 2 copies the second record")
                await asyncio.sleep(0.3)  # node 2 fetched again: it holds it; node 3 never will
                assert not pending.done()
                with pytest.raises(RequestTimedOutError):
                    await n1.rep.wait_replicated(T, 0, 2, 0.05)
                # Consumers do not see it: not on every in-sync replica.
                got = await c.fetch(T, 0, 0)
                assert got.high_watermark == 1
                assert [r.value for r in got.records] == [b"first"]
                # Past replica_lag_max_ms, the leader proposes node 3 out; the ISR change
                # lets the high watermark pass the record and the produce is answered.
                n1.clock.now += LAG_MS / 1000 + 1
                assert await bounded(pending) == 1
                assert (1, T, 0, 0, (1, 2)) in proposals
                got = await c.fetch(T, 0, 0)
                assert got.high_watermark == 2
                assert [r.value for r in got.records] == [b"first", b"second"]

    asyncio.run(main())


def test_a_follower_refuses_produce_naming_the_leader(tmp_path: Path) -> None:
    async def main() -> None:
        async with cluster(tmp_path) as (nodes, _):
            n1, n2, _n3 = nodes
            await lead(nodes, n1, 0)
            # The client retries NotLeaderError for its request timeout (the metadata of
            # these bare replica managers names no leader): a short one, then it reports it.
            async with AsyncClient(n2.addr, request_timeout_s=5.0) as c:
                with pytest.raises(NotLeaderError) as info:
                    await c.produce(T, 0, msgs(b"x"))
                assert f"node 1 at 127.0.0.1:{n1.server.port}" in str(info.value)
            assert n2.end() == 0
            with pytest.raises(NotLeaderError) as direct:
                await n2.broker.produce(T, 0, b"irrelevant")
            assert (direct.value.leader_id, direct.value.leader_port) == (1, n1.server.port)

    asyncio.run(main())


def test_acks_all_is_refused_while_the_isr_is_below_min_insync(tmp_path: Path) -> None:
    async def main() -> None:
        async with cluster(tmp_path) as (nodes, _):
            n1, _n2, _n3 = nodes
            await n1.rep.become_leader(T, 0, epoch=0, replicas=(1, 2, 3), isr=(1,), min_insync=2)
            async with AsyncClient(n1.addr) as c:
                with pytest.raises(NotEnoughReplicasError):
                    await c.produce(T, 0, msgs(b"x"))
                assert n1.end() == 0  # nothing stored
                # acks=leader does not ask for replicas.
                assert await c.produce(T, 0, msgs(b"y"), acks=ACKS_LEADER) == 0

    asyncio.run(main())


def test_acks_all_is_answered_not_enough_replicas_when_the_isr_shrank_below_min_insync(
    tmp_path: Path,
) -> None:
    """Kafka's NOT_ENOUGH_REPLICAS_AFTER_APPEND: taken with 3 in sync (min_insync 2), both
    followers stop and are dropped; the high watermark then passes the batch with the leader
    alone in the ISR, so the producer hears it has fewer copies than it asked for. The batch
    is stored all the same."""

    async def main() -> None:
        async with cluster(tmp_path) as (nodes, proposals):
            n1, n2, n3 = nodes
            await n1.rep.become_leader(
                T, 0, epoch=0, replicas=(1, 2, 3), isr=(1, 2, 3), min_insync=2
            )
            for node in (n2, n3):
                await node.rep.become_follower(T, 0, epoch=0, leader=1, leader_address=n1.address)
            async with AsyncClient(n1.addr) as c:
                assert await bounded(c.produce(T, 0, msgs(b"first"))) == 0
                await n2.rep.stop_replica(T, 0)
                await n3.rep.stop_replica(T, 0)
                pending = asyncio.ensure_future(c.produce(T, 0, msgs(b"second")))
                await until(lambda: n1.end() == 2, "the leader stores the second record")
                n1.clock.now += LAG_MS / 1000 + 1  # both followers lag: out of the ISR
                with pytest.raises(NotEnoughReplicasAfterAppendError):
                    await bounded(pending)
                assert (1, T, 0, 0, (1,)) in proposals
                got = await c.fetch(T, 0, 0)
                assert got.high_watermark == 2
                assert [r.value for r in got.records] == [b"first", b"second"]

    asyncio.run(main())


def test_a_new_leader_makes_the_old_one_drop_its_unreplicated_tail(tmp_path: Path) -> None:
    async def main() -> None:
        async with cluster(tmp_path) as (nodes, _):
            n1, n2, n3 = nodes
            await lead(nodes, n1, 0)
            async with AsyncClient(n1.addr) as c:
                await bounded(c.produce(T, 0, msgs(b"r0", b"r1")))
                await n2.rep.stop_replica(T, 0)
                await n3.rep.stop_replica(T, 0)
                # Only node 1 gets these two (acks=leader): never acknowledged as replicated.
                await c.produce(T, 0, msgs(b"lost2"), acks=ACKS_LEADER)
                await c.produce(T, 0, msgs(b"lost3"), acks=ACKS_LEADER)
            assert (n1.end(), n2.end(), n3.end()) == (4, 2, 2)
            # Node 2 is elected in epoch 1 (node 1 out of the ISR); node 1 comes back as a
            # follower and must cut its epoch-0 tail at the new leader's end of epoch 0.
            await n2.rep.become_leader(T, 0, epoch=1, replicas=(1, 2, 3), isr=(2, 3))
            await n3.rep.become_follower(T, 0, epoch=1, leader=2, leader_address=n2.address)
            await n1.rep.become_follower(T, 0, epoch=1, leader=2, leader_address=n2.address)
            async with AsyncClient(n2.addr) as c:
                assert await bounded(c.produce(T, 0, msgs(b"new2"))) == 2
                await until(lambda: n1.end() == n2.end() == n3.end() == 3, "all at 3")
                got = await c.fetch(T, 0, 0)
                assert [r.value for r in got.records] == [b"r0", b"r1", b"new2"]
            assert n1.all_bytes() == n2.all_bytes() == n3.all_bytes()
            assert list(n1.broker.log(T, 0).epoch_history()) == [(0, 0), (1, 2)]
            # The deposed leader refuses produce now.
            with pytest.raises(NotLeaderError):
                await n1.broker.produce(T, 0, b"x")

    asyncio.run(main())


def test_a_restarted_follower_catches_up(tmp_path: Path) -> None:
    async def main() -> None:
        async with cluster(tmp_path) as (nodes, _):
            n1, n2, n3 = nodes
            await lead(nodes, n1, 0)
            async with AsyncClient(n1.addr) as c:
                await bounded(c.produce(T, 0, msgs(b"a", b"b")))
                await n3.stop()
                for i in range(3):
                    await c.produce(T, 0, msgs(b"while-down-%d" % i), acks=ACKS_LEADER)
                await until(lambda: n2.end() == 5, "node 2 at 5")
                assert n1.rep.high_watermark(T, 0) == 2  # node 3 (in the ISR) has 2
                await n3.start()
                assert n3.end() == 2
                await n3.rep.become_follower(T, 0, epoch=0, leader=1, leader_address=n1.address)
                await until(lambda: n3.end() == 5, "node 3 catches up")
                await until(lambda: n1.rep.high_watermark(T, 0) == 5, "high watermark at 5")
            assert n1.all_bytes() == n2.all_bytes() == n3.all_bytes()

    asyncio.run(main())


def flip_bit(segment: Path, batch: int) -> None:
    """Flip one bit inside the records of the ``batch``-th batch of ``segment`` (covered by
    its CRC; the file size and the segment's seal stay as they were)."""
    data = bytearray(segment.read_bytes())
    pos = [p for p, _ in iter_batches(data)][batch] + BATCH_OVERHEAD + 2
    data[pos] ^= 0x10
    segment.write_bytes(bytes(data))


def every_batch(node: Node) -> bytes:
    """The node's whole log, batch after batch (across segments, wherever they roll)."""
    plog = node.broker.log(T, 0)
    out, at = bytearray(), plog.log_start_offset
    for _ in range(10_000):
        if at >= plog.log_end_offset:
            break
        r = plog.read(at, 1024 * 1024)
        out += r.data
        at = r.next_offset
    return bytes(out)


async def produce_idempotent(leader: Node, count: int) -> None:
    """``count`` one-record batches from an idempotent producer (its state is replicated, so
    the followers snapshot it at a clean stop and do not read their logs again at a start)."""
    async with AsyncProducer(leader.addr, linger_ms=0) as producer:
        for i in range(count):
            await bounded(await producer.send(T, b"r%03d-" % i + b"x" * 100, partition=0))


def test_a_follower_restarted_with_a_bit_flipped_in_a_sealed_segment_copies_it_again(
    tmp_path: Path,
) -> None:
    """A sealed segment found intact at the open is trusted unread, and a follower's producer
    state comes from its snapshot: the follower's own check finds the flipped bit, the log is
    cut there and copied again, and it ends holding the leader's bytes."""

    async def main() -> None:
        async with cluster(tmp_path, log_config=LogConfig(segment_bytes=1024)) as (nodes, _):
            n1, n3 = nodes[0], nodes[2]
            await lead(nodes, n1, 0)
            await produce_idempotent(n1, 30)
            await until(lambda: n3.end() == n1.end() == 30, "node 3 at 30")
            await n3.stop()
            segments = sorted((n3.dir / f"{T}-0").glob("*.log"))
            assert len(segments) >= 2, segments  # the first one is sealed
            flip_bit(segments[0], batch=1)
            await n3.start()
            assert not n3.broker.log(T, 0).damage  # not found by the open
            await n3.rep.become_follower(T, 0, epoch=0, leader=1, leader_address=n1.address)
            await until(lambda: (T, 0) in n3.rep._checked, "node 3's own log checked")
            await until(
                lambda: n3.end() == 30 and not n3.broker.log(T, 0).damage,
                "node 3 cut at the damage and caught up",
            )
            assert every_batch(n3) == every_batch(n1)

    asyncio.run(main())


def test_damage_a_read_finds_on_a_follower_is_copied_again(tmp_path: Path) -> None:
    """Damage found while following (here by a read of the follower's log) is repaired from
    the leader at the next fetch, not left as a hole below the log end the follower
    reports."""

    async def main() -> None:
        async with cluster(tmp_path, log_config=LogConfig(segment_bytes=1024)) as (nodes, _):
            n1, n3 = nodes[0], nodes[2]
            await lead(nodes, n1, 0)
            await produce_idempotent(n1, 20)
            await until(lambda: n3.end() == n1.end() == 20, "node 3 at 20")
            plog = n3.broker.log(T, 0)
            await until(lambda: (T, 0) in n3.rep._checked, "node 3's own log checked")
            flip_bit(sorted((n3.dir / f"{T}-0").glob("*.log"))[0], batch=1)
            with pytest.raises(PartitionCorruptError):
                plog.read(1, 1024)  # the read finds the flipped bit and records the range
            await produce_idempotent(n1, 2)  # a fetch round answered with data
            await until(
                lambda: n3.end() == 22 and not plog.damage, "node 3 cut at the damage, caught up"
            )
            assert every_batch(n3) == every_batch(n1)

    asyncio.run(main())


def test_replica_fetch_answers_fenced_unknown_epoch_and_divergence(tmp_path: Path) -> None:
    async def main() -> None:
        async with cluster(tmp_path, n=2) as (nodes, _):
            n1, n2 = nodes
            await n1.rep.become_leader(T, 0, epoch=3, replicas=(1, 2), isr=(1,))
            await n1.broker.produce(T, 0, _batch(b"x"), durable=False)
            async with AsyncClient(n1.addr) as c:

                async def ask(*p: ReplicaFetchPartition) -> ReplicaFetchResponse:
                    req = ReplicaFetchRequest(node_id=2, max_wait_ms=0, partitions=list(p))
                    got = await c._t.request(req)
                    assert got is not None
                    body: ReplicaFetchResponse = got.body
                    return body

                r = await ask(
                    ReplicaFetchPartition(T, 0, 0, 2),
                    ReplicaFetchPartition(T, 0, 0, 4),
                    ReplicaFetchPartition(T, 0, 5, 3, 1),
                    ReplicaFetchPartition(T, 0, 0, 3),
                )
                fenced, unknown, diverged, ok = r.partitions
                assert fenced.error_code == 132
                assert unknown.error_code == 133
                # The follower's epoch 1 predates everything here: it keeps nothing.
                assert (diverged.diverging_epoch, diverged.diverging_end_offset) == (-1, 0)
                assert ok.error_code == 0
                assert ok.data_bytes > 0
                assert ok.leader_epoch == 3
            # A node not told of epoch 3 yet answers UnknownLeaderEpoch (the asker retries);
            # one that follows in it answers NotLeader; a single node refuses it whole.
            async with AsyncClient(n2.addr) as c:
                req = ReplicaFetchRequest(
                    node_id=1, max_wait_ms=0, partitions=[ReplicaFetchPartition(T, 0, 0, 3)]
                )
                got = await c._t.request(req)
                assert got is not None
                assert got.body.partitions[0].error_code == 133
                await n2.rep.become_follower(T, 0, epoch=3, leader=1, leader_address=n1.address)
                got = await c._t.request(req)
                assert got is not None
                assert got.body.partitions[0].error_code == 130
            n2.broker.replication = None
            async with AsyncClient(n2.addr) as c:
                with pytest.raises(InvalidRequestError):
                    await c._t.request(req)

    asyncio.run(main())


def test_a_followers_read_of_a_durable_log_end_keeps_the_leaders_commits_off_the_loop(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A follower copies what the leader has appended, durable or not: its read counts as a
    read for the leader's lone commits (``INLINE_FSYNC_AFTER``) even once every commit is
    done, when the log end is the durable offset (where a caught-up consumer's read, which
    waits for the next commit anyway, does not)."""
    monkeypatch.setattr(log_module, "_COMMITS", log_module._Commits())

    async def main() -> None:
        async with cluster(tmp_path, n=2, log_config=LogConfig(fsync=FsyncPolicy.ALWAYS)) as (
            nodes,
            _,
        ):
            n1 = nodes[0]
            await n1.rep.become_leader(T, 0, epoch=1, replicas=(1, 2), isr=(1,))
            await n1.broker.produce(T, 0, _batch(b"x"), durable=False)
            plog = n1.broker.log(T, 0)
            await plog.flush_async()
            commits = log_module._COMMITS
            assert commits.last == id(plog)  # this log started the last commit
            assert plog.flushed_offset == plog.log_end_offset == 1
            commits.read_at = -1.0
            results, data = await n1.rep.replica_fetch(
                ReplicaFetchRequest(
                    node_id=2, max_wait_ms=0, partitions=[ReplicaFetchPartition(T, 0, 0, 1)]
                )
            )
            assert results[0].error_code == 0
            assert data
            assert commits.read_at > 0

    asyncio.run(main())


def _batch(value: bytes) -> bytes:
    b = BatchBuilder()
    b.append(value, timestamp_ms=1_700_000_000_000)
    return b.build()


def test_a_follower_behind_the_leaders_log_start_starts_its_log_over_there(
    tmp_path: Path,
) -> None:
    """Retention on the leader deleted what a follower (away meanwhile) would copy next: the
    follower deletes its log, starts it at the leader's log start and catches up from there,
    instead of asking for offsets that no longer exist, forever."""

    async def main() -> None:
        config = LogConfig(segment_bytes=1024)  # a segment per two records or so
        async with cluster(tmp_path, log_config=config) as (nodes, _):
            n1, n2, n3 = nodes
            # Node 3 is away (not following) while the leader writes and deletes.
            await n1.rep.become_leader(T, 0, epoch=0, replicas=(1, 2, 3), isr=(1, 2))
            await n2.rep.become_follower(T, 0, epoch=0, leader=1, leader_address=n1.address)
            async with AsyncClient(n1.addr) as c:
                await bounded(c.produce(T, 0, msgs(b"early")))
                await until(lambda: n2.end() == 1, "node 2 at 1")
                for i in range(10):
                    await bounded(c.produce(T, 0, msgs(b"r%d-" % i + b"x" * 400)))
            leader_log = n1.broker.log(T, 0)
            assert leader_log.segment_count > 3
            n1.broker.log(T, 0).delete_before(8)  # what retention does
            start = leader_log.log_start_offset
            assert start > n3.end() == 0
            await n3.rep.become_follower(T, 0, epoch=0, leader=1, leader_address=n1.address)
            await until(lambda: n3.end() == n1.end(), "node 3 catches up from the log start")
            follower_log = n3.broker.log(T, 0)
            assert follower_log.log_start_offset == start

            def tail(plog: object) -> bytes:
                assert hasattr(plog, "read")
                return bytes(plog.read(start, 1 << 20, max_offset=plog.log_end_offset).data)

            assert tail(follower_log) == tail(leader_log)
            assert n1.rep.high_watermark(T, 0) == n1.end()

    asyncio.run(main())


def test_an_epoch_bump_fences_the_older_epoch_on_the_next_leader(
    tmp_path: Path, etcd: EtcdServer
) -> None:
    """A producer's epoch is bumped on the leader of a partition (node A), which then goes:
    the next leader refuses the older epoch at once, before the new epoch has written
    there (the bump is recorded in etcd and every node fences it), and takes the new one.
    Three in-process cluster nodes against the real etcd."""

    async def main() -> None:
        async with in_process_cluster(
            lambda i: InProcessNode(tmp_path, etcd, i, cluster_id="epochs"), 3
        ) as nodes:
            async with AsyncClient(",".join(n.addr for n in nodes)) as client:
                await client.create_topic(T, partitions=1)

            def leader() -> InProcessNode | None:
                live = [n for n in nodes if not n.stopped]
                got = live[0].cluster.cache.partition(T, 0)
                lead_ = None if got is None else got[0].leader
                return next((n for n in live if n.id == lead_), None)

            async def produce_on_leader(batch: bytes) -> ProduceResult:
                for _ in range(300):  # until the leader elected has taken its role
                    node = leader()
                    if node is not None:
                        try:
                            return await node.broker.produce(T, 0, batch)
                        except (NotLeaderError, NotEnoughReplicasError):
                            pass
                    await asyncio.sleep(0.1)
                raise AssertionError("no leader took the partition")

            def idem(epoch: int, seq: int, value: bytes) -> bytes:
                b = BatchBuilder(producer_id=pid, producer_epoch=epoch, base_sequence=seq)
                b.append(value, timestamp_ms=1_700_000_000_000)
                return b.build()

            await until_in_process_leader(leader)
            a = leader()
            assert a is not None
            pid, epoch = await a.broker.init_producer_id()
            await produce_on_leader(idem(epoch, 0, b"a"))
            _, bumped = await a.broker.init_producer_id(pid, epoch)
            assert bumped == epoch + 1
            others = [n for n in nodes if n is not a]
            await until(
                lambda: all(n.cluster.cache.producer_epochs.get(pid) == bumped for n in others),
                "every node knows of the bump",
            )
            await a.stop()
            await until_in_process_leader(lambda: leader() if leader() is not a else None)
            # The older instance's next batch: fenced on the new leader.
            with pytest.raises(ProducerFencedError):
                await produce_on_leader(idem(epoch, 1, b"b"))
            # The new instance writes.
            got = await produce_on_leader(idem(bumped, 0, b"c"))
            assert got.base_offset == 1

    asyncio.run(asyncio.wait_for(main(), 120))


async def until_in_process_leader(find: Callable[[], object | None]) -> None:
    await until(lambda: find() is not None, "a leader named")


def _etcd_state(nodes: list[InProcessNode]) -> PartitionState:
    """``T``'s partition 0 in etcd, as a running node's copy of the metadata has it."""
    live = next(n for n in nodes if not n.stopped)
    got = live.cluster.cache.partition(T, 0)
    assert got is not None
    return got[0]


class _FollowerOut:
    """Topic ``T`` (one partition) on three nodes, its ISR of 3 reached; then a follower
    (``out``) stopped, and out of the ISR both in etcd and at the ``leader``."""

    def __init__(self, nodes: list[InProcessNode], leader: InProcessNode, out: InProcessNode):
        self.nodes = nodes
        self.leader = leader
        self.out = out

    def state(self) -> PartitionState:
        """The partition's state in etcd, as a running node's copy of the metadata has it."""
        return _etcd_state(self.nodes)

    def local_isr(self) -> frozenset[int]:
        """The ISR the leader's replica manager goes by."""
        led = self.leader.broker.replication._led[(T, 0)]  # type: ignore[union-attr]
        return led.state.isr


async def _a_follower_out_of_the_isr(nodes: list[InProcessNode]) -> _FollowerOut:
    """Create ``T``, wait for its ISR of 3, then stop a follower and wait until it is out of
    the ISR in etcd and at the leader."""
    async with AsyncClient(",".join(n.addr for n in nodes)) as client:
        await client.create_topic(T, partitions=1)

    await until(lambda: len(_etcd_state(nodes).isr) == 3, "the ISR of 3")
    leader = next(n for n in nodes if n.id == _etcd_state(nodes).leader)
    scene = _FollowerOut(nodes, leader, next(n for n in nodes if n is not leader))
    await scene.out.stop()
    await until(lambda: scene.out.id not in scene.state().isr, "the stopped node out of the ISR")
    await until(lambda: scene.out.id not in scene.local_isr(), "the leader applied it")
    return scene


def test_a_leader_follows_etcd_back_to_the_isr_it_had_applied(
    tmp_path: Path, etcd: EtcdServer
) -> None:
    """The leader takes a follower back into the ISR itself (its own compare-and-swap), then
    the controller takes it out again (as for a node whose lease lapsed), both before the
    leader's node applied the first: etcd's ISR is again the one the node applied last. The
    leader must count etcd's ISR (and take the follower in again after its next fetch), not
    go on with its own, which it would never propose again: a follower out for good."""

    async def main() -> None:
        async with in_process_cluster(
            lambda i: InProcessNode(tmp_path, etcd, i, cluster_id="isr"), 3
        ) as nodes:
            scene = await _a_follower_out_of_the_isr(nodes)
            leader, out, state, local_isr = scene.leader, scene.out, scene.state, scene.local_isr
            # The leader's node applies nothing more until told: its replica manager goes on.
            gate = asyncio.Event()
            inner = leader.cluster._reconcile

            async def gated() -> bool:
                await gate.wait()
                return await inner()

            leader.cluster._reconcile = gated  # type: ignore[method-assign]
            await out.start()
            await until(lambda: out.id in state().isr, "the leader took it in (etcd)")

            def leader_sees_it_in() -> bool:
                """The leader committed the ISR it proposed, and its own copy of the metadata
                holds etcd's answer (another node's watch may see etcd's change first)."""
                got = leader.cluster.cache.partition(T, 0)
                return out.id in local_isr() and got is not None and out.id in got[0].isr

            await until(leader_sees_it_in, "the leader took it in (its replica manager)")
            got = leader.cluster.cache.partition(T, 0)
            assert got is not None
            s, version = got
            taken_out = PartitionState(
                s.replicas, s.leader, s.leader_epoch, tuple(r for r in s.isr if r != out.id)
            )
            assert await leader.cluster.store.set_partition(T, 0, taken_out, version)
            await until(lambda: out.id not in state().isr, "the controller's change seen")
            gate.set()
            # Applied, then the follower's next fetch takes it in again, through etcd.
            await until(
                lambda: out.id in state().isr and local_isr() == frozenset(state().isr),
                "the leader's ISR is etcd's, the follower back in",
            )

    asyncio.run(asyncio.wait_for(main(), 120))


def test_an_isr_change_answered_after_a_later_one_does_not_take_the_later_one_back(
    tmp_path: Path, etcd: EtcdServer
) -> None:
    """The leader takes a returning follower back into the ISR; etcd's answer reaches the
    leader only after the watch brought its node that change and then the controller's
    taking the follower out again (its node went again). The late answer is counted, but
    the leader must keep etcd's later ISR, not hold the one it proposed: that would count
    a node that is gone for the high watermark until the lag check proposed it out."""

    async def main() -> None:
        async with in_process_cluster(
            lambda i: InProcessNode(tmp_path, etcd, i, cluster_id="isr-late"), 3
        ) as nodes:
            scene = await _a_follower_out_of_the_isr(nodes)
            leader, out, state, local_isr = scene.leader, scene.out, scene.state, scene.local_isr
            # The leader's next compare-and-swap is taken by etcd, its answer held back.
            store = leader.cluster.store
            inner = store.set_partition
            held, release = asyncio.Event(), asyncio.Event()

            async def late(
                topic: str,
                partition: int,
                new: PartitionState,
                version: int,
                fence: object = None,
            ) -> bool:
                ok = await inner(topic, partition, new, version, fence)  # type: ignore[arg-type]
                if topic == T and not held.is_set() and out.id in new.isr:
                    held.set()
                    await release.wait()
                return ok

            store.set_partition = late  # type: ignore[method-assign]
            expands = leader.cluster.stats.isr_expands
            await out.start()
            await until(held.is_set, "the leader's expansion taken by etcd")
            await until(lambda: out.id in local_isr(), "the leader's node applied it (watch)")
            await out.stop()
            await until(lambda: out.id not in state().isr, "the controller took it out again")
            await until(lambda: out.id not in local_isr(), "the leader's node applied that")
            release.set()
            await until(
                lambda: leader.cluster.stats.isr_expands == expands + 1, "the answer counted"
            )
            assert out.id not in state().isr
            assert local_isr() == frozenset(state().isr)
            assert leader.cluster._applied[(T, 0)][3] == state().isr

    asyncio.run(asyncio.wait_for(main(), 120))


def test_a_fetcher_closed_as_its_last_partition_goes_stops() -> None:
    """The node removes a fetcher's last partition and closes it in the same turn of the
    loop: the fetcher's task, waiting for a change with a timeout, ends (with
    ``asyncio.wait_for`` Python 3.11 lost that cancellation and the close waited for ever)."""

    async def main() -> None:
        fetcher = LeaderFetcher(cast(ReplicaManager, None), 2, ("127.0.0.1", 9))
        later = asyncio.get_running_loop().time() + 3600  # not fetched: waits with a timeout
        state = FollowedPartition(T, 0, 1, 2, ("127.0.0.1", 9), retry_at=later)
        fetcher.add(state)
        for _ in range(5):
            await asyncio.sleep(0)
        fetcher.remove(state.key)
        async with asyncio.timeout(10):  # a failure rather than a hang
            await fetcher.close()

    asyncio.run(main())
