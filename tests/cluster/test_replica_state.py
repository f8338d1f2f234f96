"""The leader's follower bookkeeping: the high watermark follows the slowest committed in-sync
replica and never goes back, laggards are proposed out and caught-up followers back in, a
change counts only once etcd took it, and acks=all is refused below min_insync_replicas.
Also random runs against the invariants."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tidewire.cluster.replica_state import PartitionLeader


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def leader(clock: Clock, isr: tuple[int, ...] = (1, 2, 3), **kw: int) -> PartitionLeader:
    return PartitionLeader(
        1,
        (1, 2, 3),
        isr,
        log_end=kw.get("log_end", 0),
        epoch_start=kw.get("epoch_start", 0),
        high_watermark=kw.get("hw", 0),
        clock=clock,
        lag_max_s=10.0,
        min_insync=2,
    )


def test_the_high_watermark_is_the_slowest_in_sync_replica() -> None:
    c = Clock()
    p = leader(c)
    p.appended(10)
    assert p.high_watermark == 0
    p.fetched(2, 10)
    assert p.high_watermark == 0  # 3 has nothing yet
    p.fetched(3, 4)
    assert p.high_watermark == 4
    assert p.replicated(4)
    assert not p.replicated(5)
    p.fetched(3, 10)
    assert p.high_watermark == 10
    p.fetched(3, 7)  # a follower that went back (truncated) cannot lower it
    assert p.high_watermark == 10
    with pytest.raises(ValueError, match="node 9 is not a follower"):
        p.fetched(9, 1)
    with pytest.raises(ValueError, match="leader 1 is not in its own ISR"):
        PartitionLeader(
            1,
            (1, 2),
            (2,),
            log_end=0,
            epoch_start=0,
            high_watermark=0,
            clock=c,
            lag_max_s=1,
            min_insync=1,
        )


def test_a_laggard_leaves_only_once_etcd_took_it_and_comes_back_when_caught_up() -> None:
    c = Clock()
    p = leader(c)
    p.appended(10)
    p.fetched(2, 10)
    p.fetched(3, 2)
    c.now += 5
    assert p.proposed_isr() is None  # 3 is slow but within replica_lag_max_ms
    c.now += 6
    p.fetched(2, 10)  # 2 keeps up
    proposed = p.proposed_isr()
    assert proposed == {1, 2}
    assert p.proposed_isr() is None  # one change at a time
    p.appended(12)
    p.fetched(2, 12)
    assert p.high_watermark == 2  # 3 still counts until etcd took the change
    p.isr_committed(proposed)
    assert p.high_watermark == 12
    assert p.can_append_acks_all()
    # 3 catches up to the high watermark: proposed back in; counted once committed.
    p.fetched(3, 12)
    back = p.proposed_isr()
    assert back == {1, 2, 3}
    p.isr_refused()  # the partition changed meanwhile: proposed again next time
    assert p.proposed_isr() == {1, 2, 3}
    p.isr_committed({1, 2, 3})
    assert p.isr == {1, 2, 3}


def test_a_follower_rejoins_only_from_this_epochs_start() -> None:
    c = Clock()
    p = leader(c, isr=(1,), log_end=50, epoch_start=50, hw=20)
    p.fetched(2, 40)  # has the high watermark (20) but not this epoch's start (50)
    assert p.proposed_isr() is None
    p.fetched(2, 50)
    assert p.proposed_isr() == {1, 2}


def test_a_follower_that_stopped_fetching_at_the_end_is_not_taken_back_in() -> None:
    c = Clock()
    p = leader(c)
    p.appended(10)
    p.fetched(2, 10)
    p.fetched(3, 10)
    c.now += 11
    p.fetched(2, 10)  # 3 stopped fetching (at the end: nothing new was written)
    out = p.proposed_isr()
    assert out == {1, 2}
    p.isr_committed(out)
    assert p.proposed_isr() is None  # not back in: it does not fetch
    p.fetched(3, 10)
    assert p.proposed_isr() == {1, 2, 3}


def test_a_follower_the_controller_removed_comes_back_only_after_a_new_fetch() -> None:
    """The controller drops a node that left the cluster; its last fetch, a moment ago, was at
    the log end. The leader must not propose it back on that fetch (a tug of war with the
    controller until the node returns), only on one made after the removal."""
    c = Clock()
    p = leader(c)
    p.appended(10)
    p.fetched(2, 10)
    p.fetched(3, 10)
    p.isr_committed((1, 2))  # the controller's change: node 3 left the cluster
    c.now += 0.01
    assert p.proposed_isr() is None
    p.fetched(3, 10)  # back, and caught up
    assert p.proposed_isr() == frozenset({1, 2, 3})


def test_a_follower_whose_log_end_goes_back_below_the_high_watermark_leaves_at_once() -> None:
    """Cut at a damaged range, it lacks offsets below the high watermark: out of the ISR
    without waiting for the lag timeout, back in once it holds the high watermark again."""
    c = Clock()
    p = leader(c)
    p.appended(10)
    p.fetched(2, 10)
    p.fetched(3, 10)
    assert p.high_watermark == 10
    assert p.proposed_isr() is None
    p.fetched(3, 4)  # its log was cut at offset 4
    assert p.proposed_isr() == {1, 2}
    p.isr_committed({1, 2})
    p.appended(12)
    p.fetched(2, 12)
    assert p.high_watermark == 12
    p.fetched(3, 8)  # copying again: still lacks offsets
    assert p.proposed_isr() is None
    p.fetched(3, 12)
    assert p.proposed_isr() == {1, 2, 3}


def test_a_newcomer_below_the_high_watermark_is_not_lost() -> None:
    """Taken in at the high watermark, it may be behind it when etcd takes it (the high
    watermark moved on without it): its log end never went back, so it stays in."""
    c = Clock()
    p = leader(c, isr=(1, 2))
    p.appended(10)
    p.fetched(2, 10)
    p.fetched(3, 10)
    assert p.proposed_isr() == {1, 2, 3}
    p.appended(20)
    p.fetched(2, 20)
    assert p.high_watermark == 20
    p.isr_committed({1, 2, 3})
    p.fetched(3, 15)
    assert p.proposed_isr() is None


def test_acks_all_is_refused_below_min_insync() -> None:
    c = Clock()
    p = leader(c)
    c.now += 11
    assert p.proposed_isr() == {1}
    p.isr_committed({1})
    assert not p.can_append_acks_all()
    p.appended(5)
    assert p.high_watermark == 5  # alone in the ISR: its own log end


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.one_of(
            st.tuples(st.just("append"), st.integers(0, 5)),
            st.tuples(st.just("fetch"), st.sampled_from([2, 3]), st.integers(0, 40)),
            st.tuples(st.just("tick"), st.floats(0, 6)),
            st.tuples(st.just("isr"), st.booleans()),
        ),
        max_size=60,
    )
)
def test_invariants_over_random_runs(ops: list[tuple]) -> None:  # type: ignore[type-arg]
    """The high watermark never goes back, never passes the leader's log end, and never passes
    the log end of a follower in the committed ISR; the leader is always in its ISR."""
    c = Clock()
    p = leader(c)
    ends = {2: 0, 3: 0}
    last_hw = 0
    for op in ops:
        if op[0] == "append":
            p.appended(p.log_end + op[1])
        elif op[0] == "fetch":
            ends[op[1]] = min(op[2], p.log_end)
            p.fetched(op[1], op[2])
        elif op[0] == "tick":
            c.now += op[1]
        else:
            proposal = p.proposed_isr()
            if proposal is not None:
                p.isr_committed(proposal) if op[1] else p.isr_refused()
        assert p.node_id in p.isr
        assert last_hw <= p.high_watermark <= p.log_end
        for r in p.isr - {1}:
            assert p.high_watermark <= max(ends[r], last_hw)
        last_hw = p.high_watermark
