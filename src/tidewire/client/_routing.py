"""Which node a partition's produce and fetch requests go to.

A cluster's METADATA answer names every node (``nodes``) and each partition's leader; a
:class:`Router` keeps that map and a connection per leader node, opened on first use and
closed once the node leads nothing the client has asked about. A single node names no nodes
and no leaders: the router then stays *unclustered* and every request goes to the client's
one connection, exactly as before; the clients test :attr:`Router.clustered` (one attribute)
before doing any routing work, so a single node costs nothing more.

Consumer-group requests are routed the same way, to the group's *coordinator*: the leader of
the group's partition of ``__consumer_offsets`` (:func:`coordinator_partition`); a node that is
not the coordinator answers :class:`~tidewire.errors.NotCoordinatorError`, a kind of
:class:`NotLeaderError`.

When a request meets a node that no longer leads its partition (:class:`NotLeaderError`), a
partition without a leader (:class:`PartitionOfflineError`, in a cluster) or a lost
connection to a leader, the client forgets that leader, refreshes the metadata
(:meth:`Router.refresh`: the bootstrap connection first, then every other node it knows, in
turn; the bootstrap connection last once it let a refresh time out, until it answers again)
and retries after :func:`backoff_s` -- what it retries is each client's decision (see
docs/clients.md, "Clusters"). The router counts what it did (:class:`RoutingStats`), so
that an application can see its client's failovers.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
import zlib
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Any, TypeVar

from tidewire.errors import (
    ConnectionLostError,
    NotEnoughReplicasError,
    NotLeaderError,
    PartitionOfflineError,
    RequestTimedOutError,
    ShuttingDownError,
    TidewireError,
)
from tidewire.protocol.messages import MetadataRequest, MetadataResponse

from ._transport import Transport

__all__ = [
    "LOSS",
    "OFFSETS_PARTITIONS",
    "OFFSETS_TOPIC",
    "Router",
    "RoutingStats",
    "backoff_s",
    "call_routed",
    "call_the_leader_of",
    "coordinator_partition",
    "leader_lost",
]

#: The broker's topic of committed offsets: in a cluster, a group's coordinator is the leader
#: of the group's partition of it (the broker's ``tidewire.broker.offsets``; the client does
#: not import the broker, and a test pins that both agree).
OFFSETS_TOPIC = "__consumer_offsets"
#: Its partition count (fixed, because a group's partition is derived from it).
OFFSETS_PARTITIONS = 8


def coordinator_partition(group_id: str) -> int:
    """The partition of :data:`OFFSETS_TOPIC` whose leader coordinates ``group_id``."""
    return zlib.crc32(group_id.encode()) % OFFSETS_PARTITIONS


#: A request's connection was lost, or its node went silent or is shutting down: the node
#: may have handled it or not.
LOSS = (ConnectionLostError, RequestTimedOutError, ShuttingDownError)
_LOSS = LOSS

T = TypeVar("T")

#: The first pause before a request is retried on a partition's new leader (s): long enough
#: for the cluster to elect one after a node is lost, short enough not to be noticed when a
#: client's metadata was merely stale.
RETRY_BACKOFF_MIN_S = 0.05
#: The longest pause between two such retries (s): a cluster names a new leader within its
#: session timeout, and a client that polls at this pace finds it within a quarter second (a
#: connection refused by a dead node, or a METADATA answer, is cheap at four a second).
RETRY_BACKOFF_MAX_S = 0.25


def backoff_s(attempt: int) -> float:
    """The pause before retry number ``attempt`` (1, 2, ...): 50 ms doubling per attempt up
    to 250 ms, times a random factor in [0.5, 1] so that clients that lost the same leader do
    not all come back at the same instant."""
    base = min(RETRY_BACKOFF_MIN_S * 2 ** max(attempt - 1, 0), RETRY_BACKOFF_MAX_S)
    return float(base * (0.5 + random.random() / 2))


def leader_lost(exc: BaseException, clustered: bool) -> bool:
    """Whether ``exc`` means the request went to a node that does not (or no longer) lead
    its partition, so that the metadata should be refreshed before a retry: NotLeaderError
    always (only a cluster answers it); in a cluster also a partition without a leader and
    a lost or silent connection, or a node shutting down (the leader's node may be gone)."""
    if isinstance(exc, NotLeaderError):
        return True
    return clustered and isinstance(exc, (PartitionOfflineError, *_LOSS))


@dataclass(slots=True)
class RoutingStats:
    """What a client's routing did since the client was made: how often it looked for
    leaders, and how often it had to (the clients' ``routing_stats``; a copy).

    On a single node only ``metadata_refreshes`` can grow (a client asks METADATA for a
    topic's partition count, or when a node answers NotLeaderError); the other two stay 0.
    """

    #: METADATA questions asked to locate leaders (the first ones, when a client starts
    #: using a topic, included), answered or not; a question passed on to the next node
    #: because one did not answer is one refresh.
    metadata_refreshes: int = 0
    #: Times a request, or a push subscription, found that its node does not (or no longer)
    #: lead its partition -- :class:`NotLeaderError`, and in a cluster also a partition
    #: without a leader or a lost or silent connection to its leader -- so that the client
    #: forgot that leader and sent the request (subscribed the partition) again where fresh
    #: metadata points, within its retry bounds. (A produce that is not idempotent is not
    #: sent again after a lost connection: that error reaches the application, and the loss
    #: is counted all the same.) Also each round of asking the nodes for the leader of an
    #: internal topic (a security change) after a NotLeaderError.
    not_leader_retries: int = 0
    #: Partitions whose leader the client learned to be another node than the one it knew
    #: last (a failover, a preferred-leader move or a reassignment it followed).
    leader_moves: int = 0

    def __add__(self, other: RoutingStats) -> RoutingStats:
        """The sum of two routers' counts (a group consumer's coordinator and partitions)."""
        return RoutingStats(
            self.metadata_refreshes + other.metadata_refreshes,
            self.not_leader_retries + other.not_leader_retries,
            self.leader_moves + other.leader_moves,
        )


class Router:
    """The leaders of the partitions a client uses, and a connection per leader node.

    Args:
        bootstrap: the client's own connection (to the address, or the first of the
            bootstrap list, that answers); unrouted requests and metadata go to it.
        connect: makes the connection to a node from its ``"HOST:PORT"`` (with the client's
            timeouts, TLS and credentials).
    """

    def __init__(self, bootstrap: Transport, connect: Callable[[str], Transport]) -> None:
        self.bootstrap = bootstrap
        self._connect = connect
        #: Whether a METADATA answer named the cluster's nodes: only then are requests
        #: routed (a single node's answer names none).
        self.clustered = False
        self._leaders: dict[tuple[str, int], int] = {}
        self._nodes: dict[int, tuple[str, int]] = {}
        self._links: dict[int, Transport] = {}  # open connections to nodes, by node id
        self._bootstrap_node = -1  # the node the bootstrap connection reached last
        #: The bootstrap connection's node let a METADATA request time out (cut off, or
        #: hung): refreshes ask the other nodes first until it answers one again. Else,
        #: with the leader forgotten after each failure, every retry and refresh would go
        #: to it first and wait out a request timeout, for as long as it stays silent.
        self._bootstrap_silent = False
        self._throttled_closed_ms = 0  # throttle time of connections closed since
        self._refresh: asyncio.Task[None] | None = None
        #: The last leader known of partitions whose leader is not known now (forgotten, or
        #: named as none): so that the leader learned next is counted as a move if it is
        #: another node (:attr:`RoutingStats.leader_moves`).
        self._former: dict[tuple[str, int], int] = {}
        #: What this router did (see :class:`RoutingStats`); its owner hands out copies.
        self.stats = RoutingStats()

    def stats_copy(self) -> RoutingStats:
        """A copy of :attr:`stats` (what the clients' ``routing_stats`` return)."""
        s = self.stats
        return RoutingStats(s.metadata_refreshes, s.not_leader_retries, s.leader_moves)

    @property
    def throttle_time_ms_total(self) -> int:
        """Throttle time of every connection together (see
        :attr:`Transport.throttle_time_ms_total`)."""
        total = self.bootstrap.throttle_time_ms_total + self._throttled_closed_ms
        return total + sum(t.throttle_time_ms_total for t in self._links.values())

    def leader(self, topic: str, partition: int) -> int:
        """The leader's node id as last learned (-1: not known)."""
        return self._leaders.get((topic, partition), -1)

    def transport_for(self, topic: str, partition: int) -> Transport:
        """The connection to the partition's leader; the bootstrap connection when its
        leader is not known (or is the node that connection reached)."""
        node = self._leaders.get((topic, partition), -1)
        if node < 0 or node == self._bootstrap_node:
            return self.bootstrap
        link = self._links.get(node)
        if link is None:
            address = self._nodes.get(node)
            if address is None:
                return self.bootstrap
            host, port = address
            link = self._links[node] = self._connect(f"{host}:{port}")
        return link

    def forget(self, topic: str, partition: int) -> None:
        """The partition's leader is no longer known (until the next refresh). When the
        connection to its node is down, the next request to that node (should the metadata
        still name it) connects at once: the callers pace their retries themselves
        (:func:`backoff_s`), and the transport's own backoff, which grows to seconds, would
        otherwise hold the first request after a failover that long."""
        self.stats.not_leader_retries += 1
        node = self._leaders.pop((topic, partition), None)
        if node is not None:
            self._former[topic, partition] = node
        link = None if node is None else self._links.get(node)
        if link is not None and not link.connected:
            link.reconnect_now()

    async def learn(self, meta: MetadataResponse, via: Transport) -> None:
        """Take the nodes and leaders of a METADATA answer that came over ``via``; close the
        connections to nodes that lead nothing known any more. A single node's answer (no
        ``nodes``) changes nothing."""
        if not meta.nodes:
            return
        self.clustered = True
        self._nodes = {n.node_id: (n.host, n.port) for n in meta.nodes}
        if via is self.bootstrap:
            self._bootstrap_node = meta.broker_id
        leaders, former, stats = self._leaders, self._former, self.stats
        for desc in meta.topics:
            if desc.error_code:
                continue
            for p in desc.partitions:
                tp = (desc.name, p.partition)
                known = leaders.get(tp, -1)
                if known < 0:
                    known = former.pop(tp, -1)
                if p.leader >= 0:
                    leaders[tp] = p.leader
                    if 0 <= known != p.leader:
                        stats.leader_moves += 1
                else:
                    leaders.pop(tp, None)
                    if known >= 0:
                        former[tp] = known
        leading = set(self._leaders.values())
        for node in [n for n in self._links if n not in leading or n == self._bootstrap_node]:
            link = self._links.pop(node)
            self._throttled_closed_ms += link.throttle_time_ms_total
            await link.close()

    async def refresh(self, topics: Iterable[str]) -> MetadataResponse:
        """Ask for the metadata of ``topics`` (without creating any) and learn it: of the
        bootstrap connection (which itself tries every bootstrap address), then of each other
        node known, until one answers.

        Raises:
            ConnectionLostError, RequestTimedOutError: no node answered (the last failure).
            TidewireError: the broker refused the request.
        """
        request = MetadataRequest(topics=sorted(set(topics)))
        self.stats.metadata_refreshes += 1
        others = [node for node in sorted(self._nodes) if node != self._bootstrap_node]
        failure: TidewireError | None = None
        order = [*others, -1] if self._bootstrap_silent else [-1, *others]
        for node in order:
            if node < 0:
                transport = self.bootstrap
            elif node in self._links:
                transport = self._links[node]
            else:
                host, port = self._nodes[node]
                transport = self._connect(f"{host}:{port}")  # for this question only
            try:
                response = await transport.request(request)
            except _LOSS as exc:
                if node < 0 and isinstance(exc, RequestTimedOutError):
                    self._bootstrap_silent = True
                failure = exc
                continue
            finally:
                if node >= 0 and transport is not self._links.get(node):
                    await transport.close()
            assert response is not None
            if node < 0:
                self._bootstrap_silent = False
            body: MetadataResponse = response.body
            await self.learn(body, transport)
            return body
        assert failure is not None
        raise failure

    async def ask_nodes_until(self, request: Any, done: Callable[[Any], bool]) -> Any | None:
        """Ask the cluster's nodes in turn (after a metadata refresh names them) until one's
        answer is ``done``: that answer's body, or None when no node's was (on a single
        node: its answer, done or not). For a request that only one node carries out and
        the others refuse without changing anything (a security change, made on the leader
        of ``__security``, whose location the metadata keeps private).

        Raises:
            ConnectionLostError, RequestTimedOutError: a node did not answer (it may have
                carried the request out: not sent elsewhere).
        """
        answers = await self._ask_nodes(request, until=done)
        if not self.clustered:
            return answers[0]
        return answers[-1] if answers and done(answers[-1]) else None

    async def ask_every_node(self, request: Any) -> list[Any]:
        """The answers of every node of the cluster to ``request`` (a request each node
        answers for its own share, such as LIST_GROUPS: a node lists the groups it
        coordinates), after a metadata refresh names the nodes; on a single node, its one
        answer.

        Raises:
            ConnectionLostError, RequestTimedOutError: a node did not answer (a partial
                answer would look whole).
        """
        return await self._ask_nodes(request)

    async def _ask_nodes(
        self, request: Any, until: Callable[[Any], bool] | None = None
    ) -> list[Any]:
        """The answers' bodies of the cluster's nodes to ``request``, asked in turn after a
        metadata refresh names them, up to the first that is ``until`` (every node: None);
        on a single node, its one answer. A node that does not answer raises."""
        await self.refresh([])
        if not self.clustered:
            response = await self.bootstrap.request(request)
            assert response is not None
            return [response.body]
        answers = []
        for node in sorted(self._nodes):
            if node == self._bootstrap_node:
                transport = self.bootstrap
            elif node in self._links:
                transport = self._links[node]
            else:
                host, port = self._nodes[node]
                transport = self._connect(f"{host}:{port}")  # for this question only
            try:
                response = await transport.request(request)
            finally:
                if transport is not self.bootstrap and transport is not self._links.get(node):
                    await transport.close()
            assert response is not None
            answers.append(response.body)
            if until is not None and until(response.body):
                break
        return answers

    def refresh_soon(self, topics: Iterable[str]) -> None:
        """Start a refresh in the background unless one is running (what it fails with is
        dropped: the next failed request asks again)."""
        if self._refresh is None or self._refresh.done():
            self._refresh = asyncio.get_running_loop().create_task(
                self._refresh_quietly(list(topics)), name="tidewire metadata refresh"
            )

    async def _refresh_quietly(self, topics: list[str]) -> None:
        with contextlib.suppress(TidewireError):  # the next request that fails asks again
            await self.refresh(topics)

    async def close(self) -> None:
        """Close the connections to the nodes (not the bootstrap connection, its owner's)."""
        task, self._refresh = self._refresh, None
        if task is not None and not task.done():
            task.cancel()
            await asyncio.wait([task])
        links, self._links = list(self._links.values()), {}
        for link in links:
            self._throttled_closed_ms += link.throttle_time_ms_total
            await link.close()


async def call_the_leader_of(transport: Transport, router: Router, body: Any) -> Any:
    """Send ``body``, a change that only the leader of a one-partition internal topic makes
    (``__security``, ``__queue_definitions``), and return the answer's body: the bootstrap
    node's, unless it refuses with :class:`NotLeaderError` (changing nothing); then the
    nodes are asked in turn, with :func:`backoff_s` between rounds while the leadership
    moves, for up to the request timeout. A lost connection is not retried (the change may
    have been made). On a single node: its answer."""
    response = await transport.request(body)
    assert response is not None
    answer = response.body
    deadline = time.monotonic() + transport.request_timeout_s
    attempt = 0
    while answer.error_code == NotLeaderError.code and time.monotonic() < deadline:
        attempt += 1
        router.stats.not_leader_retries += 1
        got = await router.ask_nodes_until(body, lambda b: b.error_code != NotLeaderError.code)
        if got is not None:
            return got
        await asyncio.sleep(backoff_s(attempt))  # the leadership is moving
    return answer


async def call_routed(
    router: Router,
    topic: str,
    partition: int,
    send: Callable[[Transport], Awaitable[T]],
    *,
    timeout_s: float,
    resend_on_loss: bool,
) -> T:
    """``send`` the request for ``topic``/``partition`` to its leader; when the leader is
    lost (:func:`leader_lost`), or the partition's in-sync replicas are too few
    (:class:`NotEnoughReplicasError`, nothing stored), refresh the metadata, back off and send
    it again, for up to ``timeout_s`` after the first failure.

    Args:
        resend_on_loss: whether a request whose connection was lost may be sent again (not a
            produce that is not idempotent: it may have been stored).

    Raises:
        TidewireError: what the last attempt failed with.
    """
    deadline = 0.0
    attempt = 0
    while True:
        transport = router.transport_for(topic, partition) if router.clustered else router.bootstrap
        try:
            return await send(transport)
        except TidewireError as exc:
            lost = leader_lost(exc, router.clustered)
            if isinstance(exc, _LOSS) and not resend_on_loss:
                if lost:
                    # Not sent again here, but the caller may send it again: not to the same
                    # node by the stale metadata, whose connection to a dead node would only
                    # wait out a reconnect backoff growing to seconds at each attempt.
                    router.forget(topic, partition)
                    router.refresh_soon([topic])
                raise
            # Too few in-sync replicas is worth waiting out in a cluster only (a single node
            # answers as before: at once).
            if not lost and not (router.clustered and isinstance(exc, NotEnoughReplicasError)):
                raise
            now = time.monotonic()
            attempt += 1
            if attempt == 1:
                deadline = now + timeout_s
            if now >= deadline:
                raise
            if lost:
                router.forget(topic, partition)
            await asyncio.sleep(min(backoff_s(attempt), max(deadline - now, 0.0)))
            if lost:
                # No node answering is not final: the next attempt tells, within the deadline.
                with contextlib.suppress(*_LOSS):
                    await router.refresh([topic])
