"""Storing messages for the HTTP API: payload decoding, partition choice, one record batch
per partition, ``Idempotency-Key`` bookkeeping.

Publishing calls the broker core as the binary protocol's produce does with acks=durable:
the answer comes once the messages are as durable as the topic's fsync policy promises, and
a first publish creates the topic when the broker creates topics on first publish (after
its messages were checked, so a refused publish creates nothing).

In a cluster a publish whose partitions another node leads is, with a ``forward`` (the HTTP
API's default, ``http_cluster_routing = "forward"``), sent whole to that leader as the
protocol's ``HTTP_PUBLISH`` (see peers.py), where :func:`serve_forwarded` stores it with
that leader's publisher and keys: the answer (offsets, errors, ``Idempotency-Key``) is the
one the leader's own HTTP API would give. Without one, it raises ``NotLeaderError`` naming
the leader (the HTTP API answers 307 to it).
"""

from __future__ import annotations

import base64
import binascii
import itertools
import time
import weakref
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from tidewire.broker import Broker
from tidewire.cluster import cluster_node
from tidewire.errors import (
    InvalidConfigError,
    InvalidRequestError,
    InvalidTopicError,
    NotLeaderError,
    TidewireError,
    UnknownPartitionError,
    UnknownTopicError,
)
from tidewire.protocol.messages import HttpPublishRequest, HttpPublishResponse, PublishedAt
from tidewire.records import BatchBuilder
from tidewire.records._impl import fnv1a_32 as _compiled_fnv1a_32
from tidewire.server.http import cluster
from tidewire.server.http._common import parse_body
from tidewire.server.http.errors import IdempotencyKeyReusedError
from tidewire.server.http.idempotency import INDEX_HEADER, KEY_HEADER, IdempotencyStore, KeyEntry
from tidewire.server.http.models import BatchPublishRequest, PublishMessage, PublishRequest
from tidewire.storage.manager import validate_topic_name

__all__ = [
    "Forward",
    "Publisher",
    "partition_for_key",
    "payload_bytes",
    "serve_forwarded",
    "shared_store",
]

#: Sends a publish to the leader of a partition: ``(topic, partition, body, batch,
#: idempotency_key)`` -> ``(partition, offset)`` of each message (see peers.py).
Forward = Callable[[str, int, bytes, bool, str | None], Awaitable[list[tuple[int, int]]]]

#: Per broker: the idempotency keys its HTTP API and the publishes other nodes forward to it
#: share, and the publisher that stores those forwarded publishes.
_STORES: weakref.WeakKeyDictionary[Broker, IdempotencyStore] = weakref.WeakKeyDictionary()
_FORWARDED: weakref.WeakKeyDictionary[Broker, Publisher] = weakref.WeakKeyDictionary()


def shared_store(broker: Broker) -> IdempotencyStore:
    """The idempotency keys of ``broker`` (made on first use): one store for its HTTP API's
    publishes and those other nodes forward to it, so a retry is found whichever way it came."""
    store = _STORES.get(broker)
    if store is None:
        store = _STORES[broker] = IdempotencyStore(broker)
    return store


#: FNV-1a, 32 bits: the tidewire clients' key partitioner (tidewire.client.partitioner), so a
#: key published over HTTP lands where a client would put it. The compiled hash of the record
#: codec where it is built; else restated here, because the server layer does not import the
#: client's. A test holds the two equal.
_FNV_BASIS = 0x811C9DC5
_FNV_PRIME = 0x01000193


def _fnv1a_32(key: bytes) -> int:
    h = _FNV_BASIS
    for byte in key:
        h = ((h ^ byte) * _FNV_PRIME) & 0xFFFFFFFF
    return h


_fnv: Callable[[bytes], int] = _compiled_fnv1a_32 or _fnv1a_32


def partition_for_key(key: bytes, partitions: int) -> int:
    """``fnv1a_32(key) % partitions``, as the tidewire clients route a keyed message."""
    return _fnv(key) % partitions


#: One message ready to store: key, value, headers, timestamp (ms).
_Ready = tuple[bytes | None, bytes | None, list[tuple[str, bytes | None]], int]


class Publisher:
    """Stores messages for the HTTP API: payload decoding, partition choice, one batch per
    partition, idempotency keys."""

    def __init__(
        self, broker: Broker, store: IdempotencyStore, *, forward: Forward | None = None
    ) -> None:
        self.broker = broker
        self.store = store
        #: In a cluster: where a publish led by another node goes (None: NotLeaderError).
        self.forward = forward
        self._counts: dict[str, int] = {}
        self._round_robin = itertools.count()

    def partitions(self, topic: str) -> int:
        """The partition count of ``topic`` (cached; checked against the logs each time)."""
        logs = self.broker.logs.logs
        n = self._counts.get(topic)
        if n is not None and (topic, n - 1) in logs and (topic, n) not in logs:
            return n
        n = self._counts[topic] = self.broker.partition_count(topic)
        return n

    def _partitions_for_publish(self, topic: str) -> int:
        """The partition count ``topic`` has, or gets when its first publish creates it (the
        broker's produce creates it then, after checking the batch, as the binary protocol's
        first publish does).

        Raises:
            UnknownTopicError: no such topic, and topics are not created on first publish.
            InvalidTopicError: a name that is not allowed, or an internal topic.
        """
        broker = self.broker
        in_cluster = cluster.partition_count(broker, topic)
        if in_cluster is not None:
            return in_cluster
        if (topic, 0) in broker.logs.logs:
            return self.partitions(topic)
        if not broker.config.auto_create_topics:
            raise UnknownTopicError(
                f"topic {topic!r} does not exist and this broker does not create topics on "
                "first publish"
            )
        try:
            validate_topic_name(topic)
        except InvalidConfigError as exc:
            raise InvalidTopicError(exc.message) from None
        return broker.config.default_partitions

    def choose(
        self,
        msg: PublishMessage,
        key: bytes | None,
        n: int,
        topic: str,
        idempotency_key: str | None = None,
    ) -> int:
        """The partition of one message: its own, its key's, else (in a cluster, with an
        Idempotency-Key) the Idempotency-Key's, so that a retry sent to another node goes to
        the same partition; else one led here, round robin."""
        if msg.partition is not None:
            if msg.partition >= n:
                raise UnknownPartitionError(
                    f"topic {topic!r} has partitions 0..{n - 1}, not {msg.partition}"
                )
            return msg.partition
        if key is not None:
            return partition_for_key(key, n)
        if self.broker.replication is not None and idempotency_key is not None:
            return partition_for_key(idempotency_key.encode(), n)
        if self.broker.replication is not None:  # a cluster: where it arrived, if led here
            led = cluster.led_here(self.broker, topic, n)
            if led:
                return led[next(self._round_robin) % len(led)]
        return next(self._round_robin) % n

    async def publish_one(self, topic: str, body: bytes, idempotency_key: str | None) -> bytes:
        """Store the message of a PublishRequest ``body``; return the PublishResult JSON.

        Raises:
            InvalidRequestError: a body that is not a PublishRequest; as :meth:`publish`.
        """
        req = parse_body(PublishRequest, body)
        if idempotency_key is not None:
            ((p, off),) = await self.publish(
                topic, (req,), req.encoding, idempotency_key, body=body, batch=False
            )
            return b'{"offset":%d,"partition":%d}' % (off, p)
        # The hot path: what publish() does for one message, without its bookkeeping.
        n = self._partitions_for_publish(topic)
        ((key, value, headers, ts),) = _decode((req,), req.encoding)
        p = self.choose(req, key, n, topic)
        rep = self.broker.replication
        if rep is not None and not rep.leads(topic, p):  # a cluster: to its leader
            got = await self._forward(topic, {p}, body, False, None)
            if got is not None:
                ((p, off),) = got
                return b'{"offset":%d,"partition":%d}' % (off, p)
        builder = BatchBuilder()
        builder.append(value, timestamp_ms=ts, key=key, headers=headers)
        result = await self.broker.produce(topic, p, builder.build())
        return b'{"offset":%d,"partition":%d}' % (result.base_offset, p)

    async def publish(
        self,
        topic: str,
        msgs: Sequence[PublishMessage],
        encoding: str,
        idempotency_key: str | None,
        *,
        body: bytes | None = None,
        batch: bool = True,
    ) -> list[tuple[int, int]]:
        """Store ``msgs``; return ``(partition, offset)`` of each.

        Args:
            body: the HTTP request body ``msgs`` came from (a BatchPublishRequest, or with
                ``batch`` false a PublishRequest): given, and with a ``forward``, a publish
                whose partitions another node leads is sent there whole.

        Raises:
            InvalidRequestError: a payload that is not valid base64.
            UnknownTopicError: no such topic and no auto-creation; InvalidTopicError: a name
                not allowed; UnknownPartitionError: no such partition.
            IdempotencyKeyReusedError: the key was used for other messages.
            BatchTooLargeError, StorageError, BackpressureError: the log refused.
        """
        n = self._partitions_for_publish(topic)
        ready = _decode(msgs, encoding)
        if body is not None and self.forward is not None and self.broker.replication is not None:
            chosen = {
                self.choose(m, r[0], n, topic, idempotency_key)
                for m, r in zip(msgs, ready, strict=True)
            }
            got = await self._forward(topic, chosen, body, batch, idempotency_key)
            if got is not None:
                return got
        if idempotency_key is None:
            placement = [self.choose(m, r[0], n, topic) for m, r in zip(msgs, ready, strict=True)]
            return await self._store(topic, ready, placement, {}, None)
        if not idempotency_key:
            raise InvalidRequestError("header Idempotency-Key: must not be empty")
        fingerprint = hash((encoding, tuple(_canonical(m) for m in msgs)))
        async with self.store.hold(topic, idempotency_key) as entry:
            placement = self._placement(
                entry,
                fingerprint=fingerprint,
                msgs=msgs,
                ready=ready,
                n=n,
                topic=topic,
                key=idempotency_key,
            )
            try:
                return await self._store(topic, ready, placement, entry.done, idempotency_key)
            except BaseException:
                if not entry.done:  # nothing stored: the key is free for any messages
                    entry.placement = entry.fingerprint = None
                raise

    async def _forward(
        self, topic: str, partitions: set[int], body: bytes, batch: bool, key: str | None
    ) -> list[tuple[int, int]] | None:
        """A publish to ``partitions`` sent to their leader when another node leads them all
        (and this publisher forwards): its answer; None when this node leads them all.

        Raises:
            NotLeaderError: their leader is not known now (503), or there is no ``forward``
                (the HTTP API redirects to the leader it names).
            InvalidRequestError: they are led by several nodes.
        """
        try:
            cluster.require_leader(self.broker, topic, partitions)
        except NotLeaderError as exc:
            node = cluster_node(self.broker)
            rep = self.broker.replication
            if self.forward is None or node is None or rep is None:
                raise
            if exc.leader_id < 0 or exc.leader_id == node.node_id:
                raise  # no leader known now: 503, retry
            target = min(p for p in partitions if not rep.leads(topic, p))
            return await self.forward(topic, target, body, batch, key)
        return None

    def _placement(
        self,
        entry: KeyEntry,
        *,
        fingerprint: int,
        msgs: Sequence[PublishMessage],
        ready: list[_Ready],
        n: int,
        topic: str,
        key: str,
    ) -> list[int]:
        """The partitions of ``msgs`` under ``entry``: as its first request chose them."""
        if entry.placement is None:  # the key's first request
            entry.fingerprint = fingerprint
            entry.placement = [
                self.choose(m, r[0], n, topic, key) for m, r in zip(msgs, ready, strict=True)
            ]
            return entry.placement
        if entry.fingerprint is not None and entry.fingerprint != fingerprint:
            raise IdempotencyKeyReusedError(
                "this Idempotency-Key was used for other messages: a retry must send the "
                "same messages, new messages need a new key"
            )
        if len(entry.placement) != len(msgs):  # read back after a start: compare the count
            raise IdempotencyKeyReusedError(
                f"this Idempotency-Key was used for {len(entry.placement)} message(s), "
                f"not {len(msgs)}"
            )
        for i, p in enumerate(entry.placement):
            if p < 0:  # a partition the first attempt did not store: choose now
                entry.placement[i] = self.choose(msgs[i], ready[i][0], n, topic, key)
        entry.fingerprint = fingerprint
        return entry.placement

    async def _store(
        self,
        topic: str,
        ready: list[_Ready],
        placement: list[int],
        done: dict[int, int],
        idempotency_key: str | None,
    ) -> list[tuple[int, int]]:
        """One batch per partition not yet in ``done``; record each base offset there."""
        groups: dict[int, list[int]] = {}
        for i, p in enumerate(placement):
            groups.setdefault(p, []).append(i)
        extra: list[tuple[str, bytes | None]] = []
        if idempotency_key is not None:
            extra.append((KEY_HEADER, idempotency_key.encode()))
        cluster.require_leader(self.broker, topic, groups.keys() - done.keys())
        for p, indices in groups.items():
            if p in done:
                continue
            builder = BatchBuilder()
            for i in indices:
                key, value, headers, ts = ready[i]
                if idempotency_key is not None:
                    headers = headers + extra
                    if len(ready) > 1:
                        headers.append((INDEX_HEADER, str(i).encode()))
                builder.append(value, timestamp_ms=ts, key=key, headers=headers)
            result = await self.broker.produce(topic, p, builder.build())
            done[p] = result.base_offset
        position: dict[int, int] = {}
        out: list[tuple[int, int]] = []
        for p in placement:
            k = position.get(p, 0)
            position[p] = k + 1
            out.append((p, done[p] + k))
        return out


def _canonical(m: PublishMessage) -> tuple[Any, ...]:
    headers = tuple(sorted(m.headers.items())) if m.headers else ()
    return (m.key, m.value, headers, m.partition, m.timestamp)


def payload_bytes(text: str | None, encoding: str, field: str) -> bytes | None:
    """A key, value or header value of a request as bytes: UTF-8 text, or base64 with
    ``encoding="base64"``.

    Raises:
        InvalidRequestError: not valid base64 (naming ``field``).
    """
    if text is None:
        return None
    if encoding == "base64":
        try:
            return base64.b64decode(text, validate=True)
        except (binascii.Error, ValueError):
            raise InvalidRequestError(f"field {field}: not valid base64") from None
    return text.encode("utf-8", "surrogatepass")


def _decode(msgs: Sequence[PublishMessage], encoding: str) -> list[_Ready]:
    now = time.time_ns() // 1_000_000
    single = len(msgs) == 1
    out: list[_Ready] = []
    for i, m in enumerate(msgs):
        where = "" if single else f"messages.{i}."
        headers = (
            [(k, payload_bytes(v, encoding, f"{where}headers.{k}")) for k, v in m.headers.items()]
            if m.headers
            else []
        )
        out.append(
            (
                payload_bytes(m.key, encoding, f"{where}key"),
                payload_bytes(m.value, encoding, f"{where}value"),
                headers,
                now if m.timestamp is None else m.timestamp,
            )
        )
    return out


def _forwarded_publisher(broker: Broker) -> Publisher:
    pub = _FORWARDED.get(broker)
    if pub is None:
        pub = _FORWARDED[broker] = Publisher(broker, shared_store(broker))
    return pub


async def serve_forwarded(broker: Broker, req: HttpPublishRequest) -> HttpPublishResponse:
    """Store a publish another node forwarded (``HTTP_PUBLISH``) as this node's HTTP API
    would, with its keys (:func:`shared_store`); never forwarded again: a partition this node
    does not lead (any more) is refused with NotLeaderError, so the sender finds the leader.
    """
    pub = _forwarded_publisher(broker)
    try:
        if req.batch:
            many = parse_body(BatchPublishRequest, req.body)
            got = await pub.publish(req.topic, many.messages, many.encoding, req.idempotency_key)
        else:
            one = parse_body(PublishRequest, req.body)
            got = await pub.publish(req.topic, (one,), one.encoding, req.idempotency_key)
    except TidewireError as exc:
        return HttpPublishResponse(
            error_code=exc.code, error_message=exc.message, error_name=type(exc).__name__
        )
    return HttpPublishResponse(results=[PublishedAt(p, o) for p, o in got])
