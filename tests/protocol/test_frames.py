"""The frame codec: :func:`encode_frame` and the incremental :class:`FrameDecoder`.

The same frames whatever the chunking (whole, byte by byte, random splits); only
``ProtocolError`` out of trailing garbage; every limit refused as soon as the bytes that break
it arrive, and the decoder failed for good afterwards."""

from __future__ import annotations

import itertools
import struct
from collections.abc import Iterable, Sequence
from typing import NamedTuple

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.protocol._support import join
from tidewire.errors import FrameTooLargeError, ProtocolError
from tidewire.protocol import Frame, FrameDecoder, FrameType, encode_frame
from tidewire.protocol.frames import (
    DEFAULT_MAX_FRAME_BYTES,
    FLAG_ERROR,
    FRAME_HEADER,
    LARGE_FRAME_BYTES,
    data_window,
)

HEADER = FRAME_HEADER.size  # 18: the length field and the 14 bytes it counts


class Spec(NamedTuple):
    """A frame as the tests think of it: what goes in, and what must come out."""

    frame_type: FrameType
    flags: int
    api_key: int
    api_version: int
    correlation_id: int
    body: bytes
    data: tuple[bytes, ...]

    def encode(self) -> bytes:
        return join(
            encode_frame(
                self.frame_type,
                self.api_key,
                self.api_version,
                self.correlation_id,
                self.body,
                self.data,
                flags=self.flags,
            )
        )

    def expected(self) -> tuple[object, ...]:
        return (*self[:5], self.body, b"".join(self.data))


int16 = st.integers(-(2**15), 2**15 - 1)
int32 = st.integers(-(2**31), 2**31 - 1)
specs = st.builds(
    Spec,
    frame_type=st.sampled_from(FrameType),
    flags=st.sampled_from([0, FLAG_ERROR]),
    api_key=int16,
    api_version=int16,
    correlation_id=int32,
    body=st.binary(max_size=48),
    data=st.lists(st.binary(max_size=32), max_size=3).map(tuple),
).map(
    # the error flag is valid on responses only
    lambda s: s if s.frame_type is FrameType.RESPONSE else s._replace(flags=0)
)
streams = st.lists(specs, min_size=1, max_size=6)


def as_tuple(frame: Frame) -> tuple[object, ...]:
    return (*frame[:5], bytes(frame.body), bytes(frame.data))


def reencode(frame: Frame) -> bytes:
    return join(
        encode_frame(
            frame.frame_type,
            frame.api_key,
            frame.api_version,
            frame.correlation_id,
            bytes(frame.body),
            [frame.data],
            flags=frame.flags,
        )
    )


def feed(
    chunks: Iterable[bytes], decoder: FrameDecoder | None = None
) -> tuple[list[tuple[object, ...]], ProtocolError | None]:
    """Feed ``chunks`` one at a time, taking each frame as soon as it is complete.

    Returns the frames and the ProtocolError that stopped the stream, if any; any other
    exception propagates and fails the test.
    """
    decoder = decoder or FrameDecoder()
    out: list[tuple[object, ...]] = []
    try:
        for chunk in chunks:
            decoder.receive_data(chunk)
            while (frame := decoder.next_frame()) is not None:
                out.append(as_tuple(frame))
    except ProtocolError as exc:
        return out, exc
    return out, None


def split_at(data: bytes, cuts: Sequence[int]) -> list[bytes]:
    bounds = [0, *sorted(cuts), len(data)]
    return [data[a:b] for a, b in itertools.pairwise(bounds)]


def byte_by_byte(data: bytes) -> list[bytes]:
    return [data[i : i + 1] for i in range(len(data))]


def header(
    length: int,
    *,
    frame_type: int = 0,
    flags: int = 0,
    api_key: int = 11,
    api_version: int = 0,
    correlation_id: int = 1,
    body_length: int = 0,
) -> bytes:
    return FRAME_HEADER.pack(
        length, frame_type, flags, api_key, api_version, correlation_id, body_length
    )


def outcome(error: ProtocolError | None) -> tuple[type[ProtocolError], str] | None:
    return None if error is None else (type(error), str(error))


# --- round trips --------------------------------------------------------------------------------


@settings(deadline=None, max_examples=150)
@given(specs)
def test_encode_decode_round_trip(spec: Spec) -> None:
    buffers = encode_frame(
        spec.frame_type,
        spec.api_key,
        spec.api_version,
        spec.correlation_id,
        spec.body,
        spec.data,
        flags=spec.flags,
    )
    # the data buffers travel as they are, for writelines/sendmsg: not copied, not joined
    assert len(buffers) == 1 + len(spec.data)
    assert all(a is b for a, b in zip(buffers[1:], spec.data, strict=True))
    assert len(buffers[0]) == HEADER + len(spec.body)

    decoder = FrameDecoder()
    decoder.receive_data(join(buffers))
    frame = decoder.next_frame()
    assert frame is not None
    assert as_tuple(frame) == spec.expected()
    assert type(frame.frame_type) is FrameType
    assert isinstance(frame.body, memoryview)
    assert isinstance(frame.data, memoryview)
    assert decoder.next_frame() is None
    assert decoder.buffered == 0


@settings(deadline=None, max_examples=100)
@given(streams, st.data())
def test_same_frames_whole_byte_by_byte_and_at_random_splits(
    frames: list[Spec], data: st.DataObject
) -> None:
    stream = b"".join(s.encode() for s in frames)
    expected = [s.expected() for s in frames]
    cuts = data.draw(st.lists(st.integers(0, len(stream)), max_size=12), label="cuts")

    assert feed([stream]) == (expected, None)
    assert feed(byte_by_byte(stream)) == (expected, None)
    assert feed(split_at(stream, cuts)) == (expected, None)


@settings(deadline=None, max_examples=50)
@given(streams, st.integers(1, 40))
def test_frames_stay_intact_while_more_data_arrives(frames: list[Spec], step: int) -> None:
    """Frames handed out earlier are not views into a buffer the decoder later compacts or
    refills, nor into the caller's buffer, which it may reuse for the next read."""
    stream = b"".join(s.encode() for s in frames)
    decoder = FrameDecoder()
    kept: list[Frame] = []
    for i in range(0, len(stream), step):
        chunk = bytearray(stream[i : i + step])
        decoder.receive_data(memoryview(chunk))
        chunk[:] = b"\xee" * len(chunk)  # the caller reuses its read buffer
        while (frame := decoder.next_frame()) is not None:
            kept.append(frame)
    assert decoder.buffered == 0
    assert [as_tuple(f) for f in kept] == [s.expected() for s in frames]


@settings(deadline=None, max_examples=100)
@given(streams, st.binary(min_size=1, max_size=HEADER - 1), st.data())
def test_short_trailing_garbage_yields_the_frames_then_none_or_protocol_error(
    frames: list[Spec], garbage: bytes, data: st.DataObject
) -> None:
    """Fewer than 18 bytes can never complete a frame: after the valid frames the decoder
    either waits for more or refuses the header it has, the same way however it was fed."""
    stream = b"".join(s.encode() for s in frames) + garbage
    expected = [s.expected() for s in frames]
    cuts = data.draw(st.lists(st.integers(0, len(stream)), max_size=8), label="cuts")

    results = [feed([stream]), feed(byte_by_byte(stream)), feed(split_at(stream, cuts))]
    for got, error in results:
        assert got == expected
        assert error is None or isinstance(error, ProtocolError)
    assert len({outcome(error) for _, error in results}) == 1


@settings(deadline=None, max_examples=150)
@given(streams, st.binary(min_size=1, max_size=200), st.data())
def test_any_trailing_garbage_yields_the_frames_then_none_or_protocol_error(
    frames: list[Spec], garbage: bytes, data: st.DataObject
) -> None:
    """Longer garbage may happen to hold well-formed frames; if so, they are exactly its
    bytes. Whatever it holds, nothing but ProtocolError comes out."""
    stream = b"".join(s.encode() for s in frames) + garbage
    expected = [s.expected() for s in frames]
    cuts = data.draw(st.lists(st.integers(0, len(stream)), max_size=8), label="cuts")

    results = [
        feed(chunks, FrameDecoder(max_frame_bytes=1024))
        for chunks in ([stream], byte_by_byte(stream), split_at(stream, cuts))
    ]
    for got, error in results:
        assert got[: len(frames)] == expected
        assert error is None or isinstance(error, ProtocolError)
    assert len({(tuple(got), outcome(error)) for got, error in results}) == 1
    # frames decoded out of the garbage re-encode to a prefix of it
    decoder = FrameDecoder(max_frame_bytes=1024)
    decoder.receive_data(garbage)
    extra = b""
    for _ in results[0][0][len(frames) :]:
        frame = decoder.next_frame()
        assert frame is not None
        extra += reencode(frame)
    assert garbage.startswith(extra)


# --- limits ---------------------------------------------------------------------------------------


def test_frame_over_the_limit_is_refused_as_soon_as_its_length_arrives() -> None:
    decoder = FrameDecoder(max_frame_bytes=1024)
    length = struct.pack(">i", 1021)  # a frame of 1,025 bytes with its length field
    for i in range(3):
        decoder.receive_data(length[i : i + 1])
        assert decoder.next_frame() is None
    decoder.receive_data(length[3:])
    with pytest.raises(FrameTooLargeError) as info:
        decoder.next_frame()
    assert "1,025" in str(info.value)
    assert "max_frame_bytes=1,024" in str(info.value)
    assert info.value.code == 51


def test_frame_of_exactly_the_limit_is_accepted() -> None:
    spec = Spec(FrameType.REQUEST, 0, 7, 0, 9, b"\x80", (b"x" * (1024 - HEADER - 1),))
    encoded = spec.encode()
    assert len(encoded) == 1024
    assert feed([encoded], FrameDecoder(max_frame_bytes=1024)) == ([spec.expected()], None)
    got, error = feed([encoded], FrameDecoder(max_frame_bytes=1023))
    assert got == []
    assert isinstance(error, FrameTooLargeError)


def test_largest_length_field_exceeds_the_default_limit() -> None:
    decoder = FrameDecoder()
    decoder.receive_data(struct.pack(">i", 2**31 - 1))
    with pytest.raises(FrameTooLargeError, match=f"max_frame_bytes={DEFAULT_MAX_FRAME_BYTES:,}"):
        decoder.next_frame()


@pytest.mark.parametrize("length", [13, 1, 0, -1, -(2**31)])
def test_length_below_the_header_is_refused_on_four_bytes(length: int) -> None:
    decoder = FrameDecoder()
    decoder.receive_data(struct.pack(">i", length))
    with pytest.raises(ProtocolError) as info:
        decoder.next_frame()
    assert type(info.value) is ProtocolError
    assert str(length) in str(info.value)


def test_length_of_exactly_the_header_is_an_empty_frame() -> None:
    got, error = feed([header(14, frame_type=2, correlation_id=-5)])
    assert (got, error) == ([(FrameType.PUSH, 0, 11, 0, -5, b"", b"")], None)


BAD_HEADERS = {
    "frame type 3": header(20, frame_type=3),
    "frame type 255": header(20, frame_type=255),
    "flag bit 1": header(20, flags=0x02),
    "flag bit 7": header(20, flags=0x80),
    "error flag and another": header(20, frame_type=1, flags=0x03),
    "error flag on a request": header(20, frame_type=0, flags=FLAG_ERROR),
    "error flag on a push": header(20, frame_type=2, flags=FLAG_ERROR),
    "body longer than the frame": header(20, body_length=7),
    "body longer than an empty frame": header(14, body_length=1),
    "negative body length": header(20, body_length=-1),
    "most negative body length": header(20, body_length=-(2**31)),
}


@pytest.mark.parametrize("raw", BAD_HEADERS.values(), ids=BAD_HEADERS.keys())
def test_impossible_header_is_refused_before_the_rest_arrives(raw: bytes) -> None:
    decoder = FrameDecoder()
    for i in range(HEADER - 1):
        decoder.receive_data(raw[i : i + 1])
        assert decoder.next_frame() is None
    decoder.receive_data(raw[HEADER - 1 :])  # the header complete, none of the frame's rest
    with pytest.raises(ProtocolError) as info:
        decoder.next_frame()
    assert type(info.value) is ProtocolError
    assert info.value.code == 50


FAILURES = {
    "too large": (struct.pack(">i", 1 << 20), FrameTooLargeError),
    "too short": (struct.pack(">i", 3), ProtocolError),
    "frame type": (header(20, frame_type=9), ProtocolError),
    "flags": (header(20, flags=4), ProtocolError),
    "body length": (header(20, body_length=99), ProtocolError),
}


@pytest.mark.parametrize(("raw", "error_type"), FAILURES.values(), ids=FAILURES.keys())
def test_decoder_stays_failed(raw: bytes, error_type: type[ProtocolError]) -> None:
    valid = Spec(FrameType.RESPONSE, 0, 11, 0, 1, b"\x80", ()).encode()
    decoder = FrameDecoder(max_frame_bytes=4096)
    decoder.receive_data(valid + raw)
    assert decoder.next_frame() is not None
    with pytest.raises(error_type) as first:
        decoder.next_frame()
    # the same error again, whether asked for a frame or given more (valid) bytes
    for _ in range(2):
        with pytest.raises(error_type) as again:
            decoder.next_frame()
        assert again.value is first.value
        with pytest.raises(error_type) as again:
            decoder.receive_data(valid)
        assert again.value is first.value


@pytest.mark.parametrize("chunk", [1, 7, 4096, 65_536, 1 << 20])
def test_large_frames_fill_their_own_buffer(chunk: int) -> None:
    """Frames of LARGE_FRAME_BYTES and more are received into a buffer of their own: the
    same frames come out, with what follows them, whatever the split."""
    from tidewire.protocol.frames import LARGE_FRAME_BYTES

    big = bytes(range(256)) * (LARGE_FRAME_BYTES // 256 + 7)
    frames = [
        (FrameType.RESPONSE, 3, 0, 1, b"body-1", [big]),
        (FrameType.RESPONSE, 4, 0, 2, b"", [b"small"]),
        (FrameType.REQUEST, 5, 1, 3, b"b", [big[: LARGE_FRAME_BYTES - 18], big[:9]]),
        (FrameType.RESPONSE, 6, 0, 4, b"x", []),
    ]
    stream = b"".join(join(encode_frame(*f)) for f in frames)
    dec = FrameDecoder()
    got: list[Frame] = []
    for i in range(0, len(stream), chunk):
        dec.receive_data(stream[i : i + chunk])
        while (frame := dec.next_frame()) is not None:
            got.append(frame)
        assert dec.buffered == (i + len(stream[i : i + chunk])) - sum(
            4 + struct.unpack(">i", bytes(g.body.obj[:4]))[0] for g in got
        )
    assert [
        (g.frame_type, g.api_key, g.api_version, g.correlation_id, bytes(g.body), bytes(g.data))
        for g in got
    ] == [(t, k, v, c, b, b"".join(d)) for t, k, v, c, b, d in frames]
    assert dec.buffered == 0


@pytest.mark.parametrize("size", [100, LARGE_FRAME_BYTES * 3])
def test_a_frames_data_is_read_in_place_from_its_bytes(size: int) -> None:
    """Small or large (received in pieces), a frame's data is the tail of one bytes object,
    which data_window finds without copying."""
    data = bytes(range(256)) * (size // 256 + 1)
    wire = b"".join(encode_frame(FrameType.RESPONSE, 1, 0, 7, b"\x90", [data]))
    dec = FrameDecoder()
    for i in range(0, len(wire), 65_536):
        dec.receive_data(wire[i : i + 65_536])
    frame = dec.next_frame()
    assert frame is not None
    assert dec.next_frame() is None
    buf, start = data_window(frame.data)
    assert type(buf) is bytes
    assert buf is frame.data.obj  # not a copy
    assert buf[start:] == data
    assert data_window(data) == (data, 0)
    copied, at = data_window(memoryview(bytearray(data)))
    assert (copied, at) == (data, 0)
