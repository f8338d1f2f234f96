"""The assignment strategies: every subscribed partition owned exactly once, by a member
subscribed to its topic; range and round-robin as documented; sticky balanced and moving the
fewest partitions a balanced assignment must move."""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tidewire.broker.assignors import Assignment, Strategy, TopicPartition, assign


def check_complete(
    out: Assignment, subs: Mapping[str, Sequence[str]], partitions: Mapping[str, int]
) -> None:
    wanted = {
        (t, p) for ts in subs.values() for t in ts if t in partitions for p in range(partitions[t])
    }
    owned = [tp for tps in out.values() for tp in tps]
    assert len(owned) == len(set(owned)), "a partition owned twice"
    assert set(owned) == wanted
    assert set(out) == set(subs)
    for m, tps in out.items():
        assert tps == sorted(tps)
        assert all(t in subs[m] for t, _ in tps)


def test_range_splits_each_topic_into_contiguous_ranges() -> None:
    subs = {"a": ["t", "u"], "b": ["t", "u"], "c": ["t"]}
    out = assign(Strategy.RANGE, subs, {"t": 7, "u": 3})
    assert out == {
        "a": [("t", 0), ("t", 1), ("t", 2), ("u", 0), ("u", 1)],
        "b": [("t", 3), ("t", 4), ("u", 2)],
        "c": [("t", 5), ("t", 6)],
    }


def test_round_robin_deals_partitions_in_turn() -> None:
    subs = {"a": ["t"], "b": ["t"], "c": ["t"]}
    out = assign(Strategy.ROUND_ROBIN, subs, {"t": 5})
    assert out == {"a": [("t", 0), ("t", 3)], "b": [("t", 1), ("t", 4)], "c": [("t", 2)]}


def test_round_robin_skips_members_not_subscribed() -> None:
    out = assign(Strategy.ROUND_ROBIN, {"a": ["t"], "b": ["u"]}, {"t": 2, "u": 2})
    assert out == {"a": [("t", 0), ("t", 1)], "b": [("u", 0), ("u", 1)]}


def test_missing_topics_and_members_without_topics_get_nothing() -> None:
    for strategy in Strategy:
        out = assign(strategy, {"a": ["nope"], "b": ["t"]}, {"t": 2})
        assert out == {"a": [], "b": [("t", 0), ("t", 1)]}


def test_sticky_keeps_everything_when_nothing_changes() -> None:
    subs = {"a": ["t"], "b": ["t"], "c": ["t"]}
    first = assign(Strategy.STICKY, subs, {"t": 12})
    assert assign(Strategy.STICKY, subs, {"t": 12}, first) == first


def test_sticky_moves_only_the_leavers_partitions() -> None:
    subs = {"a": ["t"], "b": ["t"], "c": ["t"]}
    first = assign(Strategy.STICKY, subs, {"t": 12})
    del subs["b"]
    second = assign(Strategy.STICKY, subs, {"t": 12}, first)
    for m in ("a", "c"):
        assert set(first[m]) <= set(second[m])
    assert sorted(len(v) for v in second.values()) == [6, 6]


def test_sticky_gives_a_newcomer_its_share_only() -> None:
    subs = {"a": ["t"], "b": ["t"]}
    first = assign(Strategy.STICKY, subs, {"t": 12})
    subs["c"] = ["t"]
    second = assign(Strategy.STICKY, subs, {"t": 12}, first)
    assert len(second["c"]) == 4
    moved = sum(len(set(first[m]) - set(second[m])) for m in first)
    assert moved == 4


def minimum_moves(
    previous: Mapping[str, Sequence[TopicPartition]], members: list[str], total: int
) -> int:
    """The fewest previously owned partitions any balanced assignment must move, when every
    member subscribes to every partition: the ceil quotas go to the members keeping most."""
    kept = sorted((len(previous.get(m, ())) for m in members), reverse=True)
    base, extra = divmod(total, len(members))
    quotas = [base + 1] * extra + [base] * (len(members) - extra)
    return sum(max(0, k - q) for k, q in zip(kept, quotas, strict=True))


@settings(max_examples=300, deadline=None)
@given(
    n_partitions=st.integers(1, 40),
    before=st.integers(1, 8),
    leave=st.integers(0, 7),
    join=st.integers(0, 7),
    seed=st.integers(0, 2**32),
)
def test_sticky_moves_the_minimum(
    n_partitions: int, before: int, leave: int, join: int, seed: int
) -> None:
    rng = random.Random(seed)
    members = [f"m{i}" for i in range(before)]
    subs = {m: ["t"] for m in members}
    first = assign(Strategy.STICKY, subs, {"t": n_partitions})
    staying = rng.sample(members, max(before - leave, 0))
    newcomers = [f"n{i}" for i in range(join)]
    after = staying + newcomers
    if not after:
        return
    second = assign(Strategy.STICKY, {m: ["t"] for m in after}, {"t": n_partitions}, first)
    check_complete(second, {m: ["t"] for m in after}, {"t": n_partitions})
    loads = [len(v) for v in second.values()]
    assert max(loads) - min(loads) <= 1
    prev = {m: first[m] for m in staying}
    moved = sum(len(set(prev[m]) - set(second[m])) for m in staying)
    assert moved == minimum_moves(prev, after, n_partitions)


@settings(max_examples=200, deadline=None)
@given(
    strategy=st.sampled_from(list(Strategy)),
    subs=st.dictionaries(
        st.text("abcdef", min_size=1, max_size=3),
        st.lists(st.sampled_from(["t", "u", "v", "missing"]), max_size=4),
        min_size=1,
        max_size=8,
    ),
    counts=st.tuples(st.integers(1, 20), st.integers(1, 5), st.integers(1, 9)),
)
def test_every_strategy_assigns_every_partition_once(
    strategy: Strategy, subs: dict[str, list[str]], counts: tuple[int, int, int]
) -> None:
    partitions = dict(zip(("t", "u", "v"), counts, strict=True))
    out = assign(strategy, subs, partitions)
    check_complete(out, subs, partitions)
    again = assign(strategy, subs, partitions, out)
    check_complete(again, subs, partitions)
    if strategy is Strategy.STICKY:
        assert again == out


@pytest.mark.parametrize("strategy", list(Strategy))
def test_large_groups_are_assigned_quickly(strategy: Strategy) -> None:
    subs = {f"m{i:03}": ["t", "u"] for i in range(100)}
    partitions = {"t": 600, "u": 400}
    out = assign(strategy, subs, partitions)
    check_complete(out, subs, partitions)
    del subs["m050"]
    check_complete(assign(strategy, subs, partitions, out), subs, partitions)


def test_sticky_spreads_one_owner_over_a_hundred_members() -> None:
    """The start of a growing group: one member owned all 10,000 partitions; 99 join. Each
    ends with 100, and the first keeps 100 of its own (the fewest moves). The same-subscription
    path does this in one pass; a move-one-partition-at-a-time balancer took seconds here."""
    subs = {f"m{i:03d}": ["t"] for i in range(100)}
    before = [("t", p) for p in range(10_000)]
    out = assign(Strategy.STICKY, subs, {"t": 10_000}, {"m000": before})
    assert {len(tps) for tps in out.values()} == {100}
    assert set(out["m000"]) <= set(before)
    assert sorted(tp for tps in out.values() for tp in tps) == before
