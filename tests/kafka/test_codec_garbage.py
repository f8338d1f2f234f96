"""The Kafka decoders against bad input: every prefix of a valid frame, random bytes,
mutated frames, huge counts. Whatever the input, a decoder returns or raises
KafkaCodecError with the error code to answer, never another exception."""

from __future__ import annotations

import struct
import time
import tracemalloc
from collections.abc import Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.kafka._codec_support import FAST, SLOW, all_versions, body_for, plain
from tidewire.protocol.kafka import (
    ErrorCode,
    KafkaCodecError,
    RequestHeader,
    decode_header,
    decode_request,
    decode_response,
    encode_request,
    encode_response,
)

VERSIONS = all_versions()
REQUESTS = [(api, v) for api, kind, v in VERSIONS if kind == "request"]
RESPONSES = [(api, v) for api, kind, v in VERSIONS if kind == "response"]


def _code(decode: Callable[[], object]) -> ErrorCode | None:
    """The error code ``decode()`` raised KafkaCodecError with, None when it decoded; any
    other exception propagates (and fails the test)."""
    try:
        decode()
    except KafkaCodecError as exc:
        return exc.error_code
    return None


_REQUEST_CODES = (
    None,
    ErrorCode.CORRUPT_MESSAGE,
    ErrorCode.INVALID_REQUEST,
    ErrorCode.UNSUPPORTED_VERSION,
)


def _decode_req(frame: bytes) -> None:
    assert _code(lambda: decode_request(frame)) in _REQUEST_CODES


def _decode_resp(api: int, version: int, frame: bytes) -> None:
    got = _code(lambda: decode_response(api, version, frame))
    assert got in (None, ErrorCode.CORRUPT_MESSAGE, ErrorCode.INVALID_REQUEST)


def _frame_request(api: int, version: int, data: st.DataObject) -> bytes:
    body = data.draw(body_for(api, "request", version))
    return encode_request(RequestHeader(api, version, 1, "c"), body)[4:]


def _frame_response(api: int, version: int, data: st.DataObject) -> bytes:
    body = data.draw(body_for(api, "response", version))
    return encode_response(RequestHeader(api, version, 1, None), body)[4:]


def _prefixes_request(api: int, version: int, data: st.DataObject) -> None:
    frame = _frame_request(api, version, data)
    for n in range(len(frame)):
        got = _code(lambda: decode_request(frame[:n]))  # noqa: B023 (called at once)
        assert got in (None, ErrorCode.CORRUPT_MESSAGE), n
        # a prefix may decode too: e.g. a frame ending in an empty tagged-field section
    decode_request(frame)
    # trailing bytes are ignored as Kafka does (the size prefix bounds the frame)
    decode_request(frame + b"\x00")


@pytest.mark.parametrize(("api", "version"), REQUESTS, ids=[f"{a}-v{v}" for a, v in REQUESTS])
@settings(FAST, max_examples=1)
@given(data=st.data())
def test_every_request_prefix(api: int, version: int, data: st.DataObject) -> None:
    _prefixes_request(api, version, data)


@pytest.mark.parametrize(("api", "version"), RESPONSES, ids=[f"{a}-v{v}" for a, v in RESPONSES])
@settings(FAST, max_examples=1)
@given(data=st.data())
def test_every_response_prefix(api: int, version: int, data: st.DataObject) -> None:
    frame = _frame_response(api, version, data)
    for n in range(len(frame)):
        got = _code(lambda: decode_response(api, version, frame[:n]))  # noqa: B023
        assert got in (None, ErrorCode.CORRUPT_MESSAGE), n


def _mutations(frame: bytes, data: st.DataObject) -> bytes:
    out = bytearray(frame)
    for _ in range(data.draw(st.integers(1, 4), label="flips")):
        i = data.draw(st.integers(0, len(out) - 1), label="at")
        out[i] = data.draw(st.integers(0, 255), label="to")
    return bytes(out)


def _mutated(data: st.DataObject) -> None:
    api, version = data.draw(st.sampled_from(REQUESTS), label="request")
    frame = _mutations(_frame_request(api, version, data), data)
    _decode_req(frame)
    if _code(lambda: decode_request(frame)) is None:
        # whatever decodes is a valid body: it encodes, and reads back the same
        header, body = decode_request(frame)
        again_header, again = decode_request(encode_request(header, body)[4:])
        assert again_header == header
        assert plain(again) == plain(body)
    api, version = data.draw(st.sampled_from(RESPONSES), label="response")
    frame = _frame_response(api, version, data)
    _decode_resp(api, version, _mutations(frame, data))


@settings(FAST, max_examples=200)
@given(data=st.data())
def test_mutated_frames(data: st.DataObject) -> None:
    _mutated(data)


@pytest.mark.slow
@settings(SLOW, max_examples=5000)
@given(data=st.data())
def test_mutated_frames_many(data: st.DataObject) -> None:
    _mutated(data)


_HEADS = st.sampled_from(REQUESTS).map(lambda av: struct.pack(">hhih", av[0], av[1], 3, -1))


@settings(FAST, max_examples=300)
@given(head=_HEADS, tail=st.binary(max_size=200))
def test_garbage_after_a_valid_header(head: bytes, tail: bytes) -> None:
    _decode_req(head + tail)


@settings(FAST, max_examples=300)
@given(frame=st.binary(max_size=300))
def test_random_bytes(frame: bytes) -> None:
    _decode_req(frame)
    assert _code(lambda: decode_header(frame)) in (None, ErrorCode.CORRUPT_MESSAGE)
    api, version = RESPONSES[len(frame) % len(RESPONSES)]
    _decode_resp(api, version, frame)


@pytest.mark.slow
@settings(SLOW, max_examples=5000)
@given(head=_HEADS, tail=st.binary(max_size=2000))
def test_garbage_after_a_valid_header_many(head: bytes, tail: bytes) -> None:
    _decode_req(head + tail)


def _head(api: int, version: int, flexible: bool = False) -> bytes:
    return struct.pack(">hhih", api, version, 9, -1) + (b"\x00" if flexible else b"")


@pytest.mark.parametrize(
    "frame",
    [
        # Metadata v1: topics array of 2**31-1 names, 4 bytes follow
        _head(3, 1) + struct.pack(">i", 2**31 - 1) + b"\x00\x00\x00\x00",
        # Produce v3: transactional id null, acks, timeout, 2**31-1 topics
        _head(0, 3) + struct.pack(">hhii", -1, 1, 1000, 2**31 - 1),
        # Metadata v9 (flexible): a compact array of 2**35-ish entries (5-byte varint)
        _head(3, 9, flexible=True) + b"\xff\xff\xff\xff\x7f",
        # Fetch v12 (flexible): 2**28 topics
        _head(1, 12, flexible=True)
        + struct.pack(">iiiibii", -1, 0, 0, 0, 0, 0, -1)
        + b"\x80\x80\x80\x80\x01",
        # bytes of 2**31-1 in SaslAuthenticate v0
        _head(36, 0) + struct.pack(">i", 2**31 - 1),
        # a string of 32,767 bytes in a 10-byte frame
        _head(17, 1) + struct.pack(">h", 0x7FFF),
        # 2**31-1 tagged fields, then a tag of 2**28
        _head(3, 9, flexible=True) + b"\x01" + b"\x00\x00\x00" + b"\xff\xff\xff\xff\x07",
    ],
    ids=["array", "produce", "compact-array", "fetch-topics", "bytes", "string", "tags"],
)
def test_huge_counts_are_refused_at_once(frame: bytes) -> None:
    start = time.process_time()
    tracemalloc.start()
    try:
        with pytest.raises(KafkaCodecError) as info:
            decode_request(frame)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    # nothing sized by the announced count is allocated (a list of 2**31 would be 16 GiB)
    assert peak < 256 * 1024, peak
    assert info.value.error_code == ErrorCode.CORRUPT_MESSAGE
    assert info.value.header is not None
    # bounded work: no loop over the announced count, no allocation of it
    assert time.process_time() - start < 0.5


def test_deep_nesting_is_corrupt_not_recursion() -> None:
    """The schemas nest at most a few levels; nothing in the input makes a decoder recurse."""
    frame = _head(1, 4) + b"\x00" * 10_000
    _decode_req(frame)


@pytest.mark.parametrize(
    ("api", "version"),
    [(0, 12), (1, 18), (3, 13), (18, 5), (60, 2), (4, 0), (21, 0), (999, 0), (-1, 0), (3, -1)],
)
def test_unknown_api_or_version_is_unsupported_with_its_header(api: int, version: int) -> None:
    frame = struct.pack(">hhih", api, version, 77, 3) + b"cli" + b"\x01\x02\x03"
    with pytest.raises(KafkaCodecError) as info:
        decode_request(frame)
    assert info.value.error_code == ErrorCode.UNSUPPORTED_VERSION
    assert info.value.header == RequestHeader(api, version, 77, "cli")
    assert decode_header(frame) == RequestHeader(api, version, 77, "cli")
    with pytest.raises(KafkaCodecError) as out:
        encode_response(RequestHeader(api, version, 77, "cli"), {})
    assert out.value.error_code == ErrorCode.UNSUPPORTED_VERSION
    with pytest.raises(KafkaCodecError) as resp:
        decode_response(api, version, b"\x00\x00\x00\x01")
    assert resp.value.error_code == ErrorCode.UNSUPPORTED_VERSION


def test_short_header_is_corrupt() -> None:
    for n in range(10):
        with pytest.raises(KafkaCodecError) as info:
            decode_request(b"\x00\x03\x00\x01\x00\x00\x00\x09\x00\x01"[:n])
        assert info.value.error_code == ErrorCode.CORRUPT_MESSAGE
        assert info.value.header is None


def test_bad_utf8_and_null_where_not_nullable() -> None:
    # Metadata v1: one topic name that is not UTF-8
    bad = _head(3, 1) + struct.pack(">ih", 1, 2) + b"\xff\xfe"
    with pytest.raises(KafkaCodecError, match="UTF-8"):
        decode_request(bad)
    # SaslHandshake v1: a null mechanism
    null = _head(17, 1) + struct.pack(">h", -1)
    with pytest.raises(KafkaCodecError, match="null"):
        decode_request(null)


def test_tags_out_of_order_are_corrupt() -> None:
    # ApiVersions v3 request: two strings, then tags 5 and 2
    frame = _head(18, 3, flexible=True) + b"\x01\x01" + b"\x02" + b"\x05\x00" + b"\x02\x00"
    with pytest.raises(KafkaCodecError, match="ascend"):
        decode_request(frame)
