"""The codec against an independent one: kafka-python's own schema-driven codec
(``kafka.protocol``, written from Kafka's JSON message definitions by other people).

For a representative body of every API at every advertised version and every flexible one:
the frames our encoder writes decode with kafka-python to the same values, and the frames
kafka-python writes from those values decode with ours to them, headers included (request
header v1/v2, response header v0/v1, ApiVersions answering in header v0 whatever its version).
"""

from __future__ import annotations

import importlib
import pkgutil
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.kafka._codec_support import (
    FAST,
    SLOW,
    all_versions,
    body_for,
    plain,
    supported_and_flexible,
)
from tidewire.protocol.kafka import (
    RequestHeader,
    decode_request,
    decode_response,
    encode_request,
    encode_response,
)
from tidewire.protocol.kafka.schema import layout

kafka_protocol = pytest.importorskip("kafka.protocol")
api_message = importlib.import_module("kafka.protocol.api_message")


def _subclasses(cls: type) -> Iterator[type]:
    for sub in cls.__subclasses__():
        yield sub
        yield from _subclasses(sub)


def _registry() -> dict[tuple[int, str], Any]:
    for mod in pkgutil.walk_packages(kafka_protocol.__path__, "kafka.protocol."):
        importlib.import_module(mod.name)
    out: dict[tuple[int, str], Any] = {}
    for cls in _subclasses(api_message.ApiMessage):
        if getattr(cls, "_class_version", None) is None and getattr(cls, "_json", None):
            out[(cls.API_KEY, cls.type)] = cls
    return out


KP = _registry()
CASES = [
    (api, v)
    for api, v in supported_and_flexible()
    if all(v <= KP[(api, kind)].max_version for kind in ("request", "response"))
]
IDS = [f"{api}-v{v}" for api, v in CASES]


def _kp_dict(obj: Any) -> Any:
    """A kafka-python message or struct as a dict of the fields of its version."""
    return plain(obj.to_dict(json=False))


_ZERO_UUID = uuid.UUID(int=0)
_NO_OPERATIONS = -(2**31)


def _tagged_names() -> frozenset[str]:
    out = set()
    for api, kind, version in all_versions():
        stack = [layout(api, kind, version)]
        while stack:
            lay = stack.pop()
            if lay is None:
                continue
            out.update(f.name for f in lay.tagged)
            stack.extend(f.struct for f in (*lay.fields, *lay.tagged) if f.struct is not None)
    return frozenset(out)


_TAGGED = _tagged_names()
#: Fields kafka-python's schemas (Kafka 4) name otherwise than Kafka 3.9's: same place, type.
_RENAMED = {
    "authorized_operations": ("cluster_authorized_operations", "topic_authorized_operations")
}


def _ours(key: str, ours: dict[str, Any]) -> str:
    """The name in our body of kafka-python's field ``key``."""
    if key in ours:
        return key
    return next((n for n in _RENAMED.get(key, ()) if n in ours), key)


def _same(ours: Any, theirs: Any, where: str = "body") -> None:
    """Every value kafka-python decoded equals ours (ours also holds the fields the
    version lacks, at their defaults, which kafka-python leaves out)."""
    if isinstance(theirs, dict):
        assert isinstance(ours, dict), where
        for key, value in theirs.items():
            name = _ours(key, ours)
            assert name in ours, f"{where}.{key}: kafka-python has a field we lack"
            _same(ours[name], value, f"{where}.{name}")
    elif isinstance(theirs, list):
        assert isinstance(ours, list), where
        assert len(ours) == len(theirs), where
        for i, (a, b) in enumerate(zip(ours, theirs, strict=True)):
            _same(a, b, f"{where}[{i}]")
    elif theirs is None and ours == _ZERO_UUID:
        return  # kafka-python reads the zero UUID as None
    elif theirs is None and ours == _NO_OPERATIONS and where.endswith("authorized_operations"):
        return  # and INT32_MIN authorized operations ("not asked for") as None
    elif isinstance(theirs, (set, frozenset)) and isinstance(ours, int):
        # and authorized operations as the set of their bits
        assert theirs == {i for i in range(32) if (ours & 0xFFFFFFFF) >> i & 1}, where
    elif theirs is None and isinstance(ours, dict) and where.rsplit(".", 1)[-1] in _TAGGED:
        return  # and a tagged struct left out (at its default) as None
    else:
        assert ours == theirs, f"{where}: ours {ours!r} kafka-python {theirs!r}"


def _build(struct: Any, data_class: Any, value: dict[str, Any], version: int) -> Any:
    """A kafka-python object of ``value``, field by field, at ``version``."""
    kwargs = {}
    for field in struct._fields:
        name = _ours(field.name, value)
        if not field.for_version_q(version) or name not in value:
            continue
        v = value[name]
        if v is not None and field.is_struct():
            v = _build(field, field.data_class, v, version)
        elif v is not None and field.is_struct_array():
            v = [_build(field.array_of, field.data_class, x, version) for x in v]
        kwargs[field.name] = v
    return data_class(version=version, **kwargs)


def _decode_with_kafka_python(cls: Any, version: int, frame: bytes) -> Any:
    return cls.decode(frame[4:], version=version, header=True)


def _requests_agree(api: int, version: int, data: st.DataObject) -> None:
    cls = KP[(api, "request")]
    body = data.draw(body_for(api, "request", version))
    header = RequestHeader(api, version, 42, "oracle")
    frame = encode_request(header, body)
    theirs = _decode_with_kafka_python(cls, version, frame)
    assert theirs.header.request_api_key == api
    assert theirs.header.request_api_version == version
    assert theirs.header.correlation_id == 42
    assert theirs.header.client_id == "oracle"
    _same(plain(body), _kp_dict(theirs))
    # and back: kafka-python writes the values; ours reads them
    msg = _build(cls._struct, cls, _kp_dict(theirs), version)
    msg.with_header(correlation_id=43, client_id="kp")
    got_header, got = decode_request(bytes(msg.encode(header=True)))
    assert got_header == RequestHeader(api, version, 43, "kp")
    _same(plain(got), _kp_dict(theirs))


def _responses_agree(api: int, version: int, data: st.DataObject) -> None:
    cls = KP[(api, "response")]
    body = data.draw(body_for(api, "response", version))
    if api == 18 and body.get("error_code"):  # kafka-python reads errors in the v0 layout
        body["error_code"] = 0
    frame = encode_response(RequestHeader(api, version, 7, None), body)
    theirs = _decode_with_kafka_python(cls, version, frame)
    assert theirs.header.correlation_id == 7
    _same(plain(body), _kp_dict(theirs))
    msg = _build(cls._struct, cls, _kp_dict(theirs), version)
    msg.with_header(correlation_id=8)
    cid, got = decode_response(api, version, bytes(msg.encode(header=True)))
    assert cid == 8
    _same(plain(got), _kp_dict(theirs))


@pytest.mark.parametrize(("api", "version"), CASES, ids=IDS)
@settings(FAST)
@given(data=st.data())
def test_requests_agree(api: int, version: int, data: st.DataObject) -> None:
    _requests_agree(api, version, data)


@pytest.mark.parametrize(("api", "version"), CASES, ids=IDS)
@settings(FAST)
@given(data=st.data())
def test_responses_agree(api: int, version: int, data: st.DataObject) -> None:
    _responses_agree(api, version, data)


@pytest.mark.slow
@pytest.mark.parametrize(("api", "version"), CASES, ids=IDS)
@settings(SLOW)
@given(data=st.data())
def test_many_agree(api: int, version: int, data: st.DataObject) -> None:
    _requests_agree(api, version, data)
    _responses_agree(api, version, data)


def test_the_flexible_versions_clients_use_are_checked() -> None:
    for case in [(18, 3), (60, 0), (60, 1), (3, 9), (3, 12), (1, 12), (1, 16), (0, 9), (11, 6)]:
        assert case in CASES, case


def test_api_versions_v3_response_in_header_v0() -> None:
    """KIP-511: the ApiVersions response header has no tagged fields at any version, while
    its v3 body is flexible; librdkafka's first request is ApiVersions v3."""
    body = {
        "error_code": 0,
        "api_keys": [{"api_key": 0, "min_version": 3, "max_version": 7}],
        "throttle_time_ms": 0,
        "finalized_features_epoch": -1,
    }
    frame = encode_response(RequestHeader(18, 3, 5, None), body)
    # size, correlation id, then the body at once: error code 0, compact array of 1
    assert frame[4:8] == (5).to_bytes(4, "big")
    assert frame[8:10] == b"\x00\x00"
    assert frame[10] == 2
    theirs = _decode_with_kafka_python(KP[(18, "response")], 3, frame)
    assert theirs.api_keys[0].max_version == 7
    # an UNSUPPORTED_VERSION answer written at v0 for a v3 request
    err = encode_response(RequestHeader(18, 3, 6, None), {**body, "error_code": 35}, version=0)
    old = _decode_with_kafka_python(KP[(18, "response")], 3, err)
    assert old.error_code == 35
    assert [(k.api_key, k.min_version, k.max_version) for k in old.api_keys] == [(0, 3, 7)]


def test_metadata_v12_topic_ids() -> None:
    topic_id = uuid.uuid4()
    lay = layout(3, "response", 12)
    assert lay is not None
    body = lay.defaults()
    body["topics"] = [{"name": "t", "topic_id": topic_id, "partitions": []}]
    frame = encode_response(RequestHeader(3, 12, 1, None), body)
    theirs = _decode_with_kafka_python(KP[(3, "response")], 12, frame)
    assert theirs.topics[0].topic_id == topic_id
    assert theirs.topics[0].name == "t"
