"""Decoding a queue delivery's data section: whole batches, of which only the records whose
offset has an entry belong to the delivery (the rest are skipped), in the entries' order."""

from __future__ import annotations

import asyncio

import pytest

from tidewire.client import QueueMessage
from tidewire.client._queue_messages import decode_delivery
from tidewire.errors import InvalidRecordError, UnknownDeliveryTagError
from tidewire.protocol.frames import FrameType, encode_frame
from tidewire.protocol.messages import DeliveryEntryInfo
from tidewire.records import BatchBuilder


def _batch(base: int, n: int, *, key: bytes = b"rk") -> bytes:
    b = BatchBuilder(base_offset=base)
    for i in range(n):
        b.append(
            f"m{base + i}".encode(),
            key=key,
            headers=[("h", str(base + i).encode())],
            timestamp_ms=1_000 + i,
        )
    return b.build()


DATA = _batch(10, 4) + _batch(14, 3, key="ключ".encode())


def test_only_records_with_an_entry_in_entry_order() -> None:
    entries = [DeliveryEntryInfo(7, 15, 2), DeliveryEntryInfo(5, 11, 1)]
    got = decode_delivery("orders", entries, DATA, None)
    assert [(m.offset, m.delivery_tag, m.delivery_count, m.value) for m in got] == [
        (15, 7, 2, b"m15"),
        (11, 5, 1, b"m11"),
    ]
    first = got[0]
    assert first.routing_key == "ключ"
    assert first.redelivered
    assert not got[1].redelivered
    assert first.headers == [("h", b"15")]
    assert first.header("h") == b"15"
    assert first.header("missing") is None
    assert first.timestamp_ms == 1_001
    assert first.queue == "orders"


def test_a_view_of_a_frame_decodes_the_same() -> None:
    # As a push hands it over: a view of the frame's tail.
    frame = b"".join(bytes(b) for b in encode_frame(FrameType.PUSH, 55, 0, 0, b"\x80", [DATA]))
    view = memoryview(frame)[len(frame) - len(DATA) :]
    got = decode_delivery("q", [DeliveryEntryInfo(1, 13, 1)], view, None)
    assert [m.value for m in got] == [b"m13"]


def test_no_entries_no_messages() -> None:
    assert decode_delivery("q", [], DATA, None) == []
    assert decode_delivery("q", [], b"", None) == []


def test_an_entry_without_its_record_is_an_error() -> None:
    with pytest.raises(InvalidRecordError, match=r"offsets \[99\] are in none of its"):
        decode_delivery("q", [DeliveryEntryInfo(1, 99, 1)], DATA, None)


def test_a_browsed_message_cannot_be_settled() -> None:
    (msg,) = decode_delivery("dlq", [DeliveryEntryInfo(0, 12, 1)], DATA, None)
    assert isinstance(msg, QueueMessage)
    with pytest.raises(UnknownDeliveryTagError, match="browsed, not taken"):
        asyncio.run(msg.ack())
