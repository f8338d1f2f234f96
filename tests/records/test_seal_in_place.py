"""``seal_batch_in_place`` writes the same header and CRC-32C as ``seal_batch`` into room left
before a records section, and the batch it makes passes the broker's check and reads back."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tidewire.records import BATCH_OVERHEAD, BatchBuilder, Codec, check_batch, decode_batch
from tidewire.records.batch import seal_batch, seal_batch_in_place

_INT64 = st.integers(-(2**63), 2**63 - 1)


@settings(deadline=None, max_examples=200)
@given(
    section=st.binary(max_size=300),
    count=st.integers(0, 2**31 - 1),
    first=_INT64,
    last=_INT64,
    producer_id=_INT64,
    producer_epoch=st.integers(-(2**15), 2**15 - 1),
    base_sequence=st.integers(-(2**31), 2**31 - 1),
)
def test_the_same_bytes_as_seal_batch(  # noqa: PLR0917 (one argument per field)
    section: bytes,
    count: int,
    first: int,
    last: int,
    producer_id: int,
    producer_epoch: int,
    base_sequence: int,
) -> None:
    fields = {
        "codec": Codec.NONE,
        "count": count,
        "first_timestamp": first,
        "max_timestamp": last,
        "producer_id": producer_id,
        "producer_epoch": producer_epoch,
        "base_sequence": base_sequence,
    }
    buf = bytearray(b"\xee" * BATCH_OVERHEAD) + section  # whatever was in the room
    assert seal_batch_in_place(buf, **fields) is buf
    assert bytes(buf) == seal_batch(section, **fields)


def test_a_sealed_batch_passes_the_check_and_reads_back() -> None:
    builder = BatchBuilder(producer_id=7, producer_epoch=1, base_sequence=40)
    for i in range(5):
        builder.append(f"v{i}".encode(), timestamp_ms=1_000 + i, key=b"k")
    whole = builder.build()
    buf = bytearray(BATCH_OVERHEAD) + whole[BATCH_OVERHEAD:]
    seal_batch_in_place(
        buf,
        codec=Codec.NONE,
        count=5,
        first_timestamp=1_000,
        max_timestamp=1_004,
        producer_id=7,
        producer_epoch=1,
        base_sequence=40,
    )
    assert bytes(buf) == whole
    header = check_batch(buf)
    assert (header.records_count, header.base_sequence, header.producer_id) == (5, 40, 7)
    assert [r.value for r in decode_batch(bytes(buf))[1]] == [f"v{i}".encode() for i in range(5)]


def test_no_room_for_the_header_is_refused() -> None:
    with pytest.raises(ValueError, match="a batch of 60 bytes has no room for its 61-byte header"):
        seal_batch_in_place(
            bytearray(60), codec=Codec.NONE, count=0, first_timestamp=-1, max_timestamp=-1
        )
