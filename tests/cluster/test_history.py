"""The cluster history checker against planted anomalies: each check fails on the anomaly it
exists for, and a clean history passes."""

from __future__ import annotations

from typing import Any

import pytest

from tests.cluster._history import Ack, Committed, LeaderSeen, Poll, Seek, check_cluster_history

V = [f"v{i}".encode() for i in range(6)]
LOG = [(i, v) for i, v in enumerate(V)]


def clean(**change: Any) -> dict[str, Any]:
    h: dict[str, Any] = {
        "sent": V,
        "acks": [Ack(0, 0, tuple(V[:3])), Ack(0, 3, tuple(V[3:]))],
        "events": [
            LeaderSeen(0, 0, 1),
            Poll("c1", 0, tuple(LOG[:4])),
            LeaderSeen(0, 1, 2),
            Poll("c1", 0, tuple(LOG[4:])),
            Seek("c1", 0),
            Poll("c1", 0, tuple(LOG[:2])),
            Committed("g", 0, 6),
        ],
        "replicas": {1: {0: LOG}, 2: {0: LOG}, 3: {0: LOG[:4]}},
        "leaders": {0: 2},
        "isr": {0: [1, 2]},
        "high_watermarks": {0: 6},
    }
    h.update(change)
    return h


def test_a_clean_history_passes() -> None:
    assert check_cluster_history(**clean()) == []


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        ({"replicas": {1: {0: LOG}, 2: {0: LOG[:5]}, 3: {}}}, "lost"),
        (
            {"replicas": {1: {0: [*LOG[:5], (5, b"other")]}, 2: {0: LOG}, 3: {}}},
            "inconsistent offset 0/5",
        ),
        ({"isr": {0: [1, 2, 3]}}, "node 3, in sync for partition 0, lacks 2 offsets"),
        (
            {"events": [Poll("c1", 0, ((0, V[0]), (2, V[2])))]},
            "unseen: b'v1', acknowledged at 0/1",
        ),
        (
            {"events": [Poll("c1", 0, tuple(LOG[:3])), Poll("c1", 0, tuple(LOG[1:4]))]},
            "non-monotonic poll: c1 read 0/1 after 0/2",
        ),
        (
            {"events": [LeaderSeen(0, 3, 1), LeaderSeen(0, 3, 2)]},
            "two leaders of partition 0 in epoch 3",
        ),
        ({"events": [Committed("g", 0, 7)]}, "group g committed 0/7, above the high watermark 6"),
        ({"events": [Poll("c2", 0, ((1, b"forged"),))]}, "inconsistent offset 0/1"),
    ],
)
def test_each_planted_anomaly_is_found(change: dict[str, Any], expected: str) -> None:
    problems = check_cluster_history(**clean(**change))
    assert any(expected in p for p in problems), problems
