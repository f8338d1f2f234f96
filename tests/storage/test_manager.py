"""The log manager: a data directory of partition logs.

Creating, finding, listing and deleting logs; refusing bad names, duplicates and unknown logs;
each log's configuration persisted; the clean-shutdown marker and the recovery checkpoint that
decide how the next open recovers; interval flushes driven by explicit monotonic times.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import errno
import functools
import json
import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tidewire.errors import (
    BatchTooLargeError,
    InvalidConfigError,
    LogExistsError,
    LogNotFoundError,
    NotLeaderError,
    PartitionCorruptError,
    StorageError,
)
from tidewire.records import build_batch
from tidewire.storage import (
    FaultFS,
    FileSystem,
    FsyncPolicy,
    LogConfig,
    LogManager,
    OsFileSystem,
    PartitionLog,
    validate_topic_name,
)
from tidewire.storage.flusher import set_flush_executor
from tidewire.storage.manager import (
    CLEAN_SHUTDOWN_FILE,
    LOG_CONFIG_FILE,
    MAX_PARTITION,
    RECOVERY_CHECKPOINT_FILE,
)

T0 = 1_700_000_000_000


@dataclass
class Env:
    fs: FileSystem
    data_dir: str

    def manager(self, **kwargs: Any) -> LogManager:
        kwargs.setdefault("clock", lambda: T0)
        return LogManager(self.data_dir, fs=self.fs, **kwargs)

    def names(self) -> list[str]:
        return self.fs.listdir(self.data_dir)

    def write(self, path: str, data: bytes) -> None:
        f = self.fs.open(f"{self.data_dir}/{path}")
        f.truncate(0)
        f.pwritev([data], 0)
        f.close()

    def read(self, path: str) -> bytes:
        return self.fs.read_file(f"{self.data_dir}/{path}")


@pytest.fixture(params=["faultfs", "osfs"])
def env(request: pytest.FixtureRequest, tmp_path: Path) -> Env:
    if request.param == "faultfs":
        return Env(FaultFS(), "/data")
    return Env(OsFileSystem(), str(tmp_path / "data"))


@pytest.fixture
def opened(env: Env) -> Iterator[LogManager]:
    mgr = env.manager().open()
    yield mgr
    mgr.close()


def batch(n: int = 1) -> bytes:
    return build_batch([f"v{i}".encode() for i in range(n)], timestamp_ms=T0)


def crash(mgr: LogManager) -> None:
    """Drop a manager without closing anything: what a killed process leaves."""
    mgr.abandon()


# --- creating, finding, listing -------------------------------------------------------------------


def test_create_get_and_list(env: Env, opened: LogManager) -> None:
    a0 = opened.create_log("orders", 0)
    a2 = opened.create_log("orders", 2)
    b1 = opened.create_log("audit.v1_x-y", 1)
    assert opened.get_log("orders", 0) is a0
    assert opened.get_log("orders", 2) is a2
    assert opened.get_log("audit.v1_x-y", 1) is b1
    assert opened.topics() == {"audit.v1_x-y": [1], "orders": [0, 2]}
    assert {"orders-0", "orders-2", "audit.v1_x-y-1"} <= set(env.names())
    assert LOG_CONFIG_FILE in env.fs.listdir(a0.directory)
    assert a0.append(batch(3)).base_offset == 0
    assert a0.append(batch()).base_offset == 3
    assert a2.log_end_offset == 0


def test_logs_are_found_again_after_reopen(env: Env) -> None:
    mgr = env.manager().open()
    mgr.create_log("a-1", 3).append(batch(2))  # a topic name that ends like a partition
    mgr.create_log("b", 0).append(batch(5))
    mgr.close()
    mgr = env.manager().open()
    assert mgr.topics() == {"a-1": [3], "b": [0]}
    assert mgr.get_log("a-1", 3).log_end_offset == 2
    assert mgr.get_log("b", 0).log_end_offset == 5
    mgr.close()


@pytest.mark.parametrize(
    "name",
    ["", ".", "..", "a/b", "../x", "a b", "naïve", "tab\t", "nul\x00", "x" * 201, "a:b", "*"],
)
def test_invalid_topic_names_are_refused(env: Env, opened: LogManager, name: str) -> None:
    before = env.names()
    with pytest.raises(InvalidConfigError):
        validate_topic_name(name)
    with pytest.raises(InvalidConfigError):
        opened.create_log(name, 0)
    assert env.names() == before
    assert opened.topics() == {}


def test_valid_topic_name_limits(opened: LogManager) -> None:
    for name in ("x" * 200, "a", "A.b_c-D9", "...", "-"):
        validate_topic_name(name)
    opened.create_log("x" * 200, 0)
    assert opened.topics() == {"x" * 200: [0]}


@pytest.mark.parametrize("partition", [-1, MAX_PARTITION, 2**63, True, False, "0", 1.0, None])
def test_invalid_partitions_are_refused(env: Env, opened: LogManager, partition: Any) -> None:
    before = env.names()
    with pytest.raises(InvalidConfigError):
        opened.create_log("t", partition)
    assert env.names() == before


def test_highest_partition_is_accepted(opened: LogManager) -> None:
    opened.create_log("t", MAX_PARTITION - 1)
    assert opened.topics() == {"t": [MAX_PARTITION - 1]}


def test_duplicate_create_is_refused(opened: LogManager) -> None:
    plog = opened.create_log("t", 0)
    plog.append(batch(4))
    with pytest.raises(LogExistsError):
        opened.create_log("t", 0)
    with pytest.raises(LogExistsError):
        opened.create_log("t", 0, LogConfig(segment_bytes=4096))
    assert opened.get_log("t", 0) is plog
    assert plog.log_end_offset == 4
    assert plog.config == LogConfig()


def test_unknown_logs(opened: LogManager) -> None:
    opened.create_log("t", 0)
    for topic, partition in (("t", 1), ("u", 0), ("T", 0)):
        with pytest.raises(LogNotFoundError):
            opened.get_log(topic, partition)
    with pytest.raises(LogNotFoundError):
        opened.delete_topic("u")
    with pytest.raises(LogNotFoundError):
        opened.set_config("u", 0, LogConfig())


def test_operations_need_an_open_manager(env: Env) -> None:
    mgr = env.manager()
    with pytest.raises(StorageError):
        mgr.create_log("t", 0)
    mgr.open()
    mgr.create_log("t", 0)
    mgr.close()
    with pytest.raises(StorageError):
        mgr.create_log("u", 0)
    with pytest.raises(StorageError):
        mgr.delete_topic("t")
    mgr.close()  # a second close does nothing


# --- deleting -------------------------------------------------------------------------------------


def test_delete_topic(env: Env, opened: LogManager) -> None:
    for p in range(3):
        opened.create_log("doomed", p).append(batch(p + 1))
    keep = opened.create_log("kept", 0)
    keep.append(batch(2))
    dirs = [opened.get_log("doomed", p).directory for p in range(3)]
    assert opened.delete_topic("doomed") == [0, 1, 2]
    for d in dirs:
        assert not env.fs.exists(d)
    assert not any(n.startswith("doomed") for n in env.names())
    assert opened.topics() == {"kept": [0]}
    with pytest.raises(LogNotFoundError):
        opened.get_log("doomed", 0)
    with pytest.raises(LogNotFoundError):
        opened.delete_topic("doomed")
    assert keep.read(0).data
    fresh = opened.create_log("doomed", 1)  # the name can be used again, from offset 0
    assert fresh.log_end_offset == 0
    assert fresh.append(batch()).base_offset == 0


def test_deleted_topic_stays_deleted_after_reopen(env: Env) -> None:
    mgr = env.manager().open()
    mgr.create_log("doomed", 0).append(batch())
    mgr.create_log("kept", 0).append(batch())
    mgr.delete_topic("doomed")
    mgr.close()
    mgr = env.manager().open()
    assert mgr.topics() == {"kept": [0]}
    checkpoint = json.loads(env.read(RECOVERY_CHECKPOINT_FILE))
    assert "doomed-0" not in checkpoint["logs"]
    mgr.close()


def test_leftover_delete_directories_are_removed_on_open(env: Env) -> None:
    mgr = env.manager().open()
    mgr.create_log("t", 0).append(batch(3))
    mgr.create_log("u", 0).append(batch(3))
    mgr.close()
    # a crash between the rename and the removal of a deleted partition
    env.fs.rename(f"{env.data_dir}/u-0", f"{env.data_dir}/u-0.0123456789abcdef-delete")
    env.fs.makedirs(f"{env.data_dir}/v-7.ffff-delete")
    env.write("v-7.ffff-delete/00000000000000000000.log", b"partial")
    env.write("notes.txt", b"not a log")  # names that are not logs are left alone
    mgr = env.manager().open()
    names = env.names()
    assert not any(n.endswith("-delete") for n in names)
    assert "notes.txt" in names
    assert mgr.topics() == {"t": [0]}
    assert mgr.get_log("t", 0).log_end_offset == 3
    mgr.close()


# --- configuration --------------------------------------------------------------------------------


CUSTOM = LogConfig(
    segment_bytes=4096,
    segment_ms=60_000,
    retention_ms=-1,
    retention_bytes=10_000,
    fsync=FsyncPolicy.ALWAYS,
    flush_interval_ms=7,
    index_interval_bytes=128,
    max_batch_bytes=2048,
    max_pending_appends=3,
)


def test_log_config_is_persisted_and_reloaded(env: Env) -> None:
    default = LogConfig(fsync=FsyncPolicy.NEVER, segment_bytes=8192)
    mgr = env.manager(default_config=default).open()
    mgr.create_log("custom", 0, CUSTOM)
    mgr.create_log("plain", 0)
    assert mgr.get_log("custom", 0).config == CUSTOM
    assert mgr.get_log("plain", 0).config == default
    stored = json.loads(env.read(f"custom-0/{LOG_CONFIG_FILE}"))
    assert LogConfig.from_dict(stored) == CUSTOM
    assert stored["fsync"] == "always"
    mgr.close()
    mgr = env.manager().open()  # another default: each log keeps its own settings
    assert mgr.get_log("custom", 0).config == CUSTOM
    assert mgr.get_log("plain", 0).config == default
    mgr.close()


def test_set_config_takes_effect_and_persists(env: Env) -> None:
    mgr = env.manager().open()
    plog = mgr.create_log("t", 0)
    plog.append(batch())
    mgr.set_config("t", 0, CUSTOM)
    assert plog.config == CUSTOM
    with pytest.raises(BatchTooLargeError, match="max_batch_bytes=2,048"):
        plog.append(build_batch([bytes(3000)], timestamp_ms=T0))
    assert LogConfig.from_dict(json.loads(env.read(f"t-0/{LOG_CONFIG_FILE}"))) == CUSTOM
    assert not any(n.endswith(".tmp") for n in env.fs.listdir(plog.directory))
    mgr.close()
    mgr = env.manager().open()
    assert mgr.get_log("t", 0).config == CUSTOM
    mgr.close()


@pytest.mark.parametrize(
    "content",
    [b"{not json", b'{"segment_bytes": 1}', b'{"colour": "blue"}', b'{"fsync": "sometimes"}'],
)
def test_unreadable_log_config_takes_only_its_partition_offline(
    env: Env, content: bytes, caplog: pytest.LogCaptureFixture
) -> None:
    mgr = env.manager().open()
    mgr.create_log("t", 0).append(batch(3))
    mgr.create_log("t", 1).append(batch(2))
    mgr.create_log("u", 0).append(batch())
    mgr.close()
    env.write(f"t-0/{LOG_CONFIG_FILE}", content)
    mgr = env.manager().open()
    assert set(mgr.offline) == {("t", 0)}
    assert LOG_CONFIG_FILE in mgr.offline[("t", 0)]
    assert any("partition t-0 is offline" in r.getMessage() for r in caplog.records)
    assert mgr.topics() == {"t": [0, 1], "u": [0]}
    with pytest.raises(LogNotFoundError):
        mgr.get_log("t", 0)
    assert mgr.get_log("t", 1).read(0).data
    with pytest.raises(LogExistsError):
        mgr.create_log("t", 0)
    mgr.close()
    # not opened, so not recovered: no clean-shutdown marker; its recovery point is kept
    assert CLEAN_SHUTDOWN_FILE not in env.names()
    points = json.loads(env.read(RECOVERY_CHECKPOINT_FILE))["logs"]
    assert points["t-0"] == 3
    env.write(f"t-0/{LOG_CONFIG_FILE}", b"{}")  # repaired: the defaults
    mgr = env.manager().open()
    assert mgr.offline == {}
    assert mgr.get_log("t", 0).log_end_offset == 3
    assert mgr.delete_topic("t") == [0, 1]
    mgr.close()


# --- clean shutdown and the recovery checkpoint ---------------------------------------------------


def test_clean_shutdown_marker(env: Env) -> None:
    mgr = env.manager().open()
    assert not mgr.was_clean  # a new data directory
    mgr.create_log("t", 0).append(batch(2))
    assert CLEAN_SHUTDOWN_FILE not in env.names()
    mgr.close()
    assert CLEAN_SHUTDOWN_FILE in env.names()

    mgr = env.manager().open()
    assert mgr.was_clean
    assert CLEAN_SHUTDOWN_FILE not in env.names(), "the marker must go before the first write"
    assert mgr.get_log("t", 0).report.clean
    assert mgr.get_log("t", 0).report.scanned_segments == 0
    mgr.get_log("t", 0).append(batch())
    crash(mgr)

    mgr = env.manager().open()
    assert not mgr.was_clean
    plog = mgr.get_log("t", 0)
    assert not plog.report.clean
    assert plog.report.scanned_segments == 1
    assert plog.log_end_offset == 3
    mgr.close()
    assert CLEAN_SHUTDOWN_FILE in env.names()


def test_no_marker_when_a_log_is_corrupt(env: Env, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.CRITICAL, logger="tidewire.storage")
    mgr = env.manager(default_config=LogConfig(segment_bytes=1024)).open()
    plog = mgr.create_log("t", 0)
    while plog.segment_count < 3:
        plog.append(batch(20))
    mgr.create_log("fine", 0).append(batch())
    mgr.close()
    path = f"t-0/{0:020d}.log"
    data = bytearray(env.read(path))
    data[100] ^= 0x01
    env.write(path, bytes(data))
    mgr = env.manager().open()
    plog = mgr.get_log("t", 0)
    with pytest.raises(PartitionCorruptError):
        plog.read(0)
    assert plog.corruption is not None
    mgr.close()
    assert CLEAN_SHUTDOWN_FILE not in env.names()
    assert RECOVERY_CHECKPOINT_FILE in env.names()


def test_recovery_checkpoint(env: Env) -> None:
    mgr = env.manager(default_config=LogConfig(fsync=FsyncPolicy.INTERVAL)).open()
    a = mgr.create_log("a", 0)
    b = mgr.create_log("b", 3)
    a.append(batch(4))
    b.append(batch(2))
    a.flush()
    b.append(batch(2))
    mgr.write_recovery_checkpoint()
    assert json.loads(env.read(RECOVERY_CHECKPOINT_FILE)) == {
        "version": 1,
        "logs": {"a-0": 4, "b-3": 0},
    }
    mgr.close()
    assert json.loads(env.read(RECOVERY_CHECKPOINT_FILE)) == {
        "version": 1,
        "logs": {"a-0": 4, "b-3": 4},
    }


def _tear_last_batch(env: Env, log_dir: str) -> None:
    path = f"{log_dir}/{0:020d}.log"
    data = env.read(path)
    env.write(path, data[:-5])
    env.fs.remove(f"{env.data_dir}/{CLEAN_SHUTDOWN_FILE}")


def test_checkpoint_makes_a_torn_tail_below_it_corruption(
    env: Env, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.CRITICAL, logger="tidewire.storage")
    mgr = env.manager().open()
    mgr.create_log("t", 0).append(batch(3))
    mgr.get_log("t", 0).append(batch(2))
    mgr.close()  # checkpoint: t-0 flushed to 5
    _tear_last_batch(env, "t-0")
    mgr = env.manager().open()
    plog = mgr.get_log("t", 0)
    assert plog.corruption is not None
    assert (plog.corruption.offset, plog.corruption.position) == (3, len(batch(3)))
    assert plog.report.truncated_bytes == 0
    with pytest.raises(PartitionCorruptError):
        plog.read(3)
    assert plog.append(batch()).base_offset == 5  # writes go on past the damage
    assert plog.read(0).data
    crash(mgr)


@pytest.mark.parametrize("checkpoint", [None, b"garbage", b'{"version": 2, "logs": {}}', b"[]"])
def test_without_a_usable_checkpoint_a_torn_tail_is_cut(
    env: Env, checkpoint: bytes | None, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.CRITICAL, logger="tidewire.storage")
    mgr = env.manager().open()
    mgr.create_log("t", 0).append(batch(3))
    mgr.get_log("t", 0).append(batch(2))
    mgr.close()
    _tear_last_batch(env, "t-0")
    if checkpoint is None:
        env.fs.remove(f"{env.data_dir}/{RECOVERY_CHECKPOINT_FILE}")
    else:
        env.write(RECOVERY_CHECKPOINT_FILE, checkpoint)
    mgr = env.manager().open()
    plog = mgr.get_log("t", 0)
    assert plog.corruption is None
    assert (plog.report.truncated_bytes, plog.report.truncated_from_offset) == (
        len(batch(2)) - 5,
        3,
    )
    assert plog.append(batch()).base_offset == 3
    mgr.close()


# --- background work ------------------------------------------------------------------------------


def test_flush_due_flushes_interval_logs_on_their_schedule(env: Env) -> None:
    mgr = env.manager().open()
    fast = mgr.create_log("fast", 0, LogConfig(fsync=FsyncPolicy.INTERVAL, flush_interval_ms=100))
    slow = mgr.create_log("slow", 0, LogConfig(fsync=FsyncPolicy.INTERVAL, flush_interval_ms=1000))
    never = mgr.create_log("never", 0, LogConfig(fsync=FsyncPolicy.NEVER))
    for plog in (fast, slow, never):
        plog.append(batch(2))

    def tick(now: float) -> int:
        return asyncio.run(mgr.flush_due(now))

    assert tick(500.0) == 0  # the first tick starts every log's schedule
    assert tick(500.099) == 0
    assert fast.flushed_offset == 0
    assert tick(500.1) == 1
    assert (fast.flushed_offset, slow.flushed_offset, never.flushed_offset) == (2, 0, 0)
    assert tick(500.25) == 0  # nothing new to flush
    fast.append(batch())
    assert tick(500.3) == 1  # its last flush was 0.2 s ago: due at once
    assert fast.flushed_offset == 3
    fast.append(batch())
    assert tick(500.35) == 0  # flushed 0.05 s ago
    assert tick(500.45) == 1
    assert fast.flushed_offset == 4
    assert tick(501.0) == 1  # slow is due
    assert (slow.flushed_offset, never.flushed_offset) == (2, 0)
    fast.append(batch())
    slow.append(batch())
    assert tick(502.0) == 2
    assert (fast.flushed_offset, slow.flushed_offset, never.flushed_offset) == (5, 3, 0)
    mgr.close()
    assert never.flushed_offset == 2  # only the close flushes a never log


def test_only_interval_logs_wake_the_background_loop(env: Env) -> None:
    """An append marks its log for the manager's background loop (which wakes for it) only
    under ``interval``: ``always`` logs flush themselves, ``never`` logs only at close, so
    marking them woke that loop for every message for nothing."""
    mgr = env.manager().open()
    woken: list[tuple[str, int]] = []
    mark = mgr._mark_unflushed

    def counting(key: tuple[str, int]) -> None:
        woken.append(key)
        mark(key)

    mgr._mark_unflushed = counting  # type: ignore[method-assign]
    logs = {
        policy: mgr.create_log(str(policy), 0, LogConfig(fsync=policy)) for policy in FsyncPolicy
    }
    woken.clear()
    for _ in range(3):
        for plog in logs.values():
            plog.append(batch())
        logs[FsyncPolicy.INTERVAL].flush()
        asyncio.run(mgr.flush_due())  # what the loop does when woken: settles what it saw
    assert woken == [("interval", 0)] * 3
    # A log switched to interval with unflushed data is marked, then by its appends.
    mgr.set_config("never", 0, LogConfig(fsync=FsyncPolicy.INTERVAL))
    logs[FsyncPolicy.NEVER].append(batch())
    assert woken[3:]
    assert set(woken[3:]) == {("never", 0)}
    mgr.close()


def test_flush_due_skips_a_failed_log(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.CRITICAL, logger="tidewire.storage")
    fs = FaultFS()
    mgr = LogManager("/data", fs=fs, clock=lambda: T0).open()
    cfg = LogConfig(fsync=FsyncPolicy.INTERVAL, flush_interval_ms=10)
    bad = mgr.create_log("bad", 0, cfg)
    good = mgr.create_log("good", 0, cfg)
    bad.append(batch())
    good.append(batch())
    assert asyncio.run(mgr.flush_due(0.0)) == 0
    bad.flush()  # in sync: nothing left to flush
    bad.append(batch())
    fs.fail_kinds["sync"] = errno.EIO
    assert asyncio.run(mgr.flush_due(1.0)) == 2  # both due; both fail, and it is logged
    assert bad.failed is not None
    del fs.fail_kinds["sync"]
    assert good.failed is not None  # it failed too: same disk
    assert asyncio.run(mgr.flush_due(2.0)) == 0  # failed logs are not retried as if healthy
    mgr.close()  # the failure was reported when it happened; the close only notes it
    assert CLEAN_SHUTDOWN_FILE not in fs.listdir("/data")
    mgr = LogManager("/data", fs=fs, clock=lambda: T0).open()
    assert not mgr.was_clean
    assert mgr.get_log("bad", 0).failed is None  # reopened and recovered: writable again
    assert mgr.get_log("bad", 0).append(batch()).base_offset == 2
    mgr.close()


def test_apply_retention_for_every_log(env: Env) -> None:
    cfg = LogConfig(segment_bytes=1024, retention_bytes=0, retention_ms=-1)
    mgr = env.manager(default_config=cfg).open()
    a = mgr.create_log("a", 0)
    mgr.create_log("b", 0).append(batch())
    while a.segment_count < 4:
        a.append(batch(20))
    bases = a.segment_bases
    assert mgr.apply_retention(T0) == {("a", 0): bases[:-1]}
    assert a.log_start_offset == bases[-1]
    assert mgr.apply_retention(T0) == {}
    mgr.close()


def test_async_context_manager(env: Env) -> None:
    async def run() -> None:
        cfg = LogConfig(fsync=FsyncPolicy.ALWAYS)
        async with env.manager(default_config=cfg) as mgr:
            plog = mgr.create_log("t", 0)
            info = await plog.append_async(batch(2))
            assert info.last_offset < plog.flushed_offset
        assert plog.closed

    asyncio.run(run())
    assert CLEAN_SHUTDOWN_FILE in env.names()
    mgr = env.manager().open()
    assert mgr.was_clean
    assert mgr.get_log("t", 0).log_end_offset == 2
    mgr.close()


def test_manager_opens_logs_with_partition_log(env: Env) -> None:
    mgr = env.manager().open()
    assert isinstance(mgr.create_log("t", 0), PartitionLog)
    mgr.close()


def test_delete_before_drops_only_whole_segments_below_the_offset(env: Env) -> None:
    mgr = env.manager(default_config=LogConfig(segment_bytes=1024, retention_ms=-1)).open()
    a = mgr.create_log("a", 0)
    while a.segment_count < 4:
        a.append(batch(20))
    bases = a.segment_bases
    # An offset inside the third segment: the first two go, the third holds records below it
    # and stays.
    assert a.delete_before(bases[2] + 1) == bases[:2]
    assert a.segment_bases == bases[2:]
    assert a.log_start_offset == bases[2]
    assert a.delete_before(bases[2]) == []
    # Past the end: every segment but the active one.
    assert a.delete_before(a.log_end_offset + 5) == [bases[2]]
    assert a.segment_bases == [bases[3]]
    assert a.read(bases[3], 1 << 20).data  # the active segment still reads
    mgr.close()
    reopened = env.manager().open().get_log("a", 0)
    assert reopened.segment_bases == [bases[3]]


def test_appends_waiting_on_a_replica_moved_away_fail_retriably(env: Env) -> None:
    """A partition log deleted because its replica moved to other nodes fails the appends
    still waiting for their fsync with ``NotLeaderError`` (retriable: the producer sends them
    to the new leader), not with the ``LogClosedError`` of a crash, which ended the send."""

    class Held(concurrent.futures.ThreadPoolExecutor):
        """Keeps every flush job: the group commit never finishes while the test runs."""

        def __init__(self) -> None:
            super().__init__(max_workers=1)
            self.jobs: list[Callable[[], None]] = []

        def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
            self.jobs.append(functools.partial(fn, *args, **kwargs))
            return concurrent.futures.Future()

    async def run() -> None:
        loop = asyncio.get_running_loop()
        held = Held()
        set_flush_executor(loop, held)
        mgr = env.manager().open()
        try:
            plog = mgr.create_log("moved", 0, LogConfig(fsync=FsyncPolicy.ALWAYS))
            pending = asyncio.ensure_future(plog.append_async(batch()))
            for _ in range(20):  # bounded: until its group commit is under way
                await asyncio.sleep(0)
                if held.jobs:
                    break
            assert held.jobs
            assert not pending.done()
            await mgr.delete_partition_async("moved", 0)
            with pytest.raises(NotLeaderError, match="moved to other nodes"):
                await asyncio.wait_for(pending, 30)
        finally:
            set_flush_executor(loop, None)
            mgr.close()

    asyncio.run(run())
