"""Simulated power cuts at random write/fsync points, through the FaultFS seam.

Each trial runs a log with small segments (so segments roll and their indexes are persisted)
on a :class:`FaultFS`, with several asyncio tasks appending batches of uniquely named records
through ``append_async``, and cuts power at a random operation. It then keeps what a disk
would keep (``power_cut`` in every mode: lose the unsynced bytes, tear the last write, or
fill its tail with garbage), reopens the log and checks the history
(:func:`tests.storage.history.check_recovered`): the surviving log is an exact prefix of the
pre-cut log, offsets contiguous from 0, ending on a batch boundary, holding everything that
was promised durable — acknowledged under ``always``, flushed under ``interval``, everything
after a clean close. The recovered log must then take writes and survive a clean restart with
its indexes trusted.

Trials are seeded. By default the group-commit fsync runs on the event loop's thread a
seeded number of loop turns after the flush took its snapshot (``SteppedExecutor``), so
appends still land while a flush is "in flight" and a seed replays exactly:
``run_trial(seed, policy)`` reproduces a failure printed as ``seed=... policy=...``. A share
of the trials runs the fsync in real worker threads, as in production; those replay the same
workload and cut point, not always the same interleaving.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import unittest.mock
from dataclasses import dataclass, field

import pytest

from tests.storage.history import (
    History,
    SteppedExecutor,
    check_recovered,
    clone,
    install_executor,
    make_batch,
    read_all,
    record_appends,
)
from tidewire.errors import StorageError, TidewireError
from tidewire.storage import FaultFS, FsyncPolicy, LogConfig, LogManager, PartitionLog
from tidewire.storage import log as storage_log

MODES = ("lose", "torn", "garbage")
DIR = "/p"
#: The smallest segments the config allows, so a trial of ~40 batches rolls several times,
#: and the densest index, so every sealed segment persists index entries.
SMALL = {"segment_bytes": 1024, "index_interval_bytes": 64}
#: Zeros written ahead (under ``always``) from a segment's second small fsync on, so that the
#: small segments of these trials get them, and power is cut with zeros past the end.
PREALLOCATE_BYTES = 4096
PREALLOCATE_AFTER_SYNCS = 2


def config(policy: FsyncPolicy) -> LogConfig:
    return LogConfig(fsync=policy, **SMALL)


# --- the checker's own tests --------------------------------------------------------------------


def _history(*batches: tuple[bytes, ...], acked: tuple[int, ...] = ()) -> History:
    h = History()
    base = 0
    for ps in batches:
        h.written.append((base, ps))
        base += len(ps)
    h.acked.update(acked)
    return h


def _recs(*payloads: bytes) -> list[tuple[int, bytes]]:
    return list(enumerate(payloads))


def test_checker_accepts_every_prefix_on_a_batch_boundary() -> None:
    h = _history((b"a", b"b"), (b"c",), (b"d", b"e"), acked=(0, 2))
    assert h.acked_end() == 3
    for n in (0, 2, 3, 5):
        recs = [(i, bytes([c])) for i, c in enumerate(b"abcde"[:n])]
        assert check_recovered(h, recs, durable_end=0) == []
        assert (check_recovered(h, recs, durable_end=h.acked_end()) == []) == (n >= 3)


def test_checker_names_a_lost_durable_record() -> None:
    h = _history((b"a",), (b"b",), (b"c",), acked=(0, 1))
    (problem,) = check_recovered(h, _recs(b"a"), durable_end=h.acked_end())
    assert problem.startswith("lost: 1 durable record(s) from offset 1")


def test_checker_names_reordering_duplicates_gaps_and_inventions() -> None:
    h = _history((b"a",), (b"b",), (b"c",))
    assert any("reordered" in p for p in check_recovered(h, _recs(b"b", b"a"), durable_end=0))
    assert any("duplicate" in p for p in check_recovered(h, _recs(b"a", b"a"), durable_end=0))
    gap = check_recovered(h, [(0, b"a"), (2, b"c")], durable_end=0)
    assert any("not contiguous" in p for p in gap)
    assert any("never written" in p for p in check_recovered(h, _recs(b"x"), durable_end=0))
    more = check_recovered(h, _recs(b"a", b"b", b"c", b"d"), durable_end=0)
    assert any("only 3 written" in p for p in more)


def test_checker_names_a_batch_cut_in_half() -> None:
    h = _history((b"a", b"b"), (b"c",))
    (problem,) = check_recovered(h, _recs(b"a"), durable_end=0)
    assert "inside a batch" in problem


def test_checker_rejects_a_history_that_is_not_a_log() -> None:
    h = History(written=[(0, (b"a",)), (5, (b"b",))])
    assert check_recovered(h, [], durable_end=0) == ["history: record 1 was written at offset 5"]


# --- one trial ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Step:
    """One append of one writer."""

    payloads: tuple[bytes, ...]
    pause: int  # event-loop turns the writer yields before sending it
    tick: bool  # interval: an interval flush (flush_async) follows it


@dataclass(frozen=True)
class Workload:
    """What the appenders of one trial do (derived from the seed alone)."""

    writers: tuple[tuple[Step, ...], ...]
    close_at_end: bool


def make_workload(seed: int) -> Workload:
    rng = random.Random(seed)
    writers = []
    for w in range(rng.randint(2, 4)):
        steps = []
        for b in range(rng.randint(4, 14)):
            payloads = tuple(
                f"s{seed}-w{w}-b{b}-r{r}-".encode() + b"x" * rng.randint(0, 90)
                for r in range(rng.randint(1, 4))
            )
            steps.append(Step(payloads, rng.choice([0, 0, 1, 2, 3]), rng.random() < 0.3))
        writers.append(tuple(steps))
    return Workload(tuple(writers), rng.random() < 0.3)


@dataclass
class Outcome:
    """What happened before the power cut."""

    history: History = field(default_factory=History)
    durable_end: int = 0  # every offset below was promised durable
    flushed_claim: int = 0  # the log's own flushed_offset (what a checkpoint would record)
    closed_clean: bool = False
    cut: bool = False


async def _drive(
    fs: FaultFS, policy: FsyncPolicy, work: Workload, threaded: bool, seed: int
) -> Outcome:
    if not threaded:
        executor = SteppedExecutor(random.Random(f"turns-{seed}"))
        install_executor(executor)
    out = Outcome()
    try:
        log = PartitionLog.open(fs, DIR, config(policy))
    except StorageError:
        out.cut = fs.dead
        return out
    record_appends(log, out.history)

    async def append(payloads: tuple[bytes, ...]) -> None:
        try:
            info = await log.append_async(make_batch(payloads))
        except TidewireError:
            return  # not acknowledged
        out.history.acked.add(info.base_offset)

    async def tick() -> None:
        end = log.log_end_offset
        try:
            await log.flush_async()
        except TidewireError:
            return
        out.durable_end = max(out.durable_end, end)

    async def writer(steps: tuple[Step, ...], tg: asyncio.TaskGroup) -> None:
        # Like a producer with several requests in flight: each append is its own task, so
        # appends land while a group commit is running, and join the next one.
        for step in steps:
            for _ in range(step.pause):
                await asyncio.sleep(0)
            tg.create_task(append(step.payloads))
            if step.tick and policy is FsyncPolicy.INTERVAL:
                tg.create_task(tick())

    async with asyncio.TaskGroup() as tg:
        for steps in work.writers:
            tg.create_task(writer(steps, tg))
    if policy is FsyncPolicy.ALWAYS:
        out.durable_end = max(out.durable_end, out.history.acked_end())
    if work.close_at_end:
        try:
            await log.close_async()
        except StorageError:
            pass
        else:
            # close() of a log that failed earlier skips the flush and does not raise.
            out.closed_clean = log.failed is None
        if out.closed_clean:
            out.durable_end = len(out.history.records())
    out.flushed_claim = log.flushed_offset
    if policy is FsyncPolicy.ALWAYS:
        assert out.history.acked_end() <= out.flushed_claim, "acknowledged beyond the flush"
    out.durable_end = max(out.durable_end, out.flushed_claim)
    out.cut = fs.dead
    return out


def run_trial(seed: int, policy: FsyncPolicy, *, threaded: bool = False) -> bool:
    """One seeded trial: run, cut, then check the survivors of every cut mode.

    Returns whether the cut landed inside the run (else power is cut after it).
    """
    with (
        unittest.mock.patch.object(storage_log, "PREALLOCATE_AFTER_SYNCS", PREALLOCATE_AFTER_SYNCS),
        unittest.mock.patch.object(storage_log, "DEFAULT_PREALLOCATE_BYTES", PREALLOCATE_BYTES),
    ):
        return _run_trial(seed, policy, threaded=threaded)


def _run_trial(seed: int, policy: FsyncPolicy, *, threaded: bool) -> bool:
    work = make_workload(seed)
    dry = FaultFS()
    asyncio.run(_drive(dry, policy, work, threaded, seed))
    rng = random.Random(f"cut-{seed}")
    fs = FaultFS()
    fs.cut_at = rng.randint(1, dry.ops)
    out = asyncio.run(_drive(fs, policy, work, threaded, seed))
    where = f"seed={seed} policy={policy} threaded={threaded} cut_at={fs.cut_at}/{dry.ops}"
    for mode in MODES:
        survivor = fs.power_cut(rng, mode=mode)
        try:
            _check_survivor(
                survivor, out, policy=policy, rng=rng, mode=mode, where=f"{where} mode={mode}"
            )
        except Exception as exc:
            exc.add_note(f"{where} mode={mode}")
            raise
    return out.cut


def _check_survivor(
    survivor: FaultFS,
    out: Outcome,
    *,
    policy: FsyncPolicy,
    rng: random.Random,
    mode: str,
    where: str,
) -> None:
    cfg = config(policy)
    recovery_point = rng.choice([0, out.flushed_claim])
    # A second power cut, during the recovery itself, in a quarter of the cases.
    double = rng.random() < 0.25
    if double:
        probe = clone(survivor)
        PartitionLog.open(
            probe, DIR, cfg, clean=out.closed_clean, recovery_point=recovery_point
        ).abandon()
        if probe.ops:
            survivor.cut_at = rng.randint(1, probe.ops)
            with pytest.raises(StorageError):
                PartitionLog.open(
                    survivor, DIR, cfg, clean=out.closed_clean, recovery_point=recovery_point
                )
            second = rng.choice(MODES)
            where += f" recovery_cut={survivor.cut_at}/{probe.ops} mode={second}"
            survivor = survivor.power_cut(rng, mode=second)
    on_disk = _log_bytes(survivor)
    before = {p: survivor.contents(p) for p in survivor.files() if p.endswith(".log")}
    log = PartitionLog.open(
        survivor, DIR, cfg, clean=out.closed_clean, recovery_point=recovery_point
    )
    where += f" recovery_point={recovery_point}"
    records = read_all(log)
    problems = check_recovered(out.history, records, durable_end=out.durable_end)
    assert not problems, f"{where}:\n" + "\n".join(problems)
    assert log.corruption is None, f"{where}: {log.corruption}"
    assert (log.log_start_offset, log.log_end_offset) == (0, len(records)), where
    report = log.report
    # Recovery cut every invalid byte, and reported exactly what it cut, from the new end.
    assert _log_bytes(survivor) == log.size_bytes, where
    assert report.truncated_bytes == on_disk - log.size_bytes, f"{where}: {report}"
    if report.truncated_bytes or report.truncated_from_offset is not None:
        # (The byte count may be 0: a cut across segments drops a newer, empty segment.)
        assert report.truncated_from_offset == len(records), f"{where}: {report}"
    if mode == "lose" and not double:
        # Only synced bytes survive, and syncs cover whole batches: nothing to cut but zeros
        # written ahead of the appends (synced with the batches before them).
        assert _cut_only_zeros(before, survivor), f"{where}: {report}"
        assert report.truncated_batches_seen == 0, f"{where}: {report}"
        assert report.truncated_zero_bytes == report.truncated_bytes, f"{where}: {report}"
    # The recovered log takes writes, and a clean restart trusts every persisted index.
    assert log.append(make_batch([b"after-recovery"])).base_offset == len(records), where
    log.close()
    again = PartitionLog.open(survivor, DIR, cfg, clean=True)
    assert read_all(again) == [*records, (len(records), b"after-recovery")], where
    assert again.report.scanned_segments == 0, f"{where}: {again.report}"
    again.close()


def _cut_only_zeros(before: dict[str, bytes], fs: FaultFS) -> bool:
    """Whether every ``.log`` file is now a prefix of what it was, the rest being zeros."""
    for path, data in before.items():
        now = fs.contents(path) if path in fs.files() else b""
        if not data.startswith(now) or data.count(0, len(now)) != len(data) - len(now):
            return False
    return True


def _log_bytes(fs: FaultFS) -> int:
    return sum(len(fs.contents(p)) for p in fs.files() if p.endswith(".log"))


# --- the runs -----------------------------------------------------------------------------------

#: Trials per (policy, threads) in the default run: 1,080 power cuts in all, each checked in
#: the three cut modes. The slow variant runs ten times as many.
DEFAULT_TRIALS = {
    (FsyncPolicy.ALWAYS, False): 480,
    (FsyncPolicy.ALWAYS, True): 120,
    (FsyncPolicy.INTERVAL, False): 300,
    (FsyncPolicy.INTERVAL, True): 60,
    (FsyncPolicy.NEVER, False): 120,
}
BLOCKS = 6


@pytest.mark.parametrize("block", range(BLOCKS))
@pytest.mark.parametrize(("policy", "threaded"), list(DEFAULT_TRIALS))
def test_power_cut_at_random_operations(policy: FsyncPolicy, threaded: bool, block: int) -> None:
    trials = DEFAULT_TRIALS[(policy, threaded)] // BLOCKS
    first = 1_000_000 * (1 + list(FsyncPolicy).index(policy)) + 500_000 * threaded
    first += block * trials
    cuts = sum(run_trial(seed, policy, threaded=threaded) for seed in range(first, first + trials))
    # The cut point is drawn within the dry run's operation count: a seeded run replays it,
    # so every cut lands; with real threads the count varies a little from run to run.
    assert cuts >= (trials * 0.9 if threaded else trials), f"{cuts} of {trials} cuts landed"


@pytest.mark.slow
@pytest.mark.crash
@pytest.mark.parametrize("policy", [FsyncPolicy.ALWAYS, FsyncPolicy.INTERVAL])
def test_power_cut_at_random_operations_10k(policy: FsyncPolicy) -> None:
    first = 50_000_000 * (1 + list(FsyncPolicy).index(policy))
    for seed in range(first, first + 5_000):
        run_trial(seed, policy, threaded=seed % 5 == 0)


# --- a torn tail across segments ---------------------------------------------------------------


def _tail_lost_behind_a_newer_segment() -> tuple[FaultFS, LogConfig, int, list[bytes]]:
    """Segment 1 has an unsynced tail, segment 2 was just created, and retention's directory
    sync makes segment 2's entry durable; then power is cut: segment 2 survives (empty) while
    segment 1 lost its tail. Returns the survivor, the config, the flushed offset before the
    cut and the values flushed."""
    cfg = LogConfig(fsync=FsyncPolicy.INTERVAL, retention_bytes=1000, retention_ms=-1, **SMALL)
    fs = FaultFS()
    log = PartitionLog.open(fs, DIR, cfg)
    values: list[bytes] = []

    def append_until(segments: int) -> None:
        for _ in range(100):  # bounded: 1 KiB segments roll within a handful of appends
            if log.segment_count >= segments:
                return
            values.append(b"v%d" % len(values) + b"." * 100)
            log.append(make_batch([values[-1]]))

    append_until(2)
    log.flush()
    flushed = log.flushed_offset
    append_until(3)
    assert log.apply_retention() == [0]  # deletes segment 0 and syncs the directory
    start = log.log_start_offset
    return fs.power_cut(mode="lose"), cfg, flushed, values[start:flushed]


def test_tail_lost_behind_a_newer_segment_is_cut_not_corruption() -> None:
    survivor, cfg, flushed, kept = _tail_lost_behind_a_newer_segment()
    log = PartitionLog.open(survivor, DIR, cfg, recovery_point=flushed)
    assert log.corruption is None
    assert log.log_end_offset == flushed
    assert log.report.truncated_from_offset == flushed
    assert [v for _, v in read_all(log)] == kept
    assert log.segment_count == 1  # the empty newer segment is gone
    assert log.append(make_batch([b"next"])).base_offset == flushed
    log.close()
    again = PartitionLog.open(survivor, DIR, cfg, clean=True)
    assert [v for _, v in read_all(again)] == [*kept, b"next"]


def test_segment_gap_below_the_recovery_point_is_corruption() -> None:
    """Offsets below the recovery point were synced: missing ones are corruption, not a tail."""
    survivor, cfg, flushed, kept = _tail_lost_behind_a_newer_segment()
    log = PartitionLog.open(survivor, DIR, cfg, recovery_point=flushed + 1)
    assert log.corruption is not None
    assert log.corruption.offset == flushed
    assert [v for _, v in read_all(log, end=flushed)] == kept


# --- truncation --------------------------------------------------------------------------------


def _truncated(policy: FsyncPolicy) -> tuple[FaultFS, LogManager, PartitionLog]:
    """A log of 10 flushed batches ("old0".."old9") with a recovery checkpoint at 10,
    truncated to offset 5 (as a follower drops a divergent suffix)."""
    cfg = LogConfig(fsync=policy, retention_ms=-1, **SMALL)
    fs = FaultFS()
    mgr = LogManager("/data", fs=fs, default_config=cfg).open()
    log = mgr.create_log("t", 0)
    for i in range(10):
        log.append(make_batch([b"old%d" % i]))
    log.flush()
    mgr.write_recovery_checkpoint()
    assert log.truncate_to(5) == 5
    return fs, mgr, log


@pytest.mark.parametrize("mode", MODES)
def test_truncation_is_not_undone_by_a_power_cut(mode: str) -> None:
    """Once truncate_to returned, the removed batches stay removed."""
    fs, mgr, _ = _truncated(FsyncPolicy.ALWAYS)
    survivor = fs.power_cut(mode=mode)
    cfg = mgr.default_config
    log = PartitionLog.open(survivor, "/data/t-0", cfg, recovery_point=5)
    assert [v for _, v in read_all(log)] == [b"old%d" % i for i in range(5)]


def test_torn_tail_after_truncation_below_a_stale_checkpoint_is_not_corruption() -> None:
    fs, mgr, log = _truncated(FsyncPolicy.INTERVAL)
    for i in range(2):
        log.append(make_batch([b"new%d" % i]))
    log.flush()
    for i in range(2):
        log.append(make_batch([b"unflushed%d" % i]))
    survivor = fs.power_cut(random.Random(3), mode="torn")
    again = LogManager("/data", fs=survivor, default_config=mgr.default_config).open()
    log = again.get_log("t", 0)
    assert log.corruption is None, log.corruption
    assert [v for _, v in read_all(log)][:7] == [
        *(b"old%d" % i for i in range(5)),
        b"new0",
        b"new1",
    ]


# --- the log manager: interval ticks, checkpoints, metadata -------------------------------------


@dataclass
class ManagerOutcome:
    history: dict[str, History] = field(default_factory=dict)
    durable: dict[str, int] = field(default_factory=dict)


async def _drive_manager(fs: FaultFS, seed: int, threaded: bool) -> ManagerOutcome:
    """Two interval logs under a LogManager whose flush_due ticks on a fake clock, with a
    recovery checkpoint written every few ticks."""
    if not threaded:
        executor = SteppedExecutor(random.Random(f"turns-{seed}"))
        install_executor(executor)
    rng = random.Random(seed)
    out = ManagerOutcome()
    cfg = config(FsyncPolicy.INTERVAL)
    mgr = LogManager("/data", fs=fs, default_config=cfg, clock=lambda: 1_700_000_000_000)
    logs: dict[str, PartitionLog] = {}
    try:
        mgr.open()
        for name in ("a", "b"):
            logs[name] = mgr.create_log(name, 0)
            out.history[name] = History()
            record_appends(logs[name], out.history[name])
    except StorageError:
        return out
    done = asyncio.Event()

    async def writer(name: str, n: int) -> None:
        for b in range(n):
            payloads = tuple(f"s{seed}-{name}-b{b}-r{r}".encode() for r in range(rng.randint(1, 5)))
            try:
                await logs[name].append_async(make_batch(payloads))
            except TidewireError:
                return
            await asyncio.sleep(0)  # let the ticker run between appends

    async def ticker() -> None:
        now = 0.0
        for tick in range(10_000):  # bounded; ends when the writers are done
            if done.is_set():
                return
            await asyncio.sleep(0)
            if tick % 3 == 0:
                now += cfg.flush_interval_ms / 1000
                await mgr.flush_due(now)
            if tick % 7 == 0:
                with contextlib.suppress(OSError):  # the cut: reopening checks the rest
                    await asyncio.to_thread(mgr.write_recovery_checkpoint)

    async with asyncio.TaskGroup() as tg:
        tick = tg.create_task(ticker())
        async with asyncio.TaskGroup() as writers:
            for name in logs:
                writers.create_task(writer(name, rng.randint(5, 25)))
        done.set()
        await tick
    for name, plog in logs.items():
        out.durable[name] = plog.flushed_offset
    return out


def run_manager_trial(seed: int, *, threaded: bool = False) -> bool:
    dry = FaultFS()
    asyncio.run(_drive_manager(dry, seed, threaded))
    rng = random.Random(f"cut-{seed}")
    fs = FaultFS()
    fs.cut_at = rng.randint(1, dry.ops)
    out = asyncio.run(_drive_manager(fs, seed, threaded))
    for mode in MODES:
        where = f"seed={seed} threaded={threaded} cut_at={fs.cut_at}/{dry.ops} mode={mode}"
        survivor = fs.power_cut(rng, mode=mode)
        mgr = LogManager("/data", fs=survivor, default_config=config(FsyncPolicy.INTERVAL))
        mgr.open()  # the recovery points come from the last checkpoint that survived
        for name, history in out.history.items():
            log = mgr.get_log(name, 0)
            problems = check_recovered(history, read_all(log), durable_end=out.durable.get(name, 0))
            assert not problems, f"{where} log={name}:\n" + "\n".join(problems)
            assert log.corruption is None, f"{where} log={name}: {log.corruption}"
        mgr.close()
    return fs.dead


def test_power_cut_under_the_log_manager_with_interval_ticks() -> None:
    cuts = sum(run_manager_trial(seed, threaded=seed % 4 == 0) for seed in range(100))
    assert cuts >= 90


@pytest.mark.slow
@pytest.mark.crash
def test_power_cut_under_the_log_manager_with_interval_ticks_slow() -> None:
    for seed in range(10_000, 12_000):
        run_manager_trial(seed, threaded=seed % 4 == 0)


# --- the log manager's own metadata: open, create, close, delete --------------------------------


@dataclass
class Journal:
    """What the manager script had done, and had acknowledged, when power was cut."""

    history: dict[str, History] = field(default_factory=dict)
    durable: dict[str, int] = field(default_factory=dict)
    created: set[str] = field(default_factory=set)  # create_log returned
    deleting: set[str] = field(default_factory=set)  # delete_topic started
    deleted: set[str] = field(default_factory=set)  # delete_topic returned


INTERVAL_CFG = LogConfig(fsync=FsyncPolicy.INTERVAL, flush_interval_ms=7, **SMALL)


def _manager_script(fs: FaultFS, j: Journal) -> None:
    """Every metadata write the manager does: open (fresh, then clean), create with and
    without a config, flushes across segment rolls, the checkpoint, delete, close."""
    cfg = config(FsyncPolicy.ALWAYS)

    def fill(plog: PartitionLog, name: str, n: int) -> None:
        for b in range(n):
            batch = make_batch([f"{name}-{len(j.history[name].written)}-{b}".encode() * 3])
            plog.append(batch)
        plog.flush()
        j.durable[name] = plog.log_end_offset

    def create(mgr: LogManager, name: str, c: LogConfig | None) -> PartitionLog:
        plog = mgr.create_log(name, 0, c)
        j.history[name] = History()
        record_appends(plog, j.history[name])
        j.created.add(name)
        return plog

    mgr = LogManager("/data", fs=fs, default_config=cfg).open()
    a = create(mgr, "a", None)
    b = create(mgr, "b", INTERVAL_CFG)
    fill(a, "a", 12)  # rolls: sealed segments persist their indexes in the flush
    mgr.write_recovery_checkpoint()
    fill(b, "b", 3)
    create(mgr, "c", None)
    j.deleting.add("c")
    mgr.delete_topic("c")
    j.deleted.add("c")
    mgr.close()
    mgr = LogManager("/data", fs=fs, default_config=cfg).open()  # clean: removes the marker
    a = mgr.get_log("a", 0)
    record_appends(a, j.history["a"])
    fill(a, "a", 4)
    mgr.close()


def test_manager_metadata_survives_a_cut_at_every_operation() -> None:
    dry = FaultFS()
    _manager_script(dry, Journal())
    complete = Journal()
    _manager_script(FaultFS(), complete)
    rng = random.Random(7)
    for cut_at in range(1, dry.ops + 2):  # +1: no cut, power lost after the clean close
        fs = FaultFS()
        fs.cut_at = cut_at
        j = Journal()
        with contextlib.suppress(TidewireError, OSError):  # the cut
            _manager_script(fs, j)
        for mode in MODES:
            where = f"cut_at={cut_at}/{dry.ops} mode={mode}"
            survivor = fs.power_cut(rng, mode=mode)
            mgr = LogManager("/data", fs=survivor, default_config=config(FsyncPolicy.ALWAYS))
            mgr.open()  # the data dir opens whatever the cut left
            present = {t for t, _ in mgr.logs}
            assert j.created - j.deleting <= present, where
            assert not present & j.deleted, where
            assert present <= {"a", "b", "c"}, where
            if "b" in j.created:
                assert mgr.get_log("b", 0).config == INTERVAL_CFG, where
            for name in present:
                log = mgr.get_log(name, 0)
                history = j.history.get(name, History())
                records = read_all(log)
                problems = check_recovered(history, records, durable_end=j.durable.get(name, 0))
                assert not problems, f"{where} log={name}:\n" + "\n".join(problems)
                assert log.corruption is None, where
                if mgr.was_clean:
                    # The marker survives only a close that flushed everything: every log is
                    # whole and every index is trusted.
                    assert records == history.records(), where
                    assert log.report.scanned_segments == 0, f"{where}: {log.report}"
            mgr.close()
            # And the directory it leaves is clean.
            reopened = LogManager("/data", fs=survivor, default_config=config(FsyncPolicy.ALWAYS))
            reopened.open()
            assert reopened.was_clean, where
            reopened.close()
