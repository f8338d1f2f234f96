"""``tidewire metrics`` against a running broker's HTTP API."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tidewire.cli import app
from tidewire.client import Client
from tidewire.embedded import EmbeddedBroker
from tidewire.records.builder import BatchBuilder


def batch(n: int) -> bytes:
    b = BatchBuilder()
    for i in range(n):
        b.append(b"v%d" % i, timestamp_ms=int(time.time() * 1000))
    return b.build()


def test_summary_and_json(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TIDEWIRE_API_KEY", raising=False)
    runner = CliRunner()
    with EmbeddedBroker(str(tmp_path / "data"), http_port=0).running() as eb:
        with Client(eb.addr) as client:
            client.create_topic("orders", 2)
            client.create_topic("quiet", 1)
            client.produce_batch("orders", 0, batch(30))
            client.produce_batch("orders", 1, batch(12))
            client.commit_offsets("billing", {("orders", 0): 10, ("orders", 1): 12})
        r = runner.invoke(app, ["metrics", "--http-url", eb.http_url, "--json"])
        assert r.exit_code == 0, r.output
        doc = json.loads(r.output)
        assert doc["messages_in"] == 42
        assert doc["messages_out"] == 0
        assert [t["topic"] for t in doc["topics"]] == ["orders", "quiet"]
        assert doc["topics"][0]["messages_in"] == 42
        assert doc["topics"][0]["partitions"] == 2
        assert doc["groups"] == [{"group": "billing", "members": 0, "state": "empty", "lag": 20}]
        r = runner.invoke(app, ["metrics", "-u", eb.http_url])
        assert r.exit_code == 0, r.output
        assert "messages in 42 (" in r.output
        assert "  orders: 2 partitions, in 42, out 0" in r.output
        assert "  billing: lag 20, 0 members, empty" in r.output
    r = runner.invoke(app, ["metrics", "--http-url", "nowhere:80"])
    assert r.exit_code == 2
    assert "must be an http:// or https:// address" in r.output
