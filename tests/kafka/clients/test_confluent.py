"""confluent-kafka (librdkafka) against the Kafka listener, with no client setting beyond
short timeouts: admin, every compression codec, a group of three, commit and resume with
metadata, offsets for times, an idempotent producer whose connections are cut, SASL/SCRAM and
ACLs; and the failures other Kafka-compatible brokers showed under librdkafka's own test suite
(automatic topic creation through Metadata, empty CreatePartitions results, ListOffsets that
hangs, commit metadata not returned, extra rebalances)."""

from __future__ import annotations

import time
from typing import Any

import pytest

from tests.kafka.clients._records import Got, Sent, check_log, messages
from tests.kafka.clients.conftest import CODECS, WITHIN_S, Proxy, Running, wait_until
from tidewire.security.model import Operation

ck = pytest.importorskip("confluent_kafka")
from confluent_kafka.admin import AdminClient, NewPartitions, NewTopic  # noqa: E402

FAST = {
    "socket.timeout.ms": 10_000,
    "topic.metadata.refresh.interval.ms": 1_000,
    "reconnect.backoff.ms": 20,
    "reconnect.backoff.max.ms": 200,
}


def consumer_conf(r: Running, group: str, **kw: Any) -> dict[str, Any]:
    return {
        "bootstrap.servers": r.bootstrap,
        "group.id": group,
        "auto.offset.reset": "earliest",
        "enable.auto.commit": False,
        "session.timeout.ms": 3_000,
        "heartbeat.interval.ms": 100,
        **FAST,
        **kw,
    }


def produce(r: Running, topic: str, sent: list[Sent], **conf: Any) -> list[Got]:
    """Produce ``sent`` with acks=all; the places the delivery reports give."""
    p = ck.Producer({"bootstrap.servers": r.bootstrap, "linger.ms": 5, **FAST, **conf})
    placed: list[Got] = []
    errors: list[Any] = []

    def report(err: Any, msg: Any, s: Sent) -> None:
        if err is not None:
            errors.append(err)
        else:
            placed.append(Got(msg.partition(), msg.offset(), *s))

    for s in sent:
        p.produce(
            topic,
            key=s.key,
            value=s.value,
            headers=list(s.headers),
            timestamp=s.timestamp,
            on_delivery=lambda err, msg, s=s: report(err, msg, s),
        )
    assert p.flush(WITHIN_S) == 0
    assert errors == []
    return placed


def got(msg: Any) -> Got:
    ts_type, ts = msg.timestamp()
    assert ts_type == ck.TIMESTAMP_CREATE_TIME
    return Got(
        msg.partition(),
        msg.offset(),
        msg.key(),
        msg.value(),
        tuple(msg.headers() or ()),
        ts,
    )


def consume(c: Any, n: int) -> list[Got]:
    out: list[Got] = []
    deadline = time.monotonic() + WITHIN_S
    while len(out) < n and time.monotonic() < deadline:
        msg = c.poll(0.2)
        if msg is None:
            continue
        assert msg.error() is None, msg.error()
        out.append(got(msg))
    assert len(out) == n, f"{len(out)} of {n} messages within {WITHIN_S} s"
    return out


def admin(r: Running, **conf: Any) -> Any:
    return AdminClient({"bootstrap.servers": r.bootstrap, **FAST, **conf})


def test_create_topic_and_partitions_through_the_admin_client(running: Running) -> None:
    a = admin(running)
    futures = a.create_topics(
        [NewTopic("made", num_partitions=2, replication_factor=1)], operation_timeout=10
    )
    assert futures["made"].result(WITHIN_S) is None
    md = a.list_topics("made", timeout=WITHIN_S)
    assert sorted(md.topics["made"].partitions) == [0, 1]
    # CreatePartitions answers a result per topic (never an empty list)
    futures = a.create_partitions([NewPartitions("made", 4)], operation_timeout=10)
    assert list(futures) == ["made"]
    assert futures["made"].result(WITHIN_S) is None
    assert running.on_loop(lambda: running.broker.topics()["made"]) == 4
    # a second identical creation is refused by name, not silently ignored
    again = a.create_topics([NewTopic("made", num_partitions=2, replication_factor=1)])["made"]
    with pytest.raises(ck.KafkaException) as info:
        again.result(WITHIN_S)
    assert info.value.args[0].code() == ck.KafkaError.TOPIC_ALREADY_EXISTS


def test_create_topic_with_the_default_replication_factor(running: Running) -> None:
    """CreateTopics v4 (KIP-464): librdkafka's NewTopic without a replication factor, or
    without a partition count, asks for the broker's defaults (-1)."""
    a = admin(running)  # kept: the futures fail if the client is destroyed first
    futures = a.create_topics([NewTopic("plain", num_partitions=1), NewTopic("defaults")])
    assert futures["plain"].result(WITHIN_S) is None
    assert futures["defaults"].result(WITHIN_S) is None
    topics = running.on_loop(running.broker.topics)
    assert topics["plain"] == 1
    assert topics["defaults"] == running.on_loop(lambda: running.broker.config.default_partitions)


@pytest.mark.parametrize("codec", CODECS)
def test_produce_and_consume_from_the_beginning(running: Running, codec: str) -> None:
    running.create_topic("t", 3)
    sent = messages(30, codec)
    placed = produce(running, "t", sent, **{"compression.type": codec, "acks": "all"})
    c = ck.Consumer(consumer_conf(running, f"g-{codec}"))
    try:
        c.subscribe(["t"])
        check_log(sent, placed, consume(c, len(sent)))
    finally:
        c.close()
    assert running.end_offsets("t", 3) == [
        sum(1 for g in placed if g.partition == p) for p in range(3)
    ]


def test_group_of_three_rebalances_once_when_one_leaves(running: Running) -> None:
    running.create_topic("orders", 3)
    assigned: list[set[int]] = [set(), set(), set()]
    assigns = [0, 0, 0]

    def on_assign(i: int) -> Any:
        def cb(consumer: Any, partitions: list[Any]) -> None:
            assigns[i] += 1
            assigned[i] = {tp.partition for tp in partitions}

        return cb

    members = [ck.Consumer(consumer_conf(running, "workers")) for _ in range(3)]
    for i, m in enumerate(members):
        m.subscribe(["orders"], on_assign=on_assign(i))

    def poll_until(what: str, ok: Any, who: list[Any]) -> None:
        deadline = time.monotonic() + WITHIN_S
        while not ok():
            assert time.monotonic() < deadline, f"not within {WITHIN_S} s: {what}"
            for m in who:
                m.poll(0.02)

    try:
        poll_until(
            "3 members own one partition each",
            lambda: (
                sorted(p for a in assigned for p in a) == [0, 1, 2]
                and all(len(a) == 1 for a in assigned)
            ),
            members,
        )
        d = running.on_loop(lambda: running.broker.kafka_groups.describe("workers"))
        assert d is not None
        generation = d.generation
        before = list(assigns)
        members[2].close()  # a LeaveGroup
        rest = members[:2]
        assigned[2] = set()
        poll_until(
            "the 2 members left own all 3 partitions",
            lambda: sorted(p for a in assigned[:2] for p in a) == [0, 1, 2],
            rest,
        )
        for _ in range(20):  # a little longer: an extra rebalance would show here
            for m in rest:
                m.poll(0.02)
        d = running.on_loop(lambda: running.broker.kafka_groups.describe("workers"))
        assert d is not None
        assert d.generation == generation + 1  # exactly one rebalance
        assert [assigns[i] - before[i] for i in range(2)] == [1, 1]
    finally:
        for m in members[:2]:
            m.close()


def test_commit_metadata_and_resume(running: Running) -> None:
    running.create_topic("log", 1)
    sent = messages(20)
    produce(running, "log", sent)
    c = ck.Consumer(consumer_conf(running, "resume"))
    c.subscribe(["log"])
    first = consume(c, 8)
    tp = ck.TopicPartition("log", 0, 8, metadata="checkpoint-8")
    c.commit(offsets=[tp], asynchronous=False)
    (committed,) = c.committed([ck.TopicPartition("log", 0)], timeout=WITHIN_S)
    assert (committed.offset, committed.metadata) == (8, "checkpoint-8")
    c.close()
    c2 = ck.Consumer(consumer_conf(running, "resume"))
    try:
        c2.subscribe(["log"])
        rest = consume(c2, 12)
    finally:
        c2.close()
    assert [g.offset for g in first + rest] == list(range(20))
    assert [g.value for g in first + rest] == [s.value for s in sent]


def test_offsets_for_times_and_list_offsets_answer_promptly(running: Running) -> None:
    running.create_topic("ts", 1)
    running.create_topic("empty", 1)
    sent = messages(10)
    produce(running, "ts", sent)
    c = ck.Consumer(consumer_conf(running, "times"))
    try:
        (tp,) = c.offsets_for_times([ck.TopicPartition("ts", 0, sent[6].timestamp)], WITHIN_S)
        assert tp.error is None
        assert tp.offset == 6
        (tp,) = c.offsets_for_times([ck.TopicPartition("ts", 0, sent[-1].timestamp + 1)], 10)
        assert tp.offset == -1  # after the last message: none (Kafka's answer)
        c.assign([ck.TopicPartition("ts", 0, 6)])
        assert [g.offset for g in consume(c, 4)] == [6, 7, 8, 9]
        # ListOffsets never hangs, on an empty partition either
        started = time.monotonic()
        assert c.get_watermark_offsets(ck.TopicPartition("ts", 0), timeout=10) == (0, 10)
        assert c.get_watermark_offsets(ck.TopicPartition("empty", 0), timeout=10) == (0, 0)
        assert time.monotonic() - started < 10
    finally:
        c.close()


def test_automatic_topic_creation_through_metadata(running: Running) -> None:
    # a producer's Metadata asks for the topic to be created (allow_auto_topic_creation)
    placed = produce(running, "auto.created", messages(3))
    assert len(placed) == 3
    assert running.on_loop(lambda: "auto.created" in running.broker.topics())
    # a consumer that does not allow it creates nothing
    c = ck.Consumer(consumer_conf(running, "no-auto", **{"allow.auto.create.topics": False}))
    try:
        md = c.list_topics("not.created", timeout=10)
        assert md.topics["not.created"].error is not None
        assert md.topics["not.created"].error.code() == ck.KafkaError.UNKNOWN_TOPIC_OR_PART
    finally:
        c.close()
    assert running.on_loop(lambda: "not.created" not in running.broker.topics())


@pytest.mark.parametrize(
    ("count", "cut_every"),
    [(1_500, 300), pytest.param(30_000, 1_000, marks=pytest.mark.slow, id="30000-1000")],
)
def test_idempotent_producer_survives_cut_connections(
    proxied: tuple[Running, Proxy], count: int, cut_every: int
) -> None:
    r, proxy = proxied
    r.create_topic("exact", 2)
    bootstrap = f"127.0.0.1:{proxy.port}"
    p = ck.Producer(
        {
            "bootstrap.servers": bootstrap,
            "enable.idempotence": True,
            "linger.ms": 2,
            "batch.num.messages": 50,
            "message.timeout.ms": 20_000,
            **FAST,
        }
    )
    sent = messages(count, "exact")
    placed: list[Got] = []
    errors: list[Any] = []

    def report(err: Any, msg: Any) -> None:
        if err is not None:
            errors.append(err)
        else:
            placed.append(Got(msg.partition(), msg.offset(), msg.key(), msg.value(), (), 0))

    for i, s in enumerate(sent):
        p.produce("exact", key=s.key, value=s.value, on_delivery=report)
        if i % cut_every == cut_every // 2:
            p.poll(0)
            proxy.cut()  # mid-stream: batches in flight are retried on a new connection
    assert p.flush(WITHIN_S) == 0
    assert errors == []
    assert proxy.cuts == count // cut_every
    assert proxy.connections > 1
    c = ck.Consumer({**consumer_conf(r, "exact-check"), "bootstrap.servers": bootstrap})
    try:
        c.subscribe(["exact"])
        stored = consume(c, len(sent))
    finally:
        c.close()
    assert sum(r.end_offsets("exact", 2)) == len(sent)  # nothing more was stored: 0 duplicates
    assert sorted((g.partition, g.offset) for g in stored) == sorted(
        (g.partition, g.offset) for g in placed
    )
    assert sorted(g.value for g in stored) == sorted(s.value for s in sent)  # no gaps
    # per key, the order produced is the order stored
    for key in {s.key for s in sent}:
        assert [g.value for g in stored if g.key == key] == [s.value for s in sent if s.key == key]


def test_sasl_scram_and_acls(secured: Running) -> None:
    r = secured
    user, password = r.new_user("alice")
    r.allow("alice", "app.", Operation.ALL)
    r.create_topic("app.orders", 1)
    r.create_topic("secret", 1)

    def conf(pw: str) -> dict[str, Any]:
        return {
            "bootstrap.servers": r.bootstrap,
            "security.protocol": "SASL_PLAINTEXT",
            "sasl.mechanism": "SCRAM-SHA-256",
            "sasl.username": user,
            "sasl.password": pw,
            **FAST,
        }

    sent = messages(5)
    p = ck.Producer(conf(password))
    reports: dict[str, list[Any]] = {"app.orders": [], "secret": []}

    def report(err: Any, msg: Any) -> None:
        reports[msg.topic()].append(None if err is None else err.code())

    for s in sent:
        p.produce("app.orders", key=s.key, value=s.value, on_delivery=report)
    p.produce("secret", value=b"no", on_delivery=report)
    assert p.flush(WITHIN_S) == 0
    assert reports == {
        "app.orders": [None] * 5,
        "secret": [ck.KafkaError.TOPIC_AUTHORIZATION_FAILED],
    }
    assert r.end_offsets("app.orders", 1) == [5]
    assert r.end_offsets("secret", 1) == [0]

    # a wrong password is refused
    errors: list[Any] = []
    bad = ck.Producer({**conf(password + "x"), "error_cb": errors.append})
    bad.produce("app.orders", value=b"never", on_delivery=lambda e, m: errors.append(e))
    wait_until("an authentication error", lambda: bad.poll(0.1) >= 0 and bool(errors))
    assert any(e.code() == ck.KafkaError._AUTHENTICATION for e in errors), errors
    bad.purge()
    bad.flush(1)
    assert r.end_offsets("app.orders", 1) == [5]
