"""Metadata files survive a power cut at every step of their writing.

For ``write_atomic`` and for every metadata file the storage engine writes — a log's
``log.json``, the ``recovery-point-offset-checkpoint``, the ``.clean-shutdown`` marker (written
at close, removed at open), and a sealed segment's ``.index`` / ``.timeindex`` — power is cut
at each operation the write takes (1..N, and once after it completed), and what survives is
checked in every cut mode (lose, torn, garbage): each file is the complete old one or the
complete new one, never a mix, never missing when an old one existed; after the write
completed, the new one. The data directory then opens, and its logs read back whole.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest

from tests.storage.history import make_batch, read_all
from tidewire.errors import TidewireError
from tidewire.storage import (
    FaultFS,
    FsyncPolicy,
    LogConfig,
    LogManager,
    PartitionLog,
    write_atomic,
)
from tidewire.storage.manager import CLEAN_SHUTDOWN_FILE, LOG_CONFIG_FILE, RECOVERY_CHECKPOINT_FILE

MODES = ("lose", "torn", "garbage")
#: Torn and garbage modes draw the kept prefix at random: a few draws per cut.
DRAWS = 4
DATA = "/data"
CFG = LogConfig(fsync=FsyncPolicy.ALWAYS, segment_bytes=1024, index_interval_bytes=64)
OTHER_CFG = LogConfig(fsync=FsyncPolicy.INTERVAL, segment_bytes=2048, flush_interval_ms=5)


@dataclass(frozen=True)
class Case:
    """One metadata write.

    ``prepare`` builds the state before it on a fresh file system (deterministically: the
    same operations each time) and returns what ``write`` needs; ``check`` (optional) looks
    at a file system that survived a cut, given whether the write had completed.
    """

    name: str
    paths: tuple[str, ...]
    prepare: Callable[[FaultFS], Any]
    write: Callable[[Any], None]
    check: Callable[[FaultFS, bool], None] | None = None


def _contents(fs: FaultFS, path: str) -> bytes | None:
    return fs.contents(path) if path in fs.files() else None


def crash_at_every_step(case: Case) -> int:
    """Cut power at every operation of ``case.write``; check the survivors. Returns N."""
    ref = FaultFS()
    ctx = case.prepare(ref)
    start = ref.ops
    old = {p: _contents(ref, p) for p in case.paths}
    case.write(ctx)
    steps = ref.ops - start
    new = {p: _contents(ref, p) for p in case.paths}
    assert steps > 0, f"{case.name}: the write took no operation"
    assert old != new, f"{case.name}: the write changed nothing"
    rng = random.Random(case.name)
    for step in range(1, steps + 2):  # steps + 1: the write completed, then power went
        fs = FaultFS()
        ctx = case.prepare(fs)
        assert fs.ops == start, f"{case.name}: prepare is not deterministic"
        completed = step > steps
        fs.cut_at = None if completed else start + step
        try:
            case.write(ctx)
        except (OSError, TidewireError):
            assert not completed
        for mode in MODES:
            for _ in range(1 if mode == "lose" else DRAWS):
                where = f"{case.name}: cut at step {step}/{steps}, mode={mode}"
                survivor = fs.power_cut(rng, mode=mode)
                for p in case.paths:
                    got = _contents(survivor, p)
                    if completed:
                        assert got == new[p], f"{where}: {p} is not the new file: {got!r}"
                    else:
                        assert got in (old[p], new[p]), f"{where}: {p} is partial: {got!r}"
                if case.check is not None:
                    try:
                        case.check(survivor, completed)
                    except Exception as exc:
                        exc.add_note(where)
                        raise
    return steps


# --- write_atomic -------------------------------------------------------------------------------


def _dir(fs: FaultFS) -> FaultFS:
    fs.makedirs("/d")
    return fs


def _with_old(fs: FaultFS) -> FaultFS:
    write_atomic(_dir(fs), "/d/f", b"the old contents, " * 20)
    return fs


def _with_old_and_stale_tmp(fs: FaultFS) -> FaultFS:
    _with_old(fs)
    # What an earlier crash left: a durable, longer temp file.
    f = fs.open("/d/f.tmp")
    f.pwritev([b"stale temp file " * 64], 0)
    f.sync()
    fs.sync_dir("/d")
    return fs


WRITE_ATOMIC_CASES = [
    Case("write_atomic new", ("/d/f",), _dir, lambda fs: write_atomic(fs, "/d/f", b"new" * 50)),
    Case(
        "write_atomic replace",
        ("/d/f",),
        _with_old,
        lambda fs: write_atomic(fs, "/d/f", b"the new contents" * 9),
    ),
    Case(
        "write_atomic replace over a stale temp file",
        ("/d/f",),
        _with_old_and_stale_tmp,
        lambda fs: write_atomic(fs, "/d/f", b"new"),
    ),
    Case(
        "write_atomic replace with empty",
        ("/d/f",),
        _with_old,
        lambda fs: write_atomic(fs, "/d/f", b""),
    ),
]


@pytest.mark.parametrize("case", WRITE_ATOMIC_CASES, ids=lambda c: c.name)
def test_write_atomic_leaves_the_old_or_the_new_file(case: Case) -> None:
    # (temp create,) truncate, write, sync, rename, directory sync
    assert crash_at_every_step(case) == (5 if "stale" in case.name else 6)


# --- the log manager's files --------------------------------------------------------------------


def _manager(fs: FaultFS) -> LogManager:
    return LogManager(DATA, fs=fs, default_config=CFG, clock=lambda: 1_700_000_000_000)


def _opens(survivor: FaultFS) -> LogManager:
    """The data directory opens; every log reads back."""
    mgr = _manager(survivor).open()
    for plog in mgr.logs.values():
        read_all(plog)
        assert plog.corruption is None
    return mgr


def _fill(plog: PartitionLog, n: int, tag: str) -> None:
    for i in range(n):
        plog.append(make_batch([f"{tag}-{i}".encode() * 10]))
    plog.flush()


def _open_manager(fs: FaultFS) -> LogManager:
    return _manager(fs).open()


def _manager_with_log(fs: FaultFS) -> LogManager:
    mgr = _manager(fs).open()
    _fill(mgr.create_log("t", 0, OTHER_CFG), 5, "t")
    return mgr


def _manager_with_checkpoint(fs: FaultFS) -> LogManager:
    mgr = _manager_with_log(fs)
    mgr.write_recovery_checkpoint()
    _fill(mgr.get_log("t", 0), 3, "more")
    return mgr


def _manager_with_logs(fs: FaultFS) -> LogManager:
    mgr = _manager_with_log(fs)
    _fill(mgr.create_log("u", 0), 12, "u")  # several segments
    return mgr


def _closed_cleanly(fs: FaultFS) -> FaultFS:
    _manager_with_logs(fs).close()
    return fs


def _check_config(survivor: FaultFS, completed: bool) -> None:
    mgr = _opens(survivor)
    path = f"{DATA}/t-0/{LOG_CONFIG_FILE}"
    if completed or _contents(survivor, path) is not None:
        assert mgr.get_log("t", 0).config == OTHER_CFG


def _check_new_config(survivor: FaultFS, completed: bool) -> None:
    config = _opens(survivor).get_log("t", 0).config
    assert config == CFG if completed else config in (CFG, OTHER_CFG)


def _check_checkpoint(survivor: FaultFS, completed: bool) -> None:
    raw = _contents(survivor, f"{DATA}/{RECOVERY_CHECKPOINT_FILE}")
    if raw is not None:
        points = json.loads(raw)["logs"]
        assert points["t-0"] in (5, 8), points
    mgr = _opens(survivor)
    assert [v for _, v in read_all(mgr.get_log("t", 0))][:5] == [b"t-%d" % i * 10 for i in range(5)]


def _check_marker(survivor: FaultFS, completed: bool) -> None:
    marker = _contents(survivor, f"{DATA}/{CLEAN_SHUTDOWN_FILE}") is not None
    mgr = _opens(survivor)
    assert mgr.was_clean == marker
    assert marker or not completed
    if marker:
        # The marker promises a complete close: every log whole, every index trusted.
        assert len(read_all(mgr.get_log("u", 0))) == 12
        for plog in mgr.logs.values():
            assert plog.report.scanned_segments == 0, plog.report


def _reopen_and_append(fs: FaultFS) -> None:
    mgr = _manager(fs).open()
    plog = mgr.get_log("u", 0)
    plog.append(make_batch([b"after the clean open"]))
    plog.flush()


def _check_reopened(survivor: FaultFS, completed: bool) -> None:
    marker = _contents(survivor, f"{DATA}/{CLEAN_SHUTDOWN_FILE}") is not None
    mgr = _opens(survivor)
    records = read_all(mgr.get_log("u", 0))
    if marker:
        # Still marked clean: then nothing was written since the clean close.
        assert len(records) == 12
        assert all(p.report.scanned_segments == 0 for p in mgr.logs.values())
    if completed:
        assert not marker
        assert len(records) == 13


MANAGER_CASES = [
    Case(
        "log.json at create_log",
        (f"{DATA}/t-0/{LOG_CONFIG_FILE}",),
        _open_manager,
        lambda mgr: mgr.create_log("t", 0, OTHER_CFG),
        _check_config,
    ),
    Case(
        "log.json at set_config",
        (f"{DATA}/t-0/{LOG_CONFIG_FILE}",),
        _manager_with_log,
        lambda mgr: mgr.set_config("t", 0, CFG),
        _check_new_config,
    ),
    Case(
        "first recovery checkpoint",
        (f"{DATA}/{RECOVERY_CHECKPOINT_FILE}",),
        _manager_with_log,
        lambda mgr: mgr.write_recovery_checkpoint(),
        _check_checkpoint,
    ),
    Case(
        "recovery checkpoint rewritten",
        (f"{DATA}/{RECOVERY_CHECKPOINT_FILE}",),
        _manager_with_checkpoint,
        lambda mgr: mgr.write_recovery_checkpoint(),
        _check_checkpoint,
    ),
    Case(
        ".clean-shutdown written at close",
        (f"{DATA}/{CLEAN_SHUTDOWN_FILE}", f"{DATA}/{RECOVERY_CHECKPOINT_FILE}"),
        _manager_with_logs,
        lambda mgr: mgr.close(),
        _check_marker,
    ),
    Case(
        ".clean-shutdown removed at open, before the first write",
        (f"{DATA}/{CLEAN_SHUTDOWN_FILE}",),
        _closed_cleanly,
        _reopen_and_append,
        _check_reopened,
    ),
]


@pytest.mark.parametrize("case", MANAGER_CASES, ids=lambda c: c.name)
def test_manager_metadata_is_the_old_or_the_new_file(case: Case) -> None:
    assert crash_at_every_step(case) > 0


# --- sealed segment indexes ---------------------------------------------------------------------

LOG = "/p"


def _seg(base: int, suffix: str) -> str:
    return f"{LOG}/{base:020d}{suffix}"


def _log_rolled_unflushed(fs: FaultFS) -> PartitionLog:
    plog = PartitionLog.open(fs, LOG, CFG)
    while plog.segment_count < 2:
        plog.append(make_batch([b"r%d" % plog.log_end_offset * 30]))
    return plog


def _log_flushed_active(fs: FaultFS) -> PartitionLog:
    plog = _log_rolled_unflushed(fs)
    _fill(plog, 2, "active")
    return plog


def _log_reopened_clean(fs: FaultFS) -> PartitionLog:
    _log_flushed_active(fs).close()
    plog = PartitionLog.open(fs, LOG, CFG, clean=True)
    assert plog.report.scanned_segments == 0
    plog.append(make_batch([b"after the clean open"]))
    plog.flush()
    return plog


def _index_paths(base: int) -> tuple[str, str]:
    return (_seg(base, ".index"), _seg(base, ".timeindex"))


def _check_log(expected: int) -> Callable[[FaultFS, bool], None]:
    def check(survivor: FaultFS, completed: bool) -> None:
        plog = PartitionLog.open(survivor, LOG, CFG)
        records = read_all(plog)
        assert plog.corruption is None
        if completed:
            assert len(records) == expected
        plog.close()
        again = PartitionLog.open(survivor, LOG, CFG, clean=True)
        assert read_all(again) == records
        assert again.report.scanned_segments == 0, again.report

    return check


def _first_roll_base() -> int:
    return _log_rolled_unflushed(FaultFS()).segment_bases[1]


ROLL = _first_roll_base()

INDEX_CASES = [
    Case(
        "sealed indexes written by the flush after a roll",
        _index_paths(0),
        _log_rolled_unflushed,
        lambda plog: plog.flush(),
        _check_log(ROLL + 1),
    ),
    Case(
        "active segment's indexes written at close",
        _index_paths(ROLL),
        _log_flushed_active,
        lambda plog: plog.close(),
        _check_log(ROLL + 3),
    ),
    Case(
        "stale indexes rewritten at close after a clean reopen and an append",
        _index_paths(ROLL),
        _log_reopened_clean,
        lambda plog: plog.close(),
        _check_log(ROLL + 4),
    ),
]


@pytest.mark.parametrize("case", INDEX_CASES, ids=lambda c: c.name)
def test_sealed_indexes_are_the_old_or_the_new_files(case: Case) -> None:
    assert crash_at_every_step(case) > 0
