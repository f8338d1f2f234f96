"""Kafka clients against a cluster: three real ``tidewire serve --cluster --kafka-port``
processes over a real etcd, driven by librdkafka (confluent-kafka). Metadata from any node names
every node's Kafka listener and each partition's leader, replicas and in-sync replicas; a topic
created through the Kafka admin API is placed over the nodes with its replication factor;
produce (acks=all) goes to each partition's leader and everything reads back; a node that does
not lead a partition answers NOT_LEADER_OR_FOLLOWER. About 10 s."""

from __future__ import annotations

import asyncio
import socket
import time
from pathlib import Path

import pytest

from tests.cli._support import start_serve, stop
from tests.cluster._etcd import EtcdServer
from tests.cluster._nodes import node_metadata, wait_until
from tests.kafka._support import batch, produce_body, wire
from tidewire.client import AsyncClient
from tidewire.protocol.kafka import ApiKey, ErrorCode

confluent_kafka = pytest.importorskip("confluent_kafka")
admin_mod = pytest.importorskip("confluent_kafka.admin")

WAIT_S = 30.0
NODES = (1, 2, 3)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_kafka_clients_are_routed_to_each_partitions_leader(
    tmp_path: Path, etcd: EtcdServer
) -> None:
    cluster = f"etcd://127.0.0.1:{etcd.client_port}"
    kafka = {n: _free_port() for n in NODES}
    procs = {}
    try:
        for n in NODES:
            procs[n] = start_serve(
                tmp_path / f"node{n}",
                *("--node-id", str(n), "--cluster", cluster, "--fsync", "always"),
                *("--session-timeout", "3", "--kafka-port", str(kafka[n])),
            )
        native = {n: f"127.0.0.1:{port}" for n, (_, port) in procs.items()}
        wait_until(
            "3 nodes registered",
            lambda: len(asyncio.run(node_metadata(native[1])).nodes) == 3,
            WAIT_S,
        )
        bootstrap = ",".join(f"127.0.0.1:{kafka[n]}" for n in NODES)
        admin = admin_mod.AdminClient({"bootstrap.servers": bootstrap})
        fut = admin.create_topics(
            [admin_mod.NewTopic("events", num_partitions=3, replication_factor=3)]
        )["events"]
        fut.result(WAIT_S)
        strict = admin_mod.NewTopic(
            "strict",
            num_partitions=1,
            replication_factor=3,
            config={"min.insync.replicas": "3", "unclean.leader.election.enable": "true"},
        )
        admin.create_topics([strict])["strict"].result(WAIT_S)

        def settings_of() -> dict[str, tuple[int, int, bool]]:
            # Another node learns a new topic from its copy of the metadata a moment later.
            return {
                t.name: (t.replication_factor, t.min_insync_replicas, t.unclean_leader_election)
                for t in asyncio.run(node_metadata(native[3])).topics
            }

        settings = wait_until(
            "both topics on node 3",
            lambda: (s := settings_of()).keys() >= {"strict", "events"} and s,
            WAIT_S,
        )
        assert settings["strict"] == (3, 3, True)
        assert settings["events"][0] == 3

        # Any node's Kafka Metadata names the three listeners and the cluster's leaders.
        md = admin.list_topics("events", timeout=WAIT_S)
        assert {b.id: b.port for b in md.brokers.values()} == kafka
        meta = asyncio.run(node_metadata(native[2]))
        (topic,) = [t for t in meta.topics if t.name == "events"]
        leaders = {p.partition: p.leader for p in topic.partitions}
        for p in md.topics["events"].partitions.values():
            assert p.leader == leaders[p.id]
            assert sorted(p.replicas) == [1, 2, 3]
        assert len(set(leaders.values())) == 3  # one partition led by each node

        def in_sync() -> bool:
            m = asyncio.run(node_metadata(native[1]))
            (t,) = [t for t in m.topics if t.name == "events"]
            return all(len(p.isr) == 3 for p in t.partitions)

        wait_until("every replica in sync", in_sync, WAIT_S)
        producer = confluent_kafka.Producer(
            {"bootstrap.servers": bootstrap, "acks": "all", "enable.idempotence": True}
        )
        acked: list[tuple[int, int]] = []
        errors: list[object] = []

        def report(err, msg) -> None:  # type: ignore[no-untyped-def]
            if err is not None:
                errors.append(err)
            else:
                acked.append((msg.partition(), msg.offset()))

        for i in range(300):
            producer.produce("events", b"v%d" % i, partition=i % 3, on_delivery=report)
        assert producer.flush(WAIT_S) == 0
        assert errors == []
        assert sorted(acked) == [(p, o) for p in range(3) for o in range(100)]

        consumer = confluent_kafka.Consumer(
            {
                "bootstrap.servers": bootstrap,
                "group.id": "unused",
                "enable.auto.commit": False,
            }
        )
        try:
            consumer.assign([confluent_kafka.TopicPartition("events", p, 0) for p in range(3)])
            got: dict[int, list[bytes]] = {0: [], 1: [], 2: []}
            for _ in range(300):
                m = consumer.poll(1.0)
                if m is not None and m.error() is None:
                    got[m.partition()].append(m.value())
                if sum(map(len, got.values())) == 300:
                    break
            for p in range(3):
                assert got[p] == [b"v%d" % i for i in range(p, 300, 3)]
        finally:
            consumer.close()

        # A Kafka consumer group: FindCoordinator from any node names the leader of the
        # group's offsets partition, whose commits are replicated; tidewire's own client
        # reads them back from the coordinator too.
        member = confluent_kafka.Consumer(
            {
                "bootstrap.servers": bootstrap,
                "group.id": "billing",
                "enable.auto.commit": False,
                "auto.offset.reset": "earliest",
            }
        )
        try:
            member.subscribe(["events"])
            seen = 0
            deadline = time.monotonic() + WAIT_S
            while seen < 300 and time.monotonic() < deadline:
                m = member.poll(1.0)
                if m is not None and m.error() is None:
                    seen += 1
            assert seen == 300
            member.commit(asynchronous=False)
        finally:
            member.close()

        async def committed() -> dict[tuple[str, int], int]:
            async with AsyncClient(",".join(native.values()), request_timeout_s=WAIT_S) as c:
                return await c.committed_offsets("billing")

        assert asyncio.run(committed()) == {("events", p): 100 for p in range(3)}

        # A node that does not lead partition 0 refuses to store it: NOT_LEADER_OR_FOLLOWER,
        # which every Kafka client answers by refreshing its metadata and sending again.
        follower = next(n for n in NODES if n != leaders[0])

        async def produce_to_follower() -> dict:  # type: ignore[type-arg]
            async with wire(kafka[follower]) as w:
                return await w.call(ApiKey.PRODUCE, 7, produce_body("events", 0, batch([b"x"])))

        answer = asyncio.run(produce_to_follower())
        (part,) = answer["responses"][0]["partition_responses"]
        assert part["error_code"] == ErrorCode.NOT_LEADER_OR_FOLLOWER
    finally:
        for proc, _ in procs.values():
            stop(proc)
