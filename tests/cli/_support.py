"""A real ``tidewire serve`` process on a free port of 127.0.0.1, and the CLI run in-process
against it."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest
from typer.testing import CliRunner, Result

from tidewire.cli import app

#: How long a broker may take to start or to stop (seconds).
STARTUP_S = 30


def tidewire_cmd(*args: str) -> list[str]:
    """The argv of ``tidewire ARGS`` run by this interpreter."""
    return [sys.executable, "-m", "tidewire", *args]


def sigint_as_at_a_terminal() -> None:
    """``preexec_fn`` of a child that the test interrupts with SIGINT: a shell that runs a job
    in the background (as CI may) starts it with SIGINT ignored, and Python then never raises
    KeyboardInterrupt; a command run at a terminal gets SIGINT's default action."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def subprocess_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """This environment without ``TIDEWIRE_*`` settings (the test decides them), with
    ``extra`` and this interpreter's import path."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TIDEWIRE_")}
    return {**env, **(extra or {}), "PYTHONPATH": os.pathsep.join(sys.path)}


def popen_serve(
    *args: str, env: Mapping[str, str] | None = None, stderr: int = subprocess.DEVNULL
) -> subprocess.Popen[str]:
    """``tidewire serve ARGS`` as a child process: its stdout (the listening lines) a pipe,
    its stderr (the log) ``stderr``."""
    return subprocess.Popen(
        tidewire_cmd("serve", *args),
        stdout=subprocess.PIPE,
        stderr=stderr,
        stdin=subprocess.DEVNULL,
        text=True,
        env=subprocess_env(env),
    )


def start_serve(
    data_dir: Path | None, *args: str, env: Mapping[str, str] | None = None
) -> tuple[subprocess.Popen[str], int]:
    """Start ``tidewire serve --port 0 ARGS`` (with ``--data-dir`` unless None); return the
    process and the port it listens on, read from its first line."""
    dirs = [] if data_dir is None else ["--data-dir", str(data_dir)]
    proc = popen_serve(*dirs, "--port", "0", *args, env=env)
    assert proc.stdout is not None
    line = proc.stdout.readline()
    m = re.search(r"listening on 127\.0\.0\.1:(\d+)", line)
    if m is None:
        stop(proc)
        pytest.fail(f"serve did not start: {line!r}")
    return proc, int(m.group(1))


def stop(proc: subprocess.Popen[str]) -> None:
    """Stop a serve process by its PID (SIGKILL if it has not exited) and reap it."""
    if proc.poll() is None:
        os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=STARTUP_S)
    if proc.stdout is not None:
        proc.stdout.close()


@contextlib.contextmanager
def serving(
    data_dir: Path | None, *args: str, env: Mapping[str, str] | None = None
) -> Iterator[tuple[subprocess.Popen[str], int]]:
    """A ``tidewire serve`` process, killed at the end if the test did not stop it."""
    proc, port = start_serve(data_dir, *args, env=env)
    try:
        yield proc, port
    finally:
        stop(proc)


@dataclass(frozen=True, slots=True)
class Broker:
    """A running broker and a way to run CLI commands against it."""

    proc: subprocess.Popen[str]
    port: int

    @property
    def addr(self) -> str:
        return f"127.0.0.1:{self.port}"

    def cli(self, *args: str, input: bytes | str | None = None) -> Result:
        """``tidewire ARGS --addr THIS`` run in-process."""
        return run_cli([*args, "--addr", self.addr], input=input)


def run_cli(
    args: Sequence[str],
    *,
    input: bytes | str | None = None,
    env: Mapping[str, str | None] | None = None,
) -> Result:
    """``tidewire ARGS`` run in-process, with no ``TIDEWIRE_*`` variable of this
    environment leaking in (unless ``env`` sets it)."""
    clean: dict[str, str | None] = dict.fromkeys(
        (k for k in os.environ if k.startswith("TIDEWIRE_")), None
    )
    return CliRunner().invoke(app, list(args), input=input, env={**clean, **(env or {})})


def closed_port() -> int:
    """A port of 127.0.0.1 that nothing listens on (bound, then released)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def failure(broker: Broker, *args: str, code: int = 1) -> str:
    """Run a command that must fail; return its one-line error."""
    result = broker.cli(*args)
    assert result.exit_code == code, (args, result.stdout, result.stderr)
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("error: "), result.stderr
    return lines[0]
