"""The frame decoder a socket reads into (:class:`BufferedFrameDecoder`, what the clients'
``asyncio.BufferedProtocol`` feeds): the same frames and errors as :class:`FrameDecoder`
whatever the read sizes, large frames received in a buffer of their own (never written past,
never copied), and :meth:`receive_data` giving the same frames as reading in place."""

from __future__ import annotations

import struct
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.protocol._support import join
from tests.protocol.test_frames import Spec, as_tuple, feed, header, outcome, streams
from tidewire.errors import FrameTooLargeError, ProtocolError
from tidewire.protocol import Frame, FrameType, encode_frame, frames
from tidewire.protocol.frames import (
    HEAD_BYTES,
    LARGE_FRAME_BYTES,
    BufferedFrameDecoder,
    FramePool,
    data_window,
    frame_data_window,
)


def read_in_place(
    stream: bytes, sizes: list[int], decoder: BufferedFrameDecoder | None = None
) -> tuple[list[Frame], ProtocolError | None]:
    """Write ``stream`` into the decoder's buffers as a socket would (each read at most the
    next of ``sizes``, cycled, and at most what get_buffer offers), taking the frames after
    each read."""
    dec = decoder or BufferedFrameDecoder()
    out: list[Frame] = []
    at = i = 0
    try:
        while at < len(stream):
            view = dec.get_buffer(-1)
            assert len(view) > 0  # never an empty buffer
            n = min(len(view), sizes[i % len(sizes)], len(stream) - at)
            i += 1
            view[:n] = stream[at : at + n]
            view.release()
            dec.buffer_updated(n)
            at += n
            while (frame := dec.next_frame()) is not None:
                out.append(frame)
    except ProtocolError as exc:
        return out, exc
    return out, None


@settings(deadline=None, max_examples=100)
@given(streams, st.lists(st.integers(1, 64), min_size=1, max_size=8))
def test_same_frames_as_frame_decoder_whatever_the_read_sizes(
    frames: list[Spec], sizes: list[int]
) -> None:
    stream = b"".join(s.encode() for s in frames)
    expected = [s.expected() for s in frames]
    got, error = read_in_place(stream, sizes)
    assert error is None
    assert [as_tuple(f) for f in got] == expected
    assert feed([stream], BufferedFrameDecoder()) == (expected, None)


@settings(deadline=None, max_examples=50)
@given(streams, st.binary(min_size=1, max_size=40), st.integers(1, 50))
def test_trailing_garbage_gives_the_same_outcome_as_frame_decoder(
    frames: list[Spec], garbage: bytes, size: int
) -> None:
    stream = b"".join(s.encode() for s in frames) + garbage
    want_frames, want_error = feed([stream], None)
    got, error = read_in_place(stream, [size], BufferedFrameDecoder())
    assert [as_tuple(f) for f in got] == want_frames
    assert outcome(error) == outcome(want_error)


def _large_stream() -> tuple[bytes, list[tuple[FrameType, int, int, int, bytes, list[bytes]]]]:
    big = bytes(range(256)) * (LARGE_FRAME_BYTES // 256 * 3 + 7)
    frames: list[tuple[FrameType, int, int, int, bytes, list[bytes]]] = [
        (FrameType.RESPONSE, 3, 0, 1, b"body-1", [big]),
        (FrameType.RESPONSE, 4, 0, 2, b"", [b"small"]),
        (FrameType.PUSH, 5, 0, 3, b"b", [big[: LARGE_FRAME_BYTES - 18], big[:9]]),
        (FrameType.RESPONSE, 6, 0, 4, b"x", []),
        (FrameType.RESPONSE, 7, 0, 5, b"y", [big[: HEAD_BYTES - 100]]),  # small, yet big
    ]
    return b"".join(join(encode_frame(*f)) for f in frames), frames


@pytest.mark.parametrize("size", [7, 4096, 65_536, 1 << 20, 1 << 24])
def test_large_frames_are_read_into_a_buffer_of_their_own(size: int) -> None:
    stream, frames = _large_stream()
    dec = BufferedFrameDecoder()
    got, error = read_in_place(stream, [size], dec)
    assert error is None
    assert [
        (g.frame_type, g.api_key, g.api_version, g.correlation_id, bytes(g.body), bytes(g.data))
        for g in got
    ] == [(t, k, v, c, b, b"".join(d)) for t, k, v, c, b, d in frames]
    assert dec.buffered == 0
    for g in got:
        size_of_frame = 4 + struct.unpack(">i", bytes(g.body.obj[:4]))[0]
        if size_of_frame >= LARGE_FRAME_BYTES:
            # Its own buffer, of exactly its size: nothing of the next frame was read into it.
            assert type(g.data.obj) is bytearray
            assert len(g.data.obj) == size_of_frame
            buf, start = frame_data_window(g.data)
            assert buf is g.data.obj  # not a copy
            assert bytes(buf[start:]) == bytes(g.data)
        else:
            assert type(g.data.obj) is bytes  # copied out of the head, once
            assert frame_data_window(g.data) == data_window(g.data)


def test_a_large_frame_is_never_written_again_once_handed_out() -> None:
    stream, _ = _large_stream()
    stream = stream * 2
    dec = BufferedFrameDecoder()
    got: list[tuple[Frame, bytes]] = []
    at = 0
    while at < len(stream):
        view = dec.get_buffer(-1)
        n = min(len(view), 100_000, len(stream) - at)
        view[:n] = stream[at : at + n]
        view.release()
        dec.buffer_updated(n)
        at += n
        while (frame := dec.next_frame()) is not None:
            got.append((frame, bytes(frame.data)))
    assert len(got) == 10
    assert all(bytes(f.data) == copy for f, copy in got)


def _big_frame(corr: int, size: int, fill: int) -> bytes:
    return join(encode_frame(FrameType.REQUEST, 0, 0, corr, b"b", [bytes([fill]) * size]))


@pytest.mark.parametrize("pooled", [False, True])
def test_a_pooled_buffer_is_taken_again_only_once_nothing_refers_to_its_frame(
    pooled: bool,
) -> None:
    """With a pool, the next large frame reuses the buffer of one whose views are all gone
    (no fresh megabyte to fault in), and never one whose views are still alive."""
    pool = FramePool() if pooled else None
    dec = BufferedFrameDecoder(head_bytes=16 * 1024, pool=pool)
    got, error = read_in_place(_big_frame(1, 1_000_000, 1), [65_536], dec)
    assert error is None
    (first,) = got
    first_buf = first.data.obj
    first_id = id(first_buf)
    held = first.data  # a view still alive: its buffer must not be taken
    del got, first
    got, error = read_in_place(_big_frame(2, 1_000_100, 2), [65_536], dec)
    assert error is None
    (second,) = got
    assert second.data.obj is not first_buf
    assert bytes(held) == b"\x01" * 1_000_000  # untouched by the second frame
    assert bytes(second.data) == b"\x02" * 1_000_100
    second_id = id(second.data.obj)  # not the object: a reference would keep it in use
    del held, first_buf, second
    # Every view gone: a pool hands a buffer out again, at the new frame's exact size.
    assert pool is None or pool.reused == 0
    got, error = read_in_place(_big_frame(3, 999_000, 3), [65_536], dec)
    assert error is None
    (third,) = got
    if pool is not None:
        assert id(third.data.obj) in (first_id, second_id)  # both are free by now
        assert (pool.reused, pool.fresh) == (1, 2)
    assert len(third.data.obj) == 4 + struct.unpack(">i", bytes(third.body.obj[:4]))[0]
    assert bytes(third.data) == b"\x03" * 999_000
    buf, start = frame_data_window(third.data)
    assert buf is third.data.obj
    assert bytes(buf[start:]) == bytes(third.data)


def test_a_frame_pool_stays_within_its_bytes() -> None:
    pool = FramePool(max_bytes=4 * 1024 * 1024)
    held = [pool.take(900_000) for _ in range(8)]  # all in use: the pool stops at 4 MiB
    assert all(len(b) == 900_000 for b in held)
    assert len({id(b) for b in held}) == 8
    assert pool.pooled_bytes <= 4 * 1024 * 1024
    assert len(pool.take(2 * 1024 * 1024)) == 2 * 1024 * 1024  # over a quarter: not pooled
    assert pool.pooled_bytes <= 4 * 1024 * 1024
    del held
    again = pool.take(850_000)  # a free one of about that size
    assert len(again) == 850_000
    assert pool.reused == 1
    assert pool.pooled_bytes <= 4 * 1024 * 1024


def test_frames_below_the_pool_s_least_size_get_a_fresh_buffer() -> None:
    """A small large frame (16 KiB - 256 KiB) is never pooled: the pool stays a few buffers
    to look through, not hundreds."""
    pool = FramePool()
    held = [pool.take(20_000) for _ in range(100)]
    assert pool.pooled_bytes == 0
    assert pool.fresh == 100
    del held
    assert len(pool.take(20_000)) == 20_000
    assert pool.reused == 0
    big = pool.take(300_000)
    assert pool.pooled_bytes >= 300_000
    del big
    assert len(pool.take(290_000)) == 290_000
    assert pool.reused == 1


def test_the_pool_trusts_reference_counts_only_where_they_tell_a_view_apart() -> None:
    """CPython's do (the pool is on); a pool where they did not would never reuse."""
    assert frames.POOL_SAFE is (sys.implementation.name == "cpython")
    if frames.POOL_SAFE:
        assert FramePool().max_bytes == frames.FRAME_POOL_BYTES


def test_receive_data_of_many_frames_at_once_keeps_them_all() -> None:
    """Fed faster than taken (many frames in one receive_data), the head grows rather than
    refuse or lose bytes; every frame comes out after."""
    small = join(encode_frame(FrameType.RESPONSE, 1, 0, 9, b"", [b"v" * 1000]))
    stream, frames = _large_stream()
    dec = BufferedFrameDecoder()
    dec.receive_data(small * 600 + stream)
    got = []
    while (frame := dec.next_frame()) is not None:
        got.append(frame)
    assert len(got) == 600 + len(frames)
    assert all(bytes(g.data) == b"v" * 1000 for g in got[:600])
    assert bytes(got[600].data) == b"".join(frames[0][5])
    assert dec.buffered == 0


def test_a_frame_over_the_limit_is_refused_on_its_length_and_stays_failed() -> None:
    dec = BufferedFrameDecoder(max_frame_bytes=1024)
    view = dec.get_buffer(-1)
    view[:4] = struct.pack(">i", 2000)
    view.release()
    dec.buffer_updated(4)
    with pytest.raises(FrameTooLargeError, match="2,004 bytes exceeds max_frame_bytes=1,024"):
        dec.next_frame()
    with pytest.raises(FrameTooLargeError):
        dec.get_buffer(-1)
    with pytest.raises(FrameTooLargeError):
        dec.receive_data(b"x")


def test_an_impossible_header_is_refused_before_the_rest_arrives() -> None:
    dec = BufferedFrameDecoder()
    got, error = read_in_place(header(LARGE_FRAME_BYTES * 2, frame_type=9), [18], dec)
    assert got == []
    assert isinstance(error, ProtocolError)
    assert str(error) == "unknown frame type 9"
