"""Shared pieces of the Kafka codec tests: hypothesis strategies built from the schema
layouts themselves (so every field of every version is covered, whatever the schemas hold),
the list of every (api key, kind, version) the schemas define, and value normalisation."""

from __future__ import annotations

import os
import uuid
from typing import Any

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

from tidewire.protocol.kafka import SUPPORTED
from tidewire.protocol.kafka.schema import FieldSpec, Layout, flexible, layout, valid_versions

# The default run tries a few bodies per (api, kind, version) — there are about 450 of them;
# the slow run (pytest -m slow) tries many. KAFKA_CODEC_EXAMPLES overrides both.
settings.register_profile(
    "kafka-codec-fast",
    max_examples=int(os.environ.get("KAFKA_CODEC_EXAMPLES", "3")),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    derandomize=False,
)
settings.register_profile(
    "kafka-codec-slow",
    max_examples=int(os.environ.get("KAFKA_CODEC_EXAMPLES", "150")),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
FAST = settings.get_profile("kafka-codec-fast")
SLOW = settings.get_profile("kafka-codec-slow")

KINDS = ("request", "response")


def all_versions() -> list[tuple[int, str, int]]:
    """Every (api key, kind, version) the schemas define, supported or not."""
    out = []
    for api in sorted(SUPPORTED):
        for kind in KINDS:
            rng = valid_versions(api, kind)
            assert rng is not None, (api, kind)
            lo, hi = rng
            out.extend((api, kind, v) for v in range(lo, hi + 1))
    return out


def supported_and_flexible() -> list[tuple[int, int]]:
    """(api key, version) pairs of every SUPPORTED version and every flexible version."""
    out = []
    for api, (lo, hi) in sorted(SUPPORTED.items()):
        top = valid_versions(api, "request")
        assert top is not None
        for v in range(top[0], top[1] + 1):
            if lo <= v <= hi or flexible(api, v):
                out.append((api, v))
    return out


_INTS = {
    "int8": (-(2**7), 2**7 - 1),
    "int16": (-(2**15), 2**15 - 1),
    "uint16": (0, 2**16 - 1),
    "int32": (-(2**31), 2**31 - 1),
    "uint32": (0, 2**32 - 1),
    "int64": (-(2**63), 2**63 - 1),
}
_TEXT = st.text(max_size=12)
_BLOB = st.binary(max_size=24)


def _ints(lo: int, hi: int) -> st.SearchStrategy[int]:
    # Edges and small values more often than uniform draws would give them.
    return st.one_of(st.sampled_from([lo, hi, 0, -1 if lo < 0 else 1]), st.integers(lo, hi))


def _value(f: FieldSpec, depth: int) -> st.SearchStrategy[Any]:
    kind = f.kind
    base: st.SearchStrategy[Any]
    if kind in _INTS:
        base = _ints(*_INTS[kind])
    elif kind == "float64":
        base = st.floats(allow_nan=False)
    elif kind == "bool":
        base = st.booleans()
    elif kind == "string":
        base = _TEXT
    elif kind in ("bytes", "records"):
        base = _BLOB
    elif kind == "uuid":
        base = st.one_of(st.just(uuid.UUID(int=0)), st.uuids())
    else:
        assert f.struct is not None
        base = body(f.struct, depth + 1)
    if not f.array and f.nullable:
        return st.one_of(st.none(), base)
    return base


def _field(f: FieldSpec, depth: int) -> st.SearchStrategy[Any]:
    if not f.array:
        return _value(f, depth)
    # Shallow lists at depth: nested arrays of arrays grow fast.
    items = st.lists(_value(f, depth), max_size=3 if depth < 2 else 1)
    return st.one_of(st.none(), items) if f.nullable else items


def body(lay: Layout, depth: int = 0) -> st.SearchStrategy[dict[str, Any]]:
    """Valid bodies of ``lay``: every field of the version (tagged ones too) drawn, the fields
    the version lacks at their defaults (what decoding fills them with)."""
    fields: dict[str, st.SearchStrategy[Any]] = {}
    for f in (*lay.fields, *lay.tagged):
        fields[f.name] = _field(f, depth)
    for f in lay.absent:
        fields[f.name] = st.builds(f.fresh_default)
    return st.fixed_dictionaries(fields)


def body_for(api: int, kind: str, version: int) -> st.SearchStrategy[dict[str, Any]]:
    lay = layout(api, kind, version)
    assert lay is not None, (api, kind, version)
    return body(lay)


def plain(value: Any) -> Any:
    """``value`` with memoryviews and bytearrays as bytes, recursively (for comparing)."""
    if isinstance(value, (memoryview, bytearray)):
        return bytes(value)
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [plain(v) for v in value]
    return value
