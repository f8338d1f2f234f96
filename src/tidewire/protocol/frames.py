"""Frames of the binary protocol: the fixed header, encoding, and an incremental decoder
(pure, sans-IO: bytes in, frames out).

Every frame (big-endian)::

    offset  size  field
         0     4  frame_length     bytes after this field: 14 + body_length + data length
         4     1  frame_type       0 request, 1 response, 2 push (server-initiated)
         5     1  flags            bit 0: the body is an ErrorBody (response frames only)
         6     2  api_key          which API (see tidewire.protocol.messages.ApiKey)
         8     2  api_version      the version of that API's schema
        10     4  correlation_id   chosen by the client per request, echoed by the response;
                                   a push frame carries the subscription id
        14     4  body_length      bytes of the msgpack body that follows
        18     …  body             msgpack, the API's schema for this frame type and version
         …     …  data             the rest of the frame: raw record batches (produce
                                   requests, fetch responses, pushes), never re-encoded

Only :class:`~tidewire.errors.ProtocolError` subclasses escape the decoder.
"""

from __future__ import annotations

import enum
import struct
import sys
from collections.abc import Sequence
from typing import NamedTuple, NoReturn

from tidewire.errors import FrameTooLargeError, ProtocolError

__all__ = [
    "DEFAULT_MAX_FRAME_BYTES",
    "FLAG_ERROR",
    "FRAME_HEADER",
    "FRAME_POOL_MIN_BYTES",
    "BufferedFrameDecoder",
    "Frame",
    "FrameDecoder",
    "FramePool",
    "FrameType",
    "data_window",
    "encode_frame",
    "frame_data_window",
]

#: The whole fixed header as one struct, a format character per field (see the docstring).
FRAME_HEADER = struct.Struct(
    ">"
    "i"  # frame_length
    "B"  # frame_type
    "B"  # flags
    "h"  # api_key
    "h"  # api_version
    "i"  # correlation_id
    "i"  # body_length
)
#: Bytes of the header that frame_length counts (everything after frame_length itself).
_COUNTED_HEADER = FRAME_HEADER.size - 4
#: Default frame limit: a produce request carries batches of up to 16 MiB for several
#: partitions; 64 MiB bounds what one connection can make the broker buffer.
DEFAULT_MAX_FRAME_BYTES = 64 * 1024 * 1024
#: A frame at least this large that has not fully arrived is kept as the pieces it arrives in
#: and joined once: no growing, compacting or copying of a shared buffer for the
#: multi-megabyte frames of fetch responses and produce requests.
LARGE_FRAME_BYTES = 256 * 1024
#: Flag bit: the body is an ErrorBody instead of the API's response schema.
FLAG_ERROR = 0x01
_KNOWN_FLAGS = FLAG_ERROR

Buffer = bytes | bytearray | memoryview


class FrameType(enum.IntEnum):
    """What a frame is."""

    REQUEST = 0
    RESPONSE = 1
    PUSH = 2


#: Frame type byte -> member (checked to be one of them by the header's check): an index,
#: not an enum call, once a frame.
_FRAME_TYPES = tuple(FrameType)


class Frame(NamedTuple):
    """One decoded frame. ``body`` and ``data`` are views into the frame's bytes (a
    ``bytes`` object); ``data`` is their tail (see :func:`data_window`)."""

    frame_type: FrameType
    flags: int
    api_key: int
    api_version: int
    correlation_id: int
    body: memoryview
    data: memoryview


def encode_frame(  # noqa: PLR0917 - the header's fields, in their wire order
    frame_type: FrameType,
    api_key: int,
    api_version: int,
    correlation_id: int,
    body: bytes,
    data: Sequence[Buffer] = (),
    *,
    flags: int = 0,
) -> list[Buffer]:
    """Return the buffers of one frame, ready for ``writelines``/``sendmsg``: the header and
    body, then the data buffers as they are (not copied)."""
    data_len = sum(len(d) for d in data)
    header = FRAME_HEADER.pack(
        _COUNTED_HEADER + len(body) + data_len,
        frame_type,
        flags,
        api_key,
        api_version,
        correlation_id,
        len(body),
    )
    return [header + body, *data]


def data_window(data: Buffer) -> tuple[bytes, int]:
    """The ``bytes`` a frame's ``data`` lies in, and where it starts there, without copying:
    a frame's data view is the tail of the frame's own bytes. Anything else (bytes, a
    bytearray, a view of one) is returned as bytes of its own (a copy unless it is bytes).

    Reading records straight from the frame's bytes saves copying every byte of a fetch or
    push once more."""
    if type(data) is bytes:
        return data, 0
    if isinstance(data, memoryview) and type(data.obj) is bytes and data.contiguous:
        whole = data.obj
        return whole, len(whole) - data.nbytes
    return bytes(data), 0


def _frame_length(buf: bytearray, start: int, avail: int, max_frame_bytes: int) -> int:
    """The length field of the frame at ``buf[start:]`` once its header (``avail`` bytes of
    it are there) is checked; -1 while too little of the header is there to check it.

    Raises:
        FrameTooLargeError: the frame exceeds ``max_frame_bytes`` (known from 4 bytes on).
        ProtocolError: an impossible length, frame type, flag or body length.
    """
    if avail < 4:
        return -1
    length = int.from_bytes(buf[start : start + 4], "big", signed=True)
    if length < _COUNTED_HEADER:
        raise ProtocolError(f"frame length {length} is below the header's 14 bytes")
    if length + 4 > max_frame_bytes:
        raise FrameTooLargeError(
            f"frame of {length + 4:,} bytes exceeds max_frame_bytes={max_frame_bytes:,}"
        )
    if avail < FRAME_HEADER.size:
        return -1
    _, ftype, flags, _, _, _, body_len = FRAME_HEADER.unpack_from(buf, start)
    if ftype > FrameType.PUSH:
        raise ProtocolError(f"unknown frame type {ftype}")
    if flags & ~_KNOWN_FLAGS or (flags & FLAG_ERROR and ftype != FrameType.RESPONSE):
        raise ProtocolError(f"frame flags {flags:#04x} are not valid here")
    if body_len < 0 or body_len > length - _COUNTED_HEADER:
        raise ProtocolError(f"body length {body_len} does not fit in a frame of length {length}")
    return length


def frame_data_window(data: Buffer) -> tuple[bytes | bytearray, int]:
    """:func:`data_window`, except that a frame received in place
    (:class:`BufferedFrameDecoder`: a ``bytearray`` of its own, never written again once
    whole) is returned as that ``bytearray`` rather than copied. For readers that take any
    buffer (the record readers)."""
    if isinstance(data, memoryview) and type(data.obj) is bytearray and data.contiguous:
        whole = data.obj
        return whole, len(whole) - data.nbytes
    return data_window(data)


class FrameDecoder:
    """Incremental decoder of a byte stream of frames.

    Feed bytes with :meth:`receive_data`; :meth:`next_frame` returns each complete frame, or
    ``None`` while more bytes are needed. The header is checked as soon as it arrives, so an
    impossible length is refused before anything is buffered for it. After an error the
    decoder stays failed and raises it again.

    Args:
        max_frame_bytes: the largest frame accepted (whole frame, header included).
    """

    def __init__(self, *, max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES) -> None:
        self._buf = bytearray()
        self._start = 0
        self._max = max_frame_bytes
        self._error: ProtocolError | None = None
        #: A large frame being received as its pieces (joined into one bytes object when it is
        #: all there), how much of it is there, and its whole size.
        self._large: list[bytes] | None = None
        self._filled = 0
        self._large_size = 0

    @property
    def buffered(self) -> int:
        """Bytes received and not yet returned in a frame."""
        return len(self._buf) - self._start + self._filled

    @property
    def failed(self) -> bool:
        """Whether the stream broke the protocol (every call raises that error again)."""
        return self._error is not None

    def receive_data(self, data: Buffer) -> None:
        """Add bytes from the stream."""
        if self._error is not None:
            raise self._error
        large = self._large
        if large is not None:
            n = min(self._large_size - self._filled, len(data))
            if n == len(data) and type(data) is bytes:
                large.append(data)  # the common case: kept as it came, not copied
            else:
                with memoryview(data) as view:
                    large.append(bytes(view[:n]))
                    if n < len(data):
                        self._buf += view[n:]
            self._filled += n
            return
        if self._start and self._start >= len(self._buf) // 2:
            del self._buf[: self._start]  # compact now and then, not per frame
            self._start = 0
        self._buf += data

    def next_frame(self) -> Frame | None:
        """Return the next complete frame, or ``None`` if more data is needed.

        Raises:
            FrameTooLargeError: the frame's length exceeds ``max_frame_bytes``.
            ProtocolError: an impossible length, frame type or flag.
        """
        if self._error is not None:
            raise self._error
        large = self._large
        if large is not None:
            if self._filled < self._large_size:
                return None
            self._large, self._filled, self._large_size = None, 0, 0
            return self._frame(b"".join(large))
        buf, start = self._buf, self._start
        avail = len(buf) - start
        try:
            length = _frame_length(buf, start, avail, self._max)
        except ProtocolError as exc:
            self._fail(exc)
        if length < 0:
            return None
        end = start + 4 + length
        if len(buf) < end:
            if length + 4 >= LARGE_FRAME_BYTES:
                # Receive the rest as its own pieces, joined once when all is there.
                with memoryview(buf) as whole:
                    self._large = [bytes(whole[start:])]
                self._filled, self._large_size = avail, length + 4
                buf.clear()
                self._start = 0
            return None
        with memoryview(buf) as whole:  # one copy (buf[start:end] would copy twice)
            frame_bytes = bytes(whole[start:end])
        self._start = end
        if self._start == len(buf):
            buf.clear()
            self._start = 0
        return self._frame(frame_bytes)

    @staticmethod
    def _frame(frame_bytes: bytes | bytearray) -> Frame:
        """The frame in ``frame_bytes`` (whole, its header checked); the views are its own:
        the decoder never writes to these bytes again."""
        _, ftype, flags, api_key, version, corr, body_len = FRAME_HEADER.unpack_from(frame_bytes)
        view = memoryview(frame_bytes)
        body_end = FRAME_HEADER.size + body_len
        return Frame(
            _FRAME_TYPES[ftype],
            flags,
            api_key,
            version,
            corr,
            view[FRAME_HEADER.size : body_end],
            view[body_end:],
        )

    def _fail(self, exc: ProtocolError) -> NoReturn:
        self._error = exc
        raise exc


#: What a :class:`FramePool` keeps at most, by default: eight 1 MiB produce requests (a
#: producer's default batch size) in flight on the connections of a server at once. Beyond it
#: a large frame gets a fresh buffer, as without a pool.
FRAME_POOL_BYTES = 8 * 1024 * 1024
#: Frames smaller than this get a fresh buffer, never a pooled one: a few page faults are
#: all a pooled buffer would save them, less than a look through the pool costs, and the
#: pool holds at most FRAME_POOL_BYTES / FRAME_POOL_MIN_BYTES buffers (32) to look through.
FRAME_POOL_MIN_BYTES = 256 * 1024
#: A pooled buffer's capacity is a frame's size rounded up to this, so that the next frames of
#: about the same size (a producer's batches differ by a few records) fit in it.
_POOL_GRAIN = 64 * 1024


def _refcounts_tell_use() -> bool:
    """Whether ``sys.getrefcount`` tells a pooled buffer nothing else refers to from one
    that a view holds, as CPython's reference counts do (checked, not assumed: a pool that
    cannot tell would write a new frame over bytes still waiting to be stored)."""
    if sys.implementation.name != "cpython":
        return False
    bufs = [bytearray(8)]
    if sys.getrefcount(bufs[0]) != 2:
        return False
    view = memoryview(bufs[0])
    held = sys.getrefcount(bufs[0]) == 3
    view.release()
    return held and sys.getrefcount(bufs[0]) == 2


#: Whether a :class:`FramePool` may hand buffers out again here (see _refcounts_tell_use).
POOL_SAFE = _refcounts_tell_use()


class FramePool:
    """Buffers for large frames received in place (:class:`BufferedFrameDecoder`), handed
    out again once nothing refers to the frame they held any more.

    A fresh ``bytearray`` of a megabyte costs a page fault for every 4 KiB of it the first
    time the socket writes there; a buffer taken again is already mapped. A buffer is taken
    again only when nothing but the pool refers to it: no view of its frame (a request's
    body or data, or anything made of them, such as a batch waiting for its write) is alive
    anywhere, which CPython's reference count tells exactly, so a frame once handed out is
    never written again while it can be seen. Each buffer is resized to the frame's exact size
    (within its capacity, which keeps its memory), so a frame's data is still the tail of its
    ``bytearray`` (:func:`frame_data_window`).

    One pool may serve many decoders (the connections of one server, on one thread).

    Where reference counts cannot tell that (not CPython: :data:`POOL_SAFE`), every frame
    gets a fresh buffer.

    Args:
        max_bytes: the capacity of all pooled buffers together, at most. Frames larger than
            a quarter of it are never pooled.
        min_bytes: frames smaller than this are never pooled.
    """

    def __init__(
        self, max_bytes: int = FRAME_POOL_BYTES, min_bytes: int = FRAME_POOL_MIN_BYTES
    ) -> None:
        if max_bytes < 0:
            raise ValueError(f"max_bytes={max_bytes} must be >= 0")
        if min_bytes < 1:
            raise ValueError(f"min_bytes={min_bytes} must be >= 1")
        self.max_bytes = max_bytes if POOL_SAFE else 0
        self.min_bytes = min_bytes
        self._bufs: list[bytearray] = []
        self._caps: list[int] = []
        self._total = 0  # sum(self._caps)
        #: Frames that got a pooled buffer again, and those that got a fresh one.
        self.reused = 0
        self.fresh = 0

    @property
    def pooled_bytes(self) -> int:
        """The capacity of the buffers the pool holds (in use or not)."""
        return self._total

    def take(self, size: int) -> bytearray:
        """A ``bytearray`` of exactly ``size`` bytes (its contents undefined) that nothing
        else refers to."""
        if size < self.min_bytes:
            self.fresh += 1
            return bytearray(size)
        bufs, caps = self._bufs, self._caps
        free = -1
        for i in range(len(bufs)):
            # 2: the pool's list and getrefcount's own argument: nothing else holds it.
            if sys.getrefcount(bufs[i]) == 2:
                cap = caps[i]
                if cap // 2 < size <= cap:
                    buf = bufs[i]
                    have = len(buf)
                    if size < have:
                        del buf[size:]  # within the capacity: the memory is kept
                    elif size > have:
                        buf += bytes(size - have)
                    self.reused += 1
                    return buf
                if free < 0:
                    free = i
        self.fresh += 1
        cap = -(-size // _POOL_GRAIN) * _POOL_GRAIN
        if size <= cap // 2:
            cap = size  # cut to size, a bytearray gives its memory back: keep it exact
        if cap > self.max_bytes // 4:
            return bytearray(size)
        if self._total + cap > self.max_bytes:
            if free < 0:
                return bytearray(size)  # every pooled buffer is in use: not pooled
            self._total -= caps[free]
            del bufs[free], caps[free]  # a free one of another size makes room
            if self._total + cap > self.max_bytes:
                return bytearray(size)
        buf = bytearray(cap)
        del buf[size:]
        bufs.append(buf)
        caps.append(cap)
        self._total += cap
        return buf


#: Bytes of the buffer a :class:`BufferedFrameDecoder` receives headers and small frames in:
#: every frame below LARGE_FRAME_BYTES fits, so it is never grown.
HEAD_BYTES = LARGE_FRAME_BYTES


class BufferedFrameDecoder(FrameDecoder):
    """A :class:`FrameDecoder` the socket can read into directly (``asyncio.BufferedProtocol``):
    :meth:`get_buffer` says where the next bytes go, :meth:`buffer_updated` how many came.

    Headers and frames below ``head_bytes`` (``LARGE_FRAME_BYTES`` by default) are received
    into one preallocated buffer and copied out once per frame, as :class:`FrameDecoder` does.
    A frame of ``head_bytes`` or more (a fetch response, a push of records, a produce request)
    gets a ``bytearray``
    of its exact size as soon as its header is there, and the rest of it is read straight into
    that: no copy of its bytes in user space at all, nor a join of pieces. Its views are over
    that ``bytearray`` (:func:`frame_data_window` finds it), which is never written again.
    :meth:`receive_data` works too (a copy into the same buffers), so the two ways of feeding
    it give the same frames.

    Args:
        max_frame_bytes: the largest frame accepted (whole frame, header included).
        head_bytes: the size of the buffer for headers and small frames, and so where "large"
            begins: a frame of ``head_bytes`` or more is received in place. A server, which
            holds one such buffer per connection, keeps it smaller than the default.
        pool: where the buffers of large frames come from (None: a fresh ``bytearray`` each).
    """

    def __init__(
        self,
        *,
        max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES,
        head_bytes: int = HEAD_BYTES,
        pool: FramePool | None = None,
    ) -> None:
        super().__init__(max_frame_bytes=max_frame_bytes)
        if head_bytes < FRAME_HEADER.size:
            raise ValueError(f"head_bytes={head_bytes} is below a frame header's 18 bytes")
        self._head = bytearray(head_bytes)
        self._head_bytes = head_bytes
        self._end = 0  # head[_start:_end] holds bytes received and not yet framed
        self._frame_buf: bytearray | None = None  # a large frame being received in place
        self._pool = pool

    @property
    def buffered(self) -> int:
        """Bytes received and not yet returned in a frame."""
        return self._end - self._start + self._filled

    def get_buffer(self, sizehint: int = -1) -> memoryview:
        """Where the next bytes read from the socket go (write into it, then call
        :meth:`buffer_updated`). Never empty; never beyond the frame being received in
        place, so the bytes of the next frame are not written into it.

        Args:
            sizehint: ignored (the buffer is what the frame being received needs).
        """
        if self._error is not None:
            raise self._error
        frame = self._frame_buf
        if frame is not None and self._filled < len(frame):
            return memoryview(frame)[self._filled :]
        head, start, end = self._head, self._start, self._end
        if start == end:
            self._start = self._end = start = end = 0
        elif start and len(head) - end < len(head) // 4:
            head[: end - start] = head[start:end]  # room at the end: move what is left up
            self._start, self._end = 0, end - start
            end -= start
        if end == len(head):
            # Only when frames are fed faster than they are taken (receive_data of many at
            # once): the head holds whole frames, and grows for more.
            head.extend(bytes(self._head_bytes))
        return memoryview(head)[end:]

    def buffer_updated(self, nbytes: int) -> None:
        """``nbytes`` were written at the start of the last :meth:`get_buffer`'s view."""
        frame = self._frame_buf
        if frame is not None and self._filled < len(frame):
            self._filled += nbytes
        else:
            self._end += nbytes

    def receive_data(self, data: Buffer) -> None:
        """Add bytes from the stream (copied into the buffers :meth:`get_buffer` hands out)."""
        if self._error is not None:
            raise self._error
        with memoryview(data) as src:
            at = 0
            while at < len(src):
                if self._frame_buf is None:
                    # A large frame whose header is there moves out of the head first.
                    self._promote()
                with self.get_buffer() as dst:
                    n = min(len(dst), len(src) - at)
                    dst[:n] = src[at : at + n]
                self.buffer_updated(n)
                at += n

    def next_frame(self) -> Frame | None:
        """Return the next complete frame, or ``None`` if more data is needed.

        Raises:
            FrameTooLargeError, ProtocolError: as :meth:`FrameDecoder.next_frame`.
        """
        if self._error is not None:
            raise self._error
        frame = self._frame_buf
        if frame is not None:
            if self._filled < len(frame):
                return None
            self._frame_buf, self._filled = None, 0
            return self._frame(frame)
        head, start = self._head, self._start
        try:
            length = _frame_length(head, start, self._end - start, self._max)
        except ProtocolError as exc:
            self._fail(exc)
        if length < 0:
            return None
        end = start + 4 + length
        if end > self._end:
            self._promote()
            return None
        with memoryview(head) as whole:
            frame_bytes = bytes(whole[start:end])
        self._start = end
        return self._frame(frame_bytes)

    def _promote(self) -> None:
        """A large frame whose header is there moves to a buffer of its own (what of it is
        there already is copied once); the rest of it is then read straight into that."""
        head, start, end = self._head, self._start, self._end
        try:
            length = _frame_length(head, start, end - start, self._max)
        except ProtocolError as exc:
            self._fail(exc)
        if length < 0 or length + 4 < self._head_bytes or start + 4 + length <= end:
            if start:  # a small frame, or a header, at the end of the head: move it up
                head[: end - start] = head[start:end]
                self._start, self._end = 0, end - start
            return
        pool = self._pool
        frame = bytearray(length + 4) if pool is None else pool.take(length + 4)
        frame[: end - start] = head[start:end]
        self._frame_buf, self._filled = frame, end - start
        self._start = self._end = 0
