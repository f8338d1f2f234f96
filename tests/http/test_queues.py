"""Exchanges, queues and bindings over HTTP, through a real broker: declare (made, existing,
conflicting), list, describe, delete, purge; publish through the default, fanout and direct
exchanges (mandatory, unroutable, a full queue); get, ack, nack, reject; a get redelivered
after its visibility timeout; dead letters browsed, replayed and purged; the OpenAPI spec."""

from __future__ import annotations

import base64
import json
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.http._support import error_of, served

#: Generous for a loaded 2-core machine (seconds).
DEADLINE_S = 30.0


@pytest.fixture
def client(tmp_path: Path) -> Any:
    with served(tmp_path / "data") as (_, c):
        yield c


def eventually(check: Callable[[], bool], what: str) -> None:
    """Wait until ``check()`` holds (what the broker does after answering)."""
    deadline = time.monotonic() + DEADLINE_S
    while not check():
        assert time.monotonic() < deadline, f"not within {DEADLINE_S} s: {what}"
        time.sleep(0.02)


def publish(c: httpx.Client, exchange: str, key: str, *values: str, **extra: Any) -> Any:
    r = c.post(
        f"/v1/exchanges/{exchange}/publish",
        json={"routing_key": key, "messages": [{"value": v} for v in values], **extra},
    )
    assert r.status_code == 200, r.text
    return r.json()


def get(c: httpx.Client, queue: str, **body: Any) -> list[dict[str, Any]]:
    r = c.post(f"/v1/queues/{queue}/get", json=body)
    assert r.status_code == 200, r.text
    doc = r.json()
    assert doc["queue"] == queue
    return list(doc["messages"])


def queue(c: httpx.Client, name: str) -> dict[str, Any]:
    r = c.get(f"/v1/queues/{name}")
    assert r.status_code == 200, r.text
    return dict(r.json())


def test_declare_queue_made_existing_and_conflicting(client: httpx.Client) -> None:
    r = client.put("/v1/queues/jobs", json={"max_deliveries": 3})
    assert r.status_code == 201, r.text
    doc = r.json()
    assert doc["name"] == "jobs"
    assert doc["durable"] is True
    assert doc["max_deliveries"] == 3
    assert (doc["ready"], doc["unacked"], doc["delayed"], doc["consumers"]) == (0, 0, 0, 0)
    assert doc["counters"]["published"] == 0
    again = client.put("/v1/queues/jobs", json={"max_deliveries": 3})
    assert again.status_code == 200, again.text
    r = client.put("/v1/queues/jobs", json={"max_deliveries": 4})
    assert r.status_code == 409, r.text
    assert error_of(r)["name"] == "PreconditionFailedError"
    # An empty body takes every default.
    assert client.put("/v1/queues/plain", content=b"").status_code == 201
    r = client.put("/v1/queues/x", json={"exclusive": True})
    assert r.status_code == 400
    assert "exclusive" in error_of(r)["message"]
    r = client.put("/v1/queues/x", json={"max_length": -1})
    assert r.status_code == 400
    assert "max_length" in error_of(r)["message"]
    r = client.put("/v1/queues/amq.mine", json={})
    assert r.status_code == 400, r.text
    assert error_of(r)["name"] == "InvalidQueueError"
    listed = client.get("/v1/queues").json()
    assert [q["name"] for q in listed["queues"]] == ["jobs", "plain"]
    assert listed["total"] == 2
    assert listed["next"] is None
    page = client.get("/v1/queues", params={"q": "JO"}).json()
    assert [q["name"] for q in page["queues"]] == ["jobs"]
    r = client.get("/v1/queues/missing")
    assert r.status_code == 404
    assert error_of(r)["name"] == "UnknownQueueError"
    r = client.delete("/v1/queues/plain")
    assert r.status_code == 200, r.text
    assert r.json() == {"queue": "plain", "messages": 0}
    assert client.get("/v1/queues/plain").status_code == 404


def test_publish_get_ack_nack_reject(client: httpx.Client) -> None:
    assert client.put("/v1/queues/work", json={}).status_code == 201
    got = publish(client, "amq.default", "work", "a", "b", "c")
    assert got == {"messages": 3, "queues": ["work"], "topics": [], "unroutable": False}
    assert queue(client, "work")["ready"] == 3
    first = get(client, "work", max_messages=2)
    assert [m["value"] for m in first] == ["a", "b"]
    assert all(m["delivery_count"] == 1 and not m["redelivered"] for m in first)
    assert first[0]["routing_key"] == "work"
    assert first[0]["encoding"] == "utf-8"
    q = queue(client, "work")
    assert (q["ready"], q["unacked"]) == (1, 2)
    r = client.post("/v1/queues/work/ack", json={"tags": [first[0]["tag"]]})
    assert r.status_code == 200, r.text
    assert r.json()["outcome"] == "ack"
    r = client.post("/v1/queues/work/nack", json={"tags": [first[1]["tag"]]})
    assert r.status_code == 200, r.text
    assert r.json()["outcome"] == "requeue"
    # A tag not held (acked already): 409 naming it.
    r = client.post("/v1/queues/work/ack", json={"tags": [first[0]["tag"]]})
    assert r.status_code == 409, r.text
    assert error_of(r)["name"] == "UnknownDeliveryTagError"
    assert str(first[0]["tag"]) in error_of(r)["message"]
    again = get(client, "work", max_messages=10)
    values = sorted(m["value"] for m in again)
    assert values == ["b", "c"]
    b = next(m for m in again if m["value"] == "b")
    assert b["redelivered"] is True
    assert b["delivery_count"] == 2
    assert b["offset"] == first[1]["offset"]
    r = client.post(
        "/v1/queues/work/reject", json={"tags": [m["tag"] for m in again]}
    )  # no dead-letter exchange: dropped
    assert r.status_code == 200, r.text
    assert r.json()["outcome"] == "dead-letter"
    q = queue(client, "work")
    assert (q["ready"], q["unacked"]) == (0, 0)
    c = q["counters"]
    assert c["published"] == 3
    assert c["acked"] == 1
    assert c["redelivered"] >= 1
    assert get(client, "work") == []
    r = client.post("/v1/queues/work/ack", json={"tags": []})
    assert r.status_code == 400
    r = client.post("/v1/queues/work/ack", json={"tags": [1], "requeue": True})
    assert r.status_code == 400
    assert "requeue" in error_of(r)["message"]
    r = client.post("/v1/queues/nope/get", json={})
    assert r.status_code == 404


def test_base64_payloads_and_headers(client: httpx.Client) -> None:
    assert client.put("/v1/queues/bin", json={}).status_code == 201
    raw = b"\xff\x00binary"
    r = client.post(
        "/v1/exchanges/amq.default/publish",
        json={
            "routing_key": "bin",
            "encoding": "base64",
            "headers": {"origin": "test"},
            "messages": [
                {"value": base64.b64encode(raw).decode(), "headers": {"h": "aGk="}},
            ],
        },
    )
    assert r.status_code == 200, r.text
    (m,) = get(client, "bin")
    assert m["encoding"] == "base64"
    assert base64.b64decode(m["value"]) == raw
    assert base64.b64decode(m["headers"]["h"]) == b"hi"
    assert base64.b64decode(m["headers"]["origin"]) == b"test"
    r = client.post(
        "/v1/exchanges/amq.default/publish",
        json={"routing_key": "bin", "encoding": "base64", "messages": [{"value": "***"}]},
    )
    assert r.status_code == 400
    assert "messages.0.value" in error_of(r)["message"]
    r = client.post(
        "/v1/exchanges/amq.default/publish",
        json={
            "routing_key": "bin",
            "messages": [{"value": "x"}],
            "delay_ms": 5,
            "deliver_at_ms": 9,
        },
    )
    assert r.status_code == 400


def test_exchanges_bindings_and_routing(client: httpx.Client) -> None:
    for q in ("a", "b"):
        assert client.put(f"/v1/queues/{q}", json={}).status_code == 201
    r = client.put("/v1/exchanges/fan", json={"type": "fanout"})
    assert r.status_code == 201, r.text
    assert r.json() == {"name": "fan", "type": "fanout", "durable": True, "alternate_exchange": ""}
    assert client.put("/v1/exchanges/fan", json={"type": "fanout"}).status_code == 200
    r = client.put("/v1/exchanges/fan", json={"type": "direct"})
    assert r.status_code == 409
    assert client.put("/v1/exchanges/direct.x", json={}).status_code == 201
    for q in ("a", "b"):
        r = client.post("/v1/bindings", json={"exchange": "fan", "destination": q})
        assert r.status_code == 201, r.text
    r = client.post("/v1/bindings", json={"exchange": "direct.x", "destination": "a", "key": "k"})
    assert r.status_code == 201
    r = client.post("/v1/bindings", json={"exchange": "fan", "destination": "missing"})
    assert r.status_code == 404, r.text
    bindings = client.get("/v1/bindings", params={"exchange": "fan"}).json()["bindings"]
    assert sorted(b["destination"] for b in bindings) == ["a", "b"]
    assert all(b["destination_kind"] == "queue" for b in bindings)
    names = [x["name"] for x in client.get("/v1/exchanges").json()["exchanges"]]
    assert {"", "fan", "direct.x"} <= set(names)
    desc = client.get("/v1/exchanges/fan").json()
    assert desc["type"] == "fanout"
    assert len(desc["bindings"]) == 2
    assert client.get("/v1/exchanges/amq.default").status_code == 200

    got = publish(client, "fan", "anything", "hello")
    assert sorted(got["queues"]) == ["a", "b"]
    got = publish(client, "direct.x", "k", "direct")
    assert got["queues"] == ["a"]
    got = publish(client, "direct.x", "other", "lost")
    assert got["queues"] == []
    assert got["unroutable"] is True
    r = client.post(
        "/v1/exchanges/direct.x/publish",
        json={"routing_key": "other", "messages": [{"value": "x"}], "mandatory": True},
    )
    assert r.status_code == 422, r.text
    assert error_of(r)["name"] == "UnroutableError"
    r = client.post("/v1/exchanges/nowhere/publish", json={"messages": [{"value": "x"}]})
    assert r.status_code == 404
    assert error_of(r)["name"] == "UnknownExchangeError"
    assert [m["value"] for m in get(client, "a", max_messages=10)] == ["hello", "direct"]
    assert [m["value"] for m in get(client, "b", max_messages=10)] == ["hello"]

    r = client.request(
        "DELETE", "/v1/bindings", json={"exchange": "direct.x", "destination": "a", "key": "k"}
    )
    assert r.status_code == 204, r.text
    assert publish(client, "direct.x", "k", "again")["unroutable"] is True
    r = client.delete("/v1/exchanges/fan", params={"if_unused": "true"})
    assert r.status_code == 409, r.text
    assert client.delete("/v1/exchanges/fan").status_code == 204
    assert client.get("/v1/exchanges/fan").status_code == 404
    assert client.get("/v1/bindings", params={"exchange": "fan"}).json()["bindings"] == []


def test_a_get_not_settled_is_redelivered_after_its_visibility_timeout(
    client: httpx.Client,
) -> None:
    assert client.put("/v1/queues/slow", json={}).status_code == 201
    publish(client, "amq.default", "slow", "once")
    (m,) = get(client, "slow", visibility_timeout_ms=300)
    assert m["delivery_count"] == 1
    assert get(client, "slow") == []  # held by the first get
    deadline = time.monotonic() + DEADLINE_S
    again: list[dict[str, Any]] = []
    while not again and time.monotonic() < deadline:
        again = get(client, "slow", wait_ms=5_000)  # answered as soon as it is back
    assert again, "not redelivered within the deadline"
    assert again[0]["offset"] == m["offset"]
    assert again[0]["delivery_count"] == 2
    assert again[0]["redelivered"] is True
    assert again[0]["tag"] != m["tag"]
    # The old tag is no longer held; the new one settles it.
    assert client.post("/v1/queues/slow/ack", json={"tags": [m["tag"]]}).status_code == 409
    r = client.post("/v1/queues/slow/ack", json={"tags": [again[0]["tag"]]})
    assert r.status_code == 200, r.text
    assert queue(client, "slow")["counters"]["acked"] == 1


def test_dead_letters_browse_replay_and_purge(client: httpx.Client) -> None:
    assert client.put("/v1/queues/dead", json={}).status_code == 201
    r = client.put(
        "/v1/queues/orders",
        json={"dead_letter_exchange": "amq.default", "dead_letter_routing_key": "dead"},
    )
    assert r.status_code == 201, r.text
    assert r.json()["dead_letter_exchange"] == ""
    publish(client, "amq.default", "orders", "o1", "o2", "o3")
    msgs = get(client, "orders", max_messages=3)
    r = client.post("/v1/queues/orders/reject", json={"tags": [m["tag"] for m in msgs]})
    assert r.status_code == 200, r.text
    # Dead letters are republished by the broker after the answer.
    eventually(
        lambda: queue(client, "orders")["counters"]["dead_lettered"] == 3, "three dead letters"
    )
    assert queue(client, "dead")["ready"] == 3

    page = client.get("/v1/queues/dead/dlq", params={"max_messages": 2})
    assert page.status_code == 200, page.text
    doc = page.json()
    assert [m["value"] for m in doc["messages"]] == ["o1", "o2"]
    death = json.loads(doc["messages"][0]["headers"]["x-death"])
    assert death[0]["queue"] == "orders"
    assert death[0]["reason"] == "rejected"
    rest = client.get("/v1/queues/dead/dlq", params={"from_offset": doc["next_offset"]}).json()
    assert [m["value"] for m in rest["messages"]] == ["o3"]
    assert queue(client, "dead")["ready"] == 3  # browsing delivers nothing

    first = doc["messages"][0]["offset"]
    r = client.post("/v1/queues/dead/dlq/replay", json={"offsets": [first]})
    assert r.status_code == 200, r.text
    assert r.json() == {"queue": "dead", "messages": 1}
    (back,) = get(client, "orders")
    assert back["value"] == "o1"
    assert "x-death" in back["headers"]
    r = client.post("/v1/queues/dead/dlq/replay", json={"all": True, "offsets": [1]})
    assert r.status_code == 400
    r = client.post("/v1/queues/dead/dlq/purge")
    assert r.status_code == 200, r.text
    assert r.json() == {"queue": "dead", "messages": 2}
    assert client.get("/v1/queues/dead/dlq").json()["messages"] == []


def test_a_full_queue_refuses_publishes_with_429(client: httpx.Client) -> None:
    assert client.put("/v1/queues/small", json={"max_length": 2}).status_code == 201
    publish(client, "amq.default", "small", "1", "2")
    r = client.post(
        "/v1/exchanges/amq.default/publish",
        json={"routing_key": "small", "messages": [{"value": "3"}]},
    )
    assert r.status_code == 429, r.text
    assert r.headers["retry-after"] == "1"
    assert error_of(r)["name"] == "QueueFullError"
    q = queue(client, "small")
    assert q["ready"] == 2
    assert q["counters"]["rejected_publishes"] >= 1
    r = client.post("/v1/queues/small/purge")
    assert r.json() == {"queue": "small", "messages": 2}
    publish(client, "amq.default", "small", "3")


def test_the_openapi_spec_describes_the_queue_routes(client: httpx.Client) -> None:
    spec = client.get("/openapi.json").json()
    paths = spec["paths"]
    for path, method in (
        ("/v1/exchanges", "get"),
        ("/v1/exchanges/{name}", "put"),
        ("/v1/exchanges/{name}/publish", "post"),
        ("/v1/bindings", "post"),
        ("/v1/bindings", "delete"),
        ("/v1/queues", "get"),
        ("/v1/queues/{name}", "put"),
        ("/v1/queues/{name}/get", "post"),
        ("/v1/queues/{name}/ack", "post"),
        ("/v1/queues/{name}/nack", "post"),
        ("/v1/queues/{name}/reject", "post"),
        ("/v1/queues/{name}/dlq", "get"),
        ("/v1/queues/{name}/dlq/replay", "post"),
        ("/v1/queues/{name}/dlq/purge", "post"),
    ):
        assert method in paths[path], (path, method)
    publish_op = paths["/v1/exchanges/{name}/publish"]["post"]
    ref = publish_op["requestBody"]["content"]["application/json"]["schema"]["$ref"]
    assert ref.endswith("/QueuePublishRequest")
    assert {"404", "422", "429"} <= set(publish_op["responses"])
    schemas = spec["components"]["schemas"]
    assert "routing_key" in schemas["QueuePublishRequest"]["properties"]
    assert schemas["GetRequest"]["properties"]["visibility_timeout_ms"]["default"] == 30_000
    assert "counters" in schemas["QueueInfo"]["properties"]


def test_a_long_poll_get_is_answered_by_a_publish(tmp_path: Path) -> None:
    with served(tmp_path / "data") as (eb, c):
        assert c.put("/v1/queues/poll", json={}).status_code == 201
        answers: list[httpx.Response] = []

        def wait() -> None:
            with httpx.Client(base_url=eb.http_url, timeout=60) as other:
                answers.append(other.post("/v1/queues/poll/get", json={"wait_ms": 25_000}))

        t = threading.Thread(target=wait)
        t.start()
        # Publish once the get is being handled (the scrape counts itself too).
        eventually(
            lambda: 'tidewire_requests_in_flight{interface="http"} 2.0' in c.get("/metrics").text,
            "the get in flight",
        )
        publish(c, "amq.default", "poll", "woken")
        t.join(60)
        assert answers, "the long-poll did not answer"
        assert answers[0].status_code == 200, answers[0].text
        assert [m["value"] for m in answers[0].json()["messages"]] == ["woken"]


def test_headers_exchanges_and_bindings_to_topics(client: httpx.Client) -> None:
    assert client.put("/v1/queues/invoices", json={}).status_code == 201
    assert client.put("/v1/exchanges/by-kind", json={"type": "headers"}).status_code == 201
    r = client.post(
        "/v1/bindings",
        json={
            "exchange": "by-kind",
            "destination": "invoices",
            "arguments": {"x-match": "all", "kind": "invoice"},
        },
    )
    assert r.status_code == 201, r.text
    assert r.json()["bindings"][0]["arguments"] == {"kind": "invoice", "x-match": "all"}
    got = publish(client, "by-kind", "", "inv 1", headers={"kind": "invoice"})
    assert got["queues"] == ["invoices"]
    assert publish(client, "by-kind", "", "other", headers={"kind": "receipt"})["unroutable"]
    (m,) = get(client, "invoices")
    assert m["headers"] == {"kind": "invoice"}  # routing headers are stored too

    assert client.post("/v1/topics", json={"name": "audit", "partitions": 1}).status_code == 201
    r = client.post(
        "/v1/bindings",
        json={"exchange": "amq.fanout", "destination": "audit", "destination_kind": "topic"},
    )
    assert r.status_code == 201, r.text
    got = publish(client, "amq.fanout", "k", "to the log")
    assert got["queues"] == []
    assert [t["topic"] for t in got["topics"]] == ["audit"]
    page = client.get("/v1/topics/audit/partitions/0/messages").json()
    assert [(x["key"], x["value"]) for x in page["messages"]] == [("k", "to the log")]
