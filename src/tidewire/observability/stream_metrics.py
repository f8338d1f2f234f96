"""The lightweight streams' metrics, read from the broker's stream manager when ``/metrics`` is
scraped (metrics.py's collector calls :func:`stream_families`): one call to
``broker.streams.stats()``, nothing counted per message on the streams' hot path.

- ``tidewire_streams``: streams the broker holds now (gauge);
- ``tidewire_stream_messages{kind}``: messages held now, ``in_memory`` (in the streams' rings)
  and ``persistent`` (held for reading by token until they expire) (gauge);
- ``tidewire_stream_in_memory_bytes``: bytes of the in-memory messages (gauge);
- ``tidewire_stream_receivers``: receivers waiting now, work-queue and token reads (gauge);
- ``tidewire_stream_sent_total{kind}``: messages stored by sends, ``in_memory`` and
  ``persistent`` (counter; duplicates are not stored, so not counted here);
- ``tidewire_stream_received_total{mode}``: messages ``take``-n by work-queue receives and
  returned by token ``read``-s (counted once per reader) (counter);
- ``tidewire_stream_expired_total``, ``tidewire_stream_dropped_total`` (pushed out of a full
  ring by a newer send), ``tidewire_stream_duplicates_total`` (sends whose uuid was recent),
  ``tidewire_stream_sends_timed_out_total`` (blocking sends that found no room in time),
  ``tidewire_stream_created_total``, ``tidewire_stream_evicted_total`` (forgotten when empty
  and idle) (counters);
- ``tidewire_stream_log_bytes``: bytes of the shared ``__streams`` partition logs (gauge).

No series per stream: a broker holds millions of them, more than any scrape could carry.
Counters restart from zero with the broker.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from tidewire.errors import InvalidRequestError

if TYPE_CHECKING:
    from tidewire.broker import Broker
    from tidewire.broker.streams.manager import StreamManager
    from tidewire.broker.streams.model import StreamStats

__all__ = ["stream_families", "stream_metric_families", "stream_stats"]


def _streams_of(broker: Broker) -> StreamManager | None:
    try:
        return broker.streams
    except InvalidRequestError:  # not started, or closed
        return None


def stream_stats(broker: Broker) -> StreamStats | None:
    """``broker.streams.stats()``, or None while the broker has no stream manager (not
    started, or closed)."""
    manager = _streams_of(broker)
    return None if manager is None else manager.stats()


def stream_families(broker: Broker) -> Iterator[Metric]:
    """The stream metric families of ``broker`` (none while it has no stream manager)."""
    st = stream_stats(broker)
    if st is not None:
        yield from stream_metric_families(st)


def stream_metric_families(st: StreamStats) -> Iterator[Metric]:
    """The stream metric families of the figures ``st``."""
    for name, doc, value in (
        ("tidewire_streams", "Streams the broker holds now.", st.streams),
        (
            "tidewire_stream_in_memory_bytes",
            "Bytes of the stream messages kept in memory only.",
            st.in_memory_bytes,
        ),
        (
            "tidewire_stream_receivers",
            "Receivers waiting on streams now (work-queue receives and token reads).",
            st.receivers,
        ),
        (
            "tidewire_stream_log_bytes",
            "Bytes of the shared partition logs (__streams) of persistent stream messages.",
            st.log_bytes,
        ),
    ):
        g = GaugeMetricFamily(name, doc)
        g.add_metric([], value)
        yield g
    held = GaugeMetricFamily(
        "tidewire_stream_messages",
        "Stream messages held now: in_memory (in the streams' rings) and persistent (held "
        "for reading by token until they expire, taken or not).",
        labels=["kind"],
    )
    held.add_metric(["in_memory"], st.in_memory_messages)
    held.add_metric(["persistent"], st.persistent_messages)
    yield held
    sent = CounterMetricFamily(
        "tidewire_stream_sent",
        "Stream messages stored by sends, by kind (in_memory, persistent).",
        labels=["kind"],
    )
    sent.add_metric(["in_memory"], st.sent_in_memory)
    sent.add_metric(["persistent"], st.sent_persistent)
    yield sent
    received = CounterMetricFamily(
        "tidewire_stream_received",
        "Stream messages handed to receivers: take (by work-queue receives, each once) and "
        "read (by token reads, once per reader).",
        labels=["mode"],
    )
    received.add_metric(["take"], st.received)
    received.add_metric(["read"], st.read)
    yield received
    for name, doc, value in (
        (
            "tidewire_stream_expired",
            "Stream messages removed because their TTL ran out.",
            st.expired,
        ),
        (
            "tidewire_stream_dropped",
            "Stream messages pushed out of a full ring by a newer send (a persistent one "
            "stays readable by token).",
            st.dropped,
        ),
        (
            "tidewire_stream_duplicates",
            "Stream sends that stored nothing: their uuid was among the stream's recent ones.",
            st.duplicates,
        ),
        (
            "tidewire_stream_sends_timed_out",
            "Blocking stream sends refused after waiting block_ms for room in the ring.",
            st.blocked_sends_timed_out,
        ),
        ("tidewire_stream_created", "Streams created (by a first send or receive).", st.created),
        (
            "tidewire_stream_evicted",
            "Streams forgotten because they held nothing, had no receiver and were idle.",
            st.evicted,
        ),
    ):
        c = CounterMetricFamily(name, doc)
        c.add_metric([], value)
        yield c
