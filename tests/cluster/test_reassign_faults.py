"""Reassignment under faults.

- With three real node processes under load (``tests/cluster/_workload.py``: idempotent
  acks=all producers, min_insync_replicas=2, fsync=always, judged by
  ``check_cluster_history`` over every replica's log), a partition's leader is moved away
  (the others lead it), then moved back while the leader of the moment is SIGKILLed: the
  replica coming back is SIGSTOPped before the move starts, so that the move is surely
  under way at the kill (it cannot catch up). The move then completes once that replica
  resumes (``complete``) or is cancelled and made again (``cancel``); nothing acknowledged
  is lost and every replica ends with the same records.
- A leader whose replica set changes while it goes on leading in the same epoch (a move adds
  or drops replicas) keeps its produces waiting for their replicas, judged by the new ISR:
  they are answered (with their offsets) once the replicas that stay in sync hold them,
  rather than failed for the producer to resend.
"""

from __future__ import annotations

import asyncio
import signal
from pathlib import Path

import pytest

from tests.cluster._etcd import EtcdServer
from tests.cluster._workload import WAIT_S, Cluster, PartitionInfo, Workload
from tests.cluster._workload import until as until_some
from tests.cluster.test_faults import ACKS_PER_ROUND, run_faults
from tests.cluster.test_replication import bounded, cluster, lead, msgs, until
from tidewire.client import AsyncClient
from tidewire.protocol.messages import PartitionReplication

T = "orders"


def test_a_leader_whose_replicas_change_keeps_its_acks_all_waits(tmp_path: Path) -> None:
    """Node 3 stops copying, so an acks=all produce waits for it; node 2 holds the batch and
    stops fetching too. A move then drops node 3 from the ISR and adds a node 4 (not yet in
    sync) in the same epoch: the produce is answered at once from what node 2 was known to
    hold, without another fetch (a leader that forgot its followers' ends, or failed the
    wait, would leave it unanswered or refused)."""

    async def main() -> None:
        async with cluster(tmp_path) as (nodes, _):
            n1, n2, n3 = nodes
            n1.min_insync = 2
            await lead(nodes, n1, 0)
            await n3.rep.stop_replica(T, 0)
            async with AsyncClient(n1.addr, request_timeout_s=60) as c:
                pending = asyncio.ensure_future(c.produce(T, 0, msgs(b"a", b"b")))
                await until(lambda: n2.end() == 2, "node 2 holds the batch")
                # Node 2's fetch of offset 2 reported it holds the batch: then it stops too.
                leader_view = n1.rep.led_states()[(T, 0)]
                await until(lambda: leader_view.followers[2].log_end == 2, "its end seen")
                await n2.rep.stop_replica(T, 0)
                assert not pending.done()  # node 3, in the ISR, lacks it
                await n1.rep.become_leader(
                    T, 0, epoch=0, replicas=(1, 2, 3, 4), isr=(1, 2), min_insync=2
                )
                assert await bounded(pending) == 0
                hw = n1.rep.high_watermark(T, 0)
                assert hw == 2

    asyncio.run(asyncio.wait_for(main(), 120))


def through(cluster: Cluster, avoid: int) -> str:
    """The bootstrap list without node ``avoid`` (stopped, its listener would hang)."""
    return ",".join(cluster.advertised(n) for n in cluster.nodes if n != avoid)


async def move(cluster: Cluster, replicas: list[int], *, avoid: int, cancel: bool = False) -> None:
    """Start moving partition 0 to ``replicas`` (or cancel its move), from a node other
    than ``avoid``."""
    async with AsyncClient(through(cluster, avoid), request_timeout_s=30, connect_timeout_s=5) as c:
        if cancel:
            await c.alter_replication(T, cancel=True, partitions=[0])
        else:
            await c.alter_replication(T, replicas={0: replicas})


async def status(cluster: Cluster, avoid: int) -> PartitionReplication:
    async with AsyncClient(through(cluster, avoid), request_timeout_s=10, connect_timeout_s=5) as c:
        (p,) = [p for p in await c.alter_replication(T) if p.partition == 0]
    return p


async def move_done(cluster: Cluster, replicas: list[int], avoid: int) -> PartitionReplication:
    """Wait until no move of partition 0 is under way and ``replicas`` are its replicas,
    all in sync."""

    async def probe() -> PartitionReplication | None:
        p = await status(cluster, avoid)
        done = not p.target and sorted(p.replicas) == sorted(replicas)
        return p if done and sorted(p.isr) == sorted(replicas) else None

    return await until_some(f"the move to {replicas} done", probe, WAIT_S)


def move_back_killing_the_leader(how: str):  # type: ignore[no-untyped-def]
    """The fault of one round (``how``: "complete" or "cancel", see the module)."""

    async def fault(c: Cluster, p: PartitionInfo, w: Workload) -> None:
        away = p.leader
        others = [n for n in c.nodes if n != away]
        await move(c, others, avoid=away)  # the leader leaves: one of the others leads
        await move_done(c, others, away)
        await w.acked_at_least(ACKS_PER_ROUND)
        now = await status(c, away)
        # Back: ``away`` copies the whole log again (its own was deleted as it left), but
        # stopped it cannot, so the move is under way when the leader is killed.
        c.signal(away, signal.SIGSTOP)
        try:
            await move(c, [*others, away], avoid=away)
            moving = await status(c, away)
            assert moving.target, moving
            c.kill(now.leader)
            await c.new_leader(now.leader, now.leader_epoch)
            c.start(now.leader)
            if how == "cancel":
                await move(c, [], avoid=away, cancel=True)
                await move_done(c, others, away)  # back where the move started
        finally:
            c.signal(away, signal.SIGCONT)
        if how == "cancel":  # made again once ``away`` is live again (it registers anew)

            async def moved() -> bool:
                await move(c, [*others, away], avoid=away)
                return True

            await until_some(f"node {away} back and moving to it", moved, WAIT_S)
        await move_done(c, [*others, away], away)
        await w.acked_at_least(ACKS_PER_ROUND)

    return fault


def scenario(tmp_path: Path, etcd: EtcdServer, how: str, rounds: int) -> None:
    c = Cluster(tmp_path, etcd)
    try:
        asyncio.run(run_faults(c, move_back_killing_the_leader(how), rounds))
    finally:
        c.stop_all()


def test_a_move_under_load_completes_across_a_leader_kill(tmp_path: Path, etcd: EtcdServer) -> None:
    scenario(tmp_path, etcd, "complete", 1)


def test_a_move_under_load_is_cancelled_after_a_leader_kill(
    tmp_path: Path, etcd: EtcdServer
) -> None:
    scenario(tmp_path, etcd, "cancel", 1)


@pytest.mark.slow
def test_moves_under_load_across_leader_kills_5_times(tmp_path: Path, etcd: EtcdServer) -> None:
    scenario(tmp_path, etcd, "complete", 5)


@pytest.mark.slow
def test_moves_cancelled_after_leader_kills_5_times(tmp_path: Path, etcd: EtcdServer) -> None:
    scenario(tmp_path, etcd, "cancel", 5)
