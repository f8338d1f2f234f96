"""The Kafka listener over a socket: ApiVersions (and KIP-511's answer to a version it does
not know), versions outside the advertised ranges, garbage and oversized frames closing
that connection alone, answers in request order, a long-poll that holds back neither other
connections nor the requests behind it on its own, the idle timeout, and the drain."""

from __future__ import annotations

import asyncio
import re
import socket
import struct
from pathlib import Path

from tests.kafka._support import (
    ANSWER_S,
    Wire,
    aio,
    batch,
    fetch_body,
    kafka_broker,
    produce_body,
    until,
    wire,
)
from tidewire.observability.kafka_metrics import kafka_stats_for
from tidewire.protocol.kafka import SUPPORTED, ApiKey, ErrorCode, RequestHeader, encode_request
from tidewire.server.kafka.dispatch import registry
from tidewire.server.tcp import ServerConfig


@aio
async def test_api_versions_lists_what_is_served(tmp_path: Path) -> None:
    handlers, _ = registry()
    async with kafka_broker(tmp_path) as (_, k), wire(k.port) as w:
        for version in (0, 1, 2):
            got = await w.call(ApiKey.API_VERSIONS, version, {})
            assert got["error_code"] == ErrorCode.NONE
            ranges = {a["api_key"]: (a["min_version"], a["max_version"]) for a in got["api_keys"]}
            assert ranges == {key: SUPPORTED[key] for key in handlers if key in SUPPORTED}
            assert ranges[ApiKey.PRODUCE] == SUPPORTED[ApiKey.PRODUCE]


@aio
async def test_api_versions_above_the_supported_answers_in_the_v0_layout(tmp_path: Path) -> None:
    # KIP-511: librdkafka asks with v3 first; the answer is v0's layout, UNSUPPORTED_VERSION
    # and the ranges, so it retries with a version it finds there.
    async with kafka_broker(tmp_path) as (_, k), wire(k.port) as w:
        cid = await w.send(ApiKey.API_VERSIONS, 3, {"client_software_name": "x"})
        got_cid, got = await w.receive(ApiKey.API_VERSIONS, 0)
        assert got_cid == cid
        assert got["error_code"] == ErrorCode.UNSUPPORTED_VERSION
        keys = {a["api_key"] for a in got["api_keys"]}
        assert {ApiKey.API_VERSIONS, ApiKey.PRODUCE, ApiKey.FETCH, ApiKey.METADATA} <= keys
        # The connection goes on working.
        assert (await w.call(ApiKey.API_VERSIONS, 2, {}))["error_code"] == ErrorCode.NONE


@aio
async def test_a_version_outside_the_advertised_range(tmp_path: Path) -> None:
    async with kafka_broker(tmp_path) as (_, k):
        # InitProducerId v2 has a schema but is not advertised; its answer has an error code.
        assert SUPPORTED[ApiKey.INIT_PRODUCER_ID][1] < 2
        async with wire(k.port) as w:
            got = await w.call(ApiKey.INIT_PRODUCER_ID, 2, {"transactional_id": None})
            assert got["error_code"] == ErrorCode.UNSUPPORTED_VERSION
            assert (await w.call(ApiKey.API_VERSIONS, 0, {}))["error_code"] == 0
        # Produce v2 (message format v1): its answer has no error code of its own: closed.
        async with wire(k.port) as w:
            await w.send(ApiKey.PRODUCE, 2, produce_body("t", 0, b""))
            assert await w.closed()
        # An API key the broker does not know at all: closed.
        async with wire(k.port) as w:
            w.writer.write(struct.pack(">ihhih", 10, 57, 0, 1, -1))
            assert await w.closed()


@aio
async def test_garbage_and_oversized_frames_close_that_connection_alone(tmp_path: Path) -> None:
    config = ServerConfig(port=0, kafka_port=0, max_frame_bytes=4096)
    async with kafka_broker(tmp_path, server=config) as (_, k), wire(k.port) as good:
        assert (await good.call(ApiKey.API_VERSIONS, 2, {}))["error_code"] == 0
        for junk in (
            struct.pack(">i", 1 << 20) + b"x" * 100,  # a size over max_frame_bytes
            struct.pack(">i", -5),  # a negative size
            struct.pack(">i", 7) + b"\x00\x03\x00\x05\xff\xff\xff",  # a truncated header
            struct.pack(">i", 12) + b"\x00\x03\x00\x05\x00\x00\x00\x01\x00\x09zz",  # bad body
            b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03",  # a TLS ClientHello
        ):
            async with wire(k.port) as bad:
                bad.writer.write(junk)
                assert await bad.closed()
        assert (await good.call(ApiKey.API_VERSIONS, 2, {}))["error_code"] == 0


@aio
async def test_answers_come_in_request_order_behind_a_long_poll(tmp_path: Path) -> None:
    async with kafka_broker(tmp_path) as (b, k), wire(k.port) as w, wire(k.port) as other:
        b.create_topic("t", 1)
        # A long-poll first, then a metadata request: the answers keep the requests' order,
        # and the long-poll does not hold back another connection.
        poll = await w.send(ApiKey.FETCH, 11, fetch_body("t", 0, 0, max_wait_ms=10_000))
        meta = await w.send(ApiKey.METADATA, 8, {"topics": None})
        got = await other.call(ApiKey.PRODUCE, 7, produce_body("t", 0, batch([b"wake"])))
        assert got["responses"][0]["partition_responses"][0]["error_code"] == 0
        cid, fetched = await w.receive(ApiKey.FETCH, 11)
        assert cid == poll
        assert fetched["responses"][0]["partitions"][0]["high_watermark"] == 1
        cid, _ = await w.receive(ApiKey.METADATA, 8)
        assert cid == meta


@aio
async def test_an_idle_connection_is_closed(tmp_path: Path) -> None:
    config = ServerConfig(port=0, kafka_port=0, idle_timeout_s=0.3)
    async with kafka_broker(tmp_path, server=config) as (_, k), wire(k.port) as w:
        assert (await w.call(ApiKey.API_VERSIONS, 2, {}))["error_code"] == 0
        assert await w.closed()


@aio
async def test_a_drain_answers_the_long_poll_then_closes(tmp_path: Path) -> None:
    async with kafka_broker(tmp_path) as (b, k):
        b.create_topic("t", 1)
        w = await Wire.connect(k.port)
        await w.send(ApiKey.FETCH, 11, fetch_body("t", 0, 0, max_wait_ms=30_000))
        await until(lambda: b.fetch_waiters == 1)
        closing = asyncio.create_task(k.close(grace_s=5.0))
        _, fetched = await w.receive(ApiKey.FETCH, 11)
        assert fetched["responses"][0]["partitions"][0]["error_code"] == 0
        assert await w.closed()
        await asyncio.wait_for(closing, ANSWER_S)
        await w.close()
        # No new connection is accepted.
        try:
            r, wr = await asyncio.open_connection("127.0.0.1", k.port)
        except OSError:
            pass
        else:
            wr.write(encode_request(RequestHeader(ApiKey.API_VERSIONS, 0, 1, None), {}))
            assert await Wire(r, wr).closed()
            wr.close()


@aio
async def test_metadata_advertises_the_configured_address(tmp_path: Path) -> None:
    config = ServerConfig(
        port=0, kafka_port=0, kafka_advertised_host="broker.example", kafka_advertised_port=19092
    )
    async with kafka_broker(tmp_path, server=config) as (_, k), wire(k.port) as w:
        got = await w.call(ApiKey.METADATA, 8, {"topics": None})
        assert got["brokers"] == [
            {"node_id": 0, "host": "broker.example", "port": 19092, "rack": None}
        ]
        assert got["controller_id"] == 0
        assert len(got["cluster_id"]) == 22
    async with kafka_broker(tmp_path) as (_, k), wire(k.port) as w:
        got = await w.call(ApiKey.METADATA, 8, {"topics": None})
        assert (got["brokers"][0]["host"], got["brokers"][0]["port"]) == ("127.0.0.1", k.port)


@aio
async def test_the_listener_reports_to_its_recorder(tmp_path: Path) -> None:
    """What /metrics, /v1/stats/kafka and the dashboard show moves with real traffic:
    connections, bytes, requests by API and version, and the refused versions."""
    async with kafka_broker(tmp_path) as (broker, k):
        stats = kafka_stats_for(broker)
        assert (stats.host, stats.port) == (k.host, k.port)
        async with wire(k.port) as w:
            await until(lambda: stats.connections == 1)
            assert (await w.call(ApiKey.API_VERSIONS, 2, {}))["error_code"] == 0
            assert (await w.call(ApiKey.METADATA, 8, {"topics": []}))["brokers"]
            got = await w.call(ApiKey.INIT_PRODUCER_ID, 2, {"transactional_id": None})
            assert got["error_code"] == ErrorCode.UNSUPPORTED_VERSION
        await until(lambda: stats.connections == 0)
        assert stats.accepted == 1
        assert stats.requests[("api_versions", "2")] == 1
        assert stats.requests[("metadata", "8")] == 1
        assert stats.errors[("init_producer_id", "unsupported_version")] == 1
        assert stats.received_bytes > 0
        assert stats.sent_bytes > stats.received_bytes  # the answers are the longer
        latency = stats.latency("metadata")
        assert latency is not None
        assert latency[2] == 1


@aio
async def test_a_client_that_never_reads_its_answers_is_cut(tmp_path: Path) -> None:
    """Pipelined fetches whose answers the client never reads: the broker holds at most
    max_unsent_bytes of them and closes the connection after the idle timeout, instead of
    keeping it and its answers in memory forever."""
    config = ServerConfig(
        port=0, kafka_port=0, idle_timeout_s=1, frame_timeout_s=1, max_unsent_bytes=2 << 20
    )
    async with kafka_broker(tmp_path, server=config) as (b, k):
        await b.create_topic_async("t", 1)
        for _ in range(20):
            await b.produce("t", 0, batch([bytes(500_000)]))
        reader, writer = await asyncio.open_connection("127.0.0.1", k.port)
        sock = writer.get_extra_info("socket")
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        w = Wire(reader, writer)
        body = fetch_body("t", 0, 0)
        body["max_bytes"] = 16 << 20
        body["topics"][0]["partitions"][0]["partition_max_bytes"] = 16 << 20
        for _ in range(4):
            await w.send(ApiKey.FETCH, 11, body)
        await until(lambda: any(c.unsent for c in k.connections))
        assert all(c.unsent <= config.max_unsent_bytes for c in k.connections)
        await until(lambda: not k.connections, timeout_s=30)
        writer.close()


def test_the_documented_versions_are_the_advertised_ones() -> None:
    """docs/kafka.md's table of APIs and versions is SUPPORTED, row for row."""
    text = (Path(__file__).parents[2] / "docs" / "kafka.md").read_text()
    rows = re.findall(r"^\| (\w+) \| (\d+) \| (\d+)\u2013(\d+) \|$", text, re.MULTILINE)
    documented = {int(key): (int(lo), int(hi)) for _, key, lo, hi in rows}
    assert documented == SUPPORTED
    assert {name for name, *_ in rows} == {
        k.name.title().replace("_", "") for k in ApiKey if k in SUPPORTED
    }
