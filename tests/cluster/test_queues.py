"""Queues in a cluster: definitions replicated on every node, each durable queue served by its
owner (the leader of both partitions of ``__queue.<name>``), clients routed to it, and a new
owner carrying on when the old one's node goes.

Three in-process nodes (broker, TCP server, :class:`ClusterNode` with its real replica
manager) in one event loop, against the real etcd of the ``etcd`` fixture. Every wait is
bounded; nothing asserts on how long something took.
"""

from __future__ import annotations

import asyncio
import subprocess
import time
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from pathlib import Path

import httpx
import pytest

from tests.cli._support import stop
from tests.cluster._etcd import EtcdServer
from tests.cluster._inprocess import WAIT_S, InProcessNode, in_process_cluster, until
from tests.cluster._nodes import serve_with_http
from tidewire.broker.queues.definitions import DEFINITIONS_TOPIC
from tidewire.broker.queues.store import queue_topic
from tidewire.client import AsyncClient
from tidewire.client._queue_consumer import AsyncQueueConsumer
from tidewire.client._queue_messages import QueueMessage
from tidewire.cluster.metadata import PartitionState
from tidewire.cluster.queues import follow_owner
from tidewire.errors import (
    NotEnoughReplicasError,
    NotLeaderError,
    PreconditionFailedError,
    TidewireError,
)
from tidewire.records import BatchBuilder
from tidewire.storage import LogConfig


class Node(InProcessNode):
    """One node of the cluster (see :class:`InProcessNode`)."""

    def __init__(self, tmp: Path, etcd: EtcdServer, node_id: int) -> None:
        super().__init__(tmp, etcd, node_id, cluster_id="queues")


def cluster(tmp: Path, etcd: EtcdServer, n: int = 3) -> AbstractAsyncContextManager[list[Node]]:
    return in_process_cluster(lambda i: Node(tmp, etcd, i), n)


def serving(nodes: list[Node], queue: str) -> list[Node]:
    """The live nodes serving ``queue`` now (at most one, once settled)."""
    return [
        n
        for n in nodes
        if not n.stopped and any(q.spec.name == queue for q in n.broker.queues._queues.values())
    ]


def knows(nodes: list[Node], queue: str) -> Callable[[], bool]:
    """Whether every live node knows durable queue ``queue`` (its definition replicated)."""
    return lambda: all(
        queue in {q.spec.name for q in n.broker.queues.queues()} for n in nodes if not n.stopped
    )


async def take(consumer: AsyncQueueConsumer, n: int) -> list[QueueMessage]:
    """``n`` messages from ``consumer`` (bounded: fails after WAIT_S)."""
    out: list[QueueMessage] = []
    loop = asyncio.get_running_loop()
    deadline = loop.time() + WAIT_S
    while len(out) < n:
        assert loop.time() < deadline, f"got {len(out)} of {n} messages within {WAIT_S:.0f} s"
        msg = await consumer.get(timeout_s=1.0)
        if msg is not None:
            out.append(msg)
    return out


def test_the_state_partition_follows_the_owner() -> None:
    topic = queue_topic("jobs")
    owner = PartitionState((1, 2, 3), 2, 5, (1, 2, 3))
    state = PartitionState((1, 2, 3), 1, 4, (1, 2, 3))
    moved = follow_owner(topic, 1, state, owner, {1, 2, 3})
    assert moved == PartitionState((1, 2, 3), 2, 5, (1, 2, 3))
    # Not moved: the owner already leads it, is not in its ISR, is gone, or not a queue.
    assert follow_owner(topic, 1, moved, owner, {1, 2, 3}) is None
    assert follow_owner(topic, 1, PartitionState((1, 2, 3), 1, 4, (1, 3)), owner, {1, 2, 3}) is None
    assert follow_owner(topic, 1, state, owner, {1, 3}) is None
    assert follow_owner("orders", 1, state, owner, {1, 2, 3}) is None
    assert follow_owner(topic, 0, state, owner, {1, 2, 3}) is None


def test_declare_publish_consume_on_three_nodes_and_the_owner_stopped(
    tmp_path: Path, etcd: EtcdServer
) -> None:
    async def main() -> None:
        async with cluster(tmp_path, etcd) as nodes:
            n1, n2, n3 = nodes
            async with AsyncClient(n1.addr) as c1, AsyncClient(n2.addr) as c2:
                await c1.declare_queue("jobs", durable=True)
                await until(knows(nodes, "jobs"), "every node knows the queue")
                await until(lambda: len(serving(nodes, "jobs")) == 1, "an owner serves it")
                (owner,) = serving(nodes, "jobs")
                # __queue_definitions is on every node.
                for n in nodes:
                    assert (DEFINITIONS_TOPIC, 0) in n.broker.logs.logs
                # A node that is not the owner answers NotLeaderError naming it.
                other = next(n for n in nodes if n is not owner)
                with pytest.raises(NotLeaderError) as refused:
                    other.broker.queues.describe_queue("jobs")
                assert refused.value.leader_id == owner.id

                # Published through node 2 (routed to the owner), each confirmed.
                for i in range(20):
                    await c2.publish("", "jobs", f"m{i}")
                # Consumed through node 3 first (routed to the owner); 10 acked, the rest held.
                addrs = [n3.addr, n1.addr, n2.addr]
                async with AsyncQueueConsumer(addrs, "jobs", prefetch=15) as consumer:
                    got = await take(consumer, 15)
                    acked = got[:10]
                    await consumer.ack_many(acked)
                    acked_values = {m.value for m in acked}
                    assert len(acked_values) == 10

                    status = owner.broker.queues.describe_queue("jobs")
                    assert status.unacked + status.ready == 10

                    await owner.stop()
                    await until(lambda: len(serving(nodes, "jobs")) == 1, "a new owner")
                    (new_owner,) = serving(nodes, "jobs")
                    assert new_owner is not owner

                    # The consumer follows the new owner: what it held comes again, and
                    # what was never delivered; nothing acknowledged comes again.
                    rest = await take(consumer, 10)
                    values = {m.value for m in rest}
                    assert not values & acked_values
                    assert values | acked_values == {f"m{i}".encode() for i in range(20)}
                    await consumer.ack_many(rest)
                    assert await consumer.get(timeout_s=0.3) is None

                # Publishing goes on at the new owner.
                live = next(n for n in nodes if not n.stopped)
                async with AsyncClient(live.addr) as c:
                    await c.publish("", "jobs", "after")
                    msgs = await c.get("jobs", wait_ms=5000)
                    assert [m.value for m in msgs] == [b"after"]
                    await msgs[0].ack()

    asyncio.run(main())


def test_a_live_owner_that_hands_the_queue_over_moves_its_consumer(
    tmp_path: Path, etcd: EtcdServer
) -> None:
    """The owner stays up but stops leading the queue's partition 0: the controller moves
    partition 1 after it, the new owner serves the queue, and the consumer, told it was
    cancelled, consumes there."""

    async def main() -> None:
        async with cluster(tmp_path, etcd) as nodes, AsyncClient([n.addr for n in nodes]) as c:
            await c.declare_queue("moving", durable=True)
            await until(lambda: len(serving(nodes, "moving")) == 1, "an owner serves it")
            (owner,) = serving(nodes, "moving")
            for i in range(4):
                await c.publish("", "moving", f"a{i}")
            # Connected to the owner first: the consumer learns of the cluster only when
            # the queue moves.
            addrs = [owner.addr, *(n.addr for n in nodes if n is not owner)]
            async with AsyncQueueConsumer(addrs, "moving", prefetch=10) as consumer:
                first = await take(consumer, 4)
                assert first[0].value == b"a0"
                await consumer.ack_many(first[:1])  # the others stay held
                topic = queue_topic("moving")
                got = owner.cluster.cache.partition(topic, 0)
                assert got is not None
                assert await owner.cluster.resign(topic, 0, got[0].leader_epoch)
                await until(lambda: serving(nodes, "moving") not in ([], [owner]), "another owner")
                (new_owner,) = serving(nodes, "moving")
                for p in (0, 1):  # it leads both partitions
                    state = new_owner.cluster.cache.partition(topic, p)
                    assert state is not None
                    assert state[0].leader == new_owner.id
                rest = await take(consumer, 3)
                assert {m.value for m in rest} == {b"a1", b"a2", b"a3"}
                await consumer.ack_many(rest)

    asyncio.run(main())


def test_an_owner_below_min_insync_refuses_publishes_and_acks(
    tmp_path: Path, etcd: EtcdServer
) -> None:
    async def main() -> None:
        async with cluster(tmp_path, etcd) as nodes, AsyncClient([n.addr for n in nodes]) as c:
            await c.declare_queue("few", durable=True)
            await until(lambda: len(serving(nodes, "few")) == 1, "an owner serves it")
            (owner,) = serving(nodes, "few")
            await c.publish("", "few", "kept")
            held = (await owner.broker.queues.get("few", owner="x")).entries[0]
            for n in nodes:
                if n is not owner:
                    await n.stop()
            topic = queue_topic("few")

            def alone() -> bool:  # as the owner's replica manager sees both partitions
                rep = owner.broker.replication
                assert rep is not None
                return not any(rep.check_leader(topic, p).can_append_acks_all() for p in (0, 1))

            await until(alone, "the owner alone in the ISR of both partitions")
            b = BatchBuilder()
            b.append(b"refused", timestamp_ms=1)
            with pytest.raises(NotEnoughReplicasError):  # min_insync_replicas is 2
                await owner.broker.queues.publish("", "few", b.build())
            with pytest.raises(NotEnoughReplicasError):
                await owner.broker.queues.settle("few", [held.tag], "ack", owner="x")
            status = owner.broker.queues.describe_queue("few")
            assert (status.ready, status.unacked) == (0, 1)  # nothing stored

    asyncio.run(main())


def test_confirmed_publishes_survive_the_owner_stopped_under_load(
    tmp_path: Path, etcd: EtcdServer
) -> None:
    async def main() -> None:
        async with cluster(tmp_path, etcd) as nodes, AsyncClient([n.addr for n in nodes]) as c:
            await c.declare_queue("load", durable=True)
            await until(lambda: len(serving(nodes, "load")) == 1, "an owner serves it")
            (owner,) = serving(nodes, "load")
            confirmed: set[bytes] = set()
            stop_at = 40  # the owner is stopped once this many are confirmed

            async def publisher() -> None:
                for i in range(120):
                    value = f"p{i}".encode()
                    for _ in range(100):  # bounded: retried while the owner moves
                        try:
                            await c.publish("", "load", value)
                        except TidewireError as exc:
                            if not exc.retriable:
                                raise
                            await asyncio.sleep(0.1)
                            continue
                        confirmed.add(value)
                        break
                    else:
                        raise AssertionError(f"{value!r} never confirmed")

            task = asyncio.create_task(publisher())
            await until(lambda: len(confirmed) >= stop_at, "publishes confirmed")
            await owner.stop()
            await asyncio.wait_for(task, WAIT_S)
            await until(lambda: len(serving(nodes, "load")) == 1, "a new owner")

            received: set[bytes] = set()
            for _ in range(200):  # bounded
                msgs = await c.get("load", max_messages=100, wait_ms=200)
                if not msgs:
                    break
                received.update(m.value for m in msgs)
                await c.settle("load", [m.delivery_tag for m in msgs], "ack")
            assert confirmed <= received, sorted(confirmed - received)

    asyncio.run(main())


def test_dead_letters_and_an_exchange_reach_queues_of_other_owners(
    tmp_path: Path, etcd: EtcdServer
) -> None:
    async def main() -> None:
        async with cluster(tmp_path, etcd) as nodes:
            n1, _, n3 = nodes
            async with AsyncClient(n1.addr) as c1, AsyncClient(n3.addr) as c3:
                await c1.declare_exchange("dlx", "direct", durable=True)
                await c1.declare_exchange("all", "fanout", durable=True)
                await c1.declare_queue("dead", durable=True)
                await c1.bind("dlx", "dead", "work")
                await c1.declare_queue("work", durable=True, dead_letter_exchange="dlx")
                names = [f"q{i}" for i in range(4)]
                for q in names:
                    await c1.declare_queue(q, durable=True)
                    await c1.bind("all", q)
                for q in ["dead", "work", *names]:
                    await until(knows(nodes, q), f"every node knows {q}")
                    await until(lambda q=q: len(serving(nodes, q)) == 1, f"{q} is served")

                # A fanout publish through node 3 reaches every queue, whoever owns it.
                result = await c3.publish("all", "", "fan")
                assert sorted(result.queues) == names
                for q in names:
                    msgs = await c3.get(q, wait_ms=5000)
                    assert [m.value for m in msgs] == [b"fan"], q
                    await msgs[0].ack()

                # A rejected message of "work" reaches "dead" through the exchange "dlx".
                await c3.publish("", "work", "bad")
                (msg,) = await c3.get("work", wait_ms=5000)
                await msg.reject()
                dead = await c3.get("dead", wait_ms=10_000)
                assert [m.value for m in dead] == [b"bad"]
                assert dict(dead[0].headers).get("x-first-death-queue") == b"work"
                await dead[0].ack()

                # The definitions are changed on their leader only; the client finds it.
                await c3.delete_queue("q0")
                await until(
                    lambda: (
                        not any(
                            "q0" in {q.spec.name for q in n.broker.queues.queues()} for n in nodes
                        )
                    ),
                    "every node forgot q0",
                )
                await until(
                    lambda: all(queue_topic("q0") not in n.cluster.cache.topics for n in nodes),
                    "its topic is deleted",
                )

    asyncio.run(main())


def test_a_node_that_joins_later_learns_the_definitions(tmp_path: Path, etcd: EtcdServer) -> None:
    async def main() -> None:
        async with cluster(tmp_path, etcd, n=2) as nodes:
            async with AsyncClient(nodes[0].addr) as c:
                await c.declare_exchange("events", "topic", durable=True)
                await c.declare_queue("audit", durable=True)
                await c.bind("events", "audit", "user.#")
            late = Node(tmp_path, etcd, 3)
            try:
                await late.start()
                await until(knows([late], "audit"), "the late node knows the queue")
                await until(
                    lambda: "events" in late.broker.queues.router.exchanges,
                    "the late node knows the exchange",
                )
                bound = late.broker.queues.bindings(exchange="events")
                assert [(b.destination, b.key) for b in bound] == [("audit", "user.#")]
                # A publish through it reaches the queue (forwarded to its owner).
                async with AsyncClient(late.addr) as c3:
                    result = await c3.publish("events", "user.created", "hello")
                    assert result.queues == ("audit",)
                    msgs = await c3.get("audit", wait_ms=5000)
                    assert [m.value for m in msgs] == [b"hello"]
            finally:
                await late.stop()

    asyncio.run(main())


def test_followers_give_back_the_segments_their_leader_gave_back(
    tmp_path: Path, etcd: EtcdServer
) -> None:
    """What a queue's owner deletes below its oldest unsettled message, its replicas delete
    too (shown on a plain topic with small segments: the rule is the fetcher's)."""

    async def main() -> None:
        async with cluster(tmp_path, etcd) as nodes:
            await nodes[0].cluster.create_topic("small", 1, LogConfig(segment_bytes=1024), 3)
            got = nodes[0].cluster.cache.partition("small", 0)
            assert got is not None
            (leader,) = [n for n in nodes if n.id == got[0].leader]
            followers = [n for n in nodes if n is not leader]
            await until(
                lambda: all(("small", 0) in n.broker.logs.logs for n in nodes), "replicas made"
            )
            # A node makes the log before it takes its role: produce only once it leads.
            await until(
                lambda: leader.broker.replication.leads("small", 0),  # type: ignore[union-attr]
                "the leader has its role",
            )
            for i in range(40):
                b = BatchBuilder()
                b.append(b"x" * 200, timestamp_ms=1 + i)
                await leader.broker.produce("small", 0, b.build())
            plog = leader.broker.logs.get_log("small", 0)
            end = plog.log_end_offset
            await until(
                lambda: all(
                    f.broker.logs.get_log("small", 0).log_end_offset == end for f in followers
                ),
                "the followers copied everything",
            )
            plog.delete_before(30)
            start = plog.log_start_offset
            assert start > 0
            b = BatchBuilder()
            b.append(b"y", timestamp_ms=99)
            await leader.broker.produce("small", 0, b.build())  # a fetch answer carries it
            await until(
                lambda: all(
                    f.broker.logs.get_log("small", 0).log_start_offset == start for f in followers
                ),
                "the followers' logs start where the leader's does",
            )

    asyncio.run(main())


def _eventually(check: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while not check():
        assert time.monotonic() < deadline, f"not within {WAIT_S:.0f} s: {what}"
        time.sleep(0.1)


@pytest.mark.slow  # three serve processes (the default tier has the in-process tests above)
def test_http_routes_reach_the_owner_and_a_killed_owner_is_replaced(
    tmp_path: Path, etcd: EtcdServer
) -> None:
    cluster_url = f"etcd://{etcd.endpoint.removeprefix('http://')}"
    procs: list[subprocess.Popen[str]] = []
    try:
        http: list[int] = []
        for n in (1, 2, 3):
            proc, _, port = serve_with_http(tmp_path / f"n{n}", cluster_url, n)
            procs.append(proc)
            http.append(port)
        urls = [f"http://127.0.0.1:{p}" for p in http]
        follow = httpx.Client(follow_redirects=True, timeout=WAIT_S)
        plain = httpx.Client(follow_redirects=False, timeout=WAIT_S)

        def live_nodes() -> bool:
            r = plain.get(f"{urls[0]}/v1/cluster")
            return r.status_code == 200 and len(r.json().get("nodes", [])) == 3

        _eventually(live_nodes, "three nodes registered")
        # A transient queue declared on node 1: the others describe it (with its node's
        # counts) and forward its operations to it, and its messages go through any node.
        r = plain.put(f"{urls[0]}/v1/queues/temp", json={"durable": False})
        assert r.status_code in (200, 201), r.text

        def known() -> bool:
            for url in urls[1:]:
                r = plain.get(f"{url}/v1/queues/temp")
                if r.status_code != 200 or r.json()["durable"] is not False:
                    return False
            return True

        _eventually(known, "nodes 2 and 3 know the transient queue")
        # Forwarded to node 1 (http_cluster_routing "forward", the default) and answered
        # there: it holds no such tag.
        r = plain.post(f"{urls[1]}/v1/queues/temp/ack", json={"tags": [1]})
        assert r.status_code == 409, r.text
        body = {"routing_key": "temp", "messages": [{"value": "t0"}]}
        r = follow.post(f"{urls[2]}/v1/exchanges/amq.default/publish", json=body)
        assert r.status_code == 200, r.text
        r = plain.get(f"{urls[1]}/v1/queues")
        assert r.status_code == 200, r.text
        assert {q["name"]: q["ready"] for q in r.json()["queues"]}["temp"] == 1
        r = follow.post(f"{urls[1]}/v1/queues/temp/get", json={"max_messages": 1})
        assert r.status_code == 200, r.text
        assert [m["value"] for m in r.json()["messages"]] == ["t0"]

        r = follow.put(f"{urls[0]}/v1/queues/jobs", json={})
        assert r.status_code in (200, 201), r.text

        def owner() -> int | None:
            """The index of the live node that owns the queue (the leader of its topic's
            partition 0, as a live node's metadata names it: any node answers the queue's
            description, with its owner's counts) once it serves it."""
            for url, proc in zip(urls, procs, strict=True):
                if proc.poll() is not None:
                    continue
                try:
                    r = plain.get(f"{url}/v1/cluster/partitions", params={"topic": "__queue.jobs"})
                except httpx.TransportError:
                    continue
                leaders = [p["leader"] for p in r.json()["partitions"] if p["partition"] == 0]
                if r.status_code != 200 or not leaders or not 1 <= leaders[0] <= 3:
                    return None
                i = leaders[0] - 1  # node ids 1..3, in order
                if procs[i].poll() is not None:
                    return None
                try:  # served there: answered, not redirected
                    served = plain.get(f"{urls[i]}/v1/queues/jobs").status_code == 200
                except httpx.TransportError:
                    return None
                return i if served else None
            return None

        _eventually(lambda: owner() is not None, "an owner serves the queue")
        first = owner()
        assert first is not None
        other = (first + 1) % 3
        # Its operations on another node are forwarded to it and answered there.
        r = plain.post(f"{urls[other]}/v1/queues/jobs/ack", json={"tags": [1]})
        assert r.status_code == 409, r.text

        # Published through a non-owner (routed to its owner), taken and acked through another.
        body = {"routing_key": "jobs", "messages": [{"value": f"m{i}"} for i in range(6)]}
        r = follow.post(f"{urls[other]}/v1/exchanges/amq.default/publish", json=body)
        assert r.status_code == 200, r.text
        third = (first + 2) % 3
        r = follow.post(f"{urls[third]}/v1/queues/jobs/get", json={"max_messages": 3})
        assert r.status_code == 200, r.text
        got = r.json()["messages"]
        assert [m["value"] for m in got] == ["m0", "m1", "m2"]
        r = follow.post(f"{urls[third]}/v1/queues/jobs/ack", json={"tags": [got[0]["tag"]]})
        assert r.status_code == 200, r.text

        # The owner killed: another node serves the queue; what was acked is gone, what was
        # held comes again, nothing confirmed is lost.
        procs[first].kill()
        procs[first].wait(timeout=WAIT_S)
        _eventually(lambda: owner() not in (None, first), "a new owner serves the queue")
        new = owner()
        assert new is not None

        values: list[str] = []

        def drained() -> bool:
            r = follow.post(
                f"{urls[new]}/v1/queues/jobs/get", json={"max_messages": 10, "wait_ms": 200}
            )
            if r.status_code != 200:
                return False
            msgs = r.json()["messages"]
            values.extend(m["value"] for m in msgs)
            if msgs:
                tags = [m["tag"] for m in msgs]
                assert follow.post(f"{urls[new]}/v1/queues/jobs/ack", json={"tags": tags})
            return sorted(values) == [f"m{i}" for i in range(1, 6)]

        _eventually(drained, f"m1..m5 delivered again by the new owner (got {values})")
        follow.close()
        plain.close()
    finally:
        for proc in procs:
            stop(proc)


def _definitions_leader(nodes: list[Node]) -> Node:
    got = nodes[0].cluster.cache.partition(DEFINITIONS_TOPIC, 0)
    assert got is not None
    return next(n for n in nodes if n.id == got[0].leader)


async def _served_elsewhere(
    nodes: list[Node], c: AsyncClient, prefix: str, **settings: bool
) -> tuple[str, Node]:
    """A durable queue (named ``prefix<i>``) whose owner is not the leader of the
    definitions, with that owner (owners are drawn at random: a few tries at most)."""
    for i in range(20):
        name = f"{prefix}{i}"
        await c.declare_queue(name, durable=True, **settings)
        await until(knows(nodes, name), f"every node knows {name}")
        await until(lambda n=name: len(serving(nodes, n)) == 1, f"an owner serves {name}")
        (owner,) = serving(nodes, name)
        if owner is not _definitions_leader(nodes):
            return name, owner
    raise AssertionError("20 queues, all owned by the leader of the definitions")


def test_deletes_check_the_owner_wherever_it_is(tmp_path: Path, etcd: EtcdServer) -> None:
    async def main() -> None:
        async with cluster(tmp_path, etcd) as nodes:
            addrs = [n.addr for n in nodes]
            async with AsyncClient(addrs) as c:
                name, owner = await _served_elsewhere(nodes, c, "del")
                leader = _definitions_leader(nodes)
                assert owner is not leader
                await c.publish("", name, "one")
                with pytest.raises(PreconditionFailedError, match=r"holds 1 messages \(if_empty"):
                    await c.delete_queue(name, if_empty=True)
                async with AsyncQueueConsumer(owner.addr, name, prefetch=1) as consumer:
                    (msg,) = await take(consumer, 1)
                    await consumer.ack_many([msg])
                    with pytest.raises(PreconditionFailedError, match=r"1 consumers \(if_unused"):
                        await c.delete_queue(name, if_unused=True)
                await until(
                    lambda: not owner.broker.queues.describe_queue(name).consumers,
                    "the consumer gone",
                )
                # Empty and unused as its owner counts it: deleted, everywhere.
                assert await c.delete_queue(name, if_empty=True, if_unused=True) == 0
                await until(
                    lambda: all(
                        name not in {q.spec.name for q in n.broker.queues.queues()} for n in nodes
                    ),
                    "every node forgot the queue",
                )
                assert not serving(nodes, name)

                # auto_delete: the last consumer leaving its owner deletes it.
                auto, owner = await _served_elsewhere(nodes, c, "auto", auto_delete=True)
                await c.publish("", auto, "kept until the consumer leaves")
                async with AsyncQueueConsumer(owner.addr, auto, prefetch=1) as consumer:
                    await take(consumer, 1)
                await until(
                    lambda: all(
                        auto not in {q.spec.name for q in n.broker.queues.queues()} for n in nodes
                    ),
                    "the auto_delete queue deleted on every node",
                )
                await until(
                    lambda: all(queue_topic(auto) not in n.cluster.cache.topics for n in nodes),
                    "its topic deleted through etcd",
                )

    asyncio.run(main())


def transient_owner(nodes: list[Node], queue: str) -> int:
    """The node a live node's copy of the metadata names as transient ``queue``'s (-1)."""
    live = next(n for n in nodes if not n.stopped)
    return live.cluster.cache.transient_queues.get(queue, -1)


def test_a_transient_queue_is_its_declaring_node_s_and_reachable_from_every_node(
    tmp_path: Path, etcd: EtcdServer
) -> None:
    """A transient (not durable, not exclusive) queue is served by the node that declared
    it, which records itself as its owner in etcd: clients of other nodes are routed there
    (publish, get, consume, declare again, delete); the broker forwards an exchange's
    publish to it; it goes with its node. An exclusive queue stays its connection's."""

    async def main() -> None:
        async with cluster(tmp_path, etcd) as nodes:
            n1, n2, n3 = nodes
            async with AsyncClient(n1.addr) as c1, AsyncClient(n2.addr) as c2:
                await c1.declare_queue("temp", durable=False)
                await until(
                    lambda: (
                        transient_owner(nodes, "temp") == n1.id
                        and all(transient_owner([n], "temp") == n1.id for n in nodes)
                    ),
                    "every node knows the transient queue's owner",
                )
                assert serving(nodes, "temp") == [n1]
                # Another node answers NotLeaderError naming the owner.
                with pytest.raises(NotLeaderError) as refused:
                    n2.broker.queues.describe_queue("temp")
                assert refused.value.leader_id == n1.id
                # Declared again through another node with the same settings: the same
                # queue (its owner answers); other settings: refused.
                info = await c2.declare_queue("temp", durable=False)
                assert info.name == "temp"
                with pytest.raises(PreconditionFailedError):
                    await c2.declare_queue("temp", durable=False, max_length=5)
                with pytest.raises(PreconditionFailedError):  # no durable twin either
                    await c2.declare_queue("temp", durable=True)
                # Published through node 2, taken through node 2 and consumed through node 3.
                for i in range(4):
                    await c2.publish("", "temp", f"t{i}")
                # Listed by every node (its settings), with its owner's counts by a client.
                assert all("temp" in {q.spec.name for q in n.broker.queues.queues()} for n in nodes)
                listed = {q.name: q for q in await c2.list_queues()}
                assert not listed["temp"].durable
                assert listed["temp"].ready == 4
                got = await c2.get("temp", wait_ms=5000)
                assert [m.value for m in got] == [b"t0"]
                await got[0].ack()
                async with AsyncQueueConsumer([n3.addr], "temp", prefetch=10) as consumer:
                    rest = await take(consumer, 3)
                    assert [m.value for m in rest] == [b"t1", b"t2", b"t3"]
                    await consumer.ack_many(rest)
                # An exchange's publish on node 3 reaches it (forwarded to its owner).
                async with AsyncClient(n3.addr) as c3:
                    await c3.declare_exchange("fan", "fanout", durable=False)
                    await c3.bind("fan", "temp")
                    published = await c3.publish("fan", "", "via-fan")
                    assert published.queues == ("temp",)
                    got = await c3.get("temp", wait_ms=5000)
                    assert [m.value for m in got] == [b"via-fan"]
                    await got[0].ack()
                # Deleted through node 2: gone, its record too; the name is free again.
                await c2.delete_queue("temp")
                await until(lambda: transient_owner(nodes, "temp") == -1, "the record gone")
                assert serving(nodes, "temp") == []
                assert "temp" not in {q.name for q in await c2.list_queues()}

                # An exclusive queue stays its connection's: other nodes do not know it.
                await c1.declare_queue("mine", durable=False, exclusive=True)
                assert "mine" not in n1.cluster.cache.transient_queues
                with pytest.raises(TidewireError):
                    await c2.get("mine")

                # Its node gone, a transient queue is gone (as its messages, in memory).
                await c1.declare_queue("short", durable=False)
                await c1.publish("", "short", "lost")
                await until(lambda: transient_owner(nodes, "short") == n1.id, "recorded")
            await n1.stop()
            await until(lambda: transient_owner(nodes, "short") == -1, "the record gone")
            async with AsyncClient(n2.addr) as c2:
                with pytest.raises(TidewireError):
                    await c2.get("short")
                await c2.declare_queue("short", durable=False)  # anew, on node 2
                await until(lambda: transient_owner(nodes, "short") == n2.id, "node 2's now")

    asyncio.run(main())


def test_a_node_registered_again_records_its_transient_queues_again(
    tmp_path: Path, etcd: EtcdServer
) -> None:
    """The records of a node's transient queues are on its lease: when it loses the lease
    (revoked here, as etcd does to a node cut off past the session) and registers again,
    it records the transient queues it still serves again."""

    async def main() -> None:
        async with cluster(tmp_path, etcd, n=2) as nodes:
            n1, n2 = nodes
            async with AsyncClient(n1.addr) as c1:
                await c1.declare_queue("kept", durable=False)
                await c1.publish("", "kept", "still-here")
            await until(lambda: transient_owner(nodes, "kept") == n1.id, "recorded")
            old = n1.cluster.lease.id
            await n1.cluster.etcd.revoke(old)
            await until(
                lambda: n1.cluster.lease.id != old and transient_owner([n2], "kept") == n1.id,
                "registered again, the queue recorded again",
            )
            async with AsyncClient(n2.addr) as c2:
                got = await c2.get("kept", wait_ms=5000)
                assert [m.value for m in got] == [b"still-here"]
                await got[0].ack()

    asyncio.run(main())
