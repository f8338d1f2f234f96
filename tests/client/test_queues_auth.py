"""Queues with authentication on: a principal is refused what its ACLs do not grant, sees only
the queues and exchanges it may describe, and its consumer gets nothing of a queue it may not
read. (Every queue API against the gate, with and without its declared permission, is in
tests/security/test_authorization_matrix.py.)"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.client._support import run, secured
from tidewire.client import AsyncClient, AsyncQueueConsumer
from tidewire.errors import AuthorizationFailedError
from tidewire.security.model import Acl, Operation, PatternType, ResourceType


def _acl(resource: ResourceType, pattern: str, op: Operation, *, prefix: bool = False) -> Acl:
    return Acl(
        principal="bob",
        resource_type=resource,
        pattern=pattern,
        pattern_type=PatternType.PREFIX if prefix else PatternType.LITERAL,
        operation=op,
    )


def test_a_principal_gets_what_its_acls_grant_and_nothing_more(tmp_path: Path) -> None:
    async def main() -> None:
        async with secured(tmp_path) as (broker, at, admin, bob):
            async with AsyncClient(at, credentials=admin) as a:
                for name in ("team.jobs", "secret"):
                    await a.declare_queue(name)
                await a.declare_exchange("team.x", "fanout")
                await a.declare_exchange("other.x", "fanout")
                await a.bind("team.x", "team.jobs")
                await a.publish_batch("", "secret", [b"s"])

            async with AsyncClient(at, credentials=bob) as b:
                with pytest.raises(AuthorizationFailedError):
                    await b.declare_queue("team.new")
                with pytest.raises(AuthorizationFailedError):
                    await b.publish("team.x", "", b"v")
                with pytest.raises(AuthorizationFailedError):
                    await b.publish("", "team.jobs", b"v")  # the default exchange too
                with pytest.raises(AuthorizationFailedError):
                    await b.get("team.jobs")
                assert await b.list_queues() == []
                assert await b.list_exchanges() == ([], [])

                await broker.security.add_acls(
                    [
                        _acl(ResourceType.QUEUE, "team.", Operation.ALL, prefix=True),
                        _acl(ResourceType.EXCHANGE, "team.", Operation.ALL, prefix=True),
                        _acl(ResourceType.EXCHANGE, "amq.default", Operation.WRITE),
                    ]
                )
                await b.declare_queue("team.new")
                assert (await b.publish("team.x", "", b"fan")).queues == ("team.jobs",)
                assert (await b.publish("", "team.jobs", b"direct")).queues == ("team.jobs",)
                assert [q.name for q in await b.list_queues()] == ["team.jobs", "team.new"]
                exchanges, bindings = await b.list_exchanges()
                # write on amq.default lets bob describe it too (as for topics)
                assert [x.name for x in exchanges] == ["", "team.x"]
                assert [(x.exchange, x.destination) for x in bindings] == [("team.x", "team.jobs")]
                got = await b.get("team.jobs", max_messages=5)
                assert [m.value for m in got] == [b"fan", b"direct"]
                await got[0].ack()
                await got[1].reject()
                with pytest.raises(AuthorizationFailedError):
                    await b.get("secret")
                with pytest.raises(AuthorizationFailedError):
                    await b.purge_queue("secret")
                with pytest.raises(AuthorizationFailedError):
                    await b.bind("team.x", "secret")  # read on the queue is needed

            async with AsyncQueueConsumer(at, "secret", credentials=bob) as consumer:
                with pytest.raises(AuthorizationFailedError):
                    await consumer.get(1)
            assert broker.queues.describe_queue("secret").ready == 1

    run(main())
