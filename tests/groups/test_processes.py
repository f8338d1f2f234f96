"""Consumer groups with real ``tidewire serve`` processes (and real consumer processes):
a SIGKILLed member's partitions move to the others within the session timeout; committed
offsets never go backwards across broker SIGKILLs; a consumer killed and restarted processes
every acknowledged message at least once, with duplicates only from the uncommitted window
(checked with the history checker)."""

from __future__ import annotations

import asyncio
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.cli._support import serving, start_serve, stop, subprocess_env
from tests.server._history import Ack, check_history
from tidewire.client import AsyncClient, AsyncGroupConsumer, Client, Message
from tidewire.errors import TidewireError
from tidewire.protocol.messages import CommitPartition, OffsetCommitRequest

pytestmark = pytest.mark.crash

#: A consumer process: joins group "g" for topic "t", processes a record in 2 ms (printing
#: "partition offset value"), and auto-commits every 200 ms.
CONSUMER = """
import sys, time
from tidewire.client import GroupConsumer
addr, session = sys.argv[1], int(sys.argv[2])
with GroupConsumer(addr, "g", topics=["t"], auto_offset_reset="earliest",
                   session_timeout_ms=session, heartbeat_interval_ms=100,
                   auto_commit_interval_ms=200, max_wait_ms=100) as c:
    print("assigned", flush=True)
    for r in c:
        time.sleep(0.002)
        print(r.partition, r.offset, r.value.decode(), flush=True)
"""


def consumer_process(addr: str, session_ms: int) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", CONSUMER, addr, str(session_ms)],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env=subprocess_env(),
    )


def kill(proc: subprocess.Popen[str]) -> None:
    if proc.poll() is None:
        os.kill(proc.pid, signal.SIGKILL)
    proc.wait(30)
    if proc.stdout is not None:
        proc.stdout.close()


def test_a_killed_members_partitions_move_within_the_session_timeout(tmp_path: Path) -> None:
    session_ms = 1_000
    with serving(tmp_path / "data", "--partitions", "6") as (_, port):
        addr = f"127.0.0.1:{port}"
        with Client(addr) as c:
            c.create_topic("t", 6)
        other = consumer_process(addr, session_ms)
        try:

            async def main() -> float:
                async with AsyncGroupConsumer(
                    addr, "g", topics=["t"], session_timeout_ms=session_ms,
                    heartbeat_interval_ms=100, max_wait_ms=100,
                ) as me:  # fmt: skip
                    while len(me.assignment()) != 3:  # the other process holds the rest
                        await me.poll(0.1)
                    killed = time.monotonic()
                    kill(other)
                    while len(me.assignment()) != 6:
                        await me.poll(0.1)
                    return time.monotonic() - killed

            took = asyncio.run(asyncio.wait_for(main(), 60))
        finally:
            kill(other)
    # session timeout, then the broker's check (100 ms), a heartbeat (100 ms), the rejoin
    assert took < session_ms / 1000 + 1.0, f"took {took:.2f} s"


KILLS = int(os.environ.get("TIDEWIRE_GROUP_KILLS", "10"))


def test_committed_offsets_never_go_backwards_across_broker_sigkills(tmp_path: Path) -> None:
    rng = random.Random(3)
    acked: dict[int, int] = {}  # partition -> highest acknowledged commit
    seen: dict[int, int] = {}  # partition -> highest offset fetched after a restart
    commits = 0

    async def load(addr: str, seconds: float) -> None:
        nonlocal commits
        async with AsyncClient(addr, request_timeout_s=5) as client:
            deadline = time.monotonic() + seconds
            n = max(acked.values(), default=0)
            while time.monotonic() < deadline:
                n += 1
                req = OffsetCommitRequest(
                    group_id="g", partitions=[CommitPartition("t", p, n) for p in range(3)]
                )
                try:
                    resp = await client._call(req)
                except TidewireError:
                    return  # the broker died under us
                assert all(r.error_code == 0 for r in resp.body.results)
                for p in range(3):
                    acked[p] = n
                commits += 1

    async def check(addr: str) -> None:
        async with AsyncClient(addr) as client:
            got = await client.committed_offsets("g")
        for p in range(3):
            off = got.get(("t", p), -1)
            assert off >= acked.get(p, -1), f"partition {p}: {off} < acknowledged {acked[p]}"
            assert off >= seen.get(p, -1), f"partition {p}: {off} went back from {seen[p]}"
            seen[p] = off

    data = tmp_path / "data"
    proc, port = start_serve(data, "--partitions", "3")
    try:
        with Client(f"127.0.0.1:{port}") as c:
            c.create_topic("t", 3)
        for _ in range(KILLS):
            addr = f"127.0.0.1:{port}"

            async def round_(addr: str = addr, pid: int = proc.pid) -> None:
                task = asyncio.create_task(load(addr, 5.0))
                await asyncio.sleep(rng.uniform(0.1, 0.4))
                os.kill(pid, signal.SIGKILL)  # mid-load: commits in flight
                await task

            asyncio.run(round_())
            stop(proc)
            proc, port = start_serve(data, "--partitions", "3")
            asyncio.run(check(f"127.0.0.1:{port}"))
    finally:
        stop(proc)
    assert commits > KILLS
    assert min(seen.values()) > 0


def test_a_killed_consumer_restarted_processes_every_acknowledged_message(tmp_path: Path) -> None:
    sent: list[bytes] = []
    acks: list[Ack] = []
    with serving(tmp_path / "data", "--partitions", "3") as (_, port):
        addr = f"127.0.0.1:{port}"
        with Client(addr) as c:
            c.create_topic("t", 3)

            def produce(batches: int) -> None:
                for _ in range(batches):
                    for p in range(3):
                        values = tuple(f"v{len(sent) + i}".encode() for i in range(5))
                        sent.extend(values)
                        base = c.produce("t", p, [Message(v) for v in values])
                        acks.append(Ack(p, base, values))

            produce(100)
            first = consumer_process(addr, 1_000)
            assert first.stdout is not None
            assert first.stdout.readline() == "assigned\n"
            run1: list[tuple[int, int, bytes]] = []
            while len(run1) < 800:  # processing; auto-commits every 200 ms meanwhile
                part, off, value = first.stdout.readline().split()
                run1.append((int(part), int(off), value.encode()))
            os.kill(first.pid, signal.SIGKILL)
            first.wait(30)
            # what it printed before it died, still in the pipe, was processed too
            for line in first.stdout.read().splitlines():
                part, off, value = line.split()
                run1.append((int(part), int(off), value.encode()))
            kill(first)
            committed = c.committed_offsets("g")
            produce(20)
            second = consumer_process(addr, 1_000)
            assert second.stdout is not None
            second.stdout.readline()
            run2: list[tuple[int, int, bytes]] = []
            done = {(p, o) for p, o, _ in run1}
            total = len(sent)
            while len(done) < total:
                line = second.stdout.readline()
                if not line:
                    break
                part, off, value = line.split()
                run2.append((int(part), int(off), value.encode()))
                done.add((int(part), int(off)))
            kill(second)
    assert len(done) == total
    # every acknowledged message processed, nothing skipped, nothing phantom
    processed: dict[int, dict[int, bytes]] = {}
    for p, o, v in run1 + run2:
        processed.setdefault(p, {})[o] = v
    read = {p: sorted(offs.items()) for p, offs in processed.items()}
    assert check_history(sent, acks, read) == []
    # duplicates only from the uncommitted window: offsets at or after what was committed
    # when the first consumer died, and processed before it died
    for p, o, v in run2:
        if (p, o, v) in set(run1):
            assert o >= committed.get(("t", p), 0), f"{p}/{o} was committed, yet read again"
    for p in range(3):
        starts = [o for q, o, _ in run2 if q == p]
        assert not starts or starts[0] == committed.get(("t", p), 0)
    assert any(committed.get(("t", p), 0) > 0 for p in range(3))
    assert run2
