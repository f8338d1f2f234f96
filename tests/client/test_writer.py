"""Writers (``Producer(writer_id=...)``) against a real ``tidewire serve`` process: an attempt
that dies part-way is followed by one that sends every record again, and each record is
stored exactly once, in order within its partition -- also when the broker is SIGKILLed
between the attempts, and when the dead attempt's unflushed records were lost with it.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from tests.cli._support import serving
from tidewire.client import Client, Producer
from tidewire.errors import BatchTooLargeError, ProducerFencedError
from tidewire.protocol.messages import TopicConfig

pytestmark = pytest.mark.crash

N = 3_000
PARTITIONS = 3


def rows() -> list[tuple[bytes | None, int | None, bytes]]:
    """(key, partition, value): keyed, pinned to a partition, and unkeyed records."""
    out: list[tuple[bytes | None, int | None, bytes]] = []
    for i in range(N):
        value = b"v%05d" % i + b"." * (i % 200)
        if i % 3 == 0:
            out.append((b"k%d" % (i % 17), None, value))
        elif i % 3 == 1:
            out.append((None, i % PARTITIONS, value))
        else:
            out.append((None, None, value))
    return out


def attempt(addr: str, writer_id: str, upto: int, *, flush: bool) -> int:
    """One attempt of a task: send the first ``upto`` records; ``flush=False`` dies without
    waiting for what is still buffered. Returns the records it skipped."""
    p = Producer(addr, writer_id=writer_id, batch_bytes=4096, acks="durable")
    try:
        for key, partition, value in rows()[:upto]:
            p.send("t", value, key=key, partition=partition)
        skipped = p.skipped
    finally:
        p.close(flush=flush)
    return skipped


def stored(addr: str) -> dict[int, list[bytes]]:
    with Client(addr) as c:
        out: dict[int, list[bytes]] = {}
        for p in range(PARTITIONS):
            values: list[bytes] = []
            offset = 0
            while True:
                got = c.fetch("t", p, offset, max_wait_ms=0)
                if not got.records:
                    break
                values.extend(r.value or b"" for r in got.records)
                offset = got.next_offset
            out[p] = values
        return out


def check_exactly_once(addr: str) -> None:
    by_partition = stored(addr)
    every = [v for vs in by_partition.values() for v in vs]
    counts = Counter(every)
    assert [v for v, n in counts.items() if n > 1] == []
    assert set(every) == {value for _, _, value in rows()}
    order = {value: i for i, (_, _, value) in enumerate(rows())}
    for values in by_partition.values():
        assert [order[v] for v in values] == sorted(order[v] for v in values)


def test_a_retried_writer_stores_each_record_once(tmp_path: Path) -> None:
    with serving(tmp_path / "data", "--partitions", str(PARTITIONS)) as (_, port):
        addr = f"127.0.0.1:{port}"
        assert attempt(addr, "job-1/0", 1_000, flush=True) == 0
        attempt(addr, "job-1/0", 2_000, flush=False)  # dies with records still buffered
        skipped = attempt(addr, "job-1/0", N, flush=True)
        assert 1_000 <= skipped < N
        check_exactly_once(addr)
        assert attempt(addr, "job-1/0", N, flush=True) == N  # a third run stores nothing
        check_exactly_once(addr)


def test_a_broker_killed_between_attempts_loses_and_repeats_nothing(tmp_path: Path) -> None:
    data = tmp_path / "data"
    with serving(data, "--partitions", str(PARTITIONS), "--fsync", "always") as (_, port):
        attempt(f"127.0.0.1:{port}", "job-2/4", 1_700, flush=True)
    # serving() SIGKILLed it: no clean shutdown, no snapshot; the state comes from the log
    with serving(data, "--partitions", str(PARTITIONS), "--fsync", "always") as (_, port):
        addr = f"127.0.0.1:{port}"
        assert attempt(addr, "job-2/4", N, flush=True) == 1_700
        check_exactly_once(addr)


def test_a_released_writer_cannot_write_again(tmp_path: Path) -> None:
    with serving(tmp_path / "data", "--partitions", str(PARTITIONS)) as (_, port):
        addr = f"127.0.0.1:{port}"
        attempt(addr, "job-3/0", 100, flush=True)
        with Client(addr) as c:
            assert c.release_writers(["job-3/0"]) >= 1
        with pytest.raises(ProducerFencedError, match="released"):
            attempt(addr, "job-3/0", 100, flush=True)


def test_send_values_resumes_like_send(tmp_path: Path) -> None:
    values = [b"bulk-%05d" % i for i in range(5_000)]
    with serving(tmp_path / "data", "--partitions", str(PARTITIONS)) as (_, port):
        addr = f"127.0.0.1:{port}"
        with Producer(addr, writer_id="bulk/0", batch_bytes=2048) as p:
            p.send_values("t", values[:1_800])
        with Producer(addr, writer_id="bulk/0", batch_bytes=2048) as p:
            p.send_values("t", values[:700])  # all stored already: skipped
            p.send_values("t", values[700:])
            p.flush()
            assert p.failure is None
            assert p.skipped == 1_800
        by_partition = stored(addr)
        every = [v for vs in by_partition.values() for v in vs]
        assert sorted(every) == values  # each once
        for vs in by_partition.values():
            assert vs == sorted(vs)  # in order within a partition
        # the writer's rotation: 1,024 records to a partition, then the next
        # (5,000 records: 1,024 to each of 3 partitions, then 1,024 and 904 more)
        assert sorted(len(vs) for vs in by_partition.values()) == [1_024, 1_928, 2_048]
        with Producer(addr) as p:  # an ordinary producer: the sticky partition
            p.send_values("t", [b"x"] * 1_000)
            p.flush()
            assert p.failure is None
        assert sum(len(vs) for vs in stored(addr).values()) == 6_000


def test_send_values_refuses_a_value_larger_than_a_batch(tmp_path: Path) -> None:
    with serving(tmp_path / "data", "--partitions", str(PARTITIONS)) as (_, port):
        addr = f"127.0.0.1:{port}"
        with Client(addr) as c:
            c.create_topic("small", 1, TopicConfig(max_message_bytes=4096))
        with Producer(addr, writer_id="big/0") as p:
            p.send_values("small", [b"a" * 100, None, b"b" * 100])
            with pytest.raises(BatchTooLargeError):
                p.send_values("small", [b"c" * 100, b"x" * 5000])
            p.flush()
        with Client(addr) as c:
            values = [r.value for r in c.fetch("small", 0, 0).records]
        assert values == [b"a" * 100, None, b"b" * 100, b"c" * 100]
