"""A stand-in cluster for the client's routing tests: real TCP servers of real brokers, each
server a *node* (its id chosen by the test), where the test decides which node leads which
partition.

The server's METADATA, PRODUCE and FETCH handlers are wrapped (``HANDLERS`` entries, put back
after the test by ``monkeypatch``) so that a node of the cluster:

- answers METADATA with every node that is up (``nodes``), its own id (``broker_id``), and
  each partition's leader from :attr:`FakeCluster.leaders`;
- stores and serves only the partitions it leads, refusing the others with
  :class:`~tidewire.errors.NotLeaderError` (nothing stored), as a follower does.

Nodes may share one broker (then its log and producer state are "replicated" perfectly: a
leader change loses nothing, which is what the idempotence tests need) or have one each
(then where a record was stored shows which node the client sent it to). A server that is
not a node of the cluster answers as a single broker does.
"""

from __future__ import annotations

import collections
from typing import Any

import pytest

from tidewire.broker import Broker
from tidewire.errors import NotLeaderError
from tidewire.protocol.messages import (
    ApiKey,
    FetchPartitionResult,
    FetchRequest,
    FetchResponse,
    MetadataResponse,
    NodeAddress,
    ProducePartitionResult,
    ProduceRequest,
    ProduceResponse,
)
from tidewire.server import TcpServer
from tidewire.server.handlers import HANDLERS, Handler, Reply, ServerInfo

TP = tuple[str, int]


class FakeCluster:
    """Nodes (TCP servers) by id, the leader of each partition, and what each node was asked."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.servers: dict[int, TcpServer] = {}
        self.leaders: dict[TP, int] = {}
        #: Nodes taken out: not listed in METADATA answers (their server is stopped).
        self.down: set[int] = set()
        #: Requests answered, by (node id or -1 for a server outside the cluster, api name).
        self.asked: collections.Counter[tuple[int, str]] = collections.Counter()
        #: Produce entries a node refused as not their leader, by node.
        self.refused: collections.Counter[int] = collections.Counter()
        self._original = {
            key: HANDLERS[key] for key in (ApiKey.METADATA, ApiKey.PRODUCE, ApiKey.FETCH)
        }
        monkeypatch.setitem(HANDLERS, ApiKey.METADATA, self._wrap(self._metadata))
        monkeypatch.setitem(HANDLERS, ApiKey.PRODUCE, self._wrap(self._produce))
        monkeypatch.setitem(HANDLERS, ApiKey.FETCH, self._wrap(self._fetch))

    def add(self, node_id: int, server: TcpServer) -> None:
        self.servers[node_id] = server

    def addr(self, node_id: int) -> str:
        return f"127.0.0.1:{self.servers[node_id].port}"

    def _node(self, s: ServerInfo) -> int:
        for node_id, server in self.servers.items():
            if server.port == s.port:
                return node_id
        return -1

    def _wrap(self, inner: Any) -> Handler:
        async def handler(b: Broker, s: ServerInfo, req: Any, data: memoryview) -> Reply:
            node = self._node(s)
            self.asked[node, ApiKey(req.api_key).name] += 1
            if node < 0:
                return await self._original[req.api_key](b, s, req, data)
            reply: Reply = await inner(node, b, s, req, data)
            return reply

        return handler

    def _refusal(self, node: int, tp: TP) -> NotLeaderError:
        leader = self.leaders.get(tp, -1)
        return NotLeaderError(
            f"node {node} does not lead {tp[0]!r} partition {tp[1]}; {leader} does"
        )

    async def _metadata(
        self, node: int, b: Broker, s: ServerInfo, req: Any, data: memoryview
    ) -> Reply:
        body, out = await self._original[ApiKey.METADATA](b, s, req, data)
        assert isinstance(body, MetadataResponse)
        up = sorted(n for n in self.servers if n not in self.down)
        body.broker_id = node
        body.nodes = [
            NodeAddress(node_id=n, host="127.0.0.1", port=self.servers[n].port) for n in up
        ]
        body.controller = up[0]
        for desc in body.topics:
            for p in desc.partitions:
                leader = self.leaders.get((desc.name, p.partition), -1)
                p.leader = leader if leader not in self.down else -1
                p.leader_epoch = 0
                p.replicas = list(self.servers)
                p.isr = up
        return body, out

    async def _produce(
        self, node: int, b: Broker, s: ServerInfo, req: Any, data: memoryview
    ) -> Reply:
        assert isinstance(req, ProduceRequest)
        mine, chunks, refused = [], [], {}
        pos = 0
        for i, p in enumerate(req.partitions):
            chunk = data[pos : pos + p.size]
            pos += p.size
            if self.leaders.get((p.topic, p.partition)) == node:
                mine.append(p)
                chunks.append(chunk)
            else:
                refused[i] = self._refusal(node, (p.topic, p.partition))
                self.refused[node] += 1
        results: list[ProducePartitionResult] = []
        if mine:
            sub = ProduceRequest(acks=req.acks, timeout_ms=req.timeout_ms, partitions=mine)
            body, _ = await self._original[ApiKey.PRODUCE](b, s, sub, memoryview(b"".join(chunks)))
            if body is None:  # acks=0
                return None, []
            results = list(body.results)
        out: list[ProducePartitionResult] = []
        for i, p in enumerate(req.partitions):
            if i in refused:
                exc = refused[i]
                out.append(
                    ProducePartitionResult(
                        topic=p.topic,
                        partition=p.partition,
                        error_code=exc.code,
                        error_message=exc.message,
                    )
                )
            else:
                out.append(results.pop(0))
        return ProduceResponse(results=out), []

    async def _fetch(
        self, node: int, b: Broker, s: ServerInfo, req: Any, data: memoryview
    ) -> Reply:
        assert isinstance(req, FetchRequest)
        mine = [p for p in req.partitions if self.leaders.get((p.topic, p.partition)) == node]
        results: list[FetchPartitionResult] = []
        buffers: list[bytes] = []
        if mine:
            sub = FetchRequest(
                max_wait_ms=req.max_wait_ms,
                min_bytes=req.min_bytes,
                max_bytes=req.max_bytes,
                partitions=mine,
            )
            body, buffers = await self._original[ApiKey.FETCH](b, s, sub, data)
            results = list(body.partitions)
        out: list[FetchPartitionResult] = []
        for p in req.partitions:
            if self.leaders.get((p.topic, p.partition)) == node:
                out.append(results.pop(0))
            else:
                exc = self._refusal(node, (p.topic, p.partition))
                out.append(
                    FetchPartitionResult(
                        topic=p.topic,
                        partition=p.partition,
                        error_code=exc.code,
                        error_message=exc.message,
                    )
                )
        return FetchResponse(partitions=out), buffers
