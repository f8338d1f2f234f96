"""``tidewire stream send | receive | read | list | describe`` against a real broker: text and
JSON output, stdin as one message per line, tokens, --follow, and errors (one line on
stderr; exit 1 from the broker, 2 for usage)."""

from __future__ import annotations

import json
import re

from tests.cli._support import Broker, failure


def ok(broker: Broker, *args: str, input: str | None = None) -> str:
    result = broker.cli(*args, input=input)
    assert result.exit_code == 0, (args, result.stdout, result.stderr)
    return result.stdout


def doc(broker: Broker, *args: str, input: str | None = None) -> dict[str, object]:
    d = json.loads(ok(broker, *args, "--json", input=input))
    assert isinstance(d, dict)
    return d


def test_send_and_receive(broker: Broker) -> None:
    assert ok(broker, "stream", "send", "user/42", "hello") == "sent 1 message to 'user/42'\n"
    assert ok(broker, "stream", "send", "user/42", "again", "--uuid", "u1") == (
        "sent 1 message to 'user/42'\n"
    )
    d = doc(broker, "stream", "send", "user/42", "again", "--uuid", "u1")
    assert (d["stream"], d["outcome"], d["code"]) == ("user/42", "duplicate", -1)
    assert ok(broker, "stream", "receive", "user/42") == "hello\n"
    d = doc(broker, "stream", "receive", "user/42", "other", "--max", "5", "--wait-ms", "10")
    msgs = d["messages"]
    assert isinstance(msgs, list)
    assert [(m["stream"], m["value"], m["uuid"]) for m in msgs] == [("user/42", "again", "u1")]
    # nothing waiting: no output, exit 0
    assert ok(broker, "stream", "receive", "user/42", "--wait", "10") == ""


def test_stdin_lines_are_messages_and_read_by_token(broker: Broker) -> None:
    out = ok(broker, "stream", "send", "audit", "--persistent", input="a\nb\nc\n")
    assert out == "sent 3 messages to 'audit'\n"
    result = broker.cli("stream", "read", "audit", "--max", "2")
    assert result.exit_code == 0, result.stderr
    assert result.stdout == "a\nb\n"
    token = result.stderr.strip().removeprefix("token: ")
    d = doc(broker, "stream", "read", "audit", "--from", token)
    msgs = d["messages"]
    assert isinstance(msgs, list)
    assert [m["value"] for m in msgs] == ["c"]
    assert d["token"] == msgs[-1]["token"]
    # --follow from that token: the one after, then stop at --count
    ok(broker, "stream", "send", "audit", "d", "--persistent")
    out = ok(broker, "stream", "read", "audit", "--from", str(d["token"]), "-f", "--count", "1")
    assert out == "d\n"
    lines = ok(broker, "stream", "read", "audit", "-f", "--count", "2", "--json").splitlines()
    assert [json.loads(x)["value"] for x in lines] == ["a", "b"]


def test_binary_values_in_json(broker: Broker) -> None:
    ok(broker, "stream", "send", "bin", "\udcff")  # the byte 0xff in argv, surrogate-escaped
    d = doc(broker, "stream", "receive", "bin")
    msgs = d["messages"]
    assert isinstance(msgs, list)
    assert [(m.get("value"), m["value_base64"]) for m in msgs] == [(None, "/w==")]


def test_list_and_describe(broker: Broker) -> None:
    ok(broker, "stream", "send", "p/one", "x", "--persistent")
    ok(broker, "stream", "send", "p/two", "y")
    ok(broker, "stream", "send", "q", "z")
    out = ok(broker, "stream", "list", "--prefix", "p/")
    assert "p/one" in out
    assert "p/two" in out
    assert "q" not in out.split("streams")[0].replace("p/", "")
    assert out.rstrip().endswith("2 streams")
    d = doc(broker, "stream", "list")
    streams = d["streams"]
    assert isinstance(streams, list)
    assert [s["stream"] for s in streams] == ["p/one", "p/two", "q"]
    d = doc(broker, "stream", "describe", "p/one")
    assert (d["stream"], d["waiting"], d["persistent"], d["in_memory"]) == ("p/one", 1, 1, 0)
    out = ok(broker, "stream", "describe", "p/two")
    assert re.search(r"^in memory +1$", out, re.M), out
    assert re.search(r"^oldest ms +\d{13}$", out, re.M), out
    stats = doc(broker, "stream", "describe")
    assert stats["streams"] == 3
    assert "does not exist" in failure(broker, "stream", "describe", "nope")


def test_errors(broker: Broker) -> None:
    assert "at most 1,024" in failure(broker, "stream", "send", "x" * 1025, "v")
    assert "--max" in failure(broker, "stream", "receive", "a", "--max", "0", code=2)
    assert "--count goes with --follow" in failure(
        broker, "stream", "read", "a", "--count", "1", code=2
    )
    assert "not a resume token" in failure(broker, "stream", "read", "a", "--from", "!!")
