"""The queue and exchange APIs of one connection (keys 41..57): requests to
``broker.queues`` (:class:`~tidewire.broker.queues.QueueManager`) on behalf of the connection,
which is the *owner* of what it takes, and its consumers' deliveries as QUEUE_DELIVER push
frames.

Each connection has one :class:`QueueSession`; its owner name is the connection's id. What the
owner holds (deliveries to its consumers, messages it took with QUEUE_GET, exclusive queues)
the manager takes back when the connection closes (:meth:`QueueSession.close` calls
``connection_closed``), so a delivery is never lost with its connection: it is delivered
again.

Deliveries are written only while the socket's write buffer is below its high-water mark;
meanwhile they wait here. That costs at most what the manager hands out, which is bounded by
each consumer's ``prefetch`` (messages delivered and not settled). A consumer's deliveries
never reach the client before the answer to its QUEUE_CONSUME: they are held until the
connection has written that answer (:meth:`QueueSession.answered`).
"""

from __future__ import annotations

import asyncio
import bisect
import logging
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any

from tidewire.broker import Broker
from tidewire.broker.queues.model import (
    Binding,
    Delivery,
    ExchangeSpec,
    QueueSpec,
    QueueStatus,
    SettleOutcome,
)
from tidewire.errors import InvalidQueueError, PreconditionFailedError, TidewireError
from tidewire.protocol import Connection
from tidewire.protocol.frames import Buffer
from tidewire.protocol.messages import (
    ApiKey,
    BindingInfo,
    Body,
    DeliveryEntryInfo,
    ExchangeDeclareRequest,
    ExchangeDeclareResponse,
    ExchangeDeleteRequest,
    ExchangeDeleteResponse,
    ExchangeInfo,
    ListExchangesRequest,
    ListExchangesResponse,
    ListQueuesRequest,
    ListQueuesResponse,
    QueueBindRequest,
    QueueBindResponse,
    QueueBrowseRequest,
    QueueBrowseResponse,
    QueueCancelRequest,
    QueueCancelResponse,
    QueueConsumeRequest,
    QueueConsumeResponse,
    QueueCountersInfo,
    QueueDeclareRequest,
    QueueDeclareResponse,
    QueueDeleteRequest,
    QueueDeleteResponse,
    QueueDeliverBody,
    QueueGetRequest,
    QueueGetResponse,
    QueueInfo,
    QueuePublishRequest,
    QueuePublishResponse,
    QueuePurgeRequest,
    QueuePurgeResponse,
    QueueReplayRequest,
    QueueReplayResponse,
    QueueSettleRequest,
    QueueSettleResponse,
    QueueUnbindRequest,
    QueueUnbindResponse,
    TopicOffset,
    encode_body,
)
from tidewire.records import iter_batches
from tidewire.security.model import ResourceType
from tidewire.server.gate import gate_for, names_allowed
from tidewire.server.needs import DEFAULT_EXCHANGE_ACL_NAME

__all__ = ["MAX_PUSH_BYTES", "QUEUE_APIS", "QueueSession", "queue_info", "split_delivery"]

log = logging.getLogger("tidewire.server")

#: Consumers one connection may have at once: each is a waiter on its queue and holds up to
#: its prefetch of messages for this connection.
MAX_CONSUMERS = 1024
#: The most data one QUEUE_DELIVER frame carries (a larger single batch goes alone): a
#: delivery of many messages is split on batch boundaries, so a frame stays far below the
#: frame limit and the write buffer's high-water mark is passed by at most one such frame.
MAX_PUSH_BYTES = 1024 * 1024

Reply = tuple[Body, list[bytes]]
_Handler = Callable[["QueueSession", Any, memoryview], Awaitable[Reply]]

_OUTCOMES: dict[str, SettleOutcome] = {
    "ack": "ack",
    "requeue": "requeue",
    "dead-letter": "dead-letter",
}


def queue_info(s: QueueStatus) -> QueueInfo:
    """A queue's status as the protocol lists it."""
    spec, c = s.spec, s.counters
    return QueueInfo(
        name=spec.name,
        durable=spec.durable,
        exclusive=spec.exclusive,
        auto_delete=spec.auto_delete,
        max_deliveries=spec.max_deliveries,
        message_ttl_ms=spec.message_ttl_ms,
        max_length=spec.max_length,
        max_length_bytes=spec.max_length_bytes,
        overflow=spec.overflow,
        dead_letter_exchange=spec.dead_letter_exchange,
        dead_letter_routing_key=spec.dead_letter_routing_key,
        visibility_timeout_ms=spec.visibility_timeout_ms,
        ready=s.ready,
        unacked=s.unacked,
        delayed=s.delayed,
        bytes=s.bytes,
        consumers=s.consumers,
        counters=QueueCountersInfo(
            published=c.published,
            delivered=c.delivered,
            acked=c.acked,
            redelivered=c.redelivered,
            dead_lettered=c.dead_lettered,
            expired=c.expired,
            dropped=c.dropped,
            rejected_publishes=c.rejected_publishes,
        ),
    )


def _entries(d: Delivery) -> list[DeliveryEntryInfo]:
    return [DeliveryEntryInfo(e.tag, e.offset, e.delivery_count) for e in d.entries]


def split_delivery(
    entries: list[DeliveryEntryInfo], data: bytes, max_bytes: int = MAX_PUSH_BYTES
) -> list[tuple[list[DeliveryEntryInfo], memoryview]]:
    """``data`` (whole batches) cut on batch boundaries into pieces of at most ``max_bytes``
    (a larger single batch alone), each with the entries whose offsets it holds; pieces
    holding no entry are left out."""
    view = memoryview(data)
    if len(data) <= max_bytes:
        return [(entries, view)]
    # (start, end, first offset, last offset) of each piece
    pieces: list[list[int]] = []
    for pos, h in iter_batches(data, verify=False):
        end = pos + h.size
        last = h.base_offset + h.last_offset_delta
        if pieces and end - pieces[-1][0] <= max_bytes:
            pieces[-1][1], pieces[-1][3] = end, last
        else:
            pieces.append([pos, end, h.base_offset, last])
    firsts = [p[2] for p in pieces]
    by_piece: list[list[DeliveryEntryInfo]] = [[] for _ in pieces]
    for e in entries:
        i = bisect.bisect_right(firsts, e.offset) - 1
        if i >= 0 and e.offset <= pieces[i][3]:
            by_piece[i].append(e)
    return [(ents, view[p[0] : p[1]]) for p, ents in zip(pieces, by_piece, strict=True) if ents]


def _err(exc: TidewireError) -> dict[str, Any]:
    return {"error_code": exc.code, "error_message": exc.message}


def _binding(req: QueueBindRequest | QueueUnbindRequest) -> Binding:
    if req.destination_kind not in ("queue", "topic"):
        raise InvalidQueueError(
            f"destination_kind={req.destination_kind!r} must be 'queue' or 'topic'"
        )
    return Binding(
        exchange=req.exchange,
        destination=req.destination,
        destination_kind="queue" if req.destination_kind == "queue" else "topic",
        key=req.key,
        arguments=tuple(sorted(req.arguments.items())),
    )


class QueueSession:
    """The queue state of one connection: its owner name, its consumers, the deliveries
    waiting for the socket.

    Args:
        broker: the broker (``broker.queues`` serves the requests).
        conn: the connection's sans-IO state (push frames are encoded with it).
        write: writes a push frame's buffers to the socket.
        writable: set while the socket's write buffer is below its high-water mark.
        owner: the connection's id: what it takes is held in this name.
    """

    def __init__(
        self,
        broker: Broker,
        conn: Connection,
        write: Callable[[list[Buffer]], None],
        writable: asyncio.Event,
        owner: str,
    ) -> None:
        self.broker = broker
        self.conn = conn
        self._write = write
        self.writable = writable
        self.owner = owner
        #: (queue, consumer tag) of this connection's consumers.
        self.consumers: set[tuple[str, str]] = set()
        #: Push frames waiting for the socket: (queue, consumer tag, entries, data).
        # (queue, consumer tag, entries, data); entries None: the consumer was cancelled.
        self._outbox: deque[tuple[str, str, list[DeliveryEntryInfo] | None, memoryview]] = deque()
        self._holding = 0  # QUEUE_CONSUME answers not yet written: deliveries wait
        self._flush_scheduled = False
        self._waiter: asyncio.Task[None] | None = None
        self._used = False  # whether the connection used queues at all
        self.closed = False
        #: Push frames written, and the most that waited here at once.
        self.pushed = 0
        self.peak_waiting = 0

    # --- requests -------------------------------------------------------------------------------

    async def handle(self, api_key: int, body: Any, data: memoryview) -> Reply:
        """Answer one request of :data:`QUEUE_APIS`; the broker's refusals are in the
        response's ``error_code``/``error_message``. Call :meth:`answered` once the answer
        is written (or the request failed)."""
        self._used = True
        if api_key == ApiKey.QUEUE_CONSUME:
            self._holding += 1
        return await _HANDLERS[api_key](self, body, data)

    def answered(self, api_key: int) -> None:
        """The answer to a request of ``api_key`` is written (or it failed)."""
        if api_key == ApiKey.QUEUE_CONSUME:
            self._holding -= 1
            self._kick()

    # --- deliveries -----------------------------------------------------------------------------

    def _deliver(self, d: Delivery) -> None:
        """The manager's deliver callback: never blocks."""
        if self.closed:
            return  # connection_closed takes them back
        for entries, data in split_delivery(_entries(d), d.data):
            self._outbox.append((d.queue, d.consumer, entries, data))
        self.peak_waiting = max(self.peak_waiting, len(self._outbox))
        self._kick()

    def _cancelled(self, queue: str, tag: str) -> None:
        """The manager ended a consumer of this connection (its queue was deleted): tell
        the client, after the deliveries already on their way."""
        self.consumers.discard((queue, tag))
        if not self.closed:
            self._outbox.append((queue, tag, None, memoryview(b"")))
            self._kick()

    def _kick(self) -> None:
        if self._holding or self._flush_scheduled or not self._outbox or self.closed:
            return
        self._flush_scheduled = True
        asyncio.get_running_loop().call_soon(self._flush)

    def _flush(self) -> None:
        self._flush_scheduled = False
        if self.closed or self._holding:
            return
        outbox = self._outbox
        while outbox and self.writable.is_set():
            queue, tag, entries, data = outbox.popleft()
            if entries is None:
                body = QueueDeliverBody(queue=queue, consumer_tag=tag, cancelled=True)
            else:
                body = QueueDeliverBody(queue=queue, consumer_tag=tag, entries=entries)
            self._write(self.conn.send_push(0, ApiKey.QUEUE_DELIVER, encode_body(body), [data]))
            self.pushed += 1
        if outbox and self._waiter is None:
            self._waiter = asyncio.get_running_loop().create_task(
                self._wait_writable(), name=f"queue deliveries {self.owner}"
            )

    async def _wait_writable(self) -> None:
        try:
            await self.writable.wait()
        finally:
            self._waiter = None
        self._kick()

    def close(self) -> None:
        """The connection is gone: the manager takes back what it held (and drops its
        exclusive queues); deliveries waiting here are among those."""
        if self.closed:
            return
        self.closed = True
        self._outbox.clear()
        if self._waiter is not None:
            self._waiter.cancel()
            self._waiter = None
        if self._used:
            try:
                self.broker.queues.connection_closed(self.owner)
            except TidewireError as exc:  # the broker stopped first: nothing is held
                log.debug("queues of %s not released: %s", self.owner, exc)

    # --- the handlers ---------------------------------------------------------------------------

    async def _exchange_declare(self, req: ExchangeDeclareRequest, _: memoryview) -> Reply:
        spec = ExchangeSpec(
            name=req.name,
            type=req.type,
            durable=req.durable,
            alternate_exchange=req.alternate_exchange,
        )
        try:
            await self.broker.queues.declare_exchange(spec, passive=req.passive)
        except TidewireError as exc:
            return ExchangeDeclareResponse(**_err(exc)), []
        return ExchangeDeclareResponse(), []

    async def _exchange_delete(self, req: ExchangeDeleteRequest, _: memoryview) -> Reply:
        try:
            await self.broker.queues.delete_exchange(req.name, if_unused=req.if_unused)
        except TidewireError as exc:
            return ExchangeDeleteResponse(**_err(exc)), []
        return ExchangeDeleteResponse(), []

    async def _queue_declare(self, req: QueueDeclareRequest, _: memoryview) -> Reply:
        spec = QueueSpec(
            name=req.name,
            durable=req.durable,
            exclusive=req.exclusive,
            auto_delete=req.auto_delete,
            max_deliveries=req.max_deliveries,
            message_ttl_ms=req.message_ttl_ms,
            max_length=req.max_length,
            max_length_bytes=req.max_length_bytes,
            overflow=req.overflow,
            dead_letter_exchange=req.dead_letter_exchange,
            dead_letter_routing_key=req.dead_letter_routing_key,
            visibility_timeout_ms=req.visibility_timeout_ms,
        )
        try:
            status = await self.broker.queues.declare_queue(
                spec, owner=self.owner, passive=req.passive
            )
        except TidewireError as exc:
            return QueueDeclareResponse(**_err(exc)), []
        return QueueDeclareResponse(queue=queue_info(status)), []

    async def _queue_delete(self, req: QueueDeleteRequest, _: memoryview) -> Reply:
        try:
            if req.auto_delete_by >= 0:  # a cluster's own request (see the request's doc)
                n = await self.broker.queues.delete_for_owner(req.name, req.auto_delete_by)
            else:
                n = await self.broker.queues.delete_queue(
                    req.name, if_empty=req.if_empty, if_unused=req.if_unused, owner=self.owner
                )
        except TidewireError as exc:
            return QueueDeleteResponse(**_err(exc)), []
        return QueueDeleteResponse(messages=n), []

    async def _queue_purge(self, req: QueuePurgeRequest, _: memoryview) -> Reply:
        try:
            n = await self.broker.queues.purge_queue(req.name, owner=self.owner)
        except TidewireError as exc:
            return QueuePurgeResponse(**_err(exc)), []
        return QueuePurgeResponse(messages=n), []

    async def _bind(self, req: QueueBindRequest, _: memoryview) -> Reply:
        try:
            await self.broker.queues.bind(_binding(req))
        except TidewireError as exc:
            return QueueBindResponse(**_err(exc)), []
        return QueueBindResponse(), []

    async def _unbind(self, req: QueueUnbindRequest, _: memoryview) -> Reply:
        try:
            await self.broker.queues.unbind(_binding(req))
        except TidewireError as exc:
            return QueueUnbindResponse(**_err(exc)), []
        return QueueUnbindResponse(), []

    async def _list_queues(self, req: ListQueuesRequest, _: memoryview) -> Reply:
        try:
            statuses = self.broker.queues.queues()
        except TidewireError as exc:
            return ListQueuesResponse(**_err(exc)), []
        allowed = set(
            names_allowed(
                gate_for(self.broker), ResourceType.QUEUE, [s.spec.name for s in statuses]
            )
        )
        infos = [queue_info(s) for s in statuses if s.spec.name in allowed]
        return ListQueuesResponse(queues=sorted(infos, key=lambda i: i.name)), []

    async def _list_exchanges(self, req: ListExchangesRequest, _: memoryview) -> Reply:
        mgr = self.broker.queues
        try:
            exchanges = mgr.exchanges()
            bindings = mgr.bindings()
        except TidewireError as exc:
            return ListExchangesResponse(**_err(exc)), []
        gate = gate_for(self.broker)
        acl_names = {x.name: x.name or DEFAULT_EXCHANGE_ACL_NAME for x in exchanges}
        visible = set(names_allowed(gate, ResourceType.EXCHANGE, list(acl_names.values())))
        shown = {name for name, acl in acl_names.items() if acl in visible}
        return ListExchangesResponse(
            exchanges=[
                ExchangeInfo(
                    name=x.name,
                    type=x.type,
                    durable=x.durable,
                    alternate_exchange=x.alternate_exchange,
                )
                for x in sorted(exchanges, key=lambda x: x.name)
                if x.name in shown
            ],
            bindings=[
                BindingInfo(
                    exchange=b.exchange,
                    destination=b.destination,
                    destination_kind=b.destination_kind,
                    key=b.key,
                    arguments=dict(b.arguments),
                )
                for b in bindings
                if b.exchange in shown
            ],
        ), []

    async def _publish(self, req: QueuePublishRequest, data: memoryview) -> Reply:
        mgr = self.broker.queues
        try:
            if req.delay_ms < 0:
                raise InvalidQueueError(f"delay_ms={req.delay_ms} must be >= 0")
            deliver_at = req.deliver_at_ms
            if req.delay_ms:
                deliver_at = max(deliver_at, mgr.clock() + req.delay_ms)
            r = await mgr.publish(
                req.exchange,
                req.routing_key,
                data,
                headers=req.headers,
                mandatory=req.mandatory,
                ttl_ms=req.ttl_ms,
                deliver_at_ms=deliver_at,
                owner=self.owner,
            )
        except TidewireError as exc:
            return QueuePublishResponse(**_err(exc)), []
        return QueuePublishResponse(
            queues=list(r.queues),
            topics=[TopicOffset(t, p, o) for t, p, o in r.topics],
            unroutable=r.unroutable,
        ), []

    async def _consume(self, req: QueueConsumeRequest, _: memoryview) -> Reply:
        try:
            if len(self.consumers) >= MAX_CONSUMERS:
                raise PreconditionFailedError(
                    f"this connection has {len(self.consumers):,} consumers "
                    f"(at most {MAX_CONSUMERS:,})"
                )
            named: list[str] = []  # the tag, for the cancel callback (known once consuming)
            tag = self.broker.queues.consume(
                req.queue,
                owner=self.owner,
                prefetch=req.prefetch,
                deliver=self._deliver,
                consumer_tag=req.consumer_tag,
                cancelled=lambda: self._cancelled(req.queue, named[0]),
            )
            named.append(tag)
        except TidewireError as exc:
            return QueueConsumeResponse(**_err(exc)), []
        self.consumers.add((req.queue, tag))
        return QueueConsumeResponse(consumer_tag=tag), []

    async def _cancel(self, req: QueueCancelRequest, _: memoryview) -> Reply:
        key = (req.queue, req.consumer_tag)
        if key not in self.consumers:
            exc = PreconditionFailedError(
                f"no consumer {req.consumer_tag!r} of this connection on queue {req.queue!r}"
            )
            return QueueCancelResponse(**_err(exc)), []
        self.consumers.discard(key)
        try:
            self.broker.queues.cancel(req.queue, req.consumer_tag)
        except TidewireError as exc:
            return QueueCancelResponse(**_err(exc)), []
        return QueueCancelResponse(), []

    async def _get(self, req: QueueGetRequest, _: memoryview) -> Reply:
        try:
            d = await self.broker.queues.get(
                req.queue,
                owner=self.owner,
                max_messages=req.max_messages,
                wait_ms=req.wait_ms,
                visibility_timeout_ms=req.visibility_timeout_ms,
            )
        except TidewireError as exc:
            return QueueGetResponse(**_err(exc)), []
        if self.closed and d.entries:
            # Taken for a connection that went meanwhile: give them back at once.
            tags = [e.tag for e in d.entries]
            await self.broker.queues.settle(req.queue, tags, "requeue", owner=self.owner)
            return QueueGetResponse(), []
        return QueueGetResponse(entries=_entries(d)), [d.data] if d.entries else []

    async def _settle(self, req: QueueSettleRequest, _: memoryview) -> Reply:
        outcome = _OUTCOMES.get(req.outcome)
        try:
            if outcome is None:
                raise InvalidQueueError(
                    f"outcome {req.outcome!r}: 'ack', 'requeue' or 'dead-letter'"
                )
            await self.broker.queues.settle(
                req.queue, req.tags, outcome, owner=self.owner, up_to=req.up_to
            )
        except TidewireError as exc:
            return QueueSettleResponse(**_err(exc)), []
        return QueueSettleResponse(), []

    async def _browse(self, req: QueueBrowseRequest, _: memoryview) -> Reply:
        try:
            d = self.broker.queues.browse(
                req.queue, from_offset=req.from_offset, max_messages=req.max_messages
            )
        except TidewireError as exc:
            return QueueBrowseResponse(**_err(exc)), []
        return QueueBrowseResponse(entries=_entries(d)), [d.data] if d.entries else []

    async def _replay(self, req: QueueReplayRequest, _: memoryview) -> Reply:
        try:
            n = await self.broker.queues.replay(
                req.queue,
                offsets=req.offsets,
                from_offset=req.from_offset,
                to_offset=None if req.to_offset < 0 else req.to_offset,
            )
        except TidewireError as exc:
            return QueueReplayResponse(**_err(exc)), []
        return QueueReplayResponse(messages=n), []


_HANDLERS: dict[int, _Handler] = {
    ApiKey.EXCHANGE_DECLARE: QueueSession._exchange_declare,
    ApiKey.EXCHANGE_DELETE: QueueSession._exchange_delete,
    ApiKey.QUEUE_DECLARE: QueueSession._queue_declare,
    ApiKey.QUEUE_DELETE: QueueSession._queue_delete,
    ApiKey.QUEUE_PURGE: QueueSession._queue_purge,
    ApiKey.QUEUE_BIND: QueueSession._bind,
    ApiKey.QUEUE_UNBIND: QueueSession._unbind,
    ApiKey.LIST_QUEUES: QueueSession._list_queues,
    ApiKey.LIST_EXCHANGES: QueueSession._list_exchanges,
    ApiKey.QUEUE_PUBLISH: QueueSession._publish,
    ApiKey.QUEUE_CONSUME: QueueSession._consume,
    ApiKey.QUEUE_CANCEL: QueueSession._cancel,
    ApiKey.QUEUE_GET: QueueSession._get,
    ApiKey.QUEUE_SETTLE: QueueSession._settle,
    ApiKey.QUEUE_BROWSE: QueueSession._browse,
    ApiKey.QUEUE_REPLAY: QueueSession._replay,
}
#: The APIs a connection's :class:`QueueSession` serves (QUEUE_DELIVER is its push).
QUEUE_APIS = frozenset(_HANDLERS)
