"""What a node of a cluster answers for the others over HTTP, with in-process nodes (each a
broker, its TCP server, its HTTP gateway with the native and msgbus listeners, and its
:class:`ClusterNode`) against the real etcd of the ``etcd`` fixture:

- an audit query while nodes holding other nodes' audit logs do not answer: another holder
  is asked, and when none answers the events found are returned with ``missing_nodes``
  (binary protocol, HTTP 200, the CLI's warning), each node waited for a bounded time;
- a durable queue's counts shown by any node (``GET /v1/queues``, ``GET /v1/queues/{q}``,
  ``tidewire queue list``): its owner's, asked of it; the queue's WebSocket route on a node
  that is not its owner fed from the owner (deliveries, settles, what it held given back
  when it closes);
- msgbus pops on any node taken once, in order, by the leader of the topic's partition
  (``TAKE``), and ``GET /`` listing the cluster's msgbus topics on every node;
- forwarded requests sharing a few connections per node (the node's ``PeerPool``), closed
  when the node leaves the cluster;
- publishes (one, a batch, with an ``Idempotency-Key``), partition reads and a group's
  commit, description and reset sent to a node that does not serve them, forwarded to the
  one that does (``http_cluster_routing = "forward"``, the default) and answered as it
  answers; a node set to ``redirect`` answering ``307`` instead; the same with
  authorization on, as the node principal, for a caller with an API key;
- a publish to a partition without a leader, or whose lead moves as it is stored: ``503``
  with ``Retry-After``, never ``307`` (nor ``400``).

Every wait is bounded; nothing asserts on durations.
"""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
from websockets.asyncio.client import connect as ws_connect

from tests.cli._support import run_cli
from tests.cluster._etcd import EtcdServer
from tests.cluster._inprocess import (
    WAIT_S,
    InProcessNode,
    in_process_cluster,
    stop_for_next_leader,
    until,
)
from tests.cluster._secure import NODE_PRINCIPAL, acl, secure_cluster
from tidewire.client import AsyncClient
from tidewire.client._routing import OFFSETS_TOPIC, coordinator_partition
from tidewire.client._transport import Transport
from tidewire.cluster import audit as cluster_audit
from tidewire.cluster.fetcher import ReplicaLink
from tidewire.errors import ConnectionLostError, NotLeaderError
from tidewire.protocol.messages import ListQueuesRequest, TakeRequest
from tidewire.security._logs import audit_topic
from tidewire.server.http import HttpConfig, peers
from tidewire.server.http.gateway import MSGBUS, NATIVE, HttpGateway
from tidewire.server.http.peers import PeerClient
from tidewire.server.http.queue_owners import owner_of
from tidewire.storage import LogConfig

#: Longer than the default: a lease that expires under a loaded test is not what is tested.
SESSION_S = 10


class HttpNode(InProcessNode):
    """An in-process node with an HTTP gateway (native API and msgbus), its HTTP port
    registered with the cluster as ``tidewire serve --http-port`` does."""

    def __init__(
        self,
        tmp: Path,
        etcd: EtcdServer,
        node_id: int,
        cluster_id: str,
        *,
        routing: str = "forward",
    ) -> None:
        super().__init__(tmp, etcd, node_id, cluster_id=cluster_id, session_s=SESSION_S)
        self.gateway: HttpGateway | None = None
        self.routing = routing

    async def start(self) -> None:
        self.gateway = None
        await super().start()

    async def before_cluster(self) -> dict[str, Any]:
        self.gateway = HttpGateway.for_broker(
            self.broker,
            HttpConfig(http_port=0, http_msgbus_port=0, http_cluster_routing=self.routing),
        )
        await self.gateway.start()
        return {"http_port": self.gateway.port_of(NATIVE)}

    async def stop(self) -> None:
        if self.stopped:
            return
        if self.gateway is not None:
            await self.gateway.close()
        await super().stop()

    @property
    def http(self) -> str:
        assert self.gateway is not None
        return f"http://127.0.0.1:{self.gateway.port_of(NATIVE)}"

    @property
    def msgbus(self) -> str:
        assert self.gateway is not None
        return f"http://127.0.0.1:{self.gateway.port_of(MSGBUS)}"


def cluster(
    tmp: Path, etcd: EtcdServer, n: int, cluster_id: str
) -> AbstractAsyncContextManager[list[HttpNode]]:
    return in_process_cluster(lambda i: HttpNode(tmp, etcd, i, cluster_id), n)


@asynccontextmanager
async def black_hole() -> AsyncIterator[int]:
    """A TCP port that accepts connections and never answers (a node that hangs); closed,
    with its connections, on the way out."""
    conns: list[asyncio.StreamWriter] = []

    async def swallow(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        conns.append(writer)
        while await reader.read(65536):
            pass

    server = await asyncio.start_server(swallow, "127.0.0.1", 0)
    try:
        yield server.sockets[0].getsockname()[1]
    finally:
        server.close()
        for w in conns:
            w.close()
        await server.wait_closed()


def hanging(ports: set[int], hole: int) -> Callable[[str, int], ReplicaLink]:
    """A ``connect`` for the audit query that sends what is meant for ``ports`` to the
    black hole ``hole`` (those nodes then hang), the rest where it is meant."""
    real = cluster_audit.default_connect

    def connect(host: str, port: int) -> ReplicaLink:
        return real(host, hole if port in ports else port)

    return connect


# --- the audit log: a partial answer when nodes do not answer ----------------------------------


def test_an_audit_query_answers_what_it_found_naming_the_nodes_not_read(
    tmp_path: Path, etcd: EtcdServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(cluster_audit, "ASK_TIMEOUT_S", 1.0)  # the bound under test, small

    async def main() -> None:
        async with cluster(tmp_path, etcd, 4, "audit-partial") as nodes:
            by_id = {n.id: n for n in nodes}
            async with AsyncClient(by_id[4].addr) as client:
                await client.create_topic("made-on-4", 1, replication_factor=1)
            topic4 = audit_topic(4)
            cache = nodes[0].cluster.cache
            await until(
                lambda: all(topic4 in n.cluster.cache.topics for n in nodes), "__audit.4 made"
            )
            got = cache.partition(topic4, 0)
            assert got is not None
            replicas = got[0].replicas
            assert len(replicas) == 3
            (lacking,) = [n for n in by_id if n not in replicas]
            asker = by_id[lacking]
            # The asker records an event of its own too: its own log, read locally.
            async with AsyncClient(asker.addr) as client:
                await client.create_topic(f"made-on-{lacking}", 1, replication_factor=1)

            def resources(events: list[object]) -> set[str]:
                return {getattr(e, "resource", "") for e in events}

            async def both_read() -> bool:
                async with AsyncClient(asker.addr) as client:
                    got = await client.describe_audit(action="CREATE_TOPIC")
                return {"topic:made-on-4", f"topic:made-on-{lacking}"} <= resources(got)

            loop = asyncio.get_running_loop()
            deadline = loop.time() + WAIT_S
            while not await both_read():
                assert loop.time() < deadline, "both events not read"
                await asyncio.sleep(0.1)
            await until(
                lambda: all(
                    (plog := by_id[r].broker.logs.logs.get((topic4, 0))) is not None
                    and plog.log_end_offset >= 1
                    for r in replicas
                ),
                "node 4's audit log copied",
            )
            await until(
                lambda: (g := cache.partition(topic4, 0)) is not None and len(g[0].isr) == 3,
                "node 4's audit log in sync on three nodes",
            )
            port = {n.id: n.server.port for n in nodes}
            async with black_hole() as hole:
                # Node 4 (the leader of its log) hangs: the asker asks another holder.
                monkeypatch.setattr(cluster_audit, "default_connect", hanging({port[4]}, hole))
                async with AsyncClient(asker.addr) as client:
                    got = await client.describe_audit(action="CREATE_TOPIC")
                assert "topic:made-on-4" in resources(got)
                assert got.missing_nodes == ()
                # Every other node hangs: what the asker holds is answered, the rest named.
                others = {port[n] for n in by_id if n != lacking}
                monkeypatch.setattr(cluster_audit, "default_connect", hanging(others, hole))
                expected = sorted(
                    owner
                    for name in asker.cluster.cache.topics
                    if (owner := _owner(name)) is not None
                    and (name, 0) not in asker.broker.logs.logs
                )
                assert 4 in expected
                assert lacking not in expected
                async with AsyncClient(asker.addr) as client:
                    got = await client.describe_audit(action="CREATE_TOPIC")
                assert f"topic:made-on-{lacking}" in resources(got)
                assert "topic:made-on-4" not in resources(got)
                assert list(got.missing_nodes) == expected
                # HTTP: 200, the same nodes named.
                async with httpx.AsyncClient(base_url=asker.http, timeout=WAIT_S) as c:
                    r = await c.get("/v1/audit", params={"action": "CREATE_TOPIC"})
                assert r.status_code == 200, r.text
                assert r.json()["missing_nodes"] == expected
                assert f"topic:made-on-{lacking}" in {e["resource"] for e in r.json()["events"]}
                # The CLI: the events, and a warning naming the nodes.
                cli = await asyncio.to_thread(
                    run_cli, ["audit", "--action", "CREATE_TOPIC", "--json", "--addr", asker.addr]
                )
                assert cli.exit_code == 0, cli.output
                assert "were not read" in cli.stderr
                assert str(4) in cli.stderr
                assert f"topic:made-on-{lacking}" in {e["resource"] for e in json.loads(cli.stdout)}

    asyncio.run(main())


def _owner(topic: str) -> int | None:
    from tidewire.security._logs import audit_node_of

    return audit_node_of(topic)


# --- queues: any node shows the owner's counts ---------------------------------------------------


async def declare_served(c: AsyncClient, nodes: list[HttpNode], queue: str) -> None:
    """Declare the durable ``queue`` through ``c`` and wait until every node knows it and
    one node serves it."""
    await c.declare_queue(queue, durable=True)
    await until(
        lambda: all(queue in {q.spec.name for q in n.broker.queues.queues()} for n in nodes),
        "every node knows the queue",
    )
    await until(lambda: len(serving(nodes, queue)) == 1, "an owner serves it")


def serving(nodes: list[HttpNode], queue: str) -> list[HttpNode]:
    """The live nodes serving ``queue`` now (at most one, once settled)."""
    return [
        n
        for n in nodes
        if not n.stopped and any(q.spec.name == queue for q in n.broker.queues._queues.values())
    ]


def test_any_node_shows_a_queues_counts_as_its_owner_counts_them(
    tmp_path: Path, etcd: EtcdServer
) -> None:
    async def main() -> None:
        async with cluster(tmp_path, etcd, 3, "http-queues") as nodes:
            async with AsyncClient(nodes[0].addr) as c:
                await declare_served(c, nodes, "jobs")
                for i in range(7):
                    await c.publish("", "jobs", f"m{i}")
            (owner,) = serving(nodes, "jobs")
            others = [n for n in nodes if n is not owner]
            for n in others:
                # The node's own view has no counts: what it shows comes from the owner.
                assert {q.spec.name: q.ready for q in n.broker.queues.queues()}["jobs"] == 0
                async with httpx.AsyncClient(base_url=n.http, timeout=WAIT_S) as h:
                    one = await h.get("/v1/queues/jobs")
                    assert one.status_code == 200, one.text
                    assert one.json()["ready"] == 7
                    assert one.json()["counters"]["published"] == 7
                    listed = await h.get("/v1/queues", params={"sort": "-ready"})
                    assert listed.status_code == 200, listed.text
                    assert {q["name"]: q["ready"] for q in listed.json()["queues"]} == {"jobs": 7}
                async with AsyncClient(n.addr) as c:
                    assert [(q.name, q.ready) for q in await c.list_queues()] == [("jobs", 7)]
                cli = await asyncio.to_thread(
                    run_cli, ["queue", "list", "--json", "--addr", n.addr]
                )
                assert cli.exit_code == 0, cli.output
                assert [(d["name"], d["ready"]) for d in json.loads(cli.stdout)] == [("jobs", 7)]
            # The WebSocket route on a node that is not the owner is fed from the owner.
            first, second = others
            ws_url = first.http.replace("http://", "ws://") + "/v1/queues/jobs/ws?prefetch=5"
            async with asyncio.timeout(WAIT_S), ws_connect(ws_url) as ws:
                sub = json.loads(await ws.recv())
                assert sub["type"] == "subscribed", sub
                assert sub["prefetch"] == 5, sub
                got = [json.loads(await ws.recv()) for _ in range(5)]  # the prefetch: no more
                assert all(m["type"] == "message" for m in got), got
                await ws.send(json.dumps({"type": "ack", "tags": [m["tag"] for m in got[:3]]}))
                acked = {m["value"] for m in got[:3]}
                # Settled; and two more come now that three are (7 in all), in any order.
                frames = [json.loads(await ws.recv()) for _ in range(3)]
                assert sorted(f["type"] for f in frames) == ["message", "message", "settled"]
                got += [f for f in frames if f["type"] == "message"]
                await ws.send(json.dumps({"type": "ack", "tags": [999_999]}))
                refused = json.loads(await ws.recv())
                assert refused["type"] == "error", refused
                assert refused["command"] == "ack", refused
            # Closed with four unsettled: they go back to the queue, delivered again.
            await until(
                lambda: owner.broker.queues.describe_queue("jobs").unacked == 0,
                "what the closed socket held given back",
            )
            assert owner.broker.queues.describe_queue("jobs").ready == 4
            ws_url = second.http.replace("http://", "ws://") + "/v1/queues/jobs/ws"
            async with asyncio.timeout(WAIT_S), ws_connect(ws_url) as ws:
                assert json.loads(await ws.recv())["type"] == "subscribed"
                again = [json.loads(await ws.recv()) for _ in range(4)]
                assert {m["value"] for m in again} | acked == {f"m{i}" for i in range(7)}
                assert all(m["redelivered"] for m in again)
                await ws.send(json.dumps({"type": "ack", "up_to": max(m["tag"] for m in again)}))
                assert json.loads(await ws.recv())["type"] == "settled"
            await until(
                lambda: (s := owner.broker.queues.describe_queue("jobs")).ready + s.unacked == 0,
                "every message acked through the forwarded sockets",
            )

    asyncio.run(main())


# --- msgbus: pops forwarded to the leader, the cluster's topics listed --------------------------


async def known_everywhere(nodes: list[HttpNode], topic: str) -> int:
    """Once every node knows partition 0 of ``topic``: its leader, as node 0 knows it."""
    await until(
        lambda: all(n.cluster.cache.partition(topic, 0) is not None for n in nodes),
        "every node knows the topic",
    )
    got = nodes[0].cluster.cache.partition(topic, 0)
    assert got is not None
    return got[0].leader


def test_msgbus_pops_on_any_node_are_taken_once_by_the_leader(
    tmp_path: Path, etcd: EtcdServer
) -> None:
    async def main() -> None:
        async with (
            cluster(tmp_path, etcd, 3, "http-msgbus") as nodes,
            httpx.AsyncClient(timeout=WAIT_S) as h,
        ):
            for i in range(6):  # through every node: forwarded to the leader
                r = await h.post(f"{nodes[i % 3].msgbus}/jobs", content=f"m{i}".encode())
                assert r.status_code == 202, r.text
            leader = await known_everywhere(nodes, "msgbus.jobs")
            # Pops on every node, the leader's and the others' interleaved: each message
            # taken once, in order.
            taken = []
            for i in range(6):
                r = await h.get(f"{nodes[i % 3].msgbus}/jobs")
                assert r.status_code == 200, (nodes[i % 3].id, leader, r.text)
                doc = r.json()
                taken.append((doc["id"], base64.b64decode(doc["payload"]).decode()))
                assert doc["topic"]["name"] == "jobs"
            assert taken == [(i, f"m{i}") for i in range(6)]
            for n in nodes:
                r = await h.get(f"{n.msgbus}/jobs")
                assert r.status_code == 404, r.text
            # The cluster's msgbus topics, from any node (seq: the high watermark the
            # node knows, a follower's a fetch behind the leader's at most).
            for n in nodes:
                listed = (await h.get(f"{n.msgbus}/")).json()
                assert set(listed) == {"jobs"}, listed
                assert listed["jobs"]["seq"] in (5, 6), listed
            # A topic of one replica: listed on the nodes without one as its leader tells.
            async with AsyncClient(nodes[0].addr) as c:
                await c.create_topic("msgbus.solo", 1, replication_factor=1)
            await until(
                lambda: all(
                    (g := n.cluster.cache.partition("msgbus.solo", 0)) is not None
                    and g[0].leader > 0
                    for n in nodes
                ),
                "every node knows msgbus.solo and its leader",
            )
            solo = nodes[0].cluster.cache.partition("msgbus.solo", 0)
            assert solo is not None
            (holder,) = solo[0].replicas
            holder_node = next(n for n in nodes if n.id == holder)
            r = await h.post(f"{holder_node.msgbus}/solo", content=b"one")
            assert r.status_code == 202, r.text
            for n in nodes:
                listed = (await h.get(f"{n.msgbus}/")).json()
                assert set(listed) == {"jobs", "solo"}, listed
                assert listed["solo"]["seq"] == 1, (n.id, holder, listed)
            # A topic no node knows: 404 on a node that does not lead anything of it.
            r = await h.get(f"{nodes[0].msgbus}/nothing-here")
            assert r.status_code == 404, r.text

    asyncio.run(main())


# --- forwarded requests share a few connections per node ----------------------------------------


def _accepted(node: HttpNode) -> float:
    """Binary-protocol connections ``node``'s server accepted since it started."""
    got = node.server.metrics.registry.get_sample_value(
        "tidewire_connections_accepted_total", {"interface": "binary"}
    )
    return got or 0.0


def test_forwarded_requests_share_a_few_connections_closed_with_the_node(
    tmp_path: Path, etcd: EtcdServer
) -> None:
    async def main() -> None:
        async with cluster(tmp_path, etcd, 3, "http-pool") as nodes:
            async with AsyncClient(nodes[0].addr) as c:
                await declare_served(c, nodes, "pooled")
                await c.publish("", "pooled", "one")
            (owner,) = serving(nodes, "pooled")
            asker = next(n for n in nodes if n is not owner)
            await until(
                lambda: owner_of(asker.broker, "pooled") == owner.id, "the asker knows the owner"
            )
            before = _accepted(owner)
            async with httpx.AsyncClient(base_url=asker.http, timeout=WAIT_S) as h:
                for _ in range(20):  # one after the other
                    r = await h.get("/v1/queues/pooled")
                    assert r.status_code == 200, r.text
                    assert r.json()["ready"] == 1
                answers = await asyncio.gather(*(h.get("/v1/queues/pooled") for _ in range(20)))
                assert all(r.status_code == 200 and r.json()["ready"] == 1 for r in answers)
            # 40 requests asked the owner (LIST_QUEUES): over a few shared connections, not
            # one each (the node's replica fetchers may reconnect meanwhile: a few more).
            assert _accepted(owner) - before <= peers.LINKS_PER_NODE + 2
            pool = asker.cluster.peer_pool
            assert isinstance(pool, peers.PeerPool)
            links = pool.links()
            assert 1 <= len(links) <= 2 * peers.LINKS_PER_NODE  # to the owner, and itself
            assert any(link.connected for link in links)
            # The node leaving the cluster closes them.
            await asker.stop()
            assert asker.cluster.peer_pool is None
            assert pool.closed
            assert pool.links() == []
            assert all(link.closed and not link.connected for link in links)

    asyncio.run(main())


def test_a_pool_shares_a_connection_until_it_is_busy_and_closes_them() -> None:
    """The pool's rule with real connections to a node that never answers (requests stay in
    flight): one connection while it is not busy, another when it is, 4 at most, and after
    close connections of their own."""

    async def main() -> None:
        async with black_hole() as port:
            address = f"127.0.0.1:{port}"
            pool = peers.PeerPool(
                lambda a: Transport(a, connect_timeout_s=5.0, request_timeout_s=WAIT_S)
            )
            hanging: list[asyncio.Task[object]] = []
            links: list[peers.SharedLink] = []
            try:
                for i in range(peers.LINKS_PER_NODE):
                    link = pool.link(address)
                    assert isinstance(link, peers.SharedLink)
                    assert link not in links  # the others are busy: a new one
                    links.append(link)
                    assert pool.link(address) is link  # not busy yet: shared
                    hanging += [
                        asyncio.create_task(link.request(ListQueuesRequest()))
                        for _ in range(peers.BUSY_IN_FLIGHT)
                    ]
                    await until(
                        lambda n=link: n.in_flight == peers.BUSY_IN_FLIGHT,
                        f"connection {i} busy",
                    )
                # All busy and no room for another: the least busy of them.
                assert pool.link(address) in links
                assert pool.links() == links
                assert sum(link.connected for link in links) == peers.LINKS_PER_NODE
                await links[0].close()  # a borrower's close leaves it open
                assert links[0].connected
            finally:
                await pool.close()
                failed = await asyncio.gather(*hanging, return_exceptions=True)
            assert all(isinstance(f, ConnectionLostError) for f in failed), failed
            assert pool.links() == []
            assert all(link.closed and not link.connected for link in links)
            own = pool.link(address)  # closed: a connection of the borrower's own
            assert not isinstance(own, peers.SharedLink)
            await own.close()

    asyncio.run(main())


# --- publishes, reads and group requests forwarded to the node that serves them ----------------


async def _placed(nodes: list[Any], topic: str, partitions: int) -> dict[int, Any]:
    """Each partition's leader node, once every node's copy of the metadata names one and
    that node has taken the partition up."""
    by_id = {n.id: n for n in nodes}

    def leader(p: int) -> int:
        got = nodes[0].cluster.cache.partition(topic, p)
        return -1 if got is None else int(got[0].leader)

    def ready() -> bool:
        for p in range(partitions):
            for n in nodes:
                got = n.cluster.cache.partition(topic, p)
                if got is None or got[0].leader != leader(p) or leader(p) not in by_id:
                    return False
            if not by_id[leader(p)].broker.replication.leads(topic, p):
                return False
        return True

    await until(ready, f"{topic}: every partition led, every node knows where")
    return {p: by_id[leader(p)] for p in range(partitions)}


async def _until_served(send: Callable[[], Any]) -> httpx.Response:
    """``await send()`` again while it answers 503 (the offsets topic made on first use),
    for up to WAIT_S."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + WAIT_S
    while True:
        r: httpx.Response = await send()
        if r.status_code != 503 or loop.time() > deadline:
            return r
        await asyncio.sleep(0.1)


def test_a_node_forwards_publishes_reads_and_group_requests_to_the_node_serving_them(
    tmp_path: Path, etcd: EtcdServer
) -> None:
    """Nodes 1 and 2 forward (the default), node 3 redirects. A publish (one message, a
    batch, keyed with an Idempotency-Key) sent to a node that does not lead its partition is
    stored by the leader and answered with its partition and offset; a retry of the keyed one
    through another node, or the leader itself, gets the same offsets and stores nothing; the
    key with other messages is 409, a partition that does not exist 404. A read of a
    partition the node holds no replica of (from an offset, a time, with a search, and a
    long poll) is answered with the leader's records and high watermark. A group committed,
    described and reset through a node that does not coordinate it, answered as the
    coordinator answers. Node 3 answers 307 to the leader (or coordinator) instead. About
    10 s."""

    async def main() -> None:
        async with in_process_cluster(
            lambda i: HttpNode(
                tmp_path, etcd, i, "http-fwd", routing="redirect" if i == 3 else "forward"
            )
        ) as nodes:
            await nodes[0].cluster.create_topic("f", 6, LogConfig(), 1)  # one replica each
            lead = await _placed(nodes, "f", 6)
            forwarders = [n for n in nodes if n.routing == "forward"]

            def via(p: int) -> HttpNode:  # a forwarding node without a replica of p
                return next(n for n in forwarders if n is not lead[p])

            async with httpx.AsyncClient(timeout=WAIT_S) as web:
                for p in range(6):
                    r = await web.post(
                        f"{via(p).http}/v1/topics/f/messages",
                        json={"value": f"v{p}", "partition": p},
                    )
                    assert r.status_code == 201, r.text
                    assert r.json() == {"partition": p, "offset": 0}
                    assert lead[p].broker.log("f", p).log_end_offset == 1
                p = next(p for p in range(6) if lead[p].id != 1)
                r = await web.post(
                    f"{via(p).http}/v1/topics/f/messages:batch",
                    json={
                        "messages": [
                            {"value": "b1", "partition": p},
                            {"value": "b2", "partition": p},
                        ]
                    },
                )
                assert r.status_code == 201, r.text
                end = lead[p].broker.log("f", p).log_end_offset
                assert r.json() == {
                    "results": [
                        {"offset": end - 2, "partition": p},
                        {"offset": end - 1, "partition": p},
                    ]
                }
                # Idempotency-Key: kept by the leader, whichever way the request came.
                keyed = {"value": "once", "partition": p}
                answers = []
                for n in [via(p), *nodes]:
                    r = await web.post(
                        f"{n.http}/v1/topics/f/messages",
                        json=keyed,
                        headers={"Idempotency-Key": "k-1"},
                        follow_redirects=True,
                    )
                    assert r.status_code == 201, r.text
                    answers.append(r.json())
                assert answers == [{"offset": end, "partition": p}] * 4
                assert lead[p].broker.log("f", p).log_end_offset == end + 1  # stored once
                r = await web.post(
                    f"{via(p).http}/v1/topics/f/messages",
                    json={"value": "other", "partition": p},
                    headers={"Idempotency-Key": "k-1"},
                )
                assert r.status_code == 409, r.text
                assert r.json()["error"]["name"] == "IdempotencyKeyReusedError"
                r = await web.post(
                    f"{via(p).http}/v1/topics/f/messages", json={"value": "x", "partition": 9}
                )
                assert r.status_code == 404, r.text
                # Reads of a partition held elsewhere: the leader's records and watermark.
                base = f"{via(p).http}/v1/topics/f/partitions/{p}/messages"
                r = await web.get(base, params={"offset": 0})
                assert r.status_code == 200, r.text
                page = r.json()
                assert [m["value"] for m in page["messages"]] == [f"v{p}", "b1", "b2", "once"]
                assert page["next_offset"] == end + 1
                assert page["high_watermark"] == end + 1
                r = await web.get(base)  # from the log start
                assert [m["offset"] for m in r.json()["messages"]] == [0, 1, 2, 3]
                r = await web.get(base, params={"from_timestamp": 0, "limit": 2})
                assert [m["value"] for m in r.json()["messages"]] == [f"v{p}", "b1"]
                r = await web.get(base, params={"q": "B2"})
                assert [m["offset"] for m in r.json()["messages"]] == [2]
                assert r.json()["scanned"] == 4
                # A long poll at the end: answered with what is published meanwhile.
                polled = asyncio.ensure_future(
                    web.get(base, params={"offset": end + 1, "wait_ms": 20_000})
                )
                r = await web.post(
                    f"{lead[p].http}/v1/topics/f/messages", json={"value": "late", "partition": p}
                )
                assert r.status_code == 201, r.text
                r = await polled
                assert [m["value"] for m in r.json()["messages"]] == ["late"]
                # A group through a node that does not coordinate it.
                body = {"offsets": [{"topic": "f", "partition": p, "offset": 2}]}
                r = await _until_served(
                    lambda: web.post(f"{forwarders[0].http}/v1/groups/g/commit", json=body)
                )
                assert r.status_code == 200, r.text
                holder = next(
                    n
                    for n in nodes
                    if n.broker.replication.leads(OFFSETS_TOPIC, coordinator_partition("g"))
                )
                other = next(n for n in forwarders if n is not holder)
                for n in forwarders:  # the coordinator's answer, from any node
                    r = await web.post(f"{n.http}/v1/groups/g/commit", json=body)
                    assert r.status_code == 200, r.text
                r = await web.get(f"{other.http}/v1/groups/g")
                assert r.status_code == 200, r.text
                offsets = r.json()["offsets"]
                assert [
                    (o["partition"], o["committed"]) for o in offsets if o["committed"] >= 0
                ] == [(p, 2)]
                assert holder.broker.groups.committed("g", None)[("f", p)].offset == 2
                r = await web.get(f"{other.http}/v1/groups/nobody")  # the coordinator's 404
                assert r.status_code in (404, 503), r.text  # 503: its coordinator not up yet
                # A reset through a node that does not coordinate the group (nor hold the
                # partition): the coordinator's answer, the end offset from the leader.
                q = next(q for q in range(6) if lead[q] is holder)
                assert ("f", q) not in other.broker.logs.logs
                dry = {"topic": "f", "to": "earliest", "partitions": [q], "dry_run": True}
                r = await web.post(f"{other.http}/v1/groups/g/reset", json=dry)
                assert r.status_code == 200, r.text
                hw = holder.broker.high_watermark("f", q)
                assert hw > 0
                assert r.json() == {
                    "group": "g",
                    "dry_run": True,
                    "partitions": [
                        {
                            "topic": "f",
                            "partition": q,
                            "previous": 2 if q == p else -1,
                            "offset": 0,
                            "end_offset": hw,
                            "lag": hw,
                        }
                    ],
                }
                same = await web.post(f"{holder.http}/v1/groups/g/reset", json=dry)
                assert same.json() == r.json()  # as the coordinator answers it
                reset = {"topic": "f", "to": "offset", "offset": 1, "partitions": [q]}
                r = await web.post(f"{other.http}/v1/groups/g/reset", json=reset)
                assert r.status_code == 200, r.text
                assert r.json()["partitions"][0]["offset"] == 1
                assert holder.broker.groups.committed("g", None)[("f", q)].offset == 1
                r = await web.post(
                    f"{other.http}/v1/groups/g/reset", json={"topic": "nope", "to": "latest"}
                )
                assert r.status_code == 404, r.text  # the coordinator's
                assert r.json()["error"]["name"] == "UnknownTopicError"
                if holder is not nodes[2]:  # node 3 redirects a reset too
                    r = await web.post(f"{nodes[2].http}/v1/groups/g/reset", json=dry)
                    assert r.status_code == 307, r.text
                    assert r.headers["location"] == f"{holder.http}/v1/groups/g/reset"
                # Node 3 redirects: 307 to the leader's listener, nothing stored there.
                q = next((q for q in range(6) if lead[q].id != 3), None)
                if q is not None:
                    before = lead[q].broker.log("f", q).log_end_offset
                    r = await web.post(
                        f"{nodes[2].http}/v1/topics/f/messages", json={"value": "r", "partition": q}
                    )
                    assert r.status_code == 307, r.text
                    assert r.headers["location"] == f"{lead[q].http}/v1/topics/f/messages"
                    r = await web.get(f"{nodes[2].http}/v1/topics/f/partitions/{q}/messages")
                    assert r.status_code == 307, r.text
                    assert lead[q].broker.log("f", q).log_end_offset == before

    asyncio.run(asyncio.wait_for(main(), 120))


def test_a_secured_cluster_forwards_a_callers_publish_and_read_as_the_node(
    tmp_path: Path, etcd: EtcdServer
) -> None:
    """Authorization on, the node principal given the role ``node``: a user whose API key
    may write and read a topic of one replica publishes (one message, a keyed batch), reads
    it and commits a group's offset over HTTP on nodes that hold no replica of it, answered
    by the leader (no 307 whose Authorization a client would drop), and resets the group
    through a node that does not coordinate it. A user without ``write`` (or ``alter`` on
    the group) is refused 403 where it arrives, and nothing is stored. About 10 s."""

    async def main() -> None:
        async with secure_cluster(tmp_path, etcd, "sec-fwd") as c:
            async with c.nodes[0].client(c.admin) as admin:
                await admin.alter_principal(NODE_PRINCIPAL, roles=["node"])
                await admin.create_topic("solo", partitions=1, replication_factor=1)
                await admin.create_topic("wide", partitions=1, replication_factor=3)
                keys = {}
                for name, ops, group_ops in (
                    ("writer", ("write", "read"), ("read", "alter")),
                    ("reader", ("read",), ("read",)),
                ):
                    await admin.create_principal(name)
                    _, keys[name] = await admin.create_api_key(name)
                    await admin.add_acls(
                        [
                            *acl(name, "topic", "solo", *ops),
                            *acl(name, "topic", "wide", "describe"),
                            *acl(name, "group", "g", *group_ops),
                        ]
                    )
            await c.settled()
            (lead,) = (await _placed(c.nodes, "solo", 1)).values()
            others = [n for n in c.nodes if n is not lead]
            assert all(("solo", 0) not in n.broker.logs.logs for n in others)
            async with others[0].http(keys["writer"]) as http:
                r = await http.post("/v1/topics/solo/messages", json={"value": "a"})
                assert r.status_code == 201, r.text
                assert r.json() == {"partition": 0, "offset": 0}
                batch = {"messages": [{"value": "b"}, {"value": "c"}]}
                for _ in range(2):  # the retry is answered with the first offsets
                    r = await http.post(
                        "/v1/topics/solo/messages:batch",
                        json=batch,
                        headers={"Idempotency-Key": "b-1"},
                    )
                    assert r.status_code == 201, r.text
                    assert r.json()["results"] == [
                        {"partition": 0, "offset": 1},
                        {"partition": 0, "offset": 2},
                    ]
            async with others[1].http(keys["writer"]) as http:
                r = await http.get("/v1/topics/solo/partitions/0/messages")
                assert r.status_code == 200, r.text
                assert [m["value"] for m in r.json()["messages"]] == ["a", "b", "c"]
                body = {"offsets": [{"topic": "solo", "partition": 0, "offset": 3}]}
                r = await _until_served(lambda: http.post("/v1/groups/g/commit", json=body))
                assert r.status_code == 200, r.text
            # A reset through a node that does not coordinate the group, by a caller with
            # alter on it (checked there); one without is refused there.
            coordinator = next(
                n
                for n in c.nodes
                if n.broker.replication.leads(OFFSETS_TOPIC, coordinator_partition("g"))
            )
            via = next(n for n in c.nodes if n is not coordinator)
            reset = {"topic": "wide", "to": "latest"}
            async with via.http(keys["reader"]) as http:
                r = await http.post("/v1/groups/g/reset", json=reset)
                assert r.status_code == 403, r.text
            async with via.http(keys["writer"]) as http:
                r = await http.post("/v1/groups/g/reset", json=reset)
                assert r.status_code == 200, r.text
                assert r.json()["partitions"] == [
                    {
                        "topic": "wide",
                        "partition": 0,
                        "previous": -1,
                        "offset": 0,
                        "end_offset": 0,
                        "lag": 0,
                    }
                ]
            committed = coordinator.broker.groups.committed("g", None)
            assert committed[("wide", 0)].offset == 0
            async with others[1].http(keys["reader"]) as http:
                r = await http.post("/v1/topics/solo/messages", json={"value": "no"})
                assert r.status_code == 403, r.text
            assert lead.broker.log("solo", 0).log_end_offset == 3

    asyncio.run(asyncio.wait_for(main(), 120))


def test_a_forwarded_pop_whose_answer_is_lost_is_sent_again_and_takes_once(
    tmp_path: Path, etcd: EtcdServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A msgbus pop forwarded to the leader (``TAKE``) whose answer is lost on the way back
    (the leader took a message, the sender sees its connection break) is sent once more
    with the same take id: the leader answers it with the message it took, so that message
    is handed out (not lost) and the next pop takes the next one (none taken twice)."""
    real = PeerClient.routed_body
    lost: list[str] = []

    async def losing(self: PeerClient, topic: str, partition: int, request: Any) -> Any:
        body = await real(self, topic, partition, request)
        if isinstance(request, TakeRequest) and not lost:
            lost.append(request.take_id)
            raise ConnectionLostError("the answer was lost on the way (test)")
        return body

    monkeypatch.setattr(PeerClient, "routed_body", losing)

    async def main() -> None:
        async with (
            cluster(tmp_path, etcd, 3, "http-take") as nodes,
            httpx.AsyncClient(timeout=WAIT_S) as h,
        ):
            for i in range(2):
                r = await h.post(f"{nodes[0].msgbus}/once", content=f"m{i}".encode())
                assert r.status_code == 202, r.text
            leader = await known_everywhere(nodes, "msgbus.once")
            other = next(n for n in nodes if n.id != leader)
            popped = []
            for _ in range(2):
                r = await h.get(f"{other.msgbus}/once")
                assert r.status_code == 200, r.text
                popped.append(base64.b64decode(r.json()["payload"]))
            assert popped == [b"m0", b"m1"]
            assert len(lost) == 1  # one answer lost, its take sent again (with its id)
            assert lost[0]
            r = await h.get(f"{other.msgbus}/once")
            assert r.status_code == 404, r.text

    asyncio.run(asyncio.wait_for(main(), 120))


def test_a_forwarded_publish_follows_the_leader_and_keeps_its_idempotency_key(
    tmp_path: Path, etcd: EtcdServer
) -> None:
    """A keyed publish forwarded to a partition's leader, retried through the same node
    after that leader stopped, reaches the new leader (the forwarding node's routing follows
    it), which answers the first offsets and stores nothing again (it read the keys back); a
    new publish through that node is stored by the new leader. About 10 s."""

    async def main() -> None:
        async with cluster(tmp_path, etcd, 3, "http-fwd-move") as nodes:
            await nodes[0].cluster.create_topic("m", 1, LogConfig(), 3)

            def in_sync() -> bool:
                got = nodes[0].cluster.cache.partition("m", 0)
                return got is not None and len(got[0].isr) == 3

            await until(in_sync, "every replica of m in sync")
            (leader,) = (await _placed(nodes, "m", 1)).values()
            via = next(n for n in nodes if n is not leader)
            msg = {"value": "once", "partition": 0}
            async with httpx.AsyncClient(timeout=WAIT_S) as web:
                first = await web.post(
                    f"{via.http}/v1/topics/m/messages", json=msg, headers={"Idempotency-Key": "mv"}
                )
                assert first.status_code == 201, first.text
                new = await stop_for_next_leader(nodes, leader, "m")
                again = await _until_served(
                    lambda: web.post(
                        f"{via.http}/v1/topics/m/messages",
                        json=msg,
                        headers={"Idempotency-Key": "mv"},
                    )
                )
                assert again.status_code == 201, again.text
                assert again.json() == first.json()
                end = first.json()["offset"] + 1
                assert new.broker.log("m", 0).log_end_offset == end  # stored once
                r = await _until_served(
                    lambda: web.post(f"{via.http}/v1/topics/m/messages", json={"value": "next"})
                )
                assert r.status_code == 201, r.text
                assert r.json() == {"partition": 0, "offset": end}

    asyncio.run(asyncio.wait_for(main(), 120))


def test_a_publish_to_a_partition_without_a_leader_is_503_never_307(
    tmp_path: Path, etcd: EtcdServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A partition of one replica whose node stopped has no leader: a publish to it through
    a forwarding node (one message, a batch, keyed or not) answers ``503`` with
    ``Retry-After`` (retry), not a ``400``; nothing is stored. A publish whose partition's
    lead moves to another node while the node reached stores it (its produce refused,
    naming the new leader) is ``503`` too, never a ``307`` (which a client set up for
    forwarding does not expect). About 10 s."""

    async def main() -> None:
        async with cluster(tmp_path, etcd, 3, "http-fwd-none") as nodes:
            await nodes[0].cluster.create_topic("lone", 3, LogConfig(), 1)
            lead = await _placed(nodes, "lone", 3)
            assert len({n.id for n in lead.values()}) == 3  # placed one per node
            rest = [n for n in nodes if n is not lead[0]]
            await lead[0].stop()

            def leaderless() -> bool:
                for n in rest:
                    got = n.cluster.cache.partition("lone", 0)
                    if got is None or got[0].leader >= 0:
                        return False
                return True

            await until(leaderless, "lone/0 without a leader on every other node")
            sizes = {
                (n.id, k): log.log_end_offset for n in rest for k, log in n.broker.logs.logs.items()
            }
            one = {"value": "x", "partition": 0}
            batch = {"messages": [{"value": "a", "partition": 0}, {"value": "b"}]}
            async with httpx.AsyncClient(timeout=WAIT_S) as web:

                async def unavailable(n: HttpNode, path: str, body: Any, **headers: str) -> None:
                    r = await web.post(
                        f"{n.http}/v1/topics/lone/{path}", json=body, headers=headers
                    )
                    assert r.status_code == 503, r.text
                    assert r.headers["retry-after"] == "1"
                    assert "location" not in r.headers
                    assert r.json()["error"]["name"] == "NotLeaderError"

                for n in rest:
                    await unavailable(n, "messages", one)
                    await unavailable(n, "messages", one, **{"Idempotency-Key": f"k{n.id}"})
                    await unavailable(n, "messages:batch", batch)
                    await unavailable(n, "messages:batch", batch, **{"Idempotency-Key": f"b{n.id}"})
                for n in rest:
                    for k, log in n.broker.logs.logs.items():
                        assert log.log_end_offset == sizes[(n.id, k)], (n.id, k)
                # The lead of a node's partition moves to the other node as it stores.
                here, there = rest
                p = next(p for p in range(3) if lead[p] is here)
                assert there.gateway is not None

                async def moved(topic: str, partition: int, data: bytes) -> Any:
                    raise NotLeaderError(
                        f"node {there.id} leads partition {partition} of {topic!r} now",
                        leader_id=there.id,
                        leader_host="127.0.0.1",
                        leader_port=there.server.port,
                    )

                monkeypatch.setattr(here.broker, "produce", moved)
                mine = {"value": "m", "partition": p}
                await unavailable(here, "messages", mine)
                await unavailable(here, "messages", mine, **{"Idempotency-Key": "mv"})
                await unavailable(here, "messages:batch", {"messages": [mine]})

    asyncio.run(asyncio.wait_for(main(), 120))
