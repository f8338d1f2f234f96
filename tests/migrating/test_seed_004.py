"""iPubSub's README, example by example, as docs/migrating.md translates it ("From iPubSub"),
run against a real ``tidewire serve`` started from the page's configuration file, with the
iPubSub compatibility listener on a free port.

The documented requests are sent as written, with only the port changed (the page says 8090;
a test takes a free one). Every command the section shows is run here
(:func:`test_every_documented_command_is_run`).
"""

from __future__ import annotations

import contextlib
import json
import re
from collections.abc import Iterator
from pathlib import Path

import httpx

from tests.migrating._compat_doc import (
    Served,
    code_block,
    documented_commands,
    section,
    serve,
    shell,
)

SECTION = section("From iPubSub (004)")
# The page's commands, as it writes them.
SEND = (
    "curl -X POST http://localhost:8090/api/v1/streams/send -H 'Content-Type: application/json'"
    ' -d \'{"streamId": "user-notifications", "messageUuid": "msg-123", "message": {"type":'
    ' "welcome", "userId": 123}, "writeToDB": false, "inMemoryStreamSize": 100}\''
)
RECEIVE = (
    "curl 'http://localhost:8090/api/v1/streams/receive?streamId=user-notifications"
    "&timeoutSeconds=30'"
)
RUN = {SEND, RECEIVE}
#: The message of iPubSub's example.
MESSAGE = {"type": "welcome", "userId": 123}
RFC3339 = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z")


def documented(command: str) -> str:
    assert command in documented_commands(SECTION), f"not in docs/migrating.md: {command}"
    return command


def at(command: str, served: Served) -> str:
    """A documented command against this test's listener."""
    return documented(command).replace("localhost:8090", f"localhost:{served.port('ipubsub')}")


@contextlib.contextmanager
def ipubsub_serve(tmp_path: Path) -> Iterator[Served]:
    """``tidewire serve --config tidewire.toml`` with the page's file (its data directory and
    port made the test's own)."""
    assert "`tidewire serve --config tidewire.toml`" in SECTION
    toml = code_block(SECTION, "toml")
    assert 'data_dir = "./tidewire-data"' in toml
    assert "http_ipubsub_port = 8090" in toml
    toml = toml.replace("./tidewire-data", str(tmp_path / "data")).replace("8090", "0")
    (tmp_path / "tidewire.toml").write_text(toml, encoding="utf-8")
    with serve("--config", str(tmp_path / "tidewire.toml")) as served:
        assert set(served.urls) == {"ipubsub"}
        yield served


def test_the_readme_request_unchanged(tmp_path: Path) -> None:
    """The page's HTTP request, as iPubSub's README writes it: 200 {}; then a receive."""
    request = code_block(SECTION, "http")
    head, _, body = request.partition("\n\n")
    request_line, *header_lines = head.splitlines()
    method, path = request_line.split()
    headers = dict(line.split(": ", 1) for line in header_lines)
    assert (method, path, headers) == (
        "POST",
        "/api/v1/streams/send",
        {"Content-Type": "application/json"},
    )
    with ipubsub_serve(tmp_path) as served:
        base = served.urls["ipubsub"]
        r = httpx.request(method, base + path, headers=headers, content=body.encode())
        assert (r.status_code, r.json()) == (200, {})
        r = httpx.get(
            f"{base}/api/v1/streams/receive",
            params={"streamId": "user-notifications", "timeoutSeconds": 30},
        )
        assert r.status_code == 200
        assert r.json()["messageUuid"] == "msg-123"
        assert r.json()["message"] == MESSAGE


def test_the_curl_session(tmp_path: Path) -> None:
    """Send with curl (JSON), receive with curl; a resent uuid is stored once; an empty
    stream answers 424 after the timeout; curl's -d alone (a form) is 415 naming --json."""
    with ipubsub_serve(tmp_path) as served:
        assert json.loads(shell(at(SEND, served))) == {}
        assert json.loads(shell(at(SEND, served))) == {}  # the same messageUuid: stored once
        got = json.loads(shell(at(RECEIVE, served)))
        assert set(got) == {"messageUuid", "message", "timestamp"}
        assert (got["messageUuid"], got["message"]) == ("msg-123", MESSAGE)
        assert RFC3339.fullmatch(got["timestamp"])

        base = f"{served.urls['ipubsub']}/api/v1/streams"
        r = httpx.get(
            f"{base}/receive", params={"streamId": "user-notifications", "timeoutSeconds": 1}
        )
        assert (r.status_code, r.json()) == (424, {"error": "long poll waiting timeout"})

        # The one-line change the page names: without the JSON type, curl -d sends a form.
        as_form = at(SEND, served).replace(" -H 'Content-Type: application/json'", "")
        done = shell(as_form + " -s -o /dev/null -w '%{http_code}'")
        assert done == "415"
        r = httpx.post(f"{base}/send", content=b'{"streamId": "s"}', headers=_FORM)
        assert r.status_code == 415
        assert "--json" in r.json()["error"]
        # A field missing: 400 with iPubSub's error document.
        r = httpx.post(f"{base}/send", json={"streamId": "s"})
        assert r.status_code == 400
        assert "messageUuid" in r.json()["error"]


_FORM = {"Content-Type": "application/x-www-form-urlencoded"}


def test_write_to_db_and_replay_with_resume_tokens(tmp_path: Path) -> None:
    """writeToDB: the message carries a dbResumeToken, and readFromDB replays the stream from
    a token without taking its messages."""
    with ipubsub_serve(tmp_path) as served:
        base = f"{served.urls['ipubsub']}/api/v1/streams"
        for n in (1, 2):
            body = {"streamId": "log", "messageUuid": f"m{n}", "message": {"n": n}}
            r = httpx.post(f"{base}/send", json={**body, "writeToDB": True})
            assert r.status_code == 200
        q = {"streamId": "log", "readFromDB": "true", "timeoutSeconds": 1}
        first = httpx.get(f"{base}/receive", params=q).json()
        assert first["message"] == {"n": 1}
        second = httpx.get(
            f"{base}/receive", params={**q, "dbResumeToken": first["dbResumeToken"]}
        ).json()
        assert second["message"] == {"n": 2}
        # Replaying took nothing: a receive still gets the first message.
        r = httpx.get(f"{base}/receive", params={"streamId": "log", "timeoutSeconds": 1})
        assert r.json()["message"] == {"n": 1}
        assert "dbResumeToken" in r.json()


def test_the_default_stream_size_is_ipubsubs(tmp_path: Path) -> None:
    """inMemoryStreamSize defaults to 100, as iPubSub's: the 101st unreceived message drops the
    oldest (a circular buffer)."""
    with ipubsub_serve(tmp_path) as served:
        base = f"{served.urls['ipubsub']}/api/v1/streams"
        with httpx.Client() as client:
            for n in range(101):
                body = {"streamId": "ring", "messageUuid": f"u{n}", "message": n}
                assert client.post(f"{base}/send", json=body).status_code == 200
            r = client.get(f"{base}/receive", params={"streamId": "ring", "timeoutSeconds": 1})
        assert r.json()["message"] == 1  # message 0 was dropped


def test_every_documented_command_is_run() -> None:
    """The page's iPubSub section shows exactly the commands these tests run."""
    assert documented_commands(SECTION) == RUN
