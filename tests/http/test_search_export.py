"""Reading one partition with filters (``q``, ``key``), from a time (``from_timestamp``),
bounded by ``max_scan``, and exported as JSON or CSV."""

from __future__ import annotations

import csv
import io
import json

import httpx

from tests.http._support import error_of

URL = "/v1/topics/t/partitions/0/messages"


def _fill(client: httpx.Client) -> None:
    assert client.post("/v1/topics", json={"name": "t", "partitions": 1}).status_code == 201
    messages = [
        {"key": f"user-{i % 3}", "value": f"order {i} {'Paid' if i % 4 == 0 else 'open'}"}
        for i in range(40)
    ]
    messages.append({"key": "Ymlu", "value": "/w==", "encoding": "base64"})  # not UTF-8
    r = client.post("/v1/topics/t/messages:batch", json={"messages": messages[:20]})
    assert r.status_code == 201, r.text
    for m in messages[20:]:
        r = client.post("/v1/topics/t/messages", json={**m, "partition": 0})
        assert r.status_code == 201, r.text


def test_search_by_text_and_key(client: httpx.Client) -> None:
    _fill(client)
    r = client.get(URL, params={"q": "paid"})  # case-insensitive
    assert r.status_code == 200, r.text
    doc = r.json()
    assert [m["offset"] for m in doc["messages"]] == list(range(0, 40, 4))
    assert doc["scanned"] == 41
    assert doc["next_offset"] == 41
    doc = client.get(URL, params={"q": "paid", "limit": 3}).json()
    assert [m["offset"] for m in doc["messages"]] == [0, 4, 8]
    assert (doc["scanned"], doc["next_offset"]) == (9, 9)
    doc = client.get(URL, params={"q": "paid", "limit": 3, "offset": 9}).json()
    assert [m["offset"] for m in doc["messages"]] == [12, 16, 20]
    doc = client.get(URL, params={"key": "user-1", "q": "PAID"}).json()
    assert [m["offset"] for m in doc["messages"]] == [4, 16, 28]
    doc = client.get(URL, params={"key": "user-2"}).json()
    assert [m["offset"] for m in doc["messages"]] == list(range(2, 40, 3))
    # max_scan bounds the records looked at; the search goes on from next_offset.
    doc = client.get(URL, params={"q": "paid", "max_scan": 6}).json()
    assert [m["offset"] for m in doc["messages"]] == [0, 4]
    assert (doc["scanned"], doc["next_offset"]) == (6, 6)
    doc = client.get(URL, params={"q": "nothing-like-it"}).json()
    assert (doc["messages"], doc["scanned"], doc["next_offset"]) == ([], 41, 41)
    # A value that is not UTF-8 is searched with replacement characters, answered base64.
    doc = client.get(URL, params={"q": "\ufffd"}).json()
    assert [(m["offset"], m["encoding"]) for m in doc["messages"]] == [(40, "base64")]
    # Without a filter the page keeps its shape.
    assert set(client.get(URL).json()) == {"messages", "next_offset", "high_watermark"}
    r = client.get(URL, params={"max_scan": 100_001, "q": "x"})
    assert r.status_code == 400
    assert "max_scan" in error_of(r)["message"]


def test_from_timestamp(client: httpx.Client) -> None:
    _fill(client)
    all_ = client.get(URL, params={"limit": 100}).json()["messages"]
    ts = all_[30]["timestamp"]
    doc = client.get(URL, params={"from_timestamp": ts, "limit": 100}).json()
    first = doc["messages"][0]["offset"]
    assert first <= 30
    assert all_[first]["timestamp"] >= ts
    assert first == 0 or all_[first - 1]["timestamp"] < ts
    doc = client.get(URL, params={"from_timestamp": ts + 10**9}).json()
    assert doc["messages"] == []
    assert doc["next_offset"] == 41
    r = client.get(URL, params={"from_timestamp": ts, "offset": 3})
    assert r.status_code == 400
    assert "not both" in error_of(r)["message"]


def test_export_json_and_csv(client: httpx.Client) -> None:
    _fill(client)
    r = client.get(URL, params={"key": "user-0", "limit": 3, "format": "json"})
    assert r.status_code == 200
    assert r.headers["content-disposition"] == 'attachment; filename="t-0-0.json"'
    docs = json.loads(r.content)
    assert [(d["offset"], d["key"]) for d in docs] == [(0, "user-0"), (3, "user-0"), (6, "user-0")]
    r = client.get(URL, params={"offset": 38, "format": "csv"})
    assert r.status_code == 200
    assert r.headers["content-type"].startswith("text/csv")
    assert r.headers["content-disposition"] == 'attachment; filename="t-0-38.csv"'
    rows = list(csv.reader(io.StringIO(r.text)))
    assert rows[0] == ["partition", "offset", "timestamp", "key", "value", "headers", "encoding"]
    assert [(row[1], row[3], row[4], row[5], row[6]) for row in rows[1:]] == [
        ("38", "user-2", "order 38 open", "{}", "utf-8"),
        ("39", "user-0", "order 39 open", "{}", "utf-8"),
        ("40", "Ymlu", "/w==", "{}", "base64"),
    ]
