"""The sans-IO stream decoder and :func:`iter_batches`: the same batches whatever the
chunking, and only record-batch errors out of garbage."""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.records._batches import BatchSpec, RecordSpec, batch_specs, build, patch_header
from tidewire.errors import BatchLengthError, CorruptBatchError, RecordBatchError
from tidewire.records import BatchDecoder, check_batch, iter_batches, parse_header

streams = st.lists(batch_specs(min_records=0, max_records=4), min_size=1, max_size=4).map(
    lambda specs: [build(s) for s in specs]
)


def small_batch(n: int = 3) -> bytes:
    return build(
        BatchSpec(records=tuple(RecordSpec(i, b"k", b"value %d" % i, ()) for i in range(n)))
    )


def feed(
    chunks: Iterable[bytes], decoder: BatchDecoder
) -> tuple[list[bytes], RecordBatchError | None]:
    """Feed ``chunks`` one at a time, taking every batch as soon as it is complete.

    Returns the batches and the record-batch error that stopped the stream, if any; any other
    exception propagates (and fails the test).
    """
    out: list[bytes] = []
    try:
        for chunk in chunks:
            decoder.receive_data(chunk)
            while (batch := decoder.next_batch()) is not None:
                out.append(batch)
    except RecordBatchError as exc:
        return out, exc
    return out, None


def split_at(data: bytes, cuts: Sequence[int]) -> list[bytes]:
    bounds = [0, *sorted(cuts), len(data)]
    return [data[a:b] for a, b in itertools.pairwise(bounds)]


def byte_by_byte(data: bytes) -> list[bytes]:
    return [data[i : i + 1] for i in range(len(data))]


@settings(deadline=None, max_examples=60)
@given(streams, st.data())
def test_same_batches_whole_byte_by_byte_and_at_random_splits(
    batches: list[bytes], data: st.DataObject
) -> None:
    stream = b"".join(batches)
    cuts = data.draw(st.lists(st.integers(0, len(stream)), max_size=12), label="cuts")
    for chunks in ([stream], byte_by_byte(stream), split_at(stream, cuts)):
        d = BatchDecoder()
        assert feed(chunks, d) == (batches, None)
        assert d.buffered == 0
        assert d.next_batch() is None


def test_empty_chunks_and_a_partial_batch_wait_for_more() -> None:
    batch = small_batch()
    d = BatchDecoder()
    d.receive_data(b"")
    assert d.next_batch() is None
    for cut in (1, 11, 12, 60, 61, len(batch) - 1):
        d = BatchDecoder()
        d.receive_data(batch[:cut])
        assert d.next_batch() is None
        assert d.buffered == cut
        d.receive_data(batch[cut:])
        assert d.next_batch() == batch
        assert d.buffered == 0


def _flip_last_byte(batches: list[bytes]) -> bytes:
    b = batches[0]
    return b[:-1] + bytes([b[-1] ^ 1])


garbage = st.one_of(
    st.binary(min_size=1, max_size=120),  # noise
    streams.map(lambda bs: bs[0][: len(bs[0]) // 2]),  # a batch cut short: waits for more
    streams.map(_flip_last_byte),  # a damaged batch: CRC, count or length error
    st.integers(-(2**31), 48).map(lambda n: bytes(8) + n.to_bytes(4, "big", signed=True)),
)


@settings(deadline=None, max_examples=80)
@given(streams, garbage, st.data())
def test_trailing_garbage_yields_the_valid_batches_then_waits_or_fails_cleanly(
    batches: list[bytes], junk: bytes, data: st.DataObject
) -> None:
    stream = b"".join(batches) + junk
    cuts = data.draw(st.lists(st.integers(0, len(stream)), max_size=8), label="cuts")
    verdicts: set[type[RecordBatchError] | None] = set()
    for chunks in ([stream], byte_by_byte(stream), split_at(stream, cuts)):
        d = BatchDecoder()
        out, error = feed(chunks, d)
        assert out[: len(batches)] == batches
        for extra in out[len(batches) :]:  # only if the junk happens to be a valid batch
            check_batch(extra)
        if error is None:
            assert d.next_batch() is None
            verdicts.add(None)
        else:
            # the decoder stays failed: the same error again, from both entry points
            with pytest.raises(RecordBatchError) as again:
                d.next_batch()
            assert again.value is error
            with pytest.raises(RecordBatchError) as again:
                d.receive_data(b"more")
            assert again.value is error
            verdicts.add(type(error))
    # whole, byte by byte or split, the junk gets the same verdict
    assert len(verdicts) == 1


def test_a_flipped_bit_fails_with_corrupt_batch() -> None:
    batch = small_batch()
    bad = batch[:-1] + bytes([batch[-1] ^ 0x10])
    d = BatchDecoder()
    d.receive_data(batch + bad)
    assert d.next_batch() == batch
    with pytest.raises(CorruptBatchError):
        d.next_batch()


@pytest.mark.parametrize("length", [-(2**31), -1, 0, 48, 2**31 - 1])
def test_impossible_length_is_refused_after_12_bytes(length: int) -> None:
    d = BatchDecoder(max_batch_bytes=1024)
    d.receive_data(bytes(8) + length.to_bytes(4, "big", signed=True))
    with pytest.raises(BatchLengthError):
        d.next_batch()


def test_batch_above_max_batch_bytes_is_refused_before_it_is_buffered() -> None:
    batch = small_batch(20)
    d = BatchDecoder(max_batch_bytes=len(batch) - 1)
    d.receive_data(batch[:12])
    with pytest.raises(BatchLengthError, match=f"{len(batch) - 1:,}"):
        d.next_batch()
    assert feed([batch], BatchDecoder(max_batch_bytes=len(batch))) == ([batch], None)


# --- iter_batches -------------------------------------------------------------------------------


@settings(deadline=None)
@given(streams, st.booleans(), st.integers(0, 80))
def test_iter_batches_yields_each_position_and_header(
    batches: list[bytes], verify: bool, partial: int
) -> None:
    positions = [0, *itertools.accumulate(len(b) for b in batches)][:-1]
    expected = [(pos, parse_header(b)) for pos, b in zip(positions, batches, strict=True)]
    stream = b"".join(batches)
    assert list(iter_batches(stream, verify=verify)) == expected
    assert list(iter_batches(memoryview(stream), verify=verify)) == expected
    # a partial batch at the end is not yielded
    tail = batches[0][: min(partial, len(batches[0]) - 1)]
    assert list(iter_batches(stream + tail, verify=verify)) == expected


def test_iter_batches_checks_the_crc_only_when_asked() -> None:
    good = small_batch()
    bad = good[:-1] + bytes([good[-1] ^ 1])
    with pytest.raises(CorruptBatchError):
        list(iter_batches(good + bad))
    assert [pos for pos, _ in iter_batches(good + bad, verify=False)] == [0, len(good)]


def test_iter_batches_raises_on_a_malformed_header_before_the_end() -> None:
    good = small_batch()
    with pytest.raises(RecordBatchError):
        list(iter_batches(good + patch_header(good, magic=1)))
