"""Exactly once under crashes, after Kafka's own transactions test: messages copied
topic -> topic (the tidewire sink) and topic -> Parquet (Spark's file sink) by a streaming job
in a child process that is SIGKILLed past 20% of the copy and restarted from its checkpoints
each time: 30,000 messages killed once in the default tier, 100,000 killed three times in the
``slow`` one (each start of the job is a JVM's). Either way the job reads five micro-batches,
so a kill lands in the middle of one. The copies equal the input as a set, with no duplicate,
and keep the order within each partition."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from tests.cli._support import subprocess_env
from tests.spark._write_support import create_topic, read_topic, topic_name
from tidewire.client import Client, Producer

pytestmark = pytest.mark.crash

PARTITIONS = 4
#: The slow tier: messages, and the output records at which the job is killed (past 20% of
#: the copy, three times) with the micro-batches of N / 5 the Parquet copy has committed when
#: it is killed (40%, 60%, 80%).
N = 100_000
KILLS = ((25_000, 2), (50_000, 3), (75_000, 4))
#: The default tier: fewer messages, killed once in the middle.
N_SMALL = 30_000
KILLS_SMALL = ((15_000, 3),)
#: The longest one run of the job may take (s).
RUN_S = 300
REPO = Path(__file__).resolve().parents[2]


def start_job(
    what: str, addr: str, src: str, dst: str, tmp: Path, *, per_trigger: int
) -> subprocess.Popen[bytes]:
    """The copy ``what`` ("topic" or "parquet") in a child process of its own, reading
    ``per_trigger`` records a micro-batch."""
    env = subprocess_env({"PYSPARK_PYTHON": sys.executable})
    with (tmp / f"{what}.log").open("ab") as log:  # what it says, for a failure's message
        return subprocess.Popen(
            [sys.executable, "-m", "tests.spark._copy_job", what, addr, src, dst,
             str(tmp / "parquet"), str(tmp / "checkpoints"), str(per_trigger)],
            cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=log,
            start_new_session=True,  # its own process group: the JVM and its workers with it
        )  # fmt: skip


def kill_job(proc: subprocess.Popen[bytes]) -> None:
    """SIGKILL the job's process group (the driver, its JVM and the Python workers)."""
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(60)
    assert proc.stdout is not None
    if not proc.stdout.closed:
        proc.stdout.close()


def log_tail(tmp: Path, what: str) -> str:
    return (tmp / f"{what}.log").read_text(errors="replace")[-3000:]


def parquet_batches(tmp: Path) -> int:
    """Micro-batches the Parquet copy has committed (its sink's log: a file per batch)."""
    meta = tmp / "parquet" / "_spark_metadata"
    return sum(1 for f in meta.iterdir() if f.name.isdigit()) if meta.is_dir() else 0


def stored(client: Client, topic: str) -> int:
    return sum(p.high_watermark for p in client.describe_topic(topic).partitions)


@pytest.mark.parametrize(
    ("n", "kill_at"),
    [
        pytest.param(N_SMALL, KILLS_SMALL, id="1-kill"),
        pytest.param(N, KILLS, id="3-kills", marks=pytest.mark.slow),
    ],
)
def test_copies_survive_sigkills_exactly_once(
    spark: Any, broker: Any, tmp_path: Path, n: int, kill_at: tuple[tuple[int, int], ...]
) -> None:
    src, dst = topic_name("eo-in"), topic_name("eo-out")
    create_topic(broker.addr, src, PARTITIONS)
    create_topic(broker.addr, dst, PARTITIONS)
    per_trigger = n // 5
    with Producer(broker.addr) as p:
        for i in range(n):
            p.send(src, b"%06d" % i, key=b"k%d" % (i % 97))
    kills = 0
    with Client(broker.addr) as client:
        for threshold, batches in kill_at:
            jobs = {
                w: start_job(w, broker.addr, src, dst, tmp_path, per_trigger=per_trigger)
                for w in ("topic", "parquet")
            }
            try:
                deadline = time.monotonic() + RUN_S
                # each copy is killed once past its own threshold
                while any(job.returncode is None for job in jobs.values()):
                    assert time.monotonic() < deadline, "the copies never reached the thresholds"
                    for w, job in jobs.items():
                        if job.returncode is not None:
                            continue
                        assert job.poll() is None, f"the {w} job ended: " + log_tail(tmp_path, w)
                        done = (
                            stored(client, dst) >= threshold
                            if w == "topic"
                            else parquet_batches(tmp_path) >= batches
                        )
                        if done:
                            kill_job(job)
                    time.sleep(0.1)
            finally:
                for job in jobs.values():
                    kill_job(job)
            kills += 1
        jobs = {
            w: start_job(w, broker.addr, src, dst, tmp_path, per_trigger=per_trigger)
            for w in ("topic", "parquet")
        }
        try:
            for w, job in jobs.items():
                assert job.wait(RUN_S) == 0, log_tail(tmp_path, w)
                assert job.stdout is not None
                assert job.stdout.read().strip().endswith(b"done")
        finally:
            for job in jobs.values():
                kill_job(job)
    assert kills == len(kill_at)

    want = read_topic(broker.addr, src)
    got = read_topic(broker.addr, dst)
    every = [r.value for rs in got.values() for r in rs]
    assert [v for v, n in Counter(every).items() if n > 1] == []
    assert sorted(every) == [b"%06d" % i for i in range(n)]
    for p in range(PARTITIONS):  # same keys, same partitioner: each partition in its order
        assert [r.value for r in got[p]] == [r.value for r in want[p]]

    rows = spark.read.parquet(str(tmp_path / "parquet")).collect()
    assert len(rows) == n
    assert len({(r.partition, r.offset) for r in rows}) == n
    by_partition: dict[int, list[Any]] = {}
    for r in sorted(rows, key=lambda r: (r.partition, r.offset)):
        by_partition.setdefault(r.partition, []).append(r.value)
    for p in range(PARTITIONS):
        assert by_partition[p] == [r.value for r in want[p]]
