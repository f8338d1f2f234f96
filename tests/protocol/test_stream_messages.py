"""The STREAM_* bodies on the wire: items and messages are msgpack arrays with their values
as bin, the defaults stay off the wire, and a malformed item is refused naming its place."""

from __future__ import annotations

import msgspec
import pytest

from tidewire.broker.streams import model
from tidewire.errors import InvalidRequestError
from tidewire.protocol.messages import (
    MAX_SEND_ITEMS,
    SendItem,
    StreamReadRequest,
    StreamReceiveRequest,
    StreamSendRequest,
    StreamSendResponse,
    decode_body,
    encode_body,
)


def test_the_broker_model_names_the_protocol_types() -> None:
    assert model.SendItem is SendItem
    assert model.StreamMessage.__module__ == "tidewire.protocol.streams"


def test_a_send_item_is_an_array_with_its_value_as_bin() -> None:
    req = StreamSendRequest(items=[SendItem("s", b"v", "u", 5, True)])
    raw = msgspec.msgpack.decode(encode_body(req))
    assert raw == {"items": [["s", b"v", "u", 5, True]]}
    # msgpack bin 8 (0xc4) with length 1: the value is bytes on the wire, not a string
    assert b"\xc4\x01v" in encode_body(req)


def test_defaults_stay_off_the_wire_and_come_back() -> None:
    assert msgspec.msgpack.decode(encode_body(StreamReceiveRequest(streams=["a"]))) == {
        "streams": ["a"]
    }
    req = decode_body(StreamSendRequest, msgspec.msgpack.encode({"items": [["a", b"x"]]}))
    assert req == StreamSendRequest(items=[SendItem("a", b"x")])
    assert (req.ring_size, req.block_ms) == (-1, 0)
    assert (req.items[0].uuid, req.items[0].ttl_ms, req.items[0].persistent) == ("", 0, False)


def test_a_malformed_item_is_named_by_its_place() -> None:
    data = msgspec.msgpack.encode({"items": [["a", b"x"], ["b", "not bytes"]]})
    with pytest.raises(InvalidRequestError, match=r"\$\.items\[1\]\[1\]"):
        decode_body(StreamSendRequest, data)
    with pytest.raises(InvalidRequestError, match=r"\$\.positions"):
        decode_body(StreamReadRequest, msgspec.msgpack.encode({"positions": ["a"]}))


def test_a_full_send_round_trips() -> None:
    items = [
        SendItem(f"stream-{i}", i.to_bytes(4, "big"), persistent=i % 2 == 0)
        for i in range(MAX_SEND_ITEMS)
    ]
    req = StreamSendRequest(items=items, block_ms=10)
    data = encode_body(req)
    assert len(data) < 300_000  # about 25 bytes an item: far below any frame limit
    assert decode_body(StreamSendRequest, data) == req


def test_an_empty_response_is_an_empty_map() -> None:
    assert encode_body(StreamSendResponse()) == b"\x80"
