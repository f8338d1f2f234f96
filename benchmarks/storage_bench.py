"""Storage benchmark: the partition log against the raw disk, side by side, same run, same disk.

Usage::

    python benchmarks/storage_bench.py [--dir DIR] [--quick] [--json] [--seconds S] [--reps R]

What is measured (every measurement ``--reps`` times, configurations interleaved so drift hits
all alike; the median is reported with the min-max range):

* ``raw write+fdatasync``: ``os.write`` of 64 KiB blocks with ``os.fdatasync`` after each one,
  the baseline of the ``always`` policy.
* ``raw write``: ``os.write`` of 64 KiB blocks and one ``os.fdatasync`` at the end (timed), the
  baseline of ``never``.
* ``raw write+writeback`` (informational): ``raw write`` that also asks the OS, from a worker
  thread, to start writing back every 8 MiB written (``sync_file_range``), as the log does
  under ``never`` and ``interval`` (``tidewire.storage.log.WRITEBACK_BYTES``). Against it the
  log is compared like with like: what is left is the log's own cost.
* ``raw pwritev log layout`` (informational): the log's own write pattern without the log, each
  batch as ``os.pwritev([16-byte prefix, rest])`` at the end of the file (65,140-byte writes at
  unaligned offsets), one fdatasync at the end. It splits the ``never`` gap into what the
  on-disk layout costs the kernel and what the log's code costs.
* ``log <policy> xN``: ``N`` asyncio tasks each looping ``await log.append_async(batch)`` on a
  log created by a :class:`LogManager` with that fsync policy. The batches (1,024-byte records,
  as many as fit in 64 KiB) are built once before anything is timed. Under ``interval`` a task
  calls ``LogManager.flush_due`` every 10 ms, as ``LogManager.run`` does. Under ``interval`` and
  ``never`` the final flush that makes every appended byte durable is timed, as the ``raw
  write`` baseline's final fdatasync is. fsyncs are counted by a :class:`FileSystem` wrapper
  around :class:`OsFileSystem` (``sync()`` calls on ``.log`` files).
* ``cold read``: a log of 1 GiB (``--quick``: 256 MiB) written under ``never`` and closed; after
  dropping the page cache (``/proc/sys/vm/drop_caches``, or ``POSIX_FADV_DONTNEED`` on each
  segment file if that is not allowed), ``log.read(offset, 1 MiB)`` from offset 0 to the end,
  against ``os.read`` of 1 MiB blocks over the same segment files after the same cache drop.
  One untimed pass of each comes first: right after the write the first cold read is slow.

Each write run stops at a byte budget (512 MiB; ``--quick``: 128 MiB) or after ``--seconds``
(5; ``--quick``: 1), whichever comes first. Rates are in MB/s (10^6 bytes per second); budgets
are in MiB. Progress goes to stderr; ``--json`` prints one JSON object instead of the table.
A run that hangs (appenders still waiting 30 s past its time bound) aborts the benchmark with
the log's group-commit state.

Under ``interval`` and ``never``, ``append_async`` suspends only until the end of the event
loop's turn, where the batches appended in that turn are written together, and not at all
when enough is gathered to be written at once (4 MiB or 500 batches); an appender that never
yielded otherwise could starve the interval flusher. Each appender therefore also yields to
the event loop (``asyncio.sleep(0)``) once it has appended for ``--yield-every-ms`` (default
1 ms: the appenders interleave and the flusher runs on time, at a cost of one loop iteration
per millisecond); ``--yield-every-ms 0`` yields after every append, as a broker does when each
batch arrives in its own request (it adds one event-loop iteration per batch, which is not the
log's cost). Under ``always``, ``append_async`` suspends on its fsync, which is the yield.
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import json
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from tidewire.records.builder import BatchBuilder
from tidewire.server.tcp import loop_factory
from tidewire.storage import FileHandle, FileSystem, LogManager, OsFileSystem, PartitionLog
from tidewire.storage.config import FsyncPolicy, LogConfig
from tidewire.storage.fs import FileHandleWrapper, FileSystemWrapper
from tidewire.storage.log import WRITEBACK_BYTES

#: The event loop of the log runs: ``auto`` is the one ``tidewire serve`` runs the broker on
#: (uvloop when it is installed); ``--event-loop asyncio`` measures asyncio's own.
EVENT_LOOP = ["auto"]

KIB = 1024
MIB = 1024 * 1024
MB = 1_000_000
BLOCK = 64 * KIB
RECORD_BYTES = 1024
READ_BYTES = 1 * MIB
APPENDERS = (1, 4, 16)
POLICIES = (FsyncPolicy.ALWAYS, FsyncPolicy.INTERVAL, FsyncPolicy.NEVER)
FLUSH_TICK_S = 0.010
HANG_GRACE_S = 30.0

Buffer = bytes | bytearray | memoryview


def progress(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


# --- fsync counting --------------------------------------------------------------------------


@dataclass
class SyncCounter:
    """``sync()`` calls seen by :class:`CountingFileSystem`, by kind of file."""

    log_syncs: int = 0
    other_syncs: int = 0
    dir_syncs: int = 0

    def reset(self) -> None:
        self.log_syncs = self.other_syncs = self.dir_syncs = 0


class CountingFile(FileHandleWrapper):
    """A file handle that counts its ``sync()`` calls."""

    def __init__(self, inner: FileHandle, counter: SyncCounter) -> None:
        super().__init__(inner)
        self._counter = counter
        self._is_log = inner.path.endswith(".log")

    def sync(self) -> None:
        # Called from the flush worker thread; one flush runs at a time per log.
        if self._is_log:
            self._counter.log_syncs += 1
        else:
            self._counter.other_syncs += 1
        self.inner.sync()


class CountingFileSystem(FileSystemWrapper):
    """:class:`OsFileSystem` whose files count their ``sync()`` calls."""

    def __init__(self, counter: SyncCounter) -> None:
        super().__init__(OsFileSystem())
        self.counter = counter

    def open(self, path: str, *, create: bool = True) -> FileHandle:
        return CountingFile(self.inner.open(path, create=create), self.counter)

    def sync_dir(self, path: str) -> None:
        self.counter.dir_syncs += 1
        self.inner.sync_dir(path)


# --- results ---------------------------------------------------------------------------------


@dataclass
class Run:
    """One timed run."""

    seconds: float
    bytes: int
    batches: int = 0
    records: int = 0
    fsyncs: int = 0
    reads: int = 0

    @property
    def mb_s(self) -> float:
        return self.bytes / self.seconds / MB

    @property
    def records_s(self) -> float:
        return self.records / self.seconds

    @property
    def fsyncs_s(self) -> float:
        return self.fsyncs / self.seconds

    @property
    def batches_per_fsync(self) -> float | None:
        return self.batches / self.fsyncs if self.fsyncs else None


@dataclass
class Measurement:
    """Every run of one configuration."""

    name: str
    label: str
    kind: str  # "raw" or "log"
    policy: str | None = None
    appenders: int | None = None
    runs: list[Run] = field(default_factory=list)

    def stat(self, get: Callable[[Run], float | None]) -> dict[str, float] | None:
        values = [v for v in (get(r) for r in self.runs) if v is not None]
        if not values:
            return None
        return {"median": statistics.median(values), "min": min(values), "max": max(values)}

    def median_mb_s(self) -> float:
        s = self.stat(lambda r: r.mb_s)
        assert s is not None
        return s["median"]

    def to_dict(self) -> dict[str, Any]:
        any_records = any(r.records for r in self.runs)
        any_fsyncs = any(r.fsyncs for r in self.runs)
        return {
            "label": self.label,
            "kind": self.kind,
            "policy": self.policy,
            "appenders": self.appenders,
            "mb_s": self.stat(lambda r: r.mb_s),
            "records_s": self.stat(lambda r: r.records_s) if any_records else None,
            "fsyncs_s": self.stat(lambda r: r.fsyncs_s) if any_fsyncs else None,
            "batches_per_fsync": self.stat(lambda r: r.batches_per_fsync) if any_records else None,
            "runs": [
                {
                    "seconds": round(r.seconds, 6),
                    "bytes": r.bytes,
                    "batches": r.batches,
                    "records": r.records,
                    "fsyncs": r.fsyncs,
                    "reads": r.reads,
                    "mb_s": round(r.mb_s, 3),
                }
                for r in self.runs
            ],
        }


# --- raw baselines ---------------------------------------------------------------------------


def raw_write(
    path: str,
    block: bytes,
    budget: int,
    seconds: float,
    *,
    sync_each: bool,
    writeback: bool = False,
) -> Run:
    """Sequential ``os.write`` of ``block`` to a fresh file; fdatasync after each block or once
    at the end (timed either way). ``writeback``: every ``WRITEBACK_BYTES`` written, a worker
    thread asks the OS to start writing them back (one request at a time, as the log does)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    hint = OsFileSystem().open(path, create=False) if writeback else None
    pool = concurrent.futures.ThreadPoolExecutor(1) if writeback else None
    try:
        written = syncs = hinted = 0
        request: concurrent.futures.Future[None] | None = None
        start = time.perf_counter()
        deadline = start + seconds
        while written < budget and time.perf_counter() < deadline:
            n = os.write(fd, block)
            if n != len(block):
                raise OSError(f"short write of {n} bytes to {path}")
            written += n
            if sync_each:
                os.fdatasync(fd)
                syncs += 1
            if (
                hint is not None
                and pool is not None
                and written - hinted >= WRITEBACK_BYTES
                and (request is None or request.done())
            ):
                request = pool.submit(hint.start_writeback, hinted, written - hinted)
                hinted = written
        if request is not None:
            request.result()
        if not sync_each:
            os.fdatasync(fd)
            syncs += 1
        elapsed = time.perf_counter() - start
    finally:
        if pool is not None:
            pool.shutdown()
        if hint is not None:
            hint.close()
        os.close(fd)
        os.remove(path)
    return Run(elapsed, written, batches=written // len(block), fsyncs=syncs)


def raw_pwritev_batches(path: str, batches: Sequence[bytes], budget: int, seconds: float) -> Run:
    """The log's write pattern without the log: each batch as ``os.pwritev([16-byte prefix,
    rest of the batch], end of file)``, one fdatasync at the end (timed). Informational: it
    splits the gap between ``raw write`` and ``log never`` into what the on-disk layout costs
    the kernel (65,140-byte writes at unaligned offsets) and what the log's own code costs."""
    prefix = bytes(16)
    rests = [memoryview(b)[16:] for b in batches]
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        written = i = 0
        start = time.perf_counter()
        deadline = start + seconds
        while written < budget and time.perf_counter() < deadline:
            rest = rests[i % len(rests)]
            i += 1
            n = os.pwritev(fd, [prefix, rest], written)
            if n != len(rest) + 16:
                raise OSError(f"short write of {n} bytes to {path}")
            written += n
        os.fdatasync(fd)
        elapsed = time.perf_counter() - start
    finally:
        os.close(fd)
        os.remove(path)
    return Run(elapsed, written, batches=i, fsyncs=1)


# --- log appends -----------------------------------------------------------------------------


def build_batches(count: int, timestamp_ms: int) -> tuple[list[bytes], int]:
    """``count`` distinct batches of random 1,024-byte records, as many as fit in 64 KiB each.
    Returns the batches and the records per batch."""
    batches: list[bytes] = []
    per_batch = 0
    for _ in range(count):
        b = BatchBuilder()
        while True:
            before = b.size_in_bytes
            b.append(os.urandom(RECORD_BYTES), timestamp_ms=timestamp_ms)
            # the next record grows the batch by as much as this one did
            if b.size_in_bytes + (b.size_in_bytes - before) > BLOCK:
                break
        per_batch = len(b)
        batches.append(b.build())
    return batches, per_batch


async def _log_run_async(
    data_dir: str,
    policy: FsyncPolicy,
    appenders: int,
    *,
    batches: Sequence[bytes],
    records_per_batch: int,
    budget: int,
    seconds: float,
    flush_interval_ms: int,
    yield_every_s: float,
) -> Run:
    counter = SyncCounter()
    fs: FileSystem = CountingFileSystem(counter)
    manager = LogManager(data_dir, fs=fs).open()
    config = LogConfig(fsync=policy, flush_interval_ms=flush_interval_ms)
    plog = manager.create_log("bench", 0, config)
    counter.reset()  # setup syncs (log.json, directories) are not part of the run

    state = {"bytes": 0, "batches": 0}
    stop_flusher = False
    may_yield = policy is not FsyncPolicy.ALWAYS
    nbatches = len(batches)

    async def appender(first: int) -> None:
        i = first
        append_async = plog.append_async
        next_yield = 0.0
        while state["bytes"] < budget and time.perf_counter() < deadline:
            batch = batches[i % nbatches]
            i += 1
            info = await append_async(batch)
            state["bytes"] += info.size
            state["batches"] += 1
            if may_yield and (now := time.perf_counter()) >= next_yield:
                await asyncio.sleep(0)
                next_yield = now + yield_every_s

    async def interval_flusher() -> None:
        # What LogManager.run does every tick, without its checkpoint and retention work.
        while not stop_flusher:
            await asyncio.sleep(FLUSH_TICK_S)
            await manager.flush_due()

    flusher = None
    if policy is FsyncPolicy.INTERVAL:
        flusher = asyncio.get_running_loop().create_task(interval_flusher())
    start = time.perf_counter()
    deadline = start + seconds
    work = asyncio.gather(*(appender(k) for k in range(appenders)))
    # A run that does not finish well after its time bound is a hang (a lost wake-up in the
    # log's group commit, say): report the log's flush state instead of waiting forever.
    done, _ = await asyncio.wait([work], timeout=seconds + HANG_GRACE_S)
    if not done:
        work.cancel()
        raise RuntimeError(f"{policy} x{appenders}: appenders hung; {_flush_state(plog)}")
    work.result()
    if policy is not FsyncPolicy.ALWAYS:
        await plog.flush_async()  # make everything durable, as the raw baseline's fdatasync
    elapsed = time.perf_counter() - start
    log_syncs = counter.log_syncs
    stop_flusher = True
    if flusher is not None:
        await flusher
    if plog.flushed_offset != plog.log_end_offset:
        raise RuntimeError("benchmark bug: the log is not fully flushed at the end of the run")
    await manager.close_async()
    return Run(
        elapsed,
        state["bytes"],
        batches=state["batches"],
        records=state["batches"] * records_per_batch,
        fsyncs=log_syncs,
    )


def _flush_state(plog: PartitionLog) -> str:
    """The group-commit state of ``plog``, for a hang report (reads private attributes)."""
    task = getattr(plog, "_flush_task", None)
    waiters = list(getattr(plog, "_waiters", ()))
    return (
        f"log end {plog.log_end_offset}, flushed {plog.flushed_offset}, "
        f"{len(waiters)} waiter(s) for offsets {[o for o, _ in waiters][:8]}, flush task "
        f"{'none' if task is None else ('done' if task.done() else 'running')}, "
        f"flushing={getattr(plog, '_flushing', '?')}"
    )


def log_run(
    data_dir: str,
    policy: FsyncPolicy,
    appenders: int,
    *,
    batches: Sequence[bytes],
    records_per_batch: int,
    budget: int,
    seconds: float,
    flush_interval_ms: int,
    yield_every_s: float,
) -> Run:
    """One timed append run on a fresh log in ``data_dir`` (removed afterwards)."""
    try:
        with asyncio.Runner(loop_factory=loop_factory(EVENT_LOOP[0])[1]) as runner:
            return runner.run(
                _log_run_async(
                    data_dir,
                    policy,
                    appenders,
                    batches=batches,
                    records_per_batch=records_per_batch,
                    budget=budget,
                    seconds=seconds,
                    flush_interval_ms=flush_interval_ms,
                    yield_every_s=yield_every_s,
                )
            )
    finally:
        shutil.rmtree(data_dir, ignore_errors=True)


# --- cold reads ------------------------------------------------------------------------------


def drop_cache(paths: Sequence[str]) -> str:
    """Evict ``paths`` from the page cache; return the method that worked."""
    os.sync()
    try:
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("1")
        return "drop_caches"
    except OSError:
        pass
    for p in paths:
        fd = os.open(p, os.O_RDONLY)
        try:
            os.fdatasync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)
    return "fadvise_dontneed"


def write_read_log(
    log_dir: str, batches: Sequence[bytes], total: int
) -> tuple[list[str], int, int, float]:
    """Write ``total`` bytes of batches through a ``never`` log and close it. Returns the
    segment files, the log size, its end offset and the write time."""
    plog = PartitionLog.open(OsFileSystem(), log_dir, LogConfig(fsync=FsyncPolicy.NEVER))
    start = time.perf_counter()
    i = 0
    while plog.size_bytes < total:
        plog.append(batches[i % len(batches)])
        i += 1
    plog.close()
    elapsed = time.perf_counter() - start
    size, end = plog.size_bytes, plog.log_end_offset
    segments = sorted(os.path.join(log_dir, n) for n in os.listdir(log_dir) if n.endswith(".log"))
    return segments, size, end, elapsed


def raw_read(paths: Sequence[str]) -> Run:
    """Sequential ``os.read`` of 1 MiB blocks over ``paths``."""
    total = reads = 0
    start = time.perf_counter()
    for p in paths:
        fd = os.open(p, os.O_RDONLY)
        try:
            while True:
                b = os.read(fd, READ_BYTES)
                if not b:
                    break
                total += len(b)
                reads += 1
        finally:
            os.close(fd)
    return Run(time.perf_counter() - start, total, reads=reads)


def _log_read_open(plog: PartitionLog, expect_bytes: int, expect_end: int) -> Run:
    total = reads = 0
    offset = 0
    read = plog.read
    start = time.perf_counter()
    while offset < expect_end:
        r = read(offset, READ_BYTES)
        if not r.data:
            raise RuntimeError(f"log.read({offset}) returned nothing before the end")
        total += len(r.data)
        offset = r.next_offset
        reads += 1
    elapsed = time.perf_counter() - start
    if total != expect_bytes:
        raise RuntimeError(f"log.read returned {total:,} bytes, the log holds {expect_bytes:,}")
    return Run(elapsed, total, reads=reads)


# --- the benchmark ---------------------------------------------------------------------------


@dataclass
class Settings:
    write_budget: int
    seconds: float
    reps: int
    read_total: int
    flush_interval_ms: int
    yield_every_ms: float


def run_benchmark(root: str, s: Settings) -> dict[str, Any]:
    now_ms = time.time_ns() // 1_000_000
    batches, per_batch = build_batches(16, now_ms)
    batch_bytes = len(batches[0])
    block = os.urandom(BLOCK)

    measurements: list[Measurement] = [
        Measurement("raw_write_fdatasync", "raw write+fdatasync each 64 KiB", "raw"),
        Measurement("raw_write", "raw write, 1 fdatasync at end", "raw"),
        Measurement("raw_write_writeback", "raw write+writeback, 1 fdatasync", "raw"),
        Measurement("raw_pwritev_batches", "raw pwritev log layout, 1 fdatasync", "raw"),
    ]
    for policy in POLICIES:
        for n in APPENDERS:
            measurements.append(
                Measurement(
                    f"log_{policy}_{n}",
                    f"log {policy:<8} x{n:<2} appenders",
                    "log",
                    str(policy),
                    n,
                )
            )
    by_name = {m.name: m for m in measurements}

    progress(
        f"batches: {per_batch} records x {RECORD_BYTES} B = {batch_bytes:,} B each; "
        f"write runs: {s.write_budget // MIB} MiB or {s.seconds:g} s; {s.reps} reps"
    )
    run_no = 0
    for rep in range(s.reps):
        # Interleave: every configuration once per rep, the order rotated from rep to rep.
        order = measurements[rep % len(measurements) :] + measurements[: rep % len(measurements)]
        for m in order:
            run_no += 1
            # Start every run from the same disk state: what earlier runs left dirty in the
            # page cache is written back now, untimed, not during the next run.
            os.sync()
            if m.name == "raw_pwritev_batches":
                r = raw_pwritev_batches(
                    os.path.join(root, "raw.dat"), batches, s.write_budget, s.seconds
                )
            elif m.kind == "raw":
                r = raw_write(
                    os.path.join(root, "raw.dat"),
                    block,
                    s.write_budget,
                    s.seconds,
                    sync_each=m.name == "raw_write_fdatasync",
                    writeback=m.name == "raw_write_writeback",
                )
            else:
                assert m.policy is not None
                assert m.appenders is not None
                r = log_run(
                    os.path.join(root, f"log-{run_no}"),
                    FsyncPolicy(m.policy),
                    m.appenders,
                    batches=batches,
                    records_per_batch=per_batch,
                    budget=s.write_budget,
                    seconds=s.seconds,
                    flush_interval_ms=s.flush_interval_ms,
                    yield_every_s=s.yield_every_ms / 1000,
                )
            m.runs.append(r)
            bpf = r.batches_per_fsync
            progress(
                f"[rep {rep + 1}/{s.reps}] {m.label:<34} {r.mb_s:8.1f} MB/s "
                f"{r.bytes / MIB:7.1f} MiB in {r.seconds:6.3f} s, {r.fsyncs} fsyncs"
                + (f", {bpf:.1f} batches/fsync" if bpf is not None and m.kind == "log" else "")
            )

    # Cold catch-up read.
    read_dir = os.path.join(root, "read-log")
    progress(f"writing {s.read_total // MIB} MiB through a never log for the cold read...")
    segments, log_size, log_end, write_s = write_read_log(read_dir, batches, s.read_total)
    progress(f"  {log_size / MIB:.1f} MiB in {len(segments)} segment(s), {write_s:.2f} s")
    raw_m = Measurement("raw_read", "raw os.read 1 MiB, cold", "raw")
    log_m = Measurement("log_read", "log.read 1 MiB, cold", "log")
    methods: set[str] = set()

    def cold_read(m: Measurement) -> Run:
        if m is raw_m:
            methods.add(drop_cache(segments))
            return raw_read(segments)
        # Opened (untimed) before the cache drop, from the indexes its clean close persisted:
        # nothing is scanned.
        plog = PartitionLog.open(
            OsFileSystem(), read_dir, LogConfig(fsync=FsyncPolicy.NEVER), clean=True
        )
        try:
            if plog.report.scanned_segments:
                raise RuntimeError("benchmark bug: the read log was scanned on open")
            methods.add(drop_cache(segments))
            return _log_read_open(plog, log_size, log_end)
        finally:
            plog.abandon()

    # Right after a large write the disk is still busy (writeback, discards of the files the
    # write runs deleted) and the first cold read is slow, whichever it is: one untimed pass
    # of each settles it.
    warmup = {m.name: cold_read(m).mb_s for m in (raw_m, log_m)}
    progress("  warm-up (untimed): " + ", ".join(f"{k} {v:.0f} MB/s" for k, v in warmup.items()))
    for rep in range(s.reps):
        pair = [raw_m, log_m] if rep % 2 == 0 else [log_m, raw_m]
        for m in pair:
            r = cold_read(m)
            m.runs.append(r)
            progress(
                f"[rep {rep + 1}/{s.reps}] {m.label:<34} {r.mb_s:8.1f} MB/s "
                f"{r.bytes / MIB:7.1f} MiB in {r.seconds:6.3f} s, {r.reads} reads"
            )
    shutil.rmtree(read_dir, ignore_errors=True)

    def ratio(num: Measurement, den: Measurement, target: float | None) -> dict[str, Any]:
        v = num.median_mb_s() / den.median_mb_s()
        return {
            "numerator": num.name,
            "denominator": den.name,
            "value": v,
            "target": target,
            "met": None if target is None else v >= target,
        }

    raw_sync, raw_w = by_name["raw_write_fdatasync"], by_name["raw_write"]
    ratios = {
        "always_16_vs_raw_write_fdatasync": ratio(by_name["log_always_16"], raw_sync, 0.60),
        "never_16_vs_raw_write": ratio(by_name["log_never_16"], raw_w, 0.80),
        "never_1_vs_raw_write": ratio(by_name["log_never_1"], raw_w, 0.80),
        "cold_read_log_vs_raw": ratio(log_m, raw_m, 0.70),
        "always_1_vs_raw_write_fdatasync": ratio(by_name["log_always_1"], raw_sync, None),
        "always_4_vs_raw_write_fdatasync": ratio(by_name["log_always_4"], raw_sync, None),
        "interval_16_vs_raw_write": ratio(by_name["log_interval_16"], raw_w, None),
        "raw_layout_vs_raw_write": ratio(by_name["raw_pwritev_batches"], raw_w, None),
        "never_1_vs_raw_layout": ratio(
            by_name["log_never_1"], by_name["raw_pwritev_batches"], None
        ),
        "interval_1_vs_raw_write": ratio(by_name["log_interval_1"], raw_w, None),
        "never_16_vs_raw_write_writeback": ratio(
            by_name["log_never_16"], by_name["raw_write_writeback"], None
        ),
        "never_1_vs_raw_write_writeback": ratio(
            by_name["log_never_1"], by_name["raw_write_writeback"], None
        ),
    }
    return {
        "settings": {
            "write_budget_bytes": s.write_budget,
            "seconds_per_run": s.seconds,
            "reps": s.reps,
            "read_total_bytes": s.read_total,
            "flush_interval_ms": s.flush_interval_ms,
            "yield_every_ms": s.yield_every_ms,
            "event_loop": loop_factory(EVENT_LOOP[0])[0],
            "block_bytes": BLOCK,
            "batch_bytes": batch_bytes,
            "records_per_batch": per_batch,
            "record_value_bytes": RECORD_BYTES,
            "read_bytes": READ_BYTES,
        },
        "write": {m.name: m.to_dict() for m in measurements},
        "read": {
            "log_bytes": log_size,
            "segments": len(segments),
            "cache_drop": sorted(methods),
            "write_seconds": write_s,
            "warmup_mb_s": warmup,
            raw_m.name: raw_m.to_dict(),
            log_m.name: log_m.to_dict(),
        },
        "ratios": ratios,
    }


# --- output ----------------------------------------------------------------------------------


def _fmt(stat: dict[str, float] | None, spec: str) -> str:
    if stat is None:
        return "-"
    return (
        f"{format(stat['median'], spec)} [{format(stat['min'], spec)}-{format(stat['max'], spec)}]"
    )


def render_table(result: dict[str, Any]) -> str:
    env, st = result["environment"], result["settings"]
    lines = [
        "tidewire storage benchmark",
        f"  dir {env['dir']} ({env['filesystem']}), {env['kernel']}, {env['cpus']} CPUs, "
        f"Python {env['python']}",
        f"  {env['git']}; median [min-max] of {st['reps']} reps; MB = 10^6 bytes",
        f"  batch = {st['records_per_batch']} records x {st['record_value_bytes']} B = "
        f"{st['batch_bytes']:,} B; write runs stop at {st['write_budget_bytes'] // MIB} MiB or "
        f"{st['seconds_per_run']:g} s",
        f"  interval flush every {st['flush_interval_ms']} ms; interval/never appenders yield "
        f"every {st['yield_every_ms']:g} ms; event loop {st['event_loop']}",
        "",
    ]
    head = ("write", "MB/s", "records/s", "fsyncs/s", "batches/fsync")
    rows: list[tuple[str, ...]] = []
    for m in result["write"].values():
        rows.append(
            (
                m["label"],
                _fmt(m["mb_s"], ".1f"),
                _fmt(m["records_s"], ",.0f"),
                _fmt(m["fsyncs_s"], ",.0f"),
                _fmt(m["batches_per_fsync"], ",.1f"),
            )
        )
    rd = result["read"]
    read_head = (f"cold read of {rd['log_bytes'] / MIB:,.0f} MiB ({', '.join(rd['cache_drop'])})",)
    read_rows = [
        (rd[k]["label"], _fmt(rd[k]["mb_s"], ".1f"), "", "", "") for k in ("raw_read", "log_read")
    ]
    widths = [
        max(len(r[i]) for r in [head, *rows, *read_rows, (read_head[0], "", "", "", "")])
        for i in range(len(head))
    ]

    def fmt_row(r: Sequence[str]) -> str:
        first = r[0].ljust(widths[0])
        rest = [c.rjust(w) for c, w in zip(r[1:], widths[1:], strict=True)]
        return "  ".join([first, *rest]).rstrip()

    lines.append(fmt_row(head))
    lines.append("  ".join("-" * w for w in widths))
    lines.extend(fmt_row(r) for r in rows)
    lines.append("")
    lines.append(fmt_row((read_head[0], "MB/s", "", "", "")))
    lines.append("  ".join("-" * w for w in widths[:2]))
    lines.extend(fmt_row(r) for r in read_rows)
    lines.append("")
    rnames = {
        "always_16_vs_raw_write_fdatasync": "always x16 / raw write+fdatasync",
        "always_4_vs_raw_write_fdatasync": "always x4  / raw write+fdatasync",
        "always_1_vs_raw_write_fdatasync": "always x1  / raw write+fdatasync",
        "never_16_vs_raw_write": "never x16 / raw write",
        "never_1_vs_raw_write": "never x1  / raw write",
        "interval_16_vs_raw_write": "interval x16 / raw write",
        "interval_1_vs_raw_write": "interval x1  / raw write",
        "raw_layout_vs_raw_write": "raw pwritev log layout / raw write",
        "never_1_vs_raw_layout": "never x1 / raw pwritev log layout",
        "never_16_vs_raw_write_writeback": "never x16 / raw write+writeback",
        "never_1_vs_raw_write_writeback": "never x1  / raw write+writeback",
        "cold_read_log_vs_raw": "log.read / raw read (cold)",
    }
    rw = max(len(v) for v in rnames.values())
    lines.append(f"{'ratio'.ljust(rw)}  {'value':>6}  {'target':>7}  met")
    lines.append(f"{'-' * rw}  {'-' * 6}  {'-' * 7}  ---")
    for key, name in rnames.items():
        r = result["ratios"][key]
        target = "-" if r["target"] is None else f">={r['target']:.2f}"
        met = "-" if r["met"] is None else ("yes" if r["met"] else "NO")
        lines.append(f"{name.ljust(rw)}  {r['value']:6.2f}  {target:>7}  {met}")
    return "\n".join(lines)


def git_describe() -> str:
    """``git <commit>[+dirty]`` of the checkout this file is in (best effort)."""
    import subprocess

    here = os.path.dirname(os.path.abspath(__file__))
    try:
        head = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            cwd=here,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no", "--", ":(top)src"],
            cwd=here,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "git ?"
    return f"git {head}{'+dirty src' if dirty else ''}"


def filesystem_of(path: str) -> str:
    """``fstype on device`` of the mount holding ``path`` (best effort)."""
    best = ("", "?", "?")
    try:
        with open("/proc/mounts") as f:
            for line in f:
                dev, mnt, fstype = line.split()[:3]
                if (path == mnt or path.startswith(mnt.rstrip("/") + "/")) and len(mnt) >= len(
                    best[0]
                ):
                    best = (mnt, fstype, dev)
    except OSError:
        pass
    return f"{best[1]} on {best[2]}"


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--dir", help="parent directory of the scratch dir (default /var/tmp)")
    p.add_argument("--quick", action="store_true", help="smaller budgets: under a minute")
    p.add_argument("--json", action="store_true", help="print one JSON object, no table")
    p.add_argument("--json-out", metavar="PATH", help="also write the JSON object to PATH")
    p.add_argument(
        "--seconds", type=float, help="time bound of each write run (default 5; --quick 1)"
    )
    p.add_argument("--reps", type=int, default=3, help="repetitions of each measurement")
    p.add_argument("--write-mib", type=int, help="byte bound of each write run (512; --quick 128)")
    p.add_argument("--read-mib", type=int, help="size of the cold-read log (1024; --quick 256)")
    p.add_argument("--flush-interval-ms", type=int, default=50, help="interval policy period")
    p.add_argument(
        "--yield-every-ms",
        type=float,
        default=1.0,
        help="interval/never appenders yield to the loop this often (0: after every append)",
    )
    p.add_argument(
        "--event-loop",
        choices=["auto", "asyncio", "uvloop"],
        default="auto",
        help="the log runs' event loop (auto: uvloop when installed, as tidewire serve)",
    )
    args = p.parse_args(argv)
    if args.reps < 1:
        p.error("--reps must be >= 1")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    EVENT_LOOP[0] = args.event_loop
    settings = Settings(
        write_budget=(args.write_mib or (128 if args.quick else 512)) * MIB,
        seconds=args.seconds if args.seconds is not None else (1.0 if args.quick else 5.0),
        reps=args.reps,
        read_total=(args.read_mib or (256 if args.quick else 1024)) * MIB,
        flush_interval_ms=args.flush_interval_ms,
        yield_every_ms=args.yield_every_ms,
    )
    parent = os.path.abspath(args.dir or "/var/tmp")
    root = tempfile.mkdtemp(prefix="tidewire-bench-", dir=parent)
    started = time.perf_counter()
    try:
        result = run_benchmark(root, settings)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    result["environment"] = {
        "dir": root,
        "filesystem": filesystem_of(root),
        "kernel": platform.release(),
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "git": git_describe(),
        "quick": args.quick,
        "total_seconds": round(time.perf_counter() - started, 1),
    }
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump(result, f, indent=2)
            f.write("\n")
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print(render_table(result))
    progress(f"done in {result['environment']['total_seconds']} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
