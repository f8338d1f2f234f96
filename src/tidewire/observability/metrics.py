"""The broker's Prometheus metrics: one :class:`BrokerMetrics` per broker, with its own
``prometheus_client.CollectorRegistry`` (never the process-wide default one, so several
brokers in one process keep apart).

Most figures are read from the broker's own state when ``/metrics`` is scraped, by
:class:`_BrokerCollector`: the logs' offsets, sizes and per-partition counters (bumped once
per produce or fetch, never per message), the groups' committed offsets, the group commits of
the storage, the push subscriptions, the gate's counters, the queues'
(queue_metrics.py) and the streams' (stream_metrics.py) figures, and in a cluster the node's
(cluster/metrics.py). What cannot be read later is
counted as it happens, once per request: the request latency histogram, errors by code,
connections accepted and closed. So the produce hot path pays no per-message work for them.

Names follow Prometheus' conventions (``tidewire_*``, ``_total``, ``_seconds``, ``_bytes``);
docs/observability.md lists them all. Per-partition series are bounded by
``max_partition_series``: beyond it they are dropped (per-topic aggregates stay), with one
warning and ``tidewire_metrics_series_dropped`` saying how many.
"""

from __future__ import annotations

import logging
import shutil
import time
import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Histogram,
    PlatformCollector,
    ProcessCollector,
)
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from tidewire import __version__
from tidewire.cluster.metrics import cluster_families
from tidewire.errors import InvalidConfigError, InvalidRequestError, TidewireError
from tidewire.observability.kafka_metrics import kafka_families
from tidewire.observability.queue_metrics import queue_families
from tidewire.observability.stream_metrics import stream_families
from tidewire.storage.log import FLUSH_BUCKETS

if TYPE_CHECKING:
    from tidewire.broker import Broker

__all__ = [
    "DEFAULT_MAX_PARTITION_SERIES",
    "REQUEST_BUCKETS",
    "BrokerMetrics",
    "Totals",
    "configure_metrics",
    "metrics_for",
]

log = logging.getLogger(__name__)

#: Partitions (of topics, and of groups' committed offsets, counted apart) with series of
#: their own; beyond it only per-topic and per-group aggregates are exported. Each partition
#: makes about ten series: 10,000 partitions are ~100,000 series, what one Prometheus
#: scrape target is commonly allowed.
DEFAULT_MAX_PARTITION_SERIES = 10_000

#: Request latency buckets, seconds: from a produce acknowledged from memory (~100 us) to a
#: long-poll held for its whole wait (up to max_wait_ms, 30 s by default).
REQUEST_BUCKETS = (
    0.0001,
    0.00025,
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
)


@dataclass(frozen=True, slots=True)
class Totals:
    """Broker-wide figures at one moment (what the recent-samples ring records)."""

    messages_in: int
    bytes_in: int
    bytes_out: int
    requests: int
    connections: int
    disk_used_bytes: int


class BrokerMetrics:
    """The metrics of one broker: its registry and the counters listeners bump.

    Args:
        broker: whose state is exported.
        enabled: when False, nothing is counted and ``/metrics`` answers 404.
        max_partition_series: see :data:`DEFAULT_MAX_PARTITION_SERIES`.
        sample_interval_s: seconds between the recent samples (``samples.py``).
        clock: seconds since the epoch (uptime).
    """

    def __init__(
        self,
        broker: Broker,
        *,
        enabled: bool = True,
        max_partition_series: int = DEFAULT_MAX_PARTITION_SERIES,
        sample_interval_s: float = 5.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if max_partition_series < 0:
            raise InvalidConfigError(
                f"metrics_max_partition_series={max_partition_series:,} must be >= 0"
            )
        self._broker = weakref.ref(broker)
        self.enabled = enabled
        self.max_partition_series = max_partition_series
        self.clock = clock
        self.started = clock()
        self.registry = CollectorRegistry(auto_describe=False)
        r = self.registry
        self.request_duration = Histogram(
            "tidewire_request_duration_seconds",
            "Time from a request's arrival to its answer, by interface (binary, http) and API "
            "(the binary API's name, or the HTTP method and route template).",
            ["interface", "api"],
            buckets=REQUEST_BUCKETS,
            registry=r,
        )
        self.request_errors = Counter(
            "tidewire_request_errors",
            "Requests answered with an error, by interface, API and code (tidewire's error "
            "code for the binary protocol, the HTTP status for HTTP).",
            ["interface", "api", "code"],
            registry=r,
        )
        self.connections_accepted = Counter(
            "tidewire_connections_accepted",
            "Connections accepted, by interface.",
            ["interface"],
            registry=r,
        )
        self.connections_closed = Counter(
            "tidewire_connections_closed",
            "Connections closed, by interface and reason (peer: the client closed; error: "
            "the connection broke; protocol: the client broke the protocol; timeout; "
            "refused: over max_connections or its TLS identity; shutdown: the broker drained).",
            ["interface", "reason"],
            registry=r,
        )
        ProcessCollector(registry=r)
        PlatformCollector(registry=r)
        r.register(_BrokerCollector(self))
        #: The binary listeners of the broker (their connections, requests in flight and
        #: push subscriptions are read at scrape time).
        self.tcp_servers: weakref.WeakSet[Any] = weakref.WeakSet()
        #: The HTTP gateways of the broker (their open connections, read at scrape time).
        self.http_gateways: weakref.WeakSet[Any] = weakref.WeakSet()
        #: Requests answered (every interface): what the recent samples turn into a rate.
        self.requests = 0
        #: HTTP requests in flight, and WebSocket / SSE sessions open.
        self.http_in_flight = 0
        self.streams_open = {"websocket": 0, "sse": 0}
        #: Partitions whose series the last scrape dropped (see max_partition_series).
        self.series_dropped = 0
        #: The recent-samples ring (``samples.samples_for``) and its interval, seconds.
        self.samples: Any = None
        self.sample_interval_s = sample_interval_s
        #: The gate's counters (``Gate.stats``), set by the listeners that share the gate.
        self.security_stats: Callable[[], dict[str, float]] | None = None
        self._warned = False
        self._timers: dict[tuple[str, str], Any] = {}

    @property
    def broker(self) -> Broker:
        b = self._broker()
        if b is None:
            raise InvalidRequestError("the broker of these metrics is gone")
        return b

    # --- counted as it happens (once per request or connection) -------------------------------

    def observe_request(self, interface: str, api: str, seconds: float, error: int | None) -> None:
        """One request answered after ``seconds``; ``error``: its error code, or None."""
        self.requests += 1
        child = self._timers.get((interface, api))
        if child is None:
            child = self._timers[interface, api] = self.request_duration.labels(interface, api)
        child.observe(seconds)
        if error:
            self.request_errors.labels(interface, api, str(error)).inc()

    def connection_accepted(self, interface: str) -> None:
        self.connections_accepted.labels(interface).inc()

    def connection_closed(self, interface: str, reason: str) -> None:
        self.connections_closed.labels(interface, reason).inc()

    # --- read at scrape time ------------------------------------------------------------------

    def http_connections_open(self) -> int:
        return sum(g.connections() for g in list(self.http_gateways))

    def connections_open(self) -> int:
        """Binary and HTTP connections open (a WebSocket or SSE session is one of the
        latter)."""
        return sum(len(s.connections) for s in list(self.tcp_servers)) + (
            self.http_connections_open()
        )

    def totals(self) -> Totals:
        """Broker-wide counters now (one pass over the partitions)."""
        b = self.broker
        messages_in = bytes_in = bytes_out = disk = 0
        for plog in list(b.logs.logs.values()):
            messages_in += plog.messages_in
            bytes_in += plog.bytes_in
            bytes_out += plog.bytes_out
            disk += plog.size_bytes
        return Totals(
            messages_in,
            bytes_in,
            bytes_out,
            self.requests,
            self.connections_open(),
            disk,
        )

    def group_lags(self, limit: int) -> dict[str, int]:
        """Total lag (messages) of each consumer group with committed offsets, the ``limit``
        largest."""
        groups = _groups_of(self.broker)
        if groups is None:
            return {}
        out: dict[str, int] = {}
        for listing in groups.list_groups():
            try:
                desc = groups.describe(listing.group_id)
            except TidewireError:  # a group that went away meanwhile
                continue
            out[listing.group_id] = sum(max(p.lag, 0) for p in desc.offsets)
        top = sorted(out.items(), key=lambda kv: (-kv[1], kv[0]))[:limit]
        return dict(top)

    def exposition(self, accept: str | None) -> tuple[bytes, str]:
        """The registry in the format ``accept`` asks for (OpenMetrics or Prometheus text):
        the body and its content type."""
        from prometheus_client.exposition import choose_encoder  # noqa: PLC0415

        encoder, content_type = choose_encoder(accept or "")
        return encoder(self.registry), content_type


# --- one BrokerMetrics per broker ----------------------------------------------------------------

_METRICS: weakref.WeakKeyDictionary[Broker, BrokerMetrics] = weakref.WeakKeyDictionary()


def metrics_for(broker: Broker) -> BrokerMetrics:
    """The metrics of ``broker``: one per broker, shared by all its listeners (created with
    the defaults unless :func:`configure_metrics` came first)."""
    m = _METRICS.get(broker)
    if m is None:
        m = _METRICS[broker] = BrokerMetrics(broker)
    return m


def configure_metrics(
    broker: Broker,
    *,
    enabled: bool = True,
    max_partition_series: int = DEFAULT_MAX_PARTITION_SERIES,
    sample_interval_s: float = 5.0,
    clock: Callable[[], float] = time.time,
) -> BrokerMetrics:
    """Set the metrics settings of ``broker`` (creating its metrics if needed; listeners
    already started see the new settings at once).

    Raises:
        InvalidConfigError: a negative ``max_partition_series``.
    """
    if max_partition_series < 0:
        raise InvalidConfigError(
            f"metrics_max_partition_series={max_partition_series:,} must be >= 0"
        )
    m = metrics_for(broker)
    m.enabled = enabled
    m.max_partition_series = max_partition_series
    m.sample_interval_s = sample_interval_s
    m.clock = clock
    m._warned = False
    return m


def _groups_of(broker: Broker) -> Any:
    try:
        return broker.groups
    except InvalidRequestError:  # not started, or closed
        return None


# --- the scrape-time collector -------------------------------------------------------------------


def _counter(name: str, doc: str, labels: list[str] | None = None) -> CounterMetricFamily:
    return CounterMetricFamily(name, doc, labels=labels)


def _gauge(name: str, doc: str, labels: list[str] | None = None) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, doc, labels=labels)


class _BrokerCollector(Collector):
    """Reads the broker's state at scrape time (see the module docstring)."""

    def __init__(self, metrics: BrokerMetrics) -> None:
        self.m = metrics

    def collect(self) -> Iterator[Metric]:
        m = self.m
        if not m.enabled:
            return
        b = m._broker()
        if b is None:
            return
        info = _gauge("tidewire_broker_info", "The broker's version (always 1).", ["version"])
        info.add_metric([__version__], 1)
        yield info
        up = _gauge("tidewire_uptime_seconds", "Seconds since the broker's metrics started.")
        up.add_metric([], max(m.clock() - m.started, 0.0))
        yield up
        yield from self._partitions(b)
        yield from self._queues(b)
        yield from stream_families(b)  # observability/stream_metrics.py
        yield from kafka_families(b)  # observability/kafka_metrics.py
        yield from self._groups(b)
        yield from self._storage(b)
        yield from self._server(b)
        yield from self._security(b)
        yield from cluster_families(b, m.max_partition_series)  # cluster/metrics.py

    # --- topics and partitions

    def _partitions(self, b: Broker) -> Iterator[Metric]:
        m = self.m
        cap = m.max_partition_series
        tl = ["topic", "partition"]
        p_in = _counter("tidewire_partition_messages_in", "Messages appended by producers.", tl)
        p_bin = _counter("tidewire_partition_bytes_in", "Bytes of batches appended.", tl)
        p_out = _counter(
            "tidewire_partition_messages_out",
            "Messages handed to readers (fetch and push; counted once per reader).",
            tl,
        )
        p_bout = _counter("tidewire_partition_bytes_out", "Bytes of batches handed to readers.", tl)
        p_start = _gauge("tidewire_partition_log_start_offset", "First offset kept.", tl)
        p_end = _gauge("tidewire_partition_log_end_offset", "Offset the next message gets.", tl)
        p_hw = _gauge("tidewire_partition_high_watermark", "Offset below which reads see.", tl)
        p_size = _gauge("tidewire_partition_size_bytes", "Bytes of the partition's segments.", tl)
        p_segs = _gauge("tidewire_partition_segments", "Segment files of the partition.", tl)
        t = ["topic"]
        t_in = _counter("tidewire_topic_messages_in", "Messages appended to the topic.", t)
        t_bin = _counter("tidewire_topic_bytes_in", "Bytes appended to the topic.", t)
        t_out = _counter("tidewire_topic_messages_out", "Messages handed to readers.", t)
        t_bout = _counter("tidewire_topic_bytes_out", "Bytes handed to readers.", t)
        t_size = _gauge("tidewire_topic_size_bytes", "Bytes of the topic's segments.", t)
        t_parts = _gauge("tidewire_topic_partitions", "Partitions of the topic.", t)
        appended = 0
        shown = dropped = 0
        logs = b.logs.logs
        for topic, n in sorted(b.topics().items()):
            agg = [0, 0, 0, 0, 0]
            for p in range(n):
                plog = logs.get((topic, p))
                if plog is None:  # offline
                    continue
                agg[0] += plog.messages_in
                agg[1] += plog.bytes_in
                agg[2] += plog.messages_out
                agg[3] += plog.bytes_out
                size = plog.size_bytes
                agg[4] += size
                if shown >= cap:
                    dropped += 1
                    continue
                shown += 1
                lv = [topic, str(p)]
                p_in.add_metric(lv, plog.messages_in)
                p_bin.add_metric(lv, plog.bytes_in)
                p_out.add_metric(lv, plog.messages_out)
                p_bout.add_metric(lv, plog.bytes_out)
                p_start.add_metric(lv, plog.log_start_offset)
                p_end.add_metric(lv, plog.log_end_offset)
                p_hw.add_metric(lv, min(plog.flushed_offset, plog.log_end_offset))
                p_size.add_metric(lv, size)
                p_segs.add_metric(lv, plog.segment_count)
            t_in.add_metric([topic], agg[0])
            t_bin.add_metric([topic], agg[1])
            t_out.add_metric([topic], agg[2])
            t_bout.add_metric([topic], agg[3])
            t_size.add_metric([topic], agg[4])
            t_parts.add_metric([topic], n)
        for plog in logs.values():
            appended += plog.batches_appended
        self._note_dropped(dropped, shown + dropped, "partitions of topics")
        yield from (p_in, p_bin, p_out, p_bout, p_start, p_end, p_hw, p_size, p_segs)
        yield from (t_in, t_bin, t_out, t_bout, t_size, t_parts)
        batches = _counter(
            "tidewire_log_batches_appended",
            "Batches appended to every log (internal topics included).",
        )
        batches.add_metric([], appended)
        yield batches
        st = b.stats
        for name, value, doc in (
            ("tidewire_messages_in", st.published, "Messages appended by producers."),
            ("tidewire_messages_out", st.delivered, "Messages handed to readers."),
        ):
            c = _counter(name, doc)
            c.add_metric([], value)
            yield c

    def _note_dropped(self, dropped: int, total: int, what: str) -> None:
        m = self.m
        m.series_dropped = dropped
        if dropped and not m._warned:
            m._warned = True
            log.warning(
                "metrics: %s of %s %s have no per-partition series "
                "(metrics_max_partition_series=%s); their topics' aggregates are kept",
                f"{dropped:,}",
                f"{total:,}",
                what,
                f"{m.max_partition_series:,}",
            )

    # --- queues (observability/queue_metrics.py)

    def _queues(self, b: Broker) -> Iterator[Metric]:
        got: list[tuple[int, int]] = []
        yield from queue_families(b, self.m.max_partition_series, got)
        for dropped, total in got:
            if dropped:
                self._note_dropped(self.m.series_dropped + dropped, total, "queues")

    # --- consumer groups

    def _groups(self, b: Broker) -> Iterator[Metric]:
        groups = _groups_of(b)
        if groups is None:
            return
        cap = self.m.max_partition_series
        gl = ["group", "topic", "partition"]
        committed = _gauge(
            "tidewire_group_committed_offset", "The group's committed offset (next to read).", gl
        )
        lag = _gauge("tidewire_group_lag_messages", "High watermark minus committed offset.", gl)
        lag_s = _gauge(
            "tidewire_group_lag_seconds",
            "While the group lags: seconds since it last committed this partition (0 when "
            "it has caught up).",
            gl,
        )
        total = _gauge("tidewire_group_lag_total_messages", "The group's lag summed.", ["group"])
        members = _gauge("tidewire_group_members", "Members of the group.", ["group"])
        state = _gauge(
            "tidewire_group_state",
            "1 for the group's state (empty, rebalancing, stable).",
            ["group", "state"],
        )
        now_ms = self.m.clock() * 1000
        shown = dropped = 0
        for listing in groups.list_groups():
            g = listing.group_id
            members.add_metric([g], listing.members)
            state.add_metric([g, str(listing.state)], 1)
            try:
                desc = groups.describe(g)
                got = groups.committed(g)
            except TidewireError:  # a group that went away meanwhile
                continue
            summed = 0
            for p in desc.offsets:
                if p.committed < 0:
                    continue
                summed += max(p.lag, 0)
                if shown >= cap:
                    dropped += 1
                    continue
                shown += 1
                lv = [g, p.topic, str(p.partition)]
                committed.add_metric(lv, p.committed)
                lag.add_metric(lv, max(p.lag, 0))
                c = got.get((p.topic, p.partition))
                behind = p.lag > 0 and c is not None and c.timestamp_ms > 0
                lag_s.add_metric(lv, max(now_ms - c.timestamp_ms, 0) / 1000 if behind else 0.0)
            total.add_metric([g], summed)
        if dropped:
            self._note_dropped(self.m.series_dropped + dropped, shown + dropped, "group partitions")
        sd = _gauge(
            "tidewire_metrics_series_dropped",
            "Partitions and queues whose series were left out (over metrics_max_partition_series).",
        )
        sd.add_metric([], self.m.series_dropped)
        yield from (committed, lag, lag_s, total, members, state, sd)

    # --- storage

    def _storage(self, b: Broker) -> Iterator[Metric]:
        logs = b.logs
        fs = logs.flush_stats
        buckets: list[tuple[str, float]] = []
        acc = 0
        for bound, n in zip(FLUSH_BUCKETS, fs.buckets, strict=False):
            acc += n
            buckets.append((repr(bound), acc))
        buckets.append(("+Inf", fs.count))
        h = HistogramMetricFamily(
            "tidewire_fsync_duration_seconds",
            "Duration of each group commit (fsync of a log's files), seconds.",
        )
        h.add_metric([], buckets, fs.seconds)
        yield h
        for name, value, doc in (
            ("tidewire_fsync_batches", fs.batches, "Batches made durable by group commits."),
            ("tidewire_fsync_bytes", fs.bytes, "Bytes made durable by group commits."),
            ("tidewire_fsync_failures", fs.failures, "Group commits whose fsync failed."),
        ):
            c = _counter(name, doc)
            c.add_metric([], value)
            yield c
        scanned = truncated = zeros = damaged = segments = 0
        for plog in list(logs.logs.values()):
            rep = plog.report
            scanned += rep.scanned_segments
            segments += rep.segments
            truncated += rep.truncated_bytes
            zeros += rep.truncated_zero_bytes
            damaged += len(rep.damage)
        figures: tuple[tuple[str, float, str], ...] = (
            (
                "tidewire_recovery_duration_seconds",
                logs.open_seconds,
                "How long the last start took to open and recover the data directory.",
            ),
            (
                "tidewire_recovery_clean",
                int(logs.was_clean),
                "1 if the last start followed a clean shutdown.",
            ),
            ("tidewire_recovery_segments", segments, "Segments found by the last start."),
            (
                "tidewire_recovery_segments_scanned",
                scanned,
                "Segments the last start re-read (CRC-checked) past their recovery point.",
            ),
            (
                "tidewire_recovery_truncated_bytes",
                truncated,
                "Bytes of torn tails cut by the last start.",
            ),
            (
                "tidewire_recovery_truncated_zero_bytes",
                zeros,
                "Of those, bytes of zeros after a log's last batch (written ahead of appends).",
            ),
            ("tidewire_recovery_damaged_ranges", damaged, "Damaged ranges the last start found."),
            (
                "tidewire_partitions_offline",
                len(logs.offline),
                "Partitions that could not be opened.",
            ),
        )
        for name, figure, doc in figures:
            gm = _gauge(name, doc)
            gm.add_metric([], figure)
            yield gm
        try:
            usage = shutil.disk_usage(logs.data_dir)
        except OSError:
            return
        for name, value, doc in (
            ("tidewire_disk_free_bytes", usage.free, "Free bytes of the data directory's disk."),
            ("tidewire_disk_total_bytes", usage.total, "Size of the data directory's disk."),
        ):
            gm = _gauge(name, doc)
            gm.add_metric([], value)
            yield gm

    # --- listeners and delivery

    def _server(self, b: Broker) -> Iterator[Metric]:
        m = self.m
        servers = list(m.tcp_servers)
        conns = _gauge(
            "tidewire_connections_open", "Connections open, by interface.", ["interface"]
        )
        conns.add_metric(["binary"], sum(len(s.connections) for s in servers))
        conns.add_metric(["http"], m.http_connections_open())
        yield conns
        inflight = _gauge(
            "tidewire_requests_in_flight", "Requests being handled, by interface.", ["interface"]
        )
        inflight.add_metric(["binary"], sum(s.in_flight() for s in servers))
        inflight.add_metric(["http"], m.http_in_flight)
        yield inflight
        waiters = _gauge("tidewire_fetch_waiters", "Long-poll fetches waiting for data.")
        waiters.add_metric([], b.fetch_waiters)
        yield waiters
        subs = credit = 0
        for s in servers:
            for c in list(s.connections):
                for sub in list(c.subscriptions.subs.values()):
                    subs += 1
                    credit += max(sub.in_flight, 0)
        for name, value, doc in (
            ("tidewire_push_subscriptions", subs, "Push subscriptions open."),
            (
                "tidewire_push_credit_outstanding_bytes",
                credit,
                "Bytes pushed that the subscribers have not given back as credit yet.",
            ),
        ):
            gm = _gauge(name, doc)
            gm.add_metric([], value)
            yield gm
        drops = _counter(
            "tidewire_push_dropped_messages",
            "Messages best-effort push subscriptions skipped because they lagged.",
        )
        drops.add_metric([], b.stats.dropped)
        yield drops
        streams = _gauge("tidewire_http_streams_open", "WebSocket and SSE sessions open.", ["kind"])
        for kind, n in sorted(m.streams_open.items()):
            streams.add_metric([kind], n)
        yield streams

    # --- security

    def _security(self, b: Broker) -> Iterator[Metric]:
        if self.m.security_stats is None:
            return
        stats = self.m.security_stats()
        auth = _counter(
            "tidewire_authentications",
            "Authentications, by result (ok, failed, rate_limited).",
            ["result"],
        )
        auth.add_metric(["ok"], stats.get("authentications_ok", 0))
        auth.add_metric(["failed"], stats.get("authentication_failures", 0))
        auth.add_metric(["rate_limited"], stats.get("authentications_rate_limited", 0))
        yield auth
        denied = _counter("tidewire_requests_denied", "Requests refused by the authorizer.")
        denied.add_metric([], stats.get("requests_denied", 0))
        yield denied
        throttle = _counter(
            "tidewire_quota_throttle_seconds",
            "Seconds answers were held back by quotas, by kind (of principals still tracked).",
            ["kind"],
        )
        for key, value in sorted(stats.items()):
            if key.startswith("throttle_seconds_"):
                throttle.add_metric([key.removeprefix("throttle_seconds_")], value)
        yield throttle
        audit = b.audit
        if audit is not None:
            events = _counter(
                "tidewire_audit_events",
                "Audit events since start: recorded (taken by the audit log), summarized (of "
                "those, over the buffer: counted into a summary record instead of one each), "
                "lost (after close, or refused by the log at close).",
                ["fate"],
            )
            events.add_metric(["recorded"], audit.recorded)
            events.add_metric(["summarized"], audit.suppressed)
            events.add_metric(["lost"], audit.lost)
            yield events
