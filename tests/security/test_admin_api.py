"""Security administration over the binary protocol: principals, API keys, ACLs and quotas
through a real server and client, kept across a restart, with clear errors for bad input.

Authentication is off here (the connection is anonymous): these tests are about what the
APIs do, not who may call them."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from tests.server._support import serve
from tidewire.broker import Broker, BrokerConfig
from tidewire.client import AsyncClient, Client
from tidewire.errors import (
    AuthorizationFailedError,
    InvalidRequestError,
    PrincipalExistsError,
    UnknownPrincipalError,
)
from tidewire.protocol.messages import AclEntry, ApiKey
from tidewire.security.config import SecurityConfig
from tidewire.security.credentials import Credentials
from tidewire.security.keys import parse_key
from tidewire.server import ServerConfig, TcpServer
from tidewire.server.needs import API_NEEDS, Need

ORDERS_READ = AclEntry(principal="alice", resource_type="topic", pattern="orders", operation="read")


def addr(s: TcpServer) -> str:
    return f"127.0.0.1:{s.port}"


def test_principal_round_trip(tmp_path: Path) -> None:
    async def main() -> None:
        async with serve(tmp_path) as (_, s), AsyncClient(addr(s)) as c:
            p = await c.create_principal("alice", roles=["producer"], description="orders team")
            assert (p.name, p.kind, p.roles, p.description) == (
                "alice",
                "user",
                ["producer"],
                "orders team",
            )
            assert p.created_ms > 0
            await c.create_principal("etl", kind="service", roles=["consumer", "producer"])
            assert [x.name for x in await c.describe_principals()] == ["alice", "etl"]
            (etl,) = await c.describe_principals(["etl"])
            assert (etl.kind, etl.roles) == ("service", ["consumer", "producer"])

            altered = await c.alter_principal("alice", roles=["viewer"])
            assert (altered.roles, altered.description) == (["viewer"], "orders team")
            altered = await c.alter_principal("alice", description="read only")
            assert (altered.roles, altered.description) == (["viewer"], "read only")

            assert await c.delete_principal("etl") == (0, 0)
            assert [x.name for x in await c.describe_principals()] == ["alice"]

    asyncio.run(main())


def test_bad_principal_input_gets_specific_errors(tmp_path: Path) -> None:
    async def main() -> None:
        async with serve(tmp_path) as (_, s), AsyncClient(addr(s)) as c:
            with pytest.raises(InvalidRequestError, match=r"principal name 'bad name!'"):
                await c.create_principal("bad name!")
            with pytest.raises(InvalidRequestError, match=r"'role:x'.*not beginning with"):
                await c.create_principal("role:x")
            with pytest.raises(InvalidRequestError, match=r"unknown role 'prodcer'.*producer"):
                await c.create_principal("alice", roles=["prodcer"])
            with pytest.raises(InvalidRequestError, match="kind 'robot' must be user or service"):
                await c.create_principal("alice", kind="robot")
            with pytest.raises(InvalidRequestError, match="300 characters exceeds 256"):
                await c.create_principal("alice", description="x" * 300)
            assert await c.describe_principals() == []

            await c.create_principal("alice")
            with pytest.raises(PrincipalExistsError, match="'alice' exists already"):
                await c.create_principal("alice")
            for call in (
                c.delete_principal("bob"),
                c.alter_principal("bob", roles=["viewer"]),
                c.create_api_key("bob"),
                c.describe_principals(["alice", "bob"]),
                c.set_quota("bob", requests_per_s=5),
                c.clear_quota("bob"),
                c.describe_quotas(["bob"]),
            ):
                with pytest.raises(UnknownPrincipalError, match="no principal named 'bob'"):
                    await call
            with pytest.raises(UnknownPrincipalError, match="no API key with id '0123456789ab'"):
                await c.revoke_api_key("0123456789ab")
            with pytest.raises(InvalidRequestError, match="nothing to alter"):
                await c.alter_principal("alice")

    asyncio.run(main())


def test_a_role_named_by_an_acl_may_be_given(tmp_path: Path) -> None:
    async def main() -> None:
        async with serve(tmp_path) as (_, s), AsyncClient(addr(s)) as c:
            with pytest.raises(InvalidRequestError, match="unknown role 'auditors'"):
                await c.create_principal("carol", roles=["auditors"])
            grant = AclEntry(
                principal="role:auditors",
                resource_type="cluster",
                pattern="cluster",
                operation="describe",
            )
            await c.add_acls([grant])
            p = await c.create_principal("carol", roles=["auditors"])
            assert p.roles == ["auditors"]

    asyncio.run(main())


def test_api_keys_created_listed_and_revoked(tmp_path: Path) -> None:
    async def main() -> None:
        async with serve(tmp_path) as (b, s), AsyncClient(addr(s)) as c:
            await c.create_principal("alice")
            expires = int(time.time() * 1000) + 3_600_000
            info, whole = await c.create_api_key("alice", expires_ms=expires, description="ci")
            key_id, _ = parse_key(whole)
            assert (info.id, info.principal, info.state) == (key_id, "alice", "active")
            assert (info.expires_ms, info.description) == (expires, "ci")
            assert (await b.security.verify_key(whole)).name == "alice"

            other, _ = await c.create_api_key("alice")
            (p,) = await c.describe_principals(["alice"])
            assert [k.id for k in p.keys] == [info.id, other.id]
            assert all(k.state == "active" for k in p.keys)

            revoked = await c.revoke_api_key(info.id, principal="alice")
            assert revoked.state == "revoked"
            assert revoked.revoked_ms > 0
            assert b.security.key_principal(info.id) is None
            (p,) = await c.describe_principals(["alice"])
            assert {k.id: k.state for k in p.keys} == {info.id: "revoked", other.id: "active"}

            # Naming another owner than the key's: refused, nothing changed.
            await c.create_principal("bob")
            with pytest.raises(UnknownPrincipalError, match="of principal 'bob'"):
                await c.revoke_api_key(other.id, principal="bob")
            assert b.security.key_principal(other.id) is not None

            with pytest.raises(InvalidRequestError, match="is in the past"):
                await c.create_api_key("alice", expires_ms=1000)
            with pytest.raises(InvalidRequestError, match="expires_ms=-5"):
                await c.create_api_key("alice", expires_ms=-5)

            # Deleting the principal takes its keys and ACLs.
            await c.add_acls([ORDERS_READ])
            assert await c.delete_principal("alice") == (2, 1)
            assert b.security.keys == {}
            assert await c.describe_acls() == []

    asyncio.run(main())


def test_acls_added_filtered_and_removed(tmp_path: Path) -> None:
    async def main() -> None:
        async with serve(tmp_path) as (_, s), AsyncClient(addr(s)) as c:
            prefix_write = AclEntry(
                principal="role:producer",
                resource_type="topic",
                pattern="logs.",
                pattern_type="prefix",
                operation="write",
            )
            deny = AclEntry(
                principal="*",
                resource_type="group",
                pattern="*",
                operation="delete",
                effect="deny",
            )
            added, removed = await c.alter_acls(add=[ORDERS_READ, prefix_write, deny])
            assert (len(added), removed) == (3, [])
            assert await c.add_acls([ORDERS_READ]) == []  # there already

            assert await c.describe_acls(principal="alice") == [ORDERS_READ]
            assert await c.describe_acls(resource_type="group") == [deny]
            assert await c.describe_acls(resource_type="topic", matching="logs.app") == [
                prefix_write
            ]
            assert await c.describe_acls(pattern_type="prefix") == [prefix_write]
            assert len(await c.describe_acls()) == 3

            assert await c.remove_acls([ORDERS_READ, ORDERS_READ]) == [ORDERS_READ]
            assert await c.remove_acls([ORDERS_READ]) == []
            assert len(await c.describe_acls()) == 2

            bad = [
                (
                    AclEntry(
                        principal="alice", resource_type="table", pattern="x", operation="read"
                    ),
                    "resource type 'table' is not one of topic",
                ),
                (
                    AclEntry(
                        principal="alice", resource_type="topic", pattern="x", operation="eat"
                    ),
                    "operation 'eat' is not one of read",
                ),
                (
                    AclEntry(
                        principal="alice",
                        resource_type="topic",
                        pattern="x",
                        operation="read",
                        effect="maybe",
                    ),
                    "effect 'maybe'",
                ),
                (
                    AclEntry(
                        principal="alice",
                        resource_type="topic",
                        pattern="x",
                        pattern_type="glob",
                        operation="read",
                    ),
                    "pattern type 'glob'",
                ),
                (
                    AclEntry(
                        principal="alice", resource_type="cluster", pattern="x", operation="alter"
                    ),
                    "cluster ACL's pattern is 'cluster' or '\\*'",
                ),
                (
                    AclEntry(principal="a b", resource_type="topic", pattern="x", operation="read"),
                    "principal name 'a b'",
                ),
                (
                    AclEntry(
                        principal="alice", resource_type="topic", pattern="", operation="read"
                    ),
                    "must be 1..255 characters",
                ),
            ]
            for entry, message in bad:
                with pytest.raises(InvalidRequestError, match=message):
                    # With a good entry first: all are checked before any is added.
                    await c.alter_acls(add=[ORDERS_READ, entry])
            assert len(await c.describe_acls()) == 2
            with pytest.raises(InvalidRequestError, match="resource type 'x'"):
                await c.describe_acls(resource_type="x")

    asyncio.run(main())


def test_quotas_set_merged_and_cleared(tmp_path: Path) -> None:
    async def main() -> None:
        async with serve(tmp_path) as (_, s), AsyncClient(addr(s)) as c:
            await c.create_principal("alice")
            q = await c.set_quota("alice", produce_bytes_per_s=1_000_000)
            assert (q.produce_bytes_per_s, q.fetch_bytes_per_s, q.requests_per_s) == (
                1_000_000,
                -1,
                -1,
            )
            q = await c.set_quota("alice", requests_per_s=50)
            assert (q.produce_bytes_per_s, q.requests_per_s) == (1_000_000, 50)
            got = await c.describe_quotas()
            assert [x.principal for x in got.quotas] == ["alice"]
            assert got.quotas[0].requests_per_s == 50
            assert got.defaults is not None
            assert got.defaults.principal == "*"
            with pytest.raises(InvalidRequestError, match="requests_per_s=-2 of 'alice'"):
                await c.set_quota("alice", requests_per_s=-2)
            await c.clear_quota("alice")
            assert (await c.describe_quotas()).quotas == []
            (q,) = (await c.describe_quotas(["alice"])).quotas
            assert q.produce_bytes_per_s == -1

    asyncio.run(main())


def test_state_survives_a_restart_and_no_secret_is_stored(tmp_path: Path) -> None:
    async def first() -> tuple[str, str, str]:
        async with serve(tmp_path) as (_, s), AsyncClient(addr(s)) as c:
            await c.create_principal("alice", roles=["producer"], description="d")
            await c.create_principal("svc", kind="service")
            kept, whole = await c.create_api_key("alice", description="kept")
            gone, _ = await c.create_api_key("svc")
            await c.revoke_api_key(gone.id)
            await c.add_acls([ORDERS_READ])
            await c.set_quota("svc", fetch_bytes_per_s=4096)
            return kept.id, gone.id, whole

    kept_id, gone_id, whole = asyncio.run(first())

    async def second() -> None:
        async with serve(tmp_path) as (b, s), AsyncClient(addr(s)) as c:
            alice, svc = await c.describe_principals()
            assert (alice.name, alice.roles, alice.description) == ("alice", ["producer"], "d")
            assert (svc.name, svc.kind) == ("svc", "service")
            assert [(k.id, k.state, k.description) for k in alice.keys] == [
                (kept_id, "active", "kept")
            ]
            assert [(k.id, k.state) for k in svc.keys] == [(gone_id, "revoked")]
            assert await c.describe_acls() == [ORDERS_READ]
            (q,) = (await c.describe_quotas()).quotas
            assert (q.principal, q.fetch_bytes_per_s) == ("svc", 4096)
            # The key still works after the restart: its hash was kept, not the secret.
            assert (await b.security.verify_key(whole)).name == "alice"

    asyncio.run(second())
    _, secret = parse_key(whole)
    for path in (tmp_path / "data").rglob("*"):
        if path.is_file():
            data = path.read_bytes()
            assert secret.encode() not in data, path
            assert whole.encode() not in data, path


def test_the_blocking_client(tmp_path: Path) -> None:
    async def main() -> None:
        async with serve(tmp_path) as (_, s):

            def work() -> None:
                with Client(addr(s)) as c:
                    c.create_principal("alice", roles=["viewer"])
                    info, whole = c.create_api_key("alice")
                    assert whole.startswith(f"twk_{info.id}_")
                    assert c.add_acls([ORDERS_READ]) == [ORDERS_READ]
                    assert c.describe_acls(principal="alice") == [ORDERS_READ]
                    assert c.set_quota("alice", requests_per_s=3).requests_per_s == 3
                    assert c.revoke_api_key(info.id).state == "revoked"
                    assert c.delete_principal("alice") == (1, 1)

            await asyncio.to_thread(work)

    asyncio.run(main())


def test_every_admin_api_declares_its_need() -> None:
    from tidewire.protocol.messages import (
        CreateApiKeyRequest,
        DescribePrincipalsRequest,
        RevokeApiKeyRequest,
    )

    admin = [
        ApiKey.CREATE_PRINCIPAL,
        ApiKey.DELETE_PRINCIPAL,
        ApiKey.DESCRIBE_PRINCIPALS,
        ApiKey.ALTER_PRINCIPAL,
        ApiKey.CREATE_API_KEY,
        ApiKey.REVOKE_API_KEY,
        ApiKey.ALTER_ACLS,
        ApiKey.DESCRIBE_ACLS,
        ApiKey.ALTER_QUOTAS,
        ApiKey.DESCRIBE_QUOTAS,
    ]
    assert [int(k) for k in admin] == [30, 31, 32, 33, 34, 35, 36, 37, 39, 40]
    assert all(k in API_NEEDS for k in admin)
    # One's own keys: the cluster permission is waived for the principal itself only.
    (need,) = API_NEEDS[ApiKey.CREATE_API_KEY](CreateApiKeyRequest(principal="alice"))  # type: ignore[operator]
    assert (need.resource, need.operation) == ("cluster", "alter")
    assert not need.applies_to("alice")
    assert need.applies_to("bob")
    assert need.applies_to(None)
    (need,) = API_NEEDS[ApiKey.REVOKE_API_KEY](RevokeApiKeyRequest(key_id="k"))  # type: ignore[operator]
    assert need.applies_to("alice")  # no owner named: alter on the cluster
    (need,) = API_NEEDS[ApiKey.DESCRIBE_PRINCIPALS](DescribePrincipalsRequest())  # type: ignore[operator]
    assert need == Need("cluster", "describe")  # type: ignore[arg-type]
    (need,) = API_NEEDS[ApiKey.DESCRIBE_PRINCIPALS](DescribePrincipalsRequest(names=["al"]))  # type: ignore[operator]
    assert not need.applies_to("al")
    assert need.applies_to("bob")


def test_every_change_is_audited_without_the_key(tmp_path: Path) -> None:
    async def main() -> None:
        async with serve(tmp_path) as (b, s), AsyncClient(addr(s)) as c:
            await c.create_principal("alice", roles=["viewer"])
            with pytest.raises(PrincipalExistsError):
                await c.create_principal("alice")
            info, whole = await c.create_api_key("alice")
            await c.revoke_api_key(info.id)
            await c.alter_acls(add=[ORDERS_READ], remove=[ORDERS_READ])
            await c.set_quota("alice", requests_per_s=1)
            await c.alter_principal("alice", roles=[])
            await c.describe_principals()  # reads are not changes
            await c.delete_principal("alice")
            assert b.audit is not None
            events = [
                (e.action, e.outcome, e.resource, e.reason, e.detail)
                for e in await b.audit.query()
                if "." in e.action  # the changes, not the topic operations
            ]
            assert [(a, o, r) for a, o, r, _, _ in events] == [
                ("principal.create", "ok", "principal:alice"),
                ("principal.create", "failed", "principal:alice"),
                ("key.create", "ok", "principal:alice"),
                ("key.revoke", "ok", f"key:{info.id}"),
                ("acl.add", "ok", "topic:orders"),
                ("acl.remove", "ok", "topic:orders"),
                ("quota.alter", "ok", "principal:alice"),
                ("principal.alter", "ok", "principal:alice"),
                ("principal.delete", "ok", "principal:alice"),
            ]
            assert events[1][3] == "principal 'alice' exists already"
            assert events[2][4] == {"key_id": info.id}
            assert events[4][4] == {"entry.0": "allow alice read on topic:orders"}
            _, secret = parse_key(whole)
            assert secret not in repr(events)

    asyncio.run(main())


def test_a_principal_manages_its_own_keys_without_a_permission(tmp_path: Path) -> None:
    async def main() -> None:
        config = SecurityConfig(authentication=True, superusers="admin")
        broker = Broker(BrokerConfig(str(tmp_path / "data")), security=config)
        await broker.start()
        server = TcpServer(broker, ServerConfig(port=0))
        await server.start()
        try:
            store = broker.security
            await store.create_principal("self")
            _, key = await store.create_key("self")
            admin_key, _ = await store.create_key("admin")
            async with AsyncClient(addr(server), credentials=Credentials(key)) as c:
                info, whole = await c.create_api_key("self", description="mine")
                assert (await store.verify_key(whole)).name == "self"
                (me,) = await c.describe_principals(["self"])
                assert len(me.keys) == 2
                assert await c.revoke_api_key(info.id, principal="self")
                with pytest.raises(UnknownPrincipalError, match="of principal 'self'"):
                    await c.revoke_api_key(admin_key.id, principal="self")
                version = store.version
                for call in (
                    c.create_api_key("admin"),
                    c.revoke_api_key(admin_key.id),
                    c.describe_principals(),
                    c.describe_principals(["admin"]),
                    c.create_principal("other"),
                    c.describe_acls(),
                ):
                    with pytest.raises(AuthorizationFailedError):
                        await call
                assert store.version == version
                assert store.key_principal(admin_key.id) is not None
        finally:
            await server.close()
            await broker.close()

    asyncio.run(main())
