"""The Spark sink and source over TLS: a batch write and a batch read through a broker whose
listener wants TLS and a client certificate, with the ``tidewire.tls.*`` options; a source
without them cannot read, and a wrong path fails on the driver naming the option."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tidewire.embedded import EmbeddedBroker
from tidewire.security.certs import issue, make_ca, write_key, write_pem
from tidewire.security.config import TlsConfig


@pytest.fixture(scope="module")
def tls_broker(tmp_path_factory: pytest.TempPathFactory) -> Any:
    d = tmp_path_factory.mktemp("spark-tls")
    ca = make_ca()
    for name, issued in (
        ("ca", ca),
        ("server", issue(ca, "127.0.0.1", hosts=("127.0.0.1",))),
        ("spark", issue(ca, "spark", client=True)),
    ):
        write_pem(d / f"{name}.pem", issued.cert_pem)
        write_key(d / f"{name}.key", issued.key_pem)
    tls = TlsConfig(
        tls_cert_file=str(d / "server.pem"),
        tls_key_file=str(d / "server.key"),
        tls_ca_file=str(d / "ca.pem"),
        tls_client_auth="required",
    )
    with EmbeddedBroker(str(d / "data"), tls=tls, default_partitions=2).running() as eb:
        yield eb, d


def _options(d: Path) -> dict[str, str]:
    return {
        "tidewire.tls.ca": str(d / "ca.pem"),
        "tidewire.tls.cert": str(d / "spark.pem"),
        "tidewire.tls.key": str(d / "spark.key"),
    }


def test_write_and_read_over_mutual_tls(spark: Any, tls_broker: Any) -> None:
    eb, d = tls_broker
    rows = [(f"k{i}".encode(), f"v{i}".encode()) for i in range(100)]
    df = spark.createDataFrame(rows, "key binary, value binary")
    writer = df.write.format("tidewire").option("tidewire.servers", eb.addr)
    writer = writer.option("topic", "spark.tls")
    for k, v in _options(d).items():
        writer = writer.option(k, v)
    writer.mode("append").save()

    reader = spark.read.format("tidewire").option("tidewire.servers", eb.addr)
    reader = reader.option("subscribe", "spark.tls").option("startingOffsets", "earliest")
    for k, v in _options(d).items():
        reader = reader.option(k, v)
    got = sorted(bytes(r.value) for r in reader.load().select("value").collect())
    assert got == sorted(v for _, v in rows)


def test_a_wrong_tls_path_fails_on_the_driver(spark: Any, tls_broker: Any) -> None:
    eb, d = tls_broker
    reader = spark.read.format("tidewire").option("tidewire.servers", eb.addr)
    reader = reader.option("subscribe", "spark.tls").option("startingOffsets", "earliest")
    reader = reader.option("tidewire.tls.ca", str(d / "missing.pem"))
    with pytest.raises(Exception, match=r"tidewire\.tls.*missing\.pem"):
        reader.load().collect()
