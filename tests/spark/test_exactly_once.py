"""Exactly once under crashes, after Kafka's own transactions test: 100,000 messages copied
topic -> topic (the tidewire sink) and topic -> Parquet (Spark's file sink) by a streaming job
in a child process that is SIGKILLed three times past 20% of the copy and restarted from its
checkpoints each time. The copies equal the input as a set, with no duplicate, and keep the
order within each partition."""

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

N = 100_000
PARTITIONS = 4
#: Output records at which the job is killed: past 20% of the copy, three times.
KILL_AT = (25_000, 50_000, 75_000)
#: The longest one run of the job may take (s).
RUN_S = 300
REPO = Path(__file__).resolve().parents[2]


def start_job(addr: str, src: str, dst: str, tmp: Path) -> subprocess.Popen[bytes]:
    env = subprocess_env({"PYSPARK_PYTHON": sys.executable})
    with (tmp / "job.log").open("ab") as log:  # what the job says, for a failure's message
        return subprocess.Popen(
            [sys.executable, "-m", "tests.spark._copy_job", addr, src, dst,
             str(tmp / "parquet"), str(tmp / "checkpoints")],
            cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=log,
            start_new_session=True,  # its own process group: the JVM and its workers with it
        )  # fmt: skip


def kill_job(proc: subprocess.Popen[bytes]) -> None:
    """SIGKILL the job's process group (the driver, its JVM and the Python workers)."""
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(60)
    assert proc.stdout is not None
    proc.stdout.close()


def stored(client: Client, topic: str) -> int:
    return sum(p.high_watermark for p in client.describe_topic(topic).partitions)


def test_copies_survive_three_sigkills_exactly_once(
    spark: Any, broker: Any, tmp_path: Path
) -> None:
    src, dst = topic_name("eo-in"), topic_name("eo-out")
    create_topic(broker.addr, src, PARTITIONS)
    create_topic(broker.addr, dst, PARTITIONS)
    with Producer(broker.addr) as p:
        for i in range(N):
            p.send(src, b"%06d" % i, key=b"k%d" % (i % 97))
    kills = 0
    with Client(broker.addr) as client:
        for threshold in KILL_AT:
            job = start_job(broker.addr, src, dst, tmp_path)
            try:
                deadline = time.monotonic() + RUN_S
                while stored(client, dst) < threshold and job.poll() is None:
                    assert time.monotonic() < deadline, f"the copy never reached {threshold:,}"
                    time.sleep(0.1)
                assert job.poll() is None, (
                    "the job ended before it could be killed: "
                    + (tmp_path / "job.log").read_text(errors="replace")[-3000:]
                )
            finally:
                kill_job(job)
            kills += 1
        job = start_job(broker.addr, src, dst, tmp_path)
        try:
            assert job.wait(RUN_S) == 0, (tmp_path / "job.log").read_text(errors="replace")[-3000:]
            assert job.stdout is not None
            assert job.stdout.read().strip().endswith(b"done")
        finally:
            kill_job(job)
    assert kills == 3

    want = read_topic(broker.addr, src)
    got = read_topic(broker.addr, dst)
    every = [r.value for rs in got.values() for r in rs]
    assert [v for v, n in Counter(every).items() if n > 1] == []
    assert sorted(every) == [b"%06d" % i for i in range(N)]
    for p in range(PARTITIONS):  # same keys, same partitioner: each partition in its order
        assert [r.value for r in got[p]] == [r.value for r in want[p]]

    rows = spark.read.parquet(str(tmp_path / "parquet")).collect()
    assert len(rows) == N
    assert len({(r.partition, r.offset) for r in rows}) == N
    by_partition: dict[int, list[Any]] = {}
    for r in sorted(rows, key=lambda r: (r.partition, r.offset)):
        by_partition.setdefault(r.partition, []).append(r.value)
    for p in range(PARTITIONS):
        assert by_partition[p] == [r.value for r in want[p]]
