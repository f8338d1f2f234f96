"""``/v1/streams`` through a real broker: send (one, a batch, deduplicated), work-queue
receive of one stream and of many (long-poll answered promptly on a send), read by resume
token, SSE with ``Last-Event-ID``, ids with any character in paths, list and describe, bad
input answered with specific 4xx errors, and the OpenAPI spec listing the routes."""

from __future__ import annotations

import asyncio
import json
import socket
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx
import pytest

from tests.http._support import TIMEOUT_S, error_of, served
from tidewire.embedded import EmbeddedBroker
from tidewire.server.http.config import HttpConfig

#: A long-poll answered "promptly" on a loaded 2-core CI machine: far below its wait.
PROMPT_S = 5.0
LONG_WAIT_MS = 25_000


def path(stream: str) -> str:
    return "/v1/streams/" + quote(stream, safe="")


def send(c: httpx.Client, stream: str, **body: Any) -> httpx.Response:
    return c.post(f"{path(stream)}/messages", json=body)


def values(r: httpx.Response) -> list[str]:
    assert r.status_code == 200, r.text
    return [m["value"] for m in r.json()["messages"]]


def wait_for_receivers(c: httpx.Client, stream: str, n: int) -> None:
    """Until ``n`` receivers wait on the stream (the condition, polled: the waits happen in
    other threads' requests)."""
    deadline = time.monotonic() + TIMEOUT_S
    while time.monotonic() < deadline:
        r = c.get(path(stream))
        if r.status_code == 200 and r.json()["receivers"] >= n:
            return
        time.sleep(0.02)
    raise AssertionError(f"{n} receivers never waited on {stream!r}")


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[tuple[EmbeddedBroker, httpx.Client]]:
    with served(tmp_path) as running:
        yield running


def test_send_and_receive_one_message(broker: tuple[EmbeddedBroker, httpx.Client]) -> None:
    _, c = broker
    r = send(c, "greetings", value="hello")
    assert r.status_code == 200, r.text
    assert r.json() == {"status": "stored", "token": ""}  # in memory: no token
    r = send(c, "greetings", json={"n": 1}, uuid="u1")
    assert r.json()["status"] == "stored"
    assert send(c, "greetings", json={"n": 1}, uuid="u1").json()["status"] == "duplicate"
    r = c.get(f"{path('greetings')}/messages", params={"max": 10})
    got = r.json()["messages"]
    assert [m["value"] for m in got] == ["hello", '{"n":1}']
    assert got[1]["uuid"] == "u1"
    assert got[0]["encoding"] == "utf-8"
    assert got[0]["expires_at_ms"] > got[0]["timestamp_ms"] > 0
    # Taken once: nothing is left; an empty list at once (wait_ms 0).
    assert values(c.get(f"{path('greetings')}/messages")) == []
    # Bytes that are not UTF-8 come back as base64.
    send(c, "greetings", value_base64="/wA=")
    (m,) = c.get(f"{path('greetings')}/messages").json()["messages"]
    assert (m["value"], m["encoding"]) == ("/wA=", "base64")


def test_long_poll_is_answered_promptly_on_a_send(
    broker: tuple[EmbeddedBroker, httpx.Client],
) -> None:
    eb, c = broker
    url = f"{eb.http_url}{path('jobs')}/messages"
    with ThreadPoolExecutor(1) as pool:
        waiting = pool.submit(
            httpx.get, url, params={"wait_ms": LONG_WAIT_MS}, timeout=TIMEOUT_S + 30
        )
        wait_for_receivers(c, "jobs", 1)
        t0 = time.monotonic()
        assert send(c, "jobs", value="go").status_code == 200
        r = waiting.result(timeout=TIMEOUT_S)
        assert time.monotonic() - t0 < PROMPT_S
    assert values(r) == ["go"]


def test_an_abandoned_long_poll_takes_nothing(
    broker: tuple[EmbeddedBroker, httpx.Client],
) -> None:
    eb, c = broker
    host, port = eb.http_url.removeprefix("http://").split(":")
    body = b'{"streams": ["gone"], "wait_ms": 25000}'
    for request in [
        b"GET /v1/streams/gone/messages?wait_ms=25000 HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n",
        b"POST /v1/streams/receive HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body),
    ]:
        with socket.create_connection((host, int(port)), timeout=TIMEOUT_S) as quitter:
            quitter.sendall(request)
            wait_for_receivers(c, "gone", 1)
        # The client went away while its receive waited: the receive ends, taking nothing.
        deadline = time.monotonic() + TIMEOUT_S
        while c.get(path("gone")).json()["receivers"] and time.monotonic() < deadline:
            time.sleep(0.02)
        assert c.get(path("gone")).json()["receivers"] == 0
        send(c, "gone", value="for someone else")
        assert values(c.get(f"{path('gone')}/messages")) == ["for someone else"]


def test_receive_from_many_streams_answers_on_any_of_them(
    broker: tuple[EmbeddedBroker, httpx.Client],
) -> None:
    eb, c = broker
    streams = [f"user/{i}" for i in range(50)]
    body = {"streams": streams, "wait_ms": LONG_WAIT_MS, "max": 5}
    with ThreadPoolExecutor(1) as pool:
        waiting = pool.submit(
            httpx.post, f"{eb.http_url}/v1/streams/receive", json=body, timeout=TIMEOUT_S + 30
        )
        wait_for_receivers(c, "user/37", 1)
        t0 = time.monotonic()
        send(c, "user/37", value="for 37")
        r = waiting.result(timeout=TIMEOUT_S)
        assert time.monotonic() - t0 < PROMPT_S
    assert [(m["stream"], m["value"]) for m in r.json()["messages"]] == [("user/37", "for 37")]
    # Waiting messages of several streams: up to max in one answer, each taken once.
    for s in ("a", "b", "c"):
        send(c, s, value=s)
    r = c.post("/v1/streams/receive", json={"streams": ["a", "b", "c"], "max": 2})
    first = values(r)
    rest = values(c.post("/v1/streams/receive", json={"streams": ["a", "b", "c"], "max": 5}))
    assert len(first) == 2
    assert sorted(first + rest) == ["a", "b", "c"]


def test_batch_send_answers_each_item(broker: tuple[EmbeddedBroker, httpx.Client]) -> None:
    _, c = broker
    items = [
        {"stream": "orders", "value": "1", "uuid": "o1", "persistent": True},
        {"stream": "orders", "value": "1 again", "uuid": "o1"},
        {"stream": "orders", "json": [2], "ttl_ms": 10**15},
        {"stream": "other/one", "value_base64": "aGk="},
    ]
    r = c.post("/v1/streams/messages", json={"items": items})
    assert r.status_code == 200, r.text
    results = r.json()["results"]
    assert [x["status"] for x in results] == ["stored", "duplicate", "error", "stored"]
    assert results[0]["token"]  # persistent: a resume token
    assert results[2]["error"]["code"] == 120
    assert results[2]["error"]["name"] == "InvalidStreamError"
    assert values(c.get(f"{path('other/one')}/messages")) == ["hi"]
    # Reading from a stored message's token returns it first.
    r = c.get(f"{path('orders')}/read", params={"token": results[0]["token"]})
    assert values(r) == ["1"]


def test_read_and_resume_by_token(broker: tuple[EmbeddedBroker, httpx.Client]) -> None:
    eb, c = broker
    for i in range(5):
        assert send(c, "log", value=str(i), persistent=True).json()["status"] == "stored"
    send(c, "log", value="memory only")  # not readable by token
    r = c.get(f"{path('log')}/read", params={"max": 2})
    assert values(r) == ["0", "1"]
    token = r.json()["token"]
    assert r.json()["messages"][1]["token"] == token
    r = c.get(f"{path('log')}/read", params={"token": token})
    assert values(r) == ["2", "3", "4"]
    end = r.json()["token"]
    # Caught up: nothing, and the same place to read on from.
    r = c.get(f"{path('log')}/read", params={"token": end})
    assert (values(r), r.json()["token"]) == ([], end)
    # Reading takes nothing: the work queue still holds every message, in send order.
    r = c.get(f"{path('log')}/messages", params={"max": 10})
    assert values(r) == ["0", "1", "2", "3", "4", "memory only"]
    # A long-polled read is answered by the next persistent send.
    with ThreadPoolExecutor(1) as pool:
        waiting = pool.submit(
            httpx.get,
            f"{eb.http_url}{path('log')}/read",
            params={"token": end, "wait_ms": LONG_WAIT_MS},
            timeout=TIMEOUT_S + 30,
        )
        wait_for_receivers(c, "log", 1)
        send(c, "log", value="5", persistent=True)
        assert values(waiting.result(timeout=TIMEOUT_S)) == ["5"]
    # Several streams in one read, each from its own token.
    send(c, "log2", value="x", persistent=True)
    r = c.post("/v1/streams/read", json={"positions": {"log": end, "log2": ""}})
    assert sorted(values(r)) == ["5", "x"]
    assert set(r.json()["tokens"]) == {"log", "log2"}


def _events(c: httpx.Client, stream: str, n: int, **headers: str) -> list[dict[str, str]]:
    """The first ``n`` events (message events and keepalives) of the stream's SSE."""
    out: list[dict[str, str]] = []
    event: dict[str, str] = {}
    with c.stream(
        "GET",
        f"{path(stream)}/sse",
        params={"heartbeat_ms": 200},
        headers={"Accept": "text/event-stream", **headers},
    ) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        for line in r.iter_lines():
            if line.startswith(": keepalive"):
                out.append({"keepalive": "1"})
            elif line == "" and event:
                if "data" in event:  # not the opening "retry:" advice
                    out.append(event)
                event = {}
            elif ": " in line and not line.startswith(":"):
                k, _, v = line.partition(": ")
                event[k] = v
            if len(out) >= n:
                return out
    raise AssertionError("the event stream ended")


def test_sse_resumes_from_last_event_id(broker: tuple[EmbeddedBroker, httpx.Client]) -> None:
    _, c = broker
    for i in range(3):
        send(c, "feed", value=f"m{i}", persistent=True)
    first = [e for e in _events(c, "feed", 3) if "id" in e]
    assert [httpx.Response(200, content=e["data"]).json()["value"] for e in first] == [
        "m0",
        "m1",
        "m2",
    ]
    for i in range(3, 5):
        send(c, "feed", value=f"m{i}", persistent=True)
    # Reconnecting with the id of the second event: exactly what followed it.
    again = _events(c, "feed", 4, **{"Last-Event-ID": first[1]["id"]})
    got = [httpx.Response(200, content=e["data"]).json()["value"] for e in again if "id" in e]
    assert got[:3] == ["m2", "m3", "m4"]
    # Idle: keepalive comments.
    assert {"keepalive": "1"} in _events(c, "feed", 6, **{"Last-Event-ID": first[2]["id"]})


def test_ids_with_any_character_in_paths(broker: tuple[EmbeddedBroker, httpx.Client]) -> None:
    _, c = broker
    odd = ["a/b", "x/messages", "q?&#%", "ü n i/ c o d e", "trailing/", "read"]
    for s in odd:
        assert send(c, s, value=s, persistent=True).json()["status"] == "stored", s
    for s in odd:
        if not s.endswith(("/messages", "/read", "/sse")):
            r = c.get(path(s))
            assert r.status_code == 200, (s, r.text)
            assert r.json()["stream"] == s
            assert r.json()["waiting"] == 1
        assert values(c.get(f"{path(s)}/read")) == [s]
        assert values(c.get(f"{path(s)}/messages")) == [s]
    # Listing pages by id, with a prefix.
    send(c, "a/c", value="1")
    r = c.get("/v1/streams", params={"prefix": "a/", "limit": 1})
    doc = r.json()
    assert [s["stream"] for s in doc["streams"]] == ["a/b"]
    r = c.get("/v1/streams", params={"prefix": "a/", "after": doc["next_after"], "limit": 1})
    assert [s["stream"] for s in r.json()["streams"]] == ["a/c"]
    stats = c.get("/v1/stats/streams").json()
    assert stats["streams"] >= len(odd)
    assert stats["partitions"] >= 1


@pytest.mark.parametrize(
    ("method", "url", "kwargs", "status", "code", "words"),
    [
        ("GET", "/v1/streams/s/read", {"params": {"token": "nonsense"}}, 400, 120, "token"),
        ("GET", "/v1/streams/s/read", {"params": {"token": "AQAAAAAAAAAAAAAAAA"}}, 400, 120, ""),
        (
            "POST",
            "/v1/streams/s/messages",
            {"json": {"value": "v", "ttl_ms": 10**15}},
            400,
            120,
            "ttl",
        ),
        (
            "POST",
            "/v1/streams/" + "x" * 1025 + "/messages",
            {"json": {"value": "v"}},
            400,
            120,
            "1,024",
        ),
        ("GET", "/v1/streams/" + "x" * 1025 + "/messages", {}, 400, 120, "1,025"),
        ("POST", "/v1/streams/s/messages", {"content": b"{not json"}, 400, 54, "JSON"),
        (
            "POST",
            "/v1/streams/s/messages",
            {"json": {"value": "v", "json": 1}},
            400,
            54,
            "exactly one of value",
        ),
        ("POST", "/v1/streams/s/messages", {"json": {"value_base64": "!!"}}, 400, 54, "base64"),
        ("POST", "/v1/streams/messages", {"json": {"items": []}}, 400, 54, "items"),
        ("POST", "/v1/streams/receive", {"json": {"streams": ["a", "a"]}}, 400, 120, ""),
        ("GET", "/v1/streams/s/messages", {"params": {"wait_ms": 10**9}}, 400, 120, "wait"),
        ("GET", "/v1/streams/s/messages", {"params": {"max": 0}}, 400, 54, "max"),
        ("GET", "/v1/streams/never-used", {}, 404, 120, "does not exist"),
        ("GET", "/v1/streams/s/sse", {}, 406, 54, "text/event-stream"),
        (
            "GET",
            "/v1/streams/s/sse",
            {"headers": {"Accept": "text/event-stream"}, "params": {"token": "zz"}},
            400,
            120,
            "token",
        ),
    ],
)
def test_bad_input_gets_a_specific_error(  # noqa: PLR0917 (the parameters of the table)
    broker: tuple[EmbeddedBroker, httpx.Client],
    method: str,
    url: str,
    kwargs: dict[str, Any],
    status: int,
    code: int,
    words: str,
) -> None:
    _, c = broker
    r = c.request(method, url, **kwargs)
    assert r.status_code == status, r.text
    err = error_of(r)
    assert err["code"] == code, err
    assert words.lower() in err["message"].lower(), err


def test_the_openapi_spec_lists_the_routes(broker: tuple[EmbeddedBroker, httpx.Client]) -> None:
    _, c = broker
    spec = c.get("/openapi.json").json()
    paths = spec["paths"]
    for route, method in [
        ("/v1/streams", "get"),
        ("/v1/streams/messages", "post"),
        ("/v1/streams/receive", "post"),
        ("/v1/streams/read", "post"),
        ("/v1/streams/{stream}/messages", "post"),
        ("/v1/streams/{stream}/messages", "get"),
        ("/v1/streams/{stream}/read", "get"),
        ("/v1/streams/{stream}/sse", "get"),
        ("/v1/streams/{stream}", "get"),
        ("/v1/stats/streams", "get"),
    ]:
        op = paths[route][method]
        assert "streams" in op["tags"], route
        assert "400" in op["responses"], route
    schemas = spec["components"]["schemas"]
    assert {"StreamSendBatchRequest", "ReceiveRequest", "ReadRequest"} <= set(schemas)


async def _long_poll(port: int, stream: str) -> list[str]:
    """One long-polling receive over a connection of its own (plain HTTP/1.1: an HTTP client
    library's pool is what a test of thousands of connections would measure)."""
    r, w = await asyncio.open_connection("127.0.0.1", port)
    try:
        w.write(
            f"GET /v1/streams/{stream}/messages?wait_ms=60000 HTTP/1.1\r\n"
            "Host: 127.0.0.1\r\n\r\n".encode()
        )
        head = (await r.readuntil(b"\r\n\r\n")).decode("latin-1")
        assert head.startswith("HTTP/1.1 200"), head
        (size,) = (
            int(line.split(":")[1])
            for line in head.split("\r\n")
            if line.lower().startswith("content-length:")
        )
        doc = json.loads(await r.readexactly(size))
        return [m["value"] for m in doc["messages"]]
    finally:
        w.close()


def _many_long_polls(eb: EmbeddedBroker, n: int) -> float:
    """``n`` long-polling receivers, one per stream, all waiting; then one batch send to
    every stream. Returns the seconds from the send to the last receiver's answer."""
    port = int(eb.http_url.rsplit(":", 1)[1])

    async def main() -> float:
        polls = [asyncio.ensure_future(_long_poll(port, f"many-{i}")) for i in range(n)]
        async with httpx.AsyncClient(base_url=eb.http_url, timeout=TIMEOUT_S) as client:
            deadline = time.monotonic() + TIMEOUT_S
            while (await client.get("/v1/stats/streams")).json()["receivers"] < n:
                assert time.monotonic() < deadline, "the receivers never all waited"
                await asyncio.sleep(0.05)
            items = [{"stream": f"many-{i}", "value": str(i)} for i in range(n)]
            t0 = time.monotonic()
            r = await client.post("/v1/streams/messages", json={"items": items})
            assert {x["status"] for x in r.json()["results"]} == {"stored"}
            answers = await asyncio.gather(*polls)
            took = time.monotonic() - t0
        assert answers == [[str(i)] for i in range(n)]
        return took

    return asyncio.run(main())


def test_many_concurrent_long_polls_are_each_answered(
    broker: tuple[EmbeddedBroker, httpx.Client],
) -> None:
    eb, _ = broker
    assert _many_long_polls(eb, 50) < PROMPT_S


@pytest.mark.slow
def test_two_thousand_concurrent_long_polls(tmp_path: Path) -> None:
    conns = {"http_max_connections": 3000, "http_max_connections_per_source": 3000}
    with served(tmp_path, http=HttpConfig(http_host="127.0.0.1", http_port=0, **conns)) as (
        eb,
        _,
    ):
        assert _many_long_polls(eb, 2000) < PROMPT_S * 4


def test_a_stream_id_with_a_line_break_is_routed(
    broker: tuple[EmbeddedBroker, httpx.Client],
) -> None:
    """A stream id is any string but NUL: one holding a line break is named in the path
    (percent-encoded) and reaches its route, not "no route" (404)."""
    _, c = broker
    stream = "two\nlines"
    assert send(c, stream, value="hi").status_code == 200
    assert values(c.get(f"{path(stream)}/messages")) == ["hi"]
    assert c.get(f"{path(stream)}/read").status_code == 200
