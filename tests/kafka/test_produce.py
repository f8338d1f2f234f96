"""Produce over the Kafka listener: offsets under acks=1 and -1, no answer under acks=0
(the data stored all the same), idempotent batches (a retry answered with its first offset,
a sequence gap, a fenced epoch), message formats v0/v1 and damaged batches refused
per partition, unknown partitions, transactions refused."""

from __future__ import annotations

import socket
import struct
from pathlib import Path
from typing import Any

from tests.kafka._support import (
    Wire,
    aio,
    batch,
    fetch_body,
    kafka_broker,
    produce_body,
    values_of,
    wire,
)
from tidewire.protocol.kafka import ApiKey, ErrorCode
from tidewire.storage import FsyncPolicy, LogConfig


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


def _two_partition_body(parts: list[tuple[int, bytes]]) -> dict[str, Any]:
    return {
        "transactional_id": None,
        "acks": -1,
        "timeout_ms": 10_000,
        "topic_data": [
            {"name": "t", "partition_data": [{"index": i, "records": r} for i, r in parts]}
        ],
    }


@aio
async def test_pipelined_produces_are_appended_in_request_order(tmp_path: Path) -> None:
    """Request 1 writes partitions 0 and 1, request 2 (sent before request 1 is answered)
    partition 1 again: under fsync=always request 1 waits for its fsync on partition 0
    while request 2 is read, yet partition 1 holds request 1's batch first. With an
    idempotent producer an inversion would answer DUPLICATE_SEQUENCE_NUMBER for sequence 0
    and lose that acknowledged batch."""
    for idempotent in (False, True):
        async with (
            kafka_broker(tmp_path / str(idempotent), log=LogConfig(fsync=FsyncPolicy.ALWAYS)) as (
                b,
                k,
            ),
            wire(k.port) as w,
        ):
            await b.create_topic_async("t", 2)
            pid = epoch = -1
            if idempotent:
                got = await w.call(
                    ApiKey.INIT_PRODUCER_ID,
                    1,
                    {"transactional_id": None, "transaction_timeout_ms": 1000},
                )
                pid, epoch = got["producer_id"], got["producer_epoch"]

            def mk(
                value: bytes, seq: int, pid: int = pid, epoch: int = epoch, idem: bool = idempotent
            ) -> bytes:
                return batch(
                    [value],
                    producer_id=pid,
                    producer_epoch=epoch,
                    base_sequence=seq if idem else -1,
                )

            await w.send(
                ApiKey.PRODUCE, 7, _two_partition_body([(0, mk(b"a0", 0)), (1, mk(b"b0", 0))])
            )
            await w.send(ApiKey.PRODUCE, 7, _two_partition_body([(1, mk(b"b1", 1))]))
            answers = [(await w.receive(ApiKey.PRODUCE, 7))[1] for _ in range(2)]
            placed = [
                (p["index"], p["error_code"], p["base_offset"])
                for a in answers
                for t in a["responses"]
                for p in t["partition_responses"]
            ]
            assert placed == [(0, 0, 0), (1, 0, 0), (1, 0, 1)], idempotent
            f = await w.call(ApiKey.FETCH, 11, fetch_body("t", 1, 0))
            assert values_of(f["responses"][0]["partitions"][0]["records"]) == [b"b0", b"b1"]


@aio
async def test_a_reset_connection_with_produces_in_flight_stores_each_batch_once(
    tmp_path: Path,
) -> None:
    """An idempotent producer pipelines five batches and its connection is reset (RST)
    while they wait for their fsync; it sends all five again on a new connection: each is
    stored once (the cancelled waits must not make the broker forget what it stored)."""
    async with kafka_broker(tmp_path, log=LogConfig(fsync=FsyncPolicy.ALWAYS)) as (b, k):
        await b.create_topic_async("t", 1)
        w = await Wire.connect(k.port)
        got = await w.call(
            ApiKey.INIT_PRODUCER_ID, 1, {"transactional_id": None, "transaction_timeout_ms": 1000}
        )
        pid, epoch = got["producer_id"], got["producer_epoch"]
        batches = [
            batch([b"m%d" % i], producer_id=pid, producer_epoch=epoch, base_sequence=i)
            for i in range(5)
        ]
        for x in batches:
            await w.send(ApiKey.PRODUCE, 7, produce_body("t", 0, x))
        sock = w.writer.get_extra_info("socket")
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        w.writer.transport.abort()
        async with wire(k.port) as again:
            for x in batches:
                answer = await again.call(ApiKey.PRODUCE, 7, produce_body("t", 0, x))
                [part] = answer["responses"][0]["partition_responses"]
                assert part["error_code"] == ErrorCode.NONE
            f = await again.call(ApiKey.FETCH, 11, fetch_body("t", 0, 0))
            records = f["responses"][0]["partitions"][0]["records"]
            assert values_of(records) == [b"m%d" % i for i in range(5)]


@aio
async def test_a_failed_acks0_produce_closes_the_connection(tmp_path: Path) -> None:
    """acks=0 gets no answer, so a failure (here: an unknown topic with auto-creation off)
    closes the connection, as in Kafka: the producer notices and refreshes its metadata."""
    async with kafka_broker(tmp_path, auto_create_topics=False) as (_, k), wire(k.port) as w:
        await w.send(ApiKey.PRODUCE, 7, produce_body("nowhere", 0, batch([b"x"]), acks=0))
        assert await w.closed()
