"""Planning without Spark: the read limit's share per partition, the split by
minPartitions, and the checkpoint's offsets JSON."""

from __future__ import annotations

import itertools
import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tidewire.spark._plan import OffsetRange
from tidewire.spark._plan import split_ranges as split
from tidewire.spark._stream import from_json_offsets, limit_rows, to_json_offsets


def test_limit_rows_shares_by_backlog() -> None:
    begin = {("a", 0): 0, ("a", 1): 100, ("b", 0): 5}
    end = {("a", 0): 600, ("a", 1): 400, ("b", 0): 5, ("c", 0): 100}  # c: new, from 0
    got = limit_rows(begin, end, 100)
    assert got == {("a", 0): 60, ("a", 1): 130, ("b", 0): 5, ("c", 0): 10}
    assert limit_rows(begin, end, 10_000) == end  # everything fits


@given(
    backlog=st.dictionaries(
        st.tuples(st.sampled_from("abc"), st.integers(0, 5)), st.integers(0, 1000), min_size=1
    ),
    max_rows=st.integers(1, 3000),
)
def test_limit_rows_never_exceeds_and_never_goes_back(
    backlog: dict[tuple[str, int], int], max_rows: int
) -> None:
    begin = dict.fromkeys(backlog, 7)
    end = {tp: 7 + n for tp, n in backlog.items()}
    got = limit_rows(begin, end, max_rows)
    taken = sum(got[tp] - begin[tp] for tp in end)
    assert taken == min(max_rows, sum(backlog.values()))
    assert all(begin[tp] <= got[tp] <= end[tp] for tp in end)


def test_split_ranges() -> None:
    ranges = [OffsetRange("t", 0, 10, 300), OffsetRange("t", 1, 0, 300), OffsetRange("t", 2, 4, 4)]
    assert split(ranges, None) == ranges[:2]  # empty ranges get no task
    assert split(ranges, 2) == ranges[:2]
    pieces = split(ranges, 7)
    assert len(pieces) == 8  # 290 -> 4 pieces, 300 -> 4 pieces
    for p in (0, 1):
        mine = [r for r in pieces if r.partition == p]
        assert mine[0].start == ranges[p].start
        assert mine[-1].end == ranges[p].end
        assert all(a.end == b.start for a, b in itertools.pairwise(mine))
        assert max(r.size for r in mine) - min(r.size for r in mine) <= 1
    assert len(split([OffsetRange("t", 0, 0, 3)], 10)) == 3  # never an empty piece


def test_offsets_json_is_sorted_and_round_trips() -> None:
    offsets = {("b", 10): 5, ("a", 2): 1, ("b", 9): 0, ("a", 10): 3}
    as_json = to_json_offsets(offsets)
    assert json.dumps(as_json) == '{"a": {"2": 1, "10": 3}, "b": {"9": 0, "10": 5}}'
    assert from_json_offsets(json.loads(json.dumps(as_json))) == offsets
    with pytest.raises(ValueError, match="not offsets of the tidewire source"):
        from_json_offsets({"a": 3})
    with pytest.raises(ValueError, match="not offsets of the tidewire source"):
        from_json_offsets({"a": {"x": 3}})
