"""write_atomic_many: many files replaced wholly or not at all, with two syncs of the whole
file system instead of two fsyncs a file; a power cut at any operation leaves each file's
old contents or its new ones."""

from __future__ import annotations

import errno

import pytest

from tidewire.storage.faultfs import FaultFS, PowerCut
from tidewire.storage.fs import WRITE_MANY_WHOLE_SYNC_FROM, write_atomic, write_atomic_many

N = WRITE_MANY_WHOLE_SYNC_FROM + 4


class CountingFS(FaultFS):
    def __init__(self) -> None:
        super().__init__()
        self.kinds: dict[str, int] = {}

    def _op(self, kind: str, path: str) -> None:
        self.kinds[kind] = self.kinds.get(kind, 0) + 1
        super()._op(kind, path)


def _setup(fs: FaultFS, n: int) -> list[tuple[str, bytes]]:
    """``n`` directories each holding a durable ``snap`` (old contents); the new ones."""
    for i in range(n):
        fs.makedirs(f"/data/p-{i}")
        write_atomic(fs, f"/data/p-{i}/snap", f"old-{i}".encode())
    return [(f"/data/p-{i}/snap", f"new-{i}".encode() * 3) for i in range(n)]


def test_many_files_take_two_whole_syncs_and_no_fsync_each() -> None:
    fs = CountingFS()
    files = _setup(fs, N)
    fs.kinds.clear()
    assert write_atomic_many(fs, files, "/data") == [None] * N
    assert fs.kinds.get("sync", 0) == 0
    assert fs.kinds.get("sync_dir", 0) == 0
    assert fs.kinds["sync_all"] == 2
    survivor = fs.power_cut()  # every new file is durable
    assert [survivor.read_file(p) for p, _ in files] == [d for _, d in files]
    assert not [p for p in survivor.files() if p.endswith(".tmp")]


def test_a_few_files_are_written_one_by_one() -> None:
    fs = CountingFS()
    files = _setup(fs, 3)
    fs.kinds.clear()
    assert write_atomic_many(fs, files, "/data") == [None] * 3
    assert fs.kinds.get("sync_all", 0) == 0
    assert fs.kinds["sync"] == 3
    survivor = fs.power_cut()
    assert [survivor.read_file(p) for p, _ in files] == [d for _, d in files]


def test_a_power_cut_at_any_operation_leaves_old_or_new_whole() -> None:
    probe = FaultFS()
    files = _setup(probe, N)
    start = probe.ops
    write_atomic_many(probe, files, "/data")
    total = probe.ops - start
    for cut in range(1, total + 1):
        fs = FaultFS()
        _setup(fs, N)
        fs.cut_at = fs.ops + cut
        with pytest.raises(PowerCut):
            write_atomic_many(fs, files, "/data")
        survivor = fs.power_cut()
        for i, (path, new) in enumerate(files):
            assert survivor.read_file(path) in (f"old-{i}".encode(), new), (cut, path)


def test_a_file_that_cannot_be_written_is_reported_and_the_others_replaced() -> None:
    fs = FaultFS()
    files = _setup(fs, N)
    fs.failures[fs.ops + 6] = errno.ENOSPC  # the second file's write (create, truncate, write)
    errors = write_atomic_many(fs, files, "/data")
    failed = [i for i, e in enumerate(errors) if e is not None]
    assert failed == [1]
    assert errors[1] is not None
    assert errors[1].errno == errno.ENOSPC
    survivor = fs.power_cut()
    assert survivor.read_file(files[1][0]) == b"old-1"
    assert [survivor.read_file(p) for i, (p, _) in enumerate(files) if i != 1] == [
        d for i, (_, d) in enumerate(files) if i != 1
    ]
