"""Push subscribers in a cluster: each partition subscribed on its leader, and subscribed
again on the new leader when the leader goes, from the next offset not handed out; and a
client whose first bootstrap node is cut off, with the leader, finding the new leader
without waiting out a request timeout on its metadata.

Three in-process nodes (RF=3, min_insync=2) against the real etcd of the ``etcd`` fixture.
Every wait is bounded; nothing asserts on how long something took.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

from tests.cluster._etcd import EtcdServer
from tests.cluster._inprocess import WAIT_S, InProcessNode, in_process_cluster, until
from tests.cluster._proxy import Proxy
from tidewire.client import (
    AsyncClient,
    AsyncGroupConsumer,
    AsyncProducer,
    AsyncSubscriber,
    ConsumerRecord,
    Message,
    _subscriber,
)
from tidewire.client._transport import Transport
from tidewire.cluster.metadata import PartitionState
from tidewire.errors import NotLeaderError, RequestTimedOutError
from tidewire.protocol.messages import (
    MetadataRequest,
    PushBody,
    SubscribePartition,
    SubscribeRequest,
    decode_body,
)

T = "pushed"
PARTITIONS = 3


@asynccontextmanager
async def three_nodes(
    tmp_path: Path, etcd: EtcdServer, cluster_id: str, partitions: int
) -> AsyncIterator[tuple[list[InProcessNode], str]]:
    """Three in-process nodes of cluster ``cluster_id`` with ``T`` made with ``partitions``
    partitions, and the bootstrap addresses of them all."""
    async with in_process_cluster(
        lambda i: InProcessNode(tmp_path, etcd, i, cluster_id=cluster_id), 3
    ) as nodes:
        bootstrap = ",".join(n.addr for n in nodes)
        async with AsyncClient(bootstrap) as client:
            await client.create_topic(T, partitions=partitions)
        yield nodes, bootstrap


async def subscribe_from_0(t: Transport, subscription_id: int, topic: str) -> Any:
    """A raw SUBSCRIBE of partition 0 of ``topic`` from offset 0 on ``t`` (1 MiB of credit):
    the answer's body."""
    response = await t.request(
        SubscribeRequest(
            subscription_id=subscription_id,
            partitions=[SubscribePartition(topic, 0, 0)],
            credit_bytes=1 << 20,
        )
    )
    assert response is not None
    return response.body


def leader_of(nodes: list[InProcessNode], partition: int) -> InProcessNode | None:
    """The node that leads ``partition`` of ``T`` and has taken the role."""
    return next(
        (
            n
            for n in nodes
            if not n.stopped
            and n.broker.replication is not None
            and n.broker.replication.leads(T, partition)
        ),
        None,
    )


def subscribed_here(node: InProcessNode) -> set[tuple[str, int]]:
    """The partitions of ``T`` the node's connections push now."""
    return {
        (p.topic, p.partition)
        for c in node.server.connections
        for s in c.subscriptions.subs.values()
        for p in s.parts
        if p.topic == T and not p.done
    }


async def leaders_settled(nodes: list[InProcessNode]) -> dict[int, InProcessNode]:
    """Every partition of ``T`` led by a live node that has taken its role."""
    await until(
        lambda: all(leader_of(nodes, p) is not None for p in range(PARTITIONS)),
        "every partition has a leader",
    )
    out = {}
    for p in range(PARTITIONS):
        node = leader_of(nodes, p)
        assert node is not None
        out[p] = node
    return out


async def take_until(
    sub: AsyncSubscriber, got: list[ConsumerRecord], done: Callable[[], bool], what: str
) -> None:
    """Poll ``sub`` into ``got`` until ``done()`` (bounded by WAIT_S * 2)."""

    async def run() -> None:
        while not done():
            got.extend(await sub.poll(0.5))

    try:
        await asyncio.wait_for(run(), WAIT_S * 2)
    except TimeoutError:
        raise AssertionError(f"not within {WAIT_S * 2:.0f} s: {what}") from None


def check_once_in_order(got: list[ConsumerRecord]) -> dict[int, list[int]]:
    """Each partition's offsets as handed out: no duplicates, in order, no gap."""
    offsets: dict[int, list[int]] = {}
    for r in got:
        offsets.setdefault(r.partition, []).append(r.offset)
    for p, seen in offsets.items():
        assert seen == list(range(seen[0], seen[0] + len(seen))), (p, seen)
    return offsets


def test_a_subscriber_gets_each_partition_from_its_leader(tmp_path: Path, etcd: EtcdServer) -> None:
    """Partitions led by different nodes, the subscriber given one node's address: every
    record of every partition comes, once and in order, each partition pushed by its
    leader; and a node refuses to push a partition it does not lead (NotLeaderError)."""

    async def main() -> None:
        async with three_nodes(tmp_path, etcd, "push-leaders", PARTITIONS) as (nodes, bootstrap):
            leaders = await leaders_settled(nodes)
            assert len({n.id for n in leaders.values()}) >= 2, leaders
            per = 20
            async with AsyncProducer(bootstrap, linger_ms=0) as producer:
                futures = [
                    await producer.send(T, f"{p}:{i}".encode(), partition=p)
                    for p in range(PARTITIONS)
                    for i in range(per)
                ]
                for f in futures:
                    await f

            # A follower is asked directly: refused, naming the leader.
            p0 = leaders[0]
            follower = next(n for n in nodes if n is not p0)
            t = Transport(follower.addr)
            try:
                answer = await subscribe_from_0(t, 1, T)
                assert answer.error_code == NotLeaderError.code, answer
                assert answer.results[0].error_code == NotLeaderError.code
            finally:
                await t.close()

            got: list[ConsumerRecord] = []
            async with AsyncSubscriber(follower.addr) as sub:
                await sub.subscribe([(T, p, "earliest") for p in range(PARTITIONS)])
                await take_until(
                    sub, got, lambda: len(got) >= PARTITIONS * per, "every record pushed"
                )
                for node in nodes:
                    led = {(T, p) for p, n in leaders.items() if n is node}
                    assert subscribed_here(node) == led, (node.id, led)
            offsets = check_once_in_order(got)
            first_and_count = {p: (s[0], len(s)) for p, s in offsets.items()}
            assert first_and_count == dict.fromkeys(range(PARTITIONS), (0, per))
            assert sorted(r.value for r in got) == sorted(
                f"{p}:{i}".encode() for p in range(PARTITIONS) for i in range(per)
            )

    asyncio.run(asyncio.wait_for(main(), 180))


def all_in_sync(nodes: list[InProcessNode], partitions: int = PARTITIONS) -> bool:
    """Every partition of ``T`` has all three replicas in its ISR (as a live node's copy of
    the metadata says)."""
    live = next(n for n in nodes if not n.stopped)
    for p in range(partitions):
        got = live.cluster.cache.partition(T, p)
        if got is None or len(got[0].isr) != 3:
            return False
    return True


async def failover(tmp_path: Path, etcd: EtcdServer, rounds: int) -> None:
    """A producer writes to every partition while a subscriber reads them; ``rounds`` times
    the leader of partition 0 is stopped mid-stream (and started again once the next leader
    took over): the subscriber carries on from each new leader, and every acknowledged
    record comes, each handed out once, in order."""
    async with three_nodes(tmp_path, etcd, "push-failover", PARTITIONS) as (nodes, bootstrap):
        await leaders_settled(nodes)
        acked: set[bytes] = set()
        stop = asyncio.Event()

        async def produce(producer: AsyncProducer) -> None:
            i = 0
            while not stop.is_set() or i < 30:
                pending = []
                for p in range(PARTITIONS):
                    value = f"{p}:{i}".encode()
                    pending.append((value, await producer.send(T, value, partition=p)))
                for value, f in pending:
                    await f  # an idempotent producer: stored once, or it raises
                    acked.add(value)
                i += 1
                await asyncio.sleep(0.01)

        def of_p0() -> int:
            return sum(r.partition == 0 for r in got)

        got: list[ConsumerRecord] = []
        victims: list[int] = []
        async with (
            AsyncProducer(
                bootstrap, linger_ms=0, delivery_timeout_ms=int(WAIT_S * 4000)
            ) as producer,
            AsyncSubscriber(bootstrap, credit_bytes=4096) as sub,
        ):
            await sub.subscribe([(T, p, "earliest") for p in range(PARTITIONS)])
            task = asyncio.create_task(produce(producer))
            try:
                for r in range(rounds):
                    if r:
                        await until(lambda: all_in_sync(nodes), "every replica in sync again")
                    start = of_p0()
                    await take_until(
                        sub, got, lambda s=start: of_p0() >= s + 20, "records of partition 0"
                    )
                    victim = leader_of(nodes, 0)
                    assert victim is not None
                    victims.append(victim.id)
                    before = sub.stats.resubscribes
                    await victim.stop()
                    await until(
                        lambda: leader_of(nodes, 0) is not None, "a new leader of partition 0"
                    )
                    await take_until(
                        sub,
                        got,
                        lambda b=before, s=start: sub.stats.resubscribes > b and of_p0() >= s + 60,
                        "records of partition 0 from its new leader",
                    )
                    await victim.start()
                stop.set()
                await asyncio.wait_for(task, WAIT_S * 2)
            except BaseException:
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
                raise
            await take_until(
                sub, got, lambda: acked <= {r.value for r in got}, "every acknowledged record"
            )
        check_once_in_order(got)
        values = [r.value for r in got]
        assert len(values) == len(set(values)), "a record handed out twice"
        assert len(victims) == rounds


def test_the_subscriber_carries_on_from_the_new_leader_when_its_leader_stops(
    tmp_path: Path, etcd: EtcdServer
) -> None:
    asyncio.run(asyncio.wait_for(failover(tmp_path, etcd, 1), 240))


@pytest.mark.slow
def test_the_subscriber_follows_the_leader_stopped_5_times(
    tmp_path: Path, etcd: EtcdServer
) -> None:
    asyncio.run(asyncio.wait_for(failover(tmp_path, etcd, 5), 900))


def test_a_cut_off_first_bootstrap_node_costs_at_most_one_metadata_timeout_a_client(
    tmp_path: Path, etcd: EtcdServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The clients reach the nodes through proxies, the leader's first in their bootstrap
    list; the leader leaves the cluster and its proxy goes silent (connections accepted,
    nothing answered). The producer's next send waits out one request timeout on it (it
    cannot know), its metadata refresh at most one more (then the other nodes are asked
    first), and the send goes to the new leader; the subscriber, idle on the silent node,
    moves its partition to the new leader and receives that record."""
    timeouts: list[str] = []
    request = Transport.request

    async def counted(self: Transport, body: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return await request(self, body, *args, **kwargs)
        except RequestTimedOutError:
            if isinstance(body, MetadataRequest):
                timeouts.append(f"{self.host}:{self.port}")
            raise

    monkeypatch.setattr(Transport, "request", counted)
    monkeypatch.setattr(_subscriber, "LEADER_CHECK_S", 1.0)

    async def main() -> None:
        async with three_nodes(tmp_path, etcd, "push-cutoff", 1) as (nodes, _):
            await until(lambda: leader_of(nodes, 0) is not None, "a leader")
            victim = leader_of(nodes, 0)
            assert victim is not None
            proxies = {n.id: await Proxy("127.0.0.1", n.server.port).start() for n in nodes}
            try:
                order = [victim, *(n for n in nodes if n is not victim)]
                bootstrap = ",".join(proxies[n.id].address for n in order)
                got: list[ConsumerRecord] = []
                async with (
                    AsyncProducer(bootstrap, linger_ms=0, request_timeout_ms=3000) as producer,
                    AsyncSubscriber(bootstrap, request_timeout_ms=3000) as sub,
                ):
                    await (await producer.send(T, b"before", partition=0))
                    await sub.subscribe([(T, 0, "earliest")])
                    await take_until(sub, got, lambda: len(got) >= 1, "the first record")
                    # Cut off: its clients' connections go silent, and it leaves the cluster.
                    proxies[victim.id].blackhole()
                    node, victim.node = victim.node, None
                    assert node is not None
                    await node.close()
                    others = [n for n in nodes if n is not victim]
                    await until(lambda: leader_of(others, 0) is not None, "a new leader")
                    meta = await (await producer.send(T, b"after", partition=0))
                    assert meta.offset == 1
                    await take_until(sub, got, lambda: len(got) >= 2, "the record sent after")
                assert [r.value for r in got] == [b"before", b"after"]
                # One client's bootstrap connection each (producer, subscriber): at most one
                # metadata request timed out on the silent node per client.
                assert len(timeouts) <= 2, timeouts
            finally:
                for p in proxies.values():
                    await p.close()

    asyncio.run(asyncio.wait_for(main(), 180))


def test_a_partition_moved_off_its_live_leader_is_followed_there(
    tmp_path: Path, etcd: EtcdServer
) -> None:
    """Partition 0 is moved off its leader's node, which stays up (a reassignment): the node
    stops pushing it (NotLeaderError in a push, its replica gone), the subscriber subscribes
    it on its new leader and every record sent before and after comes once, in order; the
    node that gave it up pushes it no more."""

    async def main() -> None:
        async with (
            three_nodes(tmp_path, etcd, "push-moved", 1) as (nodes, bootstrap),
            AsyncClient(bootstrap) as client,
        ):
            await until(lambda: leader_of(nodes, 0) is not None, "a leader")
            old = leader_of(nodes, 0)
            assert old is not None
            got: list[ConsumerRecord] = []
            async with (
                AsyncProducer(bootstrap, linger_ms=0) as producer,
                AsyncSubscriber(bootstrap) as sub,
            ):
                for i in range(10):
                    await (await producer.send(T, b"a%d" % i, partition=0))
                await sub.subscribe([(T, 0, "earliest")])
                await take_until(sub, got, lambda: len(got) >= 10, "the records before")
                assert subscribed_here(old) == {(T, 0)}
                others = [n.id for n in nodes if n is not old]
                await client.alter_replication(T, replicas={0: others})
                await until(
                    lambda: (n := leader_of(nodes, 0)) is not None and n is not old,
                    "partition 0 led elsewhere",
                )
                for i in range(10):
                    await (await producer.send(T, b"b%d" % i, partition=0))
                await take_until(sub, got, lambda: len(got) >= 20, "the records after")
                new = leader_of(nodes, 0)
                assert new is not None
                await until(
                    lambda: subscribed_here(new) == {(T, 0)} and not subscribed_here(old),
                    "pushed by the new leader only",
                )
                assert sub.stats.resubscribes >= 1
            check_once_in_order(got)
            assert [r.value for r in got] == [b"a%d" % i for i in range(10)] + [
                b"b%d" % i for i in range(10)
            ]

    asyncio.run(asyncio.wait_for(main(), 180))


def test_a_lead_moved_through_etcd_off_a_live_node_is_followed_and_counted(
    tmp_path: Path, etcd: EtcdServer
) -> None:
    """Partition 0's state in etcd names another in-sync replica its leader at the next
    epoch (what a preferred-leader election writes); the old leader's node stays up and in
    the replica set, a follower now. Server side: a subscription made on that node by hand
    is pushed NotLeaderError for the partition once the node has lost the lead, and nothing
    past the records it had pushed before. Client side: the subscriber subscribes it on the
    new leader and every record sent before and after comes once, in order; its
    ``routing_stats`` count the NotLeader retry, the leader move and the refreshes."""

    async def main() -> None:
        async with three_nodes(tmp_path, etcd, "push-lead-moved", 1) as (nodes, bootstrap):
            await until(lambda: leader_of(nodes, 0) is not None, "a leader")
            await until(lambda: all_in_sync(nodes, 1), "every replica in sync")
            old = leader_of(nodes, 0)
            assert old is not None
            got: list[ConsumerRecord] = []
            pushes: list[PushBody] = []
            raw = Transport(old.addr)
            raw.on_push = lambda ev: pushes.append(decode_body(PushBody, ev.body))
            try:
                async with (
                    AsyncProducer(bootstrap, linger_ms=0) as producer,
                    AsyncSubscriber(bootstrap) as sub,
                ):
                    for i in range(10):
                        await (await producer.send(T, b"a%d" % i, partition=0))
                    await sub.subscribe([(T, 0, "earliest")])
                    answer = await subscribe_from_0(raw, 7, T)
                    assert answer.error_code == 0
                    await take_until(sub, got, lambda: len(got) >= 10, "the records before")
                    await until(lambda: any(p.next_offset == 10 for p in pushes), "the raw pushes")
                    assert subscribed_here(old) == {(T, 0)}
                    before = sub.routing_stats
                    assert before.leader_moves == 0
                    assert before.not_leader_retries == 0
                    old_rep = old.broker.replication
                    assert old_rep is not None
                    new = await move_lead(nodes, old, 0)
                    await until(
                        lambda: leader_of(nodes, 0) is new and not old_rep.leads(T, 0),
                        "partition 0 led by the node named in etcd",
                    )
                    for i in range(10):
                        await (await producer.send(T, b"b%d" % i, partition=0))
                    await take_until(sub, got, lambda: len(got) >= 20, "the records after")
                    await until(
                        lambda: any(p.error_code == NotLeaderError.code for p in pushes),
                        "NotLeaderError pushed by the old leader",
                    )
                    assert pushes[-1].error_code == NotLeaderError.code, pushes
                    assert all(p.next_offset <= 10 for p in pushes), pushes
                    await until(
                        lambda: subscribed_here(new) == {(T, 0)} and not subscribed_here(old),
                        "pushed by the new leader only",
                    )
                    assert not old.stopped
                    rs = sub.routing_stats
                    assert rs.not_leader_retries >= 1, rs
                    assert rs.leader_moves == 1, rs
                    assert rs.metadata_refreshes > before.metadata_refreshes, rs
                    assert producer.routing_stats.leader_moves <= 1
            finally:
                await raw.close()
            check_once_in_order(got)
            assert [r.value for r in got] == [b"a%d" % i for i in range(10)] + [
                b"b%d" % i for i in range(10)
            ]

    asyncio.run(asyncio.wait_for(main(), 180))


async def move_lead(
    nodes: list[InProcessNode], old: InProcessNode, partition: int
) -> InProcessNode:
    """Write partition ``partition`` of ``T`` led by the next in-sync replica after
    ``old``'s node, at the next epoch, in etcd (compare-and-set on its version, as the
    controller writes; retried while a concurrent ISR change wins); its node."""
    node = old.cluster
    for _ in range(20):
        got = node.cache.partition(T, partition)
        assert got is not None
        state, version = got
        others = [r for r in state.isr if r != old.id]
        assert others, state
        moved = PartitionState(state.replicas, others[0], state.leader_epoch + 1, state.isr)
        if await node.store.set_partition(T, partition, moved, version):
            return next(n for n in nodes if n.id == others[0])
        await asyncio.sleep(0.2)
    raise AssertionError("the partition's state kept changing in etcd")


def test_a_leader_that_becomes_a_follower_stops_pushing_with_not_leader(
    tmp_path: Path,
) -> None:
    """Server side, roles set by hand (no etcd): a subscription on the leader gets its
    records; when that node becomes a follower (its log kept), it pushes NotLeaderError for
    the partition and nothing more, rather than go on serving a follower's copy."""
    from tests.cluster.test_replication import T as RT
    from tests.cluster.test_replication import cluster as bare_cluster
    from tests.cluster.test_replication import lead

    async def main() -> None:
        async with bare_cluster(tmp_path) as (nodes, _):
            n1, n2, _n3 = nodes
            await lead(nodes, n1, 0)
            async with AsyncClient(n1.addr) as c:
                await c.produce(RT, 0, [Message(b"x"), Message(b"y")])
            pushes: list[PushBody] = []
            t = Transport(n1.addr)
            t.on_push = lambda ev: pushes.append(decode_body(PushBody, ev.body))
            try:
                answer = await subscribe_from_0(t, 7, RT)
                assert answer.error_code == 0, answer
                await until(lambda: any(p.next_offset == 2 for p in pushes), "the records")
                await lead(nodes, n2, 1)
                async with AsyncClient(n2.addr) as c:
                    await c.produce(RT, 0, [Message(b"z")])
                await until(
                    lambda: any(p.error_code == NotLeaderError.code for p in pushes),
                    "NotLeaderError pushed",
                )
                last = pushes[-1]
                assert last.error_code == NotLeaderError.code, pushes
                assert all(p.next_offset <= 2 for p in pushes), pushes
            finally:
                await t.close()

    asyncio.run(asyncio.wait_for(main(), 120))


def test_a_group_member_in_push_mode_reads_every_partition_from_its_leader(
    tmp_path: Path, etcd: EtcdServer
) -> None:
    """``delivery="push"`` in a cluster: the member's subscriber subscribes each assigned
    partition on its leader; every record comes once, and its commit is kept."""

    async def main() -> None:
        async with (
            three_nodes(tmp_path, etcd, "push-group", PARTITIONS) as (nodes, bootstrap),
            AsyncClient(bootstrap) as client,
        ):
            leaders = await leaders_settled(nodes)
            per = 10
            async with AsyncProducer(bootstrap, linger_ms=0) as producer:
                for p in range(PARTITIONS):
                    for i in range(per):
                        await (await producer.send(T, f"{p}:{i}".encode(), partition=p))
            got: list[ConsumerRecord] = []
            async with AsyncGroupConsumer(
                bootstrap,
                "push-members",
                topics=[T],
                auto_offset_reset="earliest",
                delivery="push",
            ) as member:

                async def read() -> None:
                    while len(got) < PARTITIONS * per:
                        got.extend(await member.poll(0.5))

                await asyncio.wait_for(read(), WAIT_S * 2)
                for node in nodes:
                    led = {(T, p) for p, n in leaders.items() if n is node}
                    assert subscribed_here(node) == led, (node.id, led)
                await member.commit()
            check_once_in_order(got)
            assert sorted(r.value for r in got) == sorted(
                f"{p}:{i}".encode() for p in range(PARTITIONS) for i in range(per)
            )
            lag = {(x.topic, x.partition): x.lag for x in await client.group_lag("push-members")}
            assert lag == dict.fromkeys([(T, p) for p in range(PARTITIONS)], 0)

    asyncio.run(asyncio.wait_for(main(), 180))
