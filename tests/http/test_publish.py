"""Publishing: one message, a batch (atomic per partition), payload encodings, routing, and
the errors (400, 404, 413, 422)."""

from __future__ import annotations

import base64
import threading
from pathlib import Path

import httpx
import pytest

from tests.http._support import api, error_of, read_all
from tidewire.broker.offsets import OFFSETS_TOPIC
from tidewire.client.partitioner import partition_for_key
from tidewire.server.http import HttpConfig
from tidewire.storage import LogConfig


def test_publish_answers_201_with_partition_and_offset(client: httpx.Client) -> None:
    r = client.post(
        "/v1/topics/events/messages",
        json={"key": "k1", "value": "hello", "headers": {"h": "v", "n": None}, "timestamp": 1234},
    )
    assert r.status_code == 201, r.text
    p = partition_for_key(b"k1", 2)  # auto-created with the default 2 partitions
    assert r.json() == {"offset": 0, "partition": p}
    assert client.post(
        "/v1/topics/events/messages", json={"key": "k1", "value": "again"}
    ).json() == {"offset": 1, "partition": p}
    (first, second) = read_all(client, "events", p)
    assert first == {
        "partition": p,
        "offset": 0,
        "timestamp": 1234,
        "key": "k1",
        "value": "hello",
        "headers": {"h": "v", "n": None},
        "encoding": "utf-8",
    }
    assert second["value"] == "again"


def test_partition_and_round_robin(client: httpx.Client) -> None:
    assert client.post("/v1/topics/t/messages", json={"value": "p1", "partition": 1}).json() == {
        "offset": 0,
        "partition": 1,
    }
    spread = {
        client.post("/v1/topics/t/messages", json={"value": str(i)}).json()["partition"]
        for i in range(4)
    }
    assert spread == {0, 1}


def test_base64_payloads_round_trip_any_bytes(client: httpx.Client) -> None:
    raw = bytes(range(256))
    r = client.post(
        "/v1/topics/bin/messages",
        json={
            "encoding": "base64",
            "key": base64.b64encode(b"\xff\x00").decode(),
            "value": base64.b64encode(raw).decode(),
            "headers": {"sig": base64.b64encode(b"\x80").decode()},
            "partition": 0,
        },
    )
    assert r.status_code == 201, r.text
    (msg,) = read_all(client, "bin", 0)
    assert msg["encoding"] == "base64"  # not valid UTF-8: answered as base64
    assert base64.b64decode(msg["value"]) == raw
    assert base64.b64decode(msg["key"]) == b"\xff\x00"
    assert base64.b64decode(msg["headers"]["sig"]) == b"\x80"
    # A tombstone (null value) stays null.
    client.post("/v1/topics/bin/messages", json={"key": "k", "value": None, "partition": 0})
    tomb = read_all(client, "bin", 0)[1]
    assert tomb["value"] is None
    assert tomb["key"] == "k"
    # UTF-8 text may be asked for as base64.
    client.post("/v1/topics/bin/messages", json={"value": "é", "partition": 1})
    r = client.get("/v1/topics/bin/partitions/1/messages", params={"encoding": "base64"})
    assert base64.b64decode(r.json()["messages"][0]["value"]) == "é".encode()


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"value": "!!", "encoding": "base64"}, "field value: not valid base64"),
        ({"value": "ok", "key": "%%", "encoding": "base64"}, "field key: not valid base64"),
        ({"value": 5}, "field value"),
        ({"value": "x", "partition": "0"}, "field partition"),
        ({"value": "x", "partition": -1}, "field partition"),
        ({"value": "x", "headers": {"a": 1}}, "field headers.a"),
        ({"value": "x", "encoding": "hex"}, "field encoding"),
        ({"value": "x", "unknown": True}, "field unknown"),
    ],
)
def test_bad_messages_are_400(client: httpx.Client, body: object, field: str) -> None:
    r = client.post("/v1/topics/t/messages", json=body)
    assert r.status_code == 400, r.text
    assert error_of(r)["message"].startswith(field), r.text
    assert client.get("/v1/topics/t").status_code == 404  # nothing created


def test_unknown_partition_404_and_invalid_topic_422(client: httpx.Client) -> None:
    r = client.post("/v1/topics/t/messages", json={"value": "x", "partition": 7})
    assert r.status_code == 404
    assert error_of(r)["name"] == "UnknownPartitionError"
    r = client.post("/v1/topics/bad%20name/messages", json={"value": "x"})
    assert r.status_code == 422
    assert error_of(r)["name"] == "InvalidTopicError"
    r = client.post(f"/v1/topics/{OFFSETS_TOPIC}/messages", json={"value": "x"})
    assert r.status_code == 422
    assert error_of(r)["name"] == "InternalTopicError"


def test_unknown_topic_is_404_without_auto_creation(tmp_path: Path) -> None:
    with api(tmp_path / "d", auto_create_topics=False) as client:
        r = client.post("/v1/topics/t/messages", json={"value": "x"})
        assert r.status_code == 404
        assert error_of(r)["name"] == "UnknownTopicError"
        r = client.post("/v1/topics/t/messages:batch", json={"messages": [{"value": "x"}]})
        assert r.status_code == 404


def test_too_large_is_413(tmp_path: Path) -> None:
    settings = HttpConfig(http_max_body_bytes=4096)
    with api(tmp_path / "d", http=settings, log=LogConfig(max_batch_bytes=1000)) as client:
        # A first publish over max_batch_bytes does not create its topic.
        r = client.post("/v1/topics/small/messages", json={"value": "x" * 2000, "partition": 0})
        assert r.status_code == 413
        assert error_of(r)["name"] == "BatchTooLargeError"
        assert "max_message_bytes=1,000" in error_of(r)["message"]
        assert client.get("/v1/topics/small").status_code == 404
        # Nor does a later one store anything.
        assert client.post("/v1/topics", json={"name": "small"}).status_code == 201
        r = client.post("/v1/topics/small/messages", json={"value": "x" * 2000, "partition": 0})
        assert r.status_code == 413
        assert client.get("/v1/topics/small").json()["partitions"][0]["end_offset"] == 0
        # A body over http_max_body_bytes, by its Content-Length or sent chunked.
        big = b'{"value": "' + b"x" * 5000 + b'"}'
        for path in ("/v1/topics/small/messages", "/v1/topics/small/messages:batch"):
            for content in (big, iter([big[:3000], big[3000:]])):
                r = client.post(path, content=content)
                assert r.status_code == 413
                assert "http_max_body_bytes=4,096" in error_of(r)["message"]
        assert client.get("/v1/topics/small").json()["partitions"][0]["end_offset"] == 0


def test_batch_answers_in_order_and_is_atomic_per_partition(tmp_path: Path) -> None:
    with api(tmp_path / "d", default_partitions=2) as client:
        client.post(
            "/v1/topics", json={"name": "b", "partitions": 2, "config": {"max_message_bytes": 3000}}
        )
        r = client.post(
            "/v1/topics/b/messages:batch",
            json={
                "messages": [
                    {"value": "a", "partition": 0},
                    {"value": "b", "partition": 1},
                    {"value": "c", "partition": 0},
                ]
            },
        )
        assert r.status_code == 201, r.text
        assert r.json() == {
            "results": [
                {"offset": 0, "partition": 0},
                {"offset": 0, "partition": 1},
                {"offset": 1, "partition": 0},
            ]
        }
        # Messages of one partition that together exceed the limit: none is stored.
        r = client.post(
            "/v1/topics/b/messages:batch",
            json={"messages": [{"value": "x" * 1000, "partition": 1} for _ in range(4)]},
        )
        assert r.status_code == 413
        assert [m["value"] for m in read_all(client, "b", 1)] == ["b"]

        # Batches racing single publishes into one partition keep their offsets together.
        def batches(worker: int) -> None:
            with httpx.Client(base_url=str(client.base_url), timeout=30) as c:
                for i in range(15):
                    msgs = [{"value": f"{worker}-{i}-{j}", "partition": 0} for j in range(5)]
                    got = c.post("/v1/topics/b/messages:batch", json={"messages": msgs}).json()
                    offsets = [x["offset"] for x in got["results"]]
                    assert offsets == list(range(offsets[0], offsets[0] + 5))
                    c.post("/v1/topics/b/messages", json={"value": "single", "partition": 0})

        threads = [threading.Thread(target=batches, args=(w,)) for w in range(3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        values = [m["value"] for m in read_all(client, "b", 0)]
        assert len(values) == 2 + 3 * 15 * 6
        for w in range(3):
            for i in range(15):
                at = values.index(f"{w}-{i}-0")
                assert values[at : at + 5] == [f"{w}-{i}-{j}" for j in range(5)]


def test_batch_errors(client: httpx.Client) -> None:
    r = client.post("/v1/topics/t/messages:batch", json={"messages": []})
    assert r.status_code == 400
    r = client.post(
        "/v1/topics/t/messages:batch",
        json={"messages": [{"value": "ok"}, {"value": "@@", "partition": 0}], "encoding": "base64"},
    )
    assert r.status_code == 400
    assert error_of(r)["message"].startswith("field messages.0.value: not valid base64")
    r = client.post("/v1/topics/t/messages:batch", json={"messages": [{"value": 1}]})
    assert r.status_code == 400
    assert error_of(r)["message"].startswith("field messages.0.value")


def test_keys_route_as_the_clients_route_them() -> None:
    from tidewire.client import partitioner
    from tidewire.server.http.publisher import partition_for_key as http_partition

    keys = [b"", b"k", b"customer-7", bytes(range(256)), "ü".encode()] + [
        str(i).encode() for i in range(500)
    ]
    for n in (1, 2, 3, 7, 64, 1000):
        for key in keys:
            assert http_partition(key, n) == partitioner.partition_for_key(key, n)
    # The server's own loop (used without the compiled codec) agrees with the client's too.
    from tidewire.server.http import publisher

    for key in keys:
        assert publisher._fnv1a_32(key) == partitioner._fnv1a_32(key)
