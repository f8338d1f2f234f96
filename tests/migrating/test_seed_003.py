"""msgbus' README, example by example, as docs/migrating.md translates it ("From msgbus"), run
against a real ``tidewire serve`` with the msgbus compatibility listener on a free port.

The documented commands are run as written, with only the port changed (the page says 8000; a
test takes a free one): ``localhost:8000`` in a URL becomes the listener's port, and the client
commands get ``--uri`` for it (their default is ``http://localhost:8000``). Every command the
section shows is run by one of these tests (:func:`test_every_documented_command_is_run`).
"""

from __future__ import annotations

import base64
import contextlib
import json
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
from websockets.sync.client import connect

from tests.cli._support import (
    STARTUP_S,
    closed_port,
    run_cli,
    sigint_as_at_a_terminal,
    subprocess_env,
)
from tests.migrating._compat_doc import (
    Served,
    code_block,
    documented_commands,
    section,
    serve,
    shell,
)

SECTION = section("From msgbus (003)")
#: A line msgbus' client prints for a message.
LINE = re.compile(
    r"\d{4}/\d\d/\d\d \d\d:\d\d:\d\d \[msgbus\] received message: "
    r"id=(\d+) topic=(\S+) payload=(.*)"
)
# The page's commands, as it writes them; each is run by a test below.
SERVE = "tidewire serve --http-msgbus-port 8000"
HELLO = "python hello.py"
SUB = "tidewire sub foo"
PUB_HI = "tidewire pub foo hi"
PUB_BYE = "tidewire pub foo bye"
PULL = "tidewire pull foo"
CURL_PUT = 'curl -q -o - -X PUT -d \'{"message": "hello"}\' http://localhost:8000/hello'
CURL_GET = "curl -q -o - http://localhost:8000/hello"
DECODE = "echo 'eyJtZXNzYWdlIjogImhlbGxvIn0=' | base64 -d"
CURL_LIST = "curl -q -o - http://localhost:8000/ | jq '.'"
RUN = {SERVE, HELLO, SUB, PUB_HI, PUB_BYE, PULL, CURL_PUT, CURL_GET, DECODE, CURL_LIST}
#: Commands the tests cannot run as written: installing the package they test.
NOT_RUN = {"pip install tidewire"}


def documented(command: str) -> str:
    """``command`` as docs/migrating.md shows it (failing if it does not)."""
    assert command in documented_commands(SECTION), f"not in docs/migrating.md: {command}"
    return command


def at(command: str, served: Served) -> str:
    """A documented shell command against this test's listener."""
    return documented(command).replace("localhost:8000", f"localhost:{served.port('msgbus')}")


def tidewire(command: str, served: Served) -> list[str]:
    """A documented ``tidewire pub|sub|pull`` command, as argv, at this test's listener."""
    args = documented(command).split()[1:]
    uri = f"http://localhost:{served.port('msgbus')}"
    return [sys.executable, "-m", "tidewire", *args, "--uri", uri]


def run(argv: list[str], stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    """A client command to its end: exit code, stdout and stderr."""
    return subprocess.run(
        argv,
        input=stdin,
        capture_output=True,
        text=True,
        timeout=STARTUP_S,
        env=subprocess_env(),
        check=False,
    )


def msgbus_serve(tmp_path: Path, *more: str) -> contextlib.AbstractContextManager[Served]:
    """The page's ``tidewire serve --http-msgbus-port 8000``, on free ports."""
    args = documented(SERVE).split()[2:]
    args[args.index("8000")] = "0"
    return serve("--data-dir", str(tmp_path / "data"), *args, *more)


def test_the_library_example(tmp_path: Path) -> None:
    """hello.go's Put and Get, as the page's Python program: the message comes back once."""
    (tmp_path / "hello.py").write_text(code_block(SECTION, "python"), encoding="utf-8")
    documented(HELLO)

    def run() -> str:
        done = subprocess.run(
            [sys.executable, "hello.py"],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=STARTUP_S * 2,
            env=subprocess_env(),
            check=True,
        )
        return done.stdout

    assert run() == "Received message: id=0 topic=foo payload=Hello World!\n"
    # Durable, as the page says: a second run puts a second message and gets it.
    assert run() == "Received message: id=1 topic=foo payload=Hello World!\n"


def test_the_http_session(tmp_path: Path) -> None:
    """The README's curl session: publish, pop, decode, list, with msgbus' answers."""
    with msgbus_serve(tmp_path) as served:
        out = shell(at(CURL_PUT, served))
        assert out == "message successfully published to hello with sequence 1"
        msg = json.loads(shell(at(CURL_GET, served)))
        assert msg["id"] == 0
        assert msg["payload"] == "eyJtZXNzYWdlIjogImhlbGxvIn0="
        assert msg["topic"]["name"] == "hello"
        assert msg["topic"]["ttl"] == 60_000_000_000  # msgbus' 60 s, in ns
        assert msg["topic"]["seq"] == 1
        decoded = shell(documented(DECODE))
        assert decoded == '{"message": "hello"}'
        listing = json.loads(shell(at(CURL_LIST, served)))
        assert list(listing) == ["hello"]
        assert listing["hello"]["ttl"] == 60_000_000_000
        assert listing["hello"]["seq"] == 1
        assert set(listing["hello"]) == {"name", "ttl", "seq", "created"}

        base = served.urls["msgbus"]
        # The route table: the queue is empty now (404, msgbus' text); POST publishes too;
        # DELETE is not served; an unknown topic is 404.
        r = httpx.get(f"{base}/hello")
        assert (r.status_code, r.text) == (404, "no messages enqueued for topic: hello")
        r = httpx.post(f"{base}/hello", content=b"again", headers={"Content-Type": "text/plain"})
        assert r.status_code == 202
        assert r.text == "message successfully published to hello with sequence 2"
        assert httpx.delete(f"{base}/hello").status_code == 405
        assert httpx.get(f"{base}/nope").status_code == 404


def test_msgbus_default_payload_limit(tmp_path: Path) -> None:
    """msgbus' 8 KB default: 8,192 bytes are taken, 9,000 are refused with 413 and nothing is
    stored; the setting raises it, as msgbus' WithMaxPayloadSize."""
    with msgbus_serve(tmp_path) as served:
        url = f"{served.urls['msgbus']}/big"
        assert httpx.put(url, content=b"x" * 8192).status_code == 202
        r = httpx.put(url, content=b"x" * 9000)
        assert r.status_code == 413
        assert "8192" in r.text
        assert httpx.get(f"{served.urls['msgbus']}/").json()["big"]["seq"] == 1
    with msgbus_serve(tmp_path, "--http-msgbus-max-payload-bytes", "16384") as served:
        assert httpx.put(f"{served.urls['msgbus']}/big", content=b"x" * 9000).status_code == 202


def test_a_message_expires_after_the_ttl(tmp_path: Path) -> None:
    """A message not popped within the TTL is never handed out; the listing shows the TTL."""
    with msgbus_serve(tmp_path, "--http-msgbus-ttl-ms", "300") as served:
        base = served.urls["msgbus"]
        assert httpx.put(f"{base}/t", content=b"old").status_code == 202
        assert httpx.get(f"{base}/").json()["t"]["ttl"] == 300_000_000
        time.sleep(0.5)  # the TTL passing is what is tested
        assert httpx.put(f"{base}/t", content=b"new").status_code == 202
        r = httpx.get(f"{base}/t")
        assert base64.b64decode(r.json()["payload"]) == b"new"
        assert r.json()["id"] == 1
        assert httpx.get(f"{base}/t").status_code == 404


def test_the_client_commands(tmp_path: Path) -> None:
    """msgbus sub / pub / pull, spelled tidewire: the subscriber prints both messages as they
    are published, pull takes both off the queue, in msgbus' format."""
    with msgbus_serve(tmp_path) as served:
        sub = subprocess.Popen(
            tidewire(SUB, served),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            stdin=subprocess.DEVNULL,
            text=True,
            env=subprocess_env(),
            preexec_fn=sigint_as_at_a_terminal,  # noqa: PLW1509 - sets one signal, no locks
        )
        try:
            assert sub.stderr is not None
            assert sub.stdout is not None
            assert sub.stderr.readline().startswith("subscribed to foo at http://localhost:")
            for command in (PUB_HI, PUB_BYE):
                done = run(tidewire(command, served))
                assert (done.returncode, done.stdout, done.stderr) == (0, "", "")
            got = [LINE.fullmatch(sub.stdout.readline().rstrip("\n")) for _ in range(2)]
            assert [m.groups() if m else None for m in got] == [
                ("0", "foo", "hi"),
                ("1", "foo", "bye"),
            ]
            sub.send_signal(signal.SIGINT)
            assert sub.wait(timeout=STARTUP_S) == 130
        finally:
            if sub.poll() is None:
                sub.kill()
                sub.wait(timeout=STARTUP_S)
            for f in (sub.stdout, sub.stderr):
                if f is not None:
                    f.close()

        pull = tidewire(PULL, served)
        done = run(pull)
        assert done.returncode == 0, done.stderr
        lines = [LINE.fullmatch(line) for line in done.stdout.splitlines()]
        assert [m.groups() if m else None for m in lines] == [
            ("0", "foo", "hi"),
            ("1", "foo", "bye"),
        ]
        # The queue is empty now: pull prints nothing.
        again = run(pull)
        assert (again.returncode, again.stdout) == (0, "")

        # pub without a message reads standard input; over the payload limit it fails (1).
        pub = [a for a in tidewire(PUB_HI, served) if a != "hi"]  # the message from stdin
        done = run(pub, "from stdin\n")
        assert done.returncode == 0, done.stderr
        done = run(pub, "second\n")
        assert done.returncode == 0, done.stderr
        # The payload is stdin byte for byte; a line ending with it prints as one line.
        r = httpx.get(f"{served.urls['msgbus']}/foo")
        assert base64.b64decode(r.json()["payload"]) == b"from stdin\n"
        done = run(pull)
        assert LINE.fullmatch(done.stdout.removesuffix("\n"))
        assert done.stdout.endswith(" topic=foo payload=second\n")
        done = run(pub, "x" * 9000)
        assert done.returncode == 1
        assert done.stderr.startswith("error: 413: payload exceeds max payload size of 8192")


def test_a_websocket_subscription(tmp_path: Path) -> None:
    """GET /topic with the WebSocket upgrade: every message published from then on."""
    with msgbus_serve(tmp_path) as served:
        ws_url = served.urls["msgbus"].replace("http://", "ws://") + "/news"
        with connect(ws_url, open_timeout=STARTUP_S) as ws:
            httpx.put(f"{served.urls['msgbus']}/news", content=b"flash")
            msg = json.loads(ws.recv(timeout=STARTUP_S))
            assert (msg["id"], base64.b64decode(msg["payload"])) == (0, b"flash")
            assert msg["topic"]["name"] == "news"


def test_the_hostile_request_checks_the_page_names(tmp_path: Path) -> None:
    """The one-line changes the page names: another Host is 421 until it is allowed."""
    with msgbus_serve(tmp_path) as served:
        url = f"{served.urls['msgbus']}/hello"
        assert httpx.get(url, headers={"Host": "bus.internal"}).status_code == 421
    assert "--http-allowed-hosts bus.internal" in SECTION
    with msgbus_serve(tmp_path, "--http-allowed-hosts", "bus.internal") as served:
        url = f"{served.urls['msgbus']}/hello"
        r = httpx.put(url, content=b"x", headers={"Host": "bus.internal"})
        assert r.status_code == 202


def test_every_documented_command_is_run() -> None:
    """The page's msgbus section shows exactly the commands these tests run (and the install)."""
    assert documented_commands(SECTION) - NOT_RUN == RUN


def test_the_settings_refuse_values_out_of_range(tmp_path: Path) -> None:
    """A bad payload limit or TTL is a usage error naming the setting and its range."""
    data = ["--data-dir", str(tmp_path / "data"), "--port", "0", "--http-msgbus-port", "0"]
    r = run_cli(["serve", *data, "--http-msgbus-max-payload-bytes", "0"])
    assert r.exit_code == 2
    assert "http_msgbus_max_payload_bytes=0 must be within 1..1,073,741,824" in r.output
    r = run_cli(["serve", *data, "--http-msgbus-ttl-ms", "-5"])
    assert r.exit_code == 2
    assert "http_msgbus_ttl_ms=-5 must be within 0..315,360,000,000" in r.output


def test_the_client_commands_errors() -> None:
    """A --uri that is not http(s) is a usage error (2); a listener not there is 1."""
    r = run_cli(["pull", "foo", "--uri", "localhost:8000"])
    assert r.exit_code == 2
    assert "--uri: 'localhost:8000' must be an http:// or https:// address" in r.output
    url = f"http://127.0.0.1:{closed_port()}"
    r = run_cli(["pub", "foo", "hi", "--uri", url])
    assert r.exit_code == 1
    assert f"error: cannot reach {url}/foo" in r.output
    r = run_cli(["sub", "foo", "--uri", url])
    assert r.exit_code == 1
    assert "error: cannot subscribe at ws://127.0.0.1:" in r.output
