"""The group coordinator's state machine, driven with a fake clock: joins wait for every
member, generations fence stale members, sessions expire, leaving rebalances at once, static
members come back without a rebalance, topic changes rebalance."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any, TypeVar

import pytest

from tidewire.broker.groups import (
    TRANSITIONS,
    GroupConfig,
    GroupCoordinator,
    GroupState,
    JoinResult,
)
from tidewire.errors import (
    GroupFullError,
    GroupNotEmptyError,
    IllegalGenerationError,
    InconsistentGroupProtocolError,
    InvalidGroupError,
    PartitionNotAssignedError,
    RebalanceInProgressError,
    UnknownMemberError,
)

T = TypeVar("T")


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


def run(coro: Coroutine[Any, Any, T]) -> T:
    return asyncio.run(asyncio.wait_for(coro, 10))


def make(
    topics: dict[str, int] | None = None, **config: Any
) -> tuple[GroupCoordinator, Clock, dict[str, int]]:
    clock = Clock()
    t = {"t": 6} if topics is None else topics
    return GroupCoordinator(lambda: t, GroupConfig(**config), clock), clock, t


async def settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


def join(c: GroupCoordinator, **kw: Any) -> asyncio.Task[JoinResult]:
    kw.setdefault("topics", ["t"])
    kw.setdefault("session_timeout_ms", 1_000)
    kw.setdefault("rebalance_timeout_ms", 2_000)
    return asyncio.get_running_loop().create_task(c.join("g", **kw))


def test_transitions_are_the_documented_ones() -> None:
    assert TRANSITIONS[GroupState.EMPTY] == {GroupState.REBALANCING}
    assert TRANSITIONS[GroupState.STABLE] == {GroupState.REBALANCING, GroupState.EMPTY}


def test_a_lone_member_gets_everything_in_generation_1() -> None:
    async def main() -> None:
        c, _, _ = make()
        r = await join(c)
        assert r.generation == 1
        assert r.assignment == [("t", p) for p in range(6)]
        assert c.state("g")[:2] == (GroupState.STABLE, 1)
        c.heartbeat("g", r.member_id, 1)

    run(main())


def test_a_second_member_waits_for_the_first_to_rejoin() -> None:
    async def main() -> None:
        c, _, _ = make()
        a = await join(c)
        b_task = join(c)
        await settle()
        assert not b_task.done()
        with pytest.raises(RebalanceInProgressError):
            c.heartbeat("g", a.member_id, 1)
        # a may still commit for generation 1 while the rebalance waits for it
        c.check_commit("g", a.member_id, 1, [("t", 0)])
        a2 = await join(c, member_id=a.member_id)
        b = await b_task
        assert a2.generation == b.generation == 2
        owned = a2.assignment + b.assignment
        assert sorted(owned) == [("t", p) for p in range(6)]
        assert len(a2.assignment) == len(b.assignment) == 3
        # stale generation is fenced
        with pytest.raises(IllegalGenerationError):
            c.check_commit("g", a.member_id, 1, [("t", 0)])
        with pytest.raises(IllegalGenerationError):
            c.heartbeat("g", a.member_id, 1)
        with pytest.raises(PartitionNotAssignedError):
            c.check_commit("g", a.member_id, 2, [b.assignment[0]])
        c.check_commit("g", a.member_id, 2, a2.assignment)

    run(main())


def test_a_member_that_does_not_rejoin_is_removed_at_the_rebalance_timeout() -> None:
    async def main() -> None:
        c, clock, _ = make()
        a = await join(c)
        b_task = join(c)
        await settle()
        for _ in range(2):  # a keeps its session alive but does not rejoin
            clock.now += 900
            with pytest.raises(RebalanceInProgressError):
                c.heartbeat("g", a.member_id, 1)
            c.tick()
            await settle()
            assert not b_task.done()
        clock.now += 200  # 2,000 ms since the rebalance began
        c.tick()
        b = await b_task
        assert b.generation == 2
        assert len(b.assignment) == 6
        with pytest.raises(UnknownMemberError):
            c.heartbeat("g", a.member_id, 1)

    run(main())


def test_a_silent_member_expires_after_its_session_timeout() -> None:
    async def main() -> None:
        c, clock, _ = make()
        a = await join(c)
        b_task = join(c)
        await settle()
        a2 = await join(c, member_id=a.member_id)
        b = await b_task
        clock.now += 600
        c.heartbeat("g", b.member_id, b.generation)
        clock.now += 600  # a: 1,200 ms of silence > 1,000; b: 600
        c.tick()
        with pytest.raises(UnknownMemberError):
            c.heartbeat("g", a2.member_id, a2.generation)
        with pytest.raises(RebalanceInProgressError):
            c.heartbeat("g", b.member_id, b.generation)
        b2 = await join(c, member_id=b.member_id)
        assert b2.generation == 3
        assert len(b2.assignment) == 6

    run(main())


def test_leaving_rebalances_at_once_and_the_last_leaver_empties_the_group() -> None:
    async def main() -> None:
        c, _, _ = make()
        a = await join(c)
        b_task = join(c)
        await settle()
        await join(c, member_id=a.member_id)
        b = await b_task
        c.leave("g", a.member_id)
        with pytest.raises(RebalanceInProgressError):
            c.heartbeat("g", b.member_id, b.generation)
        b2 = await join(c, member_id=b.member_id)
        assert len(b2.assignment) == 6
        c.leave("g", b.member_id)
        assert c.state("g")[0] is GroupState.EMPTY
        assert not c.has_members("g")
        c.check_commit("g", "", -1, [("t", 0)])  # from outside, at rest

    run(main())


def test_an_outside_commit_is_refused_while_the_group_has_members() -> None:
    async def main() -> None:
        c, _, _ = make()
        await join(c)
        with pytest.raises(GroupNotEmptyError):
            c.check_commit("g", "", -1, [("t", 0)])
        with pytest.raises(UnknownMemberError):
            c.check_commit("g", "nobody", 1, [("t", 0)])

    run(main())


def test_a_static_member_comes_back_without_a_rebalance() -> None:
    async def main() -> None:
        c, clock, _ = make()
        a = await join(c, instance_id="box-1")
        b_task = join(c, instance_id="box-2")
        await settle()
        a = await join(c, member_id=a.member_id, instance_id="box-1")
        b = await b_task
        clock.now += 500  # within the session timeout: the restarted instance rejoins
        a_again = await join(c, instance_id="box-1")
        assert a_again.generation == a.generation
        assert a_again.assignment == a.assignment
        assert a_again.member_id != a.member_id
        c.heartbeat("g", b.member_id, b.generation)  # no rebalance for b
        with pytest.raises(UnknownMemberError):  # the old instance is fenced
            c.heartbeat("g", a.member_id, a.generation)
        c.check_commit("g", a_again.member_id, a.generation, a.assignment)

    run(main())


def test_a_static_member_with_a_new_subscription_rebalances() -> None:
    async def main() -> None:
        c, _, _ = make({"t": 2, "u": 2})
        a = await join(c, instance_id="x")
        task = join(c, instance_id="x", topics=["t", "u"])
        r = await task
        assert r.generation == a.generation + 1
        assert len(r.assignment) == 4

    run(main())


def test_a_new_topic_matching_a_pattern_rebalances() -> None:
    async def main() -> None:
        c, _, topics = make({"ev.a": 2, "other": 3})
        a = await join(c, topics=[], pattern=r"ev\..*")
        assert a.assignment == [("ev.a", 0), ("ev.a", 1)]
        c.topics_changed()
        c.heartbeat("g", a.member_id, a.generation)  # nothing changed yet
        topics["ev.b"] = 1
        c.topics_changed()
        with pytest.raises(RebalanceInProgressError):
            c.heartbeat("g", a.member_id, a.generation)
        a2 = await join(c, member_id=a.member_id, topics=[], pattern=r"ev\..*")
        assert a2.assignment == [("ev.a", 0), ("ev.a", 1), ("ev.b", 0)]

    run(main())


def test_bad_joins_are_refused() -> None:
    async def main() -> None:
        c, _, _ = make(max_members=1)
        for kw, err in [
            ({"topics": [], "pattern": ""}, InvalidGroupError),
            ({"pattern": "("}, InvalidGroupError),
            ({"strategy": "fastest"}, InvalidGroupError),
            ({"session_timeout_ms": 10}, InvalidGroupError),
            ({"member_id": "ghost"}, UnknownMemberError),
        ]:
            with pytest.raises(err):
                await join(c, **kw)
        await join(c)
        with pytest.raises(InconsistentGroupProtocolError):
            await join(c, strategy="range")
        with pytest.raises(GroupFullError):
            await join(c)

    run(main())


def test_a_newer_join_of_the_same_member_replaces_the_waiting_one() -> None:
    async def main() -> None:
        c, _, _ = make()
        a = await join(c)
        b_task = join(c)
        await settle()
        first = join(c, member_id=a.member_id)
        await settle()
        assert first.done()
        assert b_task.done()
        c_task = join(c)  # a third member opens another rebalance; b has not rejoined yet
        await settle()
        old = join(c, member_id=a.member_id)
        await settle()
        new = join(c, member_id=a.member_id)
        await settle()
        with pytest.raises(RebalanceInProgressError):
            await old
        b = b_task.result()
        await join(c, member_id=b.member_id)
        assert (await new).generation == (await c_task).generation == 3

    run(main())


def test_a_join_with_an_unknown_member_id_leaves_no_group_behind() -> None:
    async def main() -> None:
        c, _, _ = make(max_groups=1)
        for i in range(3):  # e.g. members coming back with their ids after a broker restart
            with pytest.raises(UnknownMemberError):
                await c.join(
                    f"old-{i}",
                    member_id="gone-member",
                    topics=["t"],
                    session_timeout_ms=1_000,
                    rebalance_timeout_ms=2_000,
                )
        # No empty group took the only place: a real join still gets one.
        r = await join(c)
        assert r.generation == 1

    run(main())
