"""``/v1/topics/{topic}/messages``: publish (one message, or a batch stored atomically per
partition, with ``Idempotency-Key``; see publisher.py) and read (one partition from an offset,
with long-poll; every partition from a time)."""

from __future__ import annotations

import asyncio
import csv
import io
import json
from collections.abc import Awaitable, Callable
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Header, Path, Query, Request
from starlette.responses import Response

from tidewire._tasks import cancel_and_wait
from tidewire.cluster import cluster_node
from tidewire.errors import (
    InvalidRequestError,
    NotLeaderError,
    PartitionCorruptError,
    UnknownTopicError,
)
from tidewire.server.http._common import json_response, parse_body, request_body, responses
from tidewire.server.http.cluster import (
    no_redirect,
    partition_count,
    require_replica,
    topic_partition_count,
)
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
from tidewire.server.http.peers import PeerClient
from tidewire.server.http.reading import (
    StoredRecord,
    fetch_remote,
    message_doc,
    read_partition,
    read_remote,
)

__all__ = ["MAX_READ_LIMIT", "messages_router"]

#: The most messages one read returns.
MAX_READ_LIMIT = 10_000
#: Damaged ranges one read with ``skip_damaged`` passes at most (each costs a read).
MAX_GAPS_PER_READ = 16
#: Default of ``limit``.
DEFAULT_READ_LIMIT = 100
#: Records a filtered read (``q``, ``key``) looks at by default, and at most: a search of a
#: large log is done page by page (``next_offset`` goes on), each bounded so one request never
#: holds the event loop for long (100,000 small records: tens of ms of decoding).
DEFAULT_MAX_SCAN = 10_000
MAX_SCAN = 100_000
#: The columns of a CSV export.
CSV_COLUMNS = ("partition", "offset", "timestamp", "key", "value", "headers", "encoding")

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
    # In a cluster: a publish led elsewhere is answered 307 (else forwarded; never a 307).
    redirect = ctx.config.http_cluster_routing == "redirect"

    @router.post(
        "/messages",
        status_code=201,
        response_model=PublishResult,
        responses=responses(307, 404, 409, 413, 422),
        openapi_extra={"requestBody": request_body(PublishRequest)},
    )
    async def publish(
        request: Request,
        topic: TopicPath,
        idempotency_key: IdempotencyKey = None,
    ) -> Response:
        """Publish one message; answer its partition and offset."""
        try:
            body = await publisher.publish_one(topic, await request.body(), idempotency_key)
        except NotLeaderError as exc:
            raise exc if redirect else no_redirect(exc) from None
        return Response(body, status_code=201, media_type="application/json")

    @router.post(
        "/messages:batch",
        status_code=201,
        response_model=BatchPublishResult,
        responses=responses(307, 404, 409, 413, 422),
        openapi_extra={"requestBody": request_body(BatchPublishRequest)},
    )
    async def publish_batch(
        request: Request,
        topic: TopicPath,
        idempotency_key: IdempotencyKey = None,
    ) -> Response:
        """Publish several messages: those of one partition are stored as one batch, all or
        none; answer each message's partition and offset, in the order sent."""
        body = await request.body()
        req = parse_body(BatchPublishRequest, body)
        try:
            got = await publisher.publish(
                topic, req.messages, req.encoding, idempotency_key, body=body
            )
        except NotLeaderError as exc:
            raise exc if redirect else no_redirect(exc) from None
        return json_response({"results": [{"offset": o, "partition": p} for p, o in got]}, 201)

    @router.get(
        "/partitions/{partition}/messages",
        response_model=MessagePage,
        responses=responses(307, 404, 416, 422),
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
        from_timestamp: Annotated[
            int | None,
            Query(
                ge=0,
                le=2**63 - 1,
                description="Start at the first message at or after this time (ms since the "
                "epoch; found by the time index) instead of offset.",
            ),
        ] = None,
        q: Annotated[
            str | None,
            Query(
                min_length=1,
                max_length=1024,
                description="Only messages whose key or value (decoded as UTF-8, invalid "
                "bytes replaced) contains this text, case-insensitively.",
            ),
        ] = None,
        key: Annotated[
            str | None,
            Query(max_length=65_536, description="Only messages with exactly this key (UTF-8)."),
        ] = None,
        max_scan: Annotated[
            int,
            Query(
                ge=1,
                le=MAX_SCAN,
                description="With q or key: records looked at, at most (the answer's scanned).",
            ),
        ] = DEFAULT_MAX_SCAN,
        format: Annotated[
            Literal["page", "json", "csv"],
            Query(
                description="page: this JSON page; json or csv: the same messages as a file "
                "to save (Content-Disposition: attachment), a JSON array or CSV rows of "
                + ", ".join(CSV_COLUMNS)
                + "."
            ),
        ] = "page",
    ) -> Response:
        """Messages of one partition from ``offset`` (or ``from_timestamp``); with
        ``wait_ms``, wait for the first one when there is none yet (answered as soon as one
        is published). With ``q`` or ``key``, only the messages that match, looking at up to
        ``max_scan`` records (``scanned``; ``next_offset`` continues the search); no
        long-poll then. ``format`` json or csv exports the messages as a file."""
        if offset is not None and from_timestamp is not None:
            raise InvalidRequestError("give offset or from_timestamp, not both")
        peer = _peer_for_read(ctx, topic, partition)
        if peer is None:
            require_replica(broker, topic, partition)  # a cluster: else redirected (307)
        gaps: list[dict[str, int]] = []
        high = -1  # the leader's high watermark, as its last fetch answered (remote reads)

        async def read_once(at: int, count: int, wait: int) -> tuple[list[StoredRecord], int]:
            nonlocal high
            if peer is None:
                return read_partition(broker, topic, partition, at, limit=count)
            recs, after, high = await fetch_remote(
                peer, topic, partition, at, limit=count, max_wait_ms=wait
            )
            return recs, after

        async def read_from(at: int, count: int, wait: int = 0) -> tuple[list[StoredRecord], int]:
            for _ in range(MAX_GAPS_PER_READ):
                try:
                    return await read_once(at, count, wait)
                except PartitionCorruptError as exc:
                    if not skip_damaged or exc.damage_end <= at:
                        raise
                    gaps.append({"start": max(exc.damage_start, at), "end": exc.damage_end})
                    at = exc.damage_end
            return [], at  # as many gaps as one read reports: go on from here

        try:
            if peer is not None and offset is None:  # held elsewhere: as its leader answers
                at = -2 if from_timestamp is None else from_timestamp  # -2: the log start
                start = await peer.list_offset(topic, partition, at)
            elif peer is not None and offset is not None:
                start = offset
            elif from_timestamp is not None:
                start = broker.list_offset(topic, partition, from_timestamp)
            else:
                start = broker.log(topic, partition).log_start_offset if offset is None else offset
            scanned: int | None = None
            if q is None and key is None:
                recs, next_offset = await read_from(start, limit)
                if not recs and wait_ms > 0 and not gaps:
                    if peer is None:
                        recs, next_offset = await _long_poll(
                            ctx, topic, partition, offset=start, limit=limit, wait_ms=wait_ms
                        )
                    else:
                        wait = min(wait_ms, broker.config.max_wait_ms)
                        recs, next_offset = await read_from(start, limit, wait)
            else:
                recs, next_offset, scanned = await _search(
                    read_from, start, limit=limit, max_scan=max_scan, q=q, key=key
                )
            if peer is not None and high < 0:
                high = await peer.list_offset(topic, partition, -1)
        finally:
            if peer is not None:
                await peer.close()
        docs = [message_doc(r, encoding) for r in recs]
        if format != "page":
            name = f"{topic}-{partition}-{start}"
            return _export(docs, format, name)
        doc: dict[str, object] = {
            "messages": docs,
            "next_offset": next_offset,
            "high_watermark": broker.high_watermark(topic, partition) if peer is None else high,
        }
        if gaps:
            doc["gaps"] = gaps
        if scanned is not None:
            doc["scanned"] = scanned
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
        each partition continues. In a cluster any node answers: partitions it holds no
        replica of are read from their leaders."""
        node = cluster_node(broker)
        if node is None and topic not in broker.topics():
            raise UnknownTopicError(f"topic {topic!r} does not exist")
        recs: list[StoredRecord] = []
        starts: dict[int, int] = {}
        peer: PeerClient | None = None
        try:
            for p in range(topic_partition_count(broker, topic)):
                if node is None or (topic, p) in broker.logs.logs:
                    starts[p] = broker.list_offset(topic, p, since)
                    got, _ = read_partition(broker, topic, p, starts[p], limit=limit)
                else:  # a cluster's partition held elsewhere: from its leader
                    peer = peer or PeerClient(node)
                    starts[p] = await peer.list_offset(topic, p, since)
                    got = await read_remote(peer, topic, p, starts[p], limit=limit)
                recs += got
        finally:
            if peer is not None:
                await peer.close()
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


async def _search(
    read_from: Callable[[int, int], Awaitable[tuple[list[StoredRecord], int]]],
    start: int,
    *,
    limit: int,
    max_scan: int,
    q: str | None,
    key: str | None,
) -> tuple[list[StoredRecord], int, int]:
    """The first ``limit`` records from ``start`` that match ``q`` and ``key``, looking at
    ``max_scan`` records at most: (matches, the offset after the last record looked at,
    records looked at)."""
    needle = q.casefold() if q is not None else None
    key_bytes = key.encode() if key is not None else None
    found: list[StoredRecord] = []
    scanned = 0
    at = start
    while scanned < max_scan and len(found) < limit:
        chunk, after = await read_from(at, min(MAX_READ_LIMIT, max_scan - scanned))
        if not chunk:
            at = after
            break
        for r in chunk:
            scanned += 1
            at = r.offset + 1
            if _matches(r, needle, key_bytes):
                found.append(r)
                if len(found) >= limit:
                    break
        await asyncio.sleep(0)  # a long scan lets the other requests run between chunks
    return found, at, scanned


def _matches(r: StoredRecord, needle: str | None, key: bytes | None) -> bool:
    if key is not None and r.key != key:
        return False
    if needle is None:
        return True
    return any(
        data is not None and needle in data.decode("utf-8", "replace").casefold()
        for data in (r.key, r.value)
    )


def _export(docs: list[dict[str, Any]], format: str, name: str) -> Response:
    """``docs`` as a file to save: a JSON array, or CSV with a header row (headers as a
    JSON object)."""
    if format == "json":
        body = json.dumps(docs, ensure_ascii=False, indent=1).encode()
        media = "application/json"
    else:
        out = io.StringIO()
        writer = csv.writer(out)
        writer.writerow(CSV_COLUMNS)
        for d in docs:
            row = {**d, "headers": json.dumps(d["headers"], ensure_ascii=False)}
            writer.writerow(["" if row[c] is None else row[c] for c in CSV_COLUMNS])
        body = out.getvalue().encode()
        media = "text/csv; charset=utf-8"
    safe = "".join(c if c.isalnum() or c in "._-" else "_" for c in name)
    return Response(
        body,
        media_type=media,
        headers={"Content-Disposition": f'attachment; filename="{safe}.{format}"'},
    )


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


def _peer_for_read(ctx: GatewayContext, topic: str, partition: int) -> PeerClient | None:
    """In a cluster forwarding requests (``http_cluster_routing = "forward"``): a client to
    read a partition of which this node holds no replica from its leader (the caller closes
    it); None when the node reads it itself (or redirects)."""
    broker = ctx.broker
    node = cluster_node(broker)
    if node is None or (topic, partition) in broker.logs.logs:
        return None
    if ctx.config.http_cluster_routing != "forward":
        return None
    n = partition_count(broker, topic)  # UnknownTopicError: 404
    if n is None or partition >= n:
        return None  # the read answers "no such partition" itself
    return PeerClient(node)
