"""Leader epochs and replica appends of :class:`PartitionLog`: the stamping of appended
batches, copying a leader's batches as they are (and refusing those that do not continue the
log), the epoch history (built from the batch headers, kept current, the same after a
restart, a truncation and retention) and ``end_offset_for_epoch`` (Kafka's
OffsetForLeaderEpoch).
"""

from __future__ import annotations

import asyncio
import errno
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tidewire.errors import (
    BackpressureError,
    CorruptBatchError,
    RecordBatchError,
    ReplicaAppendError,
    StorageError,
    TidewireError,
)
from tidewire.records import BatchBuilder, iter_batches
from tidewire.storage import FaultFS, FileSystem, FsyncPolicy, LogConfig, OsFileSystem, PartitionLog
from tidewire.storage.epochs import UNDEFINED, EpochHistory
from tidewire.storage.fs import write_atomic
from tidewire.storage.log import EPOCH_FILE
from tidewire.storage.segment import PREFIX

T0 = 1_700_000_000_000


def batch(n: int = 2, tag: int = 0) -> bytes:
    """A producer's batch of ``n`` records."""
    b = BatchBuilder()
    for i in range(n):
        b.append(f"v{tag}-{i}".encode() * 5, timestamp_ms=T0 + i, key=b"k")
    return b.build()


def config(**overrides: Any) -> LogConfig:
    return LogConfig(fsync=FsyncPolicy.INTERVAL, index_interval_bytes=256, **overrides)


def open_log(fs: FileSystem, d: str, **kw: Any) -> PartitionLog:
    cfg = kw.pop("cfg", None) or config()
    return PartitionLog.open(fs, d, cfg, clock=lambda: T0, **kw)


def read_all(plog: PartitionLog) -> bytes:
    """Every batch of the log, as :meth:`PartitionLog.read` returns them."""
    out = bytearray()
    offset = plog.log_start_offset
    for _ in range(10_000):
        r = plog.read(offset, 4096)
        if not r.data:
            return bytes(out)
        out += r.data
        offset = r.next_offset
    raise AssertionError("read did not reach the end")


def epochs_of(data: bytes) -> list[tuple[int, int]]:
    """``(base offset, epoch)`` of every batch in ``data``."""
    return [(h.base_offset, h.partition_leader_epoch) for _, h in iter_batches(data)]


def log_files(fs: FileSystem, d: str) -> dict[str, bytes]:
    return {n: fs.read_file(f"{d}/{n}") for n in sorted(fs.listdir(d)) if n.endswith(".log")}


@pytest.fixture(params=["osfs", "faultfs"])
def fs_dir(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[FileSystem, str]]:
    if request.param == "osfs":
        yield OsFileSystem(), str(tmp_path)
    else:
        yield FaultFS(), "/data"


def leader_with_epochs(
    fs: FileSystem, d: str, plan: list[tuple[int, int]], **kw: Any
) -> PartitionLog:
    """A log with ``count`` one-record batches in each ``(epoch, count)`` of ``plan``."""
    plog = open_log(fs, d, **kw)
    tag = 0
    for epoch, count in plan:
        plog.set_leader_epoch(epoch)
        for _ in range(count):
            plog.append(batch(1, tag))
            tag += 1
    return plog


# --- stamping -------------------------------------------------------------------------------------


def test_single_node_log_stamps_epoch_0_and_writes_no_epoch_file(
    fs_dir: tuple[FileSystem, str],
) -> None:
    fs, d = fs_dir
    plog = open_log(fs, d)
    assert plog.leader_epoch == 0
    plog.append(batch())
    assert epochs_of(read_all(plog)) == [(0, 0)]
    plog.close()
    assert EPOCH_FILE not in fs.listdir(d)


def test_set_leader_epoch_stamps_later_batches_and_survives_restart(
    fs_dir: tuple[FileSystem, str],
) -> None:
    fs, d = fs_dir
    plog = open_log(fs, d)
    plog.append(batch(2))
    plog.set_leader_epoch(3)
    assert plog.leader_epoch == 3
    plog.append(batch(3))
    plog.set_leader_epoch(3)  # the same again: nothing changes
    with pytest.raises(ValueError, match="epochs only go up"):
        plog.set_leader_epoch(2)
    assert epochs_of(read_all(plog)) == [(0, 0), (2, 3)]
    assert list(plog.epoch_history()) == [(0, 0), (3, 2)]
    plog.abandon()  # a crash: the active segment is scanned on open, epochs checked
    plog = open_log(fs, d)
    assert plog.report.truncated_from_offset is None
    assert plog.log_end_offset == 5
    assert plog.leader_epoch == 3
    assert epochs_of(read_all(plog)) == [(0, 0), (2, 3)]
    assert list(plog.epoch_history()) == [(0, 0), (3, 2)]
    plog.close()


def test_without_the_epoch_file_a_later_epoch_is_not_accepted(tmp_path: Path) -> None:
    """What the epoch file is for: a batch of an epoch above the bound is a torn tail."""
    fs, d = OsFileSystem(), str(tmp_path)
    plog = open_log(fs, d)
    plog.append(batch())
    plog.set_leader_epoch(1)
    plog.append(batch())
    plog.abandon()
    fs.remove(f"{d}/{EPOCH_FILE}")
    plog = open_log(fs, d)
    assert plog.report.truncated_from_offset == 2
    assert plog.log_end_offset == 2
    plog.close()


def test_a_new_segment_takes_the_epoch(fs_dir: tuple[FileSystem, str]) -> None:
    fs, d = fs_dir
    plog = open_log(fs, d, cfg=config(segment_bytes=1024))
    plog.set_leader_epoch(2)
    for i in range(30):
        plog.append(batch(2, i))
    assert plog.segment_count > 2
    assert {e for _, e in epochs_of(read_all(plog))} == {2}
    plog.close()
    plog = open_log(fs, d, cfg=config(segment_bytes=1024), clean=True)
    assert {e for _, e in epochs_of(read_all(plog))} == {2}
    plog.close()


# --- replica appends ------------------------------------------------------------------------------


def test_follower_equals_leader_byte_for_byte(fs_dir: tuple[FileSystem, str]) -> None:
    fs, d = fs_dir
    cfg = config(segment_bytes=2048)
    leader = leader_with_epochs(fs, f"{d}/leader", [(0, 5), (1, 7), (4, 20), (5, 3)], cfg=cfg)
    follower = open_log(fs, f"{d}/follower", cfg=cfg)

    async def copy() -> None:
        offset = 0
        for _ in range(1000):
            r = leader.read(offset, 700)
            if not r.data:
                return
            infos = await follower.append_replica_async(r.data)
            assert infos[0].base_offset == offset
            offset = r.next_offset

    asyncio.run(copy())
    assert follower.log_end_offset == leader.log_end_offset
    assert read_all(follower) == read_all(leader)
    assert list(follower.epoch_history()) == list(leader.epoch_history())
    assert follower.leader_epoch == 5
    history = list(leader.epoch_history())
    assert [e for e, _ in history] == [0, 1, 4, 5]
    for e in range(-1, 7):
        assert follower.end_offset_for_epoch(e) == leader.end_offset_for_epoch(e)
    leader.close()
    follower.close()
    assert log_files(fs, f"{d}/follower") == log_files(fs, f"{d}/leader")
    follower = open_log(fs, f"{d}/follower", cfg=cfg)  # and it recovers as it was written
    assert list(follower.epoch_history()) == history
    follower.close()


def test_sync_append_replica(fs_dir: tuple[FileSystem, str]) -> None:
    fs, d = fs_dir
    leader = leader_with_epochs(fs, f"{d}/leader", [(2, 3), (3, 2)])
    follower = open_log(fs, f"{d}/follower")
    data = read_all(leader)
    infos = follower.append_replica(data)
    assert [i.base_offset for i in infos] == [b for b, _ in epochs_of(data)]
    assert follower.append_replica(b"") == []
    assert read_all(follower) == data
    assert follower.leader_epoch == 3
    leader.close()
    follower.close()


def test_durable_replica_append(fs_dir: tuple[FileSystem, str]) -> None:
    fs, d = fs_dir
    leader = leader_with_epochs(fs, f"{d}/leader", [(1, 4)])
    follower = open_log(fs, f"{d}/follower")

    async def go() -> None:
        await follower.append_replica_async(read_all(leader), durable=True)

    asyncio.run(go())
    assert follower.flushed_offset == follower.log_end_offset == leader.log_end_offset
    leader.close()
    follower.close()


def _refused(
    follower: PartitionLog, data: bytes, error: type[Exception], match: str | None
) -> None:
    """``data`` is refused, with nothing stored, sync and async."""
    end, size = follower.log_end_offset, follower.size_bytes
    history = list(follower.epoch_history())
    with pytest.raises(error, match=match):
        follower.append_replica(data)

    async def go() -> None:
        with pytest.raises(error, match=match):
            await follower.append_replica_async(data)

    asyncio.run(go())
    assert (follower.log_end_offset, follower.size_bytes) == (end, size)
    assert list(follower.epoch_history()) == history


def test_replica_append_refusals(fs_dir: tuple[FileSystem, str]) -> None:
    fs, d = fs_dir
    leader = leader_with_epochs(fs, f"{d}/leader", [(1, 3), (2, 3), (3, 2)])
    data = read_all(leader)
    spans = [(pos, h) for pos, h in iter_batches(data)]
    follower = open_log(fs, f"{d}/follower")
    cut = spans[2][0]  # offsets 0.. of the first two batches
    follower.append_replica(data[:cut])
    end = follower.log_end_offset
    rest = data[cut:]
    # A gap: the batch after the next one.
    _refused(
        follower, data[spans[3][0] :], ReplicaAppendError, rf"starts at offset \d+ but .* at {end}"
    )
    # An overlap: from the start again.
    _refused(follower, data, ReplicaAppendError, rf"starts at offset 0 but .* continues at {end}")
    # A good batch followed by a bad one: nothing stored.
    bad_second = bytearray(rest)
    second = spans[3][0] - cut
    bad_second[second : second + 8] = (999).to_bytes(8, "big")
    _refused(follower, bytes(bad_second), ReplicaAppendError, "batch 2 starts at offset 999")
    # A corrupt batch (a flipped bit under the CRC), even after good ones.
    corrupt = bytearray(rest)
    corrupt[-3] ^= 0x10
    _refused(follower, bytes(corrupt), CorruptBatchError, "CRC")
    # Cut short.
    _refused(follower, rest[:-5], RecordBatchError, None)
    # A lower epoch than the log's last batch.
    follower.append_replica(rest)  # epochs 2 and 3 now
    lower = bytearray(batch(1))
    lower[: PREFIX.size] = PREFIX.pack(follower.log_end_offset, len(lower) - 12, 2)
    _refused(follower, bytes(lower), ReplicaAppendError, "leader epoch 2, below 3")
    # A lower epoch within the data.
    two = bytearray(lower)
    two[: PREFIX.size] = PREFIX.pack(follower.log_end_offset, len(lower) - 12, 5)
    nxt = bytearray(lower)
    nxt[: PREFIX.size] = PREFIX.pack(follower.log_end_offset + 1, len(lower) - 12, 4)
    _refused(follower, bytes(two + nxt), ReplicaAppendError, "leader epoch 4, below 5")
    assert follower.leader_epoch == 3  # nothing refused raised it
    assert read_all(follower) == data
    leader.close()
    follower.close()


def test_replica_append_after_a_local_leader_epoch(fs_dir: tuple[FileSystem, str]) -> None:
    """A former leader cut back to where the new leader's epochs go on takes batches of an
    epoch below the one it led in (the new leader never saw that one)."""
    fs, d = fs_dir
    new_leader = leader_with_epochs(fs, f"{d}/a", [(1, 3), (2, 2), (6, 2)])
    old_leader = leader_with_epochs(fs, f"{d}/b", [(1, 3), (5, 4)])
    assert old_leader.epoch_history() is not None
    # KIP-101: the follower asks for the end of its latest epoch (5): the new leader answers
    # with its largest epoch <= 5 (2) and that epoch's end.
    answer = new_leader.end_offset_for_epoch(old_leader.epoch_history().latest)
    assert answer == (2, 5)
    own_epoch, own_end = old_leader.end_offset_for_epoch(answer[0])
    assert (own_epoch, own_end) == (1, 3)
    old_leader.truncate_to(min(own_end, answer[1]))
    assert list(old_leader.epoch_history()) == [(1, 0)]
    r = new_leader.read(3, 1 << 20)
    old_leader.append_replica(r.data)
    assert read_all(old_leader) == read_all(new_leader)
    assert list(old_leader.epoch_history()) == list(new_leader.epoch_history())
    assert old_leader.leader_epoch == 6
    new_leader.close()
    old_leader.close()
    old_leader = open_log(fs, f"{d}/b")
    assert read_all(old_leader) == read_all(open_log(fs, f"{d}/a"))
    old_leader.close()


# --- the epoch history ----------------------------------------------------------------------------


def test_history_only_holds_epochs_with_batches(fs_dir: tuple[FileSystem, str]) -> None:
    fs, d = fs_dir
    plog = open_log(fs, d)
    assert list(plog.epoch_history()) == []
    plog.set_leader_epoch(1)
    plog.set_leader_epoch(2)
    assert list(plog.epoch_history()) == []
    plog.append(batch(2))
    plog.set_leader_epoch(4)
    assert list(plog.epoch_history()) == [(2, 0)]
    plog.append(batch(1))
    plog.append(batch(1))
    assert list(plog.epoch_history()) == [(2, 0), (4, 2)]
    plog.close()
    plog = open_log(fs, d)
    assert list(plog.epoch_history()) == [(2, 0), (4, 2)]
    plog.close()


def test_history_is_a_copy(fs_dir: tuple[FileSystem, str]) -> None:
    fs, d = fs_dir
    plog = leader_with_epochs(fs, d, [(1, 2), (2, 2)])
    h = plog.epoch_history()
    h.truncate_to(0)
    assert list(plog.epoch_history()) == [(1, 0), (2, 2)]
    plog.close()


@pytest.mark.parametrize("segment_bytes", [1024, 1 << 20])
def test_history_is_rebuilt_the_same(fs_dir: tuple[FileSystem, str], segment_bytes: int) -> None:
    """Kept current while appending (epochs changing inside segments and at their starts),
    the history equals the one rebuilt from the headers after a clean and a crashed stop."""
    fs, d = fs_dir
    cfg = config(segment_bytes=segment_bytes)
    plan = [(0, 4), (1, 1), (3, 9), (4, 1), (7, 12), (8, 2)]
    plog = open_log(fs, d, cfg=cfg)
    plog.epoch_history()  # built first, then kept current by the appends
    tag = 0
    for epoch, count in plan:
        plog.set_leader_epoch(epoch)
        for _ in range(count):
            plog.append(batch(2, tag))
            tag += 1
    kept = list(plog.epoch_history())
    assert [e for e, _ in kept] == [e for e, _ in plan]
    assert kept == [(e, b) for b, e in _first_of_each_epoch(read_all(plog))]
    plog.close()
    for clean in (True, False):
        plog = open_log(fs, d, cfg=cfg, clean=clean)
        assert list(plog.epoch_history()) == kept
        if clean:
            plog.close()
        else:
            plog.abandon()


def _first_of_each_epoch(data: bytes) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    for base, epoch in epochs_of(data):
        if not out or out[-1][1] != epoch:
            out.append((base, epoch))
    return out


def test_truncate_drops_epochs_starting_at_or_after_the_end(fs_dir: tuple[FileSystem, str]) -> None:
    fs, d = fs_dir
    plog = leader_with_epochs(fs, d, [(1, 3), (2, 3), (3, 3)])
    starts = list(plog.epoch_history())
    e3_start = starts[2][1]
    e2_start = starts[1][1]
    plog.truncate_to(e3_start + 1)  # inside epoch 3: it stays
    assert list(plog.epoch_history()) == starts
    plog.truncate_to(e3_start)  # at epoch 3's start: it goes
    assert list(plog.epoch_history()) == starts[:2]
    assert plog.end_offset_for_epoch(3) == (2, e3_start)
    plog.truncate_to(e2_start + 1)
    plog.append(batch(1))  # stamped 3 still: epoch 3 starts again at the new end
    end = plog.log_end_offset
    assert list(plog.epoch_history()) == [*starts[:2], (3, end - 1)]
    plog.close()
    plog = open_log(fs, d)
    assert list(plog.epoch_history()) == [*starts[:2], (3, end - 1)]
    plog.close()


def test_history_after_retention(fs_dir: tuple[FileSystem, str]) -> None:
    fs, d = fs_dir
    cfg = config(segment_bytes=1024, retention_bytes=2048, retention_ms=-1)
    plog = leader_with_epochs(fs, d, [(1, 20), (2, 20)], cfg=cfg)
    plog.epoch_history()
    assert plog.apply_retention()
    start = plog.log_start_offset
    kept = list(plog.epoch_history())
    assert kept[0][1] == start
    plog.close()
    plog = open_log(fs, d, cfg=cfg)
    assert list(plog.epoch_history()) == kept
    plog.close()


# --- end_offset_for_epoch -------------------------------------------------------------------------


def test_end_offset_for_epoch(fs_dir: tuple[FileSystem, str]) -> None:
    fs, d = fs_dir
    plog = leader_with_epochs(fs, d, [(2, 2), (3, 3), (6, 1)])
    h = plog.epoch_history()
    (_, s2), (_, s3), (_, s6) = list(h)
    end = plog.log_end_offset
    assert plog.end_offset_for_epoch(1) == UNDEFINED  # older than every epoch
    assert plog.end_offset_for_epoch(2) == (2, s3)
    assert plog.end_offset_for_epoch(3) == (3, s6)
    assert plog.end_offset_for_epoch(5) == (3, s6)  # never held 4 or 5: the one before
    assert plog.end_offset_for_epoch(6) == (6, end)  # the latest ends at the log end
    assert plog.end_offset_for_epoch(9) == (6, end)
    plog.set_leader_epoch(8)  # a leader of 8 that appended nothing yet
    assert plog.end_offset_for_epoch(8) == (6, end)
    plog.append(batch(1))
    assert plog.end_offset_for_epoch(6) == (6, end)
    assert plog.end_offset_for_epoch(8) == (8, end + 1)
    assert s2 == 0
    plog.close()


def test_empty_log(fs_dir: tuple[FileSystem, str]) -> None:
    fs, d = fs_dir
    plog = open_log(fs, d)
    assert plog.end_offset_for_epoch(0) == UNDEFINED
    assert isinstance(plog.epoch_history(), EpochHistory)
    plog.close()


# --- crashes --------------------------------------------------------------------------------------


def _replica_batch(base: int, epoch: int, tag: int) -> bytes:
    data = bytearray(batch(1, tag))
    data[: PREFIX.size] = PREFIX.pack(base, len(data) - 12, epoch)
    return bytes(data)


def _epoch_scenario(fs: FaultFS, flushed: list[int]) -> None:
    """Appends, epoch changes and replica appends, each step flushed; ``flushed`` gets the
    log end each flush made durable. Stops at the first failure (the power cut)."""
    try:
        plog = open_log(fs, "/p", cfg=config(segment_bytes=1024))
        for step in range(8):
            if step in {2, 5}:
                plog.set_leader_epoch(plog.leader_epoch + 2)
            if step in {3, 6}:
                end = plog.log_end_offset
                plog.append_replica(
                    _replica_batch(end, plog.leader_epoch + 1, step)
                    + _replica_batch(end + 1, plog.leader_epoch + 1, step + 100)
                )
            else:
                plog.append(batch(1, step))
                plog.append(batch(2, step))
            plog.flush()
            flushed.append(plog.log_end_offset)
        plog.close()
    except (OSError, TidewireError):
        pass


def test_power_cut_at_every_operation_keeps_epochs_verifiable() -> None:
    """A new epoch is durable before any batch carrying it: wherever power is cut, recovery
    finds no damage, keeps what was flushed and rebuilds a history that matches the batches."""
    dry = FaultFS()
    _epoch_scenario(dry, [])
    for cut_at in range(1, dry.ops + 2):
        for mode in ("lose", "torn"):
            fs = FaultFS()
            fs.cut_at = cut_at
            flushed: list[int] = []
            _epoch_scenario(fs, flushed)
            survivor = fs.power_cut(random.Random(cut_at), mode=mode)
            where = f"cut_at={cut_at}/{dry.ops} mode={mode}"
            plog = open_log(survivor, "/p", cfg=config(segment_bytes=1024))
            assert not plog.report.damage, where
            assert plog.log_end_offset >= (flushed[-1] if flushed else 0), where
            data = read_all(plog)
            assert [e for _, e in epochs_of(data)] == sorted(e for _, e in epochs_of(data)), where
            assert all(e <= plog.leader_epoch for _, e in epochs_of(data)), where
            history = [(e, b) for b, e in _first_of_each_epoch(data)]
            assert list(plog.epoch_history()) == history, where
            plog.close()


def test_an_unreadable_epoch_file_loses_nothing(fs_dir: tuple[FileSystem, str]) -> None:
    """Every batch is accepted, appends go on with the last batch's epoch, and the file is
    written again."""
    fs, d = fs_dir
    plog = leader_with_epochs(fs, d, [(1, 3), (4, 2)])
    plog.set_leader_epoch(6)  # set but no batch of it yet
    data = read_all(plog)
    plog.abandon()
    write_atomic(fs, f"{d}/{EPOCH_FILE}", b"garbage")
    plog = open_log(fs, d)
    assert not plog.report.damage
    assert read_all(plog) == data
    assert plog.leader_epoch == 4
    plog.append(batch(1))
    assert epochs_of(read_all(plog))[-1] == (5, 4)
    plog.set_leader_epoch(6)
    plog.abandon()
    plog = open_log(fs, d)
    assert plog.leader_epoch == 6
    assert list(plog.epoch_history()) == [(1, 0), (4, 3)]
    plog.close()


def test_a_segment_made_active_again_takes_the_epoch(fs_dir: tuple[FileSystem, str]) -> None:
    """Truncation back into an older segment: what is appended there carries (and verifies
    with) the log's epoch, not the one that segment had when it was rolled."""
    fs, d = fs_dir
    cfg = config(segment_bytes=1024)
    plog = leader_with_epochs(fs, d, [(1, 30), (2, 30)], cfg=cfg)
    assert plog.segment_count > 3
    plog.set_leader_epoch(3)
    plog.truncate_to(5)
    assert plog.segment_count == 1
    plog.append(batch(1))
    plog.append_replica(_replica_batch(plog.log_end_offset, 4, 1))
    assert epochs_of(plog.read(5).data) == [(5, 3), (6, 4)]
    assert not plog.damage
    plog.abandon()
    plog = open_log(fs, d, cfg=cfg)
    assert epochs_of(read_all(plog))[-2:] == [(5, 3), (6, 4)]
    assert list(plog.epoch_history()) == [(1, 0), (3, 5), (4, 6)]
    plog.close()


def test_a_failed_replica_write_is_undone_whole() -> None:
    fs = FaultFS()
    cfg = config(segment_bytes=1024)
    leader = leader_with_epochs(fs, "/leader", [(1, 10), (2, 25)], cfg=cfg)
    data = read_all(leader)
    follower = open_log(fs, "/follower", cfg=cfg)
    follower.append_replica(data[: _cut(data, 8)])
    before = (follower.log_end_offset, follower.size_bytes, list(follower.epoch_history()))
    rest = data[_cut(data, 8) :]
    fs.fail_kinds["write"] = errno.EIO
    with pytest.raises(StorageError):
        follower.append_replica(rest)

    async def go() -> None:
        with pytest.raises(StorageError):
            await follower.append_replica_async(rest)

    asyncio.run(go())
    del fs.fail_kinds["write"]
    assert (follower.log_end_offset, follower.size_bytes, list(follower.epoch_history())) == before
    follower.append_replica(rest)
    assert read_all(follower) == data
    assert list(follower.epoch_history()) == list(leader.epoch_history())
    leader.close()
    follower.close()


def _cut(data: bytes, n: int) -> int:
    """The byte position of the ``n``-th batch of ``data``."""
    return [pos for pos, _ in iter_batches(data)][n]


def test_replica_append_backpressure(fs_dir: tuple[FileSystem, str]) -> None:
    fs, d = fs_dir
    leader = leader_with_epochs(fs, f"{d}/leader", [(1, 5)])
    follower = open_log(fs, f"{d}/follower", cfg=config(max_pending_appends=4))

    async def go() -> None:
        with pytest.raises(BackpressureError, match="5 more exceed max_pending_appends=4"):
            await follower.append_replica_async(read_all(leader), durable=True)
        assert follower.log_end_offset == 0
        await follower.append_replica_async(read_all(leader))  # not waiting for an fsync

    asyncio.run(go())
    assert follower.log_end_offset == 5
    leader.close()
    follower.close()


def test_history_walks_past_a_damaged_range(tmp_path: Path) -> None:
    """A flipped bit in the length of a batch in the middle of an epoch: the walk jumps over
    the damaged range (instead of following the wrong length) and the history is the same."""
    fs, d = OsFileSystem(), str(tmp_path)
    plog = leader_with_epochs(fs, d, [(1, 4), (2, 4), (3, 4)])
    kept = list(plog.epoch_history())
    data = read_all(plog)
    plog.close()
    pos = _cut(data, 5)  # the second batch of epoch 2
    path = f"{d}/{0:020d}.log"
    raw = bytearray(fs.read_file(path))
    raw[pos + 10] ^= 0x01  # batch_length, outside the CRC
    with open(path, "r+b") as f:
        f.write(raw)
    plog = open_log(fs, d, recovery_point=12)  # scanned, the flip found below the point
    assert [(x.start, x.end) for x in plog.damage] == [(5, 6)]
    assert list(plog.epoch_history()) == kept
    plog.close()
