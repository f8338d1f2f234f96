"""Metadata in etcd and the controller, against a real etcd: nodes on leases, topics created
once, partitions that follow their leader's node, an offline partition that comes back with
the node that had everything, unclean election only where enabled, and a deposed controller
whose writes are refused."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

import pytest

from tests.cluster._etcd import EtcdServer
from tidewire.cluster.controller import Controller, assign, elect
from tidewire.cluster.etcd import EtcdClient, EtcdError, KeyValue, Lease, WatchEvent
from tidewire.cluster.lost_tail import LostTail
from tidewire.cluster.metadata import (
    NO_LEADER,
    Fence,
    MetadataCache,
    MetadataStore,
    NodeInfo,
    PartitionState,
    TopicInfo,
)

WAIT_S = 20.0


def test_assign_spreads_leaders_and_needs_enough_nodes() -> None:
    sets = assign(6, 3, [3, 1, 2])
    assert sets[:3] == [[1, 2, 3], [2, 3, 1], [3, 1, 2]]
    assert [s[0] for s in sets] == [1, 2, 3, 1, 2, 3]
    assert all(len(set(s)) == 3 for s in sets)
    with pytest.raises(ValueError, match="replication factor 3 needs as many live nodes; 2 are"):
        assign(1, 3, [1, 2])


def test_elect_follows_kafkas_rules() -> None:
    s = PartitionState((1, 2, 3), 1, 4, (1, 2, 3))
    assert elect(s, {1, 2, 3}, unclean=False) is None
    assert elect(s, {1, 2}, unclean=False) == PartitionState((1, 2, 3), 1, 4, (1, 2))
    assert elect(s, {2, 3}, unclean=False) == PartitionState((1, 2, 3), 2, 5, (2, 3))
    behind = PartitionState((1, 2, 3), 1, 4, (1,))  # 2 and 3 lag behind
    offline = elect(behind, {2, 3}, unclean=False)
    assert offline == PartitionState((1, 2, 3), NO_LEADER, 5, (1,))
    assert elect(offline, {2, 3}, unclean=False) is None  # stays offline
    assert elect(offline, {1, 2, 3}, unclean=False) == PartitionState((1, 2, 3), 1, 6, (1,))
    assert elect(behind, {2, 3}, unclean=True) == PartitionState((1, 2, 3), 2, 5, (2,))


class _Node:
    def __init__(self, etcd: EtcdClient, store: MetadataStore, node_id: int) -> None:
        self.id = node_id
        self.lease = Lease(etcd, ttl_s=2)
        self.cache = MetadataCache(store, retry_s=0.1)
        self.controller = Controller(store, self.cache, node_id, self.lease)
        self.store = store

    async def start(self) -> None:
        await self.lease.start()
        await self.store.register(NodeInfo(self.id, "127.0.0.1", 9000 + self.id), self.lease.id)
        await self.cache.load()
        self.cache.start()
        self.controller.start()

    async def stop(self, *, revoke: bool = True) -> None:
        await self.controller.close()
        await self.cache.close()
        await self.lease.close(revoke=revoke)


@asynccontextmanager
async def cluster(
    etcd: EtcdServer, n: int
) -> AsyncIterator[tuple[EtcdClient, MetadataStore, list[_Node]]]:
    async with EtcdClient([etcd.endpoint], timeout_s=5) as c:
        store = MetadataStore(c, "test")
        nodes = [_Node(c, store, i) for i in range(1, n + 1)]
        for node in nodes:
            await node.start()
        # Each copy read the store when its node started: the nodes after it reach it
        # through its watch.
        for node in nodes:
            await node.cache.wait_for(lambda cache=node.cache: len(cache.nodes) == n, WAIT_S)
        try:
            yield c, store, nodes
        finally:
            for node in nodes:
                await node.stop()


def test_elect_never_names_a_replica_that_may_have_lost_its_tail_while_another_can_lead() -> None:
    """A lost-tail mark (the node restarted after an unclean shutdown under fsync=interval):
    another live in-sync replica leads first; with none, the partition stays offline unless
    unclean election is on, which then prefers an unmarked replica, else the marked one
    holding the most."""
    lost1 = {1: LostTail(end=40, topic_id="", revision=10)}
    s = PartitionState((1, 2, 3), NO_LEADER, 5, (1, 2))
    # Node 2 (in sync, unmarked) leads, though node 1 comes first.
    assert elect(s, {1, 2, 3}, unclean=False, lost=lost1, version=20) == PartitionState(
        (1, 2, 3), 2, 6, (1, 2)
    )
    # The last in-sync replica is the marked one: offline (its ISR kept), node 3 out of it.
    last = PartitionState((1, 2, 3), NO_LEADER, 5, (1,))
    assert elect(last, {1, 2, 3}, unclean=False, lost=lost1, version=20) is None
    assert elect(last, {1, 2, 3}, unclean=False, version=20) == PartitionState(
        (1, 2, 3), 1, 6, (1,)
    )  # unmarked: it had everything, it leads
    # Unclean: an unmarked live replica first; else the marked one holding the most.
    assert elect(last, {1, 3}, unclean=True, lost=lost1, version=20) == PartitionState(
        (1, 2, 3), 3, 6, (3,)
    )
    both = {1: LostTail(40, "", 10), 3: LostTail(55, "", 11)}
    assert elect(last, {1, 3}, unclean=True, lost=both, version=20) == PartitionState(
        (1, 2, 3), 3, 6, (3,)
    )
    # A leader marked after it was named (restarted within its session) is replaced...
    led = PartitionState((1, 2, 3), 1, 5, (1, 2, 3))
    assert elect(led, {1, 2, 3}, unclean=False, lost=lost1, version=9) == PartitionState(
        (1, 2, 3), 2, 6, (1, 2, 3)
    )
    # ... and one named after the mark (knowingly) stays.
    assert elect(led, {1, 2, 3}, unclean=False, lost=lost1, version=11) is None
    alone = PartitionState((1, 2, 3), 1, 5, (1,))
    assert elect(alone, {1, 2, 3}, unclean=False, lost=lost1, version=9) == PartitionState(
        (1, 2, 3), NO_LEADER, 6, (1,)
    )


def test_a_node_id_is_registered_once(etcd: EtcdServer) -> None:
    async def main() -> None:
        async with EtcdClient([etcd.endpoint], timeout_s=5) as c:
            store = MetadataStore(c, "test")
            a, b = Lease(c, ttl_s=5), Lease(c, ttl_s=5)
            await a.start()
            await b.start()
            await store.register(NodeInfo(1, "h", 1), a.id)
            await store.register(NodeInfo(1, "h", 2), a.id)  # the same node again: fine
            with pytest.raises(EtcdError, match="node id 1 is registered already by a live node"):
                await store.register(NodeInfo(1, "other", 1), b.id)
            await a.close()
            await store.register(NodeInfo(1, "other", 1), b.id)  # gone: free again
            await b.close()

    asyncio.run(main())


def test_topics_are_created_once_and_every_cache_sees_them(etcd: EtcdServer) -> None:
    async def main() -> None:
        async with cluster(etcd, 3) as (_, store, nodes):
            live = list(nodes[0].cache.nodes)
            assert sorted(live) == [1, 2, 3]
            topic = TopicInfo("orders", 3, 3)
            assert await store.create_topic(topic, assign(3, 3, live), None)
            assert not await store.create_topic(TopicInfo("orders", 1, 1), [[1]], None)
            for node in nodes:
                await node.cache.wait_for(lambda n=node: len(n.cache.partitions()) == 3, WAIT_S)
                assert node.cache.topics["orders"] == topic
                state, _ = node.cache.partition("orders", 1)  # type: ignore[misc]
                assert state == PartitionState((2, 3, 1), 2, 0, (2, 3, 1))
            assert await store.delete_topic("orders", None)
            await nodes[0].cache.wait_for(lambda: not nodes[0].cache.partitions(), WAIT_S)

    asyncio.run(main())


def test_leadership_follows_the_nodes_and_returns_with_the_one_that_had_everything(
    etcd: EtcdServer,
) -> None:
    async def main() -> None:
        async with cluster(etcd, 3) as (_, store, nodes):
            await asyncio.wait_for(nodes[0].controller.leading.wait(), WAIT_S)
            assert not nodes[1].controller.leading.is_set()
            await store.create_topic(TopicInfo("t", 3, 2), assign(3, 2, [1, 2, 3]), None)
            cache = nodes[0].cache

            def state(p: int) -> PartitionState:
                got = cache.partition("t", p)
                assert got is not None
                return got[0]

            await cache.wait_for(lambda: len(cache.partitions()) == 3, WAIT_S)
            assert [state(p).leader for p in range(3)] == [1, 2, 3]
            # Node 2 goes (its lease revoked): its partition moves to its in-sync follower,
            # and it leaves the ISR of the partition it followed.
            await nodes[1].stop()
            await cache.wait_for(lambda: state(1).leader == 3 and 2 not in state(0).isr, WAIT_S)
            assert state(1) == PartitionState((2, 3), 3, 1, (3,))
            assert state(0) == PartitionState((1, 2), 1, 0, (1,))
            # Node 3 goes too: partition 1's only in-sync replica is gone: offline.
            await nodes[2].stop()
            await cache.wait_for(
                lambda: state(1).leader == NO_LEADER and state(2).leader == 1, WAIT_S
            )
            assert state(1) == PartitionState((2, 3), NO_LEADER, 2, (3,))
            assert state(2) == PartitionState((3, 1), 1, 1, (1,))
            # Node 2 returns: it lacks what 3 had, so partition 1 stays offline; 3 returns: leads.
            n2, n3 = _Node(store.etcd, store, 2), _Node(store.etcd, store, 3)
            await n2.start()
            await cache.wait_for(lambda: 2 in cache.nodes, WAIT_S)
            await asyncio.sleep(0.5)
            assert state(1).leader == NO_LEADER
            await n3.start()
            await cache.wait_for(lambda: state(1).leader == 3, WAIT_S)
            assert state(1) == PartitionState((2, 3), 3, 3, (3,))
            await n2.stop()
            await n3.stop()

    asyncio.run(main())


def test_the_controller_moves_on_when_it_goes_and_a_deposed_one_writes_nothing(
    etcd: EtcdServer,
) -> None:
    async def main() -> None:
        async with cluster(etcd, 2) as (_, store, nodes):
            await asyncio.wait_for(nodes[0].controller.leading.wait(), WAIT_S)
            fence = nodes[0].controller.fence
            assert fence is not None
            await store.create_topic(TopicInfo("t", 1, 2), [[1, 2]], fence)
            await nodes[0].cache.wait_for(
                lambda: nodes[0].cache.partition("t", 0) is not None, WAIT_S
            )
            _, version = nodes[0].cache.partition("t", 0)  # type: ignore[misc]
            # Node 1 pauses past its lease (stops renewing, keeps its fence): node 2 takes over
            # and moves the partition; node 1's late write, fenced, is refused.
            await nodes[0].controller.close()
            await nodes[0].lease.close(revoke=False)
            await asyncio.wait_for(nodes[1].controller.leading.wait(), WAIT_S)
            cache = nodes[1].cache
            await cache.wait_for(lambda: cache.partition("t", 0)[0].leader == 2, WAIT_S)  # type: ignore[index]
            late = PartitionState((1, 2), 1, 9, (1, 2))
            assert not await store.set_partition("t", 0, late, version, fence)
            current = cache.partition("t", 0)
            assert current is not None
            assert current[0] == PartitionState((1, 2), 2, 1, (2,))
            assert not await store.set_partition(
                "t", 0, late, current[1], Fence(fence.key, fence.rev)
            )
            assert await store.set_partition(
                "t", 0, current[0], current[1], nodes[1].controller.fence
            )

    asyncio.run(main())


class _HeldWatch(EtcdClient):
    """An etcd client whose watch brings only the batches the test hands it (the rest is
    etcd's)."""

    def __init__(self, endpoint: str) -> None:
        super().__init__([endpoint], timeout_s=5)
        self.batches: asyncio.Queue[list[WatchEvent]] = asyncio.Queue()

    async def watch(
        self, key: str | bytes, *, prefix: bool = False, start_revision: int = 0
    ) -> AsyncIterator[list[WatchEvent]]:
        while True:
            yield await self.batches.get()


class _LookedAt(asyncio.Event):
    """A copy's ``changed`` event as another waiter of the copy leaves it (a request's or a
    test's ``wait_for``, woken in the same loop turn as the watch): cleared once that waiter
    has looked, right after each change. ``on_clear`` runs at the next clear, once."""

    def __init__(self) -> None:
        super().__init__()
        self.on_clear: Callable[[], None] | None = None

    def set(self) -> None:
        super().set()
        super().clear()

    def clear(self) -> None:
        super().clear()
        hook, self.on_clear = self.on_clear, None
        if hook is not None:
            hook()


def test_a_change_that_comes_as_the_controller_goes_to_wait_is_acted_on(
    etcd: EtcdServer,
) -> None:
    """The copy's ``changed`` event is shared, and its other waiters clear it once they have
    looked. A node's leaving that the copy applies after the controller's pass but before its
    waiter's first turn, with such a clear between them, must still start a pass: the
    partition that node led moves to its in-sync follower without any later change."""

    async def main() -> None:
        c = _HeldWatch(etcd.endpoint)
        async with c:
            store = MetadataStore(c, "test")
            leases = [Lease(c, ttl_s=5), Lease(c, ttl_s=5)]
            for node_id, lease in enumerate(leases, 1):
                await lease.start()
                await store.register(NodeInfo(node_id, "127.0.0.1", 9000 + node_id), lease.id)
            assert await store.create_topic(TopicInfo("t", 1, 2), [[2, 1]], None)
            cache = MetadataCache(store)
            await cache.load()
            cache.changed = event = _LookedAt()
            cache.start()
            # Node 2, the leader, goes; the copy learns it as the controller, its first pass
            # done (node 2 alive in it), goes to wait: at the controller's clear.
            await leases[1].close()
            _, revoked = await c.range(store.root, prefix=True)
            gone = WatchEvent("DELETE", KeyValue(store.node_key(2).encode(), b"", 0, revoked, 0, 0))
            event.on_clear = lambda: c.batches.put_nowait([gone])
            controller = Controller(store, cache, 1, leases[0])
            written: list[PartitionState] = []
            moved = asyncio.Event()

            def wrote(before: PartitionState, after: PartitionState) -> None:
                written.append(after)
                moved.set()

            controller.on_written = wrote
            controller.start()
            try:
                await asyncio.wait_for(moved.wait(), WAIT_S)
            finally:
                await controller.close()
                await cache.close()
                await leases[0].close()
            assert cache.revision == revoked
            assert written == [PartitionState((2, 1), 1, 1, (1,))]

    asyncio.run(main())
