"""A real ``tidewire serve`` in a subprocess for the crash tests: started on a fixed port
over one data directory, killed (SIGKILL) or stopped (SIGTERM), started again on the same
port and data, each start's stderr kept in a log file of its own for the failure message.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

__all__ = ["STARTUP_S", "BrokerProcess", "broker_process", "free_port"]

#: How long a start (recovery included) or a stop may take.
STARTUP_S = 30.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class BrokerProcess:
    """One broker, started again and again on ``port`` over ``data_dir``."""

    data_dir: Path
    port: int
    logs: Path
    flags: tuple[str, ...] = ()
    proc: subprocess.Popen[str] | None = None
    starts: int = 0

    @property
    def addr(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> None:
        """Start it; returns once it says it is listening (fails the test if it does not)."""
        self.starts += 1
        log = open(self.logs / f"server-{self.starts}.log", "w")  # noqa: SIM115 - handed over
        self.proc = subprocess.Popen(
            [
                sys.executable,
                *("-m", "tidewire", "serve", "--data-dir", str(self.data_dir)),
                *("--port", str(self.port), "--fsync", "always"),
                *self.flags,
            ],
            stdout=subprocess.PIPE,
            stderr=log,
            text=True,
            env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
        )
        log.close()
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not re.search(r"listening on 127\.0\.0\.1:\d+", line):
            self.stop(signal.SIGKILL)
            pytest.fail(f"start {self.starts} failed: {line!r}\n{self.log_tail()}")

    def stop(self, sig: int) -> int:
        """Send ``sig`` and wait for the process to end; its exit code (0: not running)."""
        proc, self.proc = self.proc, None
        if proc is None:
            return 0
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(sig)
        code = proc.wait(timeout=STARTUP_S)
        assert proc.stdout is not None
        proc.stdout.close()
        return code

    def log_tail(self, chars: int = 3000) -> str:
        """The end of the latest start's stderr."""
        return (self.logs / f"server-{self.starts}.log").read_text()[-chars:]


@contextlib.contextmanager
def broker_process(tmp_path: Path, *flags: str) -> Iterator[BrokerProcess]:
    """A :class:`BrokerProcess` on a free port (not started yet), killed on the way out."""
    logs = tmp_path / "logs"
    logs.mkdir()
    server = BrokerProcess(tmp_path / "data", free_port(), logs, flags)
    try:
        yield server
    finally:
        server.stop(signal.SIGKILL)
