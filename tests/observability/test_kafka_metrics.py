"""The Kafka listener's metrics: the recorder's counts, their export under bounded labels,
the histogram's buckets, and ``/metrics`` of a real broker whose recorder is driven as the
listener drives it."""

from __future__ import annotations

from pathlib import Path

import httpx
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import Metric
from prometheus_client.registry import Collector

from tests.observability.test_metrics import samples, value
from tidewire.embedded import EmbeddedBroker
from tidewire.observability.kafka_metrics import (
    KAFKA_BUCKETS,
    KafkaListenerStats,
    kafka_metric_families,
    kafka_stats_doc,
    kafka_stats_for,
    kafka_stats_of,
)
from tidewire.protocol.kafka import ApiKey, ErrorCode

TIMEOUT_S = 30.0


class _Fixed(Collector):
    def __init__(self, st: KafkaListenerStats) -> None:
        self.st = st

    def collect(self) -> list[Metric]:
        return list(kafka_metric_families(self.st))


def exported(st: KafkaListenerStats) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    reg = CollectorRegistry(auto_describe=False)
    reg.register(_Fixed(st))
    return samples(generate_latest(reg).decode())


def drive(st: KafkaListenerStats) -> None:
    """A workload as the listener would report it."""
    st.listening("127.0.0.1", 19092)
    for _ in range(3):
        st.connection_opened()
    st.connection_closed()
    st.bytes_in(1000)
    st.bytes_in(24)
    st.bytes_out(4096)
    st.request(ApiKey.API_VERSIONS, 3, 0.0002, ErrorCode.UNSUPPORTED_VERSION)
    st.request(ApiKey.API_VERSIONS, 2, 0.0001, 0)
    for _ in range(5):
        st.request(ApiKey.PRODUCE, 7, 0.003, 0)
    st.request(ApiKey.PRODUCE, 7, 0.2, ErrorCode.TOPIC_AUTHORIZATION_FAILED)
    st.request(ApiKey.FETCH, 11, 45.0, 0)  # beyond the last bucket
    st.authentication(True, "SCRAM-SHA-256")
    st.authentication(False, "scram-sha-256")
    st.authentication(False, "made-up")


def test_counts_are_exported_under_their_names() -> None:
    st = KafkaListenerStats()
    drive(st)
    got = exported(st)
    assert value(got, "tidewire_kafka_connections") == 2
    assert value(got, "tidewire_kafka_connections_accepted_total") == 3
    assert value(got, "tidewire_kafka_received_bytes_total") == 1024
    assert value(got, "tidewire_kafka_sent_bytes_total") == 4096
    assert value(got, "tidewire_kafka_requests_total", api="produce", version=7) == 6
    assert value(got, "tidewire_kafka_requests_total", api="api_versions", version=3) == 1
    assert value(got, "tidewire_kafka_requests_total", api="api_versions", version=2) == 1
    assert value(got, "tidewire_kafka_requests_total", api="fetch", version=11) == 1
    assert (
        value(
            got,
            "tidewire_kafka_request_errors_total",
            api="api_versions",
            error="unsupported_version",
        )
        == 1
    )
    assert (
        value(
            got,
            "tidewire_kafka_request_errors_total",
            api="produce",
            error="topic_authorization_failed",
        )
        == 1
    )
    assert (
        value(got, "tidewire_kafka_authentications_total", mechanism="SCRAM-SHA-256", result="ok")
        == 1
    )
    assert (
        value(
            got, "tidewire_kafka_authentications_total", mechanism="SCRAM-SHA-256", result="failed"
        )
        == 1
    )
    assert (
        value(got, "tidewire_kafka_authentications_total", mechanism="other", result="failed") == 1
    )


def test_latency_histogram_buckets() -> None:
    st = KafkaListenerStats()
    drive(st)
    got = exported(st)
    name = "tidewire_kafka_request_seconds_bucket"
    assert value(got, name, api="produce", le="0.0025") == 0
    assert value(got, name, api="produce", le="0.005") == 5
    assert value(got, name, api="produce", le="0.25") == 6
    assert value(got, name, api="produce", le="+Inf") == 6
    assert value(got, "tidewire_kafka_request_seconds_count", api="produce") == 6
    assert abs(value(got, "tidewire_kafka_request_seconds_sum", api="produce") - 0.215) < 1e-9
    assert value(got, name, api="fetch", le="30.0") == 0
    assert value(got, name, api="fetch", le="+Inf") == 1
    # a value exactly on a bound falls in that bucket (le: less or equal)
    st.request(ApiKey.HEARTBEAT, 0, KAFKA_BUCKETS[3], 0)
    got = exported(st)
    assert value(got, name, api="heartbeat", le=repr(KAFKA_BUCKETS[3])) == 1
    assert value(got, name, api="heartbeat", le=repr(KAFKA_BUCKETS[2])) == 0


def test_labels_stay_bounded() -> None:
    """Unknown API keys, versions without a schema and unknown error codes fold into
    ``other``: a hostile client cannot grow the series."""
    st = KafkaListenerStats()
    for key in range(-5, 2000, 7):
        st.request(key, key % 40000, 0.001, key % 300)
    st.request(ApiKey.METADATA, 99, 0.001, 0)
    st.request(ApiKey.METADATA, -1, 0.001, 12345)
    got = exported(st)
    labels = {dict(k[1]).get("api") for k in got if k[0].startswith("tidewire_kafka_req")}
    assert labels <= {*(k.name.lower() for k in ApiKey), "other", None}
    assert value(got, "tidewire_kafka_requests_total", api="metadata", version="other") == 2
    assert value(got, "tidewire_kafka_request_errors_total", api="metadata", error="other") == 1
    versions = {dict(k[1])["version"] for k in got if k[0] == "tidewire_kafka_requests_total"}
    assert all(v == "other" or 0 <= int(v) <= 17 for v in versions), versions
    assert len(got) < 23 * 20 + 23 * 125 + 23 * 22


def test_stats_doc() -> None:
    assert kafka_stats_doc(None)["listening"] is False
    assert kafka_stats_doc(None)["apis"] == []
    st = KafkaListenerStats()
    drive(st)
    doc = kafka_stats_doc(st)
    assert doc["listening"] is True
    assert doc["port"] == 19092
    assert doc["connections"] == 2
    assert doc["requests"] == 9
    assert doc["errors"] == 2
    produce = next(a for a in doc["apis"] if a["api"] == "produce")
    assert produce["requests"] == 6
    assert produce["versions"] == {"7": 6}
    assert produce["errors_by"] == {"topic_authorization_failed": 1}
    assert produce["p50_ms"] == 5.0
    assert produce["p99_ms"] == 250.0
    assert abs(produce["mean_ms"] - 215 / 6) < 1e-6
    fetch = next(a for a in doc["apis"] if a["api"] == "fetch")
    assert fetch["p99_ms"] is None  # beyond the last bucket: no finite bound
    st.stopped()
    assert kafka_stats_doc(st)["listening"] is False
    assert kafka_stats_doc(st)["requests"] == 9


def test_connections_never_go_negative() -> None:
    st = KafkaListenerStats()
    st.connection_closed()
    assert st.connections == 0


def test_metrics_of_a_broker(tmp_path: Path) -> None:
    """Without a Kafka listener nothing tidewire_kafka_* is exported; once the recorder of
    the broker is driven, /metrics shows it."""
    with (
        EmbeddedBroker(str(tmp_path / "data"), http_port=0).running() as eb,
        httpx.Client(base_url=eb.http_url, timeout=TIMEOUT_S) as c,
    ):
        assert kafka_stats_of(eb.broker) is None
        assert "tidewire_kafka" not in c.get("/metrics").text
        st = kafka_stats_for(eb.broker)
        assert kafka_stats_for(eb.broker) is st
        drive(st)
        got = samples(c.get("/metrics").text)
        assert value(got, "tidewire_kafka_requests_total", api="produce", version=7) == 6
        assert value(got, "tidewire_kafka_connections") == 2
