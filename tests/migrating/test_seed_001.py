"""VarthanV's pub-sub (seed 001): its settings as the page translates them (read from the
page), and its exchanges, queues and WebSocket subscriptions as the page maps them onto
topics, consumer groups and the WebSocket stream, against a real ``tidewire serve``."""

from __future__ import annotations

import json
import shlex
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from websockets.sync.client import ClientConnection, connect

from tests.migrating._support import Served, code_blocks, section, serving, terminate

#: The bound on anything that should happen at once (s), generous for a loaded machine.
PROMPT_S = 30.0
#: How long a check that nothing (more) arrives waits (s).
QUIET_S = 0.5

SEED = section("## From varthanv pub-sub (001)")


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


def _ws(served: Served, topic: str, query: str) -> ClientConnection:
    url = f"ws://127.0.0.1:{served.http_port}/v1/topics/{topic}/stream?{query}"
    return connect(url, open_timeout=PROMPT_S, close_timeout=PROMPT_S)


def _frame(ws: ClientConnection, timeout: float = PROMPT_S) -> dict[str, Any]:
    frame = ws.recv(timeout=timeout)
    assert isinstance(frame, str)
    doc = json.loads(frame)
    assert isinstance(doc, dict)
    return doc


def _subscribed(ws: ClientConnection) -> dict[str, Any]:
    first = _frame(ws)
    assert first["type"] == "subscribed", first
    return first


def _quiet(ws: ClientConnection) -> None:
    with pytest.raises(TimeoutError):
        ws.recv(timeout=QUIET_S)


def _publish(http: httpx.Client, topic: str, doc: dict[str, Any]) -> None:
    r = http.post(f"/v1/topics/{topic}/messages", json=doc)
    assert r.status_code == 201, r.text


def test_the_settings_apply(broker: Served, data_dir: Path) -> None:
    with httpx.Client(base_url=broker.url, timeout=PROMPT_S) as http:
        # ALLOWED_HOSTS=*: any Host is answered (by default another name is refused with 421).
        r = http.get("/healthz/ready", headers={"Host": "pubsub.example.com"})
        assert r.status_code == 200
        r = http.post("/v1/topics", json={"name": "events"})
        assert r.status_code == 201
        # CHECKPOINT_IN_SECONDS=10: the topic's fsync policy.
        assert r.json()["config"]["fsync"] == "interval"
        assert r.json()["config"]["flush_interval_ms"] == 10_000
    assert (data_dir / "events-0").is_dir()  # DATABASE_NAME: the data directory


def test_fanout_exchange_is_a_topic_read_by_one_group_per_queue(broker: Served) -> None:
    with httpx.Client(base_url=broker.url, timeout=PROMPT_S) as http:
        assert http.post("/v1/topics", json={"name": "notifications"}).status_code == 201
        with (
            _ws(broker, "notifications", "group=email") as email,
            _ws(broker, "notifications", "group=sms") as sms,
        ):
            _subscribed(email)
            _subscribed(sms)
            _publish(http, "notifications", {"payload": "order shipped"})
            for queue in (email, sms):
                msg = _frame(queue)
                assert (msg["type"], msg["value"]) == ("message", "order shipped")


def test_direct_exchange_is_a_topic_per_routing_key(broker: Served) -> None:
    with httpx.Client(base_url=broker.url, timeout=PROMPT_S) as http:
        for key in ("eu", "us"):
            assert http.post("/v1/topics", json={"name": f"orders.{key}"}).status_code == 201
        with _ws(broker, "orders.eu", "group=eu-orders") as eu_queue:
            _subscribed(eu_queue)
            _publish(http, "orders.us", {"value": "for us"})
            _publish(http, "orders.eu", {"value": "for eu"})
            assert _frame(eu_queue)["value"] == "for eu"
            _quiet(eu_queue)


def test_a_durable_queue_is_a_group_that_resumes_after_a_restart(data_dir: Path) -> None:
    with serving(env=_env(data_dir)) as first:
        with httpx.Client(base_url=first.url, timeout=PROMPT_S) as http:
            assert http.post("/v1/topics", json={"name": "jobs"}).status_code == 201
            with _ws(first, "jobs", "group=workers") as queue:
                _subscribed(queue)
                for i in range(3):
                    _publish(http, "jobs", {"value": f"job-{i}"})
                assert [_frame(queue)["value"] for _ in range(3)] == ["job-0", "job-1", "job-2"]
                queue.send(json.dumps({"type": "commit"}))
                committed = _frame(queue)
                assert committed == {
                    "type": "committed",
                    "offsets": [{"partition": 0, "offset": 3}],
                }
            _publish(http, "jobs", {"value": "job-3"})  # while nobody reads the queue
        terminate(first)

    with serving(env=_env(data_dir)) as second:
        with _ws(second, "jobs", "group=workers") as queue:
            assert _subscribed(queue)["partitions"] == [{"partition": 0, "offset": 3}]
            assert _frame(queue)["value"] == "job-3"
            _quiet(queue)
        # A non-durable queue (no group) starts from now.
        with (
            httpx.Client(base_url=second.url, timeout=PROMPT_S) as http,
            _ws(second, "jobs", "from=latest") as transient,
        ):
            _subscribed(transient)
            _publish(http, "jobs", {"value": "job-4"})
            assert _frame(transient)["value"] == "job-4"
