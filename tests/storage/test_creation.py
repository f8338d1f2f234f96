"""Topic creation is all or none: under ENOSPC, EMFILE or a power cut at any operation of a
creation, the topic has every partition or none, now and after a restart, and a retry works.
"""

from __future__ import annotations

import asyncio
import errno
import json
import os
from pathlib import Path

import pytest

from tidewire.errors import LogExistsError, StorageError
from tidewire.records import build_batch
from tidewire.storage import FaultFS, FileSystem, LogManager, OsFileSystem
from tidewire.storage.creation import (
    CREATING_SUFFIX,
    PARALLEL_FROM,
    WHOLE_SYNC_PARTITIONS,
    mark_deleting,
)
from tidewire.storage.fs import FileHandle, FileSystemWrapper, WholeSync
from tidewire.storage.manager import BACKGROUND_DELETE_FROM

T0 = 1_700_000_000_000
N = 8


def manager(fs: FileSystem, data_dir: str = "/data") -> LogManager:
    return LogManager(data_dir, fs=fs, clock=lambda: T0).open()


def partition_dirs(fs: FileSystem, data_dir: str, topic: str) -> list[str]:
    return [n for n in fs.listdir(data_dir) if n.rsplit("-", 1)[0] == topic]


def create(mgr: LogManager, topic: str, n: int, how: str) -> None:
    """Create ``topic`` of ``n`` partitions the caller's way ("sync": ``create_topic``) or
    queued on a worker thread ("queued": ``create_topic_async``, as the server does)."""
    if how == "sync":
        mgr.create_topic(topic, range(n))
    else:
        asyncio.run(mgr.create_topic_async(topic, range(n)))


def ops_of_one_creation(n: int, how: str = "sync") -> int:
    fs = FaultFS()
    mgr = manager(fs)
    before = fs.ops
    create(mgr, "t", n, how)
    return fs.ops - before


#: A lone creation's sizes and ways: synced file by file (on the calling thread, then on
#: worker threads), and queued large enough to be made durable by one whole sync.
CASES = [(N, "sync"), (WHOLE_SYNC_PARTITIONS, "sync"), (WHOLE_SYNC_PARTITIONS, "queued")]


@pytest.mark.parametrize(("n", "how"), CASES)
@pytest.mark.parametrize("code", [errno.ENOSPC, errno.EMFILE, errno.EIO])
def test_a_failure_at_any_operation_leaves_all_or_nothing(code: int, n: int, how: str) -> None:
    total = ops_of_one_creation(n, how)
    assert total > 3 * n  # a real sweep: every partition's operations are in it
    for k in range(1, total + 1):
        fs = FaultFS()
        mgr = manager(fs)
        mgr.create_topic("kept", range(2))
        fs.failures[fs.ops + k] = code
        failure = None
        try:
            create(mgr, "t", n, how)
        except StorageError as exc:
            failure = exc.message
        if failure is not None:
            assert "none of them was created" in failure
            assert mgr.partition_count("t") == 0
            assert "t" not in mgr.topics()
            assert partition_dirs(fs, "/data", "t") == []
            assert not [x for x in fs.listdir("/data") if CREATING_SUFFIX in x]
            # A retry succeeds (the failure was once) and creates every partition.
            mgr.create_topic("t", range(n))
        assert mgr.topics() == {"kept": [0, 1], "t": list(range(n))}, k
        mgr.get_log("t", n - 1).append(build_batch([b"v"], timestamp_ms=T0))
        mgr.close()
        again = manager(fs)
        assert again.topics() == {"kept": [0, 1], "t": list(range(n))}, k
        again.close()


@pytest.mark.parametrize(("n", "how"), CASES)
def test_a_power_cut_at_any_operation_leaves_all_or_nothing_after_restart(n: int, how: str) -> None:
    total = ops_of_one_creation(n, how)
    for k in range(1, total + 1):
        fs = FaultFS()
        mgr = manager(fs)
        mgr.create_topic("kept", range(1))
        fs.cut_at = fs.ops + k
        with pytest.raises(StorageError):
            create(mgr, "t", n, how)
        survivor = fs.power_cut()
        again = manager(survivor)
        parts = again.topics().get("t", [])
        assert parts in ([], list(range(n))), (k, parts)
        assert again.topics()["kept"] == [0]
        if not parts:
            assert partition_dirs(survivor, "/data", "t") == []
        assert not [n for n in survivor.listdir("/data") if CREATING_SUFFIX in n]
        again.create_topic("t2", range(2))  # writable
        again.close()


def test_a_failed_addition_of_partitions_keeps_the_old_ones() -> None:
    fs = FaultFS()
    mgr = manager(fs)
    mgr.create_topic("t", range(3))
    mgr.get_log("t", 0).append(build_batch([b"old"], timestamp_ms=T0))
    fs.fail_kinds["sync"] = errno.ENOSPC
    with pytest.raises(StorageError):
        mgr.create_topic("t", range(3, 10))
    del fs.fail_kinds["sync"]
    assert mgr.topics() == {"t": [0, 1, 2]}
    assert sorted(partition_dirs(fs, "/data", "t")) == ["t-0", "t-1", "t-2"]
    assert mgr.get_log("t", 0).read(0).data
    mgr.create_topic("t", range(3, 10))
    assert mgr.partition_count("t") == 10


def test_an_interrupted_creation_is_removed_at_open_and_nothing_else() -> None:
    fs = FaultFS()
    mgr = manager(fs)
    mgr.create_topic("t", range(4))
    mgr.create_topic("u", range(2))
    mgr.close()
    # As a crash leaves it: the marker of adding partitions 2..5 of u, two of them made.
    marker = {"version": 1, "topic": "u", "first": 2, "count": 4}
    fs.set_contents(f"/data/u{CREATING_SUFFIX}", json.dumps(marker).encode())
    for p in (2, 3):
        fs.makedirs(f"/data/u-{p}")
        fs.set_contents(f"/data/u-{p}/log.json", b"{}")
    again = manager(fs)
    assert again.topics() == {"t": [0, 1, 2, 3], "u": [0, 1]}
    assert f"u{CREATING_SUFFIX}" not in fs.listdir("/data")


def test_an_unreadable_marker_removes_nothing(caplog: pytest.LogCaptureFixture) -> None:
    fs = FaultFS()
    mgr = manager(fs)
    mgr.create_topic("t", range(2))
    mgr.close()
    fs.set_contents(f"/data/t{CREATING_SUFFIX}", b"not json")
    again = manager(fs)
    assert again.topics() == {"t": [0, 1]}
    assert "unreadable topic creation marker" in caplog.text


class _EmfileAfter(FileSystemWrapper):
    """The real file system, refusing to open files once ``budget`` opens were made."""

    def __init__(self, budget: int) -> None:
        super().__init__(OsFileSystem())
        self.budget = budget

    def open(self, path: str, *, create: bool = True) -> FileHandle:
        if self.budget <= 0:
            raise OSError(errno.EMFILE, "Too many open files", path)
        self.budget -= 1
        return super().open(path, create=create)


class _NoWholeSync(_EmfileAfter):
    """As a system without ``syncfs``: every partition is synced file by file."""

    def open_whole_sync(self, path: str) -> WholeSync | None:
        return None


@pytest.mark.parametrize("kind", [_EmfileAfter, _NoWholeSync])
def test_descriptors_running_out_on_a_real_disk(tmp_path: Path, kind: type[_EmfileAfter]) -> None:
    """Many partitions and EMFILE half-way: nothing is left. Made on the calling thread
    and synced once (syncfs), or, without it, made and synced on worker threads."""
    n = 4 * PARALLEL_FROM
    fs = kind(budget=10**9)
    mgr = manager(fs, str(tmp_path))
    fs.budget = n  # each partition opens two files: half of them get made
    with pytest.raises(StorageError, match="Too many open files"):
        mgr.create_topic("t", range(n))
    assert mgr.topics() == {}
    assert partition_dirs(fs, str(tmp_path), "t") == []
    assert sorted(p.name for p in tmp_path.iterdir()) == [".lock"]  # the directory's lock
    fs.budget = 10**9
    mgr.create_topic("t", range(n))
    mgr.close()
    assert manager(fs, str(tmp_path)).topics() == {"t": list(range(n))}


def test_async_creation_reserves_the_name_until_done(tmp_path: Path) -> None:
    async def main() -> None:
        mgr = manager(OsFileSystem(), str(tmp_path))
        creating = asyncio.ensure_future(mgr.create_topic_async("t", range(200)))
        await asyncio.sleep(0)  # the creation runs on a worker thread now
        with pytest.raises(LogExistsError, match="being created or deleted"):
            mgr.create_topic("t", range(1))
        logs = await creating
        assert len(logs) == 200
        assert mgr.partition_count("t") == 200
        assert [p.directory for p in logs][:2] == [f"{tmp_path}/t-0", f"{tmp_path}/t-1"]
        parts, dirs = mgr.detach_topic("t")
        assert parts == list(range(200))
        assert mgr.partition_count("t") == 0
        removing = asyncio.ensure_future(mgr.remove_files_async("t", dirs))
        await asyncio.sleep(0)
        with pytest.raises(LogExistsError, match="being created or deleted"):
            mgr.create_topic("t", range(1))
        await removing
        assert partition_dirs(mgr.fs, str(tmp_path), "t") == []
        mgr.create_topic("t", range(1))
        await mgr.close_async()

    asyncio.run(main())


def test_a_large_deletion_returns_once_marked_and_finishes_in_the_background(
    tmp_path: Path,
) -> None:
    async def main() -> None:
        mgr = manager(OsFileSystem(), str(tmp_path))
        mgr.create_topic("big", range(BACKGROUND_DELETE_FROM + 1))
        mgr.create_topic("kept", range(1))
        _, dirs = mgr.detach_topic("big")
        await mgr.remove_files_async("big", dirs)
        assert mgr.topics() == {"kept": [0]}
        await mgr.wait_removals()
        assert partition_dirs(mgr.fs, str(tmp_path), "big") == []
        assert not [n for n in os.listdir(tmp_path) if n.startswith("big")]
        mgr.create_topic("big", range(2))  # the name is free again
        await mgr.close_async()

    asyncio.run(main())


def test_an_interrupted_deletion_is_finished_at_open(tmp_path: Path) -> None:
    mgr = manager(OsFileSystem(), str(tmp_path))
    mgr.create_topic("gone", range(3))
    mgr.create_topic("kept", range(2))
    dirs = [mgr.get_log("gone", p).directory for p in range(3)]
    mgr.close()
    mark_deleting(mgr.fs, str(tmp_path), "gone", dirs)  # as a stop right after the marker
    again = manager(OsFileSystem(), str(tmp_path))
    assert again.topics() == {"kept": [0, 1]}
    assert sorted(os.listdir(tmp_path)) == sorted(
        [".lock", "kept-0", "kept-1", "recovery-point-offset-checkpoint"]
    )


class _FailingTopic(FileSystemWrapper):
    """Counts the data directory's fsyncs; fails every makedirs of one topic's partitions."""

    def __init__(self, inner: FileSystem, data_dir: str, doomed: str) -> None:
        super().__init__(inner)
        self.data_dir, self.doomed = data_dir, doomed
        self.data_dir_syncs = 0

    def makedirs(self, path: str) -> None:
        if os.path.basename(path).rsplit("-", 1)[0] == self.doomed:
            raise OSError(errno.ENOSPC, "No space left on device", path)
        super().makedirs(path)

    def sync_dir(self, path: str) -> None:
        if os.path.normpath(path) == os.path.normpath(self.data_dir):
            self.data_dir_syncs += 1
        super().sync_dir(path)


@pytest.mark.parametrize("n", [3, 40])  # on the calling thread, and on the worker threads
def test_concurrent_creations_are_made_together_each_all_or_none(n: int) -> None:
    inner = FaultFS()
    fs = _FailingTopic(inner, "/data", doomed="t7")

    async def main() -> None:
        mgr = manager(fs)
        mgr.create_topic("first", range(1))  # the data directory's fsyncs of one creation
        fs.data_dir_syncs = 0
        results = await asyncio.gather(
            *(mgr.create_topic_async(f"t{i}", range(i % 3 + 1)) for i in range(n)),
            return_exceptions=True,
        )
        for i, result in enumerate(results):
            if i == 7:
                assert isinstance(result, StorageError)
                assert "partitions 0..1 of topic 't7'" in result.message
                assert "No space left on device" in result.message
            else:
                assert isinstance(result, list), (i, result)
                assert len(result) == i % 3 + 1
        # The first creation alone, then all the others together: 3 + 3 fsyncs of the
        # data directory, and one for the failed creation's undoing of its marker.
        assert fs.data_dir_syncs <= 6 + 2 * (n > 7), fs.data_dir_syncs
        want = {f"t{i}": list(range(i % 3 + 1)) for i in range(n) if i != 7}
        assert mgr.topics() == {"first": [0], **want}
        assert not [name for name in fs.listdir("/data") if name.endswith(CREATING_SUFFIX)]
        await mgr.close_async()
        again = manager(inner.power_cut())  # every creation answered is durable
        assert again.topics() == {"first": [0], **want}
        again.close()

    asyncio.run(main())


def _create_many(fs: FileSystem, creations: list[tuple[str, int]]) -> list[object]:
    from tidewire.storage.config import LogConfig
    from tidewire.storage.creation import Creation, create_many

    cfg = LogConfig()
    return list(
        create_many(
            fs,
            "/data",
            [Creation(t, range(n), cfg, json.dumps(cfg.to_dict()).encode()) for t, n in creations],
            clock=lambda: T0,
            config_file="log.json",
        )
    )


BATCH = [("a", 1), ("b", 2), ("c", 1)]


def test_creations_made_together_share_one_marker() -> None:
    fs = FaultFS()
    manager(fs).close()
    markers: list[str] = []
    real_rename = fs.rename

    def rename(src: str, dst: str) -> None:
        markers.append(dst)
        real_rename(src, dst)

    fs.rename = rename  # type: ignore[method-assign]
    results = _create_many(fs, BATCH)
    assert all(isinstance(r, list) for r in results)
    assert len(markers) == 1, markers
    assert markers[0].endswith(CREATING_SUFFIX)
    assert "+" in markers[0].rsplit("/", 1)[1]  # no topic's marker
    assert not [n for n in fs.listdir("/data") if CREATING_SUFFIX in n]


def test_a_power_cut_at_any_operation_of_creations_made_together() -> None:
    """One marker for several topics: after a power cut anywhere, each is whole or gone."""
    fs = FaultFS()
    manager(fs).close()
    before = fs.ops
    _create_many(fs, BATCH)
    total = fs.ops - before
    assert total > 10
    for k in range(1, total + 1):
        fs = FaultFS()
        mgr = manager(fs)
        mgr.create_topic("kept", range(1))
        mgr.close()
        fs.cut_at = fs.ops + k
        results = _create_many(fs, BATCH)  # each a failure: the power cut, or what it undid
        assert fs.dead, k
        assert not any(isinstance(r, list) for r in results), (k, results)
        survivor = fs.power_cut()
        again = manager(survivor)
        topics = again.topics()
        assert topics.pop("kept") == [0], k
        for name, n in BATCH:
            assert topics.get(name, []) in ([], list(range(n))), (k, topics)
        assert not [n for n in survivor.listdir("/data") if CREATING_SUFFIX in n], k
        again.close()


def test_an_interrupted_batch_of_creations_is_removed_at_open() -> None:
    fs = FaultFS()
    mgr = manager(fs)
    mgr.create_topic("t", range(2))
    mgr.close()
    body = {
        "version": 2,
        "creations": [
            {"topic": "u", "first": 0, "count": 3},
            {"topic": "v", "first": 0, "count": 1},
        ],
    }
    fs.set_contents(f"/data/creations+{'0' * 32}{CREATING_SUFFIX}", json.dumps(body).encode())
    for p in (0, 1):
        fs.makedirs(f"/data/u-{p}")
        fs.set_contents(f"/data/u-{p}/log.json", b"{}")
    again = manager(fs)
    assert again.topics() == {"t": [0, 1]}
    assert not [n for n in fs.listdir("/data") if CREATING_SUFFIX in n]


def test_a_version_2_marker_under_a_topics_name_removes_nothing(
    caplog: pytest.LogCaptureFixture,
) -> None:
    fs = FaultFS()
    mgr = manager(fs)
    mgr.create_topic("t", range(2))
    mgr.close()
    body = {"version": 2, "creations": [{"topic": "t", "first": 0, "count": 2}]}
    fs.set_contents(f"/data/x{CREATING_SUFFIX}", json.dumps(body).encode())
    assert manager(fs).topics() == {"t": [0, 1]}
    assert "unreadable topic creation marker" in caplog.text


class _StuckTopic(FileSystemWrapper):
    """Fails the second partition of one topic, and every removal of its directories."""

    def __init__(self, inner: FileSystem, doomed: str) -> None:
        super().__init__(inner)
        self.doomed = doomed

    def makedirs(self, path: str) -> None:
        if os.path.basename(path) == f"{self.doomed}-1":
            raise OSError(errno.ENOSPC, "No space left on device", path)
        super().makedirs(path)

    def rmtree(self, path: str) -> None:
        if os.path.basename(path).rsplit("-", 1)[0] == self.doomed:
            raise OSError(errno.EIO, "Input/output error", path)
        super().rmtree(path)


def test_a_failed_creation_that_cannot_be_undone_stays_named_alone() -> None:
    """The others of its batch are done: the marker is rewritten to name only what is left
    of the failed one, so the next open removes that and keeps the rest."""
    inner = FaultFS()
    manager(inner).close()
    fs = _StuckTopic(inner, doomed="b")
    results = _create_many(fs, BATCH)
    assert isinstance(results[1], OSError)
    assert isinstance(results[0], list)
    assert isinstance(results[2], list)
    (marker,) = [n for n in inner.listdir("/data") if n.endswith(CREATING_SUFFIX)]
    assert json.loads(inner.contents(f"/data/{marker}"))["creations"] == [
        {"topic": "b", "first": 0, "count": 2}
    ]
    assert "b-0" in inner.listdir("/data")
    again = manager(inner.power_cut())
    assert again.topics() == {"a": [0], "c": [0]}
    again.close()


@pytest.mark.parametrize("batch", [True, False])
def test_a_topic_created_again_after_a_failure_left_its_marker_survives_a_restart(
    batch: bool,
) -> None:
    """A marker left behind by a creation that failed and could not be undone names the
    topic; created again (the disk works again), the topic is acknowledged, so that marker
    must not remove it at the next start."""
    inner = FaultFS()
    manager(inner).close()
    fs = _StuckTopic(inner, doomed="b")
    mgr = manager(fs)
    if batch:
        results = _create_many(fs, BATCH)
        assert isinstance(results[1], OSError)
    else:
        with pytest.raises((OSError, StorageError)):
            mgr.create_topic("b", range(2))
    assert [n for n in inner.listdir("/data") if n.endswith(CREATING_SUFFIX)]  # left behind
    fs.doomed = "none"  # the disk works again; the same broker creates the topic again
    mgr.create_topic("b", range(2))
    mgr.get_log("b", 0).append(build_batch([b"acknowledged"], timestamp_ms=T0))
    mgr.close()
    again = manager(inner.power_cut())
    assert again.topics()["b"] == [0, 1]
    assert again.get_log("b", 0).log_end_offset == 1


class _Kinds(FaultFS):
    """A FaultFS that records the kind of every operation."""

    def __init__(self) -> None:
        super().__init__()
        self.kinds: list[str] = []

    def _op(self, kind: str, path: str) -> None:
        self.kinds.append(kind)
        super()._op(kind, path)


def test_creations_made_together_are_made_durable_by_one_whole_sync() -> None:
    """Partitions created together: no fsync of each log.json or partition directory, one
    sync of the whole file system; what it acknowledged survives a power cut at once (the
    files and entries were made durable by that sync alone: without it they are lost)."""
    fs = _Kinds()
    manager(fs).close()
    fs.kinds.clear()
    results = _create_many(fs, BATCH)
    assert all(isinstance(r, list) for r in results), results
    assert fs.kinds.count("sync_all") == 1, fs.kinds
    assert fs.kinds.count("sync") == 1, fs.kinds  # the marker's only
    for r in results:
        assert isinstance(r, list)
        for plog in r:
            plog.close()
    survivor = fs.power_cut()
    again = manager(survivor)
    assert again.topics() == {n: list(range(k)) for n, k in BATCH}
    log_json = survivor.contents("/data/b-1/log.json")
    assert json.loads(log_json)  # whole, not empty
    again.close()


@pytest.mark.parametrize(
    ("n", "how"),
    [
        (1, "sync"),
        (WHOLE_SYNC_PARTITIONS, "sync"),
        (1, "queued"),
        (WHOLE_SYNC_PARTITIONS - 1, "queued"),
    ],
)
def test_a_small_or_awaited_lone_creation_is_synced_file_by_file(n: int, how: str) -> None:
    """A lone creation its caller waits for (on the event loop, when a first publish creates
    the topic), or a small one, syncs only its own files: no sync of the whole file system,
    which would wait for whatever else is dirty."""
    fs = _Kinds()
    mgr = manager(fs)
    fs.kinds.clear()
    create(mgr, "t", n, how)
    assert "sync_all" not in fs.kinds
    assert fs.kinds.count("sync") >= n + 1  # the marker, each log.json and ...
    assert fs.kinds.count("sync_dir") >= n  # ... each partition's directory
    mgr.close()
    assert manager(fs.power_cut()).topics() == {"t": list(range(n))}


def test_a_large_lone_creation_is_made_durable_by_one_whole_sync() -> None:
    """A lone queued topic of WHOLE_SYNC_PARTITIONS partitions: no fsync of each log.json or
    partition directory, one sync of the whole file system; it survives a power cut (its
    files and entries were made durable by that sync alone)."""
    n = WHOLE_SYNC_PARTITIONS
    fs = _Kinds()
    manager(fs).close()
    mgr = manager(fs)
    fs.kinds.clear()
    create(mgr, "t", n, "queued")
    assert fs.kinds.count("sync_all") == 1
    assert fs.kinds.count("sync") == 1  # the marker's, written before the partitions
    mgr.get_log("t", n - 1).append(build_batch([b"kept"], timestamp_ms=T0))
    mgr.get_log("t", n - 1).flush()
    survivor = fs.power_cut()
    again = manager(survivor)
    assert again.topics() == {"t": list(range(n))}
    assert again.get_log("t", n - 1).log_end_offset == 1
    again.close()


def test_a_failed_whole_sync_undoes_every_creation_made_together() -> None:
    """A write-back error reported by the whole file system's sync: nothing of the creations
    is acknowledged and nothing of them is left, now and after a power cut."""
    fs = FaultFS()
    manager(fs).close()
    fs.fail_kinds["sync_all"] = errno.EIO
    results = _create_many(fs, BATCH)
    assert all(isinstance(r, OSError) and r.errno == errno.EIO for r in results), results
    del fs.fail_kinds["sync_all"]
    names = fs.listdir("/data")
    assert not [n for n in names if n.rsplit("-", 1)[0] in "abc" or CREATING_SUFFIX in n], names
    survivor = fs.power_cut()
    mgr = manager(survivor)
    assert mgr.topics() == {}
    mgr.create_topic("a", range(1))  # a retry works
    assert mgr.topics() == {"a": [0]}
    mgr.close()


def test_logs_created_together_keep_what_is_flushed_to_them_over_a_power_cut() -> None:
    """The new logs' directories were made durable by the whole sync (not by a sync of each):
    a record appended and flushed to one of them survives a power cut."""
    fs = FaultFS()
    manager(fs).close()
    results = _create_many(fs, BATCH)
    logs = [plog for r in results if isinstance(r, list) for plog in r]
    assert len(logs) == 4
    for plog in logs:
        plog.append(build_batch([b"kept"], timestamp_ms=T0))
        plog.flush()
        plog.close()
    again = manager(fs.power_cut())
    for name, n in BATCH:
        for p in range(n):
            assert again.get_log(name, p).log_end_offset == 1, (name, p)
    again.close()


def test_creations_made_together_on_a_real_disk(tmp_path: Path) -> None:
    """Through syncfs where the system has it (else file by file): made, reopened whole."""
    fs = OsFileSystem()
    data = str(tmp_path / "data")
    LogManager(data, fs=fs, clock=lambda: T0).open().close()
    whole = fs.open_whole_sync(data)
    if whole is not None:
        whole.sync()
        whole.close()
    from tidewire.storage.config import LogConfig
    from tidewire.storage.creation import Creation, create_many

    cfg = LogConfig()
    body = json.dumps(cfg.to_dict()).encode()
    results = create_many(
        fs,
        data,
        [Creation(f"t{i}", range(1), cfg, body) for i in range(20)],
        clock=lambda: T0,
        config_file="log.json",
    )
    for r in results:
        assert isinstance(r, list)
        for plog in r:
            plog.close()
    again = LogManager(data, fs=fs, clock=lambda: T0).open()
    assert again.topics() == {f"t{i}": [0] for i in range(20)}
    again.close()
