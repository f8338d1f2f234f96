"""The message schemas and their codec: every request and response round-trips, a body that
breaks its schema is refused with ``InvalidRequestError`` naming the field, and the API
registry answers for every key and version."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.protocol._support import PUSH_SAMPLES, SAMPLES, SCHEMAS, structs
from tidewire.errors import (
    FrameTooLargeError,
    InvalidRequestError,
    ProtocolError,
    TooManyRequestsError,
    UnknownApiError,
    UnsupportedVersionError,
    for_code,
)
from tidewire.protocol.messages import (
    PUSH_SCHEMAS,
    ApiKey,
    ApiVersionRange,
    Body,
    CreateTopicRequest,
    DeleteTopicRequest,
    ErrorBody,
    PingRequest,
    ProducePartition,
    ProduceRequest,
    QueueDeliverBody,
    decode_body,
    encode_body,
    schema_for,
    supported_versions,
)

SCHEMA_IDS = [f"{schema.__name__}" for _, _, schema in SCHEMAS]


def builtins(body: msgspec.Struct) -> dict[str, Any]:
    """``body`` as the plain map that goes on the wire."""
    out = msgspec.to_builtins(body, builtin_types=(bytes,))
    assert isinstance(out, dict)
    return out


def refused(schema: type[msgspec.Struct], data: bytes) -> InvalidRequestError:
    with pytest.raises(InvalidRequestError) as info:
        decode_body(schema, data)
    assert info.value.code == 54
    assert str(info.value).startswith(f"invalid {schema.__name__}: ")
    return info.value


# --- the registry -------------------------------------------------------------------------------


def test_every_api_has_a_request_and_a_response_schema() -> None:
    assert set(SAMPLES) == set(ApiKey) - set(PUSH_SCHEMAS)
    assert set(PUSH_SAMPLES) == set(PUSH_SCHEMAS)
    for key in SAMPLES:
        request, response = SAMPLES[key]
        assert type(request) is schema_for(key, 0, response=False)
        assert type(response) is schema_for(key, 0, response=True)
        assert request.api_key is key
        assert response.api_key is key
        assert type(request) is not type(response)


def test_supported_versions_lists_every_api_key() -> None:
    ranges = supported_versions()
    assert [r.api_key for r in ranges] == [int(k) for k in sorted(ApiKey)]
    for r in ranges:
        assert isinstance(r, ApiVersionRange)
        assert 0 <= r.min_version <= r.max_version
        if r.api_key in PUSH_SCHEMAS:
            continue
        for version in range(r.min_version, r.max_version + 1):
            for response in (False, True):
                assert issubclass(schema_for(r.api_key, version, response=response), Body)


@pytest.mark.parametrize("api_key", [max(ApiKey) + 1, -1, 99, 2**15 - 1, -(2**15)])
@pytest.mark.parametrize("response", [False, True])
def test_schema_for_an_unknown_api(api_key: int, response: bool) -> None:
    with pytest.raises(UnknownApiError) as info:
        schema_for(api_key, 0, response=response)
    assert info.value.code == 52
    assert f"unknown API key {api_key}" in str(info.value)


@pytest.mark.parametrize("key", list(PUSH_SCHEMAS), ids=[k.name for k in PUSH_SCHEMAS])
@pytest.mark.parametrize("response", [False, True])
def test_a_push_only_api_has_no_request_nor_response(key: ApiKey, response: bool) -> None:
    with pytest.raises(
        UnknownApiError, match=f"{key.name} \\({int(key)}\\) is pushed by the server"
    ):
        schema_for(key, 0, response=response)


@pytest.mark.parametrize("key", list(PUSH_SCHEMAS), ids=[k.name for k in PUSH_SCHEMAS])
def test_push_bodies_round_trip(key: ApiKey) -> None:
    body = PUSH_SAMPLES[key]
    encoded = encode_body(body)
    assert decode_body(PUSH_SCHEMAS[key], encoded) == body
    assert decode_body(PUSH_SCHEMAS[key], memoryview(encoded)) == body


@settings(deadline=None, max_examples=40)
@given(data=st.data())
def test_queue_deliver_round_trips(data: st.DataObject) -> None:
    body = data.draw(structs(QueueDeliverBody), label="body")
    assert decode_body(QueueDeliverBody, encode_body(body)) == body


_REQUESTED = [k for k in ApiKey if k not in PUSH_SCHEMAS]


@pytest.mark.parametrize("key", _REQUESTED, ids=[k.name for k in _REQUESTED])
def test_schema_for_an_unsupported_version(key: ApiKey) -> None:
    (supported,) = [r for r in supported_versions() if r.api_key == key]
    for version in (supported.max_version + 1, supported.min_version - 1, 2**15 - 1):
        with pytest.raises(UnsupportedVersionError) as info:
            schema_for(key, version, response=False)
        assert info.value.code == 53
        message = str(info.value)
        assert key.name in message
        assert f"version {version}" in message
        assert f"{supported.min_version}..{supported.max_version}" in message


def test_protocol_error_codes() -> None:
    classes = [
        ProtocolError,
        FrameTooLargeError,
        UnknownApiError,
        UnsupportedVersionError,
        InvalidRequestError,
        TooManyRequestsError,
    ]
    assert [c.code for c in classes] == [50, 51, 52, 53, 54, 55]
    for cls in classes:
        assert issubclass(cls, ProtocolError)
        assert for_code(cls.code) is cls
        assert cls.retriable is (cls is TooManyRequestsError)
        assert cls().message == cls.description


# --- round trips ----------------------------------------------------------------------------


@pytest.mark.parametrize(("key", "response", "schema"), SCHEMAS, ids=SCHEMA_IDS)
def test_sample_round_trips(key: ApiKey, response: bool, schema: type[Body]) -> None:
    body = SAMPLES[key][int(response)]
    encoded = encode_body(body)
    assert decode_body(schema, encoded) == body
    assert decode_body(schema, memoryview(encoded)) == body  # as a frame hands it over


@settings(deadline=None, max_examples=40)
@given(data=st.data())
@pytest.mark.parametrize(("key", "response", "schema"), SCHEMAS, ids=SCHEMA_IDS)
def test_every_schema_round_trips(
    key: ApiKey, response: bool, schema: type[Body], data: st.DataObject
) -> None:
    body = data.draw(structs(schema), label="body")
    encoded = encode_body(body)
    decoded = decode_body(schema, memoryview(encoded))
    assert decoded == body
    assert type(decoded) is schema
    assert encode_body(decoded) == encoded


@settings(deadline=None, max_examples=60)
@given(structs(ErrorBody))
def test_error_body_round_trips(body: ErrorBody) -> None:
    assert decode_body(ErrorBody, encode_body(body)) == body


def test_unset_optional_fields_stay_off_the_wire() -> None:
    """omit_defaults: a default is not encoded, and a missing optional field decodes to it."""
    assert msgspec.msgpack.decode(encode_body(PingRequest())) == {}
    assert msgspec.msgpack.decode(encode_body(DeleteTopicRequest(name="t"))) == {"name": "t"}
    assert decode_body(CreateTopicRequest, msgspec.msgpack.encode({"name": "t"})) == (
        CreateTopicRequest(name="t")
    )


@pytest.mark.parametrize(("key", "response", "schema"), SCHEMAS, ids=SCHEMA_IDS)
def test_unknown_fields_are_ignored(key: ApiKey, response: bool, schema: type[Body]) -> None:
    """A field added in a later version does not break an older peer."""
    body = SAMPLES[key][int(response)]
    wire = builtins(body) | {"added_later": [1, {"nested": b"\x00"}, None], "zz": 2.5}
    assert decode_body(schema, msgspec.msgpack.encode(wire)) == body


def test_array_structs_ignore_extra_trailing_elements() -> None:
    wire = {"partitions": [["t", 0, 5, "added later", [1]]]}
    assert decode_body(ProduceRequest, msgspec.msgpack.encode(wire)) == ProduceRequest(
        partitions=[ProducePartition("t", 0, 5)]
    )


# --- refusals -------------------------------------------------------------------------------


def _fields(required_only: bool) -> list[tuple[type[Body], msgspec.structs.FieldInfo]]:
    out = []
    for _, _, schema in SCHEMAS:
        for f in msgspec.structs.fields(schema):
            if not required_only or f.required:
                out.append((schema, f))
    return out


def _wrong_value(tp: Any) -> object:
    """A value that ``tp`` does not accept."""
    for candidate in ("wrong", 7, [7]):
        try:
            msgspec.convert(candidate, tp)
        except msgspec.ValidationError:
            return candidate
    raise AssertionError(f"{tp!r} accepts everything")


FIELDS = _fields(required_only=False)
REQUIRED = _fields(required_only=True)


@pytest.mark.parametrize(
    ("schema", "field"), FIELDS, ids=[f"{s.__name__}.{f.name}" for s, f in FIELDS]
)
def test_a_field_of_the_wrong_type_is_named(
    schema: type[Body], field: msgspec.structs.FieldInfo
) -> None:
    key = schema.api_key
    sample = next(b for b in SAMPLES[key] if type(b) is schema)
    wire = builtins(sample) | {field.encode_name: _wrong_value(field.type)}
    error = refused(schema, msgspec.msgpack.encode(wire))
    assert f"`$.{field.encode_name}`" in str(error)


@pytest.mark.parametrize(
    ("schema", "field"), REQUIRED, ids=[f"{s.__name__}.{f.name}" for s, f in REQUIRED]
)
def test_a_missing_required_field_is_named(
    schema: type[Body], field: msgspec.structs.FieldInfo
) -> None:
    key = schema.api_key
    sample = next(b for b in SAMPLES[key] if type(b) is schema)
    wire = builtins(sample)
    del wire[field.encode_name]
    error = refused(schema, msgspec.msgpack.encode(wire))
    assert f"missing required field `{field.encode_name}`" in str(error)


NESTED = {
    "partition not an int": (
        ProduceRequest,
        {"partitions": [["t", "zero", 5]]},
        "`$.partitions[0][1]`",
    ),
    "partition entry too short": (ProduceRequest, {"partitions": [["t", 0]]}, "`$.partitions[0]`"),
    "partitions not a list": (ProduceRequest, {"partitions": 3}, "`$.partitions`"),
    "partitions is null": (ProduceRequest, {"partitions": None}, "`$.partitions`"),
    "config field": (
        CreateTopicRequest,
        {"name": "t", "config": {"retention_ms": "1d"}},
        "`$.config.retention_ms`",
    ),
    "config is nil": (CreateTopicRequest, {"name": "t", "config": None}, "`$.config`"),
    "float for an int": (CreateTopicRequest, {"name": "t", "partitions": 1.0}, "`$.partitions`"),
    "bool for an int": (CreateTopicRequest, {"name": "t", "partitions": True}, "`$.partitions`"),
    "bytes for a str": (DeleteTopicRequest, {"name": b"t"}, "`$.name`"),
}


@pytest.mark.parametrize(("schema", "wire", "path"), NESTED.values(), ids=NESTED.keys())
def test_a_nested_field_is_named_by_its_path(
    schema: type[Body], wire: dict[str, Any], path: str
) -> None:
    assert path in str(refused(schema, msgspec.msgpack.encode(wire)))


GARBAGE = {
    "empty": b"",
    "reserved opcode": b"\xc1",
    "truncated map": b"\x81",
    "truncated str": b"\x81\xa4na",
    "trailing bytes": b"\x80\x80",
    "an array": b"\x90",
    "an int": b"\x07",
    "nil": b"\xc0",
    "int key": b"\x81\x01\x02",
    "binary key": b"\x81\xc4\x01k\x01",
    "map32 claiming 4G entries": b"\xdf\xff\xff\xff\xff",
    "str32 claiming 4G bytes": b"\x81\xdb\xff\xff\xff\xff",
}


@pytest.mark.parametrize("data", GARBAGE.values(), ids=GARBAGE.keys())
def test_garbage_is_refused_by_every_schema(data: bytes) -> None:
    for _, _, schema in SCHEMAS:
        refused(schema, data)
    refused(ErrorBody, data)


msgpack_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**64 - 1)
    | st.floats()
    | st.text(max_size=8)
    | st.binary(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.dictionaries(st.text(max_size=12) | st.integers(0, 3), inner, max_size=4)
    ),
    max_leaves=12,
)
field_names = sorted(
    {f.encode_name for _, _, s in SCHEMAS for f in msgspec.structs.fields(s)}
    | {"error_code", "error_message"}
)
wire_maps = st.dictionaries(st.sampled_from(field_names) | st.text(max_size=6), msgpack_values)


@settings(deadline=None, max_examples=300)
@given(st.sampled_from([s for _, _, s in SCHEMAS] + [ErrorBody]), wire_maps | msgpack_values)
def test_any_msgpack_decodes_or_is_refused(schema: type[msgspec.Struct], value: object) -> None:
    data = msgspec.msgpack.encode(value)
    try:
        body = decode_body(schema, data)
    except InvalidRequestError:
        return
    assert type(body) is schema


# --- bugs -----------------------------------------------------------------------------------

#: A DeleteTopicRequest whose name is two bytes of invalid UTF-8.
INVALID_UTF8 = b"\x81\xa4name\xa2\xff\xfe"
#: A PingRequest with an unknown field holding 100,000 nested arrays.
DEEP = b"\x81\xa1z" + b"\x91" * 100_000 + b"\xc0"


def test_invalid_utf8_is_an_invalid_request() -> None:
    refused(DeleteTopicRequest, INVALID_UTF8)


def test_deep_nesting_is_an_invalid_request() -> None:
    refused(PingRequest, DEEP)
