"""The leader-epoch history and the truncation rule of KIP-101/KIP-279, on the scenarios of
those proposals and on random histories against a model."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tidewire.cluster.epochs import UNDEFINED, EpochHistory, truncation_point


def test_assign_and_end_offsets() -> None:
    h = EpochHistory.from_batches([(0, -1), (0, 0), (5, 0), (10, 2), (20, 5), (25, 5)])
    assert list(h) == [(0, 0), (2, 10), (5, 20)]
    assert h.latest == 5
    assert h.end_offset(0, 30) == (0, 10)
    assert h.end_offset(1, 30) == (0, 10)  # no epoch 1: the largest below it
    assert h.end_offset(2, 30) == (2, 20)
    assert h.end_offset(5, 30) == (5, 30)
    assert h.end_offset(9, 30) == (5, 30)
    assert EpochHistory([(3, 7)]).end_offset(2, 9) == UNDEFINED
    with pytest.raises(ValueError, match="epochs only go up"):
        h.assign(4, 40)
    with pytest.raises(ValueError, match="before epoch 5's start 20"):
        h.assign(6, 19)


def test_truncation_both_ends() -> None:
    h = EpochHistory([(0, 0), (2, 10), (5, 20)])
    h.truncate_to(15)
    assert list(h) == [(0, 0), (2, 10)]
    h.truncate_to(10)
    assert list(h) == [(0, 0)]
    h = EpochHistory([(0, 0), (2, 10), (5, 20)])
    h.truncate_before(12)
    assert list(h) == [(2, 12), (5, 20)]
    h.truncate_before(20)
    assert list(h) == [(5, 20)]


def test_kip101_scenario_1_a_replica_keeps_what_the_new_leader_has() -> None:
    # A (leader, epoch 0) and B both hold m1 (offset 0) and m2 (offset 1); B restarts before
    # the high watermark reached it, A dies, B leads epoch 1. Old rule: B truncates to the
    # high watermark and loses m2. With epochs: B keeps both.
    b = EpochHistory([(0, 0)])
    leader_b_answer = b.end_offset(0, 2)  # B itself leads: its log end
    assert truncation_point(b, 2, leader_b_answer) == 2


def test_kip101_scenario_2_divergent_logs_are_cut_at_the_fork() -> None:
    # A leads epoch 0 and wrote m1 at 0 and m2 at 1 (m2 unflushed on B). Both crash; B comes
    # back first with only m1, leads epoch 1 and writes m3 at offset 1. A returns holding m2 at
    # offset 1 in epoch 0: it asks B for the end of epoch 0 and truncates to 1 (drops m2).
    a = EpochHistory([(0, 0)])
    b = EpochHistory([(0, 0), (1, 1)])
    answer = b.end_offset(a.latest, 2)
    assert answer == (0, 1)
    assert truncation_point(a, 2, answer) == 1


def test_a_former_leader_with_an_epoch_the_new_leader_never_had() -> None:
    # A led epoch 3 from offset 10 and wrote to 15, acknowledged nothing past 10, then was cut
    # off; B (had epoch 2 up to offset 10) leads epoch 4 from 10. A asks about epoch 3: B
    # answers epoch 2 ending at 10: A cuts at 10.
    a = EpochHistory([(2, 0), (3, 10)])
    b = EpochHistory([(2, 0), (4, 10)])
    answer = b.end_offset(a.latest, 14)
    assert answer == (2, 10)
    assert truncation_point(a, 15, answer) == 10


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.tuples(st.integers(0, 3), st.integers(1, 5)), min_size=1, max_size=12), st.data()
)
def test_truncation_keeps_exactly_the_common_prefix(
    steps: list[tuple[int, int]], data: st.DataObject
) -> None:
    """A leader's log built from epochs; a follower that shares a prefix of it and then
    wrote records of its own in an epoch the leader never used: it truncates to the shared
    prefix's end (never below a record both hold in the same epoch, never above the fork)."""
    leader_log: list[int] = []  # epoch of each offset
    epoch = 0
    for bump, n in steps:
        epoch += bump * 2  # the leader's epochs are even
        leader_log += [epoch] * n
    shared = data.draw(st.integers(0, len(leader_log)))
    follower_log = leader_log[:shared]
    if follower_log and data.draw(st.booleans()):
        # the follower led an odd epoch the leader never had, after the shared prefix
        own = follower_log[-1] + 1
        follower_log += [own] * data.draw(st.integers(1, 4))
    leader = EpochHistory.from_batches(enumerate(leader_log))
    follower = EpochHistory.from_batches(enumerate(follower_log))
    if not len(follower):
        return
    cut = truncation_point(
        follower, len(follower_log), leader.end_offset(follower.latest, len(leader_log))
    )
    common = 0
    while (
        common < min(len(leader_log), len(follower_log))
        and leader_log[common] == follower_log[common]
    ):
        common += 1
    assert cut == common
