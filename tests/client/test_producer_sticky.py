"""The producer's compiled path for unkeyed messages (``records._speedups.append_sticky``)
against its Python path (``AsyncProducer._append`` and ``Accumulator.append``): the same
batches, bytes, sizes, memory accounting and futures, message by message. No broker: two
producers that never connect, each with an accumulator of its own."""

from __future__ import annotations

import concurrent.futures
import random

import pytest

from tidewire.client import AsyncProducer, RecordFuture
from tidewire.client._accumulator import Accumulator, ProducerBatch
from tidewire.client._producer import _Topic
from tidewire.records import _impl

pytestmark = pytest.mark.skipif(
    _impl.append_sticky is None, reason="the pure-Python codec has no compiled path"
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
    sticky = _impl.append_sticky
    assert sticky is not None
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
        want = py._append(py_acc, TOPIC, value, None, None, None, ns // 1_000_000)
        got: object = sticky(fast._topics, TOPIC, value, ns, fast_acc, RecordFuture)
        if got is None:
            got = fast._append(fast_acc, TOPIC, value, None, None, None, ns // 1_000_000)
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
    sticky = _impl.append_sticky
    assert sticky is not None
    p, acc = _producer(False)
    ns = 1_700_000_000_000_000_000
    assert sticky(p._topics, "unknown", b"v", ns, acc, RecordFuture) is None
    assert sticky(p._topics, TOPIC, b"v", ns, acc, RecordFuture) is None  # no sticky batch yet
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
