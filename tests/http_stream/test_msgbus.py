"""The msgbus compatibility mode, driven with the requests msgbus' README documents (its curl
examples: ``curl -X PUT -d BODY http://HOST/hello`` sends the body form-encoded, ``curl
http://HOST/hello`` a plain GET), answered with its statuses and JSON shapes; pops once only,
across a restart and under concurrent takers; WebSocket subscribers; the payload limit."""

from __future__ import annotations

import base64
import json
import re
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
from websockets.sync.client import connect

from tests.http_stream._support import PROMPT_S, gateway
from tidewire.embedded import EmbeddedBroker
from tidewire.storage import LogConfig

CURL_D = {"Content-Type": "application/x-www-form-urlencoded", "User-Agent": "curl/8.5.0"}
RFC3339 = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$")


def url(eb: EmbeddedBroker, path: str = "/") -> str:
    assert eb.gateway is not None
    return f"http://127.0.0.1:{eb.gateway.port_of('msgbus')}{path}"


def test_the_readme_session(tmp_path: Path) -> None:
    with gateway(tmp_path, http_msgbus_port=0) as eb:
        # $ curl -q -o - -X PUT -d '{"message": "hello"}' http://localhost:8000/hello
        r = httpx.put(url(eb, "/hello"), content=b'{"message": "hello"}', headers=CURL_D)
        assert r.status_code == 202
        assert r.text == "message successfully published to hello with sequence 1"
        # $ curl -q -o - http://localhost:8000/
        listing = httpx.get(url(eb)).json()
        assert list(listing) == ["hello"]
        assert listing["hello"]["name"] == "hello"
        assert listing["hello"]["seq"] == 1
        # $ curl -q -o - http://localhost:8000/hello
        r = httpx.get(url(eb, "/hello"))
        assert r.status_code == 200
        assert r.headers["content-type"] == "application/json"
        msg = r.json()
        assert set(msg) == {"id", "topic", "payload", "created", "expires"}
        assert msg["id"] == 0
        assert msg["payload"] == "eyJtZXNzYWdlIjogImhlbGxvIn0="  # the README's own value
        assert base64.b64decode(msg["payload"]) == b'{"message": "hello"}'
        assert set(msg["topic"]) == {"name", "ttl", "seq", "created"}
        assert (msg["topic"]["name"], msg["topic"]["seq"]) == ("hello", 1)
        assert isinstance(msg["topic"]["ttl"], int)
        assert RFC3339.match(msg["created"])
        assert msg["expires"] == "0001-01-01T00:00:00Z"
        # The queue is empty now.
        r = httpx.get(url(eb, "/hello"))
        assert r.status_code == 404
        assert r.text == "no messages enqueued for topic: hello"
        assert httpx.get(url(eb, "/never-used")).status_code == 404


def test_post_pops_in_order_once_only_across_a_restart(tmp_path: Path) -> None:
    with gateway(tmp_path, http_msgbus_port=0) as eb:
        for i in range(3):
            assert httpx.post(url(eb, "/jobs"), content=b"job-%d" % i).status_code == 202
        first = httpx.get(url(eb, "/jobs")).json()
        assert base64.b64decode(first["payload"]) == b"job-0"
    with gateway(tmp_path, http_msgbus_port=0) as eb:
        got = [httpx.get(url(eb, "/jobs")) for _ in range(3)]
    assert [r.status_code for r in got] == [200, 200, 404]
    assert [base64.b64decode(r.json()["payload"]) for r in got[:2]] == [b"job-1", b"job-2"]
    assert [r.json()["id"] for r in got[:2]] == [1, 2]


def test_concurrent_pops_hand_each_message_out_once(tmp_path: Path) -> None:
    with gateway(tmp_path, http_msgbus_port=0) as eb, httpx.Client() as client:
        for i in range(20):
            client.put(url(eb, "/q"), content=b"%d" % i)
        with ThreadPoolExecutor(8) as pool:
            answers = list(pool.map(lambda _: client.get(url(eb, "/q")), range(30)))
    ok = [base64.b64decode(r.json()["payload"]) for r in answers if r.status_code == 200]
    assert sorted(ok, key=int) == [b"%d" % i for i in range(20)]
    assert sum(r.status_code == 404 for r in answers) == 10


def test_websocket_subscribers_get_what_is_published_from_then_on(tmp_path: Path) -> None:
    with gateway(tmp_path, http_msgbus_port=0) as eb:
        httpx.put(url(eb, "/news"), content=b"before")
        ws_url = url(eb, "/news").replace("http://", "ws://")
        with connect(ws_url, open_timeout=PROMPT_S) as a, connect(ws_url) as b:
            httpx.put(url(eb, "/news"), content=b"one")
            httpx.post(url(eb, "/news"), content=b"\x00\xff")
            for ws in (a, b):
                got = [json.loads(ws.recv(timeout=PROMPT_S)) for _ in range(2)]
                assert [base64.b64decode(m["payload"]) for m in got] == [b"one", b"\x00\xff"]
                assert [m["id"] for m in got] == [1, 2]
                assert got[0]["topic"]["name"] == "news"
        # Subscribing does not pop: the queue still holds all three.
        assert httpx.get(url(eb, "/news")).json()["id"] == 0


def test_payload_over_the_limit_is_413_and_names_any_topic(tmp_path: Path) -> None:
    with gateway(tmp_path, http_msgbus_port=0, http_max_body_bytes=1024) as eb:
        r = httpx.put(url(eb, "/big"), content=b"x" * 1025)
        assert r.status_code == 413
        assert "max payload size of 1024 bytes" in r.text
        assert httpx.put(url(eb, "/big"), content=b"x" * 1024).status_code == 202
        # Names that are not tidewire topic names work too, and list as they were given.
        assert httpx.put(url(eb, "/a/b c_ü"), content=b"odd").status_code == 202
        assert sorted(httpx.get(url(eb)).json()) == ["a/b c_ü", "big"]
        odd = httpx.get(url(eb, "/a/b c_ü")).json()
        assert odd["topic"]["name"] == "a/b c_ü"


def test_delete_is_not_served(tmp_path: Path) -> None:
    with gateway(tmp_path, http_msgbus_port=0) as eb:
        httpx.put(url(eb, "/keep"), content=b"x")
        assert httpx.delete(url(eb, "/keep")).status_code == 405
        assert httpx.get(url(eb, "/keep")).status_code == 200


def test_a_payload_over_the_topics_batch_limit_is_413(tmp_path: Path) -> None:
    with gateway(tmp_path, http_msgbus_port=0, log=LogConfig(max_batch_bytes=1000)) as eb:
        r = httpx.put(url(eb, "/small"), content=b"x" * 2000)
        assert r.status_code == 413
        assert "max_message_bytes=1,000" in r.text
        assert httpx.put(url(eb, "/small"), content=b"x" * 100).status_code == 202


def test_a_refused_publish_creates_no_topic(tmp_path: Path) -> None:
    """A publish refused with 413 (over the payload limit, or over the new topic's batch
    limit) leaves no topic behind: the listing, the broker and the disk show none."""
    small = LogConfig(max_batch_bytes=1000)
    with gateway(tmp_path, http_msgbus_port=0, http_max_body_bytes=4096, log=small) as eb:
        assert httpx.put(url(eb, "/huge"), content=b"x" * 5000).status_code == 413
        r = httpx.put(url(eb, "/big"), content=b"x" * 2000)
        assert r.status_code == 413
        assert "max_message_bytes=1,000" in r.text
        assert httpx.get(url(eb)).json() == {}
        assert eb.broker.topics() == {}
        assert httpx.get(url(eb, "/big")).status_code == 404
        assert httpx.put(url(eb, "/big"), content=b"x" * 100).status_code == 202
        assert list(httpx.get(url(eb)).json()) == ["big"]
    assert sorted(p.name for p in tmp_path.iterdir() if p.is_dir()) == ["msgbus.big-0"]


def test_a_topic_named_like_an_internal_one_stays_in_the_msgbus_namespace(
    tmp_path: Path,
) -> None:
    with gateway(tmp_path, http_msgbus_port=0) as eb:
        assert httpx.put(url(eb, "/__consumer_offsets"), content=b"x").status_code == 202
        assert list(httpx.get(url(eb)).json()) == ["__consumer_offsets"]
        assert list(eb.broker.topics()) == ["msgbus._5f_5fconsumer_5foffsets"]
        assert ("__consumer_offsets", 0) not in eb.broker.logs.logs
