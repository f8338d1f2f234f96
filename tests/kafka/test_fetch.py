"""Fetch and ListOffsets over the Kafka listener: records as stored, a long-poll woken by a
produce and one that times out empty, OFFSET_OUT_OF_RANGE, unknown partitions beside good
ones, no fetch sessions (session id 0), and offsets by position and by timestamp (never
hanging, -1 when no record is that recent)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from tests.kafka._support import (
    T0,
    aio,
    batch,
    fetch_body,
    kafka_broker,
    produce_body,
    values_of,
    wire,
)
from tidewire.protocol.kafka import ApiKey, ErrorCode


def _first(answer: dict[str, Any]) -> dict[str, Any]:
    part: dict[str, Any] = answer["responses"][0]["partitions"][0]
    return part


@aio
async def test_fetch_returns_the_batches_and_waits_for_data(tmp_path: Path) -> None:
    async with kafka_broker(tmp_path) as (b, k), wire(k.port) as w, wire(k.port) as p:
        b.create_topic("t", 1)
        await p.call(ApiKey.PRODUCE, 7, produce_body("t", 0, batch([b"a", b"b"])))
        got = await w.call(ApiKey.FETCH, 11, fetch_body("t", 0, 0))
        assert got["session_id"] == 0
        assert got["error_code"] == 0
        assert values_of(_first(got)["records"]) == [b"a", b"b"]
        assert _first(got)["log_start_offset"] == 0
        # Caught up: a long-poll answered by the next produce.
        waiting = asyncio.create_task(
            w.call(ApiKey.FETCH, 11, fetch_body("t", 0, 2, max_wait_ms=20_000))
        )
        await asyncio.sleep(0.05)
        assert not waiting.done()
        await p.call(ApiKey.PRODUCE, 7, produce_body("t", 0, batch([b"c"])))
        got = await asyncio.wait_for(waiting, 20)
        assert values_of(_first(got)["records"]) == [b"c"]
        # A long-poll with nothing coming returns empty after max_wait_ms.
        got = await w.call(ApiKey.FETCH, 4, fetch_body("t", 0, 3, max_wait_ms=50))
        assert _first(got)["error_code"] == 0
        assert not _first(got)["records"]
        assert _first(got)["high_watermark"] == 3


@aio
async def test_fetch_errors_are_per_partition(tmp_path: Path) -> None:
    async with kafka_broker(tmp_path) as (b, k), wire(k.port) as w:
        b.create_topic("t", 1)
        await w.call(ApiKey.PRODUCE, 7, produce_body("t", 0, batch([b"a"])))
        body = fetch_body("t", 0, 0)
        body["topics"][0]["partitions"].append(
            body["topics"][0]["partitions"][0] | {"partition": 5}
        )
        body["topics"].append(
            {"topic": "missing", "partitions": [body["topics"][0]["partitions"][0]]}
        )
        got = await w.call(ApiKey.FETCH, 11, body)
        t, missing = got["responses"]
        assert [p["error_code"] for p in t["partitions"]] == [
            0,
            ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
        ]
        assert values_of(t["partitions"][0]["records"]) == [b"a"]
        assert missing["partitions"][0]["error_code"] == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
        got = await w.call(ApiKey.FETCH, 11, fetch_body("t", 0, 99))
        assert _first(got)["error_code"] == ErrorCode.OFFSET_OUT_OF_RANGE
        # A session id never handed out.
        got = await w.call(ApiKey.FETCH, 11, fetch_body("t", 0, 0) | {"session_id": 7})
        assert got["error_code"] == ErrorCode.FETCH_SESSION_ID_NOT_FOUND


def _list_body(topic: str, timestamp: int) -> dict[str, Any]:
    return {
        "replica_id": -1,
        "topics": [{"name": topic, "partitions": [{"partition_index": 0, "timestamp": timestamp}]}],
    }


@aio
async def test_list_offsets_by_position_and_by_timestamp(tmp_path: Path) -> None:
    async with kafka_broker(tmp_path) as (b, k), wire(k.port) as w:
        b.create_topic("t", 1)
        for i in range(3):  # offsets 2i, 2i+1 at T0 + 1000 i (+1 ms for the second)
            records = batch([b"x", b"y"], timestamp_ms=T0 + 1000 * i)
            await w.call(ApiKey.PRODUCE, 7, produce_body("t", 0, records))

        async def at(version: int, ts: int) -> dict[str, Any]:
            got = await w.call(ApiKey.LIST_OFFSETS, version, _list_body("t", ts))
            part: dict[str, Any] = got["topics"][0]["partitions"][0]
            return part

        assert (await at(5, -2))["offset"] == 0
        assert (await at(5, -1))["offset"] == 6
        found = await at(5, T0 + 1000)
        assert (found["error_code"], found["offset"], found["timestamp"]) == (0, 2, T0 + 1000)
        found = await at(5, T0 + 1001)
        assert (found["offset"], found["timestamp"]) == (3, T0 + 1001)
        none = await at(5, T0 + 99_000)
        assert (none["error_code"], none["offset"], none["timestamp"]) == (0, -1, -1)
        assert (await at(0, -1))["old_style_offsets"] == [6]
        got = await w.call(ApiKey.LIST_OFFSETS, 5, _list_body("missing", -1))
        assert got["topics"][0]["partitions"][0]["error_code"] == (
            ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
        )
