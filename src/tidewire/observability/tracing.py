"""Tracing: spans with the OpenTelemetry messaging semantic conventions, and the W3C trace
context carried in record headers from producer to consumer.

tidewire depends on ``opentelemetry-api`` only: without an SDK its tracer provider is a no-op
and :func:`tracer` answers None, so every call site pays one cheap check (a global read and an
identity comparison) and does nothing else -- no span, no header, no per-message work. With
an SDK provider installed (``tidewire serve`` installs one when asked, see
:func:`configure_sdk`; a program embedding the clients installs its own), the broker traces
each binary request of the produce, fetch and group APIs and each HTTP request, and the clients
trace each send ("publish", its ``traceparent`` written into the record's headers) and each
fetch ("receive", linked to the publish spans of the records it brought).

A program that would rather not set OpenTelemetry's global provider (tests, say) hands one to
tidewire alone with :func:`use_tracer_provider`.

Span names and attributes follow the messaging conventions
(https://opentelemetry.io/docs/specs/semconv/messaging/): ``{operation} {destination}``,
``messaging.system="tidewire"``, ``messaging.operation.type`` (publish, receive, process,
settle), ``messaging.operation.name``, ``messaging.destination.name``,
``messaging.destination.partition.id``, ``messaging.consumer.group.name``,
``messaging.batch.message_count``, ``server.address``/``server.port`` and ``error.type`` on
failure.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any, Final, Protocol

from opentelemetry import context as otel_context
from opentelemetry import propagate, trace
from opentelemetry import trace as _trace_api
from opentelemetry.trace import (
    Link,
    NoOpTracerProvider,
    ProxyTracerProvider,
    Span,
    SpanKind,
    StatusCode,
    Tracer,
    TracerProvider,
)

from tidewire import __version__

__all__ = [
    "MAX_LINKS",
    "SYSTEM",
    "TRACE_HEADERS",
    "configure_sdk",
    "context_of",
    "end_span",
    "fail_span",
    "inject_headers",
    "links_of",
    "process_span",
    "tracer",
    "use_tracer_provider",
]

#: ``messaging.system`` of every span.
SYSTEM: Final = "tidewire"
#: The record headers that carry the trace context (W3C Trace Context).
TRACE_HEADERS: Final = ("traceparent", "tracestate")
#: Links of one receive span at most (one per record it brought that carries a context): a
#: fetch may bring thousands of records, and a span with thousands of links is useless to
#: look at and costly to export. OpenTelemetry's SDK keeps 128 links per span by default.
MAX_LINKS: Final = 128

_override: TracerProvider | None = None
#: Whether OpenTelemetry is told to load a provider by name (then the API does, on first use).
_ENV_PROVIDER: Final = bool(os.environ.get("OTEL_PYTHON_TRACER_PROVIDER"))
#: (the provider last asked, its tidewire tracer or None for a no-op provider)
_cache: tuple[object, Tracer | None] = (None, None)


def use_tracer_provider(provider: TracerProvider | None) -> None:
    """Make tidewire trace through ``provider`` instead of OpenTelemetry's global one (None:
    back to the global one)."""
    global _override, _cache  # noqa: PLW0603 (one process-wide setting)
    _override = provider
    _cache = (None, None)


def tracer() -> Tracer | None:
    """tidewire's tracer, or None when tracing is off (no SDK: the API's no-op provider).

    Cheap enough to ask once per request or per send: a global read and an identity check
    once the provider has been seen.
    """
    provider = _override
    if provider is None:
        # OpenTelemetry's global, read directly: trace.get_tracer_provider() looks up an
        # environment variable at every call (2 us, as much as a whole send), and the global
        # is None until a provider is set (or loaded from OTEL_PYTHON_TRACER_PROVIDER).
        provider = _trace_api._TRACER_PROVIDER
        if provider is None:
            if not _ENV_PROVIDER:
                return None
            provider = trace.get_tracer_provider()  # loads it, and sets the global
    cached = _cache
    if cached[0] is provider:
        return cached[1]
    return _resolve(provider)


def _resolve(provider: TracerProvider) -> Tracer | None:
    global _cache  # noqa: PLW0603 (the cache of tracer())
    if isinstance(provider, (ProxyTracerProvider, NoOpTracerProvider)):
        # No SDK: the API's default. (A global provider set later is another object, seen
        # at the next call.)
        found: Tracer | None = None
    else:
        found = provider.get_tracer("tidewire", __version__)
    _cache = (provider, found)
    return found


# --- attributes ------------------------------------------------------------------------------


def messaging_attributes(
    operation: str,
    name: str,
    destination: str | None = None,
    *,
    partition: int | None = None,
    group: str | None = None,
    count: int | None = None,
) -> dict[str, Any]:
    """The messaging attributes of one span (``operation``: publish, receive, process,
    settle, or ``None``-less others such as ``create``; ``name``: the operation's name)."""
    attrs: dict[str, Any] = {
        "messaging.system": SYSTEM,
        "messaging.operation.type": operation,
        "messaging.operation.name": name,
    }
    if destination is not None:
        attrs["messaging.destination.name"] = destination
    if partition is not None:
        attrs["messaging.destination.partition.id"] = str(partition)
    if group is not None:
        attrs["messaging.consumer.group.name"] = group
    if count is not None:
        attrs["messaging.batch.message_count"] = count
    return attrs


def server_attributes(address: str) -> dict[str, Any]:
    """``server.address`` and ``server.port`` of a ``host:port`` (IPv6 in brackets)."""
    host, _, port = address.rpartition(":")
    if not host:
        return {"server.address": address}
    host = host.strip("[]")
    try:
        return {"server.address": host, "server.port": int(port)}
    except ValueError:
        return {"server.address": address}


def fail_span(span: Span, exc: BaseException) -> None:
    """Mark ``span`` failed by ``exc``: ``error.type`` is the exception's class name (for a
    tidewire error, the wire error's name), and the status is ERROR."""
    span.set_attribute("error.type", type(exc).__name__)
    span.set_status(StatusCode.ERROR, str(exc)[:200])


def end_span(span: Span, exc: BaseException | None = None) -> None:
    if exc is not None:
        fail_span(span, exc)
    span.end()


# --- propagation through record headers ------------------------------------------------------


class _HeaderSetter:
    """Writes a carrier's key into a record's header list (replacing one already there)."""

    def set(self, carrier: list[tuple[str, bytes | None]], key: str, value: str) -> None:
        carrier[:] = [h for h in carrier if h[0] != key]
        carrier.append((key, value.encode("ascii")))


class _HeaderGetter:
    """Reads a record's headers (a sequence of ``(str, bytes | None)``) as a carrier."""

    def get(self, carrier: Sequence[tuple[str, bytes | None]], key: str) -> list[str] | None:
        for k, v in carrier:
            if k == key and v is not None:
                try:
                    return [v.decode("ascii")]
                except UnicodeDecodeError:
                    return None
        return None

    def keys(self, carrier: Sequence[tuple[str, bytes | None]]) -> list[str]:
        return [k for k, _ in carrier]


_SETTER: Final = _HeaderSetter()
_GETTER: Final = _HeaderGetter()


def inject_headers(
    headers: list[tuple[str, bytes | None]] | None, ctx: otel_context.Context | None = None
) -> list[tuple[str, bytes | None]]:
    """``headers`` (a new list; the caller's is not changed) with the trace context of
    ``ctx`` (default: the current one) written in, through the global propagator (W3C
    ``traceparent`` and ``tracestate`` unless the program configured another)."""
    out = list(headers) if headers else []
    propagate.inject(out, context=ctx, setter=_SETTER)  # type: ignore[arg-type]
    return out


class _Record(Protocol):
    @property
    def headers(self) -> Sequence[tuple[str, bytes | None]]: ...


def _has_context(headers: Sequence[tuple[str, bytes | None]]) -> bool:
    return any(k == "traceparent" for k, _ in headers)


def context_of(record: _Record) -> otel_context.Context:
    """The trace context its producer wrote into ``record``'s headers (an empty context
    when it carries none): pass it as ``context=`` to start a span that continues the
    producer's trace, or use :func:`process_span`."""
    headers = record.headers
    if not headers or not _has_context(headers):
        return otel_context.Context()
    return propagate.extract(headers, context=otel_context.Context(), getter=_GETTER)  # type: ignore[arg-type]


def _link_of(headers: Sequence[tuple[str, bytes | None]]) -> Link | None:
    if not headers or not _has_context(headers):
        return None
    ctx = propagate.extract(headers, context=otel_context.Context(), getter=_GETTER)  # type: ignore[arg-type]
    sc = trace.get_current_span(ctx).get_span_context()
    return Link(sc) if sc.is_valid else None


def links_of(records: Iterable[_Record], limit: int = MAX_LINKS) -> list[Link]:
    """Links to the producers' spans of ``records`` (those that carry a context; at most
    ``limit``)."""
    out: list[Link] = []
    for r in records:
        link = _link_of(r.headers)
        if link is not None:
            out.append(link)
            if len(out) >= limit:
                break
    return out


class _ConsumedRecord(Protocol):
    @property
    def topic(self) -> str: ...
    @property
    def partition(self) -> int: ...
    @property
    def offset(self) -> int: ...
    @property
    def headers(self) -> Sequence[tuple[str, bytes | None]]: ...


@contextlib.contextmanager
def process_span(
    record: _ConsumedRecord, *, group: str | None = None, link: bool = False
) -> Iterator[Span | None]:
    """A "process" span around the handling of one consumed record, the child of its
    producer's span (or, with ``link=True``, a new trace linked to it), made current so that
    spans started inside belong to it. Yields None (and does nothing) when tracing is off.

    Example::

        async for record in consumer:
            with tidewire.tracing.process_span(record):
                handle(record)
    """
    t = tracer()
    if t is None:
        yield None
        return
    ctx = context_of(record)
    attrs = messaging_attributes(
        "process", "process", record.topic, partition=record.partition, group=group
    )
    attrs["messaging.message.id"] = f"{record.partition}:{record.offset}"
    if link:
        sc = trace.get_current_span(ctx).get_span_context()
        links = [Link(sc)] if sc.is_valid else []
        cm = t.start_as_current_span(
            f"process {record.topic}", kind=SpanKind.CONSUMER, attributes=attrs, links=links
        )
    else:
        cm = t.start_as_current_span(
            f"process {record.topic}", context=ctx, kind=SpanKind.CONSUMER, attributes=attrs
        )
    with cm as span:
        yield span


# --- the SDK, for ``tidewire serve`` ---------------------------------------------------------

OTEL_HINT: Final = "tracing needs the OpenTelemetry SDK: pip install 'tidewire[otel]'"


class OtelMissingError(ImportError):
    """Tracing was asked for, and the ``otel`` extra (the SDK and OTLP exporter) is not
    installed."""


def wanted_by_env(env: Mapping[str, str]) -> bool:
    """Whether the standard OTEL_* variables ask for traces to be exported: an OTLP
    endpoint is set, or ``OTEL_TRACES_EXPORTER`` names an exporter other than ``none``;
    ``OTEL_SDK_DISABLED=true`` turns it all off."""
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    exporter = env.get("OTEL_TRACES_EXPORTER", "").strip().lower()
    if exporter:
        return exporter != "none"
    return bool(
        env.get("OTEL_EXPORTER_OTLP_ENDPOINT") or env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
    )


def configure_sdk(
    *, endpoint: str | None, env: Mapping[str, str], service_name: str = "tidewire"
) -> TracerProvider:
    """Install the SDK's tracer provider as OpenTelemetry's global one, exporting in
    batches through the exporter ``OTEL_TRACES_EXPORTER`` names (``otlp``, the default, over
    HTTP/protobuf to ``endpoint`` or ``OTEL_EXPORTER_OTLP_ENDPOINT``; ``console``: to
    standard output). ``OTEL_SERVICE_NAME`` and ``OTEL_RESOURCE_ATTRIBUTES`` name the service
    as usual (default ``tidewire``); the ``OTEL_BSP_*`` and ``OTEL_TRACES_SAMPLER`` variables
    apply as the SDK reads them.

    Raises:
        OtelMissingError: the ``otel`` extra is not installed.
        ValueError: an exporter other than ``otlp`` and ``console``.
    """
    try:
        from opentelemetry.sdk.resources import SERVICE_NAME, Resource  # noqa: PLC0415
        from opentelemetry.sdk.trace import TracerProvider as SdkTracerProvider  # noqa: PLC0415
        from opentelemetry.sdk.trace.export import (  # noqa: PLC0415
            BatchSpanProcessor,
            ConsoleSpanExporter,
            SpanExporter,
        )
    except ImportError as exc:
        raise OtelMissingError(OTEL_HINT) from exc
    exporter_name = (env.get("OTEL_TRACES_EXPORTER") or "otlp").split(",")[0].strip().lower()
    exporter: SpanExporter
    if exporter_name == "console":
        exporter = ConsoleSpanExporter()
    elif exporter_name == "otlp":
        try:
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import (  # noqa: PLC0415
                OTLPSpanExporter,
            )
        except ImportError as exc:
            raise OtelMissingError(OTEL_HINT) from exc
        if endpoint:
            exporter = OTLPSpanExporter(endpoint=endpoint.rstrip("/") + "/v1/traces")
        else:
            exporter = OTLPSpanExporter()  # reads OTEL_EXPORTER_OTLP_* itself
    else:
        raise ValueError(
            f"OTEL_TRACES_EXPORTER={exporter_name!r} is not supported: use otlp, console or none"
        )
    name = env.get("OTEL_SERVICE_NAME") or service_name
    provider = SdkTracerProvider(resource=Resource.create({SERVICE_NAME: name}))
    provider.add_span_processor(BatchSpanProcessor(exporter))
    trace.set_tracer_provider(provider)
    return provider


# --- the broker's binary requests ------------------------------------------------------------

#: The binary APIs traced by the broker: API name -> (operation type, operation name, span
#: kind). Metadata, admin and push-credit requests are not traced: a span says where the time
#: of a message's journey went, and those are not on it.
TRACED_APIS: Final[dict[str, tuple[str, str, SpanKind]]] = {
    "PRODUCE": ("publish", "produce", SpanKind.SERVER),
    "FETCH": ("receive", "fetch", SpanKind.SERVER),
    "JOIN_GROUP": ("receive", "join_group", SpanKind.SERVER),
    "HEARTBEAT": ("receive", "heartbeat", SpanKind.SERVER),
    "LEAVE_GROUP": ("receive", "leave_group", SpanKind.SERVER),
    "OFFSET_COMMIT": ("settle", "commit", SpanKind.SERVER),
    "OFFSET_FETCH": ("receive", "offset_fetch", SpanKind.SERVER),
}


def request_span(t: Tracer, api: str, body: object, peer: str) -> Span | None:
    """A span for one binary request of ``api`` (None: an API that is not traced). The
    destination is named when the request is for one topic; a group request names its
    group; ``client.address`` is the peer."""
    spec = TRACED_APIS.get(api)
    if spec is None:
        return None
    op, name, kind = spec
    topics: set[str] = set()
    partition: int | None = None
    parts = getattr(body, "partitions", None) or ()
    for p in parts:
        topics.add(p.topic)
        partition = p.partition if len(parts) == 1 else None
    destination = next(iter(topics)) if len(topics) == 1 else None
    group = getattr(body, "group_id", None)
    attrs = messaging_attributes(
        op, name, destination, partition=partition, group=group if group else None
    )
    if len(topics) > 1:
        attrs["messaging.tidewire.destinations"] = sorted(topics)
    host, _, port = peer.rpartition(":")
    if host:
        attrs["client.address"] = host.strip("[]")
        if port.isdigit():
            attrs["client.port"] = int(port)
    target = group if group else destination
    return t.start_span(f"{name} {target}" if target else name, kind=kind, attributes=attrs)


def end_request_span(
    span: Span, request: object, response: object, data: Any, response_data: Any = ()
) -> None:
    """End a span of :func:`request_span` once its request was answered: a produce names
    the records it stored (``messaging.batch.message_count``) and links to the publish spans
    of the first record of each of its batches (their ``traceparent``; read from the batch
    headers and the first record only, never per message; compressed batches are not
    opened); a fetch names the records it returned (from ``response_data``'s batch headers);
    an answer with a partition's error sets ``error.type``."""
    if span.is_recording():
        key = getattr(request, "api_key", None)
        if key == _PRODUCE_KEY and data:
            _describe_produce(span, data)
        elif key == _FETCH_KEY:
            span.set_attribute("messaging.batch.message_count", _count_fetched(response_data))
        for result in (
            getattr(response, "results", None) or getattr(response, "partitions", None) or ()
        ):
            code = getattr(result, "error_code", 0)
            if code:
                span.set_attribute("error.type", _error_name(code))
                span.set_status(StatusCode.ERROR, getattr(result, "error_message", "")[:200])
                break
        code = getattr(response, "error_code", 0)
        if code:
            span.set_attribute("error.type", _error_name(code))
            span.set_status(StatusCode.ERROR, getattr(response, "error_message", "")[:200])
    span.end()


def _describe_produce(span: Span, data: Any) -> None:
    from tidewire.errors import RecordBatchError  # noqa: PLC0415
    from tidewire.records.batch import BATCH_OVERHEAD  # noqa: PLC0415 (only when tracing)
    from tidewire.records.reader import _records, iter_batches  # noqa: PLC0415

    count = 0
    links = 0
    buf = memoryview(data)
    try:
        for pos, h in iter_batches(buf, verify=False):
            count += h.records_count
            if links >= MAX_LINKS or h.attributes & 0x07 or not h.records_count:
                continue
            first = next(_records(h, buf[pos + BATCH_OVERHEAD : pos + h.size]), None)
            link = _link_of(first.headers) if first is not None else None
            if link is not None:
                span.add_link(link.context)
                links += 1
    except RecordBatchError:
        pass  # the handler answered it; the span keeps what was read
    span.set_attribute("messaging.batch.message_count", count)


def _error_name(code: int) -> str:
    from tidewire.errors import for_code  # noqa: PLC0415

    try:
        return for_code(code).__name__
    except Exception:
        return f"error_{code}"


_PRODUCE_KEY: Final = 7  # ApiKey.PRODUCE (observability does not import the protocol)
_FETCH_KEY: Final = 8  # ApiKey.FETCH


def _count_fetched(buffers: Any) -> int:
    """Records in a fetch answer's buffers of whole batches, from their headers."""
    from tidewire.errors import RecordBatchError  # noqa: PLC0415 (only when tracing)
    from tidewire.records.reader import iter_batches  # noqa: PLC0415

    count = 0
    for buf in buffers:
        try:
            for _, h in iter_batches(buf, verify=False):
                count += h.records_count
        except RecordBatchError:
            continue
    return count


# --- the clients -----------------------------------------------------------------------------


def start_publish(
    t: Tracer,
    topic: str,
    headers: list[tuple[str, bytes | None]] | None,
    partition: int | None,
    server: str,
) -> tuple[Span, list[tuple[str, bytes | None]]]:
    """A "publish" span for one send (a child of the current span), and the record's
    headers with its trace context written in."""
    key = (topic, partition, server)
    got = _publish_specs.get(key)
    if got is None:
        attrs = messaging_attributes("publish", "send", topic, partition=partition)
        attrs.update(server_attributes(server))
        got = (f"send {topic}", attrs)
        if len(_publish_specs) < _MAX_PUBLISH_SPECS:
            _publish_specs[key] = got
    span = t.start_span(got[0], kind=SpanKind.PRODUCER, attributes=got[1])
    return span, inject_headers(headers, trace.set_span_in_context(span))


#: The name and attributes of publish spans, by (topic, partition, server): built once, as the
#: SDK copies them into each span. Bounded: a program sending to more destinations than this
#: builds the rest each time.
_publish_specs: dict[tuple[str, int | None, str], tuple[str, dict[str, Any]]] = {}
_MAX_PUBLISH_SPECS: Final = 1024


def finish_publish(span: Span, future: Any, partition: int, index: int) -> None:
    """End ``span`` when ``future`` (its batch's: asyncio or concurrent) is done, naming the
    partition and the record's offset (``messaging.message.id``, ``partition:offset``) or
    the error that failed the batch."""
    if not span.is_recording():  # sampled out: its context went into the headers, that is all
        return
    span.set_attribute("messaging.destination.partition.id", str(partition))

    def done(fut: Any) -> None:
        if fut.cancelled():
            span.set_attribute("error.type", "cancelled")
            span.set_status(StatusCode.ERROR)
        else:
            exc = fut.exception()
            if exc is not None:
                fail_span(span, exc)
            else:
                base = fut.result()
                if base >= 0:
                    span.set_attribute("messaging.message.id", f"{partition}:{base + index}")
        span.end()

    future.add_done_callback(done)


def record_receive(
    t: Tracer,
    records: Sequence[_ConsumedRecord],
    start_ns: int | None,
    server: str,
    group: str | None,
) -> None:
    """A "receive" span for one fetch (or push) that brought ``records``, from ``start_ns``
    (None: now) to now, linked to the publish spans of the records that carry a trace
    context (at most :data:`MAX_LINKS`). One span per fetch, never one per record."""
    topics = {r.topic for r in records}
    parts = {(r.topic, r.partition) for r in records}
    destination = next(iter(topics)) if len(topics) == 1 else None
    partition = next(iter(parts))[1] if len(parts) == 1 else None
    attrs = messaging_attributes(
        "receive", "poll", destination, partition=partition, group=group, count=len(records)
    )
    attrs.update(server_attributes(server))
    span = t.start_span(
        f"poll {destination}" if destination else "poll",
        kind=SpanKind.CONSUMER,
        attributes=attrs,
        links=links_of(records),
        start_time=start_ns,
    )
    span.end()


def setup_tracing(
    *, enabled: bool, endpoint: str, env: Mapping[str, str] | None = None
) -> TracerProvider | None:
    """What ``tidewire serve`` does at start: install the SDK (:func:`configure_sdk`) when
    ``tracing_enabled`` is set, an ``otlp_endpoint`` is given or the OTEL_* variables ask for
    traces (:func:`wanted_by_env`); None (tracing stays a no-op) otherwise, or when
    ``OTEL_SDK_DISABLED=true``.

    Raises:
        OtelMissingError: tracing is asked for and the ``otel`` extra is not installed.
        ValueError: an unsupported ``OTEL_TRACES_EXPORTER``.
    """
    environ = os.environ if env is None else env
    if environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return None
    if not (enabled or endpoint or wanted_by_env(environ)):
        return None
    provider = configure_sdk(endpoint=endpoint or None, env=environ)
    target = (
        endpoint
        or environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
        or environ.get("OTEL_EXPORTER_OTLP_ENDPOINT")
        or "the OTLP default (http://localhost:4318)"
    )
    exporter = (environ.get("OTEL_TRACES_EXPORTER") or "otlp").split(",")[0].strip().lower()
    logging.getLogger("tidewire").info(
        "tracing: exporting spans (%s) to %s",
        exporter,
        "standard output" if exporter == "console" else target,
    )
    return provider
