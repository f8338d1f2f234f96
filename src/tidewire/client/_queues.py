"""The clients' queue and exchange methods, which :class:`~tidewire.client.AsyncClient` and its
blocking twin inherit: declaring and deleting exchanges and queues, bindings, listings,
publishing with confirms, taking messages (get), settling them, and dead-letter browsing and
replay.

Publishing: each call is confirmed on return (stored in every queue it routes to, fsynced for
durable queues). Calls made in the same loop turn with equal exchange, routing key, headers
and flags go out as one QUEUE_PUBLISH of one record batch (up to :data:`MAX_PUBLISH_MESSAGES`
messages and :data:`MAX_PUBLISH_BYTES` bytes; more start another request), and every one of
them gets that request's result or error.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar, cast

from tidewire.errors import TidewireError, for_code
from tidewire.protocol.messages import (
    BindingInfo,
    ExchangeDeclareRequest,
    ExchangeDeleteRequest,
    ExchangeInfo,
    ListExchangesRequest,
    ListQueuesRequest,
    QueueBindRequest,
    QueueBrowseRequest,
    QueueDeclareRequest,
    QueueDeleteRequest,
    QueueGetRequest,
    QueueInfo,
    QueuePublishRequest,
    QueuePurgeRequest,
    QueueReplayRequest,
    QueueSettleRequest,
    QueueUnbindRequest,
)
from tidewire.records import BatchBuilder

from ._queue_messages import BlockingQueueMessage, QueueMessage, Settler, decode_delivery
from ._routing import Router, call_routed, call_the_leader_of, leader_lost
from ._transport import Transport

__all__ = [
    "MAX_PUBLISH_BYTES",
    "MAX_PUBLISH_MESSAGES",
    "AsyncQueueAdmin",
    "PublishResult",
    "QueueAdmin",
]

T = TypeVar("T")

#: Messages one coalesced QUEUE_PUBLISH carries at most.
MAX_PUBLISH_MESSAGES = 1000
#: Bytes of records one coalesced QUEUE_PUBLISH carries at most (a larger single message
#: goes alone): far below the broker's batch and frame limits.
MAX_PUBLISH_BYTES = 1024 * 1024

_OUTCOMES = {"ack", "requeue", "dead-letter"}
#: A durable queue's topic in a cluster (the broker's ``QUEUE_TOPIC_PREFIX``): its owner
#: leads partition 0.
QUEUE_TOPIC_PREFIX = "__queue."


@dataclass(frozen=True, slots=True)
class PublishResult:
    """Where a publish went: the ``queues`` and ``topics`` (``(topic, partition,
    base_offset)``) it was stored in; ``unroutable``: nowhere (dropped, as it was not
    mandatory)."""

    queues: tuple[str, ...] = ()
    topics: tuple[tuple[str, int, int], ...] = ()
    unroutable: bool = False


def _check(body: Any) -> Any:
    if body.error_code:
        raise for_code(body.error_code)(body.error_message)
    return body


def _encode(value: bytes | str) -> bytes:
    if isinstance(value, str):
        return value.encode()
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value)
    raise TypeError(f"a message value is bytes or str, not {type(value).__name__}")


_PublishKey = tuple[str, str, tuple[tuple[str, str], ...], bool, int, int, int]


@dataclass(slots=True)
class _Group:
    """Messages of equal publish settings gathered in one loop turn."""

    key: _PublishKey
    builder: BatchBuilder = field(default_factory=BatchBuilder)
    waiters: list[asyncio.Future[PublishResult]] = field(default_factory=list)


class _Publisher:
    """Gathers the publishes of one loop turn into one request per settings."""

    def __init__(self, transport: Transport, router: Router | None = None) -> None:
        self._t = transport
        self._router = router
        self._open: dict[_PublishKey, _Group] = {}
        self._scheduled = False
        self._tasks: set[asyncio.Task[None]] = set()
        self.requests = 0  # QUEUE_PUBLISH requests sent (for tests and statistics)

    async def publish(self, key: _PublishKey, values: Sequence[bytes]) -> PublishResult:
        _, routing_key, headers, *_ = key
        record_headers = [(k, v.encode()) for k, v in headers]
        rkey = routing_key.encode()
        now = time.time_ns() // 1_000_000
        loop = asyncio.get_running_loop()
        futs: list[asyncio.Future[PublishResult]] = []
        group = self._open.get(key)
        joined: _Group | None = None  # the group this call's last future waits on
        for value in values:
            if (
                group is not None
                and len(group.builder)
                and (
                    len(group.builder) >= MAX_PUBLISH_MESSAGES
                    or group.builder.size_in_bytes + len(value) + len(rkey) > MAX_PUBLISH_BYTES
                )
            ):
                self._send(group)  # full: it goes now, the rest opens another
                group = None
            if group is None:
                group = self._open[key] = _Group(key)
            if joined is not group:
                fut: asyncio.Future[PublishResult] = loop.create_future()
                group.waiters.append(fut)
                futs.append(fut)
                joined = group
            group.builder.append(value, key=rkey, headers=record_headers, timestamp_ms=now)
        if not self._scheduled:
            self._scheduled = True
            loop.call_soon(self._flush)
        if len(futs) == 1:  # the common case: no gathering future on top
            return await futs[0]
        return _merge(await asyncio.gather(*futs))

    def _flush(self) -> None:
        self._scheduled = False
        groups, self._open = list(self._open.values()), {}
        for g in groups:
            self._send(g)

    def _send(self, group: _Group) -> None:
        if self._open.get(group.key) is group:
            del self._open[group.key]
        task = asyncio.get_running_loop().create_task(
            self._request(group), name="tidewire queue publish"
        )
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _request(self, group: _Group) -> None:
        exchange, routing_key, headers, mandatory, ttl_ms, deliver_at_ms, delay_ms = group.key
        req = QueuePublishRequest(
            exchange=exchange,
            routing_key=routing_key,
            headers=dict(headers),
            mandatory=mandatory,
            ttl_ms=ttl_ms,
            deliver_at_ms=deliver_at_ms,
            delay_ms=delay_ms,
        )
        self.requests += 1
        data = [group.builder.build()]

        async def send(transport: Transport) -> Any:
            response = await transport.request(req, data)
            assert response is not None
            return _check(response.body)

        try:
            if self._router is not None and not exchange and routing_key:
                # The default exchange routes to one queue: to its owner in a cluster.
                body = await _to_owner(self._router, routing_key, send, self._t.request_timeout_s)
            else:
                body = await send(self._t)
        except TidewireError as exc:
            for fut in group.waiters:
                if not fut.done():
                    fut.set_exception(exc)
            return
        except BaseException:
            for fut in group.waiters:
                fut.cancel()
            raise
        result = PublishResult(
            queues=tuple(body.queues),
            topics=tuple((t.topic, t.partition, t.base_offset) for t in body.topics),
            unroutable=body.unroutable,
        )
        for fut in group.waiters:
            if not fut.done():
                fut.set_result(result)


async def _to_owner(
    router: Router, queue: str, send: Callable[[Transport], Awaitable[T]], timeout_s: float
) -> T:
    """``send`` the request for ``queue`` to its owner (see :func:`call_routed`: found again
    on NotLeaderError). A request whose connection was lost is not sent again (it may have
    been carried out), but the owner is forgotten and looked up again, so the caller's retry
    goes to the new one."""
    topic = QUEUE_TOPIC_PREFIX + queue
    try:
        return await call_routed(router, topic, 0, send, timeout_s=timeout_s, resend_on_loss=False)
    except TidewireError as exc:
        if leader_lost(exc, router.clustered):
            router.forget(topic, 0)
            router.refresh_soon([topic])
        raise


def _merge(results: Sequence[PublishResult]) -> PublishResult:
    if len(results) == 1:
        return results[0]
    return PublishResult(
        queues=tuple(dict.fromkeys(q for r in results for q in r.queues)),
        topics=tuple(t for r in results for t in r.topics),
        unroutable=all(r.unroutable for r in results),
    )


def _check_publish(ttl_ms: int, delay_ms: int, deliver_at_ms: int) -> None:
    for name, value in (
        ("ttl_ms", ttl_ms),
        ("delay_ms", delay_ms),
        ("deliver_at_ms", deliver_at_ms),
    ):
        if value < 0:
            raise ValueError(f"{name}={value} must be >= 0")


class AsyncQueueAdmin:
    """The queue and exchange methods of :class:`~tidewire.client.AsyncClient`."""

    _t: Transport
    _router: Router
    _queue_publisher: _Publisher | None = None
    _queue_settlers: dict[Transport, Settler] | None = None

    def _publisher(self) -> _Publisher:
        if self._queue_publisher is None:
            self._queue_publisher = _Publisher(self._t, self._router)
        return self._queue_publisher

    def _settler(self, transport: Transport | None = None) -> Settler:
        """The settler of the deliveries got over ``transport`` (default: the client's own
        connection): a delivery is settled over the connection that got it."""
        t = self._t if transport is None else transport
        if self._queue_settlers is None:
            self._queue_settlers = {}
        settlers = self._queue_settlers
        settler = settlers.get(t)
        if settler is None:
            for gone in [k for k in settlers if k.closed]:  # connections to former owners
                del settlers[gone]
            settler = settlers[t] = Settler(t)
            previous = t.on_lost

            def lost(error: TidewireError) -> None:
                settler.connection_lost()
                if previous is not None:
                    previous(error)

            t.on_lost = lost
        return settler

    async def _qcall(self, body: Any, data: Sequence[bytes] = ()) -> Any:
        response = await self._t.request(body, data)
        assert response is not None
        return response

    async def _qowner(
        self, queue: str, body: Any, data: Sequence[bytes] = ()
    ) -> tuple[Any, Transport]:
        """A request about ``queue``, to its owner in a cluster (the leader of partition 0
        of its topic; found again on NotLeaderError for up to the request timeout); on a
        single node, to the node. A lost connection is not retried (it may have been carried
        out). Returns the response and the connection that answered it.

        Raises:
            TidewireError: the answer's error.
        """
        used: list[Transport] = []

        async def send(transport: Transport) -> Any:
            used.append(transport)
            response = await transport.request(body, data)
            assert response is not None
            _check(response.body)
            return response

        response = await _to_owner(self._router, queue, send, self._t.request_timeout_s)
        return response, used[-1]

    async def _qdefine(self, body: Any) -> Any:
        """A change of exchanges, queues or bindings, answered by the node that can make it:
        in a cluster the leader of ``__queue_definitions`` (the others refuse it with
        NotLeaderError, changing nothing; the nodes are asked in turn for up to the request
        timeout); on a single node, the node. Returns the answer's body (its error raised).
        """
        return _check(await call_the_leader_of(self._t, self._router, body))

    async def declare_exchange(
        self,
        name: str,
        type: str = "direct",
        *,
        durable: bool = True,
        alternate_exchange: str = "",
    ) -> None:
        """Declare an exchange: ``type`` direct, fanout, topic or headers; ``durable``: it
        survives restarts; ``alternate_exchange``: where messages no binding takes go.

        Raises:
            PreconditionFailedError: it exists with other settings.
            InvalidQueueError: a name that is not allowed (1..200 of ``A-Z a-z 0-9 . _ - :
                /``; ``amq.`` and ``__`` are reserved) or an unknown type.
        """
        req = ExchangeDeclareRequest(
            name=name, type=type, durable=durable, alternate_exchange=alternate_exchange
        )
        await self._qdefine(req)

    async def delete_exchange(self, name: str, *, if_unused: bool = False) -> None:
        """Delete an exchange and its bindings (``if_unused``: only if it has none).

        Raises:
            UnknownExchangeError; PreconditionFailedError (``if_unused`` and bound).
        """
        await self._qdefine(ExchangeDeleteRequest(name=name, if_unused=if_unused))

    async def declare_queue(
        self,
        name: str,
        *,
        durable: bool = True,
        exclusive: bool = False,
        auto_delete: bool = False,
        max_deliveries: int = 0,
        message_ttl_ms: int = 0,
        max_length: int = 0,
        max_length_bytes: int = 0,
        overflow: str = "reject-publish",
        dead_letter_exchange: str | None = None,
        dead_letter_routing_key: str = "",
        visibility_timeout_ms: int = 0,
        passive: bool = False,
    ) -> QueueInfo:
        """Declare a queue and return it as it is now. 0 means "no limit" for every number.

        Args:
            durable: messages and state survive restarts and crashes (else memory only).
            exclusive: used only by this connection, deleted when it closes (not durable).
            auto_delete: deleted when its last consumer leaves.
            max_deliveries: deliveries after which a message is dead-lettered.
            message_ttl_ms: messages older than this are dead-lettered (``expired``).
            max_length, max_length_bytes: ready messages (and their bytes) at most.
            overflow: ``reject-publish`` (publishes refused: QueueFullError) or
                ``drop-head`` (the oldest dead-lettered).
            dead_letter_exchange: where dead letters go (None: dropped; "": the default
                exchange).
            dead_letter_routing_key: their routing key ("": their own).
            visibility_timeout_ms: an unsettled delivery is taken back after this long.
            passive: only check that it exists and describe it.

        Raises:
            PreconditionFailedError: it exists with other settings.
            UnknownQueueError: ``passive`` and it does not exist.
            InvalidQueueError: a name or setting that is not allowed.
        """
        req = QueueDeclareRequest(
            name=name,
            durable=durable,
            exclusive=exclusive,
            auto_delete=auto_delete,
            max_deliveries=max_deliveries,
            message_ttl_ms=message_ttl_ms,
            max_length=max_length,
            max_length_bytes=max_length_bytes,
            overflow=overflow,
            dead_letter_exchange=dead_letter_exchange,
            dead_letter_routing_key=dead_letter_routing_key,
            visibility_timeout_ms=visibility_timeout_ms,
            passive=passive,
        )
        if passive:  # described by its owner in a cluster
            info = (await self._qowner(name, req))[0].body.queue
        else:
            info = (await self._qdefine(req)).queue
        assert isinstance(info, QueueInfo)
        return info

    async def delete_queue(
        self, name: str, *, if_empty: bool = False, if_unused: bool = False
    ) -> int:
        """Delete a queue; returns how many messages went with it.

        Raises:
            UnknownQueueError; PreconditionFailedError (``if_empty`` with messages,
            ``if_unused`` with consumers).
        """
        req = QueueDeleteRequest(name=name, if_empty=if_empty, if_unused=if_unused)
        return int((await self._qdefine(req)).messages)

    async def purge_queue(self, name: str) -> int:
        """Remove a queue's ready messages; returns how many. Raises UnknownQueueError."""
        response, _ = await self._qowner(name, QueuePurgeRequest(name=name))
        return int(response.body.messages)

    async def bind(
        self,
        exchange: str,
        queue: str,
        key: str = "",
        *,
        arguments: Mapping[str, str] | None = None,
        destination_kind: str = "queue",
    ) -> None:
        """Bind ``exchange`` to ``queue`` (a topic with ``destination_kind="topic"``) with the
        binding key ``key`` (topic exchanges: words with ``*`` and ``#``); ``arguments``
        (headers exchanges): ``x-match`` and the headers to match. Binding twice does
        nothing.

        Raises:
            UnknownExchangeError, UnknownQueueError, UnknownTopicError, InvalidQueueError.
        """
        req = QueueBindRequest(
            exchange=exchange,
            destination=queue,
            destination_kind=destination_kind,
            key=key,
            arguments=dict(arguments or {}),
        )
        await self._qdefine(req)

    async def unbind(
        self,
        exchange: str,
        queue: str,
        key: str = "",
        *,
        arguments: Mapping[str, str] | None = None,
        destination_kind: str = "queue",
    ) -> None:
        """Remove a binding (see :meth:`bind`); one that does not exist is no error."""
        req = QueueUnbindRequest(
            exchange=exchange,
            destination=queue,
            destination_kind=destination_kind,
            key=key,
            arguments=dict(arguments or {}),
        )
        await self._qdefine(req)

    async def list_queues(self) -> list[QueueInfo]:
        """Every queue this client may describe, with its counts: in a cluster, each
        durable or transient queue's as its owner counts them (the node asked lists every
        queue, and the owners of those it does not serve are asked for theirs; exclusive
        queues are their connection's node's, listed there only).

        Raises:
            ConnectionLostError, RequestTimedOutError: a node asked did not answer.
        """
        queues = list(_check((await self._qcall(ListQueuesRequest())).body).queues)
        router = self._router
        # A single node's transient queues are its own: asked about only in a cluster.
        routed = [q.name for q in queues if q.durable or (router.clustered and not q.exclusive)]
        if not routed:
            return queues
        topics = {QUEUE_TOPIC_PREFIX + n: n for n in routed}
        await router.refresh(topics)  # a single node answers it without creating anything
        if not router.clustered:
            return queues
        served: dict[Transport, set[str]] = {}  # by another node: its owner's counts
        for topic, name in topics.items():
            t = router.transport_for(topic, 0)
            if t is not self._t:
                served.setdefault(t, set()).add(name)
        if not served:
            return queues
        links = list(served)
        answers = await asyncio.gather(*(t.request(ListQueuesRequest()) for t in links))
        owners: dict[str, QueueInfo] = {}
        for t, response in zip(links, answers, strict=True):
            assert response is not None
            owners.update((q.name, q) for q in _check(response.body).queues if q.name in served[t])
        return [owners.get(q.name, q) for q in queues]

    async def list_exchanges(self) -> tuple[list[ExchangeInfo], list[BindingInfo]]:
        """Every exchange this client may describe (the default one is ``""``), and their
        bindings."""
        body = _check((await self._qcall(ListExchangesRequest())).body)
        return list(body.exchanges), list(body.bindings)

    async def publish(
        self,
        exchange: str,
        routing_key: str,
        value: bytes | str,
        *,
        headers: Mapping[str, str] | None = None,
        mandatory: bool = False,
        ttl_ms: int = 0,
        delay_ms: int = 0,
        deliver_at_ms: int = 0,
    ) -> PublishResult:
        """Publish one message to ``exchange`` ("": the default exchange, which routes to
        the queue named ``routing_key``) and return once it is stored (durable queues:
        fsynced). Concurrent calls with equal settings share one request (see the module
        docstring).

        Args:
            value: the body (str: UTF-8).
            headers: the message's headers (what a headers exchange matches).
            mandatory: refuse it (UnroutableError) rather than drop it when no binding
                takes it.
            ttl_ms: it expires this long after publishing (0: the queue's TTL).
            delay_ms: not delivered before this long from now (by the broker's clock).
            deliver_at_ms: not delivered before this time (ms since the epoch).

        Raises:
            UnknownExchangeError, UnroutableError, QueueFullError (retriable),
            QueueLockedError, AuthorizationFailedError, ConnectionLostError, ...
        """
        return await self.publish_batch(
            exchange,
            routing_key,
            [value],
            headers=headers,
            mandatory=mandatory,
            ttl_ms=ttl_ms,
            delay_ms=delay_ms,
            deliver_at_ms=deliver_at_ms,
        )

    async def publish_batch(
        self,
        exchange: str,
        routing_key: str,
        values: Sequence[bytes | str],
        *,
        headers: Mapping[str, str] | None = None,
        mandatory: bool = False,
        ttl_ms: int = 0,
        delay_ms: int = 0,
        deliver_at_ms: int = 0,
    ) -> PublishResult:
        """Publish several messages with the same settings (see :meth:`publish`), in as
        few requests as the size bounds allow; returns once all are stored."""
        _check_publish(ttl_ms, delay_ms, deliver_at_ms)
        if not values:
            raise ValueError("publish_batch() needs at least one message")
        key: _PublishKey = (
            exchange,
            routing_key,
            tuple(sorted((headers or {}).items())),
            mandatory,
            ttl_ms,
            deliver_at_ms,
            delay_ms,
        )
        return await self._publisher().publish(key, [_encode(v) for v in values])

    async def get(
        self,
        queue: str,
        *,
        max_messages: int = 1,
        wait_ms: int = 0,
        visibility_timeout_ms: int | None = None,
    ) -> list[QueueMessage]:
        """Take up to ``max_messages`` ready messages, waiting up to ``wait_ms`` for the first
        (an empty list: none came). They are this client's until settled (``msg.ack()``,
        :meth:`settle`), until its connection closes, or for ``visibility_timeout_ms``
        (None: the queue's setting); then they are delivered again.

        Raises:
            UnknownQueueError, QueueLockedError, InvalidQueueError (a bound out of range).
        """
        req = QueueGetRequest(
            queue=queue,
            max_messages=max_messages,
            wait_ms=wait_ms,
            visibility_timeout_ms=visibility_timeout_ms,
        )
        response, transport = await self._qowner(queue, req)
        settler = self._settler(transport)
        return decode_delivery(queue, response.body.entries, response.data, settler)

    async def settle(
        self, queue: str, tags: Sequence[int], outcome: str, *, up_to: int = 0
    ) -> None:
        """Settle deliveries this client holds by tag: ``outcome`` ``ack``, ``requeue``
        (delivered again) or ``dead-letter``; ``up_to`` > 0: also every tag up to it.

        Raises:
            UnknownDeliveryTagError: tags this connection does not hold (the others are
                settled); ValueError: an unknown outcome.
        """
        if outcome not in _OUTCOMES:
            raise ValueError(f"outcome={outcome!r} must be one of ack, requeue, dead-letter")
        req = QueueSettleRequest(queue=queue, tags=list(tags), up_to=up_to, outcome=outcome)
        await self._qowner(queue, req)

    async def browse(
        self, queue: str, *, from_offset: int = 0, max_messages: int = 100
    ) -> list[QueueMessage]:
        """Look at ready messages from ``from_offset`` on without taking them (a dead-letter
        queue's, typically); they cannot be settled. Raises UnknownQueueError."""
        req = QueueBrowseRequest(queue=queue, from_offset=from_offset, max_messages=max_messages)
        response, _ = await self._qowner(queue, req)
        return decode_delivery(queue, response.body.entries, response.data, None)

    async def replay(
        self,
        queue: str,
        *,
        offsets: Sequence[int] | None = None,
        from_offset: int = 0,
        to_offset: int | None = None,
    ) -> int:
        """Move dead letters of ``queue`` back to the queue they died in (their newest
        ``x-death`` entry): those at ``offsets``, or the ready ones in ``[from_offset,
        to_offset)`` (None: to the end). Returns how many moved. Raises UnknownQueueError."""
        req = QueueReplayRequest(
            queue=queue,
            offsets=list(offsets) if offsets is not None else None,
            from_offset=from_offset,
            to_offset=-1 if to_offset is None else to_offset,
        )
        return int((await self._qowner(queue, req))[0].body.messages)


class QueueAdmin:
    """The blocking twins of :class:`AsyncQueueAdmin`'s methods (for
    :class:`~tidewire.client.Client`)."""

    _async: Any  # the asyncio twin, an AsyncQueueAdmin

    def _run(self, coro: Coroutine[Any, Any, T]) -> T:
        raise NotImplementedError  # the client's

    @property
    def _q(self) -> AsyncQueueAdmin:
        return cast(AsyncQueueAdmin, self._async)

    def _run_none(self, coro: Coroutine[Any, Any, None]) -> None:
        self._run(coro)

    def declare_exchange(
        self,
        name: str,
        type: str = "direct",
        *,
        durable: bool = True,
        alternate_exchange: str = "",
    ) -> None:
        self._run(
            self._q.declare_exchange(
                name, type, durable=durable, alternate_exchange=alternate_exchange
            )
        )

    def delete_exchange(self, name: str, *, if_unused: bool = False) -> None:
        self._run(self._q.delete_exchange(name, if_unused=if_unused))

    def declare_queue(
        self,
        name: str,
        *,
        durable: bool = True,
        exclusive: bool = False,
        auto_delete: bool = False,
        max_deliveries: int = 0,
        message_ttl_ms: int = 0,
        max_length: int = 0,
        max_length_bytes: int = 0,
        overflow: str = "reject-publish",
        dead_letter_exchange: str | None = None,
        dead_letter_routing_key: str = "",
        visibility_timeout_ms: int = 0,
        passive: bool = False,
    ) -> QueueInfo:
        return self._run(
            self._q.declare_queue(
                name,
                durable=durable,
                exclusive=exclusive,
                auto_delete=auto_delete,
                max_deliveries=max_deliveries,
                message_ttl_ms=message_ttl_ms,
                max_length=max_length,
                max_length_bytes=max_length_bytes,
                overflow=overflow,
                dead_letter_exchange=dead_letter_exchange,
                dead_letter_routing_key=dead_letter_routing_key,
                visibility_timeout_ms=visibility_timeout_ms,
                passive=passive,
            )
        )

    def delete_queue(self, name: str, *, if_empty: bool = False, if_unused: bool = False) -> int:
        return self._run(self._q.delete_queue(name, if_empty=if_empty, if_unused=if_unused))

    def purge_queue(self, name: str) -> int:
        return self._run(self._q.purge_queue(name))

    def bind(
        self,
        exchange: str,
        queue: str,
        key: str = "",
        *,
        arguments: Mapping[str, str] | None = None,
        destination_kind: str = "queue",
    ) -> None:
        self._run(
            self._q.bind(
                exchange, queue, key, arguments=arguments, destination_kind=destination_kind
            )
        )

    def unbind(
        self,
        exchange: str,
        queue: str,
        key: str = "",
        *,
        arguments: Mapping[str, str] | None = None,
        destination_kind: str = "queue",
    ) -> None:
        self._run(
            self._q.unbind(
                exchange, queue, key, arguments=arguments, destination_kind=destination_kind
            )
        )

    def list_queues(self) -> list[QueueInfo]:
        return self._run(self._q.list_queues())

    def list_exchanges(self) -> tuple[list[ExchangeInfo], list[BindingInfo]]:
        return self._run(self._q.list_exchanges())

    def publish(
        self,
        exchange: str,
        routing_key: str,
        value: bytes | str,
        *,
        headers: Mapping[str, str] | None = None,
        mandatory: bool = False,
        ttl_ms: int = 0,
        delay_ms: int = 0,
        deliver_at_ms: int = 0,
    ) -> PublishResult:
        return self._run(
            self._q.publish(
                exchange,
                routing_key,
                value,
                headers=headers,
                mandatory=mandatory,
                ttl_ms=ttl_ms,
                delay_ms=delay_ms,
                deliver_at_ms=deliver_at_ms,
            )
        )

    def publish_batch(
        self,
        exchange: str,
        routing_key: str,
        values: Sequence[bytes | str],
        *,
        headers: Mapping[str, str] | None = None,
        mandatory: bool = False,
        ttl_ms: int = 0,
        delay_ms: int = 0,
        deliver_at_ms: int = 0,
    ) -> PublishResult:
        return self._run(
            self._q.publish_batch(
                exchange,
                routing_key,
                values,
                headers=headers,
                mandatory=mandatory,
                ttl_ms=ttl_ms,
                delay_ms=delay_ms,
                deliver_at_ms=deliver_at_ms,
            )
        )

    def get(
        self,
        queue: str,
        *,
        max_messages: int = 1,
        wait_ms: int = 0,
        visibility_timeout_ms: int | None = None,
    ) -> list[BlockingQueueMessage]:
        got: list[QueueMessage] = self._run(
            self._q.get(
                queue,
                max_messages=max_messages,
                wait_ms=wait_ms,
                visibility_timeout_ms=visibility_timeout_ms,
            )
        )
        return [BlockingQueueMessage.of(m, self._run_none) for m in got]

    def settle(self, queue: str, tags: Sequence[int], outcome: str, *, up_to: int = 0) -> None:
        self._run(self._q.settle(queue, tags, outcome, up_to=up_to))

    def browse(
        self, queue: str, *, from_offset: int = 0, max_messages: int = 100
    ) -> list[BlockingQueueMessage]:
        got: list[QueueMessage] = self._run(
            self._q.browse(queue, from_offset=from_offset, max_messages=max_messages)
        )
        return [BlockingQueueMessage.of(m, self._run_none) for m in got]

    def replay(
        self,
        queue: str,
        *,
        offsets: Sequence[int] | None = None,
        from_offset: int = 0,
        to_offset: int | None = None,
    ) -> int:
        return self._run(
            self._q.replay(queue, offsets=offsets, from_offset=from_offset, to_offset=to_offset)
        )
