"""Every client command authenticates with ``--api-key`` or ``TIDEWIRE_API_KEY`` against a
broker with authentication on; a refused key is one line ``error: ...`` and exit 1, and the
key never shows in anything a command prints."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Iterator

import pytest
from typer.testing import Result

from tests.cli._support import Broker, run_cli, serving
from tidewire.broker import Broker as TwBroker
from tidewire.broker import BrokerConfig
from tidewire.security.config import SecurityConfig
from tidewire.security.keys import parse_key


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Broker, str]]:
    """A ``tidewire serve --authentication`` process and the superuser's key."""
    data = tmp_path_factory.mktemp("auth") / "data"

    async def bootstrap() -> None:  # the first start writes the superuser's key
        config = SecurityConfig(authentication=True, superusers="admin")
        async with TwBroker(BrokerConfig(str(data)), security=config):
            pass

    asyncio.run(bootstrap())
    admin_key = (data / "bootstrap-admin.key").read_text().strip()
    with serving(data, "--authentication", "--superusers", "admin", "--partitions", "2") as (
        proc,
        port,
    ):
        yield Broker(proc, port), admin_key


def cli(
    broker: Broker,
    *args: str,
    key: str | None = None,
    env_key: str | None = None,
    input: str | None = None,
) -> Result:
    """``tidewire ARGS --addr BROKER``, with ``--api-key key`` and/or TIDEWIRE_API_KEY."""
    extra = [] if key is None else ["--api-key", key]
    env = {} if env_key is None else {"TIDEWIRE_API_KEY": env_key}
    return run_cli([*args, "--addr", broker.addr, *extra], env=env, input=input)


def ok(r: Result) -> str:
    assert r.exit_code == 0, (r.stdout, r.stderr)
    return r.stdout


def refused(r: Result, *secrets: str) -> None:
    """Exit 1 with one line ``error: ...`` naming an authentication failure, no secret in it."""
    assert r.exit_code == 1, (r.stdout, r.stderr)
    assert r.stderr.startswith("error: ")
    assert r.stderr.count("\n") == 1, r.stderr
    assert "authentication" in r.stderr.lower()
    for secret in secrets:
        assert secret not in r.stdout + r.stderr


def wrong(key: str) -> str:
    key_id, secret = parse_key(key)
    return f"twk_{key_id}_{'A' if secret[0] != 'A' else 'B'}{secret[1:]}"


@pytest.fixture(scope="module")
def keys(secured: tuple[Broker, str]) -> dict[str, str]:
    """Keys of "app" (may do anything with topics and groups) and of "admin"."""
    broker, admin = secured
    ok(cli(broker, "user", "create", "app", "--role", "producer", "--role", "consumer", key=admin))
    for resource in ("--topic", "--group"):
        ok(
            cli(
                broker,
                "acl",
                "add",
                "--principal",
                "app",
                resource,
                "*",
                "--operation",
                "all",
                key=admin,
            )
        )
    ok(
        cli(
            broker,
            "acl",
            "add",
            "--principal",
            "app",
            "--cluster",
            "--operation",
            "write",
            key=admin,
        )
    )
    app = json.loads(ok(cli(broker, "key", "create", "app", "--json", key=admin)))["api_key"]
    return {"admin": admin, "app": app}


def test_topic_publish_consume_group_with_the_option_and_the_variable(
    secured: tuple[Broker, str], keys: dict[str, str], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    broker, _ = secured
    app = keys["app"]
    outputs: list[str] = []
    r = cli(broker, "topic", "create", "orders", "--partitions", "2", key=app)
    outputs.append(ok(r) + r.stderr)
    r = cli(broker, "publish", "orders", "-", env_key=app, input="a\nb\nc\n")
    outputs.append(ok(r) + r.stderr)
    r = cli(
        broker, "consume", "orders", "--from-beginning", "--count", "3", "--timeout", "5", key=app
    )
    assert sorted(ok(r).split()) == ["a", "b", "c"]
    r = cli(
        broker, "consume", "orders", "--group", "g", "--from-beginning", "--count", "3",
        "--timeout", "10", env_key=app,
    )  # fmt: skip
    assert sorted(ok(r).split()) == ["a", "b", "c"]
    r = cli(broker, "group", "describe", "g", "--json", key=app)
    outputs.append(ok(r) + r.stderr)
    r = cli(broker, "topic", "describe", "orders", "--json", key=app)
    outputs.append(ok(r) + r.stderr)
    assert json.loads(outputs[-1])["name"] == "orders"
    r = cli(broker, "health", key=app)
    outputs.append(r.stdout + r.stderr)
    assert r.exit_code in (0, 1), r.stderr  # reachable and authenticated: not an auth error
    assert "authentication" not in r.stderr.lower()
    r = cli(broker, "audit", "--json", key=keys["admin"])
    outputs.append(ok(r) + r.stderr)
    r = cli(broker, "tail", "--topic", "orders", "--count", "3", key=app)  # brokectl's spelling
    outputs.append(ok(r) + r.stderr)
    r = cli(broker, "topic", "list", key=wrong(app))
    outputs.append(r.stdout + r.stderr)
    for secret in (app, parse_key(app)[1], keys["admin"], parse_key(keys["admin"])[1]):
        assert all(secret not in out for out in outputs)
        assert secret not in caplog.text


@pytest.mark.parametrize(
    "args",
    [
        ("topic", "list"),
        ("publish", "orders", "x"),
        ("consume", "orders", "--count", "1", "--timeout", "5"),
        ("consume", "orders", "--group", "g2", "--count", "1", "--timeout", "5"),
        ("group", "list"),
        ("audit",),
        ("bench", "produce", "--topic", "orders", "--messages", "10"),
        ("bench", "consume", "--topic", "orders", "--messages", "1", "--timeout", "5"),
        ("consumer", "list"),
    ],
    ids=lambda a: "-".join(a[:2]),
)
def test_a_wrong_or_missing_key_is_one_line_and_exit_1(
    secured: tuple[Broker, str], keys: dict[str, str], args: tuple[str, ...]
) -> None:
    broker, _ = secured
    bad = wrong(keys["app"])
    refused(cli(broker, *args, key=bad), bad, parse_key(bad)[1])
    refused(cli(broker, *args, env_key=bad), bad, parse_key(bad)[1])
    refused(cli(broker, *args))


def test_bench_authenticates_every_connection(
    secured: tuple[Broker, str], keys: dict[str, str]
) -> None:
    broker, _ = secured
    app = keys["app"]
    args = ("--topic", "bench-auth", "--messages", "200", "--json")
    produced = json.loads(ok(cli(broker, "bench", "produce", *args, "--size", "64", key=app)))
    assert produced["messages"] == 200
    consumed = json.loads(ok(cli(broker, "bench", "consume", *args, env_key=app)))
    assert consumed["messages"] == 200
    # e2e: the group's members are processes of their own, given the key too.
    r = cli(
        broker, "bench", "e2e", "--topic", "e2e-auth", "--messages", "300", "--size", "64",
        "--consumers", "1", "--partitions", "2", "--json", key=app,
    )  # fmt: skip
    doc = json.loads(ok(r))
    assert (doc["messages"], doc["delivered"]) == (300, 300)
    assert app not in r.stdout + r.stderr


def test_an_invalid_mechanism_or_key_is_a_usage_error(
    secured: tuple[Broker, str], keys: dict[str, str]
) -> None:
    broker, _ = secured
    r = run_cli(
        ["topic", "list", "--addr", broker.addr, "--sasl-mechanism", "MD5"],
        env={"TIDEWIRE_API_KEY": keys["app"]},
    )
    assert r.exit_code == 2
    assert r.stderr.startswith("error: --sasl-mechanism 'MD5'")
    r = cli(broker, "topic", "list", key="twk_nonsense")
    assert r.exit_code == 2
    assert r.stderr.startswith("error: --api-key: ")
    assert "nonsense" not in r.stderr


@pytest.mark.parametrize(
    "command",
    [
        ("topic", "create"),
        ("group", "list"),
        ("publish",),
        ("consume",),
        ("health",),
        ("audit",),
        ("export",),
        ("bench", "produce"),
        ("bench", "consume"),
        ("bench", "e2e"),
        ("tail",),
        ("consumer", "list"),
        ("user", "list"),
    ],
    ids=" ".join,
)
def test_every_client_command_has_the_credential_options(command: tuple[str, ...]) -> None:
    r = run_cli([*command, "--help"], env={"COLUMNS": "200"})
    assert r.exit_code == 0, r.stderr
    for text in ("--api-key", "TIDEWIRE_API_KEY", "--sasl-mechanism"):
        assert text in r.stdout, (command, text)
