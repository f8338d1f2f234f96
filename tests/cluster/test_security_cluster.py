"""A cluster with authentication and authorization on, end to end (docs/cluster.md,
"Security"): three in-process nodes (tests/cluster/_secure.py) whose links to each other
authenticate with the node principal's key.

- Replication and the copying of ``__security`` run as the node principal, which needs
  ``cluster_action`` and nothing else for them.
- An ACL change made on one node holds on every node.
- The routed clients, with a user's key, produce, fetch, commit, use queues and streams on
  any node.
- What a node forwards over HTTP (multi-partition reads, SSE and WebSocket streams, group
  streams, msgbus and iPubSub, queue publishes through an exchange) runs as the node
  principal with the documented grant (:data:`NODE_GRANT`), and a caller without rights is
  refused on the node it reached: the node principal's rights are never lent to it.

Every wait is bounded; nothing is timed.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from pathlib import Path

import pytest

from tests.cluster._etcd import EtcdServer
from tests.cluster._inprocess import WAIT_S, until
from tests.cluster._secure import NODE_PRINCIPAL, SecureCluster, acl, secure_cluster
from tidewire.client import AsyncGroupConsumer, AsyncQueueConsumer, Credentials, Message
from tidewire.errors import AuthorizationFailedError
from tidewire.protocol.messages import ACKS_DURABLE, AclEntry

#: The most one test may take, bounded (it takes seconds).
TEST_S = 180.0
T = "orders"


def run(main: Awaitable[None]) -> None:
    async def bounded() -> None:
        await asyncio.wait_for(main, TEST_S)

    asyncio.run(bounded())


async def make_user(c: SecureCluster, name: str, *entries: AclEntry) -> str:
    """A user ``name`` with ``entries``, made on the leader of ``__security`` and applied on
    every node; its key."""
    async with c.nodes[0].client(c.admin) as admin:
        await admin.create_principal(name)
        _, key = await admin.create_api_key(name)
        if entries:
            await admin.add_acls(list(entries))
    await c.settled()
    return key


async def create_topic(c: SecureCluster, topic: str, partitions: int) -> None:
    """``topic`` with ``partitions`` partitions on every node, each with a leader and every
    replica in sync."""
    async with c.nodes[0].client(c.admin) as admin:
        await admin.create_topic(topic, partitions=partitions, replication_factor=3)

    def placed() -> bool:
        for n in c.nodes:
            for p in range(partitions):
                got = n.cluster.cache.partition(topic, p)
                if got is None or got[0].leader < 0 or len(got[0].isr) != 3:
                    return False
        return True

    await until(placed, f"{topic} placed, every replica in sync")


def test_replication_and_security_copies_run_as_the_node_principal(
    tmp_path: Path, etcd: EtcdServer
) -> None:
    """Formed as the docs say, every node holds node 1's security state (its admin
    authenticates on each node) and an acks=all produce, answered only once a follower
    copied it as the node principal, is on every replica."""

    async def main() -> None:
        async with secure_cluster(tmp_path, etcd, "sec-replication") as c:
            for n in c.nodes:
                async with n.client(c.admin) as admin:
                    assert (await admin.whoami()).principal == "admin"
            await create_topic(c, T, 1)
            async with c.nodes[1].client(c.admin, *c.nodes) as admin:
                offset = await admin.produce(T, 0, [Message(b"x")], acks=ACKS_DURABLE)
            assert offset == 0
            await until(
                lambda: all(n.broker.log(T, 0).log_end_offset == 1 for n in c.nodes),
                "every replica holds the record",
            )

    run(main())


def test_an_acl_change_on_one_node_holds_on_every_node(tmp_path: Path, etcd: EtcdServer) -> None:
    """A grant made on the leader of ``__security`` lets the user in on every node; its
    removal refuses it on every node, on connections opened before the change too."""

    async def main() -> None:
        async with secure_cluster(tmp_path, etcd, "sec-acls") as c:
            await create_topic(c, T, 1)
            key = await make_user(c, "dana")
            clients = [n.client(key) for n in c.nodes]
            try:
                for client in clients:
                    with pytest.raises(AuthorizationFailedError):
                        await client.describe_topic(T)
                read = acl("dana", "topic", T, "describe")
                await c.grant(*read)
                for client in clients:  # the same connections
                    assert (await client.describe_topic(T)).name == T
                await c.revoke(*read)
                for client in clients:
                    with pytest.raises(AuthorizationFailedError):
                        await client.describe_topic(T)
            finally:
                for client in clients:
                    await client.close()

    run(main())


async def check_group(c: SecureCluster, key: str) -> None:
    """A group member with ``key``, bootstrapped on node 3, reads ``T`` and commits at the
    group's coordinator (wherever that is); the commit is there for any node to tell."""
    async with AsyncGroupConsumer(
        [c.nodes[2].addr],
        "billing",
        topics=[T],
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        credentials=Credentials(key),
    ) as member:
        got: list[bytes] = []
        loop = asyncio.get_running_loop()
        deadline = loop.time() + WAIT_S
        while len(got) < 3:
            assert loop.time() < deadline, f"read {got} within {WAIT_S:.0f} s"
            got.extend(r.value or b"" for r in await member.poll(0.2))
        assert sorted(got) == [b"m0", b"m1", b"m2"]
        await member.commit()
    async with c.nodes[0].client(key) as app:
        committed = await app.committed_offsets("billing")
    assert committed == {(T, p): 1 for p in range(3)}


async def check_queue(c: SecureCluster, key: str) -> None:
    """Publishes through every node reach the queue's owner; a consumer bootstrapped on
    another node takes and acknowledges them."""
    for i, n in enumerate(c.nodes):
        async with n.client(key) as app:
            await app.publish("", "jobs", f"j{i}")
    async with AsyncQueueConsumer(
        [c.nodes[1].addr], "jobs", prefetch=10, credentials=Credentials(key)
    ) as consumer:
        got = []
        loop = asyncio.get_running_loop()
        deadline = loop.time() + WAIT_S
        while len(got) < 3:
            assert loop.time() < deadline, f"took {len(got)} of 3 within {WAIT_S:.0f} s"
            msg = await consumer.get(timeout_s=1.0)
            if msg is not None:
                got.append(msg)
        await consumer.ack_many(got)
    assert sorted(m.value for m in got) == [b"j0", b"j1", b"j2"]


async def check_streams(c: SecureCluster, key: str) -> None:
    """Streams of several owners sent to and received through one node."""
    streams = [f"s-{i}" for i in range(8)]
    async with c.nodes[0].client(key) as app:
        for s in streams:
            await app.streams.send(s, s, persistent=True)
        for s in streams:
            got = await app.streams.receive(s, wait_ms=5_000)
            assert got is not None, s
            assert got.value == s.encode()


NODE_GRANT = acl(NODE_PRINCIPAL, "cluster", "cluster", "cluster_action")


def test_routed_clients_with_a_user_s_key_on_any_node(tmp_path: Path, etcd: EtcdServer) -> None:
    """A user allowed exactly what it does, bootstrapped on one node: produce and fetch on
    every partition's leader, a group's commits at its coordinator, a queue at its owner,
    streams at their owners. A user without those rights is refused each of them."""

    async def main() -> None:
        async with secure_cluster(tmp_path, etcd, "sec-clients") as c:
            await create_topic(c, T, 3)
            async with c.nodes[0].client(c.admin) as admin:
                await admin.declare_queue("jobs", durable=True)
            key = await make_user(
                c,
                "app",
                *acl("app", "topic", T, "read", "write"),
                *acl("app", "group", "billing", "read"),
                *acl("app", "queue", "jobs", "read", "write"),
                *acl("app", "exchange", "amq.default", "write"),
                *acl("app", "stream", "*", "read", "write"),
            )
            eve = await make_user(c, "eve")
            leaders = {c.nodes[0].cluster.cache.partition(T, p)[0].leader for p in range(3)}  # type: ignore[index]
            async with c.nodes[1].client(key) as app:
                for p in range(3):
                    assert await app.produce(T, p, [Message(f"m{p}".encode())]) == 0
                for p in range(3):
                    got = await app.fetch(T, p, 0)
                    assert [r.value for r in got.records] == [f"m{p}".encode()]
            assert len(leaders) > 1  # the client went to more than one node
            await check_group(c, key)
            await check_queue(c, key)
            await check_streams(c, key)
            async with c.nodes[1].client(eve) as nobody:
                with pytest.raises(AuthorizationFailedError):
                    await nobody.produce(T, 0, [Message(b"no")])
                with pytest.raises(AuthorizationFailedError):
                    await nobody.fetch(T, 0, 0)
                with pytest.raises(AuthorizationFailedError):
                    await nobody.publish("", "jobs", "no")
                with pytest.raises(AuthorizationFailedError):
                    await nobody.streams.send("s-0", "no")
            assert all(n.broker.log(T, 0).log_end_offset == 1 for n in c.nodes)

    run(main())
