"""``tidewire bench produce|consume`` against a real broker: the figures it reports agree with
what the broker stored, in text and in ``--json``; bad options and an unreachable broker are
refused with one line."""

from __future__ import annotations

import json

from tests.cli._support import Broker, closed_port, run_cli
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
