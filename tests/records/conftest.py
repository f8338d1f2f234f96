"""The conformance harness: every test module here that builds or reads batches runs once per
implementation of the hot loops (``python``: builder.py and reader.py; ``compiled``: the
Cython ``_speedups``), whichever one ``tidewire.records`` chose for this process.

For the module's tests (parameter ``records_impl``) an autouse fixture puts that implementation's
``BatchBuilder``, ``read_records`` and ``read_columns`` in place of the module's own names
(and of the shared helpers' in ``_batches``), and wraps ``decode_batch`` (the reference
reader every round-trip, malformed-input and mutation test calls) so that each call also
reads the batch with the implementation's ``read_records``, ``read_columns`` and
``read_spans`` (its columns made) and checks
that they return the same records or raise the same error, class and message.

Without the compiled module (a checkout not built with ``python setup.py build_ext
--inplace``) its half is skipped, or fails when ``TIDEWIRE_REQUIRE_COMPILED=1`` (CI, after
``pip install``, which builds it).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any, NamedTuple

import pytest

import tidewire.records
from tests.records import _batches
from tidewire.errors import RecordBatchError
from tidewire.records import builder, reader
from tidewire.records.batch import check_batch
from tidewire.records.compression import MAX_DECOMPRESSED_BYTES

#: The names an implementation provides.
HOT = (
    "BatchBuilder",
    "read_records",
    "read_columns",
    "read_spans",
    "int64_columns",
    "binary_columns",
)
#: A module using any of these names (or decode_batch, which the harness checks through the
#: implementation's readers) runs once per implementation.
USES = (*HOT, "build", "build_batch", "decode_batch")
IMPLEMENTATIONS = ("python", "compiled")
#: The readers' offset window that leaves nothing out (a mutated base offset may be negative).
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1


def load(name: str) -> SimpleNamespace | None:
    """The hot names of implementation ``name``; None when it is not built."""
    if name == "python":
        return SimpleNamespace(
            name=name,
            BatchBuilder=builder.BatchBuilder,
            read_records=reader.read_records,
            read_columns=reader.read_columns,
            read_spans=reader.read_spans,
            int64_columns=reader.int64_columns,
            binary_columns=reader.binary_columns,
        )
    try:
        from tidewire.records import _speedups  # type: ignore[attr-defined]
    except ImportError:
        return None
    return SimpleNamespace(
        name=name,
        BatchBuilder=_speedups.BatchBuilder,
        read_records=_speedups.read_records,
        read_columns=_speedups.read_columns,
        read_spans=_speedups.read_spans,
        int64_columns=_speedups.int64_columns,
        binary_columns=_speedups.binary_columns,
    )


def require(name: str) -> SimpleNamespace:
    """:func:`load`, skipping (or failing, under TIDEWIRE_REQUIRE_COMPILED=1) when not built."""
    impl = load(name)
    if impl is None:
        message = "the compiled record codec is not built (python setup.py build_ext --inplace)"
        if os.environ.get("TIDEWIRE_REQUIRE_COMPILED") == "1":
            pytest.fail(message)
        pytest.skip(message)
    return impl


class Row(NamedTuple):
    topic: str
    partition: int
    offset: int
    timestamp: int
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes | None], ...]


def outcome(fn: Callable[[], Any]) -> Any:
    """What ``fn()`` returns, or the class and message of the RecordBatchError it raises."""
    try:
        return fn()
    except RecordBatchError as exc:
        return type(exc), str(exc)


def checked_decode_batch(impl: SimpleNamespace) -> Callable[..., Any]:
    """``decode_batch`` that also reads each whole, checked batch with ``impl``'s readers."""
    reference = reader.decode_batch

    def decode_batch(batch: Any, *, decompression_limit: int = MAX_DECOMPRESSED_BYTES) -> Any:
        try:
            h = check_batch(batch)
        except RecordBatchError:
            h = None  # the readers take batches whose header was checked: nothing to compare
        if h is not None and h.size == len(batch):
            data = bytes(batch)
            expected = outcome(
                lambda: [
                    Row("t", 1, *r)
                    for r in reference(data, decompression_limit=decompression_limit)[1]
                ]
            )
            padded = b"\x81" * 5 + data + b"\x80" * 5  # in place, between other bytes
            got = outcome(
                lambda: impl.read_records(
                    padded, 5, h, Row, "t", 1, INT64_MIN, decompression_limit, INT64_MAX
                )
            )
            assert got == expected, f"read_records ({impl.name}) differs from the reference"
            columns = outcome(lambda: impl.read_columns(data, 0, h, INT64_MIN, decompression_limit))
            if isinstance(columns, tuple) and len(columns) == 5:
                columns = [Row("t", 1, *row) for row in zip(*columns, strict=True)]
            assert columns == expected, f"read_columns ({impl.name}) differs from the reference"
            spans = outcome(lambda: impl.read_spans(padded, 5, h, INT64_MIN, decompression_limit))
            if not isinstance(spans, tuple):  # made: its columns, whole and one by one
                assert [spans.column(i) for i in range(5)] == list(spans.columns())
                assert len(spans) == len(spans.column(0))
                spans = [Row("t", 1, *row) for row in zip(*spans.columns(), strict=True)]
            assert spans == expected, f"read_spans ({impl.name}) differs from the reference"
        return reference(batch, decompression_limit=decompression_limit)

    return decode_batch


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    module = metafunc.module
    if any(hasattr(module, name) for name in USES):
        metafunc.fixturenames.append("records_impl")
        metafunc.parametrize("records_impl", IMPLEMENTATIONS, scope="module")


@pytest.fixture(autouse=True)
def _records_impl_in_place(
    request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> SimpleNamespace | None:
    """Put the implementation of this test's ``records_impl`` parameter in place (autouse,
    so hypothesis tests may use it: it is the same for every example)."""
    callspec = getattr(request.node, "callspec", None)
    if callspec is None or "records_impl" not in callspec.params:
        return None
    impl = require(callspec.params["records_impl"])
    for module in (request.module, _batches, tidewire.records):
        for name in HOT:
            if hasattr(module, name):
                monkeypatch.setattr(module, name, getattr(impl, name))
    if hasattr(request.module, "decode_batch"):
        monkeypatch.setattr(request.module, "decode_batch", checked_decode_batch(impl))
    return impl
