"""Which implementation of the per-record hot loops runs: the compiled one
(``tidewire.records._speedups``, built from ``_speedups.pyx`` by ``pip install``) or the
pure-Python one (reader.py, builder.py). Pure, no I/O: the environment is read once, at import.

The compiled module is used unless it is missing (no C compiler at install time, or a source
checkout that was not built) or ``TIDEWIRE_PURE_PYTHON`` is ``1``, ``true`` or ``yes``. Both
pass the same conformance suite (tests/records) and return the same records and errors.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from types import ModuleType
from typing import Any, Final

from tidewire.records import builder as _pure_builder
from tidewire.records import reader as _pure_reader

__all__ = [
    "COMPILED",
    "IMPLEMENTATION",
    "PURE_PYTHON_ENV",
    "RECORDS_AS_PARTS",
    "BatchBuilder",
    "OpenRecords",
    "Spans",
    "append_record",
    "append_routed",
    "binary_columns",
    "fnv1a_32",
    "int64_columns",
    "read_columns",
    "read_records",
    "read_spans",
    "recycle_buffer",
]

#: The environment variable that forces the pure-Python implementation.
PURE_PYTHON_ENV: Final = "TIDEWIRE_PURE_PYTHON"


def _compiled() -> ModuleType | None:
    if os.environ.get(PURE_PYTHON_ENV, "").strip().lower() in {"1", "true", "yes"}:
        return None
    try:
        from tidewire.records import _speedups  # type: ignore[attr-defined]  # noqa: PLC0415
    except ImportError:
        return None
    return _speedups  # type: ignore[no-any-return]


#: The compiled module, or None when the pure-Python implementation runs.
COMPILED: Final = _compiled()
#: ``"compiled"`` or ``"python"``: the implementation that runs.
IMPLEMENTATION: Final = "python" if COMPILED is None else "compiled"

#: Whether a producer's batch keeps its records as a list of parts, joined once at build (the
#: pure twin: cheaper in Python), or in one growing bytearray (the compiled twin).
RECORDS_AS_PARTS: Final = COMPILED is None

BatchBuilder: type[_pure_builder.BatchBuilder]
#: The producer's one-call path for a message into the open batch it is routed to (compiled
#: only: see ``_speedups.append_routed``); None where the Python path does it all.
append_routed: Callable[..., Any] | None
#: Keeps a finished batch's buffer for the next one (compiled only: see
#: ``_speedups.recycle_buffer``); None where buffers are not reused.
recycle_buffer: Callable[[list[bytearray], Any, int], bool] | None
#: The key hash of the client's partitioner, compiled (``_speedups.fnv1a_32``); None where
#: ``tidewire.client.partitioner``'s own loop runs.
fnv1a_32: Callable[[bytes], int] | None
OpenRecords: type[_pure_builder.OpenRecords]
if COMPILED is None:
    append_routed = None
    recycle_buffer = None
    fnv1a_32 = None
    OpenRecords = _pure_builder.OpenRecords
    BatchBuilder = _pure_builder.BatchBuilder
    append_record = _pure_builder.append_record
    read_records = _pure_reader.read_records
    read_columns = _pure_reader.read_columns
    read_spans = _pure_reader.read_spans
    Spans: type[Any] = _pure_reader.Spans
    int64_columns = _pure_reader.int64_columns
    binary_columns = _pure_reader.binary_columns
else:
    BatchBuilder = COMPILED.BatchBuilder
    # A module built from an older _speedups.pyx (a checkout updated without building it
    # again) has no append_record: the pure one takes a bytearray too, only slower.
    append_record = getattr(COMPILED, "append_record", _pure_builder.append_record)
    # Both or neither: append_routed works on the compiled OpenRecords' fields.
    append_routed = getattr(COMPILED, "append_routed", None)
    recycle_buffer = getattr(COMPILED, "recycle_buffer", None)
    fnv1a_32 = getattr(COMPILED, "fnv1a_32", None)
    OpenRecords = getattr(COMPILED, "OpenRecords", _pure_builder.OpenRecords)
    read_records = COMPILED.read_records
    read_columns = COMPILED.read_columns
    # An older build (not built again after an update) has no read_spans: the pure one.
    read_spans = getattr(COMPILED, "read_spans", _pure_reader.read_spans)
    Spans = getattr(COMPILED, "Spans", _pure_reader.Spans)
    int64_columns = getattr(COMPILED, "int64_columns", _pure_reader.int64_columns)
    binary_columns = getattr(COMPILED, "binary_columns", _pure_reader.binary_columns)
