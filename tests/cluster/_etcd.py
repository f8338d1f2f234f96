"""A real etcd server for the cluster tests: Debian's ``etcd-server`` (``.ci/run`` installs
it), started on free loopback ports over a scratch directory and stopped by its PID."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

#: Where the tests find etcd: $TIDEWIRE_ETCD, else ``etcd`` on PATH.
ETCD = os.environ.get("TIDEWIRE_ETCD") or shutil.which("etcd")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class EtcdServer:
    def __init__(self, data_dir: Path) -> None:
        self.data_dir = data_dir
        self.client_port = _free_port()
        self.peer_port = _free_port()
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.client_port}"

    def start(self) -> None:
        assert ETCD is not None
        client, peer = self.endpoint, f"http://127.0.0.1:{self.peer_port}"
        log = open(self.data_dir.parent / "etcd.log", "ab")  # noqa: SIM115 (the child's)
        self.proc = subprocess.Popen(
            [
                ETCD,
                *("--data-dir", str(self.data_dir)),
                *("--listen-client-urls", client, "--advertise-client-urls", client),
                *("--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer),
                *("--initial-cluster", f"default={peer}"),
            ],
            stdout=log,
            stderr=log,
        )
        log.close()
        deadline = time.monotonic() + 30
        while True:
            with (
                contextlib.suppress(OSError),
                socket.create_connection(("127.0.0.1", self.client_port), 0.2),
            ):
                return
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"etcd did not start: {self.log_tail()}")
            time.sleep(0.05)

    def log_tail(self) -> str:
        return (self.data_dir.parent / "etcd.log").read_text(errors="replace")[-2000:]

    def stop(self, sig: int = signal.SIGTERM) -> None:
        proc, self.proc = self.proc, None
        if proc is None:
            return
        proc.send_signal(sig)
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.fixture
def etcd(tmp_path: Path) -> Iterator[EtcdServer]:
    if ETCD is None:
        if os.environ.get("CI"):
            raise RuntimeError("etcd is not installed (.ci/run installs Debian's etcd-server)")
        pytest.skip("etcd is not installed (apt-get install etcd-server)")
    server = EtcdServer(tmp_path / "etcd")
    server.start()
    try:
        yield server
    finally:
        server.stop()
