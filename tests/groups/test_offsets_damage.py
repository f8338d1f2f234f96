"""A damaged ``__consumer_offsets`` log: committed offsets never go back silently.

A group commits 100 times (offsets 10 .. 1,000), the broker stops, one byte of the offsets log
is flipped and the broker starts again. The state kept is the last intact commit of each key
(the batches after the damage are read too), the damage is reported (logged at ERROR, in the
store and on the log), and later commits to that partition succeed and survive a restart.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import pytest

from tests.broker._support import batch, config
from tidewire.broker import Broker
from tidewire.broker.offsets import OFFSETS_TOPIC, partition_for
from tidewire.errors import InvalidTopicError
from tidewire.storage.manager import CLEAN_SHUTDOWN_FILE

GROUP = "g"
TP = ("t", 0)


def _commit_100(tmp_path: Path) -> None:
    async def main() -> None:
        async with Broker(config(tmp_path)) as b:
            await b.produce("t", 0, batch([b"x"] * 1000))
            for i in range(1, 101):
                await b.groups.commit(GROUP, {TP: (10 * i, f"commit {i}")})

    asyncio.run(main())


def _segment(tmp_path: Path) -> Path:
    return tmp_path / "data" / f"{OFFSETS_TOPIC}-{partition_for(GROUP)}" / f"{0:020d}.log"


@pytest.mark.parametrize("clean", [True, False], ids=["clean", "unclean"])
@pytest.mark.parametrize(
    ("where", "expected"), [("middle", 1000), ("last", 990)], ids=["middle", "last"]
)
def test_a_flipped_byte_never_moves_a_committed_offset_back(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, where: str, expected: int, clean: bool
) -> None:
    _commit_100(tmp_path)
    if not clean:  # as after a crash: the active segment is scanned at start
        (tmp_path / "data" / CLEAN_SHUTDOWN_FILE).unlink()
    path = _segment(tmp_path)
    data = bytearray(path.read_bytes())
    at = len(data) // 2 if where == "middle" else len(data) - 3  # the last batch's value
    data[at] ^= 0x10
    path.write_bytes(bytes(data))

    async def main() -> None:
        with caplog.at_level(logging.ERROR):
            async with Broker(config(tmp_path)) as b:
                got = b.groups.committed(GROUP)[TP]
                # "last": the damaged batch held the newest commit; the one before it is kept
                assert got.offset == expected
                assert got.metadata == f"commit {expected // 10}"
                plog = b.log(OFFSETS_TOPIC, partition_for(GROUP))
                assert len(plog.damage) == 1
                assert plog.damage_found == 1
                d = plog.damage[0]
                assert d.end - d.start == 1
                assert d.size > 0
                assert b.groups.offsets.damage_skipped == [(partition_for(GROUP), d.start, d.end)]
                # writable: later commits are stored and win
                await b.groups.commit(GROUP, {TP: (1001, "after")})
                assert b.groups.committed(GROUP)[TP].offset == 1001
        errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
        assert any("damaged" in r.getMessage() and str(path) in r.getMessage() for r in errors)
        assert any("committed offsets in the damaged range" in r.getMessage() for r in errors)
        async with Broker(config(tmp_path)) as b:
            assert b.groups.committed(GROUP)[TP].offset == 1001
            assert len(b.log(OFFSETS_TOPIC, partition_for(GROUP)).damage) == 1

    asyncio.run(main())


def test_the_offsets_topic_is_quarantined_not_truncated(tmp_path: Path) -> None:
    _commit_100(tmp_path)
    path = _segment(tmp_path)
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x10
    path.write_bytes(bytes(data))
    p = partition_for(GROUP)

    async def main() -> None:
        async with Broker(config(tmp_path)) as b:
            with pytest.raises(InvalidTopicError, match="quarantine the damage instead"):
                b.repair(OFFSETS_TOPIC, p, "truncate")
            (outcome,) = b.repair(OFFSETS_TOPIC, p, "quarantine")
            assert outcome.action == "quarantined"
            assert b.groups.committed(GROUP)[TP].offset == 1000
        async with Broker(config(tmp_path)) as b:
            assert b.groups.committed(GROUP)[TP].offset == 1000
            assert b.groups.offsets.damage_skipped == []  # read past as a gap now
            assert b.storage_problems()[0].kind == "quarantined"

    asyncio.run(main())
