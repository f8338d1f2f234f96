"""``/v1/topics``: create, list, describe, delete, and their errors."""

from __future__ import annotations

import httpx
import pytest

from tests.http._support import error_of


def test_create_list_describe_delete(client: httpx.Client) -> None:
    r = client.post(
        "/v1/topics",
        json={
            "name": "orders",
            "partitions": 3,
            "config": {"fsync": "never", "retention_ms": 60_000},
        },
    )
    assert r.status_code == 201, r.text
    doc = r.json()
    assert doc["name"] == "orders"
    assert [p["partition"] for p in doc["partitions"]] == [0, 1, 2]
    assert doc["config"]["fsync"] == "never"
    assert doc["config"]["retention_ms"] == 60_000
    assert client.post("/v1/topics", json={"name": "a.b_c-1"}).status_code == 201

    listed = client.get("/v1/topics").json()
    assert listed == {
        "topics": [
            {"name": "a.b_c-1", "partitions": 2, "size_bytes": 0, "messages": 0},
            {"name": "orders", "partitions": 3, "size_bytes": 0, "messages": 0},
        ],
        "total": 2,
        "next": None,
    }

    client.post("/v1/topics/orders/messages", json={"value": "x", "partition": 1})
    got = client.get("/v1/topics/orders").json()
    ends = {
        p["partition"]: (p["start_offset"], p["end_offset"], p["high_watermark"])
        for p in got["partitions"]
    }
    assert ends == {0: (0, 0, 0), 1: (0, 1, 1), 2: (0, 0, 0)}
    assert got["partitions"][1]["size_bytes"] > 0

    r = client.delete("/v1/topics/orders")
    assert r.status_code == 204
    assert r.content == b""
    assert client.get("/v1/topics/orders").status_code == 404
    assert [t["name"] for t in client.get("/v1/topics").json()["topics"]] == ["a.b_c-1"]


def test_exists_is_409_and_unknown_is_404(client: httpx.Client) -> None:
    assert client.post("/v1/topics", json={"name": "t"}).status_code == 201
    r = client.post("/v1/topics", json={"name": "t", "partitions": 4})
    assert r.status_code == 409
    assert error_of(r) == {
        "code": 71,
        "name": "TopicExistsError",
        "message": "topic 't' exists already",
    }
    for r in (client.get("/v1/topics/nope"), client.delete("/v1/topics/nope")):
        assert r.status_code == 404
        assert error_of(r)["name"] == "UnknownTopicError"


@pytest.mark.parametrize("name", ["bad name", "..", "x" * 250, "ü"])
def test_invalid_names_are_422(client: httpx.Client, name: str) -> None:
    r = client.post("/v1/topics", json={"name": name})
    assert r.status_code == 422, r.text
    assert error_of(r)["name"] == "InvalidTopicError"


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"name": 5}, "field name"),
        ({}, "field name"),
        ({"name": "t", "partitions": "3"}, "field partitions"),
        ({"name": "t", "partitions": 0}, "field partitions"),
        ({"name": "t", "extra": 1}, "field extra"),
        ({"name": "t", "config": {"fsync": "sometimes"}}, "field config.fsync"),
        ({"name": "t", "config": {"segment_bytes": 10}}, "field config.segment_bytes"),
        ([1, 2], "the body"),
    ],
)
def test_bad_types_are_400_naming_the_field(client: httpx.Client, body: object, field: str) -> None:
    r = client.post("/v1/topics", json=body)
    assert r.status_code == 400, r.text
    err = error_of(r)
    assert err["name"] == "InvalidRequestError"
    assert err["code"] == 54
    assert err["message"].startswith(field), err["message"]


def test_bad_json_is_400(client: httpx.Client) -> None:
    for raw in (b"{bad", b"", b'{"name": "t"'):
        r = client.post("/v1/topics", content=raw, headers={"content-type": "application/json"})
        assert r.status_code == 400
        assert "not valid JSON" in error_of(r)["message"]


def test_unknown_routes_and_methods_answer_in_the_error_shape(client: httpx.Client) -> None:
    r = client.get("/v2/nothing")
    assert r.status_code == 404
    assert error_of(r)["message"] == "no route GET /v2/nothing"
    r = client.put("/v1/topics")
    assert r.status_code == 405
    error_of(r)


def test_internal_topics_are_refused(client: httpx.Client) -> None:
    """No client creates, deletes or publishes to the broker's ``__consumer_offsets`` (nor
    creates any ``__`` name): 422 with the error's own name; reading it stays allowed."""
    r = client.post(
        "/v1/topics",
        json={"name": "__consumer_offsets", "partitions": 8, "config": {"fsync": "never"}},
    )
    assert r.status_code == 422, r.text
    err = error_of(r)
    assert (err["code"], err["name"]) == (90, "InternalTopicError")
    assert "internal to the broker" in err["message"]
    r = client.post("/v1/topics", json={"name": "__mine"})
    assert r.status_code == 422
    assert "reserved" in error_of(r)["message"]
    assert client.get("/v1/topics").json() == {
        "topics": [],
        "total": 0,
        "next": None,
    }  # nothing created
    # Once the broker has made it (the first commit), it still refuses to let it go.
    assert client.post("/v1/topics/t/messages", json={"value": "x"}).status_code == 201
    commit = {"offsets": [{"topic": "t", "partition": 0, "offset": 1}]}
    assert client.post("/v1/groups/g/commit", json=commit).status_code == 200
    r = client.delete("/v1/topics/__consumer_offsets")
    assert r.status_code == 422, r.text
    assert error_of(r)["name"] == "InternalTopicError"
    r = client.post("/v1/topics/__consumer_offsets/messages", json={"value": "x"})
    assert r.status_code == 422
    assert error_of(r)["name"] == "InternalTopicError"
    assert client.delete("/v1/topics/never-was").status_code == 404


def test_alter_topic_settings_and_partitions(client: httpx.Client) -> None:
    assert client.post("/v1/topics", json={"name": "t", "partitions": 1}).status_code == 201
    before = client.get("/v1/topics/t").json()["config"]
    r = client.patch("/v1/topics/t", json={"config": {"retention_ms": 60_000}})
    assert r.status_code == 200, r.text
    doc = r.json()
    assert doc["config"] == before | {"retention_ms": 60_000}
    r = client.patch(
        "/v1/topics/t", json={"partitions": 3, "config": {"retention_bytes": 1_000_000}}
    )
    assert r.status_code == 200, r.text
    doc = client.get("/v1/topics/t").json()
    assert len(doc["partitions"]) == 3
    assert (doc["config"]["retention_ms"], doc["config"]["retention_bytes"]) == (
        60_000,
        1_000_000,
    )
    r = client.patch("/v1/topics/t", json={"config": {"segment_bytes": 10}})
    assert r.status_code == 400
    assert "config.segment_bytes" in error_of(r)["message"]
    r = client.patch("/v1/topics/t", json={"config": {"colour": "red"}})
    assert r.status_code == 400
    assert "config.colour" in error_of(r)["message"]
    r = client.patch("/v1/topics/t", json={"partitions": 2})
    assert r.status_code == 422
    assert "partitions=2 must be within 3.." in error_of(r)["message"]
    r = client.patch("/v1/topics/t", json={})
    assert r.status_code == 400
    assert "nothing to change" in error_of(r)["message"]
    assert client.patch("/v1/topics/nope", json={"partitions": 2}).status_code == 404
    assert client.get("/v1/topics/t").json()["config"]["segment_bytes"] == before["segment_bytes"]


@pytest.mark.parametrize(
    "setting",
    [{"replication_factor": 3}, {"min_insync_replicas": 2}, {"unclean_leader_election": True}],
)
def test_a_single_node_refuses_a_cluster_s_settings(client: httpx.Client, setting: dict) -> None:
    r = client.post("/v1/topics", json={"name": "solo", **setting})
    assert r.status_code == 400, r.text
    assert "a single node holds one copy" in r.json()["error"]["message"]
    assert client.get("/v1/topics/solo").status_code == 404
    # Their neutral values are accepted: one copy, one in sync.
    r = client.post(
        "/v1/topics", json={"name": "solo", "replication_factor": 1, "min_insync_replicas": 1}
    )
    assert r.status_code == 201, r.text
    assert "replication_factor" not in r.json()


def test_a_single_node_refuses_to_alter_a_cluster_s_settings(client: httpx.Client) -> None:
    assert client.post("/v1/topics", json={"name": "solo"}).status_code == 201
    r = client.patch("/v1/topics/solo", json={"min_insync_replicas": 2})
    assert r.status_code == 400, r.text
    assert "a single node holds one copy" in r.json()["error"]["message"]
