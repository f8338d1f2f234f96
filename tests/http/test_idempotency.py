"""``Idempotency-Key``: a retried publish is stored once, also across a broker restart."""

from __future__ import annotations

import threading
from pathlib import Path

import httpx

from tests.http._support import api, error_of, read_all, served
from tidewire.client import Client
from tidewire.protocol.messages import TopicConfig
from tidewire.storage import LogConfig


def _end(client: httpx.Client, topic: str) -> list[int]:
    return [p["end_offset"] for p in client.get(f"/v1/topics/{topic}").json()["partitions"]]


def test_a_retry_is_answered_with_the_first_offsets(client: httpx.Client) -> None:
    key = {"Idempotency-Key": "order-17"}
    first = client.post("/v1/topics/t/messages", json={"value": "v"}, headers=key)
    assert first.status_code == 201
    for _ in range(3):
        again = client.post("/v1/topics/t/messages", json={"value": "v"}, headers=key)
        assert again.status_code == 201
        assert again.json() == first.json()
    assert sum(_end(client, "t")) == 1
    # Keyless (round-robin) messages keep the partition their first attempt chose, however
    # far the round-robin has moved since.
    b = {"Idempotency-Key": "b"}
    other = client.post("/v1/topics/t/messages", json={"value": "w"}, headers=b).json()
    for i in range(3):
        client.post("/v1/topics/t/messages", json={"value": f"plain{i}"})
    for _ in range(2):
        assert client.post("/v1/topics/t/messages", json={"value": "w"}, headers=b).json() == other
    assert sum(_end(client, "t")) == 5
    # Keys are per topic; the stored record carries its key.
    u = client.post("/v1/topics/u/messages", json={"value": "v"}, headers=key)
    assert u.status_code == 201
    (msg,) = read_all(client, "u", u.json()["partition"])
    assert msg["headers"] == {"idempotency-key": "order-17"}


def test_a_key_reused_for_other_messages_is_409(client: httpx.Client) -> None:
    key = {"Idempotency-Key": "k"}
    assert client.post("/v1/topics/t/messages", json={"value": "a"}, headers=key).status_code == 201
    r = client.post("/v1/topics/t/messages", json={"value": "b"}, headers=key)
    assert r.status_code == 409
    assert error_of(r)["name"] == "IdempotencyKeyReusedError"
    two = {"messages": [{"value": "a"}, {"value": "a"}]}
    r = client.post("/v1/topics/t/messages:batch", json=two, headers=key)
    assert r.status_code == 409
    assert sum(_end(client, "t")) == 1


def test_bad_keys_are_400(client: httpx.Client) -> None:
    for path, body in (
        ("/v1/topics/t/messages", {"value": "a"}),
        ("/v1/topics/t/messages:batch", {"messages": [{"value": "a"}]}),
    ):
        r = client.post(path, json=body, headers={"Idempotency-Key": "x" * 256})
        assert r.status_code == 400, path
        assert "Idempotency-Key" in error_of(r)["message"]
        r = client.post(path, json=body, headers={"Idempotency-Key": ""})
        assert r.status_code == 400, path


def test_a_batch_retry_stores_once(client: httpx.Client) -> None:
    body = {"messages": [{"value": f"m{i}", "key": f"k{i}"} for i in range(6)]}
    key = {"Idempotency-Key": "batch-1"}
    first = client.post("/v1/topics/t/messages:batch", json=body, headers=key)
    assert first.status_code == 201
    again = client.post("/v1/topics/t/messages:batch", json=body, headers=key)
    assert again.json() == first.json()
    assert sum(_end(client, "t")) == 6


def test_concurrent_retries_wait_for_the_first(client: httpx.Client) -> None:
    answers: list[dict[str, int]] = []

    def send() -> None:
        with httpx.Client(base_url=str(client.base_url), timeout=30) as c:
            r = c.post(
                "/v1/topics/t/messages", json={"value": "same"}, headers={"Idempotency-Key": "race"}
            )
            answers.append(r.json())

    threads = [threading.Thread(target=send) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(answers) == 8
    assert all(a == answers[0] for a in answers)
    assert sum(_end(client, "t")) == 1


def test_keys_outlive_a_restart(tmp_path: Path) -> None:
    data = tmp_path / "d"
    body = {
        "messages": [
            {"value": "a", "partition": 0},
            {"value": "b", "partition": 1},
            {"value": "c", "partition": 0},
        ]
    }
    with api(data, default_partitions=2) as client:
        one = client.post(
            "/v1/topics/t/messages", json={"value": "x"}, headers={"Idempotency-Key": "one"}
        )
        many = client.post(
            "/v1/topics/t/messages:batch", json=body, headers={"Idempotency-Key": "many"}
        )
        client.post("/v1/topics/t/messages", json={"value": "plain"})
        ends = _end(client, "t")
    with api(data, default_partitions=2) as client:
        again = client.post(
            "/v1/topics/t/messages", json={"value": "x"}, headers={"Idempotency-Key": "one"}
        )
        assert again.status_code == 201
        assert again.json() == one.json()
        again = client.post(
            "/v1/topics/t/messages:batch", json=body, headers={"Idempotency-Key": "many"}
        )
        assert again.json() == many.json()
        assert _end(client, "t") == ends
        # Read back from the log, a key is matched by its message count.
        r = client.post(
            "/v1/topics/t/messages:batch",
            json={"messages": [{"value": "a"}]},
            headers={"Idempotency-Key": "many"},
        )
        assert r.status_code == 409
        # A new key still stores.
        assert (
            client.post(
                "/v1/topics/t/messages", json={"value": "x"}, headers={"Idempotency-Key": "two"}
            ).status_code
            == 201
        )
        assert sum(_end(client, "t")) == sum(ends) + 1


def test_a_key_whose_publish_stored_nothing_is_free(tmp_path: Path) -> None:
    with api(tmp_path / "d", log=LogConfig(max_batch_bytes=1000)) as client:
        key = {"Idempotency-Key": "k"}
        r = client.post("/v1/topics/t/messages", json={"value": "x" * 2000}, headers=key)
        assert r.status_code == 413
        r = client.post("/v1/topics/t/messages", json={"value": "small"}, headers=key)
        assert r.status_code == 201
        again = client.post("/v1/topics/t/messages", json={"value": "small"}, headers=key)
        assert again.json() == r.json()
        assert sum(_end(client, "t")) == 1


def test_a_retry_completes_a_batch_that_was_stored_in_part(tmp_path: Path) -> None:
    with served(tmp_path / "d") as (eb, client):
        client.post(
            "/v1/topics", json={"name": "t", "partitions": 2, "config": {"max_message_bytes": 1000}}
        )
        body = {
            "messages": [
                {"value": "small", "partition": 0},
                {"value": "x" * 2000, "partition": 1},
                {"value": "small too", "partition": 0},
            ]
        }
        key = {"Idempotency-Key": "partial"}
        r = client.post("/v1/topics/t/messages:batch", json=body, headers=key)
        assert r.status_code == 413  # partition 1 refused; partition 0 stored
        assert _end(client, "t") == [2, 0]
        with Client(eb.addr) as admin:  # the limit is raised: the same request now fits
            admin.alter_topic("t", config=TopicConfig(max_message_bytes=100_000))
        r = client.post("/v1/topics/t/messages:batch", json=body, headers=key)
        assert r.status_code == 201, r.text
        assert r.json() == {
            "results": [
                {"offset": 0, "partition": 0},
                {"offset": 0, "partition": 1},
                {"offset": 1, "partition": 0},
            ]
        }
        assert _end(client, "t") == [2, 1]  # partition 0 not stored twice
        assert [m["value"] for m in read_all(client, "t", 0)] == ["small", "small too"]
