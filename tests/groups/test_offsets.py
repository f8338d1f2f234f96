"""Committed offsets in the broker (in-process): durable across restarts, last value wins,
deletion by tombstones, fenced commits refused, reset with a dry run, describe with lag, and
the internal topic hidden and read-only."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from tests.broker._support import T0, batch, config
from tidewire.broker import Broker, offsets
from tidewire.broker.consumer_groups import ResetTo
from tidewire.broker.offsets import OFFSETS_TOPIC
from tidewire.errors import (
    GroupNotEmptyError,
    IllegalGenerationError,
    InvalidRequestError,
    InvalidTopicError,
    UnknownGroupError,
    UnknownPartitionError,
)


def test_commits_survive_a_restart_and_the_last_one_wins(tmp_path: Path) -> None:
    async def main() -> None:
        async with Broker(config(tmp_path, default_partitions=2)) as b:
            await b.produce("t", 0, batch([b"a", b"b", b"c"]))
            g = b.groups
            await g.commit("g1", {("t", 0): (1, "first")})
            await g.commit("g1", {("t", 0): (3, "second"), ("t", 1): (0, "")})
            await g.commit("g2", {("t", 1): (0, "x")})
            await g.delete("g2")
            assert g.committed("g1")[("t", 0)].offset == 3
        async with Broker(config(tmp_path)) as b:
            got = b.groups.committed("g1")
            assert {tp: c.offset for tp, c in got.items()} == {("t", 0): 3, ("t", 1): 0}
            assert got[("t", 0)].metadata == "second"
            assert b.groups.committed("g2") == {}
            assert [x.group_id for x in b.groups.list_groups()] == ["g1"]
            assert OFFSETS_TOPIC not in b.topics()

    asyncio.run(main())


def test_the_internal_topic_is_read_only(tmp_path: Path) -> None:
    async def main() -> None:
        async with Broker(config(tmp_path)) as b:
            await b.produce("t", 0, batch([b"a"]))
            await b.groups.commit("g", {("t", 0): (1, "")})
            with pytest.raises(InvalidTopicError):
                await b.produce(OFFSETS_TOPIC, 0, batch([b"junk"]))
            with pytest.raises(InvalidTopicError):
                b.delete_topic(OFFSETS_TOPIC)
            with pytest.raises(InvalidTopicError):
                b.alter_topic(OFFSETS_TOPIC, partitions=20)

    asyncio.run(main())


def test_bad_commits_are_refused(tmp_path: Path) -> None:
    async def main() -> None:
        async with Broker(config(tmp_path)) as b:
            await b.produce("t", 0, batch([b"a"]))
            with pytest.raises(InvalidRequestError):
                await b.groups.commit("g", {("t", 0): (-1, "")})
            with pytest.raises(UnknownPartitionError):
                await b.groups.commit("g", {("t", 5): (0, "")})
            r = await b.groups.coordinator.join("g", topics=["t"])
            with pytest.raises(GroupNotEmptyError):  # from outside while it has members
                await b.groups.commit("g", {("t", 0): (1, "")})
            with pytest.raises(IllegalGenerationError):
                await b.groups.commit(
                    "g", {("t", 0): (1, "")}, member_id=r.member_id, generation=r.generation - 1
                )
            await b.groups.commit(
                "g", {("t", 0): (1, "")}, member_id=r.member_id, generation=r.generation
            )
            with pytest.raises(GroupNotEmptyError):
                await b.groups.delete("g")
            with pytest.raises(GroupNotEmptyError):
                await b.groups.reset("g", "t", ResetTo.EARLIEST)
            assert b.groups.committed("g")[("t", 0)].offset == 1

    asyncio.run(main())


def test_reset_describe_and_lag(tmp_path: Path) -> None:
    async def main() -> None:
        async with Broker(config(tmp_path, default_partitions=2)) as b:
            await b.produce("t", 0, batch([b"a", b"b", b"c"], timestamps=[T0, T0 + 10, T0 + 20]))
            await b.produce("t", 1, batch([b"x"], timestamps=[T0]))
            g = b.groups
            with pytest.raises(UnknownGroupError):
                g.describe("g")
            dry = await g.reset("g", "t", ResetTo.LATEST, dry_run=True)
            assert [(r.partition, r.previous, r.offset) for r in dry] == [(0, -1, 3), (1, -1, 1)]
            assert g.committed("g") == {}
            await g.reset("g", "t", ResetTo.TIMESTAMP, value=T0 + 10)
            assert {tp: c.offset for tp, c in g.committed("g").items()} == {
                ("t", 0): 1,
                ("t", 1): 1,
            }
            await g.reset("g", "t", ResetTo.OFFSET, value=99, partitions=[0])  # clamped
            await g.reset("g", "t", ResetTo.EARLIEST, partitions=[1])
            d = g.describe("g")
            assert d.members == []
            assert [(x.partition, x.committed, x.end_offset, x.lag) for x in d.offsets] == [
                (0, 3, 3, 0),
                (1, 0, 1, 1),
            ]
            await g.delete("g")
            with pytest.raises(UnknownGroupError):
                await g.delete("g")

    asyncio.run(main())


def test_the_offsets_log_is_compacted_and_restarts_to_the_same_state(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Thousands of commits on few keys: the log is rewritten (live entries copied, old
    segments deleted) so it stays small, commits racing with a compaction all land, a deleted
    group stays deleted, and a restart reads back exactly the state before it."""
    monkeypatch.setattr(offsets, "SEGMENT_BYTES", 4096)

    async def main() -> dict[str, dict[tuple[str, int], int]]:
        async with Broker(config(tmp_path, default_partitions=4)) as b:
            await b.produce("t", 0, batch([b"x"] * 10))
            store = b.groups.offsets
            p = offsets.partition_for("g0")
            same = [g for g in (f"g{i}" for i in range(200)) if offsets.partition_for(g) == p]
            assert len(same) >= 4
            await b.groups.commit(same[2], {("t", 3): (5, "doomed")})
            await b.groups.delete(same[2])
            await b.groups.commit(same[3], {("t", 2): (7, "once")})  # never again: copied
            for round_ in range(150):
                # Commits of two groups at once, as from separate members.
                await asyncio.gather(
                    *(
                        b.groups.commit(g, {("t", q): (round_ + q, f"r{round_}") for q in range(4)})
                        for g in same[:2]
                    )
                )
            plog = b.logs.get_log(OFFSETS_TOPIC, p)
            assert store.compactions >= 2
            assert plog.log_start_offset > 0  # old segments are gone
            assert plog.size_bytes < 12 * 4096
            # A compaction that starts while a commit is in flight waits for it (or its copy
            # would carry the value from before, later in the log than the commit).
            racing = asyncio.ensure_future(b.groups.commit(same[1], {("t", 0): (9, "last")}))
            await asyncio.sleep(0)
            await store.compact(p)
            await racing
            state = {g: {tp: c.offset for tp, c in b.groups.committed(g).items()} for g in same[:4]}
            assert state[same[0]] == {("t", q): 149 + q for q in range(4)}
            assert state[same[1]][("t", 0)] == 9
            assert state[same[2]] == {}
            assert state[same[3]] == {("t", 2): 7}
            assert b.groups.committed(same[0])[("t", 1)].metadata == "r149"
            return state

    before = asyncio.run(main())

    async def again() -> None:
        async with Broker(config(tmp_path)) as b:
            after = {g: {tp: c.offset for tp, c in b.groups.committed(g).items()} for g in before}
            assert after == before

    asyncio.run(again())
