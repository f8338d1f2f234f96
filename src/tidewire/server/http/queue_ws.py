"""``/v1/queues/{name}/ws``: a queue consumed over a WebSocket, settled over the same socket.

Query parameters: ``prefetch`` (messages delivered and not yet settled at most, default
100, 1..10,000) and ``encoding=base64`` (always base64; else UTF-8 text where valid).

The socket is one consumer, and one owner: what it holds is its own, and when it closes
(or the gateway drains) every message it did not settle goes back to the queue, to be
redelivered first. The server sends::

    {"type": "subscribed", "queue": Q, "consumer_tag": C, "prefetch": N}
    {"type": "message", "tag", "offset", "delivery_count", "redelivered", "routing_key",
     "value", "headers", "timestamp", "encoding"}                  (one per frame)
    {"type": "settled", "outcome", "tags", "up_to"}                (after each settle command)
    {"type": "error", "error": {code, name, message}, "command": ...}

and the client sends::

    {"type": "ack" | "nack" | "reject", "tags": [..], "up_to": 0, "requeue": bool}

``ack`` acknowledges; ``nack`` requeues (``requeue: false``: dead-letters); ``reject``
dead-letters (``requeue: true``: requeues); ``up_to`` adds every tag up to it this socket
holds. A settle of tags the socket does not hold answers an error frame (the others are
settled) and the socket goes on. The manager's prefetch bounds what is outstanding: nothing
more is delivered until the client settles, so a slow client never grows the broker's
memory. Bad frames close the socket (close codes in :data:`QUEUE_CLOSE_CODES`); so does the
queue's deletion (4404, noticed within :data:`QUEUE_CHECK_S`).
"""

from __future__ import annotations

import asyncio
import collections
import itertools
import logging
import secrets
from typing import Any

import msgspec
from fastapi import APIRouter, WebSocket

from tidewire._tasks import wait_event
from tidewire.broker import Broker
from tidewire.broker.queues.model import Delivery, SettleOutcome
from tidewire.cluster import cluster_node
from tidewire.errors import (
    InvalidRequestError,
    NotLeaderError,
    QueueLockedError,
    TidewireError,
    UnknownQueueError,
)
from tidewire.server.http._params import encoding_param, error_frame, int_param
from tidewire.server.http._queue_docs import delivered, message_doc
from tidewire.server.http._ws_session import SocketIO, _Close, close_reason, receive_command
from tidewire.server.http._ws_settings import CLOSE_CODES
from tidewire.server.http.context import GatewayContext

__all__ = [
    "DEFAULT_PREFETCH",
    "MAX_PREFETCH",
    "QUEUE_CLOSE_CODES",
    "parse_settle",
    "queue_close",
    "queue_ws_router",
]

log = logging.getLogger("tidewire.http")

#: Messages outstanding per socket by default, and at most: the most one socket can make the
#: broker hold for it (and send before the client says anything).
DEFAULT_PREFETCH = 100
MAX_PREFETCH = 10_000
#: The most tags one settle command names (a command frame is 64 KiB at most anyway).
MAX_TAGS = 10_000
#: How often an idle socket checks that its queue still exists (s): a deleted queue drops
#: its consumers without a word, and the client is told (4404) at most this late.
QUEUE_CHECK_S = 2.0

#: The stream's close codes, and the queue's own.
QUEUE_CLOSE_CODES = CLOSE_CODES | {"locked": 4423}

_OUTCOMES: dict[str, tuple[SettleOutcome, SettleOutcome]] = {
    # kind: (outcome without requeue given, outcome with the other choice)
    "ack": ("ack", "ack"),
    "nack": ("requeue", "dead-letter"),
    "reject": ("dead-letter", "requeue"),
}

_ids = itertools.count(1)


def queue_ws_router(ctx: GatewayContext) -> APIRouter:
    """The queue subscription over a WebSocket."""
    router = APIRouter(tags=["queues"])

    @router.websocket("/v1/queues/{name}/ws")
    async def queue_ws(websocket: WebSocket, name: str) -> None:
        await websocket.accept()
        try:
            params = websocket.query_params
            prefetch = int_param(params, "prefetch", DEFAULT_PREFETCH, 1, MAX_PREFETCH)
            force = encoding_param(params)
        except TidewireError as exc:
            await websocket.send_json(error_frame(exc))
            await websocket.close(QUEUE_CLOSE_CODES["bad_request"], close_reason(exc))
            return
        node = cluster_node(ctx.broker)
        if node is not None and not _served_here(ctx.broker, name):
            # Another node serves it (or none now): fed from the owner, through this node.
            from tidewire.server.http.queue_ws_remote import RemoteQueueSocket  # noqa: PLC0415

            await RemoteQueueSocket(
                node,
                websocket,
                name,
                prefetch=prefetch,
                force_base64=force,
                closing=ctx.closing,
                parse=parse_settle,
                close_for=queue_close,
            ).run()
            return
        await QueueSocket(
            ctx.broker, websocket, name, prefetch=prefetch, force_base64=force, closing=ctx.closing
        ).run()

    return router


def _served_here(broker: Broker, queue: str) -> bool:
    """Whether this node's queue manager serves ``queue`` (or would answer for it: a
    transient queue, an unknown one), rather than another node of the cluster."""
    try:
        broker.queues.describe_queue(queue)
    except NotLeaderError:
        return False
    except TidewireError:
        return True  # UnknownQueueError and the like: answered here, as on a single node
    return True


def queue_close(exc: TidewireError) -> _Close:
    """The close an error that ends a queue subscription calls for (here or fed from the
    queue's owner): 4404 when the queue is gone, 4423 when it is locked, else internal."""
    if isinstance(exc, UnknownQueueError):
        return _Close(QUEUE_CLOSE_CODES["not_found"], exc)
    if isinstance(exc, QueueLockedError):
        return _Close(QUEUE_CLOSE_CODES["locked"], exc)
    return _Close(QUEUE_CLOSE_CODES["internal"], exc)


class QueueSocket(SocketIO):
    """One accepted WebSocket consuming ``queue`` until either side ends it."""

    def __init__(
        self,
        broker: Broker,
        ws: WebSocket,
        queue: str,
        *,
        prefetch: int,
        force_base64: bool,
        closing: asyncio.Event,
    ) -> None:
        self.broker = broker
        self.ws = ws
        self.queue = queue
        self.prefetch = prefetch
        self.force = force_base64
        self.closing = closing
        #: The owner of what this socket holds: unique while the broker runs.
        self.owner = f"ws-{next(_ids)}-{secrets.token_hex(4)}"
        #: Deliveries handed over by the manager, not yet sent: bounded by the prefetch
        #: (the manager never has more than that outstanding for this consumer).
        self.pending: collections.deque[Delivery] = collections.deque()
        self.arrived = asyncio.Event()
        self._send_lock = asyncio.Lock()
        #: Set when the manager ends the consumer (its queue deleted, or in a cluster served
        #: by another node now): the socket closes with the reason.
        self._ended = asyncio.Event()
        self._consuming = False

    def _deliver(self, d: Delivery) -> None:
        """The manager's callback (on the loop, never blocking)."""
        self.pending.append(d)
        self.arrived.set()

    async def run(self) -> None:
        await self._serve(self._tasks, self._stop, queue_close)

    async def _tasks(self) -> list[asyncio.Task[None]]:
        tag = self.broker.queues.consume(
            self.queue,
            owner=self.owner,
            prefetch=self.prefetch,
            deliver=self._deliver,
            cancelled=self._ended.set,
        )
        self._consuming = True
        await self._send_obj(
            {
                "type": "subscribed",
                "queue": self.queue,
                "consumer_tag": tag,
                "prefetch": self.prefetch,
            }
        )
        return [
            asyncio.create_task(self._sender(), name="queue ws sender"),
            asyncio.create_task(self._commands(), name="queue ws commands"),
            asyncio.create_task(self._drain(), name="queue ws drain"),
            asyncio.create_task(self._watch_end(), name="queue ws end"),
        ]

    async def _stop(self) -> None:
        if self._consuming:
            # Its consumer cancelled, what it held requeued (redelivered first).
            self.broker.queues.connection_closed(self.owner)

    async def _watch_end(self) -> None:
        """Until the manager ends the consumer: then close, saying why (the queue is gone:
        UnknownQueueError; in a cluster another node serves it now: NotLeaderError naming
        it, and the client opens the socket there)."""
        await self._ended.wait()
        try:
            self.broker.queues.describe_queue(self.queue)
        except UnknownQueueError:
            raise
        except TidewireError as exc:
            raise _Close(QUEUE_CLOSE_CODES["going_away"], exc) from None
        raise UnknownQueueError(f"queue {self.queue!r} ended its consumers")

    async def _sender(self) -> None:
        manager = self.broker.queues
        while True:
            if not self.pending:
                self.arrived.clear()
                if not await wait_event(self.arrived, QUEUE_CHECK_S):
                    # Idle: the queue may have been deleted (its consumers with it).
                    manager.describe_queue(self.queue)  # UnknownQueueError: close 4404
                continue
            d = self.pending.popleft()
            for entry, rec in delivered(d):
                doc = {"type": "message", **message_doc(entry, rec, self.force)}
                await self._send_text(msgspec.json.encode(doc).decode())

    async def _commands(self) -> None:
        while True:
            cmd = await receive_command(self.ws)
            await self._settle(cmd)

    async def _settle(self, cmd: Any) -> None:
        kind, tags, up_to, outcome = parse_settle(cmd)
        try:
            await self.broker.queues.settle(
                self.queue, tags, outcome, owner=self.owner, up_to=up_to
            )
        except TidewireError as exc:  # tags not held, a storage failure: not the end
            frame = error_frame(exc)
            frame["command"] = kind
            await self._send_obj(frame)
            return
        await self._send_obj({"type": "settled", "outcome": outcome, "tags": tags, "up_to": up_to})


def parse_settle(cmd: Any) -> tuple[str, list[int], int, SettleOutcome]:
    """A settle command: its kind, tags, ``up_to`` and outcome.

    Raises:
        _Close: not a valid settle command (the socket closes with the policy code).
    """
    kind = cmd.get("type") if isinstance(cmd, dict) else None
    if kind not in _OUTCOMES:
        raise _Close(
            QUEUE_CLOSE_CODES["policy"],
            InvalidRequestError(
                f"unknown command {kind!r}: commands are ack, nack and reject "
                '({"type": "ack", "tags": [..]})'
            ),
        )
    assert isinstance(cmd, dict)
    extra = set(cmd) - {"type", "tags", "up_to", "requeue"}
    if extra:
        raise _Close(
            QUEUE_CLOSE_CODES["policy"],
            InvalidRequestError(f"{kind} has unknown field(s) {sorted(extra)}"),
        )
    tags, up_to, requeue = cmd.get("tags", []), cmd.get("up_to", 0), cmd.get("requeue")
    if (
        not isinstance(tags, list)
        or len(tags) > MAX_TAGS
        or any(isinstance(t, bool) or not isinstance(t, int) or t < 1 for t in tags)
    ):
        raise _Close(
            QUEUE_CLOSE_CODES["policy"],
            InvalidRequestError(
                f"{kind} tags must be a list of at most {MAX_TAGS:,} integers >= 1"
            ),
        )
    if isinstance(up_to, bool) or not isinstance(up_to, int) or up_to < 0:
        raise _Close(
            QUEUE_CLOSE_CODES["policy"],
            InvalidRequestError(f"{kind} up_to={up_to!r} must be an integer >= 0"),
        )
    if requeue is not None and (not isinstance(requeue, bool) or kind == "ack"):
        raise _Close(
            QUEUE_CLOSE_CODES["policy"],
            InvalidRequestError("requeue: true or false, for nack and reject only"),
        )
    if not tags and not up_to:
        raise _Close(QUEUE_CLOSE_CODES["policy"], InvalidRequestError(f"{kind} names no tags"))
    usual, other = _OUTCOMES[kind]
    outcome = usual if requeue is None or requeue == (kind == "nack") else other
    return kind, tags, up_to, outcome
