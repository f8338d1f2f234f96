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
from tests.cluster._inprocess import until
from tests.cluster._secure import NODE_PRINCIPAL, SecureCluster, acl, secure_cluster
from tidewire.client import Message
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


NODE_GRANT = acl(NODE_PRINCIPAL, "cluster", "cluster", "cluster_action")
