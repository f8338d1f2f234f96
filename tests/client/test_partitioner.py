"""The key partitioner: FNV-1a 32-bit against the published test vectors, and its compiled
twin against the Python loop."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tidewire.client.partitioner import _fnv1a_32, fnv1a_32, partition_for_key
from tidewire.records import _impl

# From the FNV reference test suite (Landon Curt Noll, test_fnv.c, FNV-1a 32-bit).
VECTORS = [
    (b"", 0x811C9DC5),
    (b"a", 0xE40C292C),
    (b"b", 0xE70C2DE5),
    (b"c", 0xE60C2C52),
    (b"foo", 0xA9F37ED7),
    (b"foob", 0x3F5076EF),
    (b"fooba", 0x39AAA18A),
    (b"foobar", 0xBF9CF968),
    (b"\x00", 0x050C5D1F),
    (b"chongo was here!\n", 0xD49930D5),
]


@pytest.mark.parametrize(("data", "expected"), VECTORS)
def test_known_vectors(data: bytes, expected: int) -> None:
    assert fnv1a_32(data) == expected


def test_result_is_32_bits() -> None:
    assert 0 <= fnv1a_32(bytes(range(256)) * 64) < 2**32


def test_partition_for_key() -> None:
    assert partition_for_key(b"foobar", 7) == 0xBF9CF968 % 7
    assert partition_for_key(b"anything", 1) == 0
    # Same key, same partition.
    assert partition_for_key(b"user-42", 12) == partition_for_key(b"user-42", 12)


def test_partition_count_must_be_positive() -> None:
    with pytest.raises(ValueError, match="partitions=0"):
        partition_for_key(b"k", 0)


@pytest.mark.skipif(_impl.fnv1a_32 is None, reason="the pure-Python codec has no compiled hash")
@given(st.binary(max_size=300))
def test_the_compiled_hash_is_the_python_loop(data: bytes) -> None:
    compiled = _impl.fnv1a_32
    assert compiled is not None
    assert fnv1a_32 is compiled  # what the producer routes by
    assert compiled(data) == _fnv1a_32(data)
    # Bytes-like or an iterable of ints: the Python-level loop, as the pure twin.
    assert compiled(bytearray(data)) == _fnv1a_32(data)  # type: ignore[arg-type]
    assert compiled(list(data)) == _fnv1a_32(list(data))  # type: ignore[arg-type]


def test_both_refuse_what_is_not_bytes_alike() -> None:
    for impl in {fnv1a_32, _fnv1a_32}:
        with pytest.raises(TypeError):
            impl("text")  # type: ignore[arg-type]
