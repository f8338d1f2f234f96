"""The idempotency keys' bounds, with a fake clock: at most ``max_keys``, each for ``ttl_s``;
a key whose request runs is never forgotten under it."""

from __future__ import annotations

import asyncio
from pathlib import Path

from tidewire.broker import Broker, BrokerConfig
from tidewire.server.http.idempotency import IdempotencyStore


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_keys_expire_by_age_and_by_count(tmp_path: Path) -> None:
    async def main() -> None:
        async with Broker(BrokerConfig(str(tmp_path / "d"))) as broker:
            clock = FakeClock()
            store = IdempotencyStore(broker, ttl_s=10, max_keys=3, clock=clock)

            async def use(key: str, partition: int = 0) -> bool:
                """Whether the key was known; marks it stored."""
                async with store.hold("t", key) as e:
                    known = bool(e.done)
                    e.done[partition] = 1
                    e.placement = [partition]
                    return known

            assert not await use("a")
            assert await use("a")
            clock.now += 5
            assert not await use("b")
            clock.now += 6  # "a" is 11 s old, "b" 6 s
            assert not await use("c")
            assert len(store) == 2  # "a" expired
            assert await use("b")
            assert not await use("d")
            assert not await use("e")  # a fourth key: the oldest ("b") goes
            assert len(store) == 3
            assert not await use("b")

            # A key held by a running request is not forgotten while it runs, however old.
            async with store.hold("t", "held") as e:
                e.done[0] = 7
                clock.now += 100
                for k in ("x", "y", "z"):
                    await use(k)
                assert len(store) == 4  # over max_keys while "held" runs
            assert not await use("z2")  # now the oldest go, "held" first
            assert len(store) == 3
            assert not await use("held")

    asyncio.run(main())
