"""Shared helpers of the observability tests: an OpenTelemetry SDK tracer provider with an
in-memory exporter, handed to tidewire alone (``use_tracer_provider``), so the process-wide
provider of OpenTelemetry -- which can be set once per process -- stays the API's no-op one."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence

from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from tidewire import tracing


@contextlib.contextmanager
def traced() -> Iterator[InMemorySpanExporter]:
    """Spans of tidewire go to the exporter yielded (each ended span at once) until the
    block ends; then tidewire traces through the global provider (a no-op) again."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracing.use_tracer_provider(provider)
    try:
        yield exporter
    finally:
        tracing.use_tracer_provider(None)
        provider.shutdown()


def named(spans: Sequence[ReadableSpan], name: str) -> list[ReadableSpan]:
    return [s for s in spans if s.name == name]
