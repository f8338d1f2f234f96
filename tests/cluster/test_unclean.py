"""The last in-sync replica loses its unflushed tail: real ``tidewire serve --cluster``
processes over a real etcd, ``--fsync interval`` (a long interval, so nothing is synced).

What the test does to the leader's log. An ``acks=all`` produce under ``fsync=interval`` is
answered once every in-sync replica has *written* it: the bytes are in the OS's page cache,
not on disk. A SIGKILL does not lose them (the page cache outlives the process); a power cut
or a kernel crash does: the log file comes back as long as what was last synced. The test
SIGKILLs the leader and then cuts its last segment file back to an earlier size, which is what
the file looks like after such a crash (batches are appended whole, so the cut falls between
batches, as the OS's write-back of the earlier ones would).

The story: topic ``t`` (1 partition, 3 replicas, ``min_insync_replicas`` 1). Both followers
are killed; the leader, alone in the ISR, acknowledges more; it is killed and loses its
tail (more than the followers hold). Restarted, it is the last in-sync replica, but it may
have lost acknowledged records, so it is not elected: the partition stays offline, also once
a follower (holding more than it) is back. With unclean election turned on, the replica
holding the most leads, not the marked one first in the ISR; the damaged one follows it, and
once it caught up its mark is deleted.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from pathlib import Path

import msgspec
import pytest

from tests.cli._support import start_serve, stop
from tests.cluster._etcd import EtcdServer
from tests.cluster._nodes import node_metadata as metadata
from tests.cluster._workload import until as _until
from tidewire.client import AsyncClient
from tidewire.client._client import Message
from tidewire.client._transport import Transport
from tidewire.cluster.etcd import EtcdClient
from tidewire.cluster.lost_tail import (
    BOOT_ID_FILE,
    KERNEL_BOOT_ID,
    kernel_boot_id,
    lost_tail_prefix,
    same_boot,
)
from tidewire.cluster.metadata import MetadataStore, TopicInfo
from tidewire.cluster.node import UNCLEAN_KEY
from tidewire.protocol.messages import (
    ACKS_DURABLE,
    CreateTopicRequest,
    PartitionInfo,
)
from tidewire.storage.fs import OsFileSystem

SESSION_S = 2
WAIT_S = 40.0
#: How long the partition is watched staying offline (a negative check: the controller had
#: this long, after it saw the node, to elect it wrongly; no time is asserted).
OFFLINE_WATCH_S = 3.0


async def until(what: str, probe, timeout_s: float = WAIT_S):  # type: ignore[no-untyped-def]
    return await _until(what, probe, timeout_s)


def last_segment(data_dir: Path) -> Path:
    return sorted((data_dir / "t-0").glob("*.log"))[-1]


def test_a_node_marks_its_replicas_after_an_unclean_shutdown_and_clears_them(
    tmp_path: Path, etcd: EtcdServer
) -> None:
    """The marks themselves (in-process, real etcd): after an unclean shutdown every local
    log but the broker's internal ones under fsync=interval is marked with its end
    (fsync=always ones are not: they lose nothing acknowledged); a restart finds its marks
    again, clean or not; a leadership older than the mark is void; a cleared mark is gone
    from etcd."""
    from tidewire.broker import Broker, BrokerConfig
    from tidewire.cluster.lost_tail import LostTails, read_lost_tails
    from tidewire.cluster.node import TOPIC_ID_FILE
    from tidewire.records import BatchBuilder
    from tidewire.storage import FsyncPolicy, LogConfig

    async def main() -> None:
        broker = Broker(BrokerConfig(data_dir=str(tmp_path / "n"), auto_create_topics=False))
        await broker.start()
        try:
            broker.create_topic("loose", partitions=2, config=LogConfig(fsync=FsyncPolicy.INTERVAL))
            broker.create_topic("safe", partitions=1, config=LogConfig(fsync=FsyncPolicy.ALWAYS))
            broker.create_topic("local", partitions=1)  # no id (made before ids): marked too
            for name in ("loose", "safe"):
                for plog in broker.logs.logs.values():
                    if plog.directory.rsplit("/", 1)[-1].startswith(name + "-"):
                        Path(plog.directory, TOPIC_ID_FILE).write_text("id-" + name)
            builder = BatchBuilder()
            builder.append(b"x", timestamp_ms=1)
            broker.log("loose", 1).append(builder.build())
            async with EtcdClient([etcd.endpoint], timeout_s=5) as c:
                store = MetadataStore(c, "u")
                tails = LostTails(store, 7)
                await tails.load_and_mark(broker, clean=False, id_file=TOPIC_ID_FILE)
                assert sorted(tails.marks) == [("local", 0), ("loose", 0), ("loose", 1)]
                assert tails.marks["loose", 1].end == 1
                assert tails.marks["loose", 1].topic_id == "id-loose"
                marks = await read_lost_tails(store)
                assert marks["loose", 1][7].end == 1
                rev = tails.marks["loose", 0].revision
                assert tails.voids(("loose", 0), rev - 1)
                assert not tails.voids(("loose", 0), rev + 1)
                assert not tails.voids(("safe", 0), 0)
                again = LostTails(store, 7)  # a clean restart: the marks are still there
                await again.load_and_mark(broker, clean=True, id_file=TOPIC_ID_FILE)
                assert sorted(again.marks) == sorted(tails.marks)
                again.clear_soon(("loose", 0))

                async def cleared() -> bool | None:
                    return True if ("loose", 0) not in await read_lost_tails(store) else None

                await until("the mark deleted", cleared)
                assert ("loose", 0) not in again.marks
        finally:
            await broker.close()

    asyncio.run(main())


@pytest.mark.slow
def test_the_last_in_sync_replica_that_lost_its_tail_is_not_elected(
    tmp_path: Path, etcd: EtcdServer
) -> None:
    endpoint = f"etcd://127.0.0.1:{etcd.client_port}"
    procs: dict[int, object] = {}
    ports: dict[int, int] = {}

    def start(n: int) -> None:
        args = ["--node-id", str(n), "--cluster", endpoint, "--session-timeout", str(SESSION_S)]
        args += ["--fsync", "interval", "--flush-interval-ms", "3600000"]
        if n in ports:  # the same address again (the last --port counts)
            args += ["--port", str(ports[n])]
        proc, port = start_serve(tmp_path / f"node{n}", *args)
        procs[n] = proc
        ports.setdefault(n, port)

    def kill(n: int) -> None:
        proc = procs.pop(n)
        os.kill(proc.pid, signal.SIGKILL)  # type: ignore[attr-defined]
        stop(proc)  # type: ignore[arg-type]

    def addr(n: int) -> str:
        return f"127.0.0.1:{ports[n]}"

    async def part(n: int) -> PartitionInfo:
        meta = await metadata(addr(n))
        (p,) = next(t for t in meta.topics if t.name == "t").partitions
        return p

    async def produce(n: int, *values: bytes) -> int:
        async with AsyncClient(addr(n), request_timeout_s=WAIT_S) as c:
            return await c.produce("t", 0, [Message(v) for v in values], acks=ACKS_DURABLE)

    async def main() -> None:
        for n in (1, 2, 3):
            start(n)

        async def registered() -> bool | None:
            return True if len((await metadata(addr(1))).nodes) == 3 else None

        await until("3 nodes registered", registered)
        t = Transport(addr(1), request_timeout_s=WAIT_S)
        try:
            reply = await t.request(
                CreateTopicRequest(
                    name="t", partitions=1, replication_factor=3, min_insync_replicas=1
                )
            )
        finally:
            await t.close()
        assert reply is not None
        assert reply.body.error_code == 0, reply

        async def in_sync() -> PartitionInfo | None:
            p = await part(1)
            return p if p.leader >= 0 and len(p.isr) == 3 else None

        p = await until("every replica in sync", in_sync)
        leader = p.leader
        f1, f2 = (n for n in (1, 2, 3) if n != leader)
        assert await produce(leader, b"a0", b"a1") == 0
        await until("all in sync at 2", in_sync)
        size_after_a1 = last_segment(tmp_path / f"node{leader}").stat().st_size
        assert await produce(leader, b"a2", b"a3", b"a4") == 2

        async def followers_hold_a4() -> bool | None:
            ends = [last_segment(tmp_path / f"node{f}").stat().st_size for f in (f1, f2)]
            size = last_segment(tmp_path / f"node{leader}").stat().st_size
            return True if ends == [size, size] else None

        await until("the followers hold a0..a4", followers_hold_a4)
        kill(f1)
        kill(f2)

        async def alone() -> bool | None:
            q = await part(leader)
            return True if q.isr == [leader] and q.leader == leader else None

        await until("the leader alone in the ISR", alone)
        # Acknowledged by the last in-sync replica alone (min_insync_replicas 1).
        assert await produce(leader, b"b0", b"b1") == 5
        kill(leader)
        # The crash: the leader's segment comes back as it was after a1 (a2.. were not synced).
        with open(last_segment(tmp_path / f"node{leader}"), "r+b") as f:
            f.truncate(size_after_a1)
        # ... and the machine came back with another boot (a process SIGKILLed on the boot
        # still running loses nothing: its writes are in the page cache).
        (tmp_path / f"node{leader}" / BOOT_ID_FILE).write_text("a-boot-before-the-crash\n")

        async with EtcdClient([etcd.endpoint], timeout_s=5) as c:
            store = MetadataStore(c, "default")
            start(leader)

            async def marked() -> bool | None:
                kvs, _ = await c.range(lost_tail_prefix(store), prefix=True)
                keys = {kv.key.decode()[len(lost_tail_prefix(store)) :] for kv in kvs}
                return True if f"{leader}/t/0" in keys else None

            await until("the restarted leader's lost-tail mark", marked)

            async def seen() -> bool | None:
                return (
                    True
                    if leader in {x.node_id for x in (await metadata(addr(leader))).nodes}
                    else None
                )

            await until("the restarted node registered", seen)

            async def decided() -> PartitionInfo | None:
                q = await part(leader)
                return q if q.leader_epoch > p.leader_epoch else None

            # Restarted within its session, it was still named leader: that leadership is
            # void (decided before its mark), the controller decides again (next epoch).
            q = await until("the controller decides again", decided)
            assert q.leader == -1, q
            # The last in-sync replica may have lost acknowledged records: not elected.
            deadline = time.monotonic() + OFFLINE_WATCH_S
            while time.monotonic() < deadline:
                q = await part(leader)
                assert q.leader == -1, q
                await asyncio.sleep(0.2)
            # A follower that holds more comes back: out of the ISR, it is not elected
            # cleanly either.
            start(f1)

            async def f1_seen() -> bool | None:
                nodes = {x.node_id for x in (await metadata(addr(leader))).nodes}
                return True if f1 in nodes else None

            await until("the follower registered", f1_seen)
            # SIGKILLed on this boot, it lost nothing: not marked.
            # (The restarted leader's other fsync=interval replicas, such as a copy of
            # another node's audit log, carry marks of their own.)
            kvs, _ = await c.range(lost_tail_prefix(store), prefix=True)
            keys = {kv.key.decode()[len(lost_tail_prefix(store)) :] for kv in kvs}
            assert f"{leader}/t/0" in keys, keys
            assert all(k.startswith(f"{leader}/") for k in keys), keys
            deadline = time.monotonic() + OFFLINE_WATCH_S
            while time.monotonic() < deadline:
                q = await part(leader)
                assert q.leader == -1, q
                await asyncio.sleep(0.2)
            assert q.isr == [leader]
            # Unclean election on: the replica holding the most leads (node f1: a0..a4),
            # not the marked last in-sync replica (a0, a1).
            got = await c.get(store.topic_key("t"))
            assert got is not None
            info = msgspec.json.decode(got.value, type=TopicInfo)
            config = {**info.config, UNCLEAN_KEY: "true"}
            await c.put(
                store.topic_key("t"),
                msgspec.json.encode(msgspec.structs.replace(info, config=config)),
            )

            async def led() -> PartitionInfo | None:
                q = await part(f1)
                return q if q.leader >= 0 else None

            q = await until("a leader elected uncleanly", led)
            assert q.leader == f1, q
            assert await until("acks=all on the new leader", lambda: produce(f1, b"c0")) == 5

            async def marks_gone() -> bool | None:
                kvs, _ = await c.range(lost_tail_prefix(store), prefix=True)
                keys = {kv.key.decode()[len(lost_tail_prefix(store)) :] for kv in kvs}
                return True if not {k for k in keys if k.endswith("/t/0")} else None

            # The new leader's own mark goes (elected knowingly), the old one's once it caught
            # up. (The restarted node's marks of other topics, such as its copy of another
            # node's audit log, follow the same rule in their own time: an audit log whose
            # last in-sync replica was this node stays offline until that topic allows an
            # unclean election.)
            await until("every lost-tail mark of t deleted", marks_gone)
            async with AsyncClient(addr(leader), request_timeout_s=WAIT_S) as cl:

                async def copied() -> list[bytes] | None:
                    got = await cl.fetch("t", 0, 0)
                    values = [r.value for r in got.records]
                    return values if len(values) == 6 else None

                values = await until("the old leader copies the new one", copied)
            # What the last in-sync replica alone had acknowledged (b0, b1) was lost with its
            # tail; nothing else was.
            assert values == [b"a0", b"a1", b"a2", b"a3", b"a4", b"c0"]

    try:
        asyncio.run(main())
    finally:
        for proc in procs.values():
            stop(proc)  # type: ignore[arg-type]


def test_a_node_tells_a_process_death_from_a_machine_crash_by_the_boot_id(tmp_path: Path) -> None:
    fs = OsFileSystem()
    d = str(tmp_path)
    assert not same_boot(fs, d, "boot-1")  # a new data directory: nothing known
    assert (tmp_path / BOOT_ID_FILE).read_text() == "boot-1\n"
    assert same_boot(fs, d, "boot-1")  # the process died, the machine did not
    assert not same_boot(fs, d, "boot-2")  # the machine restarted in between
    assert same_boot(fs, d, "boot-2")
    assert not same_boot(fs, d, "")  # a system that does not tell: take the worst
    (tmp_path / BOOT_ID_FILE).write_bytes(b"\xff\xfe")
    assert not same_boot(fs, d, "boot-2")  # unreadable: another boot, and rewritten
    assert same_boot(fs, d, "boot-2")
    assert kernel_boot_id() == Path(KERNEL_BOOT_ID).read_text().strip()
    assert kernel_boot_id(str(tmp_path / "missing")) == ""
