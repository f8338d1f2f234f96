"""Real Kafka clients against an embedded broker's Kafka listener: kafka-python and
confluent-kafka (librdkafka) create topics, produce keyed messages (idempotent, compressed),
read them back from the beginning, add partitions, describe configs, delete; librdkafka
authenticates with SCRAM-SHA-256 with an API key's id and secret. The full client suites
(groups, every codec, cut connections) are under tests/kafka/clients/."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from tidewire.embedded import EmbeddedBroker
from tidewire.security.config import SecurityConfig
from tidewire.security.keys import parse_key
from tidewire.security.model import Acl, Operation, ResourceType

kafka = pytest.importorskip("kafka")
confluent_kafka = pytest.importorskip("confluent_kafka")

#: Bound on a client's wait for what must come (generous: a loaded 2-core CI box).
WAIT_S = 30.0


def test_kafka_python_round_trip(tmp_path: Path) -> None:
    from kafka.admin import NewTopic

    from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer

    with EmbeddedBroker(str(tmp_path / "d"), kafka_port=0).running() as eb:
        bs = eb.kafka_bootstrap
        admin = KafkaAdminClient(bootstrap_servers=bs, request_timeout_ms=10_000)
        try:
            admin.create_topics([NewTopic("kp", 3, 1)])
            producer = KafkaProducer(
                bootstrap_servers=bs, acks="all", enable_idempotence=True, linger_ms=5
            )
            for i in range(50):
                producer.send("kp", key=b"k%d" % (i % 5), value=b"v%d" % i)
            producer.flush(WAIT_S)
            producer.close()
            consumer = KafkaConsumer(
                "kp",
                bootstrap_servers=bs,
                auto_offset_reset="earliest",
                consumer_timeout_ms=5_000,
                enable_auto_commit=False,
            )
            got = [(m.key, m.value) for m in consumer]
            consumer.close()
            assert sorted(v for _, v in got) == sorted(b"v%d" % i for i in range(50))
            # One key, one partition: the order of each key is kept.
            for key in {k for k, _ in got}:
                values = [int(v[1:]) for k, v in got if k == key]
                assert values == sorted(values)
            assert eb.broker.topics() == {"kp": 3}
            admin.delete_topics(["kp"])
            assert eb.broker.topics() == {}
        finally:
            admin.close()


def test_confluent_kafka_round_trip(tmp_path: Path) -> None:
    from confluent_kafka import Consumer, Producer, TopicPartition
    from confluent_kafka.admin import (
        AdminClient,
        ConfigResource,
        NewPartitions,
        NewTopic,
    )

    with EmbeddedBroker(str(tmp_path / "d"), kafka_port=0).running() as eb:
        bs = eb.kafka_bootstrap
        admin = AdminClient({"bootstrap.servers": bs})
        for f in admin.create_topics([NewTopic("ck", 2, 1)]).values():
            f.result(WAIT_S)
        for f in admin.create_partitions([NewPartitions("ck", 3)]).values():
            f.result(WAIT_S)
        (configs,) = admin.describe_configs([ConfigResource("topic", "ck")]).values()
        assert configs.result(WAIT_S)["cleanup.policy"].value == "delete"
        producer = Producer(
            {
                "bootstrap.servers": bs,
                "enable.idempotence": True,
                "acks": "all",
                "compression.type": "zstd",
            }
        )
        for i in range(200):
            producer.produce("ck", key=b"k%d" % (i % 7), value=b"v%d" % i)
        assert producer.flush(WAIT_S) == 0
        # A topic made by the first produce (auto-creation through Metadata).
        producer.produce("auto", value=b"x")
        assert producer.flush(WAIT_S) == 0
        assert "auto" in eb.broker.topics()
        # No group: offsets are given (a group's coordinator is the group APIs' part).
        consumer = Consumer(
            {"bootstrap.servers": bs, "group.id": "unused", "enable.auto.commit": False}
        )
        consumer.assign([TopicPartition("ck", p, 0) for p in range(3)])
        values = []
        deadline = time.monotonic() + WAIT_S
        while len(values) < 200 and time.monotonic() < deadline:
            m = consumer.poll(0.5)
            if m is not None:
                assert m.error() is None, m.error()
                values.append(m.value())
        lo, hi = consumer.get_watermark_offsets(TopicPartition("ck", 0), timeout=WAIT_S)
        consumer.close()
        assert sorted(values) == sorted(b"v%d" % i for i in range(200))
        assert lo == 0
        assert hi == eb.broker.high_watermark("ck", 0)


def test_confluent_kafka_with_scram(tmp_path: Path) -> None:
    from confluent_kafka import Consumer, Producer, TopicPartition

    security = SecurityConfig(authentication=True, superusers="admin", auth_failure_delay_ms=0)
    with EmbeddedBroker(str(tmp_path / "d"), kafka_port=0, security=security).running() as eb:
        loop = eb.loop

        async def setup() -> str:
            await eb.broker.security.create_principal("app")
            _, key = await eb.broker.security.create_key("app")
            await eb.broker.security.add_acls(
                [
                    Acl(
                        principal="app",
                        resource_type=ResourceType.TOPIC,
                        pattern="sec",
                        operation=Operation.ALL,
                    ),
                    # The consumer names a group (librdkafka asks for its coordinator even
                    # with assign()); without READ on it Kafka and tidewire refuse that.
                    Acl(
                        principal="app",
                        resource_type=ResourceType.GROUP,
                        pattern="unused",
                        operation=Operation.READ,
                    ),
                ]
            )
            eb.broker.create_topic("sec", 1)
            return key

        key = asyncio.run_coroutine_threadsafe(setup(), loop).result(WAIT_S)
        key_id, secret = parse_key(key)
        conf = {
            "bootstrap.servers": eb.kafka_bootstrap,
            "security.protocol": "SASL_PLAINTEXT",
            "sasl.mechanism": "SCRAM-SHA-256",
            "sasl.username": key_id,
            "sasl.password": secret,
        }
        producer = Producer(conf)
        producer.produce("sec", value=b"secret")
        assert producer.flush(WAIT_S) == 0
        consumer = Consumer(conf | {"group.id": "unused", "enable.auto.commit": False})
        consumer.assign([TopicPartition("sec", 0, 0)])
        deadline = time.monotonic() + WAIT_S
        got = None
        while got is None and time.monotonic() < deadline:
            got = consumer.poll(0.5)
        consumer.close()
        assert got is not None
        assert got.error() is None
        assert got.value() == b"secret"
        # A wrong password fails the exchange: librdkafka reports it as an authentication
        # error (not a broker that is down).
        wrong = secret[:-1] + ("A" if secret[-1] != "A" else "B")
        errors: list[confluent_kafka.KafkaError] = []
        bad = Producer(conf | {"sasl.password": wrong, "error_cb": errors.append})
        deadline = time.monotonic() + WAIT_S
        while not errors and time.monotonic() < deadline:
            bad.poll(0.2)
        assert errors
        assert errors[0].code() == confluent_kafka.KafkaError._AUTHENTICATION


def test_librdkafka_idempotent_producer_through_cut_connections(tmp_path: Path) -> None:
    from confluent_kafka import Consumer, Producer, TopicPartition

    n = 5_000
    with EmbeddedBroker(str(tmp_path / "d"), kafka_port=0).running() as eb:
        eb.broker.create_topic("idem", 2)
        kafka_server = eb.kafka
        assert kafka_server is not None

        def cut() -> None:  # on the broker's loop: every Kafka connection reset at once
            for c in list(kafka_server.connections):
                c.writer.transport.abort()

        producer = Producer(
            {
                "bootstrap.servers": eb.kafka_bootstrap,
                "enable.idempotence": True,
                "linger.ms": 5,
                "batch.num.messages": 100,
            }
        )
        for i in range(n):
            producer.produce("idem", key=b"%d" % (i % 10), value=b"%d" % i)
            if i % 1_500 == 700:
                eb.loop.call_soon_threadsafe(cut)
            producer.poll(0)
        assert producer.flush(WAIT_S) == 0
        consumer = Consumer(
            {
                "bootstrap.servers": eb.kafka_bootstrap,
                "group.id": "unused",
                "enable.auto.commit": False,
            }
        )
        consumer.assign([TopicPartition("idem", p, 0) for p in range(2)])
        values: list[int] = []
        deadline = time.monotonic() + WAIT_S
        ends = sum(eb.broker.high_watermark("idem", p) for p in range(2))
        while len(values) < ends and time.monotonic() < deadline:
            m = consumer.poll(0.5)
            if m is not None and m.error() is None:
                values.append(int(m.value()))
        consumer.close()
        assert ends == n  # nothing stored twice
        assert sorted(values) == list(range(n))
        for key in range(10):  # each key's order kept
            mine = [v for v in values if v % 10 == key]
            assert mine == sorted(mine)
