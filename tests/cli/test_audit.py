"""``tidewire audit`` against a real broker process: the table, ``--json``, the filters and
their usage errors."""

from __future__ import annotations

import json
from pathlib import Path

from tests.cli._support import Broker, run_cli, serving


def test_audit_table_and_json(broker: Broker) -> None:
    assert broker.cli("topic", "create", "orders", "--partitions", "2").exit_code == 0
    assert broker.cli("topic", "delete", "nope").exit_code == 1
    assert broker.cli("topic", "delete", "orders").exit_code == 0

    r = broker.cli("audit", "--json")
    assert r.exit_code == 0, r.stderr
    events = json.loads(r.stdout)
    assert [(e["action"], e["resource"], e["outcome"]) for e in events] == [
        ("CREATE_TOPIC", "topic:orders", "ok"),
        ("DELETE_TOPIC", "topic:nope", "failed"),
        ("DELETE_TOPIC", "topic:orders", "ok"),
    ]
    first = events[0]
    assert set(first) == {
        "time_ms",
        "time",
        "principal",
        "source",
        "interface",
        "action",
        "resource",
        "outcome",
        "reason",
        "detail",
    }
    assert first["principal"] is None
    assert first["interface"] == "binary"
    assert first["time"].endswith("Z")

    r = broker.cli("audit", "--outcome", "failed", "--since", "1h", "--json")
    assert r.exit_code == 0, r.stderr
    [failed] = json.loads(r.stdout)
    assert failed["resource"] == "topic:nope"
    assert "nope" in failed["reason"]
    assert json.loads(broker.cli("audit", "--until", "1h", "--json").stdout) == []
    assert len(json.loads(broker.cli("audit", "--limit", "2", "--json").stdout)) == 2
    assert json.loads(broker.cli("audit", "--principal", "alice", "--json").stdout) == []

    wide = {"COLUMNS": "200"}
    text = run_cli(["audit", "--action", "DELETE_TOPIC", "--addr", broker.addr], env=wide).stdout
    assert "time (UTC)" in text
    assert "topic:nope" in text
    assert "topic:orders" in text
    assert "CREATE_TOPIC" not in text
    assert "127.0.0.1:" in text
    assert "(binary)" in text  # the gate gives the source
    narrow = broker.cli("audit").stdout  # 80 columns: wrapped, nothing cut
    assert "…" not in narrow
    nothing = broker.cli("audit", "--principal", "alice")
    assert nothing.exit_code == 0
    assert nothing.stdout == "no audit events match\n"


def test_audit_usage_errors() -> None:
    r = run_cli(["audit", "--outcome", "maybe"])
    assert r.exit_code == 2
    assert "--outcome 'maybe' must be one of allowed, denied, failed, ok" in r.stderr
    r = run_cli(["audit", "--since", "yesterday-ish"])
    assert r.exit_code == 2
    assert "--since 'yesterday-ish' is neither ISO-8601" in r.stderr
    r = run_cli(["audit", "--since", "1h", "--until", "2h"])
    assert r.exit_code == 2
    assert "--until (2h) is before --since (1h)" in r.stderr
    r = run_cli(["audit", "--limit", "0"])
    assert r.exit_code == 2


def test_serve_sets_the_audit_retention(tmp_path: Path) -> None:
    day = 86_400_000
    with serving(tmp_path / "data", "--audit-retention-ms", str(day)) as (_, port):
        r = run_cli(["topic", "create", "t", "--addr", f"127.0.0.1:{port}"])
        assert r.exit_code == 0, r.stderr
        # the first event created the log, with the broker's setting
        config = json.loads((tmp_path / "data" / "__audit-0" / "log.json").read_text())
        assert config["retention_ms"] == day
