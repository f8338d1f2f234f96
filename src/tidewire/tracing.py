"""Tracing for programs that use tidewire's clients (OpenTelemetry; docs/observability.md).

With an OpenTelemetry SDK installed and a tracer provider set (``trace.set_tracer_provider``,
or :func:`use_tracer_provider` for tidewire alone), a producer's ``send`` starts a "send"
span (kind PRODUCER) and writes its W3C ``traceparent`` (and ``tracestate``) into the
record's headers; each fetch of a consumer records a "poll" span (kind CONSUMER) linked to the
send spans of the records it brought. To continue the producer's trace while handling a
record::

    async for record in consumer:
        with tidewire.tracing.process_span(record):
            handle(record)

or start spans of your own with ``context=tidewire.tracing.context_of(record)``. Without an
SDK all of this is a no-op: nothing is added to the headers.
"""

from __future__ import annotations

from tidewire.observability.tracing import (
    MAX_LINKS,
    TRACE_HEADERS,
    context_of,
    inject_headers,
    links_of,
    process_span,
    tracer,
    use_tracer_provider,
)

__all__ = [
    "MAX_LINKS",
    "TRACE_HEADERS",
    "context_of",
    "inject_headers",
    "links_of",
    "process_span",
    "tracer",
    "use_tracer_provider",
]
