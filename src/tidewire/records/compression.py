"""Per-batch compression codecs of RecordBatch v2 (pure, no I/O).

The codec id sits in the low three bits of the batch attributes, as in Kafka: 0 none,
1 gzip, 2 snappy, 3 lz4 (LZ4 frame format), 4 zstd. An id above 4 is refused with
:class:`~tidewire.errors.UnsupportedCompressionError`.

Snappy comes in two forms in Kafka batches, and both are read:

- raw snappy (one block: a varint of the uncompressed length, then the compressed data), what
  librdkafka writes;
- the xerial framing of snappy-java, what Kafka's Java client and kafka-python write, and
  what tidewire writes so that every Kafka consumer can read it::

      magic      8 bytes  b"\x82SNAPPY\x00"
      version    int32    1
      compat     int32    1
      then, until the end:
      length     int32    the size of the next block
      block      length bytes of raw snappy (at most 32 KiB uncompressed each)

Every int is big-endian.

Decompression is bounded: a batch that inflates past ``limit`` bytes is refused with
:class:`~tidewire.errors.DecompressionLimitError` before more than ``limit + 1`` bytes are
produced, so a small malicious batch cannot exhaust memory.
"""

from __future__ import annotations

import enum
import io
import struct
import zlib

import cramjam
import lz4.frame
import zstandard

from tidewire.errors import (
    DecompressionLimitError,
    InvalidRecordError,
    UnsupportedCompressionError,
)

__all__ = ["MAX_DECOMPRESSED_BYTES", "Codec", "compress", "decompress"]

#: Default bound on one batch's decompressed size: 64 MiB is four times the largest batch
#: a producer may send (16 MiB), which leaves room for compressible data while keeping one
#: hostile batch from taking more than a bounded share of the broker's memory.
MAX_DECOMPRESSED_BYTES = 64 * 1024 * 1024

_GZIP_WBITS = 16 + zlib.MAX_WBITS  # a gzip header and trailer around the deflate stream
_ZSTD_LEVEL = 3  # zstd's own default: fast, and better ratios than lz4

#: The xerial (snappy-java) stream header: magic, then version 1 and compatible version 1.
XERIAL_MAGIC = b"\x82SNAPPY\x00"
_XERIAL_HEADER = struct.Struct(">8sii")  # magic, version, compatible version
_XERIAL_BLOCK = struct.Struct(">i")  # length of the compressed block that follows
#: Uncompressed bytes per xerial block: snappy-java's default (SnappyOutputStream), the
#: block size Kafka's Java client and kafka-python write.
XERIAL_BLOCK_BYTES = 32 * 1024


class Codec(enum.IntEnum):
    """Compression codec ids, as stored in the low 3 bits of the batch attributes."""

    NONE = 0
    GZIP = 1
    SNAPPY = 2
    LZ4 = 3
    ZSTD = 4


SUPPORTED = frozenset(Codec)


def check_codec(codec_id: int) -> Codec:
    """Return the :class:`Codec` for ``codec_id``, or raise ``UnsupportedCompressionError``."""
    try:
        codec = Codec(codec_id)
    except ValueError:
        raise UnsupportedCompressionError(f"unknown compression codec id {codec_id}") from None
    if codec not in SUPPORTED:
        raise UnsupportedCompressionError(
            f"compression codec {codec.name.lower()} is not supported"
        )
    return codec


def compress(codec: Codec, data: bytes | bytearray | memoryview) -> bytes:
    """Compress ``data`` with ``codec`` (``Codec.NONE`` returns it unchanged)."""
    if codec is Codec.NONE:
        return bytes(data)
    if codec is Codec.GZIP:
        c = zlib.compressobj(wbits=_GZIP_WBITS)
        return c.compress(data) + c.flush()
    if codec is Codec.SNAPPY:
        return _snappy_xerial(data)
    if codec is Codec.LZ4:
        return bytes(lz4.frame.compress(bytes(data)))
    if codec is Codec.ZSTD:
        return bytes(zstandard.ZstdCompressor(level=_ZSTD_LEVEL).compress(bytes(data)))
    raise UnsupportedCompressionError(f"compression codec {codec.name.lower()} is not supported")


def decompress(
    codec: Codec, data: bytes | memoryview, limit: int = MAX_DECOMPRESSED_BYTES
) -> bytes | memoryview:
    """Decompress one batch's records section.

    Args:
        codec: the batch's codec.
        data: the compressed bytes (the records section of the batch).
        limit: the most bytes the output may have.

    Returns:
        The decompressed bytes (``data`` itself for ``Codec.NONE``).

    Raises:
        DecompressionLimitError: the output would exceed ``limit`` bytes.
        InvalidRecordError: the compressed stream is malformed or has trailing bytes.
        UnsupportedCompressionError: ``codec`` is not implemented.
    """
    if codec is Codec.NONE:
        return data
    name = codec.name.lower()
    if codec is Codec.SNAPPY:
        return _unsnappy(data, limit)
    try:
        if codec is Codec.GZIP:
            d = zlib.decompressobj(wbits=_GZIP_WBITS)
            out = d.decompress(data, limit + 1)
            _check_limit(len(out), limit, name)
            if not d.eof or d.unused_data or d.unconsumed_tail:
                raise InvalidRecordError("gzip stream is truncated or has trailing bytes")
            return out
        if codec is Codec.LZ4:
            ld = lz4.frame.LZ4FrameDecompressor()
            out = ld.decompress(bytes(data), max_length=limit + 1)
            _check_limit(len(out), limit, name)
            if not ld.eof or ld.unused_data:
                raise InvalidRecordError("lz4 frame is truncated or has trailing bytes")
            return bytes(out)
        if codec is Codec.ZSTD:
            # The bounded streaming read enforces the limit without trusting the frame's
            # declared size; once the output is known to be small, a second pass checks that
            # the frame is complete and nothing follows it.
            reader = zstandard.ZstdDecompressor().stream_reader(
                io.BytesIO(data), read_across_frames=False
            )
            _check_limit(len(reader.read(limit + 1)), limit, name)
            zd = zstandard.ZstdDecompressor().decompressobj()
            out = zd.decompress(bytes(data))
            if not zd.eof or zd.unused_data:
                raise InvalidRecordError("zstd frame is truncated or has trailing bytes")
            return bytes(out)
    except (zlib.error, RuntimeError, zstandard.ZstdError, ValueError, EOFError) as exc:
        # zlib, lz4 and zstandard each signal a malformed stream with their own exception;
        # they become the one record error the decoder contract allows.
        raise InvalidRecordError(f"{name} stream is malformed: {exc}") from None
    raise UnsupportedCompressionError(f"compression codec {name} is not supported")


def _check_limit(produced: int, limit: int, name: str) -> None:
    if produced > limit:
        raise DecompressionLimitError(
            f"{name} batch decompresses to more than {limit:,} bytes (the decompression limit)"
        )


def _snappy_xerial(data: bytes | bytearray | memoryview) -> bytes:
    """Snappy in the xerial framing, blocks of :data:`XERIAL_BLOCK_BYTES` (as Kafka's Java
    client writes it: librdkafka, kafka-python and the Java client all read this form)."""
    view = memoryview(data).cast("B")
    parts = [_XERIAL_HEADER.pack(XERIAL_MAGIC, 1, 1)]
    for start in range(0, len(view), XERIAL_BLOCK_BYTES):
        block = bytes(cramjam.snappy.compress_raw(view[start : start + XERIAL_BLOCK_BYTES]))
        parts.append(_XERIAL_BLOCK.pack(len(block)))
        parts.append(block)
    return b"".join(parts)


def _unsnappy(data: bytes | memoryview, limit: int) -> bytes:
    """Decompress raw or xerial-framed snappy, refusing output past ``limit`` bytes.

    Each raw block declares its uncompressed length up front; the limit is checked against
    the declared lengths before anything is inflated, and the library checks that a block
    inflates to exactly what it declared.
    """
    view = memoryview(data).cast("B")
    try:
        if len(view) < _XERIAL_HEADER.size or bytes(view[:8]) != XERIAL_MAGIC:
            _check_limit(cramjam.snappy.decompress_raw_len(view), limit, "snappy")
            return bytes(cramjam.snappy.decompress_raw(view))
        blocks = []
        total = 0
        pos = _XERIAL_HEADER.size
        while pos < len(view):
            if len(view) - pos < _XERIAL_BLOCK.size:
                raise InvalidRecordError(
                    f"xerial snappy stream ends inside a block length at byte {pos} of {len(view)}"
                )
            (size,) = _XERIAL_BLOCK.unpack_from(view, pos)
            pos += _XERIAL_BLOCK.size
            if size < 0 or size > len(view) - pos:
                raise InvalidRecordError(
                    f"xerial snappy block of {size} bytes at byte {pos} overruns the "
                    f"{len(view)}-byte stream"
                )
            block = view[pos : pos + size]
            pos += size
            total += cramjam.snappy.decompress_raw_len(block)
            _check_limit(total, limit, "snappy")
            blocks.append(block)
        return b"".join(bytes(cramjam.snappy.decompress_raw(b)) for b in blocks)
    except cramjam.DecompressionError as exc:
        raise InvalidRecordError(f"snappy stream is malformed: {exc}") from None
