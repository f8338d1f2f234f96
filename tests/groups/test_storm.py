"""A rebalance storm on an in-process broker: members join and leave 200+ times on 12
partitions while the others rejoin, commit and try stale commits. No partition is owned
twice in a generation, every stale commit is refused, and the group ends with a correct
assignment."""

from __future__ import annotations

import asyncio
import random
from pathlib import Path

import pytest

from tests.broker._support import config
from tidewire.broker import Broker
from tidewire.broker.groups import JoinResult
from tidewire.errors import IllegalGenerationError, RebalanceInProgressError, UnknownMemberError

PARTITIONS = 12
ALL = [("t", p) for p in range(PARTITIONS)]
STEADY = 3
CHURNERS = 5
ROUNDS = 42  # per churner: 5 x 42 = 210 joins and 210 leaves


class Storm:
    def __init__(self, broker: Broker) -> None:
        self.b = broker
        self.owned: dict[int, dict[str, list[tuple[str, int]]]] = {}  # gen -> member -> tps
        self.stale_refused = 0
        self.joins = self.leaves = 0
        self.problems: list[str] = []

    async def join(self, member_id: str = "") -> JoinResult:
        while True:
            try:
                r = await self.b.groups.coordinator.join(
                    "g", member_id=member_id, topics=["t"], session_timeout_ms=30_000,
                    rebalance_timeout_ms=30_000,
                )  # fmt: skip
                break
            except RebalanceInProgressError:
                continue
        self.joins += 1
        gen = self.owned.setdefault(r.generation, {})
        for m, tps in gen.items():
            if m != r.member_id and set(tps) & set(r.assignment):
                self.problems.append(f"generation {r.generation}: {m} and {r.member_id} share")
        gen[r.member_id] = r.assignment
        # a member commits what it owns in its generation ...
        if r.assignment:
            await self.b.groups.commit(
                "g", dict.fromkeys(r.assignment, (r.generation, "")),
                member_id=r.member_id, generation=r.generation,
            )  # fmt: skip
        # ... and a commit from the generation before is refused
        if r.generation > 1:
            try:
                await self.b.groups.commit(
                    "g", {ALL[0]: (0, "stale")}, member_id=r.member_id, generation=r.generation - 1
                )
            except IllegalGenerationError:
                self.stale_refused += 1
            else:
                self.problems.append(f"stale commit of generation {r.generation - 1} accepted")
        return r

    async def dwell(self, r: JoinResult, turns: int) -> JoinResult:
        """Heartbeat for ``turns`` loop turns, rejoining whenever told to."""
        for _ in range(turns):
            await asyncio.sleep(0)
            try:
                self.b.groups.coordinator.heartbeat("g", r.member_id, r.generation)
            except (RebalanceInProgressError, IllegalGenerationError):
                r = await self.join(r.member_id)
        return r

    async def churner(self, rng: random.Random) -> None:
        for _ in range(ROUNDS):
            r = await self.join()
            r = await self.dwell(r, rng.randint(0, 20))
            self.b.groups.coordinator.leave("g", r.member_id)
            self.leaves += 1

    async def steady(self, done: asyncio.Event) -> JoinResult:
        r = await self.join()
        while not done.is_set():
            r = await self.dwell(r, 1)
        return r


@pytest.mark.parametrize("strategy_seed", [1])
def test_rebalance_storm(tmp_path: Path, strategy_seed: int) -> None:
    async def main() -> None:
        async with Broker(config(tmp_path, default_partitions=PARTITIONS)) as b:
            b.create_topic("t")
            storm = Storm(b)
            rng = random.Random(strategy_seed)
            done = asyncio.Event()
            steady = [asyncio.create_task(storm.steady(done)) for _ in range(STEADY)]
            await asyncio.gather(
                *(storm.churner(random.Random(rng.random())) for _ in range(CHURNERS))
            )
            done.set()
            finals = await asyncio.gather(*steady)
            # the steady members settle on one generation that covers every partition
            while len({r.generation for r in finals}) > 1:
                finals = [await storm.dwell(r, 1) for r in finals]
            final_gen = finals[0].generation
            owned = [tp for r in finals for tp in r.assignment]
            assert sorted(owned) == ALL
            assert sorted(len(r.assignment) for r in finals) == [4, 4, 4]
            assert storm.owned[final_gen] == {r.member_id: r.assignment for r in finals}
            assert storm.problems == []
            assert storm.joins >= 200
            assert storm.leaves >= 200
            assert storm.stale_refused >= 200
            committed = b.groups.committed("g")
            assert {tp: c.offset for tp, c in committed.items()} == dict.fromkeys(ALL, final_gen)
            for r in finals:
                b.groups.coordinator.leave("g", r.member_id)
            with pytest.raises(UnknownMemberError):
                b.groups.coordinator.heartbeat("g", finals[0].member_id, final_gen)

    asyncio.run(asyncio.wait_for(main(), 120))
