"""``/v1/queues/{name}/ws`` on a node of a cluster that does not serve the queue: the socket
is fed from the queue's owner (docs/queues.md, "Queues in a cluster").

A WebSocket client does not follow a redirect, so the node it reached consumes for it: an
:class:`~tidewire.client.AsyncQueueConsumer` opened as the node itself (its TLS and
``--node-api-key-file``, as its other internal requests), which finds the owner through the
metadata and follows it when the queue moves. The socket speaks exactly as on the owner
(:mod:`.queue_ws`): the same frames, the same commands, the owner's delivery tags. The
owner's prefetch bounds what is outstanding, so this node holds at most ``prefetch``
messages for the socket (the consumer's buffer) plus those sent and not settled.

When the socket closes (or the gateway drains) the consumer is closed: what it held and did
not settle goes back to the queue at the owner, delivered again first. When the owner moves,
the consumer consumes at the new one, which delivers again what was not settled; settling a
tag of the old owner then answers an error frame (UnknownDeliveryTagError), as after any
redelivery.
"""

from __future__ import annotations

import asyncio
import base64
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from fastapi import WebSocket

from tidewire.broker.queues.model import SettleOutcome
from tidewire.client._queue_consumer import AsyncQueueConsumer
from tidewire.client._queue_messages import QueueMessage
from tidewire.errors import TidewireError, UnknownDeliveryTagError
from tidewire.server.http._params import error_frame
from tidewire.server.http._ws_session import SocketIO, _Close, receive_command
from tidewire.server.http.peers import node_transports

if TYPE_CHECKING:
    from tidewire.cluster.node import ClusterNode

__all__ = ["RemoteQueueSocket", "remote_message_doc"]


def remote_message_doc(msg: QueueMessage, force_base64: bool) -> dict[str, Any]:
    """A message delivered by the owner, as :func:`~._queue_docs.message_doc` shows one
    delivered here (UTF-8 text where every part is valid UTF-8, else all base64)."""
    doc: dict[str, Any] = {
        "tag": msg.delivery_tag,
        "offset": msg.offset,
        "delivery_count": msg.delivery_count,
        "redelivered": msg.delivery_count > 1,
        "timestamp": msg.timestamp_ms,
    }
    if not force_base64:
        try:
            return doc | {
                "routing_key": msg.routing_key,
                "value": msg.value.decode(),
                "headers": {k: v.decode() for k, v in msg.headers},
                "encoding": "utf-8",
            }
        except UnicodeDecodeError:
            pass

    def b64(data: bytes) -> str:
        return base64.b64encode(data).decode("ascii")

    return doc | {
        "routing_key": b64(msg.routing_key.encode()),
        "value": b64(msg.value),
        "headers": {k: b64(v) for k, v in msg.headers},
        "encoding": "base64",
    }


class RemoteQueueSocket(SocketIO):
    """One accepted WebSocket consuming ``queue`` through its owner (see the module
    docstring), until either side ends it.

    Args:
        parse: the queue socket's command parser: a command to ``(kind, tags, up_to,
            outcome)``, raising ``_Close`` on a bad one.
        close_for: the queue socket's close for an error that ends it
            (:func:`~.queue_ws.queue_close`).
    """

    def __init__(
        self,
        node: ClusterNode,
        ws: WebSocket,
        queue: str,
        *,
        prefetch: int,
        force_base64: bool,
        closing: asyncio.Event,
        parse: Any,
        close_for: Callable[[TidewireError], _Close],
    ) -> None:
        self.ws = ws
        self.queue = queue
        self.prefetch = prefetch
        self.force = force_base64
        self.closing = closing
        self._parse = parse
        self._close_for = close_for
        self.consumer = AsyncQueueConsumer._over(
            node_transports(node), node.info.address, queue, prefetch=prefetch
        )
        #: What was sent and not settled, by tag: at most the owner's prefetch, plus tags of
        #: a former owner not settled yet (dropped when settled or refused).
        self.held: dict[int, QueueMessage] = {}
        self._send_lock = asyncio.Lock()

    async def run(self) -> None:
        await self._serve(self._tasks, self._stop, self._close_for)

    async def _tasks(self) -> list[asyncio.Task[None]]:
        await self.consumer.start()
        await self._send_obj(
            {
                "type": "subscribed",
                "queue": self.queue,
                "consumer_tag": self.consumer.consumer_tag,
                "prefetch": self.prefetch,
            }
        )
        return [
            asyncio.create_task(self._sender(), name="queue ws remote sender"),
            asyncio.create_task(self._commands(), name="queue ws remote commands"),
            asyncio.create_task(self._drain(), name="queue ws remote drain"),
        ]

    async def _stop(self) -> None:
        await self.consumer.close()  # what it held goes back to the queue at the owner

    async def _sender(self) -> None:
        while True:
            msg = await self.consumer.get(None)  # UnknownQueueError: deleted, close 4404
            assert msg is not None
            self.held[msg.delivery_tag] = msg
            await self._send_obj({"type": "message", **remote_message_doc(msg, self.force)})

    async def _commands(self) -> None:
        while True:
            cmd = await receive_command(self.ws)
            kind, tags, up_to, outcome = self._parse(cmd)
            await self._settle(kind, tags, up_to, outcome)

    async def _settle(self, kind: str, tags: list[int], up_to: int, outcome: SettleOutcome) -> None:
        named = dict.fromkeys(tags)
        if up_to:
            named.update(dict.fromkeys(t for t in self.held if t <= up_to))
        missing = [t for t in named if t not in self.held]
        messages = [self.held.pop(t) for t in named if t in self.held]
        results = await asyncio.gather(
            *(_settle_one(m, outcome) for m in messages), return_exceptions=True
        )
        failed = [m.delivery_tag for m, r in zip(messages, results, strict=True) if r is not None]
        for r in results:
            if r is not None and not isinstance(r, TidewireError):
                raise r
        if missing or failed:
            frame = error_frame(
                UnknownDeliveryTagError(
                    f"delivery tags {sorted([*missing, *failed])} of queue {self.queue!r} "
                    "are not held by this socket (settled already, or delivered again by "
                    "a new owner); the others were settled"
                )
            )
            frame["command"] = kind
            await self._send_obj(frame)
            return
        await self._send_obj({"type": "settled", "outcome": outcome, "tags": tags, "up_to": up_to})


async def _settle_one(msg: QueueMessage, outcome: SettleOutcome) -> None:
    """Settle one message at the owner, waiting for its answer (a refusal raises)."""
    if outcome == "ack":
        await msg.ack(wait=True)
    else:
        await msg.nack(requeue=outcome == "requeue", wait=True)
