"""Reading: one partition from an offset (with long-poll), every partition from a time."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import httpx

from tests.http._support import api, error_of


def _publish(client: httpx.Client, topic: str, value: str, partition: int, **extra: object) -> int:
    r = client.post(
        f"/v1/topics/{topic}/messages", json={"value": value, "partition": partition, **extra}
    )
    assert r.status_code == 201, r.text
    return int(r.json()["offset"])


def test_read_from_an_offset_with_limit(client: httpx.Client) -> None:
    for i in range(5):
        _publish(client, "t", f"m{i}", 0)
    page = client.get("/v1/topics/t/partitions/0/messages", params={"offset": 1, "limit": 2}).json()
    assert [m["value"] for m in page["messages"]] == ["m1", "m2"]
    assert [m["offset"] for m in page["messages"]] == [1, 2]
    assert page["next_offset"] == 3
    assert page["high_watermark"] == 5
    # Without an offset: from the oldest; at the end: empty, next_offset stays.
    page = client.get("/v1/topics/t/partitions/0/messages").json()
    assert len(page["messages"]) == 5
    page = client.get("/v1/topics/t/partitions/0/messages", params={"offset": 5}).json()
    assert page == {"messages": [], "next_offset": 5, "high_watermark": 5}


def test_read_errors(client: httpx.Client) -> None:
    _publish(client, "t", "x", 0)
    r = client.get("/v1/topics/t/partitions/0/messages", params={"offset": 9})
    assert r.status_code == 416
    assert error_of(r)["name"] == "OffsetOutOfRangeError"
    r = client.get("/v1/topics/t/partitions/5/messages")
    assert r.status_code == 404
    assert error_of(r)["name"] == "UnknownPartitionError"
    r = client.get("/v1/topics/nope/partitions/0/messages")
    assert r.status_code == 404
    assert error_of(r)["name"] == "UnknownTopicError"
    r = client.get("/v1/topics/nope/messages")
    assert r.status_code == 404
    for params in ({"offset": -1}, {"limit": 0}, {"limit": 10_001}, {"wait_ms": "soon"}):
        r = client.get("/v1/topics/t/partitions/0/messages", params=params)
        assert r.status_code == 400, params
        assert "query parameter" in error_of(r)["message"]
    r = client.get("/v1/topics/t/partitions/x/messages")
    assert r.status_code == 400
    assert error_of(r)["message"].startswith("path parameter 'partition'")


def test_long_poll_wakes_on_publish(client: httpx.Client) -> None:
    _publish(client, "t", "old", 0)
    got: list[httpx.Response] = []

    def poll() -> None:
        with httpx.Client(base_url=str(client.base_url), timeout=30) as c:
            got.append(
                c.get(
                    "/v1/topics/t/partitions/0/messages",
                    params={"offset": 1, "wait_ms": 20_000},
                )
            )

    start = time.monotonic()
    poller = threading.Thread(target=poll)
    poller.start()
    time.sleep(0.5)
    assert not got  # still waiting: nothing at offset 1 yet
    _publish(client, "t", "new", 0)
    poller.join(20)
    took = time.monotonic() - start
    assert got, "the long-poll did not return"
    assert [m["value"] for m in got[0].json()["messages"]] == ["new"]
    assert took < 15  # woken by the publish, not by its 20 s timeout


def test_long_poll_times_out_empty(client: httpx.Client) -> None:
    _publish(client, "t", "x", 0)
    start = time.monotonic()
    r = client.get("/v1/topics/t/partitions/0/messages", params={"offset": 1, "wait_ms": 300})
    took = time.monotonic() - start
    assert r.json()["messages"] == []
    assert took >= 0.25


def test_long_poll_is_capped_by_max_wait_ms(tmp_path: Path) -> None:
    with api(tmp_path / "d", max_wait_ms=200) as client:
        _publish(client, "t", "x", 0)
        start = time.monotonic()
        r = client.get(
            "/v1/topics/t/partitions/0/messages", params={"offset": 1, "wait_ms": 60_000}
        )
        assert r.status_code == 200
        assert time.monotonic() - start < 20


def test_read_since_a_time_across_partitions(client: httpx.Client) -> None:
    client.post("/v1/topics", json={"name": "ts", "partitions": 3})
    for ts, p in ((1000, 0), (2000, 1), (3000, 2), (4000, 0), (5000, 1)):
        _publish(client, "ts", f"at{ts}", p, timestamp=ts)
    page = client.get("/v1/topics/ts/messages", params={"since": 2500}).json()
    assert [m["value"] for m in page["messages"]] == ["at3000", "at4000", "at5000"]
    assert page["next_offsets"] == {"0": 2, "1": 2, "2": 1}
    page = client.get("/v1/topics/ts/messages", params={"since": 0, "limit": 2}).json()
    assert [m["value"] for m in page["messages"]] == ["at1000", "at2000"]
    assert page["next_offsets"] == {"0": 1, "1": 1, "2": 0}
    page = client.get("/v1/topics/ts/messages", params={"since": 9000}).json()
    assert page == {"messages": [], "next_offsets": {"0": 2, "1": 2, "2": 1}}


def test_values_that_are_not_utf8_come_back_as_base64(client: httpx.Client) -> None:
    client.post(
        "/v1/topics/t/messages",
        json={"value": "/w==", "encoding": "base64", "partition": 0},  # b"\xff"
    )
    (msg,) = client.get("/v1/topics/t/partitions/0/messages").json()["messages"]
    assert msg["encoding"] == "base64"
    assert msg["value"] == "/w=="


def test_too_many_waiting_long_polls_is_503_with_retry_after(tmp_path: Path) -> None:
    with api(tmp_path / "d", max_fetch_waiters=1) as client:
        _publish(client, "t", "x", 0)
        got: list[httpx.Response] = []

        def poll() -> None:
            with httpx.Client(base_url=str(client.base_url), timeout=30) as c:
                params = {"offset": 1, "wait_ms": 20_000}
                got.append(c.get("/v1/topics/t/partitions/0/messages", params=params))

        # Two long-polls, one waiter allowed: the later one is refused at once.
        pollers = [threading.Thread(target=poll) for _ in range(2)]
        for t in pollers:
            t.start()
        deadline = time.monotonic() + 15
        while not got and time.monotonic() < deadline:
            time.sleep(0.01)
        assert got, "neither long-poll was answered"
        refused = got[0]
        assert refused.status_code == 503
        assert refused.headers["retry-after"] == "1"
        assert error_of(refused)["name"] == "BackpressureError"
        _publish(client, "t", "y", 0)  # wakes the other
        for t in pollers:
            t.join(20)
        assert [m["value"] for m in got[1].json()["messages"]] == ["y"]
