"""One data model across protocols: what confluent-kafka produces through the Kafka listener,
tidewire's own client reads with the same offsets, timestamps, keys, values and headers (the
Spark source too: tests/spark/test_kafka_cross.py); what tidewire's client produces, aiokafka
reads the same way."""

from __future__ import annotations

import asyncio

import aiokafka
import pytest
from aiokafka.structs import TopicPartition

from tests.kafka.clients._records import Got, messages
from tests.kafka.clients.conftest import CODECS, WITHIN_S, Running
from tests.kafka.clients.test_aiokafka import consume as aiokafka_consume
from tests.kafka.clients.test_confluent import produce as confluent_produce
from tidewire.client import AsyncClient, Message
from tidewire.client import Client as TidewireClient
from tidewire.client._settings import COMPRESSION


def tidewire_read(r: Running, topic: str, partitions: int) -> list[Got]:
    """Every record of ``topic`` through tidewire's binary protocol."""

    async def main() -> list[Got]:
        out: list[Got] = []
        async with AsyncClient(r.tidewire_addr, request_timeout_s=WITHIN_S) as c:
            for p in range(partitions):
                offset = 0
                while True:
                    got = await c.fetch(topic, p, offset)
                    out.extend(
                        Got(p, rec.offset, rec.key, rec.value, rec.headers, rec.timestamp)
                        for rec in got.records
                    )
                    offset = got.next_offset
                    if offset >= got.high_watermark:
                        break
        return out

    return asyncio.run(main())


@pytest.mark.parametrize("codec", CODECS)
def test_confluent_kafka_to_tidewire_client(running: Running, codec: str) -> None:
    running.create_topic("k2t", 2)
    sent = messages(40, codec)
    placed = confluent_produce(running, "k2t", sent, **{"compression.type": codec})
    assert sorted(tidewire_read(running, "k2t", 2)) == sorted(placed)


@pytest.mark.parametrize("codec", CODECS)
def test_tidewire_client_to_aiokafka(running: Running, codec: str) -> None:
    running.create_topic("t2k", 2)
    sent = messages(40, codec)
    placed: list[Got] = []

    async def main() -> None:
        async with AsyncClient(running.tidewire_addr, request_timeout_s=WITHIN_S) as c:
            for p in range(2):
                mine = sent[p::2]
                base = await c.produce(
                    "t2k",
                    p,
                    [Message(s.value, s.key, s.headers, s.timestamp) for s in mine],
                    codec=COMPRESSION[codec],
                )
                placed.extend(Got(p, base + i, *s) for i, s in enumerate(mine))
        consumer = aiokafka.AIOKafkaConsumer(
            bootstrap_servers=running.bootstrap, auto_offset_reset="earliest"
        )
        await consumer.start()
        try:
            consumer.assign([TopicPartition("t2k", 0), TopicPartition("t2k", 1)])
            got = await aiokafka_consume(consumer, len(sent))
        finally:
            await consumer.stop()
        assert sorted(got) == sorted(placed)

    asyncio.run(main())


def test_tidewire_client_sync_reads_what_kafka_clients_wrote(running: Running) -> None:
    # the synchronous client too, from the partition's start
    running.create_topic("sync", 1)
    placed = confluent_produce(running, "sync", messages(5))
    with TidewireClient(running.tidewire_addr) as c:
        got = c.fetch("sync", 0, 0)
    assert [
        Got(0, r.offset, r.key, r.value, r.headers, r.timestamp) for r in got.records
    ] == sorted(placed)
