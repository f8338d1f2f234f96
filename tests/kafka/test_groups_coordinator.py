"""Kafka's classic group protocol on its state machine, driven with a fake clock: joins
(MEMBER_ID_REQUIRED first), the initial rebalance delay, leader and followers, sync,
heartbeat errors, session and rebalance timeouts, leaving, commits' fencing, deletion."""

from __future__ import annotations

import asyncio
import struct
from collections.abc import Coroutine
from typing import Any, TypeVar

from tidewire.broker.kafka_consumer_protocol import decode_assignment, decode_subscription
from tidewire.broker.kafka_groups import (
    TRANSITIONS,
    GroupError,
    JoinResult,
    KafkaGroupConfig,
    KafkaGroupCoordinator,
    KafkaGroupState,
    SyncResult,
)

T = TypeVar("T")
E = GroupError
DELAY = 50  # the initial rebalance delay of these tests (ms of the fake clock)


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


def run(coro: Coroutine[Any, Any, T]) -> T:
    return asyncio.run(asyncio.wait_for(coro, 10))


def make(**config: Any) -> tuple[KafkaGroupCoordinator, Clock]:
    config.setdefault("initial_rebalance_delay_ms", DELAY)
    clock = Clock()
    return KafkaGroupCoordinator(KafkaGroupConfig(**config), clock=clock, timer=False), clock


async def settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


def subscription(*topics: str) -> bytes:
    out = struct.pack(">hi", 0, len(topics))
    for t in topics:
        out += struct.pack(">h", len(t)) + t.encode()
    return out + struct.pack(">i", -1)


def assignment(parts: dict[str, list[int]]) -> bytes:
    out = struct.pack(">hi", 0, len(parts))
    for t, ps in parts.items():
        out += struct.pack(">h", len(t)) + t.encode() + struct.pack(">i", len(ps))
        out += b"".join(struct.pack(">i", p) for p in ps)
    return out + struct.pack(">i", -1)


def join(
    c: KafkaGroupCoordinator, member_id: str = "", group: str = "g", **kw: Any
) -> asyncio.Task[JoinResult]:
    kw.setdefault("session_timeout_ms", 1_000)
    kw.setdefault("rebalance_timeout_ms", 5_000)
    kw.setdefault("protocol_type", "consumer")
    kw.setdefault("protocols", [("range", subscription("t"))])
    kw.setdefault("client_id", "c")
    return asyncio.ensure_future(c.join(group, member_id=member_id, **kw))


async def new_member(c: KafkaGroupCoordinator, group: str = "g", **kw: Any) -> str:
    """A member id through MEMBER_ID_REQUIRED, as a v4+ client gets one."""
    r = await join(c, group=group, **kw)
    assert r.error is E.MEMBER_ID_REQUIRED
    assert r.member_id.startswith("c-")
    return r.member_id


async def form_group(
    c: KafkaGroupCoordinator, clock: Clock, n: int
) -> tuple[list[str], list[JoinResult]]:
    """n members join an empty group, the initial delay passes: one generation."""
    ids = [await new_member(c) for _ in range(n)]
    tasks = [join(c, m) for m in ids]
    await settle()
    assert not any(t.done() for t in tasks)  # the initial delay holds the join back
    clock.now += DELAY
    c.tick()
    await settle()
    if n > 1:  # members arrived during the delay: it is extended once, as in Kafka
        assert not any(t.done() for t in tasks)
        clock.now += DELAY
        c.tick()
    results = [await t for t in tasks]
    return ids, results


async def sync_all(
    c: KafkaGroupCoordinator, results: list[JoinResult], parts: dict[str, bytes]
) -> list[SyncResult]:
    leader = results[0].leader
    followers = [
        asyncio.ensure_future(c.sync("g", member_id=r.member_id, generation=r.generation))
        for r in results
        if r.member_id != leader
    ]
    await settle()
    assert not any(f.done() for f in followers)  # they wait for the leader
    lead = await c.sync("g", member_id=leader, generation=results[0].generation, assignments=parts)
    return [lead] + [await f for f in followers]


def test_transitions_follow_kafka() -> None:
    S = KafkaGroupState
    assert TRANSITIONS[S.STABLE] == {S.PREPARING_REBALANCE, S.DEAD}
    assert S.STABLE in TRANSITIONS[S.COMPLETING_REBALANCE]
    assert S.EMPTY in TRANSITIONS[S.PREPARING_REBALANCE]
    assert not TRANSITIONS[S.DEAD]


def test_join_needs_a_member_id_first_then_leader_gets_all_metadata() -> None:
    async def main() -> None:
        c, clock = make()
        ids, results = await form_group(c, clock, 3)
        assert {r.generation for r in results} == {1}
        assert {r.protocol_name for r in results} == {"range"}
        assert {r.protocol_type for r in results} == {"consumer"}
        leader = results[0].leader
        assert leader == ids[0]
        for r in results:
            if r.member_id == leader:
                assert sorted(m.member_id for m in r.members) == sorted(ids)
                assert all(m.metadata == subscription("t") for m in r.members)
            else:
                assert r.members == []
        assert c.rebalances == 1
        assert c.describe("g").state is KafkaGroupState.COMPLETING_REBALANCE  # type: ignore[union-attr]

    run(main())


def test_join_with_an_unknown_member_id_and_v3_style_join() -> None:
    async def main() -> None:
        c, clock = make()
        assert (await join(c, "nobody")).error is E.UNKNOWN_MEMBER_ID
        # JoinGroup v0-v3: no MEMBER_ID_REQUIRED round
        t = join(c, require_known_member_id=False)
        await settle()
        clock.now += DELAY
        c.tick()
        r = await t
        assert r.error is E.NONE
        assert r.member_id.startswith("c-")
        assert r.generation == 1

    run(main())


def test_initial_delay_extends_while_members_arrive_and_makes_one_generation() -> None:
    async def main() -> None:
        c, clock = make()
        a = await new_member(c)
        ta = join(c, a)
        await settle()
        clock.now += DELAY - 10
        b = await new_member(c)
        tb = join(c, b)  # arrives within the delay: the delay is extended once more
        await settle()
        clock.now += 10
        c.tick()
        await settle()
        assert not ta.done()
        assert not tb.done()
        clock.now += DELAY
        c.tick()
        ra, rb = await ta, await tb
        assert ra.generation == rb.generation == 1
        assert c.rebalances == 1

    run(main())


def test_sync_distributes_the_leaders_assignment() -> None:
    async def main() -> None:
        c, clock = make()
        ids, results = await form_group(c, clock, 3)
        parts = {m: assignment({"t": [i]}) for i, m in enumerate(ids)}
        synced = await sync_all(c, results, parts)
        leader = results[0].leader
        order = [leader] + [r.member_id for r in results if r.member_id != leader]
        for m, s in zip(order, synced, strict=True):
            assert s.error is E.NONE
            assert s.assignment == parts[m]
            assert s.protocol_name == "range"
        d = c.describe("g")
        assert d is not None
        assert d.state is KafkaGroupState.STABLE
        assert {m.member_id: m.assignment for m in d.members} == parts
        assert decode_assignment(d.members[0].assignment) == [("t", 0)]
        # a sync in a stable group answers at once with the member's assignment
        again = await c.sync("g", member_id=ids[1], generation=1)
        assert again.assignment == parts[ids[1]]

    run(main())


def test_sync_errors() -> None:
    async def main() -> None:
        c, clock = make()
        ids, _results = await form_group(c, clock, 1)
        assert (await c.sync("nope", member_id=ids[0], generation=1)).error is E.UNKNOWN_MEMBER_ID
        assert (await c.sync("g", member_id="x", generation=1)).error is E.UNKNOWN_MEMBER_ID
        assert (await c.sync("g", member_id=ids[0], generation=7)).error is E.ILLEGAL_GENERATION
        wrong = await c.sync("g", member_id=ids[0], generation=1, protocol_name="roundrobin")
        assert wrong.error is E.INCONSISTENT_GROUP_PROTOCOL
        wrong = await c.sync("g", member_id=ids[0], generation=1, protocol_type="connect")
        assert wrong.error is E.INCONSISTENT_GROUP_PROTOCOL
        ok = await c.sync(
            "g", member_id=ids[0], generation=1, protocol_type="consumer", protocol_name="range"
        )
        assert ok.error is E.NONE

    run(main())


def test_heartbeat_errors_and_rebalance_in_progress() -> None:
    async def main() -> None:
        c, clock = make()
        ids, results = await form_group(c, clock, 2)
        await sync_all(c, results, {})
        assert c.heartbeat("g", member_id=ids[0], generation=1) is E.NONE
        assert c.heartbeat("g", member_id="x", generation=1) is E.UNKNOWN_MEMBER_ID
        assert c.heartbeat("other", member_id=ids[0], generation=1) is E.UNKNOWN_MEMBER_ID
        assert c.heartbeat("g", member_id=ids[0], generation=0) is E.ILLEGAL_GENERATION
        # a third member joins: the others learn of the rebalance from their heartbeat
        third = await new_member(c)
        t3 = join(c, third)
        await settle()
        assert c.heartbeat("g", member_id=ids[0], generation=1) is E.REBALANCE_IN_PROGRESS
        assert (await c.sync("g", member_id=ids[0], generation=1)).error is (
            E.REBALANCE_IN_PROGRESS
        )
        t1, t2 = join(c, ids[0]), join(c, ids[1])
        r3, r1, r2 = await t3, await t1, await t2  # completes once all three rejoined
        assert r1.generation == r2.generation == r3.generation == 2
        assert c.rebalances == 2

    run(main())


def test_session_expiry_removes_a_member_and_the_rest_rebalance() -> None:
    async def main() -> None:
        c, clock = make()
        ids, results = await form_group(c, clock, 2)
        await sync_all(c, results, {})
        clock.now += 600
        assert c.heartbeat("g", member_id=ids[0], generation=1) is E.NONE
        clock.now += 600  # ids[1] is silent for 1,200 ms > its 1,000 ms session
        c.tick()
        d = c.describe("g")
        assert d is not None
        assert [m.member_id for m in d.members] == [ids[0]]
        assert d.state is KafkaGroupState.PREPARING_REBALANCE
        assert c.heartbeat("g", member_id=ids[1], generation=1) is E.UNKNOWN_MEMBER_ID
        r = await join(c, ids[0])  # the only member left rejoined: done at once
        assert r.generation == 2
        assert r.leader == ids[0]

    run(main())


def test_a_member_that_does_not_rejoin_is_removed_at_the_rebalance_timeout() -> None:
    async def main() -> None:
        c, clock = make()
        ids, results = await form_group(c, clock, 2)
        await sync_all(c, results, {})
        t = join(c, ids[0], protocols=[("range", subscription("t", "u"))])  # a new subscription
        await settle()
        assert not t.done()
        clock.now += 900
        assert c.heartbeat("g", member_id=ids[1], generation=1) is E.REBALANCE_IN_PROGRESS
        clock.now += 5_000 - 900  # the rebalance timeout: ids[1] never rejoined
        c.tick()
        r = await t
        assert r.error is E.NONE
        assert r.generation == 2
        assert [m.member_id for m in r.members] == [ids[0]]
        assert c.heartbeat("g", member_id=ids[1], generation=2) is E.UNKNOWN_MEMBER_ID

    run(main())


def test_one_of_three_leaving_makes_exactly_one_rebalance() -> None:
    async def main() -> None:
        c, clock = make()
        ids, results = await form_group(c, clock, 3)
        await sync_all(c, results, {m: assignment({"t": [i]}) for i, m in enumerate(ids)})
        assert c.leave("g", [(ids[2], None)]) == [E.NONE]
        assert c.heartbeat("g", member_id=ids[0], generation=1) is E.REBALANCE_IN_PROGRESS
        assert c.heartbeat("g", member_id=ids[1], generation=1) is E.REBALANCE_IN_PROGRESS
        t0, t1 = join(c, ids[0]), join(c, ids[1])
        r0, r1 = await t0, await t1
        assert r0.generation == r1.generation == 2
        synced = await sync_all(c, [r0, r1], {ids[0]: b"a", ids[1]: b"b"})
        assert [s.error for s in synced] == [E.NONE, E.NONE]
        assert c.heartbeat("g", member_id=ids[0], generation=2) is E.NONE
        assert c.heartbeat("g", member_id=ids[1], generation=2) is E.NONE
        assert c.rebalances == 2  # the first generation and one more: nothing extra
        assert c.describe("g").state is KafkaGroupState.STABLE  # type: ignore[union-attr]

    run(main())


def test_leave_in_a_batch_and_unknown_members() -> None:
    async def main() -> None:
        c, clock = make()
        ids, results = await form_group(c, clock, 2)
        await sync_all(c, results, {})
        got = c.leave("g", [(ids[0], None), ("ghost", None), (ids[1], None)])
        assert got == [E.NONE, E.UNKNOWN_MEMBER_ID, E.NONE]
        d = c.describe("g")
        assert d is not None
        assert d.state is KafkaGroupState.EMPTY
        assert not d.members
        assert d.generation == 2  # the rebalance after the last member left
        assert c.leave("missing", [("x", None)]) == [E.UNKNOWN_MEMBER_ID]

    run(main())


def test_members_that_do_not_sync_in_time_are_removed() -> None:
    async def main() -> None:
        c, clock = make()
        ids, _results = await form_group(c, clock, 2)
        follower = asyncio.ensure_future(c.sync("g", member_id=ids[1], generation=1))
        await settle()
        clock.now += 5_000  # the leader never syncs
        c.tick()
        assert (await follower).error is E.REBALANCE_IN_PROGRESS
        d = c.describe("g")
        assert d is not None
        assert [m.member_id for m in d.members] == [ids[1]]
        assert d.state is KafkaGroupState.PREPARING_REBALANCE

    run(main())


def test_protocol_checks() -> None:
    async def main() -> None:
        c, clock = make()
        await form_group(c, clock, 1)
        other = await join(c, protocol_type="connect")
        assert other.error is E.INCONSISTENT_GROUP_PROTOCOL
        no_common = await join(c, protocols=[("sticky", b"")])
        assert no_common.error is E.INCONSISTENT_GROUP_PROTOCOL
        assert (await join(c, protocols=[])).error is E.INCONSISTENT_GROUP_PROTOCOL
        assert (await join(c, group="")).error is E.INVALID_GROUP_ID
        assert (await join(c, session_timeout_ms=10)).error is E.INVALID_SESSION_TIMEOUT

    run(main())


def test_the_protocol_most_members_prefer_is_chosen() -> None:
    async def main() -> None:
        c, clock = make()
        both = [("range", b"r"), ("roundrobin", b"rr")]
        rr_first = [("roundrobin", b"rr"), ("range", b"r")]
        ids = [await new_member(c, protocols=p) for p in (both, rr_first, rr_first)]
        tasks = [
            join(c, m, protocols=p) for m, p in zip(ids, (both, rr_first, rr_first), strict=True)
        ]
        for _ in range(2):  # the initial delay, extended once for the later members
            await settle()
            clock.now += DELAY
            c.tick()
        results = [await t for t in tasks]
        assert {r.protocol_name for r in results} == {"roundrobin"}
        assert {m.metadata for m in results[0].members} == {b"rr"}

    run(main())


def test_a_group_in_use_by_tidewire_clients_is_refused() -> None:
    async def main() -> None:
        clock = Clock()
        c = KafkaGroupCoordinator(clock=clock, foreign=lambda g: g == "tw", timer=False)
        assert (await join(c, group="tw")).error is E.INCONSISTENT_GROUP_PROTOCOL
        assert c.check_commit("tw", member_id="", generation=-1) is (E.INCONSISTENT_GROUP_PROTOCOL)

    run(main())


def test_commit_fencing() -> None:
    async def main() -> None:
        c, clock = make()
        # no such group: a simple commit is fine, a member's is not
        assert c.check_commit("g", member_id="", generation=-1) is E.NONE
        assert c.check_commit("g", member_id="m", generation=3) is E.ILLEGAL_GENERATION
        ids, results = await form_group(c, clock, 2)
        assert c.check_commit("g", member_id=ids[0], generation=1) is E.REBALANCE_IN_PROGRESS
        await sync_all(c, results, {})
        assert c.check_commit("g", member_id=ids[0], generation=1) is E.NONE
        assert c.check_commit("g", member_id=ids[0], generation=0) is E.ILLEGAL_GENERATION
        assert c.check_commit("g", member_id="x", generation=1) is E.UNKNOWN_MEMBER_ID
        assert c.check_commit("g", member_id="", generation=-1) is E.UNKNOWN_MEMBER_ID
        # a commit keeps the session alive, as a heartbeat does
        clock.now += 900
        assert c.check_commit("g", member_id=ids[1], generation=1) is E.NONE
        assert c.heartbeat("g", member_id=ids[0], generation=1) is E.NONE
        clock.now += 900
        c.tick()
        assert c.has_members("g")
        assert len(c.describe("g").members) == 2

    run(main())


def test_delete_only_an_empty_group() -> None:
    async def main() -> None:
        c, clock = make()
        ids, results = await form_group(c, clock, 1)
        assert c.delete("g") is E.NON_EMPTY_GROUP
        await sync_all(c, results, {})
        assert c.leave("g", [(ids[0], None)]) == [E.NONE]
        assert c.delete("g") is E.NONE
        assert not c.exists("g")
        assert c.heartbeat("g", member_id=ids[0], generation=1) is E.UNKNOWN_MEMBER_ID

    run(main())


def test_static_member_restart_fences_the_old_instance() -> None:
    async def main() -> None:
        c, clock = make()
        t = join(c, group_instance_id="i-1")  # static members get no MEMBER_ID_REQUIRED
        await settle()
        clock.now += DELAY
        c.tick()
        first = await t
        assert first.error is E.NONE
        await c.sync("g", member_id=first.member_id, generation=1, assignments={})
        again = await join(c, group_instance_id="i-1")
        assert again.error is E.NONE
        assert again.member_id != first.member_id
        assert again.generation == 2
        assert c.heartbeat("g", member_id=first.member_id, generation=2) is E.UNKNOWN_MEMBER_ID
        assert c.leave("g", [("", "i-1")]) == [E.NONE]
        assert not c.has_members("g")

    run(main())


def test_pending_member_ids_lapse_after_the_session_timeout() -> None:
    async def main() -> None:
        c, clock = make()
        m = await new_member(c)
        clock.now += 1_001
        c.tick()
        assert (await join(c, m)).error is E.UNKNOWN_MEMBER_ID

    run(main())


def test_the_timer_task_acts_on_deadlines_without_tick_calls() -> None:
    async def main() -> None:
        c = KafkaGroupCoordinator(KafkaGroupConfig(initial_rebalance_delay_ms=20))
        try:
            r = await join(c, require_known_member_id=False, session_timeout_ms=200)
            assert r.generation == 1  # the timer ended the initial delay
            await c.sync("g", member_id=r.member_id, generation=1, assignments={})
            for _ in range(200):  # the session (200 ms) expires without heartbeats
                if not c.has_members("g"):
                    break
                await asyncio.sleep(0.05)
            assert not c.has_members("g")
        finally:
            await c.close()

    run(main())


def test_consumer_protocol_decoders() -> None:
    assert decode_subscription(subscription("b", "a")) == ("a", "b")
    assert decode_subscription(b"\x00") == ()
    assert decode_assignment(assignment({"t": [2, 0], "u": [1]})) == [("t", 0), ("t", 2), ("u", 1)]
    assert decode_assignment(b"\x00\x00\x7f\xff\xff\xff") == []


def test_the_timer_wakes_for_a_shorter_session_that_joins_later() -> None:
    async def main() -> None:
        c = KafkaGroupCoordinator(KafkaGroupConfig(initial_rebalance_delay_ms=0))
        try:
            slow = await join(
                c,
                require_known_member_id=False,
                session_timeout_ms=60_000,
                rebalance_timeout_ms=30_000,
            )
            await c.sync("g", member_id=slow.member_id, generation=1, assignments={})
            # the timer now sleeps until the 60 s session; a member with 300 ms joins
            fast = join(
                c,
                require_known_member_id=False,
                session_timeout_ms=300,
                rebalance_timeout_ms=30_000,
            )
            await settle()
            again = await join(
                c, slow.member_id, session_timeout_ms=60_000, rebalance_timeout_ms=30_000
            )
            new = await fast
            assert again.generation == new.generation == 2
            await asyncio.gather(
                c.sync("g", member_id=new.member_id, generation=2),
                c.sync("g", member_id=again.member_id, generation=2, assignments={}),
            )
            # the fast member never heartbeats: gone after ~300 ms, long before any other
            # deadline (60 s, 30 s) would wake the timer
            for _ in range(60):
                d = c.describe("g")
                assert d is not None
                if len(d.members) == 1:
                    break
                await asyncio.sleep(0.05)
            assert [m.member_id for m in c.describe("g").members] == [slow.member_id]  # type: ignore[union-attr]
        finally:
            await c.close()

    run(main())
