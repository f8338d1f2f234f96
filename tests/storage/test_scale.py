"""Many partitions: a restart opens them on the calling thread, or on several threads once the
opens wait on the device, and syncs only what its recovery checkpoint does not cover; logs
reopened after a restart are flushed on the interval like new ones; a broker killed with
SIGKILL holding hundreds of partitions reopens with every one intact.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from tidewire.errors import StorageError
from tidewire.records import BatchBuilder, build_batch, iter_batches, iter_records
from tidewire.storage import FsyncPolicy, LogConfig, LogManager, manager
from tidewire.storage.faultfs import FaultFS
from tidewire.storage.log import PartitionLog
from tidewire.storage.manager import PARALLEL_OPEN_FROM, RECOVERY_CHECKPOINT_FILE

T0 = 1_700_000_000_000
INTERVAL = LogConfig(fsync=FsyncPolicy.INTERVAL, flush_interval_ms=1)


def batch(tag: str) -> bytes:
    return build_batch([tag.encode()], timestamp_ms=T0)


class CountingFS(FaultFS):
    """A FaultFS that counts the syncs of each kind."""

    def __init__(self) -> None:
        super().__init__()
        self.counted: dict[str, int] = {}

    def _op(self, kind: str, path: str) -> None:
        if kind in ("sync", "sync_dir"):
            self.counted[kind] = self.counted.get(kind, 0) + 1
        super()._op(kind, path)


def test_logs_reopened_after_a_restart_are_flushed_on_the_interval() -> None:
    fs = FaultFS()
    m = LogManager("/data", fs=fs, default_config=INTERVAL, clock=lambda: T0).open()
    m.create_log("t", 0).append(batch("before"))
    m.close()
    m = LogManager("/data", fs=fs, default_config=INTERVAL, clock=lambda: T0).open()
    plog = m.get_log("t", 0)
    plog.append(batch("after"))
    assert plog.flushed_offset == 1

    async def flush() -> int:
        await m.flush_due(time.monotonic())  # the first look starts its interval
        return await m.flush_due(time.monotonic() + 1)

    assert asyncio.run(flush()) == 1
    assert plog.flushed_offset == 2
    survivor = fs.power_cut()  # the flush made the append durable
    m.abandon()
    again = LogManager("/data", fs=survivor, default_config=INTERVAL).open()
    assert again.get_log("t", 0).log_end_offset == 2
    again.close()


def test_a_restart_syncs_only_what_the_checkpoint_does_not_cover() -> None:
    fs = CountingFS()
    m = LogManager("/data", fs=fs, default_config=INTERVAL, clock=lambda: T0).open()
    logs = m.create_topic("t", range(3))
    for i, plog in enumerate(logs):
        plog.append(batch(f"m{i}"))
        plog.flush()
    m.write_recovery_checkpoint()
    logs[2].append(batch("past the checkpoint"))  # written, not flushed: not covered
    m.abandon()  # a SIGKILL: the page cache (FaultFS's live data) survives

    fs.counted.clear()
    m = LogManager("/data", fs=fs, default_config=INTERVAL, clock=lambda: T0).open()
    assert m.last_start == "unclean"
    assert [m.get_log("t", p).log_end_offset for p in range(3)] == [1, 1, 2]
    # t-0 and t-1 need nothing; t-2 syncs its tail and its directory; the data directory once.
    assert fs.counted == {"sync": 1, "sync_dir": 2}
    assert [m.get_log("t", p).flushed_offset for p in range(3)] == [1, 1, 2]
    survivor = fs.power_cut()  # what the reopened logs count as flushed is on disk
    m.abandon()
    again = LogManager("/data", fs=survivor, default_config=INTERVAL).open()
    assert [again.get_log("t", p).log_end_offset for p in range(3)] == [1, 1, 2]
    again.close()


def test_a_log_failing_to_open_among_many_fails_the_open_and_frees_the_directory(
    tmp_path: Path,
) -> None:
    data = tmp_path / "data"
    n = PARALLEL_OPEN_FROM + 10  # more than one round of opens
    m = LogManager(str(data), default_config=INTERVAL).open()
    for plog in m.create_topic("t", range(n)):
        plog.append(batch("x"))
    m.close()
    segment = data / "t-7" / "00000000000000000000.log"
    segment.rename(tmp_path / "aside")
    segment.mkdir()  # a directory where the segment was: the log cannot be opened
    with pytest.raises(StorageError, match="t-7"):
        LogManager(str(data), default_config=INTERVAL).open()
    segment.rmdir()
    (tmp_path / "aside").rename(segment)
    m = LogManager(str(data), default_config=INTERVAL).open()  # the lock was released
    assert all(m.get_log("t", p).log_end_offset == 1 for p in range(n))
    m.close()


class SlowSyncFS(FaultFS):
    """A FaultFS whose syncs wait 2 ms, as a device does: a recovery that syncs waits on it."""

    def _op(self, kind: str, path: str) -> None:
        if kind in ("sync", "sync_dir"):
            time.sleep(0.002)
        super()._op(kind, path)


def _opened_on(monkeypatch: pytest.MonkeyPatch, fail: str | None = None) -> dict[str, str]:
    """Record the thread each log is opened on (directory -> thread name); the open of the
    directory ending in ``fail`` raises."""
    threads: dict[str, str] = {}
    real = PartitionLog.open.__func__  # type: ignore[attr-defined]

    def recording(
        cls: type[PartitionLog], fs: object, directory: str, /, *a: object, **kw: object
    ) -> PartitionLog:
        threads[directory] = threading.current_thread().name
        if fail is not None and directory.endswith(fail):
            raise StorageError(f"cannot open log {directory}: injected")
        opened: PartitionLog = real(cls, fs, directory, *a, **kw)
        return opened

    monkeypatch.setattr(PartitionLog, "open", classmethod(recording))
    return threads


def _filled(fs: FaultFS, n: int) -> None:
    """A topic of ``n`` partitions, one unflushed batch each, left as a SIGKILL leaves it (no
    checkpoint covers the batches: each open syncs its tail and directory)."""
    m = LogManager("/data", fs=fs, default_config=INTERVAL, clock=lambda: T0).open()
    for p, plog in enumerate(m.create_topic("t", range(n))):
        plog.append(batch(f"m{p}"))
    m.abandon()


def _reopened(
    monkeypatch: pytest.MonkeyPatch, fs: FaultFS, n: int
) -> tuple[LogManager, dict[str, str]]:
    """``n`` partitions left as a kill leaves them (:func:`_filled`), opened again; the open
    manager and the thread each log was opened on (:func:`_opened_on`)."""
    _filled(fs, n)
    threads = _opened_on(monkeypatch)
    return LogManager("/data", fs=fs, default_config=INTERVAL).open(), threads


def test_logs_that_open_without_waiting_open_on_the_calling_thread(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    m, threads = _reopened(monkeypatch, FaultFS(), 3 * PARALLEL_OPEN_FROM)
    assert len(threads) == 3 * PARALLEL_OPEN_FROM
    assert set(threads.values()) == {threading.current_thread().name}
    assert all(m.get_log("t", p).log_end_offset == 1 for p in range(3 * PARALLEL_OPEN_FROM))
    m.close()


def test_logs_whose_opens_wait_on_the_device_open_on_threads_in_order(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    n = 3 * PARALLEL_OPEN_FROM
    m, threads = _reopened(monkeypatch, SlowSyncFS(), n)
    assert len(threads) == n
    here = [d for d, name in threads.items() if name == threading.current_thread().name]
    assert len(here) == PARALLEL_OPEN_FROM  # the first round, which found the waits
    rest = {name for d, name in threads.items() if d not in here}
    assert all(name.startswith("tidewire-open") for name in rest)
    assert len(rest) > 1
    for p in range(n):
        plog = m.get_log("t", p)
        assert plog.log_end_offset == 1
        data = plog.read(0).data
        assert [
            r.value
            for pos, h in iter_batches(data)
            for r in iter_records(memoryview(data)[pos : pos + h.size])
        ] == [f"m{p}".encode()]
        assert plog.flushed_offset == 1  # its recovery synced it
    m.close()


def test_a_round_slowed_without_sleeping_in_the_kernel_stays_on_the_calling_thread(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A busy machine preempts the opening thread (wall time grows, its CPU time does not)
    without the opens waiting on the device: threads would not help."""
    monkeypatch.setattr(manager, "_blocked", lambda: 7)  # never slept in the kernel
    m, threads = _reopened(monkeypatch, SlowSyncFS(), 2 * PARALLEL_OPEN_FROM)
    assert set(threads.values()) == {threading.current_thread().name}
    m.close()


def test_a_log_failing_on_the_threads_abandons_every_log_opened(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    fs = SlowSyncFS()
    n = 3 * PARALLEL_OPEN_FROM
    _filled(fs, n)
    opened: list[PartitionLog] = []
    real_init = PartitionLog.__init__

    def keep(self: PartitionLog, *a: object, **kw: object) -> None:
        real_init(self, *a, **kw)  # type: ignore[arg-type]
        opened.append(self)

    monkeypatch.setattr(PartitionLog, "__init__", keep)
    threads = _opened_on(monkeypatch, fail=f"t-{n - 5}")
    with pytest.raises(StorageError, match=f"t-{n - 5}"):
        LogManager("/data", fs=fs, default_config=INTERVAL).open()
    assert threads[f"/data/t-{n - 5}"].startswith("tidewire-open")
    assert opened
    assert all(plog.closed for plog in opened)
    monkeypatch.undo()
    m = LogManager("/data", fs=fs, default_config=INTERVAL).open()  # the lock was released
    assert all(m.get_log("t", p).log_end_offset == 1 for p in range(n))
    m.close()


WRITER = textwrap.dedent(
    """
    import sys
    from tidewire.records import build_batch
    from tidewire.storage import LogConfig, LogManager

    data_dir, topics, per_topic = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    m = LogManager(data_dir, default_config=LogConfig()).open()
    for t in range(topics):
        for p, plog in enumerate(m.create_topic(f"t{t}", range(per_topic))):
            plog.append(build_batch([f"{t}-{p}:0".encode()], timestamp_ms=1))
    m.write_recovery_checkpoint()
    for t in range(topics):  # past the checkpoint, never flushed: still there after a kill
        for p in range(0, per_topic, 3):
            m.get_log(f"t{t}", p).append(build_batch([f"{t}-{p}:1".encode()], timestamp_ms=1))
    print("ready", flush=True)
    sys.stdin.read()  # until killed
    """
)


def _kill_and_reopen(tmp_path: Path, topics: int, per_topic: int) -> float:
    """Fill ``topics`` topics of ``per_topic`` partitions in a process, SIGKILL it, reopen
    the data directory and check every partition; the seconds the reopen took."""
    data = tmp_path / "data"
    script = tmp_path / "writer.py"
    script.write_text(WRITER)
    proc = subprocess.Popen(
        [sys.executable, str(script), str(data), str(topics), str(per_topic)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline() == "ready\n"
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        proc.kill()
        proc.wait(timeout=30)
        for pipe in (proc.stdin, proc.stdout):
            if pipe is not None:
                pipe.close()
    assert proc.returncode == -signal.SIGKILL
    started = time.monotonic()
    m = LogManager(str(data)).open()
    took = time.monotonic() - started
    try:
        assert m.last_start == "unclean"
        assert len(m.logs) == topics * per_topic
        for t in range(topics):
            for p in range(per_topic):
                plog = m.get_log(f"t{t}", p)
                r = plog.read(0, 1 << 16)
                values = [
                    rec.value
                    for pos, h in iter_batches(r.data)
                    for rec in iter_records(memoryview(r.data)[pos : pos + h.size])
                ]
                want = [f"{t}-{p}:0".encode()] + ([f"{t}-{p}:1".encode()] if p % 3 == 0 else [])
                assert values == want, f"t{t}-{p}"
                assert plog.flushed_offset == plog.log_end_offset
    finally:
        m.close()
    return took


@pytest.mark.crash
def test_hundreds_of_partitions_reopen_intact_after_sigkill(tmp_path: Path) -> None:
    _kill_and_reopen(tmp_path, topics=4, per_topic=125)  # 500 partitions


@pytest.mark.crash
@pytest.mark.slow
def test_ten_thousand_partitions_reopen_intact_after_sigkill(tmp_path: Path) -> None:
    took = _kill_and_reopen(tmp_path, topics=2, per_topic=5_000)
    assert took < 60, f"reopening 10,000 partitions took {took:.1f} s"  # generous: 10 s here


def _idempotent_batch(tag: str) -> bytes:
    b = BatchBuilder(producer_id=7, producer_epoch=0, base_sequence=0)
    b.append(tag.encode(), timestamp_ms=T0)
    return b.build()


def test_the_recovery_scan_says_from_where_it_saw_no_producer() -> None:
    """What lets a restart skip re-reading logs for producer state: set only by a scan of
    the log's end, and only past the last batch of an idempotent producer."""
    cfg = LogConfig(segment_bytes=1024)
    fs = FaultFS()
    m = LogManager("/data", fs=fs, default_config=cfg, clock=lambda: T0).open()
    plain, mixed = m.create_log("plain", 0), m.create_log("mixed", 0)
    mixed.append(_idempotent_batch("first"))
    for i in range(40):  # several segments of 1 KB
        plain.append(batch(f"p{i:03d}" * 10))
        mixed.append(batch(f"m{i:03d}" * 10))
    plain.flush()  # the sealed segments' indexes are written: the next open trusts them
    mixed.flush()
    m.write_recovery_checkpoint()
    m.abandon()
    m = LogManager("/data", fs=fs, default_config=cfg, clock=lambda: T0).open()
    plain, mixed = m.get_log("plain", 0), m.get_log("mixed", 0)
    assert plain.segment_count > 2
    # Only the active segment is scanned (the sealed ones are trusted): from its base.
    assert plain.scanned_without_producers_from == plain.segment_bases[-1]
    assert mixed.scanned_without_producers_from == mixed.segment_bases[-1]
    mixed.append(_idempotent_batch("last"))
    m.abandon()
    m = LogManager("/data", fs=fs, default_config=cfg, clock=lambda: T0).open()
    assert m.get_log("mixed", 0).scanned_without_producers_from is None
    m.close()
    m = LogManager("/data", fs=fs, default_config=cfg, clock=lambda: T0).open()
    assert m.was_clean  # nothing scanned: nothing known
    assert m.get_log("plain", 0).scanned_without_producers_from is None
    m.close()


def test_the_background_checkpoint_follows_every_kind_of_flush() -> None:
    """The loop looks at the logs only after a counted flush (or every few rounds, which
    catches a blocking flush()), and then records the new flushed offsets."""
    fs = FaultFS()
    never = LogConfig(fsync=FsyncPolicy.NEVER)

    async def checkpoint_says(want: int) -> None:
        async with asyncio.timeout(10):
            while True:
                path = f"/data/{RECOVERY_CHECKPOINT_FILE}"
                if fs.exists(path) and json.loads(fs.read_file(path))["logs"].get("t-0") == want:
                    return
                await asyncio.sleep(0.005)  # the loop writes every 5 ms here

    async def main() -> None:
        m = LogManager("/data", fs=fs, default_config=never, checkpoint_interval_ms=5).open()
        plog = m.create_log("t", 0)
        task = asyncio.create_task(m.run(tick_ms=1))
        try:
            plog.append(batch("a"))
            await plog.flush_async()  # counted in flush_stats
            await checkpoint_says(1)
            plog.append(batch("b"))
            plog.flush()  # blocking: not counted; a full look finds it
            await checkpoint_says(2)
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        m.close()

    asyncio.run(main())


@pytest.mark.parametrize("chunk", [None, 100])  # the scan's reads: whole, and in small chunks
def test_a_checkpoint_older_than_the_data_keeps_what_is_past_it_and_cuts_a_torn_tail(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, chunk: int | None
) -> None:
    from tidewire.storage import segment
    from tidewire.storage.log import intact_records

    if chunk is not None:
        monkeypatch.setattr(segment, "SCAN_CHUNK_BYTES", chunk)
    data = tmp_path / "data"

    def open_manager() -> LogManager:
        return LogManager(
            str(data), default_config=INTERVAL, clock=lambda: T0, max_open_files=4
        ).open()

    m = open_manager()
    logs = m.create_topic("t", range(3))
    for plog in logs:
        plog.append(batch("covered"))
        plog.flush()
    m.write_recovery_checkpoint()
    for plog in logs:
        for i in range(5):
            plog.append(batch(f"past-{i}"))
        plog.flush()
    m.abandon()  # SIGKILL: the checkpoint still says 1 for every log
    points = json.loads((data / RECOVERY_CHECKPOINT_FILE).read_bytes())["logs"]
    assert points == {"t-0": 1, "t-1": 1, "t-2": 1}
    torn = data / "t-1" / "00000000000000000000.log"
    os.truncate(torn, torn.stat().st_size - 3)  # the last batch cut short

    m = open_manager()
    assert m.last_start == "unclean"
    want = [b"covered", *(f"past-{i}".encode() for i in range(5))]
    for p in (0, 2):
        plog = m.get_log("t", p)
        assert plog.log_end_offset == 6
        assert plog.report.truncated_from_offset is None
        assert [r.value for r in intact_records(plog)] == want
    cut = m.get_log("t", 1)
    assert cut.report.truncated_from_offset == 5
    assert cut.log_end_offset == 5
    assert [r.value for r in intact_records(cut)] == want[:5]
    assert cut.corruption is None  # past the recovery point a torn tail is no damage
    m.close()
