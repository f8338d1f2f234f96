"""Streams with authentication on: ACLs by stream id (literal or prefix); one stream denied
denies the whole request, naming it, and stores nothing; a listing shows only the streams the
principal may describe."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.client._support import run, secured
from tidewire.client import AsyncClient, SendItem
from tidewire.errors import AuthorizationFailedError
from tidewire.security.model import Acl, Operation, PatternType, ResourceType

#: bob may write, read and describe the streams whose ids begin "bob/", and nothing else.
BOB_ACLS = tuple(
    Acl(
        principal="bob",
        resource_type=ResourceType.STREAM,
        pattern="bob/",
        pattern_type=PatternType.PREFIX,
        operation=op,
    )
    for op in (Operation.WRITE, Operation.READ, Operation.DESCRIBE)
)


def test_stream_acls_by_id(tmp_path: Path) -> None:
    async def main() -> None:
        async with secured(tmp_path, BOB_ACLS) as (broker, at, admin, bob):
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
