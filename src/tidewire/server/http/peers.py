"""The HTTP API on a node of a cluster, for what spans partitions this node holds no replica
of: its internal routed client (:class:`PeerClient`) and the stream cursor that reads those
partitions through it (:class:`ClusterCursor`); docs/cluster.md, "The HTTP API in a cluster".

- A :class:`PeerClient` sends the protocol's FETCH, LIST_OFFSETS and LIST_GROUPS to other
  nodes with the client's leader routing (:mod:`tidewire.client._routing`: each partition's
  request to its leader, refreshed and retried on ``NotLeaderError`` or a lost node), as this
  node's own identity: the connections are made by the node's ``replica_connect`` (its TLS
  and ``--node-api-key-file``), as its replica fetchers' are. The request was checked at this
  node's gate (the HTTP caller's permissions); the leader's gate checks the node principal's.
  One client belongs to one request or stream, which closes it; its connections are not its
  own but borrowed from the node's :class:`PeerPool`: the clients of every request share a
  few connections per other node (requests are multiplexed on a connection, answered in any
  order), so forwarded requests do not open a connection each. The pool closes them when the
  node leaves the cluster (:meth:`ClusterNode.close`).
- A :class:`ClusterCursor` is a :class:`~._cursor.LogCursor` whose partitions held here are
  read from the local replica (below its high watermark, as any read on this node), and the
  others from their leaders: one FETCH in flight per such partition at most, of at most
  :data:`~._cursor.READ_BYTES`, started only once what the previous one brought has been
  delivered, so what a stream holds stays the local cursor's bound and the client's credit
  still decides what is sent. The leader long-polls the fetch; its answer sets
  :attr:`ClusterCursor.arrived`, which the streams wait on besides the local wake-ups.

A single node never makes either: its streams use a plain :class:`~._cursor.LogCursor`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from tidewire._tasks import cancel_and_wait
from tidewire.client._routing import OFFSETS_TOPIC, Router, call_routed, coordinator_partition
from tidewire.client._transport import Transport
from tidewire.cluster import cluster_node
from tidewire.errors import (
    ConnectionLostError,
    NotLeaderError,
    OffsetOutOfRangeError,
    RequestTimedOutError,
    TidewireError,
    fetch_error,
    for_code,
)
from tidewire.protocol import ResponseReceived
from tidewire.protocol.frames import Buffer
from tidewire.protocol.messages import (
    ACKS_DURABLE,
    Body,
    FetchPartition,
    FetchRequest,
    HttpPublishRequest,
    ListOffsetsPartition,
    ListOffsetsRequest,
    ProducePartition,
    ProduceRequest,
)
from tidewire.server.http._cursor import (
    READ_BYTES,
    LogCursor,
    Part,
    StartAt,
    decode_records,
    encode_message,
)

if TYPE_CHECKING:
    from tidewire.broker import Broker
    from tidewire.cluster.node import ClusterNode

__all__ = [
    "FETCH_WAIT_MS",
    "ClusterCursor",
    "Fetched",
    "PeerClient",
    "PeerPool",
    "PublishForwarder",
    "SharedLink",
    "close_cursor",
    "make_cursor",
    "node_transports",
    "offset_bounds",
    "resolve_start",
    "wake_events",
]

log = logging.getLogger("tidewire.http")

#: How long a leader holds a stream's fetch of a caught-up partition (ms): long enough that an
#: idle stream costs a request every few seconds per remote partition, short enough that a
#: leader that moved is noticed within that time even when nothing fails.
FETCH_WAIT_MS = 5_000
#: How long a request to another node is retried on a partition's new leader (s): a cluster
#: elects one within its session timeout (6 s by default); beyond that the stream reports the
#: error and the client resumes (with its resume token) when it can.
PEER_TIMEOUT_S = 30.0
#: The most connections a node's forwarded requests share to one other node.
LINKS_PER_NODE = 4
#: A shared connection with this many requests in flight is busy: the next client gets
#: another one, while there are fewer than :data:`LINKS_PER_NODE` (a stream's long-polled
#: fetches then do not make a short request wait behind them for a free slot).
BUSY_IN_FLIGHT = 16


@dataclass(frozen=True, slots=True)
class Fetched:
    """A fetch's answer: whole batches from the offset asked for, the leader's high watermark
    and log start."""

    data: bytes
    high_watermark: int
    log_start_offset: int


def node_transports(
    node: ClusterNode, timeout_s: float = PEER_TIMEOUT_S
) -> Callable[[str], Transport]:
    """Opens connections (``"HOST:PORT"``) to other nodes as ``node`` itself: with its
    ``replica_connect`` (its TLS and ``--node-api-key-file``), else plaintext with a request
    timeout of ``timeout_s``."""
    raw = node.replica_connect

    def connect(address: str) -> Transport:
        host, _, port = address.rpartition(":")
        if raw is None:
            return Transport(address, connect_timeout_s=5.0, request_timeout_s=timeout_s)
        link = raw(host.strip("[]"), int(port))
        if not isinstance(link, Transport):  # a node's replica_connect makes Transports
            raise TypeError(f"replica_connect made a {type(link).__name__}, not a Transport")
        return link

    return connect


class SharedLink(Transport):
    """A connection of a :class:`PeerPool`, configured as ``like`` (a connection the node's
    ``connect`` made, never opened itself): the clients that borrow it share it, so their
    :meth:`close` leaves it open; :meth:`shut` (the pool's) closes it. It counts its
    requests in flight, by which the pool picks the least busy."""

    def __init__(self, address: str, like: Transport) -> None:
        super().__init__(
            address,
            connect_timeout_s=like.connect_timeout_s,
            request_timeout_s=like.request_timeout_s,
            max_in_flight=like.max_in_flight,
            max_frame_bytes=like.max_frame_bytes,
            tls=like.tls,
            credentials=like.credentials,
        )
        #: Requests sent through :meth:`request` and not answered yet.
        self.in_flight = 0

    async def request(
        self,
        body: Body,
        data: Sequence[Buffer] = (),
        *,
        timeout_s: float | None = None,
        expect_response: bool = True,
    ) -> ResponseReceived | None:
        self.in_flight += 1
        try:
            return await super().request(
                body, data, timeout_s=timeout_s, expect_response=expect_response
            )
        finally:
            self.in_flight -= 1

    async def close(self) -> None:
        """Nothing: a borrower is done with it, the pool keeps it open for the others."""

    async def shut(self) -> None:
        """Close the connection (the pool's close); requests waiting on it fail."""
        await super().close()


class PeerPool:
    """The connections a node's forwarded requests share (see the module docstring): up to
    :data:`LINKS_PER_NODE` per other node's address, made by ``connect`` (the node's
    identity), opened on first use and reopened by themselves after a failure.

    Once closed, it hands out connections of their own to the borrowers (closed by them, as
    before pooling), so a request still running while the node leaves does not leak one.
    """

    def __init__(self, connect: Callable[[str], Transport]) -> None:
        self._connect = connect
        self._links: dict[str, list[SharedLink]] = {}
        self.closed = False
        #: Shared connections made since the start (a connection reopened counts once).
        self.made = 0

    def link(self, address: str) -> Transport:
        """A connection to ``address`` (``"HOST:PORT"``): the least busy of the shared ones,
        or a new shared one when every one is busy and there is room for another."""
        if self.closed:
            return self._connect(address)
        links = self._links.setdefault(address, [])
        best = min(links, key=lambda t: t.in_flight, default=None)
        if best is None or (best.in_flight >= BUSY_IN_FLIGHT and len(links) < LINKS_PER_NODE):
            best = SharedLink(address, self._connect(address))
            links.append(best)
            self.made += 1
        elif not best.connected:
            # Down since a failure: a new borrower's request tries to connect at once (as a
            # connection of its own would), not after the backoff earlier failures grew (a
            # node back from a restart is reached by the next request, not seconds later).
            best.reconnect_now()
        return best

    def links(self) -> list[SharedLink]:
        """The shared connections the pool holds (open, or to be opened on first use)."""
        return [link for links in self._links.values() for link in links]

    async def close(self) -> None:
        """Close every shared connection; from now on borrowers get their own."""
        self.closed = True
        links, self._links = self._links, {}
        for address_links in links.values():
            for link in address_links:
                await link.shut()


def peer_pool(node: ClusterNode) -> PeerPool | None:
    """The node's pool of shared connections, made on first use; None once the node has
    left the cluster (a client made then opens its own, as before)."""
    pool = node.peer_pool
    if isinstance(pool, PeerPool):
        return pool
    if pool is not None or cluster_node(node.broker) is not node:
        return None
    made = node.peer_pool = PeerPool(node_transports(node))
    return made


class PeerClient:
    """This node's routed client to the other nodes (see the module docstring).

    Args:
        node: the cluster node this gateway runs in.
        timeout_s: how long a request is retried on a partition's new leader.
    """

    def __init__(self, node: ClusterNode, *, timeout_s: float = PEER_TIMEOUT_S) -> None:
        # The node's shared connections; a client with a timeout of its own opens its own
        # (their requests' default timeout is the client's).
        pool = peer_pool(node) if timeout_s == PEER_TIMEOUT_S else None
        connect = pool.link if pool is not None else node_transports(node, timeout_s)
        self.timeout_s = timeout_s
        #: The node whose identity and connections it uses.
        self.node = node
        self._node = node
        self._connect = connect
        self._bootstrap = connect(node.info.address)
        self._router = Router(self._bootstrap, connect)
        self._nodes: dict[int, Transport] = {}  # links of ask_node, by node id

    async def close(self) -> None:
        """Close every connection this client opened (those borrowed from the node's pool
        stay open for the other clients)."""
        links, self._nodes = list(self._nodes.values()), {}
        for link in links:
            await link.close()
        await self._router.close()
        await self._bootstrap.close()

    async def ask_node(self, node_id: int, request: Any, *, timeout_s: float) -> Any:
        """``request`` sent to node ``node_id`` itself (not routed: a question that node
        answers for what it serves, such as LIST_QUEUES for its queues' counts); the
        answer's body. Its connection (the pool's) is kept for this client's later
        questions to it.

        Raises:
            ConnectionLostError: the node is not registered now, or its connection broke.
            RequestTimedOutError: it did not answer in ``timeout_s``.
        """
        link = self._nodes.get(node_id)
        if link is None:
            info = self._node.cache.nodes.get(node_id)
            if info is None:
                raise ConnectionLostError(f"node {node_id} is not registered in the cluster now")
            link = self._nodes[node_id] = self._connect(info.address)
        try:
            async with asyncio.timeout(timeout_s):
                response = await link.request(request, timeout_s=timeout_s)
        except TimeoutError:
            raise RequestTimedOutError(
                f"node {node_id} did not answer {type(request).__name__} in {timeout_s:g} s"
            ) from None
        assert response is not None
        return response.body

    async def _learn(self, topic: str, partition: int) -> None:
        """Ask the metadata of ``topic`` when this client does not know the partition's
        leader (its first request about that topic: one client may serve requests about
        several, as the node's publish forwarder does); a failure is left to the routed call,
        which refreshes and retries by itself."""
        if self._router.leader(topic, partition) < 0:
            with contextlib.suppress(TidewireError):
                await self._router.refresh([topic])

    async def _routed(self, topic: str, partition: int, request: Any, timeout_s: float) -> Any:
        await self._learn(topic, partition)

        async def send(t: Transport) -> Any:
            response = await t.request(request, timeout_s=timeout_s)
            assert response is not None
            return response

        return await call_routed(
            self._router, topic, partition, send, timeout_s=self.timeout_s, resend_on_loss=True
        )

    async def routed_body(self, topic: str, partition: int, request: Any) -> Any:
        """``request`` answered by the leader of ``topic``/``partition`` (sent again to a new
        leader on NotLeaderError; not sent again when its connection was lost, as it may
        have been carried out): the answer's body, its error raised.

        Raises:
            TidewireError: the leader's error; NotLeaderError, ...: no leader answered
                within the timeout.
        """
        return await self._answered(topic, partition, request, _own_error)

    async def _answered(
        self,
        topic: str,
        partition: int,
        request: Any,
        error_of: Callable[[Any], tuple[int, str]],
    ) -> Any:
        """``request`` answered by the leader of ``topic``/``partition``, not sent again
        after a lost connection: the answer's body, or the error ``error_of`` finds in it
        (its code and message; code 0: none) raised."""
        await self._learn(topic, partition)
        timeout = self._bootstrap.request_timeout_s

        async def send(t: Transport) -> Any:
            response = await t.request(request, timeout_s=timeout)
            assert response is not None
            body = response.body
            code, message = error_of(body)
            if code:
                raise for_code(code)(message)
            return body

        return await call_routed(
            self._router, topic, partition, send, timeout_s=self.timeout_s, resend_on_loss=False
        )

    async def fetch(
        self, topic: str, partition: int, offset: int, *, max_bytes: int, max_wait_ms: int = 0
    ) -> Fetched:
        """The batches of ``topic``/``partition`` from ``offset`` on, below the leader's high
        watermark (long-polled up to ``max_wait_ms`` when there are none yet).

        Raises:
            OffsetOutOfRangeError, UnknownTopicError, UnknownPartitionError,
            PartitionCorruptError: as the leader answers them.
            NotLeaderError, ConnectionLostError, ...: no leader answered within the timeout.
        """
        req = FetchRequest(
            max_wait_ms=max_wait_ms,
            max_bytes=max_bytes,
            partitions=[FetchPartition(topic, partition, offset, max_bytes)],
        )
        response = await self._routed(
            topic, partition, req, self._bootstrap.request_timeout_s + max_wait_ms / 1000
        )
        (result,) = response.body.partitions
        if result.error_code:
            raise fetch_error(
                result.error_code, result.error_message, result.damage_start, result.damage_end
            )
        return Fetched(
            bytes(response.data[: result.size]),
            int(result.high_watermark),
            int(result.log_start_offset),
        )

    async def produce(self, topic: str, partition: int, batch: bytes) -> int:
        """Store one record batch in ``topic``/``partition`` through its leader (durable acks:
        in a cluster, answered once every in-sync replica holds it); its base offset.

        A lost connection is not retried (the batch may have been stored): it raises.

        Raises:
            NotLeaderError, NotEnoughReplicasError: no leader took it within the timeout.
            TidewireError: what the leader refused it with.
        """
        req = ProduceRequest(
            acks=ACKS_DURABLE, partitions=[ProducePartition(topic, partition, len(batch))]
        )
        timeout = self._bootstrap.request_timeout_s
        await self._learn(topic, partition)

        async def send(t: Transport) -> Any:
            response = await t.request(req, [batch], timeout_s=timeout)
            assert response is not None
            (result,) = response.body.results
            if result.error_code:
                raise for_code(result.error_code)(result.error_message)
            return int(result.base_offset)

        got: int = await call_routed(
            self._router, topic, partition, send, timeout_s=self.timeout_s, resend_on_loss=False
        )
        return got

    async def http_publish(
        self, topic: str, partition: int, body: bytes, batch: bool, key: str | None
    ) -> list[tuple[int, int]]:
        """An HTTP API publish (its request ``body``, a batch or one message, its
        ``Idempotency-Key``) stored by the leader of ``topic``/``partition`` as its HTTP API
        would (``HTTP_PUBLISH``): ``(partition, offset)`` of each message.

        Sent again to a new leader on NotLeaderError; after a lost connection only when it
        has an Idempotency-Key (the leader then stores it once), else the loss is raised (it
        may have been stored).

        Raises:
            TidewireError: what the leader refused it with (IdempotencyKeyReusedError as
                such); NotLeaderError, ConnectionLostError, ...: no leader took it in time.
        """
        from tidewire.server.http.errors import IdempotencyKeyReusedError  # noqa: PLC0415

        req = HttpPublishRequest(topic=topic, body=body, batch=batch, idempotency_key=key)
        timeout = self._bootstrap.request_timeout_s
        await self._learn(topic, partition)

        async def send(t: Transport) -> list[tuple[int, int]]:
            response = await t.request(req, timeout_s=timeout)
            assert response is not None
            got = response.body
            if got.error_code:
                if got.error_name == IdempotencyKeyReusedError.__name__:
                    raise IdempotencyKeyReusedError(got.error_message)
                raise for_code(got.error_code)(got.error_message)
            return [(r.partition, r.offset) for r in got.results]

        result: list[tuple[int, int]] = await call_routed(
            self._router,
            topic,
            partition,
            send,
            timeout_s=self.timeout_s,
            resend_on_loss=key is not None,
        )
        return result

    async def list_offset(self, topic: str, partition: int, timestamp: int) -> int:
        """As :meth:`Broker.list_offset`, answered by the partition's leader: -2 the log
        start, -1 the high watermark, else the first offset at or after ``timestamp`` (ms)."""
        req = ListOffsetsRequest(partitions=[ListOffsetsPartition(topic, partition, timestamp)])
        response = await self._routed(topic, partition, req, self._bootstrap.request_timeout_s)
        (result,) = response.body.results
        if result.error_code:
            raise for_code(result.error_code)(result.error_message)
        return int(result.offset)

    async def group_request(self, group: str, request: Any) -> Any:
        """``request`` about consumer group ``group``, answered by its coordinator (the leader
        of its partition of ``__consumer_offsets``, found again on NotCoordinatorError): the
        answer's body."""
        p = coordinator_partition(group)
        response = await self._routed(OFFSETS_TOPIC, p, request, self._bootstrap.request_timeout_s)
        return response.body

    async def group_body(self, group: str, request: Any) -> Any:
        """``request`` about consumer group ``group`` answered by its coordinator (sent
        again to a new one on NotCoordinatorError; not after a lost connection, as it may
        have been carried out): the answer's body, its error (or its partitions' error, the
        same for all of a commit) raised.

        Raises:
            TidewireError: the coordinator's error; NotCoordinatorError, ...: none answered
                within the timeout.
        """
        p = coordinator_partition(group)
        return await self._answered(OFFSETS_TOPIC, p, request, _group_error)

    async def ask_every_node(self, request: Any) -> list[Any]:
        """The answer bodies of every node of the cluster to ``request`` (this one included).

        Raises:
            ConnectionLostError, RequestTimedOutError: a node did not answer.
        """
        return await self._router.ask_every_node(request)


def _own_error(body: Any) -> tuple[int, str]:
    """The error an answer's body carries (code 0: none)."""
    return (body.error_code, body.error_message) if body.error_code else (0, "")


def _group_error(body: Any) -> tuple[int, str]:
    """The error of a group request's answer: its own, or its first partition's (the same
    for all of a commit; a reset's results have none)."""
    code = getattr(body, "error_code", 0)
    message = getattr(body, "error_message", "")
    for result in getattr(body, "results", ()):
        if getattr(result, "error_code", 0):
            return result.error_code, result.error_message
    return code, message


class PublishForwarder:
    """The HTTP API's publishes sent to their partitions' leaders (the publisher's
    ``forward``), through one :class:`PeerClient` of the node kept for them all (its
    metadata is then asked once, not per publish; its connections are the node pool's).

    Args:
        broker: the broker whose cluster node forwards (looked up at each publish: the
            gateway is made before the node joins).
    """

    def __init__(self, broker: Broker) -> None:
        self.broker = broker
        self._peer: PeerClient | None = None

    async def __call__(
        self, topic: str, partition: int, body: bytes, batch: bool, key: str | None
    ) -> list[tuple[int, int]]:
        node = cluster_node(self.broker)
        if node is None:
            raise NotLeaderError(f"this node left the cluster: partition {partition} of {topic!r}")
        if peer_pool(node) is None:  # the node is leaving: a client of its own, closed after
            peer = PeerClient(node)
            try:
                return await peer.http_publish(topic, partition, body, batch, key)
            finally:
                await peer.close()
        if self._peer is None or self._peer.node is not node:
            self._peer = PeerClient(node)  # the former one's links were its node's pool's
        return await self._peer.http_publish(topic, partition, body, batch, key)


# --- reading a topic on any node ---------------------------------------------------------------


def _holds(broker: Broker, topic: str, partition: int) -> bool:
    return (topic, partition) in broker.logs.logs


class ClusterCursor(LogCursor):
    """A :class:`LogCursor` over every partition of a topic in a cluster: those without a
    replica here are fetched from their leaders through ``peer`` (see the module docstring).
    Call :meth:`close` when the stream ends."""

    def __init__(
        self, broker: Broker, peer: PeerClient, topic: str, *, force_base64: bool = False
    ) -> None:
        super().__init__(broker, topic, {}, force_base64=force_base64)
        self.peer = peer
        #: Set whenever a fetch from another node answered (data, nothing, or an error).
        self.arrived = asyncio.Event()
        self._fetches: dict[int, asyncio.Task[None]] = {}
        self._dropped: set[asyncio.Task[None]] = set()  # of partitions no longer assigned
        self._failed: dict[int, TidewireError] = {}

    def remote(self, partition: int) -> bool:
        """Whether the partition is read from its leader (no replica of it here)."""
        return not _holds(self.broker, self.topic, partition)

    def assign(self, positions: dict[int, int]) -> None:
        super().assign(positions)
        for p in [p for p in self._fetches if p not in self.parts]:
            task = self._fetches.pop(p)
            task.cancel()  # its answer is not wanted; reaped by close()
            self._dropped.add(task)
            self._failed.pop(p, None)

    def peek(self, part: Part) -> tuple[int, bytes] | None:
        if not self.remote(part.partition):
            return super().peek(part)
        if part.pending:
            return part.pending[0]
        failed = self._failed.pop(part.partition, None)
        if failed is not None:
            raise failed
        part.position = max(part.position, part.read_end)
        task = self._fetches.get(part.partition)
        if task is None or task.done():
            self._fetches[part.partition] = asyncio.get_running_loop().create_task(
                self._fetch(part, part.position), name=f"http fetch {self.topic}/{part.partition}"
            )
        return None

    async def _fetch(self, part: Part, position: int) -> None:
        """One fetch of ``part`` from its leader: its records join ``pending`` (or its error
        is kept for the next :meth:`peek`); then :attr:`arrived` is set."""
        try:
            got = await self.peer.fetch(
                self.topic,
                part.partition,
                position,
                max_bytes=READ_BYTES,
                max_wait_ms=FETCH_WAIT_MS,
            )
            if self.parts.get(part.partition) is not part or part.position != position:
                return  # reassigned meanwhile: what was fetched is not wanted
            if not got.data and position < got.log_start_offset:
                raise OffsetOutOfRangeError(
                    f"offset {position} of {self.topic!r} partition {part.partition} was "
                    f"removed by retention; the log starts at {got.log_start_offset}"
                )
            force = self.force_base64
            for rec in decode_records(self.topic, part.partition, got.data, position):
                part.pending.append((rec.offset, encode_message(rec, force_base64=force)))
            if part.pending:
                part.read_end = part.pending[-1][0] + 1
        except TidewireError as exc:
            self._failed[part.partition] = exc
        finally:
            self.arrived.set()

    def waiting_keys(self) -> Sequence[tuple[str, int]]:
        return [(self.topic, p) for p in self.parts if not self.remote(p)]

    async def close(self) -> None:
        """Stop the fetches in flight and close the client's connections."""
        tasks = [*self._fetches.values(), *self._dropped]
        self._fetches, self._dropped = {}, set()
        for t in tasks:
            await cancel_and_wait(t)
        await self.peer.close()


def make_cursor(broker: Broker, topic: str, *, force_base64: bool = False) -> LogCursor:
    """An empty cursor over ``topic`` for a stream: a :class:`ClusterCursor` on a node of a
    cluster, else a plain :class:`LogCursor`. Close it with :func:`close_cursor`."""
    node = cluster_node(broker)
    if node is None:
        return LogCursor(broker, topic, {}, force_base64=force_base64)
    return ClusterCursor(broker, PeerClient(node), topic, force_base64=force_base64)


async def close_cursor(cursor: LogCursor) -> None:
    """Close what :func:`make_cursor` made (nothing to do for a single node's)."""
    if isinstance(cursor, ClusterCursor):
        await cursor.close()


def wake_events(cursor: LogCursor) -> tuple[asyncio.Event, ...]:
    """What a caught-up stream waits on besides the local wake-ups: a remote fetch's answer."""
    if isinstance(cursor, ClusterCursor):
        cursor.arrived.clear()
        return (cursor.arrived,)
    return ()


async def resolve_start(cursor: LogCursor, start: StartAt, partition: int) -> int:
    """The offset ``start`` means in ``partition`` now, asked of its leader when the
    partition has no replica here."""
    if not isinstance(cursor, ClusterCursor) or not cursor.remote(partition):
        return start.resolve(cursor.broker, cursor.topic, partition)
    peer, topic = cursor.peer, cursor.topic
    if start.kind == "earliest":
        return await peer.list_offset(topic, partition, -2)
    if start.kind == "latest":
        return await peer.list_offset(topic, partition, -1)
    if start.kind == "timestamp":
        return await peer.list_offset(topic, partition, start.value)
    low = await peer.list_offset(topic, partition, -2)
    high = await peer.list_offset(topic, partition, -1)
    return min(max(start.value, low), high)


async def offset_bounds(cursor: LogCursor, partition: int) -> tuple[int, int]:
    """The log start and the high watermark of ``partition`` (from its leader when it has no
    replica here)."""
    if not isinstance(cursor, ClusterCursor) or not cursor.remote(partition):
        b, t = cursor.broker, cursor.topic
        return b.list_offset(t, partition, -2), b.high_watermark(t, partition)
    return (
        await cursor.peer.list_offset(cursor.topic, partition, -2),
        await cursor.peer.list_offset(cursor.topic, partition, -1),
    )
