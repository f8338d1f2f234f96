"""A queue consumed over a WebSocket through a real broker: deliveries within the prefetch,
acks (and nacks) over the socket, what it held requeued when it closes, bad commands and
unknown queues refused; and the queue metrics at /metrics."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import websockets.sync.client as ws_client
from websockets.exceptions import ConnectionClosed

from tests.http._support import served
from tidewire.embedded import EmbeddedBroker

#: Generous for a loaded 2-core machine (seconds).
TIMEOUT_S = 30.0


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[tuple[EmbeddedBroker, httpx.Client]]:
    with served(tmp_path / "data") as pair:
        yield pair


def ws_url(eb: EmbeddedBroker, path: str) -> str:
    return eb.http_url.replace("http://", "ws://") + path


def recv(ws: Any) -> dict[str, Any]:
    return dict(json.loads(ws.recv(timeout=TIMEOUT_S)))


def publish(c: httpx.Client, queue: str, *values: str) -> None:
    r = c.post(
        "/v1/exchanges/amq.default/publish",
        json={"routing_key": queue, "messages": [{"value": v} for v in values]},
    )
    assert r.status_code == 200, r.text


def eventually(check: Callable[[], bool], what: str) -> None:
    """Wait until ``check()`` holds (the broker settles on its own loop, after the frame)."""
    deadline = time.monotonic() + TIMEOUT_S
    while not check():
        assert time.monotonic() < deadline, f"not within {TIMEOUT_S} s: {what}"
        time.sleep(0.02)


def status(c: httpx.Client, queue: str) -> dict[str, Any]:
    r = c.get(f"/v1/queues/{queue}")
    assert r.status_code == 200, r.text
    return dict(r.json())


def test_messages_within_the_prefetch_acked_over_the_socket(
    broker: tuple[EmbeddedBroker, httpx.Client],
) -> None:
    eb, c = broker
    assert c.put("/v1/queues/tasks", json={}).status_code == 201
    with ws_client.connect(ws_url(eb, "/v1/queues/tasks/ws?prefetch=2"), open_timeout=30) as ws:
        hello = recv(ws)
        assert hello["type"] == "subscribed"
        assert hello["queue"] == "tasks"
        assert hello["prefetch"] == 2
        assert hello["consumer_tag"]
        eventually(lambda: status(c, "tasks")["consumers"] == 1, "the socket consumes")
        publish(c, "tasks", "t1", "t2", "t3")
        first = [recv(ws), recv(ws)]
        assert [m["type"] for m in first] == ["message", "message"]
        assert [m["value"] for m in first] == ["t1", "t2"]
        assert first[0]["routing_key"] == "tasks"
        assert first[0]["delivery_count"] == 1
        # The prefetch is reached: t3 waits for a settle.
        eventually(lambda: status(c, "tasks")["unacked"] == 2, "two outstanding")
        assert status(c, "tasks")["ready"] == 1
        ws.send(json.dumps({"type": "ack", "tags": [first[0]["tag"]]}))
        got = [recv(ws), recv(ws)]
        settled = next(f for f in got if f["type"] == "settled")
        assert settled == {
            "type": "settled",
            "outcome": "ack",
            "tags": [first[0]["tag"]],
            "up_to": 0,
        }
        third = next(f for f in got if f["type"] == "message")
        assert third["value"] == "t3"
        # Acks of several at once; a tag not held answers an error frame, the socket goes on.
        ws.send(json.dumps({"type": "ack", "tags": [first[1]["tag"], third["tag"]]}))
        assert recv(ws)["type"] == "settled"
        ws.send(json.dumps({"type": "ack", "tags": [third["tag"]]}))
        err = recv(ws)
        assert err["type"] == "error"
        assert err["command"] == "ack"
        assert err["error"]["name"] == "UnknownDeliveryTagError"
        q = status(c, "tasks")
        assert (q["ready"], q["unacked"]) == (0, 0)
        assert q["counters"]["acked"] == 3

        # A nack requeues: delivered again at once, redelivered.
        publish(c, "tasks", "t4")
        m4 = recv(ws)
        ws.send(json.dumps({"type": "nack", "tags": [m4["tag"]]}))
        frames = [recv(ws), recv(ws)]
        again = next(f for f in frames if f["type"] == "message")
        assert again["offset"] == m4["offset"]
        assert again["redelivered"] is True
        assert again["delivery_count"] == 2
    # Closed holding t4: it goes back to the queue.
    eventually(
        lambda: (status(c, "tasks")["ready"], status(c, "tasks")["consumers"]) == (1, 0),
        "the closed socket's message requeued",
    )
    r = c.post("/v1/queues/tasks/get", json={})
    (m,) = r.json()["messages"]
    assert m["value"] == "t4"
    assert m["delivery_count"] == 3


def test_bad_commands_and_unknown_queues_close_the_socket(
    broker: tuple[EmbeddedBroker, httpx.Client],
) -> None:
    eb, c = broker
    with ws_client.connect(ws_url(eb, "/v1/queues/missing/ws"), open_timeout=30) as ws:
        err = recv(ws)
        assert err["error"]["name"] == "UnknownQueueError"
        with pytest.raises(ConnectionClosed) as info:
            ws.recv(timeout=TIMEOUT_S)
        assert info.value.rcvd is not None
        assert info.value.rcvd.code == 4404
    with ws_client.connect(ws_url(eb, "/v1/queues/q/ws?prefetch=0"), open_timeout=30) as ws:
        assert "prefetch" in recv(ws)["error"]["message"]
        with pytest.raises(ConnectionClosed) as info:
            ws.recv(timeout=TIMEOUT_S)
        assert info.value.rcvd is not None
        assert info.value.rcvd.code == 4400
    assert c.put("/v1/queues/q", json={}).status_code == 201
    for frame, code in (
        ('{"type": "commit"}', 1008),
        ('{"type": "ack", "tags": ["x"]}', 1008),
        ('{"type": "ack", "tags": [1], "requeue": true}', 1008),
        ("not json", 1007),
    ):
        with ws_client.connect(ws_url(eb, "/v1/queues/q/ws"), open_timeout=30) as ws:
            assert recv(ws)["type"] == "subscribed"
            ws.send(frame)
            assert recv(ws)["type"] == "error"
            with pytest.raises(ConnectionClosed) as info:
                ws.recv(timeout=TIMEOUT_S)
            assert info.value.rcvd is not None
            assert info.value.rcvd.code == code, frame
    eventually(lambda: status(c, "q")["consumers"] == 0, "every socket's consumer gone")


def test_queue_metrics(broker: tuple[EmbeddedBroker, httpx.Client]) -> None:
    _, c = broker
    assert c.put("/v1/queues/m1", json={}).status_code == 201
    publish(c, "m1", "a", "b", "c")
    r = c.post("/v1/queues/m1/get", json={"max_messages": 1})
    (m,) = r.json()["messages"]
    assert c.post("/v1/queues/m1/ack", json={"tags": [m["tag"]]}).status_code == 200
    text = c.get("/metrics").text
    for line in (
        'tidewire_queue_messages{queue="m1",state="ready"} 2.0',
        'tidewire_queue_messages{queue="m1",state="unacked"} 0.0',
        'tidewire_queue_messages{queue="m1",state="delayed"} 0.0',
        'tidewire_queue_messages_by_fate_total{fate="published",queue="m1"} 3.0',
        'tidewire_queue_messages_by_fate_total{fate="acked",queue="m1"} 1.0',
        'tidewire_queue_messages_by_fate_total{fate="delivered",queue="m1"} 1.0',
        'tidewire_queue_consumers{queue="m1"} 0.0',
        "tidewire_queues 1.0",
    ):
        assert line in text, line
    assert 'tidewire_queue_bytes{queue="m1"}' in text
    # The OpenMetrics format parses (no family name twice).
    from prometheus_client.openmetrics.parser import text_string_to_metric_families

    om = c.get("/metrics", headers={"Accept": "application/openmetrics-text"})
    assert om.status_code == 200
    names = [f.name for f in text_string_to_metric_families(om.text)]
    assert "tidewire_queue_messages" in names
    assert "tidewire_queue_messages_by_fate" in names


def test_a_deleted_queue_closes_its_sockets(broker: tuple[EmbeddedBroker, httpx.Client]) -> None:
    eb, c = broker
    assert c.put("/v1/queues/brief", json={}).status_code == 201
    with ws_client.connect(ws_url(eb, "/v1/queues/brief/ws"), open_timeout=30) as ws:
        assert recv(ws)["type"] == "subscribed"
        assert c.delete("/v1/queues/brief").status_code == 200
        err = recv(ws)
        assert err["type"] == "error"
        assert err["error"]["name"] == "UnknownQueueError"
        with pytest.raises(ConnectionClosed) as info:
            ws.recv(timeout=TIMEOUT_S)
        assert info.value.rcvd is not None
        assert info.value.rcvd.code == 4404
