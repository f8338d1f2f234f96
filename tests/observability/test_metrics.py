"""``/metrics`` after a known workload: exact counter values, an exposition that parses, the
cardinality cap, and OpenMetrics on request."""

from __future__ import annotations

import asyncio
import logging
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tidewire.embedded import EmbeddedBroker
from tidewire.observability.metrics import configure_metrics, metrics_for
from tidewire.records import iter_batches
from tidewire.records.builder import BatchBuilder
from tidewire.storage.config import FsyncPolicy, LogConfig

TIMEOUT_S = 30.0


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of an exposition: (name, sorted labels) -> value."""
    out: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[s.name, tuple(sorted(s.labels.items()))] = s.value
    return out


def value(
    got: dict[tuple[str, tuple[tuple[str, str], ...]], float], name: str, **labels: Any
) -> float:
    key = (name, tuple(sorted((k, str(v)) for k, v in labels.items())))
    assert key in got, f"{key} not exported"
    return got[key]


def batch(n: int, start: int) -> bytes:
    b = BatchBuilder()
    for i in range(n):
        b.append(f"message {start + i}".encode(), key=b"k", timestamp_ms=int(time.time() * 1000))
    return b.build()


def test_exact_counters_after_a_known_workload(tmp_path: Path) -> None:
    """1,000 messages in 10 batches to a 3-partition topic, partition 0 read whole, a group
    committed: the counters say exactly that."""

    async def main() -> None:
        async with EmbeddedBroker(str(tmp_path / "data"), http_port=0) as eb:
            sizes = [0, 0, 0]
            counts = [0, 0, 0]
            async with eb.client() as client:
                await client.create_topic("orders", 3)
                for i in range(10):
                    data = batch(100, i * 100)
                    p = i % 3
                    await client.produce_batch("orders", p, data)
                    sizes[p] += len(data)
                    counts[p] += 100
                offset = fetched_bytes = 0
                while offset < 400:
                    got = await client.fetch_batches("orders", 0, offset)
                    fetched_bytes += len(got.data)
                    last = [h for _, h in iter_batches(got.data)][-1]
                    offset = last.next_offset
                await client.commit_offsets("g1", {("orders", 0): 400, ("orders", 1): 100})
            async with httpx.AsyncClient(base_url=eb.http_url, timeout=TIMEOUT_S) as http:
                r = await http.get("/metrics")
                assert r.status_code == 200, r.text
                assert r.headers["content-type"].startswith("text/plain")
                r2 = await http.get("/metrics")
            got = samples(r.text)
            assert counts == [400, 300, 300]
            for p in range(3):
                assert (
                    value(got, "tidewire_partition_messages_in_total", topic="orders", partition=p)
                    == counts[p]
                )
                assert (
                    value(got, "tidewire_partition_bytes_in_total", topic="orders", partition=p)
                    == sizes[p]
                )
                assert (
                    value(got, "tidewire_partition_log_end_offset", topic="orders", partition=p)
                    == counts[p]
                )
                assert (
                    value(got, "tidewire_partition_log_start_offset", topic="orders", partition=p)
                    == 0
                )
                assert value(got, "tidewire_partition_segments", topic="orders", partition=p) == 1
                assert (
                    value(got, "tidewire_partition_size_bytes", topic="orders", partition=p)
                    == sizes[p]
                )
            assert value(got, "tidewire_topic_messages_in_total", topic="orders") == 1000
            assert value(got, "tidewire_topic_bytes_in_total", topic="orders") == sum(sizes)
            assert value(got, "tidewire_topic_partitions", topic="orders") == 3
            assert (
                value(got, "tidewire_partition_messages_out_total", topic="orders", partition=0)
                == 400
            )
            assert (
                value(got, "tidewire_partition_bytes_out_total", topic="orders", partition=0)
                == fetched_bytes
            )
            assert fetched_bytes == sizes[0]
            assert (
                value(got, "tidewire_partition_messages_out_total", topic="orders", partition=1)
                == 0
            )
            assert value(got, "tidewire_topic_messages_out_total", topic="orders") == 400
            assert value(got, "tidewire_messages_in_total") == 1000
            # The group: partition 0 caught up, partition 1 200 behind, partition 2 never
            # committed (no series).
            g = {"group": "g1", "topic": "orders"}
            assert value(got, "tidewire_group_committed_offset", **g, partition=0) == 400
            assert value(got, "tidewire_group_committed_offset", **g, partition=1) == 100
            assert value(got, "tidewire_group_lag_messages", **g, partition=0) == 0
            assert value(got, "tidewire_group_lag_messages", **g, partition=1) == 200
            assert value(got, "tidewire_group_lag_seconds", **g, partition=0) == 0
            assert value(got, "tidewire_group_lag_seconds", **g, partition=1) >= 0
            assert (
                "tidewire_group_lag_messages",
                (("group", "g1"), ("partition", "2"), ("topic", "orders")),
            ) not in got
            assert value(got, "tidewire_group_lag_total_messages", group="g1") == 200
            assert value(got, "tidewire_group_members", group="g1") == 0
            assert value(got, "tidewire_group_state", group="g1", state="empty") == 1
            # Requests: 10 produces, 1 create, the fetches, 1 commit, all without error.
            b = {"interface": "binary"}
            assert value(got, "tidewire_request_duration_seconds_count", **b, api="PRODUCE") == 10
            assert (
                value(got, "tidewire_request_duration_seconds_count", **b, api="CREATE_TOPIC") == 1
            )
            assert not [k for k in got if k[0] == "tidewire_request_errors_total"]
            assert value(got, "tidewire_connections_accepted_total", interface="binary") == 1
            assert (
                value(got, "tidewire_connections_closed_total", interface="binary", reason="peer")
                == 1
            )
            assert value(got, "tidewire_connections_open", interface="binary") == 0
            assert value(got, "tidewire_metrics_series_dropped") == 0
            # Storage: every produce waited for a group commit that covered its batch.
            # Storage: the 10 batches and the group's commit were appended; group commits
            # (when the fsync policy made them) covered at most those.
            appended = value(got, "tidewire_log_batches_appended_total")
            assert appended >= 11
            assert value(got, "tidewire_fsync_batches_total") <= appended
            assert value(got, "tidewire_fsync_duration_seconds_bucket", le="+Inf") == value(
                got, "tidewire_fsync_duration_seconds_count"
            )
            assert value(got, "tidewire_disk_free_bytes") > 0
            assert value(got, "tidewire_recovery_clean") == 0
            assert (
                value(got, "tidewire_broker_info", version=__import__("tidewire").__version__) == 1
            )
            assert value(got, "tidewire_authentications_total", result="failed") == 0
            assert "python_info" in {k[0] for k in got}
            # The first scrape is counted by the second, under its route template.
            got2 = samples(r2.text)
            assert (
                value(
                    got2,
                    "tidewire_request_duration_seconds_count",
                    interface="http",
                    api="GET /metrics",
                )
                == 1
            )

    asyncio.run(main())


def test_openmetrics_on_request(tmp_path: Path) -> None:
    async def main() -> None:
        async with (
            EmbeddedBroker(str(tmp_path / "data"), http_port=0, listen=False) as eb,
            httpx.AsyncClient(base_url=eb.http_url, timeout=TIMEOUT_S) as http,
        ):
            r = await http.get(
                "/metrics", headers={"accept": "application/openmetrics-text; version=1.0.0"}
            )
            assert r.status_code == 200
            assert r.headers["content-type"].startswith("application/openmetrics-text")
            assert r.text.rstrip().endswith("# EOF")
            r = await http.get("/v1/topics/nope")
            assert r.status_code == 404
            r = await http.get("/metrics")
            got = samples(r.text)
            api = "GET /v1/topics/{topic}"
            assert (
                value(got, "tidewire_request_errors_total", interface="http", api=api, code=404)
                == 1
            )

    asyncio.run(main())


def test_cardinality_cap(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A cap of 5 partitions with 8: 5 have series, 3 are dropped (counted, logged once),
    the topic aggregates keep every message."""

    async def main() -> None:
        async with EmbeddedBroker(str(tmp_path / "data"), http_port=0) as eb:
            configure_metrics(eb.broker, max_partition_series=5)
            async with eb.client() as client:
                await client.create_topic("wide", 8)
                for p in range(8):
                    await client.produce_batch("wide", p, batch(3, 0))
            async with httpx.AsyncClient(base_url=eb.http_url, timeout=TIMEOUT_S) as http:
                with caplog.at_level(logging.WARNING, logger="tidewire.observability.metrics"):
                    text1 = (await http.get("/metrics")).text
                    text2 = (await http.get("/metrics")).text
            for text in (text1, text2):
                got = samples(text)
                parts = {
                    dict(k[1])["partition"]
                    for k in got
                    if k[0] == "tidewire_partition_messages_in_total"
                }
                assert parts == {"0", "1", "2", "3", "4"}
                assert value(got, "tidewire_topic_messages_in_total", topic="wide") == 24
                assert value(got, "tidewire_metrics_series_dropped") == 3
            warnings = [r for r in caplog.records if "metrics_max_partition_series=5" in r.message]
            assert len(warnings) == 1, [r.message for r in caplog.records]
            assert "3 of 8 partitions" in warnings[0].message

    asyncio.run(main())


def test_metrics_disabled(tmp_path: Path) -> None:
    async def main() -> None:
        async with EmbeddedBroker(str(tmp_path / "data"), http_port=0, listen=False) as eb:
            m = configure_metrics(eb.broker, enabled=False)
            async with httpx.AsyncClient(base_url=eb.http_url, timeout=TIMEOUT_S) as http:
                r = await http.get("/metrics")
                assert r.status_code == 404
                assert "metrics_enabled" in r.text
            assert metrics_for(eb.broker) is m
            assert m.requests == 0

    asyncio.run(main())


def test_group_commits_are_measured(tmp_path: Path) -> None:
    """Under fsync = always each acknowledged produce waited for a group commit that covered
    its batch: the fsync histogram and the batches and bytes made durable say so."""

    async def main() -> None:
        log_config = LogConfig(fsync=FsyncPolicy.ALWAYS)
        async with EmbeddedBroker(str(tmp_path / "data"), http_port=0, log=log_config) as eb:
            sizes = 0
            async with eb.client() as client:
                await client.create_topic("durable", 1)
                for i in range(3):
                    data = batch(10, i * 10)
                    sizes += len(data)
                    await client.produce_batch("durable", 0, data)
            async with httpx.AsyncClient(base_url=eb.http_url, timeout=TIMEOUT_S) as http:
                got = samples((await http.get("/metrics")).text)
            count = value(got, "tidewire_fsync_duration_seconds_count")
            assert count >= 3
            assert value(got, "tidewire_fsync_duration_seconds_bucket", le="+Inf") == count
            assert value(got, "tidewire_fsync_duration_seconds_sum") > 0
            assert value(got, "tidewire_fsync_batches_total") >= 3
            assert value(got, "tidewire_fsync_bytes_total") >= sizes
            assert value(got, "tidewire_fsync_failures_total") == 0

    asyncio.run(main())
