"""``tidewire topic``: create, list, describe, alter, delete against a real broker, in text
and JSON; broker errors as one line on stderr."""

from __future__ import annotations

import json

import pytest

from tests.cli._support import Broker, closed_port, run_cli
from tidewire.client import Client, Message


def test_create_text_and_describe_json(broker: Broker) -> None:
    result = broker.cli("topic", "create", "orders", "--partitions", "2")
    assert result.exit_code == 0, result.stderr
    assert result.stdout == "created topic 'orders' with 2 partition(s)\n"
    doc = json.loads(broker.cli("topic", "describe", "orders", "--json").stdout)
    assert doc["name"] == "orders"
    assert [p["partition"] for p in doc["partitions"]] == [0, 1]
    assert doc["config"]["fsync"] == "interval"


def test_create_with_settings_json(broker: Broker) -> None:
    result = broker.cli(
        "topic",
        "create",
        "audit",
        "--retention-ms",
        "60000",
        "--retention-bytes",
        "1048576",
        "--segment-bytes",
        "65536",
        "--fsync",
        "always",
        "--max-message-bytes",
        "4096",
        "--json",
    )
    assert result.exit_code == 0, result.stderr
    doc = json.loads(result.stdout)
    assert len(doc["partitions"]) == 3  # the broker's default
    assert doc["config"] == {
        "retention_ms": 60000,
        "retention_bytes": 1048576,
        "segment_bytes": 65536,
        "segment_ms": 604800000,
        "fsync": "always",
        "flush_interval_ms": 50,
        "max_message_bytes": 4096,
    }


def test_list(broker: Broker) -> None:
    assert broker.cli("topic", "list").stdout == ""
    assert json.loads(broker.cli("topic", "list", "--json").stdout) == []
    for name in ("b", "a"):
        assert broker.cli("topic", "create", name).exit_code == 0
    assert broker.cli("topic", "list").stdout == "a\nb\n"
    assert json.loads(broker.cli("topic", "list", "--json").stdout) == ["a", "b"]


def test_describe_shows_offsets(broker: Broker) -> None:
    with Client(broker.addr) as client:
        client.create_topic("t", 2)
        client.produce("t", 1, [Message(b"x"), Message(b"y")])
    doc = json.loads(broker.cli("topic", "describe", "t", "--json").stdout)
    p0, p1 = doc["partitions"]
    assert (p0["log_start_offset"], p0["log_end_offset"]) == (0, 0)
    assert (p1["log_start_offset"], p1["log_end_offset"], p1["high_watermark"]) == (0, 2, 2)
    assert p1["size_bytes"] > 0
    text = broker.cli("topic", "describe", "t")
    assert text.exit_code == 0
    assert text.stdout.startswith("topic t: 2 partition(s)\n")
    rows = [line.split("│")[1:-1] for line in text.stdout.splitlines() if line.count("│") == 6]
    assert [cell.strip() for cell in rows[1][:4]] == ["1", "0", "2", "2"]
    assert "retention_ms" in text.stdout
    assert "604,800,000" in text.stdout


def test_alter(broker: Broker) -> None:
    assert broker.cli("topic", "create", "t", "--partitions", "1").exit_code == 0
    result = broker.cli("topic", "alter", "t", "--partitions", "4", "--retention-ms", "5000")
    assert result.exit_code == 0, result.stderr
    assert result.stdout == "altered topic 't': 4 partition(s)\n"
    doc = json.loads(broker.cli("topic", "alter", "t", "--fsync", "never", "--json").stdout)
    assert len(doc["partitions"]) == 4
    assert doc["config"]["retention_ms"] == 5000
    assert doc["config"]["fsync"] == "never"


def test_alter_errors(broker: Broker) -> None:
    assert broker.cli("topic", "create", "t", "--partitions", "2").exit_code == 0
    nothing = broker.cli("topic", "alter", "t")
    assert nothing.exit_code == 2
    assert nothing.stderr.startswith("error: nothing to change")
    fewer = broker.cli("topic", "alter", "t", "--partitions", "1")
    assert fewer.exit_code == 1
    assert fewer.stderr == (
        "error: partitions=1 must be within 2..100,000: a topic can gain partitions but not "
        "lose them\n"
    )


def test_delete(broker: Broker) -> None:
    assert broker.cli("topic", "create", "t").exit_code == 0
    result = broker.cli("topic", "delete", "t")
    assert result.exit_code == 0
    assert result.stdout == "deleted topic 't'\n"
    assert broker.cli("topic", "list").stdout == ""


@pytest.mark.parametrize(
    "args",
    [
        ("topic", "describe", "nope"),
        ("topic", "delete", "nope"),
        ("topic", "alter", "nope", "--partitions", "9"),
    ],
)
def test_unknown_topic_is_one_line(shared_broker: Broker, args: tuple[str, ...]) -> None:
    result = shared_broker.cli(*args)
    assert result.exit_code == 1
    assert result.stdout == ""
    assert result.stderr == "error: topic 'nope' does not exist\n"


def test_broker_refusals(broker: Broker) -> None:
    assert broker.cli("topic", "create", "t").exit_code == 0
    again = broker.cli("topic", "create", "t")
    assert (again.exit_code, again.stderr) == (1, "error: topic 't' exists already\n")
    bad = broker.cli("topic", "create", "u", "--segment-bytes", "10")
    assert bad.exit_code == 1
    assert bad.stderr == "error: segment_bytes=10 must be within 1,024..2,147,483,647\n"
    name = broker.cli("topic", "create", "no/slash")
    assert name.exit_code == 1
    assert name.stderr.startswith("error: ")
    assert "\n" not in name.stderr.rstrip("\n")


def test_bad_addr_and_unreachable_broker() -> None:
    bad = run_cli(["topic", "list", "--addr", "localhost"])
    assert bad.exit_code == 2
    assert bad.stderr == (
        "error: --addr: address 'localhost' must be HOST:PORT with a port in 1..65535\n"
    )
    port = closed_port()
    down = run_cli(["topic", "list", "--addr", f"127.0.0.1:{port}"])
    assert down.exit_code == 1
    assert down.stderr.startswith(f"error: cannot connect to 127.0.0.1:{port}: ")
    assert down.stderr.count("\n") == 1
    assert "Traceback" not in down.output


def test_addr_takes_a_bootstrap_list(broker: Broker) -> None:
    """Several nodes, comma-separated: a node that is down is skipped, a malformed one is a
    usage error naming it."""
    assert broker.cli("topic", "create", "t").exit_code == 0
    down = f"127.0.0.1:{closed_port()}"
    result = run_cli(["topic", "list", "--addr", f"{down},{broker.addr}"])
    assert (result.exit_code, result.stdout) == (0, "t\n")
    bad = run_cli(["topic", "list", "--addr", f"{broker.addr},localhost"])
    assert bad.exit_code == 2
    assert bad.stderr == (
        "error: --addr: address 'localhost' must be HOST:PORT with a port in 1..65535\n"
    )


def test_cluster_settings_are_refused_by_a_single_node(broker: Broker) -> None:
    for flag in (
        ("--replication-factor", "3"),
        ("--min-insync-replicas", "2"),
        ("--unclean-leader-election",),
    ):
        result = broker.cli("topic", "create", "t", *flag)
        assert result.exit_code == 1
        assert result.stderr.startswith(
            "error: a replication factor or min_insync_replicas above 1 and "
            "unclean_leader_election are settings of a cluster's topics"
        )
    ok = broker.cli("topic", "create", "t", "--min-insync-replicas", "1", "--json")
    assert ok.exit_code == 0, ok.output
    assert "replication_factor" not in ok.stdout  # a single node has no cluster settings


def test_addr_from_environment(broker: Broker) -> None:
    assert broker.cli("topic", "create", "t").exit_code == 0
    result = run_cli(["topic", "list"], env={"TIDEWIRE_ADDR": broker.addr})
    assert result.stdout == "t\n"


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (("topic", "create", "__consumer_offsets", "--fsync", "never"), "is internal"),
        (("topic", "create", "__mine"), "reserved for the broker's internal topics"),
        (("topic", "delete", "__consumer_offsets"), "is internal"),
        (("topic", "alter", "__consumer_offsets", "--fsync", "never"), "is internal"),
    ],
)
def test_internal_topics_are_refused(broker: Broker, args: tuple[str, ...], words: str) -> None:
    with Client(broker.addr) as client:  # the broker makes its offsets topic at a commit
        client.produce("t", 0, [Message(b"x")])
        client.commit_offsets("g", {("t", 0): 1})
    result = broker.cli(*args)
    assert result.exit_code == 1
    assert result.stdout == ""
    assert result.stderr.startswith("error: topic '__")
    assert words in result.stderr
    assert result.stderr.count("\n") == 1
    assert broker.cli("topic", "list").stdout == "t\n"
