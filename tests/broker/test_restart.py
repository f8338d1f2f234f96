"""Restarts: after a clean close and after an unclean stop (every log abandoned: files closed
without a flush, no clean-shutdown marker, as a crashed process leaves them), a broker
reopened on the same data directory answers every fetch, describe and list_offset exactly as
before, and appends continue at the old end.

The unclean stop ends its event loop without closing the broker, so the background task dies
with it (``asyncio.run`` cancels it) as it would with the process.
"""

from __future__ import annotations

import asyncio
import random
from pathlib import Path
from typing import Any

import pytest

from tests.broker._support import T0, batch, config, read_all, snapshot
from tidewire.broker import Broker, BrokerConfig, ProduceResult
from tidewire.records import Codec
from tidewire.storage import FsyncPolicy, LogConfig


def _config(tmp_path: Path, policy: FsyncPolicy) -> BrokerConfig:
    # An hour between interval flushes: under interval nothing is fsynced before the stop.
    log = LogConfig(
        segment_bytes=2048, index_interval_bytes=128, fsync=policy, flush_interval_ms=3_600_000
    )
    return config(tmp_path, default_partitions=3, log=log)


async def _fill(broker: Broker, rng: random.Random, requests: int) -> None:
    for _ in range(requests):
        topic = rng.choice(["a", "b"])
        p = rng.randrange(3)
        data = b""
        for _ in range(rng.randint(1, 3)):
            n = rng.randint(1, 4)
            data += batch(
                [rng.randbytes(rng.randint(0, 200)) for _ in range(n)],
                timestamps=[T0 + rng.randint(0, 1000) for _ in range(n)],
                codec=rng.choice([Codec.NONE, Codec.LZ4]),
            )
        await broker.produce(topic, p, data)


@pytest.mark.parametrize("policy", list(FsyncPolicy))
@pytest.mark.parametrize("stop", ["clean", "unclean"])
def test_data_survives_a_restart(tmp_path: Path, policy: FsyncPolicy, stop: str) -> None:
    rng = random.Random(f"{policy}-{stop}")
    cfg = _config(tmp_path, policy)

    async def before() -> dict[object, Any]:
        broker = Broker(cfg)
        await broker.start()
        broker.create_topic("empty", 2)
        await _fill(broker, rng, 80)
        assert broker.log("a", 0).segment_count > 1
        seen = await snapshot(broker)
        if stop == "clean":
            await broker.close()
        else:
            for plog in broker.logs.logs.values():
                await plog.wait_idle()  # no flush of ours still running in a thread
            broker.logs.abandon()
        return seen

    async def after(seen: dict[object, Any]) -> None:
        async with Broker(cfg) as broker:
            assert broker.logs.was_clean == (stop == "clean")
            assert await snapshot(broker) == seen
            # Appends go on at the old end, and reads see old and new alike.
            end = broker.list_offset("a", 1, -1)
            res = await broker.produce("a", 1, batch([b"after"]))
            assert res == ProduceResult(end, end, 0)
            got = await read_all(broker, "a", 1)
            assert [r.offset for r in got] == list(range(end + 1))
            assert got[-1].value == b"after"

    seen = asyncio.run(before())
    asyncio.run(after(seen))


def test_restart_twice_with_appends_in_between(tmp_path: Path) -> None:
    rng = random.Random(5)
    cfg = _config(tmp_path, FsyncPolicy.INTERVAL)

    async def run(unclean: bool) -> dict[object, Any]:
        broker = Broker(cfg)
        await broker.start()
        await _fill(broker, rng, 20)
        seen = await snapshot(broker)
        if unclean:
            for plog in broker.logs.logs.values():
                await plog.wait_idle()
            broker.logs.abandon()
        else:
            await broker.close()
        return seen

    async def look() -> dict[object, Any]:
        async with Broker(cfg) as broker:
            return await snapshot(broker)

    for unclean in (True, False, True):
        seen = asyncio.run(run(unclean))
        assert asyncio.run(look()) == seen
