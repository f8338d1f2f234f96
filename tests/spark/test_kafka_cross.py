"""One data model across protocols, Spark's side: what librdkafka (confluent-kafka) produces
through the Kafka listener, the Spark source reads with the same partitions, offsets,
timestamps, keys, values and headers."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.kafka.clients._records import messages
from tests.kafka.clients.conftest import running_broker
from tests.kafka.clients.test_confluent import produce as confluent_produce
from tests.spark._support import rows_of

pytestmark = pytest.mark.spark


def test_confluent_kafka_to_the_spark_source(tmp_path: Path, spark: Any) -> None:
    with running_broker(tmp_path) as running:
        running.create_topic("k2s", 2)
        sent = messages(30, "spark")
        placed = confluent_produce(running, "k2s", sent, **{"compression.type": "snappy"})
        df = (
            spark.read.format("tidewire")
            .option("tidewire.servers", running.tidewire_addr)
            .option("subscribe", "k2s")
            .option("includeHeaders", "true")
            .load()
        )
        rows = rows_of(df)
    assert len(rows) == len(sent)
    assert rows == sorted(
        ("k2s", g.partition, g.offset, g.key, g.value, g.timestamp, 0, list(g.headers))
        for g in placed
    )
