"""``tidewire consume --group`` and ``tidewire group list | describe | reset | delete``
against a real broker process, in text and JSON."""

from __future__ import annotations

import json

from tests.cli._support import Broker
from tidewire.client import Client, Message


def fill(broker: Broker) -> None:
    with Client(broker.addr) as c:
        for p in range(3):
            c.produce("t", p, [Message(f"{p}-{i}".encode()) for i in range(2)])


def test_consume_as_a_group_then_describe_reset_delete(broker: Broker) -> None:
    fill(broker)
    r = broker.cli("consume", "t", "--group", "g", "--from-beginning", "-n", "6", "-f", "json")
    assert r.exit_code == 0, r.stderr
    values = sorted(json.loads(line)["value"] for line in r.stdout.splitlines())
    assert values == sorted(f"{p}-{i}" for p in range(3) for i in range(2))
    # the group committed what was printed: a second run has nothing left
    r = broker.cli("consume", "t", "--group", "g", "--timeout", "0.5")
    assert r.exit_code == 0, r.stderr
    assert r.stdout == ""

    listed = json.loads(broker.cli("group", "list", "--json").stdout)
    assert listed == [{"group_id": "g", "state": "empty", "members": 0}]
    assert broker.cli("group", "list").stdout == "g\tempty\t0 member(s)\n"

    doc = json.loads(broker.cli("group", "describe", "g", "--json").stdout)
    assert doc["members"] == []
    assert [
        (o["partition"], o["committed"], o["end_offset"], o["lag"]) for o in doc["offsets"]
    ] == [
        (0, 2, 2, 0),
        (1, 2, 2, 0),
        (2, 2, 2, 0),
    ]
    text = broker.cli("group", "describe", "g").stdout
    assert "group g: empty, generation 0, 0 member(s)" in text

    dry = broker.cli("group", "reset", "g", "--topic", "t", "--to-earliest", "--dry-run")
    assert dry.exit_code == 0, dry.stderr
    assert dry.stdout.splitlines() == [f"t/{p}: would move 2 -> 0" for p in range(3)]
    doc = json.loads(
        broker.cli(
            "group", "reset", "g", "--topic", "t", "--to-offset", "1", "-p", "1", "--json"
        ).stdout
    )
    assert doc["partitions"] == [{"topic": "t", "partition": 1, "previous": 2, "offset": 1}]
    r = broker.cli("consume", "t", "--group", "g", "-n", "1")
    assert r.stdout == "1-1\n"

    assert broker.cli("group", "delete", "g").stdout == "deleted group 'g'\n"
    gone = broker.cli("group", "describe", "g")
    assert gone.exit_code == 1
    assert gone.stderr == "error: group 'g' does not exist\n"


def test_reset_needs_exactly_one_target(broker: Broker) -> None:
    r = broker.cli("group", "reset", "g", "--topic", "t")
    assert r.exit_code == 2
    assert "exactly one of" in r.stderr
    r = broker.cli("group", "reset", "g", "--topic", "t", "--to-time", "yesterday")
    assert r.exit_code == 2
    assert "--to-time" in r.stderr
    r = broker.cli("consume", "t", "--group", "g", "--offset", "3")
    assert r.exit_code == 2


def test_reset_to_time(broker: Broker) -> None:
    with Client(broker.addr) as c:
        c.produce(
            "t", 0, [Message(b"old", timestamp_ms=1_000), Message(b"new", timestamp_ms=10**13)]
        )
    r = broker.cli(
        "group", "reset", "g", "--topic", "t", "-p", "0", "--to-time", "2020-01-01", "--json"
    )
    assert r.exit_code == 0, r.stderr
    assert json.loads(r.stdout)["partitions"][0]["offset"] == 1
