"""The compiled record codec against the pure-Python one, directly: the same batch bytes from
the same appends, the same records (and columns) from the same batches, the same errors, class
and message, from damaged ones; and the choice between them (``TIDEWIRE_PURE_PYTHON``)."""

from __future__ import annotations

import os
import re
import struct
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

import tidewire.records
from tests.records import _batches
from tests.records.conftest import Row, outcome, require
from tidewire.errors import RecordBatchError
from tidewire.records import builder, reader
from tidewire.records.batch import BATCH_OVERHEAD, check_batch

LIMIT = 1 << 20
INT64_MAX = 2**63 - 1


@pytest.fixture(scope="module")
def compiled() -> SimpleNamespace:
    return require("compiled")


PURE = SimpleNamespace(
    name="python",
    BatchBuilder=builder.BatchBuilder,
    read_records=reader.read_records,
    read_columns=reader.read_columns,
)


def build_with(impl: SimpleNamespace, spec: _batches.BatchSpec) -> bytes:
    b = impl.BatchBuilder(
        codec=spec.codec,
        producer_id=spec.producer_id,
        producer_epoch=spec.producer_epoch,
        base_sequence=spec.base_sequence,
        partition_leader_epoch=spec.partition_leader_epoch,
        timestamp_type=spec.timestamp_type,
        base_offset=spec.base_offset,
    )
    sizes = []
    for i, r in enumerate(spec.records):
        assert b.append(r.value, timestamp_ms=r.timestamp, key=r.key, headers=r.headers) == i
        sizes.append((len(b), b.size_in_bytes))
    data: bytes = b.build()
    return data + repr(sizes).encode()  # the bookkeeping is compared too


def read_both(
    impl: SimpleNamespace, buf: bytes, start: int, lo: int = 0, hi: int = INT64_MAX
) -> tuple[Any, Any]:
    """(read_records outcome, read_columns outcome as rows) of the batch at ``buf[start:]``."""
    h = check_batch(buf, start)
    rows = outcome(lambda: impl.read_records(buf, start, h, Row, "t", 7, lo, LIMIT, hi))
    cols = outcome(lambda: impl.read_columns(buf, start, h, lo, LIMIT, hi))
    if isinstance(cols, tuple) and len(cols) == 5:
        assert len({len(c) for c in cols}) == 1
        cols = [Row("t", 7, *r) for r in zip(*cols, strict=True)]
    return rows, cols


@settings(deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_batches.batch_specs(min_records=0, max_records=20))
def test_the_same_bytes_from_the_same_appends(compiled: SimpleNamespace, spec: Any) -> None:
    assert build_with(compiled, spec) == build_with(PURE, spec)


@settings(deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    _batches.batch_specs(min_records=1, max_records=20),
    st.binary(max_size=9),
    st.integers(-3, 25),
    st.integers(-3, 25),
)
def test_the_same_records_from_the_same_batch(
    compiled: SimpleNamespace, spec: Any, pad: bytes, lo: int, hi: int
) -> None:
    batch = _batches.build(spec)
    buf = pad + batch + pad
    base = spec.base_offset
    expected = [
        Row("t", 7, *r) for r in reader.decode_batch(batch)[1] if base + lo <= r.offset <= base + hi
    ]
    assert read_both(PURE, buf, len(pad), base + lo, base + hi) == (expected, expected)
    assert read_both(compiled, buf, len(pad), base + lo, base + hi) == (expected, expected)


@settings(deadline=None, max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(
    _batches.batch_specs(min_records=1, max_records=8),
    st.lists(st.tuples(st.integers(0, 10**6), st.integers(0, 255)), min_size=1, max_size=4),
    st.integers(-2, 2),
)
def test_the_same_error_from_the_same_damage(
    compiled: SimpleNamespace, spec: Any, edits: list[tuple[int, int]], grow: int
) -> None:
    """Bytes of the uncompressed records section overwritten (and the section cut or grown),
    the batch resealed (so its CRC holds): both raise the reference's error, or both read
    the same records."""
    batch = bytearray(_batches.build(spec._replace(codec=_batches.Codec.NONE)))
    assume(len(batch) > BATCH_OVERHEAD)
    for at, byte in edits:
        batch[BATCH_OVERHEAD + at % (len(batch) - BATCH_OVERHEAD)] = byte
    if grow < 0:
        del batch[grow:]
    else:
        batch += b"\x00" * grow
    sealed = _batches.reseal(batch)
    try:
        check_batch(sealed)
    except RecordBatchError:
        return  # a header the readers are never given
    expected: Any
    try:
        expected = [Row("t", 7, *r) for r in reader.decode_batch(sealed)[1]]
    except RecordBatchError as exc:
        expected = (type(exc), str(exc))
    assert read_both(PURE, sealed, 0) == (expected, expected)
    assert read_both(compiled, sealed, 0) == (expected, expected)


def raw(*records: bytes, **fields: int) -> bytes:
    return _batches.raw_batch(list(records), **fields)


VARINT_CASES = {
    # a record's length written in 5 bytes (not minimal, still a valid 32-bit varint)
    "five-byte length": raw(_batches.raw_record(length_prefix=b"\x94\x80\x80\x80\x00")),
    "six-byte length": raw(_batches.raw_record(length_prefix=b"\x94\x80\x80\x80\x80\x00")),
    "length past int32": raw(_batches.raw_record(length_prefix=b"\x94\x80\x80\x80\x7f")),
    "timestamp delta of int64 max": raw(_batches.raw_record(timestamp_delta=INT64_MAX)),
    "timestamp delta of int64 min": raw(_batches.raw_record(timestamp_delta=-(2**63))),
    "offset delta past int32": raw(_batches.raw_record(offset_delta=2**31)),
    "offset delta negative": raw(_batches.raw_record(offset_delta=-1)),
    "header key not UTF-8": raw(_batches.raw_record(headers=[(b"\xff", b"v")])),
    "header key null": raw(_batches.raw_record(headers=[(None, b"v")])),
    "header value null": raw(_batches.raw_record(headers=[(b"k", None), (b"\xc3\xa9", b"")])),
    "trailing byte in the record": raw(_batches.raw_record(body_suffix=b"\x00")),
    "fewer records than declared": raw(_batches.raw_record(), records_count=2),
    "offsets past int64": raw(
        _batches.raw_record(), _batches.raw_record(offset_delta=1), base_offset=INT64_MAX
    ),
    "timestamps past int64": raw(
        _batches.raw_record(timestamp_delta=5), first_timestamp=INT64_MAX - 2
    ),
}


@pytest.mark.parametrize("case", sorted(VARINT_CASES))
def test_edges_read_the_same(compiled: SimpleNamespace, case: str) -> None:
    batch = VARINT_CASES[case]
    assert read_both(compiled, batch, 0) == read_both(PURE, batch, 0)


def test_the_edges_cover_both_outcomes() -> None:
    results = [read_both(PURE, b, 0)[0] for b in VARINT_CASES.values()]
    assert any(isinstance(r, list) and r for r in results)
    assert any(isinstance(r, tuple) for r in results)
    wide = read_both(PURE, VARINT_CASES["timestamps past int64"], 0)[0]
    assert wide[0].timestamp == INT64_MAX + 3  # Python ints, as the pure reader gives


def test_a_plain_tuple_factory(compiled: SimpleNamespace) -> None:
    b = compiled.BatchBuilder()
    b.append(b"v", key=b"k", timestamp_ms=5, headers=[("h", None)])
    batch = b.build()
    got = compiled.read_records(batch, 0, check_batch(batch), tuple, "t", 0)
    assert got == [("t", 0, 0, 5, b"k", b"v", (("h", None),))]
    assert type(got[0]) is tuple


def append_error(impl: SimpleNamespace, **kwargs: Any) -> tuple[type, str]:
    b = impl.BatchBuilder()
    b.append(b"first", timestamp_ms=1_000)
    try:
        b.append(**({"value": b"v", "timestamp_ms": 2_000} | kwargs))
    except Exception as exc:
        return type(exc), str(exc)
    raise AssertionError(f"append({kwargs}) was accepted")


@pytest.mark.parametrize(
    ("kwargs", "same_message"),
    [
        ({"timestamp_ms": 2**63 + 5_000}, True),  # a delta past 64 bits
        ({"timestamp_ms": -(2**63) - 1}, True),
        ({"headers": [("k",)]}, True),  # not a pair
        ({"headers": [(b"k", b"v")]}, True),  # a bytes key: str required
        ({"headers": [("\ud800", b"v")]}, True),  # not encodable as UTF-8
        ({"value": "text"}, False),  # str is not bytes: the messages are the runtimes' own
        ({"key": 5}, False),
    ],
)
def test_the_same_append_errors(
    compiled: SimpleNamespace, kwargs: dict[str, Any], same_message: bool
) -> None:
    got, expected = append_error(compiled, **kwargs), append_error(PURE, **kwargs)
    assert got[0] is expected[0]
    if same_message:
        assert got == expected


def _appended(impl: Any, buf: Any, spec: Any) -> Any:
    """``spec``'s records through ``impl.append_record`` into ``buf`` (sizes returned), or the
    class and message of the error it raises."""
    first = spec.records[0].timestamp
    sizes = []
    try:
        for i, r in enumerate(spec.records):
            headers = builder._encode_headers(r.headers) if r.headers else b"\x00"
            sizes.append(impl.append_record(buf, r.value, r.key, headers, r.timestamp - first, i))
    except ValueError as exc:
        return type(exc), str(exc)
    return sizes


@settings(deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_batches.batch_specs(min_records=1, max_records=20))
def test_append_record_writes_the_builders_records(compiled: SimpleNamespace, spec: Any) -> None:
    """The producer's ``append_record``: both twins (the compiled one into a bytearray, the
    pure one into a bytearray or a list of parts) write the records section BatchBuilder
    writes, return each record's size, and refuse a delta past 64 bits alike."""
    from tidewire.records import _speedups  # type: ignore[attr-defined]

    b = builder.BatchBuilder()
    try:
        for r in spec.records:
            b.append(r.value, timestamp_ms=r.timestamp, key=r.key, headers=r.headers)
        section: Any = b.build()[BATCH_OVERHEAD:]
    except ValueError as exc:
        section = type(exc), str(exc)
    got = []
    for impl, buf in (
        (_speedups, bytearray(b"room")),
        (builder, bytearray(b"room")),
        (builder, [b"room"]),
    ):
        sizes = _appended(impl, buf, spec)
        if isinstance(sizes, list):
            data = bytes(buf) if isinstance(buf, bytearray) else b"".join(buf)
            assert data[:4] == b"room"
            assert sum(sizes) == len(data) - 4
            got.append(data[4:])
        else:
            got.append(sizes)
    assert got[0] == got[1] == got[2]
    if isinstance(section, bytes):
        assert got[0] == section
    else:  # the builder refuses the same timestamps, with its own message
        assert isinstance(got[0], tuple)
        assert got[0][0] is section[0]


def test_append_record_takes_bytes_like_values_and_keys(compiled: SimpleNamespace) -> None:
    """A bytearray or memoryview value or key (``send_values`` passes the caller's values on
    as they are) is written as its bytes by both twins; something not bytes-like is refused."""
    from tidewire.records import _speedups  # type: ignore[attr-defined]

    want = bytearray()
    builder.append_record(want, b"value", b"key", b"\x00", 0, 0)
    for value, key in ((bytearray(b"value"), memoryview(b"key")), (memoryview(b"value"), b"key")):
        for impl in (_speedups, builder):
            buf = bytearray()
            assert impl.append_record(buf, value, key, b"\x00", 0, 0) == len(want)
            assert buf == want
    for impl in (_speedups, builder):
        with pytest.raises(TypeError):
            impl.append_record(bytearray(), 5, None, b"\x00", 0, 0)


def test_append_after_build(compiled: SimpleNamespace) -> None:
    for impl in (compiled, PURE):
        b = impl.BatchBuilder()
        b.append(b"v", timestamp_ms=1)
        first = b.build()
        assert b.build() == first
        with pytest.raises(RuntimeError, match=r"append\(\) after build\(\)"):
            b.append(b"v", timestamp_ms=1)


def test_bytes_like_values(compiled: SimpleNamespace) -> None:
    """bytearray and memoryview values, keys and header values are written as their bytes."""
    out = []
    for impl in (compiled, PURE):
        b = impl.BatchBuilder()
        b.append(bytearray(b"ab"), key=memoryview(b"k"), timestamp_ms=3, headers=[("h", b"x")])
        out.append(b.build())
    assert out[0] == out[1]


def implementation_in_a_process(env_value: str | None) -> str:
    env = {k: v for k, v in os.environ.items() if k != "TIDEWIRE_PURE_PYTHON"}
    if env_value is not None:
        env["TIDEWIRE_PURE_PYTHON"] = env_value
    code = (
        "import tidewire.records as r; "
        "print(r.IMPLEMENTATION, r.BatchBuilder.__module__, r.read_records.__module__, "
        "r.read_columns.__module__)"
    )
    return subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    ).stdout.strip()


@pytest.mark.parametrize("value", ["1", "true", "YES", " yes "])
def test_the_environment_forces_the_pure_implementation(value: str) -> None:
    assert implementation_in_a_process(value) == (
        "python tidewire.records.builder tidewire.records.reader tidewire.records.reader"
    )


@pytest.mark.parametrize("value", [None, "0", "", "no"])
def test_the_compiled_implementation_is_chosen_when_built(
    compiled: SimpleNamespace, value: str | None
) -> None:
    assert implementation_in_a_process(value) == (
        "compiled tidewire.records._speedups tidewire.records._speedups tidewire.records._speedups"
    )


def test_this_process_uses_what_it_reports() -> None:
    from tidewire.records import _impl

    assert tidewire.records.IMPLEMENTATION == _impl.IMPLEMENTATION
    if _impl.IMPLEMENTATION == "compiled":
        assert _impl.read_records.__module__ == "tidewire.records._speedups"
    else:
        assert _impl.read_records is reader.read_records


def test_the_compiled_source_does_no_io() -> None:
    """The Cython source's imports (which test_purity's Python parser cannot read): only
    tidewire.records, tidewire.errors and C declarations, nothing of test_purity's list."""
    from tests.test_purity import FORBIDDEN_MODULES

    # From the checkout: an installed package holds the built module, not its source.
    pyx = Path(__file__).resolve().parents[2] / "src" / "tidewire" / "records" / "_speedups.pyx"
    source = pyx.read_text("utf-8")
    modules = re.findall(r"^(?:from|import|cimport)\s+([\w.]+)", source, re.MULTILINE)
    assert modules
    for module in modules:
        assert module.split(".")[0] not in FORBIDDEN_MODULES, module
        assert module.split(".")[0] in {"cpython", "libc"} or module.startswith(
            ("tidewire.records", "tidewire.errors")
        ), module
    assert not re.search(r"\bopen\(|__import__|import_module", source)


def test_a_failed_build_fails_again(compiled: SimpleNamespace) -> None:
    """A header field out of range (here the producer id) fails build() with struct's error,
    again on the next call: the records are not lost to the first attempt."""
    messages = []
    for impl in (compiled, PURE):
        b = impl.BatchBuilder(producer_id=2**64)
        b.append(b"v", timestamp_ms=1)
        for _ in range(2):
            with pytest.raises(struct.error) as info:
                b.build()
            messages.append(str(info.value))
    assert len(set(messages)) == 1


@pytest.mark.parametrize("codec", [_batches.Codec.NONE, _batches.Codec.ZSTD])
def test_large_batches_grow_in_place(compiled: SimpleNamespace, codec: _batches.Codec) -> None:
    """Records past the first buffer's size (4 KiB) and then past many doublings."""
    out = []
    for impl in (compiled, PURE):
        b = impl.BatchBuilder(codec=codec)
        for i in range(300):
            b.append(bytes([i % 251]) * (i * 37 % 9000), key=b"k" * (i % 3), timestamp_ms=i)
        out.append((b.size_in_bytes, b.build()))
    assert out[0] == out[1]
