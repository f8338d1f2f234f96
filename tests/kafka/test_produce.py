"""Produce over the Kafka listener: offsets under acks=1 and -1, no answer under acks=0
(the data stored all the same), idempotent batches (a retry answered with its first offset,
a sequence gap, a fenced epoch), message formats v0/v1 and damaged batches refused
per partition, unknown partitions, transactions refused."""

from __future__ import annotations

import struct
from pathlib import Path
from typing import Any

from tests.kafka._support import (
    aio,
    batch,
    fetch_body,
    kafka_broker,
    produce_body,
    values_of,
    wire,
)
from tidewire.protocol.kafka import ApiKey, ErrorCode


def _part(answer: dict[str, Any]) -> dict[str, Any]:
    result: dict[str, Any] = answer["responses"][0]["partition_responses"][0]
    return result


@aio
async def test_acks_all_and_one_return_offsets_and_acks_zero_no_answer(tmp_path: Path) -> None:
    async with kafka_broker(tmp_path) as (b, k), wire(k.port) as w:
        b.create_topic("t", 2)
        got = await w.call(ApiKey.PRODUCE, 7, produce_body("t", 1, batch([b"a", b"b"]), -1))
        assert _part(got)["error_code"] == 0
        assert (_part(got)["base_offset"], _part(got)["log_start_offset"]) == (0, 0)
        got = await w.call(ApiKey.PRODUCE, 3, produce_body("t", 1, batch([b"c"]), 1))
        assert _part(got)["base_offset"] == 2
        # acks=0: no answer; the next request's answer is the next thing read.
        await w.send(ApiKey.PRODUCE, 7, produce_body("t", 1, batch([b"d"]), 0))
        fetched = await w.call(ApiKey.FETCH, 11, fetch_body("t", 1, 0))
        part = fetched["responses"][0]["partitions"][0]
        assert values_of(part["records"]) == [b"a", b"b", b"c", b"d"]
        assert part["high_watermark"] == part["last_stable_offset"] == 4


@aio
async def test_a_first_produce_creates_the_topic_when_auto_creation_is_on(tmp_path: Path) -> None:
    async with kafka_broker(tmp_path) as (b, k), wire(k.port) as w:
        got = await w.call(ApiKey.PRODUCE, 7, produce_body("fresh", 0, batch([b"x"])))
        assert _part(got)["error_code"] == 0
        assert "fresh" in b.topics()
    async with kafka_broker(tmp_path, auto_create_topics=False) as (b, k), wire(k.port) as w:
        got = await w.call(ApiKey.PRODUCE, 7, produce_body("other", 0, batch([b"x"])))
        assert _part(got)["error_code"] == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
        got = await w.call(ApiKey.PRODUCE, 7, produce_body("fresh", 9, batch([b"x"])))
        assert _part(got)["error_code"] == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION


@aio
async def test_idempotent_batches(tmp_path: Path) -> None:
    async with kafka_broker(tmp_path) as (b, k), wire(k.port) as w:
        b.create_topic("t", 1)
        init = await w.call(ApiKey.INIT_PRODUCER_ID, 1, {"transactional_id": None})
        assert init["error_code"] == 0
        pid, epoch = init["producer_id"], init["producer_epoch"]

        def send(seq: int, values: list[bytes], ep: int = epoch) -> dict[str, Any]:
            return produce_body(
                "t", 0, batch(values, producer_id=pid, producer_epoch=ep, base_sequence=seq)
            )

        assert _part(await w.call(ApiKey.PRODUCE, 7, send(0, [b"a", b"b"])))["base_offset"] == 0
        assert _part(await w.call(ApiKey.PRODUCE, 7, send(2, [b"c"])))["base_offset"] == 2
        # A retry of the last batch: answered with its first offset, stored once.
        again = _part(await w.call(ApiKey.PRODUCE, 7, send(2, [b"c"])))
        assert (again["error_code"], again["base_offset"]) == (0, 2)
        # A gap in the sequence.
        gap = _part(await w.call(ApiKey.PRODUCE, 7, send(7, [b"z"])))
        assert gap["error_code"] == ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER
        # A new epoch (InitProducerId v3+ asks for it; v0-1 are advertised, so through the
        # broker) fences the old one.
        _, new_epoch = await b.init_producer_id(pid, epoch)
        assert (
            _part(await w.call(ApiKey.PRODUCE, 7, send(0, [b"new"], new_epoch)))["error_code"] == 0
        )
        fenced = _part(await w.call(ApiKey.PRODUCE, 7, send(3, [b"old"])))
        assert fenced["error_code"] == ErrorCode.INVALID_PRODUCER_EPOCH
        fetched = await w.call(ApiKey.FETCH, 11, fetch_body("t", 0, 0))
        assert values_of(fetched["responses"][0]["partitions"][0]["records"]) == [
            b"a",
            b"b",
            b"c",
            b"new",
        ]


@aio
async def test_old_message_formats_and_damaged_batches_are_refused(tmp_path: Path) -> None:
    async with kafka_broker(tmp_path) as (b, k), wire(k.port) as w:
        b.create_topic("t", 1)
        good = batch([b"a"])
        v1 = bytearray(good)
        v1[16] = 1  # the magic byte: message format v1
        got = await w.call(ApiKey.PRODUCE, 7, produce_body("t", 0, bytes(v1)))
        assert _part(got)["error_code"] == ErrorCode.UNSUPPORTED_FOR_MESSAGE_FORMAT
        bad_crc = bytearray(good)
        bad_crc[-1] ^= 0xFF
        got = await w.call(ApiKey.PRODUCE, 7, produce_body("t", 0, bytes(bad_crc)))
        assert _part(got)["error_code"] == ErrorCode.CORRUPT_MESSAGE
        got = await w.call(ApiKey.PRODUCE, 7, produce_body("t", 0, good[:30]))
        assert _part(got)["error_code"] == ErrorCode.CORRUPT_MESSAGE
        assert b.high_watermark("t", 0) == 0  # nothing stored


@aio
async def test_transactions_and_bad_acks_are_refused(tmp_path: Path) -> None:
    async with kafka_broker(tmp_path) as (b, k), wire(k.port) as w:
        b.create_topic("t", 1)
        body = produce_body("t", 0, batch([b"a"]))
        got = await w.call(ApiKey.PRODUCE, 7, body | {"transactional_id": "tx"})
        assert _part(got)["error_code"] == ErrorCode.INVALID_REQUEST
        got = await w.call(ApiKey.PRODUCE, 7, body | {"acks": 2})
        assert _part(got)["error_code"] == ErrorCode.INVALID_REQUIRED_ACKS
        got = await w.call(ApiKey.INIT_PRODUCER_ID, 1, {"transactional_id": "tx"})
        assert got["error_code"] == ErrorCode.UNSUPPORTED_VERSION
        assert b.high_watermark("t", 0) == 0


def test_the_magic_byte_is_where_the_test_puts_it() -> None:
    # base offset (8), batch length (4), partition leader epoch (4), then magic.
    assert struct.unpack_from(">b", batch([b"a"]), 16) == (2,)


def test_schema_defaults_written_as_json_numbers_are_read() -> None:
    # InitProducerIdResponse.ProducerId's default is -1 as a number in Kafka's JSON (most
    # defaults are strings); its layout used to raise TypeError.
    from tidewire.protocol.kafka.schema import layout

    lay = layout(ApiKey.INIT_PRODUCER_ID, "response", 1)
    assert lay is not None
    assert {f.name: f.default for f in lay.fields}["producer_id"] == -1
