"""One broker per data directory: a second ``tidewire serve`` (or an embedded broker) on a
directory that a running broker holds is refused, with one line naming the directory and the
holder's pid, and the running broker's data stays intact; the lock goes with the broker,
whether it stops cleanly or is killed."""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

import pytest

from tests.cli._support import STARTUP_S, serving, stop, subprocess_env, tidewire_cmd
from tidewire.client import Client, Message
from tidewire.embedded import EmbeddedBroker
from tidewire.errors import DataDirLockedError


def run_serve(data: Path) -> subprocess.CompletedProcess[str]:
    """``tidewire serve --data-dir DATA --port 0`` to its end (a refused one ends at once)."""
    return subprocess.run(
        tidewire_cmd("serve", "--data-dir", str(data), "--port", "0"),
        capture_output=True,
        text=True,
        stdin=subprocess.DEVNULL,
        env=subprocess_env(),
        timeout=STARTUP_S,
        check=False,
    )


def refused_line(done: subprocess.CompletedProcess[str]) -> str:
    assert done.returncode == 1, done
    assert done.stdout == ""  # never said it was listening
    lines = done.stderr.splitlines()
    assert len(lines) == 1, done.stderr
    return lines[0]


def values(client: Client, topic: str) -> list[bytes | None]:
    return [r.value for r in client.fetch(topic, 0, 0).records]


def test_a_second_serve_on_the_same_directory_is_refused(tmp_path: Path) -> None:
    data = tmp_path / "data"
    with serving(data, "--fsync", "always") as (first, port):
        with Client(f"127.0.0.1:{port}") as client:
            assert client.produce("events", 0, [Message(b"one")]) == 0
            line = refused_line(run_serve(data))
            assert line.startswith("error: data directory ")
            assert str(data) in line
            assert f"pid {first.pid}" in line
            assert f"{data}/.lock" in line
            # The first goes on, with everything it had and everything after.
            assert client.produce("events", 0, [Message(b"two")]) == 1
            assert values(client, "events") == [b"one", b"two"]
        assert (data / ".lock").read_text() == f"{first.pid}\n"
        first.send_signal(signal.SIGTERM)
        assert first.wait(timeout=STARTUP_S) == 0
    assert (data / ".lock").read_text() == ""  # released: no stale pid left behind
    with serving(data) as (second, port), Client(f"127.0.0.1:{port}") as client:
        assert values(client, "events") == [b"one", b"two"]
        second.send_signal(signal.SIGTERM)
        assert second.wait(timeout=STARTUP_S) == 0


def test_the_lock_dies_with_a_killed_broker(tmp_path: Path) -> None:
    data = tmp_path / "data"
    with serving(data, "--fsync", "always") as (first, port):
        with Client(f"127.0.0.1:{port}") as client:
            assert client.produce("events", 0, [Message(b"kept")]) == 0
        os.kill(first.pid, signal.SIGKILL)
        stop(first)
    # The file still names the dead broker, but nobody holds the lock: a restart recovers.
    assert (data / ".lock").read_text() == f"{first.pid}\n"
    assert not (data / ".clean-shutdown").exists()
    with serving(data) as (second, port), Client(f"127.0.0.1:{port}") as client:
        assert values(client, "events") == [b"kept"]
        assert (data / ".lock").read_text() == f"{second.pid}\n"


def test_an_embedded_broker_and_serve_exclude_each_other(tmp_path: Path) -> None:
    data = tmp_path / "data"
    with EmbeddedBroker(str(data)).running() as eb:
        with Client(eb.addr) as client:
            client.produce("events", 0, [Message(b"embedded")])
        line = refused_line(run_serve(data))
        assert f"pid {os.getpid()}" in line
        assert str(data) in line
    with serving(data) as (proc, port):
        embedded = EmbeddedBroker(str(data))
        with pytest.raises(DataDirLockedError) as refused, embedded.running():
            pytest.fail("the embedded broker started on a directory serve holds")
        assert f"pid {proc.pid}" in refused.value.message
        with Client(f"127.0.0.1:{port}") as client:
            assert values(client, "events") == [b"embedded"]


def test_two_embedded_brokers_in_one_process(tmp_path: Path) -> None:
    data = tmp_path / "data"
    with EmbeddedBroker(str(data)).running() as first:
        second = EmbeddedBroker(str(data))
        with (
            pytest.raises(DataDirLockedError, match="another broker in this process"),
            second.running(),
        ):
            pytest.fail("a second broker started on the same directory")
        with Client(first.addr) as client:  # the first is untouched
            assert client.produce("events", 0, [Message(b"x")]) == 0
    with EmbeddedBroker(str(data)).running() as again, Client(again.addr) as client:
        assert values(client, "events") == [b"x"]
