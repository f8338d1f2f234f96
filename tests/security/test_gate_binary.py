"""The gate on the binary protocol: authentication (SCRAM, PLAIN), authorization by ACLs,
revocation on open connections, rate-limited failures, private internal topics."""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import AsyncIterator, Callable, Coroutine
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

from tidewire.broker import Broker, BrokerConfig
from tidewire.client import AsyncClient, Message
from tidewire.errors import (
    AuthenticationFailedError,
    AuthorizationFailedError,
    InternalTopicError,
    TooManyAuthFailuresError,
    UnknownTopicError,
    UnsupportedSaslMechanismError,
)
from tidewire.security.config import SecurityConfig
from tidewire.security.credentials import Credentials
from tidewire.security.model import Acl, Effect, Operation, PatternType, ResourceType
from tidewire.server import TcpServer
from tidewire.server.gate import gate_for
from tidewire.server.tcp import ServerConfig


def aio(fn: Callable[..., Coroutine[Any, Any, None]]) -> Callable[..., None]:
    """Run an async test in a fresh event loop."""

    @functools.wraps(fn)
    def run(*args: Any, **kwargs: Any) -> None:
        asyncio.run(fn(*args, **kwargs))

    return run


@asynccontextmanager
async def secured(
    tmp_path: Path, **security: object
) -> AsyncIterator[tuple[Broker, TcpServer, str]]:
    settings: dict[str, object] = {"authentication": True, "superusers": "admin"}
    settings.update(security)
    broker = Broker(BrokerConfig(str(tmp_path / "data")), security=SecurityConfig(**settings))  # type: ignore[arg-type]
    await broker.start()
    server = TcpServer(broker, ServerConfig(port=0))
    await server.start()
    try:
        yield broker, server, f"127.0.0.1:{server.port}"
    finally:
        await server.close()
        await broker.close()


def admin_key(broker: Broker) -> str:
    assert broker.bootstrap_key_file is not None
    return broker.bootstrap_key_file.read_text().strip()


async def new_user(broker: Broker, name: str, *roles: str) -> str:
    await broker.security.create_principal(name, roles=roles)
    _, key = await broker.security.create_key(name)
    return key


def client(addr: str, key: str | None, mechanism: str = "SCRAM-SHA-256") -> AsyncClient:
    creds = None if key is None else Credentials(key, mechanism)
    return AsyncClient(addr, credentials=creds, request_timeout_s=10)


@aio
async def test_without_credentials_every_api_but_the_handshake_is_refused(tmp_path: Path) -> None:
    async with secured(tmp_path) as (_, _, addr), client(addr, None) as c:
        assert await c.server_version()  # API_VERSIONS is public
        with pytest.raises(AuthenticationFailedError, match="authentication required"):
            await c.list_topics()
        with pytest.raises(AuthenticationFailedError):
            await c.create_topic("t", partitions=1)


@pytest.mark.parametrize("mechanism", ["SCRAM-SHA-256", "SCRAM-SHA-512"])
@aio
async def test_scram_authenticates_and_the_bootstrap_superuser_may_do_everything(
    tmp_path: Path, mechanism: str
) -> None:
    async with (
        secured(tmp_path) as (broker, _, addr),
        client(addr, admin_key(broker), mechanism) as c,
    ):
        await c.create_topic("orders", partitions=2)
        await c.produce("orders", 0, [Message(b"v")])
        assert await c.list_topics() == ["orders"]
        me = await c.whoami()
        assert me.principal == "admin"
        assert me.superuser
        assert me.mechanism == mechanism


@aio
async def test_a_principal_without_an_acl_is_refused_and_nothing_changes(tmp_path: Path) -> None:
    async with secured(tmp_path) as (broker, _, addr):
        key = await new_user(broker, "alice")
        async with client(addr, key) as c:
            with pytest.raises(AuthorizationFailedError, match="alice may not create topic:t"):
                await c.create_topic("t", partitions=1)
            assert "t" not in broker.topics()
            with pytest.raises(AuthorizationFailedError, match="write topic:auto"):
                await c.produce("auto", 0, [Message(b"v")])
            assert "auto" not in broker.topics()  # a refused first publish creates nothing
            await broker.security.add_acls(
                [
                    Acl(
                        principal="alice",
                        resource_type=ResourceType.TOPIC,
                        pattern="app.",
                        pattern_type=PatternType.PREFIX,
                        operation=Operation.ALL,
                    )
                ]
            )
            await c.create_topic("app.t", partitions=1)  # the same connection: at once
            await c.produce("app.t", 0, [Message(b"v")])
            with pytest.raises(AuthorizationFailedError):
                await c.create_topic("other", partitions=1)


@aio
async def test_deny_wins_over_a_role_and_an_allow(tmp_path: Path) -> None:
    async with secured(tmp_path) as (broker, _, addr):
        key = await new_user(broker, "bob", "producer")
        async with client(addr, admin_key(broker)) as admin:
            await admin.create_topic("pay", partitions=1)
            await admin.create_topic("logs", partitions=1)
        await broker.security.add_acls(
            [
                Acl(
                    principal="bob",
                    resource_type=ResourceType.TOPIC,
                    pattern="pay",
                    operation=Operation.WRITE,
                    effect=Effect.DENY,
                ),
                Acl(
                    principal="bob",
                    resource_type=ResourceType.TOPIC,
                    pattern="pay",
                    operation=Operation.WRITE,
                ),
            ]
        )
        async with client(addr, key) as c:
            await c.produce("logs", 0, [Message(b"v")])  # the producer role
            with pytest.raises(AuthorizationFailedError, match="bob may not write topic:pay"):
                await c.produce("pay", 0, [Message(b"v")])
            with pytest.raises(AuthorizationFailedError):
                await c.fetch("logs", 0, 0)  # producers do not read


@aio
async def test_listings_show_only_what_the_principal_may_describe(tmp_path: Path) -> None:
    async with secured(tmp_path) as (broker, _, addr):
        async with client(addr, admin_key(broker)) as admin:
            for t in ("a.one", "a.two", "b.one"):
                await admin.create_topic(t, partitions=1)
        key = await new_user(broker, "carol")
        await broker.security.add_acls(
            [
                Acl(
                    principal="carol",
                    resource_type=ResourceType.TOPIC,
                    pattern="a.",
                    pattern_type=PatternType.PREFIX,
                    operation=Operation.READ,
                )
            ]
        )
        async with client(addr, key) as c:
            assert await c.list_topics() == ["a.one", "a.two"]


@aio
async def test_revoking_a_key_refuses_the_open_connections_next_request(tmp_path: Path) -> None:
    async with secured(tmp_path) as (broker, _, addr):
        key = await new_user(broker, "dave", "viewer")
        async with client(addr, key) as c:
            assert await c.list_topics() == []
            await broker.security.revoke_key(Credentials(key).key_id)
            with pytest.raises(AuthenticationFailedError, match="revoked"):
                await c.list_topics()


@aio
async def test_removing_an_acl_applies_to_the_next_request(tmp_path: Path) -> None:
    async with secured(tmp_path) as (broker, _, addr):
        async with client(addr, admin_key(broker)) as admin:
            await admin.create_topic("t", partitions=1)
        key = await new_user(broker, "erin")
        acl = Acl(
            principal="erin",
            resource_type=ResourceType.TOPIC,
            pattern="t",
            operation=Operation.WRITE,
        )
        await broker.security.add_acls([acl])
        async with client(addr, key) as c:
            await c.produce("t", 0, [Message(b"v")])
            await broker.security.remove_acls([acl])
            with pytest.raises(AuthorizationFailedError):
                await c.produce("t", 0, [Message(b"v")])


@aio
async def test_plain_needs_tls_unless_allowed(tmp_path: Path) -> None:
    async with (
        secured(tmp_path) as (broker, _, addr),
        client(addr, admin_key(broker), "PLAIN") as c,
    ):
        with pytest.raises(UnsupportedSaslMechanismError, match="needs TLS"):
            await c.list_topics()
    async with (
        secured(tmp_path / "2", allow_plain_without_tls=True) as (broker, _, addr),
        client(addr, admin_key(broker), "PLAIN") as c,
    ):
        assert await c.list_topics() == []


@aio
async def test_wrong_keys_fail_then_are_rate_limited_and_never_logged(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    async with secured(tmp_path, auth_failures_per_minute=3, auth_failure_delay_ms=0) as (
        broker,
        _,
        addr,
    ):
        good = await new_user(broker, "frank", "viewer")
        key_id = Credentials(good).key_id
        wrong = f"twk_{key_id}_{'A' * 43}"
        seen: list[type[Exception]] = []
        for _ in range(6):
            async with client(addr, wrong) as c:
                with pytest.raises((AuthenticationFailedError, TooManyAuthFailuresError)) as info:
                    await c.list_topics()
                seen.append(type(info.value))
        assert seen[0] is AuthenticationFailedError
        assert seen[-1] is TooManyAuthFailuresError
        stats = gate_for(broker).stats()
        assert stats["authentication_failures"] >= 3
        assert stats["authentications_rate_limited"] >= 1
        assert broker.security.keys[key_id]  # still there
    secret = good.split("_", 2)[2]
    assert secret not in caplog.text
    assert "A" * 43 not in caplog.text
    data = b"".join(p.read_bytes() for p in (tmp_path / "data").rglob("*") if p.is_file())
    assert secret.encode() not in data


@aio
async def test_private_internal_topics_are_not_readable_even_with_authentication_off(
    tmp_path: Path,
) -> None:
    async with secured(tmp_path, authentication=False) as (broker, _, addr):
        await broker.security.create_principal("gina")
        await broker.security.create_key("gina")
        async with client(addr, None) as c:
            assert "__security" not in await c.list_topics()
            with pytest.raises(AuthorizationFailedError, match="__security"):
                await c.fetch("__security", 0, 0)
            with pytest.raises((InternalTopicError, AuthorizationFailedError)):
                await c.produce("__security", 0, [Message(b"x")])


@aio
async def test_state_survives_a_restart(tmp_path: Path) -> None:
    async with secured(tmp_path) as (broker, _, _):
        key = await new_user(broker, "hank", "consumer")
    async with secured(tmp_path) as (broker, _, addr):
        assert broker.bootstrap_key_file is None  # principals exist: no second bootstrap
        assert broker.security.principals["hank"].roles == ("consumer",)
        async with client(addr, key) as c:
            assert (await c.whoami()).principal == "hank"
            with pytest.raises(UnknownTopicError):
                await c.fetch("missing", 0, 0)


@aio
async def test_a_failed_authentication_is_answered_after_the_delay_only(tmp_path: Path) -> None:
    async with secured(tmp_path, auth_failure_delay_ms=400) as (broker, _, addr):
        good = await new_user(broker, "ivan", "viewer")
        wrong = f"twk_{Credentials(good).key_id}_{'B' * 43}"
        async with client(addr, good) as ok:
            started = time.monotonic()
            await ok.list_topics()
            assert time.monotonic() - started < 0.4  # a success is not held back
            async with client(addr, wrong) as c:
                started = time.monotonic()
                with pytest.raises(AuthenticationFailedError):
                    await c.list_topics()
                assert time.monotonic() - started >= 0.38
                # The good connection is not held meanwhile.
                started = time.monotonic()
                await ok.list_topics()
                assert time.monotonic() - started < 0.4
