"""A history checker for storage crash tests, and the small test doubles those tests share.

A crash test appends batches whose records carry unique payloads, cuts power, reopens the log
on what survived and reads it back. :func:`check_recovered` then compares the records read
(``(offset, payload)`` in log order) with the history of what was written before the cut and
names every way the two disagree: a record lost, duplicated, reordered, altered or invented,
a gap in the offsets, a batch cut in half, or an acknowledged (durable) record missing.

The checker has its own tests (``test_power_cut.py``, ``test_checker_*``): a checker that
accepts everything would make every crash test pass.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from tidewire.records import BatchBuilder, iter_batches, iter_records
from tidewire.storage import FaultFS, PartitionLog
from tidewire.storage.flusher import set_flush_executor

__all__ = [
    "History",
    "SteppedExecutor",
    "check_recovered",
    "clone",
    "make_batch",
    "read_all",
    "record_appends",
]


# --- the history --------------------------------------------------------------------------------


@dataclass
class History:
    """What was written to one log before a crash.

    Attributes:
        written: ``(base_offset, payloads)`` of every batch the log accepted (the write
            returned), in append order — the pre-crash log.
        acked: base offsets of the batches whose ``append_async`` returned without error.
    """

    written: list[tuple[int, tuple[bytes, ...]]] = field(default_factory=list)
    acked: set[int] = field(default_factory=set)

    def records(self) -> list[tuple[int, bytes]]:
        """The pre-crash log as ``(offset, payload)`` pairs."""
        return [(base + i, p) for base, ps in self.written for i, p in enumerate(ps)]

    def boundaries(self) -> set[int]:
        """Offsets at which a batch starts or the log ends (where a surviving log may end)."""
        out = {0}
        for base, ps in self.written:
            out.add(base + len(ps))
        return out

    def acked_end(self) -> int:
        """One past the last offset of the last acknowledged batch (0 if none)."""
        ends = [base + len(ps) for base, ps in self.written if base in self.acked]
        return max(ends, default=0)


def check_recovered(
    history: History, recovered: Sequence[tuple[int, bytes]], *, durable_end: int
) -> list[str]:
    """Compare a recovered log with the pre-crash history.

    Args:
        history: what was written before the crash.
        recovered: ``(offset, payload)`` of every record read back, in log order.
        durable_end: every offset below this was promised durable (acknowledged under
            ``always``, or flushed) and must be there.

    Returns:
        Every problem found, as sentences (empty: the recovered log is a valid outcome).
    """
    problems: list[str] = []
    expected = history.records()
    # The history itself must be a log: contiguous offsets from 0.
    for i, (off, _) in enumerate(expected):
        if off != i:
            problems.append(f"history: record {i} was written at offset {off}")
            return problems
    for i, (off, _) in enumerate(recovered):
        if off != i:
            problems.append(f"offsets not contiguous from 0: record {i} has offset {off}")
            break
    known = {p: off for off, p in expected}
    seen: dict[bytes, int] = {}
    for i, (off, p) in enumerate(recovered):
        if p in seen:
            problems.append(f"duplicate: {p!r} at offsets {seen[p]} and {off}")
        seen[p] = off
        if p not in known:
            problems.append(f"invented or altered: {p!r} at offset {off} was never written")
        elif i < len(expected) and expected[i][1] != p:
            problems.append(
                f"reordered: offset {off} holds {p!r}, written at offset {known[p]}; "
                f"offset {off} was written with {expected[i][1]!r}"
            )
    if len(recovered) > len(expected):
        problems.append(f"{len(recovered)} records recovered but only {len(expected)} written")
    n = len(recovered)
    if n not in history.boundaries():
        problems.append(f"the recovered log ends at offset {n}, inside a batch")
    if n < durable_end:
        lost = [p for _, p in expected[n:durable_end]]
        problems.append(
            f"lost: {durable_end - n} durable record(s) from offset {n} "
            f"(durable up to {durable_end}): {lost[:5]!r}"
        )
    return problems


# --- helpers ------------------------------------------------------------------------------------


def make_batch(payloads: Sequence[bytes], timestamp_ms: int = 1_700_000_000_000) -> bytes:
    """A batch of one record per payload, all at ``timestamp_ms``."""
    b = BatchBuilder()
    for i, p in enumerate(payloads):
        b.append(p, timestamp_ms=timestamp_ms + i, key=p[:8])
    return b.build()


def read_all(
    log: PartitionLog, max_bytes: int = 4096, end: int | None = None
) -> list[tuple[int, bytes]]:
    """Every record of ``log`` (below ``end`` if given) as ``(offset, value)``, read batch by
    batch with ``read``."""
    out: list[tuple[int, bytes]] = []
    offset = log.log_start_offset
    end = log.log_end_offset if end is None else end
    for _ in range(end - offset + 1):  # bounded: each read returns at least one record
        if offset >= end:
            break
        result = log.read(offset, max_bytes, max_offset=end)
        assert result.data, f"empty read at offset {offset} below the end {end}"
        for pos, h in iter_batches(result.data):
            for rec in iter_records(memoryview(result.data)[pos : pos + h.size]):
                assert rec.value is not None
                if rec.offset >= offset:
                    out.append((rec.offset, rec.value))
        offset = result.next_offset
    return out


def clone(fs: FaultFS) -> FaultFS:
    """A durable copy of ``fs``'s current files (its directories and contents)."""
    new = FaultFS()
    for path in fs.files():
        new.makedirs(os.path.dirname(path))
        new.set_contents(path, fs.contents(path))
    return new


def record_appends(log: PartitionLog, history: History) -> None:
    """Make ``log`` record, in offset order, every batch it accepts into ``history``.

    Both ``append`` and ``append_async`` reserve a batch's offsets first (``_reserve``) and
    undo the reservation if the write fails (``_write_failed``, which rolls back that batch and
    every later one); hooking the two keeps ``history.written`` equal to what the log holds,
    written or about to be. The payloads are read back from the batch with ``iter_records``.
    """
    inner_reserve = log._reserve
    inner_failed = log._write_failed

    def reserve(batch: bytes | bytearray | memoryview, checked: Any = None) -> Any:
        write = inner_reserve(batch, checked)
        payloads = tuple(r.value or b"" for r in iter_records(bytes(batch)))
        history.written.append((write.info.base_offset, payloads))
        return write

    def write_failed(write: Any, exc: OSError) -> Any:
        base = write.info.base_offset
        history.written[:] = [e for e in history.written if e[0] < base]
        return inner_failed(write, exc)

    log._reserve = reserve  # type: ignore[method-assign]
    log._write_failed = write_failed  # type: ignore[method-assign]


def install_executor(executor: concurrent.futures.Executor) -> None:
    """Make ``executor`` run this event loop's disk jobs: the logs' group commits (the
    flusher's seam) and what goes through ``asyncio.to_thread`` (checkpoints)."""
    loop = asyncio.get_running_loop()
    loop.set_default_executor(executor)
    set_flush_executor(loop, executor)


class SteppedExecutor(concurrent.futures.ThreadPoolExecutor):
    """An executor that runs each job on the event loop's thread, after a seeded number of
    loop turns (0: at once, when submitted).

    Installed as the loop's default executor it stands in for the worker thread of
    ``asyncio.to_thread`` (the group-commit fsync): appends still land between a flush's
    snapshot and its I/O, as they would while a thread syncs, but a seed replays the same
    interleaving, op for op.
    """

    def __init__(self, rng: random.Random | None = None, max_turns: int = 3) -> None:
        super().__init__(max_workers=1)  # never started: no job reaches a thread
        self._rng = rng
        self._max_turns = max_turns

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
        future: concurrent.futures.Future[Any] = concurrent.futures.Future()

        def run() -> None:
            try:
                future.set_result(fn(*args, **kwargs))
            except BaseException as exc:  # handed to the awaiting task, not swallowed
                future.set_exception(exc)

        turns = self._rng.randint(0, self._max_turns) if self._rng else 0
        if turns == 0:
            run()
            return future
        loop = asyncio.get_running_loop()

        def hop(left: int) -> None:
            if left:
                loop.call_soon(hop, left - 1)
            else:
                run()

        loop.call_soon(hop, turns - 1)
        return future
