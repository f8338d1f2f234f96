"""Compatibility mode: the HTTP API of msgbus (the small Go message bus by prologic), on its
own port (``http_msgbus_port``).

=====================  ===================================================================
``GET /``              every topic: ``{"NAME": {"name", "ttl", "seq", "created"}}``
``PUT|POST /TOPIC``    publish the raw request body: ``202 Accepted``; over the payload
                       limit: ``413``
``GET /TOPIC``         pop the next message: ``{"id", "topic", "payload" (base64),
                       "created", "expires"}``; none: ``404 no messages enqueued for
                       topic: TOPIC``
``GET /TOPIC`` + WS    subscribe: every message published from now on, as that JSON, one
                       text frame each
=====================  ===================================================================

A msgbus topic ``NAME`` is the tidewire topic ``msgbus.NAME`` (escaped by
:func:`~tidewire.server.http.compat.topic_for`) of one partition, created by its first
publish; a message's ``id`` is its offset. A message expires ``ttl_ms`` after it was published
(msgbus' topic TTL, 60 s by default): a pop passes over expired messages, and a topic's
``ttl`` is that TTL in nanoseconds (a Go duration). Unlike msgbus' in-memory queues, messages are
durable, and a pop is once only across restarts: the consumer group ``msgbus`` commits the
offset after each message it hands out (:class:`~._pop.Popper`). A subscriber reads from the
log with the socket's flow control, so a slow one is never sent more than its socket takes.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import time
from collections.abc import Callable
from typing import Any

import msgspec
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.routing import Route, WebSocketRoute
from starlette.websockets import WebSocket, WebSocketDisconnect

from tidewire._tasks import cancel_and_wait
from tidewire.broker import Broker
from tidewire.cluster import cluster_node
from tidewire.errors import (
    BackpressureError,
    BatchTooLargeError,
    LogFailedError,
    NotLeaderError,
    StorageError,
    TidewireError,
    TopicExistsError,
    UnknownTopicError,
)
from tidewire.records import BatchBuilder, iter_batches
from tidewire.server.http._cursor import Record, decode_records
from tidewire.server.http._params import wait_for_data_or
from tidewire.server.http.compat import ensure_topic, name_of, rfc3339, topic_for
from tidewire.server.http.compat._pop import Popper
from tidewire.server.http.compat.take import Taken, accept_alive, take_on_leader
from tidewire.server.http.peers import PeerClient

__all__ = ["GROUP", "PREFIX", "create_msgbus_app"]

#: Prefix of the tidewire topics of msgbus topics.
PREFIX = "msgbus."
#: The consumer group whose committed offsets mark popped messages.
GROUP = "msgbus"
#: The ``expires`` field msgbus gives a message without an expiry (Go's zero time).
NO_EXPIRY = "0001-01-01T00:00:00Z"
#: Bytes read from the log per step of a subscription.
_READ_BYTES = 256 * 1024
#: How long a leader holds a remote subscription's fetch (ms): also how late a subscriber
#: that went away, or a drain, is noticed on a node without a replica of the topic.
_REMOTE_WAIT_MS = 1_000

_encode = msgspec.json.Encoder().encode


def create_msgbus_app(
    broker: Broker,
    *,
    max_payload_bytes: int,
    ttl_ms: int = 0,
    closing: asyncio.Event | None = None,
) -> Starlette:
    """The msgbus-compatible app.

    Args:
        broker: the running broker.
        max_payload_bytes: the largest message body accepted (``413`` beyond it).
        ttl_ms: how long a message may wait to be popped, ms (then a pop passes over it);
            ``0``: for ever.
        closing: set when the gateway drains (pops and subscriptions end).
    """
    stop = closing if closing is not None else asyncio.Event()
    popper = Popper(broker, GROUP, stop)

    def topic_info(topic: str) -> dict[str, Any]:
        return {
            "name": name_of(PREFIX, topic),
            "ttl": ttl_ms * 1_000_000,  # Go durations: ns
            "seq": broker.high_watermark(topic, 0),
            "created": rfc3339(_first_timestamp(broker, topic)),
        }

    def message(rec: Record) -> bytes:
        return _encode(
            {
                "id": rec.offset,
                "topic": topic_info(rec.topic),
                "payload": base64.b64encode(rec.value or b"").decode("ascii"),
                "created": rfc3339(rec.timestamp),
                "expires": NO_EXPIRY,
            }
        )

    async def list_topics(request: Request) -> Response:
        out = {}
        node = cluster_node(broker)
        if node is not None:  # the cluster's msgbus topics, wherever they are held
            try:
                return Response(
                    _encode(await _cluster_topics(broker, ttl_ms)), media_type="application/json"
                )
            except TidewireError as exc:
                return _error(exc)
        for topic in sorted(broker.topics()):
            name = name_of(PREFIX, topic)
            if name is not None and broker.partition_count(topic) == 1:
                out[name] = topic_info(topic)
        return Response(_encode(out), media_type="application/json")

    async def publish(request: Request) -> Response:
        name = request.path_params["topic"].strip("/")
        body = bytearray()
        async for chunk in request.stream():
            body += chunk
            if len(body) > max_payload_bytes:
                return PlainTextResponse(
                    f"payload exceeds max payload size of {max_payload_bytes} bytes",
                    status_code=413,
                    headers={"Connection": "close"},
                )
        try:
            topic = topic_for(PREFIX, name)
            batch = BatchBuilder()
            batch.append(bytes(body), timestamp_ms=int(time.time() * 1000))
            data = batch.build()
            if cluster_node(broker) is None:
                ensure_topic(broker, topic, data)  # a refused message creates no topic
                seq = (await broker.produce(topic, 0, data)).last_offset + 1
            else:
                seq = await _publish_in_cluster(broker, topic, data) + 1
        except TidewireError as exc:
            return _error(exc)
        return PlainTextResponse(
            f"message successfully published to {name} with sequence {seq}",
            status_code=202,
        )

    async def pop(request: Request) -> Response:
        name = request.path_params["topic"].strip("/")
        if not name:
            return await list_topics(request)
        try:
            topic = topic_for(PREFIX, name)
            if _pops_elsewhere(broker, topic):
                taken = await _pop_on_leader(broker, topic, ttl_ms)
                if taken is None:
                    return PlainTextResponse(
                        f"no messages enqueued for topic: {name}", status_code=404
                    )
                return Response(_taken_message(taken, topic), media_type="application/json")
            alive = accept_alive(ttl_ms)
            rec = await popper.pop(topic, accept=alive) if topic in broker.topics() else None
        except TidewireError as exc:
            return _error(exc)
        if rec is None:
            return PlainTextResponse(f"no messages enqueued for topic: {name}", status_code=404)
        return Response(message(rec), media_type="application/json")

    def _taken_message(taken: Taken, topic: str) -> bytes:
        return _encode(
            {
                "id": taken.offset,
                "topic": {
                    "name": name_of(PREFIX, topic),
                    "ttl": ttl_ms * 1_000_000,
                    "seq": taken.offset + 1,  # at least: the leader's end is further on
                    "created": rfc3339(taken.timestamp),
                },
                "payload": base64.b64encode(taken.value).decode("ascii"),
                "created": rfc3339(taken.timestamp),
                "expires": NO_EXPIRY,
            }
        )

    async def subscribe(websocket: WebSocket) -> None:
        name = websocket.path_params["topic"].strip("/")
        try:
            topic = topic_for(PREFIX, name)
        except TidewireError as exc:
            await websocket.close(1008, exc.message[:120])
            return
        node = cluster_node(broker)
        if node is not None:
            try:
                await _ensure_in_cluster(broker, topic)
            except TidewireError as exc:
                await websocket.close(1011, exc.message[:120])
                return
            rep = broker.replication
            if rep is None or not rep.leads(topic, 0):
                # Led elsewhere: from the leader, whose high watermark says what "from now
                # on" is (a follower's may lag behind it).
                await _subscribe_remote(websocket, PeerClient(node), topic, message, stop)
                return
        ensure_topic(broker, topic)  # msgbus creates a topic a subscriber names
        # The subscription starts before the handshake is answered: whatever is published
        # once the client holds its answer reaches it.
        position = broker.high_watermark(topic, 0)
        await websocket.accept()
        reader = asyncio.create_task(_until_disconnect(websocket))
        try:
            while not reader.done() and not stop.is_set():
                r = broker.read_partition(topic, 0, position, _READ_BYTES)
                if not r.data:
                    await wait_for_data_or(broker, [(topic, 0)], 1.0, stop)
                    continue
                for rec in decode_records(topic, 0, r.data, position):
                    await websocket.send_text(message(rec).decode())
                position = r.next_offset
        except (WebSocketDisconnect, OSError, RuntimeError, UnknownTopicError):
            pass
        finally:
            await cancel_and_wait(reader)
        if stop.is_set():
            with contextlib.suppress(WebSocketDisconnect, OSError, RuntimeError):
                await websocket.close(1001)

    routes = [
        Route("/", list_topics, methods=["GET"]),
        Route("/{topic:path}", publish, methods=["PUT", "POST"]),
        Route("/{topic:path}", pop, methods=["GET"]),
        WebSocketRoute("/{topic:path}", subscribe),
    ]
    return Starlette(routes=routes)


async def _ensure_in_cluster(broker: Broker, topic: str, batch: bytes | None = None) -> None:
    """In a cluster: create ``topic`` (one partition) through etcd unless the cluster has it,
    as msgbus creates a topic on first use (``batch``, the publish about to be stored, is
    checked against the new topic's limits first, so a refused one creates nothing)."""
    node = cluster_node(broker)
    assert node is not None
    if topic in node.cache.topics:
        return
    if batch is not None:
        broker.check_first_publish(batch)
    with contextlib.suppress(TopicExistsError):
        await node.create_topic(topic, 1, broker.config.log)


async def _publish_in_cluster(broker: Broker, topic: str, batch: bytes) -> int:
    """Store a publish in a cluster: on the leader of the topic's partition, here or through
    this node's routed client; its offset."""
    await _ensure_in_cluster(broker, topic, batch)
    rep = broker.replication
    if rep is not None and rep.leads(topic, 0):
        return (await broker.produce(topic, 0, batch)).base_offset
    node = cluster_node(broker)
    assert node is not None
    peer = PeerClient(node)
    try:
        return await peer.produce(topic, 0, batch)
    finally:
        await peer.close()


async def _cluster_topics(broker: Broker, ttl_ms: int) -> dict[str, dict[str, Any]]:
    """``GET /`` on a node of a cluster: every msgbus topic of the cluster (its metadata),
    each described from this node's replica, or asked of its leader when this node holds
    none (all at once, each within the peer client's timeout).

    Raises:
        TidewireError: a leader asked did not answer.
    """
    node = cluster_node(broker)
    assert node is not None
    topics = sorted(
        t
        for t, info in node.cache.topics.items()
        if info.partitions == 1 and name_of(PREFIX, t) is not None
    )
    remote = [t for t in topics if (t, 0) not in broker.logs.logs]
    peer = PeerClient(node) if remote else None
    try:
        found = (
            await asyncio.gather(*(_remote_seq_created(peer, t) for t in remote))
            if peer is not None
            else []
        )
    finally:
        if peer is not None:
            await peer.close()
    described = dict(zip(remote, found, strict=True))
    out: dict[str, dict[str, Any]] = {}
    for t in topics:
        seq, created = described.get(t) or (
            broker.high_watermark(t, 0),
            _first_timestamp(broker, t),
        )
        out[str(name_of(PREFIX, t))] = {
            "name": name_of(PREFIX, t),
            "ttl": ttl_ms * 1_000_000,
            "seq": seq,
            "created": rfc3339(created),
        }
    return out


async def _remote_seq_created(peer: PeerClient, topic: str) -> tuple[int, int]:
    """A topic's high watermark and first timestamp (now when empty), from its leader."""
    seq = await peer.list_offset(topic, 0, -1)
    got = await peer.fetch(topic, 0, await peer.list_offset(topic, 0, -2), max_bytes=1)
    for _, h in iter_batches(got.data, verify=False):
        return seq, h.first_timestamp
    return seq, int(time.time() * 1000)


def _pops_elsewhere(broker: Broker, topic: str) -> bool:
    """In a cluster, pops of a topic are taken by the leader of its partition (one node
    serializes them, so a message is taken once): whether another node (or none now) leads
    it, so that the pop is sent there.

    Raises:
        UnknownTopicError: the cluster has no such topic.
    """
    rep = broker.replication
    node = cluster_node(broker)
    if rep is None or node is None or rep.leads(topic, 0):
        return False
    if node.cache.partition(topic, 0) is None:
        raise UnknownTopicError(f"topic {topic!r} does not exist")
    return True


async def _pop_on_leader(broker: Broker, topic: str, ttl_ms: int) -> Taken | None:
    """A pop sent to the leader of the topic's partition (``TAKE``, through this node's
    routed client, as the node itself): what it took, None when nothing."""
    node = cluster_node(broker)
    assert node is not None
    peer = PeerClient(node)
    try:
        return await take_on_leader(peer, topic, GROUP, ttl_ms)
    finally:
        await peer.close()


async def _subscribe_remote(
    websocket: WebSocket,
    peer: PeerClient,
    topic: str,
    message: Callable[[Record], bytes],
    stop: asyncio.Event,
) -> None:
    """A subscription on a node of a cluster that does not lead the topic's partition: every
    message published from now on, fetched from the leader (long-polled) through this node's
    routed client."""
    try:
        try:
            position = await peer.list_offset(topic, 0, -1)
        except TidewireError as exc:
            await websocket.close(1011, exc.message[:120])
            return
        await websocket.accept()
        reader = asyncio.create_task(_until_disconnect(websocket))
        try:
            while not reader.done() and not stop.is_set():
                got = await peer.fetch(
                    topic, 0, position, max_bytes=_READ_BYTES, max_wait_ms=_REMOTE_WAIT_MS
                )
                for rec in decode_records(topic, 0, got.data, position):
                    await websocket.send_text(message(rec).decode())
                    position = rec.offset + 1
        except (WebSocketDisconnect, OSError, RuntimeError, TidewireError):
            pass
        finally:
            await cancel_and_wait(reader)
        if stop.is_set():
            with contextlib.suppress(WebSocketDisconnect, OSError, RuntimeError):
                await websocket.close(1001)
    finally:
        await peer.close()


async def _until_disconnect(websocket: WebSocket) -> None:
    """Read (and ignore, as msgbus does) what a subscriber sends, until it goes away."""
    while True:
        msg = await websocket.receive()
        if msg["type"] == "websocket.disconnect":
            return


def _first_timestamp(broker: Broker, topic: str) -> int:
    """The timestamp of the first record the topic still holds (now for an empty topic):
    what msgbus reports as the topic's creation time."""
    start = broker.list_offset(topic, 0, -2)
    if start >= broker.high_watermark(topic, 0):
        return int(time.time() * 1000)
    r = broker.read_partition(topic, 0, start, 1)
    for _, h in iter_batches(r.data, verify=False):
        return h.first_timestamp
    return int(time.time() * 1000)


def _error(exc: TidewireError) -> Response:
    status = 404 if isinstance(exc, UnknownTopicError) else 400
    if isinstance(exc, BatchTooLargeError):  # over the topic's max_batch_bytes
        status = 413
    if isinstance(exc, (StorageError, LogFailedError, BackpressureError, NotLeaderError)):
        status = 503  # NotLeaderError: a cluster's leader (or a group's coordinator) elsewhere
    return PlainTextResponse(exc.message, status_code=status)
