"""``tidewire bench produce|consume`` against a real broker: the figures it reports agree with
what the broker stored, in text and in ``--json``; bad options and an unreachable broker are
refused with one line."""

from __future__ import annotations

import json
import math
import random

import pytest

from tests.cli._support import Broker, closed_port, run_cli
from tidewire.cli._bench_e2e import Histogram
from tidewire.client import Client

FIGURES = {
    "test",
    "topic",
    "messages",
    "size",
    "seconds",
    "msg_per_s",
    "mb_per_s",
    "latency_ms_p50",
    "latency_ms_p95",
    "latency_ms_p99",
    "latency_ms_max",
    "latency_samples",
    "settings",
}


def test_produce_then_consume_json(broker: Broker) -> None:
    args = ["--topic", "b", "--messages", "2000", "--size", "100", "--json"]
    produced = broker.cli("bench", "produce", *args, "--partitions", "3", "--producers", "2")
    assert produced.exit_code == 0, produced.stderr
    doc = json.loads(produced.stdout)
    assert set(doc) == FIGURES
    assert (doc["test"], doc["messages"], doc["size"]) == ("produce", 2000, 100)
    assert doc["msg_per_s"] > 0
    assert doc["seconds"] > 0
    # Every 8th message of each producer is timed.
    assert doc["latency_samples"] == 2 * (1000 // 8)
    lat = [doc[f"latency_ms_{q}"] for q in ("p50", "p95", "p99", "max")]
    assert lat == sorted(lat)
    assert lat[0] > 0
    assert doc["settings"]["producers"] == 2
    with Client(broker.addr) as client:
        ends = [p.log_end_offset for p in client.describe_topic("b").partitions]
    # Each producer's first message is sent (untimed) before the clock starts.
    assert sum(ends) == 2000 + 2

    consumed = broker.cli("bench", "consume", "--topic", "b", "--messages", "2002", "--json")
    assert consumed.exit_code == 0, consumed.stderr
    got = json.loads(consumed.stdout)
    assert (got["test"], got["messages"], got["size"], got["latency_samples"]) == (
        "consume",
        2002,
        100,
        2002,
    )


def test_produce_text_with_rate(broker: Broker) -> None:
    result = broker.cli("bench", "produce", "--messages", "300", "--rate", "1000")
    assert result.exit_code == 0, result.stderr
    for label in ("throughput", "msg/s", "MB/s", "latency p50 / p95 / p99 / max", "rate=1000"):
        assert label in result.stdout
    with Client(broker.addr) as client:
        assert client.describe_topic("bench").partitions[0].log_end_offset == 301


def test_consume_stops_when_messages_do_not_come(broker: Broker) -> None:
    broker.cli("topic", "create", "empty")
    result = broker.cli(
        "bench", "consume", "--topic", "empty", "--messages", "5", "--timeout", "0.3"
    )
    assert result.exit_code == 1
    assert "only 0 of 5 messages arrived" in result.stderr


def test_bad_options_and_no_broker(broker: Broker) -> None:
    bad = broker.cli("bench", "produce", "--acks", "all")
    assert bad.exit_code == 2
    assert "--acks must be none, leader or durable" in bad.stderr
    addr = f"127.0.0.1:{closed_port()}"
    gone = run_cli(["bench", "produce", "--messages", "10", "--addr", addr])
    assert gone.exit_code == 1
    assert gone.stderr.startswith("error: cannot connect to")
    unknown = broker.cli("bench", "consume", "--topic", "nope", "--messages", "1")
    assert unknown.exit_code == 1
    assert "does not exist" in unknown.stderr


E2E_FIGURES = {
    "test",
    "topic",
    "group",
    "messages",
    "size",
    "seconds",
    "publish_msg_per_s",
    "msg_per_s",
    "mb_per_s",
    "delivered",
    "duplicates",
    "latency_ms_p50",
    "latency_ms_p95",
    "latency_ms_p99",
    "latency_ms_p999",
    "latency_ms_max",
    "latency_samples",
    "per_consumer",
    "cpu_s_producer",
    "cpu_s_consumers",
    "settings",
}


@pytest.mark.parametrize("delivery", ["push", "pull"])
def test_e2e_delivers_every_message_to_the_group_once(broker: Broker, delivery: str) -> None:
    """Two member processes split 4 partitions; every published message is handed out once,
    and each one's publish-to-delivery latency is in the histogram."""
    args = ["--topic", "e", "--messages", "3000", "--size", "200", "--rate", "3000"]
    result = broker.cli("bench", "e2e", *args, "--delivery", delivery, "--json")
    assert result.exit_code == 0, result.stderr
    doc = json.loads(result.stdout)
    assert set(doc) == E2E_FIGURES
    assert (doc["test"], doc["messages"], doc["size"], doc["delivered"]) == ("e2e", 3000, 200, 3000)
    assert doc["duplicates"] == 0
    # Both members got partitions, and they were handed the timed messages and the untimed
    # first one between them: each message's latency was measured exactly once.
    assert len(doc["per_consumer"]) == len(doc["cpu_s_consumers"]) == 2
    assert doc["cpu_s_producer"] > 0
    assert all(c > 0 for c in doc["cpu_s_consumers"])
    assert all(n > 0 for n in doc["per_consumer"])
    assert sum(doc["per_consumer"]) == doc["latency_samples"] == 3001
    lat = [doc[f"latency_ms_{q}"] for q in ("p50", "p95", "p99", "p999", "max")]
    assert lat == sorted(lat)
    assert 0 < lat[0] < 10_000
    assert doc["settings"]["delivery"] == delivery
    # Paced at 3,000 msg/s, publishing takes about a second, not less.
    assert doc["publish_msg_per_s"] < 3000 * 1.1
    with Client(broker.addr) as client:
        assert sum(p.log_end_offset for p in client.describe_topic("e").partitions) == 3001
        # The members committed what they were handed when they closed.
        group = client.describe_group(doc["group"])
        assert sum(o.committed for o in group.offsets) == 3001


def test_e2e_text_and_bad_options(broker: Broker) -> None:
    result = broker.cli(
        "bench", "e2e", "--messages", "500", "--consumers", "1", "--partitions", "2"
    )
    assert result.exit_code == 0, result.stderr
    for label in ("delivered", "publish-to-delivery p50", "duplicates", "consumers=1"):
        assert label in result.stdout
    bad = broker.cli("bench", "e2e", "--delivery", "carrier-pigeon")
    assert bad.exit_code == 2
    assert "--delivery must be push or pull" in bad.stderr
    small = broker.cli("bench", "e2e", "--size", "4")
    assert small.exit_code == 2


def test_histogram_quantiles_are_within_one_percent() -> None:
    values = [1_000 * (i + 1) for i in range(10_000)]  # 1 µs .. 10 ms, in ns
    random.Random(7).shuffle(values)
    h = Histogram()
    for v in values[:5000]:
        h.add(v)
    other = Histogram()
    for v in values[5000:]:
        other.add(v)
    h.merge(Histogram.from_json(json.loads(json.dumps(other.to_json()))))
    assert h.total == 10_000
    for q in (0.5, 0.9, 0.99, 1.0):
        true_ms = sorted(values)[math.ceil(q * 10_000) - 1] / 1e6
        assert true_ms <= h.quantile_ms(q) <= true_ms * 1.0101 + 0.001
    assert Histogram().quantile_ms(0.99) == 0.0


def test_e2e_backlog_times_the_group_catching_up(broker: Broker) -> None:
    """With --backlog every message is stored before the group starts; the new group starts
    where the topic ended before, so earlier messages are not read."""
    broker.cli("bench", "produce", "--topic", "old", "--messages", "700", "--partitions", "3")
    args = ["--topic", "old", "--messages", "2000", "--size", "64", "--backlog", "--json"]
    result = broker.cli("bench", "e2e", *args)
    assert result.exit_code == 0, result.stderr
    doc = json.loads(result.stdout)
    assert doc["settings"]["backlog"] is True
    assert (doc["delivered"], doc["duplicates"]) == (2000, 0)
    assert sum(doc["per_consumer"]) == doc["latency_samples"] == 2001
    with Client(broker.addr) as client:
        # 701 stored before (bench produce's untimed first message too), then 2,001.
        assert sum(p.log_end_offset for p in client.describe_topic("old").partitions) == 2702
