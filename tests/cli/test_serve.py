"""``tidewire serve`` as a user runs it: a real process on a free port, a client talking to it,
SIGTERM, a clean drain."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tidewire import __version__
from tidewire.cli import app
from tidewire.client import Client, Message

STARTUP_S = 30


def _start(data_dir: Path, *args: str) -> tuple[subprocess.Popen[str], int]:
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tidewire",
            "serve",
            "--data-dir",
            str(data_dir),
            "--port",
            "0",
            *args,
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    m = re.search(r"listening on 127\.0\.0\.1:(\d+)", line)
    if m is None:
        proc.kill()
        proc.wait(timeout=STARTUP_S)
        proc.stdout.close()
        pytest.fail(f"serve did not start: {line!r}")
    return proc, int(m.group(1))


def test_version() -> None:
    result = CliRunner().invoke(app, ["--version"])
    assert result.exit_code == 0
    assert result.output.strip() == f"tidewire {__version__}"


@contextlib.contextmanager
def _serving(data_dir: Path, *args: str) -> Iterator[tuple[subprocess.Popen[str], int]]:
    """A ``tidewire serve`` process, killed at the end if the test did not stop it."""
    proc, port = _start(data_dir, *args)
    try:
        yield proc, port
    finally:
        proc.kill()
        proc.wait(timeout=STARTUP_S)
        assert proc.stdout is not None
        proc.stdout.close()


def test_serve_then_sigterm_drains_cleanly(tmp_path: Path) -> None:
    data = tmp_path / "data"
    with _serving(data, "--fsync", "always", "--partitions", "2") as (proc, port):
        with Client(f"127.0.0.1:{port}") as client:
            offset = client.produce("events", 1, [Message(b"hello", key=b"k")])
            assert offset == 0
            assert client.describe_topic("events").partitions[1].log_end_offset == 1
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=STARTUP_S) == 0
    assert (data / ".clean-shutdown").exists()
    # The data is there for the next run.
    with _serving(data) as (proc, port):
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
