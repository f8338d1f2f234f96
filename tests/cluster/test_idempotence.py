"""Idempotent producers across a leader change: followers keep the producer state of what
they copy (``Broker.replica_appended``), rebuild it when their log is cut
(``Broker.replica_truncated``), and cluster nodes hand out producer ids from disjoint ranges
(``Broker.use_producer_id_range``).

In-process nodes as in test_replication.py (roles set by the test, no etcd); every wait is
bounded and nothing is timed.
"""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path

import pytest

from tests.cli._support import start_serve, stop
from tests.cluster._etcd import EtcdServer
from tests.cluster.test_node_process import _ready, metadata, until
from tests.cluster.test_replication import T, bounded, cluster, lead
from tests.cluster.test_replication import until as until_in_process
from tidewire.broker import Broker, BrokerConfig
from tidewire.broker.producers import NODE_ID_SHIFT, WRITER_PID_BASE, node_id_floor
from tidewire.client import AsyncClient, AsyncProducer
from tidewire.client._transport import Transport
from tidewire.errors import (
    InvalidConfigError,
    InvalidRequestError,
    OutOfOrderSequenceError,
    ProducerFencedError,
)
from tidewire.protocol.messages import CreateTopicRequest, MetadataResponse
from tidewire.records import BatchBuilder

PID = 7


def _idem(seq: int, *values: bytes, epoch: int = 0, pid: int = PID) -> bytes:
    b = BatchBuilder(producer_id=pid, producer_epoch=epoch, base_sequence=seq)
    for v in values:
        b.append(v, timestamp_ms=1_700_000_000_000)
    return b.build()


def test_a_promoted_follower_answers_a_resent_batch_with_its_offsets(tmp_path: Path) -> None:
    async def main() -> None:
        async with cluster(tmp_path) as (nodes, _):
            n1, n2, n3 = nodes
            await lead(nodes, n1, 0)
            r0 = await bounded(n1.broker.produce(T, 0, _idem(0, b"a", b"b")))
            r1 = await bounded(n1.broker.produce(T, 0, _idem(2, b"c")))
            await until_in_process(lambda: n2.end() == n3.end() == 3, "followers at 3")
            # The followers hold the producer's state as the leader does.
            for n in (n2, n3):
                entry = n.broker._producers[(T, 0)].entries[PID]
                assert (entry.epoch, entry.last_seq) == (0, 2)
                assert [(b.base_offset, b.last_offset) for b in entry.batches] == [(0, 1), (2, 2)]
                assert n.broker._epochs[PID] == 0
            # Node 1 is gone; node 2 leads in epoch 1.
            await n1.rep.stop_replica(T, 0)
            await n2.rep.become_leader(T, 0, epoch=1, replicas=(1, 2, 3), isr=(2, 3))
            await n3.rep.become_follower(T, 0, epoch=1, leader=2, leader_address=n2.address)
            # The producer did not hear back and sends its last batch again: the original
            # offsets, stored once.
            again = await bounded(n2.broker.produce(T, 0, _idem(2, b"c")))
            assert (again.base_offset, again.last_offset) == (r1.base_offset, r1.last_offset)
            first = await bounded(n2.broker.produce(T, 0, _idem(0, b"a", b"b")))
            assert (first.base_offset, first.last_offset) == (r0.base_offset, r0.last_offset)
            assert n2.end() == 3
            # Its sequences go on; a gap is refused.
            nxt = await bounded(n2.broker.produce(T, 0, _idem(3, b"d")))
            assert nxt.base_offset == 3
            with pytest.raises(OutOfOrderSequenceError):
                await n2.broker.produce(T, 0, _idem(9, b"x"))
            await until_in_process(lambda: n3.end() == 4, "node 3 at 4")
            assert n2.all_bytes() == n3.all_bytes()
            assert n2.end() == 4

    asyncio.run(main())


def test_a_promoted_follower_fences_an_older_epoch(tmp_path: Path) -> None:
    async def main() -> None:
        async with cluster(tmp_path) as (nodes, _):
            n1, n2, n3 = nodes
            await lead(nodes, n1, 0)
            await bounded(n1.broker.produce(T, 0, _idem(0, b"old", epoch=0)))
            await bounded(n1.broker.produce(T, 0, _idem(0, b"new", epoch=1)))
            await until_in_process(lambda: n2.end() == n3.end() == 2, "followers at 2")
            assert n2.broker._epochs[PID] == 1
            await n1.rep.stop_replica(T, 0)
            await n2.rep.become_leader(T, 0, epoch=1, replicas=(1, 2, 3), isr=(2, 3))
            await n3.rep.become_follower(T, 0, epoch=1, leader=2, leader_address=n2.address)
            with pytest.raises(ProducerFencedError):
                await n2.broker.produce(T, 0, _idem(1, b"zombie", epoch=0))
            # And the epoch is fenced for a producer-id renewal at the new leader too.
            with pytest.raises(ProducerFencedError):
                await n2.broker.init_producer_id(PID, 0)
            assert n2.end() == 2

    asyncio.run(main())


def test_a_cut_follower_forgets_the_batches_it_lost(tmp_path: Path) -> None:
    async def main() -> None:
        async with cluster(tmp_path) as (nodes, _):
            n1, n2, n3 = nodes
            await lead(nodes, n1, 0)
            await bounded(n1.broker.produce(T, 0, _idem(0, b"r0")))
            await until_in_process(lambda: n2.end() == n3.end() == 1, "followers at 1")
            await n2.rep.stop_replica(T, 0)
            await n3.rep.stop_replica(T, 0)
            # Only node 1 stores sequence 1 (acks=leader): never replicated.
            lost = await n1.broker.produce(T, 0, _idem(1, b"lost"), durable=False)
            assert lost.base_offset == 1
            assert n1.broker._producers[(T, 0)].entries[PID].last_seq == 1
            # Node 2 leads in epoch 1 and stores something else at offset 1; node 1 follows
            # it and cuts its tail.
            await n2.rep.become_leader(T, 0, epoch=1, replicas=(1, 2, 3), isr=(2, 3))
            await n3.rep.become_follower(T, 0, epoch=1, leader=2, leader_address=n2.address)
            await bounded(n2.broker.produce(T, 0, _idem(0, b"other", pid=PID + 1)))
            await n1.rep.become_follower(T, 0, epoch=1, leader=2, leader_address=n2.address)
            await until_in_process(lambda: n1.end() == n2.end() == n3.end() == 2, "all at 2")
            await until_in_process(
                lambda: n1.all_bytes() == n2.all_bytes(), "node 1 cut and caught up"
            )
            entry = n1.broker._producers[(T, 0)].entries[PID]
            assert (entry.last_seq, [b.base_offset for b in entry.batches]) == (0, [0])
            assert PID + 1 in n1.broker._producers[(T, 0)].entries
            # Node 1 leads again: the producer's retry of sequence 1 is stored now, not
            # answered with offset 1 (which holds another producer's record).
            await n1.rep.become_leader(T, 0, epoch=2, replicas=(1, 2, 3), isr=(1, 2, 3))
            await n2.rep.become_follower(T, 0, epoch=2, leader=1, leader_address=n1.address)
            await n3.rep.become_follower(T, 0, epoch=2, leader=1, leader_address=n1.address)
            retry = await bounded(n1.broker.produce(T, 0, _idem(1, b"lost")))
            assert retry.base_offset == 2
            await until_in_process(lambda: n2.end() == n3.end() == 3, "followers at 3")

    asyncio.run(main())


def test_a_duplicate_is_answered_only_once_replicated(tmp_path: Path) -> None:
    async def main() -> None:
        async with cluster(tmp_path) as (nodes, _):
            n1, n2, n3 = nodes
            await lead(nodes, n1, 0)
            await bounded(n1.broker.produce(T, 0, _idem(0, b"a")))
            await until_in_process(lambda: n2.end() == n3.end() == 1, "followers at 1")
            await n3.rep.stop_replica(T, 0)  # node 3 stops copying; still in the ISR
            # Stored on the leader (acks=leader), then sent again with acks=all: a duplicate,
            # answered with its offset only once every in-sync replica holds it.
            await n1.broker.produce(T, 0, _idem(1, b"b"), durable=False)
            pending = asyncio.ensure_future(n1.broker.produce(T, 0, _idem(1, b"b")))
            await until_in_process(lambda: n2.end() == 2, "node 2 copies it")
            for _ in range(20):
                await asyncio.sleep(0.01)
            assert not pending.done()
            assert n1.broker.high_watermark(T, 0) == 1
            # Node 3 follows again and copies it: the duplicate is answered, stored once.
            await n3.rep.become_follower(T, 0, epoch=0, leader=1, leader_address=n1.address)
            got = await bounded(pending)
            assert (got.base_offset, got.last_offset) == (1, 1)  # type: ignore[attr-defined]
            assert n1.broker.high_watermark(T, 0) == 2
            assert n1.end() == n3.end() == 2

    asyncio.run(main())


def test_cluster_nodes_hand_out_producer_ids_from_disjoint_ranges(tmp_path: Path) -> None:
    async def main() -> None:
        b1 = Broker(BrokerConfig(data_dir=str(tmp_path / "n1")))
        b2 = Broker(BrokerConfig(data_dir=str(tmp_path / "n2")))
        await b1.start()
        await b2.start()
        try:
            b1.use_producer_id_range(1)
            b2.use_producer_id_range(2)
            p1, _ = await b1.init_producer_id()
            p1b, _ = await b1.init_producer_id()
            p2, _ = await b2.init_producer_id()
            assert p1 == 1 << NODE_ID_SHIFT
            assert p1b == p1 + 1
            assert p2 == 2 << NODE_ID_SHIFT
            # A producer renews its epoch at whichever node it asks.
            assert await b2.init_producer_id(p1, 0) == (p1, 1)
            # An id of this node's range it never handed out is still refused.
            with pytest.raises(InvalidRequestError):
                await b1.init_producer_id(p1 + 5000, 0)
        finally:
            await b1.close()
            await b2.close()
        # After a restart the node goes on past the ids it handed out.
        b1 = Broker(BrokerConfig(data_dir=str(tmp_path / "n1")))
        await b1.start()
        try:
            b1.use_producer_id_range(1)
            again, _ = await b1.init_producer_id()
            assert again > p1b
            assert again >> NODE_ID_SHIFT == 1
        finally:
            await b1.close()

    asyncio.run(main())


def test_a_data_dir_moved_to_another_node_id_starts_in_the_new_range(tmp_path: Path) -> None:
    async def main() -> None:
        b = Broker(BrokerConfig(data_dir=str(tmp_path / "n")))
        await b.start()
        try:
            single, _ = await b.init_producer_id()
            assert single == 0  # a single node counts from 0, as before
        finally:
            await b.close()
        b = Broker(BrokerConfig(data_dir=str(tmp_path / "n")))
        await b.start()
        try:
            b.use_producer_id_range(3)
            pid, _ = await b.init_producer_id()
            assert pid == node_id_floor(3)
        finally:
            await b.close()
        with pytest.raises(ValueError, match="a node id is"):
            node_id_floor((WRITER_PID_BASE >> NODE_ID_SHIFT) + 1)

    asyncio.run(main())


def test_a_node_id_without_a_range_is_refused(tmp_path: Path) -> None:
    async def main() -> None:
        b = Broker(BrokerConfig(data_dir=str(tmp_path / "n")))
        await b.start()
        try:
            with pytest.raises(InvalidConfigError):
                b.use_producer_id_range(1 << 22)
        finally:
            await b.close()

    asyncio.run(main())


# --- real processes ------------------------------------------------------------------------------

SESSION_S = 2
WAIT_S = 30.0
SENT = 300  # messages; the leader is killed once KILL_AFTER of them are acknowledged
KILL_AFTER = 60


def test_an_idempotent_producer_stores_each_message_once_across_a_leader_kill(
    tmp_path: Path, etcd: EtcdServer
) -> None:
    """Three ``tidewire serve --cluster`` processes, a topic of RF 3 (min_insync 2,
    fsync=always); an idempotent producer (acks=all, several batches in flight) sends while
    the leader is SIGKILLed: every acknowledged message is read back once, at the offset it
    was acknowledged with, and no message is stored twice."""
    cluster = f"etcd://127.0.0.1:{etcd.client_port}"
    procs = {}
    try:
        for n in (1, 2, 3):
            procs[n] = start_serve(
                tmp_path / f"node{n}",
                *("--node-id", str(n), "--cluster", cluster),
                *("--session-timeout", str(SESSION_S), "--fsync", "always"),
                *("--min-insync-replicas", "2"),
            )
        addr = {n: f"127.0.0.1:{port}" for n, (_, port) in procs.items()}

        async def main() -> None:
            async def all_registered() -> MetadataResponse | None:
                meta = await metadata(addr[1])
                return meta if len(meta.nodes) == 3 else None

            await until("3 nodes registered", all_registered, WAIT_S)
            t = Transport(addr[1], request_timeout_s=WAIT_S)
            try:
                reply = await t.request(
                    CreateTopicRequest(name=T, partitions=1, replication_factor=3)
                )
            finally:
                await t.close()
            assert reply is not None
            assert reply.body.error_code == 0, reply.body

            async def in_sync() -> int | None:
                leaders = set()
                for a in addr.values():  # every node knows the topic, all replicas in sync
                    m = await metadata(a)
                    if not m.topics or not m.topics[0].partitions:
                        return None
                    (q,) = m.topics[0].partitions
                    if len(q.isr) != 3 or q.leader < 0:
                        return None
                    leaders.add(q.leader)
                return leaders.pop() if len(leaders) == 1 else None

            old = await until("every replica in sync", in_sync, WAIT_S)
            survivor = next(n for n in (1, 2, 3) if n != old)
            acked: dict[bytes, int] = {}
            failed: list[tuple[bytes, BaseException]] = []
            async with AsyncProducer(
                list(addr.values()),
                acks="durable",
                linger_ms=1,
                batch_bytes=256,  # a few messages a batch: many batches in flight
                delivery_timeout_ms=int(WAIT_S * 1000),
                request_timeout_ms=10_000,
            ) as producer:

                async def one(value: bytes) -> None:
                    try:
                        meta = await (await producer.send(T, value, partition=0))
                    except Exception as exc:
                        failed.append((value, exc))
                    else:
                        acked[value] = meta.offset

                tasks = []
                for i in range(SENT):
                    tasks.append(asyncio.create_task(one(b"m%05d" % i)))
                    if i == KILL_AFTER:
                        await until(
                            "the first messages acknowledged",
                            lambda: _ready(len(acked) >= KILL_AFTER // 2),
                            WAIT_S,
                        )
                        os.kill(procs[old][0].pid, signal.SIGKILL)
                    await asyncio.sleep(0.002)
                await asyncio.wait_for(asyncio.gather(*tasks), WAIT_S * 2)

            async def new_leader() -> int | None:
                (q,) = (await metadata(addr[survivor])).topics[0].partitions
                return q.leader if q.leader not in (old, -1) else None

            new = await until("a new leader", new_leader, WAIT_S)
            seen: dict[bytes, list[int]] = {}
            async with AsyncClient(addr[new], request_timeout_s=WAIT_S) as c:
                offset = 0
                for _ in range(SENT * 2):  # bounded: each round reads at least one record
                    got = await c.fetch(T, 0, offset)
                    for r in got.records:
                        assert r.value is not None
                        seen.setdefault(r.value, []).append(r.offset)
                    if got.next_offset >= got.high_watermark or not got.records:
                        break
                    offset = got.next_offset
            dups = {v: o for v, o in seen.items() if len(o) > 1}
            assert not dups, f"stored twice: {sorted(dups.items())[:10]}"
            # Retried across the failover, every message is acknowledged in the end.
            assert not failed, failed[:3]
            assert len(acked) == SENT
            for value, off in acked.items():
                assert value in seen, f"{value!r} acknowledged at {off}, not read back"
                if off >= 0:
                    assert seen[value] == [off], (value, off, seen[value])

        asyncio.run(main())
    finally:
        for proc, _ in procs.values():
            stop(proc)
