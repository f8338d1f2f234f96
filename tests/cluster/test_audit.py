"""The audit log of a cluster (:mod:`tidewire.cluster.audit`): each node's events in its own
replicated topic ``__audit.<node id>``, the cluster's audit log read from any node.

Four in-process nodes against the real etcd of the ``etcd`` fixture (four, so that each
node's audit log, on three of them, is missing from one node, which then asks another for
it): an audited action on one node is read on every other, with its node id; the node whose
log it is stopped, its events are still read (from its followers); back, it leads its log
again and its new events are read too. A node gone for good is taken off ``__security``
and the audit logs (a live node holds the copy instead). Every wait is bounded; nothing
asserts on durations.
"""

from __future__ import annotations

import asyncio
import json
from contextlib import AbstractAsyncContextManager
from pathlib import Path

from tests.cli._support import run_cli
from tests.cluster._etcd import EtcdServer
from tests.cluster._inprocess import InProcessNode, in_process_cluster, until
from tests.cluster._nodes import call
from tests.cluster._workload import Cluster
from tidewire.client import AsyncClient
from tidewire.cluster.audit import placement
from tidewire.protocol.messages import (
    ApiKey,
    AuditEventBody,
    DescribeAuditRequest,
    MetadataRequest,
    MetadataResponse,
)
from tidewire.security._logs import SECURITY_TOPIC, audit_topic
from tidewire.security.model import Operation, ResourceType
from tidewire.server.needs import API_NEEDS, Need

#: Longer than the default: a lease that expires under a loaded test is not what is tested.
SESSION_S = 10
#: Bound of a wait for an event to be read (generous: the box is a loaded 2-core one).
READ_WAIT_S = 60.0


class Node(InProcessNode):
    def __init__(self, tmp: Path, etcd: EtcdServer, node_id: int) -> None:
        super().__init__(tmp, etcd, node_id, cluster_id="audit", session_s=SESSION_S)


def cluster(tmp: Path, etcd: EtcdServer, n: int) -> AbstractAsyncContextManager[list[Node]]:
    return in_process_cluster(lambda i: Node(tmp, etcd, i), n)


async def _events(addr: str, resource: str) -> list[AuditEventBody]:
    async with AsyncClient(addr) as client:
        return [
            e for e in await client.describe_audit(action="CREATE_TOPIC") if e.resource == resource
        ]


async def _read_on(addr: str, resource: str, node_id: int, what: str) -> None:
    """Until the cluster's audit log, asked of ``addr``, holds node ``node_id``'s event."""
    found: list[AuditEventBody] = []

    async def check() -> bool:
        found[:] = await _events(addr, resource)
        return any(e.node_id == node_id for e in found)

    loop = asyncio.get_running_loop()
    deadline = loop.time() + READ_WAIT_S
    while not await check():
        assert loop.time() < deadline, f"not within {READ_WAIT_S:.0f} s: {what} (found {found})"
        await asyncio.sleep(0.1)


def test_every_node_reads_every_nodes_audit_events_and_they_outlive_their_node(
    tmp_path: Path, etcd: EtcdServer
) -> None:
    async def main() -> None:
        async with cluster(tmp_path, etcd, 4) as nodes:
            by_id = {n.id: n for n in nodes}
            async with AsyncClient(by_id[4].addr) as client:
                await client.create_topic("made-on-4", 1, replication_factor=1)
            topic4 = audit_topic(4)
            await until(
                lambda: all(topic4 in n.cluster.cache.topics for n in nodes), "__audit.4 made"
            )
            got = nodes[0].cluster.cache.partition(topic4, 0)
            assert got is not None
            state = got[0]
            assert state.leader == 4
            assert len(state.replicas) == 3
            (lacking,) = [n for n in by_id if n not in state.replicas]
            # Read on every node: on those holding a copy, and on the one that asks another.
            for n in nodes:
                await _read_on(n.addr, "topic:made-on-4", 4, f"node 4's event on node {n.id}")
            assert (topic4, 0) not in by_id[lacking].broker.logs.logs
            # Each event once, with its node, although three nodes hold it.
            (event,) = await _events(by_id[lacking].addr, "topic:made-on-4")
            assert event.node_id == 4
            # The CLI shows it too, with its node.
            r = await asyncio.to_thread(
                run_cli,
                ["audit", "--action", "CREATE_TOPIC", "--json", "--addr", by_id[lacking].addr],
            )
            assert r.exit_code == 0, r.output
            assert [
                e["node_id"] for e in json.loads(r.stdout) if e["resource"] == "topic:made-on-4"
            ] == [4]
            # Every follower holds it before node 4 goes.
            await until(
                lambda: all(
                    (plog := by_id[r].broker.logs.logs.get((topic4, 0))) is not None
                    and plog.log_end_offset >= 1
                    for r in state.replicas
                ),
                "node 4's audit log copied",
            )
            await by_id[4].stop()
            await until(
                lambda: all(
                    (g := n.cluster.cache.partition(topic4, 0)) is not None
                    and g[0].leader not in (4, -1)
                    for n in nodes
                    if n.id != 4
                ),
                "__audit.4 led by another replica",
            )
            for n in nodes:
                if n.id != 4:
                    await _read_on(n.addr, "topic:made-on-4", 4, f"node 4 gone, on {n.id}")
            # Back: it leads its own log again (handed back) and writes there.
            await by_id[4].start()
            await until(
                lambda: (
                    (g := nodes[0].cluster.cache.partition(topic4, 0)) is not None
                    and g[0].leader == 4
                ),
                "__audit.4 led by node 4 again",
            )
            async with AsyncClient(by_id[4].addr) as client:
                await client.create_topic("made-on-4-again", 1, replication_factor=1)
            await _read_on(by_id[1].addr, "topic:made-on-4-again", 4, "node 4's new event")
            await _read_on(by_id[1].addr, "topic:made-on-4", 4, "node 4's first event")

    asyncio.run(main())


def test_a_node_that_joins_later_gets_a_copy_of_the_audit_log_of_a_lone_node(
    tmp_path: Path, etcd: EtcdServer
) -> None:
    """A node alone in its cluster makes its audit log with one replica; once others join,
    its leader moves it onto them (up to three)."""

    async def main() -> None:
        async with cluster(tmp_path, etcd, 1) as (first,):
            async with AsyncClient(first.addr) as client:
                await client.create_topic("alone", 1, replication_factor=1)
            topic1 = audit_topic(1)
            await until(lambda: topic1 in first.cluster.cache.topics, "__audit.1 made")
            got = first.cluster.cache.partition(topic1, 0)
            assert got is not None
            assert got[0].replicas == (1,)
            second = Node(tmp_path, etcd, 2)
            try:
                await second.start()
                await until(
                    lambda: (
                        (g := first.cluster.cache.partition(topic1, 0)) is not None
                        and set(g[0].replicas) == {1, 2}
                        and set(g[0].isr) == {1, 2}
                    ),
                    "__audit.1 on both nodes",
                )
                await until(
                    lambda: (
                        (p := second.broker.logs.logs.get((topic1, 0))) is not None
                        and p.log_end_offset >= 1
                    ),
                    "node 2's copy of node 1's audit log",
                )
            finally:
                await second.stop()

    asyncio.run(main())


def test_the_replicas_of_a_node_gone_for_good_move_to_live_nodes(
    tmp_path: Path, etcd: EtcdServer
) -> None:
    """A node gone longer than ``DEAD_NODE_S`` (shortened here) is taken off ``__security``
    and the audit logs by their leaders; an audit log gets a live node instead, so it keeps
    three copies. Back, the node is moved onto ``__security`` again."""

    async def main() -> None:
        async with cluster(tmp_path, etcd, 4) as nodes:
            by_id = {n.id: n for n in nodes}
            for n in nodes:
                n.cluster.dead_replicas.after_s = 1.0
            async with AsyncClient(by_id[4].addr) as client:
                await client.create_topic("made-on-4", 1, replication_factor=1)
            async with AsyncClient(by_id[1].addr) as client:  # __security, led by node 1
                await client.create_principal("someone")
            topic4 = audit_topic(4)

            def replicas(name: str) -> set[int] | None:
                cache = by_id[1].cluster.cache
                got = cache.partition(name, 0)
                if got is None or (name, 0) in cache.reassignments:
                    return None
                return set(got[0].replicas) if set(got[0].isr) == set(got[0].replicas) else None

            await until(lambda: replicas(topic4) is not None, "__audit.4 in sync")
            held = replicas(topic4)
            assert held is not None
            assert len(held) == 3
            await until(lambda: replicas(SECURITY_TOPIC) == {1, 2, 3, 4}, "__security on all")
            gone = next(r for r in sorted(held) if r not in (1, 4))  # neither leader
            (spare,) = {1, 2, 3, 4} - held
            await by_id[gone].stop()
            await until(
                lambda: replicas(topic4) == (held - {gone}) | {spare},
                f"__audit.4 moved off node {gone} onto node {spare}",
            )
            await until(
                lambda: replicas(SECURITY_TOPIC) == {1, 2, 3, 4} - {gone},
                f"__security moved off node {gone}",
            )
            # node 4's events are on the new copy too.
            await until(
                lambda: (
                    (p := by_id[spare].broker.logs.logs.get((topic4, 0))) is not None
                    and p.log_end_offset >= 1
                ),
                "the new copy of __audit.4 caught up",
            )
            await by_id[gone].start()
            await until(
                lambda: replicas(SECURITY_TOPIC) == {1, 2, 3, 4}, "__security on node {gone} again"
            )

    asyncio.run(main())


def test_an_audit_log_is_placed_on_its_owner_and_three_live_nodes() -> None:
    live = [1, 2, 3, 4]
    assert placement(4, (4, 1, 2), live, set()) == (4, 1, 2)  # nothing to change
    assert placement(4, (4, 1, 2), [1, 3, 4], {2}) == (4, 1, 3)  # a dead one replaced
    assert placement(2, (1, 3, 4), live, set()) == (2, 1, 3, 4)  # its owner back, first
    assert placement(4, (4,), live, set()) == (4, 1, 2)  # topped up to three
    assert placement(4, (4, 1), [4, 1], set()) == (4, 1)  # as many as there are live nodes
    # A gone owner stays a replica until it is dead; then three live nodes hold its log.
    assert placement(4, (4, 1, 2), [1, 2, 3], set()) == (4, 1, 2)
    assert placement(4, (4, 1, 2), [1, 2, 3], {4}) == (1, 2, 3)


def test_reading_another_nodes_audit_log_needs_the_nodes_identity_only() -> None:
    """What a node asks of another (``DESCRIBE_AUDIT`` with ``nodes``) needs
    ``cluster_action`` on the cluster, as replica fetches do; a client's query ``admin``."""
    need = API_NEEDS[ApiKey.DESCRIBE_AUDIT]
    assert callable(need)
    assert need(DescribeAuditRequest(nodes=[4])) == [
        Need(ResourceType.CLUSTER, Operation.CLUSTER_ACTION)
    ]
    assert need(DescribeAuditRequest()) == [Need(ResourceType.CLUSTER, Operation.ADMIN)]


def test_a_killed_nodes_audit_events_are_read_on_the_others(
    tmp_path: Path, etcd: EtcdServer
) -> None:
    """Three real ``tidewire serve --cluster`` processes: an audited action on node 2 is
    read on node 1; once nodes 1 and 3 hold their copies of it (asked directly, for their
    own replicas: an event not copied yet dies with its node), node 2 is SIGKILLed, and its
    event is still read on nodes 1 and 3."""
    procs = Cluster(tmp_path, etcd, session_s=SESSION_S)

    async def main() -> None:
        for n in procs.nodes:
            procs.start(n)
        await _registered(procs.addr(1), 3)
        async with AsyncClient(procs.addr(2)) as client:
            await client.create_topic("made-on-2", 1, replication_factor=1)
        await _read_on(procs.addr(1), "topic:made-on-2", 2, "node 2's event on node 1")
        for n in (1, 3):  # each holds its own copy of __audit.2 (3 nodes, 3 copies)
            await _held_on(procs.addr(n), "topic:made-on-2", 2)
        procs.kill(2)
        for n in (1, 3):
            await _read_on(procs.addr(n), "topic:made-on-2", 2, f"node 2 killed, on node {n}")
            await _held_on(procs.addr(n), "topic:made-on-2", 2)

    try:
        asyncio.run(main())
    finally:
        procs.stop_all()


async def _held_on(addr: str, resource: str, owner: int) -> None:
    """Until the node at ``addr`` holds node ``owner``'s event in its own copy of its audit
    log (DESCRIBE_AUDIT with ``nodes``: that node's replica only, asked of no other)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + READ_WAIT_S
    while True:
        got = await call(addr, DescribeAuditRequest(action="CREATE_TOPIC", nodes=[owner]))
        events = getattr(got, "events", [])
        if any(e.resource == resource and e.node_id == owner for e in events):
            return
        assert loop.time() < deadline, f"not within {READ_WAIT_S:.0f} s: {addr} holds it"
        await asyncio.sleep(0.1)


async def _registered(addr: str, n: int) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 30.0
    while True:
        meta = await call(addr, MetadataRequest(topics=[]))
        if isinstance(meta, MetadataResponse) and len(meta.nodes) == n:
            return
        assert loop.time() < deadline, f"not within 30 s: {n} nodes registered"
        await asyncio.sleep(0.1)
