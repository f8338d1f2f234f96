"""``tidewire serve`` as a user runs it: a real process on a free port, a client talking to it,
SIGTERM, a clean drain."""

from __future__ import annotations

import re
import signal
import subprocess
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tests.cli._support import STARTUP_S, popen_serve, serving, stop
from tidewire import __version__
from tidewire.cli import app
from tidewire.client import Client, Message
from tidewire.records import IMPLEMENTATION


def test_version() -> None:
    result = CliRunner().invoke(app, ["--version"])
    assert result.exit_code == 0
    assert result.output.strip() == f"tidewire {__version__} (record codec: {IMPLEMENTATION})"
    assert IMPLEMENTATION in {"compiled", "python"}


def test_serve_then_sigterm_drains_cleanly(tmp_path: Path) -> None:
    data = tmp_path / "data"
    with serving(data, "--fsync", "always", "--partitions", "2") as (proc, port):
        with Client(f"127.0.0.1:{port}") as client:
            offset = client.produce("events", 1, [Message(b"hello", key=b"k")])
            assert offset == 0
            assert client.describe_topic("events").partitions[1].log_end_offset == 1
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=STARTUP_S) == 0
    assert (data / ".clean-shutdown").exists()
    # The data is there for the next run.
    with serving(data) as (proc, port):
        with Client(f"127.0.0.1:{port}") as client:
            got = client.fetch("events", 1, 0)
            assert [(r.offset, r.key, r.value) for r in got.records] == [(0, b"k", b"hello")]
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=STARTUP_S) == 0


def test_bad_option_is_refused(tmp_path: Path) -> None:
    result = CliRunner().invoke(
        app, ["serve", "--data-dir", str(tmp_path), "--partitions", "0", "--port", "0"]
    )
    assert result.exit_code != 0
    assert "default_partitions=0" in result.output


@pytest.mark.parametrize("event_loop", ["auto", "asyncio", "uvloop"])
def test_serves_on_each_event_loop(tmp_path: Path, event_loop: str) -> None:
    """auto takes uvloop (a dependency on this platform); every loop serves and drains."""
    args = ("--data-dir", str(tmp_path), "--port", "0", "--partitions", "1")
    proc = popen_serve(*args, "--event-loop", event_loop, stderr=subprocess.PIPE)
    try:
        assert proc.stdout is not None
        m = re.search(r"listening on 127\.0\.0\.1:(\d+)", proc.stdout.readline())
        assert m is not None
        with Client(f"127.0.0.1:{m.group(1)}") as client:
            client.produce("events", 0, [Message(b"x")] * 3)
            assert [r.value for r in client.fetch("events", 0, 0).records] == [b"x"] * 3
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=STARTUP_S)
    finally:
        stop(proc)
    assert proc.returncode == 0
    expected = "asyncio" if event_loop == "asyncio" else "uvloop"
    assert f"event loop: {expected}" in err


def test_unknown_event_loop_is_refused(tmp_path: Path) -> None:
    result = CliRunner().invoke(
        app, ["serve", "--data-dir", str(tmp_path), "--event-loop", "twisted", "--port", "0"]
    )
    assert result.exit_code == 2
    assert "event_loop='twisted' must be one of auto, asyncio, uvloop" in result.output
