"""``tidewire serve`` as a user runs it: a real process on a free port, a client talking to it,
SIGTERM, a clean drain."""

from __future__ import annotations

import signal
from pathlib import Path

from typer.testing import CliRunner

from tests.cli._support import STARTUP_S, serving
from tidewire import __version__
from tidewire.cli import app
from tidewire.client import Client, Message


def test_version() -> None:
    result = CliRunner().invoke(app, ["--version"])
    assert result.exit_code == 0
    assert result.output.strip() == f"tidewire {__version__}"


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
