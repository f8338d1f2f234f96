"""The etcd client against a real etcd: keys, compare-and-swap transactions, leases that expire
and take their keys, watches from a revision (and compaction), elections whose revision fences
a deposed leader's writes, and endpoints that do not answer."""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Awaitable, Callable
from typing import TypeVar

import pytest

from tests.cluster._etcd import EtcdServer
from tidewire.cluster.etcd import (
    Compare,
    EtcdClient,
    EtcdError,
    EtcdUnavailableError,
    Lease,
    Op,
    WatchCompactedError,
    prefix_end,
)

T = TypeVar("T")


def run(etcd: EtcdServer, body: Callable[[EtcdClient], Awaitable[T]]) -> T:
    async def main() -> T:
        async with EtcdClient([etcd.endpoint], timeout_s=5) as c:
            return await body(c)

    return asyncio.run(main())


def test_prefix_end() -> None:
    assert prefix_end(b"a/") == b"a0"
    assert prefix_end(b"a\xff") == b"b"
    assert prefix_end(b"\xff\xff") == b"\x00"


def test_put_get_range_delete(etcd: EtcdServer) -> None:
    async def body(c: EtcdClient) -> None:
        assert await c.get("nope") is None
        r1 = await c.put("t/a", b"1")
        r2 = await c.put("t/b", b"\x00\xff")
        await c.put("u/c", b"3")
        assert r2 == r1 + 1
        kv = await c.get("t/b")
        assert kv is not None
        assert (kv.key, kv.value, kv.create_revision, kv.mod_revision, kv.version) == (
            b"t/b",
            b"\x00\xff",
            r2,
            r2,
            1,
        )
        kvs, rev = await c.range("t/", prefix=True)
        assert [k.key for k in kvs] == [b"t/a", b"t/b"]
        assert rev >= r2
        old, _ = await c.range("t/a", revision=r1)
        await c.put("t/a", b"1b")
        assert old[0].value == b"1"
        assert (await c.get("t/a")).value == b"1b"  # type: ignore[union-attr]
        assert await c.delete("t/", prefix=True) == 2
        assert (await c.range("t/", prefix=True))[0] == []
        assert await c.get("u/c") is not None

    run(etcd, body)


def test_txn_is_a_compare_and_swap(etcd: EtcdServer) -> None:
    async def body(c: EtcdClient) -> None:
        create = [Compare.create_revision("leader", "=", 0)]
        first = await c.txn(create, [Op.put("leader", b"n1")], [Op.get("leader")])
        assert first.succeeded
        second = await c.txn(create, [Op.put("leader", b"n2")], [Op.get("leader")])
        assert not second.succeeded
        assert [kv.value for kv in second.responses[0]] == [b"n1"]
        mod = second.responses[0][0].mod_revision
        # Two writers that read the same revision: exactly one wins.
        results = await asyncio.gather(
            *(
                c.txn([Compare.mod_revision("leader", "=", mod)], [Op.put("leader", v)])
                for v in (b"a", b"b", b"c")
            )
        )
        assert sum(r.succeeded for r in results) == 1
        winner = (await c.get("leader")).value  # type: ignore[union-attr]
        assert winner in {b"a", b"b", b"c"}
        assert (
            await c.txn([Compare.value_is("leader", "=", winner)], [Op.delete("leader")])
        ).succeeded
        assert await c.get("leader") is None
        assert (await c.txn([Compare.version("leader", "=", 0)], [])).succeeded

    run(etcd, body)


def test_a_lease_keeps_its_keys_while_renewed_and_takes_them_when_it_expires(
    etcd: EtcdServer,
) -> None:
    async def body(c: EtcdClient) -> None:
        kept = Lease(c, ttl_s=2)
        await kept.start()
        await c.put("node/1", b"up", lease=kept.id)
        left = await c.grant(1)
        await c.put("node/2", b"up", lease=left)
        await asyncio.sleep(3.5)  # beyond both TTLs: only the renewed one is alive
        assert await c.get("node/1") is not None
        assert await c.get("node/2") is None
        assert await c.keepalive_once(left) == 0
        assert await c.time_to_live(left) == -1
        assert not kept.lost.is_set()
        await kept.close()  # revoked: its key goes at once
        assert await c.get("node/1") is None
        with pytest.raises(EtcdError, match="lease not found"):
            await c.put("node/3", b"up", lease=left)

    run(etcd, body)


def test_watch_from_a_revision_sees_every_change_in_order(etcd: EtcdServer) -> None:
    async def body(c: EtcdClient) -> None:
        start = await c.put("w/a", b"1")
        await c.put("w/b", b"2")
        await c.delete("w/a")
        seen: list[tuple[str, bytes, bytes]] = []

        async def follow() -> None:
            async for events in c.watch("w/", prefix=True, start_revision=start):
                seen.extend((e.type, e.kv.key, e.kv.value) for e in events)
                if len(seen) >= 4:
                    return

        task = asyncio.create_task(follow())
        await asyncio.sleep(0.3)
        await c.put("x/outside", b"0")
        await c.put("w/c", b"3")
        await asyncio.wait_for(task, 10)
        assert seen == [
            ("PUT", b"w/a", b"1"),
            ("PUT", b"w/b", b"2"),
            ("DELETE", b"w/a", b""),
            ("PUT", b"w/c", b"3"),
        ]

    run(etcd, body)


def test_a_watch_from_a_compacted_revision_says_so(etcd: EtcdServer) -> None:
    async def body(c: EtcdClient) -> None:
        first = await c.put("k", b"1")
        last = await c.put("k", b"2")
        await c._post("/v3/kv/compaction", {"revision": str(last)})
        with pytest.raises(WatchCompactedError) as info:
            async for _ in c.watch("k", start_revision=first):
                pass
        assert info.value.compact_revision == last

    run(etcd, body)


def test_one_leader_at_a_time_and_its_revision_fences_a_deposed_one(etcd: EtcdServer) -> None:
    async def body(c: EtcdClient) -> None:
        l1, l2 = Lease(c, ttl_s=2), Lease(c, ttl_s=2)
        await l1.start()
        await l2.start()
        first = await c.campaign("controller", l1.id, b"n1", timeout_s=5)
        assert (await c.leader("controller")).value == b"n1"  # type: ignore[union-attr]
        second = asyncio.create_task(c.campaign("controller", l2.id, b"n2", timeout_s=20))
        await asyncio.sleep(0.5)
        assert not second.done()  # waits while n1 leads

        def fenced(leader_key: bytes, rev: int) -> list[Compare]:
            """A controller's write holds only while its election key is the one it won."""
            return [Compare.create_revision(leader_key, "=", rev)]

        ok = await c.txn(fenced(first.key, first.rev), [Op.put("meta", b"by n1")])
        assert ok.succeeded
        # n1 stops renewing (a pause past its lease): n2 is elected, n1's writes now fail.
        await l1.close(revoke=False)
        won = await asyncio.wait_for(second, 15)
        assert won.rev > first.rev
        assert (await c.leader("controller")).value == b"n2"  # type: ignore[union-attr]
        late = await c.txn(fenced(first.key, first.rev), [Op.put("meta", b"late n1")])
        assert not late.succeeded
        assert (await c.get("meta")).value == b"by n1"  # type: ignore[union-attr]
        await c.resign(won)
        assert await c.leader("controller") is None
        await l2.close()

    run(etcd, body)


def test_endpoints_that_do_not_answer(etcd: EtcdServer) -> None:
    async def main() -> None:
        dead = "http://127.0.0.1:1"
        async with EtcdClient([dead, etcd.endpoint], timeout_s=2) as c:
            await c.put("k", b"v")  # the dead one is skipped
            assert c.endpoints[0] == etcd.endpoint  # and the live one is tried first now
        etcd.stop(signal.SIGKILL)
        async with EtcdClient([etcd.endpoint], timeout_s=1) as c:
            with pytest.raises(EtcdUnavailableError, match="no etcd endpoint answered") as info:
                await c.get("k")
            assert info.value.retriable
        etcd.start()
        async with EtcdClient([etcd.endpoint], timeout_s=5) as c:
            assert (await c.get("k")).value == b"v"  # type: ignore[union-attr]

    asyncio.run(main())
