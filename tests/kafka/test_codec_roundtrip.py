"""Round trips of every Kafka request and response schema at every version the schemas
define (not only the advertised ones): a body drawn from the layout, encoded, decodes to the
same body, and the decoded body encodes to the same bytes."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.kafka._codec_support import FAST, SLOW, all_versions, body_for, plain
from tidewire.protocol.kafka import (
    RequestHeader,
    decode_request,
    decode_response,
    encode_request,
    encode_response,
    encode_response_parts,
)
from tidewire.protocol.kafka.codec import BY_REFERENCE
from tidewire.protocol.kafka.schema import layout

VERSIONS = all_versions()
IDS = [f"{api}-{kind}-v{v}" for api, kind, v in VERSIONS]

_CORRELATION = st.integers(-(2**31), 2**31 - 1)
_CLIENT_ID = st.one_of(st.none(), st.text(max_size=10))


def _round_trip(api: int, kind: str, version: int, data: st.DataObject) -> None:
    want = data.draw(body_for(api, kind, version), label="body")
    cid = data.draw(_CORRELATION, label="correlation_id")
    if kind == "request":
        header = RequestHeader(api, version, cid, data.draw(_CLIENT_ID, label="client_id"))
        frame = encode_request(header, want)
        assert int.from_bytes(frame[:4], "big", signed=True) == len(frame) - 4
        got_header, got = decode_request(frame[4:])
        assert got_header == header
        again = encode_request(header, got)
    else:
        header = RequestHeader(api, version, cid, None)
        frame = encode_response(header, want)
        assert int.from_bytes(frame[:4], "big", signed=True) == len(frame) - 4
        assert b"".join(encode_response_parts(header, want)) == frame
        got_cid, got = decode_response(api, version, frame[4:])
        assert got_cid == cid
        again = encode_response(header, got)
    assert plain(got) == plain(want)
    assert again == frame


@pytest.mark.parametrize(("api", "kind", "version"), VERSIONS, ids=IDS)
@settings(FAST)
@given(data=st.data())
def test_round_trip(api: int, kind: str, version: int, data: st.DataObject) -> None:
    _round_trip(api, kind, version, data)


@pytest.mark.slow
@pytest.mark.parametrize(("api", "kind", "version"), VERSIONS, ids=IDS)
@settings(SLOW)
@given(data=st.data())
def test_round_trip_many(api: int, kind: str, version: int, data: st.DataObject) -> None:
    _round_trip(api, kind, version, data)


def test_every_schema_version_is_covered() -> None:
    """The list walked above holds every API of SUPPORTED, both kinds, from v0 (or the
    schema's first version) to the schema's last, including the flexible ones."""
    keys = {(api, kind) for api, kind, _ in VERSIONS}
    assert len(keys) == 2 * 23
    assert (3, "request", 12) in VERSIONS  # Metadata v12: flexible, topic ids
    assert (1, "response", 17) in VERSIONS  # Fetch's last version in Kafka 3.9
    assert (60, "response", 0) in VERSIONS


def _absent_and_decoded(api: int, kind: str, version: int) -> dict[str, Any]:
    lay = layout(api, kind, version)
    assert lay is not None
    return lay.defaults()


def test_missing_fields_take_their_defaults() -> None:
    """An empty body encodes with every field at its default, and decodes to the defaults of
    every field of the schema, present at that version or not."""
    header = RequestHeader(1, 4, 7, "c")
    _, got = decode_request(encode_request(header, {})[4:])
    assert plain(got) == plain(_absent_and_decoded(1, "request", 4))
    # Fields Fetch v4 lacks come back at the schema's defaults
    assert got["replica_id"] == -1
    assert got["session_epoch"] == -1
    assert got["rack_id"] == ""
    assert got["forgotten_topics_data"] == []


def test_fields_outside_the_version_are_not_written() -> None:
    """Handlers fill the newest fields; the codec drops what the version lacks."""
    header = RequestHeader(0, 4, 1, None)
    body = {"responses": [], "throttle_time_ms": 5, "node_endpoints": [{"node_id": 1}]}
    old = encode_response(RequestHeader(0, 0, 1, None), body)
    assert decode_response(0, 0, old[4:])[1]["throttle_time_ms"] == 0
    assert decode_response(0, 4, encode_response(header, body)[4:])[1]["throttle_time_ms"] == 5


@pytest.mark.parametrize("version", range(4, 17))
def test_fetch_answer_in_parts_keeps_large_records_by_reference(version: int) -> None:
    big = [bytes([i]) * (BY_REFERENCE + i) for i in range(3)]
    small = b"s" * (BY_REFERENCE - 1)
    partitions = [
        {"partition_index": i, "high_watermark": 9, "records": r}
        for i, r in enumerate([big[0], small, None, big[1], big[2]])
    ]
    body = {"responses": [{"topic": "t", "partitions": partitions}]}
    header = RequestHeader(1, version, 77, None)
    parts = encode_response_parts(header, body)
    frame = encode_response(header, body)
    assert b"".join(parts) == frame
    assert int.from_bytes(frame[:4], "big", signed=True) == len(frame) - 4
    # each large value is a part of its own, the very object given; the small one is copied
    kept = [p for p in parts if any(p is b for b in big)]
    assert len(kept) == 3
    assert not any(p is small for p in parts)
    assert len(parts) == 7  # header, big, between, big, between, big, trailer
    _, got = decode_response(1, version, frame[4:])
    got_records = [p["records"] for p in got["responses"][0]["partitions"]]
    assert got_records[:2] == [big[0], small]
    assert got_records[3:] == big[1:]
