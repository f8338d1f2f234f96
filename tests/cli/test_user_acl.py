"""``tidewire user | key | acl | quota`` against a real broker process, in text and JSON."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import pytest

from tests.cli._support import Broker, run_cli, serving
from tidewire.broker import Broker as TwBroker
from tidewire.broker import BrokerConfig
from tidewire.cli._user import format_ms, parse_expires
from tidewire.security.config import SecurityConfig
from tidewire.security.credentials import Credentials
from tidewire.security.keys import parse_key


def ok(broker: Broker, *args: str, input: str | None = None) -> str:
    r = broker.cli(*args, input=input)
    assert r.exit_code == 0, (args, r.stdout, r.stderr)
    return r.stdout


def test_users_and_keys(broker: Broker) -> None:
    out = ok(broker, "user", "create", "alice", "--role", "producer", "-d", "orders team")
    assert out == "created user alice (producer)\n"
    doc = json.loads(ok(broker, "user", "create", "etl", "--service", "--json"))
    assert (doc["name"], doc["kind"], doc["roles"]) == ("etl", "service", [])

    listed = json.loads(ok(broker, "user", "list", "--json"))
    assert [(p["name"], p["kind"], p["roles"]) for p in listed] == [
        ("alice", "user", ["producer"]),
        ("etl", "service", []),
    ]
    table = ok(broker, "user", "list")
    assert "alice" in table
    assert "orders team" in table
    assert "service" in table

    r = broker.cli("key", "create", "alice", "--expires", "30d", "-d", "ci")
    assert r.exit_code == 0, r.stderr
    first, whole = r.stdout.splitlines()
    key_id, _ = parse_key(whole)
    assert first.startswith(f"created API key {key_id} of alice, expires 20")
    assert "only time the key is shown" in r.stderr
    doc = json.loads(ok(broker, "key", "create", "alice", "--json"))
    assert doc["api_key"].startswith(f"twk_{doc['id']}_")
    assert (doc["principal"], doc["state"], doc["expires_ms"]) == ("alice", "active", 0)

    keys = json.loads(ok(broker, "key", "list", "alice", "--json"))
    assert [(k["id"], k["state"], k["description"]) for k in keys] == [
        (key_id, "active", "ci"),
        (doc["id"], "active", ""),
    ]
    assert all("api_key" not in k and "secret_hash" not in k for k in keys)
    assert whole not in ok(broker, "key", "list")
    assert whole not in ok(broker, "user", "describe", "alice")

    assert ok(broker, "key", "revoke", key_id) == f"revoked API key {key_id} of alice\n"
    described = json.loads(ok(broker, "user", "describe", "alice", "--json"))
    assert {k["id"]: k["state"] for k in described["keys"]} == {
        key_id: "revoked",
        doc["id"]: "active",
    }
    text = ok(broker, "user", "describe", "alice")
    assert "user alice: roles producer" in text
    assert "revoked" in text

    assert ok(broker, "user", "roles", "alice", "--role", "viewer", "--role", "consumer") == (
        "alice: roles viewer, consumer\n"
    )
    assert ok(broker, "user", "roles", "alice", "--clear") == "alice: roles -\n"

    # delete asks first; "n" keeps it
    r = broker.cli("user", "delete", "alice", input="n\n")
    assert r.exit_code == 1
    assert "not deleted" in r.stderr
    out = ok(broker, "user", "delete", "alice", input="y\n")
    assert out.endswith("deleted alice with 2 API key(s) and 0 ACL entr(ies)\n")
    doc = json.loads(ok(broker, "user", "delete", "etl", "--yes", "--json"))
    assert doc == {"deleted": "etl", "keys_deleted": 0, "acls_deleted": 0}
    assert json.loads(ok(broker, "user", "list", "--json")) == []


def test_errors_are_one_line(broker: Broker) -> None:
    r = broker.cli("user", "create", "alice", "--role", "prodcer")
    assert r.exit_code == 1
    assert r.stderr.startswith("error: unknown role 'prodcer': the built-in roles are admin,")
    r = broker.cli("user", "describe", "bob")
    assert (r.exit_code, r.stderr) == (1, "error: no principal named 'bob'\n")
    r = broker.cli("key", "create", "bob")
    assert (r.exit_code, r.stderr) == (1, "error: no principal named 'bob'\n")
    r = broker.cli("key", "create", "bob", "--expires", "soon")
    assert r.exit_code == 2
    assert "--expires 'soon' is neither 'never', a duration" in r.stderr
    r = broker.cli("user", "roles", "bob")
    assert r.exit_code == 2
    assert "give the new roles with --role" in r.stderr
    r = broker.cli("acl", "add", "-p", "alice", "--topic", "t", "--group", "g", "-o", "read")
    assert r.exit_code == 2
    assert "exactly one of --topic, --group, --cluster, --resource-type" in r.stderr
    r = broker.cli("acl", "add", "-p", "alice", "--topic", "t", "-o", "eat")
    assert r.exit_code == 2
    assert "--operation 'eat' is not one of" in r.stderr
    r = broker.cli("quota", "set", "alice")
    assert r.exit_code == 2
    r = broker.cli("key", "list", "--sasl-mechanism", "MD5")
    assert r.exit_code == 2
    assert "--sasl-mechanism 'MD5'" in r.stderr


def test_acls(broker: Broker) -> None:
    out = ok(broker, "acl", "add", "-p", "alice", "--topic", "orders", "-o", "read", "-o", "write")
    assert out.startswith("added 2 ACL entries\n")
    added = json.loads(
        ok(
            broker,
            "acl",
            "add",
            "-p",
            "role:ops",
            "--topic",
            "logs.",
            "--prefix",
            "-o",
            "write",
            "--json",
        )
    )
    assert added == [
        {
            "principal": "role:ops",
            "resource_type": "topic",
            "pattern": "logs.",
            "pattern_type": "prefix",
            "operation": "write",
            "effect": "allow",
        }
    ]
    ok(broker, "acl", "add", "-p", "*", "--group", "*", "-o", "delete", "--deny")
    ok(broker, "acl", "add", "-p", "ops", "--cluster", "-o", "alter")
    ok(broker, "acl", "add", "-p", "ops", "--resource-type", "queue", "--name", "q1", "-o", "read")
    # a role an ACL names may now be given
    ok(broker, "user", "create", "olga", "--role", "ops")

    assert len(json.loads(ok(broker, "acl", "list", "--json"))) == 6
    mine = json.loads(ok(broker, "acl", "list", "-p", "alice", "--json"))
    assert sorted(e["operation"] for e in mine) == ["read", "write"]
    covering = json.loads(ok(broker, "acl", "list", "--topic", "logs.app", "--json"))
    assert [e["principal"] for e in covering] == ["role:ops"]
    groups = json.loads(ok(broker, "acl", "list", "--group", "anything", "--json"))
    assert [(e["principal"], e["effect"]) for e in groups] == [("*", "deny")]
    cluster = json.loads(ok(broker, "acl", "list", "--resource-type", "cluster", "--json"))
    assert [(e["principal"], e["pattern"]) for e in cluster] == [("ops", "cluster")]
    text = ok(broker, "acl", "list")
    assert "role:ops" in text
    assert "deny" in text
    assert "prefix" in text

    out = ok(broker, "acl", "remove", "-p", "alice", "--topic", "orders", "-o", "write")
    assert out.startswith("removed 1 ACL entry\n")
    assert ok(broker, "acl", "remove", "-p", "alice", "--topic", "orders", "-o", "write") == (
        "removed 0 ACL entries\n"
    )
    assert len(json.loads(ok(broker, "acl", "list", "--json"))) == 5
    assert ok(broker, "acl", "list", "-p", "nobody") == "no ACL entries\n"


def test_quotas(broker: Broker) -> None:
    ok(broker, "user", "create", "alice")
    out = ok(broker, "quota", "set", "alice", "--produce-bytes-per-s", "1048576")
    assert out == "alice: produce 1,048,576 B/s, fetch default B/s, default requests/s\n"
    doc = json.loads(ok(broker, "quota", "set", "alice", "--requests-per-s", "0", "--json"))
    assert doc == {
        "principal": "alice",
        "produce_bytes_per_s": 1048576,
        "fetch_bytes_per_s": -1,
        "requests_per_s": 0,
    }
    listed = json.loads(ok(broker, "quota", "list", "--json"))
    assert [q["principal"] for q in listed["quotas"]] == ["alice"]
    assert listed["defaults"]["principal"] == "*"
    text = ok(broker, "quota", "list")
    assert "alice" in text
    assert "1,048,576" in text
    assert "none" in text
    r = broker.cli("quota", "set", "bob", "--requests-per-s", "5")
    assert (r.exit_code, r.stderr) == (1, "error: no principal named 'bob'\n")
    r = broker.cli("quota", "set", "alice", "--requests-per-s", "-2")
    assert r.exit_code == 2
    assert ok(broker, "quota", "clear", "alice") == "alice: the broker's default quotas apply\n"
    assert json.loads(ok(broker, "quota", "list", "--json"))["quotas"] == []


def test_api_key_option_and_environment() -> None:
    lines = run_cli(["user", "list", "--help"], env={"COLUMNS": "200"}).stdout
    assert "--api-key" in lines
    assert "TIDEWIRE_API_KEY" in lines
    assert "--sasl-mechanism" in lines
    assert "SCRAM-SHA-256" in lines
    key = "twk_0123456789ab_" + "s" * 43
    # The key's secret never shows in a repr (logs, tracebacks).
    assert "s" * 43 not in repr(Credentials(api_key=key))
    assert "0123456789ab" in repr(Credentials(api_key=key))


def test_parse_expires() -> None:
    now = 1_700_000_000_000
    assert parse_expires("never", now) == 0
    assert parse_expires("30d", now) == now + 30 * 86_400_000
    assert parse_expires("12h", now) == now + 12 * 3_600_000
    assert parse_expires("2099-01-01T00:00:00+00:00", now) == 4070908800000
    with pytest.raises(ValueError, match="not in the future"):
        parse_expires("2001-01-01T00:00:00Z", now)
    with pytest.raises(ValueError, match="above 0"):
        parse_expires("0d", now)
    assert format_ms(4070908800000) == "2099-01-01T00:00:00Z"
    assert format_ms(0, "never") == "never"
    assert int(time.time() * 1000) < parse_expires("1m", int(time.time() * 1000)) + 1


def test_with_authentication_on(tmp_path: Path) -> None:
    """The commands authenticate with --api-key or TIDEWIRE_API_KEY; without, the broker
    refuses them."""
    data = tmp_path / "data"

    async def bootstrap() -> None:  # the first start writes the superuser's key
        config = SecurityConfig(authentication=True, superusers="admin")
        async with TwBroker(BrokerConfig(str(data)), security=config):
            pass

    asyncio.run(bootstrap())
    with serving(data, "--authentication", "--superusers", "admin") as (proc, port):
        broker = Broker(proc, port)
        admin_key = (data / "bootstrap-admin.key").read_text().strip()
        r = broker.cli("user", "list")
        assert r.exit_code == 1
        assert r.stderr.startswith("error: ")
        out = ok(broker, "user", "create", "ops", "--api-key", admin_key)
        assert out == "created user ops (no roles)\n"
        r = run_cli(
            ["key", "create", "ops", "--json", "--addr", broker.addr],
            env={"TIDEWIRE_API_KEY": admin_key, "TIDEWIRE_SASL_MECHANISM": "SCRAM-SHA-512"},
        )
        assert r.exit_code == 0, r.stderr
        ops_key = json.loads(r.stdout)["api_key"]
        # ops has no permission: it may list its own keys, not everyone's
        own = json.loads(ok(broker, "key", "list", "ops", "--json", "--api-key", ops_key))
        assert [k["principal"] for k in own] == ["ops"]
        r = broker.cli("key", "list", "--api-key", ops_key)
        assert r.exit_code == 1
        assert r.stderr.startswith("error: ")
        r = broker.cli("user", "list", "--api-key", "nonsense")
        assert r.exit_code == 2
        assert r.stderr.startswith("error: --api-key: malformed API key")
