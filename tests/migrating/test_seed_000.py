"""pubsub-broker (seed 000): every brokectl command, curl call, WebSocket example and client
program of its README, translated as docs/migrating.md says (read from the page itself),
against a real ``tidewire serve`` started by the page's own command line."""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from websockets.sync.client import connect

from tests.cli._support import STARTUP_S, run_cli, subprocess_env
from tests.migrating._support import (
    Served,
    code_blocks,
    code_span,
    section,
    serving,
    shell_commands,
    shell_with_tidewire,
    table_column,
    tidewire_argv,
)

#: The bound on anything that should happen at once (s), generous for a loaded machine.
PROMPT_S = 30.0

SEED = section("## From pubsub-broker (000)")
#: pubsub-broker's addresses, which the page keeps (the test's broker has free ports).
BINARY_ADDR = "127.0.0.1:9000"
HTTP_PORT = "8080"


def _serve_args() -> list[str]:
    """The page's ``tidewire serve`` line, on free ports instead of 9000 and 8080."""
    (line,) = [c for c in shell_commands(code_blocks(SEED, "sh")[0]) if "serve" in c]
    words = line.split("#")[0].split()
    assert words[:2] == ["tidewire", "serve"]
    return [w.replace("9000", "0").replace(HTTP_PORT, "0") for w in words[2:]]


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[Served]:
    with serving("--data-dir", str(tmp_path / "data"), *_serve_args()) as served:
        yield served


def _on(served: Served, text: str) -> str:
    """A documented line pointed at the test's broker."""
    text = text.replace(BINARY_ADDR, served.addr)
    return re.sub(rf"127\.0\.0\.1:{HTTP_PORT}\b", f"127.0.0.1:{served.http_port}", text).replace(
        f'("127.0.0.1", {HTTP_PORT})', f'("127.0.0.1", {served.http_port})'
    )


def _cli(served: Served, command: str) -> tuple[int, str, str]:
    """Run a documented ``tidewire ...`` command line (in-process)."""
    words = shlex.split(_on(served, command))
    assert words[0] == "tidewire"
    result = run_cli(words[1:])
    return result.exit_code, result.stdout, result.stderr


def test_the_brokectl_commands_run_with_tidewire_in_its_place(broker: Served) -> None:
    table = section("### brokectl")
    originals = [code_span(c) for c in table_column(table, 0)]
    ours = [code_span(c) for c in table_column(table, 1)]
    assert originals[0] == "docker-compose up -d"
    assert ours[0].startswith("tidewire serve --port 9000 --http-port 8080")  # the fixture's
    for original, translated in zip(originals[1:], ours[1:], strict=True):
        # The one change the page promises: brokectl -> tidewire, nothing else.
        assert translated == original.replace("brokectl", "tidewire", 1)

    create, publish, consumers, tail, health = ours[1:]
    code, out, err = _cli(broker, create)
    assert code == 0, err
    assert out == "created topic 'orders' with 4 partition(s)\n"
    code, out, err = _cli(broker, publish)
    assert code == 0, err
    assert out == "published to orders partition 1 at offset 0\n"  # FNV-1a("order-1") % 4
    code, out, err = _cli(broker, consumers)
    assert (code, out) == (0, ""), err  # no group yet
    code, out, err = _cli(broker, tail)
    assert code == 0, err
    assert out == 'partition=1 offset=0 key=order-1 {"id":1,"amount":99.00}\n'
    code, out, err = _cli(broker, health)
    assert code == 0, err
    assert re.fullmatch(
        rf"healthy: tidewire \S+ at {re.escape(broker.addr)}, round trip [\d.]+ ms\n", out
    )

    # A group shows up in consumer list once it has committed.
    code, out, err = _cli(
        broker,
        f"tidewire consume orders --group billing --from-beginning --count 1 --addr {BINARY_ADDR}",
    )
    assert (code, out) == (0, '{"id":1,"amount":99.00}\n'), err
    code, out, err = _cli(broker, consumers)
    assert code == 0, err
    assert out.startswith("billing\t")


def test_tail_shows_the_last_messages_of_every_partition_oldest_first(broker: Served) -> None:
    assert (
        _cli(broker, f"tidewire --addr {BINARY_ADDR} topic create --name t --partitions 3")[0] == 0
    )
    for i in range(8):
        code, _, err = _cli(
            broker, f"tidewire --addr {BINARY_ADDR} publish --topic t --key k{i} --payload m{i}"
        )
        assert code == 0, err
    code, out, err = _cli(broker, f"tidewire --addr {BINARY_ADDR} tail --topic t --count 5")
    assert code == 0, err
    assert [line.rsplit(" ", 1)[1] for line in out.splitlines()] == ["m3", "m4", "m5", "m6", "m7"]
    code, out, err = _cli(broker, f"tidewire tail t -n 2 --json --addr {BINARY_ADDR}")
    assert code == 0, err
    assert [json.loads(line)["value"] for line in out.splitlines()] == ["m6", "m7"]


def test_brokectl_spellings_refuse_a_name_given_twice(broker: Served) -> None:
    code, _, err = _cli(broker, f"tidewire --addr {BINARY_ADDR} topic create a --name b")
    assert code == 2
    assert "give the topic once: NAME or --name" in err
    code, _, err = _cli(broker, f"tidewire --addr {BINARY_ADDR} topic create --partitions 2")
    assert code == 2
    assert "give the topic's NAME (or --name)" in err
    code, _, err = _cli(broker, f"tidewire --addr {BINARY_ADDR} publish --topic a m --payload p")
    assert code == 2
    assert "give the message once: MESSAGE or --payload" in err
    code, _, err = _cli(broker, f"tidewire --addr {BINARY_ADDR} tail a --topic b")
    assert code == 2
    assert "give the topic once" in err
    # The command's own --addr wins over the one before the command.
    code, _, err = _cli(
        broker, "tidewire --addr 127.0.0.1:1 health --timeout 5 --addr " + BINARY_ADDR
    )
    assert code == 0, err


def test_the_quickstart_publishes_five_messages(broker: Served) -> None:
    (cell,) = [c for c in table_column(section("### Quickstart"), 1) if "seq 1 5" in c]
    create, publish = re.findall(r"`([^`]+)`", cell)
    assert _cli(broker, create)[0] == 0
    done = subprocess.run(
        shell_with_tidewire(_on(broker, publish.replace("\\|", "|"))),
        shell=True,
        capture_output=True,
        text=True,
        timeout=PROMPT_S * 2,
        env=subprocess_env(),
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("published 5 message(s) to sample\n")


def test_the_go_client_program_in_python(broker: Served) -> None:
    (program,) = code_blocks(section("### The Go client"), "python")
    # As in the README, the topic exists with its 4 partitions.
    create = f"tidewire --addr {BINARY_ADDR} topic create --name orders --partitions 4"
    assert _cli(broker, create)[0] == 0
    with subprocess.Popen(
        [sys.executable, "-c", _on(broker, program)],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env=subprocess_env({"PYTHONUNBUFFERED": "1"}),
    ) as proc:
        assert proc.stdout is not None
        try:
            lines = [proc.stdout.readline(), proc.stdout.readline()]
            assert lines == [
                "published at offset 0\n",
                'partition=2 offset=0 payload={"amount":99}\n',  # FNV-1a("key-1") % 4
            ]
            # Then it commits the offset after its message (while it waits for more).
            assert _committed(broker, "my-group", "orders", 2) == 1
        finally:
            proc.kill()
            proc.wait(timeout=STARTUP_S)


def _committed(broker: Served, group: str, topic: str, partition: int) -> int:
    """The group's committed offset once it is not -1 (or -1 after PROMPT_S)."""
    deadline = time.monotonic() + PROMPT_S
    with httpx.Client(base_url=broker.url, timeout=PROMPT_S) as http:
        while True:
            doc = http.get(f"/v1/groups/{group}", params={"wait": 0}).json()
            got = {(o["topic"], o["partition"]): o["committed"] for o in doc.get("offsets", [])}
            committed = got.get((topic, partition), -1)
            if committed >= 0 or time.monotonic() > deadline:
                return int(committed)
            time.sleep(0.05)  # polling the broker's state: nothing to wait on from here


def _curl(broker: Served, command: str) -> tuple[int, object]:
    """Run a documented curl line against the broker; its status and JSON answer."""
    done = subprocess.run(
        _on(broker, command) + " -w '\\n%{http_code}'",
        shell=True,
        capture_output=True,
        text=True,
        timeout=PROMPT_S,
        check=True,
    )
    body, status = done.stdout.rsplit("\n", 1)
    return int(status), json.loads(body)


def test_the_gateway_curl_calls(broker: Served) -> None:
    gateway = section("### The HTTP gateway")
    create, publish, fetch = shell_commands(code_blocks(gateway, "sh")[0])

    status, doc = _curl(broker, create)
    assert status == 201
    assert isinstance(doc, dict)
    assert doc["name"] == "orders"
    assert [p["partition"] for p in doc["partitions"]] == [0, 1, 2, 3]
    status, doc = _curl(broker, create)
    assert status == 409

    status, doc = _curl(broker, publish)
    assert (status, doc) == (201, {"offset": 0, "partition": 1})

    status, doc = _curl(broker, fetch)  # partition 0: order-1 is not there
    assert status == 200
    assert doc == {"messages": [], "next_offset": 0, "high_watermark": 0}
    status, doc = _curl(broker, fetch.replace("/partitions/0/", "/partitions/1/"))
    assert status == 200
    assert isinstance(doc, dict)
    (msg,) = doc["messages"]
    assert (msg["key"], msg["value"], msg["offset"]) == ("order-1", "hello", 0)
    status, doc = _curl(
        broker,
        fetch.replace("/partitions/0/", "/partitions/1/").replace("10'", "10&encoding=base64'"),
    )
    assert isinstance(doc, dict)
    assert doc["messages"][0]["value"] == "aGVsbG8="  # as pubsub-broker's gateway answers


def test_the_gateway_curl_calls_without_the_header_are_refused_clearly(broker: Served) -> None:
    """pubsub-broker's lines as they are (curl -d: a form body): 415, saying what to do."""
    status, doc = _curl(
        broker,
        "curl -s -X POST http://127.0.0.1:8080/v1/topics/orders/messages "
        """-d '{"key":"order-1","payload":"hello"}'""",
    )
    assert status == 415
    assert isinstance(doc, dict)
    assert "--json sends JSON" in doc["error"]["message"]


def test_payload_is_value_and_both_are_refused(broker: Served) -> None:
    with httpx.Client(base_url=broker.url, timeout=PROMPT_S) as http:
        r = http.post("/v1/topics/p/messages", json={"payload": "a", "value": "b"})
        assert r.status_code == 400
        assert r.json()["error"]["message"] == (
            "the body: give value or payload (another name for value), not both"
        )
        r = http.post("/v1/topics/p/messages", json={"payload": "aGk=", "encoding": "base64"})
        assert r.status_code == 201
        r = http.post(
            "/v1/topics/p/messages:batch",
            json={"messages": [{"payload": "x"}, {"value": "y"}, {"value": "z", "payload": "w"}]},
        )
        assert r.status_code == 400
        assert "field messages.2: give value or payload" in r.json()["error"]["message"]
        r = http.post("/v1/topics/p/messages:batch", json={"messages": [{"payload": "x"}]})
        assert r.status_code == 201
        got = http.get("/v1/topics/p/partitions/0/messages").json()["messages"]
        assert [m["value"] for m in got] == ["hi", "x"]
        spec = http.get("/openapi.json").json()["components"]["schemas"]
        assert "payload" in spec["PublishRequest"]["properties"]
        assert "payload" in spec["PublishMessage"]["properties"]


def test_the_websocket_url_and_the_standard_library_snippet(broker: Served) -> None:
    websocket = section("### WebSocket")
    (websocat,) = shell_commands(code_blocks(websocket, "sh")[0])
    url = re.search(r'"(ws://[^"]+)"', _on(broker, websocat))
    assert url is not None
    with httpx.Client(base_url=broker.url, timeout=PROMPT_S) as http:
        assert http.post("/v1/topics", json={"name": "orders", "partitions": 4}).status_code == 201
        with connect(url.group(1), open_timeout=PROMPT_S) as ws:
            first = json.loads(ws.recv(timeout=PROMPT_S))
            assert first["type"] == "subscribed"
            assert first["group"] == "my-group"
            assert sorted(p["partition"] for p in first["partitions"]) == [0, 1, 2, 3]
            r = http.post("/v1/topics/orders/messages", json={"key": "order-1", "payload": "hello"})
            assert r.status_code == 201
            msg = json.loads(ws.recv(timeout=PROMPT_S))
            assert (msg["type"], msg["partition"], msg["value"]) == ("message", 1, "hello")

    (snippet,) = code_blocks(websocket, "python")
    done = subprocess.run(
        [sys.executable, "-c", _on(broker, snippet)],
        capture_output=True,
        text=True,
        timeout=PROMPT_S,
        env=subprocess_env(),
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("b'HTTP/1.1 101 Switching Protocols\\r\\n")


def test_gen_config_is_config_init(broker: Served, tmp_path: Path) -> None:
    (row,) = [c for c in table_column(section("### Configuration"), 1) if "config init" in c]
    command = code_span(row)
    done = subprocess.run(
        shell_with_tidewire(command),
        shell=True,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=PROMPT_S * 2,
        env=subprocess_env(),
        check=False,
    )
    assert done.returncode == 0, done.stderr
    config = (tmp_path / "tidewire.toml").read_text()
    for key in ("data_dir", "port", "max_connections", "segment_bytes", "fsync"):
        assert re.search(rf"^#? ?{key} = ", config, re.MULTILINE), key


def test_the_benchmark_command(broker: Served) -> None:
    (row,) = [c for c in table_column(section("### Features, one by one"), 1) if "bench" in c]
    command = code_span(row) + f" --addr {broker.addr} --json"
    done = subprocess.run(
        shell_with_tidewire(command),
        shell=True,
        capture_output=True,
        text=True,
        timeout=300,
        env=subprocess_env(),
        check=False,
    )
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert (result["test"], result["messages"], result["size"]) == ("produce", 10_000, 1024)
    assert result["msg_per_s"] > 0


def test_another_address_needs_authentication_or_allow_anonymous(tmp_path: Path) -> None:
    """The page: on another address the broker starts only with --authentication, or with
    --allow-anonymous."""
    assert "`--authentication`, or with `--allow-anonymous`" in " ".join(SEED.split())
    done = subprocess.run(
        [*tidewire_argv("tidewire serve --host 0.0.0.0 --port 0"), "--data-dir", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=PROMPT_S * 2,
        env=subprocess_env(),
        check=False,
    )
    assert done.returncode != 0
    said = " ".join(done.stderr.split())
    assert "turn authentication on" in said, said
    assert "allow_anonymous = true" in said, said


def test_the_generated_key_of_the_authentication_wizard(tmp_path: Path) -> None:
    """The quickstart's wizard, "a generated key": serve --authentication writes the first
    superuser's key; the Go client's Authenticate is the clients' credentials=."""
    (cell,) = [c for c in table_column(section("### Quickstart"), 1) if "--authentication" in c]
    words = code_span(cell).split()
    assert words[:2] == ["tidewire", "serve"]
    args = [w.replace("9000", "0").replace(HTTP_PORT, "0") for w in words[2:]]
    data = tmp_path / "data"
    with serving("--data-dir", str(data), *args) as served:
        key_file = data / "bootstrap-admin.key"
        assert "DATA_DIR/bootstrap-admin.key" in cell
        key = key_file.read_text().strip()
        with httpx.Client(base_url=served.url, timeout=PROMPT_S) as http:
            r = http.post("/v1/topics", json={"name": "orders"})
            assert r.status_code == 401
            r = http.post(
                "/v1/topics", json={"name": "orders"}, headers={"Authorization": f"Bearer {key}"}
            )
            assert r.status_code == 201, r.text
        (row,) = [c for c in table_column(section("### The Go client"), 1) if "Credentials" in c]
        assert 'credentials=Credentials("my-api-key")' in row
        program = f"""
import asyncio
from tidewire.client import AsyncProducer, Credentials

async def main() -> None:
    async with AsyncProducer({served.addr!r}, credentials=Credentials({key!r})) as producer:
        meta = await (await producer.send("orders", b"paid"))
        print(meta.offset)

asyncio.run(main())
"""
        done = subprocess.run(
            [sys.executable, "-c", program],
            capture_output=True,
            text=True,
            timeout=PROMPT_S * 2,
            env=subprocess_env(),
            check=False,
        )
        assert done.returncode == 0, done.stderr
        assert done.stdout == "0\n"
