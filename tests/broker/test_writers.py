"""Deterministic writers in the broker: a writer id maps to the same producer id on every call
and across restarts, each call fences the earlier instances with a higher epoch, a new
instance continues the sequences where the broker's state says the last one stopped, the
producer state is answered once in-flight appends end, and a released writer is forgotten and
refused.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from pathlib import Path

import pytest

from tests.broker._support import T0, config, read_all
from tidewire.broker import Broker
from tidewire.broker.producers import (
    MAX_WRITER_ID,
    PRODUCER_IDS_FILE,
    WRITER_PID_BASE,
    writer_producer_id,
)
from tidewire.errors import (
    InvalidRequestError,
    OutOfOrderSequenceError,
    ProducerFencedError,
    UnknownPartitionError,
)
from tidewire.records import BatchBuilder


def pbatch(pid: int, epoch: int, seq: int, values: Sequence[bytes]) -> bytes:
    b = BatchBuilder(producer_id=pid, producer_epoch=epoch, base_sequence=seq)
    for v in values:
        b.append(v, timestamp_ms=T0)
    return b.build()


async def values(broker: Broker, topic: str = "t", partition: int = 0) -> list[bytes | None]:
    return [r.value for r in await read_all(broker, topic, partition)]


def test_a_writer_id_maps_to_one_producer_id_with_rising_epochs(tmp_path: Path) -> None:
    async def main() -> None:
        async with Broker(config(tmp_path)) as b:
            first = await b.init_producer_id(writer_id="q/1/0")
            second = await b.init_producer_id(writer_id="q/1/0")
            other = await b.init_producer_id(writer_id="q/1/1")
            normal, _ = await b.init_producer_id()
        assert first == (writer_producer_id("q/1/0"), 0)
        assert second == (first[0], 1)
        assert other[0] != first[0]
        assert other[1] == 0
        assert first[0] >= WRITER_PID_BASE
        assert other[0] >= WRITER_PID_BASE
        assert normal < WRITER_PID_BASE
        async with Broker(config(tmp_path)) as b:  # the epoch is on disk
            assert await b.init_producer_id(writer_id="q/1/0") == (first[0], 2)
            normal2, _ = await b.init_producer_id()
        assert normal < normal2 < WRITER_PID_BASE  # writer ids do not move the id counter

    asyncio.run(main())


@pytest.mark.parametrize(
    ("writer_id", "pid", "epoch"),
    [("", -1, -1), ("x" * (MAX_WRITER_ID + 1), -1, -1), ("w", 5, 0), ("w", -1, 3)],
)
def test_bad_writer_requests_are_refused(
    tmp_path: Path, writer_id: str, pid: int, epoch: int
) -> None:
    async def main() -> None:
        async with Broker(config(tmp_path)) as b:
            if not writer_id:
                with pytest.raises(InvalidRequestError):
                    writer_producer_id(writer_id)
                return
            with pytest.raises(InvalidRequestError):
                await b.init_producer_id(pid, epoch, writer_id=writer_id)

    asyncio.run(main())


def test_a_new_instance_continues_the_sequences_and_fences_the_old(tmp_path: Path) -> None:
    async def main() -> None:
        async with Broker(config(tmp_path)) as b:
            b.create_topic("t", 2)
            pid, e0 = await b.init_producer_id(writer_id="job/0")
            await b.produce("t", 0, pbatch(pid, e0, 0, [b"a", b"b"]))
            await b.produce("t", 0, pbatch(pid, e0, 2, [b"c"]))
            # the task fails here; its next attempt asks what is stored
            _, e1 = await b.init_producer_id(writer_id="job/0")
            state = await b.producer_state(pid, e1, [("t", 0), ("t", 1)])
            assert state == [(e0, 2), (-1, -1)]
            with pytest.raises(OutOfOrderSequenceError):  # a new epoch may not restart at 0
                await b.produce("t", 0, pbatch(pid, e1, 0, [b"a"]))
            await b.produce("t", 0, pbatch(pid, e1, 3, [b"d", b"e"]))
            await b.produce("t", 1, pbatch(pid, e1, 0, [b"x"]))
            with pytest.raises(ProducerFencedError):  # the old attempt is fenced
                await b.produce("t", 0, pbatch(pid, e0, 5, [b"late"]))
            with pytest.raises(ProducerFencedError):
                await b.producer_state(pid, e0, [("t", 0)])
            assert await values(b) == [b"a", b"b", b"c", b"d", b"e"]
            assert await b.producer_state(pid, -1, [("t", 0)]) == [(e1, 4)]
            (err,) = await b.producer_state(pid, -1, [("t", 7)])
            assert isinstance(err, UnknownPartitionError)

    asyncio.run(main())


def test_normal_producers_still_restart_their_sequences_at_zero(tmp_path: Path) -> None:
    async def main() -> None:
        async with Broker(config(tmp_path)) as b:
            pid, e0 = await b.init_producer_id()
            await b.produce("t", 0, pbatch(pid, e0, 0, [b"a", b"b"]))
            _, e1 = await b.init_producer_id(pid, e0)
            with pytest.raises(OutOfOrderSequenceError):
                await b.produce("t", 0, pbatch(pid, e1, 2, [b"c"]))
            await b.produce("t", 0, pbatch(pid, e1, 0, [b"c"]))
            assert await values(b) == [b"a", b"b", b"c"]

    asyncio.run(main())


def test_the_state_waits_for_appends_in_flight(tmp_path: Path) -> None:
    async def main() -> None:
        async with Broker(config(tmp_path)) as b:
            b.create_topic("t", 1)
            pid, epoch = await b.init_producer_id(writer_id="w")
            append = asyncio.create_task(b.produce("t", 0, pbatch(pid, epoch, 0, [b"a"] * 50)))
            await asyncio.sleep(0)  # planned and recorded, its append not yet done
            assert not append.done()
            assert b._producers["t", 0].entries[pid].batches[-1].done is not None
            state = await b.producer_state(pid, -1, [("t", 0)])
            assert append.done()
            assert state == [(epoch, 49)]
            await append

    asyncio.run(main())


@pytest.mark.parametrize("stop", ["clean", "unclean"])
def test_the_state_survives_a_restart(tmp_path: Path, stop: str) -> None:
    async def first() -> tuple[int, int]:
        b = Broker(config(tmp_path))
        await b.start()
        pid, epoch = await b.init_producer_id(writer_id="q/3/1")
        await b.produce("t", 0, pbatch(pid, epoch, 0, [b"a", b"b", b"c"]))
        if stop == "clean":
            await b.close()
        else:  # every log abandoned: no snapshot, the state is rebuilt from the log
            for plog in b.logs.logs.values():
                await plog.wait_idle()
            b.logs.abandon()
        return pid, epoch

    async def second(pid: int, epoch: int) -> None:
        async with Broker(config(tmp_path)) as b:
            got, e1 = await b.init_producer_id(writer_id="q/3/1")
            assert (got, e1) == (pid, epoch + 1)
            assert await b.producer_state(pid, e1, [("t", 0)]) == [(epoch, 2)]
            await b.produce("t", 0, pbatch(pid, e1, 3, [b"d"]))
            assert await values(b) == [b"a", b"b", b"c", b"d"]

    asyncio.run(second(*asyncio.run(first())))


def test_released_writers_are_forgotten_and_refused(tmp_path: Path) -> None:
    async def main() -> None:
        async with Broker(config(tmp_path)) as b:
            b.create_topic("t", 2)
            pids = []
            for p in range(2):
                pid, epoch = await b.init_producer_id(writer_id=f"batch/9/{p}")
                await b.produce("t", p, pbatch(pid, epoch, 0, [b"v"]))
                pids.append(pid)
            keep, _ = await b.init_producer_id(writer_id="batch/10/0")
            ids_file = Path(b.logs.data_dir) / PRODUCER_IDS_FILE
            assert len(json.loads(ids_file.read_text())["writers"]) == 3
            assert await b.release_writers(["batch/9/0", "batch/9/1", "never/used"]) == 2
            assert await b.producer_state(pids[0], -1, [("t", 0), ("t", 1)]) == [(-1, -1)] * 2
            assert list(json.loads(ids_file.read_text())["writers"]) == [str(keep)]
            with pytest.raises(ProducerFencedError, match="released"):
                await b.init_producer_id(writer_id="batch/9/0")
            with pytest.raises(InvalidRequestError):
                await b.release_writers(["w"] * 10_001)

    asyncio.run(main())
