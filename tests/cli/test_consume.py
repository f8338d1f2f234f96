"""``tidewire consume``: each start option, --count and --timeout, text and JSON lines,
Ctrl-C, errors."""

from __future__ import annotations

import base64
import datetime as dt
import json
import signal
import subprocess
import time

import pytest

from tests.cli._support import (
    STARTUP_S,
    Broker,
    closed_port,
    run_cli,
    sigint_as_at_a_terminal,
    subprocess_env,
    tidewire_cmd,
)
from tidewire.cli._consume import parse_since
from tidewire.client import Client, Message

HOUR_MS = 3_600_000


def fill(broker: Broker, topic: str = "t", partitions: int = 2, per_partition: int = 3) -> None:
    """``per_partition`` messages ``p{P}-{i}`` in each partition, keyed ``k{i}``."""
    with Client(broker.addr) as client:
        client.create_topic(topic, partitions)
        for p in range(partitions):
            msgs = [
                Message(f"p{p}-{i}".encode(), key=f"k{i}".encode()) for i in range(per_partition)
            ]
            client.produce(topic, p, msgs)


def test_from_beginning_every_partition(broker: Broker) -> None:
    fill(broker)
    result = broker.cli("consume", "t", "--from-beginning", "--timeout", "0.5")
    assert result.exit_code == 0, result.stderr
    lines = result.stdout.splitlines()
    assert sorted(lines) == ["p0-0", "p0-1", "p0-2", "p1-0", "p1-1", "p1-2"]
    # Each partition's messages in offset order.
    for p in (0, 1):
        mine = [x for x in lines if x.startswith(f"p{p}-")]
        assert mine == [f"p{p}-0", f"p{p}-1", f"p{p}-2"]


def test_count_stops_exactly(broker: Broker) -> None:
    fill(broker, per_partition=5)
    result = broker.cli("consume", "t", "--from-beginning", "-n", "4", "--partition", "1")
    assert result.exit_code == 0, result.stderr
    assert result.stdout.splitlines() == ["p1-0", "p1-1", "p1-2", "p1-3"]


def test_offset_on_one_partition(broker: Broker) -> None:
    fill(broker, per_partition=5)
    result = broker.cli("consume", "t", "--offset", "3", "-p", "0", "--timeout", "0.5")
    assert result.stdout.splitlines() == ["p0-3", "p0-4"]


def test_print_key(broker: Broker) -> None:
    fill(broker, partitions=1, per_partition=2)
    result = broker.cli("consume", "t", "--from-beginning", "-n", "2", "--print-key")
    assert result.stdout == "k0\tp0-0\nk1\tp0-1\n"
    result = broker.cli(
        "consume", "t", "--from-beginning", "-n", "1", "--print-key", "--key-separator", " => "
    )
    assert result.stdout == "k0 => p0-0\n"


def test_json_lines(broker: Broker) -> None:
    with Client(broker.addr) as client:
        client.create_topic("t", 1)
        client.produce(
            "t",
            0,
            [
                Message(b"text", key=b"k", headers=[("h", b"x"), ("n", None)], timestamp_ms=1234),
                Message(b"\xff\x00bin", key=b"\xfe", headers=[("b", b"\x80")], timestamp_ms=5),
                Message(None, timestamp_ms=6),
            ],
        )
    result = broker.cli("consume", "t", "--from-beginning", "-n", "3", "--format", "json")
    assert result.exit_code == 0, result.stderr
    docs = [json.loads(line) for line in result.stdout.splitlines()]
    assert docs[0] == {
        "topic": "t",
        "partition": 0,
        "offset": 0,
        "timestamp": 1234,
        "key": "k",
        "value": "text",
        "headers": [{"key": "h", "value": "x"}, {"key": "n", "value": None}],
    }
    assert docs[1] == {
        "topic": "t",
        "partition": 0,
        "offset": 1,
        "timestamp": 5,
        "key": base64.b64encode(b"\xfe").decode(),
        "key_base64": True,
        "value": base64.b64encode(b"\xff\x00bin").decode(),
        "value_base64": True,
        "headers": [{"key": "b", "value": "gA==", "value_base64": True}],
    }
    assert (docs[2]["key"], docs[2]["value"], docs[2]["offset"]) == (None, None, 2)


def test_since(broker: Broker) -> None:
    now = int(time.time() * 1000)
    with Client(broker.addr) as client:
        client.create_topic("t", 2)
        for p in (0, 1):
            client.produce(
                "t",
                p,
                [
                    Message(f"old{p}".encode(), timestamp_ms=now - 3 * HOUR_MS),
                    Message(f"new{p}".encode(), timestamp_ms=now - 60_000),
                ],
            )
    relative = broker.cli("consume", "t", "--since", "2h", "--timeout", "0.5")
    assert sorted(relative.stdout.splitlines()) == ["new0", "new1"]
    when = dt.datetime.fromtimestamp((now - 4 * HOUR_MS) / 1000, tz=dt.UTC).isoformat()
    absolute = broker.cli("consume", "t", "--since", when, "--timeout", "0.5")
    assert sorted(absolute.stdout.splitlines()) == ["new0", "new1", "old0", "old1"]
    future = broker.cli("consume", "t", "--since", "2099-01-01T00:00:00Z", "--timeout", "0.3")
    assert (future.exit_code, future.stdout) == (0, "")
    epoch = broker.cli("consume", "t", "--since", str(now - 2 * HOUR_MS), "--timeout", "0.5")
    assert epoch.exit_code == 0, epoch.stderr
    assert sorted(epoch.stdout.splitlines()) == ["new0", "new1"]
    assert epoch.stderr == ""  # a start was given: no word about waiting


def test_default_start_is_the_end(broker: Broker) -> None:
    fill(broker)
    # Only what is published after it starts: nothing here, so --timeout ends it.
    quiet = broker.cli("consume", "t", "--timeout", "0.5")
    assert (quiet.exit_code, quiet.stdout) == (0, "")
    # It says why it prints nothing, on stderr (stdout stays the messages alone).
    assert quiet.stderr == (
        "waiting for new messages on t (use --from-beginning to read from the start)\n"
    )
    assert broker.cli("consume", "t", "--from-beginning", "--timeout", "0.5").stderr == ""
    proc = subprocess.Popen(
        tidewire_cmd("consume", "t", "--count", "1", "--addr", broker.addr),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=subprocess_env(),
        preexec_fn=sigint_as_at_a_terminal,  # noqa: PLW1509 - sets one signal, no locks
    )
    try:
        with Client(broker.addr) as client:
            # Publish until the consumer, started meanwhile, sees one (bounded).
            for i in range(200):
                client.produce("t", i % 2, [Message(f"new-{i}".encode())])
                try:
                    proc.wait(timeout=0.1)
                    break
                except subprocess.TimeoutExpired:
                    continue
        out, err = proc.communicate(timeout=STARTUP_S)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, err
    assert out.decode().startswith("new-")
    assert out.count(b"\n") == 1
    assert err.decode().startswith("waiting for new messages on t (use --from-beginning")


def test_ctrl_c_exits_cleanly(broker: Broker) -> None:
    fill(broker)
    proc = subprocess.Popen(
        tidewire_cmd("consume", "t", "--from-beginning", "--addr", broker.addr),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=subprocess_env(),
        preexec_fn=sigint_as_at_a_terminal,  # noqa: PLW1509 - sets one signal, no locks
    )
    try:
        assert proc.stdout is not None
        # All six printed: it is now waiting for more, as a console consumer does.
        lines = [proc.stdout.readline() for _ in range(6)]
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=STARTUP_S)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130
    assert b"Traceback" not in err
    assert sorted(lines) == [b"p0-0\n", b"p0-1\n", b"p0-2\n", b"p1-0\n", b"p1-1\n", b"p1-2\n"]
    assert out == b""


def test_errors(broker: Broker) -> None:
    fill(broker)
    unknown = broker.cli("consume", "nope", "--timeout", "0.2")
    assert (unknown.exit_code, unknown.stderr) == (1, "error: topic 'nope' does not exist\n")
    part = broker.cli("consume", "t", "-p", "7", "--timeout", "0.2")
    assert (part.exit_code, part.stderr) == (1, "error: topic 't' has partitions 0..1, not 7\n")
    beyond = broker.cli("consume", "t", "-p", "0", "--offset", "50", "--timeout", "0.2")
    assert beyond.exit_code == 1
    assert beyond.stderr.startswith("error: ")
    assert beyond.stderr.count("\n") == 1
    port = closed_port()
    down = run_cli(["consume", "t", "--addr", f"127.0.0.1:{port}"])
    assert down.exit_code == 1
    assert down.stderr.startswith(f"error: cannot connect to 127.0.0.1:{port}")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--from-beginning", "--since", "1h"), "give at most one of --from-beginning"),
        (("--offset", "3"), "--offset needs --partition"),
        (("--since", "yesterday"), "--since 'yesterday' is neither ISO-8601"),
    ],
)
def test_usage_errors(args: tuple[str, ...], message: str) -> None:
    result = run_cli(["consume", "t", *args])
    assert result.exit_code == 2
    assert result.stderr.startswith(f"error: {message}")


def test_parse_since() -> None:
    now = 1_700_000_000_000
    assert parse_since("10m", now) == now - 600_000
    assert parse_since("2h", now) == now - 7_200_000
    assert parse_since("1d", now) == now - 86_400_000
    assert parse_since("1w", now) == now - 604_800_000
    assert parse_since("30s", now) == now - 30_000
    assert parse_since("250ms", now) == now - 250
    assert parse_since("2024-05-01T12:00:00Z", now) == 1_714_564_800_000
    assert parse_since("2024-05-01T14:00:00+02:00", now) == 1_714_564_800_000
    local = dt.datetime(2024, 5, 1, 12, 0).astimezone()
    assert parse_since("2024-05-01T12:00", now) == int(local.timestamp() * 1000)
    assert parse_since("1714564800000", now) == 1_714_564_800_000  # ms since the epoch
    assert parse_since(" 10 ", now) == 10
    for bad in ("", "10 minutes", "-5m", "-5", "1.5", "2024-13-01"):
        with pytest.raises(ValueError, match="neither ISO-8601"):
            parse_since(bad, now)
