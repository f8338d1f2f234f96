"""The iPubSub compatibility mode, driven with the requests iPubSub's API design documents
(``POST /api/v1/streams/send`` with its example body, ``GET /api/v1/streams/receive?
streamId=user-notifications&timeoutSeconds=30``) and answered with its statuses and shapes:
long-poll with 424 on timeout and the default timeout when none is given, each message
received once, messageUuid deduplication, the circular buffer, blocking and synchronous
sends, replay from the "DB" with resume tokens, per-message TTL (on a fake clock), and
400/413 for bad requests. The mode runs on tidewire's lightweight streams: a stream is the
tidewire stream of the same id (no topic), writeToDB messages are its persistent ones."""

from __future__ import annotations

import asyncio
import re
import socket
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.http_stream._support import PROMPT_S, gateway
from tidewire.embedded import EmbeddedBroker
from tidewire.server.http.compat.ipubsub import create_ipubsub_app
from tidewire.server.http.config import HttpConfig
from tidewire.server.http.gateway import HttpGateway

#: The send request of iPubSub's API design document.
DOCUMENTED_SEND = {
    "streamId": "user-notifications",
    "messageUuid": "123e4567-e89b-12d3-a456-426614174000",
    "message": {"type": "welcome", "userId": 123},
    "inMemoryStreamSize": 100,
    "blockingSendTimeoutSeconds": 30,
    "writeToDB": False,
    "dbTTLSeconds": 86400,
}
RFC3339 = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$")


def base(eb: EmbeddedBroker) -> str:
    assert eb.gateway is not None
    return f"http://127.0.0.1:{eb.gateway.port_of('ipubsub')}/api/v1/streams"


def send(eb: EmbeddedBroker, **fields: Any) -> httpx.Response:
    return httpx.post(f"{base(eb)}/send", json=fields, timeout=PROMPT_S + 40)


def receive(eb: EmbeddedBroker, stream: str, **params: Any) -> httpx.Response:
    return httpx.get(
        f"{base(eb)}/receive", params={"streamId": stream, **params}, timeout=PROMPT_S + 40
    )


def test_the_documented_send_and_receive(tmp_path: Path) -> None:
    with gateway(tmp_path, http_ipubsub_port=0) as eb:
        assert send(eb, **DOCUMENTED_SEND).status_code == 200
        # GET /api/v1/streams/receive?streamId=user-notifications&timeoutSeconds=30
        r = receive(eb, "user-notifications", timeoutSeconds=30)
        assert r.status_code == 200
        body = r.json()
        assert body["messageUuid"] == "123e4567-e89b-12d3-a456-426614174000"
        assert body["message"] == {"type": "welcome", "userId": 123}
        assert RFC3339.match(body["timestamp"])
        assert "dbResumeToken" not in body  # only for messages written to the DB
        r = receive(eb, "user-notifications", timeoutSeconds=0)
        assert r.status_code == 424
        assert r.json() == {"error": "long poll waiting timeout"}


def test_any_json_message_and_the_long_poll_wakes_on_send(tmp_path: Path) -> None:
    with gateway(tmp_path, http_ipubsub_port=0) as eb, ThreadPoolExecutor(1) as pool:
        waiting = pool.submit(receive, eb, "chat:room-1", timeoutSeconds=20)
        time.sleep(0.3)  # let the receive start waiting (the stream is created by it)
        t0 = time.monotonic()
        assert send(eb, streamId="chat:room-1", messageUuid="m1", message=[1, "two", None])
        r = waiting.result(timeout=PROMPT_S)
        assert time.monotonic() - t0 < 5
        assert (r.status_code, r.json()["message"]) == (200, [1, "two", None])


def test_the_default_timeout_applies_when_none_is_given(tmp_path: Path) -> None:
    with gateway(tmp_path, http_ipubsub_port=0) as eb, ThreadPoolExecutor(1) as pool:
        waiting = pool.submit(receive, eb, "s")
        with pytest.raises(TimeoutError):  # not answered at once: it long-polls (30 s)
            waiting.result(timeout=1.0)
        send(eb, streamId="s", messageUuid="late", message="hi")
        assert waiting.result(timeout=PROMPT_S).json()["message"] == "hi"


def test_each_message_is_received_once_and_uuids_deduplicate(tmp_path: Path) -> None:
    with gateway(tmp_path, http_ipubsub_port=0) as eb:
        for i in range(20):
            assert send(eb, streamId="jobs", messageUuid=f"u{i}", message=i).status_code == 200
        assert send(eb, streamId="jobs", messageUuid="u3", message="again").status_code == 200
        with ThreadPoolExecutor(8) as pool:
            answers = list(pool.map(lambda _: receive(eb, "jobs", timeoutSeconds=1), range(28)))
    got = sorted(r.json()["message"] for r in answers if r.status_code == 200)
    assert got == list(range(20))
    assert sum(r.status_code == 424 for r in answers) == 8


def test_dedup_and_once_only_survive_a_restart(tmp_path: Path) -> None:
    """Messages written to the DB (persistent stream messages) and their uuids survive a
    restart, and one received before it is not received again; one kept in memory only
    (writeToDB false) does not survive it."""
    with gateway(tmp_path, http_ipubsub_port=0) as eb:
        send(eb, streamId="d", messageUuid="a", message=1, writeToDB=True)
        send(eb, streamId="d", messageUuid="b", message=2, writeToDB=True)
        send(eb, streamId="d", messageUuid="c", message="memory only")
        assert receive(eb, "d", timeoutSeconds=0).json()["message"] == 1
    with gateway(tmp_path, http_ipubsub_port=0) as eb:
        send(eb, streamId="d", messageUuid="a", message="dup", writeToDB=True)
        assert receive(eb, "d", timeoutSeconds=0).json()["message"] == 2
        assert receive(eb, "d", timeoutSeconds=0).status_code == 424


def test_circular_buffer_keeps_the_newest(tmp_path: Path) -> None:
    with gateway(tmp_path, http_ipubsub_port=0) as eb:
        for i in range(5):
            send(eb, streamId="ring", messageUuid=f"r{i}", message=i, inMemoryStreamSize=3)
        got = [receive(eb, "ring", timeoutSeconds=0) for _ in range(4)]
    assert [r.json()["message"] for r in got[:3]] == [2, 3, 4]
    assert got[3].status_code == 424


def test_blocking_and_synchronous_sends(tmp_path: Path) -> None:
    with gateway(tmp_path, http_ipubsub_port=0) as eb, ThreadPoolExecutor(2) as pool:
        full = {"inMemoryStreamSize": 1, "blockingSendTimeoutSeconds": 1}
        assert send(eb, streamId="b", messageUuid="1", message=1, **full).status_code == 200
        r = send(eb, streamId="b", messageUuid="2", message=2, **full)
        assert r.status_code == 424
        assert "full" in r.json()["error"]
        sync = {"inMemoryStreamSize": 0, "blockingSendTimeoutSeconds": 1}
        assert send(eb, streamId="sync", messageUuid="x", message=0, **sync).status_code == 424
        waiting = pool.submit(receive, eb, "sync", timeoutSeconds=20)
        sync["blockingSendTimeoutSeconds"] = 10  # waits for the receiver to arrive
        assert send(eb, streamId="sync", messageUuid="y", message="go", **sync).status_code == 200
        assert waiting.result(timeout=PROMPT_S).json()["message"] == "go"


def test_replay_from_the_db_with_resume_tokens(tmp_path: Path) -> None:
    with gateway(tmp_path, http_ipubsub_port=0) as eb:
        for i in range(3):
            send(eb, streamId="hist", messageUuid=f"h{i}", message=i, writeToDB=True)
        send(eb, streamId="hist", messageUuid="mem", message="memory only")
        seen = []
        token = ""
        while True:
            r = receive(eb, "hist", readFromDB="true", dbResumeToken=token, timeoutSeconds=0)
            if r.status_code == 424:
                break
            seen.append(r.json()["message"])
            token = r.json()["dbResumeToken"]
        assert seen == [0, 1, 2]
        # Replaying takes nothing: every message is still received once, in order.
        got = [receive(eb, "hist", timeoutSeconds=0).json()["message"] for _ in range(4)]
        assert got == [0, 1, 2, "memory only"]
        bad = receive(eb, "hist", readFromDB="true", dbResumeToken="nonsense")
        assert bad.status_code == 400


def test_per_message_ttl_on_a_fake_clock(tmp_path: Path) -> None:
    now = [1_800_000_000_000]

    async def main() -> list[int]:
        eb = EmbeddedBroker(str(tmp_path), listen=False)
        eb.broker.stream_clock = lambda: now[0]  # the stream manager's time
        async with eb:
            gw = HttpGateway()
            app = create_ipubsub_app(eb.broker, max_body_bytes=1 << 20)
            gw.add_app("ipubsub", app, "127.0.0.1", 0)
            async with gw, httpx.AsyncClient() as client:
                url = f"http://127.0.0.1:{gw.port_of('ipubsub')}/api/v1/streams"
                for uuid, ttl in (("short", 10), ("long", 1000)):
                    body = {
                        "streamId": "ttl",
                        "messageUuid": uuid,
                        "message": uuid,
                        "writeToDB": True,
                        "dbTTLSeconds": ttl,
                    }
                    assert (await client.post(f"{url}/send", json=body)).status_code == 200
                now[0] += 11_000  # "short" has expired, "long" has not
                q = {"streamId": "ttl", "timeoutSeconds": 0}
                replay = await client.get(f"{url}/receive", params={**q, "readFromDB": "true"})
                first = await client.get(f"{url}/receive", params=q)
                second = await client.get(f"{url}/receive", params=q)
                assert replay.json()["message"] == "long"
                assert first.json()["message"] == "long"
                eb.broker.streams.tick()  # the expired message leaves the index
                info = eb.broker.streams.describe("ttl")
                assert info is not None
                assert info.persistent == 1  # "long" stays readable until it expires
                return [first.status_code, second.status_code]

    assert asyncio.run(main()) == [200, 424]


@pytest.mark.parametrize(
    ("body", "status", "words"),
    [
        (b"not json", 400, "not JSON"),
        (b"[1]", 400, "JSON object"),
        (b'{"messageUuid": "u", "message": 1}', 400, "streamId must be"),
        (b'{"streamId": "s", "message": 1}', 400, "messageUuid must be"),
        (b'{"streamId": "s", "messageUuid": "u"}', 400, "message is required"),
        (b'{"streamId": "s", "messageUuid": "u", "message": 1, "writeToDB": "yes"}', 400, ""),
        (b'{"streamId": "s", "messageUuid": "u", "message": 1, "dbTTLSeconds": 0}', 400, ""),
        (b'{"streamId": "s", "messageUuid": "u", "message": "' + b"x" * 2000 + b'"}', 413, ""),
    ],
)
def test_bad_sends(tmp_path: Path, body: bytes, status: int, words: str) -> None:
    with gateway(tmp_path, http_ipubsub_port=0, http_max_body_bytes=1024) as eb:
        r = httpx.post(f"{base(eb)}/send", content=body, timeout=PROMPT_S)
    assert r.status_code == status
    assert words in r.json()["error"]


@pytest.mark.parametrize(
    ("params", "words"),
    [
        ({}, "streamId is required"),
        ({"streamId": "s", "timeoutSeconds": "soon"}, "invalid timeoutSeconds"),
        ({"streamId": "s", "timeoutSeconds": "-1"}, "invalid timeoutSeconds"),
        ({"streamId": "s", "readFromDB": "maybe"}, "invalid readFromDB"),
    ],
)
def test_bad_receives(tmp_path: Path, params: dict[str, str], words: str) -> None:
    with gateway(tmp_path, http_ipubsub_port=0) as eb:
        r = httpx.get(f"{base(eb)}/receive", params=params, timeout=PROMPT_S)
    assert r.status_code == 400
    assert words in r.json()["error"]


def test_a_refused_send_creates_no_stream(tmp_path: Path) -> None:
    """A send refused with 413 (over the body limit, or a message over the broker's
    stream_max_message_bytes) or 400 leaves no stream behind."""
    eb = EmbeddedBroker(
        str(tmp_path),
        http=HttpConfig(http_port=0, http_ipubsub_port=0, http_max_body_bytes=4096),
        stream_max_message_bytes=1000,
    )
    with eb.running():
        r = send(eb, streamId="huge", messageUuid="u1", message="x" * 5000)
        assert r.status_code == 413
        r = send(eb, streamId="big", messageUuid="u1", message="x" * 2000)
        assert r.status_code == 413
        assert "stream_max_message_bytes=1,000" in r.json()["error"]
        assert send(eb, streamId="bad", messageUuid="u1").status_code == 400
        assert streams_of(eb) == []
        assert send(eb, streamId="big", messageUuid="u2", message="small").status_code == 200
        assert streams_of(eb) == ["big"]
        got = receive(eb, "big", timeoutSeconds=0)
        assert (got.status_code, got.json()["message"]) == (200, "small")
        assert eb.broker.topics() == {}  # streams are no topics
    assert [p.name for p in tmp_path.iterdir() if p.is_dir() and p.name[:2] != "__"] == []


def streams_of(eb: EmbeddedBroker) -> list[str]:
    async def ids() -> list[str]:
        return [i.stream for i in eb.broker.streams.list()]

    return asyncio.run_coroutine_threadsafe(ids(), eb.loop).result(PROMPT_S)


def test_an_abandoned_receive_takes_nothing(tmp_path: Path) -> None:
    """A receiver that goes away while it waits takes nothing: the next message stays for
    the next receiver."""
    with gateway(tmp_path, http_ipubsub_port=0) as eb:
        assert eb.gateway is not None
        port = eb.gateway.port_of("ipubsub")
        with socket.create_connection(("127.0.0.1", port), timeout=PROMPT_S) as quitter:
            quitter.sendall(
                b"GET /api/v1/streams/receive?streamId=left&timeoutSeconds=30 HTTP/1.1\r\n"
                b"Host: 127.0.0.1\r\n\r\n"
            )
            until_receivers(eb, "left", 1)
        until_receivers(eb, "left", 0)
        assert send(eb, streamId="left", messageUuid="u", message="kept").status_code == 200
        assert receive(eb, "left", timeoutSeconds=0).json()["message"] == "kept"


def until_receivers(eb: EmbeddedBroker, stream: str, n: int) -> None:
    async def receivers() -> int:
        info = eb.broker.streams.describe(stream)
        return 0 if info is None else info.receivers

    deadline = time.monotonic() + PROMPT_S
    while time.monotonic() < deadline:
        if asyncio.run_coroutine_threadsafe(receivers(), eb.loop).result(PROMPT_S) == n:
            return
        time.sleep(0.02)
    raise AssertionError(f"never {n} receivers on {stream!r}")
