"""The background scrub (cluster/scrub.py): the sealed segments of the partitions a node
leads or follows are CRC-checked at a bounded rate, so a flipped bit nobody reads is found;
then what the read path does follows (the range is never served, a leader hands the
partition to an in-sync replica, its log is repaired from there).

Every wait is bounded; nothing asserts on time or on the rate (steps are driven by hand
where the figures are checked)."""

from __future__ import annotations

import asyncio
import struct
from pathlib import Path

import pytest

from tests.cluster._etcd import EtcdServer
from tests.cluster._inprocess import InProcessNode, in_process_cluster, until
from tidewire.broker import Broker, BrokerConfig
from tidewire.cluster import scrub
from tidewire.cluster.metrics import ClusterStats
from tidewire.cluster.replication import ReplicaManager
from tidewire.cluster.scrub import Scrubber
from tidewire.errors import PartitionCorruptError
from tidewire.records import BatchBuilder
from tidewire.storage import LogConfig, PartitionLog

T = "scrubbed"
#: Small segments: a few records each, so the first ones are sealed.
SEGMENT_BYTES = 4096


def batch(i: int) -> bytes:
    b = BatchBuilder()
    b.append(b"record %04d " % i + b"x" * 200, timestamp_ms=1_700_000_000_000 + i)
    return b.build()


def flip_bit(plog: PartitionLog, batch_index: int = 1) -> int:
    """Flip one bit in the records of the ``batch_index``-th batch of the log's first (sealed)
    segment, in place (as the disk would), and return the offset of that batch."""
    path = Path(plog.directory) / f"{plog.log_start_offset:020d}.log"
    assert plog.active_segment_base > plog.log_start_offset, "the first segment is not sealed"
    with path.open("r+b") as f:
        data = f.read()
        pos = 0
        for _ in range(batch_index):
            (length,) = struct.unpack_from(">i", data, pos + 8)
            pos += 12 + length
        (offset,) = struct.unpack_from(">q", data, pos)
        at = pos + 61 + 2  # past the batch header: inside the records, under the CRC
        f.seek(at)
        f.write(bytes([data[at] ^ 0x10]))
    return int(offset)


def test_a_scrub_finds_a_flipped_bit_in_a_sealed_segment_and_the_leader_resigns(
    tmp_path: Path,
) -> None:
    async def main() -> None:
        broker = Broker(BrokerConfig(data_dir=str(tmp_path / "n"), auto_create_topics=False))
        await broker.start()
        resigned: list[tuple[str, int, int]] = []

        async def resign(topic: str, partition: int, epoch: int) -> bool:
            resigned.append((topic, partition, epoch))
            return True

        try:
            broker.create_topic(T, partitions=1, config=LogConfig(segment_bytes=SEGMENT_BYTES))
            broker.create_topic(
                "alone", partitions=1, config=LogConfig(segment_bytes=SEGMENT_BYTES)
            )
            for i in range(60):
                await broker.produce(T, 0, batch(i))
                await broker.produce("alone", 0, batch(i))
            manager = ReplicaManager(broker, 1, resign=resign)
            broker.replication = manager
            await manager.become_leader(T, 0, epoch=1, replicas=(1, 2), isr=(1, 2))
            # Alone in its ISR: keeps leading, the range unserved.
            await manager.become_leader("alone", 0, epoch=1, replicas=(1,), isr=(1,))
            stats = ClusterStats()
            scrubber = Scrubber(manager, 1 << 20, stats=stats)
            assert scrubber.held() == [("alone", 0), (T, 0)]

            # A clean pass: every sealed byte read, nothing found.
            for _ in range(1000):
                if scrubber.step() < 0:
                    break
            else:
                pytest.fail("a pass did not end")
            plog = broker.log(T, 0)
            alone = broker.log("alone", 0)
            sealed = sum(
                (Path(p.directory) / f"{b:020d}.log").stat().st_size
                for p in (plog, alone)
                for b in p.segment_bases[:-1]
            )
            assert scrubber.bytes_scrubbed == sealed == stats.scrub_bytes
            assert scrubber.damage_found == 0
            assert not plog.damage

            bad = flip_bit(plog)
            flip_bit(alone)
            for _ in range(1000):
                if scrubber.step() < 0:
                    break
            assert scrubber.damage_found == 2 == stats.scrub_damage
            assert [d.start for d in plog.damage] == [bad]
            with pytest.raises(PartitionCorruptError):
                plog.read(bad, 1 << 16)
            await asyncio.sleep(0)  # the resign task runs
            assert resigned == [(T, 0, 1)]  # at once, not at the next lag check
            assert manager.leads("alone", 0)
            # Found again in later passes: counted once.
            for _ in range(1000):
                if scrubber.step() < 0:
                    break
            assert scrubber.damage_found == 2
            await manager.close()
            broker.replication = None
        finally:
            await broker.close()

    asyncio.run(main())


def test_a_scrub_at_rate_0_does_not_start() -> None:
    scrubber = Scrubber(None, 0)  # type: ignore[arg-type]
    scrubber.start()  # no event loop needed: nothing starts
    assert scrubber._task is None


class Node(InProcessNode):
    def __init__(self, tmp: Path, etcd: EtcdServer, node_id: int) -> None:
        super().__init__(tmp, etcd, node_id, cluster_id="scrub")

    @property
    def replicas(self) -> ReplicaManager:
        rep = self.broker.replication
        assert isinstance(rep, ReplicaManager)
        return rep


async def in_sync_topic(nodes: list[Node]) -> Node:
    """Topic T over the three nodes in small segments, 80 records acknowledged by all: its
    leader."""
    cfg = LogConfig(segment_bytes=SEGMENT_BYTES)
    await nodes[0].cluster.create_topic(T, 1, cfg, replication_factor=3)
    await until(lambda: len(leaders(nodes)) == 1, "a leader")
    (leader,) = leaders(nodes)
    for i in range(80):
        await leader.broker.produce(T, 0, batch(i))  # acks=all
    end = leader.broker.log(T, 0).log_end_offset
    await until(lambda: all(n.broker.high_watermark(T, 0) == end for n in nodes), "all in sync")
    return leader


def leaders(nodes: list[Node]) -> list[Node]:
    return [n for n in nodes if n.replicas.leads(T, 0)]


def same_logs(a: PartitionLog, b: PartitionLog) -> bool:
    """Whether ``a`` holds, from its start to its end, the bytes ``b`` holds there."""
    if a.damage or a.log_end_offset != b.log_end_offset:
        return False
    at = a.log_start_offset
    while at < a.log_end_offset:
        x, y = a.read(at, 1 << 16), b.read(at, 1 << 16)
        if x.data != y.data or x.next_offset <= at:
            return False
        at = x.next_offset
    return True


def test_damage_in_a_leaders_sealed_segment_nobody_reads_is_found_and_repaired(
    tmp_path: Path, etcd: EtcdServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Three nodes, their default scrub rate; a bit flipped in the leader's first sealed
    segment while nothing reads it: the scrub finds it, the partition moves to an in-sync
    replica, and the old leader's log is cut there and copied again (the same bytes as the
    new leader's)."""
    monkeypatch.setattr(scrub, "PASS_PAUSE_S", 0.2)

    async def main() -> None:
        async with in_process_cluster(lambda i: Node(tmp_path, etcd, i)) as nodes:
            leader = await in_sync_topic(nodes)
            epoch = leader.replicas.leader_epoch(T, 0)
            plog = leader.broker.log(T, 0)
            flip_bit(plog)
            scrubber = leader.cluster.scrubber
            assert scrubber is not None

            await until(lambda: scrubber.damage_found >= 1, "the scrub found the flipped bit")
            # (The range may be cut and copied again already: what the log's own count says.)
            assert plog.damage_found >= 1
            assert leader.cluster.stats.scrub_damage >= 1
            assert leader.cluster.stats.scrub_bytes > 0
            await until(
                lambda: (
                    [n.replicas.leader_epoch(T, 0) > epoch for n in leaders(nodes)] == [True]
                    and leaders(nodes)[0] is not leader
                ),
                "the lead moved to an in-sync replica",
            )
            (new,) = leaders(nodes)
            await until(
                lambda: same_logs(leader.broker.log(T, 0), new.broker.log(T, 0)),
                "the old leader's log cut at the damage and copied again",
            )

    asyncio.run(main())


def test_damage_in_a_followers_sealed_segment_is_found_and_copied_again(
    tmp_path: Path, etcd: EtcdServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A bit flipped in a follower's first sealed segment, after its start's own check: the
    scrub finds it and the follower cuts its log there and copies the rest again from the
    leader, which keeps leading."""
    monkeypatch.setattr(scrub, "PASS_PAUSE_S", 0.2)

    async def main() -> None:
        async with in_process_cluster(lambda i: Node(tmp_path, etcd, i)) as nodes:
            leader = await in_sync_topic(nodes)
            epoch = leader.replicas.leader_epoch(T, 0)
            follower = next(n for n in nodes if n is not leader)
            plog = follower.broker.log(T, 0)
            flip_bit(plog)
            scrubber = follower.cluster.scrubber
            assert scrubber is not None
            await until(lambda: scrubber.damage_found >= 1, "the scrub found the flipped bit")
            assert follower.cluster.stats.scrub_damage >= 1
            await until(
                lambda: same_logs(follower.broker.log(T, 0), leader.broker.log(T, 0)),
                "the follower's log cut at the damage and copied again",
            )
            assert leaders(nodes) == [leader]
            assert leader.replicas.leader_epoch(T, 0) == epoch

    asyncio.run(main())
