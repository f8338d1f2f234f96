"""The Kafka listener's metrics: a small recorder the listener calls as things happen, read
when ``/metrics`` is scraped (metrics.py's collector calls :func:`kafka_families`) and by
``GET /v1/stats/kafka`` (the dashboard's Kafka page).

The recorder of a broker is :func:`kafka_stats_for` ``(broker)`` (one per broker, created on
first use, like ``metrics_for``). The listener calls, on its one event loop:

- ``stats.listening(host, port)`` once bound (``stats.stopped()`` when it stops);
- ``stats.connection_opened()`` on accept, ``stats.connection_closed()`` when it ends;
- ``stats.bytes_in(n)`` per frame read (size prefix included), ``stats.bytes_out(n)`` per
  response written;
- ``stats.request(api_key, api_version, seconds, error_code)`` once per request answered
  (or dropped with acks=0), ``error_code`` the top-level code answered (0: none; a frame
  that failed to decode: the codec error's code);
- ``stats.authentication(ok, mechanism)`` per SASL exchange finished.

Each call is a few integer additions: nothing per record, no lock (the loop owns it).

Exported (docs/observability.md):

- ``tidewire_kafka_requests_total{api,version}``: requests answered (counter);
- ``tidewire_kafka_request_errors_total{api,error}``: requests answered with an error code,
  by Kafka's error name (counter);
- ``tidewire_kafka_request_seconds{api}``: time from a request's frame read to its answer
  written (histogram);
- ``tidewire_kafka_connections``: connections open now (gauge);
  ``tidewire_kafka_connections_accepted_total`` (counter);
- ``tidewire_kafka_received_bytes_total``, ``tidewire_kafka_sent_bytes_total`` (counters);
- ``tidewire_kafka_authentications_total{mechanism,result}`` (counter).

Cardinality is bounded: ``api`` is an :class:`ApiKey` name in lower case (any other key is
``other``), ``version`` a version the schemas define for it (others: ``other``), ``error``
an :class:`ErrorCode` name in lower case (unknown codes: ``other``), ``mechanism`` one of
Kafka's SASL mechanisms or ``other``. At most 23 APIs x 19 versions + 23 x 121 errors.
Counters restart from zero with the broker.
"""

from __future__ import annotations

import bisect
import weakref
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)

from tidewire.protocol.kafka import ApiKey, ErrorCode
from tidewire.protocol.kafka.schema import valid_versions

if TYPE_CHECKING:
    from tidewire.broker import Broker

__all__ = [
    "KAFKA_BUCKETS",
    "KafkaListenerStats",
    "api_name",
    "kafka_families",
    "kafka_metric_families",
    "kafka_stats_doc",
    "kafka_stats_for",
    "kafka_stats_of",
]

#: Latency buckets, seconds: as the other listeners' (metrics.REQUEST_BUCKETS), from a
#: produce answered from memory (~100 us) to a Fetch long-poll held for its max_wait_ms.
KAFKA_BUCKETS = (
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
    1.0, 2.5, 5.0, 10.0, 30.0,
)  # fmt: skip

#: SASL mechanisms named in the labels; anything else a client sends is ``other``.
MECHANISMS = frozenset({"PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512", "OAUTHBEARER", "GSSAPI"})
OTHER = "other"

_API_NAMES = {int(k): k.name.lower() for k in ApiKey}
_ERROR_NAMES = {int(e): e.name.lower() for e in ErrorCode}


def api_name(api_key: int) -> str:
    """The label of an API key: its ApiKey name in lower case, else ``other``."""
    return _API_NAMES.get(api_key, OTHER)


def _labels(api_key: int) -> tuple[str, ...]:
    rng = valid_versions(api_key)
    return () if rng is None else tuple(str(v) for v in range(rng[1] + 1))


#: The version labels of each API: its schema's versions (a few dozen strings, made once so
#: that a request costs a lookup, not a parse).
_VERSION_LABELS = {key: _labels(key) for key in _API_NAMES}


def _version_label(api_key: int, version: int) -> str:
    labels = _VERSION_LABELS.get(api_key, ())
    return labels[version] if 0 <= version < len(labels) else OTHER


@dataclass(slots=True)
class _Latency:
    """One API's latency histogram: counts per bucket (non-cumulative), sum, count."""

    buckets: list[int] = field(default_factory=lambda: [0] * (len(KAFKA_BUCKETS) + 1))
    total: float = 0.0
    count: int = 0

    def observe(self, seconds: float) -> None:
        self.buckets[bisect.bisect_left(KAFKA_BUCKETS, seconds)] += 1
        self.total += seconds
        self.count += 1


class KafkaListenerStats:
    """What the Kafka listener counts as it happens (see the module docstring).

    Attributes:
        host, port: where the listener listens (port None while it is not listening).
        connections: connections open now.
        accepted: connections accepted since the start.
        received_bytes, sent_bytes: bytes read and written (frames with their size).
        requests: ``(api label, version label) -> requests``.
        errors: ``(api label, error label) -> requests answered with that error``.
        authentications: ``(mechanism, "ok" | "failed") -> exchanges``.
    """

    def __init__(self) -> None:
        self.host: str | None = None
        self.port: int | None = None
        self.connections = 0
        self.accepted = 0
        self.received_bytes = 0
        self.sent_bytes = 0
        self.requests: dict[tuple[str, str], int] = {}
        self.errors: dict[tuple[str, str], int] = {}
        self.authentications: dict[tuple[str, str], int] = {}
        self._latency: dict[str, _Latency] = {}

    # --- called by the listener ---------------------------------------------------------------

    def listening(self, host: str, port: int) -> None:
        """The listener is bound to ``host:port``."""
        self.host, self.port = host, port

    def stopped(self) -> None:
        """The listener stopped listening (its counters stay)."""
        self.port = None

    def connection_opened(self) -> None:
        self.connections += 1
        self.accepted += 1

    def connection_closed(self) -> None:
        self.connections = max(self.connections - 1, 0)

    def bytes_in(self, n: int) -> None:
        self.received_bytes += n

    def bytes_out(self, n: int) -> None:
        self.sent_bytes += n

    def request(self, api_key: int, version: int, seconds: float, error_code: int) -> None:
        """One request of ``api_key`` at ``version`` answered after ``seconds``, with the
        top-level ``error_code`` (0: none)."""
        api = api_name(api_key)
        key = (api, _version_label(api_key, version))
        self.requests[key] = self.requests.get(key, 0) + 1
        if error_code:
            ek = (api, _ERROR_NAMES.get(error_code, OTHER))
            self.errors[ek] = self.errors.get(ek, 0) + 1
        lat = self._latency.get(api)
        if lat is None:
            lat = self._latency[api] = _Latency()
        lat.observe(max(seconds, 0.0))

    def authentication(self, ok: bool, mechanism: str) -> None:
        """A SASL exchange with ``mechanism`` finished, successfully or not."""
        mech = mechanism.upper() if mechanism.upper() in MECHANISMS else OTHER
        key = (mech, "ok" if ok else "failed")
        self.authentications[key] = self.authentications.get(key, 0) + 1

    # --- read ---------------------------------------------------------------------------------

    def latency(self, api: str) -> tuple[list[int], float, int] | None:
        """``(counts per bucket, +Inf last, non-cumulative; sum seconds; count)`` of an API
        label, or None when it has had no request."""
        lat = self._latency.get(api)
        return None if lat is None else (list(lat.buckets), lat.total, lat.count)

    def apis(self) -> list[str]:
        """The API labels that have had requests, sorted."""
        return sorted(self._latency)

    def quantile(self, api: str, q: float) -> float | None:
        """An upper bound of the ``q`` quantile of the API's latency (the bucket holding it),
        seconds; None without requests; ``inf`` beyond the last bucket."""
        lat = self._latency.get(api)
        if lat is None or lat.count == 0:
            return None
        rank, seen = q * lat.count, 0
        for i, n in enumerate(lat.buckets):
            seen += n
            if seen >= rank and n:
                return KAFKA_BUCKETS[i] if i < len(KAFKA_BUCKETS) else float("inf")
        return float("inf")


_STATS: weakref.WeakKeyDictionary[Broker, KafkaListenerStats] = weakref.WeakKeyDictionary()


def kafka_stats_for(broker: Broker) -> KafkaListenerStats:
    """The Kafka listener recorder of ``broker`` (created on first use; the listener calls
    it, ``/metrics`` and ``/v1/stats/kafka`` read it)."""
    st = _STATS.get(broker)
    if st is None:
        st = _STATS[broker] = KafkaListenerStats()
    return st


def kafka_stats_of(broker: Broker) -> KafkaListenerStats | None:
    """The recorder of ``broker`` if a Kafka listener ever made one, else None."""
    return _STATS.get(broker)


def kafka_families(broker: Broker) -> Iterator[Metric]:
    """The Kafka metric families of ``broker`` (none while it never had a Kafka listener)."""
    st = kafka_stats_of(broker)
    if st is not None:
        yield from kafka_metric_families(st)


def kafka_metric_families(st: KafkaListenerStats) -> Iterator[Metric]:
    """The Kafka metric families of the recorder ``st``."""
    conns = GaugeMetricFamily("tidewire_kafka_connections", "Kafka connections open now.")
    conns.add_metric([], st.connections)
    yield conns
    for name, doc, value in (
        (
            "tidewire_kafka_connections_accepted",
            "Kafka connections accepted.",
            st.accepted,
        ),
        (
            "tidewire_kafka_received_bytes",
            "Bytes of Kafka request frames read (size prefixes included).",
            st.received_bytes,
        ),
        (
            "tidewire_kafka_sent_bytes",
            "Bytes of Kafka response frames written (size prefixes included).",
            st.sent_bytes,
        ),
    ):
        c = CounterMetricFamily(name, doc)
        c.add_metric([], value)
        yield c
    req = CounterMetricFamily(
        "tidewire_kafka_requests",
        "Kafka requests answered, by API and version (other: a key or version without a schema).",
        labels=["api", "version"],
    )
    for (api, version), n in sorted(st.requests.items()):
        req.add_metric([api, version], n)
    yield req
    err = CounterMetricFamily(
        "tidewire_kafka_request_errors",
        "Kafka requests answered with a top-level error code, by API and Kafka's error name.",
        labels=["api", "error"],
    )
    for (api, code), n in sorted(st.errors.items()):
        err.add_metric([api, code], n)
    yield err
    hist = HistogramMetricFamily(
        "tidewire_kafka_request_seconds",
        "Time from a Kafka request's frame read to its answer written, by API.",
        labels=["api"],
    )
    for api in st.apis():
        got = st.latency(api)
        assert got is not None
        counts, total, _ = got
        cumulative: list[tuple[str, float]] = []
        run = 0
        for bound, n in zip((*KAFKA_BUCKETS, float("inf")), counts, strict=True):
            run += n
            cumulative.append(("+Inf" if bound == float("inf") else repr(bound), run))
        hist.add_metric([api], cumulative, total)
    yield hist
    auth = CounterMetricFamily(
        "tidewire_kafka_authentications",
        "Kafka SASL exchanges finished, by mechanism and result (ok, failed).",
        labels=["mechanism", "result"],
    )
    for (mech, result), n in sorted(st.authentications.items()):
        auth.add_metric([mech, result], n)
    yield auth


def kafka_stats_doc(st: KafkaListenerStats | None) -> dict[str, Any]:
    """The recorder as ``GET /v1/stats/kafka`` answers it (``listening`` False and zeros
    when the broker has no Kafka listener)."""
    if st is None:
        st = KafkaListenerStats()
    apis: dict[str, dict[str, Any]] = {}
    for (api, version), n in st.requests.items():
        doc = apis.setdefault(api, {"requests": 0, "errors": 0, "versions": {}, "errors_by": {}})
        doc["requests"] += n
        doc["versions"][version] = n
    for (api, code), n in st.errors.items():
        doc = apis.setdefault(api, {"requests": 0, "errors": 0, "versions": {}, "errors_by": {}})
        doc["errors"] += n
        doc["errors_by"][code] = n
    out = []
    for api in sorted(apis):
        lat = st.latency(api)
        count, total = (lat[2], lat[1]) if lat is not None else (0, 0.0)
        p50, p99 = st.quantile(api, 0.5), st.quantile(api, 0.99)
        out.append(
            {
                "api": api,
                **apis[api],
                "mean_ms": (total / count * 1000.0) if count else None,
                "p50_ms": None if p50 is None or p50 == float("inf") else p50 * 1000.0,
                "p99_ms": None if p99 is None or p99 == float("inf") else p99 * 1000.0,
            }
        )
    return {
        "listening": st.port is not None,
        "host": st.host,
        "port": st.port,
        "connections": st.connections,
        "accepted": st.accepted,
        "received_bytes": st.received_bytes,
        "sent_bytes": st.sent_bytes,
        "requests": sum(st.requests.values()),
        "errors": sum(st.errors.values()),
        "apis": out,
        "authentications": [
            {"mechanism": m, "result": r, "count": n}
            for (m, r), n in sorted(st.authentications.items())
        ],
    }
