"""``tidewire serve`` with JSON logs and tracing configured through the standard OTEL_*
variables (the console exporter, so the spans can be read from its standard output), and the
error when tracing is asked for without the SDK."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.cli._support import STARTUP_S, serving
from tidewire.client import Client, Message
from tidewire.observability import tracing


def test_serve_exports_spans_when_otel_variables_ask(tmp_path: Path) -> None:
    env = {"OTEL_TRACES_EXPORTER": "console", "OTEL_SERVICE_NAME": "broker-under-test"}
    with serving(tmp_path / "data", env=env) as (proc, port):
        with Client(f"127.0.0.1:{port}") as client:
            client.create_topic("t", 1)
            client.produce("t", 0, [Message(b"v")])
        os.kill(proc.pid, signal.SIGTERM)
        out, _ = proc.communicate(timeout=STARTUP_S)
    spans = _console_spans(out)
    produce = [s for s in spans if s["name"] == "produce t"]
    assert len(produce) == 1, [s["name"] for s in spans]
    attrs = produce[0]["attributes"]
    assert attrs["messaging.system"] == "tidewire"
    assert attrs["messaging.operation.type"] == "publish"
    assert attrs["messaging.destination.name"] == "t"
    assert attrs["messaging.batch.message_count"] == 1
    assert produce[0]["kind"] == "SpanKind.SERVER"
    assert produce[0]["resource"]["attributes"]["service.name"] == "broker-under-test"


def test_serve_log_lines_are_json(tmp_path: Path) -> None:
    cmd = [sys.executable, "-m", "tidewire", "serve", "--data-dir", str(tmp_path / "d")]
    cmd += ["--port", "0", "--log-format", "json", "--log-level", "info"]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TIDEWIRE_", "OTEL_"))}
    env["PYTHONPATH"] = os.pathsep.join(sys.path)
    proc = subprocess.Popen(
        cmd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        text=True,
        env=env,
    )
    try:
        assert proc.stdout is not None
        assert "listening on 127.0.0.1:" in proc.stdout.readline()
        os.kill(proc.pid, signal.SIGTERM)
        _, err = proc.communicate(timeout=STARTUP_S)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    lines = [json.loads(line) for line in err.splitlines() if line.strip()]
    assert lines, err
    for doc in lines:
        assert {"ts", "level", "logger", "message"} <= set(doc)
        assert doc["logger"].startswith("tidewire")


def test_a_bad_log_level_is_refused(tmp_path: Path) -> None:
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "tidewire",
            "serve",
            "--data-dir",
            str(tmp_path),
            "--log-level",
            "loud",
        ],
        capture_output=True,
        text=True,
        timeout=STARTUP_S,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
        check=False,
    )
    assert r.returncode == 2
    assert "log_level='loud' must be one of CRITICAL, ERROR, WARNING, INFO, DEBUG" in r.stderr


def test_tracing_without_the_sdk_says_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "opentelemetry.sdk.trace", None)  # as if not installed
    with pytest.raises(tracing.OtelMissingError, match=r"pip install 'tidewire\[otel\]'"):
        tracing.setup_tracing(enabled=True, endpoint="", env={})
    # not asked for: nothing is imported, nothing fails
    assert tracing.setup_tracing(enabled=False, endpoint="", env={}) is None
    assert (
        tracing.setup_tracing(enabled=True, endpoint="", env={"OTEL_SDK_DISABLED": "true"}) is None
    )


def test_which_variables_turn_tracing_on() -> None:
    assert not tracing.wanted_by_env({})
    assert tracing.wanted_by_env({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"})
    assert tracing.wanted_by_env({"OTEL_TRACES_EXPORTER": "otlp"})
    assert not tracing.wanted_by_env({"OTEL_TRACES_EXPORTER": "none"})
    assert not tracing.wanted_by_env(
        {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318", "OTEL_SDK_DISABLED": "true"}
    )


def _console_spans(out: str) -> list[dict[str, object]]:
    """The spans the console exporter printed (pretty JSON objects, one after another),
    after the listening lines."""
    decoder = json.JSONDecoder()
    spans: list[dict[str, object]] = []
    pos = out.find("{")
    while pos != -1:
        doc, end = decoder.raw_decode(out, pos)
        if isinstance(doc, dict) and "context" in doc:
            spans.append(doc)
        pos = out.find("{", end)
    return spans
