"""Messages of exchanges and queues over HTTP: publish to an exchange, get from a queue
(long-poll), ack / nack / reject by delivery tag, and the dead-letter routes (browse,
replay, purge).

A get is held by the owner ``"http"`` (every request without a connection is that owner):
any HTTP request may settle it with its tag, and unsettled it is redelivered once its
visibility timeout passes (30 s unless the request says otherwise).
"""

from __future__ import annotations

import asyncio
from typing import Annotated, Literal

from fastapi import APIRouter, Query, Request
from starlette.responses import Response

from tidewire._tasks import cancel_and_wait
from tidewire.broker.queues.model import Delivery, DeliveryEntry, SettleOutcome
from tidewire.errors import InvalidRequestError, NotLeaderError
from tidewire.protocol import messages as wire
from tidewire.records import BatchBuilder
from tidewire.server.http._common import json_response, parse_body, request_body
from tidewire.server.http._queue_docs import browsed_doc, delivered, exchange_name, message_doc
from tidewire.server.http.context import GatewayContext
from tidewire.server.http.publisher import payload_bytes
from tidewire.server.http.queue_forward import forward_to_server
from tidewire.server.http.queue_models import (
    MAX_GET_MESSAGES,
    BrowseResult,
    GetRequest,
    GetResult,
    MessageCount,
    QueuePublishRequest,
    QueuePublishResult,
    ReplayRequest,
    SettleRequest,
    SettleResult,
)
from tidewire.server.http.queues import HTTP_OWNER, NamePath, queue_responses

__all__ = ["queue_messages_router"]

#: The most messages one browse answers.
MAX_BROWSE = MAX_GET_MESSAGES
DEFAULT_BROWSE = 100

Settle = Literal["ack", "nack", "reject"]


def _outcome(kind: Settle, requeue: bool | None) -> SettleOutcome:
    if kind == "ack":
        if requeue is not None:
            raise InvalidRequestError("field requeue: only for nack and reject")
        return "ack"
    if kind == "nack":
        return "dead-letter" if requeue is False else "requeue"
    return "requeue" if requeue else "dead-letter"


def _delivery(queue: str, entries: list[wire.DeliveryEntryInfo], data: memoryview) -> Delivery:
    """A delivery as another node answered it (a forwarded get or browse)."""
    got = tuple(DeliveryEntry(e.tag, e.offset, e.delivery_count) for e in entries)
    return Delivery(queue=queue, consumer="", entries=got, data=bytes(data))


def queue_messages_router(ctx: GatewayContext) -> APIRouter:
    """Publishing to exchanges; getting, settling and dead letters of queues."""
    router = APIRouter(tags=["queues"])
    broker = ctx.broker

    @router.post(
        "/v1/exchanges/{name}/publish",
        response_model=QueuePublishResult,
        responses=queue_responses(404, 413, 422, 423, 429),
        openapi_extra={"requestBody": request_body(QueuePublishRequest)},
    )
    async def publish(request: Request, name: NamePath) -> Response:
        """Publish messages to an exchange (stored as one batch in every queue and topic it
        routes them to, fsynced for durable queues, before the answer): with ``mandatory``,
        refused (422) when nothing routes them; a full queue refuses them all (429)."""
        req = parse_body(QueuePublishRequest, await request.body())
        manager = broker.queues
        now = manager.clock()
        key = req.routing_key.encode("utf-8", "surrogatepass")
        routing = [(k, v.encode("utf-8", "surrogatepass")) for k, v in req.headers.items()]
        builder = BatchBuilder()
        for i, m in enumerate(req.messages):
            own = m.headers or {}
            headers = [
                (k, payload_bytes(v, req.encoding, f"messages.{i}.headers.{k}"))
                for k, v in own.items()
            ]
            headers += [(k, v) for k, v in routing if k not in own]
            builder.append(
                payload_bytes(m.value, req.encoding, f"messages.{i}.value"),
                timestamp_ms=now if m.timestamp is None else m.timestamp,
                key=key,
                headers=headers,
            )
        exchange = exchange_name(name)
        batch = builder.build()
        deliver_at_ms = now + req.delay_ms if req.delay_ms else req.deliver_at_ms
        try:
            result = await manager.publish(
                exchange,
                req.routing_key,
                batch,
                headers=req.headers or None,
                mandatory=req.mandatory,
                ttl_ms=req.ttl_ms,
                deliver_at_ms=deliver_at_ms,
                owner=HTTP_OWNER,
            )
        except NotLeaderError as exc:  # a cluster: the queue's owner stores it, for the caller
            forwarded = wire.QueuePublishRequest(
                exchange=exchange,
                routing_key=req.routing_key,
                headers=req.headers,
                mandatory=req.mandatory,
                ttl_ms=req.ttl_ms,
                deliver_at_ms=deliver_at_ms,
            )
            got, _ = await forward_to_server(ctx, exc, forwarded, [batch])
            queues: list[str] = list(got.queues)
            topics = [(t.topic, t.partition, t.base_offset) for t in got.topics]
            unroutable: bool = got.unroutable
        else:
            queues, topics, unroutable = list(result.queues), list(result.topics), result.unroutable
        return json_response(
            {
                "messages": len(req.messages),
                "queues": queues,
                "topics": [{"topic": t, "partition": p, "base_offset": o} for t, p, o in topics],
                "unroutable": unroutable,
            }
        )

    @router.post(
        "/v1/queues/{name}/get",
        response_model=GetResult,
        responses=queue_responses(404, 423),
        openapi_extra={"requestBody": request_body(GetRequest)},
    )
    async def get(request: Request, name: NamePath) -> Response:
        """Take up to ``max_messages`` ready messages (none: an empty list), waiting up to
        ``wait_ms`` for a first one. Settle each by its tag (ack, nack, reject); one not
        settled within ``visibility_timeout_ms`` (30,000 by default) is redelivered."""
        body = await request.body()
        req = parse_body(GetRequest, body or b"{}")
        wait_ms = 0 if ctx.closing.is_set() else min(req.wait_ms, broker.config.max_wait_ms)
        taking = asyncio.ensure_future(
            take(name, req.max_messages, wait_ms, req.visibility_timeout_ms)
        )
        delivery: Delivery | None = None
        try:
            # The gateway draining ends a wait: answered with nothing, at once.
            closing = asyncio.ensure_future(ctx.closing.wait())
            try:
                await asyncio.wait((taking, closing), return_when=asyncio.FIRST_COMPLETED)
            finally:
                await cancel_and_wait(closing)
            if taking.done():
                delivery = taking.result()
        finally:
            if not taking.done():
                await cancel_and_wait(taking)
        force = req.encoding == "base64"
        messages = [] if delivery is None else delivered(delivery)
        return json_response(
            {"queue": name, "messages": [message_doc(e, r, force) for e, r in messages]}
        )

    async def take(name: str, max_messages: int, wait_ms: int, visibility_ms: int) -> Delivery:
        """A get here, or on the queue's owner (another node of a cluster) for the caller."""
        try:
            return await broker.queues.get(
                name,
                owner=HTTP_OWNER,
                max_messages=max_messages,
                wait_ms=wait_ms,
                visibility_timeout_ms=visibility_ms,
            )
        except NotLeaderError as exc:
            request = wire.QueueGetRequest(
                queue=name,
                max_messages=max_messages,
                wait_ms=wait_ms,
                visibility_timeout_ms=visibility_ms,
            )
            got, data = await forward_to_server(ctx, exc, request)
            return _delivery(name, got.entries, data)

    def settle_route(kind: Settle) -> None:
        async def settle(request: Request, name: NamePath) -> Response:
            req = parse_body(SettleRequest, await request.body())
            outcome = _outcome(kind, req.requeue)
            try:
                await broker.queues.settle(
                    name, req.tags, outcome, owner=HTTP_OWNER, up_to=req.up_to
                )
            except NotLeaderError as exc:
                forwarded = wire.QueueSettleRequest(
                    queue=name, tags=req.tags, up_to=req.up_to, outcome=outcome
                )
                await forward_to_server(ctx, exc, forwarded)
            return json_response(
                {"queue": name, "outcome": outcome, "tags": req.tags, "up_to": req.up_to}
            )

        what = {
            "ack": "Acknowledge deliveries of HTTP gets: they are done, and removed.",
            "nack": "Refuse deliveries of HTTP gets: requeued (redelivered first), or with "
            "``requeue: false`` dead-lettered.",
            "reject": "Reject deliveries of HTTP gets: dead-lettered (to the queue's "
            "dead-letter exchange, or dropped without one), or with ``requeue: true`` "
            "requeued.",
        }[kind]
        settle.__doc__ = (
            f"{what} ``tags`` names them; ``up_to`` adds every tag up to it held by HTTP "
            "requests in this queue. Tags not held (settled already, or redelivered after "
            "their visibility timeout): 409 naming them, the others settled."
        )
        settle.__name__ = f"{kind}_messages"
        router.add_api_route(
            f"/v1/queues/{{name}}/{kind}",
            settle,
            methods=["POST"],
            response_model=SettleResult,
            responses=queue_responses(404, 409, 423),
            openapi_extra={"requestBody": request_body(SettleRequest)},
        )

    kinds: tuple[Settle, ...] = ("ack", "nack", "reject")
    for kind in kinds:
        settle_route(kind)

    # --- dead letters ---------------------------------------------------------------------------

    @router.get(
        "/v1/queues/{name}/dlq",
        response_model=BrowseResult,
        responses=queue_responses(404),
    )
    async def browse(
        name: NamePath,
        from_offset: Annotated[
            int, Query(ge=0, le=2**63 - 1, description="The first offset looked at.")
        ] = 0,
        max_messages: Annotated[int, Query(ge=1, le=MAX_BROWSE)] = DEFAULT_BROWSE,
        encoding: Annotated[Literal["auto", "base64"], Query()] = "auto",
    ) -> Response:
        """A queue's ready messages from ``from_offset`` on, without delivering them (a
        dead-letter queue's, typically: each with its ``x-death`` header); ``next_offset``
        is where the next page starts."""
        try:
            d = broker.queues.browse(name, from_offset=from_offset, max_messages=max_messages)
        except NotLeaderError as exc:
            request = wire.QueueBrowseRequest(
                queue=name, from_offset=from_offset, max_messages=max_messages
            )
            got, data = await forward_to_server(ctx, exc, request)
            d = _delivery(name, got.entries, data)
        recs = delivered(d)
        force = encoding == "base64"
        next_offset = max((r.offset for _, r in recs), default=from_offset - 1) + 1
        return json_response(
            {
                "queue": name,
                "messages": [browsed_doc(r, force) for _, r in recs],
                "next_offset": max(next_offset, from_offset),
            }
        )

    @router.post(
        "/v1/queues/{name}/dlq/replay",
        response_model=MessageCount,
        responses=queue_responses(404),
        openapi_extra={"requestBody": request_body(ReplayRequest)},
    )
    async def replay(request: Request, name: NamePath) -> Response:
        """Move dead letters (``offsets``; or the ready ones in ``[from_offset,
        to_offset)``; or ``all``) back to the queue their newest ``x-death`` entry names,
        through the default exchange, headers kept; answers how many moved."""
        req = parse_body(ReplayRequest, await request.body())
        manager = broker.queues
        try:
            if req.offsets is not None:
                moved = await manager.replay(name, offsets=req.offsets)
            elif req.all:
                moved = await manager.replay(name)
            else:
                moved = await manager.replay(
                    name, from_offset=req.from_offset or 0, to_offset=req.to_offset
                )
        except NotLeaderError as exc:
            got, _ = await forward_to_server(ctx, exc, _replay_request(name, req))
            moved = got.messages
        return json_response({"queue": name, "messages": moved})

    @router.post(
        "/v1/queues/{name}/dlq/purge",
        response_model=MessageCount,
        responses=queue_responses(404, 423),
    )
    async def purge_dead_letters(name: NamePath) -> Response:
        """Remove a (dead-letter) queue's ready messages; answers how many went."""
        return json_response({"queue": name, "messages": await purge(ctx, name)})

    return router


def _replay_request(name: str, req: ReplayRequest) -> wire.QueueReplayRequest:
    """The binary protocol's form of a replay (``offsets``; else ``all`` or a range)."""
    if req.offsets is not None:
        return wire.QueueReplayRequest(queue=name, offsets=req.offsets)
    if req.all:
        return wire.QueueReplayRequest(queue=name)
    to = -1 if req.to_offset is None else req.to_offset
    return wire.QueueReplayRequest(queue=name, from_offset=req.from_offset or 0, to_offset=to)


async def purge(ctx: GatewayContext, name: str) -> int:
    """Purge queue ``name`` here, or on its owner (another node of a cluster) for the
    caller; how many messages went."""
    try:
        return await ctx.broker.queues.purge_queue(name, owner=HTTP_OWNER)
    except NotLeaderError as exc:
        got, _ = await forward_to_server(ctx, exc, wire.QueuePurgeRequest(name=name))
        return int(got.messages)
