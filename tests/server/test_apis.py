"""Every API over the wire, answered by a real broker: api versions, ping, producer ids,
metadata, the topic APIs with the error codes of their response bodies, and well-framed
requests that fail alone (unknown API, unsupported version, a body that is not the schema)
while the connection goes on.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import msgspec

from tests.server._support import PROMPT_S, Client, serve
from tidewire.errors import (
    InvalidConfigError,
    InvalidRequestError,
    InvalidTopicError,
    ProducerFencedError,
    TopicExistsError,
    UnknownApiError,
    UnknownTopicError,
    UnsupportedVersionError,
)
from tidewire.protocol.frames import FLAG_ERROR, FrameType, encode_frame
from tidewire.protocol.messages import (
    PUSH_SCHEMAS,
    AlterTopicRequest,
    AlterTopicResponse,
    ApiKey,
    ApiVersionsRequest,
    ApiVersionsResponse,
    CreateTopicRequest,
    CreateTopicResponse,
    DeleteTopicRequest,
    DeleteTopicResponse,
    DescribeTopicRequest,
    DescribeTopicResponse,
    ErrorBody,
    InitProducerIdRequest,
    InitProducerIdResponse,
    ListTopicsRequest,
    ListTopicsResponse,
    MetadataRequest,
    MetadataResponse,
    PingRequest,
    PingResponse,
    TopicConfig,
    decode_body,
)
from tidewire.server.gate import SESSION_APIS
from tidewire.server.handlers import HANDLERS
from tidewire.server.push import PUSH_APIS
from tidewire.server.queue_handlers import QUEUE_APIS

#: What this server answers: every API.
SERVED = set(ApiKey)


def test_api_versions_lists_exactly_the_served_apis(tmp_path: Path) -> None:
    async def main() -> None:
        async with serve(tmp_path) as (_, server), Client.connect(server) as c:
            resp = await c.call(ApiVersionsRequest(client_name="tests", client_version="0"))
            assert isinstance(resp, ApiVersionsResponse)
            assert resp.server_version
            keys = [a.api_key for a in resp.apis]
            assert len(keys) == len(set(keys))
            assert set(keys) == SERVED
            # ENVELOPE: answered by the listener itself (server/envelope.py).
            listener = {ApiKey.ENVELOPE}
            served = set(HANDLERS) | PUSH_APIS | SESSION_APIS | QUEUE_APIS | set(PUSH_SCHEMAS)
            assert served | listener == SERVED
            assert all((a.min_version, a.max_version) == (0, 0) for a in resp.apis)

    asyncio.run(main())


def test_ping_and_init_producer_id(tmp_path: Path) -> None:
    async def main() -> None:
        async with serve(tmp_path) as (_, server), Client.connect(server) as c:
            assert isinstance(await c.call(PingRequest()), PingResponse)
            first = await c.call(InitProducerIdRequest())
            second = await c.call(InitProducerIdRequest())
            assert isinstance(first, InitProducerIdResponse)
            assert (first.producer_epoch, second.producer_epoch) == (0, 0)
            assert second.producer_id != first.producer_id
            bumped = await c.call(
                InitProducerIdRequest(producer_id=first.producer_id, producer_epoch=0)
            )
            assert (bumped.producer_id, bumped.producer_epoch) == (first.producer_id, 1)
            stale = await c.call(
                InitProducerIdRequest(producer_id=first.producer_id, producer_epoch=0)
            )
            assert stale.error_code == ProducerFencedError.code
            never = await c.call(InitProducerIdRequest(producer_id=10**9, producer_epoch=0))
            assert never.error_code == InvalidRequestError.code
            assert "never handed out" in never.error_message
            await c.ping()  # errors in the body leave the connection as it was

    asyncio.run(main())


def test_topic_lifecycle(tmp_path: Path) -> None:
    async def main() -> None:
        async with serve(tmp_path) as (broker, server), Client.connect(server) as c:
            resp = await c.call(CreateTopicRequest(name="orders", partitions=3))
            assert resp == CreateTopicResponse()
            assert broker.topics() == {"orders": 3}
            await c.call(CreateTopicRequest(name="audit"))  # the broker's default count: 1

            listed = await c.call(ListTopicsRequest())
            assert listed == ListTopicsResponse(topics=["audit", "orders"])

            described = await c.call(DescribeTopicRequest(name="orders"))
            assert isinstance(described, DescribeTopicResponse)
            assert described.error_code == 0
            assert described.topic is not None
            assert described.topic.name == "orders"
            assert [p.partition for p in described.topic.partitions] == [0, 1, 2]
            for p in described.topic.partitions:
                assert (p.log_start_offset, p.log_end_offset, p.high_watermark) == (0, 0, 0)
                assert p.error_code == 0
            default_retention = described.topic.config.retention_ms
            assert default_retention == broker.config.log.retention_ms

            altered = await c.call(
                AlterTopicRequest(
                    name="orders", partitions=5, config=TopicConfig(retention_ms=60_000)
                )
            )
            assert altered == AlterTopicResponse()
            described = await c.call(DescribeTopicRequest(name="orders"))
            assert described.topic is not None
            assert [p.partition for p in described.topic.partitions] == [0, 1, 2, 3, 4]
            assert described.topic.config.retention_ms == 60_000
            assert broker.log("orders", 4).config.retention_ms == 60_000

            # The same count again changes nothing and is no error.
            assert await c.call(AlterTopicRequest(name="orders", partitions=5)) == (
                AlterTopicResponse()
            )

            assert await c.call(DeleteTopicRequest(name="orders")) == DeleteTopicResponse()
            assert await c.call(ListTopicsRequest()) == ListTopicsResponse(topics=["audit"])
            assert "orders" not in broker.topics()

    asyncio.run(main())


def test_topic_api_errors_are_in_the_response_bodies(tmp_path: Path) -> None:
    async def main() -> None:
        async with serve(tmp_path) as (broker, server), Client.connect(server) as c:
            await c.call(CreateTopicRequest(name="t", partitions=2))

            cases = [
                (CreateTopicRequest(name="t", partitions=1), TopicExistsError),
                (CreateTopicRequest(name="bad/name"), InvalidTopicError),
                (CreateTopicRequest(name="", partitions=1), InvalidTopicError),
                (CreateTopicRequest(name="zero", partitions=0), InvalidTopicError),
                (CreateTopicRequest(name="neg", partitions=-3), InvalidTopicError),
                (
                    CreateTopicRequest(name="cfg", config=TopicConfig(fsync="sometimes")),
                    InvalidConfigError,
                ),
                (DescribeTopicRequest(name="nope"), UnknownTopicError),
                (DeleteTopicRequest(name="nope"), UnknownTopicError),
                (AlterTopicRequest(name="nope", partitions=4), UnknownTopicError),
                (AlterTopicRequest(name="t", partitions=1), InvalidTopicError),
                (
                    AlterTopicRequest(name="t", config=TopicConfig(fsync="sometimes")),
                    InvalidConfigError,
                ),
            ]
            for request, error in cases:
                event = await c.rpc(request)
                # A refused topic operation is a normal response with the code in its body,
                # not an error frame.
                assert event.error is None, (request, event.error)
                assert event.body.error_code == error.code, (request, event.body)
                assert event.body.error_message, request
            assert {70, 71, 72} <= {e.code for _, e in cases}

            # Nothing was changed by the refused requests.
            assert broker.topics() == {"t": 2}
            described = await c.call(DescribeTopicRequest(name="t"))
            assert described.topic.config.fsync == str(broker.config.log.fsync)

    asyncio.run(main())


def test_metadata(tmp_path: Path) -> None:
    async def main() -> None:
        async with serve(tmp_path) as (_, server), Client.connect(server) as c:
            await c.call(CreateTopicRequest(name="b", partitions=2))
            await c.call(CreateTopicRequest(name="a", partitions=1))

            everything = await c.call(MetadataRequest())
            assert isinstance(everything, MetadataResponse)
            assert (everything.host, everything.port) == ("127.0.0.1", server.port)
            assert everything.broker_id == 0
            assert [t.name for t in everything.topics] == ["a", "b"]
            assert [len(t.partitions) for t in everything.topics] == [1, 2]
            assert all(t.error_code == 0 for t in everything.topics)

            some = await c.call(MetadataRequest(topics=["b", "missing"]))
            b, missing = some.topics
            assert (b.name, b.error_code, len(b.partitions)) == ("b", 0, 2)
            assert (missing.name, missing.error_code) == ("missing", UnknownTopicError.code)
            assert missing.partitions == []

            assert (await c.call(MetadataRequest(topics=[]))).topics == []

    asyncio.run(main())


def _raw_request(api_key: int, version: int, corr: int, body: bytes) -> bytes:
    return b"".join(bytes(b) for b in encode_frame(FrameType.REQUEST, api_key, version, corr, body))


def test_rejected_requests_fail_alone(tmp_path: Path) -> None:
    """Unknown API key (52), unsupported version (53), a body that does not match its schema
    (54): an error response echoing key, version and correlation id; the connection goes on."""
    empty = msgspec.msgpack.encode({})
    cases = [
        (99, 0, empty, UnknownApiError.code),
        (ApiKey.PING, 1, empty, UnsupportedVersionError.code),
        (ApiKey.CREATE_TOPIC, 0, empty, InvalidRequestError.code),  # no name
        (ApiKey.CREATE_TOPIC, 0, msgspec.msgpack.encode({"name": 5}), InvalidRequestError.code),
        (ApiKey.PING, 0, b"\xc1", InvalidRequestError.code),  # never valid msgpack
        (ApiKey.PING, 0, empty + b"\x00", InvalidRequestError.code),  # trailing bytes
    ]

    async def main() -> None:
        async with serve(tmp_path) as (_, server), Client.connect(server) as c:
            for i, (key, version, body, code) in enumerate(cases):
                corr = 1000 + i
                c.writer.write(_raw_request(key, version, corr, body))
                await c.writer.drain()
                header = await asyncio.wait_for(c.reader.readexactly(18), PROMPT_S)
                length = int.from_bytes(header[:4], "big")
                rest = await asyncio.wait_for(c.reader.readexactly(length - 14), PROMPT_S)
                assert header[4] == FrameType.RESPONSE
                assert header[5] == FLAG_ERROR
                assert int.from_bytes(header[6:8], "big", signed=True) == key
                assert int.from_bytes(header[8:10], "big", signed=True) == version
                assert int.from_bytes(header[10:14], "big", signed=True) == corr
                err = decode_body(ErrorBody, rest)
                assert err.error_code == code, (key, version, body, err)
            await c.ping()

    asyncio.run(main())
