"""Server-Sent Events against a real gateway with httpx streaming: events and their resume
tokens, a connection dropped mid-stream and resumed with ``Last-Event-ID`` losing and
repeating nothing (with messages published while it was away), keepalives while idle, and
the errors of bad requests."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.http_stream._support import PROMPT_S, create, gateway, produce
from tidewire.embedded import EmbeddedBroker

SSE = {"Accept": "text/event-stream"}


def events(
    response: httpx.Response, want: int, *, stop_after_bytes: int | None = None
) -> tuple[list[dict[str, Any]], list[str]]:
    """Complete events (``id``/``event``/``data`` fields) and comments read from an SSE
    response, until ``want`` message events or (``stop_after_bytes``) the bytes read pass
    that: an event cut off by the end is not counted, as a browser would not dispatch it."""
    out: list[dict[str, Any]] = []
    comments: list[str] = []
    buf = b""
    seen = 0
    for chunk in response.iter_raw():
        buf += chunk
        seen += len(chunk)
        *complete, buf = buf.split(b"\n\n")
        for block in complete:
            fields: dict[str, Any] = {}
            for line in block.decode().split("\n"):
                if line.startswith(":"):
                    comments.append(line[1:].strip())
                    continue
                name, _, value = line.partition(": ")
                fields[name] = value
            if fields.get("event") in ("message", "error"):
                out.append(fields)
        if len(out) >= want or (stop_after_bytes is not None and seen >= stop_after_bytes):
            break
    return out, comments


def stream(client: httpx.Client, eb: EmbeddedBroker, topic: str, **kw: Any) -> Any:
    return client.stream("GET", f"{eb.http_url}/v1/topics/{topic}/stream", timeout=PROMPT_S, **kw)


def test_events_carry_messages_and_resume_tokens(tmp_path: Path) -> None:
    with gateway(tmp_path) as eb, httpx.Client() as client:
        create(eb, "s", partitions=2)
        produce(eb, "s", [b"a", b"b"], partition=0)
        produce(eb, "s", [b"c"], partition=1)
        with stream(client, eb, "s", headers=SSE, params={"from": "earliest"}) as r:
            assert r.status_code == 200
            assert r.headers["content-type"].startswith("text/event-stream")
            got, _ = events(r, 3)
        msgs = [json.loads(e["data"]) for e in got]
        assert sorted((m["partition"], m["value"]) for m in msgs) == [
            (0, "a"),
            (0, "b"),
            (1, "c"),
        ]
        assert len({e["id"] for e in got}) == 3
        # The last id resumes after everything: only a new message follows.
        produce(eb, "s", [b"d"], partition=1)
        headers = {**SSE, "Last-Event-ID": got[-1]["id"]}
        with stream(client, eb, "s", headers=headers) as r:
            (after,) = events(r, 1)[0]
        assert json.loads(after["data"])["value"] == "d"


def test_resume_after_a_dropped_connection_loses_and_repeats_nothing(tmp_path: Path) -> None:
    with gateway(tmp_path) as eb, httpx.Client() as client:
        create(eb, "r", partitions=3)
        total = 0
        for p in range(3):
            produce(eb, "r", [b"%d-%d" % (p, i) for i in range(400)], partition=p)
            total += 400
        received: list[dict[str, Any]] = []
        last_id = ""
        params = {"from": "earliest"}
        drops = 0
        while len(received) < total + 30:
            headers = {**SSE, "Last-Event-ID": last_id} if last_id else SSE
            with stream(client, eb, "r", headers=headers, params=params) as r:
                assert r.status_code == 200
                # Drop the connection after ~20 KB: mid-event, mid-chunk.
                got, _ = events(r, total + 30, stop_after_bytes=20_000 + 997 * drops)
            drops += 1
            assert drops < 200, "no progress"
            for e in got:
                received.append(json.loads(e["data"]))
                last_id = e["id"]
            if drops == 2:  # published while the client is away
                produce(eb, "r", [b"late-%d" % i for i in range(30)], partition=1)
        assert drops >= 3
    keys = [(m["partition"], m["offset"]) for m in received]
    assert len(keys) == len(set(keys)), "a message was repeated"
    expected = {(p, i) for p in range(3) for i in range(400)} | {(1, 400 + i) for i in range(30)}
    assert set(keys) == expected, "a message was lost"
    for p in range(3):
        offsets = [o for q, o in keys if q == p]
        assert offsets == sorted(offsets), f"partition {p} out of order"


def test_idle_stream_sends_keepalives(tmp_path: Path) -> None:
    with gateway(tmp_path) as eb, httpx.Client() as client:
        create(eb, "idle")
        with stream(client, eb, "idle", headers=SSE, params={"heartbeat_ms": "50"}) as r:
            comments: list[str] = []
            for chunk in r.iter_raw():
                comments += [c for c in chunk.decode().split("\n") if c == ": keepalive"]
                if len(comments) >= 2:
                    break
        assert len(comments) >= 2


def error_of(r: httpx.Response) -> dict[str, Any]:
    body = r.json()
    assert set(body["error"]) == {"code", "name", "message"}
    return body["error"]  # type: ignore[no-any-return]


@pytest.mark.parametrize(
    ("topic", "headers", "params", "status", "words"),
    [
        ("e", {}, {}, 406, "Accept: text/event-stream"),
        ("missing", SSE, {}, 404, "does not exist"),
        ("e", SSE, {"from": "soon"}, 400, "from='soon'"),
        ("e", SSE, {"partitions": "4"}, 404, "not 4"),
        ("e", SSE, {"partitions": "x"}, 400, "not a partition number"),
        ("e", SSE, {"encoding": "rot13"}, 400, "encoding='rot13'"),
        ("e", SSE, {"heartbeat_ms": "1"}, 400, "heartbeat_ms='1'"),
        ("e", {**SSE, "Last-Event-ID": "garbage!"}, {}, 400, "not a resume token"),
        ("e", SSE, {"last_event_id": "eyJ4IjoxfQ"}, 400, "not a resume token"),
    ],
)
def test_bad_requests_get_specific_errors(  # noqa: PLR0917 (parametrized)
    tmp_path: Path,
    topic: str,
    headers: dict[str, str],
    params: dict[str, str],
    status: int,
    words: str,
) -> None:
    with gateway(tmp_path) as eb:
        create(eb, "e")
        r = httpx.get(
            f"{eb.http_url}/v1/topics/{topic}/stream",
            headers=headers,
            params=params,
            timeout=PROMPT_S,
        )
    assert r.status_code == status
    assert words in error_of(r)["message"]


def test_tokens_of_another_topic_or_out_of_range_are_refused(tmp_path: Path) -> None:
    with gateway(tmp_path) as eb, httpx.Client() as client:
        create(eb, "one")
        create(eb, "two")
        produce(eb, "one", [b"x", b"y"])
        with stream(client, eb, "one", headers=SSE, params={"from": "earliest"}) as r:
            got, _ = events(r, 2)
        token = got[-1]["id"]
        r2 = client.get(
            f"{eb.http_url}/v1/topics/two/stream",
            headers={**SSE, "Last-Event-ID": token},
        )
        assert r2.status_code == 400
        assert "topic 'one', not of 'two'" in error_of(r2)["message"]
        eb_url = eb.http_url
    # A fresh broker with the same topic name but a shorter log: the token's offset is past it.
    with gateway(tmp_path / "fresh") as eb2:
        create(eb2, "one")
        r3 = httpx.get(
            f"{eb2.http_url}/v1/topics/one/stream",
            headers={**SSE, "Last-Event-ID": token},
            timeout=PROMPT_S,
        )
        assert eb_url != ""
        assert r3.status_code == 416
        assert "outside the log's 0..0" in error_of(r3)["message"]


def test_partitions_and_base64_and_from_offset(tmp_path: Path) -> None:
    with gateway(tmp_path) as eb, httpx.Client() as client:
        create(eb, "pb", partitions=2)
        produce(eb, "pb", [b"a", b"b", b"c"], partition=0)
        produce(eb, "pb", [b"\xff"], partition=1)
        params = {"partitions": "1", "from": "earliest", "encoding": "base64"}
        with stream(client, eb, "pb", headers=SSE, params=params) as r:
            (only,) = events(r, 1)[0]
        assert json.loads(only["data"])["partition"] == 1
        assert json.loads(only["data"])["value"] == "/w=="
        with stream(client, eb, "pb", headers=SSE, params={"from": "offset:2"}) as r:
            got = [json.loads(e["data"]) for e in events(r, 1)[0]]
        assert (got[0]["partition"], got[0]["offset"], got[0]["value"]) == (0, 2, "c")
