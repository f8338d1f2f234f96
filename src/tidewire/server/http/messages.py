"""``/v1/topics/{topic}/messages``: publish (one message, or a batch stored atomically per
partition, with ``Idempotency-Key``; see publisher.py) and read (one partition from an offset,
with long-poll; every partition from a time)."""

from __future__ import annotations

import asyncio
from typing import Annotated, Literal

from fastapi import APIRouter, Header, Path, Query, Request
from starlette.responses import Response

from tidewire._tasks import cancel_and_wait
from tidewire.errors import PartitionCorruptError, UnknownTopicError
from tidewire.server.http._common import json_response, parse_body, request_body, responses
from tidewire.server.http.context import GatewayContext
from tidewire.server.http.idempotency import MAX_KEY_CHARS
from tidewire.server.http.models import (
    BatchPublishRequest,
    BatchPublishResult,
    MessagePage,
    PublishRequest,
    PublishResult,
    TimeRangePage,
)
from tidewire.server.http.reading import StoredRecord, message_doc, read_partition

__all__ = ["MAX_READ_LIMIT", "messages_router"]

#: The most messages one read returns.
MAX_READ_LIMIT = 10_000
#: Damaged ranges one read with ``skip_damaged`` passes at most (each costs a read).
MAX_GAPS_PER_READ = 16
#: Default of ``limit``.
DEFAULT_READ_LIMIT = 100

IdempotencyKey = Annotated[
    str | None,
    Header(
        alias="Idempotency-Key",
        max_length=MAX_KEY_CHARS,
        description="A retry with the same key (per topic) is stored once: see docs/http.md.",
    ),
]
TopicPath = Annotated[str, Path(description="The topic.")]


def messages_router(ctx: GatewayContext) -> APIRouter:
    """Publishing and reading messages."""
    router = APIRouter(prefix="/v1/topics/{topic}", tags=["messages"])
    broker = ctx.broker
    publisher = ctx.publisher

    @router.post(
        "/messages",
        status_code=201,
        response_model=PublishResult,
        responses=responses(404, 409, 413, 422),
        openapi_extra={"requestBody": request_body(PublishRequest)},
    )
    async def publish(
        request: Request,
        topic: TopicPath,
        idempotency_key: IdempotencyKey = None,
    ) -> Response:
        """Publish one message; answer its partition and offset."""
        body = await publisher.publish_one(topic, await request.body(), idempotency_key)
        return Response(body, status_code=201, media_type="application/json")

    @router.post(
        "/messages:batch",
        status_code=201,
        response_model=BatchPublishResult,
        responses=responses(404, 409, 413, 422),
        openapi_extra={"requestBody": request_body(BatchPublishRequest)},
    )
    async def publish_batch(
        request: Request,
        topic: TopicPath,
        idempotency_key: IdempotencyKey = None,
    ) -> Response:
        """Publish several messages: those of one partition are stored as one batch, all or
        none; answer each message's partition and offset, in the order sent."""
        req = parse_body(BatchPublishRequest, await request.body())
        got = await publisher.publish(topic, req.messages, req.encoding, idempotency_key)
        return json_response({"results": [{"offset": o, "partition": p} for p, o in got]}, 201)

    @router.get(
        "/partitions/{partition}/messages",
        response_model=MessagePage,
        responses=responses(404, 416, 422),
    )
    async def read(
        *,
        topic: TopicPath,
        partition: Annotated[int, Path(ge=0, le=2**31 - 1)],
        offset: Annotated[
            int | None,
            Query(ge=0, le=2**63 - 1, description="The first offset (the oldest if absent)."),
        ] = None,
        limit: Annotated[int, Query(ge=1, le=MAX_READ_LIMIT)] = DEFAULT_READ_LIMIT,
        wait_ms: Annotated[
            int,
            Query(
                ge=0,
                le=3_600_000,
                description="Long-poll: wait up to this long (ms) when "
                "nothing is there yet (capped by the broker's max_wait_ms).",
            ),
        ] = 0,
        encoding: Annotated[Literal["auto", "base64"], Query()] = "auto",
        skip_damaged: Annotated[
            bool,
            Query(
                description="Read past damaged ranges of the log (answered 422 otherwise), "
                "listing each one skipped in gaps."
            ),
        ] = False,
    ) -> Response:
        """Messages of one partition from ``offset``; with ``wait_ms``, wait for the first
        one when there is none yet (answered as soon as one is published)."""
        plog = broker.log(topic, partition)
        start = plog.log_start_offset if offset is None else offset
        gaps: list[dict[str, int]] = []
        for _ in range(MAX_GAPS_PER_READ):
            try:
                recs, next_offset = read_partition(broker, topic, partition, start, limit=limit)
                break
            except PartitionCorruptError as exc:
                if not skip_damaged or exc.damage_end <= start:
                    raise
                gaps.append({"start": max(exc.damage_start, start), "end": exc.damage_end})
                start = exc.damage_end
        else:
            recs, next_offset = [], start  # as many gaps as one read reports: go on from here
        if not recs and wait_ms > 0:
            recs, next_offset = await _long_poll(
                ctx, topic, partition, offset=start, limit=limit, wait_ms=wait_ms
            )
        doc: dict[str, object] = {
            "messages": [message_doc(r, encoding) for r in recs],
            "next_offset": next_offset,
            "high_watermark": broker.high_watermark(topic, partition),
        }
        if gaps:
            doc["gaps"] = gaps
        return json_response(doc)

    @router.get("/messages", response_model=TimeRangePage, responses=responses(404))
    async def read_since(
        *,
        topic: TopicPath,
        since: Annotated[
            int,
            Query(ge=0, le=2**63 - 1, description="ms since the epoch: messages at or after."),
        ] = 0,
        limit: Annotated[int, Query(ge=1, le=MAX_READ_LIMIT)] = DEFAULT_READ_LIMIT,
        encoding: Annotated[Literal["auto", "base64"], Query()] = "auto",
    ) -> Response:
        """Messages of every partition whose timestamp is at or after ``since`` (found by the
        time index), up to ``limit`` in all, ordered by timestamp; ``next_offsets`` says where
        each partition continues."""
        if topic not in broker.topics():
            raise UnknownTopicError(f"topic {topic!r} does not exist")
        recs: list[StoredRecord] = []
        starts: dict[int, int] = {}
        for p in range(broker.partition_count(topic)):
            starts[p] = broker.list_offset(topic, p, since)
            got, _ = read_partition(broker, topic, p, starts[p], limit=limit)
            recs += got
        recs.sort(key=lambda r: (r.timestamp, r.partition, r.offset))
        del recs[limit:]
        next_offsets = dict(starts)
        for r in recs:
            next_offsets[r.partition] = r.offset + 1
        return json_response(
            {
                "messages": [message_doc(r, encoding) for r in recs],
                "next_offsets": {str(p): o for p, o in next_offsets.items()},
            }
        )

    return router


async def _long_poll(
    ctx: GatewayContext, topic: str, partition: int, *, offset: int, limit: int, wait_ms: int
) -> tuple[list[StoredRecord], int]:
    """Wait (up to ``wait_ms``, the broker's ``max_wait_ms`` at most) for records at
    ``offset``; return what is there then. The gateway's drain ends the wait at once."""
    broker = ctx.broker
    loop = asyncio.get_running_loop()
    deadline = loop.time() + min(wait_ms, broker.config.max_wait_ms) / 1000
    closing = loop.create_task(ctx.closing.wait())
    try:
        while not ctx.closing.is_set():
            left = deadline - loop.time()
            if left <= 0:
                break
            waiter = loop.create_task(broker.wait_for_data([(topic, partition)], left))
            await asyncio.wait({waiter, closing}, return_when=asyncio.FIRST_COMPLETED)
            if not waiter.done():
                await cancel_and_wait(waiter)
            else:
                waiter.result()  # BackpressureError: too many waiting
            recs, next_offset = read_partition(broker, topic, partition, offset, limit=limit)
            if recs:
                return recs, next_offset
    finally:
        await cancel_and_wait(closing)
    return read_partition(broker, topic, partition, offset, limit=limit)
