"""Streams with authentication on: ACLs by stream id (literal or prefix); one stream denied
denies the whole request, naming it, and stores nothing; a listing shows only the streams the
principal may describe."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest

from tests.client._support import run
from tidewire.broker import Broker, BrokerConfig
from tidewire.client import AsyncClient, SendItem
from tidewire.errors import AuthorizationFailedError
from tidewire.security.config import SecurityConfig
from tidewire.security.credentials import Credentials
from tidewire.security.model import Acl, Operation, PatternType, ResourceType
from tidewire.server import TcpServer
from tidewire.server.tcp import ServerConfig


@asynccontextmanager
async def secured(tmp_path: Path) -> AsyncIterator[tuple[Broker, str, Credentials, Credentials]]:
    """A broker with authentication, its address, the admin's and bob's credentials."""
    config = SecurityConfig(authentication=True, superusers="admin")
    broker = Broker(BrokerConfig(str(tmp_path / "data")), security=config)
    await broker.start()
    server = TcpServer(broker, ServerConfig(port=0))
    await server.start()
    try:
        assert broker.bootstrap_key_file is not None
        admin = Credentials(broker.bootstrap_key_file.read_text().strip())
        await broker.security.create_principal("bob")
        _, key = await broker.security.create_key("bob")
        await broker.security.add_acls(
            Acl(
                principal="bob",
                resource_type=ResourceType.STREAM,
                pattern="bob/",
                pattern_type=PatternType.PREFIX,
                operation=op,
            )
            for op in (Operation.WRITE, Operation.READ, Operation.DESCRIBE)
        )
        yield broker, f"127.0.0.1:{server.port}", admin, Credentials(key)
    finally:
        await server.close(grace_s=0)
        await broker.close()


def test_stream_acls_by_id(tmp_path: Path) -> None:
    async def main() -> None:
        async with secured(tmp_path) as (broker, at, admin, bob):
            async with AsyncClient(at, credentials=admin) as a:
                await a.streams.send("secret", b"s")
                await a.streams.send("bob/inbox", b"hi")
            async with AsyncClient(at, credentials=bob) as b:
                with pytest.raises(AuthorizationFailedError, match="stream:secret"):
                    await b.streams.send_many([SendItem("bob/a", b"1"), SendItem("secret", b"2")])
                assert broker.streams.describe("bob/a") is None  # nothing stored
                with pytest.raises(AuthorizationFailedError, match="stream:secret"):
                    await b.streams.receive_many(["bob/inbox", "secret"])
                with pytest.raises(AuthorizationFailedError, match="stream:secret"):
                    await b.streams.read({"secret": ""})
                with pytest.raises(AuthorizationFailedError, match="stream:secret"):
                    await b.streams.describe("secret")
                with pytest.raises(AuthorizationFailedError, match="cluster"):
                    await b.streams.stats()
                assert [i.stream for i in await b.streams.list()] == ["bob/inbox"]
                got = await b.streams.receive("bob/inbox")
                assert got is not None
                assert got.value == b"hi"
                assert (await b.streams.send("bob/x", b"ok")).code == 0

    run(main())
