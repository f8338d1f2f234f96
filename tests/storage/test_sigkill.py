"""Crash tests on the real file system: a process appending under ``always`` is killed with
SIGKILL at random moments; after each kill the log reopens with every acknowledged batch and
is an exact, gapless prefix of what was appended."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from tidewire.records import iter_batches, iter_records
from tidewire.storage import LogManager

pytestmark = pytest.mark.crash

KILLS = 8
# Each writer process stops by itself after this long, so a failing kill cannot leak it.
WRITER_LIFETIME_S = 30

WRITER = textwrap.dedent(
    """
    import asyncio, sys
    from tidewire.records import BatchBuilder
    from tidewire.storage import FsyncPolicy, LogConfig, LogManager

    async def main(data_dir, start, lifetime):
        cfg = LogConfig(fsync=FsyncPolicy.ALWAYS, segment_bytes=64 * 1024)
        m = LogManager(data_dir, default_config=cfg).open()
        log = m.logs.get(("t", 0)) or m.create_log("t", 0)
        print("ready", log.log_end_offset, flush=True)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + lifetime
        seq = start

        async def writer(wid):
            nonlocal seq
            while loop.time() < deadline:
                n = seq
                seq += 1
                b = BatchBuilder()
                for i in range(3):
                    b.append(f"{n}:{i}".encode() * 20, timestamp_ms=n, key=str(wid).encode())
                info = await log.append_async(b.build())
                print("ack", n, info.base_offset, flush=True)

        await asyncio.gather(*(writer(w) for w in range(4)))

    asyncio.run(main(sys.argv[1], int(sys.argv[2]), float(sys.argv[3])))
    """
)


def _note_ack(line: str, acked: dict[int, int]) -> None:
    # The kill may cut the last line short: an ack only counts once printed whole.
    fields = line.split()
    if line.endswith("\n") and len(fields) == 3 and fields[0] == "ack":
        acked[int(fields[1])] = int(fields[2])


def _read_all(data_dir: Path) -> list[tuple[int, bytes]]:
    m = LogManager(str(data_dir)).open()
    try:
        log = m.get_log("t", 0)
        out: list[tuple[int, bytes]] = []
        offset = log.log_start_offset
        while offset < log.log_end_offset:
            r = log.read(offset, 1 << 20)
            for pos, h in iter_batches(r.data):
                for rec in iter_records(memoryview(r.data)[pos : pos + h.size]):
                    assert rec.value is not None
                    out.append((rec.offset, rec.value))
            offset = r.next_offset
        assert log.corruption is None
        return out
    finally:
        m.close()


def test_sigkill_loses_no_acknowledged_batch(tmp_path: Path) -> None:
    rng = random.Random(20261121)
    data_dir = tmp_path / "data"
    script = tmp_path / "writer.py"
    script.write_text(WRITER)
    acked: dict[int, int] = {}  # sequence number -> base offset
    start = 0
    for _ in range(KILLS):
        proc = subprocess.Popen(
            [sys.executable, str(script), str(data_dir), str(start), str(WRITER_LIFETIME_S)],
            stdout=subprocess.PIPE,
            text=True,
            env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
        )
        try:
            assert proc.stdout is not None
            assert proc.stdout.readline().startswith("ready")
            deadline = time.monotonic() + rng.uniform(0.05, 0.6)
            while time.monotonic() < deadline:
                line = proc.stdout.readline()
                if not line:
                    break
                _note_ack(line, acked)
            proc.send_signal(signal.SIGKILL)
            for line in proc.stdout:  # acks printed before the kill landed
                _note_ack(line, acked)
        finally:
            proc.kill()
            proc.wait(timeout=10)
            if proc.stdout is not None:
                proc.stdout.close()
        start = max(acked, default=-1) + 1_000_000  # fresh sequence numbers per run

        records = _read_all(data_dir)
        assert [o for o, _ in records] == list(range(len(records))), "offsets not contiguous"
        by_offset = dict(records)
        for n, base in acked.items():
            for i in range(3):
                assert by_offset.get(base + i) == f"{n}:{i}".encode() * 20, (
                    f"acknowledged batch {n} at offset {base} lost or changed"
                )
    assert len(acked) > 0
