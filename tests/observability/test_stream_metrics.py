"""The lightweight streams' metrics: every field of ``StreamStats`` exported under its name,
``/metrics`` after a known workload on a real broker (with a fake stream clock for the
expiry), and the streams' figures and series of ``/v1/metrics/recent``."""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx
import msgspec
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import Metric
from prometheus_client.registry import Collector

from tests.observability.test_metrics import samples, value
from tests.observability.test_metrics_samples import FakeClock
from tidewire.broker.streams.model import FROM_START, SendItem, StreamStats
from tidewire.embedded import EmbeddedBroker
from tidewire.observability.metrics import metrics_for
from tidewire.observability.samples import STREAM_SERIES, RecentSamples
from tidewire.observability.stream_metrics import stream_metric_families, stream_stats

TIMEOUT_S = 30.0
T0_MS = 1_800_000_000_000

#: Where each field of StreamStats is exported: (sample name, labels).
EXPORTED: dict[str, tuple[str, dict[str, str]]] = {
    "streams": ("tidewire_streams", {}),
    "in_memory_messages": ("tidewire_stream_messages", {"kind": "in_memory"}),
    "in_memory_bytes": ("tidewire_stream_in_memory_bytes", {}),
    "persistent_messages": ("tidewire_stream_messages", {"kind": "persistent"}),
    "receivers": ("tidewire_stream_receivers", {}),
    "sent_in_memory": ("tidewire_stream_sent_total", {"kind": "in_memory"}),
    "sent_persistent": ("tidewire_stream_sent_total", {"kind": "persistent"}),
    "duplicates": ("tidewire_stream_duplicates_total", {}),
    "received": ("tidewire_stream_received_total", {"mode": "take"}),
    "read": ("tidewire_stream_received_total", {"mode": "read"}),
    "expired": ("tidewire_stream_expired_total", {}),
    "dropped": ("tidewire_stream_dropped_total", {}),
    "created": ("tidewire_stream_created_total", {}),
    "evicted": ("tidewire_stream_evicted_total", {}),
    "blocked_sends_timed_out": ("tidewire_stream_sends_timed_out_total", {}),
    "log_bytes": ("tidewire_stream_log_bytes", {}),
}


class _Fixed(Collector):
    def __init__(self, st: StreamStats) -> None:
        self.st = st

    def collect(self) -> list[Metric]:
        return list(stream_metric_families(self.st))


def test_every_stats_field_is_exported_under_its_name() -> None:
    """Each field a distinct value: each lands in its own sample, and nothing else is
    exported (no per-stream series)."""
    fields = msgspec.structs.fields(StreamStats)
    assert {f.name for f in fields} == set(EXPORTED), "a StreamStats field without a metric"
    st = StreamStats(**{f.name: 1_000 + i for i, f in enumerate(fields)})
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Fixed(st))
    got = samples(generate_latest(registry).decode())
    for field, (name, labels) in EXPORTED.items():
        assert value(got, name, **labels) == getattr(st, field), field
    assert len(got) == len(EXPORTED)
    # Counters end in _total, gauges do not; every name is distinct in OpenMetrics too.
    from prometheus_client.openmetrics.exposition import generate_latest as om_latest
    from prometheus_client.openmetrics.parser import text_string_to_metric_families as om_parse

    families = {f.name: f.type for f in om_parse(om_latest(registry).decode())}
    assert families["tidewire_stream_sent"] == "counter"
    assert families["tidewire_stream_messages"] == "gauge"
    assert families["tidewire_streams"] == "gauge"


def test_metrics_after_a_known_workload(tmp_path: Path) -> None:
    """Three persistent messages and two in memory, a duplicate, a take, a token read, an
    expiry: /metrics says exactly that, and agrees with stats() field by field."""

    async def main() -> None:
        eb = EmbeddedBroker(str(tmp_path / "data"), http_port=0)
        now = [T0_MS]
        eb.broker.stream_clock = lambda: now[0]
        async with eb:
            streams = eb.broker.streams
            results = await streams.send(
                [
                    SendItem("orders", b"o1", uuid="u1", persistent=True),
                    SendItem("orders", b"o2", persistent=True),
                    SendItem("orders", b"o3", persistent=True, ttl_ms=1_000),
                    SendItem("jobs", b"j1"),
                    SendItem("jobs", b"j2"),
                    SendItem("orders", b"again", uuid="u1", persistent=True),
                ]
            )
            assert [r.code for r in results] == [0, 0, 0, 0, 0, -1]
            taken = await streams.receive(["jobs"])
            assert [m.value for m in taken] == [b"j1"]
            got, _ = await streams.read({"orders": FROM_START})
            assert [m.value for m in got] == [b"o1", b"o2", b"o3"]
            now[0] += 2_000  # o3 expires
            streams.tick()
            st = streams.stats()
            async with httpx.AsyncClient(base_url=eb.http_url, timeout=TIMEOUT_S) as http:
                r = await http.get("/metrics")
                assert r.status_code == 200, r.text
                om = await http.get("/metrics", headers={"Accept": "application/openmetrics-text"})
                assert om.status_code == 200, om.text
        exported = samples(r.text)
        for field, (name, labels) in EXPORTED.items():
            assert value(exported, name, **labels) == getattr(st, field), field
        assert value(exported, "tidewire_streams") == 2
        assert value(exported, "tidewire_stream_created_total") == 2
        assert value(exported, "tidewire_stream_sent_total", kind="persistent") == 3
        assert value(exported, "tidewire_stream_sent_total", kind="in_memory") == 2
        assert value(exported, "tidewire_stream_duplicates_total") == 1
        assert value(exported, "tidewire_stream_received_total", mode="take") == 1
        assert value(exported, "tidewire_stream_received_total", mode="read") == 3
        assert value(exported, "tidewire_stream_messages", kind="in_memory") == 1
        assert value(exported, "tidewire_stream_messages", kind="persistent") == 2
        assert value(exported, "tidewire_stream_expired_total") >= 1
        assert value(exported, "tidewire_stream_log_bytes") > 0
        assert "tidewire_stream_sent_total" in om.text

    asyncio.run(main())


def test_recent_samples_of_streams(tmp_path: Path) -> None:
    """The ring records the streams' levels at each sample and their rates between two, and
    /v1/metrics/recent answers them."""

    async def main() -> None:
        async with EmbeddedBroker(str(tmp_path / "data"), http_port=0) as eb:
            streams = eb.broker.streams
            clock = FakeClock(1_000.0)
            ring = RecentSamples(metrics_for(eb.broker), interval_s=5.0, points=4, clock=clock)
            ring.sample()  # levels only
            await streams.send([SendItem(f"s{i}", b"v", persistent=True) for i in range(10)])
            taken = await streams.receive(["s0", "s1"], max_messages=2)
            assert sorted(m.stream for m in taken) == ["s0", "s1"]
            got, _ = await streams.read({"s5": FROM_START})
            assert len(got) == 1
            clock.now += 5.0
            ring.sample()
            series = ring.snapshot()["stream_series"]
            assert list(series) == list(STREAM_SERIES)
            assert series["streams"] == [[1_000.0, 0.0], [1_005.0, 10.0]]
            assert series["persistent_messages"] == [[1_000.0, 0.0], [1_005.0, 10.0]]
            assert series["in_memory_messages"] == [[1_000.0, 0.0], [1_005.0, 0.0]]
            assert series["sent_per_s"] == [[1_005.0, 10 / 5]]
            assert series["taken_per_s"] == [[1_005.0, 2 / 5]]
            assert series["read_per_s"] == [[1_005.0, 1 / 5]]
            assert series["receivers"][-1] == [1_005.0, 0.0]
            assert series["log_bytes"][-1][1] > 0
            for _ in range(5):  # the ring keeps `points` points
                clock.now += 5.0
                ring.sample()
            series = ring.snapshot()["stream_series"]
            assert len(series["streams"]) == 4
            assert series["sent_per_s"][-1] == [1_030.0, 0.0]
            async with httpx.AsyncClient(base_url=eb.http_url, timeout=TIMEOUT_S) as http:
                doc = (await http.get("/v1/metrics/recent")).json()
            # The gateway's own sampler took its first sample when it started.
            assert list(doc["stream_series"]) == list(STREAM_SERIES)
            assert len(doc["stream_series"]["streams"]) >= 1
        assert stream_stats(eb.broker) is None  # closed: no stream manager, no error

    asyncio.run(main())
