"""``tidewire health``: exit code 0 with the version and round trip, 1 with the reason."""

from __future__ import annotations

import json
import re

from tests.cli._support import Broker, closed_port, run_cli
from tidewire import __version__


def test_healthy_text(broker: Broker) -> None:
    result = broker.cli("health")
    assert result.exit_code == 0, result.stderr
    assert re.fullmatch(
        rf"healthy: tidewire {re.escape(__version__)} at {broker.addr}, "
        r"round trip \d+\.\d{3} ms\n",
        result.stdout,
    )


def test_healthy_json(broker: Broker) -> None:
    result = broker.cli("health", "--json")
    assert result.exit_code == 0
    doc = json.loads(result.stdout)
    assert doc["healthy"] is True
    assert doc["addr"] == broker.addr
    assert doc["server_version"] == __version__
    assert isinstance(doc["rtt_ms"], float)
    assert doc["rtt_ms"] >= 0


def test_unreachable() -> None:
    addr = f"127.0.0.1:{closed_port()}"
    text = run_cli(["health", "--addr", addr, "--timeout", "2"])
    assert text.exit_code == 1
    assert text.stdout == ""
    assert text.stderr.startswith(f"unhealthy: {addr}: cannot connect to {addr}: ")
    assert text.stderr.count("\n") == 1
    as_json = run_cli(["health", "--addr", addr, "--json"])
    assert as_json.exit_code == 1
    doc = json.loads(as_json.stdout)
    assert doc["healthy"] is False
    assert doc["addr"] == addr
    assert doc["error"].startswith(f"cannot connect to {addr}: ")


def test_bad_addr() -> None:
    result = run_cli(["health", "--addr", "127.0.0.1:99999"])
    assert result.exit_code == 2
    assert result.stderr == (
        "error: --addr: address '127.0.0.1:99999' must be HOST:PORT with a port in 1..65535\n"
    )
