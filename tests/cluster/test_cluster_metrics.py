"""A cluster's metrics and its HTTP status routes, on three in-process nodes (broker, TCP
server, :class:`ClusterNode` with its real replica manager) in one event loop, against the
real etcd of the ``etcd`` fixture: the figures are read as ``/metrics`` exports them and as
``GET /v1/cluster`` and ``GET /v1/cluster/partitions`` answer (the app driven in-process).

A follower stopped makes its partitions under-replicated on their leaders, a topic of one
replica on it offline on the controller; back, it catches up and the leaders take it into
their ISR again. A move held in its first step shows in ``/v1/cluster/reassignments`` and
the move metrics, and is cancelled over HTTP. Every wait is bounded; nothing asserts on how
long something took.

The nodes' audit events stay in their own ``__audit`` here: the cluster's audit topics
(``__audit.<node id>``, made by the first audited request; tests/cluster/test_audit.py)
would add partitions to every figure counted.
"""

from __future__ import annotations

import asyncio
import json
import socket
from contextlib import AbstractAsyncContextManager
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.cli._support import run_cli
from tests.cluster._etcd import EtcdServer
from tests.cluster._inprocess import InProcessNode, in_process_cluster, until
from tests.cluster._secure import secure_cluster
from tidewire.client import AsyncClient, Message
from tidewire.cluster.etcd import EtcdClient, EtcdError
from tidewire.cluster.fetcher import default_connect
from tidewire.cluster.metadata import NO_LEADER, PartitionState
from tidewire.cluster.metrics import ETCD_BUCKETS, ClusterStats, EtcdStats
from tidewire.observability.metrics import metrics_for
from tidewire.server.http.app import create_app
from tidewire.server.http.config import HttpConfig

#: Longer than the in-process default of 3 s: on a loaded 2-core box a 3 s lease has
#: expired under the follower test (its keepalive, every second, late), and the controller
#: (rightly) took the node for gone, moving leaders and ISRs the figures are compared with.
#: A stopped node revokes its lease, so no wait here depends on the session's length.
SESSION_S = 10


class Node(InProcessNode):
    """An in-process node that reads its own metrics and status routes."""

    def __init__(
        self, tmp: Path, etcd: EtcdServer, node_id: int, session_s: int = SESSION_S
    ) -> None:
        super().__init__(tmp, etcd, node_id, cluster_id="metrics", session_s=session_s)

    async def start(self) -> None:
        await super().start()
        if self.broker.audit is not None:
            self.broker.audit.replicate(None)

    def metric(self, name: str, **labels: str) -> float | None:
        """A sample of this node's ``/metrics`` (None: not exported)."""
        return metrics_for(self.broker).registry.get_sample_value(name, labels)

    async def get(self, route: str) -> Any:
        r = await self.request("GET", route)
        assert r.status_code == 200, r.text
        return r.json()

    async def request(self, method: str, route: str, body: object = None) -> httpx.Response:
        app = create_app(self.broker, HttpConfig())
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as c:
            return await c.request(method, route, json=body)


def cluster(tmp: Path, etcd: EtcdServer) -> AbstractAsyncContextManager[list[Node]]:
    return in_process_cluster(lambda i: Node(tmp, etcd, i))


def leader_of(node: Node, topic: str, partition: int) -> int:
    got = node.cluster.cache.partition(topic, partition)
    assert got is not None
    return got[0].leader


def caught_up(nodes: list[Node], topic: str, partitions: int) -> bool:
    """Every leader of ``topic`` exports a lag of 0 for each of its followers."""
    for p in range(partitions):
        (leader,) = [n for n in nodes if n.id == leader_of(n, topic, p)]
        for r in (n.id for n in nodes if n is not leader):
            lag = leader.metric(
                "tidewire_cluster_follower_lag_records",
                topic=topic,
                partition=str(p),
                replica=str(r),
            )
            if lag != 0:
                return False
    return True


def total(nodes: list[Node], name: str) -> float:
    return sum(n.metric(name) or 0.0 for n in nodes if not n.stopped)


def test_metrics_and_status_follow_a_follower_that_goes_and_comes_back(
    tmp_path: Path, etcd: EtcdServer
) -> None:
    async def main() -> None:
        async with cluster(tmp_path, etcd) as nodes:
            one = nodes[0]
            async with AsyncClient(",".join(n.addr for n in nodes)) as client:
                await client.create_topic("t", partitions=3, replication_factor=3)
                await client.create_topic("solo", partitions=1, replication_factor=1)
                for p in range(3):
                    await client.produce("t", p, [Message(b"x" * 100) for _ in range(10)])
            live = [n for n in nodes if not n.stopped]
            await until(lambda: total(live, "tidewire_cluster_partitions_led") == 4, "led")
            await until(lambda: caught_up(nodes, "t", 3), "followers caught up")
            assert total(nodes, "tidewire_cluster_is_controller") == 1
            assert total(nodes, "tidewire_cluster_under_replicated_partitions") == 0
            assert total(nodes, "tidewire_cluster_under_min_isr_partitions") == 0
            (controller,) = [n for n in nodes if n.metric("tidewire_cluster_is_controller") == 1]
            assert controller.metric("tidewire_cluster_offline_partitions") == 0
            others = [n for n in nodes if n is not controller]
            assert all(n.metric("tidewire_cluster_offline_partitions") is None for n in others)
            assert one.metric("tidewire_cluster_nodes_live") == 3
            # The followers fetched the 3 x 1,000 bytes of values (and more: batch headers).
            assert total(nodes, "tidewire_cluster_replica_fetch_requests_total") > 0
            assert total(nodes, "tidewire_cluster_replica_fetch_bytes_total") > 2 * 3_000
            assert (one.metric("tidewire_cluster_etcd_requests_total", op="txn") or 0) > 0
            assert one.metric(
                "tidewire_cluster_etcd_request_duration_seconds_count", op="txn"
            ) == one.metric("tidewire_cluster_etcd_requests_total", op="txn")
            assert one.metric("tidewire_cluster_lease_keepalive_failures_total") == 0

            status = await one.get("/v1/cluster")
            assert status["node_id"] == 1
            assert status["controller"] == controller.id
            assert [(n["node_id"], n["live"], n["port"]) for n in status["nodes"]] == [
                (n.id, True, n.server.port) for n in nodes
            ]
            assert status["partitions"] == {
                "total": 4,
                "offline": 0,
                "under_replicated": 0,
                "under_min_isr": 0,
                "led_here": sum(
                    leader_of(one, t, p) == 1
                    for t, p in (("t", 0), ("t", 1), ("t", 2), ("solo", 0))
                ),
                "led_here_under_replicated": 0,
                "led_here_under_min_isr": 0,
                "reassigning": 0,
            }
            rows = (await one.get("/v1/cluster/partitions?topic=t"))["partitions"]
            assert [(r["partition"], sorted(r["isr"]), r["state"]) for r in rows] == [
                (p, [1, 2, 3], "online") for p in range(3)
            ]
            for r in rows:  # node 1 holds a replica of each: its end is the leader's
                assert r["log_end_offset"] == 10
                if r["leader"] == 1:
                    assert r["high_watermark"] == 10
                    assert r["follower_lag"] == {str(x): 0 for x in (1, 2, 3) if x != 1}
                    assert r["lag"] is None
                else:
                    assert r["follower_lag"] == {}
                    assert r["lag"] == 0

            # A node that is not the controller goes: the partitions it held are
            # under-replicated on their (new) leaders; the one-replica topic it held is
            # offline, on the controller.
            solo = leader_of(one, "solo", 0)
            gone = next(n for n in others if n.id == solo) if solo != controller.id else others[0]
            await gone.stop()
            live = [n for n in nodes if not n.stopped]
            await until(
                lambda: total(live, "tidewire_cluster_under_replicated_partitions") == 3,
                "the 3 partitions of t under-replicated on their leaders",
            )
            assert total(live, "tidewire_cluster_under_min_isr_partitions") == 0  # 2 of 3
            assert total(live, "tidewire_cluster_partitions_led") == 3 + (solo != gone.id)
            offline = 1 if solo == gone.id else 0
            await until(
                lambda: controller.metric("tidewire_cluster_offline_partitions") == offline,
                "offline on the controller",
            )
            # gone led one partition of t: the controller named another leader.
            assert (controller.metric("tidewire_cluster_leader_elections_total") or 0) >= 1
            assert (controller.metric("tidewire_cluster_partitions_offlined_total") or 0) >= offline
            status = await controller.get("/v1/cluster")
            assert {n["node_id"]: n["live"] for n in status["nodes"]} == {
                n.id: n is not gone for n in nodes
            }
            # An offline partition keeps in its ISR who had everything: not under-replicated.
            assert status["partitions"]["under_replicated"] == 3
            assert status["partitions"]["offline"] == offline
            under = await controller.get("/v1/cluster/partitions?state=under_replicated")
            assert {(r["topic"], r["partition"]) for r in under["partitions"]} >= {
                ("t", 0),
                ("t", 1),
                ("t", 2),
            }
            assert all(gone.id not in r["isr"] for r in under["partitions"] if r["topic"] == "t")

            # Back: it catches up, and each leader takes it into its ISR again.
            expands = total(live, "tidewire_cluster_isr_expands_total")
            await gone.start()
            live = [n for n in nodes if not n.stopped]
            await until(
                lambda: total(live, "tidewire_cluster_under_replicated_partitions") == 0,
                "every partition fully in sync again",
            )
            # Each leader counts its expansion when etcd's answer to its proposal reaches it.
            # The nodes' copies of the metadata (the figure just waited for) may get the new
            # ISR from their watch before that answer: on a loaded box the answer came after
            # the whole of the wait above, so the counters are waited for, not read at once.
            await until(
                lambda: total(live, "tidewire_cluster_isr_expands_total") >= expands + 3,
                "each of the 3 leaders counted the expansion etcd took from it",
            )
            await until(
                lambda: controller.metric("tidewire_cluster_offline_partitions") == 0,
                "nothing offline",
            )

    asyncio.run(main())


def test_the_counters_count_what_they_name() -> None:
    st = ClusterStats()
    st.isr_changed((1, 2, 3), (1, 2))
    st.isr_changed((1, 2), (1, 2, 3))
    st.isr_changed((1, 2), (1, 3))  # one out, one in
    st.isr_changed((1, 3), (3, 1))  # the same members (proposed from a view behind etcd's)
    assert (st.isr_shrinks, st.isr_expands) == (2, 2)
    before = PartitionState((1, 2, 3), 1, 0, (1, 2))
    st.controller_wrote(before, PartitionState((1, 2, 3), 1, 0, (1,)))  # ISR only
    st.controller_wrote(before, PartitionState((1, 2, 3), 2, 1, (2,)))  # clean
    st.controller_wrote(before, PartitionState((1, 2, 3), 3, 1, (3,)))  # unclean
    st.controller_wrote(before, PartitionState((1, 2, 3), NO_LEADER, 1, (1, 2)))
    assert (st.leader_elections, st.unclean_elections, st.partitions_offlined) == (2, 1, 1)

    es = EtcdStats()
    es.observe("/v3/kv/range", 0.002, ok=True)
    es.observe("/v3/kv/range", 60.0, ok=False)
    es.observe("/v3/lease/keepalive", 0.0001, ok=True)
    assert es.requests == {"range": 2, "keepalive": 1}
    assert es.errors == {"range": 1}
    h = es.latency["range"]
    assert h.count == 2
    assert h.buckets[ETCD_BUCKETS.index(0.0025)] == 1
    assert h.buckets[-1] == 1  # +Inf


def test_an_etcd_that_does_not_answer_counts_as_errors() -> None:
    async def main() -> None:
        with socket.socket() as s:  # a port nothing listens on
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        async with EtcdClient([f"http://127.0.0.1:{port}"], timeout_s=2) as client:
            for _ in range(2):
                with pytest.raises(EtcdError):
                    await client.get("k")
            assert client.stats.requests == {"range": 2}
            assert client.stats.errors == {"range": 2}

    asyncio.run(main())


def test_a_move_shows_in_the_routes_and_metrics_and_is_cancelled_over_http(
    tmp_path: Path, etcd: EtcdServer
) -> None:
    async def main() -> None:
        async with in_process_cluster(lambda i: Node(tmp_path, etcd, i)) as nodes:
            async with AsyncClient(",".join(n.addr for n in nodes)) as client:
                await client.create_topic("m", partitions=1, replication_factor=1)
                await client.produce("m", 0, [Message(b"x") for _ in range(10)])
            (old,) = [n for n in nodes if n.id == leader_of(nodes[0], "m", 0)]
            new = next(n for n in nodes if n is not old)
            # The new replica cannot reach the leader: the move stays in its first step.
            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                dead = s.getsockname()[1]
            assert new.broker.replication is not None
            new.broker.replication.connect = lambda host, port: default_connect(  # type: ignore[attr-defined]
                "127.0.0.1", dead
            )
            bad = await old.request(
                "POST", "/v1/cluster/reassignments/m", {"replicas": {"0": [99]}}
            )
            assert bad.status_code == 400, bad.text
            assert "not live nodes" in bad.json()["error"]["message"]
            r = await old.request(
                "POST", "/v1/cluster/reassignments/m", {"replicas": {"0": [old.id, new.id]}}
            )
            assert r.status_code == 200, r.text
            assert r.json()["in_progress"] == 1

            async def shown() -> dict[str, Any] | None:
                moves = (await old.get("/v1/cluster/reassignments"))["moves"]
                return moves[0] if moves and len(moves[0]["replicas"]) == 2 else None

            move = None
            for _ in range(600):  # bounded: 30 s at most
                move = await shown()
                if move is not None:
                    break
                await asyncio.sleep(0.05)
            assert move is not None, "the move's first step"
            assert (move["topic"], move["partition"]) == ("m", 0)
            assert (move["target"], move["original"]) == ([old.id, new.id], [old.id])
            assert (move["adding"], move["removing"]) == ([new.id], [])
            assert move["records_left"] == 10  # the leader's whole log
            whole = old.broker.logs.logs["m", 0].size_bytes
            assert move["bytes_left"] == whole
            assert old.metric("tidewire_cluster_reassigning_partitions") == 1
            assert old.metric("tidewire_cluster_reassignment_records_left") == 10
            assert old.metric("tidewire_cluster_reassignment_bytes_left") == whole
            assert (await old.get("/v1/cluster"))["partitions"]["reassigning"] == 1
            other = (await new.get("/v1/cluster/reassignments"))["moves"]
            assert other[0]["records_left"] is None  # known where it is led only
            status = await new.get("/v1/cluster/reassignments/m")
            assert status["partitions"][0]["original"] == [old.id]
            # Cancelled: back on the leader alone; the new replica's log goes.
            r = await new.request("DELETE", "/v1/cluster/reassignments/m?partition=0")
            assert r.status_code == 200, r.text
            doc = r.json()
            assert doc["in_progress"] == 0
            assert doc["partitions"][0]["replicas"] == [old.id]
            await until(lambda: ("m", 0) not in new.broker.logs.logs, "the added log deleted")
            # The leader learns of the cancel (made through the other node) from etcd's
            # watch, in its own time: the added log may be gone before.
            await until(
                lambda: old.metric("tidewire_cluster_reassigning_partitions") == 0,
                "the leader counts no move",
            )
            # Nothing to cancel: every move (none) is fine, a partition named is refused.
            again = await new.request("DELETE", "/v1/cluster/reassignments/m")
            assert again.status_code == 200, again.text
            again = await new.request("DELETE", "/v1/cluster/reassignments/m?partition=0")
            assert again.status_code == 400, again.text
            assert "not being moved" in again.json()["error"]["message"]
            # Every record is still there, on the leader.
            async with AsyncClient(",".join(n.addr for n in nodes)) as client:
                got = await client.fetch("m", 0, 0)
            assert len(got.records) == 10

    asyncio.run(main())


def test_the_cluster_s_figures_are_summed_on_any_node_naming_those_that_do_not_answer(
    tmp_path: Path, etcd: EtcdServer
) -> None:
    """``GET /v1/cluster/metrics`` on one node gives every live node's figures (asked with
    CLUSTER_METRICS) and their sums; ``tidewire cluster status`` shows the totals. A node
    still registered whose listener is gone is named in ``missing_nodes``, left out of the
    totals, and the answer still comes."""

    async def main() -> None:
        async with cluster(tmp_path, etcd) as nodes:
            async with AsyncClient(",".join(n.addr for n in nodes)) as client:
                await client.create_topic("t", partitions=3, replication_factor=3)
                for p in range(3):
                    await client.produce("t", p, [Message(b"x" * 100) for _ in range(10)])
            await until(lambda: total(nodes, "tidewire_cluster_partitions_led") == 3, "led")
            await until(lambda: caught_up(nodes, "t", 3), "followers caught up")
            one, two, three = nodes
            got = await two.get("/v1/cluster/metrics")
            assert got["node_id"] == 2
            assert [n["node_id"] for n in got["nodes"]] == [2, 1, 3]
            assert got["missing_nodes"] == []
            totals = got["totals"]
            assert totals["messages_in"] == 30  # counted by the leaders that appended them
            assert totals["partitions_led"] == 3
            assert totals["under_replicated_partitions"] == 0
            assert totals["nodes_lease_stale"] == 0
            assert totals["offline_partitions"] == 0  # the controller's figure
            by_id = {n["node_id"]: n for n in got["nodes"]}
            for n in nodes:  # each node's own figures, as its /metrics has them
                assert by_id[n.id]["partitions_led"] == n.metric("tidewire_cluster_partitions_led")
                assert by_id[n.id]["bytes_in"] > 0  # the leaders' appends, the replicas' copies
            assert sum(n["controller"] for n in got["nodes"]) == 1
            # The CLI's status shows the totals (asked of node 1 over the binary protocol).
            out = await asyncio.to_thread(
                run_cli, ["cluster", "status", "--json", "--addr", one.addr]
            )
            assert out.exit_code == 0, out.output
            shown = json.loads(out.stdout)["metrics"]
            assert shown["totals"]["messages_in"] == 30
            assert shown["missing_nodes"] == []
            text = await asyncio.to_thread(run_cli, ["cluster", "status", "--addr", one.addr])
            assert "totals over 3 nodes: messages in 30" in text.stdout, text.output
            # Node 3's listener goes; it stays registered (its lease kept): not answering.
            await three.server.close()
            got = await one.get("/v1/cluster/metrics")
            assert got["missing_nodes"] == [3]
            assert [n["node_id"] for n in got["nodes"]] == [1, 2]
            led = sum(by_id[i]["partitions_led"] for i in (1, 2))
            assert got["totals"]["partitions_led"] == led

    asyncio.run(main())


def test_a_secured_cluster_s_figures_are_asked_as_the_node_principal(
    tmp_path: Path, etcd: EtcdServer
) -> None:
    """With authorization on, the node asked reaches the others as the node principal (which
    has only ``cluster_action`` on the cluster here): every node answers; a caller without
    credentials is refused at the entry node."""

    async def main() -> None:
        async with secure_cluster(tmp_path, etcd, "sec-metrics") as c:
            async with c.nodes[1].http(c.admin) as h:
                r = await h.get("/v1/cluster/metrics")
            assert r.status_code == 200, r.text
            got = r.json()
            assert got["missing_nodes"] == []
            assert sorted(n["node_id"] for n in got["nodes"]) == [1, 2, 3]
            async with c.nodes[1].http(None) as h:
                r = await h.get("/v1/cluster/metrics")
            assert r.status_code == 401, r.text

    asyncio.run(main())
