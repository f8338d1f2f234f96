"""Per-batch compression codecs of RecordBatch v2 (pure, no I/O).

The codec id sits in the low three bits of the batch attributes, as in Kafka: 0 none,
1 gzip, 2 snappy, 3 lz4 (LZ4 frame format), 4 zstd. Snappy is not implemented by tidewire; a
batch that names it, or an id above 4, is refused with
:class:`~tidewire.errors.UnsupportedCompressionError`.

Decompression is bounded: a batch that inflates past ``limit`` bytes is refused with
:class:`~tidewire.errors.DecompressionLimitError` before more than ``limit + 1`` bytes are
produced, so a small malicious batch cannot exhaust memory.
"""

from __future__ import annotations

import enum
import io
import zlib

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


class Codec(enum.IntEnum):
    """Compression codec ids, as stored in the low 3 bits of the batch attributes."""

    NONE = 0
    GZIP = 1
    SNAPPY = 2
    LZ4 = 3
    ZSTD = 4


SUPPORTED = frozenset({Codec.NONE, Codec.GZIP, Codec.LZ4, Codec.ZSTD})


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
