"""The crash test: a real ``tidewire serve`` process with ``fsync=always`` under load from
idempotent producers is killed with SIGKILL again and again (``TIDEWIRE_CRASH_KILLS``, 20 by
default) and restarted on the same port while the producers keep going. A producer resends
whatever was not acknowledged, the same bytes with the same sequences, until it is. At the end
a clean broker reads every partition back and the history checker finds no acknowledged
message lost, none stored twice, no hole in the offsets, every acknowledgement at the offset
it named, and each producer's order kept.

Each producer writes to every partition through one lane per partition, with a few batches in
flight on its connection (pipelined); the broker's answer for a batch it stored before the
kill is the original offsets, which is what lets the checker hold the acknowledgements to
their offsets.
"""

from __future__ import annotations

import asyncio
import os
import random
import signal
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.server._broker_process import broker_process
from tests.server._history import Ack, check_history
from tidewire.client import AsyncClient
from tidewire.errors import TidewireError
from tidewire.protocol.messages import InitProducerIdRequest
from tidewire.records import BatchBuilder

pytestmark = pytest.mark.crash

KILLS = int(os.environ.get("TIDEWIRE_CRASH_KILLS", "20"))
PRODUCERS = 3
PARTITIONS = 3
#: Batches of one lane (producer, partition) in flight at once.
WINDOW = 3
TOPIC = "crash"
#: The whole test's bound: kills, restarts and the producers' catching up.
DEADLINE_S = 300.0


@dataclass
class _Lane:
    """What one producer sent to one partition, in order."""

    partition: int
    sent: list[tuple[tuple[bytes, ...], bytes]] = field(default_factory=list)  # values, batch
    acked: int = 0  # batches acknowledged, from the start of ``sent``


@dataclass
class _Stats:
    acks: list[Ack] = field(default_factory=list)
    resends: int = 0
    errors: list[str] = field(default_factory=list)


async def _init_producer(client: AsyncClient, deadline: float) -> tuple[int, int]:
    while True:
        try:
            resp = await client._call(InitProducerIdRequest())
        except TidewireError as exc:
            if not exc.retriable or time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.05)
            continue
        assert resp.body.error_code == 0, resp.body.error_message
        return int(resp.body.producer_id), int(resp.body.producer_epoch)


async def _run_lane(
    client: AsyncClient,
    lane: _Lane,
    make_batch: Iterator[tuple[tuple[bytes, ...], bytes]],
    *,
    stop: asyncio.Event,
    stats: _Stats,
    deadline: float,
) -> None:
    """Send batches, at most ``WINDOW`` unacknowledged at once; after a failure resend
    everything unacknowledged, in order, until the broker has acknowledged it all."""
    while time.monotonic() < deadline:
        while not stop.is_set() and len(lane.sent) - lane.acked < WINDOW:
            lane.sent.append(next(make_batch))
        window = lane.sent[lane.acked : lane.acked + WINDOW]
        if not window:
            return
        results = await asyncio.gather(
            *(client.produce_batch(TOPIC, lane.partition, data) for _, data in window),
            return_exceptions=True,
        )
        for i, ((values, _), result) in enumerate(zip(window, results, strict=True)):
            if isinstance(result, BaseException):
                if not isinstance(result, TidewireError) or not result.retriable:
                    stats.errors.append(f"partition {lane.partition}: {result!r}")
                    return
                stats.resends += len(window) - i
                await asyncio.sleep(0.02)
                break
            stats.acks.append(Ack(lane.partition, result, values))
            lane.acked += 1
    stats.errors.append(f"partition {lane.partition}: not done by the deadline")


def _batches(
    name: str, pid: int, epoch: int, rng: random.Random
) -> Iterator[tuple[tuple[bytes, ...], bytes]]:
    seq = n = 0
    while True:
        values = tuple(f"{name}-{n + i}".encode() for i in range(rng.randint(1, 6)))
        b = BatchBuilder(producer_id=pid, producer_epoch=epoch, base_sequence=seq)
        for v in values:
            b.append(v, timestamp_ms=int(time.time() * 1000))
        yield values, b.build()
        seq += len(values)
        n += len(values)


def test_sigkill_under_idempotent_load_loses_and_duplicates_nothing(tmp_path: Path) -> None:
    rng = random.Random(int(os.environ.get("TIDEWIRE_CRASH_SEED", "7")))
    stats = _Stats()
    lanes: list[_Lane] = []

    with broker_process(tmp_path, "--partitions", str(PARTITIONS)) as server:
        server.start()
        addr = f"127.0.0.1:{server.port}"

        async def load_and_kill() -> None:
            deadline = time.monotonic() + DEADLINE_S
            stop = asyncio.Event()
            clients = [AsyncClient(addr, request_timeout_s=10) for _ in range(PRODUCERS)]
            tasks = []
            for i, client in enumerate(clients):
                pid, epoch = await _init_producer(client, deadline)
                for p in range(PARTITIONS):
                    lane = _Lane(p)
                    lanes.append(lane)
                    gen = _batches(f"p{i}.{p}", pid, epoch, random.Random(rng.random()))
                    tasks.append(
                        asyncio.create_task(
                            _run_lane(client, lane, gen, stop=stop, stats=stats, deadline=deadline)
                        )
                    )
            for _ in range(KILLS):
                await asyncio.sleep(rng.uniform(0.1, 0.5))
                code = await asyncio.to_thread(server.stop, signal.SIGKILL)
                assert code == -signal.SIGKILL
                await asyncio.to_thread(server.start)
            await asyncio.sleep(0.3)
            stop.set()
            await asyncio.gather(*tasks)
            for client in clients:
                await client.close()

        asyncio.run(load_and_kill())
        assert stats.errors == []
        # A clean stop, a clean start: read everything back.
        assert server.stop(signal.SIGTERM) == 0
        server.start()

        async def read_back() -> dict[int, list[tuple[int, bytes | None]]]:
            read: dict[int, list[tuple[int, bytes | None]]] = {}
            async with AsyncClient(addr) as client:
                for p in range(PARTITIONS):
                    read[p], offset = [], 0
                    while True:
                        got = await client.fetch(TOPIC, p, offset)
                        read[p] += [(r.offset, r.value) for r in got.records]
                        if got.next_offset >= got.high_watermark:
                            break
                        offset = got.next_offset
            return read

        read = asyncio.run(read_back())

    sent = [v for lane in lanes for values, _ in lane.sent for v in values]
    orders = [[v for values, _ in lane.sent for v in values] for lane in lanes]
    problems = check_history(sent, stats.acks, read, orders)
    assert problems == [], problems[:20]
    # Everything sent was acknowledged in the end, and the kills hit requests in flight.
    assert sum(len(a.values) for a in stats.acks) == len(sent)
    assert sum(len(r) for r in read.values()) == len(sent)
    assert server.starts == KILLS + 2
    assert stats.resends > 0
    print(
        f"{KILLS} SIGKILLs, {len(sent):,} messages in {len(stats.acks):,} acknowledged batches, "
        f"{stats.resends:,} batches resent"
    )
