"""The Spark sink and source against a broker with authentication on: a batch write and a
batch read with ``tidewire.api.key``; without it the read fails, and the key is in no plan,
option repr or error."""

from __future__ import annotations

from typing import Any

import pytest

from tidewire.embedded import EmbeddedBroker
from tidewire.security.config import SecurityConfig
from tidewire.security.keys import parse_key
from tidewire.spark._options import read_options


@pytest.fixture(scope="module")
def auth_broker(tmp_path_factory: pytest.TempPathFactory) -> Any:
    d = tmp_path_factory.mktemp("spark-auth")
    security = SecurityConfig(authentication=True, superusers="admin")
    with EmbeddedBroker(str(d / "data"), security=security, default_partitions=2).running() as eb:
        assert eb.broker.bootstrap_key_file is not None
        yield eb, eb.broker.bootstrap_key_file.read_text().strip()


def test_write_and_read_with_an_api_key(spark: Any, auth_broker: Any) -> None:
    eb, key = auth_broker
    rows = [(f"k{i}".encode(), f"v{i}".encode()) for i in range(50)]
    df = spark.createDataFrame(rows, "key binary, value binary")
    writer = df.write.format("tidewire").option("tidewire.servers", eb.addr)
    writer = writer.option("topic", "spark.auth").option("tidewire.api.key", key)
    writer.option("tidewire.sasl.mechanism", "SCRAM-SHA-512").mode("append").save()

    def reader(**options: str) -> Any:
        r = spark.read.format("tidewire").option("tidewire.servers", eb.addr)
        r = r.option("subscribe", "spark.auth").option("startingOffsets", "earliest")
        for k, v in options.items():
            r = r.option(k, v)
        return r.load()

    loaded = reader(**{"tidewire.api.key": key})
    got = sorted(bytes(r.value) for r in loaded.select("value").collect())
    assert got == sorted(v for _, v in rows)
    secret = parse_key(key)[1]
    assert secret not in loaded._jdf.queryExecution().toString()
    opts = read_options(
        {"tidewire.servers": eb.addr, "subscribe": "t", "tidewire.api.key": key}, streaming=False
    )
    assert secret not in repr(opts)

    with pytest.raises(Exception, match="authentication") as info:
        reader().collect()
    assert secret not in str(info.value)
    with pytest.raises(Exception, match=r"tidewire\.api\.key") as info:
        reader(**{"tidewire.api.key": "twk_not_a_key"}).collect()
    assert "not_a_key" not in str(info.value)
