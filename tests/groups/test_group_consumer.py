"""Group consumers against a real broker and server on port 0 (in-process): splitting the
partitions, commits and restarts, seek and pause, callbacks, the admin methods, and the twin
rule."""

from __future__ import annotations

import asyncio
import inspect
from pathlib import Path
from typing import Any

import pytest

from tests.client._support import addr, in_thread, run, serve
from tidewire.client import AsyncClient, AsyncGroupConsumer, Client, GroupConsumer, Message
from tidewire.client._consumer import ConsumerRecord
from tidewire.errors import GroupNotEmptyError, IllegalGenerationError, UnknownGroupError

FAST = {"session_timeout_ms": 1_000, "heartbeat_interval_ms": 100, "max_wait_ms": 100}


async def fill(client: AsyncClient, topic: str, partitions: int, per_partition: int) -> None:
    for p in range(partitions):
        msgs = [Message(f"{p}-{i}".encode()) for i in range(per_partition)]
        await client.produce(topic, p, msgs)


async def drain(c: AsyncGroupConsumer, n: int) -> list[ConsumerRecord]:
    out: list[ConsumerRecord] = []
    while len(out) < n:
        out.extend(await c.poll(5.0))
    return out


def test_members_split_the_partitions_and_take_over_a_leavers(tmp_path: Path) -> None:
    async def main() -> None:
        async with (
            serve(tmp_path, default_partitions=6) as (_, server),
            AsyncClient(addr(server)) as client,
        ):
            await fill(client, "t", 6, 5)
            await client.create_topic("other", 1)
            members = [
                AsyncGroupConsumer(
                    addr(server), "g", topics=["t"], auto_offset_reset="earliest", **FAST
                )
                for _ in range(3)
            ]
            seen: list[ConsumerRecord] = []

            async def consume(c: AsyncGroupConsumer) -> None:
                while True:
                    seen.extend(await c.poll(0.2))

            tasks = [asyncio.create_task(consume(c)) for c in members]
            while True:
                await asyncio.sleep(0.05)
                gens = {c.generation for c in members}
                owned = [tp for c in members for tp in c.assignment()]
                if len(gens) == 1 and len(owned) == 6 and len(seen) >= 30:
                    break
            assert sorted(owned) == [("t", p) for p in range(6)]  # none owned twice
            assert sorted(len(c.assignment()) for c in members) == [2, 2, 2]
            assert sorted(r.value for r in seen) == sorted(
                f"{p}-{i}".encode() for p in range(6) for i in range(5)
            )
            d = await client.describe_group("g")
            assert d.state == "stable"
            assert len(d.members) == 3
            # one leaves (close commits and leaves): the other two take its partitions
            tasks[0].cancel()
            await asyncio.gather(tasks[0], return_exceptions=True)
            await members[0].close()
            while sorted(tp for c in members[1:] for tp in c.assignment()) != [
                ("t", p) for p in range(6)
            ]:
                await asyncio.sleep(0.05)
            for t in tasks[1:]:
                t.cancel()
            await asyncio.gather(*tasks[1:], return_exceptions=True)
            for c in members[1:]:
                await c.close()
            lag = await client.group_lag("g")
            assert [(x.committed, x.end_offset, x.lag) for x in lag] == [(5, 5, 0)] * 6
            assert [g.group_id for g in await client.list_groups()] == ["g"]

    run(main())


def test_a_restarted_consumer_continues_from_its_commit(tmp_path: Path) -> None:
    async def main() -> None:
        async with (
            serve(tmp_path, default_partitions=1) as (_, server),
            AsyncClient(addr(server)) as client,
        ):
            await fill(client, "t", 1, 10)
            async with AsyncGroupConsumer(
                addr(server), "g", topics=["t"], auto_offset_reset="earliest",
                enable_auto_commit=False, **FAST,
            ) as c:  # fmt: skip
                got = await drain(c, 10)
                assert [r.offset for r in got] == list(range(10))
                await c.commit({("t", 0): 4})
            async with AsyncGroupConsumer(addr(server), "g", topics=["t"], **FAST) as c:
                got = await drain(c, 6)
                assert [r.offset for r in got] == list(range(4, 10))
                await c.seek_to_beginning()
                assert (await drain(c, 1))[0].offset == 0
                await c.seek("t", 0, 7)
                assert (await drain(c, 1))[0].offset == 7
                await c.seek_to_end()
                assert c.position("t", 0) == 10
                await c.pause([("t", 0)])
                await client.produce("t", 0, [Message(b"new")])
                assert await c.poll(0.3) == []
                await c.resume([("t", 0)])
                assert [r.value for r in await drain(c, 1)] == [b"new"]
                with pytest.raises(GroupNotEmptyError):
                    await client.reset_group_offsets("g", "t", "earliest")
                with pytest.raises(GroupNotEmptyError):
                    await client.delete_group("g")
            # closed with auto-commit: the position after the last record handed out
            assert await client.committed_offsets("g") == {("t", 0): 11}
            dry = await client.reset_group_offsets("g", "t", "offset", value=3, dry_run=True)
            assert [(r.previous, r.offset) for r in dry] == [(11, 3)]
            await client.reset_group_offsets("g", "t", "earliest")
            assert await client.committed_offsets("g", [("t", 0), ("t", 9)]) == {
                ("t", 0): 0,
                ("t", 9): -1,
            }
            await client.delete_group("g")
            with pytest.raises(UnknownGroupError):
                await client.describe_group("g")

    run(main())


def test_callbacks_and_a_fenced_commit(tmp_path: Path) -> None:
    async def main() -> None:
        async with serve(tmp_path, default_partitions=2) as (_, server):
            events: list[tuple[str, list[tuple[str, int]]]] = []

            async def on_assign(tps: list[tuple[str, int]]) -> None:
                events.append(("assign", tps))

            def on_revoke(tps: list[tuple[str, int]]) -> None:
                events.append(("revoke", tps))

            async with AsyncClient(addr(server)) as client:
                await client.create_topic("t", 2)
            c = AsyncGroupConsumer(
                addr(server), "g", topics=["t"], on_assign=on_assign, on_revoke=on_revoke, **FAST
            )
            await c.poll(0.1)
            assert events == [("assign", [("t", 0), ("t", 1)])]
            generation = c.generation
            d = AsyncGroupConsumer(addr(server), "g", topics=["t"], **FAST)

            async def keep_polling() -> None:
                while True:
                    await d.poll(0.1)

            other = asyncio.create_task(keep_polling())
            while c.generation == generation or d.generation != c.generation:
                await c.poll(0.1)
            other.cancel()
            await asyncio.gather(other, return_exceptions=True)
            assert events[1] == ("revoke", [("t", 0), ("t", 1)])
            assert events[2][0] == "assign"
            assert len(events[2][1]) == 1
            c._generation = generation  # a stale member's commit is refused
            with pytest.raises(IllegalGenerationError):
                await c.commit()
            await d.close()
            await c.close()
            assert events[-1][0] == "revoke"

    run(main())


def test_the_blocking_twin(tmp_path: Path) -> None:
    async def main() -> None:
        async with serve(tmp_path, default_partitions=2) as (_, server):
            with Client(addr(server)) as client:
                for p in range(2):
                    await in_thread(client.produce, "t", p, [Message(b"a"), Message(b"b")])

            def use() -> list[Any]:
                out: list[Any] = []
                with GroupConsumer(
                    addr(server), "g", topics=["t"], auto_offset_reset="earliest", **FAST
                ) as c:
                    it = iter(c)
                    out.extend(next(it) for _ in range(3))
                    out.append(c.assignment())
                # one record fetched but not handed out: not committed
                with Client(addr(server)) as admin:
                    out.append(admin.committed_offsets("g"))
                    out.append([x.lag for x in admin.group_lag("g")])
                return out

            *records, assignment, committed, lags = await in_thread(use)
            assert assignment == [("t", 0), ("t", 1)]
            assert len(records) == 3
            assert sum(committed.values()) == 3
            assert sorted(lags) == [0, 1]

    run(main())


def public(cls: type) -> dict[str, Any]:
    return {n: m for n, m in inspect.getmembers(cls) if not n.startswith("_")}


def test_group_consumer_is_the_blocking_twin() -> None:
    a, s = public(AsyncGroupConsumer), public(GroupConsumer)
    methods = {n for n, m in a.items() if inspect.isfunction(m)}
    assert methods <= set(s)
    for name in methods:
        assert inspect.iscoroutinefunction(a[name]) != (
            name in {"assignment", "position", "paused"}
        )
        assert not inspect.iscoroutinefunction(s[name]), name
        if name != "__init__":
            sig_a = inspect.signature(a[name])
            assert inspect.signature(s[name]).parameters.keys() == sig_a.parameters.keys(), name


def test_auto_commit_does_not_hold_up_delivery(tmp_path: Path) -> None:
    """The periodic auto-commit goes out in the background: while the broker takes 0.5 s to
    store it, polls go on returning records; a later commit (here close()) waits for it and
    lands after it, so the committed offsets end where the consumer did."""

    async def main() -> None:
        async with (
            serve(tmp_path, default_partitions=1) as (broker, server),
            AsyncClient(addr(server)) as client,
        ):
            store = broker.groups.offsets
            real_commit = store.commit
            started: list[float] = []
            commit_started = asyncio.Event()
            loop = asyncio.get_running_loop()

            async def slow_commit(group: str, offsets: Any) -> None:
                started.append(loop.time())
                commit_started.set()
                await asyncio.sleep(0.5)
                await real_commit(group, offsets)

            store.commit = slow_commit  # type: ignore[method-assign]
            await fill(client, "t", 1, 10)
            c = AsyncGroupConsumer(
                addr(server),
                "g",
                topics=["t"],
                auto_offset_reset="earliest",
                auto_commit_interval_ms=50,
                **FAST,
            )
            got = await drain(c, 10)
            await asyncio.sleep(0.06)  # an auto-commit is due at the next poll
            got += await c.poll(0.01)  # nothing new; the due auto-commit goes out
            # Once the broker is storing it (0.5 s), a record arrives: the next poll hands it
            # over without waiting for the commit. (Produced only now: a fetch is answered in
            # the turn the record becomes visible, so a record produced before the commit was
            # sent could be handed over before the commit ever reached the broker.)
            await asyncio.wait_for(commit_started.wait(), 5.0)
            await client.produce("t", 0, [Message(b"late")])
            t0 = loop.time()
            got += await c.poll(5.0)
            assert loop.time() - t0 < 0.4  # the poll did not wait for the 0.5 s commit
            assert len(started) == 1  # the due commit alone so far (close() sends the next)
            assert [r.value for r in got][-1] == b"late"
            await c.close()
            committed = await client.committed_offsets("g")
            assert committed == {("t", 0): 11}

    run(main())
