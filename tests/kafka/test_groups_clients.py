"""Kafka's group protocol with real clients against the Kafka listener: a kafka-python
group of three that rebalances once when one member leaves, commit and resume, and a
confluent-kafka (librdkafka) consumer with a group id whose commit metadata comes back.
Timeouts are small so the group forms in about a second."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Coroutine, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest

from tidewire.broker import Broker, BrokerConfig
from tidewire.broker.kafka_groups import KafkaGroupConfig
from tidewire.client import Client
from tidewire.server.kafka.listener import KafkaServer
from tidewire.server.tcp import ServerConfig, TcpServer

kafka = pytest.importorskip("kafka")
confluent_kafka = pytest.importorskip("confluent_kafka")

T = TypeVar("T")
#: The bound on anything the clients should reach (s): generous for a loaded 2-core box.
WITHIN_S = 30.0


class Running:
    """A broker and its Kafka listener on an event loop of their own (the clients block)."""

    def __init__(self, tmp_path: Path) -> None:
        self.tmp_path = tmp_path
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.broker: Broker
        self.server: KafkaServer
        self.tcp: TcpServer

    def call(self, coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(WITHIN_S)

    def start(self) -> None:
        self.thread.start()
        self.call(self._start())

    async def _start(self) -> None:
        cfg = BrokerConfig(
            data_dir=str(self.tmp_path / "data"),
            kafka_groups=KafkaGroupConfig(initial_rebalance_delay_ms=300),
        )
        self.broker = Broker(cfg)
        await self.broker.start()
        listen = ServerConfig(host="127.0.0.1", port=0, kafka_port=0)
        self.server = KafkaServer(self.broker, listen)
        await self.server.start()
        self.tcp = TcpServer(self.broker, listen)  # tidewire's own protocol, for its views
        await self.tcp.start()

    async def _stop(self) -> None:
        await self.server.close(grace_s=1.0)
        await self.tcp.close(grace_s=1.0)
        await self.broker.close()

    def stop(self) -> None:
        self.call(self._stop())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(WITHIN_S)
        self.loop.close()

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.server.port}"

    def on_loop(self, fn: Callable[[], T]) -> T:
        async def call() -> T:
            return fn()

        return self.call(call())


@pytest.fixture
def running(tmp_path: Path) -> Iterator[Running]:
    r = Running(tmp_path)
    r.start()
    try:
        yield r
    finally:
        r.stop()


def wait_until(what: str, ok: Callable[[], bool]) -> None:
    deadline = time.monotonic() + WITHIN_S
    while not ok():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {WITHIN_S} s: {what}")
        time.sleep(0.05)


def produce(r: Running, topic: str, n: int) -> None:
    producer = kafka.KafkaProducer(bootstrap_servers=r.bootstrap, acks="all")
    try:
        for i in range(n):
            producer.send(topic, key=b"k%d" % (i % 7), value=b"v%d" % i)
        producer.flush(WITHIN_S)
    finally:
        producer.close(WITHIN_S)


def consumer(r: Running, group: str, **kw: Any) -> Any:
    return kafka.KafkaConsumer(
        bootstrap_servers=r.bootstrap,
        group_id=group,
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        session_timeout_ms=3_000,
        heartbeat_interval_ms=100,
        max_poll_interval_ms=10_000,
        request_timeout_ms=20_000,
        metadata_max_age_ms=1_000,
        **kw,
    )


class Member(threading.Thread):
    """A kafka-python consumer polling in a thread of its own (it is not thread-safe)."""

    def __init__(self, r: Running, group: str, topic: str) -> None:
        super().__init__(daemon=True)
        self.c = consumer(r, group)
        self.c.subscribe([topic])
        self.halt = threading.Event()
        self.assigned: set[tuple[str, int]] = set()
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            while not self.halt.is_set():
                self.c.poll(timeout_ms=100)
                self.assigned = {(tp.topic, tp.partition) for tp in self.c.assignment()}
        except BaseException as exc:  # reported by the test
            self.error = exc
        finally:
            self.c.close()  # a LeaveGroup

    def leave(self) -> None:
        self.halt.set()
        self.join(WITHIN_S)
        assert self.error is None, self.error


def test_kafka_python_group_of_three_rebalances_once_when_one_leaves(running: Running) -> None:
    r = running
    r.on_loop(lambda: r.broker.create_topic("orders", 3))
    members = [Member(r, "workers", "orders") for _ in range(3)]
    for m in members:
        m.start()
    try:

        def spread() -> bool:
            owned = [m.assigned for m in members]
            return all(len(o) == 1 for o in owned) and len(set().union(*owned)) == 3

        wait_until("each of 3 members owns one partition", spread)
        d = r.on_loop(lambda: r.broker.kafka_groups.describe("workers"))
        assert d is not None
        assert str(d.state) == "Stable"
        generation = d.generation
        # tidewire's own view: the members with their partitions
        view = r.on_loop(lambda: r.broker.groups.describe("workers"))
        assert sorted(tp for m in view.members for tp in m.assignment) == [
            ("orders", 0),
            ("orders", 1),
            ("orders", 2),
        ]
        members[2].leave()
        rest = members[:2]

        def covered() -> bool:
            owned = [m.assigned for m in rest]
            return len(set().union(*owned)) == 3 and all(owned)

        wait_until("the 2 members left own all 3 partitions", covered)
        d = r.on_loop(lambda: r.broker.kafka_groups.describe("workers"))
        assert d is not None
        assert len(d.members) == 2
        assert d.generation == generation + 1  # one rebalance, no extra ones
    finally:
        for m in members:
            if m.is_alive():
                m.leave()


def test_kafka_python_commit_and_resume(running: Running) -> None:
    r = running
    r.on_loop(lambda: r.broker.create_topic("log", 1))
    produce(r, "log", 20)
    c = consumer(r, "resume")
    c.subscribe(["log"])
    seen: list[bytes] = []
    deadline = time.monotonic() + WITHIN_S
    while len(seen) < 10 and time.monotonic() < deadline:
        for recs in c.poll(timeout_ms=200, max_records=10 - len(seen)).values():
            seen.extend(rec.value for rec in recs)
    assert seen == [b"v%d" % i for i in range(10)]
    tp = kafka.TopicPartition("log", 0)
    c.commit({tp: kafka.OffsetAndMetadata(10, "after ten", -1)})
    c.close()
    committed = r.on_loop(lambda: r.broker.groups.committed("resume"))
    assert (committed[("log", 0)].offset, committed[("log", 0)].metadata) == (10, "after ten")
    again = consumer(r, "resume")
    again.subscribe(["log"])
    rest: list[bytes] = []
    deadline = time.monotonic() + WITHIN_S
    while len(rest) < 10 and time.monotonic() < deadline:
        for recs in again.poll(timeout_ms=200).values():
            rest.extend(rec.value for rec in recs)
    assert rest == [b"v%d" % i for i in range(10, 20)]
    assert again.committed(tp) == 10
    # tidewire's own clients (and so the CLI) see the Kafka group, its member and its lag
    with Client(f"127.0.0.1:{r.tcp.port}") as tw:
        d = tw.describe_group("resume")
        assert (d.state, d.strategy) == ("stable", "range")
        assert [[(a.topic, a.partition) for a in m.assignment] for m in d.members] == [[("log", 0)]]
        assert [(o.committed, o.end_offset, o.lag, o.metadata) for o in d.offsets] == [
            (10, 20, 10, "after ten")
        ]
        assert [(g.group_id, g.members) for g in tw.list_groups()] == [("resume", 1)]
    again.close()


def test_confluent_kafka_consumer_with_a_group_id(running: Running) -> None:
    r = running
    r.on_loop(lambda: r.broker.create_topic("events", 2))
    produce(r, "events", 10)
    c = confluent_kafka.Consumer(
        {
            "bootstrap.servers": r.bootstrap,
            "group.id": "rdkafka",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
            "session.timeout.ms": 3000,
            "heartbeat.interval.ms": 100,
            "topic.metadata.refresh.interval.ms": 1000,
        }
    )
    try:
        c.subscribe(["events"])
        values: list[bytes] = []
        deadline = time.monotonic() + WITHIN_S
        while len(values) < 10 and time.monotonic() < deadline:
            msg = c.poll(0.2)
            if msg is None:
                continue
            assert msg.error() is None, msg.error()
            values.append(msg.value())
        assert sorted(values) == sorted(b"v%d" % i for i in range(10))
        parts = [confluent_kafka.TopicPartition("events", p, 3, metadata=f"m{p}") for p in (0, 1)]
        c.commit(offsets=parts, asynchronous=False)
        got = c.committed([confluent_kafka.TopicPartition("events", p) for p in (0, 1)], 10)
        assert [(t.partition, t.offset, t.metadata) for t in got] == [(0, 3, "m0"), (1, 3, "m1")]
        d = r.on_loop(lambda: r.broker.kafka_groups.describe("rdkafka"))
        assert d is not None
        assert str(d.state) == "Stable"
        assert d.protocol_type == "consumer"
    finally:
        c.close()
    wait_until(
        "the librdkafka consumer left the group",
        lambda: not r.on_loop(lambda: r.broker.kafka_groups.has_members("rdkafka")),
    )
