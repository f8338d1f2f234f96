""":func:`check_whole_batch` (the append fast path) accepts exactly what :func:`check_batch`
accepts of a buffer holding one whole batch, and returns the same header fields.

Inputs: valid batches of every supported codec, then seeded mutants — a header field set to
an edge value (resealed, so only that field is wrong, or left unsealed), a random byte flipped,
the buffer cut short or given trailing bytes. Each mutant is rebuilt from
``random.Random(f"{SEED}:{index}")``.
"""

from __future__ import annotations

import random
from typing import Final

import pytest

from tests.records._batches import (
    SUPPORTED_CODECS,
    BatchSpec,
    RecordSpec,
    build,
    patch_header,
    reseal,
)
from tidewire.errors import RecordBatchError
from tidewire.records import BATCH_OVERHEAD, MAX_BATCH_BYTES
from tidewire.records.batch import check_batch, check_whole_batch

SEED: Final = 20250301
MUTANTS: Final = 4_000

EDGE_VALUES: Final = {
    "batch_length": (-12, 0, BATCH_OVERHEAD - 13, BATCH_OVERHEAD - 12, 2**31 - 1),
    "magic": (0, 1, 3, -1),
    "attributes": (1, 2, 3, 4, 5, 6, 7, 8, 0x7FFF, -1),
    "last_offset_delta": (-1, 0, 1, 2**31 - 1),
    "records_count": (-1, 0, 1, 2, 10_000, 2**31 - 1),
    "crc": (0, 0xFFFFFFFF),
}


def corpus() -> list[bytes]:
    out = []
    for i, codec in enumerate(SUPPORTED_CODECS):
        records = tuple(
            RecordSpec(1_700_000_000_000 + j, b"k%d" % j, bytes(j % 251 for _ in range(j * 37)), ())
            for j in range(1 + i * 3)
        )
        out.append(build(BatchSpec(records=records, codec=codec, base_offset=i)))
    return out


def expected(buf: bytes, max_batch_bytes: int) -> tuple[int, int, int, int] | None:
    """What the fast path must return: ``check_batch``'s verdict, for one whole batch."""
    try:
        h = check_batch(buf, max_batch_bytes=max_batch_bytes)
    except RecordBatchError:
        return None
    if h.size != len(buf):
        return None
    return h.batch_length, h.last_offset_delta, h.max_timestamp, h.records_count


def mutant(index: int, base: list[bytes]) -> bytes:
    rng = random.Random(f"{SEED}:{index}")
    buf = rng.choice(base)
    kind = rng.randrange(5)
    if kind == 0:
        field = rng.choice(sorted(EDGE_VALUES))
        buf = patch_header(buf, **{field: rng.choice(EDGE_VALUES[field])})
        return reseal(buf) if field not in ("batch_length", "crc") and rng.random() < 0.8 else buf
    if kind == 1:
        b = bytearray(buf)
        b[rng.randrange(len(b))] ^= 1 << rng.randrange(8)
        return bytes(b)
    if kind == 2:
        return buf[: rng.randrange(len(buf))]
    if kind == 3:
        return buf + bytes(rng.randrange(1, 80))
    return buf + buf  # two whole batches are not one


def test_valid_batches_pass_with_their_fields() -> None:
    for buf in corpus():
        got = check_whole_batch(memoryview(buf))
        assert got is not None
        assert got == expected(buf, MAX_BATCH_BYTES)


@pytest.mark.parametrize("limit", [MAX_BATCH_BYTES, 200, BATCH_OVERHEAD])
def test_the_size_limit_is_check_batch_s(limit: int) -> None:
    for buf in corpus():
        assert check_whole_batch(memoryview(buf), limit) == expected(buf, limit)


def test_mutants_agree_with_check_batch() -> None:
    base = corpus()
    verdicts = {True: 0, False: 0}
    for i in range(MUTANTS):
        buf = mutant(i, base)
        want = expected(buf, MAX_BATCH_BYTES)
        got = check_whole_batch(memoryview(buf))
        assert got == want, f"mutant {SEED}:{i}: fast path {got}, check_batch {want}"
        verdicts[got is not None] += 1
    # Both outcomes occur, so the comparison means something either way.
    assert verdicts[True] > 50, verdicts
    assert verdicts[False] > 1_000, verdicts
