"""Random histories of sends, receives, reads, timer ticks and restarts, checked against
what must hold: the counters match the index, no message is taken twice and none is lost
but those a ring pushed out, reads by token miss and repeat nothing."""

from __future__ import annotations

import asyncio
import random
from pathlib import Path

from tests.broker.streams._support import FakeClock, streams_broker
from tidewire.broker.streams.model import FROM_START, SendItem


def test_the_counters_match_the_index(tmp_path: Path) -> None:
    async def main() -> None:
        rnd = random.Random(7)
        clock = FakeClock()
        async with streams_broker(tmp_path, clock, stream_partitions=2) as (_, st):
            for step in range(2_000):
                op = rnd.random()
                sid = f"s{rnd.randrange(8)}"
                if op < 0.5:
                    uuid = str(rnd.randrange(50)) if rnd.random() < 0.3 else ""
                    item = SendItem(
                        sid,
                        b"v" * rnd.randrange(1, 5),
                        uuid=uuid,
                        ttl_ms=rnd.choice([500, 1500, 4000, 0]),
                        persistent=rnd.random() < 0.5,
                    )
                    await st.send([item], ring_size=rnd.choice([0, 1, 3, None]))
                elif op < 0.8:
                    await st.receive([sid], max_messages=rnd.randrange(1, 4))
                else:
                    clock.advance(rnd.randrange(0, 1500))
                    st.tick()
                stats = st.stats()
                index = list(st._streams.values())
                mem = sum(len(s.mem or ()) for s in index)
                pers = sum(len(s.ents) // 2 if s.ents is not None else 0 for s in index)
                assert (step, stats.in_memory_messages) == (step, mem)
                assert (step, stats.persistent_messages) == (step, pers)
                assert stats.in_memory_bytes >= 0

    asyncio.run(main())


def test_work_queue_history_across_restarts(tmp_path: Path) -> None:
    async def main() -> None:
        rnd = random.Random(11)
        ids = [f"w{i}" for i in range(5)]
        got: list[bytes] = []
        sent: set[bytes] = set()
        n = dropped = 0
        for _ in range(5):
            async with streams_broker(tmp_path, stream_partitions=2) as (_, st):
                for _ in range(150):
                    if rnd.random() < 0.5:
                        items = []
                        for _ in range(rnd.randrange(1, 4)):
                            v = str(n).encode()
                            n += 1
                            items.append(SendItem(rnd.choice(ids), v, persistent=True))
                            sent.add(v)
                        await st.send(items, ring_size=rnd.choice([3, 50]))
                    else:
                        streams = rnd.sample(ids, rnd.randrange(1, 4))
                        msgs = await st.receive(streams, max_messages=rnd.randrange(1, 4))
                        got += [m.value for m in msgs]
                dropped += st.stats().dropped
        async with streams_broker(tmp_path, stream_partitions=2) as (_, st):
            while msgs := await st.receive(ids, max_messages=100):
                got += [m.value for m in msgs]
        assert len(got) == len(set(got))  # never twice
        assert len(sent - set(got)) <= dropped  # lost only what a ring pushed out

    asyncio.run(main())


def test_reads_by_token_across_restarts_miss_and_repeat_nothing(tmp_path: Path) -> None:
    async def main() -> None:
        rnd = random.Random(3)
        ids = [f"t{i}" for i in range(6)]
        sent: dict[str, list[bytes]] = {s: [] for s in ids}
        seen: dict[str, list[bytes]] = {s: [] for s in ids}
        tokens = dict.fromkeys(ids, FROM_START)
        n = 0
        for _ in range(3):
            async with streams_broker(tmp_path, stream_partitions=3) as (_, st):
                for _ in range(120):
                    if rnd.random() < 0.5:
                        items = []
                        for _ in range(rnd.randrange(1, 6)):
                            sid = rnd.choice(ids)
                            v = str(n).encode()
                            n += 1
                            items.append(SendItem(sid, v, persistent=True))
                            sent[sid].append(v)
                        await st.send(items, ring_size=rnd.choice([0, 2]))
                        continue
                    if rnd.random() < 0.3:  # takes do not change what reads see
                        await st.receive([rnd.choice(ids)], max_messages=3)
                    ask = dict(rnd.sample(sorted(tokens.items()), rnd.randrange(1, 7)))
                    msgs, nxt = await st.read(ask, max_messages=rnd.randrange(1, 5))
                    last: dict[str, str] = {}
                    for m in msgs:
                        seen[m.stream].append(m.value)
                        last[m.stream] = m.token
                    for sid, token in last.items():  # a message's token is the next one
                        assert token == nxt[sid]
                    tokens.update({sid: nxt[sid] for sid in ask})
        async with streams_broker(tmp_path, stream_partitions=3) as (_, st):
            while True:
                msgs, tokens = await st.read(tokens, max_messages=7)
                if not msgs:
                    break
                for m in msgs:
                    seen[m.stream].append(m.value)
        assert seen == sent

    asyncio.run(main())
