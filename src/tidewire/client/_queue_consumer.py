"""A queue's consumer: :class:`AsyncQueueConsumer` and its blocking twin :class:`QueueConsumer`.

The consumer asks the broker once (QUEUE_CONSUME) and the broker pushes deliveries
(QUEUE_DELIVER) on the consumer's connection, never more than ``prefetch`` messages delivered
and not settled at a time: that is the consumer's whole buffer. Each message is settled with
``await msg.ack()`` (or ``nack``, ``reject``, :meth:`AsyncQueueConsumer.ack_many`); the
settlements of one loop turn go out as one QUEUE_SETTLE.

A lost connection is reopened (with backoff) and the consumer made again. The broker takes
back what the lost connection held, unsettled, and delivers it again (``redelivered``): the
messages buffered here are dropped, and settling one handed out before the loss raises
:class:`~tidewire.errors.UnknownDeliveryTagError` (it comes again).

In a cluster the consumer's connection goes to the queue's owner (the leader of partition 0
of ``__queue.<name>``, found through the metadata; found again on NotLeaderError, a lost
connection, or the owner telling the consumer it was cancelled because it gave the queue up):
what the old owner had delivered and was not settled is delivered again by the new one.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from tidewire.client._blocking import BlockingTwin
from tidewire.errors import (
    ConnectionLostError,
    NotLeaderError,
    TidewireError,
    UnknownQueueError,
    for_code,
)
from tidewire.protocol import PushReceived
from tidewire.protocol.messages import (
    OUTCOME_ACK,
    ApiKey,
    QueueCancelRequest,
    QueueConsumeRequest,
    QueueDeliverBody,
    decode_body,
)
from tidewire.security.credentials import Credentials
from tidewire.security.tls import TlsOptions

from ._queue_messages import BlockingQueueMessage, QueueMessage, Settler, decode_delivery
from ._queues import QUEUE_TOPIC_PREFIX
from ._routing import Router, backoff_s
from ._settings import check_ints
from ._transport import BACKOFF_MAX_S, BACKOFF_MIN_S, Addresses, Transport, parse_addrs

__all__ = ["AsyncQueueConsumer", "QueueConsumer"]

#: The most prefetch a consumer asks for: its buffer is that many messages.
MAX_PREFETCH = 65_535


class AsyncQueueConsumer:
    """Consumes one queue over a connection of its own.

    Use as ``async with AsyncQueueConsumer(addr, "orders") as consumer``, then ``async for
    msg in consumer: ...; await msg.ack()`` (or ``await consumer.get(timeout_s)``).

    Args:
        addr: ``"HOST:PORT"`` of the broker, or of several nodes of a cluster
            (``"H1:P1,H2:P2"`` or a list): the first that answers is used.
        queue: the queue to consume.
        prefetch: messages delivered and not settled at most (1..65,535).
        consumer_tag: the consumer's name ("": the broker chooses one).
        request_timeout_ms: how long a request may take.
        connect_timeout_ms: how long opening the connection may take.
        tls: TLS to the broker: :class:`~tidewire.client.TlsOptions`, True (the system's
            CAs), or None (plaintext).
        credentials: the API key to authenticate every connection with, or None.

    Consuming starts with the first ``get``/iteration (or :meth:`start`); errors of the
    consume request (UnknownQueueError, QueueLockedError, AuthorizationFailedError) are
    raised there.
    """

    def __init__(
        self,
        addr: Addresses,
        queue: str,
        *,
        prefetch: int = 100,
        consumer_tag: str = "",
        request_timeout_ms: int = 30_000,
        connect_timeout_ms: int = 10_000,
        tls: TlsOptions | bool | None = None,
        credentials: Credentials | None = None,
    ) -> None:
        check_ints(
            ("request_timeout_ms", request_timeout_ms, 1),
            ("connect_timeout_ms", connect_timeout_ms, 1),
        )
        if not 1 <= prefetch <= MAX_PREFETCH:
            raise ValueError(f"prefetch={prefetch} must be within 1..{MAX_PREFETCH:,}")

        def connect(address: Addresses) -> Transport:
            return Transport(
                address,
                request_timeout_s=request_timeout_ms / 1000,
                connect_timeout_s=connect_timeout_ms / 1000,
                max_in_flight=16,
                tls=tls,
                credentials=credentials,
            )

        self._setup(connect, addr, queue, prefetch, consumer_tag)

    @classmethod
    def _over(
        cls, connect: Callable[[str], Transport], addr: str, queue: str, *, prefetch: int
    ) -> AsyncQueueConsumer:
        """A consumer whose connections ``connect`` opens (a cluster node's HTTP gateway
        consumes for a WebSocket as the node itself, with its TLS and credentials)."""
        if not 1 <= prefetch <= MAX_PREFETCH:
            raise ValueError(f"prefetch={prefetch} must be within 1..{MAX_PREFETCH:,}")
        self = cls.__new__(cls)

        def opened(address: Addresses) -> Transport:
            return connect(address if isinstance(address, str) else ",".join(address))

        self._setup(opened, addr, queue, prefetch, "")
        return self

    def _setup(
        self,
        connect: Callable[[Addresses], Transport],
        addr: Addresses,
        queue: str,
        prefetch: int,
        consumer_tag: str,
    ) -> None:
        self.queue = queue
        self.prefetch = prefetch
        self._wanted_tag = consumer_tag
        #: The broker's name for this consumer on the current connection ("": none yet).
        self.consumer_tag = ""
        self._connect = connect
        self._t = self._bootstrap = connect(addr)
        #: The cluster's metadata, asked over the bootstrap connection: where the owner is.
        self._router = Router(self._bootstrap, connect)
        self._owner: tuple[str, int] | None = None  # the owner self._t goes to (a cluster)
        self._t.on_push = self._on_push
        self._t.on_lost = self._on_lost
        self._settler = Settler(self._t)
        self._buffer: deque[QueueMessage] = deque()
        self._arrived = asyncio.Event()
        self._errors: list[TidewireError] = []
        self._consuming = False
        self._lost = False
        self._cancelled = False  # told by the broker that the consumer was cancelled
        self._backoff = 0.0
        self._closed = False
        #: How many times the consumer was made again after a lost connection.
        self.reconsumes = 0

    async def __aenter__(self) -> AsyncQueueConsumer:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    @property
    def settle_requests(self) -> int:
        """QUEUE_SETTLE requests this consumer sent (settlements coalesce per loop turn)."""
        return self._settler.requests

    async def start(self) -> None:
        """Start consuming (the first ``get`` or iteration does it too).

        Raises:
            UnknownQueueError, QueueLockedError, AuthorizationFailedError, ...
        """
        if not self._consuming:
            await self._consume()

    async def _consume(self) -> None:
        """Consume; a NotLeaderError (the owner is elsewhere, or moving) sends it to the
        owner, for up to the request timeout."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._t.request_timeout_s
        attempt = 0
        while True:
            try:
                await self._consume_once()
                return
            except NotLeaderError:
                attempt += 1
                if loop.time() >= deadline:
                    raise
                await asyncio.sleep(backoff_s(attempt))
                await self._follow_owner()

    async def _follow_owner(self) -> None:
        """In a cluster: connect to the queue's owner as the metadata names it now (the
        old connection closed: the old owner takes back what it held)."""
        topic = QUEUE_TOPIC_PREFIX + self.queue
        with contextlib.suppress(TidewireError):  # the next attempt tells
            await self._router.refresh([topic])
        if not self._router.clustered:
            return
        node = self._router.leader(topic, 0)
        address = self._router._nodes.get(node)  # the router's own map
        if address is None or address == self._owner:
            return
        old = self._t
        self._owner = address
        self._t = self._connect(f"{address[0]}:{address[1]}")
        self._t.on_push = self._on_push
        self._t.on_lost = self._on_lost
        self._settler = Settler(self._t)
        self._buffer.clear()
        if old is not self._bootstrap:
            with contextlib.suppress(TidewireError):
                await old.close()

    async def _consume_once(self) -> None:
        self._lost = False
        self._consuming = True  # deliveries may arrive before the answer is read
        req = QueueConsumeRequest(
            queue=self.queue, prefetch=self.prefetch, consumer_tag=self._wanted_tag
        )
        try:
            response = await self._t.request(req)
            assert response is not None
            if response.body.error_code:
                raise for_code(response.body.error_code)(response.body.error_message)
        except BaseException:
            self._consuming = False
            raise
        self.consumer_tag = response.body.consumer_tag

    async def close(self) -> None:
        """Stop consuming and close the connection: the messages not settled are delivered
        again (to other consumers)."""
        if self._closed:
            return
        self._closed = True
        await self._settler.close()  # settlements asked for go first
        if self._consuming and self.consumer_tag and self._t.connected and not self._lost:
            with contextlib.suppress(TidewireError):
                await self._t.request(
                    QueueCancelRequest(queue=self.queue, consumer_tag=self.consumer_tag),
                    timeout_s=1,
                )
        self._consuming = False
        self._buffer.clear()
        await self._router.close()
        if self._t is not self._bootstrap:
            await self._t.close()
        await self._bootstrap.close()

    # --- receiving ----------------------------------------------------------------------------

    def _on_push(self, ev: PushReceived) -> None:
        if ev.api_key != ApiKey.QUEUE_DELIVER or not self._consuming:
            return
        body: QueueDeliverBody = decode_body(QueueDeliverBody, ev.body)
        if body.queue != self.queue:
            return
        if body.cancelled:
            # The queue was deleted (iteration ends with the error), or in a cluster its
            # owner gave it up: :meth:`get` tells which and consumes again where it is now.
            self._consuming = False
            self._cancelled = True
            self._arrived.set()
            return
        try:
            messages = decode_delivery(body.queue, body.entries, ev.data, self._settler)
        except TidewireError as exc:
            # Not settled here: the broker delivers them again once this connection goes.
            self._errors.append(exc)
        else:
            self._buffer.extend(messages)
        self._arrived.set()

    def _on_lost(self, error: TidewireError) -> None:
        self._settler.connection_lost()
        self._lost = True
        self._buffer.clear()  # the broker delivers them again
        self._arrived.set()

    async def get(self, timeout_s: float | None = None) -> QueueMessage | None:
        """The next message, waiting up to ``timeout_s`` (None: until one comes); None when
        none came in time.

        Raises:
            UnknownQueueError, AuthorizationFailedError, ...: (re)consuming was refused.
            ConnectionLostError: the consumer is closed.
        """
        loop = asyncio.get_running_loop()
        deadline = None if timeout_s is None else loop.time() + timeout_s
        while True:
            if self._closed:
                raise ConnectionLostError("the queue consumer is closed")
            if self._buffer:
                return self._buffer.popleft()
            if self._errors:
                raise self._errors.pop(0)
            if self._cancelled:
                self._cancelled = False
                await self._follow_owner()
                if not self._router.clustered:
                    raise UnknownQueueError(f"queue {self.queue!r} was deleted")
                self._buffer.clear()  # delivered again by the new owner
            if self._lost or not self._consuming:
                await self._reconsume()
                continue
            remaining = None if deadline is None else deadline - loop.time()
            if remaining is not None and remaining <= 0:
                return None
            self._arrived.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._arrived.wait(), remaining)

    async def _reconsume(self) -> None:
        """Consume (again, after a lost connection: after a backoff)."""
        if self._lost:
            self._backoff = min(max(self._backoff * 2, BACKOFF_MIN_S), BACKOFF_MAX_S)
            await asyncio.sleep(self._backoff)
        was_lost = self._lost
        if self._router.clustered:
            await self._follow_owner()
        try:
            await self._consume()
        except TidewireError as exc:
            if not exc.retriable or not was_lost:
                raise
            self._lost = True
            return
        if was_lost:
            self.reconsumes += 1
        self._backoff = 0.0

    async def ack_many(self, messages: Sequence[QueueMessage]) -> None:
        """Acknowledge ``messages`` in one request.

        Raises:
            UnknownDeliveryTagError: one is not held any more (see the module docstring).
        """
        for m in messages:
            if m.settled:
                raise ValueError(f"delivery tag {m.delivery_tag} was settled already")
        await self._settler.settle(messages, OUTCOME_ACK)

    def __aiter__(self) -> AsyncQueueConsumer:
        return self

    async def __anext__(self) -> QueueMessage:
        msg = await self.get(None)
        assert msg is not None
        return msg


class QueueConsumer(BlockingTwin[AsyncQueueConsumer]):
    """The blocking twin of :class:`AsyncQueueConsumer`: ``for msg in consumer: ...;
    msg.ack()``, ``get(timeout_s)``, ``ack_many``, ``close`` without ``await``."""

    _closed_error = ConnectionLostError
    _closed_message = "the queue consumer is closed"

    def __init__(
        self,
        addr: Addresses,
        queue: str,
        *,
        prefetch: int = 100,
        consumer_tag: str = "",
        request_timeout_ms: int = 30_000,
        connect_timeout_ms: int = 10_000,
        tls: TlsOptions | bool | None = None,
        credentials: Credentials | None = None,
    ) -> None:
        parse_addrs(addr)
        if not 1 <= prefetch <= MAX_PREFETCH:
            raise ValueError(f"prefetch={prefetch} must be within 1..{MAX_PREFETCH:,}")
        options: dict[str, Any] = {
            "prefetch": prefetch,
            "consumer_tag": consumer_tag,
            "request_timeout_ms": request_timeout_ms,
            "connect_timeout_ms": connect_timeout_ms,
            "tls": tls,
            "credentials": credentials,
        }
        self._start_loop("tidewire-queue-consumer")
        try:
            self._async = self._run(self._make(addr, queue, options))
        except BaseException:
            self._stop_loop()
            raise

    @staticmethod
    async def _make(addr: Addresses, queue: str, options: dict[str, Any]) -> AsyncQueueConsumer:
        return AsyncQueueConsumer(addr, queue, **options)

    @property
    def queue(self) -> str:
        return self._async.queue

    @property
    def consumer_tag(self) -> str:
        return self._async.consumer_tag

    def start(self) -> None:
        self._run(self._async.start())

    def _wrap(self, msg: QueueMessage) -> BlockingQueueMessage:
        return BlockingQueueMessage.of(msg, self._run_none)

    def _run_none(self, coro: Any) -> None:
        self._run(coro)

    def get(self, timeout_s: float | None = None) -> BlockingQueueMessage | None:
        msg = self._run(self._async.get(timeout_s))
        return None if msg is None else self._wrap(msg)

    def ack_many(self, messages: Sequence[BlockingQueueMessage]) -> None:
        self._run(self._async.ack_many([m.message for m in messages]))

    def __iter__(self) -> Iterator[BlockingQueueMessage]:
        return self

    def __next__(self) -> BlockingQueueMessage:
        msg = self._run(self._async.get(None))
        assert msg is not None
        return self._wrap(msg)
