"""etcd out of reach for longer than the nodes' session timeout, under load (three real
``tidewire serve --cluster`` processes, RF=3, min_insync_replicas=2, acks=all,
fsync=always, idempotent producers and a consumer, judged by ``check_cluster_history``):

- etcd's member SIGKILLed and started again only once every node has seen its lease pass its
  TTL unanswered: acknowledgements go on during the outage from the current leader, which
  keeps leading; once etcd is back the nodes' leases are alive again (a new raft leader gives
  every lease a full TTL), no node re-registers, leadership never changed, and the replicas
  agree with nothing acknowledged lost;
- etcd's member SIGSTOPped as long, then resumed: acknowledgements go on during the pause
  alike; as it resumes, etcd expires every lease at once (its clock jumped), so the nodes
  register again and the controller gives the partition a leader: nothing acknowledged is
  lost and the replicas agree.

First the lease itself (:class:`~tidewire.cluster.etcd.Lease`) against a real etcd: past its
TTL with etcd not answering it is ``stale``, not ``lost``; renewed once a restarted etcd
answers; ``lost`` once a paused etcd resumes and says it expired.

The default tier runs each once; ``-m slow`` runs five outages in a row, each longer.
"""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.cluster._etcd import EtcdServer
from tests.cluster._inprocess import InProcessNode, in_process_cluster
from tests.cluster._workload import WAIT_S, Cluster, PartitionInfo, Workload, until
from tests.cluster.test_faults import ETCD_DOWN_ACKS, run_faults
from tidewire.cluster.etcd import EtcdClient, Lease
from tidewire.observability.metrics import metrics_for

#: What a node logs when its lease is past its TTL and etcd does not answer (cluster/etcd.py).
STALE = "is past its TTL"
#: And when it learns its lease is lost (cluster/node.py): it must not, after a kill of etcd.
LOST = "lost its etcd lease"
#: And when a renewal is answered again (cluster/etcd.py), and when it registered again.
RENEWED = "renewed again"
REGISTERED = "registered again"
#: The nodes' session timeout in these tests (s).
SESSION_S = 2


async def bounded_until(what: str, check: Callable[[], bool]) -> None:
    async def probe() -> bool | None:
        return True if check() else None

    await until(what, probe, WAIT_S)


def test_a_lease_past_its_ttl_with_etcd_killed_is_stale_then_renewed(etcd: EtcdServer) -> None:
    async def main() -> None:
        async with EtcdClient([etcd.endpoint], timeout_s=1) as c:
            lease = Lease(c, ttl_s=2)
            await lease.start()
            await c.put("node/1", b"up", lease=lease.id)
            etcd.stop(signal.SIGKILL)
            try:
                await bounded_until("the lease stale", lease.stale.is_set)
                assert not lease.lost.is_set()
            finally:
                await asyncio.to_thread(etcd.start)
            # Restarted, etcd gives the lease a full TTL again: renewed, its key kept.
            await bounded_until("the lease renewed", lambda: not lease.stale.is_set())
            assert not lease.lost.is_set()
            assert await c.get("node/1") is not None
            await lease.close()

    asyncio.run(main())


def test_a_lease_past_its_ttl_with_etcd_paused_is_lost_once_etcd_says_so(
    etcd: EtcdServer,
) -> None:
    async def main() -> None:
        async with EtcdClient([etcd.endpoint], timeout_s=1) as c:
            lease = Lease(c, ttl_s=2)
            await lease.start()
            proc = etcd.proc
            assert proc is not None
            proc.send_signal(signal.SIGSTOP)
            try:
                await bounded_until("the lease stale", lease.stale.is_set)
                assert not lease.lost.is_set()
            finally:
                proc.send_signal(signal.SIGCONT)
            # Resumed, etcd expires the lease (its clock jumped past the TTL) and says so.
            await bounded_until("the lease lost", lease.lost.is_set)
            assert not lease.stale.is_set()
            await lease.close()

    asyncio.run(main())


async def etcd_answers(etcd: EtcdServer) -> None:
    """Wait until etcd, started again, answers a read (bounded)."""

    async def probe() -> bool | None:
        proc = etcd.proc
        assert proc is not None
        assert proc.poll() is None, f"etcd exited ({proc.returncode}): {etcd.log_tail()}"
        async with EtcdClient([etcd.endpoint], timeout_s=1) as c:
            await c.get("probe")
        return True

    await until("etcd answers again", probe, WAIT_S)


def count(cluster: Cluster, n: int, what: str) -> int:
    return (cluster.root / f"node{n}.log").read_text(errors="replace").count(what)


async def every_node_stale(cluster: Cluster, before: dict[int, int]) -> None:
    """Wait until every node has logged its lease past its TTL (once more than ``before``):
    the outage has outlasted the session timeout as each node sees it."""

    async def probe() -> bool | None:
        stale = all(count(cluster, n, STALE) > before[n] for n in cluster.nodes)
        return True if stale else None

    await until("every node's lease past its TTL", probe, WAIT_S)


def make_outage(how: str, extra_acks: int = 0):  # type: ignore[no-untyped-def]
    """A fault: etcd out (``how``: "kill" or "stop") until every node's lease is past its
    TTL and ``ETCD_DOWN_ACKS + extra_acks`` more sends are acknowledged, then back."""

    async def outage(cluster: Cluster, p: PartitionInfo, w: Workload) -> None:
        before = {n: count(cluster, n, STALE) for n in cluster.nodes}
        lost_before = {n: count(cluster, n, LOST) for n in cluster.nodes}
        proc = cluster.etcd.proc
        assert proc is not None
        if how == "kill":
            cluster.etcd.stop(signal.SIGKILL)
        else:
            proc.send_signal(signal.SIGSTOP)
        try:
            await every_node_stale(cluster, before)
            # Past the session: the leader acknowledges still (its ISR is intact).
            await w.acked_at_least(ETCD_DOWN_ACKS + extra_acks)
            for n in cluster.nodes:  # nobody gave up its roles
                assert count(cluster, n, LOST) == lost_before[n], cluster.log_tail(n)
        finally:
            if how == "kill":
                await asyncio.to_thread(cluster.etcd.start)
                await etcd_answers(cluster.etcd)
            else:
                proc.send_signal(signal.SIGCONT)
        # Every node learns that etcd is back: its lease renewed (etcd restarted kept it), or
        # lost and registered again (etcd paused expired it as it resumed).
        back, seen = (RENEWED, STALE) if how == "kill" else (REGISTERED, LOST)

        async def all_back() -> bool | None:
            done = all(count(cluster, n, back) >= count(cluster, n, seen) for n in cluster.nodes)
            return True if done else None

        await until("every node back with etcd", all_back, WAIT_S)
        after = await w.settled()
        if how == "kill":
            # The leases survived etcd's restart: nothing changed leadership, nobody
            # registered again.
            assert (after.leader, after.leader_epoch) == (p.leader, p.leader_epoch), after
            for n in cluster.nodes:
                assert count(cluster, n, LOST) == lost_before[n], cluster.log_tail(n)

    return outage


def scenario(tmp_path: Path, etcd: EtcdServer, how: str, rounds: int, extra: int = 0) -> None:
    cluster = Cluster(tmp_path, etcd, session_s=SESSION_S)
    try:
        asyncio.run(run_faults(cluster, make_outage(how, extra), rounds))
    finally:
        cluster.stop_all()


def test_etcd_killed_past_the_session_under_load(tmp_path: Path, etcd: EtcdServer) -> None:
    scenario(tmp_path, etcd, "kill", 1)


def test_etcd_paused_past_the_session_under_load(tmp_path: Path, etcd: EtcdServer) -> None:
    scenario(tmp_path, etcd, "stop", 1)


@pytest.mark.slow
def test_etcd_killed_past_the_session_5_times(tmp_path: Path, etcd: EtcdServer) -> None:
    scenario(tmp_path, etcd, "kill", 5, extra=100)


@pytest.mark.slow
def test_etcd_paused_past_the_session_5_times(tmp_path: Path, etcd: EtcdServer) -> None:
    scenario(tmp_path, etcd, "stop", 5, extra=100)


def test_a_stale_lease_is_exported_as_a_gauge_and_its_periods_counted(
    tmp_path: Path, etcd: EtcdServer
) -> None:
    """A node's ``/metrics``: ``tidewire_cluster_lease_stale`` is 1 while its lease is past
    its TTL with etcd killed, 0 again once the restarted etcd renews it; the stale period is
    counted once (``tidewire_cluster_lease_stale_periods_total``)."""

    async def main() -> None:
        def make(i: int) -> InProcessNode:
            return InProcessNode(tmp_path, etcd, i, cluster_id="stale", session_s=SESSION_S)

        async with in_process_cluster(make, 1) as (node,):

            def sample(name: str) -> float | None:
                return metrics_for(node.broker).registry.get_sample_value(name)

            assert sample("tidewire_cluster_lease_stale") == 0
            assert sample("tidewire_cluster_lease_stale_periods_total") == 0
            etcd.stop(signal.SIGKILL)
            try:
                await bounded_until(
                    "the stale lease exported", lambda: sample("tidewire_cluster_lease_stale") == 1
                )
                assert sample("tidewire_cluster_lease_stale_periods_total") == 1
            finally:
                await asyncio.to_thread(etcd.start)
            await etcd_answers(etcd)
            await bounded_until(
                "the renewed lease exported", lambda: sample("tidewire_cluster_lease_stale") == 0
            )
            assert sample("tidewire_cluster_lease_stale_periods_total") == 1
            assert not node.cluster.lease.lost.is_set()

    asyncio.run(main())
