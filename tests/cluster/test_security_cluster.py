"""A cluster with authentication and authorization on, end to end (docs/cluster.md,
"Security"): three in-process nodes (tests/cluster/_secure.py) whose links to each other
authenticate with the node principal's key, and one test with real ``tidewire serve``
processes (slow tier).

- Replication and the copying of ``__security`` run as the node principal.
- An ACL change made on one node holds on every node, on connections already open.
- The routed clients, with a user's key, produce, fetch, commit, use queues and streams on
  any node; a user without the rights is refused.
- What a node forwards (multi-partition reads, SSE and WebSocket streams, WebSocket group
  members, group listings, msgbus publishes, subscribers and pops, iPubSub and stream
  requests, queue publishes through an exchange, a queue's counts, WebSocket route and
  deletes where another node owns it) runs as the node principal with the built-in role
  ``node``, which is exactly what those requests ask for; a caller without rights is
  refused on the node it reached, and the node asks nothing on its behalf.
- The audit query on four nodes: a node asks another for a log it holds no copy of, as the
  node principal; a user needs ``admin`` on the cluster.
- A certificate's subject registered with the role may copy logs; a publish needs
  ``create`` only when the cluster lacks the topic.

Every wait is bounded; nothing is timed.
"""

from __future__ import annotations

import asyncio
import base64
import json
import re
import subprocess
from collections.abc import Awaitable
from pathlib import Path
from typing import Any

import httpx
import pytest
from websockets.asyncio.client import connect as ws_connect
from websockets.exceptions import InvalidStatus

from tests.cli._support import popen_serve, run_cli, stop
from tests.cluster._etcd import EtcdServer
from tests.cluster._inprocess import WAIT_S, until
from tests.cluster._nodes import wait_until
from tests.cluster._secure import (
    IPUBSUB,
    MSGBUS,
    NODE_PRINCIPAL,
    SECURITY,
    SecureCluster,
    SecureNode,
    acl,
    bootstrap_key,
    secure_cluster,
)
from tidewire.broker import Broker, BrokerConfig
from tidewire.broker.offsets import STREAMS_TOPIC
from tidewire.broker.queues.definitions import DEFINITIONS_TOPIC
from tidewire.broker.streams.model import partition_of
from tidewire.client import (
    AsyncGroupConsumer,
    AsyncProducer,
    AsyncQueueConsumer,
    Credentials,
    Message,
)
from tidewire.client._routing import OFFSETS_TOPIC, coordinator_partition
from tidewire.errors import AuthorizationFailedError, PreconditionFailedError, TidewireError
from tidewire.protocol.messages import (
    ACKS_DURABLE,
    AclEntry,
    ApiKey,
    DescribeAuditRequest,
    QueueDeleteRequest,
)
from tidewire.security._logs import audit_topic
from tidewire.security.authorizer import Authorizer, Decision
from tidewire.security.model import BUILTIN_ROLES, Operation, Principal, ResourceType
from tidewire.server.gate import Session, gate_for
from tidewire.server.needs import API_NEEDS

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


async def create_topic(c: SecureCluster, topic: str, partitions: int, rf: int = 3) -> None:
    """``topic`` with ``partitions`` partitions of ``rf`` replicas, each with a leader and
    every replica in sync, as every node's copy of the metadata says."""
    async with c.nodes[0].client(c.admin) as admin:
        await admin.create_topic(topic, partitions=partitions, replication_factor=rf)

    def placed() -> bool:
        for n in c.nodes:
            for p in range(partitions):
                got = n.cluster.cache.partition(topic, p)
                if got is None or got[0].leader < 0 or len(got[0].isr) != rf:
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
                *acl("app", "cluster", "cluster", "write"),
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
            # An idempotent producer (producer ids: write on the cluster) on every leader.
            async with AsyncProducer(
                [c.nodes[2].addr], credentials=Credentials(key), request_timeout_ms=30_000
            ) as producer:
                sent = [await producer.send(T, f"i{p}".encode(), partition=p) for p in range(3)]
                assert [(await f).offset for f in sent] == [1, 1, 1]
            async with c.nodes[1].client(eve) as nobody:
                with pytest.raises(AuthorizationFailedError):
                    await nobody.produce(T, 0, [Message(b"no")])
                with pytest.raises(AuthorizationFailedError):
                    await nobody.fetch(T, 0, 0)
                with pytest.raises(AuthorizationFailedError):
                    await nobody.publish("", "jobs", "no")
                with pytest.raises(AuthorizationFailedError):
                    await nobody.streams.send("s-0", "no")
            assert all(n.broker.log(T, 0).log_end_offset == 2 for n in c.nodes)

    run(main())


# --- HTTP: what a node forwards runs as the node principal ----------------------------------

#: The grant docs/cluster.md asks for: the built-in role ``node`` on the node principal.
NODE_ROLE = "node"


def leader_of(c: SecureCluster, topic: str, partition: int) -> SecureNode:
    got = c.nodes[0].cluster.cache.partition(topic, partition)
    assert got is not None
    return c.by_id(got[0].leader)


async def sse_messages(http: httpx.AsyncClient, path: str, n: int) -> list[dict[str, Any]]:
    """The first ``n`` message events of the SSE stream at ``path`` (bounded by the client's
    read timeout)."""
    out: list[dict[str, Any]] = []
    async with http.stream("GET", path, headers={"Accept": "text/event-stream"}) as r:
        assert r.status_code == 200, await r.aread()
        async for line in r.aiter_lines():
            if line.startswith("data: "):
                out.append(json.loads(line[len("data: ") :]))
                if len(out) == n:
                    return out
    raise AssertionError(f"the stream ended after {len(out)} of {n} messages")


def owner_id(node: SecureNode, stream: str) -> int:
    """The node that owns ``stream`` (leads its partition of ``__streams``), as ``node``'s
    copy of the metadata says (-1: none)."""
    cache = node.cluster.cache
    info = cache.topics.get(STREAMS_TOPIC)
    if info is None:
        return -1
    got = cache.partition(STREAMS_TOPIC, partition_of(stream, info.partitions))
    return -1 if got is None else got[0].leader


def ws_url(node: SecureNode, path: str, listener: str = "") -> str:
    return node.url(listener).replace("http://", "ws://") + path


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


async def grant_node_role(c: SecureCluster) -> None:
    async with c.nodes[0].client(c.admin) as admin:
        await admin.alter_principal(NODE_PRINCIPAL, roles=[NODE_ROLE])
    await c.settled()


def test_http_forwarding_runs_as_the_node_principal(
    tmp_path: Path, etcd: EtcdServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With the node principal given the documented role, a user allowed exactly what it
    asks for is answered on any node: publishes forwarded to the leader (the user checked
    where they arrive), the read over every partition, SSE and WebSocket streams of
    partitions led elsewhere, a WebSocket group member whose coordinator is elsewhere, the
    groups of every coordinator listed, msgbus publish, subscribe and pop on a node that
    does not lead the topic, iPubSub and native stream requests of other owners, an
    exchange's publish into queues of other owners, a durable queue's counts and its
    WebSocket route on a node that does not own it, a delete with ``if_empty`` checked with
    an owner that does not lead the definitions, and an ``auto_delete`` queue deleted when
    its last consumer leaves such an owner.

    What the node principal was asked for, over all of it, is exactly the role's grant: each
    of its permissions is used, and none beyond it is needed (it would have been refused)."""
    asked: set[tuple[ResourceType, Operation]] = set()
    decide = Authorizer.decide

    def recording(
        self: Authorizer, principal: Principal, rtype: ResourceType, name: str, op: Operation
    ) -> Decision:
        decision = decide(self, principal, rtype, name, op)
        if principal.name == NODE_PRINCIPAL:
            assert decision.allowed, (rtype, name, op, decision.reason)
            asked.add((rtype, op))
        return decision

    monkeypatch.setattr(Authorizer, "decide", recording)

    async def main() -> None:
        async with secure_cluster(tmp_path, etcd, "sec-http") as c:
            await grant_node_role(c)
            await create_topic(c, "t", 3, rf=1)  # one replica each: reads cross nodes
            await create_topic(c, "g3", 1)
            key = await make_user(
                c,
                "web",
                *acl("web", "topic", "t", "read", "write"),
                *acl("web", "topic", "g3", "read", "write"),
                *acl("web", "group", "g", "read", "alter"),
                *acl("web", "topic", "msgbus.news", "read", "write", "create"),
                *acl("web", "group", "msgbus", "read"),
                *acl("web", "stream", "*", "read", "write"),
                *acl("web", "exchange", "fan", "write"),
                *acl("web", "queue", "jobs", "read", "describe", "delete"),
                *acl("web", "queue", "auto", "read", "describe"),
            )
            await http_topics(c, key)
            await http_group_member(c, key)
            await http_msgbus(c, key)
            await http_ipubsub(c, key)
            await http_exchange(c, key)
            await http_queues(c, key)

    run(main())
    assert asked == set(BUILTIN_ROLES[NODE_ROLE])


async def http_topics(c: SecureCluster, key: str) -> None:
    lead = {p: leader_of(c, "t", p) for p in range(3)}
    assert len({n.id for n in lead.values()}) == 3  # placed one per node
    for p in range(3):
        other = next(n for n in c.nodes if n is not lead[p])
        async with other.http(key) as http:  # forwarded to the leader (HTTP_PUBLISH)
            r = await http.post("/v1/topics/t/messages", json={"value": f"v{p}", "partition": p})
            assert r.status_code == 201, r.text
    expected = {(p, f"v{p}") for p in range(3)}
    for n in c.nodes:
        async with n.http(key) as http:
            r = await http.get("/v1/topics/t/messages", params={"since": 0})
            assert r.status_code == 200, r.text
            assert {(m["partition"], m["value"]) for m in r.json()["messages"]} == expected
    async with c.nodes[0].http(key) as http:
        events = await sse_messages(http, "/v1/topics/t/stream?from=earliest", 3)
    assert {(m["partition"], m["value"]) for m in events} == expected
    async with ws_connect(
        ws_url(c.nodes[1], "/v1/topics/t/stream?from=earliest"),
        additional_headers=bearer(key),
        open_timeout=WAIT_S,
    ) as ws:
        assert json.loads(await ws.recv())["type"] == "subscribed"
        seen = set()
        while len(seen) < 3:
            msg = json.loads(await asyncio.wait_for(ws.recv(), WAIT_S))
            seen.add((msg["partition"], msg["value"]))
    assert seen == expected


async def http_group_member(c: SecureCluster, key: str) -> None:
    """A WebSocket member of group ``g`` on a node that does not coordinate it joins and
    commits at the coordinator (as the node principal); the group is reset through that
    node."""
    async with c.nodes[0].client(key) as app:
        await app.produce("g3", 0, [Message(b"m0"), Message(b"m1")])
        await app.commit_offsets("g", {("g3", 0): 1})  # makes the offsets topic too
    coordinator = leader_of(c, OFFSETS_TOPIC, coordinator_partition("g"))
    remote = next(n for n in c.nodes if n is not coordinator)
    async with ws_connect(
        ws_url(remote, "/v1/topics/g3/stream?group=g"),
        additional_headers=bearer(key),
        open_timeout=WAIT_S,
    ) as ws:
        hello = json.loads(await asyncio.wait_for(ws.recv(), WAIT_S))
        assert hello["type"] == "subscribed", hello
        assert hello["partitions"] == [{"partition": 0, "offset": 1}]
        msg = json.loads(await asyncio.wait_for(ws.recv(), WAIT_S))
        assert msg["value"] == "m1"
        await ws.send(json.dumps({"type": "commit"}))
        done = json.loads(await asyncio.wait_for(ws.recv(), WAIT_S))
        assert done == {"type": "committed", "offsets": [{"partition": 0, "offset": 2}]}
    async with c.nodes[2].client(key) as app:
        assert await app.committed_offsets("g") == {("g3", 0): 2}
    # A reset there too (RESET_OFFSETS, as the node), once the member has left.
    reset = {"topic": "g3", "to": "earliest"}
    async with remote.http(key) as http:
        for _ in range(100):
            r = await http.post("/v1/groups/g/reset", json=reset)
            if r.status_code != 409:  # GroupNotEmptyError: the member is leaving
                break
            await asyncio.sleep(0.1)
        assert r.status_code == 200, r.text
        assert r.json()["partitions"] == [
            {"topic": "g3", "partition": 0, "previous": 2, "offset": 0, "end_offset": 2, "lag": 2}
        ]
    # Every node lists the cluster's groups (each coordinator asked, as the node principal),
    # those the caller may describe.
    for n in c.nodes:
        async with n.http(key) as http:
            r = await http.get("/v1/groups")
            assert r.status_code == 200, r.text
            assert [g["group"] for g in r.json()["groups"]] == ["g"]


async def http_msgbus(c: SecureCluster, key: str) -> None:
    """msgbus: the topic made on the first publish; a subscriber on a node that does not
    lead it is fed from the leader, a publish through another is forwarded to the leader."""
    async with c.nodes[0].http(key, MSGBUS) as bus:
        r = await bus.post("/news", content=b"first")
        assert r.status_code == 202, r.text
    await until(
        lambda: all(
            (got := n.cluster.cache.partition("msgbus.news", 0)) is not None and got[0].leader >= 0
            for n in c.nodes
        ),
        "every node knows msgbus.news",
    )
    lead = leader_of(c, "msgbus.news", 0)
    sub, pub = [n for n in c.nodes if n is not lead][:2]
    async with ws_connect(
        ws_url(sub, "/news", MSGBUS), additional_headers=bearer(key), open_timeout=WAIT_S
    ) as ws:
        async with pub.http(key, MSGBUS) as bus:
            r = await bus.put("/news", content=b"second")
            assert r.status_code == 202, r.text
        got = json.loads(await asyncio.wait_for(ws.recv(), WAIT_S))
        assert base64.b64decode(got["payload"]) == b"second"
    # Pops on nodes that do not lead the topic: taken by the leader (TAKE, as the node).
    async with sub.http(key, MSGBUS) as bus:
        popped = []
        for _ in range(2):
            r = await bus.get("/news")
            assert r.status_code == 200, r.text
            popped.append(base64.b64decode(r.json()["payload"]))
    assert popped == [b"first", b"second"]


async def http_ipubsub(c: SecureCluster, key: str) -> None:
    """iPubSub on one node: streams of every owner, sent and received there."""
    streams = [f"i-{i}" for i in range(8)]
    async with c.nodes[2].http(key, IPUBSUB) as ip:
        for s in streams:
            r = await ip.post(
                "/api/v1/streams/send",
                content=json.dumps({"streamId": s, "messageUuid": f"u-{s}", "message": s}),
            )
            assert r.status_code == 200, r.text
        for s in streams:
            r = await ip.get("/api/v1/streams/receive", params={"streamId": s, "timeoutSeconds": 5})
            assert r.status_code == 200, r.text
            assert r.json()["message"] == s
    foreign = [s for s in streams if owner_id(c.nodes[2], s) != c.nodes[2].id]
    assert foreign, "every stream owned by the node asked"
    async with c.nodes[2].http(key) as http:
        for s in foreign:
            r = await http.post(
                f"/v1/streams/{s}/messages", json={"value": "n", "persistent": True}
            )
            assert r.status_code == 200, r.text
            r = await http.get(f"/v1/streams/{s}")
            assert r.status_code == 200, r.text


async def http_exchange(c: SecureCluster, key: str) -> None:
    """A fanout exchange's publish through one node reaches queues whatever node owns them
    (forwarded to their owners as the node principal)."""
    names = [f"q{i}" for i in range(4)]
    async with c.nodes[0].client(c.admin) as admin:
        await admin.declare_exchange("fan", "fanout", durable=True)
        for q in names:
            await admin.declare_queue(q, durable=True)
            await admin.bind("fan", q)
        await until(
            lambda: all(
                len(
                    [
                        n
                        for n in c.nodes
                        if q in {x.spec.name for x in n.broker.queues._queues.values()}
                    ]
                )
                == 1
                for q in names
            ),
            "every queue served by its owner",
        )

        def owned(n: SecureNode) -> set[str]:
            return {x.spec.name for x in n.broker.queues._queues.values()} & set(names)

        # Through a node that does not own them all: some are forwarded to their owners.
        via = next(n for n in c.nodes if owned(n) != set(names))
        async with via.http(key) as http:
            r = await http.post("/v1/exchanges/fan/publish", json={"messages": [{"value": "fan"}]})
            assert r.status_code == 200, r.text
        for q in names:
            msgs = await admin.get(q, wait_ms=5000)
            assert [m.value for m in msgs] == [b"fan"], q


def served_by(c: SecureCluster, queue: str) -> list[SecureNode]:
    """The nodes serving durable queue ``queue`` now (its owner, once it took it)."""
    return [n for n in c.nodes if queue in {q.spec.name for q in n.broker.queues._queues.values()}]


def definitions_leader(c: SecureCluster) -> SecureNode:
    got = c.nodes[0].cluster.cache.partition(DEFINITIONS_TOPIC, 0)
    assert got is not None
    return c.by_id(got[0].leader)


async def owned_elsewhere(
    c: SecureCluster, prefix: str, **settings: bool
) -> tuple[str, SecureNode]:
    """A durable queue ``prefix``, declared by the admin, whose owner is not the leader of
    the definitions (owners are drawn at random: declared again, deleted, a few times at
    most), with that owner."""
    async with c.nodes[0].client(c.admin) as admin:
        for _ in range(20):
            await admin.declare_queue(prefix, durable=True, **settings)
            await until(lambda: len(served_by(c, prefix)) == 1, f"an owner serves {prefix}")
            (owner,) = served_by(c, prefix)
            if owner is not definitions_leader(c):
                return prefix, owner
            await admin.delete_queue(prefix)
            await until(lambda: not served_by(c, prefix), f"{prefix} deleted")
    raise AssertionError(f"20 declarations of {prefix}, all owned by the definitions' leader")


async def http_queues(c: SecureCluster, key: str) -> None:
    """A durable queue owned elsewhere: its counts (LIST_QUEUES to the owner) and its
    WebSocket route (a consumer at the owner) on another node, a delete whose ``if_empty``
    the leader of the definitions checks with the owner, an ``auto_delete`` queue deleted
    by its owner through that leader (QUEUE_DELETE): each asked as the node principal."""
    jobs, owner = await owned_elsewhere(c, "jobs")
    async with c.nodes[0].client(c.admin) as admin:
        for i in range(3):
            await admin.publish("", jobs, f"j{i}")
    other = next(n for n in c.nodes if n is not owner)
    async with other.http(key) as http:
        r = await http.get(f"/v1/queues/{jobs}")
        assert r.status_code == 200, r.text
        assert r.json()["ready"] == 3, r.json()
        r = await http.get("/v1/queues")
        assert r.status_code == 200, r.text
        assert {q["name"]: q["ready"] for q in r.json()["queues"]} == {"jobs": 3}
    async with ws_connect(
        ws_url(other, f"/v1/queues/{jobs}/ws"), additional_headers=bearer(key), open_timeout=WAIT_S
    ) as ws:
        assert json.loads(await asyncio.wait_for(ws.recv(), WAIT_S))["type"] == "subscribed"
        got = [json.loads(await asyncio.wait_for(ws.recv(), WAIT_S)) for _ in range(3)]
        assert sorted(m["value"] for m in got) == ["j0", "j1", "j2"], got
        await ws.send(json.dumps({"type": "ack", "tags": [m["tag"] for m in got]}))
        assert json.loads(await asyncio.wait_for(ws.recv(), WAIT_S))["type"] == "settled"
    await until(lambda: not owner.broker.queues.describe_queue(jobs).consumers, "socket gone")
    async with c.nodes[0].client(key) as app:
        assert await app.delete_queue(jobs, if_empty=True, if_unused=True) == 0
    await until(lambda: not served_by(c, jobs), "jobs deleted")
    # The auto_delete queue: its last consumer (the node, for a socket on another node)
    # leaving its owner deletes it.
    auto, owner = await owned_elsewhere(c, "auto", auto_delete=True)
    other = next(n for n in c.nodes if n is not owner)
    async with ws_connect(
        ws_url(other, f"/v1/queues/{auto}/ws"), additional_headers=bearer(key), open_timeout=WAIT_S
    ) as ws:
        assert json.loads(await asyncio.wait_for(ws.recv(), WAIT_S))["type"] == "subscribed"
        await until(lambda: bool(owner.broker.queues.describe_queue(auto).consumers), "consumer")
    await until(
        lambda: all(auto not in {q.spec.name for q in n.broker.queues.queues()} for n in c.nodes),
        "the auto_delete queue deleted on every node",
    )


def test_the_node_principal_deletes_only_an_unused_auto_delete_queue_its_owner_asks_for(
    tmp_path: Path, etcd: EtcdServer
) -> None:
    """The role ``node`` holds no ``delete`` on queues: the node's key deletes no queue with
    an ordinary QUEUE_DELETE. The owner's request for an ``auto_delete`` queue
    (``auto_delete_by``) needs ``cluster_action`` instead, which a user allowed to delete
    queues does not hold, and the leader of the definitions refuses it for a queue that is
    not ``auto_delete``, for a node that does not own the queue, and while it has consumers;
    an operator's delete is checked as the operator."""

    async def main() -> None:
        async with secure_cluster(tmp_path, etcd, "sec-qdel") as c:
            await grant_node_role(c)
            assert c.node_key is not None
            plain, _ = await owned_elsewhere(c, "plain")
            auto, owner = await owned_elsewhere(c, "auto", auto_delete=True)
            leader = definitions_leader(c)
            other = next(n for n in c.nodes if n is not owner and n is not leader)
            deleter = await make_user(c, "ops", *acl("ops", "queue", "*", "delete", "describe"))

            async def ask(key: str, req: QueueDeleteRequest) -> int:
                async with leader.client(key) as client:
                    try:  # refused at the gate: raised; by the handler: in the body
                        response = await client._t.request(req)
                    except TidewireError as exc:
                        return exc.code
                    assert response is not None
                    return int(response.body.error_code)

            denied = AuthorizationFailedError.code
            # An ordinary delete: refused to the node's key, whatever the queue.
            for name in (plain, auto):
                assert await ask(c.node_key, QueueDeleteRequest(name=name)) == denied
            # The owner's request, as someone allowed to delete queues but not the cluster's
            # own requests: refused at the gate.
            got = await ask(deleter, QueueDeleteRequest(name=auto, auto_delete_by=owner.id))
            assert got == denied
            # As the node: only an auto_delete queue, of the node asking, unused.
            failed = PreconditionFailedError.code
            got = await ask(c.node_key, QueueDeleteRequest(name=plain, auto_delete_by=owner.id))
            assert got == failed
            got = await ask(c.node_key, QueueDeleteRequest(name=auto, auto_delete_by=other.id))
            assert got == failed
            async with AsyncQueueConsumer(
                owner.addr, auto, tls=owner.tls(), credentials=Credentials(c.admin)
            ) as consumer:
                await consumer.start()
                await until(
                    lambda: bool(owner.broker.queues.describe_queue(auto).consumers), "consumer"
                )
                req = QueueDeleteRequest(name=auto, auto_delete_by=owner.id)
                assert await ask(c.node_key, req) == failed
            # ... whose last consumer leaving had its owner ask (as the node): deleted.
            await until(lambda: not served_by(c, auto), "the auto_delete queue deleted")
            assert served_by(c, plain)
            # An operator's delete, checked as the operator.
            async with other.client(deleter) as ops:
                await ops.delete_queue(plain)
            await until(lambda: not served_by(c, plain), "the plain queue deleted")

    run(main())


def test_a_caller_without_rights_is_refused_where_it_arrives(
    tmp_path: Path, etcd: EtcdServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With the node principal allowed everything it forwards, a caller is still checked by
    the node it reached, before anything is forwarded: one without rights is refused (403)
    by every forwarding route, over HTTP, WebSocket, msgbus (publish, subscribe, pop) and
    iPubSub, and by the routes of a queue owned elsewhere (counts, WebSocket, delete), and
    nothing is stored or deleted; a listing answered from every node shows only what the
    caller may describe; and a WebSocket stream with ``?group=`` needs the right to read
    the group (which the node would otherwise exercise on the caller's behalf at the
    coordinator)."""
    asked: set[tuple[ResourceType, Operation]] = set()
    decide = Authorizer.decide
    refusing = False

    def recording(
        self: Authorizer, principal: Principal, rtype: ResourceType, name: str, op: Operation
    ) -> Decision:
        if refusing and principal.name == NODE_PRINCIPAL:
            asked.add((rtype, op))
        return decide(self, principal, rtype, name, op)

    monkeypatch.setattr(Authorizer, "decide", recording)

    async def main() -> None:
        nonlocal refusing
        async with secure_cluster(tmp_path, etcd, "sec-refused") as c:
            await grant_node_role(c)
            await create_topic(c, "t", 3, rf=1)
            await create_topic(c, "g3", 1)
            async with c.nodes[0].client(c.admin) as admin:
                for p in range(3):
                    await admin.produce("t", p, [Message(b"x")])
                await admin.produce("g3", 0, [Message(b"x")])
                await admin.commit_offsets("g", {("g3", 0): 1})
                await admin.declare_exchange("fan", "fanout", durable=True)
                await admin.declare_queue("q", durable=True)
                await admin.bind("fan", "q")
                await admin.streams.send("s-1", "x", persistent=True)
            async with c.nodes[0].http(c.admin, MSGBUS) as bus:
                r = await bus.post("/news", content=b"x")
                assert r.status_code == 202, r.text
            await until(
                lambda: all(n.cluster.cache.partition("msgbus.news", 0) for n in c.nodes),
                "every node knows msgbus.news",
            )
            eve = await make_user(c, "eve")
            # May read t and g3, write nothing, and read no group.
            reader = await make_user(
                c,
                "reader",
                *acl("reader", "topic", "t", "read"),
                *acl("reader", "topic", "g3", "read"),
            )
            # May read msgbus.news, not commit for the group msgbus (a pop does both).
            popper = await make_user(c, "popper", *acl("popper", "topic", "msgbus.news", "read"))
            await until(lambda: len(served_by(c, "q")) == 1, "an owner serves q")
            ends = {n.id: dict(n.broker.logs.logs) for n in c.nodes}
            sizes = {
                (n.id, k): log.log_end_offset for n in c.nodes for k, log in ends[n.id].items()
            }
            refusing = True
            t0 = leader_of(c, "t", 0)
            elsewhere = next(n for n in c.nodes if n is not t0)
            async with elsewhere.http(eve) as http:
                for method, path, body in (
                    ("GET", "/v1/topics/t/messages?since=0", None),
                    ("GET", "/v1/topics/t/stream", None),
                    ("POST", "/v1/topics/t/messages", {"value": "no", "partition": 0}),
                    ("POST", "/v1/exchanges/fan/publish", {"messages": [{"value": "no"}]}),
                    ("POST", "/v1/streams/s-1/messages", {"value": "no"}),
                    ("GET", "/v1/streams/s-1", None),
                    ("GET", "/v1/groups/g", None),
                ):
                    r = await http.request(method, path, json=body)
                    assert r.status_code == 403, (path, r.status_code, r.text)
                    assert r.json()["error"]["name"] == "AuthorizationFailedError"
                r = await http.get("/v1/groups")  # every coordinator asked, as the node
                assert r.status_code == 200, r.text
                assert r.json()["groups"] == []
            for path, who in (
                ("/v1/topics/t/stream", eve),
                ("/v1/topics/g3/stream?group=g", reader),  # t readable, the group not
            ):
                with pytest.raises(InvalidStatus) as refused:
                    async with ws_connect(
                        ws_url(elsewhere, path), additional_headers=bearer(who), open_timeout=WAIT_S
                    ):
                        pass
                assert refused.value.response.status_code == 403, path
            lead = leader_of(c, "msgbus.news", 0)
            other = next(n for n in c.nodes if n is not lead)
            async with other.http(reader, MSGBUS) as bus:
                r = await bus.put("/news", content=b"no")
                assert r.status_code == 403, r.text
            with pytest.raises(InvalidStatus) as refused:
                async with ws_connect(
                    ws_url(other, "/news", MSGBUS),
                    additional_headers=bearer(reader),
                    open_timeout=WAIT_S,
                ):
                    pass
            assert refused.value.response.status_code == 403
            async with other.http(eve, IPUBSUB) as ip:
                r = await ip.post(
                    "/api/v1/streams/send",
                    content=json.dumps({"streamId": "s-1", "messageUuid": "u", "message": 1}),
                )
                assert r.status_code == 403, r.text
                r = await ip.get("/api/v1/streams/receive", params={"streamId": "s-1"})
                assert r.status_code == 403, r.text
            for who in (eve, reader, popper):  # a pop taken by the leader: not for them
                async with other.http(who, MSGBUS) as bus:
                    r = await bus.get("/news")
                    assert r.status_code == 403, r.text
            # A queue owned elsewhere: its counts, its WebSocket route, a delete checked
            # with its owner.
            (q_owner,) = served_by(c, "q")
            not_owner = next(n for n in c.nodes if n is not q_owner)
            async with not_owner.http(eve) as http:
                r = await http.get("/v1/queues/q")
                assert r.status_code == 403, r.text
                r = await http.get("/v1/queues")
                assert r.status_code == 200, r.text
                assert r.json()["queues"] == [], r.text
                r = await http.delete("/v1/queues/q", params={"if_empty": "true"})
                assert r.status_code == 403, r.text
            with pytest.raises(InvalidStatus) as refused:
                async with ws_connect(
                    ws_url(not_owner, "/v1/queues/q/ws"),
                    additional_headers=bearer(eve),
                    open_timeout=WAIT_S,
                ):
                    pass
            assert refused.value.response.status_code == 403
            async with not_owner.client(eve) as app:
                with pytest.raises(AuthorizationFailedError):
                    await app.delete_queue("q", if_empty=True)
            assert len(served_by(c, "q")) == 1
            refusing = False
            # Nothing stored anywhere, and the node principal asked for nothing but copying
            # and the groups each coordinator lists (filtered here for the caller: none).
            for n in c.nodes:
                for k, log in n.broker.logs.logs.items():
                    if not k[0].startswith("__"):
                        assert log.log_end_offset == sizes.get((n.id, k), 0), (n.id, k)
            assert asked <= {
                (ResourceType.CLUSTER, Operation.CLUSTER_ACTION),
                (ResourceType.GROUP, Operation.DESCRIBE),
            }, asked

    run(main())


def test_the_audit_query_reads_other_nodes_logs_as_the_node_principal(
    tmp_path: Path, etcd: EtcdServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Four secured nodes: each audit log has three copies, so one node holds none of
    another's and asks a holder for it (DESCRIBE_AUDIT with ``nodes``) as the node
    principal, whose role allows it. A user with ``admin`` on the cluster (the documented
    right) reads the whole log on that node, over the binary API and HTTP, nothing left
    out; a user with ``describe`` only is refused there, and may not send the nodes' own
    form of the query either."""
    refused: list[tuple[ResourceType, str, Operation]] = []
    decide = Authorizer.decide

    def recording(
        self: Authorizer, principal: Principal, rtype: ResourceType, name: str, op: Operation
    ) -> Decision:
        decision = decide(self, principal, rtype, name, op)
        if principal.name == NODE_PRINCIPAL and not decision.allowed:
            refused.append((rtype, name, op))
        return decision

    monkeypatch.setattr(Authorizer, "decide", recording)

    async def main() -> None:
        async with secure_cluster(tmp_path, etcd, "sec-audit", 4) as c:
            await grant_node_role(c)
            ops = await make_user(c, "ops", *acl("ops", "cluster", "cluster", "admin"))
            viewer = await make_user(c, "viewer", *acl("viewer", "cluster", "cluster", "describe"))
            async with c.by_id(4).client(c.admin) as admin:
                await admin.create_topic("made-on-4", 1, replication_factor=1)
            topic4 = audit_topic(4)
            await until(
                lambda: all(
                    (g := n.cluster.cache.partition(topic4, 0)) is not None and len(g[0].isr) == 3
                    for n in c.nodes
                ),
                "node 4's audit log in sync on three nodes",
            )
            got = c.nodes[0].cluster.cache.partition(topic4, 0)
            assert got is not None
            (asker,) = [n for n in c.nodes if n.id not in got[0].replicas]
            assert (topic4, 0) not in asker.broker.logs.logs

            async def made_on_4_read() -> bool:
                async with asker.client(ops) as client:
                    events = await client.describe_audit(action="CREATE_TOPIC")
                assert events.missing_nodes == (), events.missing_nodes
                return "topic:made-on-4" in {e.resource for e in events}

            loop = asyncio.get_running_loop()
            deadline = loop.time() + WAIT_S
            while not await made_on_4_read():  # node 4's event copied (not acknowledged)
                assert loop.time() < deadline, "node 4's event not read on another node"
                await asyncio.sleep(0.1)
            async with asker.http(ops) as http:
                r = await http.get("/v1/audit", params={"action": "CREATE_TOPIC"})
                assert r.status_code == 200, r.text
                assert r.json()["missing_nodes"] == []
                assert "topic:made-on-4" in {e["resource"] for e in r.json()["events"]}
            async with asker.http(viewer) as http:
                r = await http.get("/v1/audit", params={"action": "CREATE_TOPIC"})
                assert r.status_code == 403, r.text
            async with asker.client(viewer) as client:
                with pytest.raises(AuthorizationFailedError):
                    await client.describe_audit(action="CREATE_TOPIC")
                for nodes in ([4], [asker.id]):  # the nodes' own form: cluster_action
                    with pytest.raises(AuthorizationFailedError, match="cluster_action"):
                        await client._call(DescribeAuditRequest(nodes=nodes))

    run(main())
    assert refused == []


# --- real processes ---------------------------------------------------------------------------


def _serve(data: Path, *args: str) -> tuple[subprocess.Popen[str], str, str]:
    """``tidewire serve`` with an HTTP listener, its log in ``DATA.log``: (process, native
    address, HTTP base URL)."""
    with open(f"{data}.log", "a") as err:
        proc = popen_serve(
            *("--data-dir", str(data), "--port", "0", "--http-port", "0", *args),
            stderr=err.fileno(),
        )
    assert proc.stdout is not None
    native = url = ""
    for _ in range(8):  # bounded: the listening lines come among the first few
        line = proc.stdout.readline()
        if m := re.search(r"listening on (127\.0\.0\.1:\d+)", line):
            native = native or m.group(1)
        if m := re.search(r"HTTP native listening on (http://127\.0\.0\.1:\d+)", line):
            url = m.group(1)
        if (native and url) or not line:
            break
    if not (native and url):
        stop(proc)
        pytest.fail(f"{data}: serve did not start")
    return proc, native, url


@pytest.mark.slow  # four serve processes, about 15 s (the in-process tests above are the default)
def test_serve_cluster_with_a_node_key_and_the_node_role_forwards_http(
    tmp_path: Path, etcd: EtcdServer
) -> None:
    """The procedure of docs/cluster.md with real processes: node 1 served alone makes the
    node principal with the ``node`` role and its key; three ``tidewire serve --cluster
    --authentication --node-api-key-file`` nodes form; the role given again on node 1 makes
    its state the cluster's. Then a user allowed to read a topic whose partitions are led by
    the three nodes reads all of them over HTTP from any node, and a user without that right
    is refused (403) on the node it reached."""
    procs: list[subprocess.Popen[str]] = []
    try:
        proc, native, _ = _serve(tmp_path / "node1", "--authentication")
        procs.append(proc)
        admin = bootstrap_key(str(tmp_path / "node1"))
        cli = ["--addr", native, "--api-key", admin]
        out = run_cli(["user", "create", NODE_PRINCIPAL, "--service", "--role", "node", *cli])
        assert out.exit_code == 0, out.output
        out = run_cli(["key", "create", NODE_PRINCIPAL, "--json", *cli])
        assert out.exit_code == 0, out.output
        node_key = tmp_path / "node.key"
        node_key.write_text(json.loads(out.output)["api_key"] + "\n")
        stop(procs.pop())

        cluster = f"etcd://127.0.0.1:{etcd.client_port}"
        addr, url = {}, {}
        for n in (1, 2, 3):
            proc, addr[n], url[n] = _serve(
                tmp_path / f"node{n}",
                *("--node-id", str(n), "--cluster", cluster, "--session-timeout", "3"),
                *("--authentication", "--node-api-key-file", str(node_key)),
            )
            procs.append(proc)
        cli = ["--addr", addr[1], "--api-key", admin]

        def registered() -> bool:
            out = run_cli(["cluster", "nodes", "--json", *cli])
            return out.exit_code == 0 and len(json.loads(out.output)["nodes"]) == 3

        wait_until("3 nodes registered", registered, WAIT_S)
        # The first change of the cluster (the role again: nothing changes) on node 1.
        out = run_cli(["user", "roles", NODE_PRINCIPAL, "--role", "node", *cli])
        assert out.exit_code == 0, out.output
        for args in (
            ["topic", "create", "t", "--partitions", "3", "--replication-factor", "1"],
            ["user", "create", "reader"],
            ["user", "create", "nobody"],
            ["acl", "add", "--principal", "reader", "--topic", "t", "-o", "read", "-o", "write"],
        ):
            out = run_cli([*args, *cli])
            assert out.exit_code == 0, out.output
        keys = {}
        for who in ("reader", "nobody"):
            out = run_cli(["key", "create", who, "--json", *cli])
            assert out.exit_code == 0, out.output
            keys[who] = json.loads(out.output)["api_key"]

        def published(p: int) -> bool:
            r = httpx.post(
                f"{url[1]}/v1/topics/t/messages",
                json={"value": f"v{p}", "partition": p},
                headers=bearer(keys["reader"]),
                timeout=WAIT_S,
            )
            if r.status_code == 307:  # sent again to the leader, with the key
                r = httpx.post(
                    r.headers["location"],
                    json={"value": f"v{p}", "partition": p},
                    headers=bearer(keys["reader"]),
                    timeout=WAIT_S,
                )
            return r.status_code == 201

        for p in range(3):
            wait_until(f"v{p} published", lambda p=p: published(p), WAIT_S)
        expected = {(p, f"v{p}") for p in range(3)}

        def read_all(n: int) -> bool:
            r = httpx.get(
                f"{url[n]}/v1/topics/t/messages",
                params={"since": 0},
                headers=bearer(keys["reader"]),
                timeout=WAIT_S,
            )
            assert r.status_code == 200, r.text  # no partition refused to the node
            return {(m["partition"], m["value"]) for m in r.json()["messages"]} == expected

        for n in (1, 2, 3):
            wait_until(f"node {n} answers every partition", lambda n=n: read_all(n), WAIT_S)
            r = httpx.get(
                f"{url[n]}/v1/topics/t/messages",
                params={"since": 0},
                headers=bearer(keys["nobody"]),
                timeout=WAIT_S,
            )
            assert r.status_code == 403, r.text
    finally:
        for proc in procs:
            stop(proc)


def test_a_certificate_subject_with_the_node_role_may_copy_logs(tmp_path: Path) -> None:
    """For nodes identified by a client certificate, docs/cluster.md gives the role to a
    principal named as the certificate's subject: a session authenticated by that
    certificate alone (no key) gets the role's permissions, REPLICA_FETCH among them, and
    nothing beyond them."""

    async def main() -> None:
        async with Broker(
            BrokerConfig(data_dir=str(tmp_path / "d"), auto_create_topics=False),
            security=SECURITY,
        ) as broker:
            gate = gate_for(broker)
            session = Session("127.0.0.1:5000", "binary", tls=True, cert_principal="node-by-cert")
            need = API_NEEDS[ApiKey.REPLICA_FETCH]
            with pytest.raises(AuthorizationFailedError):
                gate.check(session, "REPLICA_FETCH", need, None)
            await broker.security.create_principal("node-by-cert", kind="service", roles=["node"])
            principal = gate.check(session, "REPLICA_FETCH", need, None)
            assert principal is not None
            assert principal.name == "node-by-cert"
            assert not gate.can(session, ResourceType.CLUSTER, "cluster", Operation.ALTER)
            assert not gate.can(session, ResourceType.QUEUE, "q", Operation.CREATE)
            assert not gate.can(session, ResourceType.TOPIC, "t", Operation.DELETE)
            assert not gate.can(session, ResourceType.QUEUE, "q", Operation.DELETE)

    asyncio.run(main())


def test_write_without_create_publishes_through_a_node_holding_no_replica(
    tmp_path: Path, etcd: EtcdServer
) -> None:
    """A publish needs ``create`` only when its topic does not exist: in a cluster, when the
    cluster has no such topic, not when the node reached holds no replica of it. A user
    allowed to write (not create) a topic of one replica publishes over HTTP and msgbus
    through a node that holds none: redirected, or forwarded, to the leader."""

    async def main() -> None:
        async with secure_cluster(tmp_path, etcd, "sec-exists") as c:
            await grant_node_role(c)
            await create_topic(c, "solo", 1, rf=1)
            async with c.nodes[0].client(c.admin) as admin:
                await admin.create_topic("msgbus.solo", partitions=1, replication_factor=1)
            await until(
                lambda: all(n.cluster.cache.partition("msgbus.solo", 0) for n in c.nodes),
                "every node knows msgbus.solo",
            )
            key = await make_user(
                c,
                "writer",
                *acl("writer", "topic", "solo", "write"),
                *acl("writer", "topic", "msgbus.solo", "write"),
            )
            lead = leader_of(c, "solo", 0)
            other = next(n for n in c.nodes if n is not lead)
            assert ("solo", 0) not in other.broker.logs.logs
            async with other.http(key) as http:
                r = await http.post("/v1/topics/solo/messages", json={"value": "x"})
                assert r.status_code == 201, r.text  # forwarded to the leader
            bus_lead = leader_of(c, "msgbus.solo", 0)
            bus_other = next(n for n in c.nodes if n is not bus_lead)
            async with bus_other.http(key, MSGBUS) as bus:
                r = await bus.post("/solo", content=b"x")
                assert r.status_code == 202, r.text
            await until(
                lambda: bus_lead.broker.log("msgbus.solo", 0).log_end_offset == 1,
                "the forwarded publish stored on the leader",
            )

    run(main())


def test_nodes_identified_by_a_certificate_with_the_node_role(
    tmp_path: Path, etcd: EtcdServer
) -> None:
    """The certificate procedure of docs/cluster.md: TLS listeners taking client
    certificates, each node presenting one of CN tidewire-node, nothing prepared; the first
    change on node 1 registers that subject with the role ``node``. The others then copy
    ``__security`` and the partitions they follow (an acks=all produce is answered, on every
    replica), and a read over every partition through one node fetches the others' over TLS
    as the certificate's principal."""

    async def main() -> None:
        async with secure_cluster(tmp_path, etcd, "sec-cert", identity="certificate") as c:
            for n in c.nodes:  # node 1's admin holds on every node: the state was copied
                async with n.client(c.admin) as admin:
                    assert (await admin.whoami()).principal == "admin"
            await create_topic(c, T, 1)
            await create_topic(c, "t", 3, rf=1)
            async with c.nodes[1].client(c.admin, *c.nodes) as admin:
                assert await admin.produce(T, 0, [Message(b"x")], acks=ACKS_DURABLE) == 0
                for p in range(3):
                    await admin.produce("t", p, [Message(f"v{p}".encode())])
            await until(
                lambda: all(n.broker.log(T, 0).log_end_offset == 1 for n in c.nodes),
                "every replica holds the record",
            )
            key = await make_user(c, "reader", *acl("reader", "topic", "t", "read"))
            async with c.nodes[0].http(key) as http:
                r = await http.get("/v1/topics/t/messages", params={"since": 0})
                assert r.status_code == 200, r.text
                got = {(m["partition"], m["value"]) for m in r.json()["messages"]}
            assert got == {(p, f"v{p}") for p in range(3)}

    run(main())
