"""VarthanV's pub-sub (seed 001): its settings as the page translates them, and its exchanges,
queues, bindings and WebSocket subscriptions through the page's own requests, commands and
WebSocket URL (read from the page), against a real ``tidewire serve``; then what a restart
keeps, after a clean stop and after SIGKILL."""

from __future__ import annotations

import json
import re
import shlex
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from websockets.sync.client import ClientConnection, connect

from tests.cli._support import STARTUP_S, run_cli
from tests.migrating._support import (
    Served,
    code_blocks,
    code_span,
    section,
    serving,
    shell_commands,
    table_column,
)

#: The bound on anything that should happen at once (s), generous for a loaded machine.
PROMPT_S = 30.0
#: How long a check that nothing (more) arrives waits (s).
QUIET_S = 0.5
#: pub-sub's HTTP port, which the page's requests use (the test's broker has a free one).
HTTP_PORT = "8060"

SEED = section("## From varthanv pub-sub (001)")
EXCHANGES = section("### Exchanges, queues and bindings")
WEBSOCKET = section("### WebSocket subscriptions")


def _env(data_dir: Path) -> dict[str, str]:
    """The page's environment for ``tidewire serve`` (free ports, a test directory)."""
    (block,) = code_blocks(section("### Environment"), "sh")
    words = shlex.split(block.replace("\\\n", " "))
    assert words[-2:] == ["tidewire", "serve"]
    env = dict(w.split("=", 1) for w in words[:-2])
    assert env == {
        "TIDEWIRE_HTTP_PORT": "8060",
        "TIDEWIRE_HTTP_ALLOWED_HOSTS": "*",
        "TIDEWIRE_DATA_DIR": "./pub-sub",
        "TIDEWIRE_FSYNC": "interval",
        "TIDEWIRE_FLUSH_INTERVAL_MS": "10000",
    }
    return env | {
        "TIDEWIRE_HTTP_PORT": "0",
        "TIDEWIRE_PORT": "0",
        "TIDEWIRE_DATA_DIR": str(data_dir),
    }


@pytest.fixture
def data_dir(tmp_path: Path) -> Path:
    return tmp_path / "pub-sub"


@pytest.fixture
def broker(data_dir: Path) -> Iterator[Served]:
    with serving(env=_env(data_dir)) as served:
        yield served


def _on(served: Served, text: str) -> str:
    """A documented line pointed at the test's broker."""
    return re.sub(rf"\blocalhost:{HTTP_PORT}\b", f"127.0.0.1:{served.http_port}", text)


def _curl(served: Served, command: str) -> tuple[int, Any]:
    """Run a documented curl line against the broker: its status and JSON answer."""
    done = subprocess.run(
        _on(served, command) + " -w '\\n%{http_code}'",
        shell=True,
        capture_output=True,
        text=True,
        timeout=PROMPT_S,
        check=True,
    )
    body, status = done.stdout.rsplit("\n", 1)
    return int(status), json.loads(body) if body else None


def _requests() -> list[str]:
    """The page's curl lines, in order."""
    commands = shell_commands(code_blocks(EXCHANGES, "sh")[0])
    assert all(c.startswith("curl -s ") for c in commands), commands
    return commands


def _declare_route_publish(served: Served) -> None:
    """The page's requests, each answered as its table says."""
    answers = [_curl(served, c) for c in _requests()]
    statuses = [status for status, _ in answers]
    assert statuses == [201] * 8 + [200] * 3, answers
    docs = [doc for _, doc in answers]
    assert docs[0] == {
        "name": "notifications",
        "type": "fanout",
        "durable": True,
        "alternate_exchange": "",
    }
    assert (docs[1]["name"], docs[1]["type"]) == ("orders", "direct")
    assert (docs[2]["name"], docs[2]["durable"], docs[2]["ready"]) == ("billing", True, 0)
    assert (docs[3]["name"], docs[3]["durable"]) == ("live-feed", False)
    assert docs[6] == {
        "bindings": [
            {
                "exchange": "orders",
                "destination": "billing",
                "destination_kind": "queue",
                "key": "created",
                "arguments": {},
            }
        ]
    }
    fanout, created, shipped = docs[8:]
    assert sorted(fanout["queues"]) == ["billing", "live-feed"]
    assert created == {"messages": 3, "queues": ["billing"], "topics": [], "unroutable": False}
    assert shipped["queues"] == ["live-feed"]
    # The table's answers: declaring again alike is 200, with other settings 409.
    assert _curl(served, _requests()[0])[0] == 200
    status, doc = _curl(served, _requests()[0].replace('"fanout"', '"direct"'))
    assert status == 409
    assert doc["error"]["name"] == "PreconditionFailedError"
    # A routing key no binding matches: dropped, and said so; mandatory: refused.
    unroutable = _requests()[9].replace('"created"', '"cancelled"')
    assert _curl(served, unroutable)[1]["unroutable"] is True
    status, _ = _curl(
        served, unroutable.replace('"routing_key"', '"mandatory": true, "routing_key"')
    )
    assert status == 422


def _ws_url(served: Served, queue: str, prefetch: int | None = None) -> str:
    """The page's WebSocket URL, for ``queue`` (and another prefetch)."""
    (line,) = shell_commands(code_blocks(WEBSOCKET, "sh")[0])
    m = re.search(r"'(ws://[^']+)'", _on(served, line))
    assert m is not None, line
    url = m.group(1).replace("/v1/queues/billing/", f"/v1/queues/{queue}/")
    assert url.endswith("?prefetch=10")
    return url if prefetch is None else url.replace("prefetch=10", f"prefetch={prefetch}")


def _ws(url: str) -> ClientConnection:
    return connect(url, open_timeout=PROMPT_S, close_timeout=PROMPT_S)


def _frame(ws: ClientConnection, timeout: float = PROMPT_S) -> dict[str, Any]:
    frame = ws.recv(timeout=timeout)
    assert isinstance(frame, str)
    doc = json.loads(frame)
    assert isinstance(doc, dict)
    return doc


def _subscribed(ws: ClientConnection, queue: str) -> dict[str, Any]:
    first = _frame(ws)
    assert (first["type"], first["queue"]) == ("subscribed", queue), first
    return first


def _messages(ws: ClientConnection, n: int) -> list[dict[str, Any]]:
    got = [_frame(ws) for _ in range(n)]
    assert all(m["type"] == "message" for m in got), got
    return got


def _quiet(ws: ClientConnection) -> None:
    with pytest.raises(TimeoutError):
        ws.recv(timeout=QUIET_S)


def _settle(ws: ClientConnection, tags: list[int], more: int) -> list[dict[str, Any]]:
    """Ack ``tags`` over the socket; the ``settled`` answer, and the ``more`` messages the
    freed prefetch lets through (which may come before or after it)."""
    ws.send(json.dumps({"type": "ack", "tags": tags}))
    settled: list[dict[str, Any]] = []
    messages: list[dict[str, Any]] = []
    while not settled or len(messages) < more:
        frame = _frame(ws)
        (settled if frame["type"] == "settled" else messages).append(frame)
    assert settled == [{"type": "settled", "outcome": "ack", "tags": tags, "up_to": 0}]
    assert all(m["type"] == "message" for m in messages), messages
    return messages


def _documented_frames() -> dict[str, set[str]]:
    """The fields of each frame the page shows the broker sending, by type."""
    (block,) = code_blocks(WEBSOCKET, "text")
    frames = [json.loads(line[2:]) for line in block.splitlines() if line.startswith("< ")]
    return {f["type"]: set(f) for f in frames}


def test_the_settings_apply(broker: Served, data_dir: Path) -> None:
    with httpx.Client(base_url=broker.url, timeout=PROMPT_S) as http:
        # ALLOWED_HOSTS=*: any Host is answered (by default another name is refused with 421).
        r = http.get("/healthz/ready", headers={"Host": "pubsub.example.com"})
        assert r.status_code == 200
        r = http.post("/v1/topics", json={"name": "events"})
        assert r.status_code == 201
        # CHECKPOINT_IN_SECONDS=10: the topics' fsync policy.
        assert r.json()["config"]["fsync"] == "interval"
        assert r.json()["config"]["flush_interval_ms"] == 10_000
    assert (data_dir / "events-0").is_dir()  # DATABASE_NAME: the data directory


def test_exchanges_route_into_queues_and_websockets_take_them(broker: Served) -> None:
    _declare_route_publish(broker)
    documented = _documented_frames()
    with _ws(_ws_url(broker, "billing")) as billing, _ws(_ws_url(broker, "live-feed")) as feed:
        subscribed = _subscribed(billing, "billing")
        assert set(subscribed) == documented["subscribed"]
        assert subscribed["prefetch"] == 10
        _subscribed(feed, "live-feed")
        got = _messages(billing, 4)
        # The fanout message, then the direct exchange's "created" ones, in order.
        assert [(m["routing_key"], m["value"]) for m in got] == [
            ("", "maintenance at 02:00"),
            ("created", "order 1"),
            ("created", "order 2"),
            ("created", "order 3"),
        ]
        assert [m["delivery_count"] for m in got] == [1, 1, 1, 1]
        assert {m["type"]: set(m) for m in got} == {"message": documented["message"]}
        _quiet(billing)
        assert [m["value"] for m in _messages(feed, 2)] == [
            "maintenance at 02:00",
            "order 0 shipped",
        ]
        # Acked over the socket, as the page shows.
        billing.send(json.dumps({"type": "ack", "tags": [got[0]["tag"]]}))
        settled = _frame(billing)
        assert set(settled) == documented["settled"]
        assert settled["tags"] == [got[0]["tag"]]
    # The socket closed holding three: they are back, delivered again first.
    with _ws(_ws_url(broker, "billing")) as billing:
        _subscribed(billing, "billing")
        again = _messages(billing, 3)
        assert [m["value"] for m in again] == ["order 1", "order 2", "order 3"]
        assert [(m["delivery_count"], m["redelivered"]) for m in again] == [(2, True)] * 3


def test_the_commands(broker: Served) -> None:
    table = section("### Exchanges, queues and bindings").split("The same from the command line")[1]
    commands = [code_span(cell) for cell in table_column(table, 1)]
    outputs = []
    for command in commands:
        words = shlex.split(command)
        assert words[0] == "tidewire", command
        result = run_cli([*words[1:], "--addr", broker.addr])
        assert result.exit_code == 0, (command, result.stdout, result.stderr)
        outputs.append(result.stdout.strip())
    assert outputs == [
        "declared fanout exchange 'notifications'",
        "declared direct exchange 'orders'",
        "declared durable queue 'billing'",
        "declared transient queue 'live-feed'",
        "bound exchange 'orders' to queue 'billing' with key 'created'",
        "published to exchange orders with routing key 'created': queue billing",
        "order 4",
    ]
    with httpx.Client(base_url=broker.url, timeout=PROMPT_S) as http:
        # The transient queue outlives the command that declared it; the message was acked.
        live = http.get("/v1/queues/live-feed").json()
        assert (live["durable"], live["ready"]) == (False, 0)
        billing = http.get("/v1/queues/billing").json()
        assert (billing["ready"], billing["unacked"], billing["counters"]["acked"]) == (0, 0, 1)


def _wait_for(http: httpx.Client, queue: str, ready: int, unacked: int) -> None:
    """Poll the queue's counts until they are these (the broker's state, seen from outside)."""
    deadline = time.monotonic() + PROMPT_S
    while True:
        doc = http.get(f"/v1/queues/{queue}").json()
        if (doc["ready"], doc["unacked"]) == (ready, unacked):
            return
        assert time.monotonic() < deadline, doc
        time.sleep(0.05)


@pytest.mark.parametrize("stop", ["clean", "crash"])
def test_a_restart_keeps_the_durable_queue_and_forgets_the_other(data_dir: Path, stop: str) -> None:
    with serving(env=_env(data_dir)) as first:
        _declare_route_publish(first)
        with httpx.Client(base_url=first.url, timeout=PROMPT_S) as http:
            # Ten more: with prefetch 10, some are never delivered before the stop.
            r = http.post(
                "/v1/exchanges/orders/publish",
                json={
                    "routing_key": "created",
                    "messages": [{"value": f"order {i}"} for i in range(4, 14)],
                },
            )
            assert r.status_code == 200, r.text
            with (
                _ws(_ws_url(first, "billing")) as billing,
                _ws(_ws_url(first, "live-feed")) as feed,
            ):
                _subscribed(billing, "billing")
                _subscribed(feed, "live-feed")
                got = _messages(billing, 10)
                assert [m["value"] for m in got] == [
                    "maintenance at 02:00",
                    *(f"order {i}" for i in range(1, 10)),
                ]
                # Two acked; the two next come in their place; ten are held unacked.
                more = _settle(billing, [got[0]["tag"], got[1]["tag"]], more=2)
                assert [m["value"] for m in more] == ["order 10", "order 11"]
                shipped = _messages(feed, 2)[1]
                _settle(feed, [shipped["tag"]], more=0)
                _wait_for(http, "billing", ready=2, unacked=10)
                _wait_for(http, "live-feed", ready=0, unacked=1)
                # Stopped while the subscribers still hold their messages.
                if stop == "crash":
                    first.proc.send_signal(signal.SIGKILL)
                else:
                    first.proc.terminate()
                assert first.proc.wait(timeout=STARTUP_S) in (0, -signal.SIGKILL)

    with (
        serving(env=_env(data_dir)) as second,
        httpx.Client(base_url=second.url, timeout=PROMPT_S) as http,
    ):
        # The page's table: the transient queue is gone, with its bindings.
        assert http.get("/v1/queues/live-feed").status_code == 404
        kinds = {e["name"]: e["type"] for e in http.get("/v1/exchanges").json()["exchanges"]}
        assert (kinds["notifications"], kinds["orders"]) == ("fanout", "direct")
        bindings = {
            (b["exchange"], b["destination"], b["key"])
            for b in http.get("/v1/bindings").json()["bindings"]
        }
        assert bindings == {("notifications", "billing", ""), ("orders", "billing", "created")}
        doc = http.get("/v1/queues/billing").json()
        assert (doc["durable"], doc["ready"], doc["unacked"]) == (True, 12, 0)

        with _ws(_ws_url(second, "billing", prefetch=20)) as billing:
            _subscribed(billing, "billing")
            back = _messages(billing, 12)
            # Everything not acked, in order; the two acked ones are not there.
            assert [m["value"] for m in back] == [f"order {i}" for i in range(2, 14)]
            counts = [m["delivery_count"] for m in back]
            # The ten held at the stop, then the two never delivered. A clean stop
            # recorded the first delivery; a crash cut it before it was recorded.
            held = 2 if stop == "clean" else 1
            assert counts == [held] * 10 + [1, 1]
            assert [m["redelivered"] for m in back] == [held > 1] * 10 + [False] * 2
            _quiet(billing)
            # The durable bindings still route.
            r = http.post(
                "/v1/exchanges/orders/publish",
                json={"routing_key": "created", "messages": [{"value": "order 14"}]},
            )
            assert r.json()["queues"] == ["billing"]
            assert _frame(billing)["value"] == "order 14"
