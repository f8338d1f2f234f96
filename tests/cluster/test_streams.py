"""Lightweight streams in a cluster: ``__streams`` replicated through etcd, each stream served
by its owner (the leader of its partition), clients routed to it, the iPubSub mode answering
from any node, streams that carry on at a new owner when the old one's node goes, and
followers that give back the expired segments their owner deleted.

Three in-process nodes (broker, TCP server, :class:`ClusterNode` with its real replica
manager) in one event loop, against the real etcd of the ``etcd`` fixture. Every wait is
bounded; nothing asserts on how long something took.
"""

from __future__ import annotations

import asyncio
import os
import re
import signal
import subprocess
from collections.abc import Awaitable
from contextlib import AbstractAsyncContextManager
from pathlib import Path
from urllib.parse import quote

import httpx
import msgspec
import pytest

from tests.broker._support import PROMPT_S
from tests.broker.streams._support import FakeClock, streams_broker
from tests.broker.streams.test_manager import until as until_true
from tests.cli._support import popen_serve, stop
from tests.cluster._etcd import EtcdServer
from tests.cluster._inprocess import InProcessNode, in_process_cluster, until
from tests.cluster._nodes import call, node_metadata, wait_until
from tidewire.broker import Broker, BrokerConfig
from tidewire.broker.offsets import STREAMS_TOPIC
from tidewire.broker.streams.model import partition_of
from tidewire.client import AsyncClient, StreamMessage
from tidewire.client._streams import AUTO_UUID_PREFIX, stream_partition
from tidewire.client._streams import STREAMS_TOPIC as CLIENT_STREAMS_TOPIC
from tidewire.client._transport import Transport
from tidewire.errors import NotEnoughReplicasError, NotLeaderError, TidewireError
from tidewire.protocol.messages import (
    MetadataRequest,
    MetadataResponse,
    SendItem,
    StreamReceiveRequest,
    StreamSendRequest,
)
from tidewire.server.http.app import create_app
from tidewire.server.http.compat.ipubsub import create_ipubsub_app
from tidewire.server.http.config import HttpConfig

#: The most one test may take, bounded (it takes seconds).
TEST_S = 120.0
#: Streams enough that every node owns some (4 partitions over 3 nodes).
STREAMS = [f"sensor-{i}" for i in range(16)]


class Node(InProcessNode):
    """One node of the cluster (see :class:`InProcessNode`)."""

    def __init__(self, tmp: Path, etcd: EtcdServer, node_id: int) -> None:
        super().__init__(tmp, etcd, node_id, cluster_id="streams")


def cluster(tmp: Path, etcd: EtcdServer, n: int = 3) -> AbstractAsyncContextManager[list[Node]]:
    return in_process_cluster(lambda i: Node(tmp, etcd, i), n)


def owner_id(nodes: list[Node], stream: str) -> int:
    """The node that leads ``stream``'s partition of ``__streams`` (-1: none now), as a live
    node's copy of etcd says."""
    live = [n for n in nodes if not n.stopped]
    cache = live[0].cluster.cache
    info = cache.topics.get(STREAMS_TOPIC)
    if info is None:
        return -1
    got = cache.partition(STREAMS_TOPIC, partition_of(stream, info.partitions))
    return -1 if got is None else got[0].leader


def serving(nodes: list[Node], stream: str) -> bool:
    """Whether the owner etcd names is live and serves ``stream``'s partition."""
    leader = owner_id(nodes, stream)
    node = next((n for n in nodes if n.id == leader and not n.stopped), None)
    if node is None:
        return False
    info = node.cluster.cache.topics[STREAMS_TOPIC]
    return partition_of(stream, info.partitions) in node.broker.streams.led_partitions


async def sent_to_owner(nodes: list[Node], c: AsyncClient, stream: str) -> Node:
    """Send ``"first"`` to ``stream`` (persistent) and wait until its owner serves it: that
    node."""
    await c.streams.send(stream, "first", persistent=True)
    await until(lambda: serving(nodes, stream), "the owner serves")
    return next(n for n in nodes if n.id == owner_id(nodes, stream))


async def hand_over(nodes: list[Node], owner: Node, stream: str) -> None:
    """``owner`` hands ``stream``'s partition to another in-sync replica (its node stays
    up); returns once a new owner serves it."""
    p = partition_of(stream, owner.cluster.cache.topics[STREAMS_TOPIC].partitions)
    state = owner.cluster.cache.partition(STREAMS_TOPIC, p)
    assert state is not None
    assert await owner.cluster.resign(STREAMS_TOPIC, p, state[0].leader_epoch)
    await until(
        lambda: owner_id(nodes, stream) != owner.id and serving(nodes, stream), "a new owner"
    )


def run(main: Awaitable[None]) -> None:
    async def bounded() -> None:
        await asyncio.wait_for(main, TEST_S)

    asyncio.run(bounded())


def test_the_client_and_broker_agree_on_the_streams_topic() -> None:
    assert CLIENT_STREAMS_TOPIC == STREAMS_TOPIC
    for s in ("a", "sensor-7", "ü/x", "\udcff"):
        for n in (1, 4, 7):
            assert stream_partition(s, n) == partition_of(s, n)


def test_streams_are_served_by_their_owners_and_carry_on_at_a_new_one(
    tmp_path: Path, etcd: EtcdServer
) -> None:
    run(_served_by_owners(tmp_path, etcd))


async def _served_by_owners(tmp_path: Path, etcd: EtcdServer) -> None:
    async with (
        cluster(tmp_path, etcd) as nodes,
        AsyncClient(nodes[0].addr) as c1,
        AsyncClient(nodes[1].addr) as c2,
    ):
        # Sent through node 1 (routed to each owner); two persistent messages a stream.
        items = [(s, f"{s}/{i}", "", 0, True) for i in range(2) for s in STREAMS]
        results = await c1.streams.send_many(items)
        assert [r.code for r in results] == [0] * len(items), results
        await until(lambda: all(serving(nodes, s) for s in STREAMS), "owners serve")
        owners = {owner_id(nodes, s) for s in STREAMS}
        assert len(owners) >= 2, owners  # the streams are spread over several nodes
        # Listed and counted over every node (each lists the streams it owns).
        listed = [i.stream for i in await c2.streams.list("sensor-")]
        assert listed == sorted(STREAMS)
        assert [i.stream for i in await c2.streams.list("sensor-", limit=5)] == listed[:5]
        assert (await c2.streams.stats()).persistent_messages == 2 * len(STREAMS)

        # Each node refuses a stream it does not own, naming the owner; nothing stored.
        foreign = next(s for s in STREAMS if owner_id(nodes, s) != nodes[2].id)
        raw = Transport(nodes[2].addr)
        try:
            sent = await raw.request(
                StreamSendRequest(items=[SendItem(foreign, b"x", "", 0, True)])
            )
            assert sent is not None
            (refusal,) = sent.body.results
            assert refusal.code == NotLeaderError.code
            assert f"node {owner_id(nodes, foreign)}" in refusal.message
            taken = await raw.request(StreamReceiveRequest(streams=[foreign]))
            assert taken is not None
            assert taken.body.error_code == NotLeaderError.code
        finally:
            await raw.close()

        # Received through node 2 (routed): the first message of every stream, once.
        for s in STREAMS:
            got = await c2.streams.receive(s, wait_ms=5_000)
            assert got is not None, s
            assert got.value == f"{s}/0".encode(), (s, got)
        # One receive naming streams of several owners takes from them in turn.
        many = await c2.streams.receive_many(STREAMS[:6], max_messages=6, wait_ms=5_000)
        assert many
        assert all(m.value == f"{m.stream}/1".encode() for m in many)
        taken_twice = {m.stream for m in many}

        # The owner of STREAMS[0] leaves: its partitions move to in-sync replicas.
        victim = next(n for n in nodes if n.id == owner_id(nodes, STREAMS[0]))
        moved = [s for s in STREAMS if owner_id(nodes, s) == victim.id]
        await victim.stop()
        await until(lambda: all(serving(nodes, s) for s in STREAMS), "new owners serve")
        live = ",".join(n.addr for n in nodes if not n.stopped)
        async with AsyncClient(live) as c3:
            for s in moved:
                got = await c3.streams.receive(s, wait_ms=100)
                if s in taken_twice:  # both taken before the failover: none again
                    assert got is None, (s, got)
                else:  # the second, and only it: the first's take was replicated
                    assert got is not None, s
                    assert got.value == f"{s}/1".encode(), (s, got)
                    assert await c3.streams.receive(s, wait_ms=0) is None
            # Nothing acknowledged is lost: both messages of every stream are read back
            # (reads see what the in-sync replicas hold: a new leader's high watermark
            # reaches its log end once its followers have fetched from it).
            for s in STREAMS:
                want = [f"{s}/{i}".encode() for i in range(2)]
                read: list[StreamMessage] = []
                for _ in range(100):
                    read, _ = await c3.streams.read({s: ""}, max_messages=10, wait_ms=200)
                    if len(read) >= len(want):
                        break
                    await asyncio.sleep(0.05)
                assert [m.value for m in read] == want


def test_the_http_routes_and_the_ipubsub_mode_answer_from_any_node(
    tmp_path: Path, etcd: EtcdServer
) -> None:
    run(_http_from_any_node(tmp_path, etcd))


async def _http_from_any_node(tmp_path: Path, etcd: EtcdServer) -> None:
    async with cluster(tmp_path, etcd) as nodes:
        async with AsyncClient(nodes[0].addr) as c1:
            await c1.streams.send_many([(s, f'"{s}"', f"u-{s}", 0, True) for s in STREAMS])
        await until(lambda: all(serving(nodes, s) for s in STREAMS), "owners serve")
        foreign = [s for s in STREAMS if owner_id(nodes, s) != nodes[2].id]
        assert foreign
        app = create_ipubsub_app(nodes[2].broker, max_body_bytes=1 << 20)
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://node3") as http:
            for s in foreign:
                # a message sent before, taken through node 3 (forwarded to the owner)
                got = await http.get(
                    "/api/v1/streams/receive", params={"streamId": s, "timeoutSeconds": 5}
                )
                assert got.status_code == 200, got.text
                assert got.json()["message"] == s
                # sent through node 3, deduplicated by its uuid at the owner
                for _ in range(2):
                    sent = await http.post(
                        "/api/v1/streams/send",
                        content=msgspec.json.encode(
                            {"streamId": s, "messageUuid": "again", "message": {"n": 1}}
                        ),
                    )
                    assert sent.status_code == 200, sent.text
                got = await http.get(
                    "/api/v1/streams/receive", params={"streamId": s, "timeoutSeconds": 5}
                )
                assert got.status_code == 200
                assert got.json()["message"] == {"n": 1}
                got = await http.get(
                    "/api/v1/streams/receive", params={"streamId": s, "timeoutSeconds": 0}
                )
                assert got.status_code == 424, got.text
                # replayed from the stream's persistent messages (read, not taken)
                got = await http.get(
                    "/api/v1/streams/receive",
                    params={"streamId": s, "readFromDB": "true", "timeoutSeconds": 1},
                )
                assert got.status_code == 200
                assert got.json()["message"] == s
        # The native routes too: sent, described and read through node 3.
        native = httpx.ASGITransport(app=create_app(nodes[2].broker, HttpConfig()))
        async with httpx.AsyncClient(transport=native, base_url="http://node3") as http:
            s = foreign[0]
            where = "/v1/streams/" + quote(s, safe="")
            sent = await http.post(
                f"{where}/messages", json={"value": "native", "persistent": True}
            )
            assert sent.status_code == 200, sent.text
            described = await http.get(where)
            assert described.status_code == 200, described.text
            assert described.json()["persistent"] >= 2
            read = await http.get(f"{where}/read", params={"token": ""})
            assert read.status_code == 200, read.text
            assert read.json()["messages"][-1]["value"] == "native"


def test_a_waiting_receive_follows_its_stream_to_the_new_owner(
    tmp_path: Path, etcd: EtcdServer
) -> None:
    run(_receive_follows(tmp_path, etcd))


async def _receive_follows(tmp_path: Path, etcd: EtcdServer) -> None:
    async with cluster(tmp_path, etcd) as nodes:
        s = STREAMS[0]
        async with AsyncClient(",".join(n.addr for n in nodes)) as c:
            owner = await sent_to_owner(nodes, c, s)
            got = await c.streams.receive(s, wait_ms=5_000)
            assert got is not None
            assert got.value == b"first"
            waiting = asyncio.create_task(c.streams.receive(s, wait_ms=60_000))
            await until(lambda: owner.broker.streams.stats().receivers == 1, "it waits")
            # The owner hands the partition to another in-sync replica (its node stays up):
            # the receive waiting there is answered NotLeader and asks the new owner.
            await hand_over(nodes, owner, s)
            successor = next(n for n in nodes if n.id == owner_id(nodes, s))
            await until(lambda: successor.broker.streams.stats().receivers == 1, "it waits there")
            await c.streams.send(s, "second", persistent=True)
            got = await asyncio.wait_for(waiting, 30)
            assert got is not None
            assert got.value == b"second"


def test_a_send_refused_after_its_owner_stored_it_is_stored_once(
    tmp_path: Path, etcd: EtcdServer
) -> None:
    run(_stored_once(tmp_path, etcd))


async def _stored_once(tmp_path: Path, etcd: EtcdServer) -> None:
    async with cluster(tmp_path, etcd) as nodes:
        s = STREAMS[1]
        async with AsyncClient(",".join(n.addr for n in nodes)) as c:
            owner = await sent_to_owner(nodes, c, s)
            p = partition_of(s, owner.cluster.cache.topics[STREAMS_TOPIC].partitions)
            rep = owner.broker.streams._rep
            assert rep is not None
            replicated = rep.wait_replicated
            handed: list[int] = []

            async def store_then_hand_over(partition: int, end: int) -> None:
                # The send is written and every in-sync replica holds it; then, before it
                # is answered, the owner hands the partition to another in-sync replica
                # (its node stays up) and refuses the send: NotLeader, as a lost lead does.
                await replicated(partition, end)
                if partition != p or handed:
                    return
                handed.append(end)
                await hand_over(nodes, owner, s)
                raise rep.not_leader(partition)

            rep.wait_replicated = store_then_hand_over  # type: ignore[method-assign]
            sent = await c.streams.send(s, "second", persistent=True)
            assert handed, "the owner did not hand the partition over mid-send"
            assert sent.code == 0, sent  # the retry was found stored: answered as stored
            # Read back from the new owner: the message once (its high watermark reaches its
            # log end once its followers fetched from it; a second copy, stored after the
            # first, would then be readable too).
            want = [b"first", b"second"]
            read: list[StreamMessage] = []
            for _ in range(100):
                read, _ = await c.streams.read({s: ""}, max_messages=10, wait_ms=200)
                if len(read) >= len(want):
                    break
                await asyncio.sleep(0.05)
            assert [m.value for m in read] == want
            assert read[1].uuid.startswith(AUTO_UUID_PREFIX)


# --- the stream manager's cluster mode, over a fake replication --------------------------------


class FakeReplication:
    """What a node's :class:`ClusterStreams` answers, set by the test: 4 partitions led
    elsewhere (node 9) unless taken over, a high watermark per partition (default: all),
    ISRs too small where asked, and the replication waits it was asked for."""

    def __init__(self) -> None:
        self.hw: dict[int, int] = {}
        self.short: set[int] = set()
        self.waited: list[tuple[int, int]] = []
        self.appends = 0

    def partition_count(self) -> int | None:
        return 4

    async def ensure_topic(self) -> None:
        return None

    def not_leader(self, partition: int) -> NotLeaderError:
        return NotLeaderError(f"node 9 leads {STREAMS_TOPIC}/{partition}", leader_id=9)

    def isr_error(self, partition: int) -> TidewireError | None:
        return NotEnoughReplicasError("too few in sync") if partition in self.short else None

    def high_watermark(self, partition: int) -> int:
        return self.hw.get(partition, 1 << 40)

    async def wait_replicated(self, partition: int, end: int) -> None:
        self.waited.append((partition, end))

    def appended(self, partition: int) -> None:
        self.appends += 1


def _one_per_partition() -> dict[int, str]:
    """A stream id of each of the 4 partitions."""
    out: dict[int, str] = {}
    i = 0
    while len(out) < 4:
        out.setdefault(partition_of(f"s{i}", 4), f"s{i}")
        i += 1
    return out


def test_a_node_serves_only_the_partitions_it_leads(tmp_path: Path) -> None:
    async def main() -> None:
        ids = _one_per_partition()
        async with streams_broker(tmp_path, stream_partitions=4) as (_, st):
            await st.send([SendItem(sid, b"before", "", 0, True) for sid in ids.values()])
            fake = FakeReplication()
            st.replicate(fake)  # what the single node indexed is forgotten
            with pytest.raises(NotLeaderError, match="node 9"):
                await st.receive([ids[0]])
            st.take_over(0)  # indexed again from the log
            assert st.led_partitions == {0}
            got = await st.receive([ids[0]])
            assert [m.value for m in got] == [b"before"]
            assert fake.waited, "the take record waited for the replicas"
            results = await st.send(
                [SendItem(ids[0], b"here", "", 0, True), SendItem(ids[1], b"elsewhere")]
            )
            assert results[0].code == 0
            assert results[1].code == NotLeaderError.code
            assert "node 9" in results[1].message
            with pytest.raises(NotLeaderError):
                st.describe(ids[1])
            assert st.describe(ids[0]) is not None

    asyncio.run(main())


def test_giving_a_partition_up_answers_its_waiters_not_leader(tmp_path: Path) -> None:
    async def main() -> None:
        ids = _one_per_partition()
        async with streams_broker(tmp_path, stream_partitions=4) as (_, st):
            await st.send([SendItem(sid, b"x", "", 0, True) for sid in ids.values()])
            st.replicate(FakeReplication())
            st.take_over(1)
            await st.receive([ids[1]])  # the one message: now the stream is empty
            waiting = asyncio.create_task(st.receive([ids[1]], wait_ms=60_000))
            reading = asyncio.create_task(st.read({ids[1]: "$"}, wait_ms=60_000))
            await until_true(lambda: st.stats().receivers == 2, "both wait")
            st.give_up(1)
            for task in (waiting, reading):
                with pytest.raises(NotLeaderError):
                    await asyncio.wait_for(task, PROMPT_S)
            assert st.stats().streams == 0  # its streams are forgotten here
            st.take_over(1)  # back: the take is in the log, the message is not given again
            assert await st.receive([ids[1]]) == []

    asyncio.run(main())


def test_reads_see_what_the_in_sync_replicas_hold_and_writes_need_enough(
    tmp_path: Path,
) -> None:
    async def main() -> None:
        ids = _one_per_partition()
        async with streams_broker(tmp_path, stream_partitions=4) as (_, st):
            await st.send([SendItem(sid, b"x", "", 0, True) for sid in ids.values()])
            fake = FakeReplication()
            st.replicate(fake)
            st.take_over(2)
            end = st.broker.logs.get_log(STREAMS_TOPIC, 2).log_end_offset
            fake.hw[2] = end  # what follows is not on the replicas yet
            (sent,) = await st.send([SendItem(ids[2], b"new", "", 0, True)])
            assert sent.code == 0
            assert (2, end + 1) in fake.waited
            got, _ = await st.read({ids[2]: ""})
            assert [m.value for m in got] == [b"x"]
            fake.hw[2] = end + 1
            got, _ = await st.read({ids[2]: ""})
            assert [m.value for m in got] == [b"x", b"new"]
            fake.short.add(2)  # below min_insync: persistent writes refused, nothing stored
            refused, kept = await st.send(
                [SendItem(ids[2], b"p", "", 0, True), SendItem(ids[2], b"m", "", 0, False)]
            )
            assert refused.code == NotEnoughReplicasError.code
            assert kept.code == 0  # in memory: nothing to replicate
            with pytest.raises(NotEnoughReplicasError):
                await st.receive([ids[2]])

    asyncio.run(main())


# --- real processes: the owner SIGKILLed -------------------------------------------------------


def _serve(data: Path, cluster: str, n: int) -> tuple[subprocess.Popen[str], int, int]:
    """Node ``n`` as a ``tidewire serve --cluster`` process with an iPubSub port: the
    process, its protocol port and its iPubSub port."""
    proc = popen_serve(
        *("--data-dir", str(data), "--port", "0", "--http-ipubsub-port", "0"),
        *("--node-id", str(n), "--cluster", cluster, "--session-timeout", "3"),
        *("--min-insync-replicas", "2"),
    )
    assert proc.stdout is not None
    native = ipubsub = None
    for _ in range(6):
        line = proc.stdout.readline()
        if m := re.search(r"tidewire \S+ listening on 127\.0\.0\.1:(\d+)", line):
            native = int(m.group(1))
        if m := re.search(r"HTTP ipubsub listening on http://127\.0\.0\.1:(\d+)", line):
            ipubsub = int(m.group(1))
        if native and ipubsub:
            return proc, native, ipubsub
    stop(proc)
    pytest.fail(f"node {n} did not start")


def _owners(addr: str) -> dict[int, int]:
    """Partition of ``__streams`` -> its leader, as the node at ``addr`` says (empty: not
    made yet)."""
    meta = asyncio.run(call(addr, MetadataRequest(topics=[STREAMS_TOPIC]), 5.0))
    assert isinstance(meta, MetadataResponse)
    (t,) = meta.topics
    return {p.partition: p.leader for p in t.partitions}


@pytest.mark.slow  # three processes started and one killed past its session: about 15 s
def test_the_owner_killed_its_streams_go_on_at_the_new_one(
    tmp_path: Path, etcd: EtcdServer
) -> None:
    cluster_url = f"etcd://127.0.0.1:{etcd.client_port}"
    procs: dict[int, subprocess.Popen[str]] = {}
    try:
        native, ipubsub = {}, {}
        for n in (1, 2, 3):
            procs[n], native[n], ipubsub[n] = _serve(tmp_path / f"n{n}", cluster_url, n)
        addr = {n: f"127.0.0.1:{native[n]}" for n in procs}
        wait_until("3 nodes", lambda: len(asyncio.run(node_metadata(addr[1])).nodes) == 3, 30)

        async def send_and_take() -> None:
            async with AsyncClient(addr[1]) as c1, AsyncClient(addr[2]) as c2:
                items = [(s, f'"{s}/{i}"', f"{s}-{i}", 0, True) for i in range(2) for s in STREAMS]
                results = await c1.streams.send_many(items)
                assert [r.code for r in results] == [0] * len(items), results
                for s in STREAMS:  # the first of each taken through node 2
                    got = await c2.streams.receive(s, wait_ms=5_000)
                    assert got is not None, s
                    assert got.value == f'"{s}/0"'.encode()

        asyncio.run(send_and_take())
        owners = _owners(addr[3])
        victim = owners[partition_of(STREAMS[0], len(owners))]
        survivor = next(n for n in procs if n != victim)
        os.kill(procs[victim].pid, signal.SIGKILL)
        procs[victim].wait(timeout=30)
        wait_until(
            "new owners",
            lambda: (
                victim not in _owners(addr[survivor]).values()
                and -1 not in _owners(addr[survivor]).values()
            ),
            30,
        )
        # The rest taken through the iPubSub mode of a surviving node (forwarded): each
        # stream's second message, once; the first is not handed out again.
        with httpx.Client(base_url=f"http://127.0.0.1:{ipubsub[survivor]}", timeout=30) as http:
            for s in STREAMS:

                def answered(s: str = s) -> httpx.Response | None:
                    r = http.get(
                        "/api/v1/streams/receive", params={"streamId": s, "timeoutSeconds": 2}
                    )
                    return r if r.status_code in (200, 424) else None  # else: not yet

                got = wait_until(f"{s} served", answered, 30)
                assert got is not None
                assert got.status_code == 200, (s, got.text)
                assert got.json()["message"] == f"{s}/1"
                again = http.get(
                    "/api/v1/streams/receive", params={"streamId": s, "timeoutSeconds": 0}
                )
                assert again.status_code == 424, (s, again.text)
    finally:
        for proc in procs.values():
            stop(proc)


class SmallSegmentsNode(Node):
    """A node whose ``__streams`` has one partition of 4 KiB segments, its streams on
    ``clock`` (shared by the nodes: expiry is the test's to decide)."""

    def __init__(self, tmp: Path, etcd: EtcdServer, node_id: int, clock: FakeClock) -> None:
        super().__init__(tmp, etcd, node_id)
        self.cluster_id = "streams-reclaim"
        self.clock = clock

    def make_broker(self) -> Broker:
        broker = Broker(
            BrokerConfig(
                data_dir=self.data,
                auto_create_topics=False,
                stream_partitions=1,
                stream_segment_bytes=4096,
            )
        )
        broker.stream_clock = self.clock
        return broker


def test_followers_give_back_the_expired_segments_their_owner_reclaimed(
    tmp_path: Path, etcd: EtcdServer
) -> None:
    run(_followers_reclaim(tmp_path, etcd))


async def _followers_reclaim(tmp_path: Path, etcd: EtcdServer) -> None:
    clock = FakeClock()
    async with (
        in_process_cluster(lambda i: SmallSegmentsNode(tmp_path, etcd, i, clock)) as nodes,
        AsyncClient(nodes[0].addr) as c,
    ):
        value = "v" * 200
        for i in range(6):
            items = [(f"x{i}-{j}", value, "", 60_000, True) for j in range(10)]
            results = await c.streams.send_many(items)
            assert [r.code for r in results] == [0] * len(items), results
        key = (STREAMS_TOPIC, 0)
        (owner,) = [n for n in nodes if n.id == owner_id(nodes, "x0-0")]
        followers = [n for n in nodes if n is not owner]
        plog = owner.broker.logs.logs[key]
        end = plog.log_end_offset
        assert plog.segment_count > 3
        await until(
            lambda: all(f.broker.logs.logs[key].log_end_offset == end for f in followers),
            "the followers copied everything",
        )
        before = [f.broker.logs.logs[key].size_bytes for f in followers]
        # Expired: the owner's timer deletes the whole segments (its run loop ticks on the
        # shared clock), then the followers delete what is below its log start.
        clock.advance(60_000)
        owner.broker.streams.tick()
        start = plog.log_start_offset
        assert start > 0
        results = await c.streams.send_many([("keeper", "k", "", 0, True)])
        assert [r.code for r in results] == [0]
        await until(
            lambda: all(f.broker.logs.logs[key].log_start_offset == start for f in followers),
            "the followers' copies start where the owner's does",
        )
        after = [f.broker.logs.logs[key].size_bytes for f in followers]
        assert all(a < b for a, b in zip(after, before, strict=True)), (before, after)
