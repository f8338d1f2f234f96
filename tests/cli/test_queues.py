"""``tidewire exchange | queue | bind | unbind``, ``publish --exchange`` and ``consume
--queue`` against a real broker: text and JSON output, routing, settling, and errors (one
line on stderr, exit code 1 from the broker, 2 for usage)."""

from __future__ import annotations

import json

import pytest

from tests.cli._support import Broker, failure


def ok(broker: Broker, *args: str, input: str | None = None) -> str:
    result = broker.cli(*args, input=input)
    assert result.exit_code == 0, (args, result.stdout, result.stderr)
    return result.stdout


def doc(broker: Broker, *args: str) -> object:
    return json.loads(ok(broker, *args, "--json"))


def describe(broker: Broker, queue: str) -> dict[str, object]:
    d = doc(broker, "queue", "describe", queue)
    assert isinstance(d, dict)
    return d


def test_queue_declare_every_setting_json(broker: Broker) -> None:
    ok(broker, "exchange", "declare", "dead", "--type", "fanout")
    d = doc(
        broker,
        "queue",
        "declare",
        "work",
        "--max-deliveries",
        "3",
        "--message-ttl-ms",
        "60000",
        "--max-length",
        "100",
        "--max-length-bytes",
        "1048576",
        "--overflow",
        "drop-head",
        "--dead-letter-exchange",
        "dead",
        "--dead-letter-routing-key",
        "failed",
        "--visibility-timeout-ms",
        "30000",
    )
    assert isinstance(d, dict)
    expected = {
        "name": "work",
        "durable": True,
        "exclusive": False,
        "auto_delete": False,
        "max_deliveries": 3,
        "message_ttl_ms": 60000,
        "max_length": 100,
        "max_length_bytes": 1048576,
        "overflow": "drop-head",
        "dead_letter_exchange": "dead",
        "dead_letter_routing_key": "failed",
        "visibility_timeout_ms": 30000,
        "ready": 0,
        "unacked": 0,
        "delayed": 0,
        "consumers": 0,
    }
    assert {k: d[k] for k in expected} == expected
    assert describe(broker, "work") | {"bytes": 0} == d | {"bytes": 0}
    # The same settings again: no error, the same queue.
    assert (
        ok(
            broker,
            "queue",
            "declare",
            "work",
            "--max-deliveries",
            "3",
            "--message-ttl-ms",
            "60000",
            "--max-length",
            "100",
            "--max-length-bytes",
            "1048576",
            "--overflow",
            "drop-head",
            "--dead-letter-exchange",
            "dead",
            "--dead-letter-routing-key",
            "failed",
            "--visibility-timeout-ms",
            "30000",
        )
        == "declared durable queue 'work'\n"
    )
    # Other settings: refused, nothing changed.
    failure(broker, "queue", "declare", "work", "--max-deliveries", "4")
    assert describe(broker, "work")["max_deliveries"] == 3
    # The default exchange as the dead-letter exchange is spelled amq.default.
    d2 = doc(
        broker, "queue", "declare", "retry", "--transient", "--dead-letter-exchange", "amq.default"
    )
    assert isinstance(d2, dict)
    assert (d2["durable"], d2["dead_letter_exchange"]) == (False, "amq.default")


def test_queue_list_text_and_json(broker: Broker) -> None:
    assert doc(broker, "queue", "list") == []
    ok(broker, "queue", "declare", "b")
    ok(broker, "queue", "declare", "a", "--transient")
    ok(broker, "publish", "--exchange", "amq.default", "--routing-key", "b", "x")
    queues = doc(broker, "queue", "list")
    assert isinstance(queues, list)
    assert [(q["name"], q["durable"], q["ready"]) for q in queues] == [
        ("a", False, 0),
        ("b", True, 1),
    ]
    text = ok(broker, "queue", "list")
    rows = [[c.strip() for c in line.split("│")[1:-1]] for line in text.splitlines()]
    rows = [r for r in rows if r and r[0] in ("a", "b")]
    assert rows == [
        ["a", "no", "0", "0", "0", "0", "0"],
        ["b", "yes", "1", "0", "0", "0", rows[1][6]],
    ]
    describe_text = ok(broker, "queue", "describe", "b")
    assert describe_text.startswith("queue b: 1 ready, 0 unacked, 0 delayed, ")
    assert "max_deliveries" in describe_text
    assert "published" in describe_text


def test_exchange_declare_list_bind_unbind_delete(broker: Broker) -> None:
    assert ok(broker, "exchange", "declare", "orders-x", "--type", "topic") == (
        "declared topic exchange 'orders-x'\n"
    )
    ok(broker, "queue", "declare", "billing")
    out = ok(broker, "bind", "--exchange", "orders-x", "--queue", "billing", "--key", "order.*")
    assert out == "bound exchange 'orders-x' to queue 'billing' with key 'order.*'\n"
    ok(broker, "bind", "--exchange", "orders-x", "--queue", "billing", "--key", "order.*")  # again
    listing = doc(broker, "exchange", "list")
    assert isinstance(listing, dict)
    names = {x["name"]: x for x in listing["exchanges"]}
    assert names["amq.default"]["type"] == "direct"
    assert (names["orders-x"]["type"], names["orders-x"]["durable"]) == ("topic", True)
    assert [
        (b["exchange"], b["destination"], b["destination_kind"], b["key"])
        for b in listing["bindings"]
    ] == [("orders-x", "billing", "queue", "order.*")]
    text = ok(broker, "exchange", "list")
    assert "orders-x" in text
    assert "queue billing" in text
    assert "amq.default" in text
    # Unbind: the binding goes; a second unbind is no error.
    ok(broker, "unbind", "--exchange", "orders-x", "--queue", "billing", "--key", "order.*")
    ok(broker, "unbind", "--exchange", "orders-x", "--queue", "billing", "--key", "order.*")
    listing = doc(broker, "exchange", "list")
    assert isinstance(listing, dict)
    assert listing["bindings"] == []
    assert ok(broker, "exchange", "delete", "orders-x") == "deleted exchange 'orders-x'\n"
    listing = doc(broker, "exchange", "list")
    assert isinstance(listing, dict)
    assert "orders-x" not in [x["name"] for x in listing["exchanges"]]
    assert "amq.default" in [x["name"] for x in listing["exchanges"]]


def test_exchange_delete_if_unused(broker: Broker) -> None:
    ok(broker, "exchange", "declare", "fan", "--type", "fanout")
    ok(broker, "queue", "declare", "q")
    ok(broker, "bind", "--exchange", "fan", "--queue", "q")
    failure(broker, "exchange", "delete", "fan", "--if-unused")
    ok(broker, "exchange", "delete", "fan")


def test_publish_through_topic_exchange_and_consume(broker: Broker) -> None:
    ok(broker, "exchange", "declare", "events", "--type", "topic")
    for queue, key in (("eu", "order.eu.*"), ("all", "order.#")):
        ok(broker, "queue", "declare", queue)
        ok(broker, "bind", "--exchange", "events", "--queue", queue, "--key", key)
    out = doc(
        broker,
        "publish",
        "--exchange",
        "events",
        "--routing-key",
        "order.eu.created",
        '{"id": 1}',
        "--header",
        "source=web",
    )
    assert out == {
        "exchange": "events",
        "routing_key": "order.eu.created",
        "queues": ["all", "eu"],
        "topics": [],
        "unroutable": False,
    }
    text = ok(broker, "publish", "-e", "events", "-r", "order.us.created", "second")
    assert text == ("published to exchange events with routing key 'order.us.created': queue all\n")
    assert describe(broker, "eu")["ready"] == 1
    assert describe(broker, "all")["ready"] == 2
    lines = ok(broker, "consume", "--queue", "all", "--count", "2", "--json").splitlines()
    msgs = [json.loads(line) for line in lines]
    assert [(m["routing_key"], m["value"]) for m in msgs] == [
        ("order.eu.created", '{"id": 1}'),
        ("order.us.created", "second"),
    ]
    assert msgs[0]["headers"] == [{"key": "source", "value": "web"}]
    assert [(m["queue"], m["delivery_count"], m["redelivered"]) for m in msgs] == [
        ("all", 1, False),
        ("all", 1, False),
    ]
    assert msgs[0]["offset"] < msgs[1]["offset"]
    # Acked once printed: nothing left, and the counters say so.
    after = describe(broker, "all")
    assert (after["ready"], after["unacked"]) == (0, 0)
    counters = after["counters"]
    assert isinstance(counters, dict)
    assert (counters["published"], counters["delivered"], counters["acked"]) == (2, 2, 2)
    # Text: the values, one a line; --print-key puts the routing key first.
    assert ok(broker, "consume", "--queue", "eu", "-n", "1", "--print-key") == (
        'order.eu.created\t{"id": 1}\n'
    )


def test_publish_unroutable_and_mandatory(broker: Broker) -> None:
    ok(broker, "exchange", "declare", "direct-x")
    out = doc(broker, "publish", "-e", "direct-x", "-r", "nobody", "lost")
    assert isinstance(out, dict)
    assert (out["queues"], out["unroutable"]) == ([], True)
    text = ok(broker, "publish", "-e", "direct-x", "-r", "nobody", "lost")
    assert "dropped" in text
    assert "--mandatory" in text
    failure(broker, "publish", "-e", "direct-x", "-r", "nobody", "lost", "--mandatory")
    err = failure(broker, "publish", "-e", "no-such-exchange", "-r", "k", "x")
    assert "no-such-exchange" in err


def test_publish_stdin_through_exchange_keeps_order(broker: Broker) -> None:
    ok(broker, "queue", "declare", "lines")
    n = 2500  # more than one request's worth (1,000)
    body = "".join(f"line {i}\n" for i in range(n))
    out = json.loads(
        ok(broker, "publish", "-e", "amq.default", "-r", "lines", "-", "--json", input=body)
    )
    assert out == {
        "exchange": "amq.default",
        "routing_key": "lines",
        "messages": n,
        "queues": ["lines"],
        "topics": [],
        "unroutable": 0,
    }
    printed = ok(broker, "consume", "--queue", "lines", "--count", str(n), "--prefetch", "500")
    assert printed.splitlines() == [f"line {i}" for i in range(n)]  # FIFO
    assert describe(broker, "lines")["ready"] == 0


def test_nack_redelivers_first_with_its_count(broker: Broker) -> None:
    ok(broker, "queue", "declare", "q")
    for value in ("first", "second"):
        ok(broker, "publish", "-e", "amq.default", "-r", "q", value)
    # Prefetch 1: "second" is never delivered to it; "first", requeued, comes back first
    # (and may be delivered to it once more before it closes, which counts as a delivery).
    nacked = ok(broker, "consume", "--queue", "q", "-n", "1", "--nack", "--prefetch", "1")
    assert nacked == "first\n"
    assert describe(broker, "q")["ready"] == 2
    msgs = [
        json.loads(line)
        for line in ok(broker, "consume", "--queue", "q", "-n", "2", "--json").splitlines()
    ]
    assert [(m["value"], m["redelivered"]) for m in msgs] == [("first", True), ("second", False)]
    assert msgs[0]["delivery_count"] in (2, 3)
    assert msgs[1]["delivery_count"] == 1
    counters = describe(broker, "q")["counters"]
    assert isinstance(counters, dict)
    assert counters["redelivered"] >= 1


def test_count_leaves_the_rest_in_the_queue(broker: Broker) -> None:
    ok(broker, "queue", "declare", "q")
    ok(broker, "publish", "-e", "amq.default", "-r", "q", "-", input="a\nb\nc\n")
    assert ok(broker, "consume", "--queue", "q", "-n", "1", "--prefetch", "3") == "a\n"
    # The two prefetched but not printed went back, not acked.
    d = describe(broker, "q")
    assert (d["ready"], d["unacked"]) == (2, 0)
    assert ok(broker, "consume", "--queue", "q", "--timeout", "1") == "b\nc\n"


def test_headers_exchange_with_args(broker: Broker) -> None:
    ok(broker, "exchange", "declare", "hx", "--type", "headers")
    ok(broker, "queue", "declare", "red")
    out = doc(
        broker,
        "bind",
        "-e",
        "hx",
        "-q",
        "red",
        "--arg",
        "x-match=any",
        "--arg",
        "color=red",
        "--arg",
        "shade=crimson",
    )
    assert out == {
        "exchange": "hx",
        "destination": "red",
        "destination_kind": "queue",
        "key": "",
        "arguments": {"x-match": "any", "color": "red", "shade": "crimson"},
    }
    routed = doc(broker, "publish", "-e", "hx", "x", "--header", "color=red")
    assert isinstance(routed, dict)
    assert routed["queues"] == ["red"]
    missed = doc(broker, "publish", "-e", "hx", "y", "--header", "color=blue")
    assert isinstance(missed, dict)
    assert missed["unroutable"] is True
    ok(
        broker,
        "unbind",
        "-e",
        "hx",
        "-q",
        "red",
        "--arg",
        "x-match=any",
        "--arg",
        "color=red",
        "--arg",
        "shade=crimson",
    )
    listing = doc(broker, "exchange", "list")
    assert isinstance(listing, dict)
    assert listing["bindings"] == []


def test_bind_exchange_to_topic(broker: Broker) -> None:
    ok(broker, "topic", "create", "history", "--partitions", "1")
    ok(broker, "exchange", "declare", "fan", "--type", "fanout")
    out = ok(broker, "bind", "--exchange", "fan", "--topic", "history")
    assert out == "bound exchange 'fan' to topic 'history' with key ''\n"
    published = doc(broker, "publish", "-e", "fan", "-r", "k1", "kept")
    assert published == {
        "exchange": "fan",
        "routing_key": "k1",
        "queues": [],
        "topics": [{"topic": "history", "partition": 0, "offset": 0}],
        "unroutable": False,
    }
    text = ok(broker, "consume", "history", "--from-beginning", "-n", "1", "--print-key")
    assert text == "k1\tkept\n"


def test_delayed_message(broker: Broker) -> None:
    ok(broker, "queue", "declare", "later")
    ok(broker, "publish", "-e", "amq.default", "-r", "later", "soon", "--delay-ms", "1500")
    d = describe(broker, "later")
    assert (d["ready"], d["delayed"]) == (0, 1)
    # Delivered once due (a generous bound for a loaded machine).
    assert ok(broker, "consume", "--queue", "later", "-n", "1", "--timeout", "60") == "soon\n"


def test_purge_and_delete(broker: Broker) -> None:
    ok(broker, "queue", "declare", "q")
    ok(broker, "publish", "-e", "amq.default", "-r", "q", "-", input="1\n2\n3\n")
    assert doc(broker, "queue", "purge", "q") == {"queue": "q", "messages": 3}
    assert describe(broker, "q")["ready"] == 0
    ok(broker, "publish", "-e", "amq.default", "-r", "q", "4")
    failure(broker, "queue", "delete", "q", "--if-empty")
    assert ok(broker, "queue", "delete", "q") == "deleted queue 'q' (1 message(s) dropped)\n"
    assert doc(broker, "queue", "list") == []


@pytest.mark.parametrize(
    "argv",
    [
        ["queue", "describe", "nope"],
        ["queue", "purge", "nope"],
        ["queue", "delete", "nope"],
        ["queue", "declare", "nope", "--passive"],
        ["consume", "--queue", "nope", "-n", "1"],
        ["dlq", "list", "nope"],
        ["dlq", "replay", "nope", "--all"],
        ["bind", "--exchange", "nope-x", "--queue", "nope"],
        ["publish", "--exchange", "amq.default", "--routing-key", "nope", "x", "--mandatory"],
    ],
    ids=lambda a: " ".join(a[:2]),
)
def test_unknown_names_are_clear_errors(shared_broker: Broker, argv: list[str]) -> None:
    err = failure(shared_broker, *argv)
    assert "nope" in err


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["bind", "--exchange", "x"], "--queue Q or --topic T"),
        (["bind", "--exchange", "x", "--queue", "q", "--topic", "t"], "--queue Q or --topic T"),
        (["bind", "--exchange", "amq.default", "--queue", "q"], "nothing can be bound"),
        (["bind", "--exchange", "x", "--queue", "q", "--arg", "color"], "--arg 'color'"),
        (["exchange", "delete", "amq.default"], "built in"),
        (["queue", "declare", "q", "--exclusive"], "--transient"),
        (["publish", "t", "m", "--routing-key", "k"], "need --exchange"),
        (["publish", "--exchange", "x", "m", "--key", "k"], "--routing-key"),
        (["publish", "--exchange", "x", "m", "--partition", "0"], "for topics"),
        (["consume", "--queue", "q", "--nack", "--reject"], "one of --nack, --reject"),
        (["consume", "t", "--queue", "q"], "not both"),
        (["consume", "--queue", "q", "--group", "g"], "no --group"),
        (["consume", "t", "--nack"], "need --queue"),
        (["consume", "t", "--prefetch", "5"], "need --queue"),
        (["dlq", "replay", "q"], "--offset N"),
        (["dlq", "replay", "q", "--all", "--offset", "3"], "--offset N"),
        (["dlq", "replay", "q", "--from", "5", "--to", "5"], "--to 5 must be above --from 5"),
    ],
)
def test_usage_errors(shared_broker: Broker, argv: list[str], message: str) -> None:
    err = failure(shared_broker, *argv, code=2)
    assert message in err


def test_passive_declares_only_check(broker: Broker) -> None:
    ok(broker, "exchange", "declare", "x", "--type", "fanout")
    assert ok(broker, "exchange", "declare", "x", "--passive") == "exchange 'x' exists\n"
    assert "nope-x" in failure(broker, "exchange", "declare", "nope-x", "--passive")
    ok(broker, "queue", "declare", "q", "--max-length", "10")
    ok(broker, "publish", "-e", "amq.default", "-r", "q", "m")
    # No settings compared: a passive declare of q with defaults is fine.
    assert (
        ok(broker, "queue", "declare", "q", "--passive") == "queue 'q' exists: 1 message(s) ready\n"
    )
    failure(broker, "queue", "declare", "nope", "--passive")
    assert doc(broker, "queue", "list")[0]["max_length"] == 10  # type: ignore[index]
