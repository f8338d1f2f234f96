"""``/v1/groups``: list, describe (members, offsets, lag), commit, reset (seek)."""

from __future__ import annotations

from pathlib import Path

import httpx

from tests.http._support import error_of, served
from tidewire.client import GroupConsumer


def _fill(client: httpx.Client) -> None:
    client.post("/v1/topics", json={"name": "t", "partitions": 2})
    for i, ts in enumerate((1000, 2000, 3000)):
        client.post(
            "/v1/topics/t/messages", json={"value": f"a{i}", "partition": 0, "timestamp": ts}
        )
    client.post("/v1/topics/t/messages", json={"value": "b0", "partition": 1, "timestamp": 1500})


def test_commit_then_list_and_describe_with_lag(client: httpx.Client) -> None:
    _fill(client)
    assert client.get("/v1/groups").json() == {"groups": [], "total": 0, "next": None}
    r = client.post(
        "/v1/groups/billing/commit",
        json={"offsets": [{"topic": "t", "partition": 0, "offset": 1, "metadata": "m"}]},
    )
    assert r.status_code == 200, r.text
    assert r.json() == {
        "group": "billing",
        "offsets": [{"topic": "t", "partition": 0, "offset": 1, "metadata": "m"}],
    }
    assert client.get("/v1/groups").json() == {
        "groups": [{"group": "billing", "state": "empty", "members": 0, "lag": 2}],
        "total": 1,
        "next": None,
    }
    d = client.get("/v1/groups/billing").json()
    assert d["group"] == "billing"
    assert d["members"] == []
    assert d["offsets"] == [
        {"topic": "t", "partition": 0, "committed": 1, "end_offset": 3, "lag": 2, "metadata": "m"},
        {"topic": "t", "partition": 1, "committed": -1, "end_offset": 1, "lag": -1, "metadata": ""},
    ]


def test_group_errors(client: httpx.Client) -> None:
    _fill(client)
    r = client.get("/v1/groups/nope")
    assert r.status_code == 404
    assert error_of(r)["name"] == "UnknownGroupError"
    one = {"topic": "nope", "partition": 0, "offset": 1}
    r = client.post("/v1/groups/g/commit", json={"offsets": [one]})
    assert r.status_code == 404
    r = client.post(
        "/v1/groups/g/commit", json={"offsets": [{**one, "topic": "t", "partition": 9}]}
    )
    assert r.status_code == 404
    assert error_of(r)["name"] == "UnknownPartitionError"
    twice = {"topic": "t", "partition": 0, "offset": 1}
    r = client.post("/v1/groups/g/commit", json={"offsets": [twice, twice]})
    assert r.status_code == 400
    for body in ({"offsets": []}, {"offsets": [{**twice, "offset": -1}]}, {}):
        assert client.post("/v1/groups/g/commit", json=body).status_code == 400
    r = client.post("/v1/groups/g/reset", json={"topic": "t", "to": "offset"})
    assert r.status_code == 400
    assert error_of(r)["message"] == "field offset: required when to is 'offset'"
    r = client.post("/v1/groups/g/reset", json={"topic": "t", "to": "somewhere"})
    assert r.status_code == 400
    r = client.post("/v1/groups/g/reset", json={"topic": "nope", "to": "latest"})
    assert r.status_code == 404


def test_reset_like_the_cli(client: httpx.Client) -> None:
    _fill(client)
    client.post(
        "/v1/groups/g/commit", json={"offsets": [{"topic": "t", "partition": 0, "offset": 2}]}
    )

    def reset(**body: object) -> dict[str, object]:
        r = client.post("/v1/groups/g/reset", json={"topic": "t", **body})
        assert r.status_code == 200, r.text
        return dict(r.json())

    dry = reset(to="earliest", dry_run=True)
    assert dry == {
        "group": "g",
        "dry_run": True,
        "partitions": [
            {"topic": "t", "partition": 0, "previous": 2, "offset": 0, "end_offset": 3, "lag": 3},
            {"topic": "t", "partition": 1, "previous": -1, "offset": 0, "end_offset": 1, "lag": 1},
        ],
    }
    committed = {
        x["partition"]: x["committed"] for x in client.get("/v1/groups/g").json()["offsets"]
    }
    assert committed == {0: 2, 1: -1}  # a dry run commits nothing
    assert [p["offset"] for p in reset(to="latest")["partitions"]] == [3, 1]  # type: ignore[index]
    assert [p["offset"] for p in reset(to="offset", offset=99, partitions=[0])["partitions"]] == [3]  # type: ignore[index]
    got = reset(to="timestamp", timestamp=2000)["partitions"]
    assert [p["offset"] for p in got] == [1, 1]  # type: ignore[index]
    committed = {
        x["partition"]: x["committed"] for x in client.get("/v1/groups/g").json()["offsets"]
    }
    assert committed == {0: 1, 1: 1}


def test_a_group_with_members(tmp_path: Path) -> None:
    with served(tmp_path / "d") as (eb, client):
        _fill(client)
        with GroupConsumer(eb.addr, "live", topics=["t"], auto_offset_reset="earliest") as consumer:
            seen = []
            for _ in range(20):
                seen += consumer.poll(1.0)
                if len(seen) >= 4:
                    break
            assert len(seen) == 4
            d = client.get("/v1/groups/live").json()
            assert d["state"] == "stable"
            (member,) = d["members"]
            assert member["topics"] == ["t"]
            assert sorted(tuple(a) for a in member["assignment"]) == [("t", 0), ("t", 1)]
            r = client.post(
                "/v1/groups/live/commit",
                json={"offsets": [{"topic": "t", "partition": 0, "offset": 1}]},
            )
            assert r.status_code == 409
            assert error_of(r)["name"] == "GroupNotEmptyError"
            r = client.post("/v1/groups/live/reset", json={"topic": "t", "to": "earliest"})
            assert r.status_code == 409
            assert error_of(r)["name"] == "GroupNotEmptyError"
