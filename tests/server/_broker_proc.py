"""A broker in a process of its own (``tests.server._serve_process``), with its resident memory
and open descriptors read from /proc, and an optional descriptor limit set before it starts.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.server._serve_process import NOFILE_ENV

#: Startup and shutdown of the broker process (s): generous, for a loaded 2-core machine.
STARTUP_S = 60.0


@dataclass(slots=True)
class BrokerProcess:
    proc: subprocess.Popen[str]
    port: int
    log_path: Path

    @property
    def addr(self) -> str:
        return f"127.0.0.1:{self.port}"

    def rss_bytes(self) -> int:
        """Resident memory (VmRSS) of the broker process."""
        status = Path(f"/proc/{self.proc.pid}/status").read_text()
        m = re.search(r"^VmRSS:\s+(\d+) kB$", status, re.MULTILINE)
        assert m is not None, status
        return int(m.group(1)) * 1024

    def open_fds(self) -> int:
        return len(os.listdir(f"/proc/{self.proc.pid}/fd"))

    def log(self) -> str:
        return self.log_path.read_text()

    def stop(self) -> int:
        """SIGTERM, wait; return the exit status."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=STARTUP_S)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=STARTUP_S)
        return self.proc.returncode


@contextlib.contextmanager
def broker_process(
    data_dir: Path,
    log_path: Path,
    server: dict[str, Any] | None = None,
    *,
    nofile: int | None = None,
    check_start: bool = True,
) -> Iterator[BrokerProcess]:
    """A broker process on 127.0.0.1 and a free port (``server``: ServerConfig fields), with
    the descriptor limit ``nofile`` (soft and hard) if given; always stopped on the way out
    (SIGTERM to its PID, then SIGKILL). Warnings and errors go to ``log_path``."""
    with log_path.open("w") as log:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tests.server._serve_process",
                str(data_dir),
                json.dumps(server or {}),
            ],
            stdout=subprocess.PIPE,
            stderr=log,
            text=True,
            cwd=Path(__file__).parents[2],
            env={
                **os.environ,
                "PYTHONPATH": os.pathsep.join(sys.path),
                NOFILE_ENV: "" if nofile is None else str(nofile),
            },
        )
    assert proc.stdout is not None
    bp = BrokerProcess(proc, 0, log_path)
    try:
        line = proc.stdout.readline()
        m = re.search(r"listening on 127\.0\.0\.1:(\d+)", line)
        if m is None:
            if check_start:
                pytest.fail(f"the broker did not start: {line!r}, log: {log_path.read_text()}")
        else:
            bp.port = int(m.group(1))
        yield bp
    finally:
        bp.stop()
        proc.stdout.close()
