"""One size limit, one name: ``max_message_bytes`` (the topic setting's name everywhere).
The old name of the serve setting, ``max_batch_bytes``, still works in the file, the
environment and the flags, with a warning that names the new one."""

from __future__ import annotations

import re
import signal
import subprocess
from pathlib import Path

import pytest

from tests.cli._support import STARTUP_S, popen_serve, run_cli
from tidewire.client import Client
from tidewire.config import load_settings, unknown_env_vars
from tidewire.errors import InvalidConfigError

NEW = "max_message_bytes"


def test_the_new_name_sets_the_limit() -> None:
    s = load_settings(env={"TIDEWIRE_MAX_MESSAGE_BYTES": "4096"})
    assert s.broker.log.max_batch_bytes == 4096
    assert s.value(NEW) == 4096
    assert s.origins[NEW] == "environment variable TIDEWIRE_MAX_MESSAGE_BYTES"
    assert s.warnings == ()


def test_old_flag_works_and_warns() -> None:
    s = load_settings(env={}, flags={"max_batch_bytes": 2048})
    assert s.broker.log.max_batch_bytes == 2048
    assert s.origins[NEW] == "flag --max-batch-bytes"
    assert s.warnings == (
        "flag --max-batch-bytes is deprecated, use --max-message-bytes (the same setting)",
    )
    with pytest.raises(InvalidConfigError) as err:
        load_settings(env={}, flags={"max_batch_bytes": 2048, NEW: 4096})
    assert err.value.message == (
        "flags --max-batch-bytes and --max-message-bytes are the same setting: "
        "give only --max-message-bytes"
    )


def test_old_env_var_works_and_warns() -> None:
    env = {"TIDEWIRE_MAX_BATCH_BYTES": "3000"}
    s = load_settings(env=env)
    assert s.broker.log.max_batch_bytes == 3000
    assert s.warnings == (
        "environment variable TIDEWIRE_MAX_BATCH_BYTES is deprecated, use "
        "TIDEWIRE_MAX_MESSAGE_BYTES (the same setting)",
    )
    assert unknown_env_vars(env) == []  # known, not a typo
    with pytest.raises(InvalidConfigError, match="are the same setting"):
        load_settings(env={**env, "TIDEWIRE_MAX_MESSAGE_BYTES": "3000"})


def test_old_file_key_works_and_warns(tmp_path: Path) -> None:
    path = tmp_path / "t.toml"
    path.write_text("[log]\nmax_batch_bytes = 5000\n", encoding="utf-8")
    s = load_settings(path, env={})
    assert s.broker.log.max_batch_bytes == 5000
    assert s.warnings == (
        f"{path} [log] max_batch_bytes is deprecated, use max_message_bytes (the same setting)",
    )
    path.write_text("[log]\nmax_batch_bytes = 5000\nmax_message_bytes = 5000\n", "utf-8")
    with pytest.raises(InvalidConfigError) as err:
        load_settings(path, env={})
    assert err.value.message == (
        f"{path} [log]: max_batch_bytes and max_message_bytes are the same setting: "
        "keep only max_message_bytes"
    )
    # config show says it too, on stderr.
    path.write_text("[log]\nmax_batch_bytes = 5000\n", encoding="utf-8")
    shown = run_cli(["config", "show", "-c", str(path)])
    assert shown.exit_code == 0
    assert "max_message_bytes = 5000" in shown.stdout
    # A line of its own: stderr is the process's, so a line logged meanwhile by a thread an
    # earlier test left running may come first.
    assert any(
        line.startswith(f"warning: {path} [log] max_batch_bytes is deprecated")
        for line in shown.stderr.splitlines()
    ), shown.stderr


def test_out_of_range_names_the_setting() -> None:
    with pytest.raises(InvalidConfigError) as err:
        load_settings(env={}, flags={NEW: 10})
    assert err.value.message == (
        "flag --max-message-bytes: max_message_bytes=10 must be within 61..268,435,456"
    )


def test_serve_takes_the_old_flag_and_logs_a_warning(tmp_path: Path) -> None:
    proc = popen_serve(
        "--data-dir",
        str(tmp_path),
        "--port",
        "0",
        "--max-batch-bytes",
        "2048",
        stderr=subprocess.PIPE,
    )
    try:
        assert proc.stdout is not None
        m = re.search(r"listening on 127\.0\.0\.1:(\d+)", proc.stdout.readline())
        assert m is not None
        with Client(f"127.0.0.1:{m.group(1)}") as client:
            client.create_topic("t", 1)
            assert client.describe_topic("t").config.max_message_bytes == 2048
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=STARTUP_S)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate(timeout=STARTUP_S)
    assert proc.returncode == 0
    assert (
        "WARNING tidewire: flag --max-batch-bytes is deprecated, use --max-message-bytes "
        "(the same setting)" in err
    )
