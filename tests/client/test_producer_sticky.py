"""The producer's compiled paths: messages without headers (``records._speedups.append_routed``,
unkeyed and keyed) against the Python path (``AsyncProducer._append`` and
``Accumulator.append``): the same batches, bytes, sizes, memory accounting and futures, message
by message; and answered
batches' buffers reused by new batches (``recycle_buffer``) only when nothing else holds
them. No broker: producers that never connect, each with an accumulator of its own."""

from __future__ import annotations

import asyncio
import concurrent.futures
import random
import sys

import pytest

from tidewire.client import AsyncProducer, RecordFuture
from tidewire.client._accumulator import Accumulator, ProducerBatch
from tidewire.client._producer import _Topic
from tidewire.errors import ProducerFencedError
from tidewire.records import Codec, _impl, builder
from tidewire.records.batch import BATCH_OVERHEAD

pytestmark = pytest.mark.skipif(
    _impl.append_routed is None or _impl.recycle_buffer is None,
    reason="the pure-Python codec has no compiled paths",
)

TOPIC = "t"
#: Small batches and buffer, so that batches fill, roll over and the buffer runs out.
BATCH_BYTES = 700
BUFFER_BYTES = 6_000
LIMIT = 1_000


def _producer(threadsafe: bool) -> tuple[AsyncProducer, Accumulator]:
    p = AsyncProducer("127.0.0.1:1")  # never connects: nothing here sends
    acc = Accumulator(
        batch_bytes=BATCH_BYTES,
        buffer_bytes=BUFFER_BYTES,
        linger_s=1.0,
        new_future=concurrent.futures.Future,
        wake=lambda: None,
        on_release=lambda: None,
        threadsafe=threadsafe,
    )
    p._acc = acc
    states = [acc.partition(TOPIC, i) for i in range(3)]
    p._topics[TOPIC] = _Topic(states, LIMIT, 1)
    return p, acc


def _batches(acc: Accumulator) -> list[tuple[int, int, bytes, int, int, int, int]]:
    out = []
    for state in acc.partitions.values():
        for b in state.queue:
            assert isinstance(b.buf, bytearray)
            out.append((state.partition, b.no, bytes(b.buf), b.size, b.count, b.first_ts, b.max_ts))
    return out


def _future(got: object) -> tuple[int, int, int, int] | object:
    if isinstance(got, tuple):
        batch, index, ts = got
        assert isinstance(batch, ProducerBatch)
        return batch.state.partition, batch.no, index, ts
    return got  # the bytes a full buffer waits for, or what the Python path answered


@pytest.mark.parametrize("threadsafe", [False, True])
def test_the_compiled_path_appends_what_the_python_path_appends(threadsafe: bool) -> None:
    routed = _impl.append_routed
    assert routed is not None
    rng = random.Random(7)
    py, py_acc = _producer(threadsafe)
    fast, fast_acc = _producer(threadsafe)
    ns = 1_700_000_000_123_456_789
    compiled = 0
    for i in range(400):
        ns += rng.choice([0, 10_000, 1_500_000, -3_000_000])  # the clock may step back
        n = rng.choice([0, 1, 5, 63, 64, 200, 500, 2_000])
        value: bytes | None = None if n == 2_000 else rng.randbytes(n)
        if i % 50 == 7:
            value = bytearray(b"not bytes")  # type: ignore[assignment]  # the Python path converts it
        key = rng.choice([None, None, b"", b"k1", b"key-2", b"k" * 200])
        if i % 50 == 9:
            key = bytearray(b"k1")  # type: ignore[assignment]  # the Python path converts it
        want = py._append(py_acc, TOPIC, value, key, None, None, ns // 1_000_000)
        got: object = routed(fast._topics, TOPIC, key, value, ns, fast_acc, RecordFuture)
        if got is None:
            got = fast._append(fast_acc, TOPIC, value, key, None, None, ns // 1_000_000)
        else:
            assert type(got) is RecordFuture
            compiled += 1
        assert _future(got) == _future(want), i
        ta, tb = fast._topics[TOPIC], py._topics[TOPIC]
        assert ta.sticky == tb.sticky, i
        assert (ta.sticky_batch and ta.sticky_batch.no) == (tb.sticky_batch and tb.sticky_batch.no)
        assert fast_acc.used == py_acc.used, i
        assert _batches(fast_acc) == _batches(py_acc), i
        if isinstance(want, int) and i % 3 == 0:
            # The buffer is full: free it as the broker's answers would, both alike.
            for acc in (py_acc, fast_acc):
                for state in list(acc.queued):
                    while state.queue:
                        done = acc._pop(state)
                        acc.finish(done, in_flight=False, stored=True)
                    del acc.queued[state]
    assert compiled > 200  # most messages took the compiled path
    assert compiled < 400  # and the Python path had its part: rolls, full buffer, conversions


def test_the_compiled_path_leaves_everything_else_to_the_python_path() -> None:
    routed = _impl.append_routed
    assert routed is not None
    p, acc = _producer(False)
    ns = 1_700_000_000_000_000_000

    def sticky(*args: object) -> object:
        topics, topic, value, when, accumulator, cls = args
        return routed(topics, topic, None, value, when, accumulator, cls)

    assert sticky(p._topics, "unknown", b"v", ns, acc, RecordFuture) is None
    assert sticky(p._topics, TOPIC, b"v", ns, acc, RecordFuture) is None  # no sticky batch yet
    assert routed(p._topics, TOPIC, b"k1", b"v", ns, acc, RecordFuture) is None  # nor keyed one
    assert routed(p._topics, TOPIC, bytearray(b"k1"), b"v", ns, acc, RecordFuture) is None
    assert isinstance(p._append(acc, TOPIC, b"v", None, None, None, ns // 1_000_000), tuple)
    fut = sticky(p._topics, TOPIC, b"w", ns, acc, RecordFuture)
    assert isinstance(fut, RecordFuture)
    assert fut[1:] == (1, ns // 1_000_000)
    assert sticky(p._topics, TOPIC, bytearray(b"v"), ns, acc, RecordFuture) is None
    assert sticky(p._topics, TOPIC, b"x" * LIMIT, ns, acc, RecordFuture) is None  # too large
    assert sticky(p._topics, TOPIC, b"v", -1, acc, RecordFuture) is None
    before = _batches(acc), acc.used
    fut[0].state.open = None  # the batch was closed (sent, or a flush)
    assert sticky(p._topics, TOPIC, b"v", ns, acc, RecordFuture) is None
    assert (_batches(acc), acc.used) == before


# --- recycled batch buffers -----------------------------------------------------------------------


class _Sealed:
    """What ``recycle_buffer`` reads of a batch: its sealed bytes."""

    def __init__(self, data: bytes | bytearray) -> None:
        self.data = data


def _sealed(size: int = 100_000) -> _Sealed:
    return _Sealed(bytearray(b"\xff" * size))


def test_a_finished_batchs_buffer_is_kept_whole_only_when_nothing_else_holds_it() -> None:
    recycle = _impl.recycle_buffer
    assert recycle is not None
    pool: list[bytearray] = []
    batch = _sealed()
    allocated = sys.getsizeof(batch.data)
    assert recycle(pool, batch, 2)
    assert batch.data == b""  # still counts as sent
    assert len(pool) == 1
    assert pool[0] == bytes(BATCH_OVERHEAD)
    assert sys.getsizeof(pool[0]) == allocated  # its memory kept
    held = _sealed()
    other = held.data  # a transport still writing it, say
    assert not recycle(pool, held, 2)
    assert held.data is other
    assert len(other) == 100_000
    exported = _sealed()
    with memoryview(exported.data):
        assert not recycle(pool, exported, 2)
    assert len(exported.data) == 100_000
    assert not recycle(pool, _Sealed(b"compressed: bytes"), 2)
    assert recycle(pool, _sealed(), 2)
    assert not recycle(pool, _sealed(), 2)  # the pool is full
    assert len(pool) == 2


def test_records_appended_to_a_recycled_buffer_keep_its_memory() -> None:
    recycle = _impl.recycle_buffer
    assert recycle is not None
    pool: list[bytearray] = []
    assert recycle(pool, _sealed(), 1)
    buf = pool.pop()
    allocated = sys.getsizeof(buf)
    want = bytearray(BATCH_OVERHEAD)
    for i in range(3):
        builder.append_record(want, b"v" * 50, None, b"\x00", i, i)
        _impl.append_record(buf, b"v" * 50, None, b"\x00", i, i)
        # Not shrunk to the exact size first (bytearray's own resize does that below half).
        assert sys.getsizeof(buf) == allocated
    assert buf == want


def test_a_new_batch_takes_an_answered_batchs_buffer_and_builds_the_same_bytes() -> None:
    p, acc = _producer(False)
    state = p._topics[TOPIC].partitions[0]
    got = acc.append(state, b"first", None, b"\x00", 1_000, LIMIT)
    assert isinstance(got, tuple)
    first = got[0]
    acc.seal_open()
    data = first.build(Codec.NONE, -1, -1)
    assert acc._pop(state) is first
    acc.finish(first, in_flight=False, stored=True)
    del data
    got = acc.append(state, b"second", b"k", b"\x00", 2_000, LIMIT)
    assert isinstance(got, tuple)
    second = got[0]
    assert first.data == b""  # its buffer went to the second batch
    fresh, fresh_acc = _producer(False)
    want = fresh_acc.append(
        fresh._topics[TOPIC].partitions[0], b"second", b"k", b"\x00", 2_000, LIMIT
    )
    assert isinstance(want, tuple)
    assert second.build(Codec.NONE, -1, -1) == want[0].build(Codec.NONE, -1, -1)


def test_a_failed_producer_refuses_sends_its_open_batch_would_take() -> None:
    async def main() -> None:
        p, _ = _producer(False)
        first = await p.send(TOPIC, b"first")  # opens the sticky batch (the Python path)
        second = await p.send(TOPIC, b"second")  # the compiled path, into the same batch
        assert second[0] is first[0]
        assert first[0].state.open is first[0]  # still open: the compiled path would take more
        p._fail_fatally(ProducerFencedError("fenced"))
        with pytest.raises(ProducerFencedError, match="failed earlier"):
            await p.send(TOPIC, b"third")
        assert first[0].count == 2

    asyncio.run(main())
