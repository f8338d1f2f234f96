"""The recent-samples ring: what the dashboard's charts draw, without a Prometheus.

Every ``interval_s`` (5 s by default) :class:`RecentSamples` records a few broker-wide series
for the last hour (:data:`POINTS` points each): messages and bytes in, bytes out and requests
per second (from the counters of :class:`~tidewire.observability.metrics.BrokerMetrics`),
connections open, disk used, and the total lag of each consumer group (the
:data:`MAX_GROUPS` largest at each sample). ``GET /v1/metrics/recent`` answers
:meth:`RecentSamples.snapshot`::

    {"interval_s": 5.0, "now": 1700000000.0,
     "series": {"messages_in_per_s": [[ts, value], ...], "bytes_in_per_s": [...],
                "bytes_out_per_s": [...], "requests_per_s": [...], "connections": [...],
                "disk_used_bytes": [...]},
     "group_lag": {"<group>": [[ts, lag], ...]},
     "stream_series": {"streams": [...], "in_memory_messages": [...],
                       "persistent_messages": [...], "receivers": [...], "sent_per_s": [...],
                       "taken_per_s": [...], "read_per_s": [...], "log_bytes": [...]}}

The lightweight streams' series (:data:`STREAM_SERIES`) come from ``broker.streams.stats()``
(no points while the broker has no stream manager).

Timestamps are seconds since the epoch; the clock is injected (tests drive :meth:`sample`
themselves instead of sleeping).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from tidewire._tasks import wait_event
from tidewire.errors import InvalidConfigError, InvalidRequestError
from tidewire.observability.metrics import BrokerMetrics, Totals
from tidewire.observability.stream_metrics import stream_stats

if TYPE_CHECKING:
    from tidewire.broker.streams.model import StreamStats

__all__ = [
    "DEFAULT_INTERVAL_S",
    "MAX_GROUPS",
    "POINTS",
    "SERIES",
    "STREAM_SERIES",
    "RecentSamples",
    "samples_for",
]

log = logging.getLogger(__name__)

#: Seconds between samples.
DEFAULT_INTERVAL_S = 5.0
#: Points kept per series: an hour at 5 s.
POINTS = 720
#: Consumer groups with a lag series; the largest lags are kept (bounds memory and the
#: answer's size at thousands of groups).
MAX_GROUPS = 50
#: The broker-wide series, in the order of the answer.
SERIES = (
    "messages_in_per_s",
    "bytes_in_per_s",
    "bytes_out_per_s",
    "requests_per_s",
    "connections",
    "disk_used_bytes",
)
#: The lightweight streams' series (from ``broker.streams.stats()``), in the order of the
#: answer: streams, messages held, receivers waiting, messages stored by sends, taken by
#: work-queue receives and returned by token reads per second, bytes of their logs.
STREAM_SERIES = (
    "streams",
    "in_memory_messages",
    "persistent_messages",
    "receivers",
    "sent_per_s",
    "taken_per_s",
    "read_per_s",
    "log_bytes",
)

Point = tuple[float, float]


class RecentSamples:
    """The ring of one broker's recent samples.

    Args:
        metrics: where the counters are read.
        interval_s: seconds between samples (0.1 .. 3,600).
        points: points kept per series.
        clock: seconds since the epoch.
    """

    def __init__(
        self,
        metrics: BrokerMetrics,
        *,
        interval_s: float = DEFAULT_INTERVAL_S,
        points: int = POINTS,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if not 0.1 <= interval_s <= 3600:
            raise InvalidConfigError(f"sample_interval_s={interval_s} must be within 0.1..3,600")
        if points < 1:
            raise InvalidConfigError(f"points={points} must be >= 1")
        self.metrics = metrics
        self.interval_s = interval_s
        self.points = points
        self.clock = clock
        self.series: dict[str, deque[Point]] = {k: deque(maxlen=points) for k in SERIES}
        self.group_lag: dict[str, deque[Point]] = {}
        self.stream_series: dict[str, deque[Point]] = {
            k: deque(maxlen=points) for k in STREAM_SERIES
        }
        self._last: tuple[float, Totals] | None = None
        self._last_streams: tuple[float, StreamStats] | None = None
        self._task: asyncio.Task[None] | None = None

    def sample(self) -> None:
        """Record one point of every series now (rates: since the previous sample; the
        first sample records none)."""
        now = self.clock()
        totals = self.metrics.totals()
        last = self._last
        self._last = (now, totals)
        if last is not None and now > last[0]:
            dt = now - last[0]
            prev = last[1]
            for key, cur, old in (
                ("messages_in_per_s", totals.messages_in, prev.messages_in),
                ("bytes_in_per_s", totals.bytes_in, prev.bytes_in),
                ("bytes_out_per_s", totals.bytes_out, prev.bytes_out),
                ("requests_per_s", totals.requests, prev.requests),
            ):
                # A counter that went down (a topic deleted) restarts from zero.
                self.series[key].append((now, max(cur - old, 0) / dt))
        self.series["connections"].append((now, float(totals.connections)))
        self.series["disk_used_bytes"].append((now, float(totals.disk_used_bytes)))
        lags = self.metrics.group_lags(MAX_GROUPS)
        for group, lag in lags.items():
            ring = self.group_lag.get(group)
            if ring is None:
                ring = self.group_lag[group] = deque(maxlen=self.points)
            ring.append((now, float(lag)))
        self._sample_streams(now)
        # Groups not sampled for a whole hour are forgotten; the others stay bounded.
        horizon = now - self.interval_s * self.points
        for group in [g for g, r in self.group_lag.items() if not r or r[-1][0] < horizon]:
            del self.group_lag[group]
        if len(self.group_lag) > 2 * MAX_GROUPS:
            keep = sorted(self.group_lag, key=lambda g: self.group_lag[g][-1][0], reverse=True)
            for group in keep[2 * MAX_GROUPS :]:
                del self.group_lag[group]

    def _stream_stats(self) -> StreamStats | None:
        try:
            return stream_stats(self.metrics.broker)
        except InvalidRequestError:  # the broker is gone
            return None

    def _sample_streams(self, now: float) -> None:
        st = self._stream_stats()
        last = self._last_streams
        self._last_streams = None if st is None else (now, st)
        if st is None:
            return
        ring = self.stream_series
        if last is not None and now > last[0]:
            dt = now - last[0]
            prev = last[1]
            for key, cur, old in (
                (
                    "sent_per_s",
                    st.sent_in_memory + st.sent_persistent,
                    prev.sent_in_memory + prev.sent_persistent,
                ),
                ("taken_per_s", st.received, prev.received),
                ("read_per_s", st.read, prev.read),
            ):
                # Counters restart from zero with a new stream manager.
                ring[key].append((now, max(cur - old, 0) / dt))
        for key, value in (
            ("streams", st.streams),
            ("in_memory_messages", st.in_memory_messages),
            ("persistent_messages", st.persistent_messages),
            ("receivers", st.receivers),
            ("log_bytes", st.log_bytes),
        ):
            ring[key].append((now, float(value)))

    def snapshot(self) -> dict[str, Any]:
        """The answer of ``GET /v1/metrics/recent`` (see the module docstring)."""
        return {
            "interval_s": float(self.interval_s),
            "now": self.clock(),
            "series": {k: [[t, v] for t, v in self.series[k]] for k in SERIES},
            "group_lag": {
                g: [[t, v] for t, v in ring] for g, ring in sorted(self.group_lag.items())
            },
            "stream_series": {k: [[t, v] for t, v in self.stream_series[k]] for k in STREAM_SERIES},
        }

    # --- the sampling task ----------------------------------------------------------------------

    @property
    def running(self) -> bool:
        return self._task is not None and not self._task.done()

    def start(self, stop: asyncio.Event) -> None:
        """Sample every ``interval_s`` until ``stop`` is set or :meth:`stop` is called
        (idempotent while running)."""
        if self.running:
            return
        self._task = asyncio.get_running_loop().create_task(self._run(stop), name="metrics samples")
        self._task.add_done_callback(_log_failure)

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None and not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _run(self, stop: asyncio.Event) -> None:
        self.sample()
        while not stop.is_set():
            await wait_event(stop, self.interval_s)
            if stop.is_set():
                return
            try:
                self.sample()
            except Exception:
                log.exception("recording a metrics sample failed; the next one is tried")


def samples_for(metrics: BrokerMetrics) -> RecentSamples:
    """The recent-samples ring of ``metrics`` (one per broker, made on first use with
    ``metrics.sample_interval_s``)."""
    ring = metrics.samples
    if not isinstance(ring, RecentSamples):
        ring = metrics.samples = RecentSamples(
            metrics, interval_s=metrics.sample_interval_s, clock=metrics.clock
        )
    return ring


def _log_failure(task: asyncio.Task[None]) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.error("the metrics sampler failed", exc_info=task.exception())
