"""list_offset: ``-2`` the log start, ``-1`` the high watermark, otherwise the first offset
whose record timestamp is at or after the one asked for (or the high watermark).

Timestamps go back and forth within and across batches, over several segments with dense
time indexes, in compressed and plain batches: every answer equals a brute-force scan of the
records, before and after a restart.
"""

from __future__ import annotations

import asyncio
import random
from pathlib import Path

import pytest

from tests.broker._support import ALL, T0, batch, config, read_all
from tidewire.broker import Broker
from tidewire.errors import OffsetOutOfRangeError
from tidewire.records import Codec
from tidewire.storage import FsyncPolicy, LogConfig


def test_empty_partition(tmp_path: Path) -> None:
    async def main() -> None:
        async with Broker(config(tmp_path)) as broker:
            broker.create_topic("t")
            assert [broker.list_offset("t", 0, ts) for ts in (-2, -1, 0, T0)] == [0, 0, 0, 0]

    asyncio.run(main())


def _brute(pairs: list[tuple[int, int]], timestamp: int, hw: int) -> int:
    return next((o for o, t in pairs if t >= timestamp), hw)


@pytest.mark.parametrize("policy", list(FsyncPolicy))
@pytest.mark.parametrize("seed", range(2))
def test_timestamps_match_a_brute_force_scan(
    tmp_path: Path, seed: int, policy: FsyncPolicy
) -> None:
    rng = random.Random(seed)
    log_config = LogConfig(segment_bytes=2048, index_interval_bytes=64, fsync=policy)

    async def _check(broker: Broker) -> list[int]:
        answers = []
        for p in (0, 1):
            pairs = [(r.offset, r.timestamp) for r in await read_all(broker, "t", p)]
            hw = broker.list_offset("t", p, -1)
            assert hw == len(pairs) == broker.describe("t")[p].high_watermark
            assert broker.list_offset("t", p, -2) == 0
            stamps = {t for _, t in pairs}
            for ts in sorted(stamps | {t + 1 for t in stamps} | {0, T0 - 10**6, T0 + 10**6}):
                got = broker.list_offset("t", p, ts)
                assert got == _brute(pairs, ts, hw), ts
                answers.append(got)
        return answers

    async def main() -> None:
        async with Broker(config(tmp_path, log=log_config)) as broker:
            broker.create_topic("t", 2)
            for _ in range(100):
                n = rng.randint(1, 5)
                # Mostly rising, sometimes far back: the running maximum matters.
                stamps = [T0 + rng.randint(0, 3000) - rng.choice([0, 0, 2500]) for _ in range(n)]
                codec = rng.choice([Codec.NONE, Codec.NONE, Codec.GZIP, Codec.ZSTD])
                await broker.produce(
                    "t", rng.randrange(2), batch([b"v"] * n, timestamps=stamps, codec=codec)
                )
            assert broker.log("t", 0).segment_count > 2
            probes = await _check(broker)
        async with Broker(config(tmp_path, log=log_config)) as broker:
            assert await _check(broker) == probes

    asyncio.run(main())


def test_log_start_after_retention(tmp_path: Path) -> None:
    keep_little = LogConfig(segment_bytes=1024, retention_bytes=0)

    async def main() -> None:
        async with Broker(config(tmp_path, log=keep_little)) as broker:
            broker.create_topic("t")
            for i in range(40):
                await broker.produce("t", 0, batch([b"x" * 50], timestamps=[T0 + i]))
            deleted = broker.logs.apply_retention()
            assert deleted
            start = broker.list_offset("t", 0, -2)
            assert start == broker.log("t", 0).segment_bases[0] > max(deleted["t", 0])
            [status] = broker.describe("t")
            assert status.log_start_offset == start
            assert broker.list_offset("t", 0, -1) == status.high_watermark == 40
            # A timestamp of a deleted record: the first record still there that is as new.
            assert broker.list_offset("t", 0, T0) == start
            assert broker.list_offset("t", 0, T0 + 39) == 39
            with pytest.raises(OffsetOutOfRangeError):
                await broker.fetch([("t", 0, start - 1, ALL)])
            [r] = await broker.fetch([("t", 0, start, ALL)])
            assert r.log_start_offset == start
            assert (await broker.produce("t", 0, batch([b"y"]))).log_start_offset == start
            got = await read_all(broker, "t", 0, start)
            assert [x.offset for x in got] == list(range(start, 41))

    asyncio.run(main())
