"""``tidewire dlq``: a message rejected from a queue with a dead-letter exchange lands in the
dead-letter queue with its ``x-death`` entry; ``dlq list`` shows it without taking it,
``dlq replay`` puts it back where it came from, ``dlq purge`` removes dead letters."""

from __future__ import annotations

import json

from tests.cli._support import Broker
from tests.cli.test_queues import describe, doc, ok


def setup_dlq(broker: Broker) -> None:
    """``work`` (max_deliveries=1) dead-letters into exchange ``dead`` -> ``dead-letters``."""
    ok(broker, "exchange", "declare", "dead", "--type", "fanout")
    ok(broker, "queue", "declare", "dead-letters")
    ok(broker, "bind", "--exchange", "dead", "--queue", "dead-letters")
    ok(
        broker,
        "queue",
        "declare",
        "work",
        "--max-deliveries",
        "1",
        "--dead-letter-exchange",
        "dead",
    )


def dead_letters(broker: Broker) -> list[dict[str, object]]:
    listed = doc(broker, "dlq", "list", "dead-letters")
    assert isinstance(listed, list)
    return listed


def test_reject_list_replay_purge(broker: Broker) -> None:
    setup_dlq(broker)
    ok(broker, "publish", "-e", "amq.default", "-r", "work", "bad input", "-H", "trace=t1")
    assert ok(broker, "consume", "--queue", "work", "-n", "1", "--reject") == "bad input\n"
    assert describe(broker, "work")["ready"] == 0

    # Listed with why it died, and listing takes nothing.
    for _ in range(2):
        (letter,) = dead_letters(broker)
        assert (letter["queue"], letter["value"], letter["routing_key"]) == (
            "dead-letters",
            "bad input",
            "work",
        )
        death = letter["x_death"]
        assert isinstance(death, list)
        newest = death[0]
        assert (newest["queue"], newest["reason"], newest["count"]) == ("work", "rejected", 1)
        assert (newest["routing_key"], newest["delivery_count"]) == ("work", 1)
        assert newest["time_ms"] > 0
        headers = letter["headers"]
        assert isinstance(headers, list)
        assert {"key": "trace", "value": "t1"} in headers  # its own headers kept
    assert describe(broker, "dead-letters")["ready"] == 1
    text = ok(broker, "dlq", "list", "dead-letters")
    row = next(line for line in text.splitlines() if "bad input" in line)
    cells = [c.strip() for c in row.split("│")[1:-1]]
    assert cells[1:6] == ["work", "rejected", "1", "work", "bad input"]

    # Replay: back in work, gone from the dead letters.
    offset = letter["offset"]
    assert doc(broker, "dlq", "replay", "dead-letters", "--offset", str(offset)) == {
        "queue": "dead-letters",
        "replayed": 1,
    }
    assert dead_letters(broker) == []
    assert describe(broker, "work")["ready"] == 1
    (again,) = [
        json.loads(line)
        for line in ok(
            broker, "consume", "--queue", "work", "-n", "1", "--json", "--reject"
        ).splitlines()
    ]
    assert again["value"] == "bad input"
    assert "x-death" in [h["key"] for h in again["headers"]]

    # Rejected again: dead-lettered again, counted on; then purged.
    (letter,) = dead_letters(broker)
    death = letter["x_death"]
    assert isinstance(death, list)
    assert (death[0]["reason"], death[0]["count"]) == ("rejected", 2)
    assert ok(broker, "dlq", "purge", "dead-letters") == (
        "purged 1 dead letter(s) from 'dead-letters'\n"
    )
    assert dead_letters(broker) == []
    assert ok(broker, "dlq", "list", "dead-letters") == (
        "queue 'dead-letters': no ready messages from offset 0\n"
    )


def test_delivery_limit_and_replay_ranges(broker: Broker) -> None:
    setup_dlq(broker)
    ok(broker, "publish", "-e", "amq.default", "-r", "work", "-", input="m0\nm1\nm2\n")
    # Requeued after its one allowed delivery: dead-lettered for its delivery limit.
    assert ok(broker, "consume", "--queue", "work", "-n", "3", "--nack", "--prefetch", "1") == (
        "m0\nm1\nm2\n"
    )
    letters = dead_letters(broker)
    assert [x["value"] for x in letters] == ["m0", "m1", "m2"]
    reasons = []
    for x in letters:
        death = x["x_death"]
        assert isinstance(death, list)
        reasons.append(death[0]["reason"])
    assert reasons == ["delivery_limit"] * 3
    offsets = [x["offset"] for x in letters]
    assert isinstance(offsets[0], int)
    assert isinstance(offsets[2], int)
    # --from/--to: [from, to) only.
    replayed = doc(
        broker, "dlq", "replay", "dead-letters", "--from", str(offsets[0]), "--to", str(offsets[2])
    )
    assert replayed == {"queue": "dead-letters", "replayed": 2}
    assert [x["value"] for x in dead_letters(broker)] == ["m2"]
    assert describe(broker, "work")["ready"] == 2
    assert ok(broker, "dlq", "replay", "dead-letters", "--all") == (
        "replayed 1 message(s) from 'dead-letters'\n"
    )
    assert ok(broker, "consume", "--queue", "work", "-n", "3") == "m0\nm1\nm2\n"
    assert doc(broker, "dlq", "purge", "dead-letters") == {"queue": "dead-letters", "purged": 0}


def test_list_from_and_max(broker: Broker) -> None:
    setup_dlq(broker)
    ok(broker, "publish", "-e", "amq.default", "-r", "work", "-", input="a\nb\nc\n")
    ok(broker, "consume", "--queue", "work", "-n", "3", "--reject")
    letters = dead_letters(broker)
    assert [x["value"] for x in letters] == ["a", "b", "c"]
    second = letters[1]["offset"]
    listed = doc(broker, "dlq", "list", "dead-letters", "--from", str(second), "--max", "1")
    assert isinstance(listed, list)
    assert [x["value"] for x in listed] == ["b"]
