"""Consumer groups in a cluster: ``__consumer_offsets`` replicated through etcd, each group
served by its coordinator (the leader of the group's offsets partition), and groups that
carry on at a new coordinator when the old one's node goes.

Three in-process nodes (broker, TCP server, :class:`ClusterNode` with its real replica
manager) in one event loop, against the real etcd of the ``etcd`` fixture. Every wait is
bounded; nothing asserts on how long something took.
"""

from __future__ import annotations

import asyncio
import os
import signal
import zlib
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager, AsyncExitStack
from pathlib import Path

import pytest

from tests.cli._support import start_serve, stop
from tests.cluster._etcd import EtcdServer
from tests.cluster._inprocess import WAIT_S, InProcessNode, in_process_cluster, until
from tidewire.broker import Broker, BrokerConfig
from tidewire.broker.groups import GroupCoordinator, GroupState
from tidewire.broker.offsets import OFFSETS_PARTITIONS, OFFSETS_TOPIC, partition_for
from tidewire.client import AsyncClient, AsyncGroupConsumer, Message
from tidewire.client._routing import OFFSETS_PARTITIONS as CLIENT_OFFSETS_PARTITIONS
from tidewire.client._routing import coordinator_partition
from tidewire.client._transport import Transport
from tidewire.errors import (
    IllegalGenerationError,
    NotCoordinatorError,
    NotLeaderError,
    TidewireError,
)
from tidewire.protocol.messages import OffsetFetchRequest

TOPIC = "orders"
GROUP = "billing"


class Node(InProcessNode):
    """One node of the cluster (see :class:`InProcessNode`)."""

    def __init__(self, tmp: Path, etcd: EtcdServer, node_id: int) -> None:
        super().__init__(tmp, etcd, node_id, cluster_id="groups")


def cluster(tmp: Path, etcd: EtcdServer, n: int = 3) -> AbstractAsyncContextManager[list[Node]]:
    return in_process_cluster(lambda i: Node(tmp, etcd, i), n)


def coordinator(nodes: list[Node], group: str) -> Node:
    """The live node that coordinates ``group`` now (from a live node's copy of etcd)."""
    live = [n for n in nodes if not n.stopped]
    got = live[0].cluster.cache.partition(OFFSETS_TOPIC, partition_for(group))
    assert got is not None, "the offsets topic is not in etcd"
    (leader,) = [n for n in live if n.id == got[0].leader]
    return leader


def coordinating(node: Node, group: str) -> bool:
    return not node.stopped and node.broker.groups.offsets.serves(group)


def test_the_client_and_the_broker_agree_on_a_group_s_partition() -> None:
    assert CLIENT_OFFSETS_PARTITIONS == OFFSETS_PARTITIONS
    for group in ("", "a", GROUP, "g" * 300, "ünïcode"):
        assert coordinator_partition(group) == partition_for(group)
        assert partition_for(group) == zlib.crc32(group.encode()) % OFFSETS_PARTITIONS


def test_a_single_node_coordinates_every_group(tmp_path: Path) -> None:
    async def main() -> None:
        broker = Broker(BrokerConfig(data_dir=str(tmp_path)))
        async with broker:
            assert not broker.groups.offsets.clustered
            broker.groups.check_coordinator(GROUP)  # nothing raised
            assert broker.groups.offsets.serves(GROUP)

    asyncio.run(main())


def test_only_the_coordinator_answers_for_a_group_and_its_offsets_are_replicated(
    tmp_path: Path, etcd: EtcdServer
) -> None:
    async def main() -> None:
        async with cluster(tmp_path, etcd) as nodes:
            a = nodes[0]
            await a.cluster.ensure_offsets_topic()
            await until(
                lambda: any(coordinating(n, GROUP) for n in nodes), "a coordinator serves it"
            )
            info = a.cluster.cache.topics[OFFSETS_TOPIC]
            assert (info.partitions, info.replication_factor) == (OFFSETS_PARTITIONS, 3)
            async with AsyncClient(a.addr) as admin:
                await admin.create_topic(TOPIC, partitions=2)
            # Made in etcd: each node makes its logs at its next pass (the consumer below asks
            # a node for the topic's offsets before it has learned the cluster).
            await until(
                lambda: all(n.broker.topics().get(TOPIC) == 2 for n in nodes),
                "every node has the topic's logs",
            )
            coord = coordinator(nodes, GROUP)
            others = [n for n in nodes if n is not coord]
            # Elsewhere: refused as a whole, with the wire code of NotCoordinatorError.
            for other in others:
                t = Transport(other.addr, request_timeout_s=WAIT_S)
                try:
                    with pytest.raises(NotCoordinatorError) as caught:
                        await t.request(OffsetFetchRequest(group_id=GROUP))
                finally:
                    await t.close()
                assert isinstance(caught.value, NotLeaderError)  # routed like one
                assert str(partition_for(GROUP)) in caught.value.message
            # A client given a node that is not the coordinator finds it (AsyncGroupConsumer).
            consumer = AsyncGroupConsumer(
                ",".join(n.addr for n in others),
                GROUP,
                topics=[TOPIC],
                enable_auto_commit=False,
                auto_offset_reset="earliest",
                session_timeout_ms=6_000,
            )
            async with consumer:
                for _ in range(100):
                    await consumer.poll(0.2)
                    if consumer.assignment():
                        break
                assert consumer.assignment() == [(TOPIC, 0), (TOPIC, 1)]
                await consumer.commit({(TOPIC, 0): 7, (TOPIC, 1): 3})
            committed = coord.broker.groups.committed(GROUP)
            assert {tp: x.offset for tp, x in committed.items()} == {(TOPIC, 0): 7, (TOPIC, 1): 3}
            # AsyncClient's group calls find the coordinator too.
            async with AsyncClient(others[0].addr) as admin:
                got = await admin.committed_offsets(GROUP)
                assert got == {(TOPIC, 0): 7, (TOPIC, 1): 3}
                assert (await admin.describe_group(GROUP)).group_id == GROUP
                # A group another node coordinates: each node lists only its own groups,
                # the client's list is the cluster's.
                elsewhere = next(
                    g
                    for g in (f"audit-{i}" for i in range(1000))
                    if coordinator(nodes, g) is not coord
                )
                await admin.commit_offsets(elsewhere, {(TOPIC, 0): 2})
                assert GROUP not in {g.group_id for g in others[0].broker.groups.list_groups()}
                for node in nodes:
                    async with AsyncClient(node.addr) as lister:
                        listed = {g.group_id for g in await lister.list_groups()}
                    assert {GROUP, elsewhere} <= listed, (node.id, listed)
            # Every replica holds the commit in its log (acknowledged once replicated).
            p = partition_for(GROUP)
            ends = {n.id: n.broker.log(OFFSETS_TOPIC, p).log_end_offset for n in nodes}
            assert len(set(ends.values())) == 1, ends
            assert min(ends.values()) > 0, ends

    asyncio.run(main())


def test_a_coordinator_assigns_and_describes_partitions_it_does_not_hold(
    tmp_path: Path, etcd: EtcdServer
) -> None:
    """A group's coordinator resolves subscriptions against the cluster's topics, not its
    own logs: a topic of one replica per partition spread over three nodes is assigned
    whole, and describing the group names every partition (the end offset of one this node
    holds no replica of is unknown, -1) instead of failing."""

    async def main() -> None:
        async with cluster(tmp_path, etcd) as nodes:
            async with AsyncClient(",".join(n.addr for n in nodes)) as admin:
                await admin.create_topic("spread", partitions=3, replication_factor=1)
                await admin.commit_offsets(GROUP, {("spread", 0): 0})  # makes the offsets topic
            coord = coordinator(nodes, GROUP)
            await until(
                lambda: coord.broker.group_topics().get("spread") == 3,
                "the coordinator sees the topic's three partitions",
            )
            held = set(coord.broker.logs.topics().get("spread", []))
            assert len(held) < 3, held  # one replica each: not every partition is here
            joined = await coord.broker.groups.coordinator.join(GROUP, topics=["spread"])
            assert sorted(joined.assignment) == [("spread", p) for p in range(3)]
            described = coord.broker.groups.describe(GROUP)
            assert {(o.topic, o.partition) for o in described.offsets} == {
                ("spread", p) for p in range(3)
            }
            for o in described.offsets:
                assert (o.end_offset >= 0) == (o.partition in held), o

    asyncio.run(main())


def test_a_snapshot_restores_the_generation_and_members_on_another_coordinator() -> None:
    """What a coordinator stores at a generation change is enough for another one to carry
    the group on: same generation, member ids and assignment; heartbeats and commits of that
    generation accepted; an unreadable snapshot or a group held already left alone."""
    now = [0.0]
    topics = {TOPIC: 2}

    async def main() -> None:
        a = GroupCoordinator(lambda: topics, clock=lambda: now[0])
        stored: dict[str, bytes | None] = {}
        a.persist = stored.__setitem__
        r1 = await a.join(GROUP, instance_id="i1", topics=[TOPIC])  # generation 1, alone
        j2 = asyncio.create_task(a.join(GROUP, topics=[TOPIC]))
        await asyncio.sleep(0)  # a rebalance: the first member joins again
        r1 = await a.join(GROUP, member_id=r1.member_id, instance_id="i1", topics=[TOPIC])
        r2 = await j2
        assert r1.generation == r2.generation == 2
        state, generation, _ = a.state(GROUP)
        assert state is GroupState.STABLE
        data = stored[GROUP]
        assert data is not None
        assert data == a.snapshot(GROUP)

        b = GroupCoordinator(lambda: topics, clock=lambda: now[0])
        assert b.restore(GROUP, data)
        assert not b.restore(GROUP, data)  # held already
        assert b.state(GROUP) == a.state(GROUP)
        assert b.members(GROUP) == a.members(GROUP)
        for m in b.members(GROUP):
            b.heartbeat(GROUP, m.member_id, generation)  # nothing raised
            b.check_commit(GROUP, m.member_id, generation, m.assignment)
        with pytest.raises(IllegalGenerationError):
            b.heartbeat(GROUP, r1.member_id, generation - 1)
        # Sessions start afresh at the restore; a member that never heartbeats expires.
        now[0] += 5_000
        b.tick()
        assert len(b.members(GROUP)) == 2
        now[0] += 6_000
        b.tick()
        assert b.members(GROUP) == []
        assert not GroupCoordinator(lambda: topics).restore("other", b"\x93junk")

    asyncio.run(main())


def test_memberships_are_loaded_and_compacted_with_the_offsets(tmp_path: Path) -> None:
    """The offsets topic keeps each group's last membership record: read back at a restart,
    removed by a tombstone, kept by a compaction."""

    async def main() -> None:
        async with Broker(BrokerConfig(data_dir=str(tmp_path))) as b:
            store = b.groups.offsets
            await store.write_membership("g1", b"one")
            await store.write_membership("g1", b"two")
            await store.write_membership("g2", b"x")
            await store.write_membership("g2", None)
            b.create_topic(TOPIC, 1)
            await b.groups.commit("g1", {(TOPIC, 0): (0, "")})
            assert store.membership("g1") == b"two"
            await store.compact(partition_for("g1"))
            assert store.membership("g1") == b"two"
        async with Broker(BrokerConfig(data_dir=str(tmp_path))) as b:
            store = b.groups.offsets
            assert store.membership("g1") == b"two"
            assert store.membership("g2") is None
            assert store.memberships(partition_for("g1")) == {"g1": b"two"}
            assert {tp: c.offset for tp, c in b.groups.committed("g1").items()} == {(TOPIC, 0): 0}

    asyncio.run(main())


def test_members_carry_on_at_a_new_coordinator_without_joining_again(
    tmp_path: Path, etcd: EtcdServer
) -> None:
    """The coordinator's node stops: its successor has the group's generation and members
    from the offsets topic, so both members go on heartbeating and committing there with
    their member ids and generation; none is told it is unknown, none joins again."""

    async def main() -> None:
        async with cluster(tmp_path, etcd) as nodes:
            addrs = ",".join(n.addr for n in nodes)
            beats: list[tuple[int, str, str]] = []  # (node, member, error class or "")
            for n in nodes:
                coord_ = n.broker.groups.coordinator

                def counting(
                    group_id: str,
                    member_id: str,
                    generation: int,
                    node: int = n.id,
                    inner: Callable[[str, str, int], None] = coord_.heartbeat,
                ) -> None:
                    try:
                        inner(group_id, member_id, generation)
                    except TidewireError as exc:
                        beats.append((node, member_id, type(exc).__name__))
                        raise
                    beats.append((node, member_id, ""))

                coord_.heartbeat = counting  # type: ignore[method-assign]
            async with AsyncClient(addrs, request_timeout_s=WAIT_S) as client:
                await client.create_topic(TOPIC, partitions=2)
                for i in range(10):
                    await produce_retrying(client, i % 2, f"m{i}".encode())
                consumers = [
                    AsyncGroupConsumer(
                        addrs,
                        GROUP,
                        topics=[TOPIC],
                        client_id=f"c{i}",
                        enable_auto_commit=False,
                        auto_offset_reset="earliest",
                        session_timeout_ms=6_000,
                        heartbeat_interval_ms=200,
                    )
                    for i in range(2)
                ]
                got: list[bytes] = []

                async def run(c: AsyncGroupConsumer) -> None:
                    while True:
                        got.extend(r.value or b"" for r in await c.poll(0.1))

                async with AsyncExitStack() as stack:
                    for c in consumers:
                        await stack.enter_async_context(c)
                    tasks = [asyncio.create_task(run(c)) for c in consumers]
                    try:
                        await until(
                            lambda: (
                                len(set(got)) == 10
                                and all(c.assignment() for c in consumers)
                                and len({c.generation for c in consumers}) == 1
                            ),
                            "10 read, both members assigned in one generation",
                            60,
                        )
                        coord = coordinator(nodes, GROUP)
                        groups = coord.broker.groups
                        await until(
                            lambda: (
                                groups.coordinator.state(GROUP)[0] is GroupState.STABLE
                                and groups.offsets.membership(GROUP)
                                == groups.coordinator.snapshot(GROUP)
                            ),
                            "the group's membership replicated",
                        )
                        members = {c._member_id for c in consumers}
                        generation = consumers[0].generation
                        await coord.stop()
                        await until(
                            lambda: any(coordinating(n, GROUP) for n in nodes),
                            "another node coordinates the group",
                        )
                        new = coordinator(nodes, GROUP)
                        assert new is not coord
                        state = new.broker.groups.coordinator.state(GROUP)
                        assert state[:2] == (GroupState.STABLE, generation)
                        got_members = new.broker.groups.coordinator.members(GROUP)
                        assert {m.member_id for m in got_members} == members
                        mark = len(beats)

                        def beaten_at_new() -> bool:
                            ok = [m for node, m, err in beats[mark:] if node == new.id and not err]
                            return all(ok.count(m) >= 3 for m in members)

                        await until(beaten_at_new, "3 heartbeats of each member at the new one")
                        for c in consumers:
                            await c.commit()  # fenced members would raise
                        for i in range(10, 16):
                            await produce_retrying(client, i % 2, f"m{i}".encode())
                        await until(lambda: len(set(got)) == 16, "16 read", 60)
                        errors = [(n_, m, e) for n_, m, e in beats[mark:] if e]
                        # Told nothing but "not coordinator" (none of that is a heartbeat
                        # reaching the group): no UnknownMember, no IllegalGeneration.
                        assert errors == [], errors
                        assert {c._member_id for c in consumers} == members
                        assert {c.generation for c in consumers} == {generation}
                        assert new.broker.groups.coordinator.state(GROUP)[1] == generation
                    finally:
                        for t in tasks:
                            t.cancel()
                        await asyncio.gather(*tasks, return_exceptions=True)

    async def bounded() -> None:
        async with asyncio.timeout(150):  # a failure rather than a hang
            await main()

    asyncio.run(bounded())


async def produce_retrying(client: AsyncClient, partition: int, value: bytes) -> None:
    """Produce one message, sent again while its leader moves (a duplicate does no harm)."""
    for attempt in range(100):
        try:
            await client.produce(TOPIC, partition, [Message(value=value)])
            return
        except TidewireError:
            if attempt == 99:
                raise
            await asyncio.sleep(0.2)


def test_a_group_carries_on_at_a_new_coordinator_with_its_committed_offsets(
    tmp_path: Path, etcd: EtcdServer
) -> None:
    async def main() -> None:
        async with cluster(tmp_path, etcd) as nodes:
            addrs = ",".join(n.addr for n in nodes)
            async with AsyncClient(addrs) as client:
                await client.create_topic(TOPIC, partitions=2)
                sent: set[tuple[int, bytes]] = set()

                async def produce(first: int, count: int) -> None:
                    for i in range(first, first + count):
                        p = i % 2
                        value = f"m{i}".encode()
                        for attempt in range(100):  # a lost leader: sent again (a set: dupes ok)
                            try:
                                await client.produce(TOPIC, p, [Message(value=value)])
                                break
                            except TidewireError:
                                if attempt == 99:
                                    raise
                                await asyncio.sleep(0.2)
                        sent.add((p, value))

                await produce(0, 40)
                consumers = [
                    AsyncGroupConsumer(
                        addrs,
                        GROUP,
                        topics=[TOPIC],
                        client_id=f"c{i}",
                        enable_auto_commit=False,
                        auto_offset_reset="earliest",
                        session_timeout_ms=6_000,
                        heartbeat_interval_ms=300,
                    )
                    for i in range(2)
                ]
                got: list[tuple[int, int, bytes]] = []  # (partition, offset, value)

                # Each member polls in its own task (a join waits for the other members).
                polling = asyncio.Event()
                polling.set()

                async def run(c: AsyncGroupConsumer) -> None:
                    while True:
                        await polling.wait()
                        for r in await c.poll(0.1):
                            got.append((r.partition, r.offset, r.value or b""))

                async def poll_until(done: Callable[[], bool], what: str) -> None:
                    polling.set()
                    await until(done, what, 60)
                    polling.clear()
                    await asyncio.sleep(0.3)  # the polls in flight return

                async def commit_all() -> None:
                    """Commit each member's positions; a member fenced by a rebalance
                    (the coordinator moved) polls, rejoins and commits again."""
                    for c in consumers:
                        for _ in range(60):
                            try:
                                await c.commit()
                                break
                            except TidewireError:
                                polling.set()
                                await asyncio.sleep(0.5)
                                polling.clear()
                                await asyncio.sleep(0.3)
                        else:
                            raise AssertionError(f"{c.client_id} could not commit")

                async def scenario() -> None:
                    await poll_until(
                        lambda: (
                            len({(p, v) for p, _, v in got}) == 40
                            and all(c.assignment() for c in consumers)
                            # each member read its own partitions through: a member given a
                            # partition by the second join starts it at the committed 0
                            and all(
                                c.position(t, p) == 20 for c in consumers for t, p in c.assignment()
                            )
                        ),
                        "the first 40 messages, each member through its partitions",
                    )
                    await commit_all()
                    coord = coordinator(nodes, GROUP)
                    before = {
                        tp: x.offset for tp, x in coord.broker.groups.committed(GROUP).items()
                    }
                    assert before == {(TOPIC, 0): 20, (TOPIC, 1): 20}, before
                    # The coordinator's node goes (its lease revoked: the others take over).
                    await coord.stop()
                    await until(
                        lambda: any(coordinating(n, GROUP) for n in nodes),
                        "another node coordinates the group",
                    )
                    new = coordinator(nodes, GROUP)
                    assert new is not coord
                    # The commit acknowledged before the loss is there.
                    after = {tp: x.offset for tp, x in new.broker.groups.committed(GROUP).items()}
                    assert after == before
                    mark = len(got)
                    await produce(40, 20)
                    await poll_until(
                        lambda: {(p, v) for p, _, v in got} >= sent,
                        "every message, the 20 sent after the coordinator was lost included",
                    )
                    await commit_all()
                    # No message skipped; none read again from before the last commit.
                    for p, offset, _ in got[mark:]:
                        assert offset >= before[(TOPIC, p)], (p, offset, before)
                    final = {tp: x.offset for tp, x in new.broker.groups.committed(GROUP).items()}
                    # Never behind what was acknowledged before the loss (a member that rejoins
                    # in the middle may commit a position it has not read past yet).
                    assert all(final[tp] >= before[tp] for tp in before), (final, before)

                async with AsyncExitStack() as stack:
                    for c in consumers:
                        await stack.enter_async_context(c)
                    tasks = [asyncio.create_task(run(c)) for c in consumers]
                    try:
                        await scenario()
                    finally:
                        for t in tasks:
                            t.cancel()
                        await asyncio.gather(*tasks, return_exceptions=True)

    async def bounded() -> None:
        async with asyncio.timeout(120):  # a failure rather than a hang
            await main()

    asyncio.run(bounded())


@pytest.mark.slow  # ~8 s alone, 20 s on a busy machine (real processes)
def test_a_group_carries_on_when_its_coordinator_process_is_killed(
    tmp_path: Path, etcd: EtcdServer
) -> None:
    """Three real ``tidewire serve --cluster`` processes: the coordinator's is SIGKILLed (its
    lease expires: no clean hand-over), the group's commit is kept, its members go on."""
    cluster_url = f"etcd://127.0.0.1:{etcd.client_port}"
    procs = {}
    try:
        for n in (1, 2, 3):
            procs[n] = start_serve(
                tmp_path / f"node{n}",
                *("--node-id", str(n), "--cluster", cluster_url),
                *("--session-timeout", "2", "--fsync", "always"),
            )
        addr = {n: f"127.0.0.1:{port}" for n, (_, port) in procs.items()}
        addrs = ",".join(addr.values())

        async def main() -> None:
            async def offsets_leader(client: AsyncClient) -> int:
                async def probe() -> int | None:
                    meta = await client._router.refresh([OFFSETS_TOPIC])
                    (desc,) = meta.topics
                    if desc.error_code or not desc.partitions:
                        return None
                    leader = desc.partitions[partition_for(GROUP)].leader
                    return leader if leader >= 0 else None

                loop = asyncio.get_running_loop()
                deadline = loop.time() + WAIT_S
                while (got := await probe()) is None:
                    assert loop.time() < deadline, "no coordinator elected"
                    await asyncio.sleep(0.1)
                return got

            async def registered() -> bool:
                async with AsyncClient(addr[1]) as c:
                    return len((await c._router.refresh([])).nodes) == 3

            for _ in range(300):
                if await registered():
                    break
                await asyncio.sleep(0.1)
            else:
                raise AssertionError("3 nodes did not register")
            async with AsyncClient(addrs, request_timeout_s=WAIT_S) as client:
                await client.create_topic(TOPIC, partitions=2)
                sent: set[tuple[int, bytes]] = set()

                async def produce(first: int, count: int) -> None:
                    for i in range(first, first + count):
                        for attempt in range(100):  # until the new leaders are elected
                            try:
                                await client.produce(TOPIC, i % 2, [Message(f"m{i}".encode())])
                                break
                            except TidewireError:
                                if attempt == 99:
                                    raise
                                await asyncio.sleep(0.2)
                        sent.add((i % 2, f"m{i}".encode()))

                for _ in range(100):  # every node has made its replicas
                    try:
                        await produce(0, 20)
                        break
                    except TidewireError:
                        await asyncio.sleep(0.2)
                consumers = [
                    AsyncGroupConsumer(
                        addrs,
                        GROUP,
                        topics=[TOPIC],
                        enable_auto_commit=False,
                        auto_offset_reset="earliest",
                        session_timeout_ms=6_000,
                        heartbeat_interval_ms=300,
                    )
                    for _ in range(2)
                ]
                got: list[tuple[int, int, bytes]] = []

                async def run(c: AsyncGroupConsumer) -> None:
                    while True:
                        for r in await c.poll(0.1):
                            got.append((r.partition, r.offset, r.value or b""))

                async with AsyncExitStack() as stack:
                    for c in consumers:
                        await stack.enter_async_context(c)
                    tasks = [asyncio.create_task(run(c)) for c in consumers]
                    try:
                        await until(lambda: {(p, v) for p, _, v in got} >= sent, "20 read", 60)
                        await until(lambda: all(c.assignment() for c in consumers), "assigned")
                        for c in consumers:
                            await c.commit()  # positions: 10 and 10
                        before = await client.committed_offsets(GROUP)
                        assert before == {(TOPIC, 0): 10, (TOPIC, 1): 10}, before
                        old = await offsets_leader(client)
                        os.kill(procs[old][0].pid, signal.SIGKILL)
                        for _ in range(300):
                            if await offsets_leader(client) != old:
                                break
                            await asyncio.sleep(0.1)
                        else:
                            raise AssertionError("the coordinator did not move")
                        assert await client.committed_offsets(GROUP) == before
                        mark = len(got)
                        await produce(20, 10)
                        await until(lambda: {(p, v) for p, _, v in got} >= sent, "30 read", 60)
                        for p, offset, _ in got[mark:]:
                            assert offset >= before[(TOPIC, p)], (p, offset, before)
                    finally:
                        for t in tasks:
                            t.cancel()
                        await asyncio.gather(*tasks, return_exceptions=True)

        async def bounded() -> None:
            async with asyncio.timeout(180):  # a failure rather than a hang
                await main()

        asyncio.run(bounded())
    finally:
        for proc, _ in procs.values():
            stop(proc)
