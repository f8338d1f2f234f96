"""Mutation fuzzing of :func:`decode_batch`: damaged batches are refused with a record-batch
error naming the fault, or decode to exactly the original records.

Every mutant is derived from ``random.Random(f"{SEED}:{index}")``, so a failure names the
seed and index and :func:`mutant` rebuilds that one input on its own.
"""

from __future__ import annotations

import random
import struct
from collections import Counter
from functools import cache
from typing import Final

import pytest

from tests.records._batches import (
    SUPPORTED_CODECS,
    BatchSpec,
    RecordSpec,
    build,
    expected_records,
    relative,
    reseal,
)
from tidewire.errors import (
    BatchLengthError,
    CorruptBatchError,
    InvalidMagicError,
    InvalidRecordError,
    RecordBatchError,
    RecordCountError,
    UnsupportedCompressionError,
)
from tidewire.records import (
    BATCH_OVERHEAD,
    BatchHeader,
    Codec,
    Record,
    decode_batch,
    iter_records,
)

SEED: Final = 20240611
CORPUS_SIZE: Final = 50
MUTANTS: Final = 10_000
RESEALED_MUTANTS: Final = 6_000

ACCEPTED: Final = "accepted"
Outcome = type[RecordBatchError] | str

# header regions (see the layout in tidewire/records/batch.py)
BASE_OFFSET = range(8)
BATCH_LENGTH = range(8, 12)
LEADER_EPOCH = range(12, 16)
MAGIC_BYTE = 16
CRC_FIELD = range(17, 21)
ATTRIBUTES = range(21, 23)
LAST_OFFSET_DELTA = range(23, 27)
RECORDS_COUNT = range(57, 61)
# fields inside the CRC that must survive any accepted mutation unchanged
CRC_COVERED_FIELDS = (
    "batch_length",
    "magic",
    "crc",
    "attributes",
    "last_offset_delta",
    "first_timestamp",
    "max_timestamp",
    "producer_id",
    "producer_epoch",
    "base_sequence",
    "records_count",
)


# --- the corpus ---------------------------------------------------------------------------------


def _payload(rng: random.Random) -> bytes | None:
    kind = rng.randrange(5)
    if kind == 0:
        return None
    if kind == 1:
        return rng.randbytes(rng.randint(0, 40))  # incompressible
    if kind == 2:
        return b"tidewire " * rng.randint(1, 30)  # compressible
    if kind == 3:
        return bytes(rng.randint(0, 400))
    return f"event-{rng.randint(0, 10**6)}".encode()


def _spec(i: int) -> BatchSpec:
    rng = random.Random(f"{SEED}:corpus:{i}")
    with_headers = (i // len(SUPPORTED_CODECS)) % 2 == 1
    n = 0 if i < len(SUPPORTED_CODECS) else rng.randint(1, 12)  # one empty batch per codec
    base_ts = rng.randint(0, 2_000_000_000_000)
    records = tuple(
        RecordSpec(
            timestamp=base_ts + rng.randint(-5_000, 5_000),  # not monotonic
            key=_payload(rng) if rng.random() < 0.7 else None,
            value=_payload(rng),
            headers=tuple(
                (rng.choice(["", "trace-id", "content-type", "ünïcødé", "k"]), _payload(rng))
                for _ in range(rng.randint(1, 3) if with_headers else 0)
            ),
        )
        for _ in range(n)
    )
    return BatchSpec(
        records=records,
        codec=SUPPORTED_CODECS[i % len(SUPPORTED_CODECS)],
        producer_id=rng.choice([-1, rng.randint(0, 2**63 - 1)]),
        producer_epoch=rng.choice([-1, rng.randint(0, 2**15 - 1)]),
        base_sequence=rng.choice([-1, rng.randint(0, 2**31 - 1)]),
        partition_leader_epoch=rng.randint(-1, 1_000),
        timestamp_type=rng.randint(0, 1),
        base_offset=rng.randint(0, 2**40),
    )


@cache
def corpus() -> tuple[tuple[BatchSpec, bytes], ...]:
    return tuple((spec, build(spec)) for spec in map(_spec, range(CORPUS_SIZE)))


def test_corpus_is_varied() -> None:
    specs = [spec for spec, _ in corpus()]
    assert {s.codec for s in specs} == set(SUPPORTED_CODECS)
    for codec in SUPPORTED_CODECS:
        mine = [s for s in specs if s.codec is codec]
        assert any(r.headers for s in mine for r in s.records)
        assert any(not r.headers for s in mine for r in s.records)
        assert any(not s.records for s in mine)
    for spec, batch in corpus():
        assert decode_batch(batch)[1] == expected_records(spec)


# --- mutations ----------------------------------------------------------------------------------

KINDS: Final = ("bitflip", "overwrite", "truncate", "insert", "length", "append")


def mutant(index: int) -> tuple[int, str, int, bytes]:
    """Return ``(corpus index, kind, position, bytes)`` of mutant number ``index``."""
    rng = random.Random(f"{SEED}:{index}")
    which = rng.randrange(CORPUS_SIZE)
    _, batch = corpus()[which]
    kind = KINDS[index % len(KINDS)]
    buf = bytearray(batch)
    pos = rng.randrange(len(buf))
    if kind == "bitflip":
        buf[pos] ^= 1 << rng.randrange(8)
    elif kind == "overwrite":
        buf[pos] = (buf[pos] + rng.randint(1, 255)) % 256
    elif kind == "truncate":
        del buf[pos:]
    elif kind == "insert":
        pos = rng.randrange(len(buf) + 1)
        buf[pos:pos] = rng.randbytes(rng.randint(1, 16))
    elif kind == "length":
        old = len(batch) - 12
        new = old
        while new == old:
            new = rng.choice(
                [
                    rng.randint(-(2**31), 2**31 - 1),
                    old + rng.randint(-64, 64),
                    rng.randint(0, BATCH_OVERHEAD),
                ]
            )
        struct.pack_into(">i", buf, 8, new)
        pos = 8
    else:  # append
        pos = len(buf)
        buf += rng.randbytes(rng.randint(1, 32))
    return which, kind, pos, bytes(buf)


def allowed_outcomes(kind: str, pos: int, original: bytes) -> set[Outcome]:
    """What decode_batch may answer to a mutation of ``kind`` at ``pos``."""
    if kind in ("truncate", "append") or (kind == "insert" and pos == len(original)):
        return {BatchLengthError}
    if kind == "length" or (kind in ("bitflip", "overwrite") and pos in BATCH_LENGTH):
        return {BatchLengthError, RecordCountError, CorruptBatchError}
    if kind == "insert":
        if pos >= BATCH_OVERHEAD:  # the header is intact; the records shifted
            return {CorruptBatchError}
        if pos >= ATTRIBUTES.start:  # header fields inside the CRC shifted
            return {CorruptBatchError, UnsupportedCompressionError, RecordCountError}
        return {
            BatchLengthError,
            RecordCountError,
            CorruptBatchError,
            InvalidMagicError,
            UnsupportedCompressionError,
        }
    # one byte changed
    if pos in BASE_OFFSET or pos in LEADER_EPOCH:  # outside the CRC
        return {ACCEPTED}
    if pos == MAGIC_BYTE:
        return {InvalidMagicError}
    if pos in CRC_FIELD:
        return {CorruptBatchError}
    if pos in ATTRIBUTES:
        return {CorruptBatchError, UnsupportedCompressionError, RecordCountError}
    if pos in LAST_OFFSET_DELTA or pos in RECORDS_COUNT:
        return {CorruptBatchError, RecordCountError}
    return {CorruptBatchError}


def check_accepted(spec: BatchSpec, original: bytes, mut: bytes, where: str) -> None:
    """An accepted mutant differs from the original only outside the CRC."""
    h, records = decode_batch(mut)
    orig_h, _ = decode_batch(original)
    for field in CRC_COVERED_FIELDS:
        assert getattr(h, field) == getattr(orig_h, field), f"{where}: {field} changed"
    assert relative(records, h.base_offset) == relative(expected_records(spec), spec.base_offset)
    if spec.codec is Codec.NONE:
        # re-encode what was decoded, with the original header fields: the same bytes but for
        # the base offset and the leader epoch
        rebuilt = build(
            spec._replace(
                records=tuple(RecordSpec(r.timestamp, r.key, r.value, r.headers) for r in records)
            )
        )
        assert mut[8:12] == rebuilt[8:12], where
        assert mut[16:] == rebuilt[16:], where


def test_mutants_are_refused_with_the_right_error_or_decode_unchanged() -> None:
    seen: Counter[Outcome] = Counter()
    by_kind: dict[str, Counter[Outcome]] = {k: Counter() for k in KINDS}
    ran = 0
    for index in range(MUTANTS):
        which, kind, pos, mut = mutant(index)
        spec, original = corpus()[which]
        where = f"seed={SEED} index={index} (corpus {which}, {kind} at byte {pos})"
        outcome: Outcome
        try:
            decode_batch(mut)
        except RecordBatchError as exc:
            outcome = type(exc)
        except Exception as exc:  # any other exception out of the decoder is a bug
            pytest.fail(f"{where}: {type(exc).__name__}: {exc}")
        else:
            outcome = ACCEPTED
            check_accepted(spec, original, mut, where)
        allowed = allowed_outcomes(kind, pos, original)
        name = getattr(outcome, "__name__", outcome)
        assert outcome in allowed, f"{where}: got {name}, expected one of {allowed}"
        seen[outcome] += 1
        by_kind[kind][outcome] += 1
        ran += 1

    assert ran == MUTANTS
    assert sum(seen.values()) == MUTANTS
    # every kind of fault was met, and each kind of mutation gave its own error
    for expected in (
        ACCEPTED,
        BatchLengthError,
        CorruptBatchError,
        InvalidMagicError,
        RecordCountError,
        UnsupportedCompressionError,
    ):
        assert seen[expected] > 0, f"no mutant gave {expected}: {seen}"
    assert set(by_kind["truncate"]) == {BatchLengthError}
    assert set(by_kind["append"]) == {BatchLengthError}
    assert by_kind["bitflip"][CorruptBatchError] > by_kind["bitflip"].total() // 2
    assert by_kind["bitflip"][InvalidMagicError] > 0


def test_specific_single_byte_mutations() -> None:
    spec, batch = corpus()[CORPUS_SIZE - 1]
    assert spec.records

    def flip(pos: int, mask: int = 0x01) -> bytes:
        buf = bytearray(batch)
        buf[pos] ^= mask
        return bytes(buf)

    cases: list[tuple[bytes, type[RecordBatchError]]] = [
        (batch[: len(batch) // 2], BatchLengthError),  # truncated
        (batch[:30], BatchLengthError),  # not even a header
        (flip(len(batch) - 1), CorruptBatchError),  # a record byte
        (flip(40), CorruptBatchError),  # a header byte inside the CRC
        (flip(MAGIC_BYTE), InvalidMagicError),
        (flip(RECORDS_COUNT.start, 0x80), RecordCountError),  # negative count
        (flip(ATTRIBUTES.stop - 1, spec.codec ^ 0x07), UnsupportedCompressionError),  # codec id 7
        (batch + b"\x00", BatchLengthError),
    ]
    for mut, error in cases:
        with pytest.raises(error):
            decode_batch(mut)
    # outside the CRC: accepted, and only the base offset / leader epoch moves
    h, records = decode_batch(flip(7))
    assert h.base_offset == spec.base_offset ^ 1
    assert relative(records, h.base_offset) == relative(expected_records(spec), spec.base_offset)
    h, _ = decode_batch(flip(15))
    assert h.partition_leader_epoch == spec.partition_leader_epoch ^ 1


# --- mutants with a valid CRC: the record parser and the decompressors ---------------------------


def resealed_mutant(index: int) -> tuple[int, str, bytes]:
    """Mutate inside the CRC-covered region, then fix the length and CRC so the record parser
    and the decompressors, not the CRC check, have to catch the damage."""
    rng = random.Random(f"{SEED}:resealed:{index}")
    which = rng.randrange(CORPUS_SIZE)
    _, batch = corpus()[which]
    buf = bytearray(batch)
    # mostly the records section; sometimes the header fields inside the CRC
    lo = ATTRIBUTES.start if rng.random() < 0.2 else BATCH_OVERHEAD
    if len(buf) == lo:
        lo = ATTRIBUTES.start
    pos = rng.randrange(lo, len(buf))
    kind = rng.choice(("bitflip", "overwrite", "truncate", "insert", "delete", "append"))
    if kind == "bitflip":
        buf[pos] ^= 1 << rng.randrange(8)
    elif kind == "overwrite":
        buf[pos] = rng.randrange(256)
    elif kind == "truncate":
        del buf[pos:]
    elif kind == "insert":
        buf[pos:pos] = rng.randbytes(rng.randint(1, 8))
    elif kind == "delete":
        del buf[pos : pos + rng.randint(1, 8)]
    else:
        buf += rng.randbytes(rng.randint(1, 8))
    if len(buf) < BATCH_OVERHEAD:
        buf += bytes(BATCH_OVERHEAD - len(buf))
    return which, kind, reseal(buf)


def check_well_formed(decoded: tuple[BatchHeader, list[Record]], where: str) -> None:
    """What the decoder promises about any batch it accepts."""
    h, records = decoded
    assert len(records) == h.records_count, where
    offsets = [r.offset for r in records]
    assert offsets == sorted(set(offsets)), where
    assert all(h.base_offset <= o <= h.last_offset for o in offsets), where
    for r in records:
        assert all(isinstance(k, str) for k, _ in r.headers), where


def test_resealed_mutants_raise_only_record_batch_errors() -> None:
    seen: Counter[Outcome] = Counter()
    for index in range(RESEALED_MUTANTS):
        which, kind, mut = resealed_mutant(index)
        where = f"seed={SEED} resealed index={index} (corpus {which}, {kind})"
        try:
            decoded = decode_batch(mut, decompression_limit=1 << 20)
        except RecordBatchError as exc:
            seen[type(exc)] += 1
            continue
        except Exception as exc:  # any other exception out of the decoder is a bug
            pytest.fail(f"{where}: {type(exc).__name__}: {exc}")
        seen[ACCEPTED] += 1
        check_well_formed(decoded, where)
        assert list(iter_records(mut, decompression_limit=1 << 20)) == decoded[1], where
    assert seen.total() == RESEALED_MUTANTS
    assert seen[CorruptBatchError] == 0  # every mutant was resealed
    for expected in (InvalidRecordError, RecordCountError, ACCEPTED):
        assert seen[expected] > 0, f"no resealed mutant gave {expected}: {seen}"
