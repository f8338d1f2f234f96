"""Safe defaults of ``tidewire serve``: loopback unless told otherwise, no open network
listener without authentication unless ``allow_anonymous``, and the first superuser's key
written to a file only its owner reads, never printed or logged."""

from __future__ import annotations

import re
import signal
import stat
import subprocess
from pathlib import Path

from tests.cli._support import STARTUP_S, popen_serve, run_cli, stop
from tidewire.client import Client
from tidewire.errors import AuthenticationFailedError
from tidewire.security.credentials import Credentials


def test_a_non_loopback_listener_without_authentication_is_refused(tmp_path: Path) -> None:
    result = run_cli(["serve", "--data-dir", str(tmp_path), "--host", "0.0.0.0", "--port", "0"])
    assert result.exit_code == 1
    assert "listening on 0.0.0.0 (not loopback) with authentication off" in result.output
    assert "allow_anonymous" in result.output
    assert not (tmp_path / "__consumer_offsets").exists()


def test_allow_anonymous_starts_and_warns(tmp_path: Path) -> None:
    proc = popen_serve(
        "--data-dir",
        str(tmp_path),
        "--host",
        "0.0.0.0",
        "--port",
        "0",
        "--allow-anonymous",
        stderr=subprocess.PIPE,
    )
    try:
        assert proc.stdout is not None
        assert "listening on 0.0.0.0:" in proc.stdout.readline()
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=STARTUP_S)
    finally:
        stop(proc)
    assert "authentication is off and the broker listens on 0.0.0.0" in err


def test_the_first_start_with_authentication_writes_the_superusers_key_to_a_file(
    tmp_path: Path,
) -> None:
    data = tmp_path / "data"
    proc = popen_serve(
        "--data-dir",
        str(data),
        "--port",
        "0",
        "--authentication",
        "--superusers",
        "root",
        stderr=subprocess.PIPE,
    )
    try:
        assert proc.stdout is not None
        lines = [proc.stdout.readline(), proc.stdout.readline()]
        port = next(
            int(m.group(1)) for line in lines if (m := re.search(r"127\.0\.0\.1:(\d+)", line))
        )
        key_file = data / "bootstrap-admin.key"
        assert any(str(key_file) in line for line in lines)
        assert stat.S_IMODE(key_file.stat().st_mode) == 0o600
        key = key_file.read_text().strip()
        with Client(f"127.0.0.1:{port}", credentials=Credentials(key)) as c:
            me = c.whoami()
            assert (me.principal, me.superuser, me.roles) == ("root", True, ["admin"])
        with Client(f"127.0.0.1:{port}") as anon:
            try:
                anon.list_topics()
                raise AssertionError("an anonymous request was served")
            except AuthenticationFailedError:
                pass
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=STARTUP_S)
    finally:
        stop(proc)
    secret = key.split("_", 2)[2]
    assert secret not in out + err + "".join(lines)
